"""PyTorch Lightning on pjrt, unmodified: Trainer() picks the device with no argument,
accelerator="pjrt" is accepted, every step is judged against float64 CPU replays,
bf16-mixed autocasts on the device, checkpoints resume, Trainer() with two devices
runs DDP in two processes over the pjrt process group, and the FSDP strategy trains and
saves a full checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pl = pytest.importorskip("pytorch_lightning")

import torch_pjrt  # noqa: E402
from torch_pjrt import integrations  # noqa: E402
from torch_pjrt.qualify import differential  # noqa: E402

import hf_stack  # noqa: E402  (tests/python on sys.path via conftest; worst_ratio)
import lightning_stack as ls  # noqa: E402

DEVICE = torch_pjrt.DEVICE_NAME
HERE = Path(__file__).parent
STEPS = 4


def _trainer(**kwargs: Any) -> pl.Trainer:
    settings: dict[str, Any] = dict(max_steps=STEPS, logger=False, enable_checkpointing=False,
                                    enable_progress_bar=False, enable_model_summary=False)
    settings.update(kwargs)
    return pl.Trainer(**settings)


def test_trainer_picks_pjrt_with_no_argument() -> None:
    trainer = _trainer()
    assert type(trainer.accelerator).__name__ == "PjrtAccelerator", trainer.accelerator
    assert trainer.strategy.root_device.type == DEVICE, trainer.strategy.root_device
    module = ls.Classifier()
    trainer.fit(module, ls.loader())
    assert module.devices_seen == {f"{DEVICE}:0"}, module.devices_seen
    for name in ("lightning.accelerator", "lightning.auto_accelerator", "lightning.single_device"):
        assert name in integrations.applied(), integrations.skipped()


@pytest.mark.parametrize("name", sorted({"pjrt", DEVICE}))
def test_accelerator_is_accepted_by_name(name: str) -> None:
    trainer = _trainer(accelerator=name, devices=1)
    assert trainer.strategy.root_device == torch.device(DEVICE, 0)


def test_cpu_is_still_chosen_when_asked() -> None:
    trainer = _trainer(accelerator="cpu")
    assert trainer.strategy.root_device.type == "cpu"


def test_every_step_matches_float64_replays() -> None:
    recorder = ls.StepRecorder()
    with torch_pjrt.fallback_mode("error"):
        _trainer(callbacks=[recorder]).fit(ls.Classifier(), ls.loader())
    result = ls.judge_steps(recorder)
    assert result.passed and result.steps == STEPS, differential.describe(result)


def test_bf16_mixed_autocasts_on_the_device_and_tracks_float64_like_cpu_bf16() -> None:
    module = ls.Classifier()
    seen: list[torch.dtype] = []
    module.net[0].register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    params: list[dict[str, torch.Tensor]] = []

    class Params(pl.Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            params.append(ls.params_of(module.net))

    trainer = _trainer(precision="bf16-mixed", callbacks=[Params()])
    assert trainer.precision_plugin.device == DEVICE
    with torch_pjrt.fallback_mode("error"):
        trainer.fit(module, ls.loader())
    assert seen and set(seen) == {torch.bfloat16}, seen  # the Linear ran under autocast on the device
    batches = list(ls.loader())[:STEPS]
    exact = ls.reference_params(torch.float64, batches)
    cpu_bf16 = ls.reference_params(torch.float32, batches, autocast=torch.bfloat16)
    ratio, where = hf_stack.worst_ratio(params, exact, cpu_bf16, factor=4.0)
    assert ratio <= 1.0, f"{ratio:.2f}x the allowed distance to float64 at {where}"


def test_a_checkpoint_resumes_to_the_uninterrupted_run(tmp_path: Path) -> None:
    def final(module: pl.LightningModule) -> dict[str, torch.Tensor]:
        return {n: p.detach().cpu() for n, p in module.net.named_parameters()}

    whole = ls.Classifier()
    _trainer(max_steps=-1, max_epochs=2).fit(whole, ls.loader(16))
    first = ls.Classifier()
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True)
    _trainer(max_steps=-1, max_epochs=1, enable_checkpointing=True, callbacks=[ckpt]).fit(first, ls.loader(16))
    saved = torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved["global_step"] == 16 // ls.BATCH and saved["optimizer_states"][0]["state"], saved.keys()
    resumed = ls.Classifier()
    _trainer(max_steps=-1, max_epochs=2).fit(resumed, ls.loader(16), ckpt_path=str(tmp_path / "last.ckpt"))
    expected, got = final(whole), final(resumed)
    assert got.keys() == expected.keys()
    eps = torch.finfo(torch.float32).eps
    for name in expected:  # the same computation; a fused window may round a few ulps apart
        torch.testing.assert_close(got[name], expected[name], rtol=8 * eps, atol=8 * eps * expected[name].abs().max().item())
    assert not torch.equal(final(first)["0.weight"], expected["0.weight"])  # the second epoch did train


def _two_ranks(tmp_path: Path, *strategy: str) -> list[dict[str, Any]]:
    env = dict(os.environ, TORCH_PJRT_CPU_DEVICES="2", PYTHONPATH=os.pathsep.join(
        [str(HERE), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(HERE / "lightning_stack.py"), str(tmp_path), str(STEPS), *strategy],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]


def _judge_two_ranks(ranks: list[dict[str, Any]]) -> None:
    """Both ranks' parameters after every step against full-batch training in float64 (the
    ranks' gradients are averaged; Lightning's DistributedSampler shuffles with seed 0)."""
    batches = ls.full_batches(2, STEPS, shuffle=True)
    exact = ls.reference_params(torch.float64, batches)
    float32 = ls.reference_params(torch.float32, batches)
    for r, got in enumerate(ranks):
        assert len(got["params"]) == STEPS
        ratio, where = hf_stack.worst_ratio(got["params"], exact, float32)
        assert ratio <= 1.0, f"rank {r}: {ratio:.2f}x the allowed distance to float64 at {where}"


def test_trainer_with_two_devices_runs_ddp_in_two_processes_like_full_batch_training(tmp_path: Path) -> None:
    ranks = _two_ranks(tmp_path)
    for r, got in enumerate(ranks):
        assert got["accelerator"] == "PjrtAccelerator" and got["strategy"] == "DDPStrategy", got
        assert got["world_size"] == 2 and got["backend"] == "pjrt", got
        assert got["devices_seen"] == [f"{DEVICE}:{r}"], got["devices_seen"]
    _judge_two_ranks(ranks)


def test_fsdp_trains_like_full_batch_training_and_saves_a_full_checkpoint(tmp_path: Path) -> None:
    """FSDPStrategy (refused for any accelerator but CUDA before the patch), in its hybrid
    shard over a (1, 2) mesh: the parameters are sharded over both ranks, and the mesh splits
    the process group Lightning made with a device_id."""
    ranks = _two_ranks(tmp_path, "fsdp-hybrid")
    for r, got in enumerate(ranks):
        assert got["strategy"] == "FSDPStrategy" and got["precision"] == "PjrtFSDPPrecision", got
        assert got["backend"] == "pjrt" and got["devices_seen"] == [f"{DEVICE}:{r}"], got
    _judge_two_ranks(ranks)
    saved = torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    final = ranks[0]["params"][-1]
    assert {f"net.{n}" for n in final} == set(saved), saved.keys()
    for name, value in final.items():  # the checkpoint holds the whole trained parameters
        torch.testing.assert_close(saved[f"net.{name}"].double(), value, rtol=0, atol=0)


def test_fsdp_is_accepted_by_name_and_its_bf16_mixed_autocasts_on_the_device() -> None:
    trainer = _trainer(strategy="fsdp", precision="bf16-mixed", devices=1)
    assert type(trainer.strategy).__name__ == "FSDPStrategy", trainer.strategy
    plugin = trainer.precision_plugin
    assert type(plugin).__name__ == "PjrtFSDPPrecision", plugin
    with plugin.forward_context():
        y = torch.nn.functional.linear(torch.ones(2, 3, device=DEVICE), torch.ones(4, 3, device=DEVICE))
    assert y.dtype == torch.bfloat16 and y.device.type == DEVICE, y
