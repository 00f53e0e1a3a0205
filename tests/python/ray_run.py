"""A Ray Train run for test_stacks_ray.py: TorchTrainer with two CPU workers and a training
loop that names no device (Ray's get_device, prepare_model and prepare_data_loader place
everything); each worker saves what it saw and its parameters after every step.

    python ray_run.py OUT_DIR STEPS
"""

from __future__ import annotations

import os
import sys

import ray
import ray.train
import ray.train.torch
import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def train_loop(config: dict) -> None:
    sys.path.insert(0, config["tests"])
    import small_classifier as sc

    device = ray.train.torch.get_device()
    model = ray.train.torch.prepare_model(sc.make_net())
    loader = ray.train.torch.prepare_data_loader(sc.loader())
    opt = sc.make_optimizer(model.parameters())
    params, seen = [], set()
    for step, (x, y) in enumerate(loader):
        if step == config["steps"]:
            break
        seen.update({str(x.device), str(next(model.parameters()).device)})
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        params.append(sc.params_of(getattr(model, "module", model)))
    rank = ray.train.get_context().get_world_rank()
    torch.save({"device": str(device), "seen": sorted(seen), "params": params, "wrapped": type(model).__name__,
                "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None},
               os.path.join(config["out"], f"rank{rank}.pt"))


def main(out_dir: str, steps: int) -> None:
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=True)
    try:
        trainer = ray.train.torch.TorchTrainer(
            train_loop, train_loop_config={"out": out_dir, "steps": steps, "tests": HERE},
            scaling_config=ray.train.ScalingConfig(num_workers=2, use_gpu=False),
            run_config=ray.train.RunConfig(storage_path=os.path.join(out_dir, "ray_results")))
        trainer.fit()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
