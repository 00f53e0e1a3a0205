"""Finding a PJRT plugin: TORCH_PJRT_PLUGIN names one (cpu, a CPU plugin's package, cuda, tpu or a path).

XLA's CPU plugin comes from several PyPI packages, built from different XLA
versions. `cpu` is the one the project pins (see DEFAULT_CPU_PLUGIN and the
README for why); the others stay selectable by their package name, so a team
can qualify and benchmark them (`python -m torch_pjrt.qualify --plugin NAME`).

TORCH_PJRT_XLA_OPTIONS sets XLA DebugOptions fields for every compile
(`name=value,...`, e.g. `xla_cpu_use_xnnpack=false`), on top of a plugin's own
settings and of CPU_XLA_OPTIONS for the CPU plugins; they are part of the compile
cache's key.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from dataclasses import dataclass, field

OverrideValue = bool | int | float | str


@dataclass(frozen=True)
class CpuPluginPackage:
    """A PyPI package that carries XLA's CPU PJRT plugin."""

    name: str  # the PyPI name, also its TORCH_PJRT_PLUGIN name
    module: str  # the Python package holding the .so
    library: str  # glob of the .so inside it
    pip: str  # pinned install spec
    origin: str  # where the binary comes from


CPU_PLUGINS: dict[str, CpuPluginPackage] = {
    p.name: p
    for p in (
        CpuPluginPackage("fastatomstruct-xla-cpu", "fastatomstruct_xla_cpu", "libpjrt_cpu.so",
                         "fastatomstruct-xla-cpu==2026.6.23",
                         "zml/pjrt-artifacts build manual-2026-06-23 of XLA's CPU plugin (PJRT C API 0.106)"),
        CpuPluginPackage("lammps-jax-pjrt-cpu", "lammps_jax_pjrt_cpu", "pjrt_c_api_cpu_plugin.so",
                         "lammps-jax-pjrt-cpu==0.11.2",
                         "XLA of jaxlib 0.11.2 (PJRT C API 0.115), built by the lammps-jax project"),
        CpuPluginPackage("xla-cpu-pjrt", "xla_plugins.xla_cpu_pjrt", "*.so", "xla-cpu-pjrt==0.0.1",
                         "OpenXLA's CPU plugin of late 2025 (PJRT C API 0.81); also carries pjrt_c_api.h"),
    )
}
# Chosen by measurement (README, "Which CPU plugin"): the one that passes the whole qualification.
# xla-cpu-pjrt 0.0.1 computes float32 dots with stale weights after an in-place update on AMD Zen
# CPUs (XNNPACK reuses weights it packed, keyed by buffer address); lammps-jax-pjrt-cpu 0.11.2
# returns some inputs of torch.atan unchanged (kernels.pointwise).
DEFAULT_CPU_PLUGIN = "fastatomstruct-xla-cpu"

INSTALL_HINTS = {
    "cuda": "install XLA's CUDA plugin, e.g. pip install jax-cuda13-pjrt (or jax-cuda12-pjrt)",
    "tpu": "install libtpu (pip install libtpu) on a TPU VM",
}


@dataclass
class PluginChoice:
    name: str  # cpu, a CPU plugin package's name, cuda, tpu or path
    path: str  # "" when nothing was found
    hint: str
    compile_overrides: dict[str, OverrideValue] = field(default_factory=dict)


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


def cpu_plugin_path(name: str) -> str:
    """The installed .so of a CPU plugin package ("" when not installed)."""
    package = CPU_PLUGINS[name]
    d = _package_dir(package.module)
    return _first([os.path.join(d, package.library)]) if d else ""


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


def parse_xla_options(text: str) -> dict[str, OverrideValue]:
    """`name=value,...` -> {name: value}: true/false are booleans, then integers, floats, strings."""
    options: dict[str, OverrideValue] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, raw = item.partition("=")
        name, raw = name.strip().lstrip("-"), raw.strip()
        if not sep or not name:
            raise ValueError(f"TORCH_PJRT_XLA_OPTIONS: expected name=value, got {item!r}")
        value: OverrideValue
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            try:
                value = int(raw)
            except ValueError:
                try:
                    value = float(raw)
                except ValueError:
                    value = raw
        options[name] = value
    return options


# XLA's CPU compiler defaults to "fast" min/max, which drop NaNs: max reductions, complex
# abs and every expansion built on min/max then return a number where torch returns NaN.
CPU_XLA_OPTIONS: dict[str, OverrideValue] = {"xla_cpu_enable_fast_min_max": False}


def choose_plugin() -> PluginChoice:
    """Resolves TORCH_PJRT_PLUGIN (default: cpu) to a plugin file, without loading it."""
    wanted = os.environ.get("TORCH_PJRT_PLUGIN", "cpu").strip() or "cpu"
    overrides = parse_xla_options(os.environ.get("TORCH_PJRT_XLA_OPTIONS", ""))
    cpu_name = DEFAULT_CPU_PLUGIN if wanted == "cpu" else wanted
    if cpu_name in CPU_PLUGINS:
        package = CPU_PLUGINS[cpu_name]
        return PluginChoice(wanted, cpu_plugin_path(cpu_name),
                            f"install the XLA CPU plugin: pip install {package.pip}", {**CPU_XLA_OPTIONS, **overrides})
    if wanted in ("cuda", "gpu"):
        return PluginChoice("cuda", _cuda(), INSTALL_HINTS["cuda"], overrides)
    if wanted == "tpu":
        return PluginChoice("tpu", _tpu(), INSTALL_HINTS["tpu"], overrides)
    if os.path.isfile(wanted):
        return PluginChoice("path", os.path.abspath(wanted), "", overrides)
    names = ", ".join(["cpu", *CPU_PLUGINS, "cuda", "tpu"])
    return PluginChoice("path", "", f"TORCH_PJRT_PLUGIN={wanted!r} is neither one of {names} nor an existing "
                        "plugin file", overrides)


def is_cpu(choice: PluginChoice) -> bool:
    return choice.name == "cpu" or choice.name in CPU_PLUGINS
