"""Device registration, device module, accelerator API, memory stats, plugin errors."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

import torch_pjrt

PY = sys.executable


def run_py(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ)
    e.update(env)
    return subprocess.run([PY, "-c", code], capture_output=True, text=True, env=e, timeout=300)


def test_backend_is_renamed_and_module_registered():
    assert torch._C._get_privateuse1_backend_name() == "pjrt"
    assert torch.pjrt.is_available()
    assert torch.pjrt.device_count() == 1
    assert torch.pjrt.current_device() == 0


def test_generated_methods(dev):
    t = torch.ones(3).pjrt()
    assert t.device == dev and t.is_pjrt
    m = torch.nn.Linear(2, 2).pjrt()
    assert m.weight.device == dev


def test_accelerator_api(dev):
    assert torch.accelerator.current_accelerator() == torch.device("pjrt")
    assert torch.accelerator.device_count() == 1
    torch.accelerator.set_device_index(0)
    assert torch.accelerator.current_device_index() == 0
    x = torch.ones(4, device=dev) * 3
    torch.accelerator.synchronize()
    assert x.sum().item() == 12


def test_autoload_through_import_torch():
    r = run_py("import torch; t = torch.ones(2, device='pjrt'); print((t + 1).sum().item())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("4.0")


def test_a_build_for_another_torch_is_refused_and_autoload_only_warns(monkeypatch):
    import warnings

    import _torch_pjrt_autoload as autoload

    assert autoload.mismatch("2.13.0+cpu", "2.13.1+cu130") is None  # one minor release: one ABI
    message = autoload.mismatch("2.13.0+cpu", "2.14.1+cu130")
    assert message and "built against torch 2.13.0+cpu" in message and "Rebuild" in message
    assert autoload.build_mismatch() is None  # this checkout's build matches its torch
    monkeypatch.setattr(autoload, "build_mismatch", lambda: message)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        autoload.autoload()  # under `import torch`: a warning, never an exception
    assert any("the pjrt device is not registered" in str(w.message) for w in seen)


def test_device_name_override():
    r = run_py("import torch; t = torch.ones(2, device='tpu'); print(t.device)", TORCH_PJRT_DEVICE_NAME="tpu")
    assert r.returncode == 0, r.stderr
    assert "tpu:0" in r.stdout


def test_several_cpu_devices_and_copies_between_them():
    # Copies between devices are the plugin's device-to-device copies (no host round trip):
    # whole tensors, views, dtype changes, conj views, into a view of the destination.
    code = (
        "import torch, torch_pjrt\n"
        "print(torch.pjrt.device_count())\n"
        "a = torch.arange(4., device='pjrt:1')\n"
        "b = a.to('pjrt:0')\n"
        "print(a.device, b.device, (b * 2).cpu().tolist())\n"
        "cpu = torch.randn(6, 5, dtype=torch.float64)\n"
        "z = torch.randn(3, 2, dtype=torch.complex64)\n"
        "src, zsrc = cpu.to('pjrt:1'), z.to('pjrt:1')\n"
        "torch.pjrt.synchronize()\n"
        "before = torch_pjrt.metrics()\n"
        "moved = [src.to('pjrt:0'), src.t()[1:4, ::2].to('pjrt:0'), src.to('pjrt:0', torch.float32),\n"
        "         zsrc.conj().to('pjrt:0')]\n"
        "dst = torch.zeros(6, 5, dtype=torch.float64, device='pjrt:0')\n"
        "dst[1:3, ::2].copy_(src[4:, 1:4])\n"
        "torch.pjrt.synchronize()\n"
        "after = torch_pjrt.metrics()\n"
        "print(all(m.device == torch.device('pjrt:0') for m in moved + [dst]))\n"
        "want = [cpu, cpu.t()[1:4, ::2], cpu.float(), z.conj().resolve_conj()]\n"
        "print([torch.equal(m.cpu(), w) for m, w in zip(moved, want)])\n"
        "ref = torch.zeros(6, 5, dtype=torch.float64); ref[1:3, ::2] = cpu[4:, 1:4]\n"
        "print(torch.equal(dst.cpu(), ref))\n"
        "print(after['device_to_host_bytes'] - before['device_to_host_bytes'],\n"
        "      after['device_to_device_bytes'] - before['device_to_device_bytes'] > 0)\n"
    )
    r = run_py(code, TORCH_PJRT_CPU_DEVICES="2")
    assert r.returncode == 0, r.stderr
    out = r.stdout.split("\n")
    assert out[0] == "2"
    assert "pjrt:1 pjrt:0 [0.0, 2.0, 4.0, 6.0]" in out[1]
    assert out[2:6] == ["True", "[True, True, True, True]", "True", "0 True"], out


def test_missing_plugin_is_a_clear_python_error():
    code = (
        "import torch\n"
        "try:\n"
        "    torch.ones(1, device='pjrt')\n"
        "except RuntimeError as e:\n"
        "    print('ERR', e)\n"
    )
    r = run_py(code, TORCH_PJRT_PLUGIN="/nonexistent/plugin.so")
    assert r.returncode == 0, r.stderr
    assert "ERR" in r.stdout and "/nonexistent/plugin.so" in r.stdout
    r = run_py(code, TORCH_PJRT_PLUGIN="tpu")
    assert r.returncode == 0, r.stderr
    assert "libtpu" in r.stdout


def test_broken_plugin_file_is_an_error_not_an_abort(tmp_path):
    bogus = tmp_path / "bogus.so"
    bogus.write_bytes(b"not an ELF file")
    code = "import torch\ntry:\n    torch.ones(1, device='pjrt')\nexcept RuntimeError as e:\n    print('ERR', e)\n"
    r = run_py(code, TORCH_PJRT_PLUGIN=str(bogus))
    assert r.returncode == 0, r.stderr
    assert "cannot load PJRT plugin" in r.stdout


def test_memory_stats_track_allocations(dev):
    torch.pjrt.reset_peak_memory_stats()
    base = torch.pjrt.memory_allocated()
    x = torch.ones(1024, 256, device=dev)  # 1 MiB
    assert torch.pjrt.memory_allocated() - base == 1024 * 256 * 4
    assert torch.pjrt.max_memory_allocated() >= base + 1024 * 256 * 4
    assert torch.accelerator.memory_allocated() == torch.pjrt.memory_allocated()
    del x
    assert torch.pjrt.memory_allocated() == base
    assert torch.pjrt.max_memory_allocated() >= base + 1024 * 256 * 4
    torch.pjrt.reset_peak_memory_stats()
    assert torch.pjrt.max_memory_allocated() == base
    assert "allocated_bytes.all.current" in torch.pjrt.memory_stats()


def test_data_ptr_distinct_per_storage_and_device_from_ptr(dev):
    a = torch.ones(8, device=dev)
    b = torch.ones(8, device=dev)
    assert a.data_ptr() != b.data_ptr()
    assert a[2:].data_ptr() == a.data_ptr() + 8
    assert a.untyped_storage().data_ptr() == a.data_ptr()


def test_platform_info():
    info = torch_pjrt.platform()
    assert info["platform"] == "cpu"
    assert any(a.startswith("stablehlo_current_version=") for a in info["attributes"])


def test_import_torch_pjrt_before_torch():
    r = run_py("import torch_pjrt, torch; print(torch.ones(2, device='pjrt').sum().item())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("2.0")


def test_printing_needs_no_cpu_fallback(dev):
    with torch_pjrt.fallback_mode("error"):
        text = repr(torch.tensor([1.5, float("nan"), float("inf"), -2.0, 1e10], device=dev))
        repr(torch.arange(6, device=dev).reshape(2, 3))
        repr(torch.tensor([True, False], device=dev))
    assert "nan" in text and "inf" in text and "device='pjrt:0'" in text


def test_native_ops_come_from_the_dispatcher():
    ops = torch_pjrt.native_ops()
    assert "aten::mm" in ops and "aten::_foreach_add_.List" in ops
    assert not any(op.startswith("c10d::") for op in ops)
    assert len(ops) > 300


def test_accelerator_memory_and_events(dev):
    torch.accelerator.reset_peak_memory_stats()
    base = torch.accelerator.memory_allocated()
    x = torch.ones(1000, device=dev)
    assert torch.accelerator.memory_allocated() == base + 4000
    assert torch.accelerator.max_memory_allocated() >= base + 4000
    assert torch.accelerator.memory_stats()["allocated_bytes.all.current"] == base + 4000
    event = torch.Event(device="pjrt")
    y = x * 2
    event.record()
    event.synchronize()
    assert event.query()
    assert y.sum().item() == 2000
