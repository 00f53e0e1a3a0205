"""Python registrations for dispatcher hooks the C++ extension does not (yet) provide.

``aten::_has_compatible_shallow_copy_type``: PyTorch's default answers True only
when both tensors are dense tensors of CPU, CUDA, HIP, MPS, XPU, HPU or MTIA, so
for a CPU tensor and a PrivateUse1 tensor it answers False. ``Module.to()`` then
replaces each parameter by a new ``Parameter`` instead of swapping its data in
place (``param.data = ...``): parameters shared between modules (a tied LM head
and token embedding) silently become two independent tensors on the device, and
an optimizer built before ``.to()`` keeps the CPU ones. PyTorch's own PrivateUse1
example backend (OpenReg) overrides the operator for the same reason.
"""

from __future__ import annotations

import torch
from torch.library import Library

_libs: list[Library] = []


def _has_compatible_shallow_copy_type(self: torch.Tensor, other: torch.Tensor) -> bool:
    # Both are plain strided c10::TensorImpl (pjrt storage is an ordinary DataPtr),
    # so shallow_copy_from between CPU and pjrt tensors is valid either way.
    devices = {self.device.type, other.device.type}
    dense = self.layout == torch.strided and other.layout == torch.strided
    return dense and devices <= {"cpu", torch._C._get_privateuse1_backend_name()}


def register() -> None:
    if _libs:
        return
    op = "aten::_has_compatible_shallow_copy_type"
    if torch._C._dispatch_has_kernel_for_dispatch_key(op, "PrivateUse1"):
        return  # the C++ extension provides it
    lib = Library("aten", "IMPL")
    lib.impl("_has_compatible_shallow_copy_type", _has_compatible_shallow_copy_type, "PrivateUse1")
    _libs.append(lib)
