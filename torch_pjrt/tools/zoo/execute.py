"""One forward and backward of a model: its floating outputs and parameter gradients.

The scalar differentiated is the sum, over every floating output tensor, of
(output * weights).sum(), with fixed random weights per output (seeded by the
output's name and drawn in float64, so every run, in every dtype and on every
device, weighs the same outputs the same way). Non-finite output elements (masked
logits) are left out of it, so that one -inf does not make every gradient NaN.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

Forward = Callable[..., Any]


@dataclass
class Run:
    outputs: dict[str, torch.Tensor]  # floating outputs, CPU float64 copies
    grads: dict[str, torch.Tensor | None]  # per parameter name, CPU float64 copies
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def flatten(value: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """The tensors in a model's output (ModelOutput, tuples, dicts), by dotted name; caches skipped."""
    found: dict[str, torch.Tensor] = {}
    if isinstance(value, torch.Tensor):
        found[prefix or "output"] = value
    elif isinstance(value, dict):  # ModelOutput is an OrderedDict of its non-None fields
        for k, v in value.items():
            found.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found.update(flatten(v, f"{prefix}.{i}" if prefix else str(i)))
    return found


def weights(name: str, like: torch.Tensor) -> torch.Tensor:
    """The fixed random weights of output `name` (float64 draw, cast to its dtype and device)."""
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    w = torch.randn(like.shape, generator=gen, dtype=torch.float64)
    return w.to(device=like.device, dtype=like.dtype)


def objective(outputs: dict[str, torch.Tensor]) -> torch.Tensor | None:
    total: torch.Tensor | None = None
    for name, out in outputs.items():
        if not out.is_floating_point() or not out.requires_grad:
            continue
        finite = torch.where(torch.isfinite(out), out, torch.zeros_like(out))
        term = (finite * weights(name, out)).sum()
        total = term if total is None else total + term.to(total.device)
    return total


def _cpu64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").to(torch.float64 if t.is_floating_point() else t.dtype)


def run(model: torch.nn.Module, forward: Forward, inputs: dict[str, Any]) -> Run:
    """forward(**inputs), then backward of the objective; `model` holds the parameters
    (forward may be a compiled wrapper of it). Results are copied to the CPU."""
    start = time.perf_counter()
    for p in model.parameters():
        p.grad = None
    out = forward(**inputs)
    tensors = {k: v for k, v in flatten(out).items() if v.is_floating_point()}
    notes = []
    scalar = objective(tensors)
    if scalar is not None:
        scalar.backward()
    else:
        notes.append("no output requires grad: forward only")
    outputs = {k: _cpu64(v) for k, v in tensors.items()}
    grads = {n: (None if p.grad is None else _cpu64(p.grad)) for n, p in model.named_parameters()}
    return Run(outputs, grads, time.perf_counter() - start, notes)
