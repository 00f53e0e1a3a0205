"""Automatic mixed precision: ``torch.autocast("pjrt", dtype=torch.bfloat16)``.

PyTorch registers autocast kernels for CPU, CUDA, XPU, MPS, MTIA and MAIA, but
nothing at all for the AutocastPrivateUse1 key: not even the fallthrough, so
without this module every op inside ``torch.autocast("pjrt")`` raises
"Could not run ... with arguments from the 'Autocastpjrt' backend".

This module registers, from Python and only where PyTorch (or the C++
extension) has not already done so:

* a fallthrough for every op at AutocastPrivateUse1 (ops not listed below run
  unchanged, in whatever dtype their inputs have);
* per-op kernels following the same policy classes as PyTorch's CUDA autocast
  (``aten/src/ATen/autocast_mode.h``): matmuls, convolutions and attention run
  in the autocast dtype; numerically sensitive pointwise ops, norms and losses
  run in float32; reductions and softmaxes get ``dtype=float32`` when their
  input is eligible; ops combining several inputs run in the widest input type;
  ``binary_cross_entropy`` is refused (use the ``_with_logits`` form).

A tensor is cast only when it is a floating-point, non-float64 tensor on the
pjrt device. Unlike PyTorch's C++ autocast there is no cast cache: a float32
weight used by several ops under one autocast region is cast once per use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.library import Library, fallthrough_kernel

_KEY = "AutocastPrivateUse1"
_DISPATCH_KEY = torch._C.DispatchKey.AutocastPrivateUse1

# Run in the autocast dtype (CUDA's lower_precision_fp list, less the cuDNN-only ops).
LOWER_PRECISION = [
    "_convolution", "_convolution.deprecated", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr", "matmul",
    "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
]
# Run in float32.
FLOAT32 = [
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "sinh",
    "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm", "native_layer_norm",
    "group_norm", "rms_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim", "norm.Scalar",
    "norm.ScalarOpt_dim", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp", "grid_sampler",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d",
    "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
]
# Given dtype=float32 (unless the caller chose a dtype) when the first argument is eligible.
FLOAT32_OPT_DTYPE = [
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList",
]
# Run in the widest floating type among the inputs.
PROMOTE = [
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "index_put", "tensordot", "scatter_add",
]
# Refused under autocast, as on CUDA.
BANNED = {
    "binary_cross_entropy": (
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast. Use "
        "torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss instead, or compute "
        "the loss outside the autocast region."
    ),
}

_libs: list[Library] = []
registered: dict[str, str] = {}  # "aten::op.overload" -> policy, for what this module registered


def _device_type() -> str:
    return torch._C._get_privateuse1_backend_name()


def _eligible(t: Any, device_type: str) -> bool:
    return (isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
            and t.device.type == device_type)


def _cast(value: Any, dtype: torch.dtype, device_type: str) -> Any:
    if _eligible(value, device_type):
        return value if value.dtype == dtype else value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype, device_type) for v in value)
    if isinstance(value, dict):
        return {k: _cast(v, dtype, device_type) for k, v in value.items()}
    return value


def _tensors(value: Any):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def _widest(args: tuple, kwargs: dict, start: torch.dtype, device_type: str) -> torch.dtype:
    """PyTorch's autocast promote_type: float32 as soon as any eligible input is float32
    (or the low-precision types are mixed); float64 inputs are ignored."""
    current = start
    for t in _tensors((args, list(kwargs.values()))):
        if not _eligible(t, device_type) or t.dtype == current:
            continue
        current = torch.float32
    return current


def _without_autocast() -> torch._C._ExcludeDispatchKeyGuard:
    return torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_DISPATCH_KEY))


def _kernel(op: torch._ops.OpOverload, policy: str) -> Callable[..., Any]:
    device_type = _device_type()
    if policy == "lower_precision":
        def kernel(*args: Any, **kwargs: Any) -> Any:
            dtype = torch.get_autocast_dtype(device_type)
            with _without_autocast():
                return op(*_cast(args, dtype, device_type), **_cast(kwargs, dtype, device_type))
    elif policy == "float32":
        def kernel(*args: Any, **kwargs: Any) -> Any:
            with _without_autocast():
                return op(*_cast(args, torch.float32, device_type), **_cast(kwargs, torch.float32, device_type))
    elif policy == "promote":
        def kernel(*args: Any, **kwargs: Any) -> Any:
            dtype = _widest(args, kwargs, torch.get_autocast_dtype(device_type), device_type)
            with _without_autocast():
                return op(*_cast(args, dtype, device_type), **_cast(kwargs, dtype, device_type))
    elif policy == "float32_opt_dtype":
        schema_args = op._schema.arguments
        index = next(i for i, a in enumerate(schema_args) if a.name == "dtype")
        kwarg_only = schema_args[index].kwarg_only

        def kernel(*args: Any, **kwargs: Any) -> Any:
            with _without_autocast():
                if not (args and _eligible(args[0], device_type)):
                    return op(*args, **kwargs)
                if kwarg_only or len(args) <= index:
                    if kwargs.get("dtype") is None:
                        kwargs = {**kwargs, "dtype": torch.float32}
                elif args[index] is None:
                    args = args[:index] + (torch.float32,) + args[index + 1:]
                return op(*args, **kwargs)
    else:
        raise ValueError(policy)
    return kernel


def _banned(message: str) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(message)
    return kernel


def _overload(name: str) -> torch._ops.OpOverload | None:
    base, _, overload = name.partition(".")
    try:
        return getattr(getattr(torch.ops.aten, base), overload or "default")
    except (AttributeError, RuntimeError):
        return None  # not in this PyTorch version


def register() -> None:
    """Registers the fallthrough and the per-op kernels that are missing. Idempotent."""
    if _libs:
        return
    if not torch._C._dispatch_has_backend_fallback(_DISPATCH_KEY):
        fallback_lib = Library("_", "IMPL")
        fallback_lib.fallback(fallthrough_kernel, _KEY)
        _libs.append(fallback_lib)
    lib = Library("aten", "IMPL")
    _libs.append(lib)
    table = ([(n, "lower_precision") for n in LOWER_PRECISION] + [(n, "float32") for n in FLOAT32]
             + [(n, "float32_opt_dtype") for n in FLOAT32_OPT_DTYPE] + [(n, "promote") for n in PROMOTE]
             + [(n, "banned") for n in BANNED])
    for name, policy in table:
        op = _overload(name)
        if op is None:
            continue
        qualified = f"aten::{name}"
        if torch._C._dispatch_has_kernel_for_dispatch_key(qualified, _KEY):
            continue  # registered natively (by PyTorch or by the C++ extension)
        kernel = _banned(BANNED[name]) if policy == "banned" else _kernel(op, policy)
        lib.impl(name, kernel, _KEY)
        registered[qualified] = policy
