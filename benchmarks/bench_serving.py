"""vLLM on pjrt against vLLM's own CPU backend: same model, same requests, one run.

For each backend, in its own process (vLLM holds process-wide state):
- start-up: seconds to build ``LLM(...)`` (loading, KV cache, and for pjrt the
  compilation of every bucket; for vLLM CPU its torch.compile): cold (pjrt: empty
  program cache) and warm (pjrt: the disk cache filled by the cold start);
- steady state: REQUESTS requests arriving together (prompt lengths 8..128 tokens,
  MAX_TOKENS output tokens each, greedy, EOS ignored) through continuous batching,
  after one warm-up pass; output tokens per second over the whole pass, and the
  median and 90th-percentile time to first token as vLLM measures it per request.
  Median over REPEATS passes. The pass ends when every request has finished: the
  tokens reached the host.

    .venv/bin/python benchmarks/bench_serving.py [--model llama|gpt2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

REQUESTS, MAX_TOKENS, REPEATS = 32, 64, 3
ENGINE = {"dtype": "float32", "max_model_len": 256, "max_num_seqs": 16, "max_num_batched_tokens": 128, "seed": 0}


def worker(model_dir: str) -> None:
    """Runs in a child process: prints one JSON line of figures."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from torch_pjrt.bench import time_call

    # Each call ends when its work has reached the host: nothing left to wait for (None).
    llm, start_up = time_call(lambda: LLM(model=model_dir, disable_log_stats=False, **ENGINE), None)
    vocab = llm.llm_engine.model_config.get_vocab_size()
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(8, 129, (REQUESTS,), generator=g).tolist()
    prompts = [TokensPrompt(prompt_token_ids=torch.randint(2, vocab, (n,), generator=g).tolist()) for n in lengths]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up pass

    compiles = None
    if os.environ.get("VLLM_TARGET_DEVICE") == "pjrt":
        import torch_pjrt
        compiles = torch_pjrt.metrics()["compiles"]
    rates, ttft_median, ttft_p90 = [], [], []
    for _ in range(REPEATS):
        outs, elapsed = time_call(lambda: llm.generate(prompts, params, use_tqdm=False), None)
        rates.append(sum(len(o.outputs[0].token_ids) for o in outs) / elapsed)
        firsts = sorted(o.metrics.first_token_latency for o in outs if o.metrics is not None)
        if firsts:
            ttft_median.append(statistics.median(firsts))
            ttft_p90.append(firsts[int(0.9 * (len(firsts) - 1))])
    result = {"start_up_s": start_up, "output_tokens_per_s": statistics.median(rates),
              "ttft_median_s": statistics.median(ttft_median) if ttft_median else None,
              "ttft_p90_s": statistics.median(ttft_p90) if ttft_p90 else None}
    if compiles is not None:
        import torch_pjrt
        result["compiles_while_serving"] = torch_pjrt.metrics()["compiles"] - compiles
        result["cpu_fallbacks"] = sum(torch_pjrt.metrics()["fallbacks"].values())
    print(json.dumps(result))


def run(model_dir: str, target: str, cache_dir: str) -> dict:
    env = dict(os.environ, VLLM_TARGET_DEVICE=target, TORCH_PJRT_CACHE_DIR=cache_dir, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", model_dir], env=env,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"vLLM on {target} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama", choices=["llama", "gpt2"])
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    import serving_models

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = serving_models.make_model(args.model, os.path.join(tmp, args.model))
        cache = os.path.join(tmp, "cache")
        figures = {"vllm_cpu": run(model_dir, "cpu", cache),
                   "pjrt_cold": run(model_dir, "pjrt", cache),
                   "pjrt_warm": run(model_dir, "pjrt", cache)}
    cpu, cold, warm = figures["vllm_cpu"], figures["pjrt_cold"], figures["pjrt_warm"]
    print(f"vLLM {args.model} (serving_models.py), {REQUESTS} requests x {MAX_TOKENS} output tokens, "
          f"prompts 8..128 tokens, max_num_seqs {ENGINE['max_num_seqs']}, float32")
    print(f"{'':28s}{'vLLM CPU':>12s}{'vLLM pjrt':>12s}{'pjrt/CPU':>10s}")
    rows = [("output tokens/s", "output_tokens_per_s", "{:.0f}"), ("time to first token, median", "ttft_median_s",
            "{:.3f} s"), ("time to first token, p90", "ttft_p90_s", "{:.3f} s")]
    for label, key, fmt in rows:
        a, b = cpu[key], warm[key]
        print(f"{label:28s}{fmt.format(a):>12s}{fmt.format(b):>12s}{b / a:>10.2f}")
    print(f"{'start-up, cold':28s}{cpu['start_up_s']:>10.1f} s{cold['start_up_s']:>10.1f} s")
    print(f"{'start-up, warm program cache':28s}{'':>12s}{warm['start_up_s']:>10.1f} s")
    print(f"pjrt while serving: {warm['compiles_while_serving']} compiles, {warm['cpu_fallbacks']} CPU fallbacks")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "requests": REQUESTS, "max_tokens": MAX_TOKENS, "engine": ENGINE,
                       **figures}, f, indent=1)


if __name__ == "__main__":
    main()
