"""Judging float32 results the way numerical people do: the device's distance to
a float64 CPU reference, against float32's own distance to it.

A float32 training curve drifts from the exact one as rounding errors grow,
and it can jump: a value within an ulp of a ReLU's kink, a max-pool tie or an
argmax flips on one machine and not on another, and the runs part for good.
How often depends on the kernels a machine picks (AVX2 vs AVX-512, XLA vs
ATen summation orders), so a fixed tolerance between two float32 runs passes
on one CPU and fails on another. What must hold on every CPU is that the
device is not much less accurate than float32 itself can be on this problem.

float32's accuracy on the problem is measured, not assumed: the plain CPU
float32 run and runs whose parameters are moved by about one ulp after every
step (random-perturbation arithmetic, a standard way to estimate how rounding
errors propagate; it stands in for "another float32 implementation") are
compared with the float64 run. Over the whole curve, the device may be at
most FACTOR times farther from float64 than the worst of those runs, plus a
few ulps of the value.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

EPS32 = torch.finfo(torch.float32).eps
FACTOR = 4.0      # the device may be this many times farther from float64 than the worst float32 run
ULPS = 16.0       # plus this many float32 ulps of the value: the floor where all errors are rounding
PERTURBED = 6     # float32 runs perturbed after every step
JITTER_ULPS = 4.0  # by this many ulps (relative, normal): another float32 summation order

# run(model, dtype, jitter) trains the model on the CPU in `dtype` (moving its parameters by
# one ulp after each step when `jitter` is given) and returns (losses, trained model).
Run = Callable[[torch.nn.Module, torch.dtype, "torch.Generator | None"], tuple[list[float], torch.nn.Module]]


@dataclass
class Reference:
    ref64: list[float]
    model64: torch.nn.Module
    curves32: list[list[float]] = field(default_factory=list)   # plain CPU float32 first, then perturbed
    models32: list[torch.nn.Module] = field(default_factory=list)


def jitter_ulp(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Moves every floating-point parameter by about one float32 ulp (relative)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.mul_(1 + JITTER_ULPS * EPS32 * torch.randn(p.shape, generator=gen).to(p.dtype))


def references(model: torch.nn.Module, run: Run, n_perturbed: int = PERTURBED) -> Reference:
    ref64, model64 = run(copy.deepcopy(model), torch.float64, None)
    ref = Reference(ref64, model64)
    for k in range(n_perturbed + 1):
        jitter = torch.Generator().manual_seed(1000 + k) if k else None
        curve, trained = run(copy.deepcopy(model), torch.float32, jitter)
        ref.curves32.append(curve)
        ref.models32.append(trained)
    return ref


def assert_curve_within(device: Sequence[float], ref: Reference, what: str = "loss", factor: float = FACTOR) -> None:
    """Step by step: |device - ref64| <= factor * (worst float32 distance to ref64) + a few ulps.

    The worst over the whole curve, not up to each step: where a discrete event
    (a ReLU mask or max-pool choice flipping) parts the runs is chance; how far
    runs part after one is what the float32 runs measure."""
    dev = torch.tensor(list(device), dtype=torch.float64)
    exact = torch.tensor(ref.ref64, dtype=torch.float64)
    runs = torch.tensor(ref.curves32, dtype=torch.float64)
    assert dev.shape == exact.shape == runs.shape[1:], (dev.shape, exact.shape, runs.shape)
    e_dev = (dev - exact).abs()
    e_f32 = (runs - exact).abs().max(0).values
    envelope = e_f32.max().expand_as(e_f32)
    bound = factor * envelope + ULPS * EPS32 * exact.abs()
    bad = (e_dev > bound) | ~torch.isfinite(dev)
    if bad.any():
        step = int(bad.nonzero()[0])
        raise AssertionError(
            f"{what} at step {step}: device is {e_dev[step]:.3g} from the float64 reference, float32 runs at most "
            f"{envelope[step]:.3g} (allowed {factor}x + {ULPS} ulps = {bound[step]:.3g}); "
            f"device {dev[step]:.9g}, cpu float32 {runs[0, step]:.9g}, float64 {exact[step]:.9g}")


def assert_tensor_within(device: torch.Tensor, f32: Sequence[torch.Tensor], ref64: torch.Tensor,
                         what: str = "tensor", factor: float = FACTOR) -> None:
    """max |device - ref64| <= factor * (worst max |f32 run - ref64|) + a few ulps of the largest value."""
    dev, exact = device.detach().cpu().double(), ref64.detach().cpu().double()
    assert dev.shape == exact.shape, (dev.shape, exact.shape)
    e_dev = (dev - exact).abs().max().item()
    e_f32 = max((t.detach().cpu().double() - exact).abs().max().item() for t in f32)
    bound = factor * e_f32 + ULPS * EPS32 * exact.abs().max().item()
    assert torch.isfinite(dev).all() and e_dev <= bound, (
        f"{what}: device is {e_dev:.3g} from the float64 reference, float32 runs {e_f32:.3g} "
        f"(allowed {factor}x + {ULPS} ulps = {bound:.3g})")


def batches_as(batches: Sequence[tuple[torch.Tensor, ...]], dtype: torch.dtype) -> list[tuple[torch.Tensor, ...]]:
    """The same batches with floating-point tensors in `dtype` (integer targets kept)."""
    return [tuple(t.to(dtype) if t.is_floating_point() else t for t in b) for b in batches]
