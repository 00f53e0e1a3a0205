"""A clean interpreter exit after a backward on pjrt.

torch 2.13's backward keeps a Python object (the caller's contextvars context) in
the thread-local state of its GraphTask, and the autograd engine's thread for a
device can still hold the task's last reference for a moment after `backward()`
has returned. If the interpreter is finalizing by then, dropping that reference
needs the GIL; the thread is told to exit instead, and exiting from inside a
destructor calls std::terminate: the script, its work done, dies with "terminate
called without an active exception" (exit 134). The race is PyTorch's
(pytorch/pytorch#180700); until the pinned torch no longer has it, this module closes
the window.

At exit, before finalization, one small backward runs through each device's
autograd thread with nothing Python in it (made and run in C++, without the GIL:
a Python object in its state, among its tensors or in its result would need the GIL
when the thread drops it). The thread takes tasks in order and lets go of a finished
task before it takes the next, so when this backward returns, no earlier task is left
for the thread to drop during finalization.
"""

from __future__ import annotations

import atexit

from . import _C


def drain_device_threads() -> None:
    """Waits until no pjrt autograd thread holds a finished backward (a view's backward
    per device: no device program)."""
    _C._drain_autograd_device_threads()


def _at_exit() -> None:
    try:
        drain_device_threads()
    except Exception:  # noqa: BLE001 - a failing device at exit must not turn a clean exit into an error
        pass


atexit.register(_at_exit)
