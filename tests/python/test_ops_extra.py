"""Native indexing updates, extra reductions, factories, small linear algebra,
random distributions and embedding_bag against CPU PyTorch (fallback forbidden)."""
from __future__ import annotations

import platform
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from conftest import DEV, assert_close
from test_nn import check, rnd


def ints(*shape: int, high: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def test_index_updates() -> None:
    x, src = rnd(5, 4), rnd(3, 4, seed=1)
    idx = torch.tensor([4, 0, 4])
    check(lambda x, s: x.index_add(0, idx.to(x.device), s, alpha=2.0), x, src)
    check(lambda x, s: x.index_add(1, torch.tensor([3, 1], device=x.device), s), x, rnd(5, 2, seed=2))
    check(lambda x, s: x.index_copy(0, torch.tensor([4, 0, 2], device=x.device), s), x, src)
    check(lambda x: x.index_fill(1, torch.tensor([0, 2], device=x.device), -1.5), x)
    mask = rnd(5, 4, seed=3) > 0
    check(lambda x, s: x.masked_scatter(mask.to(x.device), s), x, rnd(20, seed=4))
    check(lambda x: torch.take(x, torch.tensor([[0, 19], [7, 3]], device=x.device)), x)
    check(lambda x, s: x.put(torch.tensor([1, 5, 1], device=x.device), s, accumulate=True), x, rnd(3, seed=5))


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce: str, include_self: bool) -> None:
    x, src = rnd(4, 5), rnd(4, 3, seed=1)
    idx = ints(4, 3, high=5, seed=2)
    check(lambda x, s: x.scatter_reduce(1, idx.to(x.device), s, reduce, include_self=include_self), x, src,
          grad=reduce in ("sum", "mean"))
    xi, si = ints(4, 5, high=9), ints(4, 3, high=9, seed=3)
    check(lambda x, s: x.scatter_reduce(1, idx.to(x.device), s, reduce, include_self=include_self), xi, si, grad=False)


def test_searchsorted_bucketize() -> None:
    seq = torch.tensor([1.0, 2.0, 2.0, 4.0, 7.0])
    v = torch.tensor([[0.5, 2.0, 3.0], [7.0, 8.0, 2.0]])
    for right in (False, True):
        check(lambda s, v: torch.searchsorted(s, v, right=right), seq, v, grad=False)
        check(lambda v, s: torch.bucketize(v, s, right=right, out_int32=True), v, seq, grad=False)
    rows = torch.sort(rnd(2, 6), 1).values
    check(lambda s, v: torch.searchsorted(s, v, side="right"), rows, rnd(2, 3, seed=1), grad=False)


def test_reductions() -> None:
    x = rnd(4, 5)
    x_nan = x.clone()
    x_nan[1, 2] = float("nan")
    check(lambda x: torch.nansum(x, 1), x_nan)
    check(lambda x: torch.std_mean(x, 1, correction=0), x)
    check(lambda x: torch.var_mean(x, keepdim=True, dim=0), x)
    check(lambda x: torch.aminmax(x, dim=1), x, grad=False)
    check(lambda x: torch.aminmax(x), x, grad=False)
    check(lambda x: torch.count_nonzero(x.round(), dim=(0,)), x, grad=False)
    check(torch.trace, x[:4, :4].contiguous())
    check(lambda x: torch.clamp_min(x, 0.2), x)
    check(lambda x, y: torch.clamp_max(x, y), x, rnd(4, 5, seed=1))
    check(lambda x: torch.histc(x, 7, -1.0, 1.0), x, grad=False)
    check(lambda x: torch.histc(x, 5), x, grad=False)


def test_linear_algebra() -> None:
    check(lambda s, a, b: torch.addbmm(s, a, b, beta=0.5, alpha=2.0), rnd(3, 4), rnd(2, 3, 5, seed=1), rnd(2, 5, 4, seed=2),
          rtol=1e-4, atol=1e-4)
    check(lambda s, a, b: torch.addr(s, a, b, alpha=3.0), rnd(3, 4), rnd(3, seed=1), rnd(4, seed=2))
    check(lambda a, b: torch.linalg.cross(a, b), rnd(4, 3), rnd(4, 3, seed=1))
    check(lambda a, b: torch.stack([a, b], 1), rnd(2, 3), rnd(2, 3, seed=1))
    check(lambda a: torch.diag_embed(a), rnd(2, 3))


