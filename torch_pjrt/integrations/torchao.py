"""torchao: float8 dynamic-activation inference and int4 weight-only quantization on pjrt.

`Float8DynamicActivationFloat8WeightConfig` first asks whether the hardware runs
float8 matmuls, and knows only CUDA (compute capability 8.9 and up), AMD's MI300/MI350
and XPU: on any other device `quantize_` stopped with an AssertionError. pjrt runs what
that config needs with tensorwise and rowwise scales (float8 casts, `torch._scaled_mm`,
`README.md`, "Float8 and torchao"), so for a model whose weights are on pjrt the check
passes; torchao's own check still decides every other case, and the 1x128/128x128
blockwise granularity, which pjrt's `_scaled_mm` does not take.

`Int4WeightOnlyConfig` keeps int4 weights in a device's own format: the default
"plain" one calls CUDA kernels (the mslk package), and "plain_int32", the format
torchao gives XPU and NPU, had no pjrt branch. pjrt gets one: two 4-bit values per
byte (even column in the low nibble), with torchao's asymmetric groupwise scales and
zero points (`choose_qparams_affine`/`quantize_affine`, as for XPU); a linear unpacks
and dequantizes the weight, `(q - zero_point) * scale`, then multiplies, all native
ops (one fused program under torch.compile, the weight read as int4 from memory). A
pjrt weight asked for the "plain" format gets this one. Its `qdata` is pjrt's own
(uint8 `[N, K/2]`, not XPU's int4pack layout): a quantized state dict moves between
pjrt processes, not to XPU or NPU.
"""

from __future__ import annotations

import contextvars
import copy
from types import ModuleType
from typing import Any

import torch

from . import DEVICE, patch

TESTED = ("0.18.0", "0.19.0")


@patch("torchao.float8_inference_hardware", "torchao.quantization.quant_api", "torchao", TESTED,
       "Float8DynamicActivationFloat8WeightConfig refused every device but recent CUDA, MI300+ and XPU: "
       "quantize_ raised on pjrt, which runs its tensorwise and rowwise scaled matmuls")
def _float8_inference_hardware(quant_api: ModuleType) -> None:
    from torchao.quantization.granularity import PerRow, PerTensor

    original = quant_api._float8_dynamic_activation_float8_weight_quantize_tensor
    original_check = quant_api._check_hardware_support
    # Set while a pjrt weight is quantized, in this thread or task alone (rank threads may
    # quantize at the same time): the check reads no device, only the process's CUDA/XPU state.
    quantizing_for_pjrt: contextvars.ContextVar[bool] = contextvars.ContextVar("torch_pjrt_float8_weight",
                                                                               default=False)

    def check(granularity: Any) -> None:
        if not quantizing_for_pjrt.get():
            original_check(granularity)

    def scaled_mm_runs_it(granularity: Any) -> bool:
        pair = granularity if isinstance(granularity, (tuple, list)) else (granularity, granularity)
        return all(isinstance(g, PerTensor) for g in pair) or all(isinstance(g, PerRow) for g in pair)

    def quantize_tensor(weight: torch.Tensor, config: Any) -> Any:
        if weight.device.type != DEVICE or not scaled_mm_runs_it(config.granularity):
            return original(weight, config)
        token = quantizing_for_pjrt.set(True)
        try:
            return original(weight, config)
        finally:
            quantizing_for_pjrt.reset(token)

    quant_api._check_hardware_support = check
    quant_api._float8_dynamic_activation_float8_weight_quantize_tensor = quantize_tensor


@patch("torchao.int4_plain_int32_pjrt", "torchao.quantization.quantize_.workflows.int4.int4_plain_int32_tensor",
       "torchao", TESTED,
       "Int4PlainInt32Tensor (int4_packing_format='plain_int32') packs and multiplies for XPU and NPU only: "
       "quantize_ raised NotImplementedError for a pjrt weight")
