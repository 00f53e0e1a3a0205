"""Device graphs: torch.cuda.graph's contract on pjrt (``torch.pjrt.graph``, ``torch.pjrt.Graph``).

A region of Python (a decode step, a training step) is captured once into one device
program; ``replay()`` runs that program again with no Python, no ATen dispatch and no
ops recorded. As with CUDA graphs, tensors are static: every tensor the region read is
read again from the same tensor at each replay (copy new inputs into it first), and
every tensor the region wrote or created and that is still alive when the capture ends
is written again in place. Unlike CUDA graphs, the capture itself runs the region, so its
results are valid at once.

    g = torch.pjrt.Graph()
    with torch.pjrt.graph(g):
        static_out = model(static_in)
    static_in.copy_(batch); g.replay()      # static_out now holds model(batch)

The capture runs on the shared capture helper (_capture.py) that torch.compile and the vLLM
worker use. What cannot be one program raises at the end of the capture, naming the cause
(a host read such as ``.item()``, an op that falls back to the CPU). Memory pools exist for
the API's sake (``MemPool``, ``use_mem_pool``, ``graph_pool_handle``): XLA owns the device
memory, and a replay's outputs reuse the captured tensors' storage, which is what a pool
gives a CUDA graph.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from . import _capture

DEVICE = torch._C._get_privateuse1_backend_name()
_pool_ids = itertools.count(1)
_state = threading.local()


def is_current_stream_capturing() -> bool:
    """True inside a ``torch.pjrt.graph`` capture on this thread."""
    return getattr(_state, "capturing", None) is not None


def graph_pool_handle() -> tuple[int, int]:
    """A handle naming a pool that several graphs may share (accepted and recorded; see the module doc)."""
    return (0, next(_pool_ids))


class MemPool:
    """``torch.cuda.MemPool``'s interface: an id to pass as ``pool=`` to a capture."""

    def __init__(self, allocator: Any = None, use_on_oom: bool = False) -> None:
        if allocator is not None:
            raise ValueError(f"torch_pjrt: MemPool(allocator=...) is not supported on {DEVICE}: XLA owns the memory")
        self.id = graph_pool_handle()

    def use_count(self) -> int:
        return 1

    def snapshot(self) -> list[Any]:
        return []


@contextlib.contextmanager
def use_mem_pool(pool: MemPool, device: Any = None) -> Iterator[None]:
    """Allocations inside come from `pool` (on pjrt, from XLA's allocator as always)."""
    if not isinstance(pool, MemPool):
        raise TypeError(f"torch_pjrt: use_mem_pool expects a torch.{DEVICE}.MemPool, got {type(pool).__name__}")
    yield


class _Tensors(TorchDispatchMode):
    """Every pjrt tensor the captured ops read or produce (weakly: what the region drops
    stays an intermediate of the program)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[int, weakref.ref[torch.Tensor]] = {}
        self.host_writes: list[str] = []  # ops that updated a CPU tensor: a replay would not repeat them

    def _note(self, value: Any) -> None:
        for t in tree_flatten(value)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == DEVICE:
                held = self.seen.get(id(t))
                if held is None or held() is not t:  # an id is reused once its tensor has died
                    self.seen[id(t)] = weakref.ref(t)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        self._note((args, kwargs))
        self._check_host_writes(func, args, kwargs)
        out = func(*args, **kwargs)
        self._note(out)
        return out

    def _check_host_writes(self, func: Any, args: Any, kwargs: Any) -> None:
        schema = func._schema
        for i, arg in enumerate(schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = kwargs.get(arg.name) if arg.kwarg_only or i >= len(args) else args[i]
            for t in tree_flatten(value)[0]:
                if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                    self.host_writes.append(str(schema.name))
                    return

    def alive(self) -> list[torch.Tensor]:
        return [t for t in (r() for r in self.seen.values()) if t is not None]


class Graph:
    """A captured device program (``torch.cuda.CUDAGraph``'s interface)."""

    def __init__(self, keep_graph: bool = False) -> None:
        self._program: _capture.CompiledGraph | None = None
        self._static: list[torch.Tensor] = []
        self._tracker: _Tensors | None = None
        self._device = 0
        self._pool: tuple[int, int] | None = None
        self.replays = 0

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        if self._program is not None or self._tracker is not None:
            raise RuntimeError(f"torch_pjrt: this {DEVICE} graph was already captured; reset() it first")
        if is_current_stream_capturing():
            raise RuntimeError(f"torch_pjrt: a {DEVICE} graph capture is already under way on this thread")
        self._pool = pool if pool is not None else graph_pool_handle()
        self._device = getattr(torch, DEVICE).current_device()
        self._tracker = _Tensors()
        _capture.begin(self._device)
        self._tracker.__enter__()
        _state.capturing = self

    def capture_end(self) -> None:
        tracker = self._tracker
        if tracker is None:
            raise RuntimeError(f"torch_pjrt: capture_end without capture_begin on this {DEVICE} graph")
        tracker.__exit__(None, None, None)
        _state.capturing = None
        self._tracker = None
        static = tracker.alive()
        program, why = _capture.end(self._device, [], [], static)
        if program is not None and tracker.host_writes:
            program, why = None, (f"{tracker.host_writes[0]} updated a CPU tensor, which a replay would not "
                                  "repeat (an optimizer's step count: create it with capturable=True, as for "
                                  "CUDA graphs, so that its state lives on the device)")
        if program is None:
            raise RuntimeError(f"torch_pjrt: the region captured in a {DEVICE} graph is not one device program: "
                               f"{why}. Keep host reads (.item(), printing, .cpu()) and ops that fall back to the "
                               "CPU out of the captured region")
        self._program, self._static = program, static

    def _abort(self) -> None:
        if self._tracker is not None:
            self._tracker.__exit__(None, None, None)
            self._tracker = None
            _state.capturing = None
            _capture.abort(self._device)

    def replay(self) -> None:
        if self._program is None:
            raise RuntimeError(f"torch_pjrt: replay() of a {DEVICE} graph that has not been captured")
        if self._program.run([]) is None:
            raise RuntimeError(f"torch_pjrt: a tensor this {DEVICE} graph reads has been emptied or resized since "
                               "the capture: capture again")
        self.replays += 1

    def reset(self) -> None:
        self._abort()
        self._program, self._static = None, []

    def pool(self) -> tuple[int, int] | None:
        return self._pool

    def static_tensors(self) -> int:
        """How many tensors the program reads and writes in place."""
        return len(self._static)


class graph:  # noqa: N801  (mirrors torch.cuda.graph)
    """Captures the block into `graph`: ``with torch.pjrt.graph(g): out = f(x)``."""

    def __init__(self, pjrt_graph: Graph, pool: Any = None, stream: Any = None,
                 capture_error_mode: str = "global") -> None:
        if not isinstance(pjrt_graph, Graph):
            raise TypeError(f"torch_pjrt: torch.{DEVICE}.graph expects a torch.{DEVICE}.Graph, "
                            f"got {type(pjrt_graph).__name__}")
        self.graph = pjrt_graph
        self.pool = pool
        self.capture_error_mode = capture_error_mode

    def __enter__(self) -> None:
        getattr(torch, DEVICE).synchronize()
        self.graph.capture_begin(pool=self.pool, capture_error_mode=self.capture_error_mode)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.graph._abort()
            return
        self.graph.capture_end()


__all__ = ["Graph", "MemPool", "graph", "graph_pool_handle", "is_current_stream_capturing", "use_mem_pool"]
