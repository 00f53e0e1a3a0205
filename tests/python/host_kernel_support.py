"""Where the host kernels (csrc/kernels) serve: shared by their tests."""
from __future__ import annotations

import importlib.util
import os


def host_kernel_expected() -> bool:
    """The host kernels serve float32 paged attention and few-row products where the build has
    them (setup builds with jaxlib's XLA FFI headers), on the default CPU plugin (whose FFI
    extension registers handlers; xla-cpu-pjrt takes the registration but compiles without it),
    unless TORCH_PJRT_HOST_KERNELS=0."""
    from torch_pjrt._plugins import DEFAULT_CPU_PLUGIN, choose_plugin
    name = choose_plugin().name
    return (os.environ.get("TORCH_PJRT_HOST_KERNELS") != "0" and name in ("cpu", DEFAULT_CPU_PLUGIN)
            and importlib.util.find_spec("jax") is not None)
