"""Memory layouts follow PyTorch's stride rules where user code can tell:
channels-last inputs give channels-last results through pointwise ops,
convolutions, pooling and batch norm (forward and backward), *_like
factories preserve layouts, and a CNN trains in channels_last like CPU with
the CPU fallback forbidden."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import assert_close

import torch_pjrt

CL = torch.channels_last


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.SiLU(), nn.AvgPool2d(2),
        nn.Conv2d(16, 16, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5),
    )


def test_layers_keep_channels_last_like_cpu(dev: torch.device) -> None:
    torch.manual_seed(0)
    cpu = small_cnn().to(memory_format=CL)
    model = copy.deepcopy(cpu).to(dev)
    x = torch.randn(2, 3, 16, 16).to(memory_format=CL).requires_grad_()
    xd = x.detach().to(dev).requires_grad_()
    assert xd.is_contiguous(memory_format=CL)
    h, hd = x, xd
    with torch_pjrt.fallback_mode("error"):
        for layer, layer_d in zip(cpu, model):
            h, hd = layer(h), layer_d(hd)
            assert hd.stride() == h.stride(), f"{type(layer).__name__}: strides {hd.stride()} vs CPU {h.stride()}"
        hd.square().sum().backward()
    h.square().sum().backward()
    assert xd.grad.stride() == x.grad.stride()
    assert_close(xd.grad, x.grad, rtol=1e-4, atol=1e-5)
    for p, q in zip(cpu.parameters(), model.parameters()):
        assert q.grad.stride() == p.grad.stride()


def test_pointwise_and_like_factories(dev: torch.device) -> None:
    x = torch.randn(2, 4, 3, 5).to(memory_format=CL)
    xd = x.to(dev)
    bias = torch.randn(4, 1, 1)
    for fn in (torch.exp, lambda t: t + bias.to(t.device), lambda t: t * 2, F.gelu, lambda t: torch.where(t > 0, t, 0.0)):
        assert fn(xd).stride() == fn(x).stride()
    assert torch.empty_like(xd).stride() == torch.empty_like(x).stride()
    assert torch.zeros_like(xd).stride() == torch.zeros_like(x).stride()
    assert torch.randn_like(xd).stride() == torch.randn_like(x).stride()
    assert xd.clone().stride() == x.clone().stride()
    assert xd.contiguous().is_contiguous() and xd.contiguous(memory_format=CL).stride() == x.stride()
    # A contiguous input stays contiguous.
    y = torch.randn(2, 4, 3, 5)
    assert torch.exp(y.to(dev)).is_contiguous()
    assert_close(torch.exp(xd), torch.exp(x))


def test_cnn_trains_in_channels_last_like_cpu(dev: torch.device) -> None:
    torch.manual_seed(1)
    ref = small_cnn().double().to(memory_format=CL)
    model = copy.deepcopy(ref).float().to(dev)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = [(torch.randn(8, 3, 16, 16).to(memory_format=CL), torch.randint(0, 5, (8,))) for _ in range(5)]
    losses_ref, losses = [], []
    with torch_pjrt.fallback_mode("error"):
        for x, y in data:
            opt.zero_grad()
            loss = F.cross_entropy(model(x.float().to(dev)), y.to(dev))
            loss.backward()
            opt.step()
            losses.append(loss.item())
    for x, y in data:
        opt_ref.zero_grad()
        loss = F.cross_entropy(ref(x.double()), y)
        loss.backward()
        opt_ref.step()
        losses_ref.append(loss.item())
    # float32 against float64: about 1e-6 relative per step, growing with the steps.
    for step, (a, b) in enumerate(zip(losses, losses_ref)):
        assert abs(a - b) <= 1e-4 * (step + 1) * abs(b), (step, a, b)
    for p in model.parameters():
        if p.dim() == 4:
            assert p.is_contiguous(memory_format=CL)
