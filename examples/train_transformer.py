"""Main job: train a small GPT-style transformer on the pjrt device, next to CPU PyTorch.

Prints the loss per step on both, steady-state tokens/s for both, and the
pjrt compile and CPU-fallback counts.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import torch
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(__file__))
from models import TinyTransformer, synthetic_tokens  # noqa: E402

import torch_pjrt  # noqa: E402  (also autoloaded by `import torch`)


def train(model: torch.nn.Module, device: str, steps: int, batch: int, seq: int, vocab: int,
          warmup: int) -> tuple[list[float], float]:
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x, y = synthetic_tokens(batch, seq, vocab)
    x, y = x.to(device), y.to(device)
    losses: list[float] = []
    start = 0.0
    for step in range(steps):
        if step == warmup:
            torch.accelerator.synchronize() if device != "cpu" else None
            start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, vocab), y.view(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())  # a sync point, as in most training loops
    elapsed = time.perf_counter() - start
    tokens_per_s = batch * seq * (steps - warmup) / elapsed
    return losses, tokens_per_s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--mode", choices=["strict", "fused", "debug"], default=None,
                   help="eager mode on pjrt (default: TORCH_PJRT_EAGER_MODE, else strict)")
    args = p.parse_args()
    if args.mode:
        torch_pjrt.set_eager_mode(args.mode)

    torch.manual_seed(0)
    model = TinyTransformer(vocab=args.vocab, dim=args.dim, heads=4, layers=args.layers, seq=args.seq)
    info = torch_pjrt.platform()
    print(f"pjrt platform: {info['platform']} {info['platform_version']} (PJRT C API {info['pjrt_c_api']}), "
          f"eager mode: {torch_pjrt.eager_mode()}")
    torch_pjrt.reset_metrics()
    dev_losses, dev_tps = train(copy.deepcopy(model), "pjrt", args.steps, args.batch, args.seq, args.vocab,
                                args.warmup)
    m = torch_pjrt.metrics()
    cpu_losses, cpu_tps = train(copy.deepcopy(model), "cpu", args.steps, args.batch, args.seq, args.vocab,
                                args.warmup)
    print(f"{'step':>4} {'pjrt loss':>10} {'cpu loss':>10}")
    for i, (a, b) in enumerate(zip(dev_losses, cpu_losses)):
        if i % 5 == 0 or i == len(dev_losses) - 1:
            print(f"{i:>4} {a:>10.4f} {b:>10.4f}")
    print(f"steady-state tokens/s: pjrt {dev_tps:,.0f}   cpu (PyTorch eager) {cpu_tps:,.0f}   "
          f"ratio {dev_tps / cpu_tps:.2f}")
    fallbacks = m["fallbacks"]
    print(f"compiles: {m['compiles']} ({m['compile_seconds']:.1f} s), disk cache hits: {m['disk_cache_hits']}, "
          f"programs run: {m['executions']} ({m['ops_recorded']} ops recorded), "
          f"CPU fallbacks: {sum(fallbacks.values())} calls {dict(fallbacks) if fallbacks else ''}")
    print(f"max |loss difference|: {max(abs(a - b) for a, b in zip(dev_losses, cpu_losses)):.2e}")


if __name__ == "__main__":
    main()
