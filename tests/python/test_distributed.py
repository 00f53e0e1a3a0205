"""torch.distributed on pjrt, with real processes: each test starts 2 ranks of
tests/python/dist_workers.py with the env:// variables torchrun sets (a TCP
store on 127.0.0.1), and reads what each rank reported. The ranks compare
pjrt against CPU (gloo, or a single-process float64 run) themselves."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

import torch_pjrt

WORKER = os.path.join(os.path.dirname(__file__), "dist_workers.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log(tmp_path: Any, rank: int) -> str:
    with open(os.path.join(tmp_path, f"rank{rank}.log"), "rb") as f:
        return f.read().decode(errors="replace")


def run_ranks(name: str, tmp_path: Any, world: int = 2, limit: float = 240, env: dict[str, str] | None = None,
              kill_after: float | None = None) -> list[dict[str, Any]]:
    """Starts `world` ranks of scenario `name`; returns each rank's report. A
    rank still running after `kill_after` seconds (one told to hang) is killed."""
    port = _free_port()
    procs = []
    for rank in range(world):
        rank_env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                        LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                        OMP_NUM_THREADS="1", **(env or {}))
        # Each rank writes to a file: with pipes, a rank that logs a lot (XLA's loader does, on
        # some CPUs) blocks on a full pipe no one drains while its peer waits in a collective.
        log = open(os.path.join(tmp_path, f"rank{rank}.log"), "wb")
        procs.append(subprocess.Popen([sys.executable, WORKER, name, str(tmp_path)], env=rank_env,
                                      stdout=log, stderr=subprocess.STDOUT))
        log.close()
    deadline = time.monotonic() + limit
    outputs = []
    for rank, p in enumerate(procs):
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            if kill_after is None:
                pytest.fail(f"rank {rank} of {name} did not finish in {limit} s:\n{_log(tmp_path, rank)[-3000:]}")
        outputs.append(_log(tmp_path, rank))
    reports = []
    for rank in range(world):
        path = os.path.join(tmp_path, f"rank{rank}.json")
        if os.path.exists(path):
            with open(path) as f:
                reports.append(json.load(f))
        else:
            reports.append({"ok": None, "output": outputs[rank][-3000:]})
    return reports


def assert_ok(reports: list[dict[str, Any]]) -> None:
    for rank, r in enumerate(reports):
        assert r["ok"], f"rank {rank}: {r.get('error') or r.get('output')}"


def test_backend_is_registered() -> None:
    assert "pjrt" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map.get("pjrt") == "pjrt"


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_every_collective_matches_gloo_on_cpu(tmp_path: Any, mode: str) -> None:
    reports = run_ranks("collectives", tmp_path, env={"TORCH_PJRT_EAGER_MODE": mode})
    assert_ok(reports)
    assert len(reports[0]["checked"]) > 50, reports[0]["checked"]
    # A compiled graph holding a collective runs eagerly, and says why.
    assert any("collective" in why for why in reports[0]["compiled_eager_reasons"]), reports[0]
    # The group asked the plugin for one client over both processes (node_id/num_nodes, the
    # key-value exchange through the group's store); XLA's CPU plugin takes the options
    # and still makes a client of this process's device only, and that is what is reported.
    for r in reports:
        processes = r["processes"]
        assert processes["spanned"] == 1 and processes["of"] == 2, processes
        assert "holds only this process's 1 device" in processes["why_not"], processes


def test_bad_input_raises_on_every_rank_and_the_group_survives(tmp_path: Any) -> None:
    reports = run_ranks("bad_input", tmp_path)
    assert_ok(reports)
    assert "recv size" in reports[1]["messages"]
    assert all(r["destroy_seconds"] < 10 for r in reports), reports  # not the group's 60 s timeout


def test_a_rank_that_dies_makes_the_others_raise(tmp_path: Any) -> None:
    reports = run_ranks("peer_dies", tmp_path, env={"DIST_TEST_TIMEOUT": "10"})
    assert reports[0]["ok"], reports[0]
    assert reports[0]["seconds"] < 10 + 5, reports[0]


def test_a_rank_that_stops_answering_times_out(tmp_path: Any) -> None:
    reports = run_ranks("peer_hangs", tmp_path, env={"DIST_TEST_TIMEOUT": "4"}, limit=24, kill_after=24)
    assert reports[0]["ok"], reports[0]
    assert 3 < reports[0]["seconds"] < 4 + 10, reports[0]


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_ddp_matches_single_process_training(tmp_path: Any, mode: str) -> None:
    reports = run_ranks("ddp", tmp_path, env={"TORCH_PJRT_EAGER_MODE": mode})
    assert_ok(reports)
    assert reports[0]["mode"] == mode and reports[0]["transport"] == "host (gloo)", reports[0]


def test_renamed_device_trains_with_ddp(tmp_path: Any) -> None:
    """TORCH_PJRT_DEVICE_NAME=tpu: init_process_group() with no backend, DDP, and the "tpu_dist" alias."""
    assert_ok(run_ranks("renamed_device", tmp_path, env={"TORCH_PJRT_DEVICE_NAME": "tpu"}))


@pytest.mark.parametrize("stack", ["trainer", "accelerate"])
def test_hugging_face_ddp_matches_full_batch_training(tmp_path: Any, stack: str) -> None:
    """Unmodified Trainer / accelerate loop under torchrun's variables: DDP over pjrt, ranks identical."""
    reports = run_ranks(f"{stack}_ddp", tmp_path, limit=300)
    assert_ok(reports)


