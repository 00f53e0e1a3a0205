"""The architecture zoo (torch_pjrt.tools.zoo): a fixed sample of Hugging Face architectures,
tiny random configs, forward and backward in strict or fused mode on pjrt, every output and
gradient within its bound of float64 and no CPU fallback; and unit tests of its parts (the
config shrinker, the inputs, the judge, the worker pool, the report) that need no device.

The sample runs in two worker processes, each serving architectures one after another (its
mode, or both, in each), started once for the session by the `zoo` fixture for the
architectures selected."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # random weights only
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import copy  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("transformers")

from torch_pjrt.qualify.differential import Comparison  # noqa: E402
from torch_pjrt.tools.zoo import build, catalog, diffusers_models, execute, inputs, judge, pool, report, results, seeds, shrink  # noqa: E402,E501

# Spread over families, each small and quick to compile. (type: (why it is here, the eager mode
# the test suite runs it in)) Each family meets both recorders, each architecture one of them:
# both modes doubled this file's time for little (the modes share every lowering; the op, view
# and model tests run in both). TORCH_PJRT_ZOO_BOTH_MODES=1 runs each in both, as
# `python -m torch_pjrt.tools.zoo --modes strict,fused` does for the whole catalog.
SAMPLE = {
    # text, encoders and decoders
    "bert": ("encoder, masked LM", "strict"),
    "distilbert": ("encoder, masked LM", "fused"),
    "electra": ("encoder, masked LM", "strict"),
    "gpt2": ("decoder, causal LM, tied head", "fused"),
    "gpt_neox": ("parallel attention + MLP, partial rotary", "strict"),
    "llama": ("RMSNorm, rotary, SwiGLU, grouped KV", "fused"),
    "mistral": ("sliding-window decoder", "strict"),
    "qwen2": ("attention biases, grouped KV", "fused"),
    "gemma": ("scaled embeddings, GeGLU", "strict"),
    "phi3": ("fused QKV and gate/up projections", "fused"),
    "opt": ("learned positions, pre-norm", "strict"),
    "t5": ("encoder-decoder, relative position buckets", "fused"),
    "bart": ("encoder-decoder, learned positions", "strict"),
    # vision
    "vit": ("patch embedding, class token", "strict"),
    "deit": ("distillation token", "fused"),
    "convnext": ("depthwise convolutions, LayerNorm over channels", "strict"),
    "resnet": ("convolutions, BatchNorm in eval", "fused"),
    "swin": ("shifted windows, relative position bias", "fused"),
    "mobilenet_v2": ("depthwise separable convolutions, ReLU6", "fused"),
    "regnet": ("grouped convolutions", "strict"),
    # audio
    "wav2vec2": ("conv feature extractor, CTC loss", "strict"),
    "hubert": ("conv feature extractor, CTC loss", "fused"),
    "whisper": ("log-mel encoder, seq2seq decoder", "strict"),
    # mixture of experts
    "mixtral": ("top-2 routing, grouped expert matmuls", "strict"),
    "qwen2_moe": ("routed + shared experts", "fused"),
    "olmoe": ("64-expert routing shrunk to 4", "strict"),
    # state space and hybrids
    "mamba": ("selective scan", "strict"),
    "mamba2": ("chunked state-space duality", "fused"),
    # multimodal
    "clip": ("vision tower, image classification head", "fused"),
    "siglip": ("vision tower without class token, pooled head", "strict"),
    "llava": ("vision tower + projector + LM (text-only batch)", "fused"),
    # diffusers
    "diffusers/AutoencoderKL": ("VAE: group norms, mid-block attention, up/down sampling convolutions", "fused"),
}
BOTH_MODES = os.environ.get("TORCH_PJRT_ZOO_BOTH_MODES") == "1"


def modes_of(model_type: str) -> list[str]:
    return ["strict", "fused"] if BOTH_MODES else [SAMPLE[model_type][1]]


# Per architecture (a hang or a pathological compile), on a quiet machine; scripts/test.sh runs
# this file beside other test jobs and scales it (TORCH_PJRT_TEST_SLOWDOWN: how many jobs share the cores).
TIMEOUT_S = 240.0 * float(os.environ.get("TORCH_PJRT_TEST_SLOWDOWN", "1"))
JOBS = 2


def _selected_types(session: pytest.Session) -> list[str]:
    wanted = []
    for item in session.items:
        spec = getattr(item, "callspec", None)
        if spec is not None and getattr(item, "originalname", "") == "test_architecture" and \
                "model_type" in spec.params:
            wanted.append(spec.params["model_type"])
    return wanted


@pytest.fixture(scope="session")
def zoo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, results.Record]:
    """The selected architectures' records, run once for the session (JOBS workers at a time)."""
    log_dir = str(tmp_path_factory.mktemp("zoo-logs"))
    types = _selected_types(request.session)
    found: dict[str, results.Record] = {}

    def keep(rec: results.Record, finished: int, total: int) -> None:
        found[rec["type"]] = rec
        modes = " ".join(f"{m}={v['status']}({v.get('seconds', 0):.0f}s)" for m, v in rec.get("modes", {}).items())
        print(f"[zoo {finished}/{total}] {rec['type']}: {rec['status']} {modes} {rec.get('seconds', 0):.0f}s",
              file=sys.stderr, flush=True)

    pool.run_all(types, {t: modes_of(t) for t in types}, TIMEOUT_S, JOBS, keep, log_dir=log_dir)
    return found


