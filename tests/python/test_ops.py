"""Every lowered op against CPU PyTorch, in float32 and bfloat16 (and ints/bools where they apply)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close

import torch_pjrt

FLOATS = [torch.float32, torch.bfloat16]


def make(shape, dtype, low=-2.0, high=2.0, seed=0):
    g = torch.Generator().manual_seed(seed + hash(tuple(shape)) % 1000)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if not dtype.is_floating_point:
        lo = 0 if dtype == torch.uint8 else int(low) - 3
        return torch.randint(lo, int(high) + 4, shape, generator=g, dtype=dtype)
    return (torch.rand(shape, generator=g, dtype=torch.float32) * (high - low) + low).to(dtype)


def check(fn: Callable, *args, native: bool = True, **tol):
    """Runs fn on CPU tensors and on their pjrt copies; compares every output."""
    dev_args = [a.to("pjrt") if isinstance(a, torch.Tensor) else a for a in args]
    torch_pjrt.reset_metrics()
    expected = fn(*args)
    with torch_pjrt.fallback_mode("error" if native else "warn"):
        actual = fn(*dev_args)
    if isinstance(expected, (tuple, list)):
        for a, e in zip(actual, expected):
            assert_close(a, e, **tol)
    else:
        assert_close(actual, expected, **tol)


UNARY = ["neg", "abs", "exp", "expm1", "log1p", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "sigmoid",
         "erf", "reciprocal", "floor", "ceil", "round", "trunc", "frac", "sign", "exp2", "sinh", "cosh",
         "atan", "asin", "acos", "log", "log2", "log10"]
POSITIVE = {"sqrt", "rsqrt", "log", "log2", "log10", "reciprocal"}
UNIT = {"asin", "acos"}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", UNARY)
def test_unary(name, dtype):
    low, high = (0.1, 3.0) if name in POSITIVE else ((-0.95, 0.95) if name in UNIT else (-2.0, 2.0))
    x = make((5, 7), dtype, low, high)
    check(getattr(torch, name), x)
    y = make((5, 7), dtype, low, high)
    check(lambda t: getattr(t.clone(), name + "_")(), y)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", ["relu", "gelu", "silu", "mish", "hardsigmoid", "hardswish"])
def test_activations(name, dtype):
    x = make((4, 9), dtype)
    check(getattr(F, name), x)


def test_gelu_tanh():
    check(lambda t: F.gelu(t, approximate="tanh"), make((6, 6), torch.float32))


BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "pow", "atan2", "remainder", "fmod",
          "eq", "ne", "lt", "le", "gt", "ge"]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", BINARY)
def test_binary_broadcast(name, dtype):
    a = make((4, 1, 5), dtype, 0.5 if name == "pow" else -2.0, 2.0)
    b = make((3, 1), dtype, 0.5, 2.0, seed=1)
    check(getattr(torch, name), a, b)
    if name not in ("maximum", "minimum", "atan2"):  # these take tensors only
        check(lambda x: getattr(torch, name)(x, 1.5), a)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "remainder", "bitwise_and", "bitwise_or", "bitwise_xor",
                                  "eq", "lt", "maximum"])
def test_binary_int(name):
    a = make((6,), torch.int64, -5, 5)
    b = make((6,), torch.int64, 1, 5, seed=3).clamp(min=1)
    check(getattr(torch, name), a, b)


@pytest.mark.parametrize("mode", [None, "trunc", "floor"])
def test_div_modes(mode):
    a = make((8,), torch.float32) * 5
    b = make((8,), torch.float32, 0.5, 3, seed=2)
    check(lambda x, y: torch.div(x, y, rounding_mode=mode), a, b)
    ai = torch.tensor([7, -7, 7, -7, 0])
    bi = torch.tensor([2, 2, -2, -2, 3])
    check(lambda x, y: torch.div(x, y, rounding_mode=mode), ai, bi)


def test_type_promotion_and_scalars():
    i = torch.arange(6).reshape(2, 3)
    f = make((2, 3), torch.float32)
    check(lambda a, b: a + b, i, f)
    check(lambda a: a * 2.5, i)
    check(lambda a: a / 2, i)
    check(lambda a: a + True, i)
    check(lambda a, b: torch.add(a, b, alpha=3), f, f)
    check(lambda a, b: torch.sub(a, b, alpha=0.5), f, f)
    h = make((2, 3), torch.bfloat16)
    check(lambda a, b: a * b, h, f)


def test_logical_and_predicates():
    a = make((10,), torch.bool)
    b = make((10,), torch.bool, seed=5)
    for fn in (torch.logical_and, torch.logical_or, torch.logical_xor):
        check(fn, a, b)
    check(torch.logical_not, a)
    x = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 0.0])
    for fn in (torch.isnan, torch.isinf, torch.isfinite, torch.isposinf, torch.isneginf):
        check(fn, x)


def test_where_masked_fill_clamp():
    x = make((4, 5), torch.float32)
    m = make((4, 5), torch.bool)
    check(lambda c, a: torch.where(c, a, -a), m, x)
    check(lambda a, c: a.masked_fill(c, 7.0), x, m)
    check(lambda a: a.clamp(-0.5, 0.5), x)
    check(lambda a: a.clamp(min=0), x)
    check(lambda a, lo: torch.clamp(a, min=lo), x, make((4, 5), torch.float32, seed=9))


def test_addcmul_addcdiv_lerp():
    a, b, c = (make((3, 4), torch.float32, 0.5, 2, seed=s) for s in range(3))
    check(lambda x, y, z: torch.addcmul(x, y, z, value=0.3), a, b, c)
    check(lambda x, y, z: torch.addcdiv(x, y, z, value=-0.7), a, b, c)
    check(lambda x, y: torch.lerp(x, y, 0.25), a, b)
    check(lambda x, y, w: torch.lerp(x, y, w), a, b, c)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8,
                                   torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool])
def test_round_trip_and_casts(dtype):
    x = make((3, 5), dtype)
    assert torch.equal(x.to("pjrt").cpu(), x)
    for target in (torch.float32, torch.int32, torch.bool, torch.bfloat16):
        check(lambda t: t.to(target), x)


@pytest.mark.parametrize("dtype", FLOATS)
def test_reductions(dtype):
    x = make((4, 6, 5), dtype)
    check(lambda t: t.sum(), x)
    check(lambda t: t.sum(dim=(0, 2), keepdim=True), x)
    check(lambda t: t.mean(1), x)
    check(lambda t: t.amax(dim=2), x)
    check(lambda t: t.amin(dim=(0, 1)), x)
    check(lambda t: t.max(), x)
    check(lambda t: t.min(dim=1), x)
    check(lambda t: t.max(dim=-1, keepdim=True), x)
    check(lambda t: t.argmax(dim=1), x)
    check(lambda t: t.argmin(), x)
    check(lambda t: t.var(dim=1), x)
    check(lambda t: t.std(dim=(0, 2), correction=0), x)
    check(lambda t: t.logsumexp(dim=2), x)
    check(lambda t: t.softmax(dim=1), x)
    check(lambda t: t.log_softmax(dim=-1), x)
    check(lambda t: t.prod(dim=0), x)
    for ord in (2, 1, 3, float("inf"), 0):
        check(lambda t: torch.linalg.vector_norm(t, ord), x)
    check(lambda t: torch.linalg.vector_norm(t, 2, dim=(0, 2), keepdim=True), x)
    check(lambda t: t.norm(dim=1), x)


def test_int_bool_reductions():
    i = make((4, 5), torch.int64)
    check(lambda t: t.sum(), i)
    check(lambda t: t.sum(1), i)
    check(lambda t: t.max(dim=1), i)
    check(lambda t: t.argmax(), i)
    b = make((4, 5), torch.bool)
    check(lambda t: t.all(), b)
    check(lambda t: t.any(dim=1), b)
    check(lambda t: t.sum(), b)


def test_argmax_ties_and_nan_like_cpu():
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [float("nan"), 1.0, float("nan"), 5.0]])
    check(lambda t: t.argmax(dim=1), x)
    check(lambda t: t.max(dim=1), x)


@pytest.mark.parametrize("dtype", FLOATS)
def test_matmul_family(dtype):
    a, b = make((5, 7), dtype), make((7, 3), dtype, seed=1)
    check(torch.mm, a, b)
    check(torch.matmul, a, b)
    check(lambda x, y, z: torch.addmm(z, x, y, beta=0.5, alpha=2.0), a, b, make((3,), dtype, seed=2))
    ba, bb = make((2, 5, 7), dtype), make((2, 7, 3), dtype, seed=3)
    check(torch.bmm, ba, bb)
    check(torch.matmul, ba, make((7, 3), dtype))
    check(lambda x, y: torch.baddbmm(torch.zeros(2, 5, 3, dtype=dtype, device=x.device), x, y), ba, bb)
    v, w = make((7,), dtype), make((7,), dtype, seed=4)
    check(torch.dot, v, w)
    check(torch.matmul, a, v)
    check(lambda x, y: F.linear(x, y), make((4, 7), dtype), make((3, 7), dtype))


def test_addmm_beta_zero_ignores_nan():
    c = torch.full((2, 2), float("nan"))
    check(lambda z, x, y: torch.addmm(z, x, y, beta=0), c, make((2, 3), torch.float32), make((3, 2), torch.float32))


def test_cat_stack_split():
    a, b = make((2, 3), torch.float32), make((4, 3), torch.float32, seed=1)
    check(lambda x, y: torch.cat([x, y]), a, b)
    check(lambda x, y: torch.cat([x, y.t()[:, :2].contiguous().t()], dim=0), a, b)
    check(lambda x: torch.stack([x, x * 2], dim=1), a)
    check(lambda x, y: torch.cat([x.int(), y]), a, b)  # promotion
    check(lambda x: [t * 1 for t in x.split(1, dim=0)], a)


def test_indexing_ops():
    x = make((5, 4), torch.float32)
    idx = torch.tensor([4, 0, 2, 2])
    check(lambda t, i: t.index_select(0, i), x, idx)
    check(lambda t, i: t.index_select(1, i), x, torch.tensor([3, 0]))
    check(lambda t, i: t[i], x, idx)
    check(lambda t, i: t[:, i], x, torch.tensor([3, 0, 2]))
    check(lambda t, i: t[i, i], x, torch.tensor([0, 1, 3]))
    check(lambda t: t[torch.tensor([-1, -5])], x)
    gi = torch.tensor([[0, 1], [3, 2], [1, 1], [0, 0], [2, 3]])
    check(lambda t, i: t.gather(1, i), x, gi)
    check(lambda t, i: torch.zeros(5, 4, device=t.device).scatter(1, i, t[:, :2].contiguous()), x, gi)
    check(lambda t, i: torch.zeros(5, 4, device=t.device).scatter_add(1, i, t[:, :2].contiguous()), x, gi)
    check(lambda t, i: torch.zeros(5, 4, device=t.device).scatter(1, i, 2.5), x, gi)
    check(lambda t: t[t > 0], x)  # boolean masks: nonzero reads the mask on the host (a sync)
    check(lambda t: t[t[:, 0] > 0], x)
    check(lambda t: torch.masked_select(t, t > 0.5), x)
    check(lambda t: torch.nonzero(t > 0), x)
    check(lambda t: torch.masked_select(t, torch.tensor(True, device=t.device)), x[0, 0])


def test_index_put():
    def put(t, i, v):
        t = t.clone()
        t[i] = v
        return t

    def acc(t, i, v):
        t = t.clone()
        t.index_put_((i,), v, accumulate=True)
        return t

    x = make((5, 3), torch.float32)
    i = torch.tensor([0, 3])
    check(put, x, i, make((2, 3), torch.float32, seed=7))
    check(put, x, i, 1.5)
    check(acc, x, torch.tensor([1, 1, 4]), make((3, 3), torch.float32, seed=2))

    def put_cols(t, i, v):
        t = t.clone()
        t[:, i] = v
        return t

    check(put_cols, x, torch.tensor([2, 0]), make((5, 2), torch.float32, seed=3))


def test_embedding_and_backward():
    w = make((10, 4), torch.float32)
    idx = torch.tensor([[1, 2, 9], [0, 2, 2]])
    check(F.embedding, idx, w)
    wd = w.clone().to("pjrt").requires_grad_()
    wc = w.clone().requires_grad_()
    F.embedding(idx.to("pjrt"), wd, padding_idx=2).pow(2).sum().backward()
    F.embedding(idx, wc, padding_idx=2).pow(2).sum().backward()
    assert_close(wd.grad, wc.grad)


def test_layer_norm_and_backward():
    x = make((3, 4, 8), torch.float32)
    w, b = make((8,), torch.float32, seed=1), make((8,), torch.float32, seed=2)
    check(lambda t, ww, bb: F.layer_norm(t, (8,), ww, bb), x, w, b)
    check(lambda t: F.layer_norm(t, (4, 8)), x)
    tensors = [t.clone().requires_grad_() for t in (x, w, b)]
    dev_tensors = [t.detach().to("pjrt").requires_grad_() for t in (x, w, b)]
    for ts in (tensors, dev_tensors):
        (F.layer_norm(ts[0], (8,), ts[1], ts[2]) * torch.linspace(-1, 1, 8, device=ts[0].device)).sum().backward()
    for c, d in zip(tensors, dev_tensors):
        assert_close(d.grad, c.grad, atol=1e-4, rtol=1e-4)


def test_losses_and_backward():
    logits = make((6, 5), torch.float32)
    target = torch.tensor([0, 4, 2, 1, 1, 3])
    check(F.cross_entropy, logits, target)
    check(lambda a, b: F.cross_entropy(a, b, reduction="sum"), logits, target)
    check(lambda a, b: F.cross_entropy(a, b, reduction="none"), logits, target)
    check(lambda a, b: F.cross_entropy(a, b, ignore_index=1), logits, target)
    check(lambda a, b, w: F.cross_entropy(a, b, weight=w), logits, target, make((5,), torch.float32, 0.5, 2))
    c = logits.clone().requires_grad_()
    d = logits.to("pjrt").requires_grad_()
    F.cross_entropy(c, target, ignore_index=1).backward()
    F.cross_entropy(d, target.to("pjrt"), ignore_index=1).backward()
    assert_close(d.grad, c.grad)
    check(F.mse_loss, logits, make((6, 5), torch.float32, seed=4))


def test_sdpa_math_path():
    q, k, v = (make((2, 3, 5, 4), torch.float32, seed=s) for s in range(3))
    check(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), q, k, v)


def test_factories_and_fills(dev):
    assert_close(torch.zeros(3, 2, device=dev), torch.zeros(3, 2))
    assert_close(torch.ones(2, dtype=torch.int32, device=dev), torch.ones(2, dtype=torch.int32))
    assert_close(torch.full((2, 2), 3.5, device=dev), torch.full((2, 2), 3.5))
    assert_close(torch.arange(5, device=dev), torch.arange(5))
    assert_close(torch.arange(1.0, 2.0, 0.25, device=dev), torch.arange(1.0, 2.0, 0.25))
    assert_close(torch.arange(10, 0, -3, device=dev), torch.arange(10, 0, -3))
    assert_close(torch.triu(torch.ones(4, 4, device=dev), 1), torch.triu(torch.ones(4, 4), 1))
    assert_close(torch.tril(torch.ones(3, 5, device=dev), -1), torch.tril(torch.ones(3, 5), -1))
    e = torch.empty(4, device=dev)
    e.fill_(2)
    assert_close(e, torch.full((4,), 2.0))
    assert_close(torch.zeros_like(e).zero_(), torch.zeros(4))


BACKWARD = {
    "sigmoid": torch.sigmoid, "tanh": torch.tanh, "relu": torch.relu, "silu": F.silu,
    "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "softmax": lambda t: t.softmax(-1),
    "log_softmax": lambda t: t.log_softmax(0), "dropout_eval": lambda t: F.dropout(t, 0.3, training=False),
    "exp_log1p": lambda t: torch.log1p(t.exp()), "mse": lambda t: F.mse_loss(t, torch.ones_like(t)),
    "matmul": lambda t: t @ t.t(), "sum_mean": lambda t: t.sum(0) * t.mean(1, keepdim=True),
    "max_dim": lambda t: t.max(dim=1).values, "norm": lambda t: torch.linalg.vector_norm(t, dim=1),
    "where": lambda t: torch.where(t > 0, t * 2, t.pow(2)), "clamp": lambda t: t.clamp(-0.5, 0.5),
}


@pytest.mark.parametrize("name", list(BACKWARD))
def test_backward_kernels_match_cpu(name):
    fn = BACKWARD[name]
    x = make((4, 6), torch.float32)
    w = make(tuple(fn(x).shape), torch.float32, seed=11)  # a non-uniform upstream gradient
    grads = []
    for device in ("cpu", "pjrt"):
        t = x.detach().clone().to(device).requires_grad_()
        with torch_pjrt.fallback_mode("error"):
            (fn(t) * w.to(device)).sum().backward()
        grads.append(t.grad)
    assert_close(grads[1], grads[0])
