"""float8 against bfloat16 and float32, side by side in one run (not a test).

A matmul ([M, K] @ [K, N]: float32, bfloat16, and torch._scaled_mm on float8_e4m3fn
operands with tensor-wise scales and a bfloat16 result), then a training step of an MLP
(float32, bfloat16 parameters, and torchao's float8 training with the tensorwise recipe),
each on the CPU (PyTorch's kernels) and on pjrt (torch.compile(backend="pjrt")). Each timed
loop ends in a real device sync (torch_pjrt.bench.time_loop).

On the CPU plugin float8 is emulated (XLA's CPU compiler widens it to float32), as is
bfloat16 arithmetic: the figures show the path works and what it costs here; the point of
float8 is a GPU or TPU, where the same programs run on float8 units.

  .venv/bin/python benchmarks/bench_float8.py [--size 1024] [--iters 20]
"""

from __future__ import annotations

import argparse
import copy

import torch

import torch_pjrt  # noqa: F401  (registers the device)
from torch_pjrt.bench import time_loop

DEVICE = torch_pjrt.DEVICE_NAME


def matmul_step(device: str, kind: str, n: int) -> tuple[object, ...]:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    if kind == "float8":
        fa = a.to(torch.float8_e4m3fn).to(device)
        fb = b.t().contiguous().to(torch.float8_e4m3fn).t().to(device)  # column-major, as _scaled_mm wants it
        one = torch.tensor(1.0, device=device)

        def run(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch._scaled_mm(x, y, one, one, out_dtype=torch.bfloat16)
        args = (fa, fb)
    else:
        dtype = torch.float32 if kind == "float32" else torch.bfloat16
        args = (a.to(dtype).to(device), b.to(dtype).to(device))

        def run(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x @ y
    fn = torch.compile(run, backend="pjrt") if device == DEVICE else run
    return fn, args


def training_step(device: str, kind: str, width: int) -> object:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.ReLU(), torch.nn.Linear(4 * width, width))
    model = copy.deepcopy(model).to(device)
    if kind == "bfloat16":
        model = model.to(torch.bfloat16)
    elif kind == "float8":
        from torchao.float8 import convert_to_float8_training
        model = convert_to_float8_training(model)
    forward = torch.compile(model, backend="pjrt") if device == DEVICE else model
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    dtype = torch.bfloat16 if kind == "bfloat16" else torch.float32
    x = torch.randn(256, width, generator=torch.Generator().manual_seed(1)).to(dtype).to(device)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = forward(x).float().square().mean()
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, default=1024, help="matmul size N (N x N @ N x N)")
    p.add_argument("--width", type=int, default=512, help="the MLP's width")
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    rows = []
    for kind in ("float32", "bfloat16", "float8"):
        for device in ("cpu", DEVICE):
            fn, operands = matmul_step(device, kind, args.size)
            _, seconds = time_loop(lambda: fn(*operands), device, args.iters, warmup=3, repeats=3)
            flops = 2 * args.size ** 3
            rows.append((f"matmul {args.size}^3", kind, device, min(seconds) * 1e3, flops / min(seconds) / 1e9))
    for kind in ("float32", "bfloat16", "float8"):
        for device in ("cpu", DEVICE):
            step = training_step(device, kind, args.width)
            _, seconds = time_loop(step, device, args.iters, warmup=3, repeats=3)
            flops = 3 * 2 * 256 * 2 * args.width * 4 * args.width  # forward and backward of both layers
            rows.append((f"MLP step, width {args.width}", kind, device, min(seconds) * 1e3, flops / min(seconds) / 1e9))
    print("| what | dtype | device | ms | GFLOP/s |\n| --- | --- | --- | --- | --- |")
    for what, kind, device, ms, gflops in rows:
        print(f"| {what} | {kind} | {device} | {ms:.2f} | {gflops:.1f} |")


if __name__ == "__main__":
    main()
