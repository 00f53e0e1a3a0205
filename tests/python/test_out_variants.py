"""out= variants run natively (no CPU fallback), resize their out tensor and
refuse an out dtype that cannot hold the result, as CPU does."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from conftest import assert_close

import torch_pjrt


def _x(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


IDX = torch.tensor([[0, 1, 2], [2, 0, 1]])
CASES: dict[str, tuple[Callable[..., object], list[torch.Tensor], torch.dtype]] = {
    "gelu": (lambda x, out: torch._C._nn.gelu(x, approximate="tanh", out=out), [_x(3, 4)], torch.float32),
    "argmax": (lambda x, out: torch.argmax(x, 1, out=out), [_x(3, 4)], torch.int64),
    "argmin": (lambda x, out: torch.argmin(x, out=out), [_x(3, 4)], torch.int64),
    "max": (lambda x, out: torch.max(x, out=out), [_x(3, 4)], torch.float32),
    "min": (lambda x, out: torch.min(x, out=out), [_x(3, 4)], torch.float32),
    "var": (lambda x, out: torch.var(x, 0, correction=0, out=out), [_x(5, 3)], torch.float32),
    "std": (lambda x, out: torch.std(x, 1, keepdim=True, out=out), [_x(5, 3)], torch.float32),
    "all": (lambda x, out: torch.all(x > 0, 1, out=out), [_x(3, 4)], torch.bool),
    "all (whole)": (lambda x, out: torch.all(x > -5, out=out), [_x(3, 4)], torch.bool),
    "any": (lambda x, out: torch.any(x > 1, 0, out=out), [_x(3, 4)], torch.bool),
    "any (whole)": (lambda x, out: torch.any(x > 1, out=out), [_x(3, 4)], torch.bool),
    "lerp scalar": (lambda x, y, out: torch.lerp(x, y, 0.3, out=out), [_x(3, 4), _x(3, 4, seed=1)], torch.float32),
    "lerp tensor": (lambda x, y, out: torch.lerp(x, y, y.sigmoid(), out=out), [_x(3, 4), _x(3, 4, seed=1)],
                    torch.float32),
    "scatter_add": (lambda x, s, out: torch.scatter_add(x, 1, IDX.to(x.device), s, out=out),
                    [_x(2, 3), _x(2, 3, seed=2)], torch.float32),
    "scatter src": (lambda x, s, out: torch.scatter(x, 1, IDX.to(x.device), s, out=out),
                    [_x(2, 3), _x(2, 3, seed=2)], torch.float32),
    "scatter value": (lambda x, out: torch.scatter(x, 1, IDX.to(x.device), 2.5, out=out), [_x(2, 3)], torch.float32),
    "scatter reduce": (lambda x, s, out: torch.scatter(x, 1, IDX.to(x.device), s, reduce="multiply", out=out),
                       [_x(2, 3), _x(2, 3, seed=2)], torch.float32),
    "scatter value reduce": (lambda x, out: torch.scatter(x, 1, IDX.to(x.device), 2.0, reduce="add", out=out),
                             [_x(2, 3)], torch.float32),
    "take": (lambda x, out: torch.take(x, torch.tensor([0, 5, 11], device=x.device), out=out), [_x(3, 4)],
             torch.float32),
    "masked_select": (lambda x, out: torch.masked_select(x, x > 0, out=out), [_x(3, 4)], torch.float32),
    "bucketize": (lambda x, out: torch.bucketize(x, torch.tensor([-1.0, 0.0, 1.0], device=x.device), out=out),
                  [_x(3, 4)], torch.int64),
    "searchsorted": (lambda x, out: torch.searchsorted(torch.tensor([-1.0, 0.0, 1.0], device=x.device), x,
                                                       right=True, out=out), [_x(3, 4)], torch.int64),
    "linalg_cross": (lambda x, y, out: torch.linalg.cross(x, y, out=out), [_x(4, 3), _x(4, 3, seed=1)],
                     torch.float32),
    "avg_pool2d": (lambda x, out: torch._C._nn.avg_pool2d(x, 2, out=out), [_x(1, 2, 4, 4)], torch.float32),
    "avg_pool3d": (lambda x, out: torch._C._nn.avg_pool3d(x, 2, out=out), [_x(1, 1, 4, 4, 4)], torch.float32),
    "histc": (lambda x, out: torch.histc(x, bins=5, min=-2, max=2, out=out), [_x(3, 4)], torch.float32),
    "index_reduce": (lambda x, s, out: torch.index_reduce(x, 1, torch.tensor([0, 2, 0], device=x.device), s, "amax",
                                                          out=out), [_x(2, 3), _x(2, 3, seed=2)], torch.float32),
}


@pytest.mark.parametrize("name", list(CASES))
def test_out_variant_matches_cpu_without_fallback(dev: torch.device, name: str) -> None:
    fn, args, dtype = CASES[name]
    want = torch.empty(7, dtype=dtype)
    with pytest.warns(UserWarning, match="resized"):
        fn(*args, out=want)
    out = torch.empty(7, dtype=dtype, device=dev)  # the wrong size: resized with CPU's warning
    with torch_pjrt.fallback_mode("error"), pytest.warns(UserWarning, match="resized"):
        returned = fn(*[a.to(dev) for a in args], out=out)
    assert returned.data_ptr() == out.data_ptr()
    assert_close(out, want)


def test_paired_out_variants(dev: torch.device) -> None:
    x = _x(4, 5)
    with torch_pjrt.fallback_mode("error"):
        values, indices = torch.empty(0, device=dev), torch.empty(0, dtype=torch.int64, device=dev)
        torch.max(x.to(dev), 1, out=(values, indices))
        lo, hi = torch.empty(0, device=dev), torch.empty(0, device=dev)
        torch.aminmax(x.to(dev), dim=0, out=(lo, hi))
        mv, mi = torch.empty(0, device=dev), torch.empty(0, dtype=torch.int64, device=dev)
        torch.min(x.to(dev), 0, keepdim=True, out=(mv, mi))
        kv, ki = torch.empty(0, device=dev), torch.empty(0, dtype=torch.int64, device=dev)
        torch.kthvalue(x.to(dev), 2, 1, out=(kv, ki))
    assert_close(kv, x.kthvalue(2, 1).values)
    assert_close(ki, x.kthvalue(2, 1).indices)
    assert_close(values, x.max(1).values)
    assert_close(indices, x.max(1).indices)
    assert_close(lo, x.aminmax(dim=0).min)
    assert_close(hi, x.aminmax(dim=0).max)
    assert_close(mv, x.min(0, keepdim=True).values)
    assert_close(mi, x.min(0, keepdim=True).indices)


def test_batch_norm_log_sigmoid_and_random_out_variants(dev: torch.device) -> None:
    x, w, bias = _x(4, 3, 5), torch.rand(3) + 0.5, _x(3, seed=3)
    with torch_pjrt.fallback_mode("error"):
        outs = [torch.empty(0, device=dev) for _ in range(3)]
        torch.ops.aten.native_batch_norm.out(x.to(dev), w.to(dev), bias.to(dev), None, None, True, 0.1, 1e-5,
                                             out=outs[0], save_mean=outs[1], save_invstd=outs[2])
        for o, r in zip(outs, torch.ops.aten.native_batch_norm(x, w, bias, None, None, True, 0.1, 1e-5)):
            assert_close(o, r)
        out = torch.empty(0, device=dev)
        torch._C._nn.log_sigmoid(x.to(dev), out=out)
        assert_close(out, torch.nn.functional.logsigmoid(x))
        # Random ones: shapes, dtypes and value ranges (a 1000-sample mean is within 0.2 of 0).
        out = torch.empty(0, device=dev)
        torch.normal(torch.zeros(1000).to(dev), torch.ones(1000).to(dev), out=out)
        assert out.shape == (1000,) and abs(out.cpu().mean().item()) < 0.2 and 0.8 < out.cpu().std().item() < 1.2
        out = torch.empty(0, device=dev)
        torch.bernoulli(torch.full((1000,), 0.25).to(dev), out=out)
        assert set(out.cpu().unique().tolist()) <= {0.0, 1.0} and 0.15 < out.cpu().mean().item() < 0.35
        out = torch.empty(0, dtype=torch.long, device=dev)
        torch.multinomial(torch.tensor([0.0, 1.0, 3.0]).to(dev), 4, replacement=True, out=out)
        assert out.shape == (4,) and set(out.cpu().tolist()) <= {1, 2}


def test_an_out_dtype_that_cannot_hold_the_result_is_refused(dev: torch.device) -> None:
    x = _x(3, 4)
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.var(x, 0, out=torch.empty(4, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.var(x.to(dev), 0, out=torch.empty(4, dtype=torch.int64, device=dev))


def test_resize_to_the_same_sizes_keeps_strides(dev) -> None:
    # ATen's composite out= paths resize_ a non-contiguous out to its own sizes, then copy into it.
    x = torch.randn(3, 4)
    out = torch.empty(4, 3, device=dev).t()
    torch.softmax(x.to(dev), 1, dtype=torch.float32, out=out)
    assert out.stride() == (1, 3)
    torch.testing.assert_close(out.cpu(), torch.softmax(x, 1))
    out.resize_(2, 2)  # new sizes: contiguous, as on CPU
    assert out.stride() == (2, 1)
