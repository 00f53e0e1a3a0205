"""Runs TorchTitan's own trainer (torchtitan.train.main, what `python -m torchtitan.train`
runs) with its command-line flags, after the workarounds TorchTitan 0.3.0 needs against
torch 2.13 on any device, each named. On pjrt nothing else is changed here: what pjrt
needs is torch_pjrt's own integration (torch_pjrt/integrations/torchtitan.py).

    python titan_run.py [--cpu [--float64]] [--record FILE] -- <torchtitan flags>
    python titan_run.py --make-assets DIR   (tokenizer and dataset, offline)

--record FILE writes, per rank (FILE.rank<N>.json), what TorchTitan logged each
step (loss, grad norm, memory) and, on pjrt, torch_pjrt's metrics. --float64
makes the CPU reference compute in float64 (weights initialised in float32 as
in every other run, then widened).
"""

from __future__ import annotations

import json
import os
import sys
import types


def workaround_missing_triton() -> None:
    """torchtitan.distributed.minimal_async_ep.kernels imports triton at import time (for MoE
    expert parallelism, unused by llama3); torch's CPU build has no triton, so
    `import torchtitan.train` fails on any device. A stand-in module with its names."""
    name = "torchtitan.distributed.minimal_async_ep.kernels"
    stub = types.ModuleType(name)
    for kernel in ("copy_full_counts_to_peers", "copy_rows_to_peers", "expand_topk_grad", "fill_combine_metadata",
                   "fill_dispatch_metadata", "invert_flat_indices", "reduce_topk_slots", "topk_scores_grad"):
        setattr(stub, kernel + "_kernel", None)
    sys.modules[name] = stub


def workaround_set_timeout() -> None:
    """TorchTitan lowers the process groups' timeout after the first step with
    torch.distributed.set_timeout, which torch 2.13 does not have; its private
    _set_pg_timeout does that."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    if not hasattr(dist, "set_timeout"):
        dist.set_timeout = lambda timeout, group=None: distributed_c10d._set_pg_timeout(timeout, group)


def cpu_reference_workarounds() -> None:
    """Only for the CPU reference run (torchtitan targets accelerators):
    - torch 2.13 refuses FlexAttention's backward on CPU tensors (its device check);
    - torchtitan compiles FlexAttention and its block mask with inductor (max-autotune):
      the CPU run uses them uncompiled, the same math;
    - torch.cpu lacks what torchtitan's memory monitor calls (device name, properties, stats)."""
    import psutil
    import torch
    import torch.nn.attention.flex_attention as flex

    original = flex._validate_device

    def validate_device(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        if query.device.type != "cpu":
            original(query, key, value)

    flex._validate_device = validate_device
    import torchtitan.tools.utils as utils

    utils.device_type = "cpu"
    utils.device_module = types.SimpleNamespace(
        set_device=lambda device: None, current_device=lambda: 0, device_count=lambda: 1,
        synchronize=lambda *args: None, get_device_name=lambda device=None: "cpu",
        get_device_properties=lambda device=None: types.SimpleNamespace(total_memory=psutil.virtual_memory().total),
        memory_stats=lambda device=None: {}, reset_peak_memory_stats=lambda *args: None, empty_cache=lambda: None)
    from torchtitan.models.common import attention

    attention.FlexAttention._compiled_flex_attn = staticmethod(flex.flex_attention)
    attention._compiled_create_block_mask = flex.create_block_mask


def float64_reference() -> None:
    """The CPU reference in float64: the model is initialised as in every run (float32,
    seeded), then its floating (complex) parameters and buffers are widened to float64
    (complex128), before the optimizer is built."""
    import torch
    from torchtitan.protocols.model import BaseModel

    original = BaseModel.init_weights

    def init_weights(self: torch.nn.Module, **kwargs: object) -> None:
        original(self, **kwargs)
        self.to(torch.float64)
        for module in self.modules():
            for name, buffer in list(module.named_buffers(recurse=False)):
                if buffer is not None and buffer.dtype == torch.complex64:
                    setattr(module, name, buffer.to(torch.complex128))

    BaseModel.init_weights = init_weights


def record(path: str) -> None:
    """Observes, never changes: TorchTitan's per-step metrics and torch_pjrt's counters."""
    import atexit

    from torchtitan.components import metrics

    steps: list[dict[str, object]] = []
    original = metrics.BaseLogger.log

    def log(self: object, values: dict[str, object], step: int) -> None:
        steps.append({"step": step, **{k: float(v) for k, v in values.items() if isinstance(v, (int, float))}})
        original(self, values, step)

    metrics.BaseLogger.log = log

    def write() -> None:
        report: dict[str, object] = {"steps": steps}
        if "torch_pjrt" in sys.modules:
            import torch_pjrt

            counters = torch_pjrt.metrics()
            report["pjrt"] = {k: counters[k] for k in ("compiled_runs", "compiles", "fallbacks", "executions")}
            report["compiled"] = torch_pjrt.recompiles.compiled_stats()
        with open(f"{path}.rank{os.environ.get('RANK', '0')}.json", "w") as f:
            json.dump(report, f, default=str)

    atexit.register(write)


def make_assets(directory: str, documents: int = 300) -> None:
    """A byte-level BPE tokenizer (vocabulary under the debug model's 2048) and a JSON-lines
    text dataset, made here: the run never reaches the hub. Every document is the same
    text: each rank of a data-parallel run then reads the same token stream as a single
    process does, so a 2-rank run's global batch is that process's batch twice and the
    two must train alike (TorchTitan's FSDP2 cannot run on CPU gloo: PREMUL_SUM)."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    words = ["the", "model", "trains", "on", "a", "device", "with", "many", "small", "steps", "and", "every",
             "gradient", "is", "checked", "against", "float64", "while", "tokens", "flow", "through", "layers"]
    text = " ".join(rng.choice(words) for _ in range(160)) + "."
    texts = [text] * documents
    tok_dir = os.path.join(directory, "tokenizer")
    data_dir = os.path.join(directory, "c4_test")
    os.makedirs(tok_dir, exist_ok=True)
    os.makedirs(data_dir, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=512, special_tokens=specials,
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.save(os.path.join(tok_dir, "tokenizer.json"))
    with open(os.path.join(tok_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": specials[0], "eos_token": specials[1]}, f)
    with open(os.path.join(data_dir, "data.json"), "w") as f:
        for text in texts:
            f.write(json.dumps({"text": text}) + "\n")


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--make-assets"]:
        make_assets(args[1])
        return
    options: list[str] = []
    while args and args[0] in ("--cpu", "--float64", "--record"):
        take = 2 if args[0] == "--record" else 1
        options += args[:take]
        args = args[take:]
    flags = args[1:] if args[:1] == ["--"] else args
    cpu = "--cpu" in options
    if cpu:  # the reference run: torch without torch_pjrt
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    workaround_missing_triton()
    workaround_set_timeout()
    if cpu:
        cpu_reference_workarounds()
    if "--float64" in options:
        float64_reference()
    if "--record" in options:
        record(options[options.index("--record") + 1])
    from torchtitan.train import main as titan_main

    sys.argv = ["torchtitan.train", *flags]
    titan_main()


if __name__ == "__main__":
    main()
