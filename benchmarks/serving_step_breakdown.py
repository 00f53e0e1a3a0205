"""Where a vLLM engine step goes, per backend: the runner's and scheduler's main functions
wrapped with timers over bench_serving.py's timed passes (after its warm-up pass), in
milliseconds per engine step. Nested functions are counted in their callers too. Then the
runner's execute_model by kind of step: decode-only steps by their request count, and
steps with prompt tokens, each with its count and median time.

    .venv/bin/python benchmarks/serving_step_breakdown.py [--model llama|gpt2|llama-large]

Each backend runs in its own process (vLLM holds process-wide state), vLLM CPU first: this
machine's speed drifts over minutes, so compare ratios from bench_serving.py, whose
backends take turns pass by pass, and read these as where each backend's step goes.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

from torch_pjrt.bench import time_call  # noqa: E402


def _timed(totals: dict[str, float], calls: collections.Counter, owner: type, name: str) -> None:
    inner: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # Each function's work has reached the host when it returns (the step's logits are
        # copied back inside it): nothing to wait for (None).
        out, seconds = time_call(lambda: inner(*args, **kwargs), None)
        totals[f"{owner.__name__}.{name}"] += seconds
        calls[f"{owner.__name__}.{name}"] += 1
        return out

    setattr(owner, name, wrapper)


def _by_step_kind(steps: dict[str, list[float]], owner: type) -> None:
    """owner.execute_model's times grouped by kind of step."""
    inner: Callable[..., Any] = owner.execute_model

    def wrapper(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        out, seconds = time_call(lambda: inner(self, scheduler_output, *args, **kwargs), None)
        counts = list(scheduler_output.num_scheduled_tokens.values())
        kind = f"decode, {len(counts):2d} requests" if counts and all(n == 1 for n in counts) else "with prompt tokens"
        steps[kind].append(seconds)
        return out

    owner.execute_model = wrapper


def worker(model_dir: str, kind: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    import bench_serving

    totals: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    for name in ("execute_model", "sample_tokens", "_prepare_inputs", "_model_forward"):
        _timed(totals, calls, GPUModelRunner, name)
    for name in ("schedule", "update_from_output"):
        _timed(totals, calls, Scheduler, name)
    _timed(totals, calls, EngineCore, "step")
    steps_by_kind: dict[str, list[float]] = collections.defaultdict(list)
    _by_step_kind(steps_by_kind, GPUModelRunner)
    target = os.environ["VLLM_TARGET_DEVICE"]
    if target == "pjrt":
        from torch_pjrt.integrations.vllm_plugin import attention, worker as pjrt_worker
        _timed(totals, calls, pjrt_worker.PjrtModelRunner, "_model_forward")
        _timed(totals, calls, pjrt_worker.PjrtModelRunner, "_step")
        _timed(totals, calls, attention.PjrtAttentionMetadataBuilder, "build")
    workload = bench_serving.WORKLOADS[kind]
    llm = LLM(model=model_dir, **workload["engine"])
    prompts, params = bench_serving.requests(llm, workload)
    llm.generate(prompts(), params, use_tqdm=False)  # warm-up pass
    totals.clear()
    calls.clear()
    steps_by_kind.clear()
    _, elapsed = time_call(lambda: [llm.generate(prompts(), params, use_tqdm=False)
                                    for _ in range(workload["repeats"])], None)
    steps = calls["EngineCore.step"]
    print(f"vLLM {target}: {elapsed:.2f} s for {workload['repeats']} passes, {steps} engine steps, "
          f"{elapsed / steps * 1e3:.2f} ms a step")
    for name, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {name:45s} {seconds / steps * 1e3:7.3f} ms a step")
    for kind, times in sorted(steps_by_kind.items()):
        print(f"  execute_model, {kind:30s} {len(times) / workload['repeats']:6.1f} a pass, "
              f"median {statistics.median(times) * 1e3:7.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama", choices=["llama", "gpt2", "llama-large"])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.model)
        return
    import serving_models

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = serving_models.make_model(args.model, os.path.join(tmp, args.model))
        cache = os.path.join(tmp, "cache")
        for target in ("cpu", "pjrt"):
            env = dict(os.environ, VLLM_TARGET_DEVICE=target, TORCH_PJRT_CACHE_DIR=cache, HF_HUB_OFFLINE="1")
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--model", args.model, "--worker",
                                   model_dir], env=env, capture_output=True, text=True, timeout=3600)
            if proc.returncode != 0:
                raise RuntimeError(f"vLLM on {target} failed:\n{proc.stderr[-4000:]}")
            print("\n".join(line for line in proc.stdout.splitlines() if line.startswith(("vLLM", "  "))))


if __name__ == "__main__":
    main()
