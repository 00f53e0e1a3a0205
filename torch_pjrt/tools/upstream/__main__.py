"""python -m torch_pjrt.tools.upstream DIR [DIR ...] [--files F,...] [--sample N | --sample F=N,...] [--report FILE]

Runs PyTorch's device-generic test files from each DIR on pjrt (a file name found in
several directories is taken from the first), one pytest process per file, and prints per file: passed, failed, errors, skipped, expected failures (the
spec's), unexpected passes, and the share of non-skipped tests passing. Exits 1 on
any failure, error or unexpected pass: the spec lists every known failure.

--jobs N runs each file's tests in N pytest processes side by side. --outcomes DIR keeps
every outcome there, and --resume then runs only the tests without one or whose outcome
was a failure, an error or an unexpected pass, so a run of many hours (test_ops.py on 2
cores) can be continued, and failures rerun after a fix; the report names the commits the
outcomes come from. A process that dies is charged to the test it was running and the
rest go on in a new one.

--sample N runs a fixed, evenly spread sample of N tests per file plus every test
the spec strictly expects to fail on pjrt alone (the CI slice; those failing on the CPU too,
and non-strict entries, which cannot fail a run, are left to the full run); --sample F=N,...
samples only the files named
and runs the others whole; without it every test runs. The report says, per file,
whether every test ran or a sample.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from .spec import SPEC, check, lookup

# test_ops.py: the tests that check a device (compare-to-CPU, out=, out warnings,
# variant consistency, non-contiguous samples, errors, non-standard bools, int-to-float
# promotion) and TestMathBits. The rest test OpInfo, the Python references or the meta
# and fake tensors, not the device. The plugin lifts compare-to-CPU's CUDA-only mark.
_DEVICE_TESTS = ("test_compare_cpu", "test_out", "test_variant_consistency_eager", "test_noncontiguous_samples",
                 "test_errors", "test_non_standard_bool_values", "test_promotes_int_to_float")
SELECTION = {"test_ops.py": f"TestMathBits or (TestCommon and ({' or '.join(_DEVICE_TESTS)}))"}
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


@dataclasses.dataclass
class FileResult:
    file: str
    counts: dict[str, int]
    seconds: float
    problems: list[dict[str, str]]  # failures, errors, unexpected passes
    cpu_too: int  # expected failures that fail on the CPU as well
    collected: int | None = None  # the file's test count when a sample ran (None: every test ran)
    commits: list[str] = dataclasses.field(default_factory=list)  # the project's commits the outcomes come from

    @property
    def run(self) -> int:
        return sum(self.counts[o] for o in OUTCOMES if o != "skipped")

    @property
    def rate(self) -> float:
        return self.counts["passed"] / self.run if self.run else 1.0

    @property
    def device_rate(self) -> float:
        """The rate over the tests that pass on the CPU (or were not tried there)."""
        run = self.run - self.cpu_too
        return self.counts["passed"] / run if run else 1.0


def _env(outcomes: str, share: str, only: str | None) -> dict[str, str]:
    env = dict(os.environ, PYTORCH_TESTING_DEVICE_FOR_CUSTOM="privateuse1",
               PYTORCH_TESTING_DEVICE_ONLY_FOR="privateuse1", TORCH_PJRT_UPSTREAM_OUTCOMES=outcomes,
               PYTORCH_PRINT_REPRO_ON_FAILURE="0", TORCH_PJRT_FALLBACK=os.environ.get("TORCH_PJRT_FALLBACK", "warn"),
               TORCH_PJRT_UPSTREAM_COMMIT=_commit())
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("TORCH_PJRT_UPSTREAM_ONLY", None)
    env["TORCH_PJRT_UPSTREAM_SHARE"] = share
    if only is not None:
        env["TORCH_PJRT_UPSTREAM_ONLY"] = only
    return env


@functools.cache
def _commit() -> str:
    """The project's commit the outcomes come from ("+" when the work tree has changes)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+" if dirty else "")


