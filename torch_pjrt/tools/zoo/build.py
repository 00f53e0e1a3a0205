"""The model of a catalog entry: its class, from the tiny config, with seeded weights."""

from __future__ import annotations

from typing import Any

import torch

from .entry import Entry
from .shrink import tiny_config
from .seeds import WEIGHT_SEED, redraw_constant_matrices


def model_class(entry: Entry) -> type:
    import transformers

    cls = getattr(transformers, entry.model_class, None)
    if cls is None:
        raise ImportError(f"transformers has no class {entry.model_class} (a missing optional dependency?)")
    return cls


def build(entry: Entry, config: Any | None = None) -> tuple[torch.nn.Module, Any]:
    """(model in eval mode, float32, on the CPU; its config). Weights drawn after
    torch.manual_seed(WEIGHT_SEED), so every process builds the same model."""
    from . import diffusers_models

    if diffusers_models.is_diffusers(entry.model_type):
        return diffusers_models.build(entry, config)
    config = config if config is not None else tiny_config(entry.model_type)
    cls = model_class(entry)
    torch.manual_seed(WEIGHT_SEED)
    model = cls(config)
    redraw_constant_matrices(model, float(getattr(config, "initializer_range", 0.02) or 0.02))
    return model.float().eval(), config


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def float64_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of `model`. Mixture-of-experts layers run their eager expert loop there:
    torch's grouped matmul (transformers' default) has no float64 CPU kernel. The same function,
    summed in another order: float64's rounding is far below the bound either way."""
    import copy

    from .diffusers_models import float64_time_embeddings

    m = copy.deepcopy(model).double()
    float64_time_embeddings(m)  # diffusers' time embeddings: float32 whatever the model's dtype
    can_set = getattr(m, "_can_set_experts_implementation", None)
    if can_set is not None:  # the top config may not hold it (a multimodal model's text config does)
        try:
            if can_set():
                m.set_experts_implementation("eager")
        except (ValueError, RuntimeError, ImportError):
            pass
    return m
