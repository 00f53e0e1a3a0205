"""Ranks as threads of one process, one pjrt device each: how a pod's script runs
on one host's devices (``spawn``; ``python -m torch_pjrt.distributed.run``).

Each rank thread sees what a torchrun rank sees: ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` in ``os.environ`` (values of its
own), its own current device (``LOCAL_RANK``'s), and its own ``torch.distributed``
state (default group, subgroups, names). The process group between the threads
runs every collective as an XLA program over their devices (the XLA transport):
no byte goes through the host.

``torch.manual_seed`` in a rank thread seeds its own device only. What is shared and
cannot be per thread: the CPU random generator (draws from two ranks interleave; draw
per-rank randomness on the device, whose generators are per device, or seed and build
on the CPU before ``spawn``; ranks that seed it differently are warned), ``sys.argv``,
and the interpreter's other globals. A rank that raises ends its process group, so the
ranks waiting for it in a collective raise too instead of hanging.

Dynamo compiles one frame at a time per process (a global lock), so under
``torch.compile`` the rank threads compile one after another: the first reaches its
first collective up to ``world - 1`` compiles before the last. A group ``timeout``
shorter than that fails the first rank; the default (30 min) leaves room.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from .. import device_module

DEVICE_NAME = torch._C._get_privateuse1_backend_name()

# The variables torchrun sets per rank (and the rendezvous it names).
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                  "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


class _Rank(threading.local):
    rank: int | None = None
    env: dict[str, str] | None = None


_rank = _Rank()
_install_lock = threading.Lock()


def current_rank() -> int | None:
    """This thread's rank under ``spawn``; None outside its rank threads."""
    return _rank.rank


class _RankEnviron(type(os.environ)):  # type: ignore[misc]
    """os.environ whose rank variables are the calling rank thread's own."""

    def __init__(self, base: Any) -> None:  # shares the real environment's storage
        self.__dict__.update(base.__dict__)

    def __getitem__(self, key: str) -> str:
        env = _rank.env
        if env is not None and key in env:
            return env[key]
        return super().__getitem__(key)

    def __setitem__(self, key: str, value: str) -> None:
        env = _rank.env
        if env is not None and key in env:
            env[key] = value
        else:
            super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        env = _rank.env
        if env is not None and key in env:
            del env[key]
        else:
            super().__delitem__(key)

    def __iter__(self) -> Iterator[str]:
        env = _rank.env or {}
        yield from env
        yield from (k for k in super().__iter__() if k not in env)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def copy(self) -> dict[str, str]:
        return dict(self)


class _ThreadWorlds(distributed_c10d._World):
    """c10d's process-group state (default group, group maps, names), one per
    thread: the module keeps it in module globals behind this object."""

    _STATE = {"default_pg": lambda: None, "pg_map": dict, "pg_names": dict, "pg_group_ranks": dict,
              "pg_backend_config": dict, "group_count": lambda: 0, "tags_to_pg": dict, "pg_to_tag": dict,
              "pg_coalesce_state": dict, "comms": list}

    def __init__(self) -> None:
        object.__setattr__(self, "_local", threading.local())

    def _state(self) -> dict[str, Any]:
        local = object.__getattribute__(self, "_local")
        if not hasattr(local, "state"):
            local.state = {name: make() for name, make in self._STATE.items()}
        return local.state


def _per_thread(name: str) -> property:
    return property(lambda self: self._state()[name],
                    lambda self, value: self._state().__setitem__(name, value))


for _name in _ThreadWorlds._STATE:
    setattr(_ThreadWorlds, _name, _per_thread(_name))


def _install() -> None:
    """Once per process: per-thread c10d state, environment and group registry."""
    with _install_lock:
        if isinstance(distributed_c10d._world, _ThreadWorlds):
            return
        if dist.is_initialized():
            raise RuntimeError("torch_pjrt.distributed.spawn: this process already has a default process group; "
                               "spawn ranks before init_process_group")
        distributed_c10d._world = _ThreadWorlds()
        torch._C._distributed_c10d._set_thread_isolation_mode(True)
        os.environ = _RankEnviron(os.environ)  # type: ignore[assignment]
        _isolate_dtensor_shape_propagation()
        _isolate_dtensor_rng_tracker()
        device_module.seed_all_scope = _rank_seed_scope


_seeds_by_rank: dict[int, int] = {}
_seeds_lock = threading.Lock()