@pytest.mark.parametrize("model_type", sorted(SAMPLE))
def test_architecture(zoo: dict[str, results.Record], model_type: str) -> None:
    rec = zoo[model_type]
    assert rec["status"] == results.RAN, f"{model_type} did not run on the CPU: {rec.get('reason')}"
    problems = {mode: f"{m['status']}: {m.get('detail', '')} {m.get('where', '')}".strip()
                for mode, m in rec["modes"].items() if m["status"] != judge.PASS}
    assert not problems, f"{model_type} ({rec['class']}): {json.dumps(problems, indent=1)}"
    assert sorted(rec["modes"]) == sorted(modes_of(model_type))


# ---- unit tests: no device, no subprocess for the model ----


def test_catalog_heads_and_sample() -> None:
    entries = {e.model_type: e for e in catalog.entries()}
    assert len(entries) > 500
    assert entries["bert"].head == "masked-lm" and entries["bert"].base_class == "BertModel"
    assert entries["gpt2"].head == "causal-lm"
    assert entries["bart"].head == "seq2seq-lm"  # the masked-LM mapping names BART's seq2seq class
    assert entries["whisper"].model_class == "WhisperForConditionalGeneration"
    assert entries["wav2vec2"].head == "ctc"
    types = sorted(entries)
    picked = catalog.sample(types, 20)
    assert picked == catalog.sample(types, 20) and len(set(picked)) == 20
    # Spread: every twentieth of the catalog contributes one.
    positions = [types.index(t) for t in picked]
    assert all(b - a >= len(types) // 20 - 1 for a, b in zip(positions, positions[1:]))


def test_shrink_llama_is_tiny_and_consistent() -> None:
    c = shrink.tiny_config("llama")
    assert c.hidden_size <= shrink.WIDTH and c.num_hidden_layers == shrink.LAYERS
    assert c.num_attention_heads == shrink.HEADS and c.num_attention_heads % c.num_key_value_heads == 0
    assert c.head_dim * c.num_attention_heads == c.hidden_size
    assert c.intermediate_size <= shrink.INTERMEDIATE and c.vocab_size <= shrink.VOCAB
    assert c.bos_token_id < c.vocab_size and c.eos_token_id < c.vocab_size


def test_shrink_keeps_one_layer_of_each_kind() -> None:
    c = shrink.tiny_config("gemma3").text_config  # 5 sliding : 1 full released
    assert set(c.layer_types) == {"sliding_attention", "full_attention"}
    assert len(c.layer_types) == c.num_hidden_layers


def test_shrink_sub_configs_and_token_ids() -> None:
    c = shrink.tiny_config("llava")
    assert c.text_config.hidden_size <= shrink.WIDTH and c.vision_config.hidden_size <= shrink.WIDTH
    assert c.text_config.num_hidden_layers <= shrink.LAYERS and c.vision_config.num_hidden_layers <= shrink.LAYERS
    assert c.vision_config.image_size <= shrink.IMAGE
    assert 0 <= c.image_token_id < c.text_config.vocab_size  # moved into the small vocabulary
    b = shrink.tiny_config("bert")
    assert b.hidden_dropout_prob == 0.0 and b.attention_probs_dropout_prob == 0.0


def test_shrink_moe_and_encoder_decoder() -> None:
    m = shrink.tiny_config("mixtral")
    assert m.num_local_experts == shrink.EXPERTS and m.num_experts_per_tok == shrink.TOP_K
    t = shrink.tiny_config("t5")
    assert t.num_layers <= shrink.LAYERS and t.num_decoder_layers <= shrink.LAYERS and t.d_model <= shrink.WIDTH
    w = shrink.tiny_config("whisper")
    assert w.encoder_layers <= shrink.LAYERS and w.decoder_layers <= shrink.LAYERS
    assert w.max_source_positions == shrink.SOURCE_POSITIONS


def test_inputs_avoid_special_ids_and_fit_the_config() -> None:
    entry = catalog.entry("llava")
    model, config = build.build(entry)
    x = inputs.make_inputs(model, config, entry.head, entry.model_type)
    assert x["input_ids"].shape == (2, 16)
    assert not torch.isin(x["input_ids"], torch.tensor(sorted(inputs.special_ids(config)))).any()
    assert "pixel_values" not in x  # text-only batch for a generative head
    w = catalog.entry("whisper")
    model, config = build.build(w)
    x = inputs.make_inputs(model, config, w.head, w.model_type)
    assert x["input_features"].shape == (2, config.num_mel_bins, 2 * config.max_source_positions)
    assert x["labels"].shape == x["decoder_input_ids"].shape


def _bert_runs() -> tuple[execute.Run, execute.Run]:
    entry = catalog.entry("bert")
    model, config = build.build(entry)
    x = inputs.make_inputs(model, config, entry.head, entry.model_type)
    m32 = copy.deepcopy(model)
    m64 = build.float64_copy(model)
    return execute.run(m32, m32, x), execute.run(m64, m64, inputs.move(x, "cpu", torch.float64))


def test_judge_passes_float32_and_catches_a_tampered_gradient() -> None:
    r32, r64 = _bert_runs()
    assert judge.verdict(judge.compare(r32, r64, r32), {}).status == judge.PASS
    name = "bert.encoder.layer.0.attention.self.query.weight"
    tampered = copy.deepcopy(r32)
    g = tampered.grads[name]
    assert g is not None
    tampered.grads[name] = g * 1.01  # 1% off: far beyond float32 rounding
    v = judge.verdict(judge.compare(tampered, r64, r32), {})
    assert v.status == judge.MISMATCH and name in v.detail and v.worst_ratio > 1
    # An output whose non-finite elements moved.
    nan_out = copy.deepcopy(r32)
    nan_out.outputs["logits"] = nan_out.outputs["logits"].clone()
    nan_out.outputs["logits"][0, 0, 0] = float("nan")
    v = judge.verdict(judge.compare(nan_out, r64, r32), {})
    assert v.status == judge.MISMATCH and "non-finite" in v.detail
    # A missing gradient.
    missing = copy.deepcopy(r32)
    missing.grads[name] = None
    assert judge.verdict(judge.compare(missing, r64, r32), {}).status == judge.MISMATCH


def test_verdict_order() -> None:
    r32, r64 = _bert_runs()
    ok = judge.compare(r32, r64, r32)
    assert judge.verdict(ok, {"aten::histc": 2}).status == judge.FALLS_BACK
    assert judge.verdict(ok, {"aten::histc": 2}).detail == "aten::histc x2"
    assert judge.verdict(None, {}, "RuntimeError: boom").status == judge.ERROR


def test_objective_weights_are_fixed_per_output() -> None:
    a = execute.weights("logits", torch.zeros(2, 3))
    assert torch.equal(a, execute.weights("logits", torch.zeros(2, 3)))
    assert not torch.equal(a, execute.weights("loss", torch.zeros(2, 3)))
    assert torch.allclose(execute.weights("logits", torch.zeros(2, 3, dtype=torch.float64)).float(), a)


def _fake(script: str) -> pool.Command:
    return lambda: [sys.executable, "-c", script]


REFERENCE = json.dumps({"event": "reference", "params": 1, "cpu_seconds": 0.1})


def test_pool_records_crash_and_timeout(tmp_path: pytest.TempPathFactory) -> None:
    crash = _fake(f"import os, signal; print({REFERENCE!r}); print('{{\"event\": \"start\", \"mode\": \"strict\"}}', "
                  "flush=True); os.kill(os.getpid(), signal.SIGSEGV)")
    rec = pool.run_one("fake", ["strict", "fused"], 60, log_dir=str(tmp_path), command=crash)
    assert rec["status"] == results.RAN
    assert rec["modes"]["strict"]["status"] == judge.CRASH and "SIGSEGV" in rec["modes"]["strict"]["detail"]
    assert rec["modes"]["fused"]["status"] == judge.CRASH and "not reached" in rec["modes"]["fused"]["detail"]
    hang = _fake(f"import time; print({REFERENCE!r}, flush=True); time.sleep(60)")
    rec = pool.run_one("fake", ["strict"], 2, log_dir=str(tmp_path), command=hang)
    assert rec["modes"]["strict"]["status"] == judge.TIMEOUT and rec["seconds"] < 30
    cpu_crash = _fake("import os; os.abort()")
    rec = pool.run_one("fake", ["strict"], 60, log_dir=str(tmp_path), command=cpu_crash)
    assert rec["status"] == judge.CPU_FAILS  # died before its CPU reference: excluded, not charged to pjrt
    rec = pool.run_one("diffusers/Fake", ["strict"], 60, log_dir=str(tmp_path), command=cpu_crash)
    assert os.path.exists(os.path.join(str(tmp_path), "diffusers__Fake.log"))  # a type with a slash: one file


SERVER = """
import json, os, signal, sys, time
for line in sys.stdin:
    t = json.loads(line)["type"]
    print(json.dumps({"event": "reference", "params": 1, "cpu_seconds": 0.1}), flush=True)
    if t == "boom":
        os.kill(os.getpid(), signal.SIGSEGV)
    if t == "slow":
        time.sleep(60)
    print(json.dumps({"event": "done", "record": {"type": t, "status": "ran", "modes": {}, "pid": os.getpid()}}),
          flush=True)
"""


def test_a_worker_serves_architectures_until_it_dies_overruns_or_is_recycled(
        tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool, "TYPES_PER_WORKER", 2)
    seen: list[str] = []
    recs = pool.run_all(["a", "b", "c", "boom", "d", "slow", "e"], ["strict"], 3, 1,
                        lambda rec, finished, total: seen.append(f"{finished}/{total}"), log_dir=str(tmp_path),
                        command=_fake(SERVER))
    by = {r["type"]: r for r in recs}
    assert seen == [f"{i}/7" for i in range(1, 8)]
    assert by["a"]["pid"] == by["b"]["pid"] != by["c"]["pid"]  # recycled after two
    assert by["boom"]["modes"]["strict"]["status"] == judge.CRASH and "SIGSEGV" in by["boom"]["modes"]["strict"]["detail"]
    assert by["slow"]["modes"]["strict"]["status"] == judge.TIMEOUT
    pids = [by[t]["pid"] for t in ("c", "d", "e")]
    assert len(set(pids)) == 3  # a fresh worker after the crash and after the timeout
    assert all(r["seconds"] < 30 for r in recs)


def test_results_resume_and_report(tmp_path: pytest.TempPathFactory) -> None:
    path = os.path.join(str(tmp_path), "r.jsonl")
    write = results.Writer(path)
    ok = {"type": "a", "class": "A", "head": "causal-lm", "status": "ran", "seconds": 3,
          "modes": {"strict": {"status": "pass", "worst_ratio": 0.1, "worst_at": "grad:w", "compile_seconds": 1.0},
                    "fused": {"status": "error", "detail": "RuntimeError: histc: input 12 bad", "fallbacks": {},
                              "compile_seconds": 75.0}}}
    write(ok)
    write({"type": "b", "class": "B", "status": "cpu-fails", "reason": "build: ImportError: timm"})
    with open(path, "a") as f:
        f.write('{"type": "c", "trunc')  # a killed run's last line
    loaded = results.load(path)
    assert set(loaded) == {"a", "b"}
    assert results.complete(loaded["a"], ["strict", "fused"], frozenset({"causal-lm"}))
    assert not results.complete(loaded["a"], ["strict", "fused", "compiled"], frozenset({"causal-lm"}))
    assert results.complete(loaded["b"], ["strict"], frozenset())
    env = report.Environment("python -m torch_pjrt.tools.zoo --only a,b", "today", {"torch": "x"})
    text = report.render(loaded, env, 2, 2, path)
    assert "| strict | 1 | 1 | 0 | 0 | 0 | 0 | 0 | 100.0% |" in text
    assert "| fused | 1 | 0 | 0 | 1 | 0 | 0 | 0 | 0.0% |" in text
    assert "- a (fused): 75 s" in text  # compile-time outlier
    assert "ImportError: timm" in text
    assert "histc: input # bad" in text  # failures grouped by their normalized message


def test_judge_floor_is_below_the_denormal_range() -> None:
    """Differences under 16 x tiny / eps (what flushed denormal intermediates can leave) pass; one
    above an exact zero does not."""
    c = Comparison()
    exact = torch.full((4,), 4e-36, dtype=torch.float64)
    judge.judge_tensor(c, "tiny", exact * 1.2, exact, exact.clone())
    assert c.passed
    zeros = torch.zeros(4, dtype=torch.float64)
    judge.judge_tensor(c, "zero", torch.full((4,), 1e-28, dtype=torch.float64), zeros, zeros.clone())
    assert not c.passed and c.mismatches[0].tensor == "zero"


def test_a_cancelled_gradient_is_judged_at_its_modules_scale() -> None:
    """A bias gradient that is zero in exact arithmetic (rounding of its module's size on the
    device) passes; the same error where the module's gradients are as small does not."""
    zeros = torch.zeros(8, dtype=torch.float64)
    weight = torch.linspace(-1e-3, 1e-3, 8, dtype=torch.float64)
    exact = execute.Run(outputs={}, grads={"norm.weight": weight, "norm.bias": zeros})
    device = execute.Run(outputs={}, grads={"norm.weight": weight.clone(), "norm.bias": zeros + 6e-12})
    assert judge.module_scales(exact.grads) == {"": 1e-3, "norm": 1e-3}
    assert judge.compare(device, exact, copy.deepcopy(exact)).passed
    # Both of the norm's gradients cancel exactly: the enclosing block's scale.
    nested = execute.Run(outputs={}, grads={"block.norm.weight": zeros, "block.norm.bias": zeros,
                                            "block.proj.weight": weight, "head.weight": weight * 100})
    assert judge.gradient_floor("block.norm.bias", judge.module_scales(nested.grads)) == 1e-3
    moved = copy.deepcopy(nested)
    moved.grads["block.norm.bias"] = zeros + 6e-12
    assert judge.compare(moved, nested, copy.deepcopy(nested)).passed
    moved.grads["block.norm.bias"] = zeros + 1e-6
    assert not judge.compare(moved, nested, copy.deepcopy(nested)).passed
    small = execute.Run(outputs={}, grads={"norm.weight": weight * 1e-9, "norm.bias": zeros})
    device.grads["norm.weight"] = weight * 1e-9
    c = judge.compare(device, small, copy.deepcopy(small))
    assert [m.tensor for m in c.mismatches] == ["grad:norm.bias"]


def test_constant_matrices_are_redrawn() -> None:
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    with torch.no_grad():
        m[0].weight.zero_()
        m[0].bias.zero_()
    assert seeds.redraw_constant_matrices(m, 0.02) == ["0.weight"]
    assert m[0].weight.std() > 0 and bool((m[0].bias == 0).all()) and bool((m[1].weight == 1).all())


def test_a_float64_reference_with_nans_is_no_reference() -> None:
    r32, r64 = _bert_runs()
    assert judge.references_disagree(r32, r64) == ""
    broken = copy.deepcopy(r64)
    name = "bert.embeddings.word_embeddings.weight"
    g = broken.grads[name]
    assert g is not None
    broken.grads[name] = torch.where(torch.arange(g.numel()).view_as(g) % 7 == 0, float("nan"), g)
    assert judge.references_disagree(r32, broken).startswith(f"grad:{name}:")


def test_a_rerun_of_one_mode_keeps_the_others(tmp_path: pytest.TempPathFactory) -> None:
    path = str(tmp_path / "r.jsonl")  # type: ignore[operator]
    write = results.Writer(path)
    write({"type": "a", "status": results.RAN, "modes": {"strict": {"status": "pass"}, "fused": {"status": "error"}}})
    write({"type": "a", "status": results.RAN, "modes": {"fused": {"status": "pass"}, "compiled": {"status": "pass"}}})
    write({"type": "b", "status": results.RAN, "modes": {"strict": {"status": "pass"}}})
    write({"type": "b", "status": judge.CPU_FAILS, "reason": "float64 run is no reference"})
    got = results.load(path)
    assert {m: v["status"] for m, v in got["a"]["modes"].items()} == {"strict": "pass", "fused": "pass",
                                                                      "compiled": "pass"}
    assert got["b"]["status"] == judge.CPU_FAILS and "modes" not in got["b"]


def test_a_forward_that_draws_random_numbers_is_no_reference() -> None:
    class Noisy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(3))

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"y": self.w * x + torch.rand(3)}

    m, x = Noisy(), {"x": torch.arange(3.0)}
    torch.manual_seed(0)
    first = execute.run(m, m, x)
    torch.manual_seed(0)
    assert judge.random_forward(first, execute.run(m, m, x)) == ""
    torch.manual_seed(1)
    assert judge.random_forward(first, execute.run(m, m, x)).startswith("out:y changes with the seed")


