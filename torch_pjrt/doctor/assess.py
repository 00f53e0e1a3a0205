"""From a run (and its parity and debug re-runs) to graded levels."""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, field
from typing import Any

import torch_pjrt

from .findings import LEVELS, Finding, grade
from .session import RunResult

# Loss parity against CPU float32: float32 kernels that only order sums
# differently stay within ~1e-5 relative over a few steps; 1e-3 leaves room
# for fused/fast-math differences; beyond 1e-2 something computes differently.
PARITY_WARN = 1e-3
PARITY_FAIL = 1e-2
# Under autocast (bf16 keeps 8 bits: 2^-8 = 4e-3 per rounding) against the
# float32 reference, losses differ by ~1e-2 even when all is well.
AUTOCAST_PARITY_WARN = 3e-2
AUTOCAST_PARITY_FAIL = 1e-1


@dataclass
class Options:
    parity: bool = False
    hourly_rate: float | None = None
    baseline_rate: float | None = None
    baseline_throughput: float | None = None
    tokens_per_step: int | None = None
    samples_per_step: int | None = None


@dataclass
class Report:
    script: str
    argv: list[str]
    levels: dict[int, dict[str, Any]]
    findings: list[Finding]
    summary: dict[str, Any]
    steps: list[dict[str, Any]]
    crash: dict[str, Any] | None = None
    checked: dict[int, bool] = field(default_factory=dict)


