"""Fused eager: ops are recorded into one graph per device and run as one
program at sync points and cuts. What it must show: the same results as CPU,
settling on cached programs in a training loop, no materialized dead values,
donation of overwritten buffers, errors that name the op and the user's line,
and a synchronize() that waits for all enqueued work."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F
from models import MLP, SmallCNN, TinyTransformer, synthetic_images, synthetic_tokens
from test_training import train

import torch_pjrt


def metric(name: str) -> int:
    return torch_pjrt.metrics()[name]


def test_eager_mode_setter_context_and_env():
    assert torch_pjrt.eager_mode() in torch_pjrt.modes.EAGER_MODES
    before = torch_pjrt.eager_mode()
    with torch_pjrt.eager_mode("fused"):
        assert torch_pjrt.eager_mode() == "fused"
        with torch_pjrt.eager_mode("debug"):
            assert torch_pjrt.eager_mode() == "debug"
        assert torch_pjrt.eager_mode() == "fused"
    assert torch_pjrt.eager_mode() == before
    torch_pjrt.eager_mode("fused")  # a plain setter too
    assert torch_pjrt.eager_mode() == "fused"
    with pytest.raises(ValueError, match="strict, fused, debug"):
        torch_pjrt.eager_mode("lazy")
    code = "import torch, torch_pjrt; print(torch_pjrt.eager_mode())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, TORCH_PJRT_EAGER_MODE="fused"), timeout=120)
    assert r.stdout.strip() == "fused", r.stderr
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, TORCH_PJRT_EAGER_MODE="bogus"), timeout=120)
    assert r.returncode != 0 and "strict, fused or debug" in r.stderr


def test_ops_are_deferred_until_a_sync_point(dev):
    torch_pjrt.eager_mode("fused")
    torch_pjrt.synchronize()
    x = torch.randn(64, device=dev)
    torch_pjrt.reset_metrics()
    y = ((x * 2 + 1).relu() - 0.5).sum()
    assert metric("executions") == 0 and metric("ops_recorded") == 5
    assert torch_pjrt._C._storage_info(y)["pending"]
    value = y.item()  # the sync point: one program for all five ops
    assert metric("executions") == 1 and metric("graphs") == 1
    assert metric("flush_reasons") == {"sync": 1}
    expected = ((x.cpu() * 2 + 1).relu() - 0.5).sum().item()
    assert value == pytest.approx(expected, rel=1e-6)


def test_dead_intermediates_are_not_materialized(dev):
    torch_pjrt.eager_mode("fused")
    x = torch.randn(256, 256, device=dev) / 16  # well conditioned: tanh does not saturate
    torch_pjrt.synchronize()
    torch_pjrt.reset_metrics()
    h = x
    for _ in range(10):
        h = torch.tanh(h @ x) * 0.5  # each iteration's h is dropped by the next
    out = h.sum()
    del h
    out.item()
    m = torch_pjrt.metrics()
    assert m["executions"] == 1
    assert m["graph_outputs"] == 1, "only the sum is still referenced"
    assert m["dropped_values"] >= 20  # 10 matmul and 10 tanh results, never made into buffers
    ref = x.cpu()
    for _ in range(10):
        ref = torch.tanh(ref @ x.cpu()) * 0.5
    assert out.cpu().item() == pytest.approx(ref.sum().item(), rel=1e-4)


def test_fused_views_and_inplace_match_cpu(dev):
    torch_pjrt.eager_mode("fused")
    base = torch.arange(24.0).reshape(4, 6)
    d = base.to(dev)
    for t in (base, d):
        v = t[1:3, ::2]           # strided view
        v.mul_(10)                # in-place through the view
        t.t()[0].add_(1)          # write through a transposed view
        col = t[:, 5]
        col.copy_(t[:, 0] * -1)   # read and write the same storage in one op
        t.narrow(1, 2, 2).zero_()
        torch.add(t[0], t[3], out=t[2])
    torch.testing.assert_close(d.cpu(), base)
    assert metric("ops_recorded") > 0


def test_rng_in_fused_mode_is_reproducible_and_advances(dev):
    torch_pjrt.eager_mode("fused")
    torch.manual_seed(7)
    a = torch.rand(1000, device=dev)
    b = torch.rand(1000, device=dev)  # the generator state is pending between the two
    torch.manual_seed(7)
    with torch_pjrt.eager_mode("strict"):
        a2 = torch.rand(1000, device=dev)
        b2 = torch.rand(1000, device=dev)
    assert torch.equal(a.cpu(), a2.cpu()) and torch.equal(b.cpu(), b2.cpu())
    assert not torch.equal(a.cpu(), b.cpu())
    state = torch.pjrt.get_rng_state()
    c = torch.rand(10, device=dev)
    torch.pjrt.set_rng_state(state)
    assert torch.equal(torch.rand(10, device=dev).cpu(), c.cpu())


def compiles_after_each_step(model, make_opt, batches, loss_fn, steps: int) -> tuple[list[float], list[int]]:
    compiles: list[int] = []
    losses = train(model, "pjrt", make_opt, batches, loss_fn, steps,
                   after_step=lambda: compiles.append(torch_pjrt.metrics()["compiles"]))
    return losses, compiles


@pytest.mark.parametrize("name", ["gpt", "cnn"])
def test_training_settles_on_cached_programs(dev, name):
    """After a few warm-up steps a fused training loop compiles nothing new:
    every iteration hits the same small set of programs."""
    torch_pjrt.eager_mode("fused")
    torch.manual_seed(0)
    if name == "gpt":
        model = TinyTransformer(vocab=64, dim=32, heads=4, layers=2, seq=16)
        batches = [synthetic_tokens(4, 16, 64, seed=s) for s in range(3)]
        loss_fn = lambda out, y: F.cross_entropy(out.reshape(-1, 64), y.reshape(-1))  # noqa: E731
        make_opt = lambda p: torch.optim.AdamW(p, lr=3e-3)  # noqa: E731
    else:
        model = SmallCNN(in_ch=3, classes=10, width=8)
        batches = [synthetic_images(8, classes=10, size=16, seed=s) for s in range(3)]
        loss_fn = F.cross_entropy
        make_opt = lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)  # noqa: E731
    torch_pjrt.reset_metrics()
    with torch_pjrt.fallback_mode("error"):
        dev_losses, compiles = compiles_after_each_step(copy.deepcopy(model), make_opt, batches, loss_fn, 36)
    m = torch_pjrt.metrics()
    assert compiles[-1] == compiles[5], f"new compiles in steady state: {compiles}"
    # The loss read cuts each step once, the optimizer step once more: two graphs a step.
    assert m["graphs"] <= 2 * 36 + 4, m
    assert m["flush_reasons"].get("optimizer_step", 0) >= 30, m["flush_reasons"]
    assert m["graph_ops"] / m["graphs"] > 20, "graphs hold many ops"
    cpu_losses = train(copy.deepcopy(model), "cpu", make_opt, batches, loss_fn, 36)
    assert dev_losses[-1] < dev_losses[0]
    # The first steps only: later ones part by float32 chance (see trajectory.py).
    torch.testing.assert_close(dev_losses[:3], cpu_losses[:3], rtol=1e-4, atol=1e-5)


def test_scalar_loop_does_not_recompile_and_cuts_at_the_loop(dev):
    torch_pjrt.eager_mode("fused")
    x = torch.ones(8, device=dev)
    torch_pjrt.synchronize()
    torch_pjrt.reset_metrics()
    ref = torch.ones(8, dtype=torch.float64)
    for i in range(600):
        x = x * 0.9 + (i % 7) * 0.01  # different Python scalars: runtime arguments
        ref = ref * 0.9 + (i % 7) * 0.01
        if i % 3 == 0:
            x = x.relu()
            ref = ref.relu()
    torch.testing.assert_close(x.cpu(), ref.float(), rtol=1e-5, atol=1e-6)
    m = torch_pjrt.metrics()
    assert m["compiles"] <= 6, m["compiles_by_op"]  # a few loop-body phases, the tail
    assert m["flush_reasons"].get("loop", 0) >= 10, m["flush_reasons"]


def test_graph_size_bound_cuts(dev):
    torch_pjrt.eager_mode("fused")
    torch_pjrt.set_fusion_policy(max_ops=50, detect_loops=False)
    try:
        torch_pjrt.reset_metrics()
        x = torch.zeros(4, device=dev)
        for _ in range(120):
            x = x + 1
        assert metric("flush_reasons").get("size", 0) == 2
        assert metric("max_graph_ops") == 50
        assert x.cpu().tolist() == [120.0] * 4
    finally:
        torch_pjrt.set_fusion_policy(max_ops=4000, detect_loops=True)


def adamw_peak_ratio(dev, donate: bool) -> float:
    """Peak device memory of one fused AdamW step over the bytes of params, grads and states."""
    torch_pjrt.eager_mode("fused")
    torch_pjrt.set_fusion_policy(donate=donate)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)]).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(2):  # creates the optimizer states
            opt.zero_grad()
            model(torch.randn(8, 256, device=dev)).sum().backward()
            opt.step()
        opt.zero_grad()
        model(torch.randn(8, 256, device=dev)).sum().backward()
        torch_pjrt.synchronize()
        tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters()]
        tensors += [s for st in opt.state.values() for s in st.values() if torch.is_tensor(s) and s.dim() > 0]
        held = sum(t.numel() * t.element_size() for t in tensors)
        torch.pjrt.reset_peak_memory_stats()
        base = torch.pjrt.memory_allocated()
        opt.step()
        torch_pjrt.synchronize()
        peak = torch.pjrt.max_memory_allocated()
        assert base >= held  # the counted statistics see what is really held
        return peak / held
    finally:
        torch_pjrt.set_fusion_policy(donate=True)


def test_donation_keeps_adamw_peak_memory_low(dev):
    with_donation = adamw_peak_ratio(dev, donate=True)
    without = adamw_peak_ratio(dev, donate=False)
    assert with_donation <= 1.2, with_donation
    assert without > 1.5, without  # the measurement can tell the difference
    assert metric("donated_buffers") > 0


def test_donation_never_takes_a_buffer_something_still_reads(dev):
    torch_pjrt.eager_mode("fused")
    x = torch.randn(1000, device=dev)
    torch_pjrt.synchronize()
    alias = torch.empty(0, device=dev).set_(x.untyped_storage())  # same storage: fine to update
    kept = x.view(10, 100)                                         # a view: sees the update
    snapshot = x.clone()
    torch_pjrt.synchronize()
    saved = x * 1  # separate storage holding the old value
    x.add_(1)
    torch_pjrt.synchronize()
    torch.testing.assert_close(x.cpu(), snapshot.cpu() + 1)
    torch.testing.assert_close(kept.cpu().flatten(), snapshot.cpu() + 1)
    torch.testing.assert_close(alias.cpu(), snapshot.cpu() + 1)
    torch.testing.assert_close(saved.cpu(), snapshot.cpu())
    # A tensor saved for backward keeps its value although the program after it overwrites
    # the parameter in place (autograd would reject a changed version anyway).
    w = torch.randn(4, 4, device=dev, requires_grad=True)
    y = (w * w).sum()
    with torch.no_grad():
        w2 = w.detach().clone()
    y.backward()
    torch.testing.assert_close(w.grad.cpu(), 2 * w2.cpu())


def test_error_in_a_fused_graph_names_the_op_and_the_line(dev):
    torch_pjrt.eager_mode("fused")
    w = torch.arange(10.0, device=dev)
    keep = w.clone()
    torch_pjrt.synchronize()
    a = w * 2
    bad = w.index_select(0, torch.tensor([3, 11], device=dev))  # recorded here; checked at the sync
    w.index_put_((torch.tensor([12], device=dev),), torch.tensor([0.0], device=dev))
    b = a + bad.sum()
    with pytest.raises(IndexError) as info:
        b.cpu()
    message = str(info.value)
    assert "aten::index_select" in message and "test_fused.py:" in message, message
    assert "test_error_in_a_fused_graph_names_the_op_and_the_line" in message
    torch_pjrt.synchronize()  # reported once
    assert torch.equal(w.cpu(), keep.cpu()), "the failing op's writes were not applied"


def test_shape_errors_raise_at_the_users_line(dev):
    torch_pjrt.eager_mode("fused")
    a = torch.ones(2, 3, device=dev)
    with pytest.raises(RuntimeError, match="must match the size") as info:
        a + torch.ones(4, device=dev)
    assert any("test_fused.py" in str(tb.path) for tb in info.traceback)
    assert a.sum().item() == 6


def test_synchronize_waits_for_work_whose_results_were_dropped(dev):
    """Like CUDA's: synchronize() returns only when everything enqueued has run."""
    torch_pjrt.eager_mode("strict")
    a = torch.randn(1024, 1024, device=dev)
    (a @ a).cpu()  # compiled and warm

    def enqueue() -> None:
        for _ in range(12):
            a @ a  # result dropped at once

    torch_pjrt.synchronize()
    start = time.perf_counter()
    enqueue()
    kept = a @ a
    kept.cpu()  # waits for the whole queue on an in-order device... or at least for this one
    with_read = time.perf_counter() - start
    torch_pjrt.synchronize()
    start = time.perf_counter()
    enqueue()
    enqueued = time.perf_counter() - start
    torch_pjrt.synchronize()
    waited = time.perf_counter() - start
    # Enqueueing is fast; synchronize() covers the work (the bug: it returned at once).
    assert waited >= 0.4 * with_read, (enqueued, waited, with_read)


