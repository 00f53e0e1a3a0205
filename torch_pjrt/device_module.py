"""torch.pjrt: the device module (the torch.cuda of this backend)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import torch

from . import _C
from .graphs import Graph, MemPool, graph, graph_pool_handle, is_current_stream_capturing, use_mem_pool  # noqa: F401

_initial_seeds: dict[int, int] = {}
_NAME = torch._C._get_privateuse1_backend_name()  # renamed by torch_pjrt before this import


def _lazy_init() -> None:
    _C._init()


def is_initialized() -> bool:
    return _C._is_initialized()


def init() -> None:
    """Starts the plugin now (it otherwise starts on first use), as torch.cuda.init."""
    _lazy_init()


def is_available() -> bool:
    return _C._device_count() > 0


def device_count() -> int:
    return _C._device_count()


def current_device() -> int:
    return torch.accelerator.current_device_index()


def set_device(device: int | str | torch.device) -> None:
    idx = torch.device(device).index if not isinstance(device, int) else device
    torch.accelerator.set_device_index(idx if idx is not None else 0)


def synchronize(device: int | str | torch.device | None = None) -> None:
    """Runs what fused mode recorded, waits for all work enqueued on `device` (the
    current device when None or unindexed, as torch.cuda.synchronize does; even work
    whose results were already freed), and raises deferred errors (e.g. out-of-range
    indices). One device, not all: a rank thread waiting on every device would wait on
    the other ranks' collectives, which may be waiting on its own next one."""
    _C._synchronize(_index(device))


def _is_in_bad_fork() -> bool:
    return False


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def _index(device: int | str | torch.device | None) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    idx = torch.device(device).index
    return current_device() if idx is None else idx


# ---- streams and events ------------------------------------------------------
# The device runs its programs in submission order on one queue, so every stream
# is that queue: waits between streams are already satisfied, events complete
# with the work before them, and record_stream has nothing to protect (a buffer
# lives while a program still reads it). DDP and FSDP2 use these as on CUDA.

def Stream(device: int | str | torch.device | None = None, priority: int = 0, **kwargs: Any) -> torch.Stream:  # noqa: N802
    return torch.Stream(device=torch.device(_NAME, _index(device)), priority=priority)