# ---- diffusers' model classes ----

needs_diffusers = pytest.mark.skipif(not diffusers_models.available(), reason="diffusers is not installed")


@needs_diffusers
def test_diffusers_types_are_in_the_catalog() -> None:
    entries = {e.model_type: e for e in catalog.entries()}
    for name in ("UNet2DModel", "UNet2DConditionModel", "AutoencoderKL", "DiTTransformer2DModel",
                 "PixArtTransformer2DModel", "SD3Transformer2DModel", "FluxTransformer2DModel"):
        e = entries["diffusers/" + name]
        assert e.head == diffusers_models.HEAD and e.model_class == name
    assert "diffusers/AutoencoderKL" in [e.model_type for e in catalog.entries() if e.head == "diffusion"]


@needs_diffusers
def test_diffusers_unet_shrinks_to_two_consistent_stages() -> None:
    c = shrink.tiny_config("diffusers/UNet2DConditionModel")  # four stages released
    assert c["down_block_types"] == ["CrossAttnDownBlock2D", "DownBlock2D"]
    assert c["up_block_types"] == ["UpBlock2D", "CrossAttnUpBlock2D"]  # the same stages, reversed
    assert c["block_out_channels"] == [32, 64] and c["layers_per_block"] == 1
    assert all(w % c["norm_num_groups"] == 0 for w in c["block_out_channels"])
    assert all(w % c["attention_head_dim"] == 0 for w in c["block_out_channels"])
    assert c["cross_attention_dim"] == diffusers_models.TEXT_WIDTH and c["sample_size"] <= 16
    assert c["reverse_transformer_layers_per_block"] is None  # unset lists stay derived
    u = shrink.tiny_config("diffusers/UNet2DModel")
    assert u["down_block_types"] == ["DownBlock2D", "AttnDownBlock2D"] and u["block_out_channels"] == [32, 64]


