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


def _layouts(values: object) -> list[tuple[int | None, ...]]:
    # A size-1 dim's stride is free (ATen picks either); the others fix the layout.
    flat = values if isinstance(values, (tuple, list)) else (values,)
    return [tuple(None if n == 1 else s for n, s in zip(t.shape, t.stride()))
            for t in flat if isinstance(t, torch.Tensor) and t.dim() >= 2]


# (name, module factory, input shape, input channels-last, module channels-last, gradients too)
_MODULE_LAYOUT_CASES = [
    ("conv-weight-cl", lambda: nn.Conv2d(3, 4, 3), (2, 3, 5, 5), False, True, True),
    ("conv-input-cl", lambda: nn.Conv2d(3, 4, 3), (2, 3, 5, 5), True, False, True),
    ("conv3d-weight-cl", lambda: nn.Conv3d(3, 4, 2), (2, 3, 4, 4, 4), False, True, True),
    ("conv-transpose-weight-cl", lambda: nn.ConvTranspose2d(3, 4, 3), (1, 3, 5, 5), False, True, True),
    # Forward only: native_group_norm's autograd formula hands a non-CPU backward contiguous
    # copies, so its input gradient is contiguous on every device but the CPU.
    ("group-norm-input-cl", lambda: nn.GroupNorm(3, 6), (2, 6, 4, 4), True, False, False),
    ("adaptive-max-pool-cl", lambda: nn.AdaptiveMaxPool2d((2, 2), return_indices=True), (2, 3, 5, 5), True, False, True),
    # (2, 3, 1, 1) is both contiguous and channels-last: the input's own strides decide.
    ("adaptive-max-pool-1x1-cl", lambda: nn.AdaptiveMaxPool2d((2, 2), return_indices=True), (2, 3, 1, 1), True, False, True),
    ("prelu-input-cl", lambda: nn.PReLU(3), (2, 3, 4, 4), True, False, True),
]


@pytest.mark.parametrize("name,make,shape,input_cl,module_cl,check_grads", _MODULE_LAYOUT_CASES,
                         ids=[c[0] for c in _MODULE_LAYOUT_CASES])
def test_module_result_and_gradient_layouts_as_cpu(dev: torch.device, name: str, make, shape, input_cl: bool,
                                                   module_cl: bool, check_grads: bool) -> None:
    # The strides of the results and of the input and parameter gradients (taken with
    # autograd.grad, which hands back the backward's own tensors) are the CPU's.
    torch.manual_seed(0)
    ref = make()
    model = copy.deepcopy(ref).to(dev)
    if module_cl:
        ref.to(memory_format=CL if len(shape) == 4 else torch.channels_last_3d)
        model.to(memory_format=CL if len(shape) == 4 else torch.channels_last_3d)
    x = torch.randn(shape)
    if input_cl:
        x = x.to(memory_format=CL)
    xd = x.to(dev).requires_grad_()
    x.requires_grad_()
    with torch_pjrt.fallback_mode("error"):
        out = model(xd)
        first = out[0] if isinstance(out, tuple) else out
        grads = torch.autograd.grad(first, (xd, *model.parameters()), torch.ones_like(first))
    out_ref = ref(x)
    first_ref = out_ref[0] if isinstance(out_ref, tuple) else out_ref
    grads_ref = torch.autograd.grad(first_ref, (x, *ref.parameters()), torch.ones_like(first_ref))
    assert _layouts(out) == _layouts(out_ref)
    if check_grads:
        assert _layouts(grads) == _layouts(grads_ref)
    assert_close(first, first_ref.detach(), rtol=1e-4, atol=1e-5)
