"""One entry point for the CLI and the tests: select ops, run them, summarize."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..._host import cpu_description
from . import opsel, settings
from .records import PHASES, OpInfoMeta, OpRun, SampleResult
from .summary import OpSummary, dispatcher_native_ops, summarize
from .supervisor import Options, Progress, Supervisor


@dataclass
class RunOutcome:
    summaries: list[OpSummary]
    info: dict[str, Any]


def _git_commit(root: str) -> str:
    try:
        rev = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev + ("+local changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _in_process(keys: Sequence[str], options: Options, progress: Progress | None) -> dict[str, OpRun]:
    """Runs the ops in this process (debugging, reproducing a crash): a crash ends the run."""
    import torch_pjrt

    from . import runner

    ops = opsel.ops_by_key()
    runs: dict[str, OpRun] = {}
    previous = torch_pjrt._C._get_fallback_mode()
    torch_pjrt.set_fallback_mode("warn")
    try:
        for i, key in enumerate(keys, 1):
            run = runs.setdefault(key, OpRun(meta=OpInfoMeta(op=key)))

            def emit(kind: str, payload: dict[str, Any], run: OpRun = run) -> None:
                if kind == "result":
                    run.results.append(SampleResult.from_json(payload))
                elif kind == "meta":
                    run.meta = OpInfoMeta.from_json(payload)

            t0 = time.monotonic()
            runner.run_op(ops[key], opsel.parse_dtypes(options.dtypes), emit, phases=options.phases,
                          max_samples_float32=options.max_samples_float32, max_samples_other=options.max_samples_other)
            run.seconds = time.monotonic() - t0
            if progress is not None:
                progress(key, run, i, len(keys))
    finally:
        torch_pjrt.set_fallback_mode(previous)
    return runs


def run(
    patterns: Sequence[str] | None = None,
    *,
    dtypes: Sequence[str] | None = None,
    phases: Sequence[str] = PHASES,
    max_samples_float32: int = settings.MAX_SAMPLES_FLOAT32,
    max_samples_other: int = settings.MAX_SAMPLES_OTHER,
    op_time_limit_s: float = settings.OP_TIME_LIMIT_S,
    jobs: int = 1,
    in_process: bool = False,
    progress: Progress | None = None,
    command: str = "",
) -> RunOutcome:
    t0 = time.monotonic()
    keys = opsel.select_ops(patterns)
    if not keys:
        raise ValueError(f"no OpInfo matches {list(patterns or [])}")
    dtype_names = [opsel.dtype_name(d) for d in opsel.parse_dtypes(dtypes)]
    for p in phases:
        if p not in PHASES:
            raise ValueError(f"unknown phase {p!r}; choose from {PHASES}")
    options = Options(dtypes=dtype_names, phases=list(phases), max_samples_float32=max_samples_float32,
                      max_samples_other=max_samples_other, op_time_limit_s=op_time_limit_s)
    metrics: dict[str, float] = {}
    if in_process:
        import torch_pjrt

        m0 = torch_pjrt.metrics()
        runs = _in_process(keys, options, progress)
        m1 = torch_pjrt.metrics()
        metrics = {k: m1[k] - m0[k] for k in ("compiles", "compile_seconds", "disk_cache_hits", "memory_cache_hits")}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plat = torch_pjrt.platform()
        snapshots = [dispatcher_native_ops()]
    else:
        sup = Supervisor(options, jobs=jobs, progress=progress)
        runs = sup.run(keys)
        metrics = dict(sup.metrics)
        plat, snapshots = sup.platform, sup.native_snapshots
    summaries = [summarize(runs[k]) for k in keys if k in runs]
    wall = time.monotonic() - t0

    import torch
    cache = os.environ.get("TORCH_PJRT_CACHE_DIR")
    info = {
        "command": command or "python -m torch_pjrt.tools.conformance " + " ".join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "commit": _git_commit(repo_root()),
        "platform": f"{plat.get('platform')} (platform version {plat.get('platform_version')}, PJRT C API "
                    f"{plat.get('pjrt_c_api')}, {', '.join(map(str, plat.get('attributes', [])))})",
        "machine": cpu_description(),
        "ops_patterns": list(patterns or []),
        "dtypes": dtype_names,
        "phases": list(phases),
        "max_samples_float32": max_samples_float32,
        "max_samples_other": max_samples_other,
        "sample_pool": settings.SAMPLE_POOL,
        "op_time_limit_s": op_time_limit_s,
        "workers": 0 if in_process else jobs,
        "wall_seconds": round(wall, 1),
        "metrics": {k: round(v, 2) for k, v in metrics.items()},
        "native": snapshots[-1] if snapshots else dispatcher_native_ops(),
        "extension_changed_during_run": len(snapshots) > 1,
        "native_counts_seen": [(n["distinct_aten_operators"], n["aten_registrations"]) for n in snapshots],
        "cache": ("disk tier off" if cache is not None and cache.strip().lower() in ("", "0", "off", "none", "false")
                  else f"disk tier at {cache or '~/.cache/torch_pjrt'}") +
                 f" ({int(metrics.get('disk_cache_hits', 0))} disk hits)",
    }
    return RunOutcome(summaries=summaries, info=info)
