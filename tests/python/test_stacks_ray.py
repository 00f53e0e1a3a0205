"""Ray Train on pjrt: TorchTrainer's workers train on the device with a loop that names
none (get_device, prepare_model, prepare_data_loader), DDP over the pjrt process group,
each worker's parameters after every step against full-batch float64 training."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("ray.train.torch")

import torch_pjrt  # noqa: E402

import hf_stack  # noqa: E402  (tests/python on sys.path via conftest; worst_ratio)
import small_classifier as sc  # noqa: E402

DEVICE = torch_pjrt.DEVICE_NAME
HERE = Path(__file__).parent
STEPS = 3


def test_torch_trainer_workers_train_on_pjrt_like_full_batch_training(tmp_path: Path) -> None:
    # Ray starts its workers at nice 15: beside other work on the cores (CI runs four test jobs
    # side by side) they got a sliver of the CPU, and this run took 350 s instead of 24 s.
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_worker_niceness="0", PYTHONPATH=os.pathsep.join(
        [str(HERE), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(HERE / "ray_run.py"), str(tmp_path), str(STEPS)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for got in ranks:
        assert got["device"] == f"{DEVICE}:0", got["device"]  # one CPU-plugin device per worker process
        assert got["seen"] == [f"{DEVICE}:0"], got["seen"]
        assert got["wrapped"] == "DistributedDataParallel" and got["backend"] == f"cpu:gloo,{DEVICE}:pjrt", got
        assert len(got["params"]) == STEPS
    batches = sc.full_batches(2, STEPS, shuffle=False)  # prepare_data_loader keeps a sequential loader's order
    exact = sc.reference_params(torch.float64, batches)
    float32 = sc.reference_params(torch.float32, batches)
    for r, got in enumerate(ranks):
        ratio, where = hf_stack.worst_ratio(got["params"], exact, float32)
        assert ratio <= 1.0, f"rank {r}: {ratio:.2f}x the allowed distance to float64 at {where}"
