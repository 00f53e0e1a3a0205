"""Model training-step benchmark: pjrt strict eager, pjrt fused eager and plain
CPU PyTorch eager side by side, in one run (not a test).

Each row trains the same seeded model in each mode: warm-up steps (compiles,
cache fill), then N timed steps, each ending in a real device synchronize;
the table shows median step times, fused/cpu (above 1: pjrt is slower than
CPU eager), strict/fused (the fused speed-up), and the compiles fused mode did
during the timed steps (0: it settled on cached programs).

  .venv/bin/python benchmarks/bench_models.py [--steps N] [--warmup N] [--threads N] [--rows "GPT;CNN"]
      [--no-compile] [--no-cold]

CPU eager uses torch.get_num_threads() intra-op threads (printed; --threads sets
it). On a loaded machine, OpenMP threads that wait on busy cores inflate the CPU
column a lot: compare runs made on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from models import MLP, SmallCNN, TinyTransformer, synthetic_images, synthetic_tokens  # noqa: E402

import torch_pjrt  # noqa: E402


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
    elif device != "cpu":
        torch_pjrt.synchronize()


def training_step(loss: Callable[[], torch.Tensor], opt: torch.optim.Optimizer,
                  backend: str | None) -> Callable[[], None]:
    """One step: zero_grad, loss().backward(), opt.step(). With a torch.compile backend,
    the loss (forward, and through AOTAutograd the backward) and the optimizer step
    are compiled; zero_grad and backward()'s call stay eager, as in user code. For
    pjrt, the optimizer is capturable (its step count on the device, as Dynamo does for
    CUDA by itself): a CPU step count would be read back from the device every step."""
    if backend == "pjrt":
        for group in opt.param_groups:
            if "capturable" in group:
                group["capturable"] = True
    forward = torch.compile(loss, backend=backend, dynamic=False) if backend else loss
    update = torch.compile(opt.step, backend=backend, dynamic=False) if backend else opt.step

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        forward().backward()
        update()

    return step


def gpt_step(device: str, backend: str | None = None, autocast: bool = False, attention: str = "sdpa",
             tied: bool = False) -> Callable[[], None]:
    vocab, seq = 256, 64
    torch.manual_seed(0)
    model = TinyTransformer(vocab=vocab, dim=128, heads=4, layers=4, seq=seq, attention=attention,
                            tied=tied).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = (t.to(device) for t in synthetic_tokens(8, seq, vocab))

    def loss() -> torch.Tensor:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            return F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))

    return training_step(loss, opt, backend)


def classifier_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                    y: torch.Tensor, backend: str | None) -> Callable[[], None]:
    return training_step(lambda: F.cross_entropy(model(x), y), opt, backend)


def cnn_step(device: str, backend: str | None = None) -> Callable[[], None]:
    torch.manual_seed(0)
    model = SmallCNN(width=32).to(device)
    x, y = (t.to(device) for t in synthetic_images(32, size=32))
    return classifier_step(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), x, y, backend)


def mlp_step(device: str, backend: str | None = None) -> Callable[[], None]:
    torch.manual_seed(0)
    model = MLP().to(device)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 32, generator=g).to(device), torch.randint(0, 10, (64,), generator=g).to(device)
    return classifier_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), x, y, backend)


def hf_gpt2_step(device: str, backend: str | None = None) -> Callable[[], None]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=128, n_layer=2, n_head=4,
                                  attn_implementation="sdpa")
    model = transformers.GPT2LMHeadModel(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 256, (8, 64), generator=torch.Generator().manual_seed(1)).to(device)
    return training_step(lambda: model(input_ids=ids, labels=ids).loss, opt, backend)


Make = Callable[..., Callable[[], None]]  # make(device, backend=None) -> step


def median_ms(make: Make, device: str, warmup: int, steps: int,
              after_warmup: Callable[[], None] = lambda: None, backend: str | None = None) -> float:
    torch._dynamo.reset()
    step = make(device, backend=backend)
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


ROWS: list[tuple[str, Make]] = [
    ("GPT 4x128, sdpa, f32", lambda d, backend=None: gpt_step(d, backend)),
    ("GPT 4x128, mha+tied, f32", lambda d, backend=None: gpt_step(d, backend, attention="mha", tied=True)),
    ("GPT 4x128, sdpa, autocast bf16", lambda d, backend=None: gpt_step(d, backend, autocast=True)),
    ("MLP 32-64-10, batch 64, AdamW", mlp_step),
    ("SmallCNN w32, 32x3x32x32, f32", cnn_step),
    ("HF GPT-2 2x128, 8x64 tokens", hf_gpt2_step),
]


def pjrt_ms(make: Make, mode: str, warmup: int, steps: int) -> tuple[float, int, str]:
    """Median step time in `mode` ("strict", "fused", or "compiled": backend="pjrt" with
    fused eager around it), compiles during the timed steps, CPU fallbacks."""
    backend = "pjrt" if mode == "compiled" else None
    with torch_pjrt.eager_mode("fused" if mode == "compiled" else mode):
        ms = median_ms(make, "pjrt", warmup, steps, after_warmup=torch_pjrt.reset_metrics, backend=backend)
    m = torch_pjrt.metrics()
    fallbacks = ", ".join(op.removeprefix("aten::") for op in sorted(m["fallbacks"])) or "none"
    return ms, m["compiles"], fallbacks


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
        t0 = time.perf_counter()
        loss = forward()
        sync(device)
        t1 = time.perf_counter()
        loss.backward()
        sync(device)
        t2 = time.perf_counter()
        update()
        sync(device)
        t3 = time.perf_counter()
        if i >= 5:
            for k, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
                times[k].append(dt)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def first_step_ms(row: str, mode: str) -> None:
    """Child process: the time of the very first step (Dynamo tracing, lowering, XLA or inductor compile)."""
    make = next(make for name, make in ROWS if name == row)
    device = "cpu" if mode == "inductor" else "pjrt"
    backend = {"compiled": "pjrt", "inductor": "inductor"}.get(mode)
    with torch_pjrt.eager_mode("fused" if mode == "compiled" else "strict"):  # modes: compiled, inductor
        start = time.perf_counter()
        step = make(device, backend=backend)
        step()
        sync(device)
    print(f"first_step_ms {(time.perf_counter() - start) * 1e3:.1f} compiles {torch_pjrt.metrics()['compiles']}")


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
    for name, make in rows:
        cpu_ms = median_ms(make, args.baseline_device, args.warmup, args.steps)
        inductor_ms = float("nan")
        try:
            strict_ms, _, fb = pjrt_ms(make, "strict", args.warmup, args.steps)
            fused_ms, compiles, _ = pjrt_ms(make, "fused", args.warmup, args.steps)
            compiled_ms, compiled_compiles = float("nan"), 0
            if not args.no_compile:
                compiled_ms, compiled_compiles, _ = pjrt_ms(make, "compiled", args.warmup, args.steps)
                inductor_ms = median_ms(make, args.baseline_device, args.warmup, args.steps, backend="inductor")
        except Exception as e:  # an op the device cannot run yet: show it, keep going
            print(f"  {name:<32}{'failed':>9}   {type(e).__name__}: {str(e)[:100]}")
            continue
        print(f"  {name:<32}{strict_ms:>9.1f}{fused_ms:>9.1f}{compiled_ms:>9.1f}{cpu_ms:>9.1f}{inductor_ms:>9.1f}"
              f"{compiled_ms / inductor_ms:>19.2f}{f'{compiles} / {compiled_compiles}':>17}   {fb}")
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
