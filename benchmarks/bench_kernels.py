"""Custom-kernel overhead, measured side by side in one run (not a test).

A compiled training step (forward and backward of a small transformer-like model) whose
RMSNorm and cross-entropy are the JAX operators of examples/jax_kernels.py, against the
same step written with PyTorch's ops, both torch.compile(backend="pjrt"); then the JAX
RMSNorm alone against PyTorch's, compiled, per call. Each timed loop ends in a real
device sync (torch_pjrt.bench.time_loop).

  .venv/bin/python benchmarks/bench_kernels.py [--iters 200]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import jax_kernels  # noqa: E402

from torch_pjrt.bench import time_loop  # noqa: E402


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


class Model(torch.nn.Module):
    def __init__(self, use_jax: bool, vocab: int = 256, dim: int = 128, layers: int = 4) -> None:
        super().__init__()
        self.use_jax = use_jax
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(layers))
        self.norms = torch.nn.ParameterList(torch.nn.Parameter(torch.ones(dim)) for _ in range(layers))
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for block, norm in zip(self.blocks, self.norms):
            n = jax_kernels.rms_norm(h, norm) if self.use_jax else rms_norm(h, norm)
            h = h + F.gelu(block(n))
        logits = self.head(h).reshape(-1, self.head.out_features)
        if self.use_jax:
            return jax_kernels.softmax_cross_entropy(logits, labels.reshape(-1))
        return F.cross_entropy(logits, labels.reshape(-1))


def time_ms(fn, iters: int) -> float:
    return time_loop(fn, "pjrt", iters, warmup=10)[1][0] * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=100)
    args = p.parse_args()
    torch.manual_seed(0)
    tokens, labels = torch.randint(0, 256, (8, 64)).to("pjrt"), torch.randint(0, 256, (8, 64)).to("pjrt")
    rows = []
    for use_jax in (False, True):
        torch.manual_seed(0)
        model = Model(use_jax).to("pjrt")
        loss = torch.compile(model, backend="pjrt")

        def step() -> torch.Tensor:
            model.zero_grad(set_to_none=True)
            value = loss(tokens, labels)
            value.backward()
            return value.detach()

        rows.append(("training step (4 RMSNorms + cross-entropy)", "JAX operators" if use_jax else "PyTorch ops",
                     time_ms(step, args.iters)))
    x, w = torch.randn(512, 128).to("pjrt"), torch.ones(128).to("pjrt")
    for name, fn in (("PyTorch ops", rms_norm), ("JAX operator", jax_kernels.rms_norm)):
        compiled = torch.compile(lambda a, b, f=fn: f(a, b).sum(), backend="pjrt")
        rows.append(("RMSNorm [512, 128] alone, compiled", name, time_ms(lambda: compiled(x, w), args.iters * 5)))
    print("| what | written with | ms per call |\n| --- | --- | --- |")
    for what, how, ms in rows:
        print(f"| {what} | {how} | {ms:.3f} |")


if __name__ == "__main__":
    main()
