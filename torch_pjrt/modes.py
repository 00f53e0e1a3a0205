"""Eager modes (strict, debug) and the CPU-fallback policy (warn, log, error)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from . import _C


def eager_mode() -> str:
    return _C._get_eager_mode()


def set_eager_mode(mode: str) -> None:
    """'strict': asynchronous; 'debug': synchronous, NaN/Inf and index checks at each op."""
    _C._set_eager_mode(mode)


@contextlib.contextmanager
def debug_mode() -> Iterator[None]:
    """Runs the block synchronously; errors are raised at the op that caused them."""
    previous = eager_mode()
    _C._synchronize(-1)
    set_eager_mode("debug")
    try:
        yield
    finally:
        set_eager_mode(previous)


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
