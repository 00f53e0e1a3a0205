"""Runs ops in worker processes: a crash or a hang is recorded for its op, never fatal.

Each op is a job for one worker. A worker that dies (signal, abort, exit) is recorded
as a "crashed" abort of the op, naming the sample that was running, the exit signal
and the tail of the worker's log; a fresh worker then resumes the op with the dtypes
after the one that crashed. An op that exceeds the time limit is killed and recorded
as a "timeout"; the run moves on to the next op.
"""

from __future__ import annotations

import collections
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import settings
from .records import Abort, OpInfoMeta, OpRun, SampleResult

Progress = Callable[[str, OpRun, int, int], None]  # (op, its record, ops finished, ops total)


@dataclass
class Options:
    dtypes: list[str]  # names, settings.DTYPE_NAMES keys
    phases: list[str]
    max_samples_float32: int = settings.MAX_SAMPLES_FLOAT32
    max_samples_other: int = settings.MAX_SAMPLES_OTHER
    op_time_limit_s: float = settings.OP_TIME_LIMIT_S
    ops_per_worker: int = settings.OPS_PER_WORKER


@dataclass
class Job:
    op: str
    dtypes: list[str]


def _exit_detail(code: int | None) -> str:
    if code is None:
        return "exited"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _tail(path: str, limit: int = 2500) -> str:
    """The end of a worker's log (an abort's message, faulthandler's stacks), without the noise."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4 * limit))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("Extension modules:")]
    return "\n".join(lines)[-limit:]


class Worker:
    """One worker process and the state of the job it runs."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.fd = -1
        self.buf = b""
        self.ready = False
        self.job: Job | None = None
        self.deadline = 0.0
        self.started = 0.0
        self.last_begin: dict[str, Any] = {}
        self.ops_done = 0
        self.log_path = ""
        self.metrics: dict[str, float] = {}

    def start(self) -> None:
        rfd, wfd = os.pipe()
        fd_log, self.log_path = tempfile.mkstemp(prefix="worker-", suffix=".log", dir=self.log_dir)
        env = dict(os.environ, TORCH_PJRT_FALLBACK="warn", PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torch_pjrt.tools.conformance.worker", "--fd", str(wfd)],
            stdin=subprocess.PIPE, stdout=fd_log, stderr=fd_log, pass_fds=(wfd,), env=env,
        )
        os.close(wfd)
        os.close(fd_log)
        self.fd, self.buf, self.ready, self.job, self.ops_done, self.metrics = rfd, b"", False, None, 0, {}
        self.deadline = time.monotonic() + 120.0  # start-up

    def send(self, job: Job, options: Options) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        msg = {"op": job.op, "dtypes": job.dtypes, "phases": options.phases,
               "max_samples_float32": options.max_samples_float32, "max_samples_other": options.max_samples_other}
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()
        self.job = job
        self.started = time.monotonic()
        self.deadline = self.started + options.op_time_limit_s
        self.last_begin = {}

    def read(self) -> tuple[list[dict[str, Any]], bool]:
        """Messages available now, and whether the pipe reached end of file (worker gone)."""
        data = os.read(self.fd, 1 << 20)
        if not data:
            return self._lines(final=True), True
        self.buf += data
        return self._lines(final=False), False

    def _lines(self, final: bool) -> list[dict[str, Any]]:
        *lines, self.buf = self.buf.split(b"\n")
        if final and self.buf:
            lines.append(self.buf)
            self.buf = b""
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # a torn last line of a dying worker
        return out

    def stop(self, kill: bool = False) -> int | None:
        """Ends the process (kill: SIGKILL at once) and returns its exit code."""
        if self.proc is None:
            return None
        proc = self.proc
        if not kill and proc.poll() is None and proc.stdin is not None:
            try:
                proc.stdin.write(b'{"type": "exit"}\n')
                proc.stdin.flush()
            except OSError:
                pass
        try:
            if kill and proc.poll() is None:
                proc.kill()
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        for f in (proc.stdin,):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = -1
        self.proc = None
        self.ready = False
        return code


def _merge_meta(old: OpInfoMeta | None, new: OpInfoMeta) -> OpInfoMeta:
    if old is None:
        return new
    for d in new.dtypes_run:
        if d not in old.dtypes_run:
            old.dtypes_run.append(d)
    old.samples_available.update(new.samples_available)
    old.notes.extend(n for n in new.notes if n not in old.notes)
    return old


