"""Rules on configuration field names (shrink.py, diffusers_models.py)."""

from __future__ import annotations

import re
from collections.abc import Callable


def name_rule(pattern: str) -> Callable[[str], bool]:
    """A predicate on field names: whether `pattern` matches somewhere in the name."""
    rx = re.compile(pattern)
    return lambda name: rx.search(name) is not None
