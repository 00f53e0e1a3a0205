"""Command line: python -m torch_pjrt.tools.conformance (--all | --ops GLOB ...) [--write-report].

Examples:
    python -m torch_pjrt.tools.conformance --all --write-report
    python -m torch_pjrt.tools.conformance --ops 'nn.functional.*' --dtypes float32
    python -m torch_pjrt.tools.conformance --in-process --ops cumsum --dtypes int64 -v
"""

from __future__ import annotations

import argparse
import os
import sys

from . import settings
from .records import PHASES, OpRun
from .summary import SHORT_DTYPE, summarize


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torch_pjrt.tools.conformance", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sel = p.add_mutually_exclusive_group(required=True)
    sel.add_argument("--all", action="store_true", help="every OpInfo in op_db")
    sel.add_argument("--ops", nargs="+", metavar="GLOB", help="OpInfo names (with variant, e.g. div.floor_rounding), "
                     "fnmatch patterns")
    sel.add_argument("--list", nargs="*", metavar="GLOB", help="list matching OpInfo names and exit")
    p.add_argument("--dtypes", nargs="+", choices=sorted(settings.DTYPE_NAMES), help="default: all of them")
    p.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    p.add_argument("--max-samples", type=int, default=settings.MAX_SAMPLES_FLOAT32,
                   help="samples per op for float32 (default %(default)s)")
    p.add_argument("--max-samples-other", type=int, default=settings.MAX_SAMPLES_OTHER,
                   help="samples per op for other dtypes (default %(default)s)")
    p.add_argument("--time-limit", type=float, default=settings.OP_TIME_LIMIT_S,
                   help="seconds per op before it is killed and recorded as timeout (default %(default)s)")
    p.add_argument("--jobs", "-j", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--in-process", action="store_true", help="no worker: run in this process (a crash ends the run)")
    p.add_argument("--write-report", action="store_true", help="write the markdown and JSON reports")
    p.add_argument("--md", default=None, help="markdown path (default docs/conformance.md)")
    p.add_argument("--json", default=None, help="JSON path (default docs/conformance.json)")
    p.add_argument("-v", "--verbose", action="store_true", help="print every failing sample")
    p.add_argument("-q", "--quiet", action="store_true", help="no per-op progress lines")
    return p


def _progress(verbose: bool):
    def show(op: str, run: OpRun, done: int, total: int) -> None:
        s = summarize(run)
        c = s.counts
        line = (f"[{done}/{total}] {op:45s} {s.status:13s} fwd {c['forward'].passed}/{c['forward'].total} "
                f"bwd {c['backward'].passed}/{c['backward'].total} nc {c['noncontiguous'].passed}/"
                f"{c['noncontiguous'].total} out {c['out'].passed}/{c['out'].total} {run.seconds:5.1f}s")
        if s.first_failure:
            line += f"  | {s.first_failure['message'][:110]}"
        print(line, file=sys.stderr, flush=True)
        if verbose:
            for r in s.problems:
                print(f"    {SHORT_DTYPE.get(r.dtype, r.dtype)} {r.phase} #{r.index} {r.outcome}: {r.message} "
                      f"{r.fallbacks or ''}", file=sys.stderr)
            for a in s.aborts:
                print(f"    {a['kind']}: {a['detail']} at {a['dtype']} {a['phase']} #{a['index']}\n{a['log_tail']}",
                      file=sys.stderr)

    return show


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from . import harness, opsel

    if args.list is not None:
        for key in opsel.select_ops(args.list):
            print(key)
        return 0
    patterns = None if args.all else args.ops
    outcome = harness.run(
        patterns, dtypes=args.dtypes, phases=args.phases, max_samples_float32=args.max_samples,
        max_samples_other=args.max_samples_other, op_time_limit_s=args.time_limit, jobs=args.jobs,
        in_process=args.in_process, progress=None if args.quiet else _progress(args.verbose),
        command="python -m torch_pjrt.tools.conformance " + " ".join(argv if argv is not None else sys.argv[1:]),
    )
    from . import report

    rep = report.build(outcome.summaries, outcome.info)
    h = rep["headline"]
    print(f"{h['opinfos_run']} OpInfos in {outcome.info['wall_seconds']:.0f} s: "
          + ", ".join(f"{n} {st}" for st, n in h["status_counts"].items() if n), file=sys.stderr)
    print(f"distinct native ATen operators {h['distinct_native_aten_operators']} "
          f"({h['native_aten_registrations']} registrations); native ops float32 forward "
          f"{h['native_float32_forward']['passed']}/{h['native_float32_forward']['total']}, backward "
          f"{h['native_float32_backward']['passed']}/{h['native_float32_backward']['total']}", file=sys.stderr)
    for c in rep["failure_causes"][:10]:
        print(f"  {c['ops']:4d} ops {c['failing_sample_runs']:5d} runs  {c['cause'][:120]}", file=sys.stderr)
    if args.write_report:
        root = harness.repo_root()
        md = args.md or os.path.join(root, "docs", "conformance.md")
        js = args.json or os.path.join(root, "docs", "conformance.json")
        report.write(rep, outcome.summaries, md, js)
        print(f"wrote {md} and {js}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
