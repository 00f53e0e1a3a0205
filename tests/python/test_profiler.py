"""torch.profiler on pjrt: ProfilerActivity.PrivateUse1 records the device's
programs (linked to the ATen ops that launched them), compiles, transfers and
syncs, in the chrome trace and in key_averages()."""

from __future__ import annotations

import json
import os
from typing import Any

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile

import torch_pjrt

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _trace(prof: Any, tmp_path: Any) -> list[dict[str, Any]]:
    path = os.path.join(tmp_path, "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        return json.load(f)["traceEvents"]


def test_a_training_step_shows_device_programs_and_transfers(dev: torch.device, tmp_path: Any) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16, device=dev)

    def step() -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    step()
    torch_pjrt.synchronize()
    with profile(activities=ACTIVITIES) as prof:
        loss = step()
        value = loss.item()  # a device->host transfer
        torch_pjrt.synchronize()
    assert value > 0
    events = _trace(prof, tmp_path)
    programs = [e for e in events if e.get("name", "").startswith("pjrt program:")]
    assert programs, sorted({e.get("name") for e in events})[:50]
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in programs)
    labels = " ".join(e["name"] for e in programs)
    if torch_pjrt.eager_mode() == "strict":  # one program per op: the step's matmuls are there by name
        assert "addmm" in labels or "mm" in labels, labels
    assert any(e.get("name", "").startswith("pjrt device->host") for e in events)
    assert any(e.get("name") == "pjrt synchronize" for e in events)
    # Device time is attributed to the ATen ops that launched the programs.
    device_us = sum(evt.self_device_time_total for evt in prof.key_averages())
    assert device_us > 0, prof.key_averages().table(row_limit=10)


def test_a_compile_is_an_event_on_the_host(dev: torch.device, tmp_path: Any) -> None:
    # A shape no run has used (the disk cache outlives processes): compiled inside the profile.
    rows = 1000 + int.from_bytes(os.urandom(3), "little") % 1_000_000
    x = torch.randn(rows, 3, device=dev)
    torch_pjrt.synchronize()
    with profile(activities=ACTIVITIES) as prof:
        y = (x * 3.25).sin().sum()
        torch_pjrt.synchronize()
    assert torch.isfinite(y.cpu())
    events = _trace(prof, tmp_path)
    compiles = [e for e in events if e.get("name") == "pjrt compile"]
    assert compiles and all(e["dur"] > 0 for e in compiles), sorted({e.get("name") for e in events})[:50]


def test_cpu_only_profiling_records_no_device_events(dev: torch.device, tmp_path: Any) -> None:
    x = torch.randn(8, 8, device=dev)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        (x + 1).sum().cpu()
    assert not [e for e in _trace(prof, tmp_path) if e.get("name", "").startswith("pjrt program:")]
