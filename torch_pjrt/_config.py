"""Environment configuration: plugin, device count, compile cache, modes."""

from __future__ import annotations

import logging
import os
import traceback

from . import _C, _plugins

_log = logging.getLogger("torch_pjrt")
_OFF = {"", "0", "off", "none", "false"}


def cache_dir_from_env() -> str:
    """TORCH_PJRT_CACHE_DIR, default ~/.cache/torch_pjrt; 0/off disables the disk tier."""
    value = os.environ.get("TORCH_PJRT_CACHE_DIR")
    if value is None:
        return os.path.join(os.path.expanduser("~"), ".cache", "torch_pjrt")
    return "" if value.strip().lower() in _OFF else value


_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def cache_max_bytes_from_env() -> int:
    """TORCH_PJRT_CACHE_MAX_SIZE: the disk tier's size bound (bytes, or 500M, 10G ...; 0: unbounded)."""
    text = os.environ.get("TORCH_PJRT_CACHE_MAX_SIZE", "10G").strip().lower().removesuffix("b").removesuffix("i")
    unit = text[-1:] if text[-1:] in _SIZE_UNITS else ""
    try:
        value = float(text[: len(text) - len(unit)])
    except ValueError:
        raise ValueError(f"torch_pjrt: TORCH_PJRT_CACHE_MAX_SIZE must be a size such as 10G or 500M, got "
                         f"{os.environ['TORCH_PJRT_CACHE_MAX_SIZE']!r}") from None
    return int(value * _SIZE_UNITS[unit])


def _user_frame() -> str:
    """The innermost stack frame outside torch and torch_pjrt: the user's line."""
    here = os.path.dirname(__file__)
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = frame.filename
        if path.startswith(here) or "/torch/" in path or path.startswith("<frozen"):
            continue
        return f"{path}:{frame.lineno} ({frame.line})"
    return "<unknown location>"


def _log_fallback(op: str) -> None:
    _log.warning("pjrt CPU fallback: %s at %s", op, _user_frame())


def configure_from_env() -> None:
    # XLA's INFO lines (e.g. "cpu_device_count set via create_options") are noise
    # for users; the plugin reads this when it starts. An explicit setting wins.
    # The CPU plugins also log an ERROR for every executable read from the disk cache
    # on AVX-512 hosts (LLVM's tuning flags such as +prefer-no-gather are not CPUID
    # features, so its loader's comparison always fails there), several KB each. The
    # cache key holds the host's CPU flags, so a loaded executable always matches its
    # host: for the CPU plugins only fatal lines are shown. Errors still reach the user
    # as exceptions, through PJRT.
    choice = _plugins.choose_plugin()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3" if _plugins.is_cpu(choice) else "1")
    devices = int(os.environ.get("TORCH_PJRT_CPU_DEVICES", "1"))
    # A process waits this long for another's compile of the same program (a fleet
    # sharing TORCH_PJRT_CACHE_DIR) before compiling it itself.
    wait = float(os.environ.get("TORCH_PJRT_CACHE_WAIT_SECONDS", "1800"))
    _C._configure(choice.path, devices if _plugins.is_cpu(choice) else 0, cache_dir_from_env(), choice.hint,
                  list(choice.compile_overrides.items()), cache_max_bytes_from_env(), wait)
    mode = os.environ.get("TORCH_PJRT_EAGER_MODE", "strict").strip().lower() or "strict"
    if mode not in ("strict", "fused", "debug"):
        raise ValueError(f"torch_pjrt: TORCH_PJRT_EAGER_MODE must be strict, fused or debug, got {mode!r}")
    _C._set_eager_mode(mode)
    _C._set_package_dir(os.path.dirname(os.path.abspath(__file__)) + os.sep)
    max_ops = os.environ.get("TORCH_PJRT_FUSED_MAX_OPS")
    if max_ops:
        policy = _C._fusion_policy()
        _C._set_fusion_policy(int(max_ops), int(policy["min_loop"]), bool(policy["detect_loops"]),
                              bool(policy["donate"]))
    isa = os.environ.get("TORCH_PJRT_HOST_KERNEL_ISA")
    if isa and isa not in _C._host_kernel_isas():
        raise ValueError(f"torch_pjrt: TORCH_PJRT_HOST_KERNEL_ISA={isa!r} is not a host kernel variant this CPU "
                         f"runs; it runs {', '.join(_C._host_kernel_isas()) or 'none'}")
    _C._set_fallback_mode(os.environ.get("TORCH_PJRT_FALLBACK", "warn"))
    _C._set_fallback_logger(_log_fallback)
