"""torch.ops.torch_pjrt.paged_attention: a ragged batch of tokens attending over a paged KV cache
(vLLM's layout), against a float64 reference written here token by token; the CPU kernel (the
operator's definition) against the same; one program for every context length."""

from __future__ import annotations

import math

import pytest
import torch

import torch_pjrt

EPS32 = torch.finfo(torch.float32).eps
paged_attention = torch.ops.torch_pjrt.paged_attention


def _reference(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_rows: torch.Tensor,
               positions: torch.Tensor, scale: float, sliding_window: int = 0, soft_cap: float = 0.0) -> torch.Tensor:
    """Token by token in float64: token t sees the slots 0..positions[t] (the last sliding_window of
    them when given) of its blocks, block_rows[t], in order."""
    q, key_cache, value_cache = q.double(), key_cache.double(), value_cache.double()
    tokens, heads, _ = q.shape
    block_size, kv_heads = key_cache.shape[1], key_cache.shape[2]
    out = torch.zeros_like(q)
    for t in range(tokens):
        pos = int(positions[t])
        seen = [p for p in range(pos + 1) if not sliding_window or p > pos - sliding_window]
        blocks = [int(block_rows[t, p // block_size]) for p in seen]
        offsets = [p % block_size for p in seen]
        k, v = key_cache[blocks, offsets], value_cache[blocks, offsets]  # [seen, kv_heads, head_size]
        for h in range(heads):
            kv = h // (heads // kv_heads)
            scores = k[:, kv] @ q[t, h] * scale
            if soft_cap:
                scores = torch.tanh(scores / soft_cap) * soft_cap
            out[t, h] = torch.softmax(scores, 0) @ v[:, kv]
    return out


def _batch(seed: int, tokens: int, heads: int, kv_heads: int, head_size: int, block_size: int, table: int,
           longest: int, cache_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    """A ragged batch: a few requests, each with its own (distinct, shuffled) blocks; each
    token at some position of its request, the last tokens padding (position 0, block 0)."""
    g = torch.Generator().manual_seed(seed)
    blocks = table * 4 + 1
    q = torch.randn(tokens, heads, head_size, generator=g)
    key_cache = torch.randn(blocks, block_size, kv_heads, head_size, generator=g).to(cache_dtype)
    value_cache = torch.randn(blocks, block_size, kv_heads, head_size, generator=g).to(cache_dtype)
    owned = (torch.randperm(blocks - 1, generator=g) + 1).view(4, table)[:, :table]  # block 0 is nobody's
    request = torch.randint(0, 4, (tokens,), generator=g)
    block_rows = owned[request]
    positions = torch.randint(0, longest, (tokens,), generator=g)
    block_rows[-2:], positions[-2:] = 0, 0
    return q, key_cache, value_cache, block_rows, positions


def _bound(expected: torch.Tensor, cpu: torch.Tensor) -> float:
    # CPU float32's own distance to float64, with a floor of a few roundings of the values' scale.
    return 4 * (cpu.double() - expected).abs().max().item() + 64 * EPS32 * expected.abs().max().item()


CASES = {
    "decode": dict(tokens=12, heads=4, kv_heads=4, head_size=16, block_size=4, table=8, longest=32),
    "grouped-kv": dict(tokens=20, heads=8, kv_heads=2, head_size=8, block_size=4, table=6, longest=24),
    "long-context": dict(tokens=6, heads=2, kv_heads=1, head_size=32, block_size=16, table=20, longest=320),
    "short-contexts-long-table": dict(tokens=10, heads=2, kv_heads=2, head_size=8, block_size=2, table=64, longest=5),
}
OPTIONS = {"plain": {}, "sliding-window": {"sliding_window": 7}, "soft-cap": {"soft_cap": 3.0}}


@pytest.mark.parametrize("options", list(OPTIONS), ids=str)
@pytest.mark.parametrize("case", list(CASES), ids=str)
def test_matches_float64_token_by_token(dev: torch.device, case: str, options: str) -> None:
    inputs = _batch(0, **CASES[case])
    scale = 1 / math.sqrt(inputs[0].shape[-1])
    expected = _reference(*inputs, scale, **OPTIONS[options])
    cpu = paged_attention(*inputs, scale, **OPTIONS[options])
    bound = _bound(expected, cpu)
    # Chunks of one block, of a few, and larger than the table: the chunking never shows.
    for chunk_blocks in (1, 3, 1000):
        got = paged_attention(*(t.to(dev) for t in inputs), scale, **OPTIONS[options], chunk_blocks=chunk_blocks)
        assert got.device == dev and got.dtype == torch.float32
        err = (got.cpu().double() - expected).abs().max().item()
        assert err <= bound, f"chunk_blocks={chunk_blocks}: {err} > {bound}"


def test_low_precision_caches_and_query(dev: torch.device) -> None:
    q, key_cache, value_cache, block_rows, positions = _batch(1, 16, 4, 2, 16, 4, 8, 30, torch.bfloat16)
    q = q.to(torch.bfloat16)
    expected = _reference(q, key_cache, value_cache, block_rows, positions, 0.25)
    got = paged_attention(q.to(dev), key_cache.to(dev), value_cache.to(dev), block_rows.to(dev), positions.to(dev),
                          0.25)
    cpu = paged_attention(q, key_cache, value_cache, block_rows, positions, 0.25)
    assert got.dtype == torch.bfloat16
    # Inputs are bfloat16 exactly; the sums run in float32 and the result rounds to bfloat16 once.
    bound = 2 * torch.finfo(torch.bfloat16).eps * expected.abs().max().item()
    assert (got.cpu().double() - expected).abs().max().item() <= bound
    assert (cpu.double() - expected).abs().max().item() <= bound


def test_float64_stays_float64(dev: torch.device) -> None:
    inputs = [t.double() if t.is_floating_point() else t for t in _batch(2, 8, 2, 2, 8, 4, 6, 20)]
    expected = _reference(*inputs, 0.3)
    got = paged_attention(*(t.to(dev) for t in inputs), 0.3)
    assert got.dtype == torch.float64
    assert (got.cpu() - expected).abs().max().item() <= 1e-12


def test_one_program_serves_every_context_length(dev: torch.device) -> None:
    """The loop's trip count comes from the positions at run time: short and long contexts of the
    same shapes replay one compiled program, and each is right."""
    q, key_cache, value_cache, block_rows, positions = _batch(3, 8, 2, 2, 8, 4, 16, 60)
    d = [t.to(dev) for t in (q, key_cache, value_cache, block_rows)]
    with torch_pjrt.eager_mode("fused"):
        paged_attention(*d, positions.to(dev), 0.5).cpu()  # compiled here
        before = torch_pjrt.metrics()["compiles"]
        for longest in (1, 5, 17, 63):
            pos = positions.clamp(max=longest - 1)
            got = paged_attention(*d, pos.to(dev), 0.5).cpu()
            expected = _reference(q, key_cache, value_cache, block_rows, pos, 0.5)
            assert (got.double() - expected).abs().max().item() <= 64 * EPS32 * expected.abs().max().item()
        assert torch_pjrt.metrics()["compiles"] == before


def test_compiled_function_calls_the_kernel(dev: torch.device) -> None:
    inputs = [t.to(dev) for t in _batch(4, 8, 4, 2, 8, 4, 6, 20)]

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return paged_attention(q * 2, k, v, rows, pos, 0.5).sum(-1)

    compiled = torch.compile(attend, backend="pjrt", fullgraph=True)
    assert torch.allclose(compiled(*inputs).cpu(), attend(*inputs).cpu(), rtol=0, atol=16 * EPS32)


@pytest.mark.parametrize("bad, message", [
    (lambda a: {**a, "query": a["query"][0]}, "expected query \\[tokens, heads, head_size\\]"),
    (lambda a: {**a, "value_cache": a["value_cache"][:-1]}, "expected key and value caches of one shape"),
    (lambda a: {**a, "query": a["query"][:, :3]}, "3 query heads are not a multiple of 2 key/value heads"),
    (lambda a: {**a, "block_rows": a["block_rows"].float()}, "expected block_rows \\[tokens, blocks per request\\] of integers"),
    (lambda a: {**a, "positions": a["positions"][:-1]}, "expected positions \\[tokens\\] of integers for 8 tokens"),
    (lambda a: {**a, "chunk_blocks": 0}, "expected sliding_window >= 0, soft_cap >= 0 and chunk_blocks >= 1"),
], ids=["query-rank", "cache-shapes", "heads", "block-rows-dtype", "positions-length", "chunk"])
def test_bad_input_is_a_clear_error(dev: torch.device, bad, message: str) -> None:
    q, key_cache, value_cache, block_rows, positions = (t.to(dev) for t in _batch(5, 8, 4, 2, 8, 4, 6, 20))
    args = bad({"query": q, "key_cache": key_cache, "value_cache": value_cache, "block_rows": block_rows,
                "positions": positions, "chunk_blocks": 2})
    with pytest.raises(RuntimeError, match="torch_pjrt::paged_attention: " + message):
        paged_attention(args["query"], args["key_cache"], args["value_cache"], args["block_rows"], args["positions"],
                        0.5, chunk_blocks=args["chunk_blocks"])


def test_inputs_on_two_devices_are_refused(dev: torch.device) -> None:
    q, key_cache, value_cache, block_rows, positions = _batch(6, 8, 4, 2, 8, 4, 6, 20)
    with pytest.raises(RuntimeError, match="paged_attention"):
        paged_attention(q.to(dev), key_cache.to(dev), value_cache.to(dev), block_rows, positions.to(dev), 0.5)