def test_fsdp2_matches_single_process_training(tmp_path: Any) -> None:
    assert_ok(run_ranks("fsdp", tmp_path))


def test_tensor_parallel_matches_single_process_training(tmp_path: Any) -> None:
    assert_ok(run_ranks("tensor_parallel", tmp_path))


def test_uneven_shards_of_a_2d_mesh_gather_whole_on_every_rank(tmp_path: Any) -> None:
    assert_ok(run_ranks("uneven_2d_redistribute", tmp_path, world=4))


def test_a_device_mesh_splits_a_group_made_with_a_device_id(tmp_path: Any) -> None:
    reports = run_ranks("split_mesh", tmp_path, world=4)
    assert_ok(reports)
    assert reports[1]["groups"] == [[1, 3], [0, 1]], reports[1]


def test_distributed_checkpoint_reloads_into_another_world_size(tmp_path: Any) -> None:
    assert_ok(run_ranks("checkpoint", tmp_path, env={"DIST_CKPT_MODE": "save"}))
    for f in ("rank0.json", "rank1.json"):
        os.remove(os.path.join(tmp_path, f))
    assert_ok(run_ranks("checkpoint", tmp_path, world=1, env={"DIST_CKPT_MODE": "load"}))


def test_streams_and_events_follow_submission_order(dev: torch.device) -> None:
    s = torch.pjrt.Stream(priority=-1)
    x = torch.randn(64, 64, device=dev)
    with torch.pjrt.stream(s):
        y = x @ x
    torch.pjrt.current_stream().wait_stream(s)
    e = torch.pjrt.Event()
    e.record()
    e.synchronize()
    assert e.query()
    y.record_stream(s)
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu(), rtol=1e-4, atol=1e-4)
    assert torch_pjrt.device_module.current_stream().device.type == "pjrt"


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_example_trains_under_torchrun(strategy: str) -> None:
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_distributed.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", example,
           "--strategy", strategy, "--steps", "11", "--warmup", "2", "--layers", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    losses = [float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("step")]
    assert len(losses) == 3 and losses[-1] < 0.7 * losses[0], done.stdout
    assert f"{strategy}, 2 ranks" in done.stdout and "tokens/s" in done.stdout, done.stdout
