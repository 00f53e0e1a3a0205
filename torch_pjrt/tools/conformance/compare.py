"""Comparing a pjrt result with the CPU result: structure, devices, shapes, dtypes, values."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from .settings import tolerance


class Mismatch(AssertionError):
    """The pjrt result differs from the CPU result (a "fail", not an "error")."""


def one_line(text: str, limit: int = 400) -> str:
    line = "; ".join(part.strip() for part in str(text).splitlines() if part.strip())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"Tensor{tuple(x.shape)}:{str(x.dtype).removeprefix('torch.')}"
    return type(x).__name__


def assert_matches(actual: Any, expected: Any, device_type: str, *, values: bool = True, what: str = "output") -> None:
    """Raises Mismatch unless `actual` (from pjrt) matches `expected` (from the CPU).

    Tensors of `actual` that correspond to CPU tensors of `expected` must be on
    `device_type`, have the same shape and dtype and, when `values`, be close under the
    per-dtype tolerance of settings.TOLERANCES. Non-tensor leaves must be equal
    (numbers within the tolerance of float32).
    """
    a_leaves, a_spec = tree_flatten(actual)
    e_leaves, e_spec = tree_flatten(expected)
    if a_spec != e_spec:
        raise Mismatch(
            f"{what} structure differs: pjrt [{', '.join(map(_describe, a_leaves))}] "
            f"vs cpu [{', '.join(map(_describe, e_leaves))}]"
        )
    multi = len(e_leaves) > 1
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        name = f"{what} {i}" if multi else what
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise Mismatch(f"{name}: pjrt returned {_describe(a)}, cpu a tensor")
            want_device = device_type if e.device.type == "cpu" else e.device.type
            if a.device.type != want_device:
                raise Mismatch(f"{name}: on {a.device.type}, expected {want_device}")
            if a.shape != e.shape:
                raise Mismatch(f"{name}: shape {tuple(a.shape)} vs cpu {tuple(e.shape)}")
            if a.dtype != e.dtype:
                raise Mismatch(f"{name}: dtype {a.dtype} vs cpu {e.dtype}")
            if a.layout != e.layout:
                raise Mismatch(f"{name}: layout {a.layout} vs cpu {e.layout}")
            if not values:
                continue
            a_cpu = a.detach().cpu()
            tol = tolerance(e.dtype)
            try:
                torch.testing.assert_close(
                    a_cpu, e.detach(), rtol=tol.rtol, atol=tol.atol, equal_nan=True, check_device=False, check_stride=False
                )
            except AssertionError as exc:
                raise Mismatch(f"{name} [{str(e.dtype).removeprefix('torch.')}]: {one_line(str(exc))}") from None
        elif isinstance(a, torch.Tensor):
            raise Mismatch(f"{name}: pjrt returned a tensor, cpu {_describe(e)}")
        elif values:
            if isinstance(e, float) and isinstance(a, float):
                tol = tolerance(torch.float32)
                try:
                    torch.testing.assert_close(a, e, rtol=tol.rtol, atol=tol.atol, equal_nan=True)
                except AssertionError as exc:
                    raise Mismatch(f"{name}: {one_line(str(exc))}") from None
            elif a != e and not (a is e):
                raise Mismatch(f"{name}: {a!r} vs cpu {e!r}")
        elif type(a) is not type(e):
            raise Mismatch(f"{name}: type {type(a).__name__} vs cpu {type(e).__name__}")


# Dtypes whose results may be judged against a float64 CPU run (their wider counterpart).
WIDER: dict[torch.dtype, torch.dtype] = {torch.float32: torch.float64, torch.complex64: torch.complex128}


# How far CPU's float32 result may be from its float64 one for the float64 judgement to apply,
# in float32 tolerances: further apart, the two runs compute different things (dtype-dependent
# cutoffs, overflow), and the result must match CPU's float32 one as usual.
JUDGED_CPU_ERROR_LIMIT = 100.0


def no_less_accurate_than_cpu(actual: Any, expected: Any, reference: Any, device_type: str) -> bool:
    """Whether `actual` (pjrt) is as close to `reference` (the CPU in float64) as `expected`
    (the CPU in float32) is, up to the float32 tolerance, wherever it differs from `expected`:
    per element |actual - reference| <= |expected - reference| + atol + rtol * |reference|,
    only where both CPU results are finite and within JUDGED_CPU_ERROR_LIMIT tolerances of
    each other (elsewhere the usual comparison with `expected`). Structure, devices, shapes,
    dtypes and the other leaves (integers, booleans, numbers) must match `expected` exactly as
    assert_matches requires."""
    try:
        assert_matches(actual, expected, device_type, values=False)
    except Mismatch:
        return False
    a_leaves, a_spec = tree_flatten(actual)
    e_leaves, e_spec = tree_flatten(expected)
    r_leaves, r_spec = tree_flatten(reference)
    if e_spec != r_spec:
        return False
    for a, e, r in zip(a_leaves, e_leaves, r_leaves):
        if not isinstance(e, torch.Tensor):
            try:
                assert_matches(a, e, device_type)
            except Mismatch:
                return False
            continue
        if not isinstance(r, torch.Tensor) or r.shape != e.shape:
            return False
        a, e = a.detach().cpu(), e.detach()
        if e.dtype not in WIDER:
            if not torch.equal(a, e):
                return False
            continue
        tol = tolerance(e.dtype)
        wide = WIDER[e.dtype]
        a64, e64, r64 = a.to(wide), e.to(wide), r.detach().to(wide)
        close = torch.isclose(a, e, rtol=tol.rtol, atol=tol.atol, equal_nan=True)
        allowance = tol.atol + tol.rtol * r64.abs()
        cpu_error = (e64 - r64).abs()
        judged = torch.isfinite(e64) & torch.isfinite(r64) & (cpu_error <= JUDGED_CPU_ERROR_LIMIT * allowance)
        accurate = judged & ((a64 - r64).abs() <= cpu_error + allowance)
        if not bool((close | accurate).all()):
            return False
    return True


# Ops whose index outputs are not unique when the input has equal elements: there, any
# index of an equal element is right (unless stable=True is asked for). Name -> (position
# of `dim` among the positional arguments after the input, position of the indices output).
_TIED_INDEX_OPS: dict[str, tuple[int, int]] = {
    "sort": (0, 1), "argsort": (0, 0), "topk": (1, 1), "kthvalue": (1, 1), "median": (0, 1), "nanmedian": (0, 1),
    "mode": (0, 1),
}


def tied_indices_equivalent(op_name: str, inp: Any, args: tuple, kwargs: dict, actual: Any, expected: Any) -> bool:
    """For sort/argsort/topk: True when the pjrt result differs from the CPU's only in which of
    several equal elements an index points at (values equal, the indexed elements equal)."""
    if op_name not in _TIED_INDEX_OPS or kwargs.get("stable") or not isinstance(inp, torch.Tensor):
        return False
    pos, indices_at = _TIED_INDEX_OPS[op_name]
    dim = kwargs.get("dim", args[pos] if len(args) > pos and isinstance(args[pos], int) else -1)
    a = [t for t in tree_flatten(actual)[0]]
    e = [t for t in tree_flatten(expected)[0]]
    if len(a) != len(e) or not all(isinstance(t, torch.Tensor) for t in a + e):
        return False
    a = [t.detach().cpu() for t in a]
    e = [t.detach() for t in e]
    values = inp.detach().cpu()
    try:
        for i, (x, y) in enumerate(zip(a, e)):
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            if i == indices_at:  # compare the elements the indices select
                if values.dim() == 0:
                    return False
                if x.dim() == values.dim() - 1:  # keepdim=False
                    x, y = values.gather(dim, x.unsqueeze(dim)), values.gather(dim, y.unsqueeze(dim))
                else:
                    x, y = values.gather(dim, x), values.gather(dim, y)
            tol = tolerance(y.dtype)
            torch.testing.assert_close(x, y, rtol=tol.rtol, atol=tol.atol, equal_nan=True)
        return True
    except (AssertionError, RuntimeError, IndexError):
        return False
