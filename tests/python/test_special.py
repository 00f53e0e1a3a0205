"""Special functions, integer math and data-dependent ops natively: the
orthogonal polynomial families, Bessel aliases, gcd/lcm, frexp, narrow_copy,
bincount, nonzero_static, unique, ormqr, against CPU with the CPU fallback
forbidden."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_close

import torch_pjrt

POLYNOMIALS = [
    "chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l",
    "legendre_polynomial_p",
]


@pytest.fixture(autouse=True)
def _no_fallback():
    with torch_pjrt.fallback_mode("error"):
        yield


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_orthogonal_polynomials(dev: torch.device, name: str) -> None:
    torch.manual_seed(0)
    x = torch.rand(64) * 2 - 1
    n = torch.randint(-1, 10, (64,)).float()
    fn = getattr(torch.special, name)
    ref = fn(x.double(), n.double())
    out = fn(x.to(dev), n.to(dev))
    assert out.dtype == fn(x, n).dtype
    # A degree-n recurrence accumulates about n rounding errors of the running values' size.
    scale = 1 + ref.abs()
    err = ((out.cpu().double() - ref).abs() / scale).max().item()
    assert err <= 10 * 10 * torch.finfo(torch.float32).eps, err
    # Broadcasting a scalar-like degree.
    assert_close(fn(x.to(dev), torch.tensor(3.0).to(dev)), fn(x, torch.tensor(3.0)), rtol=1e-5, atol=1e-5)


def test_bessel_aliases(dev: torch.device) -> None:
    x = torch.linspace(-8, 8, 101)
    for fn in (torch.special.modified_bessel_i0, torch.special.modified_bessel_i1):
        ref = fn(x.double())
        assert_close(fn(x.to(dev)), ref.float(), rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    assert_close(torch.special.spherical_bessel_j0(x.to(dev)), torch.special.spherical_bessel_j0(x), rtol=1e-6, atol=1e-6)


def test_gcd_lcm(dev: torch.device) -> None:
    torch.manual_seed(1)
    a, b = torch.randint(-60, 60, (40,)), torch.randint(-60, 60, (40,))
    a[:3], b[1:4] = 0, 0
    assert_close(torch.gcd(a.to(dev), b.to(dev)), torch.gcd(a, b))
    assert_close(torch.lcm(a.to(dev), b.to(dev)), torch.lcm(a, b))
    c = a.to(dev).to(torch.int32)
    c.gcd_(b.to(dev).to(torch.int32))
    assert_close(c, torch.gcd(a, b).to(torch.int32))
    u, v = a.abs().to(torch.uint8), b.abs().to(torch.uint8)  # unsigned: no stablehlo.abs of them
    assert_close(torch.gcd(u.to(dev), v.to(dev)), torch.gcd(u, v))
    assert_close(torch.lcm(u.to(dev), v.to(dev)), torch.lcm(u, v))
    with pytest.raises(RuntimeError, match="integer"):
        torch.gcd(torch.ones(2).to(dev), torch.ones(2).to(dev))


def test_frexp(dev: torch.device) -> None:
    # Subnormal inputs are not covered: XLA's CPU code flushes them to zero.
    v = torch.tensor([0.0, -0.0, 1.0, 0.5, 3.0, -7.25, 1e-30, float("inf"), float("nan"), 2.0**20, 0.75, -1e20])
    for dtype in (torch.float32, torch.float64):
        m, e = torch.frexp(v.to(dtype))
        md, ed = torch.frexp(v.to(dtype).to(dev))
        assert_close(md, m)
        assert_close(ed, e)


def test_data_movers(dev: torch.device) -> None:
    torch.manual_seed(2)
    t = torch.randn(4, 6)
    assert_close(t.to(dev).narrow_copy(1, -4, 3), t.narrow_copy(1, -4, 3))
    i, w = torch.randint(0, 7, (30,)), torch.rand(30)
    assert_close(torch.bincount(i.to(dev)), torch.bincount(i))
    assert_close(torch.bincount(i.to(dev), w.to(dev), minlength=10), torch.bincount(i, w, minlength=10))
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.bincount(torch.tensor([1, -1]).to(dev))
    z = (torch.randn(3, 4) > 0.3).float()
    for size in (0, 2, 5, 20):
        assert_close(torch.nonzero_static(z.to(dev), size=size), torch.nonzero_static(z, size=size))
        assert_close(torch.nonzero_static(z.to(dev), size=size, fill_value=7), torch.nonzero_static(z, size=size, fill_value=7))


@pytest.mark.parametrize("kw", [dict(), dict(return_inverse=True), dict(return_counts=True),
                                dict(return_inverse=True, return_counts=True)], ids=["plain", "inverse", "counts", "both"])
def test_unique(dev: torch.device, kw: dict) -> None:
    torch.manual_seed(3)
    x = torch.randint(0, 6, (4, 5))
    got, ref = torch.unique(x.to(dev), **kw), torch.unique(x, **kw)
    for g, r in zip(got if isinstance(got, tuple) else (got,), ref if isinstance(ref, tuple) else (ref,)):
        assert_close(g, r)
    assert torch.unique(torch.tensor([]).to(dev)).numel() == 0


def test_ormqr(dev: torch.device) -> None:
    torch.manual_seed(4)
    a = torch.randn(5, 3, dtype=torch.float64)
    refl, tau = torch.geqrf(a)
    c = torch.randn(5, 2, dtype=torch.float64)
    for left, transpose, other in ((True, False, c), (True, True, c), (False, False, c.T), (False, True, c.T)):
        ref = torch.ormqr(refl, tau, other, left, transpose)
        out = torch.ormqr(refl.float().to(dev), tau.float().to(dev), other.float().to(dev), left, transpose)
        assert_close(out, ref.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("upper", [False, True], ids=["igamma", "igammac"])
def test_incomplete_gamma(dev: torch.device, upper: bool) -> None:
    torch.manual_seed(5)
    a = torch.rand(200, dtype=torch.float64) * 20 + 0.05
    x = torch.rand(200, dtype=torch.float64) * 30
    x[:3] = torch.tensor([0.0, float("inf"), 1e-3])
    fn = torch.special.gammaincc if upper else torch.special.gammainc
    ref = fn(a, x)
    for dtype in (torch.float32, torch.float64):
        out = fn(a.to(dtype).to(dev), x.to(dtype).to(dev))
        # Both methods converge to 1e-15 relative in float64; the inputs' own rounding dominates in float32.
        tol = 1e-5 if dtype == torch.float32 else 1e-10
        assert_close(out, ref.to(dtype), rtol=tol, atol=tol)
    edge = fn(torch.tensor([-1.0, 1.0, float("nan")]).to(dev), torch.tensor([1.0, -1.0, 1.0]).to(dev))
    assert torch.isnan(edge.cpu()).all()


@pytest.mark.parametrize("upper", [False, True], ids=["igamma", "igammac"])
def test_incomplete_gamma_large_a(dev: torch.device, upper: bool) -> None:
    # x near a large a: the series would need O(sqrt(a)) terms; pjrt uses Temme's uniform
    # expansion truncated after two terms, whose error falls as a^-2 (below 1e-7 for a > 200).
    torch.manual_seed(6)
    a = torch.cat([torch.tensor([201.0, 1e3, 5e6, 1e20]), 10 ** (torch.rand(60, dtype=torch.float64) * 8 + 2.4)])
    x = a * (1 + (torch.rand(64, dtype=torch.float64) - 0.5) * 0.5)
    x[:4] = a[:4]
    fn = torch.special.gammaincc if upper else torch.special.gammainc
    ref = fn(a, x)  # Cephes' 25-term expansion: accurate to about 1e-15
    assert_close(fn(a.to(dev), x.to(dev)), ref, rtol=1e-7, atol=1e-12)
    assert_close(fn(a.float().to(dev), x.float().to(dev)), fn(a.float().double(), x.float().double()).float(),
                 rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1"])
def test_bessel_functions(dev: torch.device, name: str) -> None:
    # Across the series / asymptotic switch at |x| = 12, negative inputs, zero and inf.
    x = torch.cat([torch.linspace(-30, 30, 601), torch.tensor([0.0, 1e-8, 11.99, 12.0, 12.01, 100.0, 1e4, float("inf")])])
    fn = getattr(torch.special, name)
    ref = fn(x.double())
    out = fn(x.to(dev))
    # torch's own float64 kernels err by up to ~1e-6 (near x = 5): compare at float32 tolerances.
    assert_close(out, ref.float(), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 6])
def test_polygamma_across_poles(dev: torch.device, n: int) -> None:
    # Negative x between the poles (where XLA's series is inaccurate), values near
    # half-integers (where the reflection's two terms nearly cancel), large |x|, and the poles.
    from torch_pjrt.tools.conformance.compare import no_less_accurate_than_cpu

    torch.manual_seed(6)
    x = torch.cat([torch.rand(4000) * 18 - 9, torch.rand(500) * 1e3 - 1e3,
                   torch.tensor([-2.5, -0.4996054, -8.4783735, -1e-3, 0.3, 50.0, 1e4, 0.0, -0.0, -3.0,
                                 float("inf"), float("-inf"), float("nan")])])
    out = torch.polygamma(n, x.to(dev)).cpu()
    cpu = torch.polygamma(n, x)
    # torch's float32 kernels are themselves inexact here (n = 1 reflects in float32, the others
    # sum zeta's series): at least as close to the float64 result as CPU float32 is, within
    # float32 tolerances, and the same infinities and NaNs.
    assert no_less_accurate_than_cpu(out, cpu, torch.polygamma(n, x.double()), "cpu")
    special = ~torch.isfinite(cpu)
    assert torch.equal(out[special].nan_to_num(), cpu[special].nan_to_num())


def test_hurwitz_zeta_negative_q_and_poles(dev: torch.device) -> None:
    from torch_pjrt.tools.conformance.compare import no_less_accurate_than_cpu

    torch.manual_seed(7)
    q = torch.cat([torch.rand(300) * 40 - 20, torch.tensor([-2.0, 0.0, -0.5, 0.5, 3.0, float("-inf")])])
    for s_value in (2.0, 3.0, 4.0, 5.0, 4.5, 1.0, 0.5):
        s = torch.full_like(q, s_value)
        out = torch.special.zeta(s.to(dev), q.to(dev)).cpu()
        cpu = torch.special.zeta(s, q)
        assert no_less_accurate_than_cpu(out, cpu, torch.special.zeta(s.double(), q.double()), "cpu"), s_value
        special = ~torch.isfinite(cpu)
        assert torch.equal(out[special].nan_to_num(), cpu[special].nan_to_num()), s_value


def test_digamma_poles(dev: torch.device) -> None:
    x = torch.tensor([0.0, -0.0, -1.0, -2.0, float("inf"), float("-inf"), 1.0, -0.5])
    out = torch.digamma(x.to(dev))
    ref = torch.digamma(x)
    assert torch.equal(out[:6].cpu().nan_to_num(), ref[:6].nan_to_num())  # -inf at +0, +inf at -0, NaN, ...
    assert_close(out[6:], ref[6:])


@pytest.mark.parametrize("density", [False, True])
def test_histogram_and_histogramdd(dev: torch.device, density: bool) -> None:
    torch.manual_seed(10)
    x, w = torch.randn(300), torch.rand(300)
    edges = torch.tensor([-2.0, -0.5, 0.0, 0.1, 3.0])
    for call in (lambda t, **k: torch.histogram(t, 7, **k),                    # range from the data
                 lambda t, **k: torch.histogram(t, 5, range=(-1.0, 1.0), **k),  # samples outside are dropped
                 lambda t, **k: torch.histogram(t, edges.to(t.device), **k)):   # uneven edges, the last bin closed
        for weight in (None, w):
            kw = dict(density=density) if weight is None else dict(density=density, weight=weight)
            ref = call(x, **kw)
            out = call(x.to(dev), **{k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kw.items()})
            assert_close(out.hist, ref.hist)
            assert_close(out.bin_edges, ref.bin_edges)
    # All samples equal: edges widened by 1/2 each way, as CPU.
    same = torch.full((5,), 2.0)
    assert_close(torch.histogram(same.to(dev), 3).bin_edges, torch.histogram(same, 3).bin_edges)
    y = torch.randn(200, 2)
    for kw in (dict(bins=[3, 4]), dict(bins=[2, 2], range=[-1.0, 1.0, -2.0, 2.0]),
               dict(bins=[torch.tensor([-1.0, 0.0, 2.0]), torch.tensor([-3.0, 0.5, 1.0, 4.0])])):
        ref = torch.histogramdd(y, density=density, **kw)
        dkw = {k: [b.to(dev) for b in v] if isinstance(v[0], torch.Tensor) else v for k, v in kw.items()}
        out = torch.histogramdd(y.to(dev), density=density, **dkw)
        assert_close(out.hist, ref.hist)
        for e_out, e_ref in zip(out.bin_edges, ref.bin_edges):
            assert_close(e_out, e_ref)
    for bad in (lambda d: torch.histogram(torch.tensor([0.0, float("inf")], device=d), 3),
                lambda d: torch.histogram(torch.tensor([0.0, 1.0], device=d), 3, range=(2.0, 1.0)),
                lambda d: torch.histogram(torch.randn(5, device=d), 3, weight=torch.rand(4, device=d)),
                lambda d: torch.histogramdd(torch.randn(5, device=d), bins=[3])):
        with pytest.raises(RuntimeError) as cpu_error:
            bad("cpu")
        with pytest.raises(RuntimeError) as dev_error:
            bad(dev)
        assert str(dev_error.value).split("\n")[0] == str(cpu_error.value).split("\n")[0]


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 2.0])
def test_segment_reduce(dev: torch.device, reduce: str, initial: float | None) -> None:
    # Empty segments, zeros, a NaN and ties (prod's and max/min's special gradients), along an
    # inner axis with per-row lengths, and by offsets.
    data = torch.tensor([[1.0, 0.0, 3.0, 0.0, 0.0, 2.0, float("nan"), 4.0],
                         [3.0, 3.0, 1.0, 2.0, 2.0, 0.5, -1.0, 5.0]]).unsqueeze(-1).repeat(1, 1, 2)
    lengths = torch.tensor([[2, 0, 3, 3], [3, 1, 0, 4]])
    kw = dict(axis=1) if initial is None else dict(axis=1, initial=initial)
    x, xd = data.clone().requires_grad_(), data.to(dev).requires_grad_()
    ref = torch.segment_reduce(x, reduce, lengths=lengths, **kw)
    out = torch.segment_reduce(xd, reduce, lengths=lengths.to(dev), **kw)
    assert_close(out, ref.detach())
    w = torch.randn(ref.shape, generator=torch.Generator().manual_seed(3))
    (ref * w).nan_to_num().sum().backward()
    (out * w.to(dev)).nan_to_num().sum().backward()
    assert_close(xd.grad, x.grad)
    offsets = torch.cat([torch.zeros(2, 1, dtype=torch.long), lengths.cumsum(1)], 1)
    assert_close(torch.segment_reduce(data.to(dev), reduce, offsets=offsets.to(dev), **kw),
                 torch.segment_reduce(data, reduce, offsets=offsets, **kw))


def test_segment_reduce_checks_like_cpu(dev: torch.device) -> None:
    for bad in (lambda d: torch.segment_reduce(torch.ones(5, device=d), "sum", lengths=torch.tensor([1, 1], device=d)),
                lambda d: torch.segment_reduce(torch.ones(5, device=d), "sum")):
        with pytest.raises(RuntimeError) as cpu_error:
            bad("cpu")
        with pytest.raises(RuntimeError) as dev_error:
            bad(dev)
        assert str(dev_error.value).split("\n")[0] == str(cpu_error.value).split("\n")[0]
    # Offsets need not start at 0 (nor are they checked, as on CPU).
    offsets = torch.tensor([1, 3, 5])
    assert_close(torch.segment_reduce(torch.arange(6.0).to(dev), "sum", offsets=offsets.to(dev)),
                 torch.segment_reduce(torch.arange(6.0), "sum", offsets=offsets))
    # unsafe: lengths that fall short leave the rest out, as on CPU.
    short = torch.tensor([1, 1])
    assert_close(torch.segment_reduce(torch.arange(5.0).to(dev), "sum", lengths=short.to(dev), unsafe=True),
                 torch.segment_reduce(torch.arange(5.0), "sum", lengths=short, unsafe=True))


def test_scatter_reduce_extremes_propagate_nan(dev: torch.device) -> None:
    src = torch.tensor([2.0, float("nan"), 4.0, 1.0])
    index = torch.tensor([0, 0, 1, 1])
    for reduce in ("amax", "amin"):
        for include_self in (True, False):
            ref = torch.zeros(2).scatter_reduce(0, index, src, reduce, include_self=include_self)
            out = torch.zeros(2).to(dev).scatter_reduce(0, index.to(dev), src.to(dev), reduce, include_self=include_self)
            assert_close(out, ref)


def test_hash_tensor(dev: torch.device) -> None:
    torch.manual_seed(13)
    cases = [torch.tensor([1.0, 2.0, -0.5]), torch.tensor([1, 2, 3]), torch.tensor([True, False, True]),
             torch.tensor([-1], dtype=torch.int8), torch.tensor([1.0, 2.0], dtype=torch.bfloat16),
             torch.tensor([1, 2], dtype=torch.uint8), torch.randn(3, 4)]
    with torch_pjrt.fallback_mode("error"):
        for x in cases:
            assert torch.equal(torch.hash_tensor(x.to(dev)).cpu(), torch.hash_tensor(x)), x
        x = torch.randn(3, 4, 5)
        for kw in (dict(dim=1), dict(dim=(0, 2), keepdim=True), dict(dim=1, keepdim=True)):
            assert torch.equal(torch.hash_tensor(x.to(dev), **kw).cpu(), torch.hash_tensor(x, **kw)), kw
    with pytest.raises(RuntimeError, match="Unknown hash_tensor mode: 1"):
        torch.hash_tensor(x.to(dev), mode=1)


def test_unique_along_a_dim(dev: torch.device) -> None:
    torch.manual_seed(14)
    cases = [torch.tensor([[1, 2], [0, 5], [1, 2], [0, 1]]), torch.randint(0, 3, (20, 3)),
             torch.randint(0, 2, (4, 6, 2)).float(), torch.tensor([[True, False], [True, False], [False, False]])]
    with torch_pjrt.fallback_mode("error"):
        for x in cases:
            for dim in range(x.dim()):
                for fn in (lambda t: torch.unique(t, dim=dim, return_inverse=True, return_counts=True),
                           lambda t: torch.unique_consecutive(t, dim=dim, return_inverse=True, return_counts=True)):
                    for want, got in zip(fn(x), fn(x.to(dev))):
                        assert torch.equal(got.cpu(), want), (x, dim)
    with pytest.raises(RuntimeError, match="0 sized dimensions"):
        torch.unique(torch.empty(2, 0).to(dev), dim=0)


def test_hypot_infinity_wins_over_nan(dev: torch.device) -> None:
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([inf, -inf, nan, nan, 0.0, inf, 3.0, 1e38, nan])
    y = torch.tensor([nan, nan, inf, -inf, 0.0, inf, 4.0, 1e38, 1.0])
    assert_close(torch.hypot(x.to(dev), y.to(dev)), torch.hypot(x, y))


def test_igamma_edges_follow_torchs_order_of_checks():
    # torch checks, in order: a or x negative (NaN), a = 0, x = 0, a = inf, x = inf; a NaN fails
    # every comparison, so igamma(nan, 0) = 0 and igamma(inf, nan) = 0 on the CPU.
    inf, nan = float("inf"), float("nan")
    values = [-inf, -1.0, -0.0, 0.0, 0.5, 1.0, 3.0, 250.0, inf, nan]
    a = torch.tensor([p for p in values for _ in values])
    x = torch.tensor([q for _ in values for q in values])
    for fn in (torch.igamma, torch.igammac):
        got = fn(a.to("pjrt"), x.to("pjrt")).cpu()
        torch.testing.assert_close(got, fn(a.double(), x.double()).float(), equal_nan=True, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_ndtr_keeps_both_tails(dev: torch.device, dtype: torch.dtype) -> None:
    # Far left, Phi underflows but its logarithm is about -x^2/2; far right, Phi rounds to 1
    # but its logarithm is a tiny negative number. A float64 reference bounds the error, by the
    # CPU's own float32 distance to it and by the device's erfc (which log_ndtr is built on).
    x = torch.cat([-torch.logspace(-2, 4, 60, dtype=torch.float64), torch.logspace(-2, 1.5, 40, dtype=torch.float64),
                   torch.tensor([0.0, float("inf"), float("-inf"), float("nan")], dtype=torch.float64)])
    ref = torch.special.log_ndtr(x)
    cpu = torch.special.log_ndtr(x.to(dtype)).double()
    got = torch.special.log_ndtr(x.to(dtype).to(dev)).cpu().double()
    finite = ref.isfinite() & (ref != 0)
    cpu_err = ((cpu - ref) / ref)[finite].abs().max().item()
    z = (x[finite].abs() / 2**0.5).to(dtype)
    erfc_ref = torch.erfc(z.double())
    erfc_err = ((torch.erfc(z.to(dev)).cpu().double() - erfc_ref) / erfc_ref)[erfc_ref > 0].abs().max().item()
    eps = torch.finfo(dtype).eps
    assert ((got - ref) / ref)[finite].abs().max().item() <= max(4 * cpu_err, 8 * eps, 2 * erfc_err)
    assert torch.equal(got[~finite].nan_to_num(1.0), ref[~finite].nan_to_num(1.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_erfcx_across_its_range(dev: torch.device, dtype: torch.dtype) -> None:
    # exp(x^2) erfc(x): both factors overflow or underflow long before their product does. Far
    # right (asymptotic series) and far left (+inf where the result overflows the dtype), against
    # the float64 result at the same inputs; the bound is the CPU's own float32 distance to it
    # (float64: a few ulps).
    x = torch.cat([-torch.logspace(-3, 2, 50, dtype=torch.float64), torch.logspace(-3, 6, 90, dtype=torch.float64),
                   torch.tensor([0.0, float("inf"), float("-inf"), float("nan")], dtype=torch.float64)]).to(dtype)
    ref = torch.special.erfcx(x.double())
    cpu = torch.special.erfcx(x).double()
    got = torch.special.erfcx(x.to(dev)).cpu().double()
    finite = cpu.isfinite() & (ref != 0)
    cpu_err = ((cpu - ref) / ref)[finite].abs().max().item()
    eps = torch.finfo(dtype).eps
    assert ((got - ref) / ref)[finite].abs().max().item() <= max(4 * cpu_err, 16 * eps)
    assert torch.equal(got[~finite].nan_to_num(1.0), cpu[~finite].nan_to_num(1.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_i0_and_i0e_across_their_range(dev: torch.device, dtype: torch.dtype) -> None:
    # Both sides of the switch between the power series and the asymptotic series, up to where
    # exp(|x|) overflows (beyond, I0 is infinite as on the CPU). The bound: the CPU's own float32
    # distance to the float64 result (float64: a few ulps, the CPU's Chebyshev expansion being
    # within about 1e-16).
    limit = 709.0 if dtype == torch.float64 else 88.0
    x = torch.cat([torch.linspace(-limit, limit, 20001, dtype=torch.float64),
                   torch.tensor([11.99, 12.0, 12.01, 19.99, 20.0, 20.01], dtype=torch.float64)])
    eps = torch.finfo(dtype).eps
    for fn in (torch.i0, torch.special.i0e):
        ref = fn(x)
        got = fn(x.to(dtype).to(dev)).cpu().double()
        ref_of_rounded = fn(x.to(dtype).double())  # the input rounded as the device sees it
        finite = ref_of_rounded.isfinite()
        err = ((got - ref_of_rounded) / ref_of_rounded)[finite].abs().max().item()
        cpu = fn(x.to(dtype)).double()
        cpu_ok = finite & cpu.isfinite()
        cpu_err = ((cpu - ref_of_rounded) / ref_of_rounded)[cpu_ok].abs().max().item()
        assert err <= max(2 * cpu_err, 32 * eps), (fn.__name__, err, cpu_err)
    # As torch's CPU and scipy: I0 is NaN at +-inf (i0e: 0 there) and infinite at the largest finite values.
    big = torch.finfo(dtype).max
    special = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, big, -big], dtype=dtype)
    # Infinite exactly where the CPU's is (exp(|x|) overflows a little before I0 does).
    edge = torch.tensor([88.5, 88.8, 89.5, 90.5] if dtype == torch.float32 else [709.5, 709.9, 711.0, 713.0], dtype=dtype)
    assert torch.equal(torch.i0(edge.to(dev)).cpu().isinf(), torch.i0(edge).isinf())
    exact = dict(rtol=0, atol=0, equal_nan=True)
    inf, nan = float("inf"), float("nan")
    torch.testing.assert_close(torch.i0(special.to(dev)).cpu(), torch.tensor([nan, nan, nan, 1.0, inf, inf], dtype=dtype),
                               **exact)
    i0e = torch.special.i0e(special.to(dev)).cpu()
    torch.testing.assert_close(i0e[:4], torch.tensor([0.0, 0.0, nan, 1.0], dtype=dtype), **exact)
    torch.testing.assert_close(i0e[4:], torch.special.i0e(special[4:].double()).to(dtype), rtol=4 * torch.finfo(dtype).eps, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ndtri_keeps_its_tails(dev: torch.device, dtype: torch.dtype) -> None:
    # sqrt(2) erfinv(2p - 1) loses p's low bits as p -> 0 (2p - 1 rounds to -1 below 2^-25 in
    # float32, giving -inf): the tails must keep the CPU's accuracy down to the smallest normal p.
    tiny = torch.finfo(dtype).tiny
    p = torch.cat([torch.rand(20000, dtype=torch.float64, generator=torch.Generator().manual_seed(0)),
                   torch.logspace(math.log10(tiny) + 0.01, -1, 2000, dtype=torch.float64),
                   1 - torch.logspace(-15 if dtype == torch.float64 else -7, -1, 500, dtype=torch.float64)]).to(dtype)
    ref = torch.special.ndtri(p.double())
    got = torch.special.ndtri(p.to(dev)).cpu().double()
    cpu = torch.special.ndtri(p).double()
    finite = ref.isfinite() & (ref != 0)
    cpu_err = ((cpu - ref) / ref)[finite].abs().max().item()
    err = ((got - ref) / ref)[finite].abs().max().item()
    assert err <= max(2 * cpu_err, 16 * torch.finfo(dtype).eps), (err, cpu_err)
    edges = torch.tensor([0.0, 1.0, -0.5, 1.5, float("nan"), 0.5], dtype=dtype)
    torch.testing.assert_close(torch.special.ndtri(edges.to(dev)).cpu(), torch.special.ndtri(edges.double()).to(dtype),
                               rtol=0, atol=0, equal_nan=True)
