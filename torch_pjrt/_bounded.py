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

from ._bounded_layout import Layout, Refused, Struct, expr_of, is_static, python_text
from ._bounded_rules import RULES, pointwise
from ._graph import unboxed

aten = torch.ops.aten

MAX_BOUND = 1 << 20  # a larger bound is no bound worth padding to


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


class _Rewriter(Layout):
    """Builds the padded graph from an AOTAutograd graph with symbolic shapes."""

    def __init__(self, gm: torch.fx.GraphModule, bounds: dict[sympy.Symbol, tuple[int, int]],
                 saved: dict[str, tuple[int, Struct]] | None = None) -> None:
        super().__init__(gm, bounds)
        self.saved = saved or {}  # the forward's outputs by name: a backward's inputs keep their padded layout
        self.kept_padded: dict[int, int] = {}  # our input position -> the forward's output position

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
                            sympy.simplify(sympy.Mul(*[e for _, e in dim]) - expr_of(size)) == 0
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
            except Exception as e:  # noqa: BLE001 - a rule that cannot follow this node refuses, never crashes
                raise Refused(f"{n.target}: its rule failed ({type(e).__name__}: {e}){_where(n)}") from None
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
                if sympy.simplify(real - expr_of(size)) != 0 or math.prod(p for p, _ in dim) != self.padded(expr_of(size)):
                    raise Refused(f"{n.target}: padded layout {dim} does not give size {size}")

    def plan(self, placeholders: list[torch.fx.Node], results: list[Any]) -> Plan:
        sources: dict[sympy.Symbol, tuple[int, int]] = {}
        inputs: list[tuple[str, tuple[str, ...]]] = []
        for i, n in enumerate(placeholders):
            val = n.meta.get("val")
            if isinstance(val, torch.Tensor):
                exprs = [expr_of(d) for d in val.shape]
                for d, e in enumerate(exprs):
                    if isinstance(e, sympy.Symbol) and i not in self.kept_padded:  # a padded input holds the bound
                        sources.setdefault(e, (i, d))
                if any(not is_static(e) for e in exprs):
                    if any(u.target is aten.copy_.default and u.args[0] is n for u in n.users):
                        raise Refused(f"input {i} has a padded size and is updated in place")
                    if i in self.kept_padded:  # the forward hands it over padded, in this layout
                        sizes = tuple(str(math.prod(p for p, _ in dim)) for dim in self.struct[n])
                        inputs.append(("padded", sizes))
                    else:
                        inputs.append(("tensor", tuple(python_text(e) for e in exprs)))
                else:
                    inputs.append(("keep", ()))
            elif isinstance(val, torch.SymInt):
                e = expr_of(val)
                if isinstance(e, sympy.Symbol):
                    sources[e] = (i, -1)
                inputs.append(("int", (python_text(e),)))
            else:
                inputs.append(("keep", ()))
        missing = [s for s in self.symbols if s not in sources]
        if missing:
            raise Refused(f"no input gives the size {missing[0]}")
        outputs: list[tuple[str, tuple[Any, ...]]] = []
        for r in results:
            val = r.meta.get("val") if isinstance(r, torch.fx.Node) else r
            if isinstance(val, torch.Tensor) and self.has_padding(self.struct[r]):
                outputs.append(("tensor", tuple(tuple((p, python_text(e)) for p, e in dim) for dim in self.struct[r])))
            elif isinstance(val, torch.SymInt) and not is_static(expr_of(val)):
                outputs.append(("int", (python_text(expr_of(val)),)))
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
        rule = RULES.get(target) or RULES.get(target.overloadpacket)
        if rule is not None:
            return rule(self, n)
        inputs_padded = any(self.has_padding(self.struct.get(a)) for a in n.all_input_nodes)
        val = n.meta.get("val")
        vals = list(val) if isinstance(val, (tuple, list)) else [val]
        outputs_padded = any(isinstance(v, torch.Tensor) and any(not is_static(expr_of(d)) for d in v.shape)
                             for v in vals)
        if torch.Tag.pointwise in target.tags:
            return pointwise(self, n)
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
    return any(isinstance(a.meta.get("val"), torch.SymInt) and not is_static(expr_of(a.meta["val"]))
               for a in n.all_input_nodes)


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
            for s in expr_of(d).free_symbols:
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
                 for s in expr_of(d).free_symbols} - set(bounds)
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
        # what each int and padded input becomes: the same at every call
        bound = [hi for _, _, hi in plan.symbols]
        self.at_bound: dict[int, Any] = {
            i: (self.compiled.value(exprs[0], bound) if kind == "int" else
                [self.compiled.value(e, bound) for e in exprs] if kind == "tensor" else [int(e) for e in exprs])
            for i, (kind, exprs) in enumerate(plan.inputs) if kind != "keep"}

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
        inputs = unboxed(call_args)
        values = self._values(inputs)
        c = self.compiled
        device = None
        real = padded = 0
        for i, (kind, _) in enumerate(self.plan.inputs):
            x = inputs[i]
            if kind == "int":
                inputs[i] = self.at_bound[i]
            elif kind == "padded" and isinstance(x, torch.Tensor):
                target = self.at_bound[i]
                if list(x.shape) != target:
                    raise RuntimeError(f"torch_pjrt: input {i} of a bounded graph is {list(x.shape)}, its forward "
                                       f"gave it padded to {target}")
            elif kind == "tensor" and isinstance(x, torch.Tensor):
                device = x.device
                target = self.at_bound[i]
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
