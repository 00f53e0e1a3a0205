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

# Float32 values below the smallest normal number are denormals, which XLA's CPU code flushes to
# zero (as any flush-to-zero mode does). A tensor whose exact values are below tiny / eps (1e-31)
# may have been computed from such intermediates, each off by up to `tiny` and then scaled up by
# the layers after it (PP-LCNet's first convolution's gradient, 4e-36, is 12% off on the device
# and exact on the CPU), so the ulps floor is never taken of less than tiny / eps^2: such tensors
# are held to an absolute 16 x tiny / eps (1.6e-30), far below any value that moves training.
FLOOR_SCALE = torch.finfo(torch.float32).tiny / torch.finfo(torch.float32).eps ** 2

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
                 float32: torch.Tensor, factor: float = FACTOR, floor_scale: float = FLOOR_SCALE) -> None:
    """One tensor into `result` (float64 CPU tensors of one shape expected); the ulps floor is
    taken of at least `floor_scale`."""
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
    result.judge(0, name, device, exact, [float32], factor, floor_scale=max(floor_scale, FLOOR_SCALE))


def random_forward(first: Run, second: Run) -> str:
    """The first tensor that differs between two CPU float32 runs under other seeds ("" when
    none): the forward draws random numbers (noise, a random mask) that no other run can
    draw alike, so no run is a reference for another."""
    for kind, a, b in (("out:", first.outputs, second.outputs), ("grad:", first.grads, second.grads)):
        for name, t in a.items():
            u = b.get(name)
            if t is None or u is None:
                continue
            if t.shape != u.shape or not torch.equal(t.nan_to_num(), u.nan_to_num()):
                return f"{kind}{name} changes with the seed (give what it draws as an input)"
    return ""


def references_disagree(float32: Run, exact: Run) -> str:
    """The first tensor whose shape or non-finite elements differ between the CPU's float32 and
    float64 runs ("" when none): float64 is then no reference for it (Longformer's float64
    gradients are NaN where float32's are finite; VITS draws noise in its forward)."""
    pairs = [("out:" + n, t, float32.outputs.get(n)) for n, t in exact.outputs.items()]
    pairs += [("grad:" + n, t, float32.grads.get(n)) for n, t in exact.grads.items()]
    for name, e, f in pairs:
        if e is None or f is None:
            continue
        if e.shape != f.shape:  # a random forward (VITS' noise) or one whose shapes follow its values
            return f"{name}: shape {tuple(f.shape)} in float32, {tuple(e.shape)} in float64"
        bad_e, bad_f = ~torch.isfinite(e), ~torch.isfinite(f)
        if not torch.equal(bad_e, bad_f):
            return (f"{name}: {int(bad_e.sum())} non-finite elements in float64, {int(bad_f.sum())} in float32")
    return ""


def module_scales(grads: dict[str, torch.Tensor | None]) -> dict[str, float]:
    """Per module (every prefix of a parameter's name, "" the whole model): the largest float64
    gradient of the parameters under it."""
    scales: dict[str, float] = {}
    for name, g in grads.items():
        if g is None or g.numel() == 0 or not g.is_floating_point():
            continue
        top = g[torch.isfinite(g)].abs().max().item() if torch.isfinite(g).any() else 0.0
        parts = name.split(".")
        for k in range(len(parts)):
            prefix = ".".join(parts[:k])
            scales[prefix] = max(scales.get(prefix, 0.0), top)
    return scales


def gradient_floor(name: str, scales: dict[str, float]) -> float:
    """The scale a parameter's gradient is rounded at: a gradient that cancels to (nearly) zero,
    such as the bias of a norm whose output is normalized again, is a sum of terms as large as
    its module's other gradients; where they all cancel exactly (a block whose output the loss
    does not depend on), as large as those of the nearest enclosing module that has any."""
    module = name.rsplit(".", 1)[0] if "." in name else ""
    while True:
        if scales.get(module, 0.0) > 0 or not module:
            return scales.get(module, 0.0)
        module = module.rsplit(".", 1)[0] if "." in module else ""


def compare(device: Run, exact: Run, float32: Run, factor: float = FACTOR) -> Comparison:
    """Every output and gradient of float64's run, judged on the device's."""
    result = Comparison(steps=1)
    scales = module_scales(exact.grads)
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
        judge_tensor(result, "grad:" + name, got_grad, want_grad, f32 if f32 is not None else want_grad, factor,
                     gradient_floor(name, scales))
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
        what = max(comparison.mismatches, key=lambda m: m.error / m.allowed if m.allowed else float("inf"))
        detail = (f"{what.tensor}: error {what.error:.3g}, bound {what.allowed:.3g}, max|float64| {what.scale:.3g}"
                  if what.error == what.error and what.error != float("inf") else what.tensor)
        more = len(comparison.mismatches) - 1
        return Verdict(MISMATCH, detail + (f" (+{more} more tensors)" if more else ""), ratio, at, fallbacks)
    if fallbacks:
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(fallbacks.items()))
        return Verdict(FALLS_BACK, ops, ratio, at, fallbacks)
    return Verdict(PASS, "", ratio, at, fallbacks)
