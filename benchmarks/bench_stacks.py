"""Steps per second of the training stacks on pjrt against the same run on the CPU,
side by side in one run (figures for the README's "Training stacks" section).

- Hugging Face Trainer: a Llama from a config (hidden 256, 4 layers, 8 x 128 tokens),
  AdamW, steady-state steps/s after warm-up steps, on pjrt (strict, fused, bf16) and
  with use_cpu=True. Each timed step ends in a device sync.
- TorchTitan llama3 debug model through its own trainer (tests/python/titan_run.py):
  tokens/s as TorchTitan logs them, mean over the steps after the first two, for one
  CPU process and one pjrt process (eager and --compile), and for 2 pjrt ranks with
  FSDP2 (eager and --compile).
- PyTorch Lightning (Trainer() with no device argument against accelerator="cpu"), PEFT LoRA
  through the Trainer, TRL SFTTrainer with a LoRA config, and Ray Train's TorchTrainer with two
  workers: steps/s on pjrt (strict) and on the CPU, the same Llama where a model is trained
  (Ray: the tests' small classifier, batches of 256), each timed step ending in a device sync.

    .venv/bin/python benchmarks/bench_stacks.py [--json FILE] [--only trainer,titan,lightning,peft,trl,ray]
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


_LLAMA = f"""
import os, sys, json, tempfile
sys.path.insert(0, {TESTS!r})
import torch, transformers
from torch_pjrt.bench import Laps
cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                               num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256)
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(cfg)
laps = Laps()
class Data(torch.utils.data.Dataset):
    def __len__(self): return 10_000
    def __getitem__(self, i):
        ids = torch.randint(0, 512, (128,), generator=torch.Generator().manual_seed(i))
        return {{"input_ids": ids, "labels": ids}}
"""

# Each snippet trains WARMUP + TIMED steps on the CPU when CPU is True, else on pjrt with
# nothing said about the device, and prints the steps/s after the warm-up.
_SNIPPETS = {
    "lightning": """
import pytorch_lightning as pl
class Module(pl.LightningModule):
    def __init__(self): super().__init__(); self.model = model
    def training_step(self, batch, i): return self.model(**batch).loss
    def configure_optimizers(self): return torch.optim.AdamW(self.parameters(), lr=1e-4)
class Clock(pl.Callback):
    def on_train_batch_end(self, trainer, *a): laps.lap(trainer.strategy.root_device.type)
extra = {"accelerator": "cpu"} if CPU else {}
pl.Trainer(max_steps=STEPS, logger=False, enable_checkpointing=False, enable_progress_bar=False,
           enable_model_summary=False, callbacks=[Clock()], **extra).fit(
    Module(), torch.utils.data.DataLoader(Data(), batch_size=8))
""",
    "peft": """
import peft
model = peft.get_peft_model(model, peft.LoraConfig(r=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
class Clock(transformers.TrainerCallback):
    def on_step_end(self, args, state, control, **kw): laps.lap(args.device.type)
args = transformers.TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, max_steps=STEPS,
    learning_rate=1e-4, report_to=[], save_strategy="no", logging_steps=1000, disable_tqdm=True, use_cpu=CPU)
transformers.Trainer(model=model, args=args, train_dataset=Data(), callbacks=[Clock()]).train()
""",
    "trl": """
import datasets, peft, trl, serving_models
tok = serving_models._tokenizer()
words = serving_models._TEXT.split()
texts = [" ".join(words[(7 * i + j) % len(words)] for j in range(100)) for i in range(400)]
class Clock(transformers.TrainerCallback):
    def on_step_end(self, args, state, control, **kw): laps.lap(args.device.type)
args = trl.SFTConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, max_steps=STEPS, max_length=128,
    learning_rate=1e-4, report_to=[], save_strategy="no", logging_steps=1000, disable_tqdm=True, use_cpu=CPU)
trl.SFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_dict({"text": texts}),
               processing_class=tok, peft_config=peft.LoraConfig(r=16, target_modules=["q_proj", "v_proj"]),
               callbacks=[Clock()]).train()
""",
}


def stack_steps_per_second(stack: str, cpu: bool) -> float:
    code = (_LLAMA + f"CPU = {cpu}\nSTEPS = {WARMUP + TIMED}\n" + _SNIPPETS[stack]
            + f"print(json.dumps(laps.per_second({WARMUP})))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800,
                         env=dict(os.environ, HF_HUB_OFFLINE="1", TORCH_PJRT_EAGER_MODE="strict"))
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return float(out.stdout.strip().splitlines()[-1])


_RAY = """
import json, os, sys, tempfile
import ray, ray.train, ray.train.torch, torch
def loop(config):
    sys.path.insert(0, config["tests"])
    import small_classifier as sc
    model = ray.train.torch.prepare_model(sc.make_net())
    data = torch.utils.data.TensorDataset(torch.randn(100_000, sc.FEATURES), torch.randint(0, sc.CLASSES, (100_000,)))
    loader = ray.train.torch.prepare_data_loader(torch.utils.data.DataLoader(data, batch_size=256))
    opt = sc.make_optimizer(model.parameters())
    # Imported after the device is chosen: in the CPU run torch_pjrt must not pick it.
    from torch_pjrt.bench import Laps
    laps = Laps()
    for step, (x, y) in enumerate(loader):
        if step == config["steps"]:
            break
        opt.zero_grad(); torch.nn.functional.cross_entropy(model(x), y).backward(); opt.step()
        laps.lap(x.device.type)  # a real device sync ends each timed step
    if ray.train.get_context().get_world_rank() == 0:
        with open(config["out"], "w") as f:
            json.dump(laps.per_second(config["warmup"]), f)
ray.init(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": ENV})
out = os.path.join(tempfile.mkdtemp(), "rank0.json")
ray.train.torch.TorchTrainer(loop, train_loop_config={"tests": TESTS, "steps": STEPS, "warmup": WARMUP, "out": out},
    scaling_config=ray.train.ScalingConfig(num_workers=2),
    run_config=ray.train.RunConfig(storage_path=tempfile.mkdtemp())).fit()
print(open(out).read())
"""


def ray_steps_per_second(cpu: bool) -> float:
    """Two workers; on the CPU with torch_pjrt not loaded in the workers (Ray's own CPU path)."""
    env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"} if cpu else {}
    code = (f"ENV = {env!r}\nTESTS = {TESTS!r}\nSTEPS = {WARMUP + 3 * TIMED}\nWARMUP = {WARMUP}\n" + _RAY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800,
                         env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0", TORCH_PJRT_EAGER_MODE="strict", **env))
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
    parser.add_argument("--only", default="trainer,titan,lightning,peft,trl,ray", help="comma-separated stacks")
    args = parser.parse_args()
    only = set(args.only.split(","))
    figures: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "trainer_steps_per_s": {}, "titan_tokens_per_s": {},
                               "steps_per_s": {}}
    for stack in ("lightning", "peft", "trl", "ray"):
        if stack not in only:
            continue
        for where, cpu in (("cpu", True), ("pjrt", False)):
            rate = ray_steps_per_second(cpu) if stack == "ray" else stack_steps_per_second(stack, cpu)
            figures["steps_per_s"].setdefault(stack, {})[where] = rate
            print(f"{stack:9s} {where:5s} {rate:.2f} steps/s", flush=True)
    if "trainer" in only:
        for mode in ("cpu", "strict", "fused", "bf16"):
            figures["trainer_steps_per_s"][mode] = trainer_steps_per_second(mode)
            print(f"Trainer {mode:7s} {figures['trainer_steps_per_s'][mode]:.2f} steps/s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    if "titan" not in only:
        return
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
