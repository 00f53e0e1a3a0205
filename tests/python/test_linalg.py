"""torch.linalg natively: Cholesky, triangular solves, eigh, QR, LU and what
is built on it (solve, inv, det, slogdet, lu_solve, lu_unpack), SVD and its
users (pinv, matrix_rank, matrix norms), batched, real and complex, forward
and backward, against CPU float64 with the CPU fallback forbidden.

Tolerances come from the numerics: a backward-stable factorization of an
n x n matrix errs by about n * eps * cond(A) relative to ||A||; the inputs
here are well conditioned (cond < 100), so 100 * n * eps bounds every result."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close

import torch_pjrt

N = 5
EPS = torch.finfo(torch.float32).eps


@pytest.fixture(autouse=True)
def _no_fallback():
    with torch_pjrt.fallback_mode("error"):
        yield


def _tol(scale: float = 1.0) -> dict:
    return dict(rtol=100 * N * EPS, atol=100 * N * EPS * scale)


def well_conditioned(*batch: int, n: int = N, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    # Q diag(1..10) Q^T-like spread: a random matrix plus a dominant diagonal.
    a = torch.randn(*batch, n, n, dtype=dtype)
    return a + 3 * n ** 0.5 * torch.eye(n, dtype=dtype)


def spd(*batch: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    a = torch.randn(*batch, N, N, dtype=dtype)
    return a @ a.mH + N * torch.eye(N, dtype=dtype)


def to_dev(t: torch.Tensor, dev: torch.device) -> torch.Tensor:
    return t.to(torch.complex64 if t.is_complex() else torch.float32).to(dev)


def ref_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.complex64 if t.is_complex() else torch.float32


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=["real", "complex"])
def test_cholesky_family(dev: torch.device, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    a, rhs = spd(3, dtype=dtype), torch.randn(3, N, 2, dtype=dtype)
    ad, bd = to_dev(a, dev), to_dev(rhs, dev)
    for upper in (False, True):
        f = torch.linalg.cholesky(a, upper=upper)
        fd = torch.linalg.cholesky(ad, upper=upper)
        assert_close(fd, f.to(ref_dtype(f)), **_tol(f.abs().max().item()))
        x = torch.cholesky_solve(rhs, f, upper=upper)
        assert_close(torch.cholesky_solve(bd, fd, upper=upper), x.to(ref_dtype(x)), **_tol(x.abs().max().item()))
        inv = torch.cholesky_inverse(f[0], upper=upper)
        assert_close(torch.cholesky_inverse(fd[0], upper=upper), inv.to(ref_dtype(inv)), **_tol(inv.abs().max().item()))
    # Not positive definite: info names the failing minor, and the checked form raises like CPU.
    bad = a.clone()
    bad[1, 2, 2] = -100
    info = torch.linalg.cholesky_ex(to_dev(bad, dev)).info.cpu()
    assert info[0] == 0 and info[2] == 0 and info[1] > 0
    with pytest.raises(torch.linalg.LinAlgError, match="not positive-definite"):
        torch.linalg.cholesky(to_dev(bad, dev))


def test_triangular_solves(dev: torch.device) -> None:
    torch.manual_seed(1)
    tri = torch.linalg.cholesky(spd(2))
    rhs = torch.randn(2, N, 3, dtype=torch.float64)
    td, bd = to_dev(tri, dev), to_dev(rhs, dev)
    for upper, t in ((False, tri), (True, tri.mT)):
        tdev = td if not upper else td.mT
        x = torch.linalg.solve_triangular(t, rhs, upper=upper)
        assert_close(torch.linalg.solve_triangular(tdev, bd, upper=upper), x.float(), **_tol(x.abs().max().item()))
        xr = torch.linalg.solve_triangular(t, rhs.mT, upper=upper, left=False)
        assert_close(torch.linalg.solve_triangular(tdev, bd.mT, upper=upper, left=False), xr.float(), **_tol(xr.abs().max().item()))
        xu = torch.linalg.solve_triangular(t, rhs, upper=upper, unitriangular=True)
        assert_close(torch.linalg.solve_triangular(tdev, bd, upper=upper, unitriangular=True), xu.float(),
                     **_tol(xu.abs().max().item()))
    sol, copy = torch.triangular_solve(bd, td, upper=False, transpose=True)
    ref = torch.triangular_solve(rhs, tri, upper=False, transpose=True).solution
    assert_close(sol, ref.float(), **_tol(ref.abs().max().item()))
    assert_close(copy, tri.float())
    # Batch dims broadcast.
    x = torch.linalg.solve_triangular(tri[:1], rhs, upper=False)
    assert_close(torch.linalg.solve_triangular(td[:1], bd, upper=False), x.float(), **_tol(x.abs().max().item()))


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=["real", "complex"])
def test_eigh(dev: torch.device, dtype: torch.dtype) -> None:
    torch.manual_seed(2)
    a = spd(3, dtype=dtype)
    ad = to_dev(a, dev)
    for uplo in ("L", "U"):
        w, v = torch.linalg.eigh(a, UPLO=uplo)
        wd, vd = torch.linalg.eigh(ad, UPLO=uplo)
        scale = w.abs().max().item()
        assert_close(wd, w.float(), **_tol(scale))
        # Eigenvectors are defined up to a phase: compare the reconstruction and orthonormality.
        assert_close((vd * wd.unsqueeze(-2).to(vd.dtype)) @ vd.mH, a.to(ref_dtype(a)), **_tol(scale))
        eye = torch.eye(N, dtype=ref_dtype(a)).expand(3, N, N)
        assert_close(vd.mH @ vd, eye, **_tol())
    # Only the named triangle is read.
    junk = a.clone()
    junk[..., 0, 1:] = 1e3
    assert_close(torch.linalg.eigvalsh(to_dev(junk, dev), UPLO="L"), torch.linalg.eigvalsh(a, UPLO="L").float(), **_tol(scale))


@pytest.mark.parametrize("shape", [(2, 6, 4), (2, 4, 6), (5, 5)], ids=["tall", "wide", "square"])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr(dev: torch.device, shape: tuple, mode: str) -> None:
    torch.manual_seed(3)
    a = torch.randn(*shape, dtype=torch.float64)
    q, r = torch.linalg.qr(a, mode=mode)
    qd, rd = torch.linalg.qr(to_dev(a, dev), mode=mode)
    # Householder QR is unique once R's diagonal sign is fixed, and LAPACK and XLA fix it alike.
    assert_close(rd, r.float(), **_tol(a.abs().max().item()))
    assert qd.shape == q.shape
    if mode != "r":
        assert_close(qd, q.float(), **_tol())


def test_lu_family(dev: torch.device) -> None:
    torch.manual_seed(4)
    a = well_conditioned(3)
    rect = torch.randn(2, 6, 4, dtype=torch.float64)
    rhs = torch.randn(3, N, 2, dtype=torch.float64)
    ad, bd = to_dev(a, dev), to_dev(rhs, dev)
    lu, piv = torch.linalg.lu_factor(a)
    lud, pivd = torch.linalg.lu_factor(ad)
    assert pivd.dtype == torch.int32
    assert torch.equal(pivd.cpu(), piv)  # well separated pivots: the same row choices
    assert_close(lud, lu.float(), **_tol(lu.abs().max().item()))
    for x, xd in zip(torch.linalg.lu(rect), torch.linalg.lu(to_dev(rect, dev))):
        assert_close(xd, x.float(), **_tol(x.abs().max().item()))
    for x, xd in zip(torch.lu_unpack(lu, piv), torch.lu_unpack(lud, pivd)):
        assert_close(xd, x.float(), **_tol(x.abs().max().item()))
    for left in (True, False):
        for adjoint in (False, True):
            b = rhs if left else rhs.mT
            x = torch.linalg.lu_solve(lu, piv, b, left=left, adjoint=adjoint)
            xd = torch.linalg.lu_solve(lud, pivd, bd if left else bd.mT, left=left, adjoint=adjoint)
            assert_close(xd, x.float(), **_tol(x.abs().max().item()))
    x = torch.linalg.solve(a, rhs)
    assert_close(torch.linalg.solve(ad, bd), x.float(), **_tol(x.abs().max().item()))
    xv = torch.linalg.solve(a, rhs[..., 0])
    assert_close(torch.linalg.solve(ad, bd[..., 0]), xv.float(), **_tol(xv.abs().max().item()))
    inv = torch.linalg.inv(a)
    assert_close(torch.linalg.inv(ad), inv.float(), **_tol(inv.abs().max().item()))
    d = torch.linalg.det(a)
    assert_close(torch.linalg.det(ad), d.float(), rtol=100 * N * EPS, atol=0)
    sign, logabs = torch.linalg.slogdet(a)
    sd, ld = torch.linalg.slogdet(ad)
    assert_close(sd, sign.float())
    assert_close(ld, logabs.float(), **_tol(logabs.abs().max().item()))
    # Singular: inv raises as on CPU; det is zero.
    sing = a.clone()
    sing[0, :, 0] = 0
    with pytest.raises(torch.linalg.LinAlgError, match="singular"):
        torch.linalg.inv(to_dev(sing, dev))
    assert torch.linalg.det(to_dev(sing, dev)).cpu()[0] == 0


def test_complex_lu(dev: torch.device) -> None:
    torch.manual_seed(5)
    a = well_conditioned(2, dtype=torch.complex128)
    ad = to_dev(a, dev)
    inv = torch.linalg.inv(a)
    assert_close(torch.linalg.inv(ad), inv.to(torch.complex64), **_tol(inv.abs().max().item()))
    d = torch.linalg.det(a)
    assert_close(torch.linalg.det(ad), d.to(torch.complex64), rtol=100 * N * EPS, atol=100 * N * EPS * d.abs().max().item())


@pytest.mark.parametrize("shape", [(2, 6, 4), (4, 6), (5, 5)], ids=["tall", "wide", "square"])
def test_svd_and_its_users(dev: torch.device, shape: tuple) -> None:
    torch.manual_seed(6)
    a = torch.randn(*shape, dtype=torch.float64)
    ad = to_dev(a, dev)
    s = torch.linalg.svdvals(a)
    scale = s.max().item()
    assert_close(torch.linalg.svdvals(ad), s.float(), **_tol(scale))
    for full in (False, True):
        u, sd, vh = torch.linalg.svd(ad, full_matrices=full)
        ref_u, _, ref_vh = torch.linalg.svd(a, full_matrices=full)
        assert u.shape == ref_u.shape and vh.shape == ref_vh.shape
        k = min(shape[-2:])
        assert_close((u[..., :k] * sd.unsqueeze(-2)) @ vh[..., :k, :], a.float(), **_tol(scale))
        assert_close(u.mH @ u, torch.eye(u.shape[-1]).expand_as(u.mH @ u).contiguous(), **_tol())
        assert_close(vh @ vh.mH, torch.eye(vh.shape[-2]).expand_as(vh @ vh.mH).contiguous(), **_tol())
    pinv = torch.linalg.pinv(a)
    assert_close(torch.linalg.pinv(ad), pinv.float(), **_tol(pinv.abs().max().item()))
    assert torch.equal(torch.linalg.matrix_rank(ad).cpu(), torch.linalg.matrix_rank(a))
    for ord in ("nuc", 2, -2):
        n = torch.linalg.matrix_norm(a, ord)
        assert_close(torch.linalg.matrix_norm(ad, ord), n.float(), **_tol(scale))


GRADS = {
    "inv": lambda x: torch.linalg.inv(x).sum(),
    "det": lambda x: torch.linalg.det(x).sum(),
    "slogdet": lambda x: torch.linalg.slogdet(x).logabsdet.sum(),
    "solve": lambda x: torch.linalg.solve(x, x[..., :2] + 1).sum(),
    "cholesky": lambda x: torch.linalg.cholesky(x @ x.mT).square().sum(),
    "eigvalsh": lambda x: torch.linalg.eigvalsh(x @ x.mT).square().sum(),
    "qr": lambda x: sum(t.square().sum() for t in torch.linalg.qr(x)),
    "svdvals": lambda x: torch.linalg.svdvals(x).sum(),
    "lu_factor": lambda x: torch.linalg.lu_factor(x).LU.square().sum(),
    "solve_triangular": lambda x: torch.linalg.solve_triangular(x.tril(), x[..., :2], upper=False).sum(),
}


@pytest.mark.parametrize("name", list(GRADS))
def test_backward(dev: torch.device, name: str) -> None:
    torch.manual_seed(7)
    a = well_conditioned(2)
    ref = a.clone().requires_grad_()
    xd = to_dev(a, dev).requires_grad_()
    GRADS[name](ref).backward()
    GRADS[name](xd).backward()
    assert_close(xd.grad, ref.grad.float(), **_tol(10 * ref.grad.abs().max().item()))


def test_bad_input_names_the_op(dev: torch.device) -> None:
    with pytest.raises(RuntimeError, match="square"):
        torch.linalg.inv(torch.randn(3, 4).to(dev))
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        torch.linalg.cholesky(torch.randn(3).to(dev))
    with pytest.raises(RuntimeError, match="Incompatible shapes"):
        torch.linalg.solve(torch.randn(3, 3).to(dev), torch.randn(4, 2).to(dev))


@pytest.mark.parametrize("scale", [0.1, 1.0, 4.0])
def test_matrix_exp(dev: torch.device, scale: float) -> None:
    torch.manual_seed(8)
    a = torch.randn(3, N, N, dtype=torch.float64) * scale
    ref = torch.linalg.matrix_exp(a)
    # Each of the s squarings (s = ceil(log2 ||A||_1)) at most doubles the relative rounding error.
    squarings = max(0.0, float(torch.ceil(torch.log2(a.abs().sum(-2).amax()))))
    tol = 100 * N * EPS * 2**squarings
    assert_close(torch.linalg.matrix_exp(to_dev(a, dev)), ref.float(), rtol=tol, atol=tol * ref.abs().max().item())
    x = a.clone().requires_grad_()
    xd = to_dev(a, dev).requires_grad_()
    torch.linalg.matrix_exp(x).sum().backward()
    torch.linalg.matrix_exp(xd).sum().backward()
    assert_close(xd.grad, x.grad.float(), rtol=tol, atol=tol * x.grad.abs().max().item())
    # Half precision: computed in float32 and rounded once more.
    for dtype in (torch.float16, torch.bfloat16):
        half = a.to(dtype)
        exact = torch.linalg.matrix_exp(half.double())
        out = torch.linalg.matrix_exp(half.to(dev))
        assert out.dtype == dtype
        eps_half = torch.finfo(dtype).eps
        finite = exact.abs() < torch.finfo(dtype).max / 2  # beyond, float16 overflows as on the CPU
        scale = exact[finite].abs().max().item()
        assert_close(out.double().cpu()[finite].to(dev), exact[finite], rtol=tol + eps_half, atol=(tol + eps_half) * scale)
        assert torch.isinf(out.cpu()[exact.abs() > 2 * torch.finfo(dtype).max]).all()


@pytest.mark.parametrize("driver", ["gels", "gelsy", "gelsd", "gelss"])
@pytest.mark.parametrize("shape", [(2, 6, 4), (2, 4, 6)], ids=["tall", "wide"])
def test_lstsq(dev: torch.device, driver: str, shape: tuple) -> None:
    torch.manual_seed(9)
    a = torch.randn(*shape, dtype=torch.float64)
    rhs = torch.randn(shape[0], shape[1], 3, dtype=torch.float64)
    ref = torch.linalg.lstsq(a, rhs, driver=driver)
    got = torch.linalg.lstsq(to_dev(a, dev), to_dev(rhs, dev), driver=driver)
    for name in ("solution", "residuals", "rank", "singular_values"):
        r, g = getattr(ref, name), getattr(got, name)
        assert g.shape == r.shape, name
        if r.numel():
            if r.is_floating_point():
                assert_close(g, r.float(), **_tol(r.abs().max().item()))
            else:
                assert_close(g, r)
    # A vector right-hand side.
    vec = torch.linalg.lstsq(a, rhs[..., 0], driver=driver).solution
    assert_close(torch.linalg.lstsq(to_dev(a, dev), to_dev(rhs[..., 0], dev), driver=driver).solution, vec.float(),
                 **_tol(vec.abs().max().item()))


@pytest.mark.parametrize("shape", [(0, 0), (3, 0, 0), (0, 3, 3), (2, 0, 4, 4)])
def test_zero_size_matrices(dev: torch.device, shape: tuple) -> None:
    # Empty matrices and empty batches: the results CPU gives (det 1 of 0 x 0), no compile error.
    a = well_conditioned(*shape[:-2], n=shape[-1]).float() if shape[-1] else torch.randn(shape)
    ad = a.to(dev)
    lu, piv = torch.linalg.lu_factor(a)
    lud, pivd = torch.linalg.lu_factor(ad)
    assert_close(lud, lu, **_tol())
    assert_close(pivd, piv)
    for fn in (torch.linalg.inv, torch.linalg.det, torch.logdet, lambda t: torch.linalg.matrix_power(t, -2),
               lambda t: torch.linalg.slogdet(t)[1], lambda t: torch.linalg.inv_ex(t)[1], lambda t: torch.linalg.lu(t)[2]):
        assert_close(fn(ad), fn(a), **_tol())
    for k in (0, 2):
        b = torch.randn(*shape[:-1], k)
        assert_close(torch.linalg.solve(ad, b.to(dev)), torch.linalg.solve(a, b), **_tol())
        for adjoint in (False, True):
            assert_close(torch.linalg.lu_solve(lud, pivd, b.to(dev), adjoint=adjoint),
                         torch.linalg.lu_solve(lu, piv, b), **_tol())
    x, xd = a.clone().requires_grad_(), ad.clone().requires_grad_()
    torch.linalg.det(x).sum().backward()
    torch.linalg.det(xd).sum().backward()
    assert_close(xd.grad, x.grad, **_tol())


def test_factorizations_and_solves_are_column_major_as_aten_returns_them() -> None:
    # LAPACK's layout, which ATen keeps and torch.compile's fake tensors predict (a graph that
    # views a solve's result: Qwen3-Next's chunked delta rule).
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(2, 3, 4, 4, generator=gen) + 4 * torch.eye(4)
    b = torch.randn(2, 3, 4, 5, generator=gen)
    for f in (lambda a, b: torch.linalg.solve_triangular(a.triu(), b, upper=True),
              lambda a, b: torch.linalg.solve_triangular(a.triu(), b.mT, upper=True, left=False),
              lambda a, b: torch.linalg.solve(a, b), lambda a, b: torch.linalg.inv(a),
              lambda a, b: torch.linalg.lu_factor(a)[0], lambda a, b: torch.linalg.cholesky(a @ a.mT)):
        want, got = f(a, b), f(a.to("pjrt"), b.to("pjrt"))
        assert got.stride() == want.stride()
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
