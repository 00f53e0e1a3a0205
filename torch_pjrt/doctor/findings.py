"""What the doctor found: records, and the user's line they point at."""

from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB = tuple({sysconfig.get_paths()["stdlib"] + os.sep, sysconfig.get_paths()["platstdlib"] + os.sep})
_SKIP = (_TORCH_DIR, _PACKAGE_DIR, "<frozen", *_STDLIB)

LEVELS = {
    1: "device and API portability",
    2: "operator and library coverage",
    3: "numerical parity",
    4: "compilation and shape stability",
    5: "performance",
    6: "cost",
}


@dataclass
class Finding:
    level: int
    kind: str
    message: str
    file: str | None = None
    line: int | None = None
    count: int = 1
    severity: str = "warn"  # info, warn or fail: what it does to its level's grade
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def where(self) -> str:
        if not self.file:
            return ""
        return f"{os.path.relpath(self.file)}:{self.line}" if self.line else os.path.relpath(self.file)


def user_site(depth: int = 2) -> tuple[str | None, int | None]:
    """The innermost frame outside torch, torch_pjrt and the standard library's
    runpy: the user's file and line."""
    try:
        frame = sys._getframe(depth)
    except ValueError:  # a shallow stack: a callback on autograd's backward thread
        frame = sys._getframe(0)
    library = None  # an installed library's frame: the answer only if no user frame calls it
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_SKIP) and not path.startswith("<"):
            if "site-packages" not in path and "dist-packages" not in path:
                return path, frame.f_lineno
            library = library or (path, frame.f_lineno)
        frame = frame.f_back
    return library or (None, None)


class Findings:
    """Findings merged by (level, kind, file, line, message): repeats add to the count."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[Any, ...], Finding] = {}

    def add(self, finding: Finding) -> Finding:
        key = (finding.level, finding.kind, finding.file, finding.line, finding.message)
        known = self._by_key.get(key)
        if known is None:
            self._by_key[key] = finding
            return finding
        known.count += finding.count
        return known

    def remove(self, finding: Finding) -> None:
        self._by_key.pop((finding.level, finding.kind, finding.file, finding.line, finding.message), None)

    def all(self) -> list[Finding]:
        return sorted(self._by_key.values(), key=lambda f: (f.level, f.kind, f.file or "", f.line or 0))

    def of_level(self, level: int) -> list[Finding]:
        return [f for f in self.all() if f.level == level]


def grade(findings: list[Finding], checked: bool = True) -> str:
    """pass / warn / fail for a level; "skipped" when the level was not measured."""
    if not checked:
        return "skipped"
    if any(f.severity == "fail" for f in findings):
        return "fail"
    if any(f.severity == "warn" for f in findings):
        return "warn"
    return "pass"
