"""torch_pjrt: PyTorch on any accelerator with an OpenXLA PJRT plugin.

Importing it (or just ``import torch``, through the ``torch.backends`` entry
point) registers the ``pjrt`` device. The PJRT plugin starts on first use.
"""

from __future__ import annotations

import os
import sys


import torch  # noqa: E402
from _torch_pjrt_autoload import build_mismatch  # noqa: E402

if (_mismatch := build_mismatch()) is not None:
    raise ImportError(_mismatch)

from . import _plugins

DEVICE_NAME: str = os.environ.get("TORCH_PJRT_DEVICE_NAME", "pjrt")


def _rename_backend() -> None:
    current = torch._C._get_privateuse1_backend_name()
    if current == DEVICE_NAME:
        return
    if current != "privateuseone":
        raise RuntimeError(
            f"torch_pjrt: PrivateUse1 is already registered as {current!r}; "
            f"cannot register {DEVICE_NAME!r}"
        )
    torch.utils.rename_privateuse1_backend(DEVICE_NAME)


_rename_backend()

from . import _C  # noqa: E402  (needs the renamed backend)
from ._config import cache_dir_from_env, configure_from_env  # noqa: E402

configure_from_env()

from . import device_module, graphs  # noqa: E402

torch._register_device_module(DEVICE_NAME, device_module)  # also sys.modules["torch.<device>"]
# Named as torch.cuda is: libraries read the device type from the device module's name
# (transformers' graph lookup takes its last component).
device_module.__name__ = f"torch.{DEVICE_NAME}"
torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)

from . import _autograd_exit, _dispatch_fixes, autocast  # noqa: E402,F401  (_autograd_exit: its atexit handler)

_dispatch_fixes.register()  # Module.to("pjrt") keeps shared parameters shared
autocast.register()  # torch.autocast("pjrt", ...): fallthrough plus per-op casting policy

from . import compiler, distributed, shapes  # noqa: E402  (compiler imports _graph, which imports _cache_artifacts: it registers its type)
from .recompiles import RecompileError, set_recompile_policy  # noqa: E402

distributed.register()  # dist.init_process_group("pjrt")

from . import integrations  # noqa: E402

integrations.install()  # Hugging Face, TorchTitan, torch.distributed: see torch_pjrt/integrations

# torch.compile(backend="pjrt") is found through the torch_dynamo_backends entry
# point; register it directly too when Dynamo is already loaded (importing
# Dynamo here would double the import time).
if "torch._dynamo" in sys.modules:
    compiler.register()

from .library import jax_op, stablehlo_op  # noqa: E402  (JAX itself is imported at the first use)
from .metrics import metrics, metrics_report, reset_metrics  # noqa: E402
from .modes import (  # noqa: E402
    debug_mode,
    eager_mode,
    fallback_mode,
    fusion_policy,
    set_eager_mode,
    set_fallback_mode,
    set_fusion_policy,
    sync,
)


def _cut_after_optimizer_step(optimizer: object, args: object, kwargs: object) -> None:
    # A training iteration ends here: fused mode runs what it recorded, so each
    # iteration settles on the same cached programs. Inside torch.compile or a
    # device graph the step is part of a captured program: nothing to cut.
    if not torch.compiler.is_compiling() and not graphs.is_current_stream_capturing():
        _C._flush("optimizer_step")


from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: E402

register_optimizer_step_post_hook(_cut_after_optimizer_step)


def device(index: int = 0) -> torch.device:
    """The torch.device for PJRT device `index`."""
    return torch.device(DEVICE_NAME, index)


synchronize = device_module.synchronize  # torch_pjrt.synchronize is torch.pjrt.synchronize


def native_ops() -> list[str]:
    """ATen operators (with overloads) that have a pjrt kernel, read from the dispatcher."""
    regs = torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1")
    return sorted(op for op in regs if op.startswith("aten::"))


def platform() -> dict[str, object]:
    """The running plugin: platform name and version, PJRT C API version, attributes."""
    name, version, major, minor = _C._platform()
    return {
        "platform": name,
        "platform_version": version,
        "pjrt_c_api": f"{major}.{minor}",
        "attributes": list(_C._plugin_attributes()),
        "cache_dir": _C._cache_dir(),
    }


__all__ = [
    "DEVICE_NAME",
    "cache_dir_from_env",
    "debug_mode",
    "device",
    "eager_mode",
    "fallback_mode",
    "fusion_policy",
    "jax_op",
    "metrics",
    "metrics_report",
    "native_ops",
    "platform",
    "reset_metrics",
    "set_eager_mode",
    "set_fallback_mode",
    "set_fusion_policy",
    "stablehlo_op",
    "sync",
    "synchronize",
]