def _rank_seed_scope(seed: int) -> list[int]:
    """torch.manual_seed(seed) from a rank thread seeds that rank's device only (the others
    belong to other ranks, as other processes' devices under torchrun). The CPU generator is
    one per process: when ranks seed it differently, say so once (their CPU draws interleave)."""
    rank = _rank.rank
    if rank is None:
        return list(range(max(1, torch.accelerator.device_count())))
    with _seeds_lock:
        _seeds_by_rank[rank] = seed
        differ = len(set(_seeds_by_rank.values())) > 1
    if differ:
        warnings.warn(
            f"torch.manual_seed: the rank threads seed torch differently ({dict(sorted(_seeds_by_rank.items()))}); "
            f"each rank's {DEVICE_NAME} generator is its own, but the CPU generator is one per process, shared by the "
            "rank threads: CPU random draws (torch.randn without device=, CPU-side init, a shuffling sampler's "
            "default) follow whichever rank seeded last and interleave. Draw per-rank randomness on the device, or "
            "pass each rank its own torch.Generator", stacklevel=4)
    return [getattr(torch, DEVICE_NAME).current_device()]


class _OneFakePropagationAtATime:
    """DTensor finds an op's output shape by running it on fake tensors, under this
    context (``ShardingPropagator._fake_mode_lock``, a no-op unless replaced: PyTorch's
    own threaded DTensor tests replace it with a lock). For rank threads it must:
    - let one thread at a time in: two threads' fake modes would mix;
    - leave the process-wide fake-tensor cache out: DTensor makes its fake inputs with
      ``empty_strided(..., device="pjrt")``, no index, which a fake tensor resolves to
      the calling thread's current device, but the cache is keyed on the argument as
      written: a rank would get back a fake tensor on the device of the rank that filled
      the entry, and DTensor refuses the mix ("found at least two devices, pjrt:1 and
      pjrt:3"). Turned off per use, not per rank thread, because backward runs in the
      autograd engine's own threads (one per device), which no rank setting reaches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._uncached = threading.local()

    def __enter__(self) -> None:
        import torch._dynamo.config as dynamo_config

        self._lock.acquire()
        try:
            patch = dynamo_config.patch(fake_tensor_cache_enabled=False)
            patch.__enter__()
        except BaseException:
            self._lock.release()
            raise
        self._uncached.patch = patch

    def __exit__(self, *exc: object) -> None:
        try:
            self._uncached.patch.__exit__(*exc)
        finally:
            self._lock.release()


def _isolate_dtensor_shape_propagation() -> None:
    try:
        from torch.distributed.tensor._sharding_prop import ShardingPropagator
    except ImportError:  # a torch without DTensor
        return
    if hasattr(ShardingPropagator, "_fake_mode_lock"):
        ShardingPropagator._fake_mode_lock = _OneFakePropagationAtATime()  # type: ignore[assignment]


class _RankTrackers(type(sys)):  # type: ignore[misc]
    """``torch.distributed.tensor._random``, with its ``_rng_tracker`` one per rank thread.
    DTensor keeps one tracker per process, made by the first random op (its seed broadcast
    to the mesh) and bound to that rank's device. Shared by rank threads it read another
    rank's generator, and a rank that found it made skipped the broadcast the others were
    in, which then timed out. Other threads (autograd's) see the process-wide one."""

    _per_rank: dict[int, Any] = {}

    @property
    def _rng_tracker(self) -> Any:
        rank = _rank.rank
        return self.__dict__["_rng_tracker"] if rank is None else self._per_rank.get(rank)

    @_rng_tracker.setter
    def _rng_tracker(self, tracker: Any) -> None:
        rank = _rank.rank
        if rank is None:
            self.__dict__["_rng_tracker"] = tracker
        else:
            self._per_rank[rank] = tracker


def _rank_dtensor_manual_seed(seed: int, device_mesh: Any) -> None:
    """DTensor's manual_seed for a rank thread: it makes the rank's own tracker (without the
    seed broadcast, as DTensor's does) and seeds the rank's device."""
    from torch.distributed.tensor import _random

    if _rank.rank is None:
        return _rank_dtensor_manual_seed.original(seed, device_mesh)  # type: ignore[attr-defined]
    if not _random.is_rng_supported_mesh(device_mesh):
        return None
    if device_mesh.get_coordinate() is None:
        raise RuntimeError(f"torch.distributed.tensor manual_seed: rank {_rank.rank} is not in the device mesh "
                           f"{device_mesh}, so its DTensor random state would be undefined")
    if not _random._rng_tracker:
        _random._rng_tracker = _random.OffsetBasedRNGTracker(device_mesh, run_state_sync=False)
    torch.manual_seed(seed)
    return None


def _isolate_dtensor_rng_tracker() -> None:
    try:
        from torch.distributed.tensor import _random
    except ImportError:  # a torch without DTensor
        return
    if not isinstance(_random, _RankTrackers) and "_rng_tracker" in vars(_random):
        _random.__class__ = _RankTrackers
        _rank_dtensor_manual_seed.original = _random.manual_seed  # type: ignore[attr-defined]
        _random.manual_seed = _rank_dtensor_manual_seed


class _RankPrefixed:
    """sys.stdout/err where a rank thread's lines are written whole, prefixed "[rank N] "
    (print() writes a line in pieces: the ranks' pieces would interleave)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._pending: dict[int, str] = {}
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        rank = _rank.rank
        if rank is None:
            return self._stream.write(text)
        with self._lock:
            pending = self._pending.get(rank, "") + text
            *lines, rest = pending.split("\n")
            if lines:
                self._stream.write("".join(f"[rank {rank}] {line}\n" for line in lines))
            self._pending[rank] = rest
        return len(text)

    def flush(self) -> None:
        rank = _rank.rank
        with self._lock:
            rest = self._pending.pop(rank, "") if rank is not None else ""
            if rest:
                self._stream.write(f"[rank {rank}] {rest}")
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankFailed(RuntimeError):
    """One or more ranks raised: each rank's error and traceback."""


def spawn(fn: Callable[..., Any], args: tuple[Any, ...] = (), nprocs: int | None = None,
          prefix_output: bool = True) -> list[Any]:
    """Runs ``fn(rank, *args)`` on ``nprocs`` ranks (default: every pjrt device of this
    process), each a thread with its own device, as torch.multiprocessing.spawn runs
    processes; returns their results by rank, or raises RankFailed naming every rank
    that raised. The ranks call ``dist.init_process_group()`` (env://) as under torchrun."""
    count = torch.accelerator.device_count() if torch.accelerator.current_accelerator() else 0
    world = nprocs if nprocs is not None else count
    if world < 1 or world > count:
        raise ValueError(
            f"torch_pjrt.distributed.spawn: {world} ranks need as many {DEVICE_NAME} devices in this process, "
            f"which has {count}. On the CPU plugin set TORCH_PJRT_CPU_DEVICES={max(world, 1)} before torch_pjrt "
            f"is imported, or run the script with python -m torch_pjrt.distributed.run --nproc-per-node {world}")
    _install()
    port = str(_free_port())
    results: list[Any] = [None] * world
    failures: dict[int, str] = {}

    def rank_main(rank: int) -> None:
        _rank.rank = rank
        _rank.env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                     "LOCAL_WORLD_SIZE": str(world), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
                     "ROLE_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                     "TORCHELASTIC_RUN_ID": f"pjrt-threads-{port}"}
        getattr(torch, DEVICE_NAME).set_device(rank)
        try:
            results[rank] = fn(rank, *args)
        except BaseException:  # noqa: BLE001  (reported by spawn)
            failures[rank] = traceback.format_exc()
            if dist.is_initialized():  # its peers' collectives then fail instead of waiting for it
                try:
                    dist.destroy_process_group()
                except Exception:  # noqa: BLE001
                    pass
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            _RankTrackers._per_rank.pop(rank, None)
            sys.stdout.flush()
            sys.stderr.flush()

    streams = (sys.stdout, sys.stderr)
    # init_process_group chains a process-wide sys.excepthook that prefixes "[rankN]: " to
    # every line: each rank thread would add its own, and the main thread's RankFailed
    # (which names its ranks itself) would print under every rank's prefix at once.
    excepthook = sys.excepthook
    if prefix_output:
        sys.stdout, sys.stderr = _RankPrefixed(sys.stdout), _RankPrefixed(sys.stderr)
    try:
        threads = [threading.Thread(target=rank_main, args=(r,), name=f"pjrt-rank-{r}") for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.stdout, sys.stderr = streams
        sys.excepthook = excepthook
    if failures:
        raise RankFailed("\n".join(f"rank {r} raised:\n{tb}" for r, tb in sorted(failures.items())))
    return results
