"""FlexAttention on pjrt (torch.nn.attention.flex_attention), eager and compiled with
backend="pjrt": values and gradients against float64 attention on the CPU, block
masks (TorchTitan's causal and packed-document masks, compiled with pjrt as its
integration does) equal to the CPU's, and the compiled attention one program."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn.attention.flex_attention as flex
import torch.nn.functional as F

import torch_pjrt

DEV = torch_pjrt.DEVICE_NAME
B, H, S, D = 2, 4, 128, 16


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, S, D, generator=g, dtype=torch.float64) for _ in range(3)]


def _causal(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    return q >= kv


def _reference(dtype: torch.dtype) -> tuple[torch.Tensor, list[torch.Tensor]]:
    qkv = [t.to(dtype).requires_grad_() for t in _inputs()]
    out = F.scaled_dot_product_attention(*qkv, is_causal=True)
    out.backward(torch.ones_like(out))
    return out.detach().double(), [t.grad.double() for t in qkv]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_causal_flex_attention_matches_float64(compiled: bool) -> None:
    torch._dynamo.reset()
    torch_pjrt.recompiles.reset_compiled_stats()
    qkv = [t.to(DEV, torch.float32).requires_grad_() for t in _inputs()]
    make_mask, attend = flex.create_block_mask, flex.flex_attention
    if compiled:
        make_mask = torch.compile(make_mask, backend="pjrt")
        attend = torch.compile(attend, backend="pjrt")
    with torch_pjrt.fallback_mode("error"):
        mask = make_mask(_causal, B=None, H=None, Q_LEN=S, KV_LEN=S, device=DEV)
        out = attend(*qkv, block_mask=mask)
        out.backward(torch.ones_like(out))
    exact_out, exact_grads = _reference(torch.float64)
    f32_out, f32_grads = _reference(torch.float32)
    eps = torch.finfo(torch.float32).eps
    for name, got, exact, f32 in [("out", out.detach(), exact_out, f32_out)] + [
            (f"grad {i}", t.grad, e, f) for i, (t, e, f) in enumerate(zip(qkv, exact_grads, f32_grads))]:
        err = (got.cpu().double() - exact).abs().max().item()
        allowed = 16 * (f32 - exact).abs().max().item() + 16 * eps * exact.abs().max().item()
        assert err <= allowed, f"{name}: {err:.3g} from float64, allowed {allowed:.3g}"
    if compiled:
        stats = torch_pjrt.recompiles.compiled_stats()
        assert stats and all(s["eager_graphs"] == [] and s["programs"] >= 1 for s in stats.values()), stats


def test_torchtitan_document_masks_compiled_with_pjrt_equal_cpu() -> None:
    sys.path.insert(0, os.path.dirname(__file__))
    import titan_run

    titan_run.workaround_missing_triton()
    from torchtitan.models.common import attention

    positions = torch.cat([torch.arange(100), torch.arange(156)]).repeat(2, 1)
    positions[1] = torch.cat([torch.arange(30), torch.arange(226)])
    seq = positions.shape[1]
    for document_mask in (attention.get_document_mask_mod, attention.get_efficient_causal_mask_mod_for_packed_document):
        torch._dynamo.reset()

        def build(device: str, make: object) -> flex.BlockMask:
            mask_mod = flex.and_masks(attention.get_causal_mask_mod(), document_mask(positions.to(device)))
            return make(mask_mod, 2, None, seq, seq, device=device, BLOCK_SIZE=128, separate_full_blocks=True)

        want = build("cpu", flex.create_block_mask)
        with torch_pjrt.fallback_mode("error"):
            got = build(DEV, attention._compiled_create_block_mask)  # torch_pjrt's integration: pjrt-compiled
        for field in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks"):
            assert torch.equal(getattr(got, field).cpu(), getattr(want, field)), (document_mask.__name__, field)
