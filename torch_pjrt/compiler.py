"""torch.compile(backend="pjrt"): AOTAutograd graphs as whole StableHLO programs.

Dynamo captures the user's code; AOTAutograd splits it into functional ATen
graphs (forward and backward, or one inference graph). Each graph is a PjrtGraph
(_graph.py): run once over its first real inputs with recording on, every op goes
through the same lowering as eager and lands in one pending device graph, which
becomes one program. Later calls with inputs of the same layout bind their buffers
to that program and run it, with no ATen dispatch per op. A graph whose recording
does not stay one program (a host read, a CPU fallback, a non-tensor input) runs
eagerly, op by op, and says why in ``torch_pjrt.metrics()["compiled"]``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from . import _C, _bounded
from ._graph import PjrtGraph
from .recompiles import FunctionStats, frame_name, stats_for


def _dims(t: Any) -> tuple[Any, ...]:
    """A Dynamo example input's shape: ints, or the symbol's name for a dynamic dim."""
    if not isinstance(t, torch.Tensor):
        return ()
    return tuple(d if isinstance(d, int) else str(d) for d in t.shape)



# The last bounded forward graph compiled in this context (its plan, padded outputs and
# ShapeEnv): its backward, compiled next from the same trace, takes the padded tensors it
# saves as they are.
_last_forward: contextvars.ContextVar[tuple[Any, Any, Any] | None] = contextvars.ContextVar(
    "torch_pjrt_bounded_forward", default=None)


def _shape_env(example_inputs: list[Any]) -> Any:
    from torch._guards import detect_fake_mode

    return getattr(detect_fake_mode(example_inputs), "shape_env", None)


def _graph_compiler(kind: str, stats: FunctionStats) -> Any:
    """AOTAutograd's compiler for one kind of graph; serializable, so that its graphs
    join AOTAutograd's cache."""
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler

    from ._aot_cache import PjrtOutputCode

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        forward = _last_forward.get() if kind == "backward" else None
        if forward is not None:  # used once, and only by the backward of the same trace (its shapes)
            _last_forward.set(None)
            if forward[2] is not _shape_env(example_inputs):
                forward = None
        planned = _bounded.plan(gm, example_inputs, forward[1] if forward else None)
        note = ""
        if isinstance(planned, _bounded.Planned):
            graph: Any = _bounded.BoundedGraph(PjrtGraph(planned.gm, kind, stats), planned.plan, stats)
            note = f"{kind}: {planned.plan.note}"
            if forward:
                _bounded.hand_over(forward[0], planned)
        else:
            if planned:
                note = f"{kind}: a program per size ({planned})"
            graph = PjrtGraph(gm, kind, stats)
        if kind == "forward":  # a backward pairs with the forward compiled just before it
            _last_forward.set((planned.plan, planned.outputs_by_name, _shape_env(example_inputs))
                              if isinstance(planned, _bounded.Planned) else None)
        if note:
            stats.bounded.append(note)
        code = PjrtOutputCode(graph, kind, bounded_note=note)
        code._boxed_call = True  # on the instance: wrappers copy its __dict__
        return code

    return SerializableAOTDispatchCompiler(PjrtOutputCode, compile_graph)


def _cache_tag() -> str:
    """Part of AOTAutograd's cache key: an entry of another backend (aot_eager's, for the
    same graph) or of another torch_pjrt build or plugin is never read as ours."""
    import importlib.metadata

    try:
        version = importlib.metadata.version("torch_pjrt")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return f"torch_pjrt-{version}-{_C._cache_identity()}"


def pjrt_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **options: Any) -> Callable[..., Any]:
    """The Dynamo backend registered as "pjrt"."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch import config as functorch_config

    if options:
        raise TypeError(f"torch_pjrt: backend 'pjrt' takes no options, got {sorted(options)}")
    stats = stats_for(frame_name(gm))
    stats.dynamo_graphs += 1
    stats.shapes.append([_dims(t) for t in example_inputs])
    backend = aot_autograd(
        fw_compiler=_graph_compiler("forward", stats),
        bw_compiler=_graph_compiler("backward", stats),
        inference_compiler=_graph_compiler("inference", stats),
        keep_inference_input_mutations=True,
    )
    from torch._inductor import config as inductor_config

    from ._aot_cache import CACHEABLE_FUNCTIONS, compiling

    user_tag = torch.compiler.config.cache_key_tag
    cacheable = {**inductor_config.unsafe_marked_cacheable_functions, **CACHEABLE_FUNCTIONS}
    bounds = _bounded.bounds_of(example_inputs)  # a plan depends on them: part of the cache key
    bound_tag = "|bounds=" + ",".join(f"{s}:{lo}:{hi}" for s, (lo, hi) in sorted(bounds.items(), key=str)) \
        if bounds else ""
    token = compiling.set(stats)
    try:
        # AOTAutograd's cache holds our graphs only "bundled" (the compiled object itself);
        # the backward is saved at once, not at its first call outside this patch.
        with functorch_config.patch(bundled_autograd_cache=True, force_non_lazy_backward_lowering=True), \
                torch.compiler.config.patch(cache_key_tag=f"{user_tag}|{_cache_tag()}{bound_tag}"), \
                inductor_config.patch(unsafe_marked_cacheable_functions=cacheable):
            return backend(gm, example_inputs)
    finally:
        compiling.reset(token)


def register() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "pjrt" not in _BACKENDS:
        register_backend(pjrt_backend, name="pjrt")
