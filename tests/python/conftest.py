from __future__ import annotations

import os
import sys

import pytest
import torch

import torch_pjrt  # noqa: F401  (registers the device)
from torch_pjrt.tools.conformance.settings import TOLERANCES

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))

DEV = torch.device("pjrt", 0)
# The mode this run tests (scripts/test.sh runs a second pass with TORCH_PJRT_EAGER_MODE=fused).
SESSION_MODE = torch_pjrt.eager_mode()
# Tolerances per dtype, stated once (shared with the OpInfo conformance harness).
TOL = {dtype: dict(rtol=t.rtol, atol=t.atol) for dtype, t in TOLERANCES.items()}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, **kw: float) -> None:
    assert actual.device.type == "pjrt", f"result is on {actual.device}, not on the pjrt device"
    tol = dict(TOL.get(expected.dtype, dict(rtol=0, atol=0)), equal_nan=True)
    tol.update(kw)
    torch.testing.assert_close(actual.cpu(), expected, **tol)


@pytest.fixture
def dev() -> torch.device:
    return DEV


@pytest.fixture
def fresh_dynamo():
    """A test of compiled code: Dynamo's caches and pjrt's metrics start empty, and the
    test's compiled functions are forgotten after it."""
    torch._dynamo.reset()
    torch_pjrt.reset_metrics()
    yield
    torch._dynamo.reset()


def compiled_stats() -> dict:
    """The statistics of the one function compiled since the metrics were reset."""
    compiled = torch_pjrt.metrics()["compiled"]
    assert len(compiled) == 1, compiled
    return next(iter(compiled.values()))


@pytest.fixture(autouse=True)
def _reset_modes():
    yield
    torch_pjrt.set_eager_mode(SESSION_MODE)
    torch_pjrt.set_fallback_mode("warn")
    for index in range(torch_pjrt.device_module.device_count()):  # (errors a test left behind on any device)
        try:
            torch_pjrt.synchronize(index)
        except Exception:
            pass
