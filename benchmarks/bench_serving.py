"""vLLM on pjrt against vLLM's own CPU backend: same model, same requests, one run.

For each backend, in its own process (vLLM holds process-wide state):
- start-up: seconds to build ``LLM(...)`` (loading, KV cache, and for pjrt the
  compilation of every bucket; for vLLM CPU its torch.compile): cold (pjrt: empty
  program cache, a process of its own) and warm (pjrt: the disk cache filled by the
  cold start);
- steady state: a workload's requests arriving together (random prompt lengths in
  its range, its output tokens each, greedy, EOS ignored) through continuous
  batching, after one warm-up pass, each pass with new prompts (vLLM's prefix cache
  would otherwise serve every prompt of a pass from the one before, and the pass
  would time decoding alone); output tokens per second over the whole pass,
  and the median and 90th-percentile time to first token as vLLM measures it per
  request. Median over the workload's passes. A pass ends when every request has
  finished: the tokens reached the host. The two backends' processes live side by
  side and take turns, pass by pass (CPU, pjrt, pjrt, CPU, ...), the idle one
  waiting: this machine's speed drifts by tens of percent over minutes, and
  backends timed one after the other gave ratios from 0.70 to 0.92 on one day. Both
  get the same KV cache (the workload's ``kv_cache_memory_bytes``): left to itself
  vLLM CPU takes 92% of the host's memory for it, which beside a second process
  starves the machine.

Workloads: the tiny models (llama, gpt2: 2 layers, hidden 128) with 32 requests of
8..128 prompt tokens and 64 output tokens, max_model_len 256; llama-large (8 layers,
hidden 512) with 16 requests of 256..1,500 prompt tokens and 32 output tokens,
max_model_len 2048, where attention over long contexts matters.

    .venv/bin/python benchmarks/bench_serving.py [--model llama|gpt2|llama-large] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ANSWER = "bench_serving: "  # the prefix of a worker's answers on its stdout (JSON follows)
ANSWER_DEADLINE_S = 1800  # a worker's start-up or pass that takes longer has hung
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

# A tiny-model pass takes a third of a second: the median of many damps this machine's drift.
TINY = {"requests": 32, "prompts": (8, 128), "max_tokens": 64, "repeats": 11,
        "engine": {"dtype": "float32", "max_model_len": 256, "max_num_seqs": 16, "max_num_batched_tokens": 128,
                   "seed": 0, "kv_cache_memory_bytes": 256 << 20}}
WORKLOADS = {
    "llama": TINY,
    "gpt2": TINY,
    "llama-large": {"requests": 16, "prompts": (256, 1500), "max_tokens": 32, "repeats": 5,
                    "engine": {"dtype": "float32", "max_model_len": 2048, "max_num_seqs": 16,
                               "max_num_batched_tokens": 512, "seed": 0, "kv_cache_memory_bytes": 1 << 30}},
}


def requests(llm: Any, workload: dict) -> tuple[Callable[[], list], Any]:
    """The workload's prompts (a new set per call: the same lengths, new token ids, so that
    vLLM's prefix cache cannot serve a pass's prompts from an earlier one, or the pass would
    time decoding alone) and its sampling parameters."""
    import torch
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    vocab = llm.llm_engine.model_config.get_vocab_size()
    g = torch.Generator().manual_seed(0)
    shortest, longest = workload["prompts"]
    lengths = torch.randint(shortest, longest + 1, (workload["requests"],), generator=g).tolist()

    def fresh_prompts() -> list:
        return [TokensPrompt(prompt_token_ids=torch.randint(2, vocab, (n,), generator=g).tolist()) for n in lengths]

    return fresh_prompts, SamplingParams(max_tokens=workload["max_tokens"], temperature=0.0, ignore_eos=True)


def worker(model_dir: str, workload: dict) -> None:
    """Runs in a child process: builds the engine, runs the warm-up pass, prints one JSON line
    (start-up), then for each line "pass" on stdin one timed pass (a JSON line of its figures),
    and on "done" a last JSON line (pjrt: compiles and CPU fallbacks while serving)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    from torch_pjrt.bench import time_call

    # Each call ends when its work has reached the host: nothing left to wait for (None).
    llm, start_up = time_call(lambda: LLM(model=model_dir, disable_log_stats=False, **workload["engine"]), None)
    fresh_prompts, params = requests(llm, workload)
    llm.generate(fresh_prompts(), params, use_tqdm=False)  # warm-up pass

    on_pjrt = os.environ.get("VLLM_TARGET_DEVICE") == "pjrt"
    if on_pjrt:
        import torch_pjrt
        compiles = torch_pjrt.metrics()["compiles"]
    print(ANSWER + json.dumps({"start_up_s": start_up}), flush=True)
    for command in sys.stdin:
        if command.strip() != "pass":
            break
        prompts = fresh_prompts()
        outs, elapsed = time_call(lambda: llm.generate(prompts, params, use_tqdm=False), None)
        firsts = sorted(o.metrics.first_token_latency for o in outs if o.metrics is not None)
        print(ANSWER + json.dumps({"output_tokens_per_s": sum(len(o.outputs[0].token_ids) for o in outs) / elapsed,
                          "ttft_median_s": statistics.median(firsts) if firsts else None,
                          "ttft_p90_s": firsts[int(0.9 * (len(firsts) - 1))] if firsts else None}), flush=True)
    last = {}
    if on_pjrt:
        last = {"compiles_while_serving": torch_pjrt.metrics()["compiles"] - compiles,
                "cpu_fallbacks": sum(torch_pjrt.metrics()["fallbacks"].values())}
    print(ANSWER + json.dumps(last), flush=True)


