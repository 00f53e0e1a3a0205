"""torch_pjrt.library: kernels written in JAX (Pallas included) as PyTorch operators,
checked against their PyTorch counterparts on the CPU (float64 references) in strict,
fused and compiled modes, with gradients, program counts, the disk cache and bad input."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt

jax = pytest.importorskip("jax", reason="the custom-kernel tests need JAX (scripts/requirements-kernels.txt)")
import jax.numpy as jnp  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
sys.path.insert(0, EXAMPLES)
import jax_kernels  # noqa: E402

from torch_pjrt.library import jax_op, stablehlo_op  # noqa: E402


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def torch_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _f32_bound(device_value: torch.Tensor, cpu_f32: torch.Tensor, ref64: torch.Tensor) -> None:
    """float32 on the device is as close to the float64 reference as the CPU's float32 is
    (with a margin of 4 and a floor of a few float32 ulps of the values' scale)."""
    cpu_err = (cpu_f32.double() - ref64).abs().max().item()
    scale = ref64.abs().max().item() + 1.0
    err = (device_value.cpu().double() - ref64).abs().max().item()
    assert err <= max(4 * cpu_err, 8 * torch.finfo(torch.float32).eps * scale), (err, cpu_err)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_rms_norm_and_cross_entropy_match_pytorch_with_gradients(dev, mode):
    torch_pjrt.set_eager_mode(mode)
    torch.manual_seed(0)
    x, w = torch.randn(6, 32, dtype=torch.float64), torch.randn(32, dtype=torch.float64)
    logits, labels = torch.randn(6, 11, dtype=torch.float64), torch.randint(0, 11, (6,))
    xr, wr, lr = (t.clone().requires_grad_() for t in (x, w, logits))
    ref = torch_rms_norm(xr, wr)
    ref_loss = F.cross_entropy(lr, labels)
    (ref.square().sum() + ref_loss).backward()

    xd, wd, ld = (t.to(dev).requires_grad_() for t in (x, w, logits))
    out = jax_kernels.rms_norm(xd, wd)
    loss = jax_kernels.softmax_cross_entropy(ld, labels.to(dev))
    (out.square().sum() + loss).backward()
    # float64 on both sides: the same formulas, equal to rounding.
    for got, want in ((out, ref), (loss, ref_loss), (xd.grad, xr.grad), (wd.grad, wr.grad), (ld.grad, lr.grad)):
        torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-12, atol=1e-12)

    # float32: as close to the float64 reference as the CPU's own float32.
    out32 = jax_kernels.rms_norm(x.float().to(dev), w.float().to(dev))
    _f32_bound(out32, torch_rms_norm(x.float(), w.float()), ref.detach())


def test_cpu_tensors_run_the_same_operator_through_jax_on_the_host():
    torch.manual_seed(0)
    x, w = torch.randn(3, 8, dtype=torch.float64, requires_grad=True), torch.randn(8, dtype=torch.float64)
    out = jax_kernels.rms_norm(x, w, 1e-5)
    out.sum().backward()
    xr = x.detach().clone().requires_grad_()
    torch_rms_norm(xr, w, 1e-5).sum().backward()
    torch.testing.assert_close(out, torch_rms_norm(x.detach(), w, 1e-5), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-12, atol=1e-12)


def test_pallas_kernel_runs_through_its_interpreter(dev):
    torch.manual_seed(0)
    x, y = torch.randn(16, 256), torch.randn(16, 256)
    want = x + 0.25 * y
    assert torch.equal(jax_kernels.pallas_add_scaled(x, y, 0.25), want)
    assert torch.equal(jax_kernels.pallas_add_scaled(x.to(dev), y.to(dev), 0.25).cpu(), want)


class TinyLM(torch.nn.Module):
    """Embedding, two residual blocks with RMSNorm, a head: the norm and the loss either
    PyTorch's or the JAX operators'."""

    def __init__(self, use_jax: bool, vocab: int = 13, dim: int = 16) -> None:
        super().__init__()
        self.use_jax = use_jax
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(2))
        self.norms = torch.nn.ParameterList(torch.nn.Parameter(1 + 0.1 * torch.randn(dim)) for _ in range(2))
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for block, norm in zip(self.blocks, self.norms):
            n = jax_kernels.rms_norm(h, norm) if self.use_jax else torch_rms_norm(h, norm)
            h = h + torch.tanh(block(n))
        logits = self.head(h).reshape(-1, self.head.out_features)
        if self.use_jax:
            return jax_kernels.softmax_cross_entropy(logits, labels.reshape(-1))
        return F.cross_entropy(logits, labels.reshape(-1))


