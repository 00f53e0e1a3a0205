"""Ranks as threads of one process, one pjrt device each (torch_pjrt.distributed.spawn and
python -m torch_pjrt.distributed.run), their collectives run as XLA programs over the
devices (the XLA transport): each scenario of dist_workers.py checks its values against
CPU gloo or single-device training, and no byte goes through the host."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
# The ranks' group timeout. Dynamo compiles one frame at a time in a process (its global
# compile lock), so under torch.compile the rank threads reach their first collective up to
# world - 1 compiles apart: on a loaded 2-core machine that passed 60 s (the landing CI of 191782a).
GROUP_TIMEOUT_S = "240"


def _threads(name: str, world: int, tmp_path: Path, timeout: float = 300,
             in_programs: bool = True) -> dict[str, Any]:
    out = tmp_path / f"{name}.json"
    env = dict(os.environ, TORCH_PJRT_CPU_DEVICES="8", DIST_TEST_TIMEOUT=GROUP_TIMEOUT_S, OMP_NUM_THREADS="1",
               TORCH_PJRT_DIST_IN_PROGRAMS="1" if in_programs else "0")
    proc = subprocess.run([sys.executable, str(HERE / "thread_ranks.py"), name, str(world), str(out)], cwd=HERE,
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    result = json.loads(out.read_text())
    assert len(result["reports"]) == world
    # Every collective, all-to-all with unequal splits and point to point included, ran on
    # the devices: no byte went through the host.
    assert set(result["transport"]["collectives"]) == {"xla"}, result["transport"]
    assert result["transport"]["host_bytes"] == 0, result["transport"]
    return result


def test_every_collective_matches_gloo_bit_for_bit_over_two_rank_threads(tmp_path: Path) -> None:
    result = _threads("collectives", 2, tmp_path)
    reports = result["reports"]
    assert len(reports[0]["checked"]) > 50, reports[0]["checked"]
    # its compiled graph holding a collective stayed one program
    assert all(r["compiled_eager_reasons"] == [] for r in reports), reports
    assert result["transport"]["in_programs"] > 0, result["transport"]
    assert all(r["processes"] is None for r in reports), reports  # one process: no client across processes


def test_with_collectives_kept_out_of_programs_a_compiled_graph_runs_eagerly_and_says_why(tmp_path: Path) -> None:
    reports = _threads("collectives", 2, tmp_path, in_programs=False)["reports"]
    reasons = reports[0]["compiled_eager_reasons"]
    assert reasons and all("TORCH_PJRT_DIST_IN_PROGRAMS=1" in why for why in reasons), reasons


@pytest.mark.parametrize("world", [2, 4])
def test_every_functional_collective_runs_inside_a_compiled_program(tmp_path: Path, world: int) -> None:
    result = _threads("compiled_collectives", world, tmp_path)
    # 8 collectives (the bool sum is an all-gather and a reduction) per call, 3 calls, per rank
    assert result["transport"]["in_programs"] == 3 * 8 * world, result["transport"]


def test_compiled_tensor_parallel_training_keeps_its_collectives_in_its_programs(tmp_path: Path) -> None:
    _threads("tensor_parallel_compiled", 4, tmp_path)


def test_compiled_simple_fsdp_keeps_its_gathers_and_reduce_scatters_in_its_programs(tmp_path: Path) -> None:
    _threads("simple_fsdp_compiled", 4, tmp_path)


@pytest.mark.parametrize("world", [4, 8])
def test_collectives_over_more_rank_threads_match_gloo(tmp_path: Path, world: int) -> None:
    reports = _threads("collectives_any_world", world, tmp_path)["reports"]
    assert all(r["transport"] == "xla" for r in reports), reports


def test_ddp_over_four_rank_threads_matches_single_device_training(tmp_path: Path) -> None:
    reports = _threads("ddp", 4, tmp_path)["reports"]
    assert all(r["transport"] == "xla" for r in reports), reports


def test_fsdp2_resharded_or_not_matches_single_device_training(tmp_path: Path) -> None:
    _threads("fsdp", 2, tmp_path)


def test_tensor_parallel_over_four_rank_threads_matches_single_device_training(tmp_path: Path) -> None:
    # (DTensor's shape propagation once mixed devices: the process-wide fake tensor cache
    # handed one rank's fake tensors to another, in forward and in the autograd threads)
    reports = _threads("tensor_parallel", 4, tmp_path)["reports"]
    assert len({r["max_rel_error"] for r in reports}) == 1, reports
    # DTensor's random-op tracker is one per rank thread, bound to the rank's own device
    # (shared, it drew from one rank's generator for all; a late rank skipped its seed broadcast)
    assert [r["rng_tracker_device"] for r in reports] == [f"pjrt:{rank}" for rank in range(4)], reports


def test_fsdp2_over_tensor_parallel_rows_matches_single_device_training(tmp_path: Path) -> None:
    # a (2, 2) mesh: tensor parallel within each row, FSDP2 across the rows
    _threads("fsdp_tp", 4, tmp_path)


def test_a_checkpoint_saved_by_four_rank_threads_loads_into_one(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIST_TEST_OUT", str(tmp_path))
    for mode, world in (("save", 4), ("load", 1)):
        monkeypatch.setenv("DIST_CKPT_MODE", mode)
        reports = _threads("checkpoint", world, tmp_path)["reports"]
        assert all(len(r["saved" if mode == "save" else "loaded"]) == 6 for r in reports), reports
    assert len(list((tmp_path / "ckpt").glob("*.distcp"))) == 4


def test_each_rank_thread_seeds_its_own_device_and_hears_the_cpu_generator_is_shared(tmp_path: Path) -> None:
    reports = _threads("rank_seeds", 4, tmp_path)["reports"]
    assert "seed torch differently" in reports[0]["warning"], reports[0]


def test_dtensor_manual_seed_draws_the_same_on_every_rank_thread(tmp_path: Path) -> None:
    reports = _threads("dtensor_manual_seed", 4, tmp_path)["reports"]
    assert [r["tracker_device"] for r in reports] == [f"pjrt:{rank}" for rank in range(4)], reports


def test_a_2d_mesh_splits_into_xla_subgroups(tmp_path: Path) -> None:
    reports = _threads("split_mesh", 4, tmp_path)["reports"]
    assert reports[1]["groups"] == [[1, 3], [0, 1]], reports[1]


def test_a_late_rank_still_launches_its_part_while_the_others_queue_work(tmp_path: Path) -> None:
    # (it once hung: a collective flushed every device, so the late rank waited on a graph
    # another rank held while its launch waited for the late rank's part)
    reports = _threads("a_late_rank", 4, tmp_path)["reports"]
    assert [r["value"] for r in reports] == [1.0] * 4, reports


def test_bad_input_raises_on_every_rank_thread_and_the_group_survives(tmp_path: Path) -> None:
    reports = _threads("bad_input", 2, tmp_path)["reports"]
    assert "rank 0 sent Float[10], this rank receives into Float[5]" in reports[1]["messages"]["recv size"]
    assert all(r["destroy_seconds"] < 5 for r in reports), reports  # an unanswered irecv does not hold it up


def test_a_receive_from_a_rank_that_left_fails_at_once(tmp_path: Path) -> None:
    report = _threads("recv_from_a_rank_that_left", 2, tmp_path)["reports"][0]
    assert report["seconds"] < 10, report  # not the group's timeout


def _failed_within(output: str, what: str, seconds: float) -> bool:
    """Whether `output` says "<what> N s" with N under `seconds` (the peers did not wait out
    the group's timeout)."""
    found = re.search(re.escape(what) + r" ([0-9.]+) s", output)
    return found is not None and float(found.group(1)) < seconds


def _rank_1_raises(scenario: str, world: int, tmp_path: Path, **env: str) -> str:
    """Runs a scenario in which rank 1 raises "rank 1 gives up" over `world` rank threads; returns
    its stderr, after checking that the run failed, with rank 1's error and every other rank's."""
    env = dict(os.environ, TORCH_PJRT_CPU_DEVICES=str(world), DIST_TEST_TIMEOUT=GROUP_TIMEOUT_S, **env)
    proc = subprocess.run([sys.executable, str(HERE / "thread_ranks.py"), scenario, str(world),
                           str(tmp_path / "out.json")], cwd=HERE, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and not (tmp_path / "out.json").exists()
    assert "rank 1 raised" in proc.stderr and "rank 1 gives up" in proc.stderr, proc.stderr[-3000:]
    for rank in set(range(world)) - {1}:
        assert f"rank {rank} raised" in proc.stderr, proc.stderr[-3000:]
    return proc.stderr


def test_a_rank_that_raises_fails_the_others_at_once(tmp_path: Path) -> None:
    stderr = _rank_1_raises("one_rank_raises", 2, tmp_path)
    assert _failed_within(stderr, "the collective failed after", 10), stderr[-3000:]  # not the group's timeout
    # the ranks' exception hooks (each init_process_group adds one) do not stack on the report
    assert "[rank0]: [rank1]" not in stderr and "[rank1]: [rank0]" not in stderr, stderr[-3000:]


def test_a_rank_that_raises_holding_a_device_mesh_fails_the_others_at_once(tmp_path: Path) -> None:
    # (the failed rank's mesh and DTensors kept its process group object alive: the others
    # waited out the group's timeout in their next collective until destroying the group
    # closed its connections)
    stderr = _rank_1_raises("one_rank_raises_holding_a_mesh", 4, tmp_path)
    assert _failed_within(stderr, "the collective failed after", 10), stderr[-3000:]


def test_a_rank_that_raises_before_a_compiled_step_fails_the_others_at_once(tmp_path: Path) -> None:
    # The compiled function's cache keeps rank 1's process group object alive after it is
    # destroyed: leaving the group must not wait for that object to go.
    stderr = _rank_1_raises("one_rank_raises_before_a_compiled_step", 2, tmp_path, TORCH_PJRT_DIST_IN_PROGRAMS="1")
    assert _failed_within(stderr, "the compiled step failed after", 10), stderr[-3000:]
    assert "whose process group is gone" in stderr, stderr[-3000:]


def test_the_launcher_runs_a_torchrun_script_once_per_rank_thread(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import os, sys, torch, torch.distributed as dist\n"
        "dist.init_process_group('pjrt')\n"
        "rank, local = int(os.environ['RANK']), int(os.environ['LOCAL_RANK'])\n"
        "x = torch.full((2,), float(rank + 1), device=f'pjrt:{local}')\n"
        "dist.all_reduce(x)\n"
        "print('rank', dist.get_rank(), 'of', os.environ['WORLD_SIZE'], 'args', sys.argv[1:], 'sum', x.cpu().tolist())\n"
        "dist.destroy_process_group()\n")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_PJRT_CPU_DEVICES"}
    proc = subprocess.run([sys.executable, "-m", "torch_pjrt.distributed.run", "--nproc-per-node", "3", str(script),
                           "--lr", "0.1"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("[rank"))
    assert lines == [f"[rank {r}] rank {r} of 3 args ['--lr', '0.1'] sum [6.0, 6.0]" for r in range(3)], proc.stdout


def test_spawn_refuses_more_ranks_than_devices() -> None:
    import torch_pjrt.distributed as pjrt_dist

    with pytest.raises(ValueError, match="ranks need as many .* devices in this process"):
        pjrt_dist.spawn(lambda rank: None, nprocs=64)
