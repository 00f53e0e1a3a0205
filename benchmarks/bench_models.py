"""Model training-step benchmark: pjrt strict eager, pjrt fused eager and plain
CPU PyTorch eager side by side, in one run (not a test).

Each row trains the same seeded model in each mode: warm-up steps (compiles,
cache fill), then N timed steps, each ending in a real device synchronize;
the table shows median step times, fused/cpu (above 1: pjrt is slower than
CPU eager), strict/fused (the fused speed-up), and the compiles fused mode did
during the timed steps (0: it settled on cached programs).

  .venv/bin/python benchmarks/bench_models.py [--steps N] [--warmup N] [--threads N] [--rows "GPT;CNN"]

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
from models import MLP, SmallCNN, TinyTransformer, synthetic_images, synthetic_tokens  # noqa: E402

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


def classifier_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                    y: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def cnn_step(device: str) -> Callable[[], None]:
    torch.manual_seed(0)
    model = SmallCNN(width=32).to(device)
    x, y = (t.to(device) for t in synthetic_images(32, size=32))
    return classifier_step(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), x, y)


def mlp_step(device: str) -> Callable[[], None]:
    torch.manual_seed(0)
    model = MLP().to(device)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 32, generator=g).to(device), torch.randint(0, 10, (64,), generator=g).to(device)
    return classifier_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), x, y)


def hf_gpt2_step(device: str) -> Callable[[], None]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=128, n_layer=2, n_head=4,
                                  attn_implementation="sdpa")
    model = transformers.GPT2LMHeadModel(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 256, (8, 64), generator=torch.Generator().manual_seed(1)).to(device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()

    return step


def median_ms(make: Callable[[str], Callable[[], None]], device: str, warmup: int, steps: int,
              after_warmup: Callable[[], None] = lambda: None) -> float:
    step = make(device)
    for _ in range(warmup):
        step()
    sync(device)
    after_warmup()
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
    ("MLP 32-64-10, batch 64, AdamW", mlp_step),
    ("SmallCNN w32, 32x3x32x32, f32", cnn_step),
    ("HF GPT-2 2x128, 8x64 tokens", hf_gpt2_step),
]


def pjrt_ms(make: Callable[[str], Callable[[], None]], mode: str, warmup: int, steps: int) -> tuple[float, int, str]:
    """Median step time in `mode`, compiles during the timed steps, CPU fallbacks."""
    with torch_pjrt.eager_mode(mode):
        ms = median_ms(make, "pjrt", warmup, steps, after_warmup=torch_pjrt.reset_metrics)
    m = torch_pjrt.metrics()
    fallbacks = ", ".join(op.removeprefix("aten::") for op in sorted(m["fallbacks"])) or "none"
    return ms, m["compiles"], fallbacks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--rows", default="", help="semicolon-separated substrings of the rows to run")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, pjrt plugin: {torch_pjrt.platform()['platform']}, "
          f"torch.get_num_threads() = {torch.get_num_threads()} (CPU eager and CPU fallbacks), "
          f"os.cpu_count() = {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    print(f"train step (forward, backward, optimizer), batch as in the source; "
          f"median of {args.steps} steps after {args.warmup} warm-up steps")
    print(f"  {'model':<32}{'strict':>9}{'fused':>9}{'cpu':>9}{'fused/cpu':>11}{'strict/fused':>14}"
          f"{'fused compiles':>16}   CPU fallbacks")
    for name, make in ROWS:
        if args.rows and not any(r.lower() in name.lower() for r in args.rows.split(";")):
            continue
        cpu_ms = median_ms(make, "cpu", args.warmup, args.steps)
        try:
            strict_ms, _, fb = pjrt_ms(make, "strict", args.warmup, args.steps)
            fused_ms, compiles, fb_fused = pjrt_ms(make, "fused", args.warmup, args.steps)
        except Exception as e:  # an op the device cannot run yet: show it, keep going
            print(f"  {name:<32}{'failed':>9}{'':>9}{cpu_ms:>9.1f}   {type(e).__name__}: {str(e)[:80]}")
            continue
        print(f"  {name:<32}{strict_ms:>9.1f}{fused_ms:>9.1f}{cpu_ms:>9.1f}{fused_ms / cpu_ms:>11.2f}"
              f"{strict_ms / fused_ms:>14.2f}{compiles:>16}   {fb if fb == fb_fused else fb + ' / ' + fb_fused}")


if __name__ == "__main__":
    main()
