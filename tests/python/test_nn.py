"""Native nn kernels (conv, pooling, norms, resampling, padding, scans, sorting, losses)
against CPU PyTorch, forward and backward, with CPU fallback forbidden."""
from __future__ import annotations

from typing import Callable

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from conftest import DEV, assert_close

Fn = Callable[..., torch.Tensor]


def check(fn: Fn, *inputs: torch.Tensor, grad: bool = True, **tol: float) -> None:
    """fn on the device matches fn on CPU; so do the input gradients of a weighted sum."""
    gen = torch.Generator().manual_seed(0)
    cpu_in = [t.detach().clone().requires_grad_(grad and t.is_floating_point()) for t in inputs]
    dev_in = [t.detach().to(DEV).requires_grad_(grad and t.is_floating_point()) for t in inputs]
    with torch_pjrt.fallback_mode("error"):
        out_dev = fn(*dev_in)
    out_cpu = fn(*cpu_in)
    outs_dev = out_dev if isinstance(out_dev, (tuple, list)) else (out_dev,)
    outs_cpu = out_cpu if isinstance(out_cpu, (tuple, list)) else (out_cpu,)
    for d, c in zip(outs_dev, outs_cpu):
        assert_close(d, c, **tol)
    if not grad:
        return
    diff = [(d, c) for d, c in zip(outs_dev, outs_cpu) if c.is_floating_point() and c.requires_grad]
    weights = [torch.randn(c.shape, generator=gen) for _, c in diff]
    loss_cpu = sum((c * w).sum() for (_, c), w in zip(diff, weights))
    with torch_pjrt.fallback_mode("error"):
        loss_dev = sum((d * w.to(DEV)).sum() for (d, _), w in zip(diff, weights))
        loss_dev.backward()
    loss_cpu.backward()
    for d, c in zip(dev_in, cpu_in):
        if c.grad is not None:
            assert_close(d.grad, c.grad, **tol)


