"""Dynamo's graph breaks and recompiles, as findings of the run being watched."""

from __future__ import annotations

import functools
import os
import re
from typing import Any

import torch

from .findings import Finding, Findings

_watched: list[Findings] = []  # the run being watched (at most one); the hooks stay, idle without it
_hooked = False


def watch_dynamo(findings: Findings) -> None:
    """Graph breaks and recompiles, as Dynamo meets them (hooked on the first
    torch.compile call: a script that never compiles never imports Dynamo)."""
    global _hooked
    _watched[:] = [findings]
    if _hooked:
        return
    _hooked = True
    from torch._dynamo import convert_frame, symbolic_convert

    original_break = symbolic_convert.InstructionTranslatorBase.log_graph_break

    @functools.wraps(original_break)
    def log_graph_break(self: Any, code_options: Any, reason: str, exc: Any) -> Any:
        if not getattr(exc, "logged", False):
            stack = getattr(exc, "real_stack", None) or []
            user = [f for f in stack if not f.filename.startswith(os.path.dirname(torch.__file__))]
            frame = user[-1] if user else (stack[-1] if stack else None)
            kind = getattr(exc, "gb_type", None) or type(exc).__name__
            detail = str(reason).strip().splitlines()[0][:160] if str(reason).strip() else ""
            for sink in _watched:
                sink.add(Finding(4, "graph_break", f"graph break ({kind}): {detail}", frame.filename if frame else None,
                                 frame.lineno if frame else None, data={"reason": str(reason)[:500]}))
        return original_break(self, code_options, reason, exc)

    symbolic_convert.InstructionTranslatorBase.log_graph_break = log_graph_break
    original_reasons = convert_frame.get_and_maybe_log_recompilation_reasons

    @functools.wraps(original_reasons)
    def reasons(entries: Any, frame: Any, *args: Any, **kwargs: Any) -> Any:
        found = original_reasons(entries, frame, *args, **kwargs)
        if found:
            # One finding per function and kind of guard failure ("size mismatch at
            # index 1"), counted; the first full reason is kept as data.
            why = re.sub(r"^\d+/\d+: ", "", found[0].splitlines()[0])
            general = re.sub(r"\.? *expected .*$", "", why)
            for sink in _watched:
                sink.add(Finding(4, "recompile", f"{frame.f_code.co_name}() recompiled: {general}",
                                 frame.f_code.co_filename, frame.f_code.co_firstlineno, data={"reason": why}))
        return found

    convert_frame.get_and_maybe_log_recompilation_reasons = reasons


def unwatch_dynamo() -> None:
    _watched.clear()
