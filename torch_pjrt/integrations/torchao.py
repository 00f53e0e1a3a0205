"""torchao: float8 dynamic-activation inference on pjrt.

`Float8DynamicActivationFloat8WeightConfig` first asks whether the hardware runs
float8 matmuls, and knows only CUDA (compute capability 8.9 and up), AMD's MI300/MI350
and XPU: on any other device `quantize_` stopped with an AssertionError. pjrt runs what
that config needs with tensorwise and rowwise scales (float8 casts, `torch._scaled_mm`,
`README.md`, "Float8 and torchao"), so for a model whose weights are on pjrt the check
passes; torchao's own check still decides every other case, and the 1x128/128x128
blockwise granularity, which pjrt's `_scaled_mm` does not take.
"""

from __future__ import annotations

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
    check = quant_api._check_hardware_support

    def scaled_mm_runs_it(granularity: Any) -> bool:
        pair = granularity if isinstance(granularity, (tuple, list)) else (granularity, granularity)
        return all(isinstance(g, PerTensor) for g in pair) or all(isinstance(g, PerRow) for g in pair)

    def quantize_tensor(weight: torch.Tensor, config: Any) -> Any:
        if weight.device.type != DEVICE or not scaled_mm_runs_it(config.granularity):
            return original(weight, config)
        # The check reads no device, only the process's CUDA/XPU state: skip it for this
        # weight alone (quantize_ handles one module at a time, in this thread).
        quant_api._check_hardware_support = lambda granularity: None
        try:
            return original(weight, config)
        finally:
            quant_api._check_hardware_support = check

    quant_api._float8_dynamic_activation_float8_weight_quantize_tensor = quantize_tensor
