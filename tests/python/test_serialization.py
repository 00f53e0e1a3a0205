"""torch.save / torch.load of device tensors and module state: values, dtypes, views,
shared storage, and every map_location (cpu, pjrt, and the saved location)."""

from __future__ import annotations

import io

import pytest
import torch
from models import TinyTransformer

import torch_pjrt

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool]
MAP_LOCATIONS = {"default": None, "cpu": "cpu", "pjrt": "pjrt", "device": torch.device("pjrt", 0)}


def sample(dtype: torch.dtype, shape=(4, 6)) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=g, dtype=dtype)


def roundtrip(obj, map_location):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, map_location=map_location, weights_only=True)


def expected_device(map_location) -> str:
    return "cpu" if map_location == "cpu" else "pjrt"


@pytest.mark.parametrize("where", list(MAP_LOCATIONS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tensor_roundtrip(dtype, where):
    ref = sample(dtype)
    with torch_pjrt.fallback_mode("error"):
        loaded = roundtrip(ref.to("pjrt"), MAP_LOCATIONS[where])
    assert loaded.device.type == expected_device(MAP_LOCATIONS[where])
    assert loaded.dtype == dtype and loaded.shape == ref.shape
    assert torch.equal(loaded.cpu(), ref)


@pytest.mark.parametrize("where", list(MAP_LOCATIONS))
def test_views_and_shared_storage_roundtrip(where):
    base_cpu = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    base = base_cpu.to("pjrt")
    views = {
        "base": base,
        "row": base[2],                      # storage offset
        "transposed": base.t(),              # permuted strides
        "strided": base[1::2, ::3],          # non-contiguous, offset
        "diag": base.diagonal(),
        "expanded": base[0, :1].expand(3, 4),  # zero stride
    }
    expected = {"base": base_cpu, "row": base_cpu[2], "transposed": base_cpu.t(), "strided": base_cpu[1::2, ::3],
                "diag": base_cpu.diagonal(), "expanded": base_cpu[0, :1].expand(3, 4)}
    with torch_pjrt.fallback_mode("error"):
        loaded = roundtrip(views, MAP_LOCATIONS[where])
        for name, t in loaded.items():
            assert t.device.type == expected_device(MAP_LOCATIONS[where]), name
            assert t.shape == expected[name].shape and t.stride() == expected[name].stride(), name
            assert t.storage_offset() == expected[name].storage_offset(), name
            assert torch.equal(t.cpu(), expected[name]), name
        # One storage was saved, so the loaded views alias each other again.
        ptr = loaded["base"].untyped_storage().data_ptr()
        assert all(t.untyped_storage().data_ptr() == ptr for t in loaded.values())
        loaded["base"][2, 0] = -1.0
        assert loaded["row"][0].item() == -1.0 and loaded["transposed"][0, 2].item() == -1.0
        # The originals are untouched.
        assert base[2, 0].item() == 16.0


def test_saved_view_keeps_whole_storage():
    base = torch.arange(10, dtype=torch.int64).to("pjrt")
    view = base[3:5]
    with torch_pjrt.fallback_mode("error"):
        loaded = roundtrip(view, "pjrt")
        assert loaded.storage_offset() == 3 and loaded.untyped_storage().nbytes() == 10 * 8
        assert loaded.tolist() == [3, 4]


@pytest.mark.parametrize("where", list(MAP_LOCATIONS))
def test_state_dict_roundtrip(where):
    torch.manual_seed(0)
    cpu_model = TinyTransformer(vocab=32, dim=16, heads=2, layers=1, seq=8)
    cpu_model.register_buffer("steps", torch.tensor(7, dtype=torch.int64))
    dev_model = TinyTransformer(vocab=32, dim=16, heads=2, layers=1, seq=8)
    dev_model.register_buffer("steps", torch.tensor(0, dtype=torch.int64))
    dev_model.load_state_dict(cpu_model.state_dict())
    dev_model.to("pjrt")
    with torch_pjrt.fallback_mode("error"):
        state = roundtrip(dev_model.state_dict(), MAP_LOCATIONS[where])
        assert state.keys() == cpu_model.state_dict().keys()
        for name, t in state.items():
            assert t.device.type == expected_device(MAP_LOCATIONS[where]), name
            assert torch.equal(t.cpu(), cpu_model.state_dict()[name]), name
        # Load into a fresh model on the device and compare outputs with the CPU model.
        fresh = TinyTransformer(vocab=32, dim=16, heads=2, layers=1, seq=8)
        fresh.register_buffer("steps", torch.tensor(0, dtype=torch.int64))
        fresh = fresh.to("pjrt")
        fresh.load_state_dict(state)
        assert fresh.steps.device.type == "pjrt" and fresh.steps.item() == 7
        x = torch.randint(0, 32, (2, 8))
        with torch.no_grad():
            torch.testing.assert_close(fresh(x.to("pjrt")).cpu(), cpu_model(x), rtol=1e-5, atol=1e-5)


def test_optimizer_state_roundtrip():
    """AdamW state (step counts, moments) saved from the device resumes identically."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).to("pjrt")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(16, 8).to("pjrt")
    for _ in range(3):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, map_location="pjrt", weights_only=True)
    clone = torch.nn.Linear(8, 4).to("pjrt")
    clone.load_state_dict(ckpt["model"])
    opt2 = torch.optim.AdamW(clone.parameters(), lr=1e-2)
    opt2.load_state_dict(ckpt["opt"])
    for m, o in ((model, opt), (clone, opt2)):
        o.zero_grad()
        m(x).pow(2).mean().backward()
        o.step()
    for a, b in zip(model.parameters(), clone.parameters()):
        # Bit-identical in strict mode; fused mode may fuse the two steps' programs
        # differently (XLA contracts multiply-adds inside a fusion), a last-bit matter.
        torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), rtol=2e-6, atol=1e-7)
        if torch_pjrt.eager_mode() == "strict":
            assert torch.equal(a.detach().cpu(), b.detach().cpu())


def test_load_cpu_checkpoint_onto_device():
    ref = {"w": torch.randn(3, 5), "i": torch.arange(4, dtype=torch.int32), "flag": torch.tensor([True, False])}
    with torch_pjrt.fallback_mode("error"):
        loaded = roundtrip(ref, "pjrt")
        for k, t in loaded.items():
            assert t.device.type == "pjrt" and torch.equal(t.cpu(), ref[k]), k