@pytest.mark.parametrize("mode", ["strict", "fused", "compiled"])
def test_training_with_jax_operators_matches_pytorch_every_step(dev, mode):
    # float64 throughout: the reference is PyTorch's own ops on the CPU, so every step's
    # loss, gradients and parameters must agree to rounding.
    torch.manual_seed(0)
    ref = TinyLM(use_jax=False).double()
    model = copy.deepcopy(ref).to(dev)
    model.use_jax = True
    if mode != "compiled":
        torch_pjrt.set_eager_mode(mode)
    loss_fn = torch.compile(model, backend="pjrt") if mode == "compiled" else model
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(3):
        tokens, labels = torch.randint(0, 13, (4, 5)), torch.randint(0, 13, (4, 5))
        opt_ref.zero_grad()
        want = ref(tokens, labels)
        want.backward()
        opt.zero_grad()
        got = loss_fn(tokens.to(dev), labels.to(dev))
        got.backward()
        torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-11, atol=1e-12)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-10, atol=1e-12, msg=f"step {step} grad {name}")
        opt_ref.step()
        opt.step()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-10, atol=1e-12, msg=f"step {step} {name}")
    if mode == "compiled":
        stats = next(iter(torch_pjrt.metrics()["compiled"].values()))
        # The JAX operators are inside the forward and backward programs: no graph break.
        assert stats["programs"] == 2 and stats["eager_graphs"] == [] and stats["recompiles"] == 0, stats


WARM_CHILD = """
import json, sys, torch, torch_pjrt
sys.path.insert(0, {examples!r})
import jax_kernels
torch.manual_seed(0)
x, w = torch.randn(4, 32).to("pjrt"), torch.randn(32).to("pjrt")
f = torch.compile(lambda a, b: jax_kernels.rms_norm(a, b).square().sum(), backend="pjrt")
value = f(x, w).item()
print(json.dumps({{"value": value, "compiles": torch_pjrt.metrics()["compiles"],
                  "disk_hits": torch_pjrt.metrics()["disk_cache_hits"]}}))
"""


def test_a_second_process_reads_the_kernel_s_programs_from_the_disk_cache(tmp_path):
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=str(tmp_path / "pjrt"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "ind"))
    code = WARM_CHILD.format(examples=os.path.abspath(EXAMPLES))

    def child() -> dict:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    cold, warm = child(), child()
    assert cold["compiles"] >= 1
    assert warm["compiles"] == 0 and warm["disk_hits"] == cold["compiles"], (cold, warm)
    assert warm["value"] == cold["value"]


def test_static_arguments_are_part_of_the_key(dev):
    x, w = torch.randn(2, 8), torch.ones(8)
    for eps in (1e-6, 0.5):
        torch.testing.assert_close(jax_kernels.rms_norm(x.to(dev), w.to(dev), eps).cpu(), torch_rms_norm(x, w, eps))


def test_bad_input_names_the_operator(dev):
    with pytest.raises(RuntimeError, match="torch_pjrt_examples::softmax_cross_entropy.*could not"):
        jax_kernels.softmax_cross_entropy(torch.randn(2, 3, 4, device=dev), torch.zeros(2, dtype=torch.long, device=dev))
    with pytest.raises(RuntimeError, match="torch_pjrt_examples::rms_norm.*could not"):
        jax_kernels.rms_norm(torch.randn(2, 8, device=dev), torch.ones(3, device=dev))
    with pytest.raises(RuntimeError, match="torch_pjrt_examples::rms_norm: expected all tensors on one device"):
        jax_kernels.rms_norm(torch.randn(2, 8, device=dev), torch.ones(8))

    def not_exportable(x):
        return jnp.asarray(float(x.sum()))  # a concrete value from a traced one: JAX refuses

    op = jax_op("torch_pjrt_tests::not_exportable", not_exportable, differentiable=False)
    with pytest.raises(RuntimeError, match="torch_pjrt_tests::not_exportable: JAX could not export"):
        op(torch.ones(3, device=dev))
    with pytest.raises(TypeError, match="needs a float, int, bool or str default"):
        jax_op("torch_pjrt_tests::bad_static", lambda x, flag=None: x)