def Event(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:  # noqa: N802
    return torch.Event(device=torch.device(_NAME, current_device()), enable_timing=enable_timing,
                       blocking=blocking, interprocess=interprocess)


def current_stream(device: int | str | torch.device | None = None) -> torch.Stream:
    return torch.Stream(device=torch.device(_NAME, _index(device)))


default_stream = current_stream


def set_stream(stream: torch.Stream) -> None:
    """Every stream is the device's one queue: nothing to switch."""


@contextlib.contextmanager
def stream(stream: torch.Stream | None) -> Iterator[None]:
    yield


# ---- RNG ----------------------------------------------------------------------

def manual_seed(seed: int, device: int | None = None) -> None:
    idx = _index(device)
    _initial_seeds[idx] = int(seed)
    _C._manual_seed(idx, int(seed) & 0xFFFF_FFFF_FFFF_FFFF)


def _every_device(seed: int) -> list[int]:
    return list(range(max(1, device_count())))


# The devices manual_seed_all (and so torch.manual_seed) seeds: every device of the process,
# unless ranks run as threads (torch_pjrt.distributed.threads installs its own rule: a rank
# thread seeds its own device only, as a torchrun rank seeds its process's devices only).
seed_all_scope: Any = _every_device


def manual_seed_all(seed: int) -> None:
    for i in seed_all_scope(seed):
        manual_seed(seed, i)


def seed() -> None:
    manual_seed(int(torch.randint(0, 2**62, (1,)).item()))


def initial_seed() -> int:
    return _initial_seeds.get(current_device(), torch.initial_seed())


def default_generator(device: int | None = None) -> torch.Generator:
    return _C._default_generator(_index(device))


def get_rng_state(device: int | str | torch.device | None = None) -> torch.Tensor:
    return default_generator(_index(device)).get_state()


def set_rng_state(state: torch.Tensor, device: int | str | torch.device | None = None) -> None:
    default_generator(_index(device)).set_state(state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states: list[torch.Tensor]) -> None:
    for i, s in enumerate(states):
        set_rng_state(s, i)


# ---- memory -------------------------------------------------------------------
# Each tensor's storage is one PJRT buffer, freed with its last tensor: nothing is
# cached, so reserved = allocated (a plugin that reports its own use, with program
# temporaries, gives reserved). Keys and meanings follow torch.cuda's.

def memory_stats(device: int | str | torch.device | None = None) -> dict[str, Any]:
    """torch.cuda.memory_stats' keys ("allocated_bytes.all.current", "reserved_bytes.all.peak",
    "active_bytes.all.peak", "num_device_alloc", ...), plus the plugin's own "plugin_*" figures."""
    idx = _index(device)
    if not is_initialized():
        return {}
    stats: dict[str, Any] = dict(torch.accelerator.memory_stats(idx))
    stats.update((k, v) for k, v in _C._memory_stats(idx).items() if k.startswith("plugin_"))
    return stats


def _counter(key: str, device: int | str | torch.device | None) -> int:
    return int(memory_stats(device).get(key, 0))


# The allocated figures are read straight from the counters (called every step by some
# trainers); the others go through the full statistics.
def memory_allocated(device: int | str | torch.device | None = None) -> int:
    return int(_C._memory_stats(_index(device))["allocated_bytes"]) if is_initialized() else 0


def max_memory_allocated(device: int | str | torch.device | None = None) -> int:
    return int(_C._memory_stats(_index(device))["peak_allocated_bytes"]) if is_initialized() else 0


def memory_reserved(device: int | str | torch.device | None = None) -> int:
    return _counter("reserved_bytes.all.current", device)


def max_memory_reserved(device: int | str | torch.device | None = None) -> int:
    return _counter("reserved_bytes.all.peak", device)


memory_cached = memory_reserved
max_memory_cached = max_memory_reserved


def reset_peak_memory_stats(device: int | str | torch.device | None = None) -> None:
    _C._reset_peak_memory(_index(device))


def reset_max_memory_allocated(device: int | str | torch.device | None = None) -> None:
    """As torch.cuda's: resets every peak (allocated and reserved are one figure here)."""
    reset_peak_memory_stats(device)


reset_max_memory_cached = reset_max_memory_allocated


def reset_accumulated_memory_stats(device: int | str | torch.device | None = None) -> None:
    _C._reset_accumulated_memory(_index(device))


def mem_get_info(device: int | str | torch.device | None = None) -> tuple[int, int]:
    """(free, total) bytes: the plugin's figures, or the host's memory for a CPU plugin."""
    _lazy_init()
    free, total = _C._memory_info(_index(device))
    return int(free), int(total)


def empty_cache() -> None:
    """Nothing is cached: buffers are freed when their last tensor goes."""


# ---- device description ---------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _DeviceProperties:
    """What torch.cuda.get_device_properties gives that a PJRT device can say.

    `major`/`minor` are the plugin's compute capability where it has one (GPU
    plugins), else 0; `multi_processor_count` its core count (host cores for a
    CPU plugin); `attributes` every attribute the plugin describes the device with.
    """

    name: str
    type: str
    platform_version: str
    total_memory: int
    major: int
    minor: int
    multi_processor_count: int
    is_integrated: bool
    index: int
    attributes: dict[str, str]


def _attributes(idx: int) -> dict[str, str]:
    return dict(a.split("=", 1) for a in _C._device_attributes(idx))


def get_device_name(device: int | str | torch.device | None = None) -> str:
    """The plugin's device kind (e.g. "NVIDIA H200", "TPU v5 lite", "cpu")."""
    _lazy_init()
    return str(_C._device_kind(_index(device)))


def get_device_capability(device: int | str | torch.device | None = None) -> tuple[int, int]:
    props = get_device_properties(device)
    return props.major, props.minor


def get_device_properties(device: int | str | torch.device | None = None) -> _DeviceProperties:
    _lazy_init()
    idx = _index(device)
    if not 0 <= idx < device_count():
        raise ValueError(f"{_NAME}: invalid device index {idx} ({device_count()} devices)")
    attrs = _attributes(idx)
    platform, version, _, _ = _C._platform()
    is_cpu = platform in ("cpu", "host")
    major, _, minor = attrs.get("compute_capability", "0.0").partition(".")
    try:
        total = mem_get_info(idx)[1]
    except RuntimeError:  # the plugin reports no memory figures
        total = 0
    cores = attrs.get("core_count") or (os.cpu_count() if is_cpu else 0)
    return _DeviceProperties(name=get_device_name(idx), type=str(platform), platform_version=str(version),
                             total_memory=total, major=int(major or 0), minor=int(minor or 0),
                             multi_processor_count=int(cores or 0), is_integrated=is_cpu, index=idx,
                             attributes=attrs)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Every XLA backend compiles bfloat16 programs (the CPU one computes them in float32
    and rounds each result, as PyTorch's CPU kernels do)."""
    return is_available()


def __getattr__(name: str) -> Any:
    # torch.utils.checkpoint and torch.random.fork_rng read `_initialized` (as on
    # torch.cuda) to decide whether to save and restore this device's RNG state.
    if name == "_initialized":
        return is_initialized()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class device:  # noqa: N801  (mirrors torch.cuda.device)
    def __init__(self, index: int | str | torch.device) -> None:
        self.index = _index(index)
        self.previous = -1

    def __enter__(self) -> None:
        self.previous = current_device()
        set_device(self.index)

    def __exit__(self, *exc: object) -> None:
        set_device(self.previous)
