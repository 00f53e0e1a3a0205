"""Shape bucketing: pad inputs to a few fixed sizes so compiled programs are reused;
or mark a varying dim bounded, for one program over its whole range.

Every new input shape is a new XLA program (``dynamic=False``). Padding a
varying dimension (sequence length, the short last batch) up to the next of a
few buckets bounds the programs to one per bucket; the mask says which
positions are real, so attention and losses can ignore the padding.

    buckets = [32, 64, 128]
    ids, mask = pad_to_bucket(ids, dim=1, buckets=buckets)            # [B, 37] -> [B, 64] + mask
    loader = DataLoader(dataset, batch_size=8, collate_fn=bucket_collate(buckets, batch_buckets=[8]))
    precompile(step, [example_batch(b) for b in buckets])             # fill the cache before serving
    mark_bounded(ids, dim=1, high=512)                                 # or: one program for 1..512
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from . import _C


def bucket_for(size: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds `size`."""
    if not buckets:
        raise ValueError("torch_pjrt.shapes: no buckets given")
    fitting = [b for b in buckets if b >= size]
    if not fitting:
        raise ValueError(f"torch_pjrt.shapes: size {size} is larger than the largest bucket {max(buckets)}; "
                         "add a bucket or truncate the input")
    return min(fitting)


def pad_to_bucket(x: torch.Tensor, dim: int, buckets: Sequence[int], value: float = 0,
                  mask_dtype: torch.dtype = torch.long) -> tuple[torch.Tensor, torch.Tensor]:
    """Pads `x` along `dim` with `value` up to its bucket. Returns (padded, mask): the
    mask has padded's shape up to and including `dim`, 1 at real positions, 0 at padding."""
    dim = dim % x.dim()
    size = x.shape[dim]
    target = bucket_for(size, buckets)
    pad_shape = list(x.shape)
    pad_shape[dim] = target - size
    padded = torch.cat([x, x.new_full(pad_shape, value)], dim=dim) if target > size else x
    mask_shape = list(padded.shape[: dim + 1])
    mask = torch.zeros(mask_shape, dtype=mask_dtype, device=x.device)
    mask.narrow(dim, 0, size).fill_(1)
    return padded, mask


def pad_sequences(seqs: Sequence[torch.Tensor], buckets: Sequence[int], value: float = 0,
                  batch_buckets: Sequence[int] | None = None,
                  mask_dtype: torch.dtype = torch.long) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacks variable-length sequences ([T_i, ...]) into [B, bucket, ...] with a [B, bucket]
    mask. With `batch_buckets`, the batch is padded with all-padding rows too (a short
    last batch then reuses the full batch's program)."""
    if not seqs:
        raise ValueError("torch_pjrt.shapes: no sequences to pad")
    length = bucket_for(max(s.shape[0] for s in seqs), buckets)
    rows = bucket_for(len(seqs), batch_buckets) if batch_buckets else len(seqs)
    first = seqs[0]
    out = first.new_full((rows, length, *first.shape[1:]), value)
    mask = torch.zeros((rows, length), dtype=mask_dtype, device=first.device)
    for i, s in enumerate(seqs):
        if s.shape[1:] != first.shape[1:]:
            raise ValueError(f"torch_pjrt.shapes: sequence {i} has trailing shape {tuple(s.shape[1:])}, "
                             f"sequence 0 has {tuple(first.shape[1:])}")
        out[i, : s.shape[0]] = s
        mask[i, : s.shape[0]] = 1
    return out, mask


def bucket_collate(buckets: Sequence[int], pad_value: float = 0, batch_buckets: Sequence[int] | None = None,
                   pad_values: Mapping[str, float] | None = None) -> Callable[[list[Any]], Any]:
    """A DataLoader `collate_fn` that pads variable-length samples to buckets.

    Samples may be tensors ([T, ...]: returns (batch, mask)), tuples of tensors (each
    padded; returns the padded fields then the mask of the first), or dicts of tensors
    (each key padded, `pad_values[key]` or `pad_value`; an "attention_mask" from the
    first key is added when the samples have none)."""
    pad_values = dict(pad_values or {})

    def pad(seqs: Sequence[torch.Tensor], value: float) -> tuple[torch.Tensor, torch.Tensor]:
        return pad_sequences(seqs, buckets, value, batch_buckets)

    def collate(samples: list[Any]) -> Any:
        first = samples[0]
        if isinstance(first, torch.Tensor):
            return pad(samples, pad_value)
        if isinstance(first, Mapping):
            out, mask = {}, None
            for key in first:
                out[key], m = pad([s[key] for s in samples], pad_values.get(key, pad_value))
                mask = m if mask is None else mask
            if "attention_mask" not in out and mask is not None:
                out["attention_mask"] = mask
            return out
        if isinstance(first, (tuple, list)):
            fields = [pad([s[k] for s in samples], pad_value) for k in range(len(first))]
            return (*[f[0] for f in fields], fields[0][1])
        raise TypeError(f"torch_pjrt.shapes.bucket_collate: samples must be tensors, tuples or dicts, "
                        f"got {type(first).__name__}")

    return collate


def mark_bounded(x: torch.Tensor, dim: int, high: int, low: int = 2) -> torch.Tensor:
    """Marks `x`'s `dim` dynamic within [low, high] for torch.compile: the pjrt backend then
    compiles one program, padded to `high` and masked, for every size in the range
    (torch_pjrt/_bounded.py). Dynamo specializes sizes 0 and 1: a tensor whose size there
    is below 2 is left unmarked (a program of its own) unless
    torch.fx.experimental._config.backed_size_oblivious is set, which lets `low` be 1."""
    from torch.fx.experimental import _config as fx_config

    dim = dim % x.dim()
    if not low <= x.shape[dim] <= high:
        raise ValueError(f"torch_pjrt.shapes.mark_bounded: size {x.shape[dim]} of dim {dim} is outside "
                         f"[{low}, {high}]")
    if x.shape[dim] < 2 and not fx_config.backed_size_oblivious:
        return x
    torch._dynamo.mark_dynamic(x, dim, min=low, max=high)
    return x


def precompile(fn: Callable[..., Any], examples: Iterable[Any]) -> dict[str, int]:
    """Calls `fn` once per example (a tuple of arguments, a dict of keyword arguments,
    or one argument) so every bucket's programs are compiled, or loaded from the disk
    cache, before serving. Returns the compiles and disk-cache hits it caused."""
    from .device_module import synchronize

    before = _C._metrics()
    calls = 0
    for example in examples:
        if isinstance(example, tuple):
            fn(*example)
        elif isinstance(example, Mapping):
            fn(**example)
        else:
            fn(example)
        calls += 1
    synchronize()
    after = _C._metrics()
    return {"calls": calls, "compiles": after["compiles"] - before["compiles"],
            "disk_cache_hits": after["disk_cache_hits"] - before["disk_cache_hits"]}