class Supervisor:
    def __init__(self, options: Options, jobs: int = 1, progress: Progress | None = None) -> None:
        self.options = options
        self.n_workers = max(1, jobs)
        self.progress = progress
        self.runs: dict[str, OpRun] = {}
        self.metrics: dict[str, float] = collections.defaultdict(float)
        self.log_dir = tempfile.mkdtemp(prefix="torch_pjrt_conformance_")
        # The workers' dispatcher registrations (summary.dispatcher_native_ops), one entry per
        # distinct set seen: more than one means the extension changed during the run.
        self.native_snapshots: list[dict[str, Any]] = []
        self.platform: dict[str, Any] = {}

    def _run_of(self, op: str) -> OpRun:
        if op not in self.runs:
            self.runs[op] = OpRun(meta=OpInfoMeta(op=op))
        return self.runs[op]

    def run(self, ops: Sequence[str]) -> dict[str, OpRun]:
        queue: collections.deque[Job] = collections.deque(Job(op, list(self.options.dtypes)) for op in ops)
        total, finished = len(ops), 0
        workers = [Worker(self.log_dir) for _ in range(min(self.n_workers, max(1, len(ops))))]
        failed_starts = 0
        for w in workers:
            w.start()
        try:
            while queue or any(w.job is not None for w in workers):
                for w in workers:
                    if w.proc is None and queue:  # a replacement starts only when there is work for it
                        w.start()
                    if w.ready and w.job is None and queue:
                        if w.ops_done >= self.options.ops_per_worker:
                            w.stop()  # recycled: started again, as any replacement, at the loop's top
                            continue
                        w.send(queue.popleft(), self.options)
                live = [w for w in workers if w.proc is not None]
                now = time.monotonic()
                timeout = min(5.0, max(0.0, min(w.deadline for w in live) - now)) if live else 0.1
                readable, _, _ = select.select([w.fd for w in live], [], [], timeout)
                for w in live:
                    if w.fd in readable:
                        messages, eof = w.read()
                        for msg in messages:
                            if msg.get("type") == "ready":
                                failed_starts = 0
                            if self._handle(w, msg):
                                finished += 1
                                self._report(w, finished, total)
                        if eof:
                            code = w.stop(kill=True)
                            if w.job is None and not w.ready:
                                # E.g. the extension is being rewritten by a build: wait and retry.
                                failed_starts += 1
                                if failed_starts >= 6:
                                    raise RuntimeError(
                                        f"conformance worker failed to start ({_exit_detail(code)}):\n{_tail(w.log_path)}")
                                time.sleep(5 * failed_starts)
                            elif w.job is not None:
                                done = self._abort(w, "crashed", _exit_detail(code), queue)
                                finished += done
                                if done:  # else it resumes with its later dtypes and reports when done
                                    self._report(w, finished, total, op=self._last_op)
                    elif time.monotonic() >= w.deadline:
                        if w.job is not None:
                            w.stop(kill=True)
                            finished += self._abort(w, "timeout", f"over {self.options.op_time_limit_s:.0f} s", queue,
                                                    resume=False)
                            self._report(w, finished, total, op=self._last_op)
                        else:
                            w.stop(kill=True)
                            failed_starts += 1
                            if failed_starts >= 6:
                                raise RuntimeError("conformance worker did not start within 120 s")
        finally:
            for w in workers:
                w.stop(kill=w.job is not None)
        return self.runs

    _last_op = ""

    def _handle(self, w: Worker, msg: dict[str, Any]) -> bool:
        """Applies one message; True when it finishes the worker's job."""
        kind = msg.pop("type", "")
        if kind == "ready":
            w.ready = True
            w.deadline = float("inf")
            native = msg.get("native")
            if native and (not self.native_snapshots or self.native_snapshots[-1] != native):
                self.native_snapshots.append(native)
            self.platform = msg.get("platform", self.platform)
        elif kind == "begin":
            w.last_begin = msg
        elif kind == "result":
            r = SampleResult.from_json(msg)
            self._run_of(r.op).results.append(r)
        elif kind == "meta":
            meta = OpInfoMeta.from_json(msg)
            run = self._run_of(meta.op)
            run.meta = _merge_meta(run.meta if run.meta.dtypes_claimed else None, meta)
        elif kind == "done":
            assert w.job is not None
            run = self._run_of(w.job.op)
            run.seconds += time.monotonic() - w.started
            for k, v in msg.get("metrics", {}).items():
                self.metrics[k] += v - w.metrics.get(k, 0)
            w.metrics = msg.get("metrics", {})
            self._last_op = w.job.op
            w.job = None
            w.ops_done += 1
            w.deadline = float("inf")
            return True
        return False

    def _abort(self, w: Worker, kind: str, detail: str, queue: collections.deque[Job], resume: bool = True) -> int:
        """Records a crash or timeout of the worker's job; resumes later dtypes. Ops finished (0 or 1)."""
        job = w.job
        assert job is not None
        b = w.last_begin
        run = self._run_of(job.op)
        run.seconds += time.monotonic() - w.started
        run.aborts.append(Abort(op=job.op, kind=kind, detail=detail, dtype=b.get("dtype", ""), phase=b.get("phase", ""),
                                index=int(b.get("index", -1)), log_tail=_tail(w.log_path)))
        dtype = b.get("dtype", "")
        if dtype and dtype not in run.meta.dtypes_run:
            run.meta.dtypes_run.append(dtype)
        w.job = None
        self._last_op = job.op
        rest = job.dtypes[job.dtypes.index(dtype) + 1:] if dtype in job.dtypes else []
        if resume and rest:
            queue.appendleft(Job(job.op, rest))
            return 0
        return 1

    def _report(self, w: Worker, finished: int, total: int, op: str | None = None) -> None:
        name = op or self._last_op
        if self.progress is not None and name in self.runs:
            self.progress(name, self.runs[name], finished, total)
