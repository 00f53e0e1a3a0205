"""Model training-step benchmark, pjrt next to plain CPU PyTorch eager, in one run (not a test).

Each row trains the same seeded model on both devices: warm-up steps (compiles,
cache fill), then N timed steps, each ending in a device synchronize; the table
shows the median step time and the pjrt / CPU ratio (above 1: pjrt is slower).

  .venv/bin/python benchmarks/bench_models.py [--steps N] [--warmup N] [--threads N]

CPU eager uses torch.get_num_threads() intra-op threads (printed; --threads sets
it). On a loaded machine, OpenMP threads that wait on busy cores inflate the CPU
column a lot: compare runs made on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from models import SmallCNN, TinyTransformer, synthetic_images, synthetic_tokens  # noqa: E402

import torch_pjrt  # noqa: E402


def sync(device: str) -> None:
    if device != "cpu":
        torch_pjrt.synchronize()


def gpt_step(device: str, autocast: bool = False, attention: str = "sdpa",
             tied: bool = False) -> Callable[[], None]:
    vocab, seq = 256, 64
    torch.manual_seed(0)
    model = TinyTransformer(vocab=vocab, dim=128, heads=4, layers=4, seq=seq, attention=attention,
                            tied=tied).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = (t.to(device) for t in synthetic_tokens(8, seq, vocab))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            loss = F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        opt.step()

    return step


def cnn_step(device: str) -> Callable[[], None]:
    torch.manual_seed(0)
    model = SmallCNN(width=32).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = (t.to(device) for t in synthetic_images(32, size=32))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def median_ms(make: Callable[[str], Callable[[], None]], device: str, warmup: int, steps: int) -> float:
    step = make(device)
    for _ in range(warmup):
        step()
    sync(device)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


ROWS: list[tuple[str, Callable[[str], Callable[[], None]]]] = [
    ("GPT 4x128, sdpa, f32", lambda d: gpt_step(d)),
    ("GPT 4x128, mha+tied, f32", lambda d: gpt_step(d, attention="mha", tied=True)),
    ("GPT 4x128, sdpa, autocast bf16", lambda d: gpt_step(d, autocast=True)),
    ("SmallCNN w32, 32x3x32x32, f32", cnn_step),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, pjrt plugin: {torch_pjrt.platform()['platform']}, "
          f"torch.get_num_threads() = {torch.get_num_threads()} (CPU eager and CPU fallbacks), "
          f"os.cpu_count() = {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    print(f"train step (forward, backward, optimizer), batch as in the source; "
          f"median of {args.steps} steps after {args.warmup} warm-up steps")
    print(f"  {'model':<32}{'pjrt ms':>10}{'cpu ms':>10}{'ratio':>8}   pjrt CPU fallbacks")
    for name, make in ROWS:
        cpu_ms = median_ms(make, "cpu", args.warmup, args.steps)
        torch_pjrt.reset_metrics()
        try:
            dev_ms = median_ms(make, "pjrt", args.warmup, args.steps)
        except Exception as e:  # an op the device cannot run yet: show it, keep going
            print(f"  {name:<32}{'failed':>10}{cpu_ms:>10.1f}{'':>8}   {type(e).__name__}: {str(e)[:80]}")
            continue
        fallbacks = torch_pjrt.metrics()["fallbacks"]
        fb = ", ".join(f"{op.removeprefix('aten::')}" for op in sorted(fallbacks)) or "none"
        print(f"  {name:<32}{dev_ms:>10.1f}{cpu_ms:>10.1f}{dev_ms / cpu_ms:>8.2f}   {fb}")


if __name__ == "__main__":
    main()