def _int4_plain_int32(module: ModuleType) -> None:
    tensor_cls = module.Int4PlainInt32Tensor
    original_from_hp = tensor_cls.from_hp.__func__

    def from_hp(cls: type, w: torch.Tensor, block_size: list[int]) -> Any:
        if w.device.type != DEVICE:
            return original_from_hp(cls, w, block_size)
        return _int4_from_hp(cls, w, block_size)

    tensor_cls.from_hp = classmethod(from_hp)
    aten_table = tensor_cls._ATEN_OP_TABLE[tensor_cls]
    function_table = tensor_cls._TORCH_FN_TABLE[tensor_cls]
    for table, key in ((aten_table, torch.ops.aten.linear.default), (function_table, torch.nn.functional.linear)):
        table[key] = _int4_linear_for(table[key])


def _int4_from_hp(cls: type, w: torch.Tensor, block_size: list[int]) -> Any:
    from torchao.quantization.quant_primitives import MappingType, choose_qparams_affine, quantize_affine

    if w.ndim != 2 or len(block_size) != 2 or block_size[0] != 1 or w.shape[1] % 2:
        raise ValueError(f"int4 weight-only on {DEVICE}: a 2-D weight with groups along its rows and an even "
                         f"number of columns, got shape {tuple(w.shape)} and block size {block_size}")
    from ..modes import eager_mode

    # Op by op, each result rounded to the weight's dtype as on the CPU: a fused program keeps
    # float32 between ops (XLA's excess precision), which moves a value on a rounding
    # boundary to the next integer.
    with eager_mode("strict"):
        scale, zero_point = choose_qparams_affine(w, MappingType.ASYMMETRIC, block_size, torch.int32, 0, 15, 1e-6,
                                                  None, torch.int32)
        values = quantize_affine(w, block_size, scale, zero_point, torch.int32, 0, 15)
    packed = (values[:, 1::2] << 4 | values[:, ::2]).to(torch.uint8)  # two per byte, even column low
    rows = w.shape[0]
    return cls(packed, scale.reshape(rows, -1).t().contiguous(),
               zero_point.reshape(rows, -1).t().contiguous().to(torch.int8), block_size, w.shape)


def _int4_linear_for(original: Any) -> Any:
    def linear(func: Any, types: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        x, weight = args[0], args[1]
        bias = args[2] if len(args) > 2 else None
        if x.device.type != DEVICE:
            return original(func, types, args, kwargs)
        if weight.act_pre_scale is not None:  # set by AWQ and SmoothQuant, as torchao's XPU/NPU kernels apply it
            x = x * weight.act_pre_scale
        return torch.nn.functional.linear(x, _int4_dequantized(weight, x.dtype), bias)
    return linear


def _int4_dequantized(weight: Any, dtype: torch.dtype) -> torch.Tensor:
    """The weight in `dtype`: `(q - zero_point) * scale` per group, as torchao dequantizes."""
    packed = weight.qdata
    rows, columns = weight.shape
    group = weight.block_size[1]
    values = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(rows, columns // group, group)
    scale = weight.scale.t().unsqueeze(-1)  # [rows, groups, 1]
    zero_point = weight.zero_point.t().unsqueeze(-1).to(scale.dtype)
    return ((values.to(scale.dtype) - zero_point) * scale).reshape(rows, columns).to(dtype)


@patch("torchao.int4_default_format", "torchao.quantization.quant_api", "torchao", TESTED,
       "Int4WeightOnlyConfig's default 'plain' format calls CUDA's int4 kernels (it asked for the mslk "
       "package): a pjrt weight gets the 'plain_int32' format, which pjrt runs")
def _int4_default_format(quant_api: ModuleType) -> None:
    from torchao.quantization.quantize_.workflows import Int4PackingFormat

    original = quant_api._int4_weight_only_quantize_tensor

    def quantize_tensor(weight: torch.Tensor, config: Any) -> Any:
        if weight.device.type == DEVICE and config.int4_packing_format == Int4PackingFormat.PLAIN:
            config = copy.copy(config)
            config.int4_packing_format = Int4PackingFormat.PLAIN_INT32
        return original(weight, config)

    quant_api._int4_weight_only_quantize_tensor = quantize_tensor
