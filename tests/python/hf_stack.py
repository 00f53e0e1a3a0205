"""Shared by the Hugging Face stack tests (test_stacks_hf.py) and their ranks
(dist_workers.py): a small Llama built from a config (no download, no dropout),
a token dataset, the Trainer's arguments, per-step capture of what the Trainer
did, and the float64 CPU references a run is judged against."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

from torch_pjrt.qualify import differential  # noqa: E402

VOCAB = 128
SEQ = 16
LR = 1e-3
EPS32 = torch.finfo(torch.float32).eps


def make_llama(seed: int = 0) -> transformers.LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg)


class TokenDataset(torch.utils.data.Dataset):
    """`n` random sequences whose labels are their tokens (causal LM)."""

    def __init__(self, n: int = 16, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


def training_args(out_dir: str, batch: int, steps: int, **extra: Any) -> transformers.TrainingArguments:
    """Sequential batches (so a 2-rank run's batches together are the 1-rank run's batch), a
    constant learning rate, and a clipping bound the gradients never reach (the norm is still
    computed): each step is a plain AdamW step, which the references repeat."""
    return transformers.TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=batch, max_steps=steps, learning_rate=LR,
        lr_scheduler_type="constant", train_sampling_strategy="sequential", max_grad_norm=1e9,
        report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0, **extra)


class StepRecorder(transformers.TrainerCallback):
    """Records, per optimizer step, the forward's arguments and loss (CPU copies) and the
    model's and optimizer's state after the step, with that step's gradients
    (differential.capture: float64 CPU copies)."""

    def __init__(self) -> None:
        self.inputs: list[dict[str, Any]] = []
        self.losses: list[float] = []
        self.states: list[differential.State] = []
        self.initial: differential.State | None = None
        self._handle: Any = None

    def _record(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        if module.training:
            self.inputs.append({k: v.detach().cpu() if isinstance(v, torch.Tensor) else v
                                for k, v in kwargs.items()})
            self.losses.append(float(output.loss.detach().cpu()))

    def on_train_begin(self, args: Any, state: Any, control: Any, model: torch.nn.Module = None,
                       **kwargs: Any) -> None:
        self.initial = differential.capture(model, None)
        self._handle = model.register_forward_hook(self._record, with_kwargs=True)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, model: torch.nn.Module = None,
                          optimizer: Any = None, **kwargs: Any) -> None:
        self.states.append(differential.capture(model, optimizer))  # gradients are still there

    def on_train_end(self, *args: Any, **kwargs: Any) -> None:
        self._handle.remove()


def _unwrapped(optimizer: Any) -> torch.optim.Optimizer:
    return getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer


def judge_trainer_steps(trainer: transformers.Trainer, recorder: StepRecorder,
                        make_model: Callable[[], torch.nn.Module] = make_llama) -> differential.Comparison:
    """Each step the Trainer took on the device, replayed on the CPU from the device's own state
    in float64 and float32 (torch_pjrt.qualify.differential): loss, every gradient and every
    parameter within 16x float32's own distance to float64 (plus 16 ulps)."""
    optimizer = _unwrapped(trainer.optimizer)
    index = {p: i for i, p in enumerate(trainer.model.parameters())}
    groups = [([index[p] for p in g["params"]], {k: v for k, v in g.items() if k != "params"})
              for g in optimizer.param_groups]

    def make_optimizer(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        # The Trainer's own grouping (decay / no decay) and hyperparameters, so its state loads.
        return type(optimizer)([{"params": [params[i] for i in idx], **hyper} for idx, hyper in groups])

    keys = list(recorder.inputs[0])
    batches = [tuple(inputs[k] for k in keys) for inputs in recorder.inputs]
    assert len(batches) == len(recorder.states), (len(batches), len(recorder.states))

    def loss(m: torch.nn.Module, batch: tuple[Any, ...]) -> torch.Tensor:
        return m(**dict(zip(keys, batch))).loss

    problem = differential.Problem(make_model, batches, loss, make_optimizer, len(batches))
    result = differential.Comparison()
    before = recorder.initial
    for step, after in enumerate(recorder.states):
        after.loss = recorder.losses[step]
        differential.check_step(problem, step, batches[step], before, after, result)
        result.steps += 1
        before = after
    return result


def reference_trajectory(dtype: torch.dtype, batches: list[torch.Tensor], steps: int,
                         autocast: torch.dtype | None = None) -> list[dict[str, torch.Tensor]]:
    """Plain-loop AdamW training on the CPU (the Trainer's step: constant LR, no weight decay):
    the parameters after each step, as float64."""
    model = make_llama().to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    out = []
    for step in range(steps):
        ids = batches[step]
        opt.zero_grad()
        with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        out.append({n: p.detach().to(torch.float64, copy=True) for n, p in model.named_parameters()})
    return out


def worst_ratio(got: list[dict[str, torch.Tensor]], exact: list[dict[str, torch.Tensor]],
                float32: list[dict[str, torch.Tensor]], factor: float = 16.0) -> tuple[float, str]:
    """max over steps and parameters of |got - exact| / (factor |float32 - exact| + 16 ulps)."""
    worst, where = 0.0, ""
    for step, (g, e, f) in enumerate(zip(got, exact, float32)):
        for name in e:
            scale = e[name].abs().max().item()
            allowed = factor * (f[name] - e[name]).abs().max().item() + 16 * EPS32 * scale
            err = (g[name].double() - e[name]).abs().max().item()
            # allowed is 0 only where float64 itself is all zeros and float32 hit it exactly
            # (a LoRA A's gradient while B is still zero): then nothing but exact zeros passes.
            ratio = err / allowed if allowed > 0 else (0.0 if err == 0 else float("inf"))
            if ratio > worst:
                worst, where = ratio, f"step {step}, {name}"
    return worst, where

