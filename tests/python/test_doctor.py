"""The portability doctor on small scripts made for each finding
(tests/python/doctor_scripts): each is run by `python -m torch_pjrt.doctor`
in its own process, and the JSON findings must name the kind, file and line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

SCRIPTS = os.path.join(os.path.dirname(__file__), "doctor_scripts")


def doctor(tmp_path: Any, script: str, *options: str) -> tuple[dict[str, Any], subprocess.CompletedProcess]:
    out = os.path.join(tmp_path, "report.json")
    path = os.path.join(SCRIPTS, script)
    done = subprocess.run([sys.executable, "-m", "torch_pjrt.doctor", "--no-progress", "--json", out, *options,
                           path], capture_output=True, text=True, timeout=300)
    assert os.path.exists(out), done.stdout[-3000:] + done.stderr[-3000:]
    with open(out) as f:
        return json.load(f), done


def line_of(script: str, text: str) -> int:
    with open(os.path.join(SCRIPTS, script)) as f:
        return next(i for i, line in enumerate(f, start=1) if text in line)


def findings(report: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["kind"] == kind]


def at(found: list[dict[str, Any]], script: str, line: int) -> list[dict[str, Any]]:
    return [f for f in found if f["file"] and f["file"].endswith(script) and f["line"] == line]


def test_cuda_calls_are_redirected_and_parity_holds(tmp_path: Any) -> None:
    script = "train_cuda.py"
    report, done = doctor(tmp_path, script, "--parity", "--html", os.path.join(tmp_path, "r.html"))
    assert done.returncode == 0, done.stderr[-3000:]
    calls = findings(report, "cuda_call")
    assert at(calls, script, line_of(script, ").cuda()")), calls
    assert at(calls, script, line_of(script, 'x = torch.randn(32, 8, device="cuda")')), calls
    assert report["levels"]["1"]["grade"] == "warn"
    # .item() every step: a host sync per step at that line.
    syncs = at(findings(report, "host_sync"), script, line_of(script, "loss.item()"))
    assert syncs and syncs[0]["count"] == 6 and syncs[0]["severity"] == "warn", findings(report, "host_sync")
    # Parity against CPU float32: the same seeded script, the same numbers.
    assert report["levels"]["3"]["grade"] == "pass", findings(report, "parity")
    assert report["summary"]["parity"]["steps_compared"] == 6
    assert report["summary"]["parity"]["max_rel_error"] < 1e-4
    s = report["summary"]
    assert s["steps"] == 6 and s["warmup_steps"] >= 1 and s["median_step_ms"] > 0
    assert s["throughput_unit"] == "samples/s" and s["peak_device_memory_bytes"] > 0
    page = open(os.path.join(tmp_path, "r.html")).read()
    assert "<svg" in page and "cuda_call" in page


def test_cpu_fallback_is_counted_at_its_line(tmp_path: Any) -> None:
    script = "fallback_op.py"
    report, _ = doctor(tmp_path, script)
    bessel = [f for f in findings(report, "cpu_fallback") if "airy_ai" in f["data"]["op"]]
    assert at(bessel, script, line_of(script, "torch.special.airy_ai")) and bessel[0]["count"] == 3, findings(report, "cpu_fallback")
    assert report["levels"]["2"]["grade"] == "warn"


def test_recompile_storm_fails_level_4_with_buckets(tmp_path: Any) -> None:
    script = "recompile_storm.py"
    report, _ = doctor(tmp_path, script)
    recompiles = at(findings(report, "recompile"), script, line_of(script, "fn = torch.compile"))
    assert recompiles and recompiles[0]["count"] >= 4 and "size mismatch" in recompiles[0]["message"], report
    storm = findings(report, "recompile_storm")
    assert storm and "buckets" in storm[0]["message"], findings(report, "recompile_storm")
    assert report["levels"]["4"]["grade"] == "fail"
    assert findings(report, "compile_backend"), "torch.compile with no backend is reported as redirected"


def test_graph_break_is_reported_at_the_print(tmp_path: Any) -> None:
    script = "graph_break.py"
    report, _ = doctor(tmp_path, script)
    breaks = at(findings(report, "graph_break"), script, line_of(script, 'print("inside the model")'))
    assert breaks, findings(report, "graph_break")
    assert report["levels"]["4"]["grade"] == "warn"
    assert not findings(report, "recompile"), "the doctor itself must not cause recompiles"


def test_nan_is_located_at_the_op_and_line(tmp_path: Any) -> None:
    script = "nan_loss.py"
    report, _ = doctor(tmp_path, script)
    bad = findings(report, "nonfinite")
    assert at(bad, script, line_of(script, "torch.log(h)")), bad
    assert "aten::log" in bad[0]["message"] and bad[0]["data"]["step"] == 1
    assert report["levels"]["3"]["grade"] == "fail"


def test_a_crash_is_reported_with_where_and_why(tmp_path: Any) -> None:
    script = "crash.py"
    report, done = doctor(tmp_path, script)
    assert done.returncode == 1
    assert report["crash"]["type"] == "ValueError" and "ran dry" in report["crash"]["message"]
    assert report["crash"]["line"] == line_of(script, "raise ValueError")
    assert len(report["steps"]) == 2  # what ran before the crash is still measured
    assert "THE SCRIPT FAILED" in done.stdout


def test_attention_by_hand_is_flagged(tmp_path: Any) -> None:
    script = "hand_attention.py"
    report, _ = doctor(tmp_path, script)
    assert at(findings(report, "attention_not_sdpa"), script, line_of(script, "scores.softmax")), report["findings"]


@pytest.mark.parametrize("rate", ["2.5"])
def test_cost_per_million_follows_the_throughput(tmp_path: Any, rate: str) -> None:
    report, _ = doctor(tmp_path, "train_cuda.py", "--hourly-rate", rate, "--samples-per-step", "32",
                       "--baseline-rate", "10", "--baseline-throughput", "1e9")
    s = report["summary"]
    assert s["cost_per_1m"] == pytest.approx(float(rate) / 3600 / s["throughput"] * 1e6)
    assert s["throughput"] == pytest.approx(32 / (s["median_step_ms"] / 1e3))
    assert report["levels"]["6"]["grade"] == "warn"  # dearer than a baseline at 1e9 samples/s


def test_autocast_in_compiled_code_and_scaled_losses(tmp_path: Any) -> None:
    report, done = doctor(tmp_path, "autocast_compiled.py", "--parity")
    assert not report["crash"], report["crash"]
    assert not findings(report, "graph_break"), "the doctor's autocast must not break the graph"
    parity = [f for f in findings(report, "parity") if "max_rel_error" in f["data"]]
    assert parity and parity[0]["data"]["autocast"], findings(report, "parity")
    # The recorded losses are the unscaled ones: GradScaler multiplies by 65536.
    assert report["summary"]["parity"]["max_rel_error"] < 3e-2, report["summary"]["parity"]


def test_a_cuda_extension_gets_the_jax_kernel_route(tmp_path: Any) -> None:
    script = "cuda_extension.py"
    report, _ = doctor(tmp_path, script)
    line = line_of(script, "return load_inline(")
    assert at(findings(report, "cuda_extension"), script, line), report["findings"]
    route = at(findings(report, "custom_kernel_route"), script, line)
    assert route and route[0]["level"] == 2 and "torch_pjrt.library.jax_op" in route[0]["message"], report["findings"]
