"""Workers in parallel, each a process that runs architectures one after another.

Every architecture runs under its own time limit. A worker that outlives it is killed
with its process group (a timeout); one that dies by a signal is a crash. Either way
the phases the architecture finished are kept (results.assemble), and the next
architecture starts in a fresh worker. A worker is also replaced after
TYPES_PER_WORKER architectures, so that a long sweep's memory stays bounded.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import IO, Any

from .results import Record, assemble

Command = Callable[[], list[str]]  # a worker process's command line
OnRecord = Callable[[Record, int, int], None]  # (record, finished, total)
TYPES_PER_WORKER = 25


def worker_command() -> list[str]:
    return [sys.executable, "-m", "torch_pjrt.tools.zoo.worker", "--serve"]


def worker_env(jobs: int) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    # torch's CPU threads: the cores shared out among the workers.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(jobs, 1))))
    return env


def _events(lines: list[bytes]) -> list[dict[str, Any]]:
    found = []
    for raw in lines:
        line = raw.decode("utf-8", "replace").strip()
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


class Worker:
    """One worker process, started when first needed and replaced after a crash or a timeout."""

    def __init__(self, jobs: int, log_dir: str, command: Command = worker_command) -> None:
        self.jobs, self.log_dir, self.command = jobs, log_dir, command
        self.proc: subprocess.Popen[bytes] | None = None
        self.buffer = b""
        self.types_run = 0

    def log_path(self, model_type: str) -> str:
        return os.path.join(self.log_dir, model_type.replace("/", "__") + ".log")  # diffusers/<Class>: one file

    def _start(self, first_log: str) -> None:
        with open(first_log, "ab") as log:  # its imports' messages go to the first architecture's log
            self.proc = subprocess.Popen(self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         env=worker_env(self.jobs), start_new_session=True)
        self.buffer, self.types_run = b"", 0

    def stop(self, kill: bool = False) -> int | None:
        """Ends the process (kill: its whole group at once) and returns its exit code."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if kill:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            return proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait()

    def _send(self, stream: IO[bytes], request: dict[str, Any]) -> None:
        try:
            stream.write((json.dumps(request) + "\n").encode())
            stream.flush()
        except OSError:
            pass  # it died starting: read() finds the end of its output

    def _read_until_done(self, deadline: float) -> tuple[list[bytes], bool, bool]:
        """The worker's lines up to its "done" event: (lines, done, timed out); neither: it died."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        lines: list[bytes] = []
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                lines.append(line)
                if line.startswith(b'{"event": "done"'):
                    return lines, True, False
            left = deadline - time.monotonic()
            if left <= 0:
                return lines, False, True
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            data = os.read(fd, 1 << 16)
            if not data:
                if self.buffer:
                    lines.append(self.buffer)
                    self.buffer = b""
                return lines, False, False
            self.buffer += data

    def run(self, model_type: str, modes: list[str], timeout: float) -> Record:
        """One architecture, to its end or its time limit."""
        log_path = self.log_path(model_type)
        if self.proc is not None and self.types_run >= TYPES_PER_WORKER:
            self.stop()
        if self.proc is None:
            self._start(log_path)
        assert self.proc is not None and self.proc.stdin is not None
        start = time.monotonic()
        self._send(self.proc.stdin, {"type": model_type, "modes": modes, "log": log_path})
        lines, done, timed_out = self._read_until_done(start + timeout)
        rc = None
        if done:
            self.types_run += 1
        else:  # a timeout or a death: this worker is finished
            rc = self.stop(kill=True)
        seconds = time.monotonic() - start
        return assemble(model_type, _events(lines), modes, rc, timed_out, seconds, _tail(log_path))


def run_one(model_type: str, modes: list[str], timeout: float, jobs: int = 1, log_dir: str | None = None,
            command: Command = worker_command) -> Record:
    """One architecture in a worker of its own."""
    log_dir = log_dir or tempfile.mkdtemp(prefix="zoo-logs-")
    os.makedirs(log_dir, exist_ok=True)
    worker = Worker(jobs, log_dir, command)
    try:
        return worker.run(model_type, modes, timeout)
    finally:
        worker.stop()


def run_all(model_types: Sequence[str], modes: list[str] | Mapping[str, list[str]], timeout: float, jobs: int,
            on_record: OnRecord, log_dir: str | None = None, command: Command = worker_command) -> list[Record]:
    """Every type, in `jobs` workers at a time, in `modes` (or each type's own list of them);
    on_record is called as each finishes."""
    modes_of = modes if isinstance(modes, Mapping) else {t: modes for t in model_types}
    log_dir = log_dir or tempfile.mkdtemp(prefix="zoo-logs-")
    os.makedirs(log_dir, exist_ok=True)
    n = max(1, min(jobs, len(model_types)))
    workers = [Worker(n, log_dir, command) for _ in range(n)]
    queue = list(model_types)
    records: list[Record] = []
    lock = threading.Lock()  # one on_record at a time, in the order records finish

    def drain(worker: Worker) -> None:
        while True:
            with lock:
                if not queue:
                    return
                t = queue.pop(0)
            rec = worker.run(t, modes_of[t], timeout)
            with lock:
                records.append(rec)
                on_record(rec, len(records), len(model_types))

    try:
        with ThreadPoolExecutor(max_workers=n) as pool:
            for fut in as_completed([pool.submit(drain, w) for w in workers]):
                fut.result()
    finally:
        for w in workers:
            w.stop()
    return records
