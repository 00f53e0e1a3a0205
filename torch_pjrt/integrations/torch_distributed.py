"""torch.distributed: ``init_process_group()`` with no backend on this device."""

from __future__ import annotations

from types import ModuleType

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
