"""Bounded dynamic shapes against a program per size, side by side in one run (not a test).

A causal LM's training steps over a stream of batches whose sequence length varies in
[2, MAX] (tests/python/test_bounded_shapes.py's TinyLM, widened), compiled with
torch.compile(backend="pjrt"):

- per size: dynamic=False, a forward and a backward program for every length met (Dynamo's
  recompile limit raised so that it compiles them all instead of running eagerly past 8);
- bounded: the length marked with torch._dynamo.mark_dynamic(ids, 1, min=2, max=MAX), one
  forward and one backward program padded to MAX for every length.

For each: the first pass over the stream (tracing and compiling included, each process's
XLA disk cache empty), then the steady state (programs compiled, every length once more),
per step, each timed loop ending in a real device sync (torch_pjrt.bench.time_loop); the
XLA compiles (the bounded step's include a small eager pad program per new input shape)
and the padding's cost (real and padded input elements).

  .venv/bin/python benchmarks/bench_bounded.py [--lengths 24] [--max 128] [--width 64]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile

RUN = """
import json, math, sys, torch, torch_pjrt
from torch_pjrt.bench import time_call, time_loop
sys.path.insert(0, {tests!r})
from test_bounded_shapes import TinyLM, lm_loss
kind, lengths, high, width = {kind!r}, {lengths!r}, {high}, {width}
torch._dynamo.config.recompile_limit = 4 * len(lengths)  # per size: a program per length, not eager past 8
torch.manual_seed(0)
model = TinyLM(vocab=256, width=width, length=high).to("pjrt")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step_fn = torch.compile(lambda ids, targets: lm_loss(model(ids), targets), backend="pjrt",
                        dynamic=None if kind == "bounded" else False)
g = torch.Generator().manual_seed(1)
batches = []
for t in lengths:
    ids = torch.randint(0, 256, (4, t), generator=g).to("pjrt")
    batches.append((ids, torch.roll(ids, -1, dims=1)))
position = [0]
torch_pjrt.synchronize()
torch_pjrt.reset_metrics()  # the batches' own programs (randint, roll) are not the step's

def step():
    ids, targets = batches[position[0] % len(batches)]
    position[0] += 1
    if kind == "bounded":
        torch._dynamo.mark_dynamic(ids, 1, min=2, max=high)
        torch._dynamo.mark_dynamic(targets, 1, min=2, max=high)
    opt.zero_grad(set_to_none=True)
    loss = step_fn(ids, targets)
    loss.backward()
    opt.step()
    return loss

def first_pass():
    for _ in lengths:
        step()

_, first = time_call(first_pass, "pjrt")
compiled = torch_pjrt.metrics()["compiles"]
_, seconds = time_loop(step, "pjrt", 1, repeats=len(lengths))
m = torch_pjrt.metrics()
[stats] = m["compiled"].values()
print(json.dumps({{"first_pass_s": first, "programs": compiled, "steady_compiles": m["compiles"] - compiled,
                  "median_ms": sorted(seconds)[len(seconds) // 2] * 1e3, "mean_ms": sum(seconds) / len(seconds) * 1e3,
                  "real": stats["bounded"]["real_elements"], "padded": stats["bounded"]["padded_elements"],
                  "bounded": stats["bounded"]["graphs"]}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, default=24, help="batches in the stream, lengths drawn in [2, max]")
    parser.add_argument("--max", type=int, default=128)
    parser.add_argument("--width", type=int, default=64)
    args = parser.parse_args()
    rng = random.Random(0)
    lengths = [rng.randint(2, args.max) for _ in range(args.lengths)]
    tests = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python")
    results = {}
    for kind in ("per size", "bounded"):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TORCH_PJRT_CACHE_DIR=os.path.join(cache, "pjrt"),
                       TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"))
            code = RUN.format(tests=tests, kind=kind, lengths=lengths, high=args.max, width=args.width)
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
            if out.returncode:
                sys.exit(f"{kind}: failed\n{out.stderr[-3000:]}")
            results[kind] = json.loads(out.stdout.strip().splitlines()[-1])
    distinct = len(set(lengths))
    print(f"{len(lengths)} training steps, {distinct} distinct lengths in [2, {args.max}] (mean "
          f"{sum(lengths) / len(lengths):.0f}), batch 4, width {args.width}; host: {os.cpu_count()} cores")
    print("| | first pass (s) | XLA compiles | steady state per step (ms, median) | padded / real input elements |")
    print("| --- | --- | --- | --- | --- |")
    for kind, r in results.items():
        ratio = f"{r['padded'] / r['real']:.2f}" if r["real"] else "1 (no padding)"
        print(f"| {kind} | {r['first_pass_s']:.1f} | {r['programs']} | {r['median_ms']:.1f} | {ratio} |")
    b, p = results["bounded"], results["per size"]
    print(f"bounded/per size: first pass {b['first_pass_s'] / p['first_pass_s']:.2f}x, steady state "
          f"{b['median_ms'] / p['median_ms']:.2f}x; {b['bounded']}")
    assert not b["steady_compiles"] and not p["steady_compiles"], results
    assert math.isfinite(b["median_ms"])


if __name__ == "__main__":
    main()
