"""Hugging Face transformers: TrainingArguments picks pjrt and accepts bf16."""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import torch

from . import DEVICE, device_active, device_module, patch

TESTED = ("5.23.0", "5.24.0")


@patch("transformers.bf16_available", "transformers.training_args", "transformers", TESTED,
       "TrainingArguments(bf16=True) asks is_torch_bf16_gpu_available(), which knows only named vendors "
       "(and a device called 'tpu'): 'Your setup doesn't support bf16/gpu'")
def _bf16_available(training_args: ModuleType) -> None:
    original = training_args.is_torch_bf16_gpu_available

    def is_torch_bf16_gpu_available() -> bool:
        return (device_active() and device_module().is_bf16_supported()) or original()

    training_args.is_torch_bf16_gpu_available = is_torch_bf16_gpu_available


@patch("transformers.setup_devices", "transformers.training_args", "transformers", TESTED,
       "with one process, TrainingArguments ends on 'cuda:0 if CUDA else cpu' after its vendor list, "
       "overriding accelerate's device: the Trainer trained on the CPU")
def _setup_devices(training_args: ModuleType) -> None:
    cls = training_args.TrainingArguments
    original = cls.__dict__["_setup_devices"].func

    def _setup_devices(self: Any) -> torch.device:
        device = original(self)
        state = self.distributed_state
        if (device.type == "cpu" and not self.use_cpu and state is not None and state.device is not None
                and state.device.type == DEVICE and device_active()):
            self._n_gpu = 1
            return state.device
        return device

    prop = functools.cached_property(_setup_devices)
    prop.__set_name__(cls, "_setup_devices")
    cls._setup_devices = prop


@patch("transformers.max_memory", "transformers.integrations.accelerate", "transformers", TESTED,
       "transformers holds its own reference to accelerate's get_max_memory (device_map='auto')")
def _max_memory(integration: ModuleType) -> None:
    import accelerate.utils.modeling

    integration.accelerate_max_memory = accelerate.utils.modeling.get_max_memory


@patch("transformers.device_graphs", "transformers.generation.continuous_batching.utils", "transformers", TESTED,
       "continuous batching looks up the graph class by device type in a table of 'cuda' and 'xpu' only: "
       "on pjrt it ran every step op by op")
def _device_graphs(utils: ModuleType) -> None:
    utils.DEVICE_TYPE_TO_GRAPH_NAME.setdefault(DEVICE, "Graph")


@patch("transformers.cache_memory", "transformers.generation.continuous_batching.utils", "transformers", TESTED,
       "continuous batching sizes its paged cache from CUDA's, XPU's or MPS's memory figures, else the host's: "
       "on pjrt it took the host's and put that many bytes on the device")
def _cache_memory(utils: ModuleType) -> None:
    original = utils.get_device_and_memory_breakdown

    def get_device_and_memory_breakdown() -> tuple[torch.device, int, int, int]:
        if not device_active() or torch.cuda.is_available():
            return original()
        device = torch.device(DEVICE, device_module().current_device())
        device_module().synchronize()
        free, total = device_module().mem_get_info(device)
        return device, total, device_module().memory_reserved(device), total - free

    utils.get_device_and_memory_breakdown = get_device_and_memory_breakdown
