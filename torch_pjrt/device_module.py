"""torch.pjrt: the device module (the torch.cuda of this backend)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from . import _C

_initial_seeds: dict[int, int] = {}
_NAME = torch._C._get_privateuse1_backend_name()  # renamed by torch_pjrt before this import


def _lazy_init() -> None:
    _C._init()


def is_initialized() -> bool:
    return _C._is_initialized()


def is_available() -> bool:
    return _C._device_count() > 0


def device_count() -> int:
    return _C._device_count()


def current_device() -> int:
    return torch.accelerator.current_device_index()


def set_device(device: int | str | torch.device) -> None:
    idx = torch.device(device).index if not isinstance(device, int) else device
    torch.accelerator.set_device_index(idx if idx is not None else 0)


def synchronize(device: int | None = None) -> None:
    _C._synchronize(-1 if device is None else int(device))


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


def manual_seed_all(seed: int) -> None:
    for i in range(max(1, device_count())):
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

def memory_stats(device: int | str | torch.device | None = None) -> dict[str, Any]:
    s = _C._memory_stats(_index(device))
    return {
        "allocated_bytes.all.current": s["allocated_bytes"],
        "allocated_bytes.all.peak": s["peak_allocated_bytes"],
        "allocation.all.allocated": s["num_allocs"],
        "allocation.all.freed": s["num_frees"],
        **{k: v for k, v in s.items() if k.startswith("plugin_")},
    }


def memory_allocated(device: int | str | torch.device | None = None) -> int:
    return _C._memory_stats(_index(device))["allocated_bytes"]


def max_memory_allocated(device: int | str | torch.device | None = None) -> int:
    return _C._memory_stats(_index(device))["peak_allocated_bytes"]


def reset_peak_memory_stats(device: int | str | torch.device | None = None) -> None:
    _C._reset_peak_memory(_index(device))


def empty_cache() -> None:
    """Nothing is cached: buffers are freed when their last tensor goes."""


class device:  # noqa: N801  (mirrors torch.cuda.device)
    def __init__(self, index: int | str | torch.device) -> None:
        self.index = _index(index)
        self.previous = -1

    def __enter__(self) -> None:
        self.previous = current_device()
        set_device(self.index)

    def __exit__(self, *exc: object) -> None:
        set_device(self.previous)
