"""Device RNG: seeded, reproducible, state held on the device."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def draw(dev: torch.device) -> list[torch.Tensor]:
    x = torch.empty(1000, device=dev)
    return [torch.rand(1000, device=dev), torch.randn(1000, device=dev), x.uniform_(-2, 3), x.clone().normal_(1, 2),
            torch.bernoulli(torch.full((1000,), 0.3, device=dev)), F.dropout(torch.ones(1000, device=dev), 0.25),
            torch.randint(0, 7, (1000,), device=dev)]


def test_manual_seed_reproduces(dev):
    torch.manual_seed(1234)
    a = [t.cpu() for t in draw(dev)]
    torch.manual_seed(1234)
    b = [t.cpu() for t in draw(dev)]
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    torch.pjrt.manual_seed(99)
    c = draw(dev)[0].cpu()
    assert not torch.equal(a[0], c)


def test_distributions_look_right(dev):
    torch.manual_seed(0)
    u, n, ur, nn_, bern, drop, ri = (t.cpu().double() for t in draw(dev))
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.05
    assert abs(n.mean()) < 0.1 and abs(n.std() - 1) < 0.1
    assert -2 <= ur.min() and ur.max() < 3
    assert abs(nn_.mean() - 1) < 0.2 and abs(nn_.std() - 2) < 0.2
    assert set(bern.unique().tolist()) <= {0.0, 1.0} and abs(bern.mean() - 0.3) < 0.05
    assert set(drop.unique().tolist()) <= {0.0, float(torch.tensor(1 / 0.75))} and abs((drop == 0).double().mean() - 0.25) < 0.05
    assert ri.min() >= 0 and ri.max() <= 6 and len(ri.unique()) == 7


def test_rng_state_get_set(dev):
    state = torch.pjrt.get_rng_state()
    a = torch.rand(5, device=dev).cpu()
    torch.pjrt.set_rng_state(state)
    b = torch.rand(5, device=dev).cpu()
    assert torch.equal(a, b)
    g = torch.Generator(device=dev)
    g.manual_seed(5)
    x = torch.rand(4, device=dev, generator=g).cpu()
    g.manual_seed(5)
    assert torch.equal(x, torch.rand(4, device=dev, generator=g).cpu())


def test_dropout_backward_uses_mask(dev):
    torch.manual_seed(3)
    x = torch.ones(200, device=dev, requires_grad=True)
    y = F.dropout(x, 0.5)
    y.sum().backward()
    assert torch.equal(x.grad.cpu(), y.detach().cpu())


def test_manual_seed_after_set_rng_state_restarts_the_stream(dev):
    # freeze_rng_state-style code restores a state, then seeds: the seed alone decides what follows.
    torch.manual_seed(42)
    first = torch.rand(6, device=dev).cpu()
    saved = torch.pjrt.get_rng_state()
    torch.rand(3, device=dev)
    torch.pjrt.set_rng_state(saved)
    torch.manual_seed(42)
    assert torch.equal(torch.rand(6, device=dev).cpu(), first)


def _raises_like_cpu(dev, fn) -> None:
    import pytest

    with pytest.raises(Exception) as cpu_error:
        fn(torch.device("cpu"))
    with pytest.raises(type(cpu_error.value)) as dev_error:
        fn(dev)
    assert str(dev_error.value).split("\n")[0] == str(cpu_error.value).split("\n")[0]


def test_random_bounds_and_spread_as_aten(dev):
    # random_ draws from [from, to) (default: [0, the dtype's largest integer], 2^digits for
    # floats), over the whole int64 range where asked, with ATen's bound checks.
    torch.manual_seed(0)
    n = 4000
    cases = [(torch.int64, None, None, 0, 2**63 - 1), (torch.int16, None, None, 0, 2**15 - 1),
             (torch.float32, None, None, 0, 2**24), (torch.bfloat16, None, None, 0, 2**8),
             (torch.bool, None, None, 0, 1), (torch.uint8, 3, None, 3, 255),
             (torch.int64, -2**63, None, -2**63, 2**63 - 1), (torch.int32, -7, 5, -7, 4),
             (torch.float64, 2**40, 2**40 + 10, 2**40, 2**40 + 9)]
    for dtype, lo, hi, expect_lo, expect_hi in cases:
        t = torch.empty(n, dtype=dtype, device=dev)
        if lo is None:
            t.random_()
        elif hi is None:
            t.random_(lo, None)
        else:
            t.random_(lo, hi)
        v = t.cpu().double()
        span = float(expect_hi) - float(expect_lo) + 1
        assert v.min() >= expect_lo and v.max() <= expect_hi, dtype
        # Spread over the range: both ends come within a tenth of it (or hit for small ranges).
        assert v.min() < expect_lo + max(1.0, 0.1 * span) and v.max() > expect_hi - max(1.0, 0.1 * span), dtype
    for fn in (lambda d: torch.empty(3, dtype=torch.int8, device=d).random_(0, 200),
               lambda d: torch.empty(3, dtype=torch.uint8, device=d).random_(-1, 5),
               lambda d: torch.empty(3, dtype=torch.bool, device=d).random_(0, 3),
               lambda d: torch.empty(3, device=d).random_(5, 5)):
        _raises_like_cpu(dev, fn)
    with _warnings_recorded() as w:
        torch.empty(3, device=dev).random_(0, 2**25)
    assert any("to - 1 is out of bounds" in str(x.message) for x in w)


def _warnings_recorded():
    import warnings

    ctx = warnings.catch_warnings(record=True)
    warnings.simplefilter("always")
    return ctx


def test_uniform_normal_randperm_refuse_what_aten_refuses(dev):
    for fn in (lambda d: torch.empty(3, device=d).uniform_(-3e38, 3e38),
               lambda d: torch.empty(3, device=d).uniform_(1, 0),
               lambda d: torch.normal(torch.zeros(3, device=d), torch.tensor([1.0, -1.0, 1.0], device=d)),
               lambda d: torch.randperm(257, dtype=torch.uint8, device=d),
               lambda d: torch.randperm(2**11 + 2, dtype=torch.half, device=d)):
        _raises_like_cpu(dev, fn)
