"""Capture and replay: a run of Python code recorded as one device program, replayed
on later inputs of the same layout with no Python in between.

The one place that drives the runtime's capture (torch.compile's graphs,
_graph.py; the vLLM worker's steps, integrations/vllm_plugin/worker.py; device graphs,
graphs.py):

    key = layout_key(inputs)                # 0: these inputs cannot key a program
    out = programs[key].run(inputs) if key in programs else None   # None: capture
    if out is None:
        result, graph, why = capture(device, lambda: f(*inputs), inputs, lambda r: [r], weights)

What a caller does when a capture fails (``graph`` None, ``why`` saying why: a host
read, a CPU fallback, a tensor that is neither an input nor a constant) and what it
counts is its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, NamedTuple, TypeVar

import torch

from . import _C

T = TypeVar("T")

CompiledGraph = _C._CompiledGraph
"""A captured program. ``run(inputs)``: its outputs (None where it returned a non-tensor),
or None when it cannot run on these inputs (then capture again); ``mutated_inputs``: the
positions of the inputs it updates in place."""

layout_key: Callable[[list[object]], int] = _C._layout_key
"""The key of a call's inputs (a list of tensors and ints): each tensor's device, dtype,
sizes and strides, each int's value. 0: not replayable as they are (an int out of int64's
range). The hot path of every replay: the runtime's function itself, no wrapper."""


class Captured(NamedTuple, Generic[T]):
    result: T  # what the recorded code returned
    graph: CompiledGraph | None  # the program; None: the run could not be captured
    why: str  # why not, when graph is None


def begin(device: int) -> None:
    """Starts recording on `device` (what is pending runs first): the ops that follow run
    as usual and are recorded, until end() or abort()."""
    _C._capture_begin(device)


def abort(device: int) -> None:
    """Stops recording after an error; what was recorded still runs."""
    _C._capture_abort(device)


def end(device: int, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor | None],
        constants: Sequence[torch.Tensor]) -> tuple[CompiledGraph | None, str]:
    """Makes one program of what was recorded: parameters `inputs`, results `outputs` (None
    for a non-tensor output), `constants` the tensors it may read and write besides its
    inputs (weights; a device graph's static tensors). (None, why) when it is not one."""
    return _C._capture_end(device, list(inputs), list(outputs), list(constants))


def capture(device: int, record: Callable[[], T], inputs: Sequence[torch.Tensor],
            outputs: Callable[[T], Sequence[torch.Tensor | None]],
            constants: Sequence[torch.Tensor]) -> Captured[T]:
    """Runs `record` with capture on for `device` (its ops run as usual, and are recorded),
    then makes one program of them (end()). An exception in `record` ends the capture and
    propagates."""
    begin(device)
    try:
        result = record()
    except BaseException:
        abort(device)
        raise
    graph, why = end(device, inputs, outputs(result), constants)
    return Captured(result, graph, why)


__all__ = ["CompiledGraph", "Captured", "abort", "begin", "capture", "end", "layout_key"]
