"""PEFT and TRL on pjrt, unmodified (the Trainer integration carries them): LoRA through
the Hugging Face Trainer judged step by step against float64 replays, the merged and
unmerged adapters against float64, and TRL's SFTTrainer and DPOTrainer with a LoRA config
(plain SGD), every step's loss, adapter gradients and adapter parameters against the same trainer run
on the CPU in float64 (bound: the CPU float32 run's own distance to it)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

peft = pytest.importorskip("peft")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

import torch_pjrt  # noqa: E402
from torch_pjrt.qualify import differential  # noqa: E402

import hf_stack  # noqa: E402  (tests/python on sys.path via conftest)
import serving_models  # noqa: E402

DEVICE = torch_pjrt.DEVICE_NAME
STEPS = 3
BATCH = 4


def lora_config(**extra: Any) -> Any:
    return peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                           task_type="CAUSAL_LM", **extra)


def lora_llama() -> torch.nn.Module:
    return peft.get_peft_model(hf_stack.make_llama(), lora_config(init_lora_weights="gaussian"))


def test_lora_through_the_trainer_matches_float64_replays(tmp_path: Path) -> None:
    recorder = hf_stack.StepRecorder()
    model = lora_llama()
    trainer = transformers.Trainer(model=model, args=hf_stack.training_args(str(tmp_path), BATCH, STEPS),
                                   train_dataset=hf_stack.TokenDataset(), callbacks=[recorder])
    assert next(trainer.model.parameters()).device.type == DEVICE
    with torch_pjrt.fallback_mode("error"):
        trainer.train()
    trained = {n for n, g in recorder.states[0].grads.items()}
    assert trained and all("lora_" in n for n in trained), sorted(trained)  # only the adapters learn
    result = hf_stack.judge_trainer_steps(trainer, recorder, make_model=lora_llama)
    assert result.passed and result.steps == STEPS, differential.describe(result)


def test_merged_and_unmerged_adapters_match_float64() -> None:
    trained = lora_llama()
    with torch.no_grad():  # an adapter that changes the output (B starts at zero)
        for n, p in trained.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))) * 0.1)
    ids = hf_stack.TokenDataset()[0]["input_ids"][None]
    exact = copy.deepcopy(trained).double()(input_ids=ids).logits
    cpu32 = trained(input_ids=ids).logits
    cpu32_merged = copy.deepcopy(trained).merge_and_unload()(input_ids=ids).logits
    own = max((cpu32.double() - exact).abs().max().item(), (cpu32_merged.double() - exact).abs().max().item())
    allowed = 16 * own + 16 * torch.finfo(torch.float32).eps * exact.abs().max().item()
    on_device = copy.deepcopy(trained).to(DEVICE)
    with torch_pjrt.fallback_mode("error"), torch.no_grad():
        unmerged = on_device(input_ids=ids.to(DEVICE)).logits.cpu()
        merged_model = on_device.merge_and_unload()
        merged = merged_model(input_ids=ids.to(DEVICE)).logits.cpu()
    assert not any("lora_" in n for n, _ in merged_model.named_parameters())
    for name, got in (("unmerged", unmerged), ("merged", merged)):
        err = (got.double() - exact).abs().max().item()
        assert err <= allowed, f"{name}: {err:.3g} from float64, allowed {allowed:.3g}"


# ---- TRL ----------------------------------------------------------------------------

class _Record(transformers.TrainerCallback):
    """Copies `start` (the first run's initial adapter) into the model when training begins,
    and records each step's adapter gradients and parameters (float64 CPU copies)."""

    def __init__(self, start: dict[str, torch.Tensor] | None) -> None:
        self.start = start
        self.initial: dict[str, torch.Tensor] = {}
        self.grads: list[dict[str, torch.Tensor]] = []
        self.params: list[dict[str, torch.Tensor]] = []

    @staticmethod
    def _trainable(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
        return {n: p for n, p in model.named_parameters() if p.requires_grad}

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        params = self._trainable(model)
        if self.start is not None:
            assert params.keys() == self.start.keys(), (sorted(params), sorted(self.start))
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(self.start[n].to(p.dtype))
        self.initial = {n: p.detach().to("cpu", torch.float64, copy=True) for n, p in params.items()}

    def on_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        params = self._trainable(model)
        self.grads.append({n: p.grad.detach().to("cpu", torch.float64, copy=True) for n, p in params.items()})
        self.params.append({n: p.detach().to("cpu", torch.float64, copy=True) for n, p in params.items()})


def _tiny_llama(vocab: int, dtype: torch.dtype) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   pad_token_id=1)
    return transformers.LlamaForCausalLM(cfg).to(dtype)


def _sentences(n: int, seed: int) -> list[str]:
    words = serving_models._TEXT.split()
    g = torch.Generator().manual_seed(seed)
    return [" ".join(words[i] for i in torch.randint(0, len(words), (int(k),), generator=g).tolist())
            for k in torch.randint(4, 12, (n,), generator=g)]


def _trl_run(kind: str, tmp: Path, on_cpu: bool, dtype: torch.dtype,
             start: dict[str, torch.Tensor] | None) -> tuple[list[torch.Tensor], _Record]:
    tokenizer = serving_models._tokenizer()
    model = _tiny_llama(len(tokenizer), dtype)
    # Plain SGD: Adam's first steps move each element by about lr * sign(gradient), so an element
    # whose gradient is below float32's noise takes a full step either way and the runs part
    # (seen: one LoRA B element of 128, gradient 2.4e-4 against a float32 noise of 1e-3). SGD's
    # update is linear in the gradient, so every step stays comparable; AdamW's own step is judged
    # by replays in test_lora_through_the_trainer_matches_float64_replays.
    common = dict(output_dir=str(tmp), per_device_train_batch_size=BATCH, max_steps=STEPS, learning_rate=0.1,
                  optim="sgd", lr_scheduler_type="constant", max_grad_norm=1e9, report_to=[], save_strategy="no",
                  logging_steps=1, disable_tqdm=True, seed=0, use_cpu=on_cpu, train_sampling_strategy="sequential")
    if kind == "sft":
        data = datasets.Dataset.from_dict({"text": _sentences(BATCH * STEPS, 0)})
        trainer: Any = trl.SFTTrainer(model=model, args=trl.SFTConfig(max_length=32, **common), train_dataset=data,
                                      processing_class=tokenizer, peft_config=lora_config())
    else:
        prompts, chosen, rejected = (_sentences(BATCH * STEPS, s) for s in (1, 2, 3))
        data = datasets.Dataset.from_dict({"prompt": prompts, "chosen": chosen, "rejected": rejected})
        trainer = trl.DPOTrainer(model=model, args=trl.DPOConfig(max_length=48, beta=0.5, **common),
                                 train_dataset=data, processing_class=tokenizer, peft_config=lora_config())
    record = _Record(start)
    trainer.add_callback(record)
    losses: list[torch.Tensor] = []
    compute_loss = trainer.compute_loss

    lengths: list[int] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        lengths.append(int((kwargs.get("inputs") or args[1])["input_ids"].shape[-1]))
        out = compute_loss(*args, **kwargs)
        loss = out[0] if isinstance(out, tuple) else out
        losses.append(loss.detach().to("cpu", torch.float64, copy=True).reshape(()))
        return out

    trainer.compute_loss = recording
    expected = "cpu" if on_cpu else DEVICE
    assert next(trainer.model.parameters()).device.type == expected
    if on_cpu:
        trainer.train()
    else:
        with torch_pjrt.fallback_mode("error"):
            trainer.train()
    assert len(record.params) == STEPS and len(losses) == STEPS, (len(record.params), len(losses))
    # pad_to_multiple_of="auto" pads on pjrt (torch_pjrt.integrations.trl): every batch one length, one
    # set of programs; on the CPU batches keep their own lengths.
    max_length = trainer.args.max_length
    if on_cpu:
        assert trainer.args.pad_to_multiple_of is None and len(set(lengths)) > 1, lengths
    else:
        assert trainer.args.pad_to_multiple_of == max_length and set(lengths) == {max_length}, lengths
    return losses, record


@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_trl_with_lora_tracks_the_cpu_float64_run(kind: str, tmp_path: Path) -> None:
    losses, got = _trl_run(kind, tmp_path / "pjrt", False, torch.float32, None)
    exact_losses, exact = _trl_run(kind, tmp_path / "f64", True, torch.float64, got.initial)
    cpu_losses, cpu32 = _trl_run(kind, tmp_path / "f32", True, torch.float32, got.initial)
    def named(values: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        return [{"loss": v} for v in values]

    for what, g, e, f in (("loss", named(losses), named(exact_losses), named(cpu_losses)),
                          ("gradient", got.grads, exact.grads, cpu32.grads),
                          ("parameter", got.params, exact.params, cpu32.params)):
        ratio, where = hf_stack.worst_ratio(g, e, f)
        assert ratio <= 1.0, f"{kind} {what}: {ratio:.2f}x the allowed distance to float64 at {where}"


def test_an_explicit_pad_to_multiple_of_is_kept_on_pjrt(tmp_path: Path) -> None:
    from torch_pjrt.integrations import trl as trl_patch

    assert "trl.pad_to_multiple_of.SFTConfig" in torch_pjrt.integrations.applied(), torch_pjrt.integrations.skipped()
    for given, want in ((None, None), (8, 8), ("auto", trl_patch.padding_multiple(1024))):
        config = trl.SFTConfig(output_dir=str(tmp_path), report_to=[], max_length=1024, pad_to_multiple_of=given)
        assert config.device.type == DEVICE and config.pad_to_multiple_of == want, (given, config.pad_to_multiple_of)
    assert trl_patch.padding_multiple(1024) == 128 and trl_patch.padding_multiple(32) == 32
