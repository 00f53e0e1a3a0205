"""Differential training: every step's gradients, parameters and buffers on the
device against float64 CPU computations from the same state, within a bound
measured from float32 itself.

The device trains on its own. After each optimizer step its state is copied
back, and the step is replayed on the CPU from the state the device had before
it (parameters, buffers, optimizer state, the same batch):
- in float64: the exact gradients, loss and BatchNorm statistics of that
  state, and the optimizer's update applied, in float64, to the device's own
  gradients;
- in float32, plainly and with the parameters moved by a few ulps (random-
  perturbation arithmetic, standing in for "another float32 implementation",
  another summation order): how far float32 itself lands from float64 on
  this very step.
A tensor passes when

    max|device - float64| <= FACTOR * (worst float32 replay's max|replay - float64|) + ULPS * eps32 * max|float64|

Replaying from the device's own state keeps every comparison to one step of
rounding: nothing accumulates, no chaotic drift between runs has to be allowed
for, and the update is judged on the gradients it was given, so Adam's
division of each gradient element by its own size (which turns the rounding
of a near-zero element into a parameter difference of up to lr/4eps times it)
cannot part correct runs. A kernel that computes with stale weights is off by
a large fraction of the values (26% for the embedding gradient of the repro
that motivated this); rounding differences are a few ulps. The bound sits
between the two.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

EPS32 = torch.finfo(torch.float32).eps
# The device may be this many times farther from float64 than the worst float32 replay: XLA sums in
# other orders than PyTorch's CPU kernels, and on long sums (a BatchNorm bias gradient over 4096
# terms) its error was seen at 0.73 of an 8x bound. Bugs sit orders of magnitude further out.
FACTOR = 16.0
ULPS = 16.0  # plus this many float32 ulps of the largest value: the floor where all errors are rounding
PERTURBED = 2  # float32 replays from ulp-perturbed parameters, beside the plain one
JITTER_ULPS = 4.0  # by this many ulps (relative, normal)

Batch = tuple[torch.Tensor, ...]
# loss(model, batch) on the model's device; batches are CPU tensors, moved by the harness.
LossFn = Callable[[torch.nn.Module, Batch], torch.Tensor]
MakeOptimizer = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]


@dataclass
class Problem:
    """A model (built seeded, on the CPU, float32), its batches, loss and optimizer."""

    make_model: Callable[[], torch.nn.Module]
    batches: list[Batch]
    loss: LossFn
    make_optimizer: MakeOptimizer
    steps: int = 10


@dataclass
class State:
    """A training state on the CPU: float64 copies of floating tensors, others as they are."""

    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    optimizer: dict[str, Any] | None  # optimizer.state_dict(), tensors on the CPU; None before the first step
    grads: dict[str, torch.Tensor] = field(default_factory=dict)  # of the step that led here
    loss: float = float("nan")


def _cpu(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy (never the live tensor), floating point widened to float64."""
    return t.detach().to("cpu", torch.float64 if t.is_floating_point() else t.dtype, copy=True)


def _cpu_tree(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)  # optimizer state keeps its dtypes (step counts)
    if isinstance(value, dict):
        return {k: _cpu_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cpu_tree(v) for v in value]
    return value


def capture(model: torch.nn.Module, opt: torch.optim.Optimizer | None, loss: torch.Tensor | None = None) -> State:
    """The model's and optimizer's state as CPU copies (one sync)."""
    state = State({n: _cpu(p) for n, p in model.named_parameters()},
                  {n: _cpu(b) for n, b in model.named_buffers()},
                  _cpu_tree(opt.state_dict()) if opt is not None and opt.state else None)
    state.grads = {n: _cpu(p.grad) for n, p in model.named_parameters() if p.grad is not None}
    if loss is not None:
        state.loss = float(loss.detach().to("cpu"))
    return state


def _move(batch: Batch, device: str, dtype: torch.dtype) -> Batch:
    return tuple(t.to(device, dtype) if t.is_floating_point() else t.to(device) for t in batch)


def _jitter(model: torch.nn.Module, gen: torch.Generator) -> None:
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                noise = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype)
                p.mul_(1 + JITTER_ULPS * EPS32 * noise)


