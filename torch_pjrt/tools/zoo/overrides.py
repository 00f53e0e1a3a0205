"""Per-architecture data the generic rules cannot find (values, never code).

CONFIG_OVERRIDES[type]: constructor arguments of the type's config class, applied
after the generic shrink; a sub-config's overrides sit in a dict under its field
name ({"vision_config": {"image_size": 64}}).
INPUT_OVERRIDES[type]: arguments of inputs.make_inputs (sequence length, audio
samples, which optional inputs to give).
"""

from __future__ import annotations

from typing import Any

CONFIG_OVERRIDES: dict[str, dict[str, Any]] = {
    # heads * head_dim must equal expand * hidden_size (2 * 64): 8 heads of 16.
    "mamba2": {"num_heads": 8},
    # attention_types: [[kinds, repeats]] spelling the layer pattern; one global and one local layer.
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    # The neck reads four backbone layers: four layers, all read.
    "dpt": {"num_hidden_layers": 4, "backbone_out_indices": [0, 1, 2, 3]},
}

INPUT_OVERRIDES: dict[str, dict[str, Any]] = {
}
