"""XLA executables in PyTorch's portable compile caches.

``torch.compiler.save_cache_artifacts()`` bundles what Dynamo, AOTAutograd and inductor
cached; with this module it also carries the disk-tier entries (compiled XLA programs)
this process used, so ``load_cache_artifacts`` on another machine or a fresh cache
directory starts with nothing to compile. Registered when torch_pjrt is imported (and so
by ``import torch``), before any bundle can be loaded.

An entry is its file, whole: it holds its full key (program text, plugin, options, torch
and torch_pjrt versions) and checksums, so the disk tier refuses a foreign or corrupted
one at its first read and compiles instead.
"""

from __future__ import annotations

import os
import re
import socket
import threading

from torch.compiler._cache import CacheArtifact, CacheArtifactFactory, CacheArtifactManager

from . import _C

_ENTRY_NAME = re.compile(r"[0-9a-f]{16}\.pjrtexe")


@CacheArtifactFactory.register
class PjrtExecutableArtifact(CacheArtifact):
    """One disk-tier entry: key = its file name, content = its bytes."""

    @staticmethod
    def type() -> str:
        return "pjrt_executable"

    def populate_cache(self) -> None:
        directory = _C._cache_dir()
        if not directory or not _ENTRY_NAME.fullmatch(self.key):  # disk tier off, or not a name we write
            return
        path = os.path.join(directory, self.key)
        if os.path.exists(path):
            return
        os.makedirs(directory, exist_ok=True)
        # Written as the disk tier writes: a unique temporary name, then an atomic rename.
        tmp = f"{path}.tmp.{socket.gethostname()}.{os.getpid()}.{threading.get_ident()}"
        with open(tmp, "wb") as f:
            f.write(self.content)
        os.replace(tmp, path)


_recorded = 0
_lock = threading.Lock()


def record_new_entries() -> None:
    """Hands torch.compiler the entries used since the last call (called after each
    compiled graph's capture, when its programs exist)."""
    global _recorded
    with _lock:
        paths = _C._disk_entries_used(_recorded)
        _recorded += len(paths)
    for path in paths:
        try:
            with open(path, "rb") as f:
                content = f.read()
        except OSError:  # evicted meanwhile: the receiver compiles that program
            continue
        CacheArtifactManager.record_artifact(PjrtExecutableArtifact.type(), os.path.basename(path), content)
