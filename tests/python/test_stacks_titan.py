"""TorchTitan's llama3 debug model on pjrt through TorchTitan's own trainer and
flags (tests/python/titan_run.py names the few workarounds TorchTitan 0.3.0 needs
against torch 2.13 on any device), under torchrun with 2 ranks and FSDP2, eager
and with --compile (backend pjrt), offline.

Reference: TorchTitan's FSDP2 cannot run on CPU (gloo has no PREMUL_SUM), so the
reference is the same trainer in one CPU process, in float64 and in float32, from
the same seed checkpoint (TorchTitan's own --checkpoint.create_seed_checkpoint).
Every document of the dataset is the same text, so each rank reads the single
process's token stream and the 2-rank global batch is its batch twice: the runs
must train alike. Each step's loss and gradient norm must lie within 16x float32's
own distance to float64 (plus 16 ulps)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

RUNNER = os.path.join(os.path.dirname(__file__), "titan_run.py")
STEPS = 4
WORLD = 2
# TorchTitan's global_avg_loss is a sum over the ranks (dist_sum). On torch 2.13 under the
# full-DTensor backend each rank's term is already the full batch's mean, so it reports WORLD
# times the mean (its 2-rank CPU DDP run does too); on torch 2.14 it reports the mean (pjrt
# 8.129916, float64 8.129895 at step 1).
LOSS_SUMMED_OVER_RANKS = WORLD if torch.__version__ < "2.14" else 1
EPS32 = 2.0 ** -23
FLAGS = ["--module", "llama3", "--config", "llama3_debugmodel", "--training.steps", str(STEPS),
         "--training.local_batch_size", "2", "--training.seq_len", "128", "--training.mixed_precision_param",
         "float32", "--debug.seed", "42", "--metrics.log_freq", "1", "--dataloader.dataset", "c4_test",
         # TorchTitan 0.3.0's default SPMD backend ("spmd_types") rejects torch 2.13's FSDP2 parameters on
         # any device ("all parameters must be DTensors on the full SPMD mesh"): its full-DTensor backend.
         "--parallelism.spmd_backend", "full_dtensor"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(work: Path, name: str, nproc: int, options: list[str], flags: list[str]) -> dict[int, dict[str, Any]]:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    record = str(work / name)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
           str(_port()), RUNNER, *options, "--record", record, "--", *FLAGS,
           "--hf_assets_path", str(work / "assets" / "tokenizer"),
           "--dataloader.dataset_path", str(work / "assets" / "c4_test"),
           "--dump_folder", str(work / f"out_{name}"), *flags]
    out = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{name} failed:\n{(out.stdout + out.stderr)[-4000:]}"
    reports = {}
    for rank in range(nproc):
        with open(f"{record}.rank{rank}.json") as f:
            reports[rank] = json.load(f)
    return reports


def _series(report: dict[str, Any], key: str) -> list[float]:
    return [s[key] for s in report["steps"] if key in s]


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, list[float]]]]:
    work = tmp_path_factory.mktemp("titan")
    subprocess.run([sys.executable, RUNNER, "--make-assets", str(work / "assets")], check=True, timeout=120)
    _torchrun(work, "seed", 1, ["--cpu"], ["--checkpoint.enable", "--checkpoint.create_seed_checkpoint",
                                          "--training.steps", "1"])
    refs = {}
    for name, options in (("float32", ["--cpu"]), ("float64", ["--cpu", "--float64"])):
        report = _torchrun(work, name, 1, options, _load_seed(work))[0]
        refs[name] = {k: _series(report, k) for k in ("loss_metrics/global_avg_loss", "grad_norm")}
    return work, refs


def _load_seed(work: Path) -> list[str]:
    return ["--checkpoint.enable", "--checkpoint.load_only", "--checkpoint.initial_load_path",
            str(work / "out_seed" / "checkpoint" / "step-0")]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_llama3_debug_model_fsdp2_on_two_ranks(references: tuple[Path, dict[str, Any]], compiled: bool) -> None:
    work, refs = references
    flags = _load_seed(work) + ["--parallelism.data_parallel_shard_degree", str(WORLD)]
    if compiled:
        flags += ["--compile.enable", "--compile.backend", "pjrt"]
    reports = _torchrun(work, "compiled" if compiled else "eager", WORLD, [], flags)
    for rank, report in reports.items():
        assert report["pjrt"]["fallbacks"] == {}, f"rank {rank} ran ops on the CPU: {report['pjrt']['fallbacks']}"
        assert len(report["steps"]) == STEPS
        assert _series(report, "memory/max_active(GiB)")[0] > 0  # memory_stats' keys are there
    assert _series(reports[0], "loss_metrics/global_avg_loss") == _series(reports[1], "loss_metrics/global_avg_loss")
    if compiled:
        block = reports[0]["compiled"]["Llama3TransformerBlock.forward"]
        assert block["eager_graphs"] == [] and block["programs"] == 2, block  # forward and backward
        assert block["calls"] == 2 * 6 * STEPS, block  # 6 layers, every step, one program each way
    for key in ("loss_metrics/global_avg_loss", "grad_norm"):
        got = _series(reports[0], key)
        if key == "loss_metrics/global_avg_loss":
            got = [g / LOSS_SUMMED_OVER_RANKS for g in got]
        exact, f32 = refs["float64"][key], refs["float32"][key]
        for step, (g, e, f) in enumerate(zip(got, exact, f32)):
            allowed = 16 * abs(f - e) + 16 * EPS32 * max(abs(e), 1.0)
            assert abs(g - e) <= allowed, (f"step {step + 1} {key}: pjrt {g:.7g}, float64 {e:.7g}, "
                                           f"float32 {f:.7g}, allowed {allowed:.3g}")