class Backend:
    """One backend's worker process, alive for the whole run (vLLM holds process-wide state).
    Its stdout is read by a thread into a queue, so that each answer has a deadline."""

    def __init__(self, model_dir: str, kind: str, target: str, cache_dir: str) -> None:
        # vLLM's log to stderr, and stderr to a file: stdout carries the answers alone, and no
        # pipe that nobody reads while the passes run can fill and stall the worker.
        env = dict(os.environ, VLLM_TARGET_DEVICE=target, TORCH_PJRT_CACHE_DIR=cache_dir, HF_HUB_OFFLINE="1",
                   VLLM_LOGGING_STREAM="ext://sys.stderr")
        self.target = target
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--model", kind, "--worker",
                                      model_dir], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True)
        self.answers: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.passes: list[dict] = []
        self.figures: dict[str, Any] = self._answer()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(ANSWER):
                self.answers.put(line[len(ANSWER):])
        self.answers.put(None)  # the worker's output ended

    def _answer(self) -> dict:
        try:
            line = self.answers.get(timeout=ANSWER_DEADLINE_S)
        except queue.Empty:
            line = None
        if line is None:
            self.end()
            self.log.seek(0)
            raise RuntimeError(f"vLLM on {self.target}: no answer (exit status {self.proc.returncode}):\n"
                               f"{self.log.read()[-4000:]}")
        return json.loads(line)

    def _send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def run_pass(self) -> None:
        self._send("pass")
        self.passes.append(self._answer())

    def finish(self) -> dict:
        """Ends the worker; its figures: start-up, the median of its passes, what it said last."""
        self._send("done")
        self.figures.update(self._answer())
        self.end()
        for key in ("output_tokens_per_s", "ttft_median_s", "ttft_p90_s"):
            values = [p[key] for p in self.passes if p[key] is not None]
            if values:
                self.figures[key] = statistics.median(values)
        self.figures["passes"] = self.passes
        return self.figures

    def end(self) -> None:
        """Waits a little for the worker to end (it has answered "done", or it failed), then ends it."""
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama", choices=list(WORKLOADS))
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    workload = WORKLOADS[args.model]
    if args.worker:
        worker(args.worker, workload)
        return
    import serving_models

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = serving_models.make_model(args.model, os.path.join(tmp, args.model))
        cache = os.path.join(tmp, "cache")
        # Start-up cold (an empty program cache), then the backends side by side: the vLLM CPU
        # worker and a pjrt worker started warm take turns, pass by pass (in the order ABBA, so
        # that the machine's drift over the run weighs on both alike).
        figures = {"pjrt_cold": Backend(model_dir, args.model, "pjrt", cache).finish()}
        backends: list[Backend] = []
        try:
            backends.append(Backend(model_dir, args.model, "cpu", cache))
            backends.append(Backend(model_dir, args.model, "pjrt", cache))
            cpu_backend, warm_backend = backends
            for i in range(workload["repeats"]):
                for backend in (cpu_backend, warm_backend) if i % 2 == 0 else (warm_backend, cpu_backend):
                    backend.run_pass()
            figures["vllm_cpu"], figures["pjrt_warm"] = cpu_backend.finish(), warm_backend.finish()
        finally:
            for backend in backends:
                if backend.proc.poll() is None:
                    backend.proc.kill()
    cpu, cold, warm = figures["vllm_cpu"], figures["pjrt_cold"], figures["pjrt_warm"]
    engine = workload["engine"]
    print(f"vLLM {args.model} (serving_models.py), {workload['requests']} requests x {workload['max_tokens']} output "
          f"tokens, prompts {workload['prompts'][0]}..{workload['prompts'][1]} tokens, max_model_len "
          f"{engine['max_model_len']}, max_num_seqs {engine['max_num_seqs']}, max_num_batched_tokens "
          f"{engine['max_num_batched_tokens']}, float32")
    print(f"{'':28s}{'vLLM CPU':>12s}{'vLLM pjrt':>12s}{'pjrt/CPU':>10s}")
    rows = [("output tokens/s", "output_tokens_per_s", "{:.0f}"), ("time to first token, median", "ttft_median_s",
            "{:.3f} s"), ("time to first token, p90", "ttft_p90_s", "{:.3f} s")]
    for label, key, fmt in rows:
        a, b = cpu[key], warm[key]
        print(f"{label:28s}{fmt.format(a):>12s}{fmt.format(b):>12s}{b / a:>10.2f}")
    pairs = [w["output_tokens_per_s"] / c["output_tokens_per_s"] for c, w in zip(cpu["passes"], warm["passes"])]
    print(f"{'pjrt/CPU, pass by pass':28s}{' '.join(f'{r:.2f}' for r in pairs)}")
    print(f"{'start-up, cold':28s}{cpu['start_up_s']:>10.1f} s{cold['start_up_s']:>10.1f} s")
    print(f"{'start-up, warm program cache':28s}{'':>12s}{warm['start_up_s']:>10.1f} s")
    print(f"pjrt while serving: {warm['compiles_while_serving']} compiles, {warm['cpu_fallbacks']} CPU fallbacks")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, **workload, **figures}, f, indent=1)


if __name__ == "__main__":
    main()
