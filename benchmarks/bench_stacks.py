"""Steps per second of the training stacks on pjrt against the same run on the CPU,
side by side in one run (figures for the README's "Training stacks" section).

- Hugging Face Trainer: a Llama from a config (hidden 256, 4 layers, 8 x 128 tokens),
  AdamW, steady-state steps/s after warm-up steps, on pjrt (strict, fused, bf16) and
  with use_cpu=True. Each timed step ends in a device sync.
- TorchTitan llama3 debug model through its own trainer (tests/python/titan_run.py):
  tokens/s as TorchTitan logs them, mean over the steps after the first two, for one
  CPU process and one pjrt process (eager and --compile), and for 2 pjrt ranks with
  FSDP2 (eager and --compile).

    .venv/bin/python benchmarks/bench_stacks.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests", "python")
WARMUP, TIMED = 3, 10


def trainer_steps_per_second(mode: str) -> float:
    """Runs in a fresh process per configuration (eager mode is read at import)."""
    code = f"""
import os, sys, json
sys.path.insert(0, {TESTS!r})
os.environ["TORCH_PJRT_EAGER_MODE"] = {("fused" if mode == "fused" else "strict")!r}
import torch, transformers, torch_pjrt, hf_stack
from torch_pjrt.bench import Laps
cfg = transformers.LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                               num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256)
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(cfg)
class Data(torch.utils.data.Dataset):
    def __len__(self): return 10_000
    def __getitem__(self, i):
        ids = torch.randint(0, 2048, (128,), generator=torch.Generator().manual_seed(i))
        return {{"input_ids": ids, "labels": ids}}
laps = Laps()
class Clock(transformers.TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        laps.lap(args.device.type)
args = transformers.TrainingArguments(output_dir={tempfile.mkdtemp()!r}, per_device_train_batch_size=8,
    max_steps={WARMUP + TIMED}, learning_rate=1e-4, report_to=[], save_strategy="no", logging_steps=1000,
    disable_tqdm=True, use_cpu={mode == "cpu"}, bf16={mode == "bf16"}, dataloader_num_workers=0)
transformers.Trainer(model=model, args=args, train_dataset=Data(), callbacks=[Clock()]).train()
print(json.dumps(laps.per_second({WARMUP})))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800,
                         env=dict(os.environ, HF_HUB_OFFLINE="1"))
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return float(out.stdout.strip().splitlines()[-1])


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def titan_tokens_per_second(work: str, name: str, nproc: int, cpu: bool, compiled: bool) -> float:
    runner = os.path.join(TESTS, "titan_run.py")
    flags = ["--module", "llama3", "--config", "llama3_debugmodel", "--training.steps", "8",
             "--training.local_batch_size", "4", "--training.seq_len", "256", "--training.mixed_precision_param",
             "float32", "--debug.seed", "42", "--metrics.log_freq", "1", "--dataloader.dataset", "c4_test",
             "--parallelism.spmd_backend", "full_dtensor", "--parallelism.data_parallel_shard_degree", str(nproc),
             "--hf_assets_path", os.path.join(work, "assets", "tokenizer"),
             "--dataloader.dataset_path", os.path.join(work, "assets", "c4_test"),
             "--dump_folder", os.path.join(work, "out_" + name)]
    if compiled:
        flags += ["--compile.enable", "--compile.backend", "pjrt"]
    record = os.path.join(work, name)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
           str(_port()), runner, *(["--cpu"] if cpu else []), "--record", record, "--", *flags]
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // nproc)), HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    if out.returncode != 0:
        raise RuntimeError((out.stdout + out.stderr)[-3000:])
    total = 0.0
    for rank in range(nproc):
        with open(f"{record}.rank{rank}.json") as f:
            tps = [s["throughput(tps)"] for s in json.load(f)["steps"]][2:]
        total += sum(tps) / len(tps)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    figures: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "trainer_steps_per_s": {}, "titan_tokens_per_s": {}}
    for mode in ("cpu", "strict", "fused", "bf16"):
        figures["trainer_steps_per_s"][mode] = trainer_steps_per_second(mode)
        print(f"Trainer {mode:7s} {figures['trainer_steps_per_s'][mode]:.2f} steps/s", flush=True)
    work = tempfile.mkdtemp()
    subprocess.run([sys.executable, os.path.join(TESTS, "titan_run.py"), "--make-assets",
                    os.path.join(work, "assets")], check=True)
    for name, nproc, cpu, compiled in (("cpu, 1 process", 1, True, False), ("pjrt, 1 process", 1, False, False),
                                       ("pjrt compiled, 1 process", 1, False, True),
                                       ("pjrt, 2 ranks FSDP2", 2, False, False),
                                       ("pjrt compiled, 2 ranks FSDP2", 2, False, True)):
        tps = titan_tokens_per_second(work, name.replace(" ", "_").replace(",", ""), nproc, cpu, compiled)
        figures["titan_tokens_per_s"][name] = tps
        print(f"TorchTitan {name:30s} {tps:8.0f} tokens/s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
