"""Which OpInfos and dtypes a run covers."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from . import settings

OpInfo = Any  # torch.testing._internal.opinfo.core.OpInfo (imported lazily: it is slow)


def op_db() -> list[OpInfo]:
    from torch.testing._internal.common_methods_invocations import op_db as db

    return list(db)


def op_key(op: OpInfo) -> str:
    """The OpInfo's name with its variant, e.g. ``div.floor_rounding``; unique in op_db."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def ops_by_key() -> dict[str, OpInfo]:
    return {op_key(op): op for op in op_db()}


def select_ops(patterns: Sequence[str] | None) -> list[str]:
    """Keys of op_db entries matching any fnmatch pattern (all when none), in op_db order."""
    keys = [op_key(op) for op in op_db()]
    if not patterns:
        return keys
    return [k for k in keys if any(fnmatch.fnmatchcase(k, p) for p in patterns)]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtypes(names: Iterable[str] | None) -> list[torch.dtype]:
    if not names:
        return list(settings.DTYPES)
    out = []
    for name in names:
        if name not in settings.DTYPE_NAMES:
            raise ValueError(f"unknown dtype {name!r}; choose from {sorted(settings.DTYPE_NAMES)}")
        out.append(settings.DTYPE_NAMES[name])
    return out


def claimed_dtypes(op: OpInfo) -> list[torch.dtype]:
    """The harness dtypes that the op claims to support on the CPU."""
    supported = op.supported_dtypes("cpu")
    return [d for d in settings.DTYPES if d in supported]


def backward_dtypes(op: OpInfo) -> set[torch.dtype]:
    if not op.supports_autograd:
        return set()
    return set(op.supported_backward_dtypes("cpu"))


def properties_only(op: OpInfo) -> bool:
    """Random ops and ops returning uninitialized memory: values are not comparable."""
    key = op_key(op)
    if getattr(op, "has_nondeterministic_output", False):
        return True
    return any(fnmatch.fnmatchcase(key, p) for p in settings.PROPERTIES_ONLY_PATTERNS)