def test_functional_scatters() -> None:
    x = rnd(4, 6)
    check(lambda x, s: torch.slice_scatter(x, s, 1, 1, 6, 2), x, rnd(4, 3, seed=1))
    check(lambda x, s: torch.select_scatter(x, s, 0, 2), x, rnd(6, seed=1))
    check(lambda x, s: torch.diagonal_scatter(x, s, 1), x, rnd(4, seed=1))


def test_factories() -> None:
    with torch_pjrt.fallback_mode("error"):
        assert_close(torch.eye(3, 5, device=DEV), torch.eye(3, 5))
        assert_close(torch.eye(4, device=DEV, dtype=torch.int64), torch.eye(4, dtype=torch.int64))
        for steps in (1, 2, 7, 50):
            assert_close(torch.linspace(-2.5, 3.0, steps, device=DEV), torch.linspace(-2.5, 3.0, steps))
            assert_close(torch.logspace(-1, 2, steps, base=3.0, device=DEV), torch.logspace(-1, 2, steps, base=3.0))
        assert_close(torch.linspace(0, 10, 6, device=DEV, dtype=torch.int64), torch.linspace(0, 10, 6, dtype=torch.int64))


def test_random_distributions() -> None:
    torch.manual_seed(0)
    n = 20000
    with torch_pjrt.fallback_mode("error"):
        e = torch.empty(n, device=DEV).exponential_(2.0).cpu()
        g = torch.empty(n, device=DEV).geometric_(0.3).cpu()
        ln = torch.empty(n, device=DEV).log_normal_(0.5, 0.25).cpu()
        c = torch.empty(n, device=DEV).cauchy_(1.0, 2.0).cpu()
        p = torch.randperm(1000, device=DEV).cpu()
        probs = torch.tensor([0.1, 0.0, 0.6, 0.3], device=DEV)
        m_rep = torch.multinomial(probs, n, replacement=True).cpu()
        m_norep = torch.multinomial(probs.repeat(200, 1), 3).cpu()
    assert e.min() >= 0 and abs(e.mean().item() - 0.5) < 0.02
    assert g.min() >= 1 and (g == g.round()).all() and abs(g.mean().item() - 1 / 0.3) < 0.1
    assert abs(ln.log().mean().item() - 0.5) < 0.01 and abs(ln.log().std().item() - 0.25) < 0.01
    assert abs(c.median().item() - 1.0) < 0.1
    assert torch.equal(torch.sort(p).values, torch.arange(1000)) and not torch.equal(p, torch.arange(1000))
    freq = torch.bincount(m_rep, minlength=4).float() / n
    assert freq[1] == 0 and torch.allclose(freq, torch.tensor([0.1, 0.0, 0.6, 0.3]), atol=0.02)
    assert (m_norep != 1).all() and all(len(set(r.tolist())) == 3 for r in m_norep)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag(mode: str) -> None:
    w = rnd(10, 4)
    idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0])
    offsets = torch.tensor([0, 3, 3, 6])  # one empty bag
    check(lambda w: F.embedding_bag(idx.to(w.device), w, offsets.to(w.device), mode=mode), w)
    check(lambda w: F.embedding_bag(idx.to(w.device), w, offsets.to(w.device), mode=mode, padding_idx=4), w)
    check(lambda w: F.embedding_bag(idx.view(3, 3).to(w.device), w, mode=mode), w)
    if mode == "sum":
        psw = rnd(9, seed=3)
        check(lambda w, p: F.embedding_bag(idx.to(w.device), w, offsets.to(w.device), mode=mode, per_sample_weights=p), w, psw)
    check(lambda w: F.embedding_bag(idx.to(w.device), w, torch.tensor([0, 3, 3, 6, 9], device=w.device), mode=mode,
                                    include_last_offset=True), w)


def test_isin() -> None:
    x = torch.tensor([[1, 5, 3], [7, 3, 0]])
    t = torch.tensor([3, 0, 9])
    for invert in (False, True):
        check(lambda x, t: torch.isin(x, t, invert=invert), x, t, grad=False)
    check(lambda x: torch.isin(x, 3), x, grad=False)
    check(lambda t: torch.isin(5, t), t, grad=False)


