"""One run of the user's script under the doctor's instruments."""

from __future__ import annotations

import os
import runpy
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

import torch_pjrt

from .findings import _PACKAGE_DIR, Finding, Findings
from .dynamo_watch import unwatch_dynamo
from .observe import DoctorMode, FallbackWatch, RunRecord, StepWatch
from .redirect import Redirect
from .source_scan import local_sources, scan_file


@dataclass
class Crash:
    type: str
    message: str
    file: str | None
    line: int | None
    traceback: str


@dataclass
class RunResult:
    script: str
    argv: list[str]
    target: str
    findings: Findings
    record: RunRecord
    seconds: float
    crash: Crash | None = None
    losses: list[float] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    peak_memory: int | None = None
    used_autocast: bool = False


def _crash_of(exc: BaseException) -> Crash:
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if not f.filename.startswith(_PACKAGE_DIR) and "/torch/" not in f.filename
            and not f.filename.startswith("<")]
    where = user[-1] if user else (frames[-1] if frames else None)
    return Crash(type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else "",
                 where.filename if where else None, where.lineno if where else None,
                 "".join(traceback.format_exception(exc))[-4000:])


def run_script(script: str, argv: list[str], target: str = "pjrt", progress: bool = False) -> RunResult:
    """Runs `script` as __main__ with `argv`, CUDA redirected to `target`.
    Whatever the script raises is caught and described, never re-raised."""
    script = os.path.abspath(script)
    findings = Findings()
    record = RunRecord()
    on_device = target != "cpu"
    redirect = Redirect(findings, target)
    fallbacks = FallbackWatch(findings) if on_device else None
    steps = StepWatch(record, on_device, progress)
    if on_device:
        torch_pjrt.reset_metrics()
        torch.pjrt.reset_peak_memory_stats()
    saved_argv, saved_path = sys.argv, list(sys.path)
    crash = None
    start = time.perf_counter()
    try:
        sys.argv = [script, *argv]
        sys.path.insert(0, os.path.dirname(script))
        redirect.install()
        if fallbacks:
            fallbacks.install()
        steps.install()
        # One seed for every run of the doctor (pjrt, the CPU parity run): an
        # unseeded script draws the same numbers in both; a seeded one overrides it.
        torch.manual_seed(0)
        start = time.perf_counter()
        with DoctorMode(redirect, record, target):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            crash = Crash("SystemExit", f"exit status {e.code}", None, None, "")
    except Exception as e:  # noqa: BLE001  (the report says where and why; Ctrl-C still stops)
        crash = _crash_of(e)
    finally:
        seconds = time.perf_counter() - start
        unwatch_dynamo()
        steps.uninstall()
        if fallbacks:
            fallbacks.uninstall()
        redirect.uninstall()
        sys.argv, sys.path[:] = saved_argv, saved_path
    if record.first_input is None:
        record.first_input = redirect.first_input
    result = RunResult(script, argv, target, findings, record, seconds, crash, used_autocast=redirect.used_autocast)
    try:
        if on_device:
            torch_pjrt.synchronize()
        result.losses = [float(t) for t in record.losses]
    except Exception as e:  # noqa: BLE001  (a failed program: the crash already says it)
        if result.crash is None:
            result.crash = _crash_of(e)
    if on_device:
        result.metrics = torch_pjrt.metrics()
        result.peak_memory = torch.pjrt.max_memory_allocated()
    sources = [p for p in local_sources(script) if not p.startswith(_PACKAGE_DIR)]
    for path in sources:
        scan_file(path, findings)
    _drop_source_twins(findings)
    if crash is not None and crash.type == "NotImplementedError":
        # No pjrt kernel with fallbacks forbidden, or no kernel on any backend.
        findings.add(Finding(2, "no_kernel", crash.message, crash.file, crash.line, severity="fail"))
    return result


def _drop_source_twins(findings: Findings) -> None:
    """A source line that was also met at run time is reported once, as the run-time finding."""
    met = {(f.file, f.line) for f in findings.all() if f.kind == "cuda_call"}
    for f in findings.all():
        if f.kind == "cuda_source" and (f.file, f.line) in met:
            findings.remove(f)
