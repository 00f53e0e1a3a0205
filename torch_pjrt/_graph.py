"""PjrtGraph: one AOTAutograd graph run as captured programs, one per input layout.

Its first call with inputs of a new layout runs the FX graph with capture on
(_capture.py): every op goes through the same lowering as eager and lands in one
program. Later calls with that layout bind their buffers to the program and run it,
with no ATen dispatch per op. A layout whose capture does not stay one program (a
host read, a non-tensor input) runs eagerly, op by op; one broken by CPU-fallback
ops is partitioned around them. Each says why in ``torch_pjrt.metrics()["compiled"]``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from . import _C, _cache_artifacts
from ._capture import CompiledGraph, capture, layout_key
from .recompiles import FunctionStats, Signature, guard_storm


@dataclass
class _Variant:
    graph: CompiledGraph
    constants: list[Any]  # non-tensor outputs by position (None where the graph returns a tensor)
    positions: list[int] | None  # the tensors among the inputs; None: every input is one


@dataclass
class _Partitioned:
    """A graph with ops that fall back to the CPU: those run eagerly, each
    maximal run of the others is its own compiled program."""

    gm: torch.fx.GraphModule
    why: str


_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


def _views_as_reshapes(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The graph with its views as reshapes. AOTAutograd decides view against reshape from
    the strides its fake tensors predict, which follow some ops' decompositions rather than
    their kernels (softplus_backward's decomposition is contiguous where the kernel, on the
    CPU as here, follows its permuted gradient); such a view cannot run. A reshape is the
    same view wherever the view could be taken, and in a captured program the layout is
    XLA's anyway."""
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _VIEWS:
            node.target = torch.ops.aten.reshape.default
            changed = True
    if changed:
        gm.recompile()
    return gm


def unboxed(call_args: tuple[Any, ...]) -> list[Any]:
    """A compiled graph's arguments as a list: AOTAutograd's boxed call passes one list,
    which is emptied so that the caller's references go and inputs can be freed early."""
    if len(call_args) == 1 and isinstance(call_args[0], list):
        inputs = list(call_args[0])
        call_args[0].clear()
        return inputs
    return list(call_args)


