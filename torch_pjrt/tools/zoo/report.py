"""docs/zoo.md from the JSONL records: summary per mode, failures grouped by cause, a row
per architecture, compile-time outliers, and the excluded architectures with reasons."""

from __future__ import annotations

import datetime
import os
import re
import subprocess
from collections import Counter, defaultdict
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from ..._host import cpu_description
from . import judge
from .diffusers_models import is_diffusers
from .results import RAN, Record

COMPILE_OUTLIER_S = 60.0
STATUS_ORDER = judge.MODE_STATUSES


@dataclass
class Environment:
    command: str
    date: str
    versions: dict[str, str]


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _commit() -> str:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{rev}+local changes" if dirty else rev or "unknown"


def environment(command: str) -> Environment:
    import platform

    versions = {"python": platform.python_version(), "torch": _version("torch"),
                "transformers": _version("transformers"), "diffusers": _version("diffusers"), "torch_pjrt": f"{_version('torch_pjrt')} (commit {_commit()})",
                "plugin": os.environ.get("TORCH_PJRT_PLUGIN", "cpu") + f" (fastatomstruct-xla-cpu "
                f"{_version('fastatomstruct-xla-cpu')})", "host": cpu_description()}
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return Environment(command, date, versions)


def _modes(records: list[Record]) -> list[str]:
    seen = {m for r in records for m in r.get("modes", {})}
    return [m for m in ("strict", "fused", "compiled") if m in seen]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def normalize(message: str) -> str:
    """A failure message without its numbers and shapes (one cause, many architectures)."""
    text = re.sub(r"\[[0-9, ]*\]|\([0-9, ]*\)", "[#]", message)
    text = re.sub(r"(?<![A-Za-z_])-?\d+(\.\d+)?(e[-+]?\d+)?", "#", text)
    return text[:220]


def _fallback_ops(records: list[Record]) -> dict[str, list[str]]:
    ops: dict[str, set[str]] = defaultdict(set)
    for r in records:
        for m in r.get("modes", {}).values():
            for op in m.get("fallbacks", {}):
                ops[op].add(r["type"])
    return {op: sorted(ts) for op, ts in sorted(ops.items())}


def summary_rows(records: list[Record], modes: list[str]) -> list[str]:
    ran = [r for r in records if r.get("status") == RAN]
    rows = ["| mode | ran | " + " | ".join(STATUS_ORDER) + " | pass rate |",
            "| --- | ---: | " + " | ".join("---:" for _ in STATUS_ORDER) + " | ---: |"]
    for mode in modes:
        counts = Counter(r["modes"][mode]["status"] for r in ran if mode in r.get("modes", {}))
        n = sum(counts.values())
        rate = f"{100.0 * counts[judge.PASS] / n:.1f}%" if n else "-"
        rows.append(f"| {mode} | {n} | " + " | ".join(str(counts[s]) for s in STATUS_ORDER) + f" | {rate} |")
    return rows


