"""Model training-step benchmark: pjrt strict eager, pjrt fused eager and plain
CPU PyTorch eager side by side, in one run (not a test).

Each row trains the same seeded model in each mode through torch_pjrt.bench:
the first step timed alone, warm-up steps (compiles, cache fill), then N timed
steps, each ending in a real device synchronize; a mode that compiled or fell
back to the CPU while timed is flagged under its row. The table shows median
step times, compiled/inductor (above 1: pjrt is slower), and the programs fused
and compiled mode compiled during the timed steps (0: they settled on cached
programs).

  .venv/bin/python benchmarks/bench_models.py [--steps N] [--warmup N] [--threads N] [--rows "GPT;CNN"]
      [--no-compile] [--no-cold]

CPU eager uses torch.get_num_threads() intra-op threads (printed; --threads sets
it). On a loaded machine, OpenMP threads that wait on busy cores inflate the CPU
column a lot: compare runs made on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from models import TinyTransformer, synthetic_tokens  # noqa: E402

import torch_pjrt  # noqa: E402
from torch_pjrt._bench_steps import cnn_step, gpt_step, hf_gpt2_step, mlp_step  # noqa: E402
from torch_pjrt.bench import Result, benchmark, percentiles_ms, standard_targets, sync, time_call  # noqa: E402


Make = Callable[..., Callable[[], None]]  # make(device, backend=None) -> step


ROWS: list[tuple[str, Make]] = [
    ("GPT 4x128, sdpa, f32", lambda d, backend=None: gpt_step(d, backend)),
    ("GPT 4x128, mha+tied, f32", lambda d, backend=None: gpt_step(d, backend, attention="mha", tied=True)),
    ("GPT 4x128, sdpa, autocast bf16", lambda d, backend=None: gpt_step(d, backend, autocast=True)),
    ("MLP 32-64-10, batch 64, AdamW", mlp_step),
    ("SmallCNN w32, 32x3x32x32, f32", cnn_step),
    ("HF GPT-2 2x128, 8x64 tokens", hf_gpt2_step),
]


def median(res: dict[str, Result], key: str) -> float:
    return res[key].median_ms if key in res else float("nan")


def compiles(res: dict[str, Result], key: str) -> int:
    return res[key].compiles if key in res else 0


def fallbacks(r: Result) -> str:
    return ", ".join(op.removeprefix("aten::") for op in sorted(r.fallbacks or {})) or "none"


def gpt_parts_ms(backend: str, device: str, steps: int) -> dict[str, float]:
    """The GPT step's compiled forward, backward and (capturable) AdamW update, each
    timed alone between syncs: where a compiled step spends its time."""
    torch._dynamo.reset()
    vocab, seq = 256, 64
    torch.manual_seed(0)
    model = TinyTransformer(vocab=vocab, dim=128, heads=4, layers=4, seq=seq).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=device != "cpu")
    x, y = (t.to(device) for t in synthetic_tokens(8, seq, vocab))
    forward = torch.compile(lambda: F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1)),
                            backend=backend, dynamic=False)
    update = torch.compile(opt.step, backend=backend, dynamic=False)
    times: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}
    for i in range(steps + 5):
        opt.zero_grad(set_to_none=True)
        sync(device)
        loss, forward_s = time_call(forward, device)
        _, backward_s = time_call(loss.backward, device)
        _, update_s = time_call(update, device)
        if i >= 5:
            for k, dt in zip(times, (forward_s, backward_s, update_s)):
                times[k].append(dt)
    return {k: percentiles_ms(v)[0] for k, v in times.items()}


def first_step_ms(row: str, mode: str) -> None:
    """Child process: the time of the very first step (Dynamo tracing, lowering, XLA or inductor compile)."""
    make = next(make for name, make in ROWS if name == row)
    device = "cpu" if mode == "inductor" else "pjrt"
    backend = {"compiled": "pjrt", "inductor": "inductor"}.get(mode)
    with torch_pjrt.eager_mode("fused" if mode == "compiled" else "strict"):  # modes: compiled, inductor
        _, seconds = time_call(lambda: make(device, backend=backend)(), device)
    print(f"first_step_ms {seconds * 1e3:.1f} compiles {torch_pjrt.metrics()['compiles']}")


def cold_and_warm(row: str, mode: str) -> tuple[float, float]:
    """First-step time in a fresh process with empty caches (cold), then in a second one
    that finds the first's caches on disk (warm)."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCH_PJRT_CACHE_DIR=os.path.join(cache, "pjrt"),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"))
        times = []
        for _ in range(2):
            out = subprocess.run([sys.executable, __file__, "--first-step", row, "--mode", mode], env=env,
                                 capture_output=True, text=True, timeout=900)
            line = [x for x in out.stdout.splitlines() if x.startswith("first_step_ms")]
            if out.returncode != 0 or not line:
                raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "no output")
            times.append(float(line[-1].split()[1]))
    return times[0], times[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--rows", default="", help="semicolon-separated substrings of the rows to run")
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled and inductor columns")
    parser.add_argument("--baseline-device", default="cpu",
                        help="device of the PyTorch eager and inductor columns (cuda on a GPU machine)")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold/warm first-step table")
    parser.add_argument("--no-parts", action="store_true", help="skip the GPT forward/backward/optimizer split")
    parser.add_argument("--first-step", default="", help=argparse.SUPPRESS)  # child process of cold_and_warm
    parser.add_argument("--mode", default="compiled", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.first_step:
        first_step_ms(args.first_step, args.mode)
        return
    print(f"torch {torch.__version__}, pjrt plugin: {torch_pjrt.platform()['platform']}, "
          f"torch.get_num_threads() = {torch.get_num_threads()} (CPU eager and CPU fallbacks), "
          f"os.cpu_count() = {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    print(f"train step (forward, backward, optimizer), batch as in the source; median ms of {args.steps} "
          f"steps after {args.warmup} warm-up steps. compiled: torch.compile(backend='pjrt') of the loss "
          f"(forward + backward) and of optimizer.step; inductor: the same on the CPU")
    base = args.baseline_device
    print(f"  {'model':<32}{'strict':>9}{'fused':>9}{'compiled':>9}{base:>9}{'inductor':>9}"
          f"{'compiled/inductor':>19}{'steady compiles':>17}   CPU fallbacks")
    rows = [(name, make) for name, make in ROWS
            if not args.rows or any(r.lower() in name.lower() for r in args.rows.split(";"))]
    keys = ["strict", "fused", "cpu"] + ([] if args.no_compile else ["compiled", "inductor"])
    targets = standard_targets(keys, base)
    for name, make in rows:
        try:
            res = dict(zip(keys, benchmark(make, targets, args.warmup, args.steps)))
        except Exception as e:  # an op the device cannot run yet: show it, keep going
            print(f"  {name:<32}{'failed':>9}   {type(e).__name__}: {str(e)[:100]}")
            continue
        times = "".join(f"{median(res, k):>9.1f}" for k in ("strict", "fused", "compiled", "cpu", "inductor"))
        steady = f"{compiles(res, 'fused')} / {compiles(res, 'compiled')}"
        print(f"  {name:<32}{times}{median(res, 'compiled') / median(res, 'inductor'):>19.2f}{steady:>17}   "
              f"{fallbacks(res['strict'])}")
        flagged = [f"{r.target.name}: {'; '.join(r.flags)}" for r in res.values() if r.flags]
        if flagged:
            print(f"  {'':<32}flagged: " + " | ".join(flagged))
    if not (args.no_parts or args.no_compile) and any(n.startswith("GPT 4x128, sdpa, f32") for n, _ in rows):
        pjrt_parts = gpt_parts_ms("pjrt", "pjrt", args.steps)
        base_parts = gpt_parts_ms("inductor", base, args.steps)
        print("GPT 4x128 sdpa f32, compiled step split (ms, each part timed alone between syncs; "
              "AdamW capturable on pjrt): " + "   ".join(
                  f"{k} pjrt {pjrt_parts[k]:.1f} / inductor {base_parts[k]:.1f}" for k in pjrt_parts))
    if args.no_cold or args.no_compile or base != "cpu":
        return
    print("first step (s), a fresh process: cold = empty compile caches, warm = a second process "
          "reading the first one's caches from disk")
    print(f"  {'model':<32}{'compiled cold':>15}{'warm':>8}{'inductor cold':>15}{'warm':>8}")
    for name, _ in rows:
        if not name.startswith(("GPT 4x128, sdpa, f32", "HF GPT-2")):
            continue
        try:
            pc, pw = cold_and_warm(name, "compiled")
            ic, iw = cold_and_warm(name, "inductor")
        except Exception as e:  # noqa: BLE001
            print(f"  {name:<32} failed: {e}")
            continue
        print(f"  {name:<32}{pc / 1e3:>15.2f}{pw / 1e3:>8.2f}{ic / 1e3:>15.2f}{iw / 1e3:>8.2f}")


if __name__ == "__main__":
    main()
