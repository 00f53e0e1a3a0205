"""Reductions, searches, nll_loss, binary ops and add/sub's alpha refuse what ATen refuses, with the same exception type and
wording, and answer the edge cases ATen answers (empty dims, NaN, unsorted rows), judged
against CPU PyTorch (fallback forbidden)."""
from __future__ import annotations

import re
import warnings
from typing import Callable

import pytest
import torch
import torch.nn.functional as F

from conftest import DEV

Fn = Callable[[torch.device], object]


def _run(fn: Fn, device: torch.device) -> tuple[object, BaseException | None]:
    torch.manual_seed(0)  # the same CPU-drawn inputs for both devices
    try:
        return fn(device), None
    except Exception as error:  # noqa: BLE001 - the exception itself is compared
        return None, error


def _cpu_tensors(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, tuple):
        return tuple(_cpu_tensors(v) for v in value)
    return value


# (name, fn of the device, phrase both messages hold or None where both succeed)
_CASES: list[tuple[str, Fn, str | None]] = [
    ("argmax-65-dims", lambda d: torch.ones([1] * 65, device=d).argmax(0), "only tensors with up to 64 dims"),
    ("prod-65-dims", lambda d: torch.ones([1] * 65, device=d).prod(0), "only tensors with up to 64 dims"),
    ("nansum-65-dims", lambda d: torch.ones([1] * 65, device=d).nansum(-1), "only tensors with up to 64 dims"),
    ("count-nonzero-65-dims", lambda d: torch.ones([1] * 65, device=d).count_nonzero(0), "only tensors with up to 64"),
    ("sum-65-dims-no-dim", lambda d: torch.ones([1] * 65, device=d).sum(), None),
    ("all-65-dims-no-dim", lambda d: torch.ones([1] * 65, device=d).all(), "only tensors with up to 64 dims"),
    ("nansum-repeated-dim", lambda d: torch.ones(2, 3, 4, device=d).nansum((0, 1, 1)), "appears multiple times"),
    ("count-nonzero-repeated-dim", lambda d: torch.ones(2, 3, 4, device=d).count_nonzero((1, 1)), "appears multiple"),
    ("all-empty-dims", lambda d: torch.tensor([[1.0, 0.0], [2.0, 3.0]], device=d).all(dim=[]), None),
    ("any-empty-dims-keepdim", lambda d: torch.tensor([[0, 0], [2, 3]], device=d).any(dim=[], keepdim=True), None),
    ("all-out-float", lambda d: torch.all(torch.ones(3, device=d), 0, out=torch.empty(0, device=d)),
     "all only supports bool tensor for result"),
    ("any-out-uint8", lambda d: torch.any(torch.ones(3, 2, dtype=torch.uint8, device=d), 1,
                                          out=torch.empty(0, dtype=torch.uint8, device=d)), None),
    ("max-dim-out-int-values", lambda d: torch.max(torch.ones(3, 2, device=d), 0, out=(
        torch.empty(0, dtype=torch.int32, device=d), torch.empty(0, dtype=torch.long, device=d))), "dtype"),
    ("min-dim-out-double-indices", lambda d: torch.min(torch.ones(3, 2, device=d), 0, out=(
        torch.empty(0, device=d), torch.empty(0, dtype=torch.double, device=d))), "dtype"),
    ("mode-out-wrong-values", lambda d: torch.mode(torch.ones(4, dtype=torch.uint8, device=d), -1, out=(
        torch.empty(0, dtype=torch.int8, device=d), torch.empty(0, dtype=torch.long, device=d))),
     "expected scalar type .* but got .* for values"),
    ("argmax-empty-dim", lambda d: torch.ones(2, 0, 3, device=d).argmax(1), "Expected reduction dim 1 to have non-zero"),
    ("argmin-empty-no-dim", lambda d: torch.ones(0, device=d).argmin(), "Expected reduction dim to be specified"),
    ("kthvalue-empty-dim", lambda d: torch.ones(2, 0, 3, device=d).kthvalue(1, 1), "Expected reduction dim 1"),
    ("median-empty-dim", lambda d: torch.ones(2, 0, 3, device=d).median(1), "Expected reduction dim 1"),
    ("median-empty-last-dim-keepdim", lambda d: torch.ones(2, 0, 3, device=d).median(2, keepdim=True), None),
    ("median-of-nothing", lambda d: torch.ones(0, device=d).median(), None),
    ("nanmedian-of-nothing", lambda d: torch.ones(0, device=d).nanmedian(), None),
    ("aminmax-complex", lambda d: torch.aminmax(torch.tensor(1.0, dtype=torch.complex64, device=d), dim=0),
     "not implemented"),
    ("bincount-float", lambda d: torch.bincount(torch.tensor([1.0], device=d)), "not implemented for 'Float'"),
    ("bincount-2d", lambda d: torch.bincount(torch.tensor([[1, 2]], device=d)), "1-d non-negative integral"),
    ("histc-infinite-data", lambda d: torch.histc(torch.tensor([0.0, float("inf")], device=d)), r"range of \[.*\] is not"),
    ("histc-nan-data", lambda d: torch.histc(torch.tensor([0.0, float("nan")], device=d)), r"range of \[.*\] is not"),
    ("histc-data-range", lambda d: torch.histc(torch.tensor([0.5, 2.0, 2.0, 7.0], device=d), bins=4), None),
    ("histc-constant-data", lambda d: torch.histc(torch.tensor([3.0, 3.0], device=d), bins=3), None),
    ("searchsorted-nan", lambda d: torch.searchsorted(torch.tensor([0.0, 1.0, 2.0, 3.0], device=d),
                                                      torch.tensor([1.0, float("nan"), 2.0], device=d)), None),
    ("searchsorted-nan-right", lambda d: torch.searchsorted(torch.tensor([0.0, 1.0, 2.0, 3.0], device=d),
                                                            torch.tensor([1.0, float("nan")], device=d), right=True), None),
    # Unsorted rows: the answer is wherever ATen's binary search stops.
    ("searchsorted-unsorted", lambda d: torch.searchsorted(
        torch.tensor([[3.0, 2.0, 9.0, 1.0, 5.0], [5.0, 4.0, 3.0, 2.0, 1.0]], device=d),
        torch.tensor([[3.0, 1.0, 6.0], [2.5, 5.0, 0.0]], device=d)), None),
    ("searchsorted-long-row", lambda d: torch.searchsorted(torch.arange(1000.0, device=d) * 0.5,
                                                           torch.tensor([-1.0, 0.0, 0.25, 499.5, 700.0], device=d)), None),
    ("searchsorted-scalar-2d", lambda d: torch.searchsorted(torch.ones(2, 3, device=d), 1.0), "only when boundaries"),
    ("searchsorted-out-dtype", lambda d: torch.searchsorted(torch.ones(3, device=d), torch.ones(2, device=d),
                                                            out=torch.empty(2, device=d)), "output tensor's dtype is wrong"),
    ("searchsorted-sorter-long", lambda d: torch.searchsorted(torch.ones(3, device=d), torch.ones(2, device=d),
                                                              sorter=torch.zeros(3, device=d)), "sorter must be a tensor of"),
    ("searchsorted-sorter-range", lambda d: torch.searchsorted(torch.tensor([1, 2, 3], device=d), 2,
                                                               sorter=torch.tensor([0, 1, 3], device=d)), "out of range"),
    ("bucketize-scalar", lambda d: torch.bucketize(2.5, torch.tensor([1.0, 2.0, 3.0], device=d)), None),
    ("nll-loss-float-target", lambda d: F.nll_loss(torch.randn(2, 3).to(d), torch.zeros(2, device=d)),
     "expected target dtype to be Long or Byte"),
    ("nll-loss2d-float-target", lambda d: F.nll_loss(torch.randn(2, 3, 2, 2).to(d), torch.zeros(2, 2, 2, device=d)),
     "expected target dtype to be Long or Byte"),
    ("nll-loss-short-weight", lambda d: F.nll_loss(torch.randn(2, 3).to(d), torch.tensor([0, 1], device=d),
                                                   weight=torch.ones(2, device=d)), "defined either for all 3 classes"),
    ("nll-loss2d-short-weight", lambda d: F.nll_loss(torch.randn(2, 3, 2, 2).to(d), torch.zeros(2, 2, 2, dtype=torch.long,
                                                     device=d), weight=torch.ones(2, device=d)), "defined either for all"),
    ("nll-loss-weight-dtype", lambda d: F.nll_loss(torch.randn(2, 3).to(d), torch.tensor([0, 1], device=d),
                                                   weight=torch.ones(3, dtype=torch.double, device=d)),
     r"expected scalar type \w+ but found \w+"),
    ("add-bool-alpha", lambda d: torch.add(torch.ones(2, dtype=torch.int8, device=d), 1, alpha=True), "Boolean alpha"),
    ("add-float-alpha-ints", lambda d: torch.add(torch.ones(2, dtype=torch.int8, device=d), 1, alpha=1.5), "integral input"),
    ("add-complex-alpha-real", lambda d: torch.add(torch.ones(2, device=d), torch.ones(2, device=d), alpha=1j),
     "non-complex input"),
    ("sub-bool-alpha", lambda d: torch.sub(torch.ones(2, dtype=torch.int8, device=d), 1, alpha=True), "Boolean alpha"),
    ("add-bool-alpha-bools", lambda d: torch.add(torch.ones(2, dtype=torch.bool, device=d),
                                                 torch.zeros(2, dtype=torch.bool, device=d), alpha=True), None),
    ("maximum-complex", lambda d: torch.maximum(torch.ones(2, dtype=torch.complex64, device=d),
                                                torch.ones(2, dtype=torch.complex64, device=d)), "not implemented for complex"),
    ("fmin-complex", lambda d: torch.fmin(torch.ones(2, dtype=torch.complex64, device=d), torch.ones(2, device=d)),
     "not implemented for complex"),
    ("pow-int-negative-int", lambda d: torch.tensor([2, 3], device=d).pow(-2), "Integers to negative integer powers"),
    ("pow-int-negative-float", lambda d: torch.tensor([2, 4], device=d).pow(-0.5), None),
    # The sign bit itself, NaNs' included (arithmetic on a NaN keeps no sign XLA promises).
    ("copysign-nan-broadcast", lambda d: torch.signbit(torch.copysign(
        torch.tensor([float("nan")], device=d), torch.tensor([[-1.0, 2.0], [3.0, -4.0]], device=d))), None),
    ("signbit-nan-and-zero", lambda d: torch.signbit(torch.tensor([-float("nan"), float("nan"), -0.0, 0.0], device=d)), None),
    ("copysign-half-zero", lambda d: torch.signbit(torch.copysign(torch.tensor([0.0, 2.0], dtype=torch.half, device=d),
                                                                  torch.tensor([-0.0, -1.0], dtype=torch.half, device=d))), None),
    # A Python scalar multiplies or divides a half tensor in float: 1e5 is no half.
    ("half-div-large-scalar", lambda d: torch.tensor([100.0, 3.0], dtype=torch.half, device=d).div(1e5), None),
    ("bfloat16-mul-small-scalar", lambda d: torch.tensor([1e30, 3.0], dtype=torch.bfloat16, device=d) * 1e-40, None),
    ("nll-loss-byte-target", lambda d: F.nll_loss(torch.randn(2, 3).to(d), torch.tensor([0, 2], dtype=torch.uint8, device=d)),
     None),
]


@pytest.mark.parametrize("name,fn,phrase", _CASES, ids=[c[0] for c in _CASES])
def test_as_cpu(name: str, fn: Fn, phrase: str | None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected, expected_error = _run(fn, torch.device("cpu"))
        got, error = _run(fn, DEV)
    if phrase is None:
        assert expected_error is None and error is None, (expected_error, error)
        torch.testing.assert_close(_cpu_tensors(got), expected, equal_nan=True)
        return
    assert expected_error is not None, f"{name}: the CPU accepts this; the case is wrong"
    assert error is not None, f"{name}: pjrt accepted what the CPU refuses ({expected_error})"
    assert type(error) is type(expected_error), (error, expected_error)

    assert re.search(phrase, str(expected_error)), expected_error
    assert re.search(phrase, str(error)), error


def test_var_warns_without_degrees_of_freedom() -> None:
    x = torch.randn(4, 3).to(DEV)
    for fn in (torch.std, torch.var, torch.var_mean, torch.std_mean):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn(x, dim=-1, correction=3)
        assert any("degrees of freedom is <= 0" in str(w.message) for w in caught), fn
