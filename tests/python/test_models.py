"""Real models end to end: a small CNN and a GPT-style decoder train 50 steps on the
device with no CPU fallback, and their loss curves match the same model on CPU."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from models import SmallCNN, TinyTransformer, synthetic_images, synthetic_tokens
from test_training import cpu_runs, train
from trajectory import assert_curve_within, assert_tensor_within, references

import torch_pjrt

STEPS = 50


def on_device(model: torch.nn.Module, compiled: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the device model, what to call): the model itself, or it compiled with backend="pjrt"."""
    dev_model = copy.deepcopy(model).to("pjrt")
    if not compiled:
        return dev_model, dev_model
    torch._dynamo.reset()
    return dev_model, torch.compile(dev_model, backend="pjrt", dynamic=False)


def assert_compiled_whole(compiled: bool) -> None:
    if compiled:
        stats = torch_pjrt.metrics()["compiled"]
        assert stats and all(not s["eager_graphs"] for s in stats.values()), stats


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_cnn_trains_like_cpu(compiled):
    torch.manual_seed(0)
    model = SmallCNN(in_ch=3, classes=10, width=16)
    batches = [synthetic_images(16, classes=10, size=16, seed=s) for s in range(4)]
    make_opt = lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-4)  # noqa: E731
    dev_model, runner = on_device(model, compiled)
    torch_pjrt.reset_metrics()
    with torch_pjrt.fallback_mode("error"):
        dev = train(runner, "pjrt", make_opt, batches, F.cross_entropy, steps=STEPS)
    assert_compiled_whole(compiled)
    ref = references(model, cpu_runs(make_opt, batches, F.cross_entropy, steps=STEPS))
    assert_curve_within(dev, ref)
    assert dev[-1] < dev[0] * 0.5, dev
    # BatchNorm running statistics (updated in place on the device) and an eval-mode forward.
    for name, b_dev in dev_model.named_buffers():
        b_ref, b_f32 = ref.model64.get_buffer(name), [m.get_buffer(name) for m in ref.models32]
        if b_ref.is_floating_point():
            assert_tensor_within(b_dev, b_f32, b_ref, what=name)
        else:
            assert torch.equal(b_dev.cpu(), b_f32[0]), name
    x, _ = synthetic_images(8, seed=99)
    for m in [dev_model, ref.model64, *ref.models32]:
        m.eval()
    with torch.no_grad(), torch_pjrt.fallback_mode("error"):
        out = runner(x.to("pjrt")).cpu()
    with torch.no_grad():
        assert_tensor_within(out, [m(x) for m in ref.models32], ref.model64(x.double()), what="eval logits")


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
    dev_model, runner = on_device(model, compiled)
    torch_pjrt.reset_metrics()
    with torch_pjrt.fallback_mode("error"):
        dev = train(runner, "pjrt", make_opt, batches, lm_loss, steps=STEPS)
    assert_compiled_whole(compiled)
    ref = references(model, cpu_runs(make_opt, batches, lm_loss, steps=STEPS))
    assert_curve_within(dev, ref)
    assert dev[-1] < dev[0] * 0.5, dev
    if tied:
        assert dev_model.head.weight is dev_model.tok.weight
    # The trained models agree on unseen data. (Not compared parameter by parameter: the
    # key bias gets a zero gradient up to rounding, which Adam turns into +-lr steps.)
    x, _ = synthetic_tokens(4, seq, vocab, seed=99)
    with torch.no_grad(), torch_pjrt.fallback_mode("error"):
        out = runner(x.to("pjrt")).cpu()
    with torch.no_grad():
        assert_tensor_within(out, [m(x) for m in ref.models32], ref.model64(x), what="logits after training")


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
