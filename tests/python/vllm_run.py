"""Runs vLLM's offline engine in its own process (vLLM patches process-wide state) and
prints what the serving tests check, as JSON on the last line of stdout.

    python vllm_run.py MODEL_DIR JOB.json

JOB: {"prompts": [[token ids], ...], "max_tokens": n, "workload": [[token ids], ...],
"engine": {LLM keyword arguments}, "then": [[token ids], ...]}. Output: greedy token ids
of the prompts batched together, and the prompt tokens vLLM found in its prefix cache
for each; with "then", the same for those prompts, served after the first ones finished
(their shared prefixes are cached by then); unless "sampled" is false, three seeded
sampled runs (seed A twice, seed B); with a workload, the compiles, program executions
and CPU fallbacks while serving it after start-up, and one prompt's logprobs.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "pjrt")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: its metrics are ours
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _linear_weight_layout(worker: object) -> dict[str, int]:
    """How many of the model's linear layers keep their weight [out, in] in storage laid out [in, out]."""
    from vllm.model_executor.layers.linear import LinearBase

    weights = [m.weight for m in worker.model_runner.model.modules() if isinstance(m, LinearBase)]
    return {"linear_weights": len(weights), "stored_in_by_out": sum(w.stride() == (1, w.shape[0]) for w in weights)}


def main() -> None:
    model_dir, job_path = sys.argv[1], sys.argv[2]
    with open(job_path) as f:
        job = json.load(f)
    import torch_pjrt
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    engine = {"dtype": "float32", "max_model_len": 256, "max_num_seqs": 16, "max_num_batched_tokens": 128,
              "seed": 0, **job.get("engine", {})}
    start = torch_pjrt.metrics()
    llm = LLM(model=model_dir, **engine)
    ready = torch_pjrt.metrics()

    cached: list[int] = []

    def run(prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        cached[:] = [o.num_cached_tokens or 0 for o in outs]
        return [list(o.outputs[0].token_ids) for o in outs]

    n = job["max_tokens"]
    greedy = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    result: dict[str, object] = {
        "start_up": {"compiles": ready["compiles"] - start["compiles"],
                     "disk_cache_hits": ready["disk_cache_hits"] - start["disk_cache_hits"]},
        "greedy": run(job["prompts"], greedy),
        "cached": list(cached),
    }
    if "then" in job:
        result["greedy_then"] = run(job["then"], greedy)
        result["cached_then"] = list(cached)
        result["compiles_after_start_up"] = torch_pjrt.metrics()["compiles"] - ready["compiles"]
    if job.get("sampled", True):
        for name, seed in (("sampled_a", 7), ("sampled_a_again", 7), ("sampled_b", 8)):
            result[name] = run(job["prompts"], SamplingParams(max_tokens=n, temperature=1.0, top_p=0.9, seed=seed,
                                                              ignore_eos=True))
    if "workload" not in job:
        print(json.dumps(result))
        return
    before = torch_pjrt.metrics()
    lengths = job.get("workload_max_tokens", [n])
    params = [SamplingParams(max_tokens=lengths[i % len(lengths)], temperature=0.0, ignore_eos=True)
              for i in range(len(job["workload"]))]
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in job["workload"]], params, use_tqdm=False)
    after = torch_pjrt.metrics()
    result["workload"] = {
        "requests": len(outs), "tokens": sum(len(o.outputs[0].token_ids) for o in outs),
        "compiles": after["compiles"] - before["compiles"],
        "new_programs": {k: v - before["compiles_by_op"].get(k, 0) for k, v in after["compiles_by_op"].items()
                         if v != before["compiles_by_op"].get(k, 0)},
        "executions": after["executions"] - before["executions"],
        "fallbacks": {k: v - before["fallbacks"].get(k, 0) for k, v in after["fallbacks"].items()
                      if v != before["fallbacks"].get(k, 0)},
    }
    result["fallbacks_total"] = dict(after["fallbacks"])
    # Prompt logprobs (the path that sends a step's hidden states to the host): each prompt
    # token's log-probability given the tokens before it, for one prompt.
    prompt = job["prompts"][job.get("logprobs_prompt", 0)]
    out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], SamplingParams(max_tokens=1, prompt_logprobs=0),
                       use_tqdm=False)[0]
    result["prompt_logprobs"] = [None if d is None else d[t].logprob for d, t in zip(out.prompt_logprobs, prompt)]
    import vllm.platforms
    result["platform"] = type(vllm.platforms.current_platform).__name__
    result["linear_weight_layout"] = llm.collective_rpc(_linear_weight_layout)[0]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
