"""Ray Train: workers train on pjrt, over the pjrt process group.

Ray picks a worker's torch device manager from the accelerators Ray scheduled for it
(GPU -> CUDA, HPU, NPU, TPU -> torch_tpu) and otherwise uses its CPU manager, and
TorchTrainer's process group is gloo unless a GPU or TPU was scheduled. A pjrt device
is none of those resources, so ``ray.train.torch.get_device()`` said ``cpu``,
``prepare_model`` left the model there and the workers trained on the CPU. These
patches make pjrt the device of a worker with no accelerator resource where pjrt is
this process's accelerator, and its process group ``cpu:gloo,<device>:pjrt`` (Ray Train's
v2 TorchTrainer, the default in Ray 2.60; the v1 trainer is untested).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from types import ModuleType
from typing import Any

import torch

from . import DEFAULT_BACKEND, DEVICE, device_active, device_module, patch

TESTED = ("2.60.0", "2.61.0")


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
                self.device = torch.device(DEVICE, local_rank % max(1, device_module().device_count()))

        def get_devices(self) -> list[torch.device]:
            return [self.device]

        def set_device(self, device: torch.device | int | str | None) -> None:
            if device is not None and torch.device(device).type == DEVICE:
                device_module().set_device(torch.device(device).index or 0)

        def get_stream_context(self, stream: Any) -> contextlib.AbstractContextManager[None]:
            return contextlib.nullcontext()

    PjrtTorchDeviceManager.__module__ = __name__
    managers.DEFAULT_TORCH_DEVICE_MANAGER_CLS = PjrtTorchDeviceManager  # read at each lookup
    globals()["PjrtTorchDeviceManager"] = PjrtTorchDeviceManager
    by_type = managers.get_torch_device_manager_by_device_type

    def get_torch_device_manager_by_device_type(device_type: str) -> Any:
        return PjrtTorchDeviceManager() if device_type == DEVICE else by_type(device_type)

    managers.get_torch_device_manager_by_device_type = get_torch_device_manager_by_device_type


@patch("ray.device_manager_by_type", "ray.train.torch.train_loop_utils", "ray", TESTED,
       "prepare_data_loader asks for a device manager by the device's type, which raised "
       "'Device type pjrt cannot be recognized' (this module holds its own reference to the lookup)")
def _device_manager_by_type(loop_utils: ModuleType) -> None:
    import ray.air._internal.device_manager as managers

    loop_utils.get_torch_device_manager_by_device_type = managers.get_torch_device_manager_by_device_type


@patch("ray.torch_backend", "ray.train.v2.torch.torch_trainer", "ray", TESTED,
       "TorchTrainer sets the process group to gloo unless use_gpu or use_tpu: DDP on pjrt tensors failed with "
       "'No backend type associated with device type pjrt'")
def _torch_backend(trainer: ModuleType) -> None:
    cls = trainer.TorchTrainer
    original = cls.__init__

    def __init__(self: Any, train_loop_per_worker: Any, *, torch_config: Any = None, scaling_config: Any = None,
                 **kwargs: Any) -> None:
        accelerated = scaling_config is not None and (scaling_config.use_gpu or getattr(scaling_config, "use_tpu", False))
        if (torch_config is None or not torch_config.backend) and not accelerated and device_active():
            from ray.train.torch.config import TorchConfig

            torch_config = dataclasses.replace(torch_config or TorchConfig(), backend=DEFAULT_BACKEND)
        original(self, train_loop_per_worker, torch_config=torch_config, scaling_config=scaling_config, **kwargs)

    cls.__init__ = __init__
