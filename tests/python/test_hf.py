"""Hugging Face Transformers models on the device: GPT-2 and Llama built from small
configs (no download) with the same seeded weights on CPU and on the device.

Forward and backward must run without CPU fallback; generate() may still fall
back for a few ops (reported by the test output, see GENERATE_FALLBACKS)."""

from __future__ import annotations

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402  (pinned in scripts/setup.sh)

import torch_pjrt  # noqa: E402
from torch_pjrt.qualify import differential  # noqa: E402

VOCAB = 128
# Ops generate() ran through the CPU fallback, per model, filled in by the tests (printed with -s / -rA).
GENERATE_FALLBACKS: dict[str, dict[str, int]] = {}


def make_model(kind: str, attn: str, positions: int = 64) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=positions, n_embd=64, n_layer=2, n_head=4,
                                      bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, attn_implementation=attn)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2,
                                       max_position_embeddings=positions,
                                       attn_implementation=attn)
        model = transformers.LlamaForCausalLM(cfg)
    return model.eval()  # no dropout: CPU and device must compute the same function


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_hf_causal_lm_matches_cpu(kind, attn):
    model = make_model(kind, attn)
    cpu_model = copy.deepcopy(model)
    dev_model = copy.deepcopy(model).to("pjrt")
    if kind == "gpt2":  # tied LM head stays tied on the device
        assert dev_model.lm_head.weight is dev_model.transformer.wte.weight
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding in the second row

    # Forward and backward: values, loss and every gradient, with no CPU fallback.
    ref = cpu_model(input_ids=ids, attention_mask=mask, labels=ids)
    ref.loss.backward()
    with torch_pjrt.fallback_mode("error"):
        out = dev_model(input_ids=ids.to("pjrt"), attention_mask=mask.to("pjrt"), labels=ids.to("pjrt"))
        out.loss.backward()
        logits = out.logits.detach().cpu()
    valid = mask.bool()  # padded positions' logits are not meaningful (fully masked rows)
    torch.testing.assert_close(logits[valid], ref.logits.detach()[valid], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.loss.item(), ref.loss.item(), rtol=1e-5, atol=1e-5)
    grads = dict(cpu_model.named_parameters())
    checked = 0
    for name, p in dev_model.named_parameters():
        expected = grads[name].grad
        assert p.grad is not None and p.grad.device.type == "pjrt", name
        torch.testing.assert_close(p.grad.cpu(), expected, rtol=1e-4, atol=2e-5,
                                   msg=lambda m, n=name: f"grad of {n}: {m}")
        checked += 1
    assert checked == len(grads)

    # Greedy generation (with the KV cache): identical token ids.
    prompt, prompt_mask = ids[:, :8], mask[:, :8]
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    expected = cpu_model.generate(prompt, attention_mask=prompt_mask, **kw)
    torch_pjrt.reset_metrics()
    with torch.no_grad():
        got = dev_model.generate(prompt.to("pjrt"), attention_mask=prompt_mask.to("pjrt"), **kw)
    GENERATE_FALLBACKS[f"{kind}-{attn}"] = dict(torch_pjrt.metrics()["fallbacks"])
    print(f"{kind}-{attn} generate() CPU fallbacks: {GENERATE_FALLBACKS[f'{kind}-{attn}']}")
    assert got.device.type == "pjrt"
    assert torch.equal(got.cpu(), expected), (got.cpu().tolist(), expected.tolist())
    assert got.shape[1] > prompt.shape[1]


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_hf_compiled_training_matches_cpu(kind):
    """The model compiled with backend="pjrt": forward and backward are one program each,
    with no CPU fallback; every step's gradients and parameters are within the float64
    bound (torch_pjrt.qualify.differential; the battery runs wider configs)."""
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randint(0, VOCAB, (2, 16), generator=g),) for _ in range(3)]
    prob = differential.Problem(lambda: make_model(kind, "sdpa"), batches,
                                lambda m, b: m(input_ids=b[0], labels=b[0]).loss,
                                lambda p: torch.optim.AdamW(p, lr=1e-3), steps=5)
    torch._dynamo.reset()
    torch_pjrt.reset_metrics()
    with torch_pjrt.fallback_mode("error"):
        result = differential.run(prob, "pjrt", compile_backend="pjrt")
    assert result.passed, differential.describe(result)
    stats = torch_pjrt.metrics()["compiled"]
    assert sum(s["programs"] for s in stats.values()) >= 2, stats
    assert all(not s["eager_graphs"] for s in stats.values()), stats
    torch._dynamo.reset()


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_static_cache_generation_compiles_once_per_bucket(kind):
    """generate() with a static KV cache and the forward compiled: after the first prompt,
    64 decode steps and a prompt of another length padded into the same bucket compile
    nothing new (no Dynamo recompile, no XLA compile), and the tokens are the CPU's."""
    torch._dynamo.reset()
    model = make_model(kind, "sdpa", positions=128)
    cpu_model = copy.deepcopy(model)
    dev_model = copy.deepcopy(model).to("pjrt")
    dev_model.forward = torch.compile(dev_model.forward, backend="pjrt", dynamic=False)
    kw = dict(max_new_tokens=64, do_sample=False, pad_token_id=0, cache_implementation="static")
    g = torch.Generator().manual_seed(3)
    bucket = 16
    totals = []
    for length in (11, 6):  # real prompt lengths, left-padded to one bucket
        ids = torch.randint(1, VOCAB, (2, bucket), generator=g)
        mask = torch.zeros_like(ids)
        mask[:, bucket - length:] = 1
        mask[1, : bucket - length + 2] = 0  # the rows differ too
        ids = ids * mask
        expected = cpu_model.generate(ids, attention_mask=mask, **kw)
        with torch.no_grad(), torch_pjrt.fallback_mode("error"):
            got = dev_model.generate(ids.to("pjrt"), attention_mask=mask.to("pjrt"), **kw)
        assert torch.equal(got.cpu(), expected), (length, got.cpu().tolist(), expected.tolist())
        assert got.shape[1] == bucket + 64
        m = torch_pjrt.metrics()
        totals.append((m["compiles"], sum(s["dynamo_graphs"] for s in m["compiled"].values()),
                       sum(s["programs"] for s in m["compiled"].values()), m["compiled_runs"]))
    (compiles0, dynamo0, programs0, runs0), (compiles1, dynamo1, programs1, runs1) = totals
    assert (compiles1, dynamo1, programs1) == (compiles0, dynamo0, programs0), totals
    assert runs1 - runs0 == 64, totals  # one prefill and 63 decode steps, each a replayed program
    torch._dynamo.reset()


