"""torch.distributed on pjrt: the c10d backend ``"pjrt"``.

``dist.init_process_group("pjrt")``, or ``"cpu:gloo,pjrt:pjrt"`` for groups
that also move CPU tensors, under ``torchrun``. A device renamed with
TORCH_PJRT_DEVICE_NAME (say ``tpu``) keeps the backend ``"pjrt"`` and also gets
``"tpu_dist"``; either is its default backend, so ``init_process_group()`` with
no backend picks it. DDP, FSDP2 (``fully_shard``),
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
from typing import Any

import torch
import torch.distributed as dist

from .. import _C

BACKEND = "pjrt"
# The device's name: "pjrt" unless TORCH_PJRT_DEVICE_NAME renamed it (e.g. "tpu").
DEVICE = torch._C._get_privateuse1_backend_name()  # renamed by torch_pjrt before this import


def backend_names() -> list[str]:
    """The c10d names of this backend: "pjrt", and for a renamed device also
    "<name>_dist" (the name libraries expect for a "tpu" device: "tpu_dist")."""
    return [BACKEND] if DEVICE == BACKEND else [BACKEND, f"{DEVICE}_dist"]


def _checks_enabled() -> bool:
    return os.environ.get("TORCH_PJRT_DIST_CHECK", "1") != "0"


def _select_local_device() -> None:
    """With several devices in this process (a multi-chip plugin), LOCAL_RANK
    (set by torchrun) picks this rank's device unless the script chose one."""
    device_module = getattr(torch, DEVICE)
    local_rank = os.environ.get("LOCAL_RANK")
    count = device_module.device_count()
    if local_rank is not None and count > 1 and device_module.current_device() == 0:
        device_module.set_device(int(local_rank) % count)


# How this process's PJRT client relates to the job's other processes: None until a
# group of several processes starts the runtime (see _start_runtime_across_processes).
_processes: dict[str, Any] | None = None


def _start_runtime_across_processes(store: dist.Store, rank: int, size: int) -> None:
    """A group of `size` processes whose runtime has not started yet asks the plugin for
    one client over all of them (node_id = rank, num_nodes = size, the plugin's key-value
    exchange through the group's store), so that their devices could join in programs.
    A plugin that cannot (XLA's CPU plugin) gets a client of this process's devices, and
    the reason is kept for metrics()["distributed"]["processes"] and qualification.
    Ranks as threads of one process never come here: their runtime is already running."""
    global _processes
    if _processes is not None or _C._is_initialized():
        return
    if os.environ.get("TORCH_PJRT_DIST_TRANSPORT", "auto") == "host":
        _processes = {"spanned": 1, "of": size, "why_not": "TORCH_PJRT_DIST_TRANSPORT=host"}
        return
    why_not = _C._start_runtime_across_processes(dist.PrefixStore("pjrt_client/", store), rank, size)
    _processes = {"spanned": 1 if why_not else size, "of": size, "why_not": why_not}


def _create_backend(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> object:
    if size > 1:
        _start_runtime_across_processes(store, rank, size)
    _select_local_device()
    return _make_backend(store, rank, size, timeout)


def _xla_device_ids(store: dist.Store, rank: int, size: int) -> list[int]:
    """Every rank's global device id when the XLA transport can join them (all ranks
    are threads of this process, each on its own device), else []."""
    choice = os.environ.get("TORCH_PJRT_DIST_TRANSPORT", "auto")
    if choice not in ("auto", "host", "xla"):
        raise ValueError(f"TORCH_PJRT_DIST_TRANSPORT={choice!r}: expected auto, host or xla")
    if choice == "host":
        return []
    device = getattr(torch, DEVICE).current_device()
    store.set(f"pjrt_device/{rank}", f"{os.getpid()}:{_C._device_global_id(device)}")
    members = [store.get(f"pjrt_device/{r}").decode().split(":") for r in range(size)]
    ids = [int(device_id) for _, device_id in members]
    joinable = len({pid for pid, _ in members}) == 1 and len(set(ids)) == size
    if choice == "xla" and not joinable:
        raise RuntimeError("TORCH_PJRT_DIST_TRANSPORT=xla: this plugin's XLA collectives join the devices of one "
                           "process only, and this group's ranks are processes (or share a device); run them as "
                           "threads (torch_pjrt.distributed.spawn) or leave the choice to torch_pjrt")
    return ids if joinable else []


def _make_backend(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> object:
    """A group's backend; its subgroups (c10d's split_group, which DeviceMesh uses when
    init_process_group was given a device_id) are made the same way by their members.
    Host-staged through gloo unless the XLA transport can join the ranks' devices."""
    host = dist.ProcessGroupGloo(dist.PrefixStore("pjrt_host/", store), rank, size, timeout)
    device_ids = _xla_device_ids(store, rank, size)
    return _C._ProcessGroupPjrt(host, rank, size, _checks_enabled(), _make_backend, timeout, device_ids,
                                _collectives_in_programs())


def _collectives_in_programs() -> bool:
    """TORCH_PJRT_DIST_IN_PROGRAMS (default 1; XLA transport only): a collective that
    torch.compile captures becomes part of the graph's program (one replica per rank's
    device); 0 runs such a graph eagerly instead, op by op, its collectives as programs of
    their own."""
    value = os.environ.get("TORCH_PJRT_DIST_IN_PROGRAMS", "1")
    if value not in ("0", "1"):
        raise ValueError(f"TORCH_PJRT_DIST_IN_PROGRAMS={value!r}: expected 0 or 1")
    return value == "1"


def spawn(fn: Any, args: tuple[Any, ...] = (), nprocs: int | None = None, prefix_output: bool = True) -> list[Any]:
    """Ranks as threads of this process, one pjrt device each (torch_pjrt.distributed.threads)."""
    from . import threads

    return threads.spawn(fn, args, nprocs, prefix_output)


def transport_stats() -> dict[str, Any]:
    """Collectives run in this process by transport ("xla", "host (gloo)"; one captured
    into a torch.compile program counts once, when captured), the bytes the host-staged
    transport moved through the host, and "in_programs": the collective runs inside
    compiled programs (every replay counts). "processes", once a group of several processes
    started the runtime: how many of them its client spans ("spanned" of "of"; 1 when the
    plugin cannot join processes) and, if not all, why not."""
    return stats_with(_C._metrics()["collectives_in_programs"])


def stats_with(in_programs: int) -> dict[str, Any]:
    """transport_stats() for a metrics snapshot already taken (its collectives in programs)."""
    return {**_C._transport_stats(), "in_programs": in_programs, "processes": _processes}


def register() -> None:
    """Registers the backend with c10d (done by ``import torch_pjrt``)."""
    if not dist.is_available():
        return
    for name in backend_names():  # the first registered is the device's default backend
        if name not in dist.Backend.backend_list:
            dist.Backend.register_backend(name, _create_backend, devices=[DEVICE])
