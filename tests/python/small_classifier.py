"""A small classifier, its data and optimizer, and float64 / float32 CPU references of
plain training steps: shared by the Lightning and Ray Train tests and their ranks."""

from __future__ import annotations

from typing import Any

import torch

LR = 1e-2
BATCH = 4
FEATURES, CLASSES = 8, 4


def make_net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, CLASSES))


def loss_fn(net: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(net(batch[0]), batch[1])


def make_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=LR)


def dataset(n: int = 32, seed: int = 1) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return torch.utils.data.TensorDataset(torch.randn(n, FEATURES, generator=g),
                                          torch.randint(0, CLASSES, (n,), generator=g))


def loader(n: int = 32, batch: int = BATCH) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(dataset(n), batch_size=batch, shuffle=False)


def params_of(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().to("cpu", torch.float64, copy=True) for n, p in net.named_parameters()}


def reference_params(dtype: torch.dtype, batches: list[tuple[torch.Tensor, ...]],
                     autocast: torch.dtype | None = None) -> list[dict[str, torch.Tensor]]:
    """A plain loop on the CPU: the parameters after each step, as float64."""
    net = make_net().to(dtype)
    opt = make_optimizer(net.parameters())
    out = []
    for x, y in batches:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            loss = loss_fn(net, (x.to(dtype), y))
        loss.backward()
        opt.step()
        out.append(params_of(net))
    return out


def full_batches(ranks: int, steps: int, shuffle: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """What `ranks` DDP ranks together train on at each step when each takes its share of the
    data through torch's DistributedSampler (seed 0) in batches of BATCH: the averaged
    gradient is that of the ranks' batches together."""
    data = dataset()
    x, y = data.tensors
    shares = [list(torch.utils.data.DistributedSampler(data, num_replicas=ranks, rank=r, shuffle=shuffle, seed=0))
              for r in range(ranks)]
    steps_idx = [sum((share[BATCH * s: BATCH * (s + 1)] for share in shares), []) for s in range(steps)]
    return [(x[idx], y[idx]) for idx in steps_idx]
