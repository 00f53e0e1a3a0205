"""torch_pjrt.bench: cold start and warm-up kept out of the timed steps; compiles,
CPU fallbacks and mixed precisions during timing flagged; the reports written."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

import pytest
import torch

import torch_pjrt
from torch_pjrt import bench
from torch_pjrt.bench import Target, benchmark

PJRT = torch_pjrt.DEVICE_NAME
STRICT = Target("pjrt strict", eager="strict")
CPU = Target("cpu eager", "cpu")


def toy(calls: dict[str, int], slow_calls: int = 0, new_shape_at: int = 0,
        fallback: bool = False) -> Callable[[str, str | None], Callable[[], None]]:
    """make_step for a matmul + add; calls[device] counts the step's calls. The step sleeps
    0.2 s on its first `slow_calls` calls, multiplies a new shape on call `new_shape_at`
    (a program no earlier call compiled), and runs an op without a pjrt kernel if `fallback`."""

    def make(device: str, backend: str | None) -> Callable[[], None]:
        assert backend is None
        a = torch.randn(16, 16, generator=torch.Generator().manual_seed(0)).to(device)
        calls[device] = 0

        def step() -> None:
            calls[device] += 1
            if calls[device] <= slow_calls:
                time.sleep(0.2)
            x = torch.ones(37, 16, device=device) if calls[device] == new_shape_at else a
            (x @ a + 1).sum()
            if fallback:
                torch.special.airy_ai(a)  # no pjrt kernel

        return step

    return make


def test_cold_start_and_warmup_are_not_timed() -> None:
    calls: dict[str, int] = {}
    lines: list[str] = []
    results = benchmark(toy(calls, slow_calls=3), [STRICT, CPU], warmup=2, iters=5, progress=lines.append)
    assert calls == {PJRT: 1 + 2 + 5, "cpu": 1 + 2 + 5}
    # Progress: each target's phases as they start, numbered, the cold start as measured.
    assert len(lines) == 6 and lines[0].startswith("[1/2] ") and lines[3].startswith("[2/2] "), lines
    assert f"cold start {results[0].cold_start_s:.2f} s" in lines[1], lines
    for r in results:
        assert len(r.times_ms) == 5
        assert r.cold_start_s >= 0.2  # the slow first call, timed on its own
        assert max(r.times_ms) < 100  # the slow warm-up calls are not among the timed ones
        assert r.p10_ms <= r.median_ms <= r.p90_ms
        assert r.steps_per_s == pytest.approx(1e3 / r.median_ms)
        assert r.flags == [], r.flags  # same shapes every call: nothing compiled while timed
    strict, cpu = results
    assert strict.programs_compiled == 0 and strict.fallbacks == {}
    assert strict.peak_memory_bytes is not None and strict.peak_memory_bytes >= 16 * 16 * 4
    assert cpu.peak_memory_bytes is None and cpu.fallbacks is None and cpu.graphs_traced == 0


def test_compile_during_timing_is_flagged() -> None:
    calls: dict[str, int] = {}
    warmup = 2
    (r,) = benchmark(toy(calls, new_shape_at=1 + warmup + 2), [STRICT], warmup=warmup, iters=4)
    assert r.programs_compiled is not None and r.programs_compiled >= 1
    assert any(f.startswith("compiled during timing") for f in r.flags), r.flags


@pytest.mark.filterwarnings("ignore:.*has no pjrt kernel")
def test_fallback_during_timing_is_flagged() -> None:
    (r,) = benchmark(toy({}, fallback=True), [STRICT], warmup=1, iters=3)
    assert r.fallbacks is not None
    bessel = [op for op in r.fallbacks if "airy_ai" in op]
    assert bessel and r.fallbacks[bessel[0]] == 3  # one per timed call; the warm-up's were reset
    assert any(f.startswith("CPU fallbacks during timing") and "airy_ai" in f for f in r.flags), r.flags


def test_precision_mismatch_is_flagged_and_cost_computed() -> None:
    bf16 = Target("cpu bf16", "cpu", precision="bfloat16")
    results = benchmark(toy({}), [CPU, bf16], warmup=1, iters=3, tokens_per_step=1000, hourly_rate=3.6)
    f32, mixed = results
    assert (f32.precision, mixed.precision) == ("float32", "bfloat16")
    assert f32.flags == []
    assert any(f.startswith("precision mismatch") for f in mixed.flags), mixed.flags
    for r in results:
        assert r.tokens_per_s == pytest.approx(1000 * r.steps_per_s)
        assert r.cost_per_1m_tokens == pytest.approx(3.6 / 3600 / r.tokens_per_s * 1e6)


def test_reports_are_written(tmp_path) -> None:
    results = benchmark(toy({}), [STRICT, CPU], warmup=1, iters=3)
    md = bench.to_markdown(results, baseline="cpu eager")
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    assert len(rows) == 3 and "vs cpu eager" in rows[0]
    assert rows[2].startswith("| cpu eager |") and "| 1.00 |" in rows[2]
    bench.to_json(results, str(tmp_path / "r.json"))
    data = json.loads((tmp_path / "r.json").read_text())
    assert [r["target"]["name"] for r in data["results"]] == ["pjrt strict", "cpu eager"]
    assert len(data["results"][0]["times_ms"]) == 3 and "torch" in data["environment"]
    assert f"{os.cpu_count()} cores" in data["environment"]["cpu"]  # which CPU: its kernels shape the numbers
    bench.plot(results, str(tmp_path / "r.png"))  # matplotlib is installed by scripts/setup.sh
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_runs_a_model(tmp_path, capsys) -> None:
    out = tmp_path / "mlp.json"
    bench.main(["--model", "mlp", "--targets", "strict,cpu", "--warmup", "1", "--iters", "2",
                "--json", str(out), "--md", str(tmp_path / "mlp.md")])
    assert "| pjrt strict |" in capsys.readouterr().out
    assert [r["target"]["name"] for r in json.loads(out.read_text())["results"]] == ["pjrt strict", "cpu eager"]
    assert (tmp_path / "mlp.md").read_text().count("\n| ") == 3


def test_time_loop_warms_up_untimed_and_syncs_each_timed_loop(monkeypatch) -> None:
    events: list[str] = []
    monkeypatch.setattr(bench, "sync", lambda device: events.append(f"sync {device}"))
    calls = iter(range(100))

    def fn() -> int:
        events.append("call")
        return next(calls)

    last, seconds = bench.time_loop(fn, PJRT, iters=3, warmup=2, repeats=2)
    assert last == 7 and len(seconds) == 2 and all(s >= 0 for s in seconds)
    assert events == ["call"] * 2 + [f"sync {PJRT}"] + (["call"] * 3 + [f"sync {PJRT}"]) * 2
    with pytest.raises(ValueError):
        bench.time_loop(fn, PJRT, iters=0)


def test_laps_count_iterations_per_second(monkeypatch) -> None:
    ticks = iter([10.0, 11.0, 11.5, 12.0])
    monkeypatch.setattr(bench, "_clock", lambda: next(ticks))
    laps = bench.Laps()
    for _ in range(4):
        laps.lap("cpu")
    assert laps.per_second(1) == pytest.approx(3 / 2.0)  # 3 laps after the first, in 2 s