@dataclass
class Replay:
    loss: float
    grads: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]  # after the forward (BatchNorm statistics)
    params: dict[str, torch.Tensor]  # after the optimizer step


def replay(problem: Problem, before: State, batch: Batch, dtype: torch.dtype,
           step_grads: dict[str, torch.Tensor] | None = None, jitter: torch.Generator | None = None) -> Replay:
    """One training step on the CPU in `dtype` from `before`. The optimizer steps on
    `step_grads` (the device's gradients) when given, else on the replay's own."""
    model = problem.make_model().to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(before.params[name])
        for name, b in model.named_buffers():
            b.copy_(before.buffers[name])
    if jitter is not None:
        _jitter(model, jitter)
    opt = problem.make_optimizer(list(model.parameters()))
    if before.optimizer is not None:
        # A copy: load_state_dict keeps tensors it need not cast (the step counts), and the
        # step below would advance them in `before` for every later replay.
        opt.load_state_dict(copy.deepcopy(before.optimizer))
    opt.zero_grad(set_to_none=True)
    loss = problem.loss(model, _move(batch, "cpu", dtype))
    loss.backward()
    grads = {n: _cpu(p.grad) for n, p in model.named_parameters() if p.grad is not None}
    buffers = {n: _cpu(b) for n, b in model.named_buffers()}
    if step_grads is not None:
        for name, p in model.named_parameters():
            p.grad = step_grads[name].to(dtype) if name in step_grads else None
    opt.step()
    return Replay(float(loss.detach()), grads, buffers, {n: _cpu(p) for n, p in model.named_parameters()})


@dataclass
class Mismatch:
    step: int
    tensor: str
    error: float  # max |device - float64|
    float32_error: float  # worst float32 replay's
    allowed: float
    scale: float  # max |float64|

    def __str__(self) -> str:
        relative = self.error / self.scale if self.scale else float("inf")
        return (f"step {self.step}, {self.tensor}: device is {self.error:.3g} from float64 ({relative:.2g} of its "
                f"largest value), float32 at most {self.float32_error:.3g}, allowed {self.allowed:.3g}")


@dataclass
class Comparison:
    steps: int = 0
    worst_ratio: float = 0.0  # max over steps and tensors of error / allowed (< 1 passes)
    worst_at: str = ""  # where: "step S, tensor"
    mismatches: list[Mismatch] = field(default_factory=list)
    device_loss: list[float] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.mismatches

    def judge(self, step: int, name: str, device: torch.Tensor, exact: torch.Tensor,
              float32: Sequence[torch.Tensor], factor: float, floor_scale: float = 0.0) -> None:
        """floor_scale: a magnitude the ulps floor is taken of when larger than the values'."""
        if device.shape != exact.shape:
            raise AssertionError(f"step {step}, {name}: shape {tuple(device.shape)}, expected {tuple(exact.shape)}")
        if not device.is_floating_point():
            if not torch.equal(device, exact):
                self.mismatches.append(Mismatch(step, name, float("nan"), 0.0, 0.0, 0.0))
            return
        if device.numel() == 0:
            return
        err = (device - exact).abs().max().item()
        err32 = max((t - exact).abs().max().item() for t in float32)
        scale = exact.abs().max().item()
        allowed = factor * err32 + ULPS * EPS32 * max(scale, floor_scale)
        finite = bool(torch.isfinite(device).all()) or not bool(torch.isfinite(exact).all())
        ratio = err / allowed if allowed > 0 else (0.0 if err == 0 else float("inf"))
        if not finite:
            ratio, err = float("inf"), float("nan")
        if ratio > self.worst_ratio:
            self.worst_ratio, self.worst_at = ratio, f"step {step}, {name}"
        if ratio > 1:
            self.mismatches.append(Mismatch(step, name, err, err32, allowed, scale))