def test_more_compositions() -> None:
    x, y = rnd(4, 5), rnd(4, 5, seed=1)
    check(lambda x, y: torch.rsub(x, y, alpha=2.0), x, y)
    check(lambda x: torch.rsub(x, 3.0), x)
    check(lambda a, b: torch.vdot(a, b), rnd(6), rnd(6, seed=1))
    check(lambda x: torch.round(x * 100, decimals=-1), x)
    check(lambda x: torch.round(x, decimals=2), x)
    check(lambda x: x.unfold(1, 2, 1) * 1.0, x)  # backward is unfold_backward
    check(lambda x: x.unfold(0, 3, 2) * 1.0, x)
    check(lambda x: torch.renorm(x, 2, 0, 1.0), x)
    check(lambda x: torch.renorm(x, 1, 1, 0.5), x)
    with torch_pjrt.fallback_mode("error"):
        assert torch.equal(x.to(DEV), x.to(DEV)) and not torch.equal(x.to(DEV), y.to(DEV))
        assert_close(torch.triu_indices(4, 5, 1, device=DEV), torch.triu_indices(4, 5, 1))
        assert_close(torch.tril_indices(5, 3, -1, device=DEV), torch.tril_indices(5, 3, -1))
    idx = ints(4, 3, high=5, seed=2)
    check(lambda x, s: x.scatter(1, idx.to(x.device), s, reduce="add"), x, rnd(4, 3, seed=3), grad=False)
    check(lambda x: x.scatter(1, idx.to(x.device), 2.0, reduce="multiply"), x, grad=False)
    for reduce in ("prod", "mean", "amax", "amin"):
        check(lambda x, s: x.index_reduce(0, torch.tensor([1, 3, 1], device=x.device), s, reduce), x, rnd(3, 5, seed=4),
              grad=reduce == "mean")


def test_normal_tensor_params() -> None:
    torch.manual_seed(0)
    mean = torch.linspace(-5, 5, 10).repeat(2000, 1)
    with torch_pjrt.fallback_mode("error"):
        a = torch.normal(mean.to(DEV), 0.5).cpu()
        b = torch.normal(mean.to(DEV), torch.full((10,), 2.0, device=DEV)).cpu()
        c = torch.normal(1.0, torch.full((20000,), 3.0, device=DEV)).cpu()
    torch.testing.assert_close(a.mean(0), mean[0], atol=0.05, rtol=0)
    torch.testing.assert_close(b.std(0), torch.full((10,), 2.0), atol=0.1, rtol=0)
    assert abs(c.mean().item() - 1.0) < 0.1 and abs(c.std().item() - 3.0) < 0.1


def test_conversions_and_integer_rounding() -> None:
    x = torch.tensor([-3.7, -0.2, 255.9, 256.5, 1000.25, 3.5])
    check(lambda x: x.to(torch.uint8), x, grad=False)
    i = torch.tensor([[-3, 4], [7, 0]])
    for fn in (torch.floor, torch.ceil, torch.round, torch.trunc, torch.isfinite):
        check(fn, i, grad=False)
    check(lambda x, lo, hi: torch.clamp(x, lo, hi), rnd(5), rnd(3, 5, seed=1) - 1, rnd(3, 5, seed=2) + 1)
    check(lambda x, lo: torch.clamp_min(x, lo), rnd(5), rnd(2, 5, seed=1))
    check(lambda x: x.gather(1, torch.tensor([[0, 2], [1, 1]], dtype=torch.int32, device=x.device)), rnd(2, 3))


def test_mode_and_zero_dim_scatters() -> None:
    x = torch.tensor([[1, 3, 3, 2, 1, 1, 3], [5, 5, 4, 4, 7, 4, 5]])
    check(lambda x: torch.mode(x, 1), x, grad=False)
    check(lambda x: torch.mode(x, 0, keepdim=True), x, grad=False)
    check(lambda x: torch.mode(x, 1), rnd(3, 6).round(), grad=False)
    s = torch.tensor(2.5)
    check(lambda s: s.index_reduce(0, torch.tensor([0], device=s.device), torch.tensor(4.0, device=s.device), "prod"), s,
          grad=False)
    check(lambda s: s.scatter_reduce(0, torch.tensor(0, device=s.device), torch.tensor(7.0, device=s.device), "amax"), s,
          grad=False)
    check(lambda x: F.multi_margin_loss(x, torch.tensor(0, device=x.device)), torch.tensor(0.3))


