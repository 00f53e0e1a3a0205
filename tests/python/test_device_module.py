"""torch.pjrt, the device module, against torch.cuda's documented meanings for what
libraries call (transformers, accelerate, torchtitan, torch.utils.checkpoint):
device description, memory figures and statistics, initialization, RNG state
around activation checkpointing, pinned host memory, and a renamed device."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.utils.checkpoint

import torch_pjrt

DEV = torch_pjrt.DEVICE_NAME
mod = getattr(torch, DEV)
CPU_PLUGIN = torch_pjrt.platform()["platform"] in ("cpu", "host")


def _meminfo(field: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            name, value = line.split(":", 1)
            if name == field:
                return int(value.split()[0]) * 1024
    raise KeyError(field)


def test_initialized_as_torch_cuda() -> None:
    torch.ones(1, device=DEV)
    assert mod._initialized is True and mod.is_initialized()


def test_device_description() -> None:
    props = mod.get_device_properties(0)
    assert props.name == mod.get_device_name(0) == mod.get_device_name() == torch_pjrt._C._device_kind(0)
    assert props.type == torch_pjrt.platform()["platform"]
    assert mod.get_device_capability(0) == (props.major, props.minor)
    assert props.total_memory == mod.mem_get_info(0)[1] > 0
    assert props.multi_processor_count > 0
    if CPU_PLUGIN:  # the CPU plugin's device is the host
        assert props.is_integrated and props.multi_processor_count == os.cpu_count()
    with pytest.raises(ValueError, match="invalid device index"):
        mod.get_device_properties(mod.device_count())


def test_memory_info_is_the_plugins_or_the_hosts() -> None:
    free, total = mod.mem_get_info()
    assert (free, total)[1] == torch.accelerator.get_memory_info(0)[1]
    assert 0 < free <= total
    if CPU_PLUGIN:
        assert total == _meminfo("MemTotal")
        # MemAvailable moves with the machine: the same reading within a GiB.
        assert abs(free - _meminfo("MemAvailable")) < 2**30


# torch.cuda.memory_stats' documented families, pools and metrics.
FAMILIES = ["allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
            "active_bytes", "inactive_split_bytes", "requested_bytes"]
COUNTERS = ["num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free"]


def test_memory_stats_have_torch_cudas_keys_and_meanings() -> None:
    torch.pjrt.synchronize() if DEV == "pjrt" else mod.synchronize()
    stats = mod.memory_stats()
    for family in FAMILIES:
        for pool in ("all", "large_pool", "small_pool"):
            for metric in ("current", "peak", "allocated", "freed"):
                assert f"{family}.{pool}.{metric}" in stats, f"{family}.{pool}.{metric}"
    for key in COUNTERS:
        assert key in stats, key
    before = mod.memory_allocated()
    mod.reset_peak_memory_stats()
    x = torch.empty(1 << 20, device=DEV).fill_(1.0)  # 4 MiB
    mod.synchronize()
    grown = mod.memory_allocated() - before
    assert grown >= 4 << 20, grown
    assert mod.memory_reserved() >= mod.memory_allocated()
    assert mod.memory_stats()["active_bytes.all.peak"] >= before + (4 << 20)
    assert mod.memory_stats()["allocated_bytes.all.allocated"] >= 4 << 20
    freed_before = mod.memory_stats()["allocated_bytes.all.freed"]
    del x
    mod.synchronize()
    assert mod.memory_allocated() <= before
    assert mod.max_memory_allocated() >= before + (4 << 20)
    assert mod.max_memory_reserved() >= mod.max_memory_allocated()
    assert mod.memory_stats()["allocated_bytes.all.freed"] >= freed_before + (4 << 20)
    mod.reset_max_memory_allocated()
    assert mod.max_memory_allocated() == mod.memory_allocated()
    mod.reset_accumulated_memory_stats()
    stats = mod.memory_stats()
    assert stats["allocated_bytes.all.freed"] == 0
    assert stats["allocated_bytes.all.allocated"] == stats["allocated_bytes.all.current"]
    mod.empty_cache()


def test_bf16_is_supported() -> None:
    assert mod.is_bf16_supported()
    a = torch.randn(8, 8)
    got = (a.to(DEV, torch.bfloat16) @ a.to(DEV, torch.bfloat16)).cpu()
    assert got.dtype == torch.bfloat16 and torch.isfinite(got.float()).all()


class _DropoutNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Dropout(0.5), torch.nn.GELU(),
                                         torch.nn.Linear(64, 32), torch.nn.Dropout(0.5))
        self.head = torch.nn.Linear(32, 1)

    def forward(self, x: torch.Tensor, checkpointed: bool, **kwargs: object) -> torch.Tensor:
        h = torch.utils.checkpoint.checkpoint(self.inner, x, **kwargs) if checkpointed else self.inner(x)
        return self.head(h).sum()


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_recomputes_the_same_dropout(use_reentrant: bool) -> None:
    """The recomputed forward must draw the dropout masks the first one drew: checkpoint saves
    and restores the device's RNG state (it reads `_initialized` to decide)."""
    torch.manual_seed(0)
    net = _DropoutNet().to(DEV)
    x = torch.randn(16, 32).to(DEV).requires_grad_()  # reentrant checkpoint needs an input that does

    def grads(checkpointed: bool, **kwargs: object) -> list[torch.Tensor]:
        net.zero_grad()
        mod.manual_seed(123)
        net(x, checkpointed, **kwargs).backward()
        return [p.grad.cpu() for p in net.parameters()]

    plain = grads(False)
    for got, want in zip(grads(True, use_reentrant=use_reentrant), plain):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    # Without the RNG state restored the recomputation draws other masks: the check above can fail.
    unrestored = grads(True, use_reentrant=use_reentrant, preserve_rng_state=False)
    assert any(not torch.equal(a, b) for a, b in zip(unrestored, plain))


def test_pinned_host_memory() -> None:
    x = torch.randn(1000).pin_memory()
    assert x.is_pinned() and x[100:].is_pinned() and not torch.randn(10).is_pinned()
    assert torch.equal(x.to(DEV, non_blocking=True).cpu(), x)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(8.0)), batch_size=4,
                                         pin_memory=True)
    assert all(b.is_pinned() for (b,) in loader)


RENAMED = textwrap.dedent("""
    import os, torch, torch_pjrt
    import torch.nn.functional as F
    assert torch_pjrt.DEVICE_NAME == "tpu" and torch.tpu.device_count() >= 1
    x = torch.randn(4, 8)
    w = torch.randn(8, 3)
    t = x.to("tpu")
    assert t.device.type == "tpu" and torch.tpu.get_device_name()
    compiled = torch.compile(lambda a, b: F.gelu(a @ b), backend="pjrt")
    torch.testing.assert_close(compiled(t, w.to("tpu")).cpu(), F.gelu(x @ w), rtol=1e-5, atol=1e-5)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        assert (t @ w.to("tpu")).dtype == torch.bfloat16
    try:
        t + torch.randn(4, 8)
    except RuntimeError as e:
        message = str(e)
    assert "tpu" in message and "pjrt" not in message, message
    print("ok")
""")


def test_renamed_device_works_in_one_process() -> None:
    env = dict(os.environ, TORCH_PJRT_DEVICE_NAME="tpu")
    out = subprocess.run([sys.executable, "-c", RENAMED], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
