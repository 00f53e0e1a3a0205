"""TorchTitan: FlexAttention and its block masks on pjrt, compiled with pjrt's backend.

TorchTitan compiles FlexAttention and create_block_mask with inductor when it
imports its attention module (inductor has no pjrt code generator), and refuses
any other compile backend for models with FlexAttention. On pjrt tensors both
are compiled with backend="pjrt" instead (one program each; inside a compiled
transformer block they are part of the block's program); other devices keep
TorchTitan's choice. Device choice, process group and memory figures need no
patch: TorchTitan finds pjrt through torch's PrivateUse1 hooks and torch.pjrt.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from . import DEVICE, patch

TESTED = ("0.3.0", "0.4.0")


def _on_device(tensor_or_device: Any) -> bool:
    device = tensor_or_device.device if isinstance(tensor_or_device, torch.Tensor) else tensor_or_device
    return device is not None and torch.device(device).type == DEVICE


@patch("torchtitan.flex_attention_compile", "torchtitan.models.common.attention", "torchtitan", TESTED,
       "FlexAttention and create_block_mask are compiled with inductor, which fails on pjrt tensors")
def _flex_attention_compile(attention: ModuleType) -> None:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    inductor_attention = attention.FlexAttention._compiled_flex_attn
    inductor_mask = attention._compiled_create_block_mask
    pjrt_attention = torch.compile(flex_attention, backend="pjrt")
    pjrt_mask = torch.compile(create_block_mask, backend="pjrt")

    def compiled_flex_attn(query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return (pjrt_attention if _on_device(query) else inductor_attention)(query, *args, **kwargs)

    def compiled_create_block_mask(*args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device", args[5] if len(args) > 5 else None)
        return (pjrt_mask if _on_device(device) else inductor_mask)(*args, **kwargs)

    attention.FlexAttention._compiled_flex_attn = staticmethod(compiled_flex_attn)
    attention._compiled_create_block_mask = compiled_create_block_mask


@patch("torchtitan.compile_backend", "torchtitan.distributed.compile", "torchtitan", TESTED,
       "--compile.backend pjrt is refused for models with FlexAttention (only inductor and aot_eager are "
       "accepted); pjrt compiles FlexAttention into the block's program itself")
def _compile_backend(compile_module: ModuleType) -> None:
    original: Callable[..., Any] = compile_module._maybe_regional_inductor_backend

    def _maybe_regional_inductor_backend(model: torch.nn.Module, backend: Any) -> Any:
        return backend if backend == "pjrt" else original(model, backend)

    compile_module._maybe_regional_inductor_backend = _maybe_regional_inductor_backend
