"""Hugging Face accelerate: pick the pjrt device, and run DDP over the pjrt
process group under torchrun / ``accelerate launch``.

accelerate chooses devices from a fixed list of vendors (CUDA, XPU, NPU, ...)
and otherwise uses the CPU, and under torchrun it finds no distributed type for
an unknown device, so each rank trained alone. These patches give pjrt the
path XPU takes (DistributedType.MULTI_XPU: DDP, barriers, gathers, RNG sync, bf16
autocast on the state's device), with pjrt's own device module.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch

from . import DEFAULT_BACKEND, DEVICE, apply_pending, device_active, device_module, patch

TESTED = ("1.15.0", "1.16.0")


def _ours(backend: str | None) -> bool:
    return backend is None or "pjrt" in backend or backend == f"{DEVICE}_dist"


@patch("accelerate.default_device", "accelerate.state", "accelerate", TESTED,
       "PartialState.default_device knows only named vendors and otherwise returns the CPU: "
       "Trainer and Accelerator() trained on the CPU")
def _default_device(state: ModuleType) -> None:
    original = state.PartialState.default_device

    def default_device(self: Any) -> torch.device:
        apply_pending()  # accelerate.accelerator, if it was mid-import when torch_pjrt loaded
        if device_active():
            return torch.device(DEVICE, device_module().current_device())
        return original.fget(self)

    state.PartialState.default_device = property(default_device, doc=original.__doc__)


@patch("accelerate.distributed_type", "accelerate.state", "accelerate", TESTED,
       "under torchrun accelerate finds no distributed type for an unknown device: each rank trained alone "
       "(or, with backend='pjrt', on sharded data with no DDP, so the ranks' weights drifted apart)")
def _distributed_type(state: ModuleType) -> None:
    original = state.PartialState._prepare_backend
    distributed_type = state.DistributedType

    def _prepare_backend(self: Any, cpu: bool = False, sagemaker_dp: bool = False,
                         backend: str | None = None) -> tuple[str, Any]:
        apply_pending()
        if (not cpu and not sagemaker_dp and int(os.environ.get("LOCAL_RANK", -1)) != -1 and _ours(backend)
                and device_active()):
            return backend or DEFAULT_BACKEND, distributed_type.MULTI_XPU
        return original(self, cpu, sagemaker_dp, backend)

    state.PartialState._prepare_backend = _prepare_backend


@patch("accelerate.set_device", "accelerate.state", "accelerate", TESTED,
       "with the XPU path, set_device would call torch.xpu; a rank's device is LOCAL_RANK modulo the "
       "device count, as torch_pjrt's process group chooses it")
def _set_device(state: ModuleType) -> None:
    original = state.PartialState.set_device

    def set_device(self: Any) -> None:
        if (self.device is None and self.distributed_type == state.DistributedType.MULTI_XPU
                and self.backend is not None and _ours(self.backend) and device_active()):
            module = device_module()
            self.device = torch.device(DEVICE, self.local_process_index % module.device_count())
            module.set_device(self.device.index)
            return
        original(self)

    state.PartialState.set_device = set_device


@contextlib.contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


@patch("accelerate.ddp_device_ids", "accelerate.accelerator", "accelerate", TESTED,
       "prepare_model gives DDP device_ids=[local rank]: with one device per process every rank but 0 "
       "would name a device that does not exist; DDP gets device_ids=None (the module's one device)")
def _ddp_device_ids(accelerator: ModuleType) -> None:
    original = accelerator.Accelerator.prepare_model

    def prepare_model(self: Any, model: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        if self.device.type != DEVICE or not self.multi_device or self.device.index == self.local_process_index:
            return original(self, model, *args, **kwargs)
        if self.verify_device_map(model):  # the check the bypass below would skip
            raise ValueError("You can't train a model that has been loaded with `device_map='auto'` in any "
                             "distributed mode.")
        with _environ("ACCELERATE_BYPASS_DEVICE_MAP", "true"):  # accelerate's switch for device_ids=None
            return original(self, model, *args, **kwargs)

    accelerator.Accelerator.prepare_model = prepare_model


def _max_memory() -> dict[int | str, int]:
    import psutil

    module = device_module()
    memory: dict[int | str, int] = {}
    integrated = False
    for index in range(module.device_count()):
        memory[index] = module.mem_get_info(index)[0]
        integrated = integrated or module.get_device_properties(index).is_integrated
    if not integrated:  # a CPU plugin's device memory is the host's: no second budget for it
        memory["cpu"] = psutil.virtual_memory().available
    return memory


@patch("accelerate.max_memory", "accelerate.utils.modeling", "accelerate", TESTED,
       "get_max_memory lists only named vendors' devices: device_map='auto' put every layer on the CPU")
def _get_max_memory(modeling: ModuleType) -> None:
    original = modeling.get_max_memory

    def get_max_memory(max_memory: dict[int | str, int | str] | None = None) -> dict[int | str, int]:
        if max_memory is None and device_active():
            return _max_memory()
        return original(max_memory)

    get_max_memory.__doc__ = original.__doc__
    modeling.get_max_memory = get_max_memory


@patch("accelerate.launch_processes", "accelerate.commands.launch", "accelerate", TESTED,
       "`accelerate launch --num_processes N` with no config starts one process unless it counts several "
       "named vendors' devices: N processes on pjrt silently became one; they are launched as for several "
       "GPUs (torchrun's variables), and with no --num_processes one per pjrt device")
def _launch_processes(launch: ModuleType) -> None:
    original = launch._validate_launch_command

    def _validate_launch_command(args: Any) -> Any:
        configured = args.config_file is not None or os.path.isfile(launch.default_config_file)
        flags = ("multi_gpu", "cpu", "tpu", "use_deepspeed", "use_fsdp", "use_megatron_lm")
        ours = device_active() and not configured and not any(getattr(args, f, False) for f in flags)
        if ours and args.num_processes is None:
            args.num_processes = device_module().device_count()
        result = original(args)
        if ours and args.num_processes > 1:
            args.multi_gpu = True
        return result

    launch._validate_launch_command = _validate_launch_command