def _pytest_cmd(path: str, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "torch_pjrt.tools.upstream.plugin",
            "--rootdir", os.path.dirname(path), *extra]


def _read(paths: list[str]) -> dict[str, dict[str, str]]:
    """Outcome records by test id: the latest record of a test wins. A rerun may land in
    another job's file than the first outcome, so records carry their time; records
    without one (older runs) count as earlier than any with one, and in file order."""
    records: dict[str, dict[str, str]] = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    old = records.get(r["test"])
                    if old is None or float(r.get("time", 0)) >= float(old.get("time", 0)):
                        records[r["test"]] = r
    return records


def _record(path: str, test: str, outcome: str, message: str) -> None:
    with open(path, "a") as f:
        f.write(json.dumps({"test": test, "outcome": outcome, "message": message, "commit": _commit(),
                            "time": time.time()}) + "\n")


@dataclasses.dataclass
class Share:
    """What one pytest process chose from its own collection (the plugin's answer)."""
    collected: int  # the file's test count
    wanted: list[str]  # the file's tests this run covers (all, or the sample), done or not
    unrun: list[dict[str, str]]  # tests of this share that left no outcome, as errors


def _run_share(path: str, selection: list[str], request: dict[str, object], outcomes: str,
               deadline: float) -> Share:
    """Runs one job's share of a file in one pytest process, which collects the file and
    picks the share itself (plugin.py), appending outcomes to `outcomes`. A process that
    dies (a crash, a signal) is charged to the test it was running, recorded as that test's
    error, and a new process runs the rest of the share."""
    with tempfile.TemporaryDirectory() as scratch:
        request_path = os.path.join(scratch, "request.json")
        answer_path = os.path.join(scratch, "answer.json")
        with open(request_path, "w") as f:
            json.dump({**request, "answer": answer_path}, f)
        only: str | None = None  # after a crash: the ids left
        todo: list[str] | None = None
        started = time.time()  # a resumed run's older outcomes (of tests it reruns) do not count
        while True:
            proc = subprocess.Popen(_pytest_cmd(path, [path, *selection]), cwd=os.path.dirname(path),
                                    env=_env(outcomes, request_path, only), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            try:
                output, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
                timed_out = False
            except subprocess.TimeoutExpired:
                proc.kill()
                output, _ = proc.communicate()
                timed_out = True
            if todo is None:  # the first process: what it chose
                if not os.path.exists(answer_path):
                    raise RuntimeError(f"upstream: collecting {path} gave no test ids (pytest ended with code "
                                       f"{proc.returncode}):\n{output[-3000:]}")
                with open(answer_path) as f:
                    answer = json.load(f)
                if not answer["collected"]:
                    raise RuntimeError(f"upstream: collecting {path} gave no test ids:\n{output[-3000:]}")
                todo = answer["mine"]
            done = _read([outcomes]) if os.path.exists(outcomes) else {}
            missing = [t for t in todo if t not in done or float(done[t].get("time", 0)) < started]
            share = functools.partial(Share, answer["collected"], answer["wanted"])
            if timed_out:
                return share([{"test": t, "outcome": "error", "message": "not run (the file's time limit ran out)"}
                              for t in missing])
            if not missing or proc.returncode in (0, 1, 5):
                return share([{"test": t, "outcome": "error",
                               "message": f"not run (pytest ended with code {proc.returncode})"} for t in missing])
            if proc.returncode in (2, 3, 4):  # interrupted, internal or usage error: no test will run
                tail = output[-600:].replace("\n", " | ")
                return share([{"test": t, "outcome": "error", "message": f"pytest ended with code {proc.returncode}: "
                               f"{tail}"} for t in missing])
            tail = output[-300:].replace("\n", " | ")
            _record(outcomes, missing[0], "error", f"pytest ended with code {proc.returncode} during this test: {tail}")
            todo = missing[1:]
            if not todo:
                return share([])
            only = os.path.join(scratch, "only.ids")
            with open(only, "w") as f:
                f.write("\n".join(todo))


def run_file(path: str, sample: int | None, timeout: float, jobs: int = 1, outcomes_dir: str | None = None,
             resume: bool = False) -> FileResult:
    file = os.path.basename(path)
    selection = ["-k", SELECTION[file]] if file in SELECTION else []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        directory = os.path.abspath(outcomes_dir or scratch)  # pytest runs in the upstream directory
        os.makedirs(directory, exist_ok=True)
        parts = sorted(glob.glob(os.path.join(glob.escape(directory), f"{glob.escape(file)}.*.jsonl")))
        if not resume:
            for part in parts:
                os.unlink(part)
        # Resumed: what has no outcome yet, and what failed (after a fix, it runs again).
        done = sorted(t for t, r in _read(parts).items() if r["outcome"] not in ("failed", "error", "xpassed")) \
            if resume else []
        jobs = max(1, jobs)
        deadline = time.monotonic() + timeout
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            futures = [pool.submit(_run_share, path, selection, {"sample": sample, "done": done, "job": j, "jobs": jobs},
                                   os.path.join(directory, f"{file}.{j}.jsonl"), deadline) for j in range(jobs)]
            shares = [f.result() for f in futures]
        records = _read(sorted(glob.glob(os.path.join(glob.escape(directory), f"{glob.escape(file)}.*.jsonl"))))
    wanted = set(shares[0].wanted)
    unrun = [p for s in shares for p in s.unrun]
    records = {t: r for t, r in records.items() if t in wanted}
    counts = {o: 0 for o in OUTCOMES}
    problems = []
    for r in records.values():
        counts[r["outcome"]] += 1
        if r["outcome"] in ("failed", "error", "xpassed"):
            problems.append(r)
    for p in unrun:  # a test asked for that left no outcome is an error: never a shorter run that looks clean
        if p["test"] not in records:
            counts["error"] += 1
            problems.append(p)
    cpu_too = sum(1 for r in records.values()
                  if r["outcome"] == "xfailed" and getattr(lookup(file, r["test"]), "cpu_too", False))
    commits = sorted({r.get("commit", "unknown") for r in records.values()})
    return FileResult(file, counts, time.perf_counter() - start, problems, cpu_too,
                      shares[0].collected if sample else None, commits)


def table(results: list[FileResult]) -> str:
    lines = ["| file | tests run | passed | failed | errors | skipped | expected failures (of them failing on CPU too) | "
             "unexpected passes | pass rate (non-skipped) | pass rate without the CPU's own failures |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in [*results, _total(results)]:
        c = r.counts
        ran = "all" if r.collected is None else f"sample of {r.run + c['skipped']} / {r.collected}"
        lines.append(f"| {r.file} | {ran} | {c['passed']} | {c['failed']} | {c['error']} | {c['skipped']} | "
                     f"{c['xfailed']} ({r.cpu_too}) | {c['xpassed']} | {100 * r.rate:.1f}% | {100 * r.device_rate:.1f}% |")
    return "\n".join(lines)


def _total(results: list[FileResult]) -> FileResult:
    counts = {o: sum(r.counts[o] for r in results) for o in OUTCOMES}
    sampled = [r.collected if r.collected is not None else r.run + r.counts["skipped"] for r in results]
    return FileResult("all", counts, sum(r.seconds for r in results), [], sum(r.cpu_too for r in results),
                      sum(sampled) if any(r.collected is not None for r in results) else None,
                      sorted({c for r in results for c in r.commits}))


def report_file(name: str, result: FileResult) -> None:
    """One line for a file, then its problems."""
    c = result.counts
    scope = "" if result.collected is None else f"; a sample of {result.run + c['skipped']} of {result.collected} tests"
    print(f"{name}: {c['passed']} passed, {c['failed']} failed, {c['error']} errors, {c['skipped']} skipped, "
          f"{c['xfailed']} expected failures ({result.cpu_too} failing on CPU too), {c['xpassed']} unexpected "
          f"passes: {100 * result.rate:.1f}%, {100 * result.device_rate:.1f}% without the CPU's own failures "
          f"({result.seconds:.0f} s{scope})", flush=True)
    for p in result.problems:
        print(f"  {p['outcome'].upper()} {p['test']}: {p['message']}", flush=True)


def _sample_size(option: str | None, file: str) -> int | None:
    if not option:
        return None
    if "=" not in option:
        return int(option)
    sizes = dict(part.split("=", 1) for part in option.split(","))
    return int(sizes[file]) if file in sizes else None


def test_files(directories: list[str]) -> dict[str, str]:
    """Every test_*.py of the directories by name, its path from the first directory that has it."""
    found: dict[str, str] = {}
    for directory in directories:
        for name in sorted(os.listdir(directory)):
            if name.startswith("test_") and name.endswith(".py"):
                found.setdefault(name, os.path.join(os.path.abspath(directory), name))
    return found


def main(argv: Sequence[str] | None = None) -> None:
    """argv: the arguments (default: the command line's); exits with the run's status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directories", nargs="+", metavar="directory",
                        help="directories of PyTorch test files (e.g. ../shared/upstream ../shared/upstream-next)")
    parser.add_argument("--files", help="comma-separated file names (default: every test_*.py there)")
    parser.add_argument("--sample", help="N: tests per file, evenly spread, plus every strict failure expected on pjrt alone; "
                        "F=N,...: sample only those files")
    parser.add_argument("--timeout", type=float, default=5400, help="seconds per file")
    parser.add_argument("--jobs", type=int, default=1, help="pytest processes per file, run side by side")
    parser.add_argument("--outcomes", help="keep each test's outcome in this directory (one JSON-lines file per "
                        "file and job) rather than in a temporary one")
    parser.add_argument("--resume", action="store_true", help="with --outcomes: run only the tests that have no "
                        "outcome there yet or failed (a long run continued later); the report counts them all")
    parser.add_argument("--report", help="write a Markdown report here")
    args = parser.parse_args(argv)
    found = test_files(args.directories)
    names = args.files.split(",") if args.files else sorted(found)
    unknown = [n for n in names if n not in found]
    if unknown:
        parser.error(f"no {', '.join(unknown)} in {' or '.join(args.directories)}")
    if args.resume and not args.outcomes:
        parser.error("--resume needs --outcomes")
    problem = check()  # here, before any run: a bad spec inside pytest is an INTERNALERROR per file
    if problem:
        parser.error(problem)
    results = []
    # A sample is a few tests per file: the files run side by side, one process each (a share
    # per job would collect the same file once per job). A whole run splits each file instead.
    files_at_once = max(1, args.jobs) if args.sample else 1
    jobs_per_file = 1 if args.sample else args.jobs
    with concurrent.futures.ThreadPoolExecutor(files_at_once) as pool:
        pending = [pool.submit(run_file, found[name], _sample_size(args.sample, name), args.timeout, jobs_per_file,
                               args.outcomes, args.resume) for name in names]
        for name, future in zip(names, pending):  # reported in the files' order
            results.append(future.result())
            report_file(name, results[-1])
    print(table(results))
    if args.report:
        command = "python -m torch_pjrt.tools.upstream " + " ".join(sys.argv[1:] if argv is None else argv)
        notes = ""  # a section written by hand ("## Notes ...") outlives the regenerated table
        if os.path.exists(args.report):
            with open(args.report) as f:
                old = f.read()
            if "\n## Notes" in old:
                notes = "\n" + old[old.index("\n## Notes") + 1:]
        with open(args.report, "w") as f:
            commits = sorted({c for r in results for c in r.commits})
            f.write("# PyTorch's own test files on pjrt\n\nGenerated by `" + command + "` (spec: "
                    f"`{os.path.relpath(SPEC)}`; outcomes from commit{'s' if len(commits) > 1 else ''} "
                    f"{', '.join(commits)}).\n\n" + table(results) + "\n" + notes)
    sys.exit(1 if any(r.problems for r in results) else 0)


if __name__ == "__main__":
    main()
