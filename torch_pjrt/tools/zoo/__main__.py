"""Command line: python -m torch_pjrt.tools.zoo [--only t1,t2] [--sample N] [--modes strict,fused,compiled]
[--jobs 2] [--timeout 300] [--results docs/zoo/results.jsonl] [--resume] [--report docs/zoo.md]

Examples:
    python -m torch_pjrt.tools.zoo --only bert,gpt2,llama
    python -m torch_pjrt.tools.zoo --sample 40 --jobs 2
    python -m torch_pjrt.tools.zoo --modes strict,fused --jobs 1 --timeout 240 --resume   # the whole catalog
    python -m torch_pjrt.tools.zoo --report-only                                           # docs/zoo.md again
"""

from __future__ import annotations

import argparse
import shlex
import sys

from . import catalog, report, results
from .pool import run_all
from .worker import COMPILED_HEADS, MODES

DEFAULT_RESULTS = "docs/zoo/results.jsonl"
DEFAULT_REPORT = "docs/zoo.md"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torch_pjrt.tools.zoo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="", help="comma-separated model types")
    p.add_argument("--sample", type=int, default=0, help="N types spread evenly over the catalog (deterministic)")
    p.add_argument("--modes", default="strict,fused,compiled",
                   help="comma-separated, of strict, fused, compiled (compiled: causal-LM heads only)")
    p.add_argument("--jobs", "-j", type=int, default=2, help="worker processes at a time (default 2)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per architecture (default 300)")
    p.add_argument("--results", default=DEFAULT_RESULTS, help="JSONL the records are appended to")
    p.add_argument("--resume", action="store_true", help="skip types the results file already answers")
    p.add_argument("--report", default=DEFAULT_REPORT, help="markdown report written from the results file")
    p.add_argument("--no-report", action="store_true", help="do not write the report")
    p.add_argument("--report-only", action="store_true", help="write the report from the results file and exit")
    p.add_argument("--runs", default="", help="with --report-only: the commands that made the records, for the header")
    p.add_argument("--logs", default=None, help="directory for the workers' logs (default: a temporary one)")
    p.add_argument("--list", action="store_true", help="print the selected types and classes and exit")
    return p


def select(only: str, sample: int) -> list[catalog.Entry]:
    everything = catalog.entries()
    if only:
        wanted = [t.strip() for t in only.split(",") if t.strip()]
        by_type = {e.model_type: e for e in everything}
        unknown = [t for t in wanted if t not in by_type]
        if unknown:
            raise SystemExit(f"unknown model type(s): {', '.join(unknown)}")
        return [by_type[t] for t in wanted]
    if sample:
        chosen = set(catalog.sample([e.model_type for e in everything], sample))
        return [e for e in everything if e.model_type in chosen]
    return everything


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command = "python -m torch_pjrt.tools.zoo " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    modes = [m for m in args.modes.split(",") if m]
    bad = sorted(set(modes) - set(MODES))
    if bad:
        raise SystemExit(f"unknown mode(s) {bad}; choose from {list(MODES)}")
    chosen = select(args.only, args.sample)
    if args.list:
        for e in chosen:
            print(f"{e.model_type:40s} {e.head:24s} {e.model_class}")
        return 0
    catalog_size = len(catalog.entries())
    if args.report_only:
        if args.runs:
            command = f"{command}` from the records of `{args.runs}"
        report.write(args.report, results.load(args.results), report.environment(command), catalog_size,
                     len(results.load(args.results)), args.results)
        print(f"wrote {args.report}")
        return 0
    done = results.load(args.results) if args.resume else {}
    todo = [e.model_type for e in chosen if e.model_type not in done
            or not results.complete(done[e.model_type], modes, COMPILED_HEADS)]
    print(f"{len(chosen)} types selected, {len(chosen) - len(todo)} already in {args.results}, {len(todo)} to run "
          f"(modes {','.join(modes)}, {args.jobs} jobs, {args.timeout:.0f} s each)", file=sys.stderr, flush=True)
    write = results.Writer(args.results)
    env = report.environment(command)

    def on_record(rec: results.Record, finished: int, total: int) -> None:
        write(rec)
        ms = rec.get("modes", {})
        line = " ".join(f"{m}={v['status']}" for m, v in ms.items()) or f"{rec['status']}: {rec.get('reason', '')}"
        print(f"[{finished}/{total}] {rec['type']:32s} {rec.get('seconds', 0):6.1f}s {line[:160]}",
              file=sys.stderr, flush=True)
        if not args.no_report and finished % 10 == 0:
            report.write(args.report, results.load(args.results), env, catalog_size, len(chosen), args.results)

    run_all(todo, modes, args.timeout, args.jobs, on_record, log_dir=args.logs)
    if not args.no_report:
        report.write(args.report, results.load(args.results), env, catalog_size, len(chosen), args.results)
        print(f"wrote {args.report}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
