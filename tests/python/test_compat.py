"""ATen's internal and fused entry points that user code reaches through
PyTorch (fused optimizers, GradScaler, weight norm, masked softmax, legacy
convolutions, cdist/pdist, ...) run natively and match CPU, with the CPU
fallback forbidden."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import assert_close

import torch_pjrt


@pytest.fixture(autouse=True)
def _no_fallback():
    with torch_pjrt.fallback_mode("error"):
        yield


def _train(model: nn.Module, opt: torch.optim.Optimizer, xs: list, dev: torch.device, scaler=None) -> None:
    for x in xs:
        opt.zero_grad()
        loss = model(x.to(dev)).square().mean()
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()


@pytest.mark.parametrize("cls,kw", [
    (torch.optim.Adam, dict(lr=1e-2)), (torch.optim.Adam, dict(lr=1e-2, amsgrad=True, weight_decay=0.1)),
    (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)), (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, maximize=True)),
], ids=["adam", "adam-amsgrad-wd", "adamw", "sgd-nesterov", "sgd-dampening-maximize"])
def test_fused_optimizers_match_cpu(dev: torch.device, cls: type, kw: dict) -> None:
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    model = copy.deepcopy(cpu).to(dev)
    xs = [torch.randn(4, 6) for _ in range(4)]
    _train(cpu, cls(cpu.parameters(), fused=True, **kw), xs, torch.device("cpu"))
    _train(model, cls(model.parameters(), fused=True, **kw), xs, dev)
    for p, q in zip(cpu.parameters(), model.parameters()):
        assert_close(q.detach(), p.detach(), rtol=1e-5, atol=1e-6)


def test_grad_scaler_skips_overflowing_steps_like_cpu(dev: torch.device) -> None:
    torch.manual_seed(1)
    cpu = nn.Linear(5, 3)
    model = copy.deepcopy(cpu).to(dev)
    sc_cpu = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    sc_dev = torch.amp.GradScaler(dev.type, init_scale=2.0**10, growth_interval=2)
    opt_cpu, opt_dev = torch.optim.SGD(cpu.parameters(), lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        x = torch.randn(4, 5) * (1e38 if step == 1 else 1.0)  # step 1 overflows: skipped, scale backs off
        for m, opt, sc, d in ((cpu, opt_cpu, sc_cpu, "cpu"), (model, opt_dev, sc_dev, dev)):
            opt.zero_grad()
            sc.scale(m(x.to(d)).square().mean()).backward()
            sc.step(opt)
            sc.update()
        assert sc_dev.get_scale() == sc_cpu.get_scale()
    for p, q in zip(cpu.parameters(), model.parameters()):
        assert_close(q.detach(), p.detach(), rtol=1e-5, atol=1e-6)


def test_weight_norm_and_masked_softmax(dev: torch.device) -> None:
    torch.manual_seed(2)
    lin = nn.Linear(5, 3)
    cpu = nn.utils.weight_norm(copy.deepcopy(lin))
    model = nn.utils.weight_norm(copy.deepcopy(lin).to(dev))
    x = torch.randn(4, 5)
    y, yd = cpu(x), model(x.to(dev))
    assert_close(yd, y.detach())
    y.square().sum().backward()
    yd.square().sum().backward()
    assert_close(model.weight_g.grad, cpu.weight_g.grad, rtol=1e-5, atol=1e-6)
    assert_close(model.weight_v.grad, cpu.weight_v.grad, rtol=1e-5, atol=1e-6)
    t = torch.randn(2, 3, 4, 4)
    mask = torch.rand(2, 4) > 0.5
    mask[0, :] = False
    assert_close(torch._masked_softmax(t.to(dev), mask.to(dev), -1, 1), torch._masked_softmax(t, mask, -1, 1))
    full = torch.rand(2, 3, 4, 4) > 0.5
    out = torch._masked_softmax(t, full, -1, 2)
    assert_close(torch._masked_softmax(t.to(dev), full.to(dev), -1, 2), out)
    g = torch.randn_like(out).nan_to_num()
    assert_close(torch.ops.aten._masked_softmax_backward(g.to(dev), out.nan_to_num().to(dev), full.to(dev), -1),
                 torch.ops.aten._masked_softmax_backward(g, out.nan_to_num(), full, -1))


def test_small_entry_points(dev: torch.device) -> None:
    torch.manual_seed(3)
    a, s = torch.randint(0, 1000, (6,)), torch.randint(0, 5, (6,))
    assert_close(a.to(dev) << s.to(dev), a << s)
    assert_close(a.to(dev) >> 2, a >> 2)
    t, u = torch.randn(4, 5), torch.randn(4, 5)
    assert_close(torch.ops.aten._add_relu(t.to(dev), u.to(dev)), torch.ops.aten._add_relu(t, u))
    assert_close(torch.logcumsumexp(t.to(dev), 1), torch.logcumsumexp(t, 1))
    assert_close(torch.mvlgamma(t.abs().to(dev) + 2, 3), torch.mvlgamma(t.abs() + 2, 3))
    # Outside the domain CPU checks nothing either: log|Gamma| terms, inf at the poles.
    outside = torch.tensor([0.1, -0.5, 3.0, -1.0, 0.7])
    assert_close(torch.mvlgamma(outside.to(dev), 3), torch.mvlgamma(outside, 3))
    with pytest.raises(RuntimeError, match="may not be a boolean tensor"):
        torch.mvlgamma(torch.tensor([True]).to(dev), 1)
    with pytest.warns(UserWarning):
        assert_close(torch.range(0, 5, 0.5, device=dev), torch.range(0, 5, 0.5))
    i8, j8 = torch.randint(-8, 8, (17, 32), dtype=torch.int8), torch.randint(-8, 8, (32, 8), dtype=torch.int8)
    assert_close(torch._int_mm(i8.to(dev), j8.to(dev)), torch._int_mm(i8, j8))
    c = torch.randn(2, 6, 3, 3)
    assert_close(F.channel_shuffle(c.to(dev), 3), F.channel_shuffle(c, 3))
    assert_close(torch.repeat_interleave(torch.tensor([1, 0, 3, 2]).to(dev)), torch.repeat_interleave(torch.tensor([1, 0, 3, 2])))
    seq = torch.tensor([1, 1, 2, 2, 3, 1, 1])
    for x, y in zip(torch.unique_consecutive(seq.to(dev), return_inverse=True, return_counts=True),
                    torch.unique_consecutive(seq, return_inverse=True, return_counts=True)):
        assert_close(x, y)
    emb = nn.Embedding(10, 4, max_norm=1.0)
    emb_d = copy.deepcopy(emb).to(dev)
    idx = torch.tensor([1, 2, 2, 7])
    assert_close(emb_d(idx.to(dev)), emb(idx).detach(), rtol=1e-5, atol=1e-6)
    assert_close(emb_d.weight.detach(), emb.weight.detach(), rtol=1e-5, atol=1e-6)
    # An async assert is checked at the next sync point, naming the message.
    torch._assert_async(torch.tensor(1).to(dev))
    torch._assert_async(torch.tensor(0).to(dev), "the batch must not be empty")
    with pytest.raises(IndexError, match="the batch must not be empty"):
        torch_pjrt.synchronize()


def test_legacy_convolutions_and_distances(dev: torch.device) -> None:
    torch.manual_seed(4)
    x, w, b = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    aten = torch.ops.aten
    assert_close(aten._slow_conv2d_forward(x.to(dev), w.to(dev), [3, 3], b.to(dev), [1, 1], [1, 1]),
                 aten._slow_conv2d_forward(x, w, [3, 3], b, [1, 1], [1, 1]), rtol=1e-5, atol=1e-5)
    assert_close(aten.slow_conv_dilated2d(x.to(dev), w.to(dev), [3, 3], b.to(dev), [1, 1], [2, 2], [2, 2]),
                 aten.slow_conv_dilated2d(x, w, [3, 3], b, [1, 1], [2, 2], [2, 2]), rtol=1e-5, atol=1e-5)
    wt = torch.randn(3, 4, 3, 3)
    assert_close(aten.slow_conv_transpose2d(x.to(dev), wt.to(dev), [3, 3], None, [2, 2], [1, 1], [1, 1], [1, 1]),
                 aten.slow_conv_transpose2d(x, wt, [3, 3], None, [2, 2], [1, 1], [1, 1], [1, 1]), rtol=1e-5, atol=1e-5)
    a = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    c = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    ad, cd = a.detach().float().to(dev).requires_grad_(), c.detach().float().to(dev).requires_grad_()
    for p in (2.0, 1.0, 3.0, float("inf"), 0.5):
        y, yd = torch.cdist(a, c, p), torch.cdist(ad, cd, p)
        assert_close(yd, y.detach().float(), rtol=1e-5, atol=1e-5)
        gy = torch.randn(y.shape, dtype=torch.float64)
        ga, gd = torch.autograd.grad(y, (a, c), gy), torch.autograd.grad(yd, (ad, cd), gy.float().to(dev))
        for x1, x2 in zip(gd, ga):
            assert_close(x1, x2.float(), rtol=1e-4, atol=1e-5)
    m = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    md = m.detach().float().to(dev).requires_grad_()
    y, yd = torch.pdist(m), torch.pdist(md)
    assert_close(yd, y.detach().float(), rtol=1e-5, atol=1e-5)
    gy = torch.randn(y.shape, dtype=torch.float64)
    assert_close(torch.autograd.grad(yd, md, gy.float().to(dev))[0], torch.autograd.grad(y, m, gy)[0].float(), rtol=1e-4, atol=1e-5)
    xs = torch.randn(4, 3, 5)
    rm, rv = torch.zeros(3), torch.ones(3)
    rmd, rvd = rm.to(dev), rv.to(dev)
    ref = torch.batch_norm_update_stats(xs, rm, rv, 0.1)
    got = torch.batch_norm_update_stats(xs.to(dev), rmd, rvd, 0.1)
    assert_close(got[0], ref[0])
    assert_close(got[1], ref[1])
    # The CPU kernel updates the running statistics in place: so does the device's.
    assert_close(rmd, rm)
    assert_close(rvd, rv)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_transformer_fast_paths_in_eval(dev: torch.device, norm_first: bool, activation: str) -> None:
    # In eval mode under no_grad, nn.TransformerEncoderLayer and nn.MultiheadAttention take
    # PyTorch's fused fast paths (_transformer_encoder_layer_fwd, _native_multi_head_attention).
    torch.manual_seed(5)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, norm_first=norm_first, activation=activation).eval()
    layer_d = copy.deepcopy(layer).to(dev)
    x = torch.randn(2, 5, 32)
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]])
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    with torch.no_grad():
        for kw in (dict(), dict(src_key_padding_mask=pad), dict(src_mask=causal, is_causal=True)):
            ref = layer(x, **kw)
            got = layer_d(x.to(dev), **{k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kw.items()})
            assert_close(got, ref, rtol=1e-5, atol=1e-5)
        mha = nn.MultiheadAttention(32, 4, batch_first=True).eval()
        mha_d = copy.deepcopy(mha).to(dev)
        for kw in (dict(), dict(key_padding_mask=pad), dict(average_attn_weights=False)):
            ref = mha(x, x, x, **kw)
            got = mha_d(x.to(dev), x.to(dev), x.to(dev), **{k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kw.items()})
            assert_close(got[0], ref[0], rtol=1e-5, atol=1e-5)
            assert_close(got[1], ref[1], rtol=1e-5, atol=1e-6)
        # A padded batch through nn.TransformerEncoder stays dense on pjrt (no nested tensors):
        # the unpadded positions match CPU.
        enc = nn.TransformerEncoder(copy.deepcopy(layer), 2).eval()
        enc_d = copy.deepcopy(enc).to(dev)
        ref = enc(x, src_key_padding_mask=pad)
        ref = ref.to_padded_tensor(0.0) if ref.is_nested else ref
        got = enc_d(x.to(dev), src_key_padding_mask=pad.to(dev)).cpu()
        keep = ~pad
        torch.testing.assert_close(got[keep], ref[keep], rtol=1e-5, atol=1e-5)
