"""What torch.compile(backend="pjrt") did per compiled function, and the
compilation-storm guard that reads it."""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

# The shapes of one call's inputs: a tensor's sizes, or (value,) for an int input.
Signature = tuple[tuple[int, ...], ...]


@dataclass
class RecompilePolicy:
    """The compilation-storm guard: past `limit` distinct input shapes for one compiled
    function, warn once (naming the varying dims and a bucket list) or raise."""

    limit: int = 4
    action: str = "warn"  # "warn" or "error"


def _policy_from_env() -> RecompilePolicy:
    action = os.environ.get("TORCH_PJRT_RECOMPILE", "warn").strip().lower() or "warn"
    if action not in ("warn", "error"):
        raise ValueError(f"torch_pjrt: TORCH_PJRT_RECOMPILE must be warn or error, got {action!r}")
    limit = os.environ.get("TORCH_PJRT_RECOMPILE_LIMIT", "4").strip() or "4"
    if not limit.isdigit() or int(limit) < 1:
        raise ValueError(f"torch_pjrt: TORCH_PJRT_RECOMPILE_LIMIT must be a positive integer, got {limit!r}")
    return RecompilePolicy(int(limit), action)


_policy = _policy_from_env()


def set_recompile_policy(limit: int | None = None, action: str | None = None) -> RecompilePolicy:
    """Sets the storm guard (limit of distinct shapes per function, "warn" or "error");
    returns the previous policy."""
    global _policy
    previous = _policy
    new = RecompilePolicy(previous.limit if limit is None else limit, previous.action if action is None else action)
    if new.action not in ("warn", "error") or new.limit < 1:
        raise ValueError(f"torch_pjrt: bad recompile policy {new}")
    _policy = new
    return previous


class RecompileError(RuntimeError):
    """A compiled function met more distinct input shapes than TORCH_PJRT_RECOMPILE_LIMIT allows."""


def suggest_buckets(values: Sequence[int]) -> list[int]:
    """Powers of two covering the observed sizes: one program per bucket instead of per size."""
    return sorted({1 << max(int(v) - 1, 0).bit_length() for v in values})


def _varying_dims(signatures: Sequence[Signature]) -> list[tuple[int, int, list[int]]]:
    """(input, dim, the values it took) for every dim that differs across the signatures."""
    first = signatures[0]
    out = []
    for i, shape in enumerate(first):
        if any(len(sig) != len(first) or len(sig[i]) != len(shape) for sig in signatures):
            continue
        for d in range(len(shape)):
            values = sorted({sig[i][d] for sig in signatures})
            if len(values) > 1:
                out.append((i, d, values))
    return out


def guard_storm(stats: FunctionStats, kind: str, signature: Signature) -> None:
    seen = stats.program_shapes.setdefault(kind, [])
    if signature in seen:
        return
    seen.append(signature)
    if len(seen) <= _policy.limit or (stats.storm and _policy.action == "warn"):
        return
    varying = _varying_dims(seen)
    where = "; ".join(f"input {i} dim {d} takes {v}, e.g. buckets {suggest_buckets(v)}" for i, d, v in varying)
    stats.storm = (f"{stats.name}: {len(seen)} distinct input shapes for its {kind} graph (limit {_policy.limit}), each "
                   f"a new program. {where or 'the inputs change rank'}. Mark a varying dim bounded "
                   f"(torch_pjrt.shapes.mark_bounded(x, dim, max): one program for the range), pad to "
                   f"buckets (torch_pjrt.shapes.pad_to_bucket) or raise TORCH_PJRT_RECOMPILE_LIMIT.")
    if _policy.action == "error":
        raise RecompileError("torch_pjrt: " + stats.storm)
    warnings.warn("torch_pjrt: " + stats.storm, stacklevel=4)


@dataclass
class FunctionStats:
    """What happened to one compiled function (a Dynamo frame)."""

    name: str = ""
    dynamo_graphs: int = 0  # graphs Dynamo handed to the backend (first compile + recompiles)
    shapes: list[list[tuple[int, ...]]] = field(default_factory=list)  # input shapes of each
    programs: int = 0  # captured programs (forward, backward, inference; per input layout)
    calls: int = 0  # program runs, first calls included
    eager_graphs: list[str] = field(default_factory=list)  # why a graph runs op by op
    # Distinct input shapes each kind of graph was captured for (what the storm guard counts).
    program_shapes: dict[str, list[Signature]] = field(default_factory=dict)
    storm: str = ""  # the storm guard's finding, once
    bounded: list[str] = field(default_factory=list)  # per graph: one program for a range of sizes, or why not
    bounded_real_elements: int = 0  # input elements of bounded calls, real ...
    bounded_padded_elements: int = 0  # ... and as run, padded to the bounds

    def as_dict(self) -> dict[str, Any]:
        return {"dynamo_graphs": self.dynamo_graphs, "recompiles": max(self.dynamo_graphs - 1, 0),
                "shapes": self.shapes, "programs": self.programs, "calls": self.calls,
                "eager_graphs": list(self.eager_graphs),
                "program_shapes": {k: [list(sig) for sig in v] for k, v in self.program_shapes.items()},
                "storm": self.storm,
                "bounded": {"graphs": list(self.bounded), "real_elements": self.bounded_real_elements,
                            "padded_elements": self.bounded_padded_elements}}


_stats: dict[str, FunctionStats] = {}
_stats_lock = threading.Lock()


def compiled_stats() -> dict[str, dict[str, Any]]:
    with _stats_lock:
        return {name: s.as_dict() for name, s in _stats.items()}


def reset_compiled_stats() -> None:
    with _stats_lock:
        _stats.clear()


def stats_for(name: str) -> FunctionStats:
    with _stats_lock:
        return _stats.setdefault(name, FunctionStats(name))


_TORCH_DIR = os.path.dirname(torch.__file__)


def frame_name(gm: torch.fx.GraphModule) -> str:
    """The user's function a Dynamo graph came from: "forward (model.py:12)", or
    "MyModel.forward" for a compiled module."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        code = InstructionTranslator.current_tx().f_code
        if not code.co_filename.startswith(_TORCH_DIR):
            return f"{code.co_name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"
    except Exception:  # noqa: BLE001 - called outside Dynamo's tracing
        pass
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            _, module_type = next(iter(stack.values()))
            name = getattr(module_type, "__name__", None) or str(module_type).rsplit(".", 1)[-1]
            return f"{name}.forward"
    return type(gm).__name__
