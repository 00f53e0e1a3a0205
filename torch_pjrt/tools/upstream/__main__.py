"""python -m torch_pjrt.tools.upstream DIR [--files F,...] [--sample N | --sample F=N,...] [--report FILE]

Runs PyTorch's device-generic test files from DIR on pjrt, one pytest process per
file, and prints per file: passed, failed, errors, skipped, expected failures (the
spec's), unexpected passes, and the share of non-skipped tests passing. Exits 1 on
any failure, error or unexpected pass: the spec lists every known failure.

--sample N runs a fixed, evenly spread sample of N tests per file plus every test
the spec expects to fail (the CI slice); --sample F=N,... samples only the files named
and runs the others whole; without it every test runs. The report says, per file,
whether every test ran or a sample.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time

from .spec import SPEC, lookup

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


def _env(outcomes: str) -> dict[str, str]:
    env = dict(os.environ, PYTORCH_TESTING_DEVICE_FOR_CUSTOM="privateuse1",
               PYTORCH_TESTING_DEVICE_ONLY_FOR="privateuse1", TORCH_PJRT_UPSTREAM_OUTCOMES=outcomes,
               PYTORCH_PRINT_REPRO_ON_FAILURE="0", TORCH_PJRT_FALLBACK=os.environ.get("TORCH_PJRT_FALLBACK", "warn"))
    env.pop("PYTEST_ADDOPTS", None)
    return env


def _pytest(path: str, extra: list[str], outcomes: str, timeout: float) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "torch_pjrt.tools.upstream.plugin",
           "--rootdir", os.path.dirname(path), *extra]
    return subprocess.run(cmd, cwd=os.path.dirname(path), env=_env(outcomes), capture_output=True, text=True,
                          timeout=timeout)


def _collect(path: str, selection: list[str]) -> list[str]:
    proc = _pytest(path, ["--collect-only", path, *selection], os.devnull, 600)
    ids = [line.split("::", 1)[1] for line in proc.stdout.splitlines() if "::" in line]
    if not ids:  # never hand pytest an empty list: it would run every file in the directory
        raise RuntimeError(f"upstream: collecting {path} gave no test ids:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return ids


def _sample(ids: list[str], n: int, file: str) -> list[str]:
    step = max(1, len(ids) // n) if n else 1
    return [t for i, t in enumerate(ids) if i % step == 0 or _expected_to_fail(file, t)]


def _expected_to_fail(file: str, test: str) -> bool:
    entry = lookup(file, test)
    return entry is not None and entry.expect == "fail"


def run_file(path: str, sample: int | None, timeout: float) -> FileResult:
    file = os.path.basename(path)
    selection = ["-k", SELECTION[file]] if file in SELECTION else []
    start = time.perf_counter()
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as out:
        collected = None
        ids = []
        if sample:
            all_ids = _collect(path, selection)
            collected = len(all_ids)
            ids = _sample(all_ids, sample, file)
            args = [f"{path}::{t}" for t in ids]
        else:
            args = [path, *selection]
        proc = _pytest(path, args, out.name, timeout)
        records = [json.loads(line) for line in out.read().splitlines() if line.strip()]
    counts = {o: 0 for o in OUTCOMES}
    problems = []
    cpu_too = sum(1 for r in records if r["outcome"] == "xfailed" and getattr(lookup(file, r["test"]), "cpu_too", False))
    for r in records:
        counts[r["outcome"]] += 1
        if r["outcome"] in ("failed", "error", "xpassed"):
            problems.append(r)
    # A test asked for that left no outcome, or a pytest that died (a crash, a signal), is an
    # error of its own: never a shorter run that looks clean.
    seen = {r["test"] for r in records}
    for test in ids:
        if test not in seen:
            problems.append({"test": test, "outcome": "error", "message": "not run (the pytest process ended first)"})
            counts["error"] += 1
    if proc.returncode not in (0, 1, 5) or (not records and proc.returncode != 5):
        problems.append({"test": "(the file)", "outcome": "error",
                         "message": f"pytest ended with code {proc.returncode} after {len(records)} outcomes: "
                                    + (proc.stdout[-400:] + proc.stderr[-400:]).replace("\n", " | ")})
        counts["error"] += 1
    return FileResult(file, counts, time.perf_counter() - start, problems, cpu_too, collected)


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
                      sum(sampled) if any(r.collected is not None for r in results) else None)


def _sample_size(option: str | None, file: str) -> int | None:
    if not option:
        return None
    if "=" not in option:
        return int(option)
    sizes = dict(part.split("=", 1) for part in option.split(","))
    return int(sizes[file]) if file in sizes else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", help="a directory of PyTorch test files (e.g. ../shared/upstream)")
    parser.add_argument("--files", help="comma-separated file names (default: every test_*.py there)")
    parser.add_argument("--sample", help="N: tests per file, evenly spread, plus every expected failure; "
                        "F=N,...: sample only those files")
    parser.add_argument("--timeout", type=float, default=5400, help="seconds per file")
    parser.add_argument("--report", help="write a Markdown report here")
    args = parser.parse_args()
    names = args.files.split(",") if args.files else sorted(
        f for f in os.listdir(args.directory) if f.startswith("test_") and f.endswith(".py"))
    results = []
    for name in names:
        result = run_file(os.path.join(os.path.abspath(args.directory), name), _sample_size(args.sample, name),
                          args.timeout)
        results.append(result)
        c = result.counts
        scope = "" if result.collected is None else f"; a sample of {result.run + c['skipped']} of {result.collected} tests"
        print(f"{name}: {c['passed']} passed, {c['failed']} failed, {c['error']} errors, {c['skipped']} skipped, "
              f"{c['xfailed']} expected failures ({result.cpu_too} failing on CPU too), {c['xpassed']} unexpected "
              f"passes: {100 * result.rate:.1f}%, {100 * result.device_rate:.1f}% without the CPU's own failures "
              f"({result.seconds:.0f} s{scope})", flush=True)
        for p in result.problems:
            print(f"  {p['outcome'].upper()} {p['test']}: {p['message']}", flush=True)
    print(table(results))
    if args.report:
        command = "python -m torch_pjrt.tools.upstream " + " ".join(sys.argv[1:])
        with open(args.report, "w") as f:
            f.write("# PyTorch's own test files on pjrt\n\nGenerated by `" + command + "` (spec: "
                    f"`{os.path.relpath(SPEC)}`).\n\n" + table(results) + "\n")
    sys.exit(1 if any(r.problems for r in results) else 0)


if __name__ == "__main__":
    main()
