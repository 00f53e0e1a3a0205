"""torch.distributed on pjrt: the c10d backend ``"pjrt"``.

``dist.init_process_group("pjrt")``, or ``"cpu:gloo,pjrt:pjrt"`` for groups
that also move CPU tensors, under ``torchrun``. DDP, FSDP2 (``fully_shard``),
DTensor and ``torch.distributed.checkpoint`` reach it through c10d.

The bytes move host-side through an inner gloo group: device buffer -> host
-> gloo -> a new device buffer written into the caller's tensor (every view of
its storage sees the result). Before each collective the ranks exchange its
signature (op, shapes, dtypes, root, reduce op), so a mismatch raises on every
rank; ``TORCH_PJRT_DIST_CHECK=0`` skips that exchange. Collectives complete
before they return (``async_op=True`` gives a completed Work whose future holds
the outputs); send and recv are asynchronous.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from . import _C

BACKEND = "pjrt"


def _checks_enabled() -> bool:
    return os.environ.get("TORCH_PJRT_DIST_CHECK", "1") != "0"


def _select_local_device() -> None:
    """With several devices in this process (a multi-chip plugin), LOCAL_RANK
    (set by torchrun) picks this rank's device unless the script chose one."""
    device_module = getattr(torch, BACKEND)
    local_rank = os.environ.get("LOCAL_RANK")
    count = device_module.device_count()
    if local_rank is not None and count > 1 and device_module.current_device() == 0:
        device_module.set_device(int(local_rank) % count)


def _create_backend(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> object:
    _select_local_device()
    host = dist.ProcessGroupGloo(dist.PrefixStore("pjrt_host/", store), rank, size, timeout)
    return _C._ProcessGroupPjrt(host, rank, size, _checks_enabled())


def register() -> None:
    """Registers the backend with c10d (done by ``import torch_pjrt``)."""
    if not dist.is_available() or BACKEND in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND, _create_backend, devices=[BACKEND])