@needs_diffusers
def test_diffusers_transformers_shrink_their_inner_width_together() -> None:
    sd3 = shrink.tiny_config("diffusers/SD3Transformer2DModel")
    inner = sd3["num_attention_heads"] * sd3["attention_head_dim"]
    assert inner == diffusers_models.HEADS * diffusers_models.HEAD_DIM
    assert sd3["caption_projection_dim"] == inner  # equal to the inner width before: equal after
    assert sd3["num_layers"] <= 2 and sd3["sample_size"] % sd3["patch_size"] == 0
    assert sd3["pos_embed_max_size"] * sd3["patch_size"] >= sd3["sample_size"]
    flux = shrink.tiny_config("diffusers/FluxTransformer2DModel")
    assert sum(flux["axes_dims_rope"]) == flux["attention_head_dim"]
    assert all(d % 2 == 0 for d in flux["axes_dims_rope"])
    assert flux["num_layers"] <= 2 and flux["num_single_layers"] == 1
    pixart = shrink.tiny_config("diffusers/PixArtTransformer2DModel")
    assert pixart["cross_attention_dim"] == pixart["num_attention_heads"] * pixart["attention_head_dim"]
    assert pixart["caption_channels"] == diffusers_models.TEXT_WIDTH


def test_diffusers_rope_axes_rescale() -> None:
    assert diffusers_models._rope_axes([16, 56, 56], 16) == [4, 6, 6]
    assert sum(diffusers_models._rope_axes([32, 32, 32, 32], 16)) == 16


