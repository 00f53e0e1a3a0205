"""TRL: its trainers pad every batch to a few lengths on pjrt, as they do on Neuron.

TRL's configs default to ``pad_to_multiple_of="auto"``: a multiple of 128 on Neuron,
"which compiles once per input shape", and no padding elsewhere. pjrt compiles per
input shape too (each op's program in eager mode, each graph in fused mode and under
torch.compile): unpadded, every batch of a new length compiled every op of the step
again (an SFT run of three steps of a tiny Llama: 585 programs, 40 s of its 43 s).
On pjrt "auto" pads like on Neuron, to a multiple of 128, or of ``max_length`` when
that is shorter (sequences are truncated to it, so every batch then has one shape).
An explicit ``pad_to_multiple_of`` (a number, or None) is left alone.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from . import DEVICE, patch

TESTED = ("1.16.0", "1.17.0")
MULTIPLE = 128  # TRL's own choice for Neuron

# The configs whose __post_init__ resolves "auto" (trl 1.16): module -> class.
_CONFIGS = {
    "trl.trainer.sft_config": "SFTConfig",
    "trl.trainer.dpo_config": "DPOConfig",
    "trl.trainer.kto_config": "KTOConfig",
    "trl.trainer.reward_config": "RewardConfig",
    "trl.trainer.grpo_config": "GRPOConfig",
    "trl.trainer.rloo_config": "RLOOConfig",
    "trl.trainer.distillation_config": "DistillationConfig",
}


def padding_multiple(max_length: int | None) -> int:
    """The multiple "auto" means on pjrt for a config truncating to `max_length`."""
    return min(MULTIPLE, max_length) if max_length else MULTIPLE


def _pad_on_device(module: ModuleType, class_name: str) -> None:
    cls = getattr(module, class_name)
    original = cls.__post_init__

    def __post_init__(self: Any) -> None:
        auto = self.pad_to_multiple_of == "auto"
        original(self)  # resolves "auto": 128 on Neuron, else None
        if auto and self.pad_to_multiple_of is None and self.device.type == DEVICE:
            self.pad_to_multiple_of = padding_multiple(getattr(self, "max_length", None))

    cls.__post_init__ = __post_init__


def _declare(module_name: str, class_name: str) -> None:
    @patch(f"trl.pad_to_multiple_of.{class_name}", module_name, "trl", TESTED,
           f"{class_name}(pad_to_multiple_of='auto') pads only on Neuron: on pjrt every batch of a new "
           "length compiled the step's programs again")
    def apply(module: ModuleType) -> None:
        _pad_on_device(module, class_name)


for _module, _class in _CONFIGS.items():
    _declare(_module, _class)
