"""Eager training on the device matches float64 CPU PyTorch step by step (every
gradient and parameter, see trajectory.py)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from models import MLP, TinyTransformer, synthetic_tokens
from trajectory import assert_trains_like_float64, problem

import torch_pjrt  # noqa: F401  (registers the device)


def train(model: torch.nn.Module, device: str, make_opt, batches, loss_fn, steps: int = 20,
          after_step=None) -> list[float]:
    """Trains and returns the losses; `after_step()` is called after each step."""
    model = model.to(device)
    opt = make_opt(model.parameters())
    losses = []
    for step in range(steps):
        x, y = (t.to(device) for t in batches[step % len(batches)])
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if after_step is not None:
            after_step()
    return losses


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_mlp_matches_cpu(optimizer):
    torch.manual_seed(0)
    model = MLP()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(4)]
    make_opt = {
        "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
    }[optimizer]
    dev, _ = assert_trains_like_float64(problem(model, batches, F.cross_entropy, make_opt, steps=20))
    assert dev[-1] < dev[0]


def test_transformer_matches_cpu():
    torch.manual_seed(0)
    model = TinyTransformer(vocab=64, dim=32, heads=4, layers=2, seq=16)
    batches = [synthetic_tokens(4, 16, 64, seed=s) for s in range(2)]

    def lm_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, 64), y.reshape(-1))

    make_opt = lambda p: torch.optim.AdamW(p, lr=3e-3)  # noqa: E731  (default foreach path)
    dev, _ = assert_trains_like_float64(problem(model, batches, lm_loss, make_opt, steps=20))
    assert dev[-1] < dev[0] * 0.8


def test_transformer_with_dropout_trains(dev):
    torch.manual_seed(0)
    model = TinyTransformer(vocab=64, dim=32, heads=4, layers=1, seq=16, dropout=0.1).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x, y = (t.to(dev) for t in synthetic_tokens(4, 16, 64))
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = F.cross_entropy(model(x).reshape(-1, 64), y.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.8
    model.eval()
    with torch.no_grad():
        a, b = model(x), model(x)
    assert torch.equal(a.cpu(), b.cpu())  # eval mode: no dropout


def test_bfloat16_forward_close_to_float32(dev):
    torch.manual_seed(0)
    model = TinyTransformer(vocab=64, dim=32, heads=4, layers=1, seq=16)
    x, _ = synthetic_tokens(2, 16, 64)
    ref = model(x)
    out = copy.deepcopy(model).to(dev, torch.bfloat16)(x.to(dev)).float().cpu()
    assert (out - ref).abs().max().item() < 0.1
