"""Integrations with libraries that have no hook for a new device.

Each library is patched in the smallest place that makes it use pjrt, when the
module holding that place is imported (or at once, if it already is). Every
patch is named, says why it exists, and is applied only to the versions it was
tested with; for any other version it is skipped with a warning naming it.
``applied()`` and ``skipped()`` list what happened in this process.
"""

from __future__ import annotations

import dataclasses
import importlib.abc
import importlib.machinery
import importlib.metadata
import logging
import re
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType

import torch

_log = logging.getLogger("torch_pjrt")
DEVICE = torch._C._get_privateuse1_backend_name()  # renamed by torch_pjrt before this import


@dataclasses.dataclass(frozen=True)
class Patch:
    name: str  # e.g. "accelerate.default_device"
    module: str  # applied when this module has been imported
    distribution: str  # the pip distribution whose version guards it
    tested: tuple[str, str]  # [lowest, highest) versions it was tested with
    reason: str
    apply: Callable[[ModuleType], None]


_PATCHES: list[Patch] = []
_applied: dict[str, str] = {}
_skipped: dict[str, str] = {}
# Modules that were still being imported when torch_pjrt loaded (a library imported
# first imports torch, which loads torch_pjrt): patched once their import completes.
_pending: set[str] = set()
_lock = threading.RLock()


def patch(name: str, module: str, distribution: str, tested: tuple[str, str],
          reason: str) -> Callable[[Callable[[ModuleType], None]], Callable[[ModuleType], None]]:
    """Declares a patch (a decorator on the function that applies it to the module)."""
    def register(fn: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
        _PATCHES.append(Patch(name, module, distribution, tested, reason, fn))
        return fn
    return register


def applied() -> dict[str, str]:
    """Patch name -> the version of the library it was applied to."""
    return dict(_applied)


def skipped() -> dict[str, str]:
    """Patch name -> why it was not applied."""
    return dict(_skipped)


def patches() -> list[Patch]:
    return list(_PATCHES)


# The process group libraries should ask for: collectives on CPU tensors (gather_object,
# broadcast_object_list) go through gloo, the device's through pjrt.
DEFAULT_BACKEND = f"cpu:gloo,{DEVICE}:pjrt"


def device_module() -> ModuleType:
    """torch.<device>: the device module libraries call as they call torch.cuda."""
    return getattr(torch, DEVICE)


def device_active() -> bool:
    """True when torch's current accelerator is this device and it has devices:
    the condition every patch checks before changing a library's choice."""
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == DEVICE and device_module().is_available()


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3])


def _in_range(version: str, tested: tuple[str, str]) -> bool:
    return _version_key(tested[0]) <= _version_key(version) < _version_key(tested[1])


def _initializing(module: ModuleType) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def apply_pending() -> None:
    """Patches the modules whose import was under way when torch_pjrt loaded and has
    completed since (checked at every later import and by the patched libraries)."""
    for name in list(_pending):
        module = sys.modules.get(name)
        if module is not None and not _initializing(module):
            _pending.discard(name)
            _apply(name, module)


def _apply(module_name: str, module: ModuleType, executed: bool = False) -> None:
    """`executed`: the module's code has run (its loader returned), though the import
    machinery still marks it as initializing."""
    if not executed and _initializing(module):
        _pending.add(module_name)
        return
    with _lock:
        for p in _PATCHES:
            if p.module != module_name or p.name in _applied or p.name in _skipped:
                continue
            try:
                version = importlib.metadata.version(p.distribution)
            except importlib.metadata.PackageNotFoundError:
                version = "unknown"
            if not _in_range(version, p.tested):
                _skipped[p.name] = (f"{p.distribution} {version} is outside the versions this patch was "
                                    f"tested with [{p.tested[0]}, {p.tested[1]})")
                _log.warning("torch_pjrt: not applying %s (%s): %s", p.name, p.reason, _skipped[p.name])
                continue
            p.apply(module)
            _applied[p.name] = version


class _Loader(importlib.abc.Loader):
    """Runs the module's own loader, then the patches for that module."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _apply(module.__name__, module, executed=True)

    def __getattr__(self, name: str) -> object:  # get_source, is_package, ... for tools
        return getattr(self.inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if _pending:
            apply_pending()
        if fullname not in {p.module for p in _PATCHES}:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


_finder = _Finder()


def install() -> None:
    """Loads the patch definitions and applies them as their modules are imported."""
    from . import (hf_accelerate, hf_transformers, lightning, pytorch, ray_train, torchao, torchrec,  # noqa: F401
                   torchtitan, trl, vllm_plugin)  # (their patches)

    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    for name in {p.module for p in _PATCHES}:
        module = sys.modules.get(name)
        if module is not None:
            _apply(name, module)
