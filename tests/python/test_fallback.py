"""CPU fallback: counted, warned once per op, logged with the user's line, or forbidden."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

import torch_pjrt


def unlowered(x: torch.Tensor) -> torch.Tensor:
    return torch.special.airy_ai(x)  # no pjrt kernel: runs through the CPU fallback


def test_fallback_is_correct_and_counted(dev):
    x = torch.arange(5.0, device=dev)
    torch_pjrt.reset_metrics()
    y = unlowered(x)
    assert y.device == dev
    torch.testing.assert_close(y.cpu(), torch.special.airy_ai(torch.arange(5.0)))
    assert torch_pjrt.metrics()["fallbacks"].get("aten::special_airy_ai.out", 0) == 1
    assert "CPU fallbacks" in torch_pjrt.metrics_report()


def test_warns_once_per_op(dev):
    x = torch.arange(4.0, device=dev)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.special.modified_bessel_k0(x)
        torch.special.modified_bessel_k0(x)
    msgs = [str(w.message) for w in caught if "modified_bessel_k0" in str(w.message)]
    assert len(msgs) == 1 and "runs on the CPU" in msgs[0]


def test_error_mode_forbids(dev):
    x = torch.arange(4.0, device=dev)
    with torch_pjrt.fallback_mode("error"):
        with pytest.raises(NotImplementedError, match="aten::special_airy_ai.*TORCH_PJRT_FALLBACK=error"):
            unlowered(x)
        assert (x * 2).sum().item() == 12  # native ops still run
    torch.testing.assert_close(unlowered(x).cpu(), torch.special.airy_ai(torch.arange(4.0)))


def test_log_mode_names_the_users_line(dev, caplog):
    x = torch.arange(4.0, device=dev)
    with caplog.at_level(logging.WARNING, logger="torch_pjrt"):
        with torch_pjrt.fallback_mode("log"):
            unlowered(x)
            unlowered(x)
    records = [r.getMessage() for r in caplog.records if "airy_ai" in r.getMessage()]
    assert len(records) == 2
    assert "test_fallback.py" in records[0] and "torch.special.airy_ai(x)" in records[0]
