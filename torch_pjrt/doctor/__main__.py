"""python -m torch_pjrt.doctor [options] SCRIPT [ARGS...]

Runs SCRIPT unmodified on pjrt ("cuda" redirected, each redirection
reported) and grades its portability level by level: device and API
portability, operator coverage, numerical parity (--parity: the same script
re-run on CPU float32 in a second process), compilation and shape stability,
performance, cost (--hourly-rate)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from .assess import Options, assess
from .report import to_text, write_html, write_json
from .session import RunResult, run_script


def _child(kind: str, script: str, argv: list[str], out: str) -> None:
    """A re-run in its own process: "cpu" (parity reference) or "debug" (locate a NaN)."""
    result = run_script(script, argv, target="cpu" if kind == "cpu" else "pjrt")
    crash = result.crash
    with open(out, "w") as f:
        json.dump({"losses": result.losses, "crash": None if crash is None else
                   {"type": crash.type, "message": crash.message, "file": crash.file, "line": crash.line}}, f)


def _rerun(kind: str, script: str, argv: list[str]) -> RunResult | None:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "child.json")
        env = dict(os.environ)
        if kind == "debug":
            env["TORCH_PJRT_EAGER_MODE"] = "debug"
        try:
            subprocess.run([sys.executable, "-m", "torch_pjrt.doctor", "--child", kind, "--child-out", out, script,
                            *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=3600)
        except subprocess.TimeoutExpired:
            return None  # the report goes on without this re-run
        if not os.path.exists(out):
            return None
        with open(out) as f:
            data = json.load(f)
    from .findings import Findings
    from .observe import RunRecord
    from .session import Crash
    result = RunResult(script, argv, kind, Findings(), RunRecord(), 0.0, losses=data["losses"])
    if data["crash"]:
        result.crash = Crash(traceback="", **data["crash"])
    return result


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m torch_pjrt.doctor", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parity", action="store_true", help="re-run on CPU float32 and compare the losses")
    p.add_argument("--json", metavar="FILE", help="write the findings as JSON records")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    p.add_argument("--hourly-rate", type=float, help="price of this machine per hour (level 6)")
    p.add_argument("--baseline-rate", type=float, help="price per hour of the machine compared against")
    p.add_argument("--baseline-throughput", type=float, help="its measured throughput (same unit as this run's)")
    p.add_argument("--tokens-per-step", type=int, help="tokens per optimizer step (default: from the model's input)")
    p.add_argument("--samples-per-step", type=int, help="samples per optimizer step")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    p.add_argument("--child", choices=["cpu", "debug"], help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    if a.child:
        _child(a.child, a.script, a.args, a.child_out)
        return 0
    opts = Options(a.parity, a.hourly_rate, a.baseline_rate, a.baseline_throughput, a.tokens_per_step,
                   a.samples_per_step)
    run = run_script(a.script, a.args, progress=not a.no_progress and sys.stderr.isatty())
    cpu_run = _rerun("cpu", a.script, a.args) if a.parity else None
    nonfinite = any(v != v or v in (float("inf"), float("-inf")) for v in run.losses)
    debug_run = _rerun("debug", a.script, a.args) if nonfinite else None
    report = assess(run, opts, cpu_run, debug_run)
    sys.stdout.flush()
    print("\n" + to_text(report))
    if a.json:
        write_json(report, a.json)
    if a.html:
        write_html(report, a.html)
    return 1 if report.crash else 0


if __name__ == "__main__":
    sys.exit(main())
