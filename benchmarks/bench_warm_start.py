"""First compiled training step in a fresh process: cold (empty caches) against warm (a
second process reading the first one's caches), measured side by side in one run (not
a test). Each run is its own process; the step ends in a host read of the loss.

  default:    the loss and AdamW's step compiled (torch.compile(opt.step));
  precompile: PyTorch's precompile cache (TORCH_CACHING_PRECOMPILE=1, saved with
              torch.compiler.save_cache_artifacts) for the compiled loss, and
              AdamW(fused=True), one op per step with nothing for Dynamo to trace;
  inductor:   the default recipe with backend="inductor" on the CPU (its own caches).

  .venv/bin/python benchmarks/bench_warm_start.py [--models gpt,hf-gpt2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = """
import json, os, sys
import torch, torch_pjrt
from torch_pjrt._bench_steps import gpt_step, hf_gpt2_step
from torch_pjrt.bench import time_call
model, backend, recipe = sys.argv[1], sys.argv[2], sys.argv[3]
device = "pjrt" if backend == "pjrt" else "cpu"
make = {"gpt": gpt_step, "hf-gpt2": hf_gpt2_step}[model]
step = make(device, backend, fused_optimizer=recipe == "precompile")
loss, first = time_call(lambda: step().item(), None)  # ends in a host read of the loss
saved = ""
if recipe == "precompile":
    try:
        torch.compiler.save_cache_artifacts()
    except Exception as e:  # PyTorch could not package the function: the warm run traces it again
        saved = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
print(json.dumps({"first": first, "loss": loss, "not_saved": saved}))
"""

RECIPES = [("default", "pjrt"), ("precompile", "pjrt"), ("default", "inductor")]


def run(model: str, recipe: str, backend: str, cache: str) -> dict:
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=os.path.join(cache, "pjrt"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"))
    if recipe == "precompile":
        env["TORCH_CACHING_PRECOMPILE"] = "1"
    done = subprocess.run([sys.executable, "-c", CHILD, model, backend, recipe], capture_output=True, text=True,
                          env=env, timeout=1200)
    if done.returncode != 0:
        if recipe == "precompile":  # PyTorch's precompile cannot take every model (README, "Compiling")
            return {"failed": done.stderr.strip().splitlines()[-1][:200]}
        raise RuntimeError(f"{model} {recipe} {backend} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="gpt,hf-gpt2")
    args = p.parse_args()
    print("| model | recipe | backend | first step cold (s) | warm (s) | losses equal |\n| --- | --- | --- | --- | --- | --- |")
    for model in args.models.split(","):
        for recipe, backend in RECIPES:
            with tempfile.TemporaryDirectory() as cache:
                cold = run(model, recipe, backend, cache)
                if "failed" in cold:
                    print(f"| {model} | {recipe} | {backend} | fails: {cold['failed']} | | |", flush=True)
                    continue
                warm = run(model, recipe, backend, cache)
            note = f" (not packaged: {cold['not_saved']})" if cold.get("not_saved") else ""
            print(f"| {model} | {recipe}{note} | {backend} | {cold['first']:.2f} | {warm['first']:.2f} | "
                  f"{cold['loss'] == warm['loss']} |", flush=True)


if __name__ == "__main__":
    main()
