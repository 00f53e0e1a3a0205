"""Few-row products (a decode step's tokens times a layer's weights) through the host kernel
(csrc/kernels/few_row_product.inc) where the CPU plugin has it, XLA's dot elsewhere: values
against float64, in eager, compiled and backward, and which programs call the kernel."""
from __future__ import annotations

import copy
import glob
import os
import subprocess
import sys

import pytest
import torch

import torch_pjrt  # noqa: F401
from host_kernel_support import host_kernel_expected

KERNEL = "torch_pjrt_few_row_product_v1"
EPS32 = torch.finfo(torch.float32).eps


def _bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """What a float32 sum of `depth` products may be off by: depth roundings of the sum of the
    terms' magnitudes (any order of summation), elementwise."""
    return (x.double().abs() @ w.double().abs()) * (x.shape[-1] + 1) * EPS32 / 2


def _assert_close(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    exact = x.double() @ w.double() + (bias.double() if bias is not None else 0)
    err = (got.cpu().double() - exact).abs()
    bound = _bound(x, w) + (bias.double().abs() * EPS32 if bias is not None else 0)
    assert bool((err <= bound).all()), f"worst {float((err - bound).max())} over the bound"


def _programs_calling_the_kernel(dump: str) -> int:
    return sum(KERNEL in open(f).read() for f in glob.glob(os.path.join(dump, "*.mlir")))


# rows, depth, columns: decode rows against weights that are and are not whole panels and vectors.
SHAPES = [(1, 512, 1024), (3, 300, 1000), (8, 1536, 512), (16, 512, 3072), (11, 257, 1031)]


@pytest.mark.parametrize("rows,depth,columns", SHAPES)
def test_linear_mm_and_addmm_match_float64(dev: torch.device, rows: int, depth: int, columns: int) -> None:
    g = torch.Generator().manual_seed(rows * 7 + columns)
    x = torch.randn(rows, depth, generator=g)
    weight = torch.randn(columns, depth, generator=g)  # a linear layer's [out, in]
    bias = torch.randn(columns, generator=g)
    w_kn = torch.randn(depth, columns, generator=g)  # stored [in, out], as vLLM on pjrt keeps it
    # The weight as it lies in a linear layer (read transposed), stored [K, N], and with a bias.
    _assert_close(torch.nn.functional.linear(x.to(dev), weight.to(dev)), x, weight.t())
    _assert_close(x.to(dev) @ w_kn.to(dev), x, w_kn)
    _assert_close(torch.nn.functional.linear(x.to(dev), weight.to(dev), bias.to(dev)), x, weight.t(), bias)
    _assert_close(torch.addmm(bias.to(dev), x.to(dev), w_kn.to(dev)), x, w_kn, bias)


def test_a_decode_layer_compiled_and_its_gradients_match_float64(dev: torch.device, tmp_path, monkeypatch) -> None:
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(512, 1536), torch.nn.SiLU(), torch.nn.Linear(1536, 512))
    x = torch.randn(4, 512)

    def forward_backward(model: torch.nn.Module, inputs: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        inputs = inputs.clone().requires_grad_()
        out = model(inputs)
        out.sum().backward()
        return out.detach(), [inputs.grad] + [p.grad for p in model.parameters()]

    ref_out, ref_grads = forward_backward(copy.deepcopy(layer).double(), x.double())
    # The float32 CPU model's own distance to float64 bounds what pjrt may differ by.
    cpu_out, cpu_grads = forward_backward(copy.deepcopy(layer), x)

    on_dev = copy.deepcopy(layer).to(dev)
    monkeypatch.setenv("TORCH_PJRT_DUMP_DIR", str(tmp_path))
    with torch.no_grad():
        got = torch.compile(on_dev, backend="pjrt")(x.to(dev)).cpu()
    # Both layers' products (4 rows, linear weights read as they lie) in the compiled program.
    assert _programs_calling_the_kernel(str(tmp_path)) == (1 if host_kernel_expected() else 0)
    tol = 4 * (cpu_out.double() - ref_out).abs().max().item() + 1e-6
    assert (got.double() - ref_out).abs().max().item() <= tol

    _, got_grads = forward_backward(on_dev, x.to(dev))
    for name, got_g, cpu_g, ref_g in zip(["x", "w1", "b1", "w2", "b2"], got_grads, cpu_grads, ref_grads):
        tol = 4 * (cpu_g.double() - ref_g).abs().max().item() + 1e-6
        assert (got_g.cpu().double() - ref_g).abs().max().item() <= tol, name


def test_which_products_call_the_host_kernel(dev: torch.device, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TORCH_PJRT_DUMP_DIR", str(tmp_path))
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(1024, 512, generator=g).to(dev)

    def calls(fn) -> int:
        """Programs calling the kernel among those fn compiled (each call must compile anew:
        a program reused from the memory cache is not dumped, and would count as none)."""
        before = (len(glob.glob(os.path.join(tmp_path, "*.mlir"))), _programs_calling_the_kernel(str(tmp_path)))
        fn().cpu()
        assert len(glob.glob(os.path.join(tmp_path, "*.mlir"))) > before[0], "no program was compiled"
        return _programs_calling_the_kernel(str(tmp_path)) - before[1]

    few = torch.randn(16, 512, generator=g).to(dev)
    many = torch.randn(17, 512, generator=g).to(dev)
    expected = 1 if host_kernel_expected() else 0
    assert calls(lambda: torch.nn.functional.linear(few, weight)) == expected
    assert calls(lambda: few @ weight[:512].contiguous()) == expected  # a weight stored [K, N]
    assert calls(lambda: torch.nn.functional.linear(few[:1], weight)) == expected
    # One row times a [K, N] weight: XLA's dot streams the weight's rows whole (faster there).
    assert calls(lambda: few[:1] @ weight[:512].contiguous()) == 0
    # More rows than the kernel takes, a weight too small to be worth the threads (2^16
    # elements), one too narrow to give each thread a panel (64 columns), a weight that is a
    # strided slice (read in place by neither layout), float64: XLA's dot.
    assert calls(lambda: torch.nn.functional.linear(many, weight)) == 0
    assert calls(lambda: few[:, :256] @ weight[:256, :256].contiguous()) == 0
    narrow = torch.randn(4096, 64, generator=g).to(dev)  # 2^18 elements
    assert calls(lambda: torch.randn(16, 4096, generator=g).to(dev) @ narrow) == 0
    assert calls(lambda: few @ weight[::2].t()) == 0
    assert calls(lambda: few.double() @ weight.double().t()) == 0


def test_the_kernel_is_not_called_with_host_kernels_off() -> None:
    # TORCH_PJRT_HOST_KERNELS=0 turns it off with the attention kernel; the products still match.
    env = dict(os.environ, TORCH_PJRT_HOST_KERNELS="0")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                           "match_float64 or which_products"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout, proc.stdout[-1000:]
