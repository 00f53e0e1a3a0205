"""Hugging Face Trainer and accelerate on pjrt, unmodified: the device is picked
with no environment variable, training is judged step by step against float64
CPU references, and device_map places models on pjrt. The 2-rank DDP runs are
in test_distributed.py (scenarios trainer_ddp and accelerate_ddp)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
import transformers

import torch_pjrt
from torch_pjrt import integrations

import hf_stack  # noqa: E402  (tests/python on sys.path via conftest)

STEPS = 3
BATCH = 4


def _trainer(tmp_path: Any, **extra: Any) -> tuple[transformers.Trainer, hf_stack.StepRecorder]:
    recorder = hf_stack.StepRecorder()
    args = hf_stack.training_args(str(tmp_path), BATCH, STEPS, **extra)
    trainer = transformers.Trainer(model=hf_stack.make_llama(), args=args, train_dataset=hf_stack.TokenDataset(),
                                   callbacks=[recorder])
    return trainer, recorder


def test_trainer_picks_the_device_with_no_setting(tmp_path: Any) -> None:
    trainer, _ = _trainer(tmp_path)
    assert trainer.args.device.type == torch_pjrt.DEVICE_NAME, trainer.args.device
    assert trainer.accelerator.device.type == torch_pjrt.DEVICE_NAME
    assert next(trainer.model.parameters()).device.type == torch_pjrt.DEVICE_NAME
    for name in ("accelerate.default_device", "transformers.setup_devices"):
        assert name in integrations.applied(), integrations.skipped()


def test_trainer_float32_steps_match_float64_replays(tmp_path: Any) -> None:
    trainer, recorder = _trainer(tmp_path)
    with torch_pjrt.fallback_mode("error"):
        trainer.train()
    assert len(recorder.states) == STEPS
    result = hf_stack.judge_trainer_steps(trainer, recorder)
    assert result.passed and result.steps == STEPS, torch_pjrt.qualify.differential.describe(result)


def test_trainer_bf16_is_accepted_and_tracks_float64_like_cpu_bf16(tmp_path: Any) -> None:
    trainer, recorder = _trainer(tmp_path, bf16=True)
    assert trainer.args.bf16
    with torch_pjrt.fallback_mode("error"):
        trainer.train()
    got = [s.params for s in recorder.states]
    batches = [torch.stack([hf_stack.TokenDataset()[BATCH * s + i]["input_ids"] for i in range(BATCH)])
               for s in range(STEPS)]
    exact = hf_stack.reference_trajectory(torch.float64, batches, STEPS)
    cpu_bf16 = hf_stack.reference_trajectory(torch.float32, batches, STEPS, autocast=torch.bfloat16)
    ratio, where = hf_stack.worst_ratio(got, exact, cpu_bf16, factor=4.0)
    assert ratio < 1, f"bf16 on pjrt is {ratio:.2f}x the allowed distance from float64 at {where}"
    # And bf16 really ran: a float32 Trainer's parameters are much closer to float64.
    f32 = hf_stack.reference_trajectory(torch.float32, batches, STEPS)
    far, _ = hf_stack.worst_ratio(got, exact, f32, factor=1.0)
    assert far > 1, "the bf16 run is as close to float64 as float32: autocast did not reach the device"


@pytest.mark.parametrize("device_map", ["pjrt", "auto"])
def test_device_map_places_the_model_on_pjrt(tmp_path: Any, device_map: str) -> None:
    hf_stack.make_llama().save_pretrained(tmp_path)
    device_map = torch_pjrt.DEVICE_NAME if device_map == "pjrt" else device_map
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, device_map=device_map)
    devices = {p.device for p in model.parameters()}
    assert devices == {torch.device(torch_pjrt.DEVICE_NAME, 0)}, devices
    cpu = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = hf_stack.TokenDataset()[0]["input_ids"][None]
    with torch.no_grad():
        want64 = cpu.double()(ids).logits
        got = model(ids.to(model.device)).logits.cpu().double()
        want32 = cpu.float()(ids).logits.double()
    allowed = 16 * (want32 - want64).abs().max() + 16 * hf_stack.EPS32 * want64.abs().max()
    assert (got - want64).abs().max() <= allowed


def test_accelerate_launch_starts_ddp_on_pjrt(tmp_path: Any) -> None:
    """`accelerate launch --num_processes 2` (no config file) runs the accelerate DDP scenario of
    dist_workers.py on 2 processes over the pjrt process group, not one process."""
    import os
    import subprocess
    import sys

    worker = os.path.join(os.path.dirname(__file__), "dist_workers.py")
    env = dict(os.environ, HOME=str(tmp_path), HF_HOME=str(tmp_path / "hf"), OMP_NUM_THREADS="1")
    cli = os.path.join(os.path.dirname(sys.executable), "accelerate")  # the command users type
    out = subprocess.run([cli, "launch", "--num_processes", "2",
                          "--main_process_port", "0", worker, "accelerate_ddp", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=300)
    for rank in range(2):
        report = tmp_path / f"rank{rank}.json"
        assert report.exists(), f"rank {rank} did not run:\n{(out.stdout + out.stderr)[-3000:]}"
        result = json.loads(report.read_text())
        assert result["ok"], result.get("error")
    assert out.returncode == 0, out.stderr[-3000:]
