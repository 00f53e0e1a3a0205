"""Judging a device run against float64, and a mode's status.

Each floating output and each parameter gradient passes when

    max|device - float64| <= FACTOR * max|cpu float32 - float64| + ULPS * eps32 * max|float64|

(torch_pjrt.qualify.differential's constants and Comparison.judge). Non-finite
elements must sit where float64 has them, with the same values; the bound is taken
over the finite ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from torch_pjrt.qualify.differential import FACTOR, Comparison, Mismatch

from .execute import Run

PASS, MISMATCH, ERROR, FALLS_BACK, TIMEOUT, CRASH = "pass", "mismatch", "error", "falls back", "timeout", "crash"
CPU_FAILS, NO_CONFIG = "cpu-fails", "no-config"
MODE_STATUSES = (PASS, MISMATCH, ERROR, FALLS_BACK, TIMEOUT, CRASH)
EXCLUDED = (CPU_FAILS, NO_CONFIG)


def _nonfinite_differs(device: torch.Tensor, exact: torch.Tensor) -> bool:
    bad = ~torch.isfinite(exact)
    if not torch.equal(bad, ~torch.isfinite(device)):
        return True
    return bool(bad.any()) and not torch.equal(device[bad].nan_to_num(), exact[bad].nan_to_num())


def judge_tensor(result: Comparison, name: str, device: torch.Tensor, exact: torch.Tensor,
                 float32: torch.Tensor, factor: float = FACTOR) -> None:
    """One tensor into `result` (float64 CPU tensors of one shape expected)."""
    if device.shape != exact.shape:
        result.mismatches.append(Mismatch(0, f"{name} (shape {tuple(device.shape)}, expected {tuple(exact.shape)})",
                                          float("nan"), 0.0, 0.0, 0.0))
        result.worst_ratio, result.worst_at = float("inf"), name
        return
    if device.is_floating_point() and _nonfinite_differs(device, exact):
        scale = exact[torch.isfinite(exact)].abs().max().item() if torch.isfinite(exact).any() else 0.0
        result.mismatches.append(Mismatch(0, f"{name} (non-finite values differ)", float("inf"), 0.0, 0.0, scale))
        result.worst_ratio, result.worst_at = float("inf"), name
        return
    if device.is_floating_point():
        keep = torch.isfinite(exact)
        device, exact, float32 = (torch.where(keep, t, torch.zeros_like(t)) for t in (device, exact, float32))
    result.judge(0, name, device, exact, [float32], factor)


def compare(device: Run, exact: Run, float32: Run, factor: float = FACTOR) -> Comparison:
    """Every output and gradient of float64's run, judged on the device's."""
    result = Comparison(steps=1)
    for name, want in exact.outputs.items():
        got = device.outputs.get(name)
        if got is None:
            result.mismatches.append(Mismatch(0, f"out:{name} (missing on the device)", float("nan"), 0.0, 0.0, 0.0))
            continue
        judge_tensor(result, "out:" + name, got, want, float32.outputs[name], factor)
    for name, want_grad in exact.grads.items():
        got_grad = device.grads.get(name)
        if want_grad is None:
            if got_grad is not None and bool(got_grad.ne(0).any()):
                result.mismatches.append(Mismatch(0, f"grad:{name} (nonzero, float64 has none)",
                                                  float("nan"), 0.0, 0.0, 0.0))
            continue
        if got_grad is None:
            if bool(want_grad.ne(0).any()):
                result.mismatches.append(Mismatch(0, f"grad:{name} (missing on the device)",
                                                  float("nan"), 0.0, 0.0, 0.0))
            continue
        f32 = float32.grads.get(name)
        judge_tensor(result, "grad:" + name, got_grad, want_grad, f32 if f32 is not None else want_grad, factor)
    return result


@dataclass
class Verdict:
    status: str
    detail: str = ""
    worst_ratio: float = 0.0  # largest error / bound over every tensor
    worst_at: str = ""
    fallbacks: dict[str, int] = field(default_factory=dict)


def verdict(comparison: Comparison | None, fallbacks: dict[str, int], error: str = "") -> Verdict:
    """error > mismatch > falls back > pass: a mismatch is the worse news when both happen
    (the fallen-back ops are listed either way)."""
    if error:
        return Verdict(ERROR, error, fallbacks=fallbacks)
    assert comparison is not None
    ratio, at = comparison.worst_ratio, comparison.worst_at.removeprefix("step 0, ")
    if not comparison.passed:
        first = comparison.mismatches[0]
        worst = max(comparison.mismatches, key=lambda m: m.error / m.allowed if m.allowed else float("inf"))
        what = worst if worst.allowed else first
        detail = (f"{what.tensor}: error {what.error:.3g}, bound {what.allowed:.3g}" if what.allowed
                  else f"{what.tensor}")
        more = len(comparison.mismatches) - 1
        return Verdict(MISMATCH, detail + (f" (+{more} more tensors)" if more else ""), ratio, at, fallbacks)
    if fallbacks:
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(fallbacks.items()))
        return Verdict(FALLS_BACK, ops, ratio, at, fallbacks)
    return Verdict(PASS, "", ratio, at, fallbacks)
