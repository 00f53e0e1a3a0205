"""Differential training: every step's gradients and parameters on the device
against a float64 CPU run, within a bound measured from float32 itself.

A float32 run parts from the exact (float64) one as rounding errors grow, and
how fast depends on the problem and on the kernels a CPU picks, so no fixed
tolerance is right on every machine. What must hold everywhere is that the
device is not much less accurate than float32 itself is on this problem. That
accuracy is measured: the CPU float32 run, and float32 runs whose parameters
are moved by a few ulps after every step (random-perturbation arithmetic,
standing in for "another float32 implementation", another summation order),
are compared with the float64 run, tensor by tensor and step by step.

At step s, for each gradient, parameter and buffer t:

    max|device - float64| <= FACTOR * max over steps <= s of (worst float32 run's max|run - float64|)
                             + ULPS * eps32 * max|float64|

A kernel that computes with stale weights is off by a large fraction of the
values (26% for the embedding gradient of the repro that motivated this);
rounding differences are a few ulps. The bound sits between the two.

Models judged this way must be smooth: at a kink (ReLU at 0, a max-pool near-tie)
two correct float32 runs can take different branches by chance, and the runs
part at that step by far more than rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch

EPS32 = torch.finfo(torch.float32).eps
FACTOR = 8.0  # the device may be this many times farther from float64 than the worst float32 run
ULPS = 16.0  # plus this many float32 ulps of the largest value: the floor where all errors are rounding
PERTURBED = 4  # float32 runs perturbed after every step, beside the plain one
JITTER_ULPS = 4.0  # by this many ulps (relative, normal)

Batch = tuple[torch.Tensor, ...]
# loss(model, batch) on the model's device; batches are CPU tensors, moved by the harness.
LossFn = Callable[[torch.nn.Module, Batch], torch.Tensor]
MakeOptimizer = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]
# One step's record: "grad:<name>", "param:<name>", "buffer:<name>" -> float64 CPU tensor.
Record = dict[str, torch.Tensor]


@dataclass
class Problem:
    """A model (built seeded, on the CPU, float32), its batches and loss."""

    make_model: Callable[[], torch.nn.Module]
    batches: list[Batch]
    loss: LossFn
    make_optimizer: MakeOptimizer
    steps: int = 10


@dataclass
class Reference:
    """The float64 run's records and float32's measured distance to them."""

    exact: list[Record]
    float32_error: list[dict[str, float]]  # per step and tensor: worst float32 run's max abs error
    float32_loss: list[float] = field(default_factory=list)


def _move(batch: Batch, device: str, dtype: torch.dtype) -> Batch:
    return tuple(t.to(device, dtype) if t.is_floating_point() else t.to(device) for t in batch)


def _jitter(model: torch.nn.Module, gen: torch.Generator) -> None:
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                noise = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.device, p.dtype)
                p.mul_(1 + JITTER_ULPS * EPS32 * noise)


def _record(model: torch.nn.Module) -> Record:
    """Gradients, parameters and floating-point buffers, as float64 CPU tensors (one sync)."""
    out: Record = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            out["grad:" + name] = p.grad.detach()
        out["param:" + name] = p.detach()
    for name, b in model.named_buffers():
        if b.is_floating_point():
            out["buffer:" + name] = b.detach()
    return {k: v.to("cpu", torch.float64, copy=True) for k, v in out.items()}  # a copy: never the live tensor


def train(problem: Problem, device: str, dtype: torch.dtype = torch.float32,
          compile_backend: str | None = None, jitter: torch.Generator | None = None,
          mode: AbstractContextManager[object] | None = None,
          trained: list[torch.nn.Module] | None = None) -> Iterator[tuple[float, Record]]:
    """Trains a fresh copy of the model; yields (loss, record) after every optimizer step.
    The model is appended to `trained` when given (to look at it after the run)."""
    model = problem.make_model().to(device=device, dtype=dtype)
    if trained is not None:
        trained.append(model)
    opt = problem.make_optimizer(list(model.parameters()))
    forward: Callable[[Batch], torch.Tensor] = lambda b: problem.loss(model, b)  # noqa: E731
    if compile_backend is not None:
        forward = torch.compile(forward, backend=compile_backend, dynamic=False)
    with mode if mode is not None else nullcontext():
        for step in range(problem.steps):
            batch = _move(problem.batches[step % len(problem.batches)], device, dtype)
            opt.zero_grad(set_to_none=True)
            loss = forward(batch)
            loss.backward()
            opt.step()
            record = _record(model)
            yield float(loss.detach().to("cpu")), record
            if jitter is not None:
                _jitter(model, jitter)


def _errors(record: Record, exact: Record) -> dict[str, float]:
    if record.keys() != exact.keys():
        missing, extra = exact.keys() - record.keys(), record.keys() - exact.keys()
        raise AssertionError(f"the runs record different tensors: missing {sorted(missing)}, extra {sorted(extra)}")
    return {k: (record[k] - exact[k]).abs().max().item() if record[k].numel() else 0.0 for k in exact}


def reference(problem: Problem, perturbed: int = PERTURBED) -> Reference:
    exact = [rec for _, rec in train(problem, "cpu", torch.float64)]
    worst: list[dict[str, float]] = [dict.fromkeys(r, 0.0) for r in exact]
    losses: list[float] = []
    for k in range(perturbed + 1):
        jitter = torch.Generator().manual_seed(1000 + k) if k else None
        for step, (loss, rec) in enumerate(train(problem, "cpu", torch.float32, jitter=jitter)):
            if k == 0:
                losses.append(loss)
            for name, err in _errors(rec, exact[step]).items():
                worst[step][name] = max(worst[step][name], err)
    return Reference(exact, worst, losses)


@dataclass
class Mismatch:
    step: int
    tensor: str
    error: float  # max |device - float64|
    float32_error: float  # the envelope: worst float32 run up to this step
    allowed: float
    scale: float  # max |float64|

    def __str__(self) -> str:
        return (f"step {self.step}, {self.tensor}: device is {self.error:.3g} from float64 "
                f"({self.error / self.scale if self.scale else float('inf'):.2g} of its largest value), "
                f"float32 CPU runs at most {self.float32_error:.3g}, allowed {self.allowed:.3g}")


@dataclass
class Comparison:
    steps: int
    worst_ratio: float  # max over steps and tensors of error / allowed (< 1 passes)
    worst_at: str  # where: "step S, tensor"
    mismatches: list[Mismatch]
    device_loss: list[float]

    @property
    def passed(self) -> bool:
        return not self.mismatches


def compare(records: Iterator[tuple[float, Record]], ref: Reference, factor: float = FACTOR) -> Comparison:
    """Compares a device run's records with the reference, step by step."""
    envelope: dict[str, float] = {}
    worst_ratio, worst_at = 0.0, ""
    mismatches: list[Mismatch] = []
    losses: list[float] = []
    for step, (loss, rec) in enumerate(records):
        losses.append(loss)
        exact = ref.exact[step]
        for name, err in _errors(rec, exact).items():
            envelope[name] = max(envelope.get(name, 0.0), ref.float32_error[step][name])
            scale = exact[name].abs().max().item() if exact[name].numel() else 0.0
            allowed = factor * envelope[name] + ULPS * EPS32 * scale
            finite = bool(torch.isfinite(rec[name]).all())
            ratio = err / allowed if allowed > 0 else (0.0 if err == 0 else float("inf"))
            if not finite or ratio > worst_ratio:
                worst_ratio, worst_at = (ratio if finite else float("inf")), f"step {step}, {name}"
            if not finite or ratio > 1:
                mismatches.append(Mismatch(step, name, err if finite else float("nan"), envelope[name], allowed,
                                           scale))
    if len(losses) != len(ref.exact):
        raise AssertionError(f"the device ran {len(losses)} steps, the reference {len(ref.exact)}")
    return Comparison(len(losses), worst_ratio, worst_at, mismatches, losses)


def describe(comparison: Comparison, limit: int = 3) -> str:
    """A verdict's detail: the first mismatches, or how close the run came to the bound."""
    if comparison.passed:
        return (f"{comparison.steps} steps, every gradient and parameter within its bound; closest "
                f"{comparison.worst_ratio:.2f} of it ({comparison.worst_at})")
    first: Sequence[Mismatch] = comparison.mismatches[:limit]
    more = len(comparison.mismatches) - len(first)
    return "; ".join(str(m) for m in first) + (f"; and {more} more" if more else "")


def run_on_device(problem: Problem, ref: Reference, device: str, mode: str) -> Comparison:
    """mode: strict, fused (eager modes) or compiled (torch.compile(backend="pjrt") over fused eager)."""
    import torch_pjrt

    eager = "fused" if mode == "compiled" else mode
    backend = "pjrt" if mode == "compiled" else None
    if backend is not None:
        torch._dynamo.reset()
    try:
        return compare(train(problem, device, compile_backend=backend, mode=torch_pjrt.eager_mode(eager)), ref)
    finally:
        if backend is not None:
            torch._dynamo.reset()


__all__ = ["FACTOR", "Comparison", "Problem", "Reference", "compare", "describe", "reference", "run_on_device",
           "train"]