def rnd(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    "stride,padding,dilation,groups",
    [(1, 0, 1, 1), (2, 1, 1, 1), (1, 2, 2, 1), (2, 1, 1, 2), (3, 0, 1, 4)],
)
def test_conv2d(stride: int, padding: int, dilation: int, groups: int) -> None:
    x, w, b = rnd(2, 4, 9, 8), rnd(8, 4 // groups, 3, 3, seed=1), rnd(8, seed=2)
    check(lambda x, w, b: F.conv2d(x, w, b, stride, padding, dilation, groups), x, w, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dims", [1, 3])
def test_conv1d_conv3d(dims: int) -> None:
    conv = {1: F.conv1d, 3: F.conv3d}[dims]
    x, w = rnd(2, 3, *([6] * dims)), rnd(4, 3, *([3] * dims), seed=1)
    check(lambda x, w: conv(x, w, None, 2, 1), x, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stride,padding,output_padding,groups,dilation", [(1, 0, 0, 1, 1), (2, 1, 1, 1, 1), (2, 0, 0, 2, 2)])
def test_conv_transpose2d(stride: int, padding: int, output_padding: int, groups: int, dilation: int) -> None:
    x, w, b = rnd(2, 4, 5, 6), rnd(4, 6 // groups, 3, 3, seed=1), rnd(6, seed=2)
    check(lambda x, w, b: F.conv_transpose2d(x, w, b, stride, padding, output_padding, groups, dilation), x, w, b,
          rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel,stride,padding,dilation,ceil", [(2, 2, 0, 1, False), (3, 2, 1, 1, True), (3, 1, 1, 2, False)])
def test_max_pool2d(kernel: int, stride: int, padding: int, dilation: int, ceil: bool) -> None:
    x = rnd(2, 3, 9, 8)
    check(lambda x: F.max_pool2d(x, kernel, stride, padding, dilation, ceil, return_indices=True), x)


def test_max_pool_ties_nan_and_3d() -> None:
    x = torch.tensor([[[[1.0, 1.0, 2.0, 2.0], [1.0, float("nan"), 0.0, 2.0]]]])
    check(lambda x: F.max_pool2d(x, 2, return_indices=True), x, grad=False)
    check(lambda x: F.max_pool3d(x, 2, 1, 1, return_indices=True), rnd(1, 2, 4, 5, 3))
    check(lambda x: F.max_pool1d(x, 3, 2), rnd(2, 3, 9))


@pytest.mark.parametrize("ceil,cip,divisor", [(False, True, None), (True, False, None), (True, True, None), (False, True, 3)])
def test_avg_pool(ceil: bool, cip: bool, divisor: int | None) -> None:
    check(lambda x: F.avg_pool2d(x, 3, 2, 1, ceil, cip, divisor), rnd(2, 3, 8, 7))
    check(lambda x: F.avg_pool3d(x, 2, 2, 1, ceil, cip, divisor), rnd(1, 2, 5, 4, 5))
    check(lambda x: F.avg_pool1d(x, 3, 2, 1, ceil, cip), rnd(2, 3, 9))


@pytest.mark.parametrize("out", [(1, 1), (3, 2), (5, 7)])
def test_adaptive_avg_pool(out: tuple[int, int]) -> None:
    check(lambda x: F.adaptive_avg_pool2d(x, out), rnd(2, 3, 7, 6))
    check(lambda x: F.adaptive_avg_pool3d(x, (2, *out)), rnd(1, 2, 5, 7, 6))


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm(training: bool) -> None:
    x, w, b = rnd(4, 3, 5, 2), rnd(3, seed=1), rnd(3, seed=2)
    rm_c, rv_c = rnd(3, seed=3), rnd(3, seed=4).abs() + 0.5
    rm_d, rv_d = rm_c.to(DEV), rv_c.to(DEV)
    out_c = F.batch_norm(x, rm_c, rv_c, w, b, training, 0.2, 1e-5)
    with torch_pjrt.fallback_mode("error"):
        out_d = F.batch_norm(x.to(DEV), rm_d, rv_d, w.to(DEV), b.to(DEV), training, 0.2, 1e-5)
    assert_close(out_d, out_c, rtol=1e-4, atol=1e-5)
    assert_close(rm_d, rm_c)
    assert_close(rv_d, rv_c)
    check(lambda x, w, b: F.batch_norm(x, rm_c.to(x.device), rv_c.to(x.device), w, b, training), x, w, b,
          rtol=1e-4, atol=1e-4)


def test_batch_norm_module_and_group_instance_norm() -> None:
    check(lambda x, w, b: F.group_norm(x, 2, w, b), rnd(3, 4, 5, 2), rnd(4, seed=1), rnd(4, seed=2), rtol=1e-4, atol=1e-4)
    check(lambda x: F.instance_norm(x), rnd(2, 3, 6), rtol=1e-4, atol=1e-4)
    check(lambda x: F.batch_norm(x, None, None, training=True), rnd(5, 3), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode,align", [("nearest", None), ("nearest-exact", None), ("bilinear", False), ("bilinear", True)])
@pytest.mark.parametrize("size", [(10, 7), (3, 2)])
def test_interpolate_2d(mode: str, align: bool | None, size: tuple[int, int]) -> None:
    check(lambda x: F.interpolate(x, size=size, mode=mode, align_corners=align), rnd(2, 3, 5, 4))


def test_interpolate_scale_1d_3d() -> None:
    check(lambda x: F.interpolate(x, scale_factor=2.5, mode="linear"), rnd(2, 3, 5))
    check(lambda x: F.interpolate(x, scale_factor=1.7, mode="nearest"), rnd(2, 3, 5))
    check(lambda x: F.interpolate(x, size=(3, 5, 4), mode="trilinear"), rnd(1, 2, 2, 3, 4))
    check(lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), rnd(1, 2, 2, 3, 4))


@pytest.mark.parametrize("mode", ["reflect", "replicate", "constant", "circular"])
def test_pad_modes(mode: str) -> None:
    check(lambda x: F.pad(x, (2, 1), mode=mode), rnd(2, 3, 5))
    check(lambda x: F.pad(x, (1, 2, 2, 0), mode=mode), rnd(2, 3, 5, 4))
    check(lambda x: F.pad(x, (1, 1, 1, 0, 0, 1), mode=mode), rnd(1, 2, 3, 4, 3))


@pytest.mark.parametrize("mode", ["reflect", "replicate", "constant", "circular"])
def test_pad_keeps_channels_last_as_the_cpu_does(mode: str) -> None:
    # The result's and the input gradient's layouts are the CPU's, not only their values.
    for shape, pad, fmt in (((2, 3, 5, 4), (1, 2, 2, 0), torch.channels_last),
                            ((1, 2, 3, 4, 3), (1, 1, 1, 0, 0, 1), torch.channels_last_3d)):
        x = rnd(*shape).to(memory_format=fmt).requires_grad_()
        xd = x.detach().to("pjrt").requires_grad_()
        y, yd = F.pad(x, pad, mode=mode), F.pad(xd, pad, mode=mode)
        g = torch.randn(y.shape)
        y.backward(g)
        yd.backward(g.to("pjrt"))
        assert yd.stride() == y.stride() and xd.grad.stride() == x.grad.stride(), mode
        torch.testing.assert_close(yd.cpu(), y.detach(), rtol=0, atol=0)
        torch.testing.assert_close(xd.grad.cpu(), x.grad)  # sums of a few terms, in another order


def test_a_pad_that_only_narrows_keeps_the_inputs_dim_order() -> None:
    # ATen narrows and clones: the result is dense in the input's dim order (a transposed
    # input stays transposed), which compiled graphs that view it rely on.
    x = rnd(2, 8, 6, 5).transpose(2, 3)
    for pad in ([0, 0, 0, -2], [0, -3], [-1, -1, 0, 0]):
        want, got = torch.constant_pad_nd(x, pad), torch.constant_pad_nd(x.to("pjrt"), pad)
        assert got.stride() == want.stride(), pad
        assert torch.equal(got.cpu(), want)


def test_constant_pad_negative_and_value() -> None:
    check(lambda x: F.pad(x, (-1, 2, 0, -2), value=3.5), rnd(2, 4, 5))


def test_scans() -> None:
    x = rnd(4, 6)
    check(lambda x: torch.cumsum(x, 1), x)
    check(lambda x: torch.cumprod(x, 0), x)
    check(lambda x: torch.logcumsumexp(x, 1), x)
    check(lambda x: torch.cummax(x, 1), x)
    check(lambda x: torch.cummin(x, 0), x)
    ints = torch.randint(-5, 5, (3, 7), generator=torch.Generator().manual_seed(1))
    check(lambda x: torch.cumsum(x, 1), ints, grad=False)
    check(lambda x: torch.cummax(x, 1), ints, grad=False)
    special = torch.tensor([1.0, float("nan"), 3.0, 3.0, -float("inf"), 5.0])
    check(lambda x: torch.cummax(x, 0), special, grad=False)
    check(lambda x: torch.logcumsumexp(x, 0), torch.tensor([-float("inf"), -float("inf"), 0.0, 1.0]), grad=False)


def test_sorting() -> None:
    x = rnd(5, 8)
    check(lambda x: torch.sort(x, 1), x)
    check(lambda x: torch.sort(x, dim=0, descending=True, stable=True), x)
    check(lambda x: torch.topk(x, 3, 1), x)
    check(lambda x: torch.topk(x, 2, 0, largest=False), x)
    check(lambda x: torch.kthvalue(x, 3, 1), x)
    check(lambda x: torch.argsort(x, 1), x, grad=False)
    check(lambda x: torch.median(x, 1), x)
    check(lambda x: torch.median(x), x)
    nan = torch.tensor([[3.0, float("nan"), 1.0, 2.0], [4.0, 1.0, 2.0, 0.0]])
    check(lambda x: torch.sort(x, 1), nan, grad=False)
    check(lambda x: torch.median(x, 1), nan, grad=False)
    check(lambda x: torch.nanmedian(x, 1), nan, grad=False)
    ints = torch.tensor([[3, 1, 2, 1, 3], [0, -2, 5, 5, 1]])
    check(lambda x: torch.sort(x, dim=1, stable=True), ints, grad=False)


def test_shape_ops() -> None:
    x = rnd(3, 4, 5)
    check(lambda x: torch.flip(x, (0, 2)), x)
    check(lambda x: torch.roll(x, (1, -2), (0, 2)), x)
    check(lambda x: torch.roll(x, 7), x)
    check(lambda x: x.repeat(2, 1, 3), x)
    check(lambda x: x.repeat(2, 1, 1, 2), x)
    check(lambda x: torch.tile(x, (2,)), x)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_losses(reduction: str) -> None:
    x, y = rnd(4, 5), rnd(4, 5, seed=1)
    check(lambda x, y: F.smooth_l1_loss(x, y, reduction=reduction, beta=0.5), x, y)
    check(lambda x, y: F.smooth_l1_loss(x, y, reduction=reduction, beta=0.0), x, y)
    check(lambda x, y: F.huber_loss(x, y, reduction=reduction, delta=0.7), x, y)
    check(lambda x, y: F.l1_loss(x, y, reduction=reduction), x, y)
    check(lambda x, y: F.mse_loss(x, y, reduction=reduction), x, y)
    p, t = torch.sigmoid(x), torch.sigmoid(y)
    w = rnd(5, seed=3).abs()
    check(lambda p, t: F.binary_cross_entropy(p, t, reduction=reduction), p, t)
    check(lambda p, t: F.binary_cross_entropy(p, t, w.to(p.device), reduction=reduction), p, t)
    check(lambda x, t: F.binary_cross_entropy_with_logits(x, t, reduction=reduction), x, t)
    check(lambda x, t: F.binary_cross_entropy_with_logits(x, t, pos_weight=w.to(x.device), reduction=reduction), x, t)
    check(lambda x, y: F.soft_margin_loss(x, y.sign().detach(), reduction=reduction), x, y)
    check(lambda x, y: F.kl_div(F.log_softmax(x, 1), F.softmax(y, 1), reduction=reduction), x, y)
    logits, target = rnd(2, 4, 3, 5), torch.randint(0, 4, (2, 3, 5), generator=torch.Generator().manual_seed(5))
    target[0, 0, 0] = -100
    check(lambda x: F.cross_entropy(x, target.to(x.device), reduction=reduction), logits)
    check(lambda x: F.cross_entropy(x, target.clamp(min=0).to(x.device), weight=w[:4].to(x.device), reduction=reduction),
          logits)
    check(lambda x: F.cross_entropy(x[:, :, 0, 0], target[:, 0, 0].clamp(min=0).to(x.device), label_smoothing=0.1,
                                    reduction=reduction), logits)


ACTIVATIONS: list[tuple[str, Fn]] = [
    ("elu", lambda x: F.elu(x, 0.7)),
    ("selu", F.selu),
    ("celu", lambda x: F.celu(x, 1.3)),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.2)),
    ("softplus", lambda x: F.softplus(x, 2.0, 3.0)),
    ("hardtanh", lambda x: F.hardtanh(x, -0.5, 0.8)),
    ("relu6", F.relu6),
    ("hardshrink", lambda x: F.hardshrink(x, 0.3)),
    ("softshrink", lambda x: F.softshrink(x, 0.3)),
    ("hardsigmoid", F.hardsigmoid),
    ("hardswish", F.hardswish),
    ("mish", F.mish),
    ("logsigmoid", F.logsigmoid),
    ("glu", lambda x: F.glu(x, 1)),
    ("threshold", lambda x: F.threshold(x, 0.1, -2.0)),
    ("prelu", lambda x: F.prelu(x, torch.tensor([0.1, 0.2, 0.3, 0.4], device=x.device))),
    ("logit", lambda x: torch.logit(torch.sigmoid(x), 1e-3)),
    ("silu", F.silu),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")),
]


@pytest.mark.parametrize("name,fn", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_activations(name: str, fn: Fn) -> None:
    check(fn, rnd(3, 4, 5) * 3)


POINTWISE: list[tuple[str, Fn]] = [
    ("asinh", torch.asinh), ("acosh", lambda x: torch.acosh(x.abs() + 1)), ("atanh", lambda x: torch.atanh(x.tanh())),
    ("lgamma", torch.lgamma), ("digamma", lambda x: torch.digamma(x.abs() + 0.5)), ("erfinv", lambda x: torch.erfinv(x.tanh())),
    ("erfc", torch.erfc), ("i1e", torch.special.i1e), ("i1", torch.special.i1), ("sgn", torch.sgn), ("sinc", torch.sinc),
    ("deg2rad", torch.deg2rad), ("rad2deg", torch.rad2deg), ("ndtri", lambda x: torch.special.ndtri(x.sigmoid())),
    ("log_ndtr", torch.special.log_ndtr), ("entr", lambda x: torch.special.entr(x.abs())),
    ("polygamma", lambda x: torch.polygamma(2, x.abs() + 0.5)), ("nan_to_num", torch.nan_to_num),
    ("trigamma_negative", lambda x: torch.polygamma(1, x - 3.3)), ("erfcx", torch.special.erfcx),
]


@pytest.mark.parametrize("name,fn", POINTWISE, ids=[p[0] for p in POINTWISE])
def test_unary_special(name: str, fn: Fn) -> None:
    # i0e (the derivative of i1/i1e) has no native kernel yet: forward only there.
    check(fn, rnd(4, 6), grad=name not in ("i1e", "i1"), rtol=1e-4, atol=1e-5)


BINARY: list[tuple[str, Fn]] = [
    ("logaddexp", torch.logaddexp), ("logaddexp2", torch.logaddexp2), ("hypot", torch.hypot),
    ("copysign", torch.copysign), ("fmax", torch.fmax), ("fmin", torch.fmin),
    ("xlog1py", lambda x, y: torch.special.xlog1py(x, y.abs())), ("xlogy", lambda x, y: torch.xlogy(x, y.abs())),
    ("zeta", lambda x, y: torch.special.zeta(x.abs() + 1.5, y.abs() + 0.5)),
    ("floor_divide", torch.floor_divide), ("heaviside", torch.heaviside), ("nextafter", torch.nextafter),
]


@pytest.mark.parametrize("name,fn", BINARY, ids=[p[0] for p in BINARY])
def test_binary_special(name: str, fn: Fn) -> None:
    grad = name not in ("floor_divide", "heaviside", "nextafter", "zeta")  # zeta: torch has no derivative
    check(fn, rnd(4, 6), rnd(4, 6, seed=1), grad=grad, rtol=1e-4, atol=1e-5)


def test_special_values() -> None:
    x = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1.5, -2.0])
    for fn in (torch.signbit, torch.sgn, torch.nan_to_num, lambda t: torch.nan_to_num(t, 1.0, 2.0, -3.0), torch.sinc,
               lambda t: torch.fmax(t, t.flip(0)), lambda t: torch.logaddexp(t, t), lambda t: torch.copysign(t.abs(), t)):
        check(fn, x, grad=False)
    ints = torch.tensor([1, -8, 37, 5])
    check(lambda a: torch.bitwise_left_shift(a, 2), ints, grad=False)
    check(lambda a: torch.bitwise_right_shift(a, torch.tensor([0, 1, 2, 3], device=a.device)), ints, grad=False)


@pytest.mark.parametrize("out", [(1, 1), (3, 2), (5, 7)])
def test_adaptive_max_pool(out: tuple[int, int]) -> None:
    check(lambda x: F.adaptive_max_pool2d(x, out, return_indices=True), rnd(2, 3, 7, 6))
    check(lambda x: F.adaptive_max_pool3d(x, (2, *out), return_indices=True), rnd(1, 2, 5, 7, 6))
    check(lambda x: F.adaptive_max_pool1d(x, out[1]), rnd(2, 3, 9))


def test_max_unpool() -> None:
    x = rnd(2, 3, 6, 8)
    v, i = F.max_pool2d(x, 2, return_indices=True)
    check(lambda v: F.max_unpool2d(v, i.to(v.device), 2), v)
    x3 = rnd(1, 2, 4, 4, 6)
    v3, i3 = F.max_pool3d(x3, 2, return_indices=True)
    check(lambda v: F.max_unpool3d(v, i3.to(v.device), 2), v3)


@pytest.mark.parametrize("kernel,dilation,padding,stride", [(2, 1, 0, 1), (3, 2, 1, 2), ((2, 3), 1, (1, 0), (2, 1))])
def test_unfold_fold(kernel, dilation, padding, stride) -> None:
    x = rnd(2, 3, 7, 8)
    check(lambda x: F.unfold(x, kernel, dilation, padding, stride), x)
    cols = F.unfold(x, kernel, dilation, padding, stride)
    check(lambda c: F.fold(c, (7, 8), kernel, dilation, padding, stride), cols)


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("size", [(10, 7), (3, 2)])
def test_bicubic(align: bool, size: tuple[int, int]) -> None:
    check(lambda x: F.interpolate(x, size=size, mode="bicubic", align_corners=align), rnd(2, 3, 5, 4), rtol=1e-4, atol=1e-5)


def test_shuffles() -> None:
    check(lambda x: F.pixel_shuffle(x, 2), rnd(2, 8, 3, 5))
    check(lambda x: F.pixel_unshuffle(x, 2), rnd(2, 3, 4, 6))
    check(lambda x: F.channel_shuffle(x, 3), rnd(2, 6, 3, 2))


def test_norm_overloads() -> None:
    x = rnd(4, 5)
    check(lambda x: torch.norm(x), x)
    check(lambda x: torch.norm(x, p=1, dim=1), x)
    check(lambda x: torch.norm(x, p=3.5, dim=(0, 1), keepdim=True), x)
    check(lambda x: torch.linalg.vector_norm(x, ord=-2, dim=1), x)
    check(lambda a, b: F.pairwise_distance(a, b), x, rnd(4, 5, seed=1))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("p", [1, 2])
def test_multi_margin_loss(reduction: str, p: int) -> None:
    x, y = rnd(4, 5), torch.tensor([0, 4, 2, 2])
    w = rnd(5, seed=2).abs()
    check(lambda x: F.multi_margin_loss(x, y.to(x.device), p=p, margin=0.7, reduction=reduction), x)
    check(lambda x: F.multi_margin_loss(x, y.to(x.device), weight=w.to(x.device), reduction=reduction), x)
    for target in (torch.tensor([3]), torch.tensor(3)):  # one sample: the loss has the target's shape
        check(lambda x: F.multi_margin_loss(x, target.to(x.device), p=p, reduction=reduction), rnd(5, seed=3))


def test_rrelu() -> None:
    check(lambda x: F.rrelu(x, 0.1, 0.3, training=False), rnd(4, 5))
    torch.manual_seed(0)
    x = rnd(2000).to(DEV).requires_grad_()
    with torch_pjrt.fallback_mode("error"):
        y = F.rrelu(x, 0.1, 0.3, training=True)
        y.sum().backward()
    xc, yc, gc = x.detach().cpu(), y.detach().cpu(), x.grad.cpu()
    slope = yc[xc < 0] / xc[xc < 0]
    assert torch.equal(yc[xc >= 0], xc[xc >= 0]) and slope.min() >= 0.1 and slope.max() < 0.3 and slope.std() > 0.03
    torch.testing.assert_close(gc[xc < 0], slope)
    # In place it runs on the device too, drawing the same slopes from pjrt's generator.
    with torch_pjrt.fallback_mode("error"):
        torch.manual_seed(0)
        functional = F.rrelu(x.detach(), 0.1, 0.3, training=True)
        torch.manual_seed(0)
        inplace = F.rrelu(x.detach().clone(), 0.1, 0.3, training=True, inplace=True)
    assert torch.equal(inplace.cpu(), functional.cpu())


def _grid_sample_against_float64(dev, x_shape, grid_shape, seed, **kw):
    # Grid points reach outside [-1, 1] so every padding rule is exercised; forward and
    # backward with the CPU fallback forbidden, against float64. Returns the device input.
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*x_shape, dtype=torch.float64, generator=gen)
    grid = torch.rand(*grid_shape, dtype=torch.float64, generator=gen) * 2.4 - 1.2
    ref_x, ref_g = x.clone().requires_grad_(), grid.clone().requires_grad_()
    dx, dg = x.float().to(dev).requires_grad_(), grid.float().to(dev).requires_grad_()
    with torch_pjrt.fallback_mode("error"):
        y = torch.nn.functional.grid_sample(dx, dg, **kw)
        w = torch.randn(y.shape, dtype=torch.float64, generator=gen)
        (y * w.float().to(dev)).sum().backward()
    ref = torch.nn.functional.grid_sample(ref_x, ref_g, **kw)
    (ref * w).sum().backward()
    # Sixteen taps at most (eight in 3-d), each a float32 product: a few ulps of the largest value.
    torch.testing.assert_close(y.cpu(), ref.float().detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dx.grad.cpu(), ref_x.grad.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dg.grad.cpu(), ref_g.grad.float(), rtol=1e-4, atol=1e-4 * ref_g.grad.abs().max().item())
    return dx, dg


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_matches_cpu(dev, mode, padding_mode, align_corners):
    _grid_sample_against_float64(dev, (2, 3, 5, 7), (2, 4, 6, 2), 0, mode=mode, padding_mode=padding_mode,
                                 align_corners=align_corners)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_3d_matches_cpu(dev, mode, padding_mode, align_corners):
    # Volumes (5-d inputs): trilinear or nearest.
    dx, dg = _grid_sample_against_float64(dev, (2, 3, 4, 5, 6), (2, 3, 4, 5, 3), 1, mode=mode,
                                          padding_mode=padding_mode, align_corners=align_corners)
    with pytest.raises(RuntimeError, match="bicubic interpolation only supports 4D input"):
        torch.nn.functional.grid_sample(dx, dg, mode="bicubic")


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("concatenated", [False, True], ids=["padded", "concatenated"])
def test_ctc_loss_matches_cpu(dev, reduction, concatenated):
    gen = torch.Generator().manual_seed(0)
    T, N, C, S = 12, 3, 6, 4
    log_probs = torch.randn(T, N, C, dtype=torch.float64, generator=gen).log_softmax(2)
    targets = torch.randint(1, C, (N, S), generator=gen)
    input_lengths, target_lengths = torch.tensor([12, 9, 7]), torch.tensor([4, 2, 3])
    if concatenated:
        targets = torch.cat([targets[i, : target_lengths[i]] for i in range(N)])
    ref = log_probs.clone().requires_grad_()
    xd = log_probs.float().to(dev).requires_grad_()
    with torch_pjrt.fallback_mode("error"):
        loss = F.ctc_loss(xd, targets.to(dev), input_lengths.to(dev), target_lengths.to(dev), reduction=reduction)
        w = torch.randn(loss.shape, dtype=torch.float64, generator=gen)
        (loss * w.float().to(dev)).sum().backward()
    expected = F.ctc_loss(ref, targets, input_lengths, target_lengths, reduction=reduction)
    (expected * w).sum().backward()
    # T steps of log-sum-exp in float32: about T ulps of the loss.
    torch.testing.assert_close(loss.cpu(), expected.float().detach(), rtol=T * 1e-6, atol=T * 1e-6)
    torch.testing.assert_close(xd.grad.cpu(), ref.grad.float(), rtol=1e-5, atol=T * 1e-6)


def test_ctc_loss_impossible_alignment(dev):
    # Four repeated labels need at least 7 frames: infinite loss, or zero with zero_infinity (as on CPU).
    gen = torch.Generator().manual_seed(1)
    log_probs = torch.randn(3, 1, 6, generator=gen).log_softmax(2)
    targets = torch.tensor([[1, 1, 1, 1]])
    for zero_infinity in (False, True):
        ref = F.ctc_loss(log_probs, targets, [3], [4], reduction="none", zero_infinity=zero_infinity)
        got = F.ctc_loss(log_probs.to(dev), targets.to(dev), [3], [4], reduction="none", zero_infinity=zero_infinity)
        torch.testing.assert_close(got.cpu(), ref)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("size", [(3, 5), (11, 14), (8, 9)], ids=["down", "up", "mixed"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_antialiased_interpolation_matches_cpu(dev, mode, size, align_corners):
    # interpolate(antialias=True) (torchvision's Resize on tensors): PIL's filters, widened when shrinking.
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 8, 9, dtype=torch.float64, generator=gen)
    ref = x.clone().requires_grad_()
    xd = x.float().to(dev).requires_grad_()
    kw = dict(size=size, mode=mode, antialias=True, align_corners=align_corners)
    with torch_pjrt.fallback_mode("error"):
        y = F.interpolate(xd, **kw)
        w = torch.randn(y.shape, dtype=torch.float64, generator=gen)
        (y * w.float().to(dev)).sum().backward()
    expected = F.interpolate(ref, **kw)
    (expected * w).sum().backward()
    torch.testing.assert_close(y.cpu(), expected.float().detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xd.grad.cpu(), ref.grad.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dims", [2, 3])
def test_fractional_max_pool_matches_cpu(dev, dims):
    # Given the random samples, the windows are deterministic: the same maxima and indices as CPU.
    gen = torch.Generator().manual_seed(0)
    # Non-integer interval ratios ((in - kernel) / (out - 1)), so the windows depend on the samples.
    shape, kernel, out = ((2, 3, 10, 11), (2, 3), (4, 5)) if dims == 2 else ((2, 2, 10, 9, 11), (2, 2, 3), (4, 4, 5))
    x = torch.randn(*shape, generator=gen)
    samples = torch.rand(shape[0], shape[1], dims, generator=gen)
    op = torch.ops.aten.fractional_max_pool2d if dims == 2 else torch.ops.aten.fractional_max_pool3d
    ref_x = x.clone().requires_grad_()
    values, indices = op(ref_x, list(kernel), list(out), samples)
    xd = x.to(dev).requires_grad_()
    with torch_pjrt.fallback_mode("error"):
        vd, idd = op(xd, list(kernel), list(out), samples.to(dev))
        g = torch.randn(values.shape, generator=gen)
        vd.backward(g.to(dev))
    values.backward(g)
    assert torch.equal(idd.cpu(), indices)
    torch.testing.assert_close(vd.cpu(), values.detach(), rtol=0, atol=0)
    torch.testing.assert_close(xd.grad.cpu(), ref_x.grad, rtol=1e-6, atol=1e-6)
    # The module form draws its own samples: shapes and that each value is its index's element.
    pool = (torch.nn.FractionalMaxPool2d if dims == 2 else torch.nn.FractionalMaxPool3d)(kernel, output_size=out, return_indices=True)
    v, i = pool(x.to(dev))
    assert v.shape == values.shape and i.shape == indices.shape
    torch.testing.assert_close(x.flatten(2).gather(2, i.cpu().flatten(2)), v.cpu().flatten(2), rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(3, 5), (5,), (4, 1)])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss(shape: tuple, reduction: str) -> None:
    torch.manual_seed(11)
    x = torch.randn(shape)
    y = torch.randint(-1, shape[-1], shape)  # lists end at the first -1
    if len(shape) == 2 and shape[1] > 1:
        y[0, 1] = y[0, 0]  # a duplicate target counts twice, as on CPU
    xa, xd = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
    with torch_pjrt.fallback_mode("error"):
        out = F.multilabel_margin_loss(xd, y.to(DEV), reduction=reduction)
        ref = F.multilabel_margin_loss(xa, y, reduction=reduction)
        assert_close(out, ref)
        w = torch.randn(ref.shape)
        (out * w.to(DEV)).sum().backward()
        (ref * w).sum().backward()
        assert_close(xd.grad, xa.grad)
    for target in ([[5, -1, 0], [0, 1, 2]], [[0, -2, 1], [0, 1, 2]]):  # every entry in [-1, C), as CPU checks
        with pytest.raises(IndexError, match="'target' is out of range"):
            F.multilabel_margin_loss(torch.randn(2, 3).to(DEV), torch.tensor(target).to(DEV))
            torch_pjrt.synchronize()



def test_embedding_bag_max_keeps_cpu_nan_rule() -> None:
    # CPU's running `>` keeps a NaN only when it comes first in the bag.
    weight = torch.tensor([[1.0], [float("nan")], [3.0]])
    for order in ([0, 1, 2], [1, 0, 2]):
        idx, offsets = torch.tensor(order), torch.tensor([0])
        with torch_pjrt.fallback_mode("error"):
            out = F.embedding_bag(idx.to(DEV), weight.to(DEV), offsets.to(DEV), mode="max")
        assert_close(out, F.embedding_bag(idx, weight, offsets, mode="max"))


@pytest.mark.parametrize("dims", [2, 3])
def test_fractional_max_pool_takes_samples_as_aten_does(dev, dims):
    # More sample rows than the batch (the first are used; an unbatched input uses row 0), and
    # ATen's errors for the wrong rank, too few rows, other channels or another window rank.
    gen = torch.Generator().manual_seed(1)
    op = torch.ops.aten.fractional_max_pool2d if dims == 2 else torch.ops.aten.fractional_max_pool3d
    kernel, out = [2] * dims, [3] * dims
    samples = torch.rand(3, 4, dims, generator=gen, dtype=torch.float64)
    for shape in ((2, 4) + (7,) * dims, (4,) + (7,) * dims):
        x = torch.randn(*shape, generator=gen, dtype=torch.float64)
        want = op(x, kernel, out, samples)
        got = op(x.to(dev), kernel, out, samples.to(dev))
        assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
    x = torch.randn((2, 4) + (7,) * dims, generator=gen, dtype=torch.float64)
    for bad in (samples[0], samples[:1], samples[:, :3], torch.rand(3, 4, dims + 1, dtype=torch.float64)):
        with pytest.raises(RuntimeError):
            op(x, kernel, out, bad)
        with pytest.raises(RuntimeError, match="_random_samples"):
            op(x.to(dev), kernel, out, bad.to(dev))