def test_integer_and_bool_predicates() -> None:
    b = torch.tensor([True, False, True])
    u = torch.tensor([3, 0, 255], dtype=torch.uint8)
    i = torch.tensor([-4, 0, 7])
    for t in (b, u, i):
        for fn in (torch.sign, torch.sgn, torch.isinf, torch.isposinf, torch.isneginf, torch.isnan):
            check(fn, t, grad=False)
    check(lambda x: torch.median(x, 1, keepdim=True), rnd(3, 5))
    check(lambda x: torch.nanmedian(x, 0, keepdim=True), rnd(3, 5))
    check(lambda x: torch.gather(x, 1, torch.empty(2, 0, dtype=torch.uint8, device=x.device)), rnd(2, 3), grad=False)
    check(lambda x: torch.native_layer_norm(x, [3], None, None, 1e-5), rnd(2, 3).bfloat16(), grad=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_max_min_reductions_return_nan(dtype: torch.dtype) -> None:
    # torch's max/min reductions return NaN when a NaN is reduced; XLA's CPU reduction drops it.
    x = rnd(4, 6).to(dtype)
    x[0, 1] = x[2, 5] = float("nan")
    for fn in (torch.amax, torch.amin):
        check(lambda t: fn(t), x, grad=False)
        check(lambda t: fn(t, 0), x, grad=False)
        check(lambda t: fn(t, 1, keepdim=True), x, grad=False)
    check(lambda t: torch.max(t), x, grad=False)
    check(lambda t: torch.min(t), x, grad=False)
    check(lambda t: torch.aminmax(t, dim=1), x, grad=False)
    check(lambda t: torch.max(t, 1), x, grad=False)
    mask = rnd(4, 6, seed=1) > 0
    check(lambda t: torch.masked.amax(t, 1, mask=mask.to(t.device)), x, grad=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_floor_division_is_exact_at_integer_boundaries(dtype: torch.dtype) -> None:
    # floor(0.3 / 0.1) is 3 from the rounded quotient; torch (like Python) says 2, from the remainder.
    x = torch.cat([torch.tensor([0.3, -0.3, 0.7, 5.0, -5.0, 0.0, -0.0, 1.0, -1.0]), rnd(64) * 100]).to(dtype)
    y = torch.cat([torch.tensor([0.1, 0.1, 0.1, 0.0, 0.0, 3.0, 3.0, -0.0, 3.0]), rnd(64, seed=1)]).to(dtype)
    check(lambda a, b: torch.div(a, b, rounding_mode="floor"), x, y, grad=False)
    check(lambda a, b: torch.floor_divide(a, b), x, y, grad=False)
    out = torch.div(x.to(DEV), y.to(DEV), rounding_mode="floor").cpu()
    assert torch.equal(torch.signbit(out), torch.signbit(torch.div(x, y, rounding_mode="floor")))  # signed zeros


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.int16])
@pytest.mark.parametrize("bins,lo,hi", [(4, 0, 3), (4, 0, 4), (3, 0, 0), (5, 1, 6), (8, 0, 8), (3, 2.7, 5.9)])
def test_integer_histc_counts_as_cuda_does(dev: torch.device, dtype: torch.dtype, bins: int, lo: float, hi: float) -> None:
    # transformers' MoE routing calls histc on integer expert ids on every device but the CPU
    # (the CPU kernel takes floats only). CUDA's kernel counts integers with integer arithmetic:
    # bounds truncated to integers, bin = (x - lo) * bins // (hi - lo), the last bin closed, the
    # counts in the input's dtype. The reference here is that rule written out in Python.
    g = torch.Generator().manual_seed(bins)
    x = torch.randint(0, 10, (50,), generator=g).to(dtype)
    ilo, ihi = int(lo), int(hi)
    if ilo == ihi:
        ilo, ihi = int(x.min()), int(x.max())
        if ilo == ihi:
            ilo, ihi = ilo - 1, ihi + 1
    expected = [0] * bins
    for v in x.tolist():
        if ilo <= v <= ihi:
            expected[min((v - ilo) * bins // (ihi - ilo), bins - 1)] += 1
    out = torch.histc(x.to(dev), bins=bins, min=lo, max=hi)
    assert out.dtype == dtype and out.device.type == dev.type
    assert out.cpu().tolist() == expected
    # Where the bounds are whole numbers, the float histogram of the same values agrees.
    if float(lo).is_integer() and float(hi).is_integer():
        assert out.cpu().tolist() == torch.histc(x.float(), bins=bins, min=lo, max=hi).to(torch.int64).tolist()


def test_histc_refuses_bool_and_complex(dev: torch.device) -> None:
    for dtype in (torch.bool, torch.complex64):
        with pytest.raises(RuntimeError, match="histc"):
            torch.histc(torch.zeros(3, dtype=dtype, device=dev), bins=2, min=0, max=1)


_SEQUENCE_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32,
                    torch.int16, torch.int8, torch.uint8, torch.complex64]


@pytest.mark.parametrize("dtype", _SEQUENCE_DTYPES, ids=str)
def test_linspace_logspace_as_cpu(dev: torch.device, dtype: torch.dtype) -> None:
    # ATen converts start and end to the dtype first (refusing overflow), and computes the
    # step and the points in the dtype's own arithmetic (double for integers), from both
    # ends. Integer results must be exact; floats within a couple of ulps of the CPU's
    # (its vectorized loop rounds some points differently from the scalar one).
    cases = [(torch.linspace, (10, 20, 11)), (torch.linspace, (0.3, 1.1, 137)), (torch.linspace, (2, 0, 3)),
             (torch.linspace, (-100, 100, 401)), (torch.linspace, (0, 90, 91)), (torch.logspace, (0, 2, 3)),
             (torch.logspace, (-0.03, 0.03, 33)), (torch.logspace, (1, -1, 3)), (torch.linspace, (0, 1, 1)),
             (torch.linspace, (10, 2000, 1991))]
    for fn, args in cases:
        try:
            ref = fn(*args, dtype=dtype)
        except RuntimeError as e:
            with pytest.raises(RuntimeError, match="without overflow"):
                fn(*args, dtype=dtype, device=dev)
            assert "without overflow" in str(e)
            continue
        out = fn(*args, dtype=dtype, device=dev).cpu()
        assert out.dtype == ref.dtype and out.shape == ref.shape
        if dtype.is_floating_point or dtype.is_complex:
            eps = torch.finfo(dtype if dtype.is_floating_point else torch.float32).eps
            torch.testing.assert_close(out, ref, rtol=4 * eps, atol=4 * eps * float(ref.abs().max()))
        else:
            assert torch.equal(out, ref), (fn.__name__, args, out, ref)


@pytest.mark.parametrize("fn", [lambda out: torch.linspace(0, 3, 4, out=out), lambda out: torch.logspace(0, 3, 4, base=2, out=out),
                                lambda out: torch.arange(0, 4, out=out), lambda out: torch.range(0, 3, out=out)],
                         ids=["linspace", "logspace", "arange", "range"])
def test_sequence_into_a_narrowed_out_keeps_its_shape(dev: torch.device, fn) -> None:
    # An out= of the right element count is filled in its own order, not resized: a narrowed
    # view of a larger tensor receives the values row by row, as on CPU.
    def run(d: torch.device) -> torch.Tensor:
        x = torch.zeros(2, 3, device=d)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.range is deprecated
            fn(x.narrow(1, 1, 2))
        return x

    assert torch.equal(run(dev).cpu(), run(torch.device("cpu")))


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="CPU float-to-int casts of out-of-range values are x86's")
@pytest.mark.parametrize("source", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
def test_float_to_integer_casts_as_cpu(dev: torch.device, source: torch.dtype) -> None:
    # Out-of-range values, infinities and NaN convert as torch's CPU casts them (x86: through
    # 32- or 64-bit truncation, the most negative value where that overflows, then wrapped);
    # XLA's own conversion saturates.
    big = torch.finfo(source).max
    vals = torch.tensor([-big, -3e9, -300.0, -2.0, -1.5, -0.5, 0.0, 0.5, 1.5, 2.0, 300.0, 3e9, big,
                         float("inf"), float("-inf"), float("nan")], dtype=torch.float64).to(source)
    for target in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool):
        assert torch.equal(vals.to(dev).to(target).cpu(), vals.to(target)), target


