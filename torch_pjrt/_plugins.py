"""Finding a PJRT plugin: TORCH_PJRT_PLUGIN names one (cpu, cuda, tpu or a path)."""

from __future__ import annotations

import glob
import importlib.util
import os
from dataclasses import dataclass

INSTALL_HINTS = {
    "cpu": "install the XLA CPU plugin: pip install xla-cpu-pjrt==0.0.1",
    "cuda": "install XLA's CUDA plugin, e.g. pip install jax-cuda13-pjrt (or jax-cuda12-pjrt)",
    "tpu": "install libtpu (pip install libtpu) on a TPU VM",
}


@dataclass
class PluginChoice:
    name: str
    path: str  # "" when nothing was found
    hint: str


def _package_dir(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _first(patterns: list[str]) -> str:
    for pattern in patterns:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    return ""


def _cpu() -> str:
    d = _package_dir("xla_plugins.xla_cpu_pjrt")
    return _first([os.path.join(d, "*.so")]) if d else ""


def _cuda() -> str:
    patterns = []
    for module in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12", "xla_plugins.xla_cuda13_pjrt",
                   "xla_plugins.xla_cuda12_pjrt"):
        d = _package_dir(module)
        if d:
            patterns.append(os.path.join(d, "*.so"))
    return _first(patterns)


def _tpu() -> str:
    d = _package_dir("libtpu")
    return _first([os.path.join(d, "libtpu.so")]) if d else ""


def choose_plugin() -> PluginChoice:
    """Resolves TORCH_PJRT_PLUGIN (default: cpu) to a plugin file, without loading it."""
    wanted = os.environ.get("TORCH_PJRT_PLUGIN", "cpu").strip() or "cpu"
    finders = {"cpu": _cpu, "cuda": _cuda, "gpu": _cuda, "tpu": _tpu}
    if wanted in finders:
        name = "cuda" if wanted == "gpu" else wanted
        return PluginChoice(name, finders[wanted](), INSTALL_HINTS[name])
    if os.path.isfile(wanted):
        return PluginChoice("path", os.path.abspath(wanted), "")
    return PluginChoice(
        "path", "", f"TORCH_PJRT_PLUGIN={wanted!r} is neither cpu/cuda/tpu nor an existing plugin file"
    )
