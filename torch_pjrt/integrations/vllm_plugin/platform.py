"""What vLLM asks of the pjrt device (``vllm.platforms.interface.Platform``)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch

import torch_pjrt  # noqa: F401  (registers the device)
from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum

from .. import DEVICE

if TYPE_CHECKING:
    from vllm.config import VllmConfig

_log = init_logger("vllm.platforms.pjrt")


class PjrtPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = DEVICE
    device_type: str = DEVICE
    dispatch_key: str = "PrivateUse1"
    dist_backend: str = "pjrt"  # the device group of vLLM's process groups (its CPU group is gloo)
    simple_compile_backend: str = "pjrt"
    supported_quantization: list[str] = []

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.float32, torch.bfloat16, torch.float16]

    @classmethod
    def import_kernels(cls) -> None:
        # The host-side bookkeeping uses vLLM's CPU kernels (slot mapping). Plain
        # `import vllm._C` loads the AVX-512 build and dies of an illegal instruction on
        # an AVX2 host: the CPU platform picks the build this CPU runs.
        from vllm.platforms.cpu import CpuPlatform
        CpuPlatform.import_kernels()

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return getattr(torch, DEVICE).get_device_name(device_id)

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return getattr(torch, DEVICE).mem_get_info(device_id)[1]

    @classmethod
    def get_current_memory_usage(cls, device: Any = None) -> float:
        return float(getattr(torch, DEVICE).memory_allocated(device))

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        getattr(torch, DEVICE).set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        getattr(torch, DEVICE).manual_seed_all(seed)

    @classmethod
    def inference_mode(cls) -> contextlib.AbstractContextManager[Any]:
        return torch.no_grad()

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False  # host buffers stay on the host: the runner's bookkeeping is host-side

    @classmethod
    def get_attn_backend_cls(cls, selected_backend: Any, attn_selector_config: Any,
                             num_heads: int | None = None) -> str:
        if selected_backend is not None and getattr(selected_backend, "name", "") != "CUSTOM":
            _log.info("vLLM on pjrt: attention backend %s is not available; using pjrt's own", selected_backend)
        if getattr(attn_selector_config, "use_mla", False):
            raise NotImplementedError("vLLM on pjrt: multi-head latent attention (MLA) models are not supported")
        return "torch_pjrt.integrations.vllm_plugin.attention.PjrtAttentionBackend"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "vllm.distributed.device_communicators.cpu_communicator.CpuCommunicator"

    @classmethod
    def opaque_attention_op(cls) -> bool:
        return False  # attention runs inline, recorded into the step's program

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return False

    @classmethod
    def check_and_update_config(cls, vllm_config: "VllmConfig") -> None:
        from vllm.config import CompilationMode
        from vllm.config.compilation import CUDAGraphMode

        model = vllm_config.model_config
        if model is not None:
            model.disable_cascade_attn = True
        cache = vllm_config.cache_config
        if cache.block_size is None:
            cache.block_size = 16
        parallel = vllm_config.parallel_config
        if parallel.world_size > 1:
            raise NotImplementedError(
                "vLLM on pjrt: tensor, pipeline and data parallelism are not supported yet "
                f"(world size {parallel.world_size}); serve one model per device")
        if parallel.worker_cls == "auto":
            parallel.worker_cls = "torch_pjrt.integrations.vllm_plugin.worker.PjrtWorker"
        parallel.enable_dbo = False
        vllm_config.scheduler_config.async_scheduling = False
        if vllm_config.speculative_config is not None:
            raise NotImplementedError("vLLM on pjrt: speculative decoding is not supported")
        if vllm_config.lora_config is not None:
            raise NotImplementedError("vLLM on pjrt: LoRA adapters are not supported")
        # The model runs as one program per padded shape (recorded in fused mode and
        # compiled by the plugin, see worker.py); vLLM's own torch.compile and CUDA
        # graphs do not apply.
        compilation = vllm_config.compilation_config
        compilation.mode = CompilationMode.NONE
        compilation.cudagraph_mode = CUDAGraphMode.NONE
        compilation.cudagraph_capture_sizes = []
