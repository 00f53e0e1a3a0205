"""PyTorch itself: ``init_process_group()`` with no backend, and FlexAttention's
device check, on this device."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from . import DEVICE, patch


@patch("torch.init_process_group_default_backend", "torch.distributed.distributed_c10d", "torch",
       ("2.11.0", "2.15.0"),
       "with no backend named, torch picks the accelerator's default backend but marks the group's default "
       "as gloo (or nccl), so DDP's constructor fails ('Could not find backend type 1'); the group gets "
       f"'cpu:gloo,{DEVICE}:pjrt' instead, as it would name both for CUDA")
def _default_backend(c10d: ModuleType) -> None:
    original_init = c10d.BackendConfig.__init__

    def __init__(self: object, backend: object) -> None:  # noqa: N807
        if str(backend) == c10d.Backend.UNDEFINED and c10d.torch._C._get_accelerator().type == DEVICE:
            backend = c10d.Backend(f"cpu:gloo,{DEVICE}:{c10d.Backend.default_device_backend_map[DEVICE]}")
        original_init(self, backend)

    c10d.BackendConfig.__init__ = __init__


@patch("torch.flex_attention_device", "torch.nn.attention.flex_attention", "torch", ("2.11.0", "2.15.0"),
       "flex_attention refuses tensors on any device outside a fixed list (CUDA, CPU, XPU, HPU, MPS); on "
       f"{DEVICE} it runs as ordinary ops (eager) or inside the compiled program (backend='pjrt'), "
       "backward included")
def _flex_attention_device(flex: ModuleType) -> None:
    original = flex._validate_device

    def _validate_device(query: Any, key: Any, value: Any) -> None:
        if query.device.type != DEVICE:
            original(query, key, value)

    flex._validate_device = _validate_device
