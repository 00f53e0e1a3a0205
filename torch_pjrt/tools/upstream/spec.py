"""The spec (spec.toml): per upstream file, the tests expected to fail or be skipped on
pjrt, each with its reason and whether it fails on the CPU as well. A key is a test id,
or a pattern (fnmatch: `*`, `?`) for a family of tests with one cause, such as every
test of a dtype the device lacks; an exact id wins over a pattern. `torch = "<2.14"` (or
">=2.14") keeps an entry to the torch releases whose behaviour it describes."""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import os
import tomllib

SPEC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spec.toml")


@dataclasses.dataclass(frozen=True)
class Entry:
    expect: str  # "fail" or "skip"
    reason: str
    cpu_too: bool  # the test fails on the CPU as well: not pjrt's doing
    # False where the outcome depends on the CPU's own kernels (which differ between
    # machines): a pass then counts as a pass, not as an unexpected one.
    strict: bool = True


def _release(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def applies_to_torch(condition: str, version: str) -> bool:
    """An entry's `torch` condition, "<X.Y" or ">=X.Y", against a torch version."""
    for op, test in (("<", lambda a, b: a < b), (">=", lambda a, b: a >= b)):
        bound = condition[len(op):]
        if condition.startswith(op) and bound[:1].isdigit():
            return test(_release(version), _release(bound))
    raise ValueError(f"torch = {condition!r}: expected '<X.Y' or '>=X.Y'")


@functools.cache
def load(path: str = SPEC) -> dict[str, dict[str, Entry]]:
    import torch
    with open(path, "rb") as f:
        raw = tomllib.load(f)
    spec: dict[str, dict[str, Entry]] = {}
    for file, tests in raw.items():
        spec[file] = {}
        for test, e in tests.items():
            if e.get("expect") not in ("fail", "skip") or not e.get("reason"):
                raise ValueError(f"{path}: {file} {test}: needs expect = 'fail' or 'skip', and a reason")
            if "torch" in e and not applies_to_torch(e["torch"], torch.__version__):
                continue
            spec[file][test] = Entry(e["expect"], e["reason"], bool(e.get("cpu_too", False)),
                                     bool(e.get("strict", True)))
    return spec


def path_in_use() -> str:
    return os.environ.get("TORCH_PJRT_UPSTREAM_SPEC", SPEC)


def check() -> str:
    """"" when the spec in use loads, else what is wrong with it, naming the file."""
    path = path_in_use()
    try:
        load(path)
    except (OSError, tomllib.TOMLDecodeError, ValueError, AttributeError) as ex:
        return f"the spec {path} cannot be used: {type(ex).__name__}: {ex}"
    return ""


def entries_for(file: str) -> dict[str, Entry]:
    return load(path_in_use()).get(file, {})


def lookup(file: str, test: str) -> Entry | None:
    """The spec's entry for one test id: its own, else the first pattern it matches."""
    entries = entries_for(file)
    if test in entries:
        return entries[test]
    for key, entry in entries.items():
        if any(c in key for c in "*?[") and fnmatch.fnmatchcase(test, key):
            return entry
    return None
