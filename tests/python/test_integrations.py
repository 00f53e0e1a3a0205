"""torch_pjrt.integrations: patches are applied when their module is imported, only
to the versions they were tested with, and also when the library was imported
before torch (and so before torch_pjrt)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torch_pjrt import integrations


def test_every_patch_is_named_explained_and_version_guarded() -> None:
    names = [p.name for p in integrations.patches()]
    assert len(names) == len(set(names))
    for p in integrations.patches():
        assert p.reason and p.module and p.distribution, p
        assert integrations._version_key(p.tested[0]) < integrations._version_key(p.tested[1]), p


def test_installed_libraries_are_patched_on_import() -> None:
    import accelerate.accelerator  # noqa: F401
    import transformers.training_args  # noqa: F401

    applied = integrations.applied()
    for name in ("accelerate.default_device", "accelerate.distributed_type", "accelerate.set_device",
                 "accelerate.ddp_device_ids", "accelerate.max_memory", "transformers.bf16_available",
                 "transformers.setup_devices", "torch.init_process_group_default_backend"):
        assert name in applied, (name, integrations.skipped())


def test_a_version_outside_the_tested_range_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "pjrt_fake_library.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls = []
    integrations.patch("test.fake", "pjrt_fake_library", "pytest", ("0.0.1", "0.0.2"),
                       "a test patch")(lambda module: calls.append(module))
    try:
        import pjrt_fake_library  # noqa: F401
    finally:
        integrations._PATCHES[:] = [p for p in integrations._PATCHES if p.name != "test.fake"]
    assert calls == [] and "test.fake" not in integrations.applied()
    assert "outside the versions" in integrations.skipped()["test.fake"]
    assert "not applying test.fake" in caplog.text


def test_library_imported_before_torch_is_patched() -> None:
    """`import accelerate` first: it imports torch, which loads torch_pjrt while
    accelerate.accelerator is still being imported."""
    script = textwrap.dedent("""
        import accelerate
        from accelerate import Accelerator
        import torch_pjrt.integrations as i
        acc = Accelerator()
        assert acc.device.type == "pjrt", acc.device
        assert "accelerate.ddp_device_ids" in i.applied(), (i.applied(), i.skipped())
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if k != "TORCH_PJRT_DEVICE_NAME"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