def test_mlp_training_matches_cpu_in_fused_mode(dev):
    torch_pjrt.eager_mode("fused")
    torch.manual_seed(0)
    model = MLP()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(4)]
    make_opt = lambda p: torch.optim.AdamW(p, lr=1e-2)  # noqa: E731
    with torch_pjrt.fallback_mode("error"):
        dev_losses = train(copy.deepcopy(model), "pjrt", make_opt, batches, F.cross_entropy, 10)
    cpu_losses = train(copy.deepcopy(model), "cpu", make_opt, batches, F.cross_entropy, 10)
    torch.testing.assert_close(dev_losses[:3], cpu_losses[:3], rtol=1e-4, atol=1e-5)  # before float32 drift
    assert dev_losses[-1] < dev_losses[0]


def test_explicit_sync_launches_without_waiting_and_is_reported(dev):
    torch_pjrt.eager_mode("fused")
    x = torch.randn(32, device=dev)
    torch_pjrt.synchronize()
    torch_pjrt.reset_metrics()
    y = (x * 3).exp()
    torch_pjrt.sync()  # launched: the value is a buffer now, no host read happened
    info = torch_pjrt._C._storage_info(y)
    assert not info["pending"] and info["materialized"] and info["producer"] == "fused graph (2 ops)"
    m = torch_pjrt.metrics()
    assert m["flush_reasons"] == {"explicit": 1} and m["device_to_host_bytes"] == 0
    report = torch_pjrt.metrics_report()
    assert "graphs run          1 (2.0 ops per graph, at most 2)" in report
    assert "graphs cut by       explicit 1" in report
    torch.testing.assert_close(y.cpu(), (x.cpu() * 3).exp())
    torch_pjrt.sync()  # nothing pending: a no-op
    assert torch_pjrt.metrics()["graphs"] == 1


@pytest.mark.parametrize("make", [lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, fused=True),
                                  lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, fused=True)],
                         ids=["adamw", "sgd"])
def test_a_learning_rate_schedule_does_not_recompile_fused_optimizers(make) -> None:
    """The learning rate (which a scheduler changes every step, as the HF Trainer's does) is
    a runtime argument of the fused optimizer's program, not a constant compiled into it."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4).to("pjrt")
    opt = make(list(model.parameters()))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    compiles = []
    for _ in range(5):
        model(torch.randn(8, 16).to("pjrt")).square().mean().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        torch_pjrt.synchronize()
        compiles.append(torch_pjrt.metrics()["compiles"])
    assert compiles[2] == compiles[-1], compiles