def _debug_mode_model(kind: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """A small model of each family and a padded batch with its standard attention mask."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(1, VOCAB, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # padding: HF fills the masked scores with -inf or the dtype's minimum
    if kind in ("gpt2", "llama"):
        return make_model(kind, "sdpa"), dict(input_ids=ids, attention_mask=mask, labels=ids)
    if kind == "bert":
        cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0)
        return transformers.BertForMaskedLM(cfg).eval(), dict(input_ids=ids, attention_mask=mask, labels=ids)
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
    return transformers.T5ForConditionalGeneration(cfg).eval(), dict(input_ids=ids, attention_mask=mask,
                                                                      labels=ids[:, :8].contiguous())


@pytest.mark.parametrize("kind", ["gpt2", "llama", "bert", "t5"])
def test_debug_mode_runs_hf_models_without_false_alarms(kind):
    """Debug mode checks every op for NaN and for Inf made from finite values: the masks of
    the four common families (causal, padding, encoder-decoder) must not set it off, and the
    loss and gradients are the CPU's."""
    model, batch = _debug_mode_model(kind)
    dev_model = copy.deepcopy(model).to("pjrt")
    ref = model(**batch).loss
    ref.backward()
    with torch_pjrt.debug_mode():
        loss = dev_model(**{k: v.to("pjrt") for k, v in batch.items()}).loss
        loss.backward()
    torch.testing.assert_close(loss.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), dev_model.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_debug_mode_stops_a_real_overflow_inside_a_hf_model():
    model, batch = _debug_mode_model("gpt2")
    dev_model = copy.deepcopy(model).to("pjrt")
    with torch.no_grad():
        dev_model.transformer.h[0].mlp.c_fc.weight.mul_(1e37)  # the MLP's activations overflow
    with torch_pjrt.debug_mode(), pytest.raises(RuntimeError, match="produced (NaN|Inf from finite inputs)") as info:
        dev_model(**{k: v.to("pjrt") for k, v in batch.items()})
    assert "aten::" in str(info.value)