def test_cat_rules_as_cpu(dev: torch.device) -> None:
    def both(fn):
        return fn(torch.device("cpu")), fn(dev)

    # Only legacy 1-D empty tensors: an empty result whatever dim says.
    ref, out = both(lambda d: torch.cat([torch.zeros(0, device=d), torch.zeros(0, device=d)], dim=1))
    assert out.shape == ref.shape == (0,)
    # The inputs' common memory format is the result's.
    ref, out = both(lambda d: torch.cat([torch.randn(2, 3, 4, 5).to(d, memory_format=torch.channels_last)] * 2, dim=1))
    assert out.is_contiguous(memory_format=torch.channels_last) == ref.is_contiguous(memory_format=torch.channels_last)
    assert out.stride() == ref.stride()
    # out= of an unsigned type (promotion never starts from bool).
    for dtype in (torch.uint16, torch.uint32, torch.uint64):
        w = torch.arange(10, dtype=dtype, device=dev)
        torch.cat([w[:2], w[4:6]], out=w[6:10])
        assert w.cpu().tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 4, 5]


def test_fill_into_self_overlapping_tensor(dev: torch.device) -> None:
    # A tensor whose elements share memory (a 0 stride) can be filled, as on CPU.
    t = torch.empty_strided((4, 3, 2), (10, 0, 3), device=dev).fill_(2.5)
    assert t.cpu().eq(2.5).all()


