"""Bounded dynamic shapes, the rules: per ATen op, the padded graph's nodes and the
layout of the result (torch_pjrt/_bounded.py says what for). A rule masks what padding
could carry into a real value (a reduction's identity, a contraction's zeros, a loss's
ignore_index), relays out operands padded differently, or refuses (`Refused`) what it
cannot make exact; pointwise ops not listed follow `pointwise`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch
import torch.fx

from ._bounded_layout import Atom, Dim, Layout, Refused, Struct, expr_of, is_static, single

aten = torch.ops.aten
Rule = Callable[[Layout, torch.fx.Node], tuple[Any, Any]]


def symbolic(a: Any) -> bool:
    """A size (SymInt) that varies: in the padded graph it holds its value at the bound."""
    val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
    return isinstance(val, torch.SymFloat) or (isinstance(val, torch.SymInt) and not is_static(expr_of(val)))


def refuse_offsets(n: torch.fx.Node, **offsets: Any) -> None:
    """An offset, index or start that varies would be taken at the bound: refused."""
    for name, a in offsets.items():
        if symbolic(a):
            raise Refused(f"{n.target}: a varying size as its {name}")


def copied(rw: Layout, n: torch.fx.Node, struct: Any) -> tuple[Any, Any]:
    """The op as traced, its result laid out as `struct`."""
    return rw.graph.node_copy(n, lambda a: rw.env[a]), struct


def _same(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    return copied(rw, n, rw.S(n.args[0]))


def _prefix_wise(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    """cumsum, triu, tril: a real position depends only on positions before it (or on its
    indices), so padding at the end of a dimension changes nothing real; padding inside a
    dimension (two atoms) would."""
    s = rw.S(n.args[0])
    if not s:
        return _same(rw, n)
    refuse_offsets(n, diagonal=n.args[1] if len(n.args) > 1 else n.kwargs.get("diagonal"))
    dims = [n.args[1] % len(s)] if n.target.overloadpacket is aten.cumsum else [len(s) - 2, len(s) - 1]
    if any(not single(s[d]) for d in dims):
        raise Refused(f"{n.target}: along a dimension with padding inside it")
    return _same(rw, n)


def _from_meta(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    """A factory (zeros, arange ...): its padded layout is its sizes at the bound, real data first."""
    val = n.meta["val"]
    if n.target.overloadpacket is aten.scalar_tensor and isinstance(n.args[0], torch.fx.Node):
        if not isinstance(n.args[0].meta.get("val"), torch.SymInt):
            raise Refused(f"{n.target}: of a varying float")
        e = expr_of(n.args[0].meta["val"])
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
    if n.target.overloadpacket is aten.arange and n.target._overloadname == "start":
        refuse_offsets(n, start=n.args[0])
    return copied(rw, n, rw.meta_struct(val))


def _broadcast(rw: Layout, n: torch.fx.Node, tensors: Sequence[Any]) -> Struct:
    """The result's layout: each dim as the first operand padded there has it (an operand
    laid out otherwise is relaid out: _aligned)."""
    return _broadcast_layout(rw, n.meta["val"].shape, tensors)


def _broadcast_layout(rw: Layout, shape: Sequence[Any], tensors: Sequence[Any]) -> Struct:
    """The layout of `shape`, the broadcast of `tensors`: each dim as the first of them
    padded there has it, a new atom where none is."""
    rank = len(shape)
    out: list[Dim] = []
    for k in range(rank):
        chosen: Dim | None = None
        for t in tensors:
            s = rw.S(t)
            j = k - (rank - len(s))
            if j >= 0 and not all(is_static(e) for _, e in s[j]):
                chosen = s[j]
                break
        out.append(chosen if chosen is not None else (rw.atom(expr_of(shape[k])),))
    return tuple(out)


def _aligned_struct(s: Struct, struct: Struct) -> Struct:
    """An operand's layout `s` with each of its padded dims as `struct` (the broadcast
    result's layout, aligned at the right) has it."""
    rank = len(struct)
    return tuple(struct[j + rank - len(s)] if not all(is_static(e) for _, e in dim) else dim
                 for j, dim in enumerate(s))


