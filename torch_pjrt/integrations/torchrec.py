"""TorchRec: its fbgemm operators on pjrt.

TorchRec's modules (`EmbeddingBagCollection` is `nn.EmbeddingBag`s, DLRM's arches are
linear layers) run on pjrt's native ops, but `KeyedJaggedTensor` and `KeyedTensor`
call fbgemm operators that have CPU and CUDA kernels only, so each call ran on the CPU
(a host round trip, counted in `metrics()["fallbacks"]`). These are pjrt kernels for
the ones their common methods call, written with native ops and static shapes: a
jagged layout's positions come from cumulative sums of its lengths and a
`searchsorted`, then one gather. What depends on the data stays as fbgemm has it:
`KeyedJaggedTensor.permute` passes the permuted length (TorchRec reads
`length_per_key()` on the host, one sync, as on CUDA); without it the kernel reads the
total from the device (a sync). A case a kernel does not cover (padding over several
jagged dimensions) runs on the CPU through the counted fallback. `invert_permute` (the
backward of a permutation of weights that require a gradient) has a kernel too.

Registered when torchrec is imported (it imports fbgemm_gpu, which defines the
operators): `metrics()["fallbacks"]` stays empty for `KeyedJaggedTensor.permute`,
`offsets()`, `JaggedTensor.to_padded_dense` and `to_dense`, `KeyedTensor.regroup`, and
the DLRM-style training in `tests/python/test_torchrec.py`.
"""

from __future__ import annotations

from types import ModuleType

import torch

from . import DEVICE, patch

TESTED = ("1.8.0", "1.9.0")
_KEY = "PrivateUse1"
_library: torch.library.Library | None = None  # kept: dropping it would unregister the kernels


@patch("torchrec.fbgemm_kernels", "torchrec", "torchrec", TESTED,
       "KeyedJaggedTensor.permute/offsets, JaggedTensor.to_padded_dense and KeyedTensor.regroup call fbgemm "
       "operators with CPU and CUDA kernels only: each ran on the CPU, a host round trip per call")
def _fbgemm_kernels(torchrec: ModuleType) -> None:
    global _library
    library = torch.library.Library("fbgemm", "IMPL")
    library.impl("asynchronous_complete_cumsum", complete_cumsum, _KEY)
    library.impl("permute_2D_sparse_data", permute_2d_sparse_data, _KEY)
    library.impl("permute_2D_sparse_data_input1D", permute_2d_sparse_data_input1d, _KEY)
    library.impl("invert_permute", invert_permute, _KEY)  # permute_2D_sparse_data's backward
    library.impl("jagged_to_padded_dense_forward", jagged_to_padded_dense, _KEY)
    library.impl("jagged_to_padded_dense_backward", jagged_to_padded_dense_backward, _KEY)
    library.impl("permute_pooled_embs", permute_pooled_embs, _KEY)
    library.impl("permute_pooled_embs_auto_grad", permute_pooled_embs, _KEY)
    _library = library


def complete_cumsum(lengths: torch.Tensor) -> torch.Tensor:
    """[0, l0, l0 + l1, ...]: a row of offsets from lengths (along the last dimension of a 2-D
    input, one row each)."""
    if lengths.dim() not in (1, 2):
        raise ValueError(f"fbgemm::asynchronous_complete_cumsum on {DEVICE}: a 1-D or 2-D tensor, got "
                         f"{lengths.dim()} dimensions")
    zero = lengths.new_zeros(*lengths.shape[:-1], 1)
    return torch.cat([zero, lengths.cumsum(-1, dtype=lengths.dtype)], dim=-1)


def _segment_gather(offsets_in: torch.Tensor, segments: torch.Tensor, offsets_out: torch.Tensor,
                    total: int) -> torch.Tensor:
    """The source position of each of `total` output positions, when output segment s is
    input segment segments[s] (offsets: each segment's start, then the end)."""
    position = torch.arange(total, device=offsets_out.device, dtype=offsets_out.dtype)
    segment = torch.searchsorted(offsets_out[1:], position, right=True)  # empty segments are skipped
    return offsets_in.index_select(0, segments.index_select(0, segment)) + position - offsets_out.index_select(0, segment)