def test_dlpack_capsule_aliases_the_pjrt_tensor(dev: torch.device) -> None:
    # torch.asarray of a pjrt tensor's DLPack capsule is the same memory (as on CUDA); a
    # copy=True import is its own. The alias used to have "no pjrt storage".
    from torch.utils.dlpack import to_dlpack

    t = torch.arange(6.0, device=dev)
    alias = torch.asarray(to_dlpack(t))
    assert alias.device == t.device and alias.data_ptr() == t.data_ptr()
    alias.add_(1)
    copy = torch.asarray(to_dlpack(t), copy=True)
    copy.mul_(2)
    assert t.cpu().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert copy.cpu().tolist() == [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]


@pytest.mark.parametrize("op", [torch.ops.aten.sigmoid_backward, torch.ops.aten.tanh_backward,
                                torch.ops.aten.silu_backward], ids=lambda o: str(o).split(".")[-1])
def test_pointwise_backwards_broadcast_as_tensoriterator(dev: torch.device, op) -> None:
    # gradcheck's batched gradients (vmap) give grad a leading batch dim the saved value lacks;
    # "ir: multiply operands differ" reached the user (test_modules' test_grad_nn_Sigmoid).
    from torch._vmap_internals import _vmap

    g = torch.Generator().manual_seed(0)
    y = torch.rand(2, dtype=torch.float64, generator=g)
    grads = torch.randn(3, 2, dtype=torch.float64, generator=g)
    ref = _vmap(lambda go: op(go, y))(grads)
    out = _vmap(lambda go: op(go, y.to(dev)))(grads.to(dev))
    torch.testing.assert_close(out.cpu(), ref, rtol=4 * torch.finfo(torch.float64).eps, atol=0)


def test_heaviside_and_embedding_refuse_as_cpu(dev: torch.device) -> None:
    for fn in (lambda d: torch.heaviside(torch.tensor([1, 2], dtype=torch.int8, device=d), torch.tensor([1, 2], device=d)),
               lambda d: torch.heaviside(torch.tensor([1j], device=d), torch.tensor([1j], device=d))):
        with pytest.raises(RuntimeError) as cpu_error:
            fn(torch.device("cpu"))
        with pytest.raises(RuntimeError, match=str(cpu_error.value).split("\n")[0].rstrip(".")):
            fn(dev)
    with pytest.raises(RuntimeError, match="Expected tensor for argument #1 'indices' to have one of the following scalar types"):
        F.embedding(torch.tensor([1.0, 2.0], device=dev), torch.randn(4, 3, device=dev))


