"""Sparse layouts on pjrt: COO and CSR tensors keep their indices and values on the
device; construction, metadata and component views are PyTorch's own device-generic
kernels, every other sparse op runs on the CPU through the counted fallback. Each
result is compared with the same op on CPU sparse tensors."""
from __future__ import annotations

import pytest
import torch

import torch_pjrt
from conftest import DEV, assert_close


def dense(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 5, generator=g, dtype=torch.float64)
    return x * (torch.rand(4, 5, generator=g) > 0.5)


def to_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x.to_sparse() if layout == "coo" else x.to_sparse_csr()


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_tensor_lives_on_the_device(layout: str) -> None:
    s = to_layout(dense().to(DEV), layout)
    assert s.device.type == "pjrt" and s.layout == to_layout(dense(), layout).layout
    values = s._values() if layout == "coo" else s.values()
    assert values.device.type == "pjrt"
    assert s._nnz() == int((dense() != 0).sum())
    assert_close(s.to_dense(), dense())


def test_coo_construction_and_component_views() -> None:
    indices, values = torch.tensor([[0, 1, 3], [2, 0, 4]]), torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    s = torch.sparse_coo_tensor(indices.to(DEV), values.to(DEV), (4, 5))
    expected = torch.sparse_coo_tensor(indices, values, (4, 5))
    assert_close(s.to_dense(), expected.to_dense())
    s = s.coalesce()
    s._values()[1] = 7.0  # a view of the tensor's own values: the write shows in the tensor
    expected = expected.coalesce()
    expected._values()[1] = 7.0
    assert_close(s.to_dense(), expected.to_dense())
    assert_close(s.indices(), expected.indices())


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_ops_match_cpu_and_are_counted(layout: str) -> None:
    a, b = dense(0), dense(1)
    torch_pjrt.reset_metrics()
    sa, sb = to_layout(a.to(DEV), layout), to_layout(b.to(DEV), layout)
    ca, cb = to_layout(a, layout), to_layout(b, layout)
    assert_close((sa + sb).to_dense(), (ca + cb).to_dense())
    assert_close((sa * 2.5).to_dense(), (ca * 2.5).to_dense())
    assert_close(torch.sparse.mm(sa, b.t().contiguous().to(DEV)), torch.sparse.mm(ca, b.t().contiguous()))
    if layout == "coo":  # torch.sparse.sum takes COO only, on every device
        assert_close(torch.sparse.sum(sa), torch.sparse.sum(ca))
    mask = to_layout((a != 0).to(DEV), layout)
    assert_close(torch.masked.sum(b.to(DEV), 1, mask=mask), torch.masked.sum(b, 1, mask=to_layout(a != 0, layout)))
    assert sum(torch_pjrt.metrics()["fallbacks"].values()) > 0  # counted, as every fallback is


def test_sparse_in_place_op_writes_the_device_tensor() -> None:
    a = dense()
    s, c = a.to(DEV).to_sparse(), a.to_sparse()
    s.mul_(3.0)
    c.mul_(3.0)
    assert s.device.type == "pjrt"
    assert_close(s.to_dense(), c.to_dense())


def test_sparse_fallback_can_be_forbidden() -> None:
    s = dense().to(DEV).to_sparse()
    with torch_pjrt.fallback_mode("error"), pytest.raises(NotImplementedError, match="TORCH_PJRT_FALLBACK=error"):
        s + s


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
def test_sparse_mm_reduce_gradients_match_cpu(reduce: str) -> None:
    # amax/amin's CPU kernel saves the argmax indices only for inputs that require grad: the
    # fallback's CPU stand-ins must say so, or the backward reads out of bounds (it crashed).
    x, w = dense(1), torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    grads = []
    for device in ("cpu", DEV):
        s = x.to(device).to_sparse_csr().requires_grad_()
        wd = w.to(device).requires_grad_()
        out = torch.sparse.mm(s, wd, reduce)
        gs, gw = torch.autograd.grad(out.sum(), (s, wd))
        grads.append((out, gs.to_dense(), gw))
    for got, expected in zip(grads[1], grads[0]):
        assert_close(got, expected.detach())
