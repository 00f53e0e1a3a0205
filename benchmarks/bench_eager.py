"""Eager benchmarks, measured side by side in one run (not a test).

  per-op overhead on tiny tensors vs PyTorch CPU eager: strict (one program per
  op, cache hit), fused (ops recorded, run as one program per loop body), and
  fused recording alone (no flush inside the timed loop)
  a tiny torch.compile'd function's per-call overhead: backend="pjrt" vs inductor
  on the CPU vs eager (pjrt strict, PyTorch CPU)
  1024x1024 matmul vs PyTorch CPU
  transformer training step vs PyTorch CPU
  first training step cold (empty disk cache) vs warm (second process, disk cache)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from models import TinyTransformer, synthetic_tokens  # noqa: E402

import torch_pjrt  # noqa: E402
from torch_pjrt.bench import time_loop  # noqa: E402


def per_call_us(fn, device: str, iters: int) -> float:
    return time_loop(fn, device, iters, warmup=20)[1][0] * 1e6


def recording_us(fn, iters: int) -> float:
    """Fused mode's cost of recording an op, flushes kept out of the timed loop."""
    policy = torch_pjrt.fusion_policy()
    torch_pjrt.set_fusion_policy(max_ops=iters + 100, detect_loops=False)
    try:
        with torch_pjrt.eager_mode("fused"):
            time_loop(fn, "pjrt", 20)  # warm-up, flushed
            _, (elapsed,) = time_loop(fn, None, iters)  # recorded, not flushed
            torch_pjrt.synchronize()
    finally:
        torch_pjrt.set_fusion_policy(max_ops=int(policy["max_ops"]), detect_loops=bool(policy["detect_loops"]))
    return elapsed * 1e6


def op_overhead() -> None:
    print("per-op eager overhead, 16-element float32 tensors (us/op, lower is better; ratios against cpu)")
    print(f"  {'op':<12}{'strict':>9}{'fused':>9}{'record':>9}{'cpu':>9}{'strict/cpu':>12}{'record/cpu':>12}")
    for name, fn in [("add", lambda a, b: a + b), ("mul_scalar", lambda a, b: a * 0.5),
                     ("relu", lambda a, b: torch.relu(a)), ("sum", lambda a, b: a.sum()),
                     ("add_", lambda a, b: a.add_(b)), ("view+add", lambda a, b: a.view(4, 4).t() + 1)]:
        res = {}
        for device in ("pjrt", "cpu"):
            a = torch.randn(16, device=device)
            b = torch.randn(16, device=device)
            res[device] = per_call_us(lambda: fn(a, b), device, 3000)
            if device == "pjrt":
                with torch_pjrt.eager_mode("fused"):
                    res["fused"] = per_call_us(lambda: fn(a, b), device, 3000)
                res["record"] = recording_us(lambda: fn(a, b), 3000)
        print(f"  {name:<12}{res['pjrt']:>9.2f}{res['fused']:>9.2f}{res['record']:>9.2f}{res['cpu']:>9.2f}"
              f"{res['pjrt'] / res['cpu']:>12.2f}{res['record'] / res['cpu']:>12.2f}")


def compiled_call_overhead() -> None:
    """f(x) = (x * 2 + 1).relu() on 16 elements: what one call of a compiled function costs."""
    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * 2 + 1).relu()

    res = {}
    for name, device, fn in (("pjrt compiled", "pjrt", torch.compile(f, backend="pjrt", dynamic=False)),
                             ("pjrt strict eager", "pjrt", f),
                             ("cpu inductor", "cpu", torch.compile(f, backend="inductor", dynamic=False)),
                             ("cpu eager", "cpu", f)):
        x = torch.randn(16, device=device)
        res[name] = per_call_us(lambda: fn(x), device, 3000)
    print("tiny compiled function, (x * 2 + 1).relu() on 16 elements, µs per call: "
          + "   ".join(f"{k} {v:.1f}" for k, v in res.items()))


def matmul() -> None:
    res = {}
    for device in ("pjrt", "cpu"):
        a = torch.randn(1024, 1024, device=device)
        b = torch.randn(1024, 1024, device=device)
        res[device] = per_call_us(lambda: a @ b, device, 20) / 1e3
    gf = {k: 2 * 1024**3 / (v / 1e3) / 1e9 for k, v in res.items()}
    print(f"matmul 1024x1024 f32: pjrt {res['pjrt']:.2f} ms ({gf['pjrt']:.0f} GFLOP/s)   "
          f"cpu {res['cpu']:.2f} ms ({gf['cpu']:.0f} GFLOP/s)")


def train_step_time(device: str, steps: int = 10) -> float:
    torch.manual_seed(0)
    model = TinyTransformer(vocab=256, dim=128, heads=4, layers=2, seq=64).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = (t.to(device) for t in synthetic_tokens(8, 64, 256))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x).view(-1, 256), y.view(-1)).backward()
        opt.step()

    return time_loop(step, device, steps, warmup=3)[1][0] * 1e3


FIRST_STEP = """
import json, os, sys
sys.path.insert(0, {examples!r})
import torch, torch.nn.functional as F, torch_pjrt
from torch_pjrt.bench import time_call
from models import TinyTransformer, synthetic_tokens
torch.manual_seed(0)
model = TinyTransformer(vocab=256, dim=128, heads=4, layers=2, seq=64).to("pjrt")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = (t.to("pjrt") for t in synthetic_tokens(8, 64, 256))
def step():
    opt.zero_grad()
    F.cross_entropy(model(x).view(-1, 256), y.view(-1)).backward()
    opt.step()
_, first = time_call(step, "pjrt")
m = torch_pjrt.metrics()
print(json.dumps({{"first_step_s": first, "compiles": m["compiles"], "disk_hits": m["disk_cache_hits"]}}))
"""


def cold_vs_warm() -> None:
    examples = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCH_PJRT_CACHE_DIR=cache)
        runs = []
        for _ in range(2):
            r = subprocess.run([sys.executable, "-c", FIRST_STEP.format(examples=examples)], capture_output=True,
                               text=True, env=env, timeout=600)
            runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    print(f"first training step: cold {cold['first_step_s']:.2f} s ({cold['compiles']} compiles)   "
          f"warm {warm['first_step_s']:.2f} s ({warm['compiles']} compiles, {warm['disk_hits']} disk hits)   "
          f"speed-up {cold['first_step_s'] / warm['first_step_s']:.1f}x")


def main() -> None:
    torch.set_num_threads(os.cpu_count() or 1)
    print(f"torch {torch.__version__}, pjrt plugin: {torch_pjrt.platform()['platform']}, "
          f"{torch.get_num_threads()} CPU threads")
    op_overhead()
    compiled_call_overhead()
    matmul()
    dev_ms, cpu_ms = train_step_time("pjrt"), train_step_time("cpu")
    with torch_pjrt.eager_mode("fused"):
        fused_ms = train_step_time("pjrt")
    print(f"transformer training step (2 layers, d=128, 8x64 tokens): pjrt strict {dev_ms:.1f} ms   "
          f"fused {fused_ms:.1f} ms   cpu {cpu_ms:.1f} ms   strict/cpu {dev_ms / cpu_ms:.2f}   "
          f"fused/cpu {fused_ms / cpu_ms:.2f}")
    cold_vs_warm()


if __name__ == "__main__":
    main()