def failure_groups(records: list[Record]) -> list[tuple[str, str, list[str], list[str], str]]:
    """(status, normalized message, modes, architectures, an example) per distinct cause, most
    architectures first. Mismatches group by status alone (each names its own tensor)."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        for mode, m in r.get("modes", {}).items():
            status = m["status"]
            if status == judge.PASS:
                continue
            if status == judge.FALLS_BACK:
                key_text = "CPU fallback of " + ", ".join(sorted(m.get("fallbacks", {})))
            elif status == judge.MISMATCH:
                key_text = "outputs or gradients beyond the bound"
            elif status in (judge.TIMEOUT, judge.CRASH):
                key_text = normalize(m.get("detail", ""))
            else:
                key_text = normalize(m.get("detail", ""))
            g = groups.setdefault((status, key_text), {"modes": set(), "types": set(), "example": ""})
            g["modes"].add(mode)
            g["types"].add(r["type"])
            if not g["example"]:
                g["example"] = m.get("detail", "") + (f" at {m['where']}" if m.get("where") else "")
    out = [(s, k, sorted(g["modes"]), sorted(g["types"]), g["example"]) for (s, k), g in groups.items()]
    return sorted(out, key=lambda x: (-len(x[3]), x[0], x[1]))


def _arch_row(r: Record, modes: list[str]) -> str:
    ms = r.get("modes", {})
    cells = []
    for mode in modes:
        m = ms.get(mode)
        cells.append(m["status"] if m else "—")
    worst = max((m.get("worst_ratio", 0.0) or 0.0 for m in ms.values()), default=0.0)
    worst_at = next((m.get("worst_at", "") for m in ms.values() if (m.get("worst_ratio") or 0.0) == worst), "")
    worst_txt = f"{worst:.2g} ({worst_at})" if worst_at else (f"{worst:.2g}" if ms else "")
    problems = [m.get("detail", "") for m in ms.values() if m["status"] in (judge.ERROR, judge.MISMATCH)]
    if problems:
        worst_txt = (worst_txt + "; " if worst_txt else "") + problems[0][:160]
    ops = sorted({op for m in ms.values() for op in m.get("fallbacks", {})})
    compile_s = " / ".join(f"{m.get('compile_seconds', 0):.1f}" for m in (ms.get(x) for x in modes) if m)
    flag = " ⚠" if any((m.get("compile_seconds") or 0) > COMPILE_OUTLIER_S for m in ms.values()) else ""
    return (f"| {r['type']} | {r.get('class', '')} | " + " | ".join(cells) + f" | {_cell(worst_txt)} | "
            f"{_cell(', '.join(ops))} | {compile_s}{flag} | {r.get('seconds', 0):.0f} |")


def render(records: dict[str, Record], env: Environment, catalog_size: int, planned: int,
           results_path: str = "docs/zoo/results.jsonl") -> str:
    recs = [records[t] for t in sorted(records)]
    ran = [r for r in recs if r.get("status") == RAN]
    excluded = [r for r in recs if r.get("status") in judge.EXCLUDED]
    modes = _modes(recs)
    w: list[str] = []
    w.append("# Hugging Face transformers architectures on pjrt")
    w.append("")
    w.append(f"Generated by `{env.command}` ({env.date}); the records are in `{results_path}`.")
    w.append("")
    w.append("- " + ", ".join(f"{k} {v}" for k, v in env.versions.items()) + ".")
    w.append(f"- Catalog: {catalog_size} model types with an auto class; this sweep planned {planned}, "
             f"has records for {len(recs)}: {len(ran)} ran on the CPU and were run on pjrt, "
             f"{len(excluded)} excluded ({sum(r['status'] == judge.CPU_FAILS for r in excluded)} cpu-fails, "
             f"{sum(r['status'] == judge.NO_CONFIG for r in excluded)} no-config).")
    w.append("- Each type runs one class (the first of masked LM, seq2seq LM, speech seq2seq, causal LM, image "
             "classification, CTC, audio classification, sequence classification, image-text-to-text, ..., else "
             "the base model) from a tiny random config (`torch_pjrt/tools/zoo/shrink.py`), batch 2, "
             "in eval mode with gradients: forward, then backward of sum over floating outputs of "
             "(output * fixed random weights). Every floating output and parameter gradient on pjrt is judged "
             "against CPU float64: error <= 16 x |CPU float32 - float64|max + 16 ulps(float32) x max|float64|.")
    w.append("- Types named diffusers/<Class> are diffusers' UNet, autoencoder and diffusion-transformer classes "
             "(`torch_pjrt/tools/zoo/diffusers_models.py`: the constructor's defaults shrunk, sample + timestep + "
             "conditioning inputs), listed in their own section below and counted in the summary.")
    w.append("- Statuses per mode: **pass**; **mismatch** (a tensor beyond its bound; the worst named); "
             "**error** (pjrt raised: type and first line); **falls back** (values within bounds but some op "
             "ran through the CPU fallback); **timeout**; **crash** (the worker died). A mismatch outranks a "
             "fallback; fallen-back ops are listed either way. Pass rate: pass / ran.")
    w.append("")
    w.append("## Summary")
    w.append("")
    w.extend(summary_rows(recs, modes))
    w.append("")
    outliers = [(r["type"], mode, m.get("compile_seconds", 0)) for r in ran for mode, m in r["modes"].items()
                if (m.get("compile_seconds") or 0) > COMPILE_OUTLIER_S]
    w.append(f"## Compile-time outliers (> {COMPILE_OUTLIER_S:.0f} s of XLA compiles in a mode)")
    w.append("")
    if outliers:
        for t, mode, s in sorted(outliers, key=lambda x: -x[2]):
            w.append(f"- {t} ({mode}): {s:.0f} s")
    else:
        w.append("None.")
    w.append("")
    w.append("## Failures by cause")
    w.append("")
    groups = failure_groups(recs)
    if groups:
        w.append("| status | cause (normalized) | modes | architectures | example |")
        w.append("| --- | --- | --- | --- | --- |")
        for status, text, ms, types, example in groups:
            w.append(f"| {status} | {_cell(text)} | {', '.join(ms)} | {len(types)}: {_cell(', '.join(types))} | "
                     f"{_cell(example[:300])} |")
    else:
        w.append("None.")
    w.append("")
    fb = _fallback_ops(recs)
    if fb:
        w.append("CPU fallbacks by op: " + "; ".join(f"`{op}` ({', '.join(ts)})" for op, ts in fb.items()) + ".")
        w.append("")
    w.append("## Architectures")
    w.append("")
    w.append("Worst error/bound over every output and gradient of every mode (< 1 passes) and where; compile s "
             f"per mode ({' / '.join(modes)}; ⚠ over {COMPILE_OUTLIER_S:.0f} s); time: the architecture's wall "
             "seconds in its worker (CPU references and every mode; the first in a worker also pays its imports).")
    w.append("")
    w.append("| type | class | " + " | ".join(modes) + " | worst error/bound | fallen-back ops | compile s | time s |")
    w.append("| --- | --- | " + " | ".join("---" for _ in modes) + " | --- | --- | ---: | ---: |")
    for r in ran:
        if not is_diffusers(r["type"]):
            w.append(_arch_row(r, modes))
    w.append("")
    diffusion = [r for r in ran if is_diffusers(r["type"])]
    if diffusion:
        w.append("## diffusers models")
        w.append("")
        w.append("The same columns, for diffusers' model classes.")
        w.append("")
        w.append("| type | class | " + " | ".join(modes) + " | worst error/bound | fallen-back ops | compile s | time s |")
        w.append("| --- | --- | " + " | ".join("---" for _ in modes) + " | --- | --- | ---: | ---: |")
        w.extend(_arch_row(r, modes) for r in diffusion)
        w.append("")
    w.append("## Excluded")
    w.append("")
    w.append("Not run on pjrt: the tiny config or the model did not build or run on the CPU (cpu-fails), or the "
             "config class has no usable defaults (no-config).")
    w.append("")
    w.append("| type | class | status | reason |")
    w.append("| --- | --- | --- | --- |")
    for r in excluded:
        w.append(f"| {r['type']} | {r.get('class', '')} | {r['status']} | {_cell(r.get('reason', ''))[:300]} |")
    w.append("")
    return "\n".join(w)


NOTES_HEADING = "## Notes (by hand)"


def write(path: str, records: dict[str, Record], env: Environment, catalog_size: int, planned: int,
          results_path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    notes = ""
    if os.path.exists(path):  # a section written by hand (causes found, what is left) stays
        with open(path, encoding="utf-8") as f:
            old = f.read()
        at = old.find(NOTES_HEADING)
        notes = old[at:] if at >= 0 else ""
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(records, env, catalog_size, planned, results_path))
        if notes:
            f.write("\n" + notes)
