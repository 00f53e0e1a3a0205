"""Bounded dynamic shapes, the layout of a padded graph (torch_pjrt/_bounded.py says what for).

Every tensor dimension of a padded graph is a product of *atoms*: a padded size and the
real size as an expression of the symbols. `Layout` builds the padded graph's helper
nodes from them: real sizes as device values, masks of the real positions, a relayout
(one gather) between two layouts of the same real tensor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import sympy
import torch
import torch.fx

aten = torch.ops.aten

Atom = tuple[int, sympy.Expr]  # (padded size, real size: an expression of the symbols, or an Integer)
Dim = tuple[Atom, ...]
Struct = tuple[Dim, ...]


class Refused(Exception):
    """The graph cannot run padded; the message says why."""


# ---------------------------------------------------------------- expressions


def expr_of(size: Any) -> sympy.Expr:
    return size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(int(size))


def is_static(e: sympy.Expr) -> bool:
    return not e.free_symbols


def monotone(e: sympy.Expr) -> bool:
    """Non-decreasing in every symbol (symbols are positive): padding to the bound
    then always holds the real size."""
    from torch.utils._sympy.functions import FloorDiv

    if is_static(e) or isinstance(e, sympy.Symbol):
        return True
    if isinstance(e, sympy.Add):
        return all(monotone(a) for a in e.args)
    if isinstance(e, sympy.Mul):
        return all(a >= 0 if is_static(a) else monotone(a) for a in e.args)
    if isinstance(e, FloorDiv):
        return monotone(e.args[0]) and is_static(e.args[1]) and e.args[1] > 0
    if isinstance(e, (sympy.Max, sympy.Min)):
        return all(monotone(a) for a in e.args)
    return False


def python_text(e: sympy.Expr) -> str:
    from torch.utils._sympy.printers import PythonPrinter

    return PythonPrinter().doprint(e)


def single(dim: Dim) -> bool:
    """One atom: the dim's padding is at its end."""
    return len(dim) == 1


class Layout:
    """The padded graph being built, and the layout of each of the traced graph's nodes."""

    def __init__(self, gm: torch.fx.GraphModule, bounds: dict[sympy.Symbol, tuple[int, int]]) -> None:
        self.gm = gm
        self.bounds = bounds
        self.at_bound = {s: sympy.Integer(hi) for s, (_, hi) in bounds.items()}
        self.symbols = sorted(bounds, key=str)
        self.graph = torch.fx.Graph()
        self.env: dict[torch.fx.Node, Any] = {}  # traced node -> padded graph's node (or value)
        self.struct: dict[torch.fx.Node, Any] = {}  # traced node -> its layout (a list for tuples; None: no tensor)
        self.symbol_nodes: dict[sympy.Symbol, torch.fx.Node] = {}
        self.device: torch.device | None = None
        self.sizes: torch.fx.Node | None = None  # the placeholder of the real sizes (int64 vector)
        self.random: list[str] = []  # random ops drawing over padded dims

    def padded(self, e: sympy.Expr) -> int:
        return int(e.xreplace(self.at_bound))

    def atom(self, e: sympy.Expr) -> Atom:
        if not is_static(e):
            if not e.free_symbols <= set(self.bounds):
                raise Refused(f"size {e} has a symbol without a bound")
            if not monotone(e):
                raise Refused(f"size {e} is not monotone in its symbols")
        return (self.padded(e), e)

    def meta_struct(self, val: Any) -> Struct:
        return tuple((self.atom(expr_of(d)),) for d in val.shape)

    def new(self, a: Any) -> Any:
        """An argument of the traced graph (nodes, in lists or not) as the new graph has it."""
        return torch.fx.node.map_arg(a, lambda x: self.env[x])

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

        if is_static(e):
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
        sym = [(k, a) for k, a in enumerate(dim) if not is_static(a[1])]
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
            if not is_static(e):
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
        return struct is not None and any(not is_static(e) for dim in struct for _, e in dim)
