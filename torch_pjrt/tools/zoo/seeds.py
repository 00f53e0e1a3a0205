"""The zoo's seeds, the same in every process: the weights' (with constant matrices
re-drawn) and the inputs'."""

from __future__ import annotations

import torch

WEIGHT_SEED = 0
INPUT_SEED = 1234


def redraw_constant_matrices(model: torch.nn.Module, std: float) -> list[str]:
    """Re-draws every parameter of two or more dimensions whose elements are all equal, from
    normal(0, std), seeded. Checkpoints never hold such matrices, but some initializers do (a
    zero router makes every expert score tie, and topk may break ties in any order: AFMoE's
    CPU picks experts 2 and 3 of four, another device 0 and 1; a zero projection hides the
    path behind it from the gradients). Returns the names re-drawn."""
    generator = torch.Generator().manual_seed(WEIGHT_SEED + 1)
    names = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and p.numel() > 1 and p.is_floating_point() and bool((p == p.reshape(-1)[0]).all()):
                p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64).mul_(std).to(p.dtype))
                names.append(name)
    return names