def permute_2d_sparse_data(permute: torch.Tensor, lengths: torch.Tensor, values: torch.Tensor,
                           weights: torch.Tensor | None = None, permuted_lengths_sum: int | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Features (rows of `lengths`, each a jagged run of `values`) in the order `permute`
    names them (repeats and omissions allowed)."""
    if permute.dtype != torch.int32:  # as fbgemm's kernels
        raise RuntimeError(f"fbgemm::permute_2D_sparse_data on {DEVICE}: permute must be int32, got {permute.dtype}")
    if lengths.dim() != 2:
        raise RuntimeError(f"fbgemm::permute_2D_sparse_data on {DEVICE}: lengths must be 2-D [features, batch], got "
                           f"{lengths.dim()} dimensions")
    batch = lengths.shape[1]
    permuted_lengths = lengths.index_select(0, permute)
    offsets_in = complete_cumsum(lengths.reshape(-1))
    offsets_out = complete_cumsum(permuted_lengths.reshape(-1))
    total = int(offsets_out[-1]) if permuted_lengths_sum is None else int(permuted_lengths_sum)
    rows = torch.arange(batch, device=lengths.device, dtype=permute.dtype)
    segments = (permute.unsqueeze(1) * batch + rows).reshape(-1)  # output segment -> input segment
    source = _segment_gather(offsets_in, segments, offsets_out, total)
    permuted_weights = None if weights is None else weights.index_select(0, source)
    return permuted_lengths, values.index_select(0, source), permuted_weights


def permute_2d_sparse_data_input1d(permute: torch.Tensor, lengths: torch.Tensor, values: torch.Tensor, stride: int,
                                   weights: torch.Tensor | None = None, permuted_lengths_sum: int | None = None
                                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    permuted_lengths, permuted_values, permuted_weights = permute_2d_sparse_data(
        permute, lengths.view(-1, stride), values, weights, permuted_lengths_sum)
    return permuted_lengths.view(-1), permuted_values, permuted_weights


def invert_permute(permute: torch.Tensor) -> torch.Tensor:
    """The inverse permutation: inverse[permute[i]] = i."""
    positions = torch.arange(permute.numel(), device=permute.device, dtype=permute.dtype)
    return torch.empty_like(permute).scatter_(0, permute.long(), positions)


def jagged_to_padded_dense(values: torch.Tensor, offsets: list[torch.Tensor], max_lengths: list[int],
                           padding_value: float = 0.0) -> torch.Tensor:
    """[rows, max_length, ...]: each row's run of `values` (offsets[0]), cut or padded."""
    if len(offsets) != 1:
        return _on_cpu("fbgemm::jagged_to_padded_dense_forward", values, offsets, max_lengths, padding_value)
    starts, ends = offsets[0][:-1], offsets[0][1:]
    length = int(max_lengths[0])
    if values.shape[0] == 0:
        return values.new_full((starts.numel(), length, *values.shape[1:]), padding_value)
    slot = torch.arange(length, device=values.device, dtype=starts.dtype)
    source = starts.unsqueeze(1) + slot  # [rows, length]
    inside = slot < (ends - starts).unsqueeze(1)
    gathered = values.index_select(0, source.clamp(max=values.shape[0] - 1).reshape(-1))
    gathered = gathered.view(starts.numel(), length, *values.shape[1:])
    inside = inside.view(*inside.shape, *([1] * (values.dim() - 1)))
    return torch.where(inside, gathered, torch.full((), padding_value, dtype=values.dtype, device=values.device))


def jagged_to_padded_dense_backward(grad_output: torch.Tensor, offsets: list[torch.Tensor],
                                    total_length: int) -> torch.Tensor:
    """The values' gradient: each padded slot's gradient back at its value (padding's dropped)."""
    if len(offsets) != 1:
        return _on_cpu("fbgemm::jagged_to_padded_dense_backward", grad_output, offsets, total_length)
    starts, ends = offsets[0][:-1], offsets[0][1:]
    rows, length = grad_output.shape[0], grad_output.shape[1]
    inner = grad_output.shape[2:]
    slot = torch.arange(length, device=grad_output.device, dtype=starts.dtype)
    target = (starts.unsqueeze(1) + slot).reshape(-1)
    inside = (slot < (ends - starts).unsqueeze(1)).reshape(-1)
    # Padding slots go to an extra row, dropped after: shapes stay static.
    target = torch.where(inside, target, torch.full_like(target, int(total_length)))
    grad = grad_output.new_zeros(int(total_length) + 1, *inner)
    grad.index_add_(0, target, grad_output.reshape(rows * length, *inner))
    return grad[: int(total_length)]


def permute_pooled_embs(pooled_embs: torch.Tensor, offset_dim_list: torch.Tensor, permute_list: torch.Tensor,
                        inv_offset_dim_list: torch.Tensor, inv_permute_list: torch.Tensor) -> torch.Tensor:
    """The columns of each key's pooled embedding ([batch, sum of dims]) in `permute_list`'s
    order (its autograd form's backward calls it with the inverse lists)."""
    if permute_list.numel() != offset_dim_list.numel() - 1:  # the output keeps the input's width
        raise RuntimeError(f"fbgemm::permute_pooled_embs on {DEVICE}: permute_list must name each of the "
                           f"{offset_dim_list.numel() - 1} keys once, got {permute_list.numel()} entries")
    dims = offset_dim_list[1:] - offset_dim_list[:-1]
    offsets_out = complete_cumsum(dims.index_select(0, permute_list))
    columns = _segment_gather(offset_dim_list, permute_list, offsets_out, pooled_embs.shape[1])
    return pooled_embs.index_select(1, columns)


def _on_cpu(name: str, *args: object) -> torch.Tensor:
    from .. import _C

    return _C._run_on_cpu(name, "", *args)
