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
                raise Mismatch(f"{name}: {one_line(str(exc))}") from None
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