def test_stablehlo_text_as_an_operator(dev):
    text = """
    func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
      %0 = stablehlo.multiply %a, %b : tensor<4xf32>
      %1 = stablehlo.add %0, %a : tensor<4xf32>
      return %1 : tensor<4xf32>
    }
    """
    op = stablehlo_op("torch_pjrt_tests::mul_add", text, outputs=[((4,), torch.float32)])
    a, b = torch.randn(4), torch.randn(4)
    # Against float64: XLA may fuse the multiply-add (one rounding) or not (two), depending on
    # the CPU; either way the error is at most 2^-24 (2|ab| + |a|), under this bound.
    ref = a.double() * b.double() + a.double()
    bound = 2.0**-23 * ((a.double() * b.double()).abs() + a.double().abs())
    assert ((op(a.to(dev), b.to(dev)).cpu().double() - ref).abs() <= bound).all()
    f = torch.compile(lambda x, y: op(x, y) * 2, backend="pjrt")
    assert ((f(a.to(dev), b.to(dev)).cpu().double() - 2 * ref).abs() <= 2 * bound).all()
    with pytest.raises(RuntimeError, match="torch_pjrt_tests::mul_add: expected inputs"):
        op(torch.randn(5, device=dev), torch.randn(5, device=dev))


def test_a_kernel_the_plugin_cannot_compile_names_the_operator(dev):
    # Parses as StableHLO, but the plugin has no such custom call: its compile error reaches
    # the caller with the operator's name, and the device goes on working.
    text = """
    func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {
      %0 = stablehlo.custom_call @torch_pjrt_no_such_target(%a) : (tensor<4xf32>) -> tensor<4xf32>
      return %0 : tensor<4xf32>
    }
    """
    op = stablehlo_op("torch_pjrt_tests::unknown_target", text, outputs=[((4,), torch.float32)])
    with pytest.raises(RuntimeError, match="torch_pjrt_tests::unknown_target failed: PJRT_Client_Compile: .*"
                                           "torch_pjrt_no_such_target"):
        op(torch.ones(4, device=dev)).cpu()
    assert torch.equal((torch.ones(4, device=dev) + 1).cpu(), torch.full((4,), 2.0))


def test_an_unused_input_and_a_linear_function_s_gradient(dev):
    # JAX drops unused inputs unless told not to; the VJP of a linear function reads no primal.
    op = jax_op("torch_pjrt_tests::scale_first", lambda x, y: 3.0 * x)
    x, y = torch.randn(4, device=dev, requires_grad=True), torch.randn(4, device=dev, requires_grad=True)
    out = op(x, y)
    out.sum().backward()
    assert torch.equal(out.detach().cpu(), 3.0 * x.detach().cpu())
    assert torch.equal(x.grad.cpu(), torch.full((4,), 3.0)) and torch.equal(y.grad.cpu(), torch.zeros(4))


def test_float32_kernels_stay_float32_and_integer_inputs_get_no_gradient(dev):
    def embed_scale(table, index):
        return table[index] * jnp.asarray(0.5)  # a weakly-typed constant: float32 in JAX's default mode

    op = jax_op("torch_pjrt_tests::embed_scale", embed_scale)
    table = torch.randn(5, 3, device=dev, requires_grad=True)
    index = torch.tensor([4, 0, 4], device=dev)
    out = op(table, index)
    assert out.dtype == torch.float32
    out.sum().backward()
    want = torch.zeros(5, 3)
    want[4], want[0] = 1.0, 0.5
    assert torch.equal(table.grad.cpu(), want)


def test_unsupported_derivatives_raise_rather_than_mislead(dev):
    op = jax_op("torch_pjrt_tests::abs2", lambda z: z * jnp.conj(z))
    z = torch.tensor([3 + 4j], device=dev, requires_grad=True)
    with pytest.raises(RuntimeError, match="torch_pjrt_tests::abs2: gradients through complex tensors"):
        op(z).real.sum().backward()
    x = torch.randn(3, device=dev, requires_grad=True)
    (g,) = torch.autograd.grad(jax_kernels.rms_norm(x, torch.ones(3, device=dev)).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="second derivative"):
        g.sum().backward()