class PjrtGraph:
    """One AOTAutograd graph: a program per input layout, captured at its first call."""

    def __init__(self, gm: torch.fx.GraphModule, kind: str, stats: FunctionStats, is_part: bool = False) -> None:
        # AOTAutograd passes the arguments as one list, which we may clear. Set
        # on the instance: wrappers (torch._dynamo.disable) copy its __dict__.
        self._boxed_call = True
        self.gm = _views_as_reshapes(gm)
        self.kind = kind
        self.is_part = is_part
        self.single_output = _returns_single(gm)  # a part may return one tensor, AOT graphs a tuple
        self.stats = stats
        self.variants: dict[Any, _Variant | _Partitioned | str] = {}  # str: why this layout runs eagerly
        self.constants = [t for t in _held_tensors(gm) if t.device.type == _DEVICE]
        self.carried: tuple[int, ...] | None = None  # positions of carried inputs, known at the first call
        self.kept: list[int] = []  # positions of the others (the program's tensors and ints)
        self.carried_objects: dict[int, Any] = {}  # id -> object: keys name them by id, so they stay alive

    def _key(self, inputs: list[Any]) -> Any:
        """The program's key: the tensors' and ints' layout (0: not replayable), and the
        identity of each carried object (a DTensor graph's DeviceMesh, which it only passes
        through to its outputs)."""
        if self.carried is None:
            self.carried = _carried(inputs)
            self.kept = [i for i in range(len(inputs)) if i not in self.carried]
        if not self.carried:
            return layout_key(inputs)
        if any(not isinstance(inputs[i], _CARRIED) for i in self.carried):
            return 0
        layout = layout_key([inputs[i] for i in self.kept])
        if not layout:
            return 0
        for i in self.carried:
            self.carried_objects.setdefault(id(inputs[i]), inputs[i])
        return (layout, *(id(inputs[i]) for i in self.carried))

    def __call__(self, *call_args: Any) -> Any:
        inputs = unboxed(call_args)
        # The hot path: dense pjrt tensors of one device (and a dynamic graph's
        # sizes), a layout seen before.
        key = self._key(inputs)  # 0: not replayable as they are
        variant = self.variants.get(key) if key else None
        if type(variant) is _Variant:
            out = variant.graph.run(inputs if variant.positions is None else [inputs[i] for i in variant.positions])
            if out is not None:
                self.stats.calls += 1
                result = _assemble(out, variant.constants)
                return result[0] if self.single_output else result
        elif variant is not None:  # this layout runs eagerly, whole or partitioned
            return self._run_eagerly(variant, inputs)
        return self._call_slowly(inputs)

    def _run_eagerly(self, variant: str | _Partitioned, inputs: list[Any]) -> Any:
        self._note_eager(variant if isinstance(variant, str) else variant.why)
        return (self.gm if isinstance(variant, str) else variant.gm)(*inputs)

    def _call_slowly(self, inputs: list[Any]) -> Any:
        device = _device_of(inputs)
        why = _why_not_replayable(inputs, device, self.carried or ())
        if why:
            self._note_eager(why)
            return self.gm(*inputs)
        # 0-d CPU inputs (an optimizer's step count without capturable=True)
        # are read on the device; in-place updates are copied back after.
        host = {i: t for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.device.type == "cpu"}
        if host:
            inputs = [t.to(f"{_DEVICE}:{device}") if i in host else t for i, t in enumerate(inputs)]
        # Int inputs (sizes of a dynamic-shape graph) specialize the program: part of the key.
        positions = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor)]
        tensors = [inputs[i] for i in positions]
        key = self._key(inputs)
        if not key:  # an int input out of int64's range: no program can be keyed by it
            self._note_eager("an int input does not fit in int64")
            return self.gm(*inputs)
        variant = self.variants.get(key)
        if isinstance(variant, (str, _Partitioned)):
            result = self._run_eagerly(variant, inputs)
            mutated: Sequence[int] = list(host)
        else:
            out = variant.graph.run(tensors) if variant is not None else None
            if out is not None:
                self.stats.calls += 1
                result = _assemble(out, variant.constants)
                if self.single_output:
                    result = result[0]
                mutated = [positions[j] for j in variant.graph.mutated_inputs]
            else:
                guard_storm(self.stats, self.kind, _signature(inputs))
                result, graph = self._capture(inputs, positions, device, key)
                mutated = [positions[j] for j in graph.mutated_inputs] if graph is not None else list(host)
        _copy_back(host, inputs, mutated)
        return result

    def _capture(self, inputs: list[Any], positions: list[int], device: int,
                 key: int) -> tuple[Any, CompiledGraph | None]:
        tensors = [inputs[i] for i in positions]
        fallbacks_before = dict(_C._metrics()["fallbacks"])
        result, graph, why = capture(device, lambda: self.gm(*inputs), tensors, self._tensor_outputs,
                                     self.constants)
        outs = self._outputs(result)
        if graph is None:
            fell_back = {_base_name(op) for op, n in _C._metrics()["fallbacks"].items()
                         if n > fallbacks_before.get(op, 0)}
            parts = _partition(self.gm, fell_back, self.kind, self.stats) if fell_back and not self.is_part else None
            if parts is not None:
                why = f"{', '.join(sorted(fell_back))} fall back to the CPU; {parts[1]} parts compiled around them"
                self.variants[key] = _Partitioned(parts[0], why)
            else:
                self.variants[key] = why
            self._note_eager(why)
        else:
            self.variants[key] = _Variant(graph, [None if isinstance(o, torch.Tensor) else o for o in outs],
                                          None if len(positions) == len(inputs) else positions)
            self.stats.programs += 1
            self.stats.calls += 1
            _cache_artifacts.record_new_entries()  # its programs, for torch.compiler.save_cache_artifacts
        return result, graph

    def _outputs(self, result: Any) -> list[Any]:
        return [result] if self.single_output else list(result)

    def _tensor_outputs(self, result: Any) -> list[torch.Tensor | None]:
        """The program's outputs: None where the graph returns a non-tensor."""
        return [o if isinstance(o, torch.Tensor) else None for o in self._outputs(result)]

    def _note_eager(self, why: str) -> None:
        if "(collective)" in why:
            why += ("; collectives go inside the program only with ranks as threads of one process "
                    "(torch_pjrt.distributed.spawn) and TORCH_PJRT_DIST_IN_PROGRAMS=1, the default")
        note = f"{self.kind}: {why}"
        if note not in self.stats.eager_graphs:
            self.stats.eager_graphs.append(note)


_DEVICE = torch._C._get_privateuse1_backend_name()  # renamed by torch_pjrt before this import
_CARRIED: tuple[type, ...] = ()
if torch.distributed.is_available():
    from torch.distributed.device_mesh import DeviceMesh

    _CARRIED = (DeviceMesh,)


def _device_of(inputs: Sequence[Any]) -> int:
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.device.type == _DEVICE:
            return t.device.index or 0
    return 0


