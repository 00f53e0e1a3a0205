"""Records: one JSON object per architecture, appended to a JSONL file as each finishes.

A record holds the catalog entry (type, class, head, base), the architecture's status
("ran", or an exclusion: cpu-fails, no-config) with its reason, the CPU reference's
figures, and per mode: status, detail, worst error/bound and where, fallen-back ops,
compiles, compile seconds and wall seconds. The last record of a type wins (a rerun
replaces an older one), except that modes it did not run are kept from the record before
it when both ran (a sweep of compiled mode alone adds to the eager modes' records).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from . import judge

RAN = "ran"
Record = dict[str, Any]


def assemble(model_type: str, events: list[dict[str, Any]], modes: list[str], returncode: int | None,
             timed_out: bool, seconds: float, log_tail: str = "") -> Record:
    """The record of a worker from the events it printed, whether or not it finished."""
    for e in events:
        if e.get("event") == "done":
            rec: Record = dict(e["record"])
            rec["seconds"] = round(seconds, 3)
            return rec
    rec = {"type": model_type, "seconds": round(seconds, 3)}
    how = judge.TIMEOUT if timed_out else judge.CRASH
    why = (f"killed after the time limit ({seconds:.0f} s)" if timed_out
           else f"worker {exit_detail(returncode)}")
    ref = next((e for e in events if e.get("event") in ("reference", "excluded")), None)
    if ref is None:  # died on the CPU: the architecture is excluded, not charged to pjrt
        rec.update(status=judge.CPU_FAILS, reason=f"CPU runs: {why}", log=log_tail[-600:])
        return rec
    info = {k: v for k, v in ref.items() if k != "event"}
    if ref["event"] == "excluded":
        rec.update(info)
        return rec
    rec.update(info, status=RAN, modes={})
    started = [e["mode"] for e in events if e.get("event") == "start"]
    for e in events:
        if e.get("event") == "mode":
            rec["modes"][e["mode"]] = {k: v for k, v in e.items() if k not in ("event", "mode")}
    for mode in modes:
        if mode in rec["modes"]:
            continue
        reached = mode in started
        rec["modes"][mode] = {"status": how, "detail": why if reached else f"not reached ({why} in an earlier mode)",
                              "fallbacks": {}, "log": log_tail[-600:] if reached else ""}
    return rec


def exit_detail(code: int | None) -> str:
    import signal

    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code} before its result"


def load(path: str) -> dict[str, Record]:
    """The latest record per type, with the modes it lacks from earlier records of the type when
    both ran (an unreadable last line, from a killed run, is skipped)."""
    found: dict[str, Record] = {}
    if not os.path.exists(path):
        return found
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            earlier = found.get(rec["type"])
            if earlier is not None and earlier.get("status") == RAN and rec.get("status") == RAN:
                rec["modes"] = {**earlier.get("modes", {}), **rec.get("modes", {})}
            found[rec["type"]] = rec
    return found


def complete(rec: Record, modes: list[str], compiled_heads: frozenset[str]) -> bool:
    """Whether a record answers a run of `modes` (a resumed sweep skips it)."""
    if rec.get("status") != RAN:
        return rec.get("status") in judge.EXCLUDED
    wanted = [m for m in modes if m != "compiled" or rec.get("head") in compiled_heads]
    return all(m in rec.get("modes", {}) for m in wanted)


class Writer:
    """Appends records to a JSONL file, one line each, from any thread."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def __call__(self, rec: Record) -> None:
        line = json.dumps(rec, sort_keys=True, default=str)
        with self.lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
