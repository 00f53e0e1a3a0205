"""Eager modes (strict, fused, debug) and the CPU-fallback policy (warn, log, error)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import TracebackType

from . import _C

EAGER_MODES = ("strict", "fused", "debug")


class _RestoreMode(contextlib.AbstractContextManager["_RestoreMode"]):
    """Returned by eager_mode(mode): the mode is already set; leaving a `with` block restores the previous one."""

    def __init__(self, previous: str) -> None:
        self.previous = previous

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        set_eager_mode(self.previous)


def eager_mode(mode: str | None = None):  # type: ignore[no-untyped-def]
    """Without an argument: the current mode's name. With one: sets it at once
    (usable as a plain setter) and returns a context manager that restores the
    previous mode, so ``with torch_pjrt.eager_mode("fused"): ...`` scopes it.

    'strict': every op runs as its own program, asynchronously (the default).
    'fused': ops are recorded and run as one program at the next sync point
    (.item(), .cpu(), printing, synchronize(), a CPU fallback ...), at
    torch_pjrt.sync(), after each optimizer step, where a loop body repeats,
    or when the graph reaches its size bound.
    'debug': every op runs synchronously with NaN/Inf and index checks.
    """
    if mode is None:
        return _C._get_eager_mode()
    previous = _C._get_eager_mode()
    set_eager_mode(mode)
    return _RestoreMode(previous)


def set_eager_mode(mode: str) -> None:
    if mode not in EAGER_MODES:
        raise ValueError(f"torch_pjrt: eager mode must be one of {', '.join(EAGER_MODES)}, got {mode!r}")
    _C._set_eager_mode(mode)


@contextlib.contextmanager
def debug_mode() -> Iterator[None]:
    """Runs the block synchronously; errors are raised at the op that caused them."""
    previous = _C._get_eager_mode()
    _C._synchronize(-1)
    set_eager_mode("debug")
    try:
        yield
    finally:
        set_eager_mode(previous)


def sync() -> None:
    """Runs what fused mode has recorded, as one program per device, without
    waiting for it (like torch_xla's mark_step). A no-op in the other modes."""
    _C._flush("explicit")


def set_fusion_policy(*, max_ops: int | None = None, min_loop: int | None = None,
                      detect_loops: bool | None = None, donate: bool | None = None) -> None:
    """Fused mode's bounds: ops per graph before a cut, the shortest op
    sequence treated as a repeating loop body, whether loops are cut where
    their first op recurs, and whether programs may take over (donate) the
    buffers they overwrite."""
    p = _C._fusion_policy()
    _C._set_fusion_policy(int(p["max_ops"] if max_ops is None else max_ops),
                          int(p["min_loop"] if min_loop is None else min_loop),
                          bool(p["detect_loops"] if detect_loops is None else detect_loops),
                          bool(p["donate"] if donate is None else donate))


def fusion_policy() -> dict[str, object]:
    return dict(_C._fusion_policy())


def set_fallback_mode(mode: str) -> None:
    """'warn' (once per op), 'log' (every call, with the user's line), 'error' (forbid)."""
    _C._set_fallback_mode(mode)


@contextlib.contextmanager
def fallback_mode(mode: str) -> Iterator[None]:
    previous = _C._get_fallback_mode()
    set_fallback_mode(mode)
    try:
        yield
    finally:
        set_fallback_mode(previous)
