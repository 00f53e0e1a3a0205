"""Ray Train: workers train on pjrt, over the pjrt process group.

Ray picks a worker's torch device manager from the accelerators Ray scheduled for it
(GPU -> CUDA, HPU, NPU, TPU -> torch_tpu) and otherwise uses its CPU manager, and
TorchTrainer's process group is gloo unless a GPU or TPU was scheduled. A pjrt device
is none of those resources, so ``ray.train.torch.get_device()`` said ``cpu``,
``prepare_model`` left the model there and the workers trained on the CPU. These
patches make pjrt the device of a worker with no accelerator resource where pjrt is
this process's accelerator, and its process group ``cpu:gloo,<device>:pjrt``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from types import ModuleType
from typing import Any

import torch

from . import DEVICE, device_active, patch

TESTED = ("2.60.0", "2.61.0")
DEFAULT_BACKEND = f"cpu:gloo,{DEVICE}:pjrt"


def _device_module() -> Any:
    return getattr(torch, DEVICE)


@patch("ray.device_manager", "ray.air._internal.device_manager", "ray", TESTED,
       "a worker with no GPU/HPU/NPU/TPU resource gets Ray's CPU device manager: get_device() said 'cpu' and "
       "prepare_model() left the model on the CPU")
def _device_manager(managers: ModuleType) -> None:
    cpu_manager = managers.DEFAULT_TORCH_DEVICE_MANAGER_CLS

    class PjrtTorchDeviceManager(cpu_manager):  # type: ignore[misc, valid-type]
        """The worker's pjrt device: LOCAL_RANK modulo this process's device count (the CPU
        when pjrt is not this process's accelerator, as Ray's default manager does)."""

        def __init__(self) -> None:
            super().__init__()
            self.device = torch.device("cpu")
            if device_active():
                local_rank = int(os.environ.get("LOCAL_RANK", "0"))
                self.device = torch.device(DEVICE, local_rank % max(1, _device_module().device_count()))

        def get_devices(self) -> list[torch.device]:
            return [self.device]

        def set_device(self, device: torch.device | int | str | None) -> None:
            if device is not None and torch.device(device).type == DEVICE:
                _device_module().set_device(torch.device(device).index or 0)

        def get_stream_context(self, stream: Any) -> contextlib.AbstractContextManager[None]:
            return contextlib.nullcontext()

    PjrtTorchDeviceManager.__module__ = __name__
    managers.DEFAULT_TORCH_DEVICE_MANAGER_CLS = PjrtTorchDeviceManager  # read at each lookup
    globals()["PjrtTorchDeviceManager"] = PjrtTorchDeviceManager


@patch("ray.torch_backend", "ray.train.torch.config", "ray", TESTED,
       "TorchTrainer's process group is gloo unless a GPU or TPU was scheduled: DDP on pjrt tensors needs the "
       "pjrt backend")
def _torch_backend(config: ModuleType) -> None:
    cls = config._TorchBackend
    original = cls.on_start

    def on_start(self: Any, worker_group: Any, backend_config: Any) -> Any:
        resources = worker_group.get_resources_per_worker()
        if (backend_config.backend is None and not resources.get("GPU", 0) and not resources.get("TPU", 0)
                and device_active()):
            backend_config = dataclasses.replace(backend_config, backend=DEFAULT_BACKEND)
        return original(self, worker_group, backend_config)

    cls.on_start = on_start
