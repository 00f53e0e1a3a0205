"""torch.compile(backend="pjrt")'s graphs in AOTAutograd's cache (imported when compiling).

AOTAutograd caches a non-inductor backend's graphs only as "bundled" entries: the
compiled object itself, pickled, which must be an OutputCode. A second process (or one
given the entries by torch.compiler.load_cache_artifacts) then skips AOTAutograd's
tracing and partitioning; its programs are captured again at their first call, from the
XLA disk cache.
"""

from __future__ import annotations

import contextvars
import dataclasses
from typing import Any

import torch
from torch._inductor.output_code import OutputCode

from ._bounded import BoundedGraph, Plan
from ._graph import PjrtGraph
from .recompiles import FunctionStats, frame_name, stats_for

# Functions Dynamo leaves in graphs that AOTAutograd's cache refuses by default, though
# the graph (their arguments included) decides what they do: an autocast region, even a
# disabled one (`with torch.autocast(..., enabled=False)` in a model), would keep every
# graph holding one out of the cache.
CACHEABLE_FUNCTIONS = {f"torch.amp.autocast_mode.{name}": torch.__version__
                       for name in ("_enter_autocast", "_exit_autocast")}

# The function being compiled: a graph read back from AOTAutograd's cache counts its
# programs and calls there (the backend runs, its graph compilers do not).
compiling: contextvars.ContextVar[FunctionStats | None] = contextvars.ContextVar("torch_pjrt_compiling", default=None)


@dataclasses.dataclass
class PjrtOutputCode(OutputCode):
    """A PjrtGraph as AOTAutograd's cache stores it. Saved: the graph module (its
    programs are captured again at the first call, from the XLA disk cache); loaded: a
    new PjrtGraph over it. So a second process skips AOTAutograd's tracing and
    partitioning, and compiles nothing in XLA."""

    graph: PjrtGraph | BoundedGraph | None = None
    kind: str = ""
    _serialized_gm: bytes | None = dataclasses.field(default=None, init=False)
    _bounded_plan: Plan | None = dataclasses.field(default=None, init=False)
    bounded_note: str = ""  # the graph's line in metrics()["compiled"][...]["bounded"], again on a load

    def __call__(self, inputs: Any) -> Any:
        assert self.graph is not None, "torch_pjrt: a compiled graph used before post_compile"
        return self.graph(inputs)

    def prepare_for_serialization(self) -> None:
        from torch.fx._graph_pickler import GraphPickler, Options

        assert self.graph is not None
        gm = self.graph.gm
        # Tracing metadata (fake tensors, stacks): not needed to run the graph, slow to
        # unpickle (a fake tensor per node) and not always picklable.
        for node in gm.graph.nodes:
            node.meta = {}
        self._serialized_gm = GraphPickler.dumps(gm, Options(ops_filter=None))
        self._bounded_plan = self.graph.plan if isinstance(self.graph, BoundedGraph) else None
        self.graph = None

    def post_compile(self, example_inputs: Any, constants: Any, graph_kwargs: Any) -> None:
        if self.graph is not None or self._serialized_gm is None:
            return
        from torch._subclasses import FakeTensorMode
        from torch.fx._graph_pickler import GraphPickler
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        gm = GraphPickler.loads(self._serialized_gm, FakeTensorMode(shape_env=ShapeEnv()))
        gm.recompile()
        stats = compiling.get() or stats_for(frame_name(gm))
        graph = PjrtGraph(gm, self.kind, stats)
        self.graph = graph if self._bounded_plan is None else BoundedGraph(graph, self._bounded_plan, stats)
        if self.bounded_note:
            stats.bounded.append(self.bounded_note)
        self._serialized_gm = None
        self._boxed_call = True

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        pass


