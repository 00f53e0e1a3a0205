"""Architectures in this process, one after another.

    python -m torch_pjrt.tools.zoo.worker TYPE --modes strict,fused   # one, then exit
    python -m torch_pjrt.tools.zoo.worker --serve                     # requests on stdin

Each architecture prints one JSON line per phase as it ends, so that a crash or a timeout
still leaves what finished: {"event": "reference", ...} after the CPU runs (or {"event":
"excluded", ...} when the architecture does not build or run on the CPU), {"event":
"mode", ...} per pjrt mode, and last {"event": "done", "record": {...}}, the whole
record (results.py). With --serve, each stdin line is a request {"type": ..., "modes":
[...], "log": path}: the worker moves its stderr to `log` and runs the architecture;
it exits at the end of its input. One process serves many architectures so that
torch's, transformers' and the models' imports are paid once per worker, not per
architecture (pool.py restarts a worker that dies or overruns).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # random weights only: never reach for the hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import argparse  # noqa: E402
import copy  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from . import build, catalog, execute, inputs, judge  # noqa: E402
from .shrink import default_config, tiny_config  # noqa: E402

MODES = ("strict", "fused", "compiled")
COMPILED_HEADS = frozenset({"causal-lm"})  # compiled mode runs for these heads only


def emit(event: dict[str, Any]) -> None:
    print(json.dumps(event, default=str), flush=True)


def first_line(ex: BaseException) -> str:
    text = str(ex).strip()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return f"{type(ex).__name__}: {line[:400]}" if line else type(ex).__name__


def where(ex: BaseException) -> str:
    """The innermost frame, and the innermost one in a model's own code (where the op was called)."""
    frames = traceback.extract_tb(ex.__traceback__)
    if not frames:
        return ""

    def short(f: traceback.FrameSummary) -> str:
        return f"{f.filename.split('site-packages/')[-1]}:{f.lineno} ({f.name})"

    model_frames = [f for f in frames if "/transformers/models/" in f.filename or "/transformers/integrations/" in f.filename
                    or "/diffusers/models/" in f.filename]
    inner = short(frames[-1])
    if model_frames and model_frames[-1] is not frames[-1]:
        return f"{short(model_frames[-1])} -> {inner}"
    return inner


def reference(entry: catalog.Entry) -> tuple[dict[str, Any], Any]:
    """The CPU float32 and float64 runs, or the reason the architecture is excluded."""
    try:
        default_config(entry.model_type)
    except Exception as ex:  # noqa: BLE001
        return {"status": judge.NO_CONFIG, "reason": f"default config: {first_line(ex)}"}, None
    stage = "tiny config"
    try:
        config = tiny_config(entry.model_type)
        stage = "build"
        model, config = build.build(entry, config)
        stage = "inputs"
        x = inputs.make_inputs(model, config, entry.head, entry.model_type)
        stage = "float32 run"
        start = time.perf_counter()
        m32 = copy.deepcopy(model)
        torch.manual_seed(0)
        r32 = execute.run(m32, m32, x)
        stage = "float32 rerun"
        m32 = copy.deepcopy(model)
        torch.manual_seed(1)
        again = execute.run(m32, m32, x)
        stage = "float64 run"
        m64 = build.float64_copy(model)
        r64 = execute.run(m64, m64, inputs.move(x, "cpu", torch.float64))
        seconds = time.perf_counter() - start
    except Exception as ex:  # noqa: BLE001
        return {"status": judge.CPU_FAILS, "reason": f"{stage}: {first_line(ex)}", "where": where(ex)}, None
    drawn = judge.random_forward(r32, again)
    if drawn:
        return {"status": judge.CPU_FAILS, "reason": f"random forward: {drawn}"}, None
    disagree = judge.references_disagree(r32, r64)
    if disagree:
        return {"status": judge.CPU_FAILS, "reason": f"float64 run is no reference: {disagree}"}, None
    info = {"params": build.parameter_count(model), "cpu_seconds": round(seconds, 3),
            "outputs": list(r64.outputs), "inputs": {k: list(v.shape) for k, v in x.items()
                                                     if isinstance(v, torch.Tensor)},
            "notes": r64.notes}
    return info, (model, x, r32, r64)


