"""One model type of the zoo's catalog (catalog.py, diffusers_models.py): the class it runs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    model_type: str
    config_class: str  # "" when CONFIG_MAPPING_NAMES has none
    head: str  # a HEADS name, or BASE, or "other:<mapping>"
    model_class: str  # the class run
    base_class: str  # MODEL_MAPPING_NAMES' class, "" when none