@needs_diffusers
def test_diffusers_inputs() -> None:
    entries = {e.model_type: e for e in catalog.entries()}
    model, config = build.build(entries["diffusers/UNet2DConditionModel"])
    x = inputs.make_inputs(model, config, diffusers_models.HEAD, "diffusers/UNet2DConditionModel")
    assert x["sample"].shape == (2, config["in_channels"], config["sample_size"], config["sample_size"])
    assert x["timestep"].shape == (2,) and not x["timestep"].is_floating_point()  # diffusion steps
    assert x["encoder_hidden_states"].shape == (2, diffusers_models.TEXT_LEN, config["cross_attention_dim"])
    flux = entries["diffusers/FluxTransformer2DModel"]
    model, config = build.build(flux)
    x = inputs.make_inputs(model, config, flux.head, flux.model_type)
    tokens = x["hidden_states"].shape[1]
    assert x["hidden_states"].shape == (2, tokens, config["in_channels"])
    assert x["img_ids"].shape == (tokens, 3) and x["txt_ids"].shape == (diffusers_models.TEXT_LEN, 3)
    assert x["pooled_projections"].shape == (2, config["pooled_projection_dim"])
    assert x["timestep"].is_floating_point() and bool((x["timestep"] <= 1).all())  # flow-matching time
    dit = entries["diffusers/DiTTransformer2DModel"]
    model, config = build.build(dit)
    x = inputs.make_inputs(model, config, dit.head, dit.model_type)
    assert x["class_labels"].shape == (2,) and int(x["class_labels"].max()) < config["num_embeds_ada_norm"]
    # Same inputs in every process; zero-initialized matrices (adaLN-zero, output projections) re-drawn.
    again = inputs.make_inputs(model, config, dit.head, dit.model_type)
    assert all(torch.equal(v, again[k]) for k, v in x.items() if isinstance(v, torch.Tensor))
    assert not any(p.dim() >= 2 and bool((p == 0).all()) for p in model.parameters())