def _aligned(rw: Layout, a: torch.fx.Node, struct: Struct) -> torch.fx.Node:
    """Operand `a` (new graph) laid out as `struct` where it has the same dims padded."""
    s = rw.S(a)
    want = _aligned_struct(s, struct)
    return rw.relayout(rw.env[a], s, want) if want != s else rw.env[a]


def pointwise(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    op = n.target
    tensors = [a for a in n.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
    struct = _broadcast(rw, n, tensors)
    replaced: list[str] = []  # the schema arguments given a real size instead of a bound one

    def arg(name: str, a: Any) -> Any:
        if isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), (torch.SymInt, torch.SymFloat)):
            if not isinstance(a.meta["val"], torch.SymInt):
                raise Refused(f"{op}: a symbolic float as a value")
            e = expr_of(a.meta["val"])
            if not is_static(e):
                replaced.append(name)
                value = rw.value(e)
                out_dtype = n.meta["val"].dtype
                if not (out_dtype.is_floating_point or out_dtype.is_complex):
                    # a Python int keeps an integer tensor's dtype; an int64 0-d tensor may not
                    value = rw.call(aten._to_copy.default, value, dtype=out_dtype)
                return value
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


def _regroup(rw: Layout, n: torch.fx.Node, source: Struct, target: Sequence[Any]) -> Struct:
    """The source's atoms grouped into the target's dims: a reshape that keeps each
    atom whole (a static atom may split)."""
    queue = [a for dim in source for a in dim if a != (1, sympy.Integer(1))]
    out: list[Dim] = []
    for size in target:
        t = expr_of(size)
        group: list[Atom] = []
        real: sympy.Expr = sympy.Integer(1)
        while sympy.simplify(real - t) != 0:
            if not queue:
                raise Refused(f"{n.target}: cannot regroup {source} into {list(target)}")
            p, e = queue.pop(0)
            ratio = sympy.simplify(t / real)
            if is_static(e) and ratio.is_Integer and int(ratio) < p and p % int(ratio) == 0 and int(ratio) > 0:
                queue.insert(0, (p // int(ratio), sympy.Integer(p // int(ratio))))
                p, e = int(ratio), sympy.Integer(int(ratio))
            group.append((p, e))
            real = real * e
        out.append(tuple(group) if group else ((1, sympy.Integer(1)),))
    if queue:
        raise Refused(f"{n.target}: cannot regroup {source} into {list(target)}")
    return tuple(out)


def _reshape(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    try:
        return copied(rw, n, _regroup(rw, n, rw.S(n.args[0]), n.meta["val"].shape))
    except Refused:
        # padding inside a dim the reshape splits differently: gather into the target's
        # own layout (each dim padded at its end)
        target = rw.meta_struct(n.meta["val"])
        return rw.relayout(rw.env[n.args[0]], rw.S(n.args[0]), target), target


def _permute(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    s = rw.S(n.args[0])
    if n.target.overloadpacket is aten.permute:
        order = [d % len(s) for d in n.args[1]]
    elif n.target.overloadpacket is aten.t:
        order = list(range(len(s)))[::-1]
    else:  # transpose
        order = list(range(len(s)))
        a, b = n.args[1] % len(s), n.args[2] % len(s)
        order[a], order[b] = order[b], order[a]
    return copied(rw, n, tuple(s[d] for d in order))


def _unsqueeze(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    s = list(rw.S(n.args[0]))
    d = n.args[1] % (len(s) + 1)
    s.insert(d, ((1, sympy.Integer(1)),))
    return copied(rw, n, tuple(s))


def _squeeze(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    s = rw.S(n.args[0])
    return copied(rw, n, _regroup(rw, n, s, n.meta["val"].shape))


def _expand(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    s = rw.S(n.args[0])
    meta = n.meta["val"].shape
    lead = len(meta) - len(s)
    out = [(rw.atom(expr_of(meta[k])),) for k in range(lead)]
    for k, dim in enumerate(s):
        size = expr_of(meta[lead + k])
        out.append(dim if sympy.simplify(sympy.Mul(*[e for _, e in dim]) - size) == 0 else (rw.atom(size),))
    return copied(rw, n, tuple(out))



def one_atom(rw: Layout, x: Any, s: Struct, d: int) -> tuple[Any, Struct]:
    """(x, its layout) with dim d relaid out to one atom (its padding at its end), so that a
    position along it is a real position."""
    if single(s[d]):
        return x, s
    want = list(s)
    want[d] = ((math.prod(p for p, _ in s[d]), sympy.Mul(*[e for _, e in s[d]])),)
    return rw.relayout(x, s, tuple(want)), tuple(want)


def _slice(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    x, d = n.args[0], (n.args[1] if len(n.args) > 1 else 0)
    s = rw.S(x)
    d %= len(s)
    start = n.args[2] if len(n.args) > 2 else 0
    step = n.args[4] if len(n.args) > 4 else 1
    refuse_offsets(n, start=start, step=step)
    out = list(s)
    out[d] = (rw.atom(expr_of(n.meta["val"].shape[d])),)
    if all(is_static(e) for _, e in s[d]):
        return copied(rw, n, tuple(out))
    if step != 1 or start is None or start < 0:
        raise Refused(f"{n.target}: a slice of a padded dimension other than [start >= 0:end]")
    xin, _ = one_atom(rw, rw.env[x], s, d)
    args = (xin, *rw.new(n.args[1:]))
    return rw.graph.call_function(n.target, args, dict(n.kwargs)), tuple(out)


def _select(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    x, d, index = n.args
    s = rw.S(x)
    d %= len(s)
    refuse_offsets(n, index=index)
    out = s[:d] + s[d + 1:]
    if all(is_static(e) for _, e in s[d]):
        return copied(rw, n, out)
    xin, s = one_atom(rw, rw.env[x], s, d)
    if index >= 0:
        return rw.call(aten.select.int, xin, d, index), out
    position = rw.binary(aten.add, rw.value(s[d][0][1]), index)
    picked = rw.call(aten.index_select.default, xin, d, rw.call(aten.reshape.default, position, [1]))
    return rw.call(aten.squeeze.dim, picked, d), out


def _select_backward(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    grad, sizes, d, index = n.args
    rank = n.meta["val"].dim()
    d %= rank
    refuse_offsets(n, index=index)
    g = rw.S(grad)
    dim = (rw.atom(expr_of(n.meta["val"].shape[d])),)
    struct = (*g[:d], dim, *g[d:])  # the gradient's layout, the selected dim around it
    if is_static(dim[0][1]) or index >= 0:
        return copied(rw, n, struct)
    position = rw.call(aten.reshape.default, rw.binary(aten.add, rw.value(dim[0][1]), index), [1])
    zeros = rw.call(aten.zeros.default, rw.new(sizes),
                    dtype=n.meta["val"].dtype, device=rw.device)
    return rw.call(aten.index_copy.default, zeros, d, position, rw.call(aten.unsqueeze.default, rw.env[grad], d)), \
        struct


def _slice_backward(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    grad, sizes, d, start, end, step = n.args
    rank = n.meta["val"].dim()
    d %= rank
    refuse_offsets(n, start=start, step=step)
    g, gs = one_atom(rw, rw.env[grad], rw.S(grad), d)  # placed at start..end: padded at its end
    struct = list(gs)  # the gradient's layout, the sliced dim as its sizes say
    struct[d] = (rw.atom(expr_of(n.meta["val"].shape[d])),)
    if not is_static(struct[d][0][1]) and (step != 1 or start < 0):
        raise Refused(f"{n.target}: a slice of a padded dimension other than [start >= 0:end]")
    args = (g, *rw.new(n.args[1:]))
    return rw.graph.call_function(n.target, args, dict(n.kwargs)), tuple(struct)


def _cat(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    tensors = [t for t in n.args[0] if t.meta["val"].dim() == n.meta["val"].dim()]  # cat skips 1-d empties
    d = (n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)) % n.meta["val"].dim()
    out = list(_broadcast(rw, n, tensors))
    out[d] = (rw.atom(expr_of(n.meta["val"].shape[d])),)
    out_struct = tuple(out)
    parts = []
    for t in tensors:
        want = list(out_struct)
        want[d] = rw.S(t)[d]
        parts.append(_aligned(rw, t, tuple(want)))
    joined = rw.call(aten.cat.default, parts, d)
    if all(all(is_static(e) for _, e in rw.S(t)[d]) for t in tensors):
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


def _pad(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
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
        refuse_offsets(n, pad_before=before)  # a varying pad after is a varying end: the real part stays first
        size = expr_of(n.meta["val"].shape[d])
        if not all(is_static(e) for _, e in s[d]):
            if before < 0 or (isinstance(after, int) and after < 0) or not single(s[d]):
                raise Refused(f"{n.target}: cropping or padding inside a padded dim")
            if symbolic(after) or after:
                masked_dims.append(d)
        out[d] = (rw.atom(size),)
    dtype = x.meta["val"].dtype
    fill = value if dtype.is_floating_point or dtype.is_complex else (bool(value) if dtype is torch.bool
                                                                       else int(value))
    xin = rw.masked(rw.env[x], s, masked_dims, fill) if masked_dims else rw.env[x]
    return rw.call(aten.constant_pad_nd.default, xin, rw.new(list(pads)), value), tuple(out)


def _split(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    s = rw.S(n.args[0])
    d = (n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0)) % len(s)
    sizes = n.args[1]
    refuse_offsets(n, **{f"size {k}": a for k, a in enumerate(sizes if isinstance(sizes, (list, tuple)) else [sizes])})
    if not all(is_static(e) for _, e in s[d]):
        raise Refused(f"{n.target}: a split along a padded dimension")
    structs = []
    for v in n.meta["val"]:
        out = list(s)
        out[d] = (rw.atom(expr_of(v.shape[d])),)
        structs.append(tuple(out))
    return copied(rw, n, structs)


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


def _lowest(dt: torch.dtype) -> Any:
    return False if dt is torch.bool else -math.inf if dt.is_floating_point else torch.iinfo(dt).min


def _highest(dt: torch.dtype) -> Any:
    return True if dt is torch.bool else math.inf if dt.is_floating_point else torch.iinfo(dt).max


_IDENTITY: dict[Any, Callable[[torch.dtype], Any]] = {
    aten.sum: lambda dt: 0, aten.mean: lambda dt: 0, aten.prod: lambda dt: 1,
    aten.amax: _lowest, aten.max: _lowest, aten.argmax: _lowest,
    aten.amin: _highest, aten.min: _highest, aten.argmin: _highest,
    aten.logsumexp: lambda dt: -math.inf, aten.any: lambda dt: False, aten.all: lambda dt: True,
}
_POSITIONS = (aten.argmax, aten.argmin, aten.max, aten.min)  # max.dim/min.dim give positions too
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _real_count(s: Struct, dims: Sequence[int]) -> Any:
    """The number of real elements over `dims` of layout `s` (a sympy expression)."""
    return sympy.Mul(*[e for d in dims for _, e in s[d]])


def _real_mean(rw: Layout, masked: torch.fx.Node, dims: Sequence[int], keepdim: bool, count: Any,
               dtype: torch.dtype | None = None) -> torch.fx.Node:
    """The mean over `dims` of a tensor whose padding there holds 0: its sum (in `dtype`)
    over the real count (`count`: rw.value of _real_count)."""
    total = rw.call(aten.sum.dim_IntList, masked, dims, keepdim, **({"dtype": dtype} if dtype else {}))
    return rw.binary(aten.div, total, count)


def _reduction(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
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
    padded = [d for d in dims if not all(is_static(e) for _, e in s[d])]
    structs: Any = tuple(out)
    if isinstance(n.meta["val"], (tuple, list)):
        structs = [tuple(out)] * len(n.meta["val"])
    if not padded:
        return copied(rw, n, structs)
    xin = rw.env[x]
    if packet in _POSITIONS and not (packet in (aten.max, aten.min) and n.target._overloadname == "default"):
        # a position along the reduced dim: right only where it is the dim's real position
        if len(dims) != 1:
            raise Refused(f"{n.target}: a position over several dims, one padded")
        xin, s = one_atom(rw, xin, s, dims[0])
    dtype = x.meta["val"].dtype
    masked = rw.masked(xin, s, padded, _IDENTITY[packet](dtype))
    args = (masked, *rw.new(n.args[1:]))
    kwargs = dict(rw.new(dict(n.kwargs)))
    if packet is not aten.mean:
        return rw.graph.call_function(n.target, args, kwargs), structs
    # the real sum over the real count, summed in float32 for half types (as eager's mean)
    out_dtype = kwargs.get("dtype") or n.meta["val"].dtype
    wide = torch.float32 if out_dtype in _LOW_PRECISION else out_dtype
    mean = _real_mean(rw, masked, dims, keepdim, rw.value(_real_count(s, dims)), dtype=wide)
    return (rw.call(aten._to_copy.default, mean, dtype=out_dtype) if wide != out_dtype else mean), structs


def _along_static_dim(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    """sort, topk, argsort: each row alone, so padding along the other dims is harmless;
    along a padded dim they would move padding among real values."""
    s = rw.S(n.args[0])
    names = [a.name for a in n.target._schema.arguments]
    bound = dict(zip(names, n.args)) | dict(n.kwargs)
    d = bound.get("dim", -1) % len(s)
    if not all(is_static(e) for _, e in s[d]):
        raise Refused(f"{n.target}: along a padded dimension")
    val = n.meta["val"]
    out = list(s)
    out[d] = (rw.atom(expr_of((val[0] if isinstance(val, (tuple, list)) else val).shape[d])),)
    return copied(rw, n, [tuple(out)] * len(val) if isinstance(val, (tuple, list)) else tuple(out))


def _variance(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    """var, std, var_mean over padded dims: the mean and the squared deviations of the
    real elements, divided by the real count (less the correction)."""
    x = n.args[0]
    s = rw.S(x)
    dims_arg = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
    dims = list(range(len(s))) if dims_arg is None or len(dims_arg) == 0 else sorted({d % len(s) for d in dims_arg})
    keepdim = bool(n.kwargs.get("keepdim", False))
    out = tuple(((1, sympy.Integer(1)),) if k in dims else s[k] for k in range(len(s)) if keepdim or k not in dims)
    packet = n.target.overloadpacket
    structs: Any = [out, out] if packet is aten.var_mean else out
    padded = [d for d in dims if not all(is_static(e) for _, e in s[d])]
    if not padded:
        return copied(rw, n, structs)
    if n.target._overloadname != "correction":
        raise Refused(f"{n.target} has no padding rule")
    correction = n.kwargs.get("correction", 1)
    correction = 1 if correction is None else correction
    count = rw.value(_real_count(s, dims))
    dtype = x.meta["val"].dtype
    xin = rw.env[x]
    if dtype in _LOW_PRECISION:  # in float32, as eager's kernels accumulate
        xin = rw.call(aten._to_copy.default, xin, dtype=torch.float32)
    xs = rw.masked(xin, s, padded, 0)
    mean = _real_mean(rw, xs, dims, True, count)
    deviation = rw.masked(rw.call(aten.sub.Tensor, xin, mean), s, padded, 0)
    squares = rw.call(aten.sum.dim_IntList, rw.call(aten.mul.Tensor, deviation, deviation), dims, keepdim)
    var = rw.binary(aten.div, squares, rw.binary(aten.sub, count, correction))
    if packet is aten.std:
        var = rw.call(aten.sqrt.default, var)
    results = [var]
    if packet is aten.var_mean:
        results.append(mean if keepdim else rw.call(aten.squeeze.dims, mean, dims))
    if dtype in _LOW_PRECISION:
        results = [rw.call(aten._to_copy.default, r, dtype=dtype) for r in results]
    return (rw.call(_tuple, *results) if packet is aten.var_mean else results[0]), structs


def _flip(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    """flip along a padded dim: the real elements reversed in place, padding still last
    (a gather of real positions n-1-i)."""
    x, dims = n.args[0], n.args[1]
    s = rw.S(x)
    dims = [d % len(s) for d in dims]
    static = [d for d in dims if all(is_static(e) for _, e in s[d])]
    out = rw.call(aten.flip.default, rw.env[x], static) if static else rw.env[x]
    for d in dims:
        if d in static:
            continue
        if not single(s[d]):
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


def _convolution(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    """A convolution over padded spatial dims reads zeros there, as its own zero padding
    past the real end: the real outputs are a prefix."""
    x = n.args[0]
    s = rw.S(x)
    if n.args[6]:  # transposed
        if any(not all(is_static(e) for _, e in dim) for dim in s[2:]):
            raise Refused(f"{n.target}: a transposed convolution over a padded dim")
    if not single(s[0]) or any(not single(dim) for dim in s[2:]):
        raise Refused(f"{n.target}: over a dim with padding inside it")
    if not all(is_static(e) for _, e in s[1]) or rw.has_padding(rw.S(n.args[1])):
        raise Refused(f"{n.target}: padded channels or weights")
    xin = rw.masked(rw.env[x], s, range(2, len(s)), 0)
    args = (xin, *rw.new(n.args[1:]))
    out = list(rw.meta_struct(n.meta["val"]))
    out[0] = s[0]
    return rw.graph.call_function(n.target, args, dict(n.kwargs)), tuple(out)


def _convolution_backward(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    grad, x = n.args[0], n.args[1]
    sg, sx = rw.S(grad), rw.S(x)
    if n.args[7]:
        raise Refused(f"{n.target}: a transposed convolution")
    if any(not single(dim) for dim in (*sg, *sx)):
        raise Refused(f"{n.target}: over a dim with padding inside it")
    if not all(is_static(e) for _, e in sx[1]) or rw.has_padding(rw.S(n.args[2])):
        raise Refused(f"{n.target}: padded channels or weights")
    g = rw.masked(rw.env[grad], sg, range(len(sg)), 0)
    xin = rw.masked(rw.env[x], sx, range(len(sx)), 0)
    args = (g, xin, *rw.new(n.args[2:]))
    vals = n.meta["val"]
    structs = [sx, *[rw.meta_struct(v) if isinstance(v, torch.Tensor) else None for v in vals[1:]]]
    return rw.graph.call_function(n.target, args, dict(n.kwargs)), structs


def _softmax(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    x, d = n.args[0], n.args[1]
    s = rw.S(x)
    masked = rw.masked(rw.env[x], s, [d], -math.inf)
    return rw.graph.call_function(n.target, (masked, *n.args[1:]), dict(n.kwargs)), s


def _softmax_backward(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    grad, out, d = n.args[0], n.args[1], n.args[2]
    s = rw.S(grad)
    g = rw.masked(rw.env[grad], s, [d], 0)
    o = _aligned(rw, out, s)  # paired elementwise with the gradient: one layout
    if n.target.overloadpacket is aten._softmax_backward_data:
        o = rw.masked(o, s, [d], 0)
    return rw.graph.call_function(n.target, (g, o, *n.args[2:]), dict(n.kwargs)), s


def _matmul(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
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
    if not all(is_static(e) for _, e in sa[-1]):
        ea = rw.masked(ea, sa, [len(sa) - 1], 0)
        eb = rw.masked(eb, sb, [len(sb) - 2], 0)
    struct = (*sa[:-1], sb[-1])
    if bias is not None:
        rank_b = len(rw.S(bias))
        for k in range(rank_b):
            dim = rw.S(bias)[k - rank_b]
            if not all(is_static(e) for _, e in dim) and dim != struct[k - rank_b]:
                raise Refused(f"{n.target}: bias padded differently")
        args = (rw.env[bias], ea, eb, *n.args[3:])
    else:
        args = (ea, eb, *n.args[2:])
    return rw.graph.call_function(n.target, args, dict(n.kwargs)), struct


def _layer_norm(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    x, shape = n.args[0], n.args[1]
    s = rw.S(x)
    lead = len(s) - len(shape)
    if any(not all(is_static(e) for _, e in dim) for dim in s[lead:]):
        raise Refused(f"{n.target}: normalized over a padded dimension")
    stat = (*s[:lead], *[((1, sympy.Integer(1)),)] * len(shape))
    return copied(rw, n, [s, stat, stat])


def _layer_norm_backward(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    grad, x, shape = n.args[:3]
    s = rw.S(x)
    lead = len(s) - len(shape)
    if any(not all(is_static(e) for _, e in dim) for dim in s[lead:]):
        raise Refused(f"{n.target}: normalized over a padded dimension")
    rows = range(lead)
    # the weight's and bias's gradients sum over rows: padding rows give 0, even where their
    # statistics are not finite
    g = rw.masked(_aligned(rw, grad, s), s, rows, 0)
    xin = rw.masked(rw.env[x], s, rows, 0)
    stat = (*s[:lead], *[((1, sympy.Integer(1)),)] * len(shape))
    mean = rw.masked(_aligned(rw, n.args[3], stat), stat, rows, 0)
    rstd = rw.masked(_aligned(rw, n.args[4], stat), stat, rows, 1)
    args = (g, xin, shape, mean, rstd, *rw.new(n.args[5:]))
    params = [rw.meta_struct(v) if isinstance(v, torch.Tensor) else None for v in n.meta["val"]]
    return rw.graph.call_function(n.target, args, dict(n.kwargs)), [s, *params[1:]]


def _embedding(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    weight, indices = n.args[:2]
    if not all(is_static(e) for _, e in rw.S(weight)[0]):
        raise Refused(f"{n.target}: a padded number of rows")
    args = (rw.env[weight], _in_range(rw, indices), *n.args[2:])
    return rw.graph.call_function(n.target, args, dict(n.kwargs)), (*rw.S(indices), *rw.S(weight)[1:])


def _embedding_backward(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    grad, indices = n.args[:2]
    si = rw.S(indices)
    want = (*si, *rw.S(grad)[len(si):])  # each index's gradient row where the index is
    g = rw.masked(_aligned(rw, grad, want), want, range(len(si)), 0)
    args = (g, _in_range(rw, indices), *rw.new(n.args[2:]))
    return rw.graph.call_function(n.target, args, dict(n.kwargs)), rw.meta_struct(n.meta["val"])


def _nll_loss(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    backward = n.target.overloadpacket is aten.nll_loss_backward
    names = ["grad_output", "self", "target", "weight", "reduction", "ignore_index", "total_weight"] if backward \
        else ["self", "target", "weight", "reduction", "ignore_index"]
    bound = dict(zip(names, n.args)) | dict(n.kwargs)
    target, scores = bound["target"], bound["self"]
    ss = rw.S(scores)
    st = ss[:len(rw.S(target))]  # the target's rows as the scores have them
    env = {name: rw.new(v) for name, v in bound.items()}
    env["target"] = rw.masked(_aligned(rw, target, st), st, range(len(st)), bound["ignore_index"])
    env["self"] = rw.masked(env["self"], ss, range(len(st)), 0)  # ignored rows: 0, not what padding held
    if backward and len(rw.S(bound["grad_output"])):
        env["grad_output"] = _aligned(rw, bound["grad_output"], st)
    args = [env[name] for name in names]
    if backward:
        struct: Any = rw.S(bound["self"])
    elif bound["reduction"] == 0:
        struct = [st, ()]
    else:
        struct = [(), ()]
    return rw.graph.call_function(n.target, tuple(args), {}), struct


def _in_range(rw: Layout, index: torch.fx.Node) -> torch.fx.Node:
    """An index tensor with 0 at its padding: what padding computed may be out of range,
    and an out-of-range index is an error."""
    s = rw.S(index)
    return rw.masked(rw.env[index], s, range(len(s)), 0)


def _gather(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    x, d, index = n.args[:3]
    si = rw.S(index)
    d %= max(len(si), 1)
    xin, sx = one_atom(rw, rw.env[x], rw.S(x), d) if si else (rw.env[x], rw.S(x))
    want = tuple(sx[k] if k == d else si[k] for k in range(len(si)))
    if want != sx:  # index position (i, j) reads x at (i, j) off the gathered dim: one layout
        if any(sympy.simplify(sympy.Mul(*[e for _, e in a]) - sympy.Mul(*[e for _, e in b])) != 0
               for a, b in zip(sx, want)):
            raise Refused(f"{n.target}: an index smaller than its source off the gathered dim")
        xin = rw.relayout(xin, sx, want)
    args = (xin, d, _in_range(rw, index), *n.args[3:])
    return rw.graph.call_function(n.target, args, dict(n.kwargs)), si


def _index_select(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    x, d, index = n.args
    d %= len(rw.S(x))
    xin, s = one_atom(rw, rw.env[x], rw.S(x), d)
    out = list(s)
    out[d] = rw.S(index)[0] if rw.S(index) else ((1, sympy.Integer(1)),)
    return rw.call(aten.index_select.default, xin, d, _in_range(rw, index)), tuple(out)


def _index(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    """x[i, j, ...] with index tensors: the indexed dims become the indices' broadcast
    layout, in place when they are adjacent, else first."""
    x, indices = n.args
    sx = rw.S(x)
    used = [k for k, i in enumerate(indices) if i is not None]
    if any(indices[k].meta["val"].dtype in (torch.bool, torch.uint8) for k in used):
        raise Refused(f"{n.target}: a boolean mask as an index")
    layout = _broadcast_layout(rw, torch.broadcast_shapes(*[indices[k].meta["val"].shape for k in used]),
                               [indices[k] for k in used])
    xin = rw.env[x]
    for k in used:  # an index value is a real position: each indexed dim padded at its end
        xin, sx = one_atom(rw, xin, sx, k)
    new_indices = []
    for k, i in enumerate(indices):
        if i is None:
            new_indices.append(None)
            continue
        want = _aligned_struct(rw.S(i), layout)
        moved = rw.masked(_aligned(rw, i, layout), want, range(len(want)), 0)
        real = sx[k][0][1]
        if not is_static(real):  # from the end: of the real size, not the padded one
            moved = rw.call(aten.where.self, rw.binary(aten.lt, moved, 0), rw.binary(aten.add, moved, rw.value(real)),
                            moved)
        new_indices.append(moved)
    adjacent = used == list(range(used[0], used[-1] + 1))
    rest = [sx[k] for k in range(len(sx)) if k not in used]
    if adjacent:
        out = (*sx[:used[0]], *layout, *sx[used[-1] + 1:])
    else:
        out = (*layout, *rest)
    return rw.call(aten.index.Tensor, xin, new_indices), tuple(out)


def _random(rw: Layout, n: torch.fx.Node) -> tuple[Any, Any]:
    """dropout, rand_like, bernoulli ...: each element drawn independently, so the real
    part is drawn as without padding, from other numbers of the stream than a per-size
    program's (said in the plan's note)."""
    val = n.meta.get("val")
    vals = list(val) if isinstance(val, (tuple, list)) else [val]
    tensors = [a for a in n.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
    if any(isinstance(v, torch.Tensor) and any(not is_static(expr_of(d)) for d in v.shape) for v in vals):
        rw.random.append(str(n.target.overloadpacket).split(".")[-1])
    if tensors:
        struct = rw.S(tensors[0])
        return copied(rw, n, [struct] * len(vals) if isinstance(val, (tuple, list)) else struct)
    return _from_meta(rw, n)


RULES: dict[Any, Rule] = {}
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
        RULES[_op] = _rule


# Pointwise ops not listed use the broadcast rule (torch.Tag.pointwise).
