"""Shared by the PyTorch Lightning tests (test_stacks_lightning.py) and their DDP ranks
(run as a script: Lightning's DDP launcher starts the other rank by running it again):
a small classifier as a LightningModule, its data, a callback that records every step,
and float64 / float32 CPU references of the same steps.

    python lightning_stack.py OUT_DIR STEPS [STRATEGY]   (each rank writes OUT_DIR/rank<r>.pt)

STRATEGY: none (Trainer() picks DDP), "fsdp" (FSDP, full shard), or "fsdp-hybrid" (FSDP's
hybrid shard over a (1, 2) device mesh, which makes c10d split the process group).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytorch_lightning as pl
import torch

from torch_pjrt.qualify import differential

from small_classifier import (BATCH, dataset, full_batches, loader, loss_fn, make_net,  # noqa: F401  (re-exported)
                              make_optimizer, params_of, reference_params)


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = make_net()
        self.devices_seen: set[str] = set()

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        self.devices_seen.add(str(batch[0].device))
        self.devices_seen.add(str(next(self.net.parameters()).device))
        return loss_fn(self.net, batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return make_optimizer(self.net.parameters())


class StepRecorder(pl.Callback):
    """Per step: the batch (CPU copies), and the net's and optimizer's state after the step
    with that step's gradients and loss (differential.capture: float64 CPU copies). The
    gradients are still there at the batch's end: Lightning zeroes them in the next step."""

    def __init__(self) -> None:
        self.initial: differential.State | None = None
        self.batches: list[tuple[torch.Tensor, ...]] = []
        self.states: list[differential.State] = []

    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.initial = differential.capture(module.net, None)

    def on_train_batch_start(self, trainer: pl.Trainer, module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self.batches.append(tuple(t.detach().cpu() for t in batch))

    def on_train_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.states.append(differential.capture(module.net, trainer.optimizers[0], outputs["loss"]))


def judge_steps(recorder: StepRecorder) -> differential.Comparison:
    """Each step replayed on the CPU from the device's own state in float64 and float32:
    loss, every gradient and parameter within the differential harness's bound."""
    problem = differential.Problem(make_net, recorder.batches, loss_fn, make_optimizer, len(recorder.batches))
    result = differential.Comparison()
    before = recorder.initial
    for step, after in enumerate(recorder.states):
        differential.check_step(problem, step, recorder.batches[step], before, after, result)
        result.steps += 1
        before = after
    return result


def _strategy(name: str) -> Any:
    if name == "fsdp-hybrid":
        from pytorch_lightning.strategies import FSDPStrategy

        return FSDPStrategy(sharding_strategy="HYBRID_SHARD", device_mesh=(1, 2))
    return name


def _rank_main(out_dir: str, steps: int, strategy: str | None = None) -> None:
    """One rank: Trainer() with nothing said about the device or devices (nor the strategy
    unless one is named); FSDP's ranks also save a full checkpoint at the end."""
    module = Classifier()
    params: list[dict[str, torch.Tensor]] = []

    class Params(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if strategy is None:
                params.append(params_of(module.net))
                return
            from torch.distributed.fsdp import FullyShardedDataParallel

            with FullyShardedDataParallel.summon_full_params(trainer.strategy.model):  # collective
                params.append(params_of(module.net))

    settings: dict[str, Any] = {} if strategy is None else {"strategy": _strategy(strategy), "devices": 2}
    trainer = pl.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[Params()], **settings)
    trainer.fit(module, loader())
    if strategy is not None:
        trainer.save_checkpoint(os.path.join(out_dir, "last.ckpt"))
    torch.save({"params": params, "accelerator": type(trainer.accelerator).__name__,
                "strategy": type(trainer.strategy).__name__,
                "precision": type(trainer.precision_plugin).__name__, "world_size": trainer.world_size,
                "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
                "devices_seen": sorted(module.devices_seen)},
               os.path.join(out_dir, f"rank{trainer.global_rank}.pt"))


if __name__ == "__main__":
    _rank_main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