@needs_diffusers
def test_diffusers_vae_runs_forward_and_backward_on_the_cpu() -> None:
    e = catalog.entry("diffusers/AutoencoderKL")
    model, config = build.build(e)
    x = inputs.make_inputs(model, config, e.head, e.model_type)
    m32, m64 = copy.deepcopy(model), build.float64_copy(model)
    r32 = execute.run(m32, m32, x)
    r64 = execute.run(m64, m64, inputs.move(x, "cpu", torch.float64))
    assert set(r64.outputs) == {"sample"} and r64.outputs["sample"].shape == x["sample"].shape
    assert judge.references_disagree(r32, r64) == ""
    assert judge.verdict(judge.compare(r32, r64, r32), {}).status == judge.PASS


def test_report_lists_diffusers_types_in_their_section() -> None:
    rec = {"type": "diffusers/UNet2DModel", "class": "UNet2DModel", "head": "diffusion", "status": "ran",
           "seconds": 9, "modes": {"strict": {"status": "pass", "worst_ratio": 0.1, "worst_at": "out:sample"}}}
    bert = {**rec, "type": "bert", "class": "BertForMaskedLM", "head": "masked-lm"}
    env = report.Environment("python -m torch_pjrt.tools.zoo", "today", {"torch": "x"})
    text = report.render({r["type"]: r for r in (rec, bert)}, env, 2, 2)
    section = text.split("## diffusers models", 1)
    assert len(section) == 2 and "| diffusers/UNet2DModel | UNet2DModel |" in section[1]
    assert "| diffusers/UNet2DModel |" not in section[0] and "| bert |" in section[0]
    assert "| strict | 2 | 2 |" in text  # the summary counts both


