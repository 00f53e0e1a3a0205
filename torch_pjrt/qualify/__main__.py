"""python -m torch_pjrt.qualify [--plugin P] [--only S[,S...]] [--steps N] [--list] [--json FILE]"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torch_pjrt.qualify",
                                description="Qualify a PJRT plugin: a fixed battery of checks, a verdict each; "
                                            "exit status 1 when any fails.")
    p.add_argument("--plugin", help="the plugin to qualify (TORCH_PJRT_PLUGIN's values: cpu, a CPU plugin "
                                    "package's name, cuda, tpu or a path); default: TORCH_PJRT_PLUGIN")
    p.add_argument("--only", default="", help="run the checks whose names contain one of these comma-separated "
                                              "parts (e.g. training.hf-gpt2,kernels)")
    p.add_argument("--steps", type=int, default=10, help="training steps per differential check (default 10)")
    p.add_argument("--list", action="store_true", help="list the checks and exit")
    p.add_argument("--json", help="write the plugin's identity and every verdict here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.plugin and os.environ.get("TORCH_PJRT_PLUGIN") != args.plugin:
        # The plugin is chosen when torch_pjrt is imported (by this very command): start again with it.
        os.environ["TORCH_PJRT_PLUGIN"] = args.plugin
        os.execv(sys.executable, [sys.executable, "-m", "torch_pjrt.qualify", *sys.argv[1:]])

    from . import all_checks, plugin_summary, run_checks, select

    checks = select(all_checks(args.steps), [s.strip() for s in args.only.split(",") if s.strip()])
    if args.list:
        for c in checks:
            print(c.name + (f"  (skipped: {c.skip_reason})" if c.skip_reason else ""))
        return 0
    if not checks:
        print(f"torch_pjrt.qualify: no check matches --only {args.only!r}", file=sys.stderr)
        return 2
    info = plugin_summary()
    print(f"torch_pjrt.qualify: plugin {info['plugin']} ({info['path']}), {info['platform']} "
          f"{info['platform_version']}, PJRT C API {info['pjrt_c_api']}, XLA options {info['xla_options'] or '{}'}")
    verdicts = []
    for v in run_checks(checks):
        verdicts.append(v)
        print(f"{v.status:4}  {v.name}  ({v.seconds:.1f} s)  {v.detail}", flush=True)
    failed = [v.name for v in verdicts if v.status == "FAIL"]
    skipped = [v.name for v in verdicts if v.status == "SKIP"]
    passed = len(verdicts) - len(failed) - len(skipped)
    print(f"\nverdict: {'FAILED' if failed else 'QUALIFIED'}: {passed} passed, {len(failed)} failed, "
          f"{len(skipped)} skipped of {len(verdicts)} checks")
    for name in failed:
        print(f"  failed: {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"plugin": info, "verdicts": [v.__dict__ for v in verdicts]}, f, indent=1, default=str)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
