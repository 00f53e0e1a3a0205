"""_foreach_* kernels (the optimizers' default path) against CPU, one program per call."""

from __future__ import annotations

import pytest
import torch

import torch_pjrt
from conftest import assert_close


def lists(n: int = 3, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(2 + i, 3, generator=g) + 0.5 for i in range(n)]


CASES = {
    "add_scalar": lambda a, b, c: torch._foreach_add(a, 0.5),
    "sub_scalarlist": lambda a, b, c: torch._foreach_sub(a, [0.1, 0.2, 0.3]),
    "mul_list": lambda a, b, c: torch._foreach_mul(a, b),
    "div_tensor": lambda a, b, c: torch._foreach_div(a, torch.tensor(4.0, device=a[0].device)),
    "add_list_alpha": lambda a, b, c: torch._foreach_add(a, b, alpha=-0.3),
    "addcmul_scalar": lambda a, b, c: torch._foreach_addcmul(a, b, c, value=0.7),
    "addcdiv_scalarlist": lambda a, b, c: torch._foreach_addcdiv(a, b, c, [0.1, -0.2, 0.3]),
    "addcdiv_tensor": lambda a, b, c: torch._foreach_addcdiv(a, b, c, torch.tensor([0.1, -0.2, 0.3])),
    "lerp_scalar": lambda a, b, c: torch._foreach_lerp(a, b, 0.25),
    "lerp_list": lambda a, b, c: torch._foreach_lerp(a, b, c),
    "sqrt": lambda a, b, c: torch._foreach_sqrt(a),
    "neg": lambda a, b, c: torch._foreach_neg(a),
    "reciprocal": lambda a, b, c: torch._foreach_reciprocal(a),
    "norm2": lambda a, b, c: torch._foreach_norm(a),
    "norm_inf": lambda a, b, c: torch._foreach_norm(a, float("inf")),
}


@pytest.mark.parametrize("name", list(CASES))
def test_foreach_functional_matches_cpu(name):
    fn = CASES[name]
    cpu = [lists(seed=s) for s in range(3)]
    dev = [[t.to("pjrt") for t in ts] for ts in cpu]
    with torch_pjrt.fallback_mode("error"):
        torch_pjrt.reset_metrics()
        out = fn(*dev)
        recorded = torch_pjrt.metrics()["ops_recorded"]
    for d, c in zip(out, fn(*cpu)):
        assert_close(d, c)
    assert recorded == 1, "one op (one program in strict mode) for the whole list"


@pytest.mark.parametrize("name", ["add_", "mul_", "lerp_", "addcmul_", "addcdiv_", "sqrt_", "zero_"])
def test_foreach_inplace_writes_through_views(name):
    def run(device: str) -> list[torch.Tensor]:
        base = torch.arange(24.0, device=device).reshape(4, 6) / 10 + 1
        views = [base[0], base[1:3, ::2], base.t()[5]]  # views of one storage
        other = [torch.full_like(v, 2.0) for v in views]
        op = getattr(torch, "_foreach_" + name)
        args = {"add_": (other,), "mul_": (1.5,), "lerp_": (other, 0.5), "addcmul_": (other, other, 0.1),
                "addcdiv_": (other, other, [0.1, 0.2, 0.3]), "sqrt_": (), "zero_": ()}[name]
        op(views, *args)
        return [base]

    assert_close(run("pjrt")[0], run("cpu")[0])


def test_clip_grad_norm_matches_cpu():
    def run(device: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(device)
        model(torch.randn(5, 8).to(device)).pow(2).sum().backward()
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        return total, [p.grad for p in model.parameters()]

    dt, dg = run("pjrt")
    ct, cg = run("cpu")
    assert_close(dt, ct)
    for d, c in zip(dg, cg):
        assert_close(d, c)
