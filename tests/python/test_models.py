"""Real models end to end: a small CNN and a GPT-style decoder train on the device with
no CPU fallback, every step's gradients, parameters and buffers within the float64
bound (trajectory.py), eager and compiled."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from models import SmallCNN, TinyTransformer, synthetic_images, synthetic_tokens
from trajectory import assert_trains_like_float64, problem

import torch_pjrt

STEPS = 50


def assert_compiled_whole(compiled: bool) -> None:
    if compiled:
        stats = torch_pjrt.metrics()["compiled"]
        assert stats and all(not s["eager_graphs"] for s in stats.values()), stats


def assert_eval_forward_matches_cpu(model: torch.nn.Module, x: torch.Tensor, compiled: bool) -> None:
    """The trained device model in eval mode against the same parameters on the CPU."""
    model.eval()
    cpu_model = copy.deepcopy(model).to("cpu")
    runner = torch.compile(model, backend="pjrt", dynamic=False) if compiled else model
    with torch.no_grad(), torch_pjrt.fallback_mode("error"):
        out = runner(x.to("pjrt")).cpu()
    with torch.no_grad():
        torch.testing.assert_close(out, cpu_model(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_cnn_trains_like_cpu(compiled):
    torch.manual_seed(0)
    model = SmallCNN(in_ch=3, classes=10, width=16, smooth=True)  # judged step by step: no kinks (models.py)
    batches = [synthetic_images(16, classes=10, size=16, seed=s) for s in range(4)]
    make_opt = lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-4)  # noqa: E731
    torch_pjrt.reset_metrics()
    # BatchNorm's running statistics (updated in place on the device) are compared every step too.
    dev, trained = assert_trains_like_float64(problem(model, batches, F.cross_entropy, make_opt, STEPS), compiled)
    assert_compiled_whole(compiled)
    assert dev[-1] < dev[0] * 0.5, dev
    assert_eval_forward_matches_cpu(trained, synthetic_images(8, seed=99)[0], compiled)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("attention,tied", [("sdpa", False), ("mha", True)], ids=["sdpa-untied", "mha-tied"])
def test_gpt_trains_like_cpu(attention, tied, compiled):
    vocab, seq = 96, 32
    torch.manual_seed(0)
    model = TinyTransformer(vocab=vocab, dim=64, heads=4, layers=2, seq=seq, attention=attention, tied=tied)
    batches = [synthetic_tokens(8, seq, vocab, seed=s) for s in range(4)]

    def lm_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))

    make_opt = lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.01)  # noqa: E731
    torch_pjrt.reset_metrics()
    dev, trained = assert_trains_like_float64(problem(model, batches, lm_loss, make_opt, STEPS), compiled)
    assert_compiled_whole(compiled)
    assert dev[-1] < dev[0] * 0.5, dev
    if tied:
        assert trained.head.weight is trained.tok.weight
    assert_eval_forward_matches_cpu(trained, synthetic_tokens(4, seq, vocab, seed=99)[0], compiled)


def test_module_to_device_keeps_parameter_objects():
    """Module.to("pjrt") swaps parameter data in place (as for CUDA): tied weights stay
    tied, and an optimizer built before the move updates the device parameters."""
    torch.manual_seed(0)
    model = TinyTransformer(vocab=16, dim=8, heads=2, layers=1, seq=4, tied=True)
    params = list(model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.to("pjrt")
    assert all(a is b for a, b in zip(params, model.parameters()))
    assert model.head.weight is model.tok.weight and model.tok.weight.device.type == "pjrt"
    before = model.tok.weight.detach().cpu().clone()
    x = torch.randint(0, 16, (2, 4)).to("pjrt")
    with torch_pjrt.fallback_mode("error"):
        model(x).sum().backward()
        opt.step()
    assert not torch.equal(model.tok.weight.detach().cpu(), before)
    model.cpu()
    assert all(a is b for a, b in zip(params, model.parameters())) and params[0].device.type == "cpu"
