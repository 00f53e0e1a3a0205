"""Complex dtypes and spectral ops natively: complex64/complex128 storage and
views, pointwise math, reductions and matmul, autograd by PyTorch's complex
convention, the torch.fft family and stft/istft, and a Llama-style block with
complex rotary embeddings, all against CPU with the CPU fallback forbidden."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import assert_close

import torch_pjrt

CDTYPES = [torch.complex64, torch.complex128]


def crandn(*shape: int, dtype: torch.dtype = torch.complex64) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype)


@pytest.fixture(autouse=True)
def _no_fallback():
    with torch_pjrt.fallback_mode("error"):
        yield


@pytest.mark.parametrize("dtype", CDTYPES)
def test_storage_round_trip_and_views(dev: torch.device, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x = crandn(4, 6, dtype=dtype)
    d = x.to(dev)
    assert d.dtype == dtype
    assert_close(d, x)
    assert_close(d.real, x.real)
    assert_close(d.imag, x.imag)
    assert_close(torch.view_as_real(d), torch.view_as_real(x))
    real_dtype = torch.float32 if dtype == torch.complex64 else torch.float64
    assert_close(d.view(real_dtype), x.view(real_dtype))
    r = torch.randn(3, 5, 2, dtype=real_dtype)
    assert_close(torch.view_as_complex(r.to(dev)), torch.view_as_complex(r))
    assert_close(r.to(dev).view(dtype), r.view(dtype))
    # Views share storage: writes through .real / .imag / view_as_real land in the complex tensor.
    y, e = x.clone(), d.clone()
    y.real.mul_(2)
    e.real.mul_(2)
    y.imag[1:3] = 5
    e.imag[1:3] = 5
    torch.view_as_real(y)[0, :, 1] = -1
    torch.view_as_real(e)[0, :, 1] = -1
    assert_close(e, y)
    # Conjugate views are lazy bits: resolved by copies and materializing ops.
    assert d.conj().is_conj()
    assert_close(d.conj().resolve_conj(), x.conj().resolve_conj())
    assert_close(d.conj() * d, x.conj() * x)
    torch.testing.assert_close(d.conj().cpu().resolve_conj(), x.conj().resolve_conj(), rtol=0, atol=0)
    z = d.clone()
    z.conj_physical_()
    assert_close(z, x.conj_physical())
    assert_close(torch.conj_physical(d), torch.conj_physical(x))
    # Real <-> complex casts.
    assert_close(r[..., 0].to(dev).to(dtype), r[..., 0].to(dtype))
    assert_close(d.to(torch.complex128 if dtype == torch.complex64 else torch.complex64),
                 x.to(torch.complex128 if dtype == torch.complex64 else torch.complex64))


def test_factories_and_random(dev: torch.device) -> None:
    assert_close(torch.zeros(3, dtype=torch.complex64, device=dev), torch.zeros(3, dtype=torch.complex64))
    assert_close(torch.ones(2, 3, dtype=torch.complex128, device=dev), torch.ones(2, 3, dtype=torch.complex128))
    assert_close(torch.full((3,), 1 - 2j, device=dev), torch.full((3,), 1 - 2j))
    r = torch.randn(20000, dtype=torch.complex64, device=dev).cpu()
    # Each part has variance 1/2 (torch's convention): 5 sigma bounds on the sample variance.
    for part in (r.real, r.imag):
        assert abs(part.var().item() - 0.5) < 5 * 0.5 * math.sqrt(2 / 20000)
        assert abs(part.mean().item()) < 5 * math.sqrt(0.5 / 20000)
    u = torch.empty(1000, dtype=torch.complex64, device=dev).uniform_(-1, 2).cpu()
    assert u.real.min() >= -1 and u.real.max() < 2 and u.imag.min() >= -1 and u.imag.max() < 2


UNARY = ["neg", "exp", "log", "sqrt", "sin", "cos", "tanh", "sigmoid", "reciprocal", "abs", "angle", "sgn",
         "log1p", "expm1", "square", "rsqrt"]


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("name", UNARY)
def test_unary(dev: torch.device, dtype: torch.dtype, name: str) -> None:
    torch.manual_seed(1)
    x = crandn(5, 7, dtype=dtype)
    x[0, 0] = 0  # sgn and abs at zero
    if name in ("log", "reciprocal", "rsqrt"):
        x[0, 0] = 1
    fn = getattr(torch, name)
    assert_close(fn(x.to(dev)), fn(x), **_tol(dtype, 4))


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("name", ["sqrt", "asin", "acos", "asinh", "acosh", "atan", "abs", "angle", "sgn"])
def test_branch_cuts_signed_zeros_and_nan(dev: torch.device, dtype: torch.dtype, name: str) -> None:
    # A signed zero names the side of a branch cut (sqrt(-2 - 0j) = -1.41j); a NaN part makes
    # abs NaN (XLA's fast min/max dropped it).
    v = torch.tensor([-2.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, float("nan")], dtype=torch.float64)
    z = torch.complex(v[:, None].expand(9, 9), v[None, :].expand(9, 9)).flatten().to(dtype)
    fn = getattr(torch, name)
    out, ref = fn(z.to(dev)).cpu(), fn(z)
    assert_close(out.to(dev), ref, **_tol(dtype, 8))
    parts = (lambda t: (t.real, t.imag)) if out.is_complex() else (lambda t: (t,))
    for o, r in zip(parts(out), parts(ref)):
        # Signs of nonzero parts (a zero's sign off a cut is a convention; a NaN's means nothing).
        numbers = ~(o.isnan() | r.isnan()) & (r != 0)
        assert torch.equal(torch.signbit(o[numbers]), torch.signbit(r[numbers])), (z, out, ref)


def _tol(dtype: torch.dtype, ulps: float) -> dict:
    eps = torch.finfo(torch.float32 if dtype == torch.complex64 else torch.float64).eps
    return dict(rtol=ulps * eps, atol=ulps * eps)


@pytest.mark.parametrize("dtype", CDTYPES)
def test_binary_reductions_matmul(dev: torch.device, dtype: torch.dtype) -> None:
    torch.manual_seed(2)
    x, y = crandn(4, 6, dtype=dtype), crandn(4, 6, dtype=dtype)
    xd, yd = x.to(dev), y.to(dev)
    tol = _tol(dtype, 8)
    for op in (torch.add, torch.sub, torch.mul, torch.div):
        assert_close(op(xd, yd), op(x, y), **tol)
    assert_close(xd * (2 - 1j), x * (2 - 1j), **tol)
    assert_close(xd + 3, x + 3, **tol)
    real = torch.randn(6)
    assert_close(xd * real.to(dev), x * real, **tol)
    assert_close(torch.pow(xd, 2), torch.pow(x, 2), **_tol(dtype, 16))
    assert_close(xd == xd.clone(), x == x.clone())
    assert_close(xd != yd, x != y)
    # Reductions grow error with the number of terms: bounded by n ulps of the largest magnitude.
    for fn in (lambda t: t.sum(0), lambda t: t.sum(), lambda t: t.mean(1), lambda t: t.prod(0)):
        assert_close(fn(xd), fn(x), **_tol(dtype, 16))
    k = 6
    assert_close(xd @ yd.T, x @ y.T, **_tol(dtype, 4 * k))
    b1, b2 = crandn(3, 4, 5, dtype=dtype), crandn(3, 5, 2, dtype=dtype)
    assert_close(torch.bmm(b1.to(dev), b2.to(dev)), torch.bmm(b1, b2), **_tol(dtype, 20))
    assert_close(torch.cat([xd, yd], 1), torch.cat([x, y], 1))
    assert_close(torch.stack([xd, yd]).transpose(0, 2).contiguous(), torch.stack([x, y]).transpose(0, 2).contiguous())
    idx = torch.tensor([3, 0, 2])
    assert_close(xd[idx], x[idx])
    assert_close(torch.where(xd.real > 0, xd, yd), torch.where(x.real > 0, x, y))


def test_complex_and_polar(dev: torch.device) -> None:
    torch.manual_seed(3)
    a, b = torch.randn(4, 5), torch.randn(5)
    assert_close(torch.complex(a.to(dev), b.to(dev)), torch.complex(a, b))
    assert_close(torch.polar(a.abs().to(dev), b.to(dev)), torch.polar(a.abs(), b), **_tol(torch.complex64, 4))
    with pytest.raises(RuntimeError, match="complex"):
        torch.complex(a.to(dev), b.to(dev).double())


def test_autograd_follows_pytorch_convention(dev: torch.device) -> None:
    # Gradients of a real loss w.r.t. complex leaves are conj(dL/dz) as PyTorch defines them.
    torch.manual_seed(4)
    z = crandn(6).requires_grad_()
    w = crandn(6).requires_grad_()
    zd = z.detach().to(dev).requires_grad_()
    wd = w.detach().to(dev).requires_grad_()

    def loss(z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return ((z * w).abs() + (z.conj() * w.exp()).real + torch.view_as_real(z / (w + 2)).sum(-1)).sum()

    loss(z, w).backward()
    loss(zd, wd).backward()
    assert_close(zd.grad, z.grad, **_tol(torch.complex64, 16))
    assert_close(wd.grad, w.grad, **_tol(torch.complex64, 16))


def _fft_tol(x: torch.Tensor, n: int) -> dict:
    # An FFT of n points errs by about eps * log2(n) * ||x||_2 (a blocked sum of n terms):
    # allow 4x that, absolute, and nothing relative.
    eps = torch.finfo(torch.float32).eps
    return dict(rtol=0, atol=4 * eps * max(1.0, math.log2(n)) * x.abs().pow(2).sum().sqrt().item())


FFTS = [
    ("fft", dict(), True), ("ifft", dict(norm="ortho"), True), ("fft", dict(n=12, norm="forward"), True),
    ("rfft", dict(), False), ("irfft", dict(n=9), True), ("hfft", dict(), True), ("ihfft", dict(), False),
    ("fft2", dict(), True), ("ifft2", dict(norm="forward"), True), ("rfft2", dict(), False), ("irfft2", dict(), True),
    ("fftn", dict(), True), ("rfftn", dict(), False), ("irfftn", dict(dim=(0, 1, 2, 3)), True),
]


@pytest.mark.parametrize("name,kw,complex_input", FFTS, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(FFTS)])
def test_fft_family_forward_and_backward(dev: torch.device, name: str, kw: dict, complex_input: bool) -> None:
    torch.manual_seed(5)
    x = torch.randn(3, 4, 5, 8, dtype=torch.complex64 if complex_input else torch.float32)  # 4 dims: fftn splits
    ref = x.to(torch.complex128 if complex_input else torch.float64).requires_grad_()
    xd = x.to(dev).requires_grad_()
    fn = getattr(torch.fft, name)
    out_ref, out = fn(ref, **kw), fn(xd, **kw)
    assert out.dtype == fn(x, **kw).dtype
    assert_close(out, out_ref.to(out.dtype), **_fft_tol(x, x.numel()))
    w = torch.randn(out.shape, dtype=out.dtype)
    (out_ref * w.to(out_ref.dtype)).real.sum().backward()
    (out * w.to(dev)).real.sum().backward()
    assert_close(xd.grad, ref.grad.to(x.dtype), **_fft_tol(w, x.numel()))


def test_fftshift_and_freqs(dev: torch.device) -> None:
    x = crandn(6, 5)
    assert_close(torch.fft.fftshift(x.to(dev)), torch.fft.fftshift(x))
    assert_close(torch.fft.ifftshift(x.to(dev), dim=1), torch.fft.ifftshift(x, dim=1))
    assert_close(torch.fft.rfftfreq(10, device=dev), torch.fft.rfftfreq(10))


def test_stft_and_istft_of_an_audio_signal(dev: torch.device) -> None:
    torch.manual_seed(6)
    t = torch.arange(8000) / 8000
    signal = torch.sin(2 * math.pi * 440 * t) + 0.5 * torch.sin(2 * math.pi * 1000 * t) + 0.1 * torch.randn(8000)
    signal = signal.unsqueeze(0).repeat(2, 1)
    window = torch.hann_window(400)
    kw = dict(n_fft=512, hop_length=160, win_length=400, return_complex=True)
    ref = signal.double().requires_grad_()
    sd = signal.to(dev).requires_grad_()
    spec_ref = torch.stft(ref, window=window.double(), **kw)
    spec = torch.stft(sd, window=window.to(dev), **kw)
    assert spec.shape == spec_ref.shape and spec.dtype == torch.complex64
    frame = signal[0, :512]
    assert_close(spec, spec_ref.to(torch.complex64), **_fft_tol(frame, 512))
    back = torch.istft(spec, n_fft=512, hop_length=160, win_length=400, window=window.to(dev), length=8000)
    back_ref = torch.istft(spec_ref, n_fft=512, hop_length=160, win_length=400, window=window.double(), length=8000)
    assert_close(back, back_ref.float(), **_fft_tol(frame, 512))
    assert_close(back, signal, atol=1e-4, rtol=0)  # perfect reconstruction
    # Backward through the magnitude spectrogram (an audio front end's loss).
    spec_ref.abs().pow(2).sum().backward()
    spec.abs().pow(2).sum().backward()
    assert_close(sd.grad, ref.grad.float(), rtol=1e-4, atol=1e-3 * ref.grad.abs().max().item())


class RotaryBlock(nn.Module):
    """A Llama-style block: RMSNorm, attention with complex rotary embeddings
    (Meta's reference formulation: view_as_complex / polar), SwiGLU MLP."""

    def __init__(self, dim: int = 32, heads: int = 4, seq: int = 16) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.w1, self.w2, self.w3 = nn.Linear(dim, 64, bias=False), nn.Linear(64, dim, bias=False), nn.Linear(dim, 64, bias=False)
        self.norm1, self.norm2 = nn.RMSNorm(dim), nn.RMSNorm(dim)
        freqs = 1.0 / (10000.0 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        angles = torch.outer(torch.arange(seq).float(), freqs)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles))

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        fc = self.freqs_cis[: x.shape[1]].view(1, x.shape[1], 1, xc.shape[-1])
        return torch.view_as_real(xc * fc).flatten(3).type_as(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.norm1(x)
        q, k, v = (w(h).view(b, t, self.heads, self.head_dim) for w in (self.wq, self.wk, self.wv))
        q, k = self.rotate(q), self.rotate(k)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.wo(attn.transpose(1, 2).reshape(b, t, -1))
        h = self.norm2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def test_llama_block_with_complex_rotary_embeddings(dev: torch.device) -> None:
    torch.manual_seed(7)
    cpu = RotaryBlock().double()
    model = RotaryBlock().to(dev)
    model.load_state_dict({k: v.to(model.state_dict()[k].dtype) for k, v in cpu.state_dict().items()})
    x = torch.randn(2, 16, 32, dtype=torch.float64)
    xd = x.float().to(dev)
    y_ref, y = cpu(x), model(xd)
    assert_close(y, y_ref.float(), rtol=1e-4, atol=1e-4)
    y_ref.square().mean().backward()
    y.square().mean().backward()
    for (name, p), q in zip(cpu.named_parameters(), model.parameters()):
        assert_close(q.grad, p.grad.float(), rtol=1e-3, atol=1e-4 * max(1.0, p.grad.abs().max().item()))


def test_bad_input_names_the_op(dev: torch.device) -> None:
    x = torch.randn(4).to(dev)
    with pytest.raises(RuntimeError, match="last dimension of size 2"):
        torch.view_as_complex(x.view(2, 2)[:, :1].contiguous())
    with pytest.raises(RuntimeError):
        torch.fft.irfft(x, n=0)


@pytest.mark.parametrize("dtype", CDTYPES)
def test_reductions_with_real_results(dev: torch.device, dtype: torch.dtype) -> None:
    torch.manual_seed(8)
    x = crandn(4, 6, dtype=dtype)
    xd = x.to(dev)
    tol = _tol(dtype, 32)
    cases = [
        lambda t: torch.var(t, 1), lambda t: torch.std(t), lambda t: torch.var(t, 0, correction=0),
        lambda t: torch.var_mean(t, 1), lambda t: torch.std_mean(t, 0),
        lambda t: torch.linalg.vector_norm(t), lambda t: torch.linalg.vector_norm(t, 1, dim=1),
        lambda t: torch.linalg.vector_norm(t, 3, dim=0), lambda t: torch.linalg.vector_norm(t, float("inf")),
        lambda t: torch.linalg.norm(t), lambda t: torch.nn.functional.normalize(t, dim=1),
        lambda t: torch.renorm(t, 2, 0, 1.0),
        lambda t: torch.logsumexp(t, 1), lambda t: torch.logcumsumexp(t, 1),
    ]
    for i, fn in enumerate(cases):
        out, ref = fn(xd), fn(x)
        for o, r in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
            assert o.dtype == r.dtype, i
            assert_close(o, r, **tol)


@pytest.mark.parametrize("dtype", CDTYPES)
def test_inverse_trig_and_logaddexp(dev: torch.device, dtype: torch.dtype) -> None:
    torch.manual_seed(9)
    z = crandn(64, dtype=dtype) * 3
    # The branch cuts (|re| > 1 on the real axis, |im| > 1 on the imaginary one), on both sides.
    cuts = [complex(2, 0.0), complex(2, -0.0), complex(-2, 0.0), complex(-2, -0.0), complex(0.0, 3), complex(-0.0, -3),
            complex(0.5, 0.0), 0j]
    z = torch.cat([z, torch.tensor(cuts, dtype=dtype)])
    ref_dtype = torch.complex128
    for fn in (torch.asin, torch.acos, torch.atan):
        # A few ulps of the result's size, from the float64 result.
        ref = fn(z.to(ref_dtype))
        assert_close(fn(z.to(dev)).to(ref_dtype), ref, **_tol(dtype, 16)), fn.__name__
    w = crandn(64, dtype=dtype) * 3
    edge = torch.tensor([complex(float("-inf"), 1), complex(float("inf"), 0), complex(float("nan"), 0)], dtype=dtype)
    a, b = torch.cat([z[:64], edge]), torch.cat([w, edge])
    assert_close(torch.logaddexp(a.to(dev), b.to(dev)), torch.logaddexp(a, b), equal_nan=True, **_tol(dtype, 16))
    # Equal real parts: which operand is "lower" decides the branch of the imaginary part, as
    # does the order in which logcumsumexp combines; a NaN on either side gives NaN.
    ties_a = torch.tensor([3j, complex(float("-inf"), 0), complex(float("-inf"), float("nan"))], dtype=dtype)
    ties_b = torch.tensor([-3j, complex(float("-inf"), float("nan")), complex(float("-inf"), 0)], dtype=dtype)
    assert_close(torch.logaddexp(ties_a.to(dev), ties_b.to(dev)), torch.logaddexp(ties_a, ties_b), **_tol(dtype, 16))
    run = torch.tensor([3j, -3j, 1 + 2j, 1 - 2j, 1 + 0.5j], dtype=dtype)
    assert_close(torch.logcumsumexp(run.to(dev), 0), torch.logcumsumexp(run, 0), **_tol(dtype, 16))
    with pytest.raises(RuntimeError, match="dtype should be complex for complex inputs"):
        torch.linalg.vector_norm(z.to(dev), dtype=torch.float32)


@pytest.mark.parametrize("dtype", CDTYPES)
def test_sigmoid_at_infinities_and_overflow_as_on_cpu(dev: torch.device, dtype: torch.dtype) -> None:
    # torch's CPU kernel (and numpy, the test files' reference) computes 1 / (1 + e^-z): 1 at
    # inf + inf i, and NaN where e^-z overflows to inf +- inf i; XLA's logistic answered 0 and NaN.
    v = [float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 1.0, -3.0, 100.0, -100.0, -1000.0, 1000.0]
    z = torch.tensor([complex(a, b) for a in v for b in v], dtype=dtype)
    z = torch.cat([z, crandn(2000, dtype=dtype) * 300])
    assert_close(torch.sigmoid(z.to(dev)), torch.sigmoid(z), **_tol(dtype, 8))


@pytest.mark.parametrize("dtype", CDTYPES)
def test_division_near_the_dtype_limits(dev: torch.device, dtype: torch.dtype) -> None:
    # Smith's scale here is past 1 / the smallest normal: its reciprocal is subnormal, which
    # XLA's CPU flushes to zero (the quotient came out 0 instead of 1).
    info = torch.finfo(dtype)
    nom = torch.tensor([complex(info.min / 2, info.min / 2), complex(info.max / 2, info.max / 2),
                        complex(info.tiny, info.tiny), complex(info.tiny, 0.0)], dtype=dtype)
    den = torch.tensor([complex(info.min / 2, info.min / 2), complex(info.max / 2, info.max / 2),
                        complex(info.tiny, info.tiny), complex(0.0, info.tiny)], dtype=dtype)
    expected = torch.tensor([1, 1, 1, -1j], dtype=dtype)
    torch.testing.assert_close(nom / den, expected)  # the CPU's own answer, within a few ulps
    torch.testing.assert_close((nom.to(dev) / den.to(dev)).cpu(), expected)


@pytest.mark.parametrize("dtype", CDTYPES)
def test_division_reciprocal_and_rsqrt_at_special_values_as_on_cpu(dev: torch.device, dtype: torch.dtype) -> None:
    # torch's CPU (and numpy) divide by Smith's algorithm with no recovery of infinities:
    # 1 / (inf + inf i) is NaN there, and a / 0 is a.real / 0 + a.imag / 0 i; XLA's division
    # gave C99's limits (0) instead.
    v = [float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 1.0, -3.0, 1e30, -1e-30, 2.5]
    z = torch.tensor([complex(a, b) for a in v for b in v], dtype=dtype)
    x, y = z[:, None].expand(len(z), len(z)).flatten(), z[None, :].expand(len(z), len(z)).flatten()
    x, y = torch.cat([x, crandn(2000, dtype=dtype)]), torch.cat([y, crandn(2000, dtype=dtype)])
    tol = _tol(dtype, 8)
    assert_close(x.to(dev) / y.to(dev), x / y, **tol)
    assert_close(torch.reciprocal(y.to(dev)), torch.reciprocal(y), **tol)
    assert_close(torch.rsqrt(y.to(dev)), torch.rsqrt(y), **tol)
