"""Runs a scenario of dist_workers.py with its ranks as threads of this process
(torch_pjrt.distributed.spawn, one pjrt device each; run with
TORCH_PJRT_CPU_DEVICES >= WORLD): writes OUT_FILE with every rank's report and
the process's transport counters, or exits 1 with every failed rank's traceback.

    python thread_ranks.py SCENARIO WORLD OUT_FILE
"""

from __future__ import annotations

import json
import sys

import torch_pjrt  # noqa: F401  (registers the device and the "pjrt" backend)
from torch_pjrt.distributed import spawn, transport_stats

import dist_workers


def main() -> None:
    name, world, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    reports = spawn(dist_workers.SCENARIOS[name], args=(world,), nprocs=world)
    with open(out, "w") as f:
        json.dump({"reports": reports, "transport": transport_stats()}, f, default=str)


if __name__ == "__main__":
    main()