@pytest.mark.parametrize("shape,dims", [((2, 16, 16, 16), (0, 1, 2, 3)), ((8, 3, 64, 64), (0, 2, 3))])
def test_long_float_sums_err_as_the_cpus_blocked_sum(shape, dims) -> None:
    # ATen sums in cascades; XLA's CPU code added a long run into a few accumulators, 27x the
    # CPU's error on the first shape (blocked_sum in ir/builder.cc). Against float64, over
    # several draws, relative to the CPU's own float32 error.
    gen = torch.Generator().manual_seed(0)
    device_err = cpu_err = 0.0
    for _ in range(4):
        x = torch.randn(shape, generator=gen) + 0.5  # a mean: the partial sums grow
        exact = x.double().sum(dims)
        device_err += (x.to("pjrt").sum(dims).cpu().double() - exact).abs().max().item()
        cpu_err += (x.sum(dims).double() - exact).abs().max().item()
        count = x.numel() // exact.numel()
        torch.testing.assert_close(x.to("pjrt").mean(dims).cpu().double(), exact / count, rtol=1e-5, atol=0)
    assert device_err < 4 * cpu_err, (device_err, cpu_err)


@pytest.mark.parametrize("layout", ["transposed", "permuted", "expanded", "channels_last", "mixed"])
def test_pointwise_results_are_laid_out_as_tensoriterator_does(dev: torch.device, layout: str) -> None:
    # Strides are part of the result: torch.compile's fake tensors predict ATen's, and a graph
    # that views a transposed sum (Mamba's output projection) fails when the device's differ.
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(2, 5, 3, 4, generator=gen)
    a = {"transposed": base.transpose(1, 3), "permuted": base.permute(2, 0, 3, 1),
         "expanded": base[:, :1].expand(2, 5, 3, 4), "channels_last": base.contiguous(memory_format=torch.channels_last),
         "mixed": base.transpose(2, 3)}[layout]
    b = torch.randn(a.shape, generator=gen) if layout != "mixed" else torch.randn(a.shape[:-1] + (1,), generator=gen)
    for f in (lambda x, y: x + y, lambda x, y: x * torch.sigmoid(y), lambda x, y: F.silu(x),
              lambda x, y: torch.where(x > 0, x, y), lambda x, y: (x > y).float()):
        want, got = f(a, b), f(a.to(dev), b.to(dev))
        assert got.stride() == want.stride(), (layout, got.stride(), want.stride())
        torch.testing.assert_close(got.cpu(), want)


def test_compiled_view_of_a_transposed_pointwise_result(dev: torch.device) -> None:
    def step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = (x.transpose(1, 2) + 1.0) * torch.sigmoid(x.transpose(1, 2))
        return y.transpose(1, 2).reshape(-1, x.shape[-1]) @ w

    x, w = torch.randn(2, 8, 16), torch.randn(16, 4)
    got = torch.compile(step, backend="pjrt")(x.to(dev), w.to(dev))
    torch.testing.assert_close(got.cpu(), step(x, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_isclose_equals_cpu_on_special_values_and_is_one_program(dev: torch.device, dtype: torch.dtype) -> None:
    import itertools

    # Every pair of signed zeros, near-equal values, NaN, infinities and a value of
    # atol's size (no float32 subnormals: XLA's CPU code flushes them to zero).
    values = torch.tensor([0.0, -0.0, 1.0, 1 + 1e-6, 1 + 1e-5, float("nan"), float("inf"), -float("inf"), 3.0, -3.0,
                           1e30, 2.5e-8], dtype=dtype)
    a, b = values[:, None].expand(12, 12), values[None, :].expand(12, 12)
    for rtol, atol, equal_nan in itertools.product((0.0, 1e-5, 0.5), (0.0, 1e-8, 1.0, float("inf")), (False, True)):
        got = torch.isclose(a.to(dev), b.to(dev), rtol=rtol, atol=atol, equal_nan=equal_nan)
        assert got.device == dev and got.dtype == torch.bool
        assert torch.equal(got.cpu(), torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)), (rtol, atol)
    x = torch.randn(5, 1, 7, dtype=dtype)
    y = x + torch.randn(4, 1, dtype=dtype) * 1e-6  # broadcast
    before = torch_pjrt.metrics()["compiles"]
    assert torch.equal(torch.isclose(x.to(dev), y.to(dev)).cpu(), torch.isclose(x, y))
    assert torch_pjrt.metrics()["compiles"] - before <= 1  # ATen's composite: about ten programs
    with pytest.raises(RuntimeError, match="rtol must be greater than or equal to zero"):
        torch.isclose(x.to(dev), y.to(dev), rtol=-1.0)
    with pytest.raises(RuntimeError, match="did not match"):
        torch.isclose(x.to(dev), y.to(dev).float() if dtype == torch.float64 else y.to(dev).double())