def _carried(inputs: Sequence[Any]) -> tuple[int, ...]:
    """Positions of inputs a graph only carries through: the DeviceMesh of each DTensor
    (AOTAutograd passes it as an input and returns it with the DTensor's local tensor)."""
    return tuple(i for i, t in enumerate(inputs) if isinstance(t, _CARRIED))


def _why_not_replayable(inputs: Sequence[Any], device: int, carried: Sequence[int] = ()) -> str:
    for i, t in enumerate(inputs):
        if isinstance(t, int) or i in carried:
            continue  # a size of a dynamic-shape graph: the program is specialized to it
        if not isinstance(t, torch.Tensor):
            return f"input {i} is a {type(t).__name__}, not a tensor or an int"
        if t.device.type == "cpu":
            if t.dim() > 0:  # 0-d CPU inputs are moved to the device (their values stay arguments)
                return f"input {i} is a CPU tensor of shape {tuple(t.shape)}"
        elif t.device.type != _DEVICE or (t.device.index or 0) != device:
            return f"input {i} is on {t.device}, the graph runs on {_DEVICE}:{device}"
        if t.is_sparse or t.layout != torch.strided:
            return f"input {i} has layout {t.layout}"
    return ""


_warned_host_scalars = False


def _signature(inputs: Sequence[Any]) -> Signature:
    return tuple(tuple(t.shape) if isinstance(t, torch.Tensor) else (int(t),) if isinstance(t, int) else ()
                 for t in inputs)


def _copy_back(host: dict[int, torch.Tensor], inputs: list[torch.Tensor], mutated: Sequence[int]) -> None:
    """Writes the device copies of mutated CPU inputs back, in one device-to-host read."""
    global _warned_host_scalars
    written = [i for i in mutated if i in host]
    if not written:
        return
    if not _warned_host_scalars:
        _warned_host_scalars = True
        warnings.warn(f"torch_pjrt: a compiled graph updates {len(written)} CPU scalar tensor(s) in place (such as "
                      "an optimizer's step count); each call reads them back from the device. Create the "
                      "optimizer with capturable=True to keep them on the device.", stacklevel=2)
    if len({inputs[i].dtype for i in written}) == 1:
        values = torch.stack([inputs[i].reshape(()) for i in written]).cpu()
        for i, v in zip(written, values):
            host[i].copy_(v)
    else:
        for i in written:
            host[i].copy_(inputs[i])


def _held_tensors(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    held: list[torch.Tensor] = []
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value: Any = gm
            for part in str(node.target).split("."):
                value = getattr(value, part, None)
            if isinstance(value, torch.Tensor):
                held.append(value)
    return held


def _base_name(op: object) -> str:
    """'special_bessel_j0' for aten.special_bessel_j0.default or 'aten::special_bessel_j0.out'."""
    name = op._schema.name if isinstance(op, torch._ops.OpOverload) else str(op)
    return name.split("::")[-1].split(".")[0]


class _PartModule(torch.nn.Module):
    """A compiled part of a partitioned graph, callable as a submodule."""

    def __init__(self, graph: PjrtGraph) -> None:
        super().__init__()
        self.graph = graph

    def forward(self, *args: Any) -> Any:
        return self.graph(*args)


def _partition(gm: torch.fx.GraphModule, unsupported: set[str], kind: str,
               stats: FunctionStats) -> tuple[torch.fx.GraphModule, int] | None:
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupport

    class Support(OperatorSupport):
        def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
            return node.op == "call_function" and not (
                isinstance(node.target, torch._ops.OpOverload) and _base_name(node.target) in unsupported)

    try:
        copy = torch.fx.GraphModule(gm, _copy_graph(gm.graph))
        parts = CapabilityBasedPartitioner(copy, Support(), allows_single_node_partition=True).partition_and_fuse()
    except Exception:  # noqa: BLE001 - a graph the partitioner cannot split runs eagerly whole
        return None
    count = 0
    for name, sub in list(parts.named_children()):
        if isinstance(sub, torch.fx.GraphModule) and name.startswith("fused_"):
            graph = PjrtGraph(sub, f"{kind} part", stats, is_part=True)
            setattr(parts, name, _PartModule(graph))
            count += 1
    return (parts, count) if count else None


def _copy_graph(graph: torch.fx.Graph) -> torch.fx.Graph:
    new = torch.fx.Graph()
    out = new.graph_copy(graph, {})
    new.output(out)
    return new


def _returns_single(gm: torch.fx.GraphModule) -> bool:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return not isinstance(out.args[0], (tuple, list))


def _assemble(tensors: list[torch.Tensor | None], constants: list[Any]) -> tuple[Any, ...]:
    return tuple(t if c is None else c for t, c in zip(tensors, constants))