@needs_diffusers
def test_diffusers_float64_copy_embeds_timesteps_in_float64() -> None:
    """diffusers computes its sinusoidal time embedding in float32 whatever the model's dtype: the
    float64 reference computes it in float64 (else the bound there is float32's ulps alone)."""
    from diffusers.models.embeddings import Timesteps

    model, _ = build.build(catalog.entry("diffusers/DiTTransformer2DModel"))
    m64 = build.float64_copy(model)
    ts = [m for m in m64.modules() if isinstance(m, Timesteps)]
    assert ts and not any(isinstance(m, Timesteps) and "forward" in vars(m) for m in model.modules())
    t = torch.tensor([2, 629])
    exact, float32 = ts[0](t), Timesteps.forward(ts[0], t)
    assert exact.dtype == torch.float64 and float32.dtype == torch.float32
    assert float(exact.sub(float32.double()).abs().max()) < 1e-4  # the same function


def test_the_reports_notes_by_hand_stay(tmp_path: pytest.TempPathFactory) -> None:
    path = str(tmp_path / "zoo.md")  # type: ignore[operator]
    with open(path, "w") as f:
        f.write("# old\n\n| old table |\n\n## Notes (by hand)\n\nkept.\n")
    report.write(path, {}, report.environment("cmd"), 0, 0, "r.jsonl")
    text = open(path).read()
    assert "old table" not in text and text.endswith("\n## Notes (by hand)\n\nkept.\n")
