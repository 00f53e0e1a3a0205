"""Bounded dynamic shapes over the zoo's text architectures: each model compiled once with
its sequence dim marked bounded (torch._dynamo.mark_dynamic(x, 1, min=2, max=MAX)), run
forward and backward at several lengths, every output and gradient judged against float64
by the zoo's judge; the graphs that got one program for the range, and why others did not.

    .venv/bin/python scripts/bounded_sweep.py [model_type ...] [--lengths 5,16,33] [--max 64]
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

import torch_pjrt  # noqa: E402
from torch_pjrt.tools.zoo import build, catalog, execute, inputs, judge  # noqa: E402

TEXT = ["bert", "distilbert", "electra", "gpt2", "gpt_neox", "llama", "mistral", "qwen2", "gemma", "phi3", "opt",
        "mixtral", "qwen2_moe", "olmoe"]


def sequence_inputs(model: torch.nn.Module, config: object, head: str, model_type: str, length: int) -> dict:
    old = inputs.INPUT_OVERRIDES.get(model_type)
    inputs.INPUT_OVERRIDES[model_type] = {**(old or {}), "seq": length}
    try:
        return inputs.make_inputs(model, config, head, model_type)
    finally:
        if old is None:
            del inputs.INPUT_OVERRIDES[model_type]
        else:
            inputs.INPUT_OVERRIDES[model_type] = old


def one(model_type: str, lengths: list[int], high: int) -> tuple[bool, list[str]]:
    entry = catalog.entry(model_type)
    model, config = build.build(entry)
    exact_model = build.float64_copy(model)
    device_model = build.build(entry, config)[0].to(torch_pjrt.DEVICE_NAME)
    torch._dynamo.reset()
    torch_pjrt.reset_metrics()
    compiled = torch.compile(device_model, backend="pjrt")
    ok = True
    lines = []
    for t in lengths:
        cpu_inputs = sequence_inputs(model, config, entry.head, model_type, t)
        device_inputs = inputs.move(cpu_inputs, torch_pjrt.DEVICE_NAME)
        for name, v in device_inputs.items():
            if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[1] == t:
                torch._dynamo.mark_dynamic(v, 1, min=2, max=high)
        device = execute.run(device_model, compiled, device_inputs)
        exact = execute.run(exact_model, exact_model, inputs.move(cpu_inputs, "cpu", torch.float64))
        float32 = execute.run(model, model, cpu_inputs)
        comparison = judge.compare(device, exact, float32)
        ok &= comparison.passed
        lines.append(f"  length {t}: {'ok' if comparison.passed else 'WRONG: ' + str(comparison)[:300]}")
    for name, s in torch_pjrt.metrics()["compiled"].items():
        lines.append(f"  {name}: {s['programs']} programs, {s['dynamo_graphs']} Dynamo graphs")
        lines += [f"    {g}" for g in s["bounded"]["graphs"]]
    return ok, lines


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("types", nargs="*", default=TEXT)
    parser.add_argument("--lengths", default="5,16,33")
    parser.add_argument("--max", type=int, default=64)
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    wrong = 0
    for model_type in args.types:
        try:
            ok, lines = one(model_type, lengths, args.max)
        except Exception as e:  # noqa: BLE001 - a sweep reports and goes on
            ok, lines = False, [f"  error: {type(e).__name__}: {str(e).splitlines()[0][:300]}"]
            if os.environ.get("SWEEP_TRACE"):
                traceback.print_exc()
        wrong += not ok
        print(f"{model_type}: {'ok' if ok else 'FAILED'}", *lines, sep="\n", flush=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
