"""torch.autocast("pjrt"): per-op casting policy (torch_pjrt/autocast.py) and mixed-
precision training that tracks CPU autocast."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from models import TinyTransformer, synthetic_tokens

import torch_pjrt

BF16 = torch.bfloat16


def rand(*shape, dtype=torch.float32, device="pjrt"):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=dtype).to(device)


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16], ids=str)
def test_op_policies(low):
    a, b = rand(4, 8), rand(8, 5)
    w, bias = rand(5, 8), rand(5)
    q = rand(2, 2, 6, 4)
    x3, y3 = rand(3, 4, 8), rand(3, 8, 2)
    with torch_pjrt.fallback_mode("error"), torch.autocast("pjrt", dtype=low):
        # Lower precision: matmuls, linear, attention.
        assert (a @ b).dtype == low
        assert torch.mm(a, b).dtype == low
        assert F.linear(a, w, bias).dtype == low
        assert torch.addmm(rand(4, 5), a, b).dtype == low
        assert torch.bmm(x3, y3).dtype == low
        assert torch.baddbmm(rand(3, 4, 2), x3, y3).dtype == low
        assert F.scaled_dot_product_attention(q, q, q, is_causal=True).dtype == low
        h = a @ b  # low precision from here on
        # Float32: norms, softmaxes, reductions, losses, sensitive pointwise ops.
        assert F.layer_norm(h, (5,)).dtype == torch.float32
        assert F.softmax(h, dim=-1).dtype == torch.float32
        assert F.log_softmax(h, dim=-1).dtype == torch.float32
        assert h.sum().dtype == torch.float32 and h.sum(0).dtype == torch.float32
        assert torch.exp(h).dtype == torch.float32 and torch.log1p(h.abs()).dtype == torch.float32
        assert F.mse_loss(h, torch.zeros_like(h)).dtype == torch.float32
        assert F.cross_entropy(h, torch.tensor([0, 1, 2, 3], device="pjrt")).dtype == torch.float32
        assert h.sum(dtype=low).dtype == low  # an explicit dtype wins
        # Promote: the widest floating input.
        assert torch.addcmul(rand(4, 5), h, h).dtype == torch.float32
        assert torch.addcmul(h, h, h).dtype == low
        # Not listed: runs in the input's dtype.
        assert torch.relu(h).dtype == low and torch.relu(a).dtype == torch.float32
        # float64 is never cast; CPU tensors are not affected by autocast("pjrt").
        assert (a.double() @ b.double()).dtype == torch.float64
        assert (a.cpu() @ b.cpu()).dtype == torch.float32
        with torch.autocast("pjrt", enabled=False):
            assert (a @ b).dtype == torch.float32
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(torch.sigmoid(h), torch.ones_like(h))
    assert (a @ b).dtype == torch.float32  # outside the region


def test_lower_precision_ops_compute_on_cast_inputs():
    """Under autocast, linear/matmul give exactly what explicitly cast inputs give."""
    x, w, bias = rand(6, 16), rand(12, 16), rand(12)
    with torch_pjrt.fallback_mode("error"):
        with torch.autocast("pjrt", dtype=BF16):
            auto_lin, auto_mm = F.linear(x, w, bias), x @ w.t()
        assert torch.equal(auto_lin.cpu(), F.linear(x.to(BF16), w.to(BF16), bias.to(BF16)).cpu())
        assert torch.equal(auto_mm.cpu(), (x.to(BF16) @ w.to(BF16).t()).cpu())
    # And the bf16 matmul matches CPU's bf16 matmul to bf16 precision.
    with torch.autocast("cpu", dtype=BF16):
        ref = F.linear(x.cpu(), w.cpu(), bias.cpu())
    torch.testing.assert_close(auto_lin.cpu(), ref, rtol=1.6e-2, atol=1e-2)


def test_backward_through_autocast_gives_float32_grads():
    lin = torch.nn.Linear(16, 8).to("pjrt")
    x = rand(4, 16)
    with torch_pjrt.fallback_mode("error"):
        with torch.autocast("pjrt", dtype=BF16):
            y = lin(x)
            loss = y.float().pow(2).mean()
        assert y.dtype == BF16
        loss.backward()
        assert lin.weight.grad.dtype == torch.float32 and lin.bias.grad.dtype == torch.float32
    ref = copy.deepcopy(lin).cpu()
    with torch.autocast("cpu", dtype=BF16):
        ref_loss = ref(x.cpu()).float().pow(2).mean()
    ref_loss.backward()
    torch.testing.assert_close(lin.weight.grad.cpu(), ref.weight.grad, rtol=2e-2, atol=2e-3)


def test_transformer_trains_under_autocast_like_cpu_autocast():
    vocab, seq, steps = 96, 32, 10
    torch.manual_seed(0)
    model = TinyTransformer(vocab=vocab, dim=64, heads=4, layers=2, seq=seq)
    batches = [synthetic_tokens(8, seq, vocab, seed=s) for s in range(4)]

    def train(device: str) -> tuple[list[float], torch.nn.Module]:
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
        losses = []
        for step in range(steps):
            x, y = (t.to(device) for t in batches[step % len(batches)])
            opt.zero_grad()
            with torch.autocast(device, dtype=BF16):
                logits = m(x)
                loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
            assert logits.dtype == BF16 and loss.dtype == torch.float32
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, m

    with torch_pjrt.fallback_mode("error"):
        dev, dev_model = train("pjrt")
    cpu, _ = train("cpu")
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in dev_model.parameters())
    torch.testing.assert_close(dev, cpu, rtol=1.6e-2, atol=1e-2)  # bf16 tolerance
    assert dev[-1] < dev[0] * 0.8


def test_hf_llama_under_autocast_matches_cpu_autocast():
    """Transformers' Llama turns autocast off around its rotary embedding
    (torch.autocast(device_type="pjrt", enabled=False)) and upcasts in RMSNorm."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    results = {}
    for device in ("cpu", "pjrt"):
        m = copy.deepcopy(model).to(device)
        with torch_pjrt.fallback_mode("error" if device == "pjrt" else "warn"):
            with torch.autocast(device, dtype=BF16):
                out = m(input_ids=ids.to(device), labels=ids.to(device))
            out.loss.backward()
        assert out.logits.dtype == BF16
        grad = m.model.layers[0].self_attn.q_proj.weight.grad
        assert grad.dtype == torch.float32
        results[device] = (out.logits.float().cpu(), out.loss.item(), grad.cpu())
    (ref_logits, ref_loss, ref_grad), (logits, loss, grad) = results["cpu"], results["pjrt"]
    torch.testing.assert_close(logits, ref_logits, rtol=1.6e-2, atol=1e-2)
    assert abs(loss - ref_loss) < 1e-2 * abs(ref_loss)
    torch.testing.assert_close(grad, ref_grad, rtol=5e-2, atol=5e-3)
