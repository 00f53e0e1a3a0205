"""Workers in parallel, one process per architecture, each under a time limit.

A worker that outlives the limit is killed with its process group (recorded as a
timeout); one that dies by a signal is a crash. Either way the phases it finished
are kept (results.assemble).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from .results import Record, assemble

Command = Callable[[str, list[str]], list[str]]
OnRecord = Callable[[Record, int, int], None]  # (record, finished, total)


def worker_command(model_type: str, modes: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch_pjrt.tools.zoo.worker", model_type, "--modes", ",".join(modes)]


def worker_env(jobs: int) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    # torch's CPU threads: the cores shared out among the workers.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(jobs, 1))))
    return env


def _events(stdout: str) -> list[dict[str, Any]]:
    found = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return found


def _tail(path: str, limit: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8 * limit))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("[transformers]")]
    return "\n".join(lines)[-limit:]


def run_one(model_type: str, modes: list[str], timeout: float, jobs: int = 1, log_dir: str | None = None,
            command: Command = worker_command) -> Record:
    """One worker, to its end or its time limit."""
    log_dir = log_dir or tempfile.mkdtemp(prefix="zoo-logs-")
    os.makedirs(log_dir, exist_ok=True)
    log_path = os.path.join(log_dir, model_type.replace("/", "__") + ".log")  # diffusers/<Class>: one file
    start = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command(model_type, modes), stdout=subprocess.PIPE, stderr=log,
                                env=worker_env(jobs), start_new_session=True)
        timed_out = False
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, _ = proc.communicate()
    seconds = time.perf_counter() - start
    rc = proc.returncode
    return assemble(model_type, _events(out.decode("utf-8", "replace")), modes, rc, timed_out, seconds,
                    _tail(log_path))


def run_all(model_types: Sequence[str], modes: list[str] | Mapping[str, list[str]], timeout: float, jobs: int,
            on_record: OnRecord, log_dir: str | None = None, command: Command = worker_command) -> list[Record]:
    """Every type's worker, `jobs` at a time, in `modes` (or each type's own list of them);
    on_record is called as each finishes."""
    modes_of = modes if isinstance(modes, Mapping) else {t: modes for t in model_types}
    log_dir = log_dir or tempfile.mkdtemp(prefix="zoo-logs-")
    records: list[Record] = []
    total = len(model_types)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(run_one, t, modes_of[t], timeout, jobs, log_dir, command) for t in model_types]
        for done, fut in enumerate(as_completed(futures), 1):
            rec = fut.result()
            records.append(rec)
            on_record(rec, done, total)
    return records
