"""The worker process: reads op jobs (JSON lines on stdin), runs them, streams records.

Records go to the file descriptor named by --fd, one JSON object per line, flushed
as they are made, so that when the process dies the supervisor knows which sample
was running ("begin" precedes every phase of every sample). The worker's own stdout
and stderr (XLA's and torch's messages, an abort's last words) are the supervisor's
log file.

    {"type": "ready"}                                    after start-up
    {"type": "begin", "op", "dtype", "phase", "index"}   a phase of a sample starts
    {"type": "result", ...SampleResult}                  its outcome
    {"type": "meta", ...OpInfoMeta}                      about the op (start and end)
    {"type": "done", "op", "metrics": {...}}             the job is finished
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time
import warnings
from typing import Any, TextIO


def _metrics_snapshot() -> dict[str, float]:
    import torch_pjrt

    m = torch_pjrt.metrics()
    return {k: m[k] for k in ("compiles", "compile_seconds", "disk_cache_hits", "memory_cache_hits", "executions")}


def serve(jobs: TextIO, out: TextIO) -> None:
    # The CPU fallback stays on and counted; its once-per-op warning (and torch's other
    # warnings) would only be noise here: the counts are read per sample.
    os.environ["TORCH_PJRT_FALLBACK"] = "warn"
    warnings.simplefilter("ignore")
    faulthandler.enable()  # a crash leaves the Python stacks in the log the supervisor keeps
    import torch  # noqa: F401

    import torch_pjrt

    from . import opsel, runner

    torch_pjrt.set_fallback_mode("warn")
    torch_pjrt.set_eager_mode("strict")
    ops = opsel.ops_by_key()

    # For the harness's own tests: "op:dtype" pairs at which to abort, or to hang.
    crash_at = set(filter(None, os.environ.get("TORCH_PJRT_CONFORMANCE_CRASH_AT", "").split(",")))
    hang_at = set(filter(None, os.environ.get("TORCH_PJRT_CONFORMANCE_HANG_AT", "").split(",")))

    def emit(kind: str, payload: dict[str, Any]) -> None:
        out.write(json.dumps({"type": kind, **payload}) + "\n")
        out.flush()
        if kind == "begin":
            where = f"{payload['op']}:{payload['dtype']}"
            if where in crash_at:
                os.abort()
            if where in hang_at:
                time.sleep(1e6)

    from .summary import dispatcher_native_ops

    # What this process runs against: the report's kernel counts come from the workers
    # (the extension can be rebuilt while a long run goes on).
    emit("ready", {"pid": os.getpid(), "native": dispatcher_native_ops(), "platform": torch_pjrt.platform()})
    for line in jobs:
        line = line.strip()
        if not line:
            continue
        job = json.loads(line)
        if job.get("type") == "exit":
            break
        key = job["op"]
        runner.run_op(
            ops[key],
            opsel.parse_dtypes(job["dtypes"]),
            emit,
            phases=job["phases"],
            max_samples_float32=job["max_samples_float32"],
            max_samples_other=job["max_samples_other"],
        )
        emit("done", {"op": key, "metrics": _metrics_snapshot()})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fd", type=int, required=True, help="file descriptor for records")
    args = parser.parse_args(argv)
    with os.fdopen(args.fd, "w", buffering=1) as out:
        serve(sys.stdin, out)


if __name__ == "__main__":
    main()
