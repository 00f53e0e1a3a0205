"""Training tests judge every step's loss, gradients, buffers and parameters against
float64 replays of that step, within a bound measured from float32's own distance to
them: the differential harness of the plugin qualification
(torch_pjrt/qualify/differential.py says how). This adapts the tests' (model,
batches, loss(output, target), optimizer) to it."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch

import torch_pjrt
from torch_pjrt.qualify import differential


def problem(model: torch.nn.Module, batches: Sequence[tuple[torch.Tensor, ...]],
            loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
            make_opt: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer], steps: int) -> differential.Problem:
    """Trains copies of `model` on `batches` ((input, target) pairs) with loss_fn(model(input), target)."""
    return differential.Problem(lambda: copy.deepcopy(model), list(batches),
                                lambda m, b: loss_fn(m(b[0]), b[1]), make_opt, steps)


def assert_trains_like_float64(prob: differential.Problem, compiled: bool = False,
                               mark: Callable[[differential.Batch], None] | None = None,
                               ) -> tuple[list[float], torch.nn.Module]:
    """Trains on the device (in the current eager mode, or compiled with backend="pjrt") with CPU
    fallback forbidden; every step must be within the bound. Returns the losses and the trained model."""
    trained: list[torch.nn.Module] = []
    if compiled:
        torch._dynamo.reset()
    with torch_pjrt.fallback_mode("error"):
        result = differential.run(prob, torch_pjrt.DEVICE_NAME, compile_backend="pjrt" if compiled else None,
                                  trained=trained, mark=mark)
    assert result.passed, differential.describe(result)
    return result.device_loss, trained[0]