def run_mode(mode: str, model: torch.nn.Module, x: dict[str, Any], r32: execute.Run,
             r64: execute.Run) -> dict[str, Any]:
    import torch_pjrt

    compiled = mode == "compiled"
    if compiled:
        torch._dynamo.reset()
    start = time.perf_counter()
    error, trace, comparison = "", "", None
    with torch_pjrt.eager_mode("fused" if compiled else mode):
        torch_pjrt.reset_metrics()
        try:
            dev_model = copy.deepcopy(model).to("pjrt")
            forward = torch.compile(dev_model, backend="pjrt") if compiled else dev_model
            run = execute.run(dev_model, forward, inputs.move(x, "pjrt"))
            comparison = judge.compare(run, r64, r32)
        except Exception as ex:  # noqa: BLE001
            error, trace = first_line(ex), where(ex)
        try:
            torch_pjrt.synchronize()
        except Exception:  # noqa: BLE001  (the error is already recorded)
            pass
        m = torch_pjrt.metrics()
    v = judge.verdict(comparison, dict(m.get("fallbacks", {})), error)
    result = {"event": "mode", "mode": mode, "status": v.status, "detail": v.detail,
              "worst_ratio": v.worst_ratio, "worst_at": v.worst_at, "fallbacks": v.fallbacks,
              "compiles": int(m.get("compiles", 0)), "compile_seconds": round(float(m.get("compile_seconds", 0.0)), 3),
              "seconds": round(time.perf_counter() - start, 3)}
    if trace:
        result["where"] = trace
    if compiled:
        torch._dynamo.reset()
    return result


def run_type(model_type: str, modes: list[str]) -> None:
    """One architecture: its CPU references, then each pjrt mode; events on stdout."""
    start = time.perf_counter()
    entry = catalog.entry(model_type)
    record: dict[str, Any] = {"type": entry.model_type, "class": entry.model_class, "head": entry.head,
                              "base": entry.base_class, "config_class": entry.config_class}
    info, ref = reference(entry)
    if ref is None:
        record.update(info)
        emit({"event": "excluded", **info})
    else:
        record.update(info, status="ran", modes={})
        emit({"event": "reference", **info})
        model, x, r32, r64 = ref
        for mode in modes:
            if mode == "compiled" and entry.head not in COMPILED_HEADS:
                continue
            emit({"event": "start", "mode": mode})
            result = run_mode(mode, model, x, r32, r64)
            emit(result)
            record["modes"][mode] = {k: v for k, v in result.items() if k not in ("event", "mode")}
        del model, x, r32, r64, ref
    record["seconds"] = round(time.perf_counter() - start, 3)
    emit({"event": "done", "record": record})
    gc.collect()  # the next architecture starts with this one's tensors freed


def _stderr_to(path: str) -> None:
    """This process's stderr (Python's and native code's) now goes to `path`."""
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)


def serve() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if request.get("log"):
            _stderr_to(request["log"])
        run_type(request["type"], list(request["modes"]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch_pjrt.tools.zoo.worker")
    p.add_argument("model_type", nargs="?")
    p.add_argument("--modes", default="strict,fused")
    p.add_argument("--serve", action="store_true", help="run the architectures requested on stdin")
    args = p.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        p.error(f"unknown mode(s) {unknown}; choose from {list(MODES)}")
    if args.serve == (args.model_type is not None):
        p.error("name one architecture, or --serve")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if args.serve:
        serve()
    else:
        run_type(args.model_type, modes)
    return 0

if __name__ == "__main__":
    sys.exit(main())
