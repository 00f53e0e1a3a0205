"""The host CPU, as reports name it: float32 results and timings depend on it (CPU PyTorch and
XLA pick different kernels on AVX-512, AVX-512 FP16 or AMX), so every report says which one."""

from __future__ import annotations

import functools
import os
import platform

# Flags that change which kernels CPU PyTorch (oneDNN) and XLA pick, as /proc/cpuinfo names them.
_KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile")


@functools.cache
def cpu_description() -> str:
    """E.g. "AMD EPYC 9R14, 2 cores, x86_64 (avx2 avx512f avx512_bf16)"."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
                if model and flags:
                    break
    except OSError:
        pass
    model = model or platform.processor() or "unknown CPU"
    kernel_flags = " ".join(f for f in _KERNEL_FLAGS if f in flags)
    return f"{model}, {os.cpu_count()} cores, {platform.machine()}" + (f" ({kernel_flags})" if kernel_flags else "")
