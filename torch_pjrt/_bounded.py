"""Bounded dynamic shapes: one program for a whole range of sizes.

A dimension marked ``torch._dynamo.mark_dynamic(x, dim, min=..., max=...)`` reaches the
backend as a symbol with an upper bound. Rather than a program per size, the graph is
rewritten (``plan``) to run on inputs padded to the bound, with masks where padding could
reach a real value, and captured once (``BoundedGraph``):

- every tensor dimension is a product of *atoms*, each a padded size and the real size as
  an expression of the symbols (a reshape of ``[3, s, 16]`` to ``[3*s, 16]`` keeps two
  atoms in its first dimension: its padding is interleaved, not at the end);
- a reduction, a contraction (mm/bmm), a softmax or a loss over a padded dimension first
  replaces the padding by the operation's identity (0, -inf, the loss's ignore_index);
  elementwise work on padding is harmless and dropped at the end;
- sizes used as values (``x / x.shape[1]``) read the real size, a device scalar;
- outputs are cut back to their real sizes, ints recomputed from the real sizes.

An op without a rule here, a size expression that is not monotone in its symbols, or an
in-place update of a padded input refuses the plan: that graph then gets a program per
size, as without bounds, and ``torch_pjrt.metrics()["compiled"]`` says why.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
import torch.fx

aten = torch.ops.aten

Atom = tuple[int, sympy.Expr]  # (padded size, real size: an expression of the symbols, or an Integer)
Dim = tuple[Atom, ...]
Struct = tuple[Dim, ...]

MAX_BOUND = 1 << 20  # a larger bound is no bound worth padding to


class Refused(Exception):
    """The graph cannot run padded; the message says why."""


# ---------------------------------------------------------------- expressions


def _expr(size: Any) -> sympy.Expr:
    return size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(int(size))


def _is_static(e: sympy.Expr) -> bool:
    return not e.free_symbols


def _monotone(e: sympy.Expr) -> bool:
    """Non-decreasing in every symbol (symbols are positive): padding to the bound
    then always holds the real size."""
    from torch.utils._sympy.functions import FloorDiv

    if _is_static(e) or isinstance(e, sympy.Symbol):
        return True
    if isinstance(e, sympy.Add):
        return all(_monotone(a) for a in e.args)
    if isinstance(e, sympy.Mul):
        return all((_is_static(a) and a >= 0) or _monotone(a) for a in e.args)
    if isinstance(e, FloorDiv):
        return _monotone(e.args[0]) and _is_static(e.args[1]) and e.args[1] > 0
    if isinstance(e, (sympy.Max, sympy.Min)):
        return all(_monotone(a) for a in e.args)
    return False


def _python(e: sympy.Expr) -> str:
    from torch.utils._sympy.printers import PythonPrinter

    return PythonPrinter().doprint(e)


# ---------------------------------------------------------------- the plan


@dataclass
class Plan:
    """What BoundedGraph needs at run time: plain data (picklable, for AOTAutograd's cache)."""

    symbols: list[tuple[str, int, int]]  # name, lowest and highest size
    sources: list[tuple[int, int]]  # per symbol: (input position, dim) to read it from (dim -1: an int input)
    inputs: list[tuple[str, tuple[str, ...]]]  # ("tensor", real dims) | ("int", (expr,)) | ("keep", ())
    outputs: list[tuple[str, tuple[Any, ...]]]  # ("tensor", atoms per dim: ((padded, expr), ...)) | ("int", (expr,)) | ("keep", ())
    note: str = ""


@dataclass
class _Compiled:
    """The plan's expressions as Python functions of the symbols' values."""

    plan: Plan
    names: list[str] = field(init=False)
    functions: dict[str, Callable[..., int]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.names = [name for name, _, _ in self.plan.symbols]

    def value(self, expr: str, values: Sequence[int]) -> int:
        fn = self.functions.get(expr)
        if fn is None:
            fn = eval(f"lambda {', '.join(self.names)}: {expr}", {"math": math})  # noqa: S307 - our own printer's text
            self.functions[expr] = fn
        return int(fn(*values))


class _Rewriter:
    """Builds the padded graph from an AOTAutograd graph with symbolic shapes."""

    def __init__(self, gm: torch.fx.GraphModule, bounds: dict[sympy.Symbol, tuple[int, int]],
                 saved: dict[str, tuple[int, Struct]] | None = None) -> None:
        self.gm = gm
        self.saved = saved or {}  # the forward's outputs by name: a backward's inputs keep their padded layout
        self.kept_padded: dict[int, int] = {}  # our input position -> the forward's output position
        self.bounds = bounds
        self.at_bound = {s: sympy.Integer(hi) for s, (_, hi) in bounds.items()}
        self.symbols = sorted(bounds, key=str)
        self.graph = torch.fx.Graph()
        self.env: dict[torch.fx.Node, Any] = {}
        self.struct: dict[torch.fx.Node, Any] = {}
        self.symbol_nodes: dict[sympy.Symbol, torch.fx.Node] = {}
        self.device: torch.device | None = None
        self.sizes: torch.fx.Node | None = None
        self.random: list[str] = []  # random ops drawing over padded dims

    # -- helpers

    def padded(self, e: sympy.Expr) -> int:
        return int(e.xreplace(self.at_bound))

    def atom(self, e: sympy.Expr) -> Atom:
        if not _is_static(e):
            if not e.free_symbols <= set(self.bounds):
                raise Refused(f"size {e} has a symbol without a bound")
            if not _monotone(e):
                raise Refused(f"size {e} is not monotone in its symbols")
        return (self.padded(e), e)

    def meta_struct(self, val: Any) -> Struct:
        return tuple((self.atom(_expr(d)),) for d in val.shape)

    def call(self, target: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
        return self.graph.call_function(target, args, kwargs)

    def binary(self, packet: Any, a: torch.fx.Node, b: Any, **kwargs: Any) -> torch.fx.Node:
        """packet(a, b): its Tensor overload, or its Scalar one when b is a number."""
        mode = "_mode" if kwargs else ""
        overload = getattr(packet, ("Tensor" if isinstance(b, torch.fx.Node) else "Scalar") + mode)
        return self.call(overload, a, b, **kwargs)

    def value(self, e: sympy.Expr) -> Any:
        """A node (0-d int64 on the device) holding e at the real sizes, or an int."""
        from torch.utils._sympy.functions import FloorDiv

        if _is_static(e):
            return int(e)
        if isinstance(e, sympy.Symbol):
            if e not in self.symbol_nodes:
                self.symbol_nodes[e] = self.call(aten.select.int, self.sizes, 0, self.symbols.index(e))
            return self.symbol_nodes[e]
        parts = [self.value(a) for a in e.args] if not isinstance(e, sympy.Pow) else [self.value(e.base)]
        if isinstance(e, (sympy.Add, sympy.Mul)):
            op = aten.add if isinstance(e, sympy.Add) else aten.mul
            nodes = [p for p in parts if isinstance(p, torch.fx.Node)]
            ints = [p for p in parts if not isinstance(p, torch.fx.Node)]
            out = nodes[0]
            for p in nodes[1:] + ints:
                out = self.binary(op, out, p)
            return out
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            out = parts[0]
            for _ in range(int(e.exp) - 1):
                out = self.call(aten.mul.Tensor, out, parts[0])
            return out
        if isinstance(e, FloorDiv) and not isinstance(parts[1], torch.fx.Node):
            return self.binary(aten.div, parts[0], parts[1], rounding_mode="floor")
        if isinstance(e, (sympy.Max, sympy.Min)):
            out = parts[0] if isinstance(parts[0], torch.fx.Node) else parts[1]
            for p in parts:
                if p is out:
                    continue
                if isinstance(p, torch.fx.Node):
                    out = self.call(aten.maximum.default if isinstance(e, sympy.Max) else aten.minimum.default, out, p)
                else:
                    out = self.call(aten.clamp_min.default if isinstance(e, sympy.Max) else aten.clamp_max.default,
                                    out, p)
            return out
        raise Refused(f"size {e} used as a value")

    def dim_mask(self, dim: Dim) -> torch.fx.Node | None:
        """A bool vector over the dim's padded extent: True at real positions."""
        sym = [(k, a) for k, a in enumerate(dim) if not _is_static(a[1])]
        if not sym:
            return None
        shape = [p for p, _ in dim]
        mask = None
        for k, (p, e) in sym:
            iota = self.call(aten.arange.default, p, dtype=torch.int64, device=self.device)
            m = self.call(aten.lt.Tensor, iota, self.value(e))
            view = [1] * len(dim)
            view[k] = p
            m = self.call(aten.reshape.default, m, view)
            mask = m if mask is None else self.call(aten.logical_and.default, mask, m)
        if len(dim) > 1:
            mask = self.call(aten.expand.default, mask, shape)
        return self.call(aten.reshape.default, mask, [math.prod(shape)])

    def masked(self, x: torch.fx.Node, struct: Struct, dims: Sequence[int], fill: Any) -> torch.fx.Node:
        """x with its padding along `dims` replaced by `fill`."""
        mask = None
        rank = len(struct)
        for d in sorted({d % rank for d in dims}) if rank else []:
            m = self.dim_mask(struct[d])
            if m is None:
                continue
            view = [1] * rank
            view[d] = math.prod(p for p, _ in struct[d])
            m = self.call(aten.reshape.default, m, view)
            mask = m if mask is None else self.call(aten.logical_and.default, mask, m)
        if mask is None:
            return x
        return self.call(aten.where.ScalarOther, mask, x, fill)

    def index_parts(self, atoms: Sequence[Atom]) -> tuple[torch.fx.Node, list[torch.fx.Node]]:
        """Over the padded positions of `atoms` (row-major): each atom's index (int64 vectors)."""
        total = math.prod(p for p, _ in atoms)
        iota = self.call(aten.arange.default, total, dtype=torch.int64, device=self.device)
        parts = []
        stride = total
        for p, _ in atoms:
            stride //= p
            parts.append(self.binary(aten.remainder, self.binary(aten.div, iota, stride, rounding_mode="floor"), p))
        return iota, parts

    def positions(self, target: Sequence[Atom], source: Sequence[Atom]) -> torch.fx.Node:
        """For each padded position of `target`'s atoms, the padded position in `source`'s
        atoms holding the same real element (row-major over the real sizes; both have the
        same real size); 0 at padding."""
        _, parts = self.index_parts(target)
        valid = None
        real: Any = 0
        for (p, e), index in zip(target, parts):
            if not _is_static(e):
                v = self.call(aten.lt.Tensor, index, self.value(e))
                valid = v if valid is None else self.call(aten.logical_and.default, valid, v)
            real = index if isinstance(real, int) else self.binary(aten.add, self.binary(aten.mul, real, self.value(e)),
                                                                   index)
        flat: Any = 0
        rest: Any = real
        for k, (q, f) in enumerate(source):
            below = sympy.Mul(*[g for _, g in source[k + 1:]])
            digit = self.binary(aten.div, rest, self.value(below), rounding_mode="floor") if below != 1 else rest
            if k > 0:
                digit = self.binary(aten.remainder, digit, self.value(f))
            flat = digit if isinstance(flat, int) else self.binary(aten.add, self.binary(aten.mul, flat, q), digit)
        if valid is not None:
            flat = self.call(aten.where.ScalarOther, valid, flat, 0)
        return flat

    def relayout(self, x: torch.fx.Node, source: Struct, target: Struct) -> torch.fx.Node:
        """x (laid out as `source`) laid out as `target`: the same real tensor, its
        padding elsewhere; a gather of every element."""
        if source == target:
            return x
        flat = self.call(aten.reshape.default, x, [-1])
        picked = self.call(aten.index_select.default, flat, 0, self.positions(
            [a for dim in target for a in dim], [a for dim in source for a in dim]))
        return self.call(aten.reshape.default, picked, [math.prod(p for p, _ in dim) for dim in target])

    def S(self, a: Any) -> Struct:
        return self.struct[a]

    def has_padding(self, struct: Any) -> bool:
        if isinstance(struct, list):
            return any(self.has_padding(s) for s in struct if s is not None)
        return struct is not None and any(not _is_static(e) for dim in struct for _, e in dim)

    # -- the walk

    def run(self) -> tuple[torch.fx.GraphModule, Plan]:
        nodes = list(self.gm.graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        for n in placeholders:
            self.env[n] = self.graph.node_copy(n, lambda a: self.env[a])
            val = n.meta.get("val")
            if isinstance(val, torch.Tensor):
                self.device = self.device or val.device
                self.struct[n] = self.meta_struct(val)
                if n.name in self.saved and self.has_padding(self.saved[n.name][1]):
                    position, struct = self.saved[n.name]
                    if len(struct) == val.dim() and all(
                            sympy.simplify(sympy.Mul(*[e for _, e in dim]) - _expr(size)) == 0
                            for dim, size in zip(struct, val.shape)):
                        self.struct[n] = struct
                        self.kept_padded[len(self.struct) - 1] = position
            else:
                self.struct[n] = None
        if self.device is None:
            raise Refused("no tensor input")
        self.sizes = self.graph.placeholder("bounded_sizes")
        output = None
        for n in nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                output = n
                break
            if n.op == "get_attr":
                self.env[n] = self.graph.node_copy(n, lambda a: self.env[a])
                val = getattr(self.gm, str(n.target), None)
                self.struct[n] = self.meta_struct(val) if isinstance(val, torch.Tensor) else None
                continue
            if n.op != "call_function":
                raise Refused(f"{n.op} node {n.name}")
            try:
                self.env[n], self.struct[n] = self.rewrite(n)
                self.check(n)
            except Refused as e:
                raise Refused(f"{e}{_where(n)}") from None
        assert output is not None
        results = output.args[0]
        single = not isinstance(results, (tuple, list))
        results_list = [results] if single else list(results)
        self.graph.output(self.env[results_list[0]] if single else
                          tuple(self.env[r] if isinstance(r, torch.fx.Node) else r for r in results_list))
        new = torch.fx.GraphModule(self.gm, self.graph)
        return new, self.plan(placeholders, results_list)

    def check(self, n: torch.fx.Node) -> None:
        """The rule's padded layout agrees with the traced shapes (a rule's mistake refuses
        the plan instead of computing a wrong value)."""
        val = n.meta.get("val")
        structs = self.struct[n]
        vals = list(val) if isinstance(val, (tuple, list)) else [val]
        structs = structs if isinstance(structs, list) else [structs]
        for v, s in zip(vals, structs):
            if not isinstance(v, torch.Tensor) or s is None:
                continue
            if len(s) != v.dim():
                raise Refused(f"{n.target}: rank {len(s)} against {v.dim()}")
            for dim, size in zip(s, v.shape):
                real = sympy.Mul(*[e for _, e in dim])
                if sympy.simplify(real - _expr(size)) != 0 or math.prod(p for p, _ in dim) != self.padded(_expr(size)):
                    raise Refused(f"{n.target}: padded layout {dim} does not give size {size}")

    def plan(self, placeholders: list[torch.fx.Node], results: list[Any]) -> Plan:
        sources: dict[sympy.Symbol, tuple[int, int]] = {}
        inputs: list[tuple[str, tuple[str, ...]]] = []
        for i, n in enumerate(placeholders):
            val = n.meta.get("val")
            if isinstance(val, torch.Tensor):
                exprs = [_expr(d) for d in val.shape]
                for d, e in enumerate(exprs):
                    if isinstance(e, sympy.Symbol):
                        sources.setdefault(e, (i, d))
                if any(not _is_static(e) for e in exprs):
                    if any(u.target is aten.copy_.default and u.args[0] is n for u in n.users):
                        raise Refused(f"input {i} has a padded size and is updated in place")
                    if i in self.kept_padded:  # the forward hands it over padded, in this layout
                        sizes = tuple(str(math.prod(p for p, _ in dim)) for dim in self.struct[n])
                        inputs.append(("padded", sizes))
                    else:
                        inputs.append(("tensor", tuple(_python(e) for e in exprs)))
                else:
                    inputs.append(("keep", ()))
            elif isinstance(val, torch.SymInt):
                e = _expr(val)
                if isinstance(e, sympy.Symbol):
                    sources[e] = (i, -1)
                inputs.append(("int", (_python(e),)))
            else:
                inputs.append(("keep", ()))
        missing = [s for s in self.symbols if s not in sources]
        if missing:
            raise Refused(f"no input gives the size {missing[0]}")
        outputs: list[tuple[str, tuple[Any, ...]]] = []
        for r in results:
            val = r.meta.get("val") if isinstance(r, torch.fx.Node) else r
            if isinstance(val, torch.Tensor) and self.has_padding(self.struct[r]):
                outputs.append(("tensor", tuple(tuple((p, _python(e)) for p, e in dim) for dim in self.struct[r])))
            elif isinstance(val, torch.SymInt) and not _is_static(_expr(val)):
                outputs.append(("int", (_python(_expr(val)),)))
            else:
                outputs.append(("keep", ()))
        symbols = [(str(s), *self.bounds[s]) for s in self.symbols]
        self.outputs_by_name = {r.name: (k, self.struct[r]) for k, r in enumerate(results)
                                if isinstance(r, torch.fx.Node) and outputs[k][0] == "tensor"}
        return Plan(symbols, [sources[s] for s in self.symbols], inputs, outputs)

    # -- rules

    def rewrite(self, n: torch.fx.Node) -> tuple[Any, Any]:
        target = n.target
        if target is operator.getitem:
            base, index = n.args
            structs = self.struct[base]
            return self.graph.node_copy(n, lambda a: self.env[a]), structs[index] if isinstance(structs, list) else None
        if not isinstance(target, torch._ops.OpOverload):
            # SymInt arithmetic (operator.mul, sym_size ...): evaluated at the bound, a size
            if isinstance(n.meta.get("val"), (torch.SymInt, int, torch.SymBool, bool)):
                return self.graph.node_copy(n, lambda a: self.env[a]), None
            raise Refused(f"{target} has no padding rule")
        if target in (aten.sym_size.int, aten.sym_numel.default):  # at the bound, as the padded tensor has it
            return self.graph.node_copy(n, lambda a: self.env[a]), None
        rule = _RULES.get(target) or _RULES.get(target.overloadpacket)
        if rule is not None:
            return rule(self, n)
        inputs_padded = any(self.has_padding(self.struct.get(a)) for a in n.all_input_nodes)
        val = n.meta.get("val")
        vals = list(val) if isinstance(val, (tuple, list)) else [val]
        outputs_padded = any(isinstance(v, torch.Tensor) and any(not _is_static(_expr(d)) for d in v.shape)
                             for v in vals)
        if torch.Tag.pointwise in target.tags:
            return _pointwise(self, n)
        if not inputs_padded and not outputs_padded and not _symbolic_args(n):
            new = self.graph.node_copy(n, lambda a: self.env[a])
            structs = [self.meta_struct(v) if isinstance(v, torch.Tensor) else None for v in vals]
            return new, structs if isinstance(val, (tuple, list)) else structs[0]
        raise Refused(f"{target} has no padding rule")


def _where(n: torch.fx.Node) -> str:
    """ ' at file:line' of the user's code that made the node, when traced."""
    trace = n.meta.get("stack_trace") or ""
    lines = [line.strip() for line in trace.splitlines() if line.strip().startswith("File ")]
    if not lines:
        return ""
    parts = lines[-1].split('"')
    location = parts[1].rsplit("/", 1)[-1] if len(parts) > 1 else ""
    line = lines[-1].split("line ")[-1].split(",")[0]
    return f" at {location}:{line}" if location else ""


def _symbolic_args(n: torch.fx.Node) -> bool:
    return any(isinstance(a.meta.get("val"), torch.SymInt) and not _is_static(_expr(a.meta["val"]))
               for a in n.all_input_nodes)


def _copy(rw: _Rewriter, n: torch.fx.Node, struct: Any) -> tuple[Any, Any]:
    return rw.graph.node_copy(n, lambda a: rw.env[a]), struct


def _same(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    return _copy(rw, n, rw.S(n.args[0]))


def _prefix_wise(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    """cumsum, triu, tril: a real position depends only on positions before it (or on its
    indices), so padding at the end of a dimension changes nothing real; padding inside a
    dimension (two atoms) would."""
    s = rw.S(n.args[0])
    dims = [n.args[1] % len(s)] if n.target.overloadpacket is aten.cumsum else [len(s) - 2, len(s) - 1]
    if any(not _single(s[d]) for d in dims):
        raise Refused(f"{n.target}: along a dimension with padding inside it")
    return _same(rw, n)


def _from_meta(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    """A factory (zeros, arange ...): its padded layout is its sizes at the bound, real data first."""
    val = n.meta["val"]
    if n.target.overloadpacket is aten.scalar_tensor and isinstance(n.args[0], torch.fx.Node):
        e = _expr(n.args[0].meta["val"])
        return rw.call(aten._to_copy.default, rw.value(e), dtype=val.dtype), ()
    for name in ("fill_value", "start", "step"):
        a = n.kwargs.get(name)
        if isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.SymInt):
            raise Refused(f"{n.target}: a size as its {name}")
    if n.target.overloadpacket in (aten.full, aten.new_full):
        fill = n.args[-1] if len(n.args) > (2 if n.target.overloadpacket is aten.new_full else 1) else None
        if isinstance(fill, torch.fx.Node):
            raise Refused(f"{n.target}: a size as its value")
    if n.target.overloadpacket is aten.arange and n.target._overloadname not in ("default", "start"):
        raise Refused(f"{n.target} with a step")
    return _copy(rw, n, rw.meta_struct(val))


def _broadcast(rw: _Rewriter, n: torch.fx.Node, tensors: Sequence[Any]) -> Struct:
    """The result's layout: each dim as the first operand padded there has it (an operand
    laid out otherwise is relaid out: _aligned)."""
    rank = n.meta["val"].dim()
    out: list[Dim] = []
    meta = n.meta["val"].shape
    for k in range(rank):
        chosen: Dim | None = None
        for t in tensors:
            s = rw.S(t)
            j = k - (rank - len(s))
            if j >= 0 and not all(_is_static(e) for _, e in s[j]):
                chosen = s[j]
                break
        out.append(chosen if chosen is not None else (rw.atom(_expr(meta[k])),))
    return tuple(out)


def _aligned(rw: _Rewriter, a: torch.fx.Node, struct: Struct) -> torch.fx.Node:
    """Operand `a` (new graph) laid out as `struct` where it has the same dims padded."""
    s = rw.S(a)
    rank = len(struct)
    want = list(s)
    for j, dim in enumerate(s):
        k = j + rank - len(s)
        if not all(_is_static(e) for _, e in dim) and dim != struct[k]:
            want[j] = struct[k]
    return rw.relayout(rw.env[a], s, tuple(want)) if tuple(want) != s else rw.env[a]


def _pointwise(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    op = n.target
    tensors = [a for a in n.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
    struct = _broadcast(rw, n, tensors)
    replaced: list[str] = []  # the schema arguments given a real size instead of a bound one

    def arg(name: str, a: Any) -> Any:
        if isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), (torch.SymInt, torch.SymFloat)):
            if not isinstance(a.meta["val"], torch.SymInt):
                raise Refused(f"{op}: a symbolic float as a value")
            e = _expr(a.meta["val"])
            if not _is_static(e):
                replaced.append(name)
                return rw.value(e)
        return torch.fx.node.map_arg(a, lambda x: _aligned(rw, x, struct) if x in tensors else rw.env[x])

    names = [a.name for a in op._schema.arguments]
    args = tuple(arg(names[k], a) for k, a in enumerate(n.args))
    kwargs = {k: arg(k, v) for k, v in n.kwargs.items()}
    if replaced:
        swap = {"Scalar": "Tensor", "Tensor_Scalar": "Tensor_Tensor", "Scalar_Tensor": "Tensor_Tensor"}.get(
            op._overloadname)
        if swap is not None and hasattr(op.overloadpacket, swap):
            op = getattr(op.overloadpacket, swap)
        types = {a.name: a.type for a in op._schema.arguments}
        if any(not isinstance(types.get(name), torch.TensorType) for name in replaced):
            raise Refused(f"{op}: a size as a value")
    return rw.graph.call_function(op, args, kwargs), struct


def _regroup(rw: _Rewriter, n: torch.fx.Node, source: Struct, target: Sequence[Any]) -> Struct:
    """The source's atoms grouped into the target's dims: a reshape that keeps each
    atom whole (a static atom may split)."""
    queue = [a for dim in source for a in dim if a != (1, sympy.Integer(1))]
    out: list[Dim] = []
    for size in target:
        t = _expr(size)
        group: list[Atom] = []
        real: sympy.Expr = sympy.Integer(1)
        while sympy.simplify(real - t) != 0:
            if not queue:
                raise Refused(f"{n.target}: cannot regroup {source} into {list(target)}")
            p, e = queue.pop(0)
            ratio = sympy.simplify(t / real)
            if _is_static(e) and ratio.is_Integer and int(ratio) < p and p % int(ratio) == 0 and int(ratio) > 0:
                queue.insert(0, (p // int(ratio), sympy.Integer(p // int(ratio))))
                p, e = int(ratio), sympy.Integer(int(ratio))
            group.append((p, e))
            real = real * e
        out.append(tuple(group) if group else ((1, sympy.Integer(1)),))
    if queue:
        raise Refused(f"{n.target}: cannot regroup {source} into {list(target)}")
    return tuple(out)


def _reshape(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    try:
        return _copy(rw, n, _regroup(rw, n, rw.S(n.args[0]), n.meta["val"].shape))
    except Refused:
        # padding inside a dim the reshape splits differently: gather into the target's
        # own layout (each dim padded at its end)
        target = rw.meta_struct(n.meta["val"])
        return rw.relayout(rw.env[n.args[0]], rw.S(n.args[0]), target), target


def _permute(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    s = rw.S(n.args[0])
    if n.target.overloadpacket is aten.permute:
        order = [d % len(s) for d in n.args[1]]
    elif n.target.overloadpacket is aten.t:
        order = list(range(len(s)))[::-1]
    else:  # transpose
        order = list(range(len(s)))
        a, b = n.args[1] % len(s), n.args[2] % len(s)
        order[a], order[b] = order[b], order[a]
    return _copy(rw, n, tuple(s[d] for d in order))


def _unsqueeze(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    s = list(rw.S(n.args[0]))
    d = n.args[1] % (len(s) + 1)
    s.insert(d, ((1, sympy.Integer(1)),))
    return _copy(rw, n, tuple(s))


def _squeeze(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    s = rw.S(n.args[0])
    return _copy(rw, n, _regroup(rw, n, s, n.meta["val"].shape))


def _expand(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    s = rw.S(n.args[0])
    meta = n.meta["val"].shape
    lead = len(meta) - len(s)
    out = [(rw.atom(_expr(meta[k])),) for k in range(lead)]
    for k, dim in enumerate(s):
        size = _expr(meta[lead + k])
        out.append(dim if sympy.simplify(sympy.Mul(*[e for _, e in dim]) - size) == 0 else (rw.atom(size),))
    return _copy(rw, n, tuple(out))


def _single(dim: Dim) -> bool:
    return len(dim) == 1


def _slice(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    x, d = n.args[0], (n.args[1] if len(n.args) > 1 else 0)
    s = rw.S(x)
    d %= len(s)
    start = n.args[2] if len(n.args) > 2 else 0
    step = n.args[4] if len(n.args) > 4 else 1
    dim = s[d]
    out = list(s)
    size = _expr(n.meta["val"].shape[d])
    if all(_is_static(e) for _, e in dim):
        out[d] = (rw.atom(size),)
        return _copy(rw, n, tuple(out))
    if not _single(dim) or step != 1 or not isinstance(start, int) or start < 0:
        raise Refused(f"{n.target}: a slice of a padded dimension other than [start >= 0:end]")
    out[d] = (rw.atom(size),)
    return _copy(rw, n, tuple(out))


def _select(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    x, d, index = n.args
    s = rw.S(x)
    d %= len(s)
    dim = s[d]
    out = s[:d] + s[d + 1:]
    if all(_is_static(e) for _, e in dim) or (isinstance(index, int) and index >= 0):
        return _copy(rw, n, out)
    if not _single(dim) or not isinstance(index, int):
        raise Refused(f"{n.target}: a select from the end of a padded dimension")
    position = rw.binary(aten.add, rw.value(dim[0][1]), index)
    picked = rw.call(aten.index_select.default, rw.env[x], d, rw.call(aten.reshape.default, position, [1]))
    return rw.call(aten.squeeze.dim, picked, d), out


def _select_backward(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    grad, sizes, d, index = n.args
    struct = rw.meta_struct(n.meta["val"])
    d %= len(struct)
    dim = struct[d]
    if all(_is_static(e) for _, e in dim) or index >= 0:
        return _copy(rw, n, struct)
    position = rw.call(aten.reshape.default, rw.binary(aten.add, rw.value(dim[0][1]), index), [1])
    zeros = rw.call(aten.zeros.default, [rw.env[a] if isinstance(a, torch.fx.Node) else a for a in sizes],
                    dtype=n.meta["val"].dtype, device=rw.device)
    return rw.call(aten.index_copy.default, zeros, d, position, rw.call(aten.unsqueeze.default, rw.env[grad], d)), \
        struct


def _slice_backward(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    grad, sizes, d, start, end, step = n.args
    struct = rw.meta_struct(n.meta["val"])
    d %= len(struct)
    if not all(_is_static(e) for _, e in struct[d]) and (step != 1 or not isinstance(start, int) or start < 0):
        raise Refused(f"{n.target}: a slice of a padded dimension other than [start >= 0:end]")
    return _copy(rw, n, struct)


def _cat(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    tensors = [t for t in n.args[0] if t.meta["val"].dim() == n.meta["val"].dim()]  # cat skips 1-d empties
    d = (n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)) % n.meta["val"].dim()
    out = list(_broadcast(rw, n, tensors))
    out[d] = (rw.atom(_expr(n.meta["val"].shape[d])),)
    out_struct = tuple(out)
    parts = []
    for t in tensors:
        want = list(out_struct)
        want[d] = rw.S(t)[d]
        parts.append(_aligned(rw, t, tuple(want)))
    joined = rw.call(aten.cat.default, parts, d)
    if all(all(_is_static(e) for _, e in rw.S(t)[d]) for t in tensors):
        return joined, out_struct
    # Each part's padding sits after its real rows: gather the real rows together, padding last.
    source = [rw.S(t)[d] for t in tensors]
    if any(len(dim) != 1 for dim in source):
        source_atoms = [rw.S(t)[d] for t in tensors]
        raise Refused(f"{n.target}: a concatenation of dims with padding inside them ({source_atoms})")
    total = math.prod(p for p, _ in out_struct[d])
    index = rw.call(aten.arange.default, total, dtype=torch.int64, device=rw.device)
    position: Any = None
    real_offset: Any = 0
    padded_offset = 0
    for (p, e), in source:
        here = rw.binary(aten.add, rw.binary(aten.sub, index, real_offset), padded_offset)
        position = here if position is None else rw.call(
            aten.where.self, rw.binary(aten.ge, index, real_offset), here, position)
        real_offset = rw.value(e) if isinstance(real_offset, int) else rw.binary(aten.add, real_offset, rw.value(e))
        padded_offset += p
    position = rw.call(aten.clamp.default, position, 0, total - 1)
    return rw.call(aten.index_select.default, joined, d, position), out_struct


def _pad(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    """constant_pad_nd: padding a padded dim at its end writes the value over our padding
    first, so the real part stays a prefix; at its start it is a prefix already."""
    x, pads = n.args[0], n.args[1]
    value = n.args[2] if len(n.args) > 2 else n.kwargs.get("value", 0)
    s = rw.S(x)
    masked_dims = []
    out = list(s)
    for k in range(len(pads) // 2):
        d = len(s) - 1 - k
        before, after = pads[2 * k], pads[2 * k + 1]
        size = _expr(n.meta["val"].shape[d])
        if not all(_is_static(e) for _, e in s[d]):
            if not (isinstance(before, int) and isinstance(after, int)) or before < 0 or after < 0 \
                    or not _single(s[d]):
                raise Refused(f"{n.target}: cropping or padding inside a padded dim")
            if after:
                masked_dims.append(d)
        out[d] = (rw.atom(size),)
    dtype = x.meta["val"].dtype
    fill = value if dtype.is_floating_point or dtype.is_complex else (bool(value) if dtype is torch.bool
                                                                       else int(value))
    xin = rw.masked(rw.env[x], s, masked_dims, fill) if masked_dims else rw.env[x]
    return rw.call(aten.constant_pad_nd.default, xin, list(pads), value), tuple(out)


def _split(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    s = rw.S(n.args[0])
    d = (n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0)) % len(s)
    if not all(_is_static(e) for _, e in s[d]):
        raise Refused(f"{n.target}: a split along a padded dimension")
    structs = []
    for v in n.meta["val"]:
        out = list(s)
        out[d] = (rw.atom(_expr(v.shape[d])),)
        structs.append(tuple(out))
    return _copy(rw, n, structs)


def _reduce_dims(n: torch.fx.Node, rank: int) -> tuple[list[int], bool]:
    """The dims a reduction reduces, and keepdim."""
    everything = list(range(rank))
    if n.target._overloadname == "default" and n.target.overloadpacket in (
            aten.sum, aten.mean, aten.prod, aten.any, aten.all, aten.max, aten.min):
        return everything, False
    dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
    keepdim = bool(n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False))
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return everything, keepdim
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % rank for d in dims}) if rank else [], keepdim


_IDENTITY: dict[Any, Callable[[torch.dtype], Any]] = {
    aten.sum: lambda dt: 0,
    aten.mean: lambda dt: 0,
    aten.amax: lambda dt: -math.inf if dt.is_floating_point else torch.iinfo(dt).min,
    aten.amin: lambda dt: math.inf if dt.is_floating_point else torch.iinfo(dt).max,
    aten.max: lambda dt: -math.inf if dt.is_floating_point else torch.iinfo(dt).min,
    aten.min: lambda dt: math.inf if dt.is_floating_point else torch.iinfo(dt).max,
    aten.argmax: lambda dt: -math.inf if dt.is_floating_point else torch.iinfo(dt).min,
    aten.argmin: lambda dt: math.inf if dt.is_floating_point else torch.iinfo(dt).max,
    aten.logsumexp: lambda dt: -math.inf,
    aten.any: lambda dt: False,
    aten.all: lambda dt: True,
    aten.prod: lambda dt: 1,
}


def _reduction(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    x = n.args[0]
    s = rw.S(x)
    packet = n.target.overloadpacket
    if packet in (aten.max, aten.min) and n.target._overloadname not in ("dim", "default"):
        raise Refused(f"{n.target} has no padding rule")
    dims, keepdim = _reduce_dims(n, len(s))
    out: list[Dim] = []
    for k, dim in enumerate(s):
        if k in dims:
            if keepdim:
                out.append(((1, sympy.Integer(1)),))
        else:
            out.append(dim)
    padded = [d for d in dims if not all(_is_static(e) for _, e in s[d])]
    structs: Any = tuple(out)
    if isinstance(n.meta["val"], (tuple, list)):
        structs = [tuple(out)] * len(n.meta["val"])
    if not padded:
        return _copy(rw, n, structs)
    dtype = x.meta["val"].dtype
    masked = rw.masked(rw.env[x], s, padded, _IDENTITY[packet](dtype))
    args = (masked, *[rw.env[a] if isinstance(a, torch.fx.Node) else a for a in n.args[1:]])
    kwargs = {k: rw.env[v] if isinstance(v, torch.fx.Node) else v for k, v in n.kwargs.items()}
    if packet is not aten.mean:
        return rw.graph.call_function(n.target, args, kwargs), structs
    total = rw.call(aten.sum.dim_IntList, masked, dims, keepdim, dtype=kwargs.get("dtype"))
    count = sympy.Mul(*[e for d in dims for _, e in s[d]])
    return rw.binary(aten.div, total, rw.value(count)), structs


def _along_static_dim(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    """sort, topk, argsort: each row alone, so padding along the other dims is harmless;
    along a padded dim they would move padding among real values."""
    s = rw.S(n.args[0])
    names = [a.name for a in n.target._schema.arguments]
    bound = dict(zip(names, n.args)) | dict(n.kwargs)
    d = bound.get("dim", -1) % len(s)
    if not all(_is_static(e) for _, e in s[d]):
        raise Refused(f"{n.target}: along a padded dimension")
    val = n.meta["val"]
    out = list(s)
    out[d] = (rw.atom(_expr((val[0] if isinstance(val, (tuple, list)) else val).shape[d])),)
    return _copy(rw, n, [tuple(out)] * len(val) if isinstance(val, (tuple, list)) else tuple(out))


def _variance(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    """var, std, var_mean over padded dims: the mean and the squared deviations of the
    real elements, divided by the real count (less the correction)."""
    x = n.args[0]
    s = rw.S(x)
    dims_arg = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
    dims = list(range(len(s))) if dims_arg in (None, []) else sorted({d % len(s) for d in dims_arg})
    keepdim = bool(n.kwargs.get("keepdim", False))
    out = tuple(((1, sympy.Integer(1)),) if k in dims else s[k] for k in range(len(s)) if keepdim or k not in dims)
    packet = n.target.overloadpacket
    structs: Any = [out, out] if packet is aten.var_mean else out
    padded = [d for d in dims if not all(_is_static(e) for _, e in s[d])]
    if not padded:
        return _copy(rw, n, structs)
    if n.target._overloadname != "correction":
        raise Refused(f"{n.target} has no padding rule")
    correction = n.kwargs.get("correction", 1)
    correction = 1 if correction is None else correction
    count = rw.value(sympy.Mul(*[e for d in dims for _, e in s[d]]))
    xs = rw.masked(rw.env[x], s, padded, 0)
    mean = rw.binary(aten.div, rw.call(aten.sum.dim_IntList, xs, dims, True), count)
    deviation = rw.masked(rw.call(aten.sub.Tensor, rw.env[x], mean), s, padded, 0)
    squares = rw.call(aten.sum.dim_IntList, rw.call(aten.mul.Tensor, deviation, deviation), dims, keepdim)
    var = rw.binary(aten.div, squares, rw.binary(aten.sub, count, correction))
    if packet is aten.std:
        return rw.call(aten.sqrt.default, var), structs
    if packet is aten.var_mean:
        m = mean if keepdim else rw.call(aten.squeeze.dims, mean, dims)
        return rw.call(_tuple, var, m), structs
    return var, structs


def _flip(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    """flip along a padded dim: the real elements reversed in place, padding still last
    (a gather of real positions n-1-i)."""
    x, dims = n.args[0], n.args[1]
    s = rw.S(x)
    dims = [d % len(s) for d in dims]
    static = [d for d in dims if all(_is_static(e) for _, e in s[d])]
    out = rw.call(aten.flip.default, rw.env[x], static) if static else rw.env[x]
    for d in dims:
        if d in static:
            continue
        if not _single(s[d]):
            raise Refused(f"{n.target}: along a dim with padding inside it")
        (p, e), = s[d]
        i = rw.call(aten.arange.default, p, dtype=torch.int64, device=rw.device)
        last = rw.binary(aten.sub, rw.value(e), 1)
        source = rw.call(aten.clamp_min.default, rw.binary(aten.sub, rw.call(aten.neg.default, i), rw.call(
            aten.neg.default, last)), 0)
        out = rw.call(aten.index_select.default, out, d, source)
    return out, s


def _tuple(*items: Any) -> tuple[Any, ...]:
    return tuple(items)


def _convolution(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    """A convolution over padded spatial dims reads zeros there, as its own zero padding
    past the real end: the real outputs are a prefix."""
    x = n.args[0]
    s = rw.S(x)
    if n.args[6]:  # transposed
        if any(not all(_is_static(e) for _, e in dim) for dim in s[2:]):
            raise Refused(f"{n.target}: a transposed convolution over a padded dim")
    if not _single(s[0]) or any(not _single(dim) for dim in s[2:]):
        raise Refused(f"{n.target}: over a dim with padding inside it")
    xin = rw.masked(rw.env[x], s, range(2, len(s)), 0)
    args = (xin, *[rw.env[a] if isinstance(a, torch.fx.Node) else a for a in n.args[1:]])
    out = list(rw.meta_struct(n.meta["val"]))
    out[0] = s[0]
    return rw.graph.call_function(n.target, args, dict(n.kwargs)), tuple(out)


def _convolution_backward(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    grad, x = n.args[0], n.args[1]
    sg, sx = rw.S(grad), rw.S(x)
    if n.args[7]:
        raise Refused(f"{n.target}: a transposed convolution")
    if any(not _single(dim) for dim in (*sg, *sx)):
        raise Refused(f"{n.target}: over a dim with padding inside it")
    g = rw.masked(rw.env[grad], sg, range(len(sg)), 0)
    xin = rw.masked(rw.env[x], sx, range(len(sx)), 0)
    args = (g, xin, *[rw.env[a] if isinstance(a, torch.fx.Node) else a for a in n.args[2:]])
    vals = n.meta["val"]
    structs = [sx, *[rw.meta_struct(v) if isinstance(v, torch.Tensor) else None for v in vals[1:]]]
    return rw.graph.call_function(n.target, args, dict(n.kwargs)), structs


def _softmax(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    x, d = n.args[0], n.args[1]
    s = rw.S(x)
    masked = rw.masked(rw.env[x], s, [d], -math.inf)
    return rw.graph.call_function(n.target, (masked, *n.args[1:]), dict(n.kwargs)), s


def _softmax_backward(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    grad, out, d = n.args[0], n.args[1], n.args[2]
    s = rw.S(grad)
    g = rw.masked(rw.env[grad], s, [d], 0)
    o = rw.masked(rw.env[out], s, [d], 0) if n.target.overloadpacket is aten._softmax_backward_data else rw.env[out]
    return rw.graph.call_function(n.target, (g, o, *n.args[2:]), dict(n.kwargs)), s


def _matmul(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    packet = n.target.overloadpacket
    bias = None
    if packet is aten.addmm:
        bias, a, b = n.args[:3]
    else:
        a, b = n.args[:2]
    sa, sb = rw.S(a), rw.S(b)
    ea, eb = rw.env[a], rw.env[b]
    want = list(sb)
    want[-2] = sa[-1]
    if packet is aten.bmm:
        want[0] = sa[0]
    if tuple(want) != sb:  # b padded otherwise along a shared dim: relaid out as a has it
        eb = rw.relayout(eb, sb, tuple(want))
        sb = tuple(want)
    if not all(_is_static(e) for _, e in sa[-1]):
        ea = rw.masked(ea, sa, [len(sa) - 1], 0)
        eb = rw.masked(eb, sb, [len(sb) - 2], 0)
    struct = (*sa[:-1], sb[-1])
    if bias is not None:
        rank_b = len(rw.S(bias))
        for k in range(rank_b):
            dim = rw.S(bias)[k - rank_b]
            if not all(_is_static(e) for _, e in dim) and dim != struct[k - rank_b]:
                raise Refused(f"{n.target}: bias padded differently")
        args = (rw.env[bias], ea, eb, *n.args[3:])
    else:
        args = (ea, eb, *n.args[2:])
    return rw.graph.call_function(n.target, args, dict(n.kwargs)), struct


def _layer_norm(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    x, shape = n.args[0], n.args[1]
    s = rw.S(x)
    lead = len(s) - len(shape)
    if any(not all(_is_static(e) for _, e in dim) for dim in s[lead:]):
        raise Refused(f"{n.target}: normalized over a padded dimension")
    stat = (*s[:lead], *[((1, sympy.Integer(1)),)] * len(shape))
    return _copy(rw, n, [s, stat, stat])


def _layer_norm_backward(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    grad, x, shape = n.args[:3]
    s = rw.S(x)
    lead = len(s) - len(shape)
    if any(not all(_is_static(e) for _, e in dim) for dim in s[lead:]):
        raise Refused(f"{n.target}: normalized over a padded dimension")
    g = rw.masked(rw.env[grad], s, range(lead), 0)
    args = (g, *[rw.env[a] if isinstance(a, torch.fx.Node) else a for a in n.args[1:]])
    params = [rw.meta_struct(v) if isinstance(v, torch.Tensor) else None for v in n.meta["val"]]
    return rw.graph.call_function(n.target, args, dict(n.kwargs)), [s, *params[1:]]


def _embedding(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    weight, indices = n.args[:2]
    args = (rw.env[weight], _in_range(rw, indices), *n.args[2:])
    return rw.graph.call_function(n.target, args, dict(n.kwargs)), (*rw.S(indices), *rw.S(weight)[1:])


def _embedding_backward(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    grad, indices = n.args[:2]
    si = rw.S(indices)
    g = rw.masked(rw.env[grad], rw.S(grad), range(len(si)), 0)
    args = (g, *[rw.env[a] if isinstance(a, torch.fx.Node) else a for a in n.args[1:]])
    return rw.graph.call_function(n.target, args, dict(n.kwargs)), rw.meta_struct(n.meta["val"])


def _nll_loss(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    backward = n.target.overloadpacket is aten.nll_loss_backward
    names = ["grad_output", "self", "target", "weight", "reduction", "ignore_index", "total_weight"] if backward \
        else ["self", "target", "weight", "reduction", "ignore_index"]
    bound = dict(zip(names, n.args)) | dict(n.kwargs)
    target = bound["target"]
    st = rw.S(target)
    new_target = rw.masked(rw.env[target], st, range(len(st)), bound["ignore_index"])
    args = [new_target if name == "target" else (rw.env[bound[name]] if isinstance(bound[name], torch.fx.Node)
                                                  else bound[name]) for name in names]
    if backward:
        struct: Any = rw.S(bound["self"])
    elif bound["reduction"] == 0:
        struct = [st, ()]
    else:
        struct = [(), ()]
    return rw.graph.call_function(n.target, tuple(args), {}), struct


def _in_range(rw: _Rewriter, index: torch.fx.Node) -> torch.fx.Node:
    """An index tensor with 0 at its padding: what padding computed may be out of range,
    and an out-of-range index is an error."""
    s = rw.S(index)
    return rw.masked(rw.env[index], s, range(len(s)), 0)


def _gather(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    x, d, index = n.args[:3]
    args = (rw.env[x], d, _in_range(rw, index), *n.args[3:])
    return rw.graph.call_function(n.target, args, dict(n.kwargs)), rw.S(index)


def _index_select(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    x, d, index = n.args
    s = list(rw.S(x))
    d %= len(s)
    s[d] = rw.S(index)[0] if rw.S(index) else ((1, sympy.Integer(1)),)
    return rw.call(aten.index_select.default, rw.env[x], d, _in_range(rw, index)), tuple(s)


def _index(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    """x[i, j, ...] with index tensors: the indexed dims become the indices' broadcast
    layout, in place when they are adjacent, else first."""
    x, indices = n.args
    sx = rw.S(x)
    used = [k for k, i in enumerate(indices) if i is not None]
    if any(indices[k].meta["val"].dtype in (torch.bool, torch.uint8) for k in used):
        raise Refused(f"{n.target}: a boolean mask as an index")
    rank = max(indices[k].meta["val"].dim() for k in used)
    shape = torch.broadcast_shapes(*[indices[k].meta["val"].shape for k in used])
    layout: list[Dim] = []
    for j in range(rank):
        chosen = None
        for k in used:
            si = rw.S(indices[k])
            jj = j - (rank - len(si))
            if jj >= 0 and not all(_is_static(e) for _, e in si[jj]):
                chosen = si[jj]
                break
        layout.append(chosen if chosen is not None else (rw.atom(_expr(shape[j])),))
    new_indices = []
    for i in indices:
        if i is None:
            new_indices.append(None)
            continue
        si = rw.S(i)
        want = tuple(layout[j + rank - len(si)] if not all(_is_static(e) for _, e in si[j]) else si[j]
                     for j in range(len(si)))
        moved = rw.relayout(rw.env[i], si, want) if want != si else rw.env[i]
        new_indices.append(rw.masked(moved, want, range(len(want)), 0))
    adjacent = used == list(range(used[0], used[-1] + 1))
    rest = [sx[k] for k in range(len(sx)) if k not in used]
    if adjacent:
        out = (*sx[:used[0]], *layout, *sx[used[-1] + 1:])
    else:
        out = (*layout, *rest)
    return rw.call(aten.index.Tensor, rw.env[x], new_indices), tuple(out)


def _random(rw: _Rewriter, n: torch.fx.Node) -> tuple[Any, Any]:
    """dropout, rand_like, bernoulli ...: each element drawn independently, so the real
    part is drawn as without padding, from other numbers of the stream than a per-size
    program's (said in the plan's note)."""
    val = n.meta.get("val")
    vals = list(val) if isinstance(val, (tuple, list)) else [val]
    tensors = [a for a in n.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
    if any(isinstance(v, torch.Tensor) and any(not _is_static(_expr(d)) for d in v.shape) for v in vals):
        rw.random.append(str(n.target.overloadpacket).split(".")[-1])
    if tensors:
        struct = rw.S(tensors[0])
        return _copy(rw, n, [struct] * len(vals) if isinstance(val, (tuple, list)) else struct)
    return _from_meta(rw, n)


_RULES: dict[Any, Callable[[_Rewriter, torch.fx.Node], tuple[Any, Any]]] = {}
for _ops, _rule in [
    ((aten.view, aten.reshape, aten._unsafe_view), _reshape),
    ((aten.permute, aten.transpose, aten.t), _permute),
    ((aten.unsqueeze,), _unsqueeze),
    ((aten.squeeze,), _squeeze),
    ((aten.expand,), _expand),
    ((aten.clone, aten.detach, aten.alias, aten.contiguous, aten._to_copy, aten.lift_fresh_copy), _same),
    ((aten.triu, aten.tril, aten.cumsum), _prefix_wise),
    ((aten.empty, aten.zeros, aten.ones, aten.full, aten.arange, aten.new_zeros, aten.new_ones, aten.new_empty,
      aten.new_full, aten.scalar_tensor, aten.empty_strided), _from_meta),
    ((aten.slice,), _slice),
    ((aten.select,), _select),
    ((aten.select_backward,), _select_backward),
    ((aten.slice_backward,), _slice_backward),
    ((aten.cat,), _cat),
    ((aten.constant_pad_nd,), _pad),
    ((aten.split, aten.split_with_sizes), _split),
    (tuple(_IDENTITY), _reduction),
    ((aten._softmax, aten._log_softmax, aten._safe_softmax), _softmax),
    ((aten._softmax_backward_data, aten._log_softmax_backward_data), _softmax_backward),
    ((aten.mm, aten.bmm, aten.addmm), _matmul),
    ((aten.native_layer_norm,), _layer_norm),
    ((aten.native_layer_norm_backward,), _layer_norm_backward),
    ((aten.embedding,), _embedding),
    ((aten.embedding_dense_backward,), _embedding_backward),
    ((aten.nll_loss_forward, aten.nll_loss_backward), _nll_loss),
    ((aten.gather,), _gather),
    ((aten.index_select,), _index_select),
    ((aten.index,), _index),
    ((aten.sort, aten.topk, aten.argsort), _along_static_dim),
    ((aten.flip,), _flip),
    ((aten.var, aten.std, aten.var_mean), _variance),
    ((aten.convolution,), _convolution),
    ((aten.convolution_backward,), _convolution_backward),
    ((aten.native_dropout, aten.rand, aten.randn, aten.rand_like, aten.randn_like, aten.bernoulli), _random),
]:
    for _op in _ops:
        _RULES[_op] = _rule


# Pointwise ops not listed use the broadcast rule (torch.Tag.pointwise).


def bounds_of(example_inputs: Sequence[Any]) -> dict[sympy.Symbol, tuple[int, int]]:
    """The symbols of a graph's inputs with a finite upper bound (mark_dynamic's max)."""
    from torch._guards import detect_fake_mode

    fake = detect_fake_mode(example_inputs)
    env = getattr(fake, "shape_env", None)
    if env is None:
        return {}
    found: dict[sympy.Symbol, tuple[int, int]] = {}
    for t in example_inputs:
        sizes = t.shape if isinstance(t, torch.Tensor) else [t] if isinstance(t, torch.SymInt) else []
        for d in sizes:
            for s in _expr(d).free_symbols:
                r = env.var_to_range.get(s)
                if r is None:
                    continue
                if not (r.upper.is_Integer and r.lower.is_Integer):
                    continue  # no upper bound (int_oo): a program per size, as without bounds
                lo, hi = int(r.lower), int(r.upper)
                if 0 < hi <= MAX_BOUND:
                    found[s] = (max(lo, 0), hi)
    return found


@dataclass
class Planned:
    gm: torch.fx.GraphModule  # the padded graph
    plan: Plan
    outputs_by_name: dict[str, tuple[int, Struct]]  # padded outputs: position and layout, by node name
    kept_padded: dict[int, int]  # inputs handed over padded: our position -> the forward's output position


def plan(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
         saved: dict[str, tuple[int, Struct]] | None = None) -> Planned | str | None:
    """The padded graph and its plan; a str: why a graph with bounded sizes cannot run
    padded; None: no bounded size. `saved`: the forward's padded outputs by name, for a
    backward graph (whose inputs are named after them)."""
    bounds = bounds_of(example_inputs)
    if not bounds:
        return None
    unbounded = {s for t in example_inputs
                 for d in (t.shape if isinstance(t, torch.Tensor) else [t] if isinstance(t, torch.SymInt) else [])
                 for s in _expr(d).free_symbols} - set(bounds)
    if unbounded:
        return f"size {sorted(map(str, unbounded))[0]} has no upper bound"
    rewriter = _Rewriter(gm, bounds, saved)
    try:
        new, p = rewriter.run()
    except Refused as e:
        return str(e)
    p.note = "one program for " + ", ".join(f"{name} in [{lo}, {hi}]" for name, lo, hi in p.symbols)
    if rewriter.random:
        p.note += (f" ({', '.join(sorted(set(rewriter.random)))} draw over the padded shape: other random numbers "
                   "than a program per size)")
    return Planned(new, p, rewriter.outputs_by_name, rewriter.kept_padded)


def hand_over(forward: Plan, backward: Planned) -> None:
    """The forward returns the tensors the backward takes padded as they are (no cut, no
    padding again): called once the backward's plan exists."""
    for position in backward.kept_padded.values():
        forward.outputs[position] = ("padded", ())


class BoundedGraph:
    """Runs a padded graph (a PjrtGraph over it) on inputs of any size within the bounds:
    inputs padded, real sizes passed as one device vector, outputs cut back."""

    def __init__(self, graph: Any, plan: Plan, stats: Any) -> None:
        self._boxed_call = True
        self.graph = graph
        self.plan = plan
        self.stats = stats
        self.compiled = _Compiled(plan)

    @property
    def gm(self) -> torch.fx.GraphModule:
        return self.graph.gm

    def _values(self, inputs: Sequence[Any]) -> list[int]:
        values = []
        for (name, lo, hi), (i, d) in zip(self.plan.symbols, self.plan.sources):
            v = int(inputs[i]) if d < 0 else int(inputs[i].shape[d])
            if not lo <= v <= hi:
                raise ValueError(f"torch_pjrt: size {name} = {v} is outside the bound [{lo}, {hi}] the graph was "
                                 "compiled for")
            values.append(v)
        return values

    def __call__(self, *call_args: Any) -> Any:
        if len(call_args) == 1 and isinstance(call_args[0], list):
            inputs = list(call_args[0])
            call_args[0].clear()
        else:
            inputs = list(call_args)
        values = self._values(inputs)
        bound = [hi for _, _, hi in self.plan.symbols]
        c = self.compiled
        device = None
        real = padded = 0
        for i, (kind, exprs) in enumerate(self.plan.inputs):
            x = inputs[i]
            if kind == "int":
                inputs[i] = c.value(exprs[0], bound)
            elif kind == "padded" and isinstance(x, torch.Tensor):
                target = [int(e) for e in exprs]
                if list(x.shape) != target:
                    raise RuntimeError(f"torch_pjrt: input {i} of a bounded graph is {list(x.shape)}, its forward "
                                       f"gave it padded to {target}")
            elif kind == "tensor" and isinstance(x, torch.Tensor):
                device = x.device
                target = [c.value(e, bound) for e in exprs]
                real += x.numel()
                padded += math.prod(target)
                if list(x.shape) != target:
                    pads: list[int] = []
                    for have, want in zip(reversed(x.shape), reversed(target)):
                        pads += [0, want - have]
                    inputs[i] = torch.nn.functional.pad(x, pads)
        if device is None:
            device = next(t.device for t in inputs if isinstance(t, torch.Tensor))
        self.stats.bounded_real_elements += real
        self.stats.bounded_padded_elements += padded
        inputs.append(torch.tensor(values, dtype=torch.int64).to(device))
        out = self.graph(inputs)
        outputs = [out] if self.graph.single_output else list(out)
        for k, (kind, spec) in enumerate(self.plan.outputs):
            if kind == "int":
                outputs[k] = c.value(spec[0], values)
            elif kind == "tensor" and isinstance(outputs[k], torch.Tensor):
                outputs[k] = _cut(outputs[k], spec, c, values)
        return outputs[0] if self.graph.single_output else tuple(outputs)


def _cut(t: torch.Tensor, dims: Sequence[Sequence[tuple[int, str]]], c: _Compiled, values: Sequence[int]) -> torch.Tensor:
    """A padded output's real part: each atom narrowed to its real size."""
    atoms = [a for dim in dims for a in dim]
    x = t.reshape([p for p, _ in atoms]) if len(atoms) != t.dim() else t
    for k, (p, e) in enumerate(atoms):
        size = c.value(e, values)
        if size != p:
            x = x.narrow(k, 0, size)
    shape = [math.prod(c.value(e, values) for _, e in dim) for dim in dims]
    if len(atoms) != t.dim():
        x = x.reshape(shape)
    return x.contiguous()
