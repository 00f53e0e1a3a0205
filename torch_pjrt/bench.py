"""Fair benchmarks of one step function on several targets side by side.

    results = benchmark(make_step, standard_targets(["compiled", "strict", "cpu"]), warmup=5, iters=20)
    print(to_markdown(results))

`make_step(device, backend)` builds a fresh, seeded step (model, data, optimizer;
`torch.compile(..., backend=backend)` when backend is not None) and returns a
callable running one step. For each target the harness resets Dynamo, builds the
step, times its first call on its own (cold start: tracing and compiling in this
process; programs another target compiled may already be cached), runs the
warm-up calls (discarded), resets the counters, then times `iters` calls, each
ending in a real device synchronize. Programs compiled, Dynamo graphs traced and
CPU fallbacks during the timed calls flag the result: it is not a steady state.

    python -m torch_pjrt.bench --model gpt --targets compiled,fused,strict,cpu,inductor --png gpt.png
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch._dynamo

import torch_pjrt
from torch_pjrt import device_module
from torch_pjrt._host import cpu_description

T = TypeVar("T")
Step = Callable[[], object]
MakeStep = Callable[[str, str | None], Step]


@dataclass(frozen=True)
class Target:
    """Where and how a step runs."""

    name: str
    device: str = torch_pjrt.DEVICE_NAME  # "pjrt", "cpu" or "cuda"
    eager: str | None = None  # pjrt eager mode around the step ("strict", "fused"); None: leave it
    backend: str | None = None  # torch.compile backend make_step compiles with; None: eager
    precision: str | None = None  # as stated by the caller; None: benchmark()'s precision
    hourly_rate: float | None = None  # the device's cost per hour; None: benchmark()'s


STANDARD_TARGETS: dict[str, Target] = {
    "compiled": Target("pjrt compiled", eager="fused", backend="pjrt"),
    "fused": Target("pjrt fused", eager="fused"),
    "strict": Target("pjrt strict", eager="strict"),
    "cpu": Target("cpu eager", "cpu"),
    "inductor": Target("cpu inductor", "cpu", backend="inductor"),
}


def standard_targets(keys: Sequence[str], baseline_device: str = "cpu") -> list[Target]:
    """The targets named by `keys` (STANDARD_TARGETS' keys); baseline_device="cuda"
    runs the PyTorch eager and inductor ones on a GPU instead of the CPU."""
    unknown = [k for k in keys if k not in STANDARD_TARGETS]
    if unknown:
        raise ValueError(f"unknown targets {unknown}; choose from {', '.join(STANDARD_TARGETS)}")
    targets = [STANDARD_TARGETS[k] for k in keys]
    return [dataclasses.replace(t, device=baseline_device, name=t.name.replace("cpu", baseline_device))
            if t.device == "cpu" else t for t in targets]


@dataclass
class Result:
    target: Target
    precision: str
    matmul_precision: str  # torch.get_float32_matmul_precision() while it ran
    warmup: int
    cold_start_s: float
    times_ms: list[float]
    median_ms: float
    p10_ms: float
    p90_ms: float
    steps_per_s: float
    tokens_per_s: float | None
    cost_per_1m_tokens: float | None
    peak_memory_bytes: int | None  # device memory high-water mark over the timed calls; None on the CPU
    programs_compiled: int | None  # pjrt: XLA compiles and disk-cache loads during timing
    graphs_traced: int  # Dynamo graphs traced during timing (recompiles)
    fallbacks: dict[str, int] | None  # pjrt: CPU fallback calls per op during timing
    flags: list[str]

    @property
    def compiles(self) -> int:
        return self.programs_compiled if self.programs_compiled is not None else self.graphs_traced


def _is_pjrt(device: str) -> bool:
    return torch.device(device).type == torch_pjrt.DEVICE_NAME


def sync(device: str | None) -> None:
    """Waits until the device has finished everything enqueued (nothing to wait for on the
    CPU, or for None: work that is done when it returns, such as a host read)."""
    if device is None:
        return
    kind = torch.device(device).type
    if kind == torch_pjrt.DEVICE_NAME:
        torch_pjrt.synchronize()
    elif kind == "cuda":
        torch.cuda.synchronize()
    elif kind != "cpu":
        raise ValueError(f"torch_pjrt.bench: no synchronize for device {device!r}")


# The clock of every figure this module and benchmarks/ report.
_clock = time.perf_counter


def time_call(fn: Callable[[], T], device: str | None) -> tuple[T, float]:
    """Runs fn and waits for the device (see sync); its result and the seconds taken."""
    start = _clock()
    out = fn()
    sync(device)
    return out, _clock() - start


def time_loop(fn: Callable[[], T], device: str | None, iters: int, warmup: int = 0,
              repeats: int = 1) -> tuple[T, list[float]]:
    """The timing loop: `warmup` calls of fn and a sync, untimed; then, `repeats` times,
    `iters` calls timed together up to a sync after the last. fn's last result and the
    seconds per call of each repeat (iters=1: each call timed alone, ending in a sync)."""
    if iters < 1 or repeats < 1 or warmup < 0:
        raise ValueError(f"torch_pjrt.bench: need iters, repeats >= 1 and warmup >= 0, got {iters}, {repeats} "
                         f"and {warmup}")
    for _ in range(warmup):
        fn()
    sync(device)
    seconds = []
    for _ in range(repeats):
        start = _clock()
        for _ in range(iters):
            out = fn()
        sync(device)
        seconds.append((_clock() - start) / iters)
    return out, seconds


class Laps:
    """Lap times of a loop another library runs (a Trainer's steps): lap() at the end of
    each iteration waits for the device and notes the time."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def lap(self, device: str | None) -> None:
        sync(device)
        self.stamps.append(_clock())

    def per_second(self, skip: int) -> float:
        """Iterations per second after the first `skip` (at least 1: the clock starts at a lap)."""
        return (len(self.stamps) - skip) / (self.stamps[-1] - self.stamps[skip - 1])


def percentiles_ms(seconds: Sequence[float]) -> tuple[float, float, float]:
    """Median, 10th and 90th percentile, in ms."""
    ms = [s * 1e3 for s in seconds]
    if len(ms) == 1:
        return ms[0], ms[0], ms[0]
    cuts = statistics.quantiles(ms, n=10, method="inclusive")
    return statistics.median(ms), cuts[0], cuts[-1]


def _eager_mode(target: Target) -> AbstractContextManager[Any]:
    if target.eager and _is_pjrt(target.device):
        return torch_pjrt.eager_mode(target.eager)
    return nullcontext()


def _dynamo_graphs() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def _reset_device_counters(device: str) -> None:
    if _is_pjrt(device):
        torch_pjrt.reset_metrics()
        device_module.reset_peak_memory_stats()
    elif torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def _peak_memory(device: str) -> int | None:
    if _is_pjrt(device):
        return device_module.max_memory_allocated()
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated()
    return None


@dataclass
class _Measured:
    cold_start_s: float
    seconds: list[float]
    peak_memory_bytes: int | None
    programs_compiled: int | None
    graphs_traced: int
    fallbacks: dict[str, int] | None


Progress = Callable[[str], None]


def _measure(make_step: MakeStep, target: Target, warmup: int, iters: int,
             progress: Progress | None = None) -> _Measured:
    say = progress or (lambda _: None)
    torch._dynamo.reset()  # each target traces afresh: no graphs left by the previous one
    device = target.device
    with _eager_mode(target):
        step = make_step(device, target.backend)
        say(f"{target.name}: first step (cold start: tracing and compiling) ...")
        _, cold = time_call(step, device)
        say(f"{target.name}: cold start {cold:.2f} s; {warmup} warm-up steps, then {iters} timed ...")
        for _ in range(warmup):
            step()
        sync(device)
        gc.collect()  # the warm-up's garbage is not the timed calls' to collect
        _reset_device_counters(device)
        graphs = _dynamo_graphs()
        _, seconds = time_loop(step, device, 1, repeats=iters)
        graphs = _dynamo_graphs() - graphs
    say(f"{target.name}: median {statistics.median(seconds) * 1e3:.1f} ms per step")
    programs, fallbacks = None, None
    if _is_pjrt(device):
        m = torch_pjrt.metrics()
        programs, fallbacks = m["compiles"] + m["disk_cache_hits"], dict(m["fallbacks"])
    return _Measured(cold, seconds, _peak_memory(device), programs, graphs, fallbacks)


def _steady_state_flags(m: _Measured) -> list[str]:
    flags = []
    if m.programs_compiled:
        flags.append(f"compiled during timing: {m.programs_compiled} programs")
    if m.graphs_traced:
        flags.append(f"Dynamo traced during timing: {m.graphs_traced} graphs")
    if m.fallbacks:
        ops = ", ".join(f"{op.removeprefix('aten::')} x{n}" for op, n in sorted(m.fallbacks.items()))
        flags.append(f"CPU fallbacks during timing: {ops}")
    return flags


def _result(m: _Measured, target: Target, warmup: int, tokens_per_step: int | None,
            hourly_rate: float | None, precision: str) -> Result:
    median, p10, p90 = percentiles_ms(m.seconds)
    steps_per_s = 1e3 / median
    tokens_per_s = tokens_per_step * steps_per_s if tokens_per_step else None
    rate = target.hourly_rate if target.hourly_rate is not None else hourly_rate
    cost = rate / 3600 / tokens_per_s * 1e6 if rate is not None and tokens_per_s else None
    return Result(target, target.precision or precision, torch.get_float32_matmul_precision(), warmup,
                  m.cold_start_s, [s * 1e3 for s in m.seconds], median, p10, p90, steps_per_s, tokens_per_s,
                  cost, m.peak_memory_bytes, m.programs_compiled, m.graphs_traced, m.fallbacks,
                  _steady_state_flags(m))


def _flag_precision(results: list[Result]) -> None:
    """A comparison is only fair at one precision: flag every result that differs from the first."""
    ref = results[0]
    for r in results[1:]:
        flag = (f"precision mismatch: {r.precision} (matmul {r.matmul_precision}) vs "
                f"{ref.target.name}'s {ref.precision} (matmul {ref.matmul_precision})")
        if (r.precision, r.matmul_precision) != (ref.precision, ref.matmul_precision) and flag not in r.flags:
            r.flags.append(flag)


def benchmark(make_step: MakeStep, targets: Sequence[Target], warmup: int = 5, iters: int = 20,
              tokens_per_step: int | None = None, hourly_rate: float | None = None,
              precision: str = "float32", progress: Progress | None = None) -> list[Result]:
    """Runs the step on each target in turn (see the module's docstring); one Result each.
    `progress` (e.g. print) hears a line as each target starts and ends its phases."""
    if iters < 1 or warmup < 0:
        raise ValueError(f"torch_pjrt.bench: need iters >= 1 and warmup >= 0, got {iters} and {warmup}")
    results = []
    for i, t in enumerate(targets):
        step_progress = (lambda line, i=i: progress(f"[{i + 1}/{len(targets)}] {line}")) if progress else None
        results.append(_result(_measure(make_step, t, warmup, iters, step_progress), t, warmup, tokens_per_step,
                               hourly_rate, precision))
    if results:
        _flag_precision(results)
    return results


# ---------------------------------------------------------------- reports

def environment() -> dict[str, Any]:
    """What the numbers depend on besides the step."""
    return {
        "torch": torch.__version__,
        "pjrt_platform": torch_pjrt.platform()["platform"],
        "torch_threads": torch.get_num_threads(),
        "cpu": cpu_description(),
        "load_average": round(os.getloadavg()[0], 2),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def _baseline(results: Sequence[Result], name: str | None) -> Result:
    if name is not None:
        return next(r for r in results if r.target.name == name)
    # Default: plain PyTorch eager on the CPU when it ran, else the first target.
    return next((r for r in results if r.target.device == "cpu" and r.target.backend is None), results[0])


def _ms(v: float) -> str:
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _throughput(r: Result) -> str:
    return f"{r.tokens_per_s:,.0f} tok/s" if r.tokens_per_s is not None else f"{r.steps_per_s:,.1f} steps/s"


def _memory(r: Result) -> str:
    return "—" if r.peak_memory_bytes is None else f"{r.peak_memory_bytes / 2**20:.1f} MiB"


def _row(r: Result, base: Result, with_cost: bool) -> list[str]:
    fallbacks = "—" if r.fallbacks is None else str(sum(r.fallbacks.values()))
    cells = [r.target.name, r.precision, f"{r.cold_start_s:.2f} s", _ms(r.median_ms), _ms(r.p10_ms),
             _ms(r.p90_ms), _throughput(r), _memory(r), f"{r.compiles} / {fallbacks}",
             f"{r.median_ms / base.median_ms:.2f}"]
    if with_cost:
        cells.append("—" if r.cost_per_1m_tokens is None else f"${r.cost_per_1m_tokens:.4f}")
    return cells + ["; ".join(r.flags) or "ok"]


def to_markdown(results: Sequence[Result], baseline: str | None = None) -> str:
    """A caption and one table; `baseline` names the target the ratio column divides by."""
    if not results:
        return "(no results)\n"
    base = _baseline(results, baseline)
    with_cost = any(r.cost_per_1m_tokens is not None for r in results)
    head = ["target", "precision", "cold start", "median ms", "p10 ms", "p90 ms", "throughput",
            "peak memory", "compiles / fallbacks (timed)", f"vs {base.target.name}"]
    head += ["per 1M tokens"] * with_cost + ["flags"]
    lines = [f"Median, p10 and p90 of {len(results[0].times_ms)} steps after {results[0].warmup} warm-up "
             "steps, each ending in a device sync; cold start: the first step alone.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_row(r, base, with_cost)) + " |" for r in results]
    return "\n".join(lines) + "\n"


def to_json(results: Sequence[Result], path: str) -> None:
    with open(path, "w") as f:
        json.dump({"environment": environment(), "results": [dataclasses.asdict(r) for r in results]}, f, indent=1)


def plot(results: Sequence[Result], path: str, title: str = "") -> None:
    """A PNG bar chart: median step time per target, p10-p90 as error bars, flagged bars hatched."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.6 * len(results) + 2, 4))
    medians = [r.median_ms for r in results]
    spread = [[r.median_ms - r.p10_ms for r in results], [r.p90_ms - r.median_ms for r in results]]
    bars = ax.bar([r.target.name for r in results], medians, yerr=spread, capsize=4, color="tab:blue")
    for bar, r in zip(bars, results):
        if r.flags:
            bar.set_hatch("//")
            bar.set_color("tab:orange")
    ax.set_ylabel("ms per step (median, p10-p90)")
    ax.set_title(title or "step time; hatched: flagged (not a steady state or other precision)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------- CLI

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m torch_pjrt.bench", description=__doc__.split("\n\n")[0],
        epilog="The models (torch_pjrt/_bench_steps.py) are the checkout's examples/models.py: "
               "run from a checkout of the repository (the editable install).")
    p.add_argument("--model", required=True, choices=["gpt", "mlp", "cnn", "hf-gpt2"])
    p.add_argument("--targets", default="compiled,fused,strict,cpu,inductor",
                   help=f"comma-separated, of {', '.join(STANDARD_TARGETS)}")
    p.add_argument("--baseline", default="cpu", help="the target the ratio column divides by")
    p.add_argument("--baseline-device", default="cpu", help="device of the cpu and inductor targets (cuda on a GPU)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--hourly-rate", type=float, default=None, help="device cost per hour: adds cost per 1M tokens")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--md", help="write the Markdown table here")
    p.add_argument("--json", help="write the results and the environment here")
    p.add_argument("--png", help="write the plot here")
    p.add_argument("--quiet", action="store_true", help="no progress lines (on stderr) while it runs")
    p.add_argument("--plugins", default="",
                   help="comma-separated PJRT plugins (TORCH_PJRT_PLUGIN values, e.g. cpu,xla-cpu-pjrt, each "
                        "optionally with XLA options: 'xla-cpu-pjrt[xla_cpu_use_xnnpack=false;...]'): the pjrt "
                        "targets run once per plugin, each plugin in a process of its own, in one table")
    return p


def _progress(line: str) -> None:
    import sys

    print(f"bench: {line}", file=sys.stderr, flush=True)


def _plugin_label(plugin: str) -> str:
    if plugin != "cpu":
        return plugin
    from torch_pjrt import _plugins
    return f"cpu={_plugins.DEFAULT_CPU_PLUGIN}"


def _renamed(result: Result, plugin: str) -> Result:
    return dataclasses.replace(result, target=dataclasses.replace(
        result.target, name=f"{result.target.name} [{_plugin_label(plugin)}]"))


def _results_from_json(path: str) -> list[Result]:
    with open(path) as f:
        rows = json.load(f)["results"]
    return [Result(**{**row, "target": Target(**row["target"])}) for row in rows]


def _run_on_plugin(plugin: str, args: argparse.Namespace, pjrt_keys: list[str]) -> list[Result]:
    """The pjrt targets on another plugin: this command again, in a process started with it."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "results.json")
        cmd = [sys.executable, "-m", "torch_pjrt.bench", "--model", args.model, "--targets", ",".join(pjrt_keys),
               "--warmup", str(args.warmup), "--iters", str(args.iters), "--json", out]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        name, _, options = plugin.partition("[")
        env = {**os.environ, "TORCH_PJRT_PLUGIN": name,
               "TORCH_PJRT_XLA_OPTIONS": options.rstrip("]").replace(";", ",")}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"torch_pjrt.bench on plugin {plugin!r} failed:\n{done.stdout}\n{done.stderr}")
        return [_renamed(r, plugin) for r in _results_from_json(out)]


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from torch_pjrt._bench_steps import MODELS  # needs the checkout's examples/

    make_step, tokens_per_step = MODELS[args.model]
    keys = [k for k in args.targets.split(",") if k]
    targets = standard_targets(keys, args.baseline_device)
    plugins = [p for p in args.plugins.split(",") if p]
    results = benchmark(make_step, targets, args.warmup, args.iters, tokens_per_step, args.hourly_rate,
                        progress=None if args.quiet else _progress)
    if plugins:
        # This process's plugin first, then every other one in a process of its own.
        here = os.environ.get("TORCH_PJRT_PLUGIN", "cpu") or "cpu"
        pjrt_keys = [k for k, t in zip(keys, targets) if _is_pjrt(t.device)]
        results = [_renamed(r, here) if _is_pjrt(r.target.device) else r for r in results]
        for plugin in plugins:
            if plugin != here:
                results += _run_on_plugin(plugin, args, pjrt_keys)
        _flag_precision(results)
    baseline = dict(zip(keys, targets)).get(args.baseline)
    baseline_name = None
    if baseline is not None:  # a pjrt baseline was renamed after its plugin
        baseline_name = next(r.target.name for r in results if r.target.name.startswith(baseline.name))
    table = to_markdown(results, baseline_name)
    print(f"{args.model}: {environment()}\n\n{table}")
    if args.md:
        with open(args.md, "w") as f:
            f.write(table)
    if args.json:
        to_json(results, args.json)
    if args.png:
        plot(results, args.png, f"{args.model} training step")


if __name__ == "__main__":
    main()
