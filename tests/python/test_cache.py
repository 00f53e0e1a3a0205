"""Compile cache: scalars never recompile; the disk tier warms a second process."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import torch

import torch_pjrt

PY = sys.executable


def test_scalar_loop_compiles_a_bounded_number_of_times(dev):
    x = torch.ones(16, device=dev)
    x = x * 0.9 + 0  # warm the programs once
    torch_pjrt.reset_metrics()
    for i in range(1000):
        x = x * 0.9 + i
    value = x.cpu()
    m = torch_pjrt.metrics()
    assert m["compiles"] <= 2, m["compiles_by_op"]
    assert m["executions"] >= 2000
    expected = torch.ones(16)
    for i in range(1000):
        expected = expected * 0.9 + i
    torch.testing.assert_close(value, expected)


def test_slicing_at_many_offsets_does_not_recompile(dev):
    x = torch.arange(1000.0, device=dev)
    _ = x[3:13] * 2
    torch_pjrt.reset_metrics()
    total = sum(float((x[i:i + 10] * 2).sum().item()) for i in range(100))
    assert torch_pjrt.metrics()["compiles"] <= 1
    assert total == sum(2 * sum(range(i, i + 10)) for i in range(100))


CHILD = """
import json, torch, torch_pjrt
x = torch.arange(12.0, device="pjrt").reshape(3, 4)
y = (x.t() @ x).softmax(-1).sum(0)
v = y.cpu().tolist()
m = torch_pjrt.metrics()
print(json.dumps({"compiles": m["compiles"], "disk_hits": m["disk_cache_hits"],
                  "rejects": m["disk_cache_rejects"], "value": v}))
"""


def run_child(cache_dir: str) -> dict:
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=cache_dir)
    r = subprocess.run([PY, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_disk_cache_hit_in_second_process_and_corruption_recompiles(tmp_path):
    cache = str(tmp_path / "cache")
    cold = run_child(cache)
    assert cold["compiles"] > 0 and cold["disk_hits"] == 0
    entries = glob.glob(os.path.join(cache, "*.pjrtexe"))
    assert len(entries) == cold["compiles"]
    warm = run_child(cache)
    assert warm["compiles"] == 0 and warm["disk_hits"] == cold["compiles"]
    assert warm["value"] == cold["value"]
    # Corrupt one entry and truncate another: both are recompiled, never loaded.
    with open(entries[0], "r+b") as f:
        f.seek(-10, os.SEEK_END)
        f.write(b"\x00garbage!\x00")
    with open(entries[1], "r+b") as f:
        f.truncate(30)
    again = run_child(cache)
    assert again["compiles"] == 2 and again["rejects"] == 2
    assert again["value"] == cold["value"]
    # The recompiled entries were rewritten whole.
    assert run_child(cache)["compiles"] == 0


def test_disk_cache_can_be_disabled(tmp_path):
    result = run_child("off")
    assert result["disk_hits"] == 0 and result["compiles"] > 0
    assert not os.path.exists("off")


def test_concurrent_processes_share_a_cache_dir(tmp_path):
    cache = str(tmp_path / "shared")
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=cache)
    procs = [subprocess.Popen([PY, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    values = {json.dumps(json.loads(o[0].strip().splitlines()[-1])["value"]) for o in outs}
    assert len(values) == 1
    assert not glob.glob(os.path.join(cache, "*.tmp.*"))  # no half-written entries left behind
    assert run_child(cache)["compiles"] == 0
