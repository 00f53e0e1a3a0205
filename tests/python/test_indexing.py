"""Indexing edge cases behave as on CPU: empty index lists and zero-size
dims, masks of the wrong shape, uint8 masks (deprecated: warned, or refused
where CPU refuses them), out-of-range indices on empty dims, and the
index_copy/index_add size checks, with CPU's error types and messages."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import assert_close


def arange(*shape: int) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return torch.arange(float(n)).reshape(shape)


@pytest.mark.parametrize("case", [
    lambda t, d: t(0, 3)[[]],
    lambda t, d: t(0, 3)[torch.tensor([], dtype=torch.long, device=d)],
    lambda t, d: t(3, 0)[:, torch.tensor([], dtype=torch.long, device=d)],
    lambda t, d: t(0)[torch.tensor([], dtype=torch.bool, device=d)],
    lambda t, d: t(5, 3)[[]],
    lambda t, d: t(2, 0, 4)[torch.tensor([1, 0], device=d)],
    lambda t, d: torch.index_select(t(0, 3), 0, torch.tensor([], dtype=torch.long, device=d)),
    lambda t, d: torch.index_select(t(0, 3), 1, torch.tensor([2, 0], device=d)),
    lambda t, d: torch.gather(t(3, 0), 1, torch.zeros(3, 0, dtype=torch.long, device=d)),
    lambda t, d: torch.zeros(0, 3, device=d).scatter_add(0, torch.zeros(0, 3, dtype=torch.long, device=d), t(0, 3)),
], ids=["list-zero-dim", "tensor-zero-dim", "zero-size-second-dim", "empty-bool", "empty-list", "zero-size-inner",
        "index-select-empty", "index-select-zero-rows", "gather-empty", "scatter-empty"])
def test_empty_indexing(dev: torch.device, case) -> None:
    ref = case(lambda *s: arange(*s), torch.device("cpu"))
    out = case(lambda *s: arange(*s).to(dev), dev)
    assert out.shape == ref.shape
    assert_close(out, ref)


def _raises_like_cpu(dev: torch.device, fn) -> None:
    with pytest.raises(Exception) as cpu_error:
        fn(torch.device("cpu"))
    with pytest.raises(type(cpu_error.value)) as dev_error:
        fn(dev)
    assert str(dev_error.value).split("\n")[0] == str(cpu_error.value).split("\n")[0]


@pytest.mark.parametrize("case", [
    lambda d: arange(5, 3).to(d)[torch.tensor([True, False], device=d)],
    lambda d: arange(2, 3, 4).to(d)[torch.tensor([[True, False], [False, True]], device=d)],
    lambda d: arange(0, 3).to(d)[torch.tensor([0], device=d)],
    lambda d: arange(0, 3).to(d)[[0]],
    lambda d: arange(5).to(d).__setitem__(torch.tensor([1, 0, 1, 0, 1], dtype=torch.uint8, device=d), 0.0),
    lambda d: torch.zeros(5, 3, device=d).index_copy_(0, torch.tensor([0, 1], device=d), arange(3, 3).to(d)),
    lambda d: torch.zeros(5, 3, device=d).index_add_(0, torch.tensor([0, 1], device=d), arange(3, 3).to(d)),
    lambda d: torch.zeros(5, 3, device=d).index_copy_(0, torch.tensor([0, 1], dtype=torch.int32, device=d), arange(2, 3).to(d)),
    lambda d: torch.zeros(5, 3, device=d).index_fill_(0, torch.tensor([], dtype=torch.int32, device=d), 1.0),
    lambda d: torch.zeros(4, 5, device=d).index_put_((torch.tensor([], dtype=torch.long, device=d),),
                                                     torch.ones(0, device=d), accumulate=True),
    lambda d: torch.zeros(4, 5, device=d).index_put_((torch.zeros(4, dtype=torch.bool, device=d),), torch.ones(0, device=d)),
    lambda d: torch.zeros(4, 5, device=d).index_put_((torch.tensor([], dtype=torch.uint8, device=d),), torch.tensor(1.0)),
    lambda d: torch.ones(2, 3, 4, device=d)[False, [0, 1], ...],
    lambda d: torch.zeros(5, 5, device=d).__setitem__(([0, 1], [0, 1, 2]), 0.0),
    lambda d: torch.arange(4, device=d).__setitem__(torch.arange(4, device=d) > -1, torch.tensor([], device=d)),
    lambda d: torch.ops.aten.index.Tensor(torch.tensor([1.0], device=d), []),
    lambda d: torch.tensor([[1, 2], [4, 5]], device=d).index_fill_(1, torch.tensor([0], device=d), 1 + 1j),
    lambda d: torch.tensor([[True, False]], device=d).index_fill_(1, torch.tensor([0], device=d), 1 + 1j),
], ids=["mask-shape", "2d-mask-shape", "index-empty-dim", "list-empty-dim", "uint8-mask-fill", "index-copy-count",
        "index-add-count", "index-copy-int32", "index-fill-int32-empty", "empty-index-put-values-shape",
        "false-mask-values-shape", "empty-uint8-mask-shape", "empty-result-indices-broadcast",
        "setitem-indices-broadcast", "values-shape-before-dtype", "no-indices", "index-fill-complex-scalar",
        "index-fill-bool-complex-scalar"])
def test_errors_match_cpu(dev: torch.device, case) -> None:
    _raises_like_cpu(dev, case)


def test_uint8_masks_warn_like_cpu(dev: torch.device) -> None:
    mask = torch.tensor([1, 0, 1, 0, 1], dtype=torch.uint8)
    with warnings.catch_warnings(record=True) as cpu_w:
        warnings.simplefilter("always")
        ref = arange(5)[mask]
    with warnings.catch_warnings(record=True) as dev_w:
        warnings.simplefilter("always")
        out = arange(5).to(dev)[mask.to(dev)]
    assert_close(out, ref)
    def messages(ws: list) -> list:  # the text, without where it was triggered
        return [str(w.message).split(" (Triggered")[0] for w in ws if "uint8" in str(w.message)]

    assert messages(dev_w) == messages(cpu_w) and messages(dev_w)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("index_shape", [(0,), (0, 5), (4, 0), (1, 0)], ids=str)
@pytest.mark.parametrize("self_shape", [(4, 5), (3,), ()], ids=str)
def test_scatter_reduce_with_an_empty_index_leaves_self_as_cpu_does(dev: torch.device, reduce: str, index_shape,
                                                                     self_shape) -> None:
    # ATen's rule: an empty index passes every shape check and scatters nothing. The rank
    # check used to come first on pjrt ("Index tensor must have the same number of dimensions").
    def run(d: torch.device) -> torch.Tensor:
        x = torch.arange(float(torch.Size(self_shape).numel())).reshape(self_shape).to(d)
        return x.scatter_reduce_(-1 if self_shape else 0, torch.zeros(index_shape, dtype=torch.long, device=d),
                                 torch.ones(3, 3, device=d), reduce)

    ref, out = run(torch.device("cpu")), run(dev)
    assert out.device.type == dev.type
    assert_close(out, ref)


def test_complex_scatter_reduce_mean_divides_as_cpu(dev: torch.device) -> None:
    # The mean's division is Smith's, as torch's CPU (and pjrt's div) computes it: equal to
    # the CPU's bit for bit, given equal sums (a sum of one or two terms here).
    g = torch.Generator().manual_seed(1)
    base = torch.randn(1, 5, dtype=torch.complex64, generator=g)
    src = torch.randn(1, 6, dtype=torch.complex64, generator=g)
    idx = torch.tensor([[0, 1, 2, 3, 4, 0]])
    ref = base.scatter_reduce(1, idx, src, "mean", include_self=False)
    out = base.to(dev).scatter_reduce(1, idx.to(dev), src.to(dev), "mean", include_self=False)
    assert torch.equal(out.cpu(), ref)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean"])
def test_complex_scatter_reduce_matches_cpu(dev: torch.device, reduce: str) -> None:
    # "mean" on complex64 killed the process (SIGSEGV): its count was taken with a maximum of
    # complex values, which XLA's CPU compiler crashed on.
    g = torch.Generator().manual_seed(0)
    idx = torch.tensor([[0, 1], [2, 3], [4, 0], [1, 1]])
    src = torch.randn(6, 7, dtype=torch.complex64, generator=g)
    ref = torch.ones(4, 5, dtype=torch.complex128).scatter_reduce_(1, idx, src.to(torch.complex128), reduce=reduce)
    out = torch.ones(4, 5, dtype=torch.complex64, device=dev).scatter_reduce_(1, idx.to(dev), src.to(dev), reduce=reduce)
    # At most two float32 roundings per element (one multiply or add, one divide).
    torch.testing.assert_close(out.cpu().to(torch.complex128), ref, rtol=4 * torch.finfo(torch.float32).eps, atol=0)


@pytest.mark.parametrize("reduce", ["amax", "amin"])
def test_complex_scatter_reduce_amax_is_refused_as_on_cpu(dev: torch.device, reduce: str) -> None:
    idx = torch.tensor([[0, 1]])
    for d in (torch.device("cpu"), dev):
        with pytest.raises(RuntimeError, match="ComplexFloat"):
            torch.ones(1, 5, dtype=torch.complex64, device=d).scatter_reduce_(
                1, idx.to(d), torch.ones(1, 2, dtype=torch.complex64, device=d), reduce=reduce)
