"""The doctor's report: terminal text, JSON records, one self-contained HTML page."""

from __future__ import annotations

import html
import json
from typing import Any

from .assess import Report

_MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skipped": "----"}


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def summary_lines(report: Report) -> list[str]:
    s = report.summary
    lines = []
    if "median_step_ms" in s:
        lines.append(f"steps: {s['steps']} ({s['warmup_steps']} warm-up discarded); first step {s['cold_start_s']:.2f} s; "
                     f"median {s['median_step_ms']:.1f} ms (p10 {s['p10_step_ms']:.1f}, p90 {s['p90_step_ms']:.1f}); "
                     f"{s['throughput']:,.0f} {s['throughput_unit']} ({s['throughput_basis']})")
        lines.append(f"peak device memory {_fmt_bytes(s['peak_device_memory_bytes'])}; per step host->device "
                     f"{_fmt_bytes(s['h2d_bytes_per_step'])}, device->host {_fmt_bytes(s['d2h_bytes_per_step'])}"
                     + (f"; fused graphs per step {s['fused_graphs_per_step']:g}" if "fused_graphs_per_step" in s else ""))
    if "parity" in s and s["parity"]["max_rel_error"] is not None:
        lines.append(f"loss parity vs CPU float32 over {s['parity']['steps_compared']} steps: max relative error "
                     f"{s['parity']['max_rel_error']:.2e}")
    if "cost_per_1m" in s:
        lines.append(f"cost per 1M {s['throughput_unit'].split('/')[0]}: ${s['cost_per_1m']:.4f}"
                     + (f" (baseline ${s['baseline_cost_per_1m']:.4f})" if "baseline_cost_per_1m" in s else ""))
    return lines


def to_text(report: Report, max_per_level: int = 12) -> str:
    out = [f"torch_pjrt doctor: {report.script} {' '.join(report.argv)}".rstrip(), ""]
    if report.crash:
        c = report.crash
        where = f" at {c['file']}:{c['line']}" if c["file"] else ""
        out += [f"THE SCRIPT FAILED{where}: {c['type']}: {c['message']}", ""]
    for n, level in report.levels.items():
        found = [f for f in report.findings if f.level == n]
        out.append(f"[{_MARK[level['grade']]}] level {n}: {level['name']}")
        shown = [f for f in found if f.severity != "info"] + [f for f in found if f.severity == "info"]
        for f in shown[:max_per_level]:
            where = f"  ({f.where()})" if f.file else ""
            count = f" x{f.count}" if f.count > 1 else ""
            out.append(f"    {f.severity:>4}  {f.kind}: {f.message}{count}{where}")
        if len(shown) > max_per_level:
            out.append(f"          ... {len(shown) - max_per_level} more in --json")
        if not found and level["grade"] == "skipped":
            out.append("          not measured" + (" (run with --parity)" if n == 3 else
                                                    " (run with --hourly-rate)" if n == 6 else ""))
    out += [""] + summary_lines(report)
    return "\n".join(out)


def to_json(report: Report) -> dict[str, Any]:
    return {"script": report.script, "argv": report.argv,
            "levels": {str(n): lv for n, lv in report.levels.items()},
            "findings": [f.to_json() for f in report.findings], "summary": report.summary,
            "steps": report.steps, "crash": report.crash}


def write_json(report: Report, path: str) -> None:
    with open(path, "w") as f:
        json.dump(to_json(report), f, indent=1, default=str)


def _svg_step_plot(steps: list[dict[str, Any]], width: int = 640, height: int = 200) -> str:
    if not steps:
        return "<p>No steps measured.</p>"
    ms = [s["seconds"] * 1e3 for s in steps]
    top = max(ms) * 1.1 or 1.0
    pad = 40
    x = lambda i: pad + i * (width - 2 * pad) / max(1, len(ms) - 1)  # noqa: E731
    y = lambda v: height - pad + 10 - v / top * (height - 2 * pad)  # noqa: E731
    points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(ms))
    compiles = "".join(f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="3" fill="#c33"><title>step {i}: '
                       f'{s["compiles"]} compiles</title></circle>' for i, (v, s) in enumerate(zip(ms, steps))
                       if s["compiles"])
    return (f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg" font-size="11">'
            f'<line x1="{pad}" y1="{y(0):.1f}" x2="{width - pad}" y2="{y(0):.1f}" stroke="#999"/>'
            f'<line x1="{pad}" y1="{y(0):.1f}" x2="{pad}" y2="{y(top):.1f}" stroke="#999"/>'
            f'<text x="2" y="{y(top) + 4:.1f}">{top:.0f} ms</text><text x="{pad}" y="{height - 4}">step 0</text>'
            f'<text x="{width - pad - 40}" y="{height - 4}">step {len(ms) - 1}</text>'
            f'<polyline fill="none" stroke="#36c" stroke-width="1.5" points="{points}"/>{compiles}</svg>'
            '<p>Step time per step; red dots: steps that compiled programs.</p>')


def to_html(report: Report) -> str:
    e = html.escape
    rows = "".join(
        f"<tr><td>{f.level}</td><td class='{f.severity}'>{e(f.severity)}</td><td>{e(f.kind)}</td>"
        f"<td>{e(f.message)}</td><td>{e(f.where())}</td><td>{f.count}</td></tr>" for f in report.findings)
    levels = "".join(f"<tr><td>{n}</td><td>{e(lv['name'])}</td><td class='{lv['grade']}'>{lv['grade']}</td></tr>"
                     for n, lv in report.levels.items())
    crash = ""
    if report.crash:
        crash = f"<h2>The script failed</h2><pre>{e(report.crash['traceback'])}</pre>"
    summary = "".join(f"<li>{e(line)}</li>" for line in summary_lines(report))
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>torch_pjrt doctor: {e(report.script)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;vertical-align:top}}.pass{{color:#272}}.warn{{color:#b70}}
.fail{{color:#c22;font-weight:bold}}.info{{color:#666}}.skipped{{color:#999}}</style></head><body>
<h1>torch_pjrt doctor</h1><p><code>{e(report.script)} {e(' '.join(report.argv))}</code></p>{crash}
<h2>Levels</h2><table><tr><th>level</th><th>checklist item</th><th>grade</th></tr>{levels}</table>
<h2>Summary</h2><ul>{summary}</ul><h2>Step time</h2>{_svg_step_plot(report.steps)}
<h2>Findings</h2><table><tr><th>level</th><th>severity</th><th>kind</th><th>message</th><th>where</th>
<th>count</th></tr>{rows}</table></body></html>"""


def write_html(report: Report, path: str) -> None:
    with open(path, "w") as f:
        f.write(to_html(report))
