"""torch.ops.torch_pjrt.paged_attention: a ragged batch of queries in tiles (each tile some query
rows of one request) attending over a paged KV cache (vLLM's layout), against a float64
reference written here row by row (the cache [2 (keys, values), blocks, kv_heads, block_size,
head_size]); the CPU kernel (the operator's definition) against the same;
one program for every context length."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch

import torch_pjrt
from host_kernel_support import host_kernel_expected

EPS32 = torch.finfo(torch.float32).eps
paged_attention = torch.ops.torch_pjrt.paged_attention


def _reference(q: torch.Tensor, kv_cache: torch.Tensor, block_rows: torch.Tensor, positions: torch.Tensor, scale: float,
               sliding_window: int = 0, soft_cap: float = 0.0) -> torch.Tensor:
    """Row by row in float64: row (s, r) sees the slots 0..positions[s, r] (the last sliding_window
    of them when given) of its tile's blocks, block_rows[s], in order; position -1 sees nothing (0)."""
    q, key_cache, value_cache = q.double(), kv_cache[0].double(), kv_cache[1].double()
    tiles, rows, heads, _ = q.shape
    kv_heads, block_size = key_cache.shape[1], key_cache.shape[2]
    out = torch.zeros_like(q)
    for s in range(tiles):
        for r in range(rows):
            pos = int(positions[s, r])
            seen = [p for p in range(pos + 1) if not sliding_window or p > pos - sliding_window]
            if not seen:
                continue
            blocks = [int(block_rows[s, p // block_size]) for p in seen]
            offsets = [p % block_size for p in seen]
            k, v = key_cache[blocks, :, offsets], value_cache[blocks, :, offsets]  # [seen, kv_heads, head_size]
            for h in range(heads):
                kv = h // (heads // kv_heads)
                scores = k[:, kv] @ q[s, r, h] * scale
                if soft_cap:
                    scores = torch.tanh(scores / soft_cap) * soft_cap
                out[s, r, h] = torch.softmax(scores, 0) @ v[:, kv]
    return out


def _batch(seed: int, tiles: int, rows: int, heads: int, kv_heads: int, head_size: int, block_size: int, table: int,
           longest: int, cache_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    """A ragged batch: a few requests, each with its own (distinct, shuffled) blocks; each tile
    one request's rows, at positions ending somewhere before `longest` (consecutive, as a prefill
    chunk's), its last rows padding (-1) at random; the last tile all padding, on block 0."""
    g = torch.Generator().manual_seed(seed)
    blocks = table * 4 + 1
    q = torch.randn(tiles, rows, heads, head_size, generator=g)
    kv_cache = torch.randn(2, blocks, kv_heads, block_size, head_size, generator=g).to(cache_dtype)
    owned = (torch.randperm(blocks - 1, generator=g) + 1).view(4, table)  # block 0 is nobody's
    block_rows = owned[torch.randint(0, 4, (tiles,), generator=g)]
    last = torch.randint(rows - 1, longest, (tiles,), generator=g)
    positions = last.unsqueeze(1) - torch.arange(rows - 1, -1, -1)
    used = torch.randint(1, rows + 1, (tiles,), generator=g)
    positions[torch.arange(rows) >= used.unsqueeze(1)] = -1
    block_rows[-1], positions[-1] = 0, -1
    return q, kv_cache, block_rows, positions


def _bound(expected: torch.Tensor, cpu: torch.Tensor) -> float:
    # CPU float32's own distance to float64, with a floor of a few roundings of the values' scale.
    return 4 * (cpu.double() - expected).abs().max().item() + 64 * EPS32 * expected.abs().max().item()


CASES = {
    "decode": dict(tiles=12, rows=1, heads=4, kv_heads=4, head_size=16, block_size=4, table=8, longest=32),
    # Decode lanes as vLLM's have them (grouped heads, one row per request) over several 64-position
    # chunks; a head of 74 is whole vectors and a tail for every vector width (16, 8, 4 floats).
    "decode-grouped-long-head": dict(tiles=6, rows=1, heads=8, kv_heads=4, head_size=74, block_size=16, table=12,
                                     longest=180),
    "prefill-tiles": dict(tiles=6, rows=8, heads=4, kv_heads=2, head_size=8, block_size=4, table=8, longest=32),
    "grouped-kv": dict(tiles=10, rows=3, heads=8, kv_heads=2, head_size=8, block_size=4, table=6, longest=24),
    "long-context": dict(tiles=4, rows=4, heads=2, kv_heads=1, head_size=32, block_size=16, table=20, longest=320),
    "short-contexts-long-table": dict(tiles=10, rows=2, heads=2, kv_heads=2, head_size=8, block_size=2, table=64,
                                      longest=5),
    # A prefill tile as vLLM's steps have them (the host kernel's lanes side by side in vectors: 17 lanes,
    # so a second vector mostly of padding) over contexts of several 64-position chunks; a head size of
    # 80 is five vectors of 16 (the value loop's blocks of four and its remainder).
    "prefill-tile-long-head": dict(tiles=3, rows=17, heads=4, kv_heads=4, head_size=80, block_size=16, table=16,
                                   longest=250),
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


@pytest.mark.parametrize("scale", [0.0, -0.5])
@pytest.mark.parametrize("case", ["decode", "decode-grouped-long-head", "prefill-tiles"])
def test_zero_and_negative_scales(dev: torch.device, case: str, scale: float) -> None:
    # Scale 0 weighs every seen position alike; a negative one reverses the scores. Positions a lane
    # does not see must still weigh nothing (masked after the scale, not before it).
    inputs = _batch(5, **CASES[case])
    expected = _reference(*inputs, scale)
    bound = _bound(expected, paged_attention(*inputs, scale))
    got = paged_attention(*(t.to(dev) for t in inputs), scale)
    assert (got.cpu().double() - expected).abs().max().item() <= bound


def test_low_precision_caches_and_query(dev: torch.device) -> None:
    q, kv_cache, block_rows, positions = _batch(1, 8, 4, 4, 2, 16, 4, 8, 30, torch.bfloat16)
    q = q.to(torch.bfloat16)
    expected = _reference(q, kv_cache, block_rows, positions, 0.25)
    got = paged_attention(q.to(dev), kv_cache.to(dev), block_rows.to(dev), positions.to(dev), 0.25)
    cpu = paged_attention(q, kv_cache, block_rows, positions, 0.25)
    assert got.dtype == torch.bfloat16
    # Inputs are bfloat16 exactly; the sums run in float32 and the result rounds to bfloat16 once.
    bound = 2 * torch.finfo(torch.bfloat16).eps * expected.abs().max().item()
    assert (got.cpu().double() - expected).abs().max().item() <= bound
    assert (cpu.double() - expected).abs().max().item() <= bound


def test_float64_stays_float64(dev: torch.device) -> None:
    inputs = [t.double() if t.is_floating_point() else t for t in _batch(2, 8, 2, 2, 2, 8, 4, 6, 20)]
    expected = _reference(*inputs, 0.3)
    got = paged_attention(*(t.to(dev) for t in inputs), 0.3)
    assert got.dtype == torch.float64
    assert (got.cpu() - expected).abs().max().item() <= 1e-12


def test_one_program_serves_every_context_length(dev: torch.device) -> None:
    """The loop's trip count comes from the positions at run time: short and long contexts of the
    same shapes replay one compiled program, and each is right."""
    q, kv_cache, block_rows, positions = _batch(3, 8, 2, 2, 2, 8, 4, 16, 60)
    d = [t.to(dev) for t in (q, kv_cache, block_rows)]
    with torch_pjrt.eager_mode("fused"):
        paged_attention(*d, positions.to(dev), 0.5).cpu()  # compiled here
        before = torch_pjrt.metrics()["compiles"]
        for longest in (1, 5, 17, 63):
            pos = torch.where(positions >= 0, positions.clamp(max=longest - 1), -1)
            got = paged_attention(*d, pos.to(dev), 0.5).cpu()
            expected = _reference(q, kv_cache, block_rows, pos, 0.5)
            assert (got.double() - expected).abs().max().item() <= 64 * EPS32 * expected.abs().max().item()
        assert torch_pjrt.metrics()["compiles"] == before


def test_compiled_function_calls_the_kernel(dev: torch.device) -> None:
    inputs = [t.to(dev) for t in _batch(4, 8, 2, 4, 2, 8, 4, 6, 20)]

    def attend(q: torch.Tensor, kv: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return paged_attention(q * 2, kv, rows, pos, 0.5).sum(-1)

    compiled = torch.compile(attend, backend="pjrt", fullgraph=True)
    assert torch.allclose(compiled(*inputs).cpu(), attend(*inputs).cpu(), rtol=0, atol=16 * EPS32)


@pytest.mark.parametrize("bad, message", [
    (lambda a: {**a, "query": a["query"][0]}, "expected query \\[tiles, rows per tile, heads, head_size\\]"),
    (lambda a: {**a, "kv_cache": a["kv_cache"][:1]}, "expected kv_cache \\[2 \\(keys, values\\), blocks"),
    (lambda a: {**a, "query": a["query"][:, :, :3]}, "3 query heads are not a multiple of 2 key/value heads"),
    (lambda a: {**a, "block_rows": a["block_rows"].float()},
     "expected block_rows \\[tiles, blocks per request\\] of integers"),
    (lambda a: {**a, "positions": a["positions"][:, :-1]},
     "expected positions \\[tiles, rows per tile\\] of integers for 8 x 2 query rows"),
    (lambda a: {**a, "chunk_blocks": 0}, "expected sliding_window >= 0, soft_cap >= 0 and chunk_blocks >= 1"),
], ids=["query-rank", "cache-shape", "heads", "block-rows-dtype", "positions-length", "chunk"])
def test_bad_input_is_a_clear_error(dev: torch.device, bad, message: str) -> None:
    q, kv_cache, block_rows, positions = (t.to(dev) for t in _batch(5, 8, 2, 4, 2, 8, 4, 6, 20))
    args = bad({"query": q, "kv_cache": kv_cache, "block_rows": block_rows, "positions": positions, "chunk_blocks": 2})
    with pytest.raises(RuntimeError, match="torch_pjrt::paged_attention: " + message):
        paged_attention(args["query"], args["kv_cache"], args["block_rows"], args["positions"], 0.5,
                        chunk_blocks=args["chunk_blocks"])


def test_inputs_on_two_devices_are_refused(dev: torch.device) -> None:
    q, kv_cache, block_rows, positions = _batch(6, 8, 2, 4, 2, 8, 4, 6, 20)
    with pytest.raises(RuntimeError, match="paged_attention"):
        paged_attention(q.to(dev), kv_cache.to(dev), block_rows, positions.to(dev), 0.5)


def test_the_host_kernel_serves_float32_where_the_plugin_takes_it(dev: torch.device) -> None:
    assert torch_pjrt._C._host_kernels_built() == (importlib.util.find_spec("jax") is not None)
    assert torch_pjrt._C._host_kernels() == host_kernel_expected()


def test_the_host_kernel_runs_the_instruction_set_asked_for() -> None:
    asked = os.environ.get("TORCH_PJRT_HOST_KERNEL_ISA")
    if not torch_pjrt._C._host_kernels_built():
        assert torch_pjrt._C._host_kernel_isa() == ""
        return
    isas = torch_pjrt._C._host_kernel_isas()
    assert isas[-1] == "baseline"
    assert torch_pjrt._C._host_kernel_isa() == (asked or isas[0])


def test_an_instruction_set_the_cpu_lacks_is_refused_at_import() -> None:
    env = dict(os.environ, TORCH_PJRT_HOST_KERNEL_ISA="x86-64-v9")
    proc = subprocess.run([sys.executable, "-c", "import torch_pjrt"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0
    assert "ValueError: torch_pjrt: TORCH_PJRT_HOST_KERNEL_ISA='x86-64-v9' is not a host kernel variant" \
        in proc.stderr, proc.stderr[-2000:]


def _other_isas() -> list[str]:
    return torch_pjrt._C._host_kernel_isas()[1:] if host_kernel_expected() else []


@pytest.mark.parametrize("isa", _other_isas())
def test_each_instruction_set_variant_of_the_host_kernel_matches(isa: str) -> None:
    # The tests above ran the best variant this CPU has; the others (what a CPU without AVX-512,
    # or without AVX2, runs) in processes that ask for them.
    env = dict(os.environ, TORCH_PJRT_HOST_KERNEL_ISA=isa)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                           "matches_float64 or zero_and_negative or instruction_set_asked_for"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout, proc.stdout[-1000:]


def test_the_stablehlo_lowering_still_matches_without_the_host_kernel() -> None:
    # The other path (plugins without the host kernel), in a process that turned it off.
    env = dict(os.environ, TORCH_PJRT_HOST_KERNELS="0")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                           "matches_float64 or low_precision or serves_float32 or one_program"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout, proc.stdout[-1000:]