def check_step(problem: Problem, step: int, batch: Batch, before: State, after: State, result: Comparison,
               factor: float = FACTOR, perturbed: int = PERTURBED) -> None:
    """Judges one device step (`before` -> `after`) against its float64 and float32 replays."""
    exact = replay(problem, before, batch, torch.float64, step_grads=after.grads)
    runs = [replay(problem, before, batch, torch.float32, step_grads=after.grads,
                   jitter=torch.Generator().manual_seed(1000 * step + k) if k else None)
            for k in range(perturbed + 1)]
    if after.grads.keys() != exact.grads.keys():
        raise AssertionError(f"step {step}: the device has gradients for {sorted(after.grads)}, "
                             f"the CPU for {sorted(exact.grads)}")
    loss = torch.tensor(after.loss, dtype=torch.float64)
    # A loss near zero is a difference of O(1) terms (cross-entropy: log-sum-exp minus the target's
    # logit): its rounding is absolute, so the floor is taken of max(|loss|, 1).
    result.judge(step, "loss", loss, torch.tensor(exact.loss, dtype=torch.float64),
                 [torch.tensor(r.loss, dtype=torch.float64) for r in runs], factor, floor_scale=1.0)
    for name, g in after.grads.items():
        result.judge(step, "grad:" + name, g, exact.grads[name], [r.grads[name] for r in runs], factor)
    for name, b in after.buffers.items():
        result.judge(step, "buffer:" + name, b, exact.buffers[name], [r.buffers[name] for r in runs], factor)
    # The update on the device's own gradients: the float32 replays without perturbation of the
    # parameters are the update's own rounding (a perturbed replay moved its parameters).
    for name, p in after.params.items():
        result.judge(step, "param:" + name, p, exact.params[name], [runs[0].params[name]], factor)


def run(problem: Problem, device: str, compile_backend: str | None = None,
        mode: AbstractContextManager[object] | None = None,
        tamper: Callable[[int, State], State] | None = None,
        trained: list[torch.nn.Module] | None = None, factor: float = FACTOR,
        mark: Callable[[Batch], None] | None = None) -> Comparison:
    """Trains on `device` and judges every step. `tamper(step, state)` may change what the
    device reported (to test the harness); the trained model is appended to `trained`;
    `mark(batch)` marks the device batch's dynamic dims before each compiled step (then the
    compile does not specialize every shape)."""
    model = problem.make_model()
    before = capture(model, None)
    model = model.to(device)
    if trained is not None:
        trained.append(model)
    opt = problem.make_optimizer(list(model.parameters()))
    forward: Callable[[Batch], torch.Tensor] = lambda b: problem.loss(model, b)  # noqa: E731
    if compile_backend is not None:
        forward = torch.compile(forward, backend=compile_backend, dynamic=None if mark else False)
    result = Comparison()
    with mode if mode is not None else nullcontext():
        for step in range(problem.steps):
            batch = problem.batches[step % len(problem.batches)]
            opt.zero_grad(set_to_none=True)
            moved = _move(batch, device, torch.float32)
            if mark is not None:
                mark(moved)
            loss = forward(moved)
            loss.backward()
            opt.step()
            after = capture(model, opt, loss)
            if tamper is not None:
                after = tamper(step, after)
            result.device_loss.append(after.loss)
            check_step(problem, step, batch, before, after, result, factor)
            result.steps += 1
            before = after
    return result


def describe(comparison: Comparison, limit: int = 3) -> str:
    """A verdict's detail: the first mismatches, or how close the run came to the bound."""
    if comparison.passed:
        return (f"{comparison.steps} steps, every loss, gradient, buffer and parameter within its bound; closest "
                f"{comparison.worst_ratio:.2f} of it ({comparison.worst_at})")
    first = comparison.mismatches[:limit]
    more = len(comparison.mismatches) - len(first)
    return "; ".join(str(m) for m in first) + (f"; and {more} more" if more else "")


def run_on_device(problem: Problem, device: str, mode: str) -> Comparison:
    """mode: strict, fused (eager modes) or compiled (torch.compile(backend="pjrt") over fused eager)."""
    import torch_pjrt

    eager = "fused" if mode == "compiled" else mode
    backend = "pjrt" if mode == "compiled" else None
    if backend is not None:
        torch._dynamo.reset()
    try:
        return run(problem, device, compile_backend=backend, mode=torch_pjrt.eager_mode(eager))
    finally:
        if backend is not None:
            torch._dynamo.reset()


__all__ = ["FACTOR", "Comparison", "Problem", "State", "capture", "check_step", "describe", "replay", "run",
           "run_on_device"]
