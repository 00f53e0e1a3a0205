"""Every knob of the conformance harness in one place: tolerances, dtypes, caps, time limits.

TOLERANCES is the single statement of how close a pjrt result must be to the CPU
result. It is keyed by the dtype of the compared tensor (an output, or a gradient),
not by the dtype of the sample's inputs: ``sin`` of an int64 tensor is a float32
tensor and is compared with the float32 tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float


# Per dtype of the compared tensor; forward outputs and gradients alike. tests/python/conftest.py
# uses the same table for the op tests.
# float32 is the torch.testing default; the low-precision types allow about two ulps
# (XLA and ATen differ in where they round intermediates). Integer and bool: exact.
TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(rtol=1e-7, atol=1e-7),
    torch.float32: Tolerance(rtol=1.3e-5, atol=1e-5),
    torch.bfloat16: Tolerance(rtol=1.6e-2, atol=1e-2),
    torch.float16: Tolerance(rtol=1e-3, atol=1e-3),
    torch.complex64: Tolerance(rtol=1.3e-5, atol=1e-5),
    torch.complex128: Tolerance(rtol=1e-7, atol=1e-7),
}
EXACT = Tolerance(rtol=0.0, atol=0.0)


def tolerance(dtype: torch.dtype) -> Tolerance:
    return TOLERANCES.get(dtype, EXACT)


# The dtypes the harness tries, in order; an op gets those of them that it claims on
# the CPU (OpInfo.supported_dtypes("cpu")).
DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.complex64)
DTYPE_NAMES: dict[str, torch.dtype] = {str(d).removeprefix("torch."): d for d in DTYPES}

# Samples per op per dtype: at most this many, spread evenly over the op's
# reference inputs (which start with its sample inputs). float32 gets more because it
# is the dtype that is also checked for gradients.
MAX_SAMPLES_FLOAT32 = 6
MAX_SAMPLES_OTHER = 3
# Reference inputs enumerated per op and dtype before choosing (bounds generation time).
SAMPLE_POOL = 64

# Wall-clock limit per op (all its dtypes and phases), in the worker, in seconds.
OP_TIME_LIMIT_S = 120.0
# A worker is restarted after this many ops (bounds memory growth of one process).
OPS_PER_WORKER = 200
SEED = 1234

# Ops whose values cannot be compared with the CPU: random ops (their pjrt stream is not
# the CPU's) and ops that return uninitialized memory. Only structure, shapes and
# dtypes are checked. Matched as fnmatch patterns on the op's name (with variant).
PROPERTIES_ONLY_PATTERNS: tuple[str, ...] = (
    "bernoulli",
    "cauchy",
    "exponential",
    "geometric",
    "log_normal",
    "multinomial",
    "normal",
    "normal.*",
    "uniform",
    "rand_like",
    "randint",
    "randint_like",
    "randn",
    "randn_like",
    "nn.functional.dropout*",
    "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.rrelu",
    "nn.functional.fractional_max_pool*",
    "nn.functional.multi_head_attention_forward",
    "nn.functional.scaled_dot_product_attention",
    "svd_lowrank",
    "pca_lowrank",
    "empty",
    "empty_like",
    "empty_strided",
    "empty_permuted",
    "new_empty",
    "new_empty_strided",
)

# Positional args (of the SampleInput's args) that torch requires on the CPU on every device
# (TORCH_CHECK(is_cpu())); OpInfo makes them there, so the device runs get them there too.
HOST_ARGS: dict[str, tuple[int, ...]] = {
    "tensor_split": (0,),  # tensor_indices_or_sections
}

# Ops whose float32 and float64 results differ by definition (cutoffs from the dtype's eps,
# the dtype's own spacing or range, binning): never judged by a float64 run (runner._as_accurate).
NOT_JUDGED_BY_FLOAT64: frozenset[str] = frozenset({
    "nextafter", "nan_to_num", "pinverse", "linalg.pinv", "linalg.matrix_rank", "linalg.lstsq", "histc", "histogram",
    "histogramdd", "frexp",
})

# Ops whose CPU comparison torch's own test suite skips (TestCommon.test_compare_cpu), with
# torch's reason. Their values are still compared here; the report shows the reason next to
# a failure, since some samples have no defined result.
TORCH_SKIPS_CPU_COMPARISON: dict[str, str] = {
    "byte": "Overflow when downcasting signed type is undefined",
    "char": "Overflow when downcasting signed type is undefined",
    "int": "Overflow when downcasting signed type is undefined",
    "long": "Overflow when downcasting signed type is undefined",
    "short": "Overflow when downcasting signed type is undefined",
    "bitwise_left_shift": "Some inputs produce undefined outputs",
    "bitwise_right_shift": "Some inputs produce undefined outputs",
    "unique": "Output order is undefined when sorted=False",
}