def _warmup(steps: list[Any]) -> int:
    """Steps to discard: up to the last one that compiled in the first half, at least one."""
    n = len(steps)
    compiled = [i for i, s in enumerate(steps[: max(1, n // 2)]) if s.compiles > 0]
    return min(n - 1, max(1, compiled[-1] + 1 if compiled else 1)) if n > 1 else 0


def _units(run: RunResult, opts: Options) -> tuple[str, float | None, str]:
    if opts.tokens_per_step:
        return "tokens", float(opts.tokens_per_step), "--tokens-per-step"
    if opts.samples_per_step:
        return "samples", float(opts.samples_per_step), "--samples-per-step"
    if run.record.first_input is not None:
        kind, shape = run.record.first_input
        n = math.prod(shape) if kind == "tokens" else shape[0]
        return kind, float(n), f"the model's first input {list(shape)}"
    return "steps", 1.0, "no model input seen"


def assess(run: RunResult, opts: Options, cpu_run: RunResult | None = None,
           debug_run: RunResult | None = None) -> Report:
    found = run.findings
    steps = run.record.steps
    summary: dict[str, Any] = {"target": run.target, "seconds": run.seconds, "steps": len(steps),
                               "step_source": run.record.step_source}
    checked = {1: True, 2: True, 3: False, 4: True, 5: bool(steps), 6: False}

    # Level 2: attention written by hand.
    if run.record.manual_attention and run.record.sdpa_calls == 0:
        for (file, line), count in run.record.manual_attention.items():
            found.add(Finding(2, "attention_not_sdpa", "softmax over a square score matrix: attention written by "
                              "hand, not F.scaled_dot_product_attention (one fused op on every backend)",
                              file, line, count))

    # Level 3: losses against the CPU, NaN/Inf located in debug mode.
    losses = run.losses
    bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
    if bad is not None:
        checked[3] = True
        where = debug_run.crash if debug_run is not None and debug_run.crash is not None else None
        msg = f"loss is {losses[bad]} at step {bad}"
        if where is not None:
            msg += f"; first NaN/Inf: {where.message}"
        found.add(Finding(3, "nonfinite", msg, where.file if where else None, where.line if where else None,
                          severity="fail", data={"step": bad}))
    if opts.parity and cpu_run is None:
        checked[3] = True
        found.add(Finding(3, "parity", "the CPU reference run did not finish (it ran past an hour or died)",
                          severity="warn"))
    if opts.parity and cpu_run is not None:
        checked[3] = True
        ref = cpu_run.losses
        n = min(len(ref), len(losses))
        errors = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses[:n], ref[:n])]
        summary["parity"] = {"steps_compared": n, "max_rel_error": max(errors) if errors else None,
                             "per_step_rel_error": errors}
        if n == 0:
            found.add(Finding(3, "parity", "no loss (a tensor passed to .backward()) to compare", severity="warn"))
        elif len(ref) < len(losses):  # more on the CPU: the script's own CPU reference run, after
            found.add(Finding(3, "parity", f"the CPU run saw {len(ref)} losses, pjrt {len(losses)}", severity="warn"))
        worst = max(errors) if errors else 0.0
        if n:
            warn, fail = (AUTOCAST_PARITY_WARN, AUTOCAST_PARITY_FAIL) if run.used_autocast else (PARITY_WARN,
                                                                                             PARITY_FAIL)
            sev = "fail" if worst > fail else "warn" if worst > warn else "info"
            step = errors.index(worst)
            found.add(Finding(3, "parity", f"max relative loss error vs CPU float32: {worst:.2e} (step {step}; "
                              f"warn above {warn:g}, fail above {fail:g}"
                              + (", autocast's thresholds" if run.used_autocast else "") + ")", severity=sev,
                              data={"max_rel_error": worst, "step": step, "autocast": run.used_autocast}))
        if cpu_run.crash is not None:
            found.add(Finding(3, "parity", f"the CPU reference run failed: {cpu_run.crash.message}",
                              cpu_run.crash.file, cpu_run.crash.line, severity="warn"))

    # Level 4: syncs per step, steady-state compiles, compiled functions.
    n_steps = max(1, len(steps))
    for (file, line, what), count in run.record.sync_sites.items():
        per_step = count / n_steps
        found.add(Finding(4, "host_sync", f"{what}: the host waits for the device ({per_step:.1f} per step)",
                          file, line, count, severity="warn" if steps and per_step >= 1 else "info"))
    warm = _warmup(steps)
    late = [i for i, s in enumerate(steps) if i >= warm and s.compiles > 0]
    if late:
        found.add(Finding(4, "steady_state_compiles", f"still compiling after warm-up: steps {late[:10]} "
                          f"compiled {sum(steps[i].compiles for i in late)} programs", severity="warn"))
    compiled = run.metrics.get("compiled", {}) if run.metrics else {}
    for name, stats in compiled.items():
        if stats.get("storm"):
            found.add(Finding(4, "recompile_storm", stats["storm"], severity="fail", data={"function": name}))
        for why in stats.get("eager_graphs", []):
            found.add(Finding(4, "eager_graph", f"{name}: a graph runs op by op: {why}", severity="warn"))
    if run.target != "cpu":
        summary["eager_mode"] = torch_pjrt.eager_mode()
        if steps and summary["eager_mode"] == "fused":
            summary["fused_graphs_per_step"] = statistics.median([s.fused_graphs for s in steps[warm:]] or [0])

    # Level 5: cold start, steady state, memory, transfers.
    if steps:
        timed = steps[warm:] or steps
        ms = sorted(s.seconds * 1e3 for s in timed)
        kind, per_step, basis = _units(run, opts)
        median = statistics.median(ms)
        summary.update({
            "cold_start_s": steps[0].seconds, "warmup_steps": warm, "median_step_ms": median,
            "p10_step_ms": ms[int(0.1 * (len(ms) - 1))], "p90_step_ms": ms[int(0.9 * (len(ms) - 1))],
            "throughput": per_step / (median / 1e3) if per_step else None, "throughput_unit": f"{kind}/s",
            "throughput_basis": basis, "peak_device_memory_bytes": run.peak_memory,
            "h2d_bytes_per_step": statistics.median(s.h2d_bytes for s in timed),
            "d2h_bytes_per_step": statistics.median(s.d2h_bytes for s in timed),
        })
        found.add(Finding(5, "timing", f"first step {steps[0].seconds:.2f} s (cold start); steady state "
                          f"{median:.1f} ms/step after {warm} warm-up steps, {summary['throughput']:,.0f} {kind}/s",
                          severity="info"))
        if sum(s.fallbacks for s in timed):
            found.add(Finding(5, "steady_state_fallbacks", "CPU fallbacks in every steady-state step cost "
                              "two host transfers each", severity="warn"))
    else:
        found.add(Finding(5, "timing", "no optimizer.step() seen: step timing not measured", severity="warn"))

    # Level 6: cost.
    if opts.hourly_rate and summary.get("throughput"):
        checked[6] = True
        unit = summary["throughput_unit"].split("/")[0]
        cost = opts.hourly_rate / 3600 / summary["throughput"] * 1e6
        summary["cost_per_1m"] = cost
        found.add(Finding(6, "cost", f"${cost:.4f} per 1M {unit} at ${opts.hourly_rate}/h", severity="info"))
        if opts.baseline_rate and opts.baseline_throughput:
            base = opts.baseline_rate / 3600 / opts.baseline_throughput * 1e6
            summary["baseline_cost_per_1m"] = base
            found.add(Finding(6, "cost_vs_baseline", f"baseline ${base:.4f} per 1M {unit}: this run costs "
                              f"{cost / base:.2f}x", severity="warn" if cost > base else "info"))

    crash = None
    if run.crash is not None:
        c = run.crash
        crash = {"type": c.type, "message": c.message, "file": c.file, "line": c.line, "traceback": c.traceback}
        found.add(Finding(0, "crash", f"the script raised {c.type}: {c.message}", c.file, c.line, severity="fail"))

    findings = found.all()
    levels = {n: {"name": name, "grade": grade([f for f in findings if f.level == n], checked[n])}
              for n, name in LEVELS.items()}
    steps_json = [{"seconds": s.seconds, "host_syncs": s.host_syncs, "compiles": s.compiles,
                   "fused_graphs": s.fused_graphs, "h2d_bytes": s.h2d_bytes, "d2h_bytes": s.d2h_bytes,
                   "fallbacks": s.fallbacks} for s in steps]
    return Report(os.path.relpath(run.script), run.argv, levels, findings, summary, steps_json, crash, checked)
