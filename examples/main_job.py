"""Main job: a GPT-style transformer trained on pjrt the way a user should run it, then
every way of running it side by side.

1. Training: `torch.compile(backend="pjrt")` (the forward, AOTAutograd's backward and the
   AdamW step as whole programs), next to the same model in CPU PyTorch eager from the
   same initial weights; the loss of every step on both, and how far apart they are.
2. Speed: `torch_pjrt.bench` on the same step: pjrt compiled, fused and strict eager,
   CPU eager and CPU inductor, one after another in this process; cold start (the first
   step alone) separately from the steady state (median of timed steps, each ending in a
   device sync). The table and a plot are written to --out.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

import torch_pjrt
from torch_pjrt import bench
from torch_pjrt._bench_steps import MODELS, gpt_step


def log(line: str) -> None:
    print(line, flush=True)


def losses_of(device: str, backend: str | None, steps: int) -> list[float]:
    """Per-step losses of the bench's GPT step (model, data and AdamW seeded alike), with progress lines."""
    step = gpt_step(device, backend)
    losses = []
    for i in range(steps):
        start = time.perf_counter()
        losses.append(float(step().cpu()))  # one host read per step, as a training loop logs
        if i == 0 or (i + 1) % 10 == 0 or i + 1 == steps:
            note = " (the first step traces and compiles)" if i == 0 and backend else ""
            log(f"  {device}{' compiled' if backend else ' eager'}: step {i + 1}/{steps}, loss {losses[-1]:.4f}, "
                f"{(time.perf_counter() - start) * 1e3:.0f} ms{note}")
    return losses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30, help="training steps compared with the CPU")
    p.add_argument("--targets", default="compiled,fused,strict,cpu,inductor", help="bench targets")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", default="build/main_job", help="directory for the table (.md, .json) and plot (.png)")
    args = p.parse_args()
    info = torch_pjrt.platform()
    log(f"pjrt: {info['platform']} {info['platform_version']} (PJRT C API {info['pjrt_c_api']}); "
        f"torch {torch.__version__}; {os.cpu_count()} CPU cores")

    log(f"1. Training {args.steps} steps: pjrt compiled and CPU eager, same initial weights")
    torch_pjrt.reset_metrics()
    with torch_pjrt.eager_mode("fused"):
        dev_losses = losses_of("pjrt", "pjrt", args.steps)
    m = torch_pjrt.metrics()
    cpu_losses = losses_of("cpu", None, args.steps)
    log(f"{'step':>5} {'pjrt loss':>10} {'cpu loss':>10}")
    for i, (a, b) in enumerate(zip(dev_losses, cpu_losses)):
        if i % 5 == 0 or i == len(dev_losses) - 1:
            log(f"{i + 1:>5} {a:>10.4f} {b:>10.4f}")
    worst = max(abs(a - b) / abs(b) for a, b in zip(dev_losses, cpu_losses))
    fallbacks = sum(m["fallbacks"].values())
    log(f"max relative loss difference pjrt vs CPU float32: {worst:.1e}; programs compiled: {m['compiles']} "
        f"(+{m['disk_cache_hits']} from the disk cache); CPU fallbacks: {fallbacks}")

    log(f"2. Speed: {args.targets} ({args.warmup} warm-up and {args.iters} timed steps each)")
    make_step, tokens = MODELS["gpt"]
    results = bench.benchmark(make_step, bench.standard_targets(args.targets.split(",")), args.warmup, args.iters,
                              tokens, progress=lambda line: log(f"  {line}"))
    table = bench.to_markdown(results, "cpu eager")
    os.makedirs(args.out, exist_ok=True)
    md, png, js = (os.path.join(args.out, f"gpt_step.{ext}") for ext in ("md", "png", "json"))
    with open(md, "w") as f:
        f.write(table)
    bench.to_json(results, js)
    bench.plot(results, png, "GPT-style training step (4 layers, d=128, 8x64 tokens)")
    log("")
    log(table)
    by_name = {r.target.name: r for r in results}
    best = min((r for r in results if r.target.device != "cpu"), key=lambda r: r.median_ms, default=None)
    cpu = by_name.get("cpu eager")
    if best is not None and cpu is not None and best.tokens_per_s and cpu.tokens_per_s:
        log(f"steady-state tokens/s: {best.target.name} {best.tokens_per_s:,.0f}   cpu eager "
            f"{cpu.tokens_per_s:,.0f}   ratio {best.tokens_per_s / cpu.tokens_per_s:.2f}")
    log(f"table: {md}   plot: {png}   results: {js}")
    if worst > 1e-2 or fallbacks:  # the doctor's parity bound
        sys.exit("main job: pjrt's losses left the CPU's, or ops fell back to the CPU (see above)")


if __name__ == "__main__":
    main()
