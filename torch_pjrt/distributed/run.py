"""Runs a torchrun script's ranks as threads of this process, one pjrt device each:

    python -m torch_pjrt.distributed.run --nproc-per-node 4 train.py --its --own args

Each rank runs the script as ``__main__`` with torchrun's variables (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT) of its own; collectives between the ranks
run on the devices (the XLA transport). On the CPU plugin the devices are made
here (TORCH_PJRT_CPU_DEVICES, unless already set). What the ranks share is listed
in torch_pjrt.distributed.threads.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_pjrt.distributed.run",
                                     description="Run a torchrun script's ranks as threads, one pjrt device each.")
    parser.add_argument("--nproc-per-node", "--nproc_per_node", type=int, required=True, dest="nproc")
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.nproc < 1:
        parser.error("--nproc-per-node: at least one rank")
    if "TORCH_PJRT_CPU_DEVICES" not in os.environ:  # the CPU plugin's devices, one per rank
        os.environ["TORCH_PJRT_CPU_DEVICES"] = str(args.nproc)
        from .. import _C, _config

        if not _C._is_initialized():  # the runtime starts at first use: configured again before
            _config.configure_from_env()
    from . import threads

    sys.argv = [args.script, *args.script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
    try:
        threads.spawn(lambda rank: runpy.run_path(args.script, run_name="__main__"), nprocs=args.nproc)
    except threads.RankFailed as failed:
        print(failed, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
