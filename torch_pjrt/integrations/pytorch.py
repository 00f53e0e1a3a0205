"""PyTorch itself: ``init_process_group()`` with no backend, FlexAttention's device
check and ``torch.compile``'s default backend, on this device."""

from __future__ import annotations

import functools
import warnings
from types import ModuleType
from typing import Any

import torch

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


@patch("torch.compile_default_backend", "torch._inductor.compile_fx", "torch", ("2.11.0", "2.15.0"),
       "torch.compile's default backend, inductor, has no code generator for this device: a graph that "
       f"touches {DEVICE} tensors fails in it with \"KeyError: '{DEVICE}'\". Such graphs compile with "
       "backend='pjrt' (inductor's mode and options do not apply to them, and a warning says so); graphs on "
       "other devices stay with inductor")
def _inductor_hands_the_device_to_pjrt(compile_fx_module: ModuleType) -> None:
    original = compile_fx_module.compile_fx

    @functools.wraps(original)
    def compile_fx(model_: Any, example_inputs_: Any, *args: Any, **kwargs: Any) -> Any:
        if not _touches_device(model_, example_inputs_):
            return original(model_, example_inputs_, *args, **kwargs)
        from ..compiler import pjrt_backend

        config = kwargs.get("config_patches")
        if config:
            warnings.warn(f"torch.compile on {DEVICE} compiles with backend='pjrt': inductor's mode and options "
                          f"{sorted(config)} do not apply", stacklevel=2)
        return pjrt_backend(model_, list(example_inputs_))

    compile_fx_module.compile_fx = compile_fx


def _touches_device(graph: Any, example_inputs: Any) -> bool:
    """Whether an FX graph reads or makes a tensor on this device (its inputs, parameters
    lifted as inputs, or the fake values Dynamo recorded for its nodes)."""
    if any(isinstance(t, torch.Tensor) and t.device.type == DEVICE for t in example_inputs):
        return True
    for node in getattr(getattr(graph, "graph", None), "nodes", ()):
        value = node.meta.get("val", node.meta.get("example_value"))
        values = value if isinstance(value, (list, tuple)) else (value,)
        if any(isinstance(v, torch.Tensor) and v.device.type == DEVICE for v in values):
            return True
    return False
