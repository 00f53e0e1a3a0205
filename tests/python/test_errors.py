"""Bad input: clear Python exceptions naming the op; the process never aborts;
tensors that existed before the error keep their values."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt


def test_shape_mismatch(dev):
    a = torch.ones(2, 3, device=dev)
    with pytest.raises(RuntimeError, match="must match the size"):
        a + torch.ones(4, device=dev)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        a @ torch.ones(2, 3, device=dev)
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        a.add_(torch.ones(4, 2, 3, device=dev))
    assert a.sum().item() == 6


def test_dtype_errors(dev):
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.ones(2, 2, device=dev) @ torch.ones(2, 2, dtype=torch.float64, device=dev)
    with pytest.raises(TypeError, match="not supported on the pjrt device"):
        torch.ones(2, dtype=torch.complex32, device=dev)
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.ones(2, dtype=torch.int64, device=dev).add_(torch.ones(2, device=dev) * 0.5)
    with pytest.raises(IndexError, match="Expected dtype int32/int64"):
        torch.ones(3, device=dev).index_select(0, torch.ones(2, device=dev))


def test_mixing_devices_is_an_error(dev):
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3, device=dev) + torch.ones(3)


def test_out_of_range_index_strict_raises_at_next_sync_and_keeps_values(dev):
    w = torch.arange(10.0, device=dev).reshape(5, 2)
    keep = w.clone()
    idx = torch.tensor([1, 7], device=dev)
    out = w.index_select(0, idx)  # queued: no error yet (like a CUDA device-side assert)
    w.index_put_((idx,), torch.zeros(2, 2, device=dev))  # this op's writes must not land
    with pytest.raises(IndexError, match="index out of range in aten::index_select"):
        out.cpu()
    torch_pjrt.synchronize()  # the error was reported once
    assert torch.equal(w.cpu(), keep.cpu())
    with pytest.raises(IndexError, match="aten::embedding"):
        F.embedding(torch.tensor([[0, 12]], device=dev), w).sum().item()
    with pytest.raises(IndexError, match="aten::gather"):
        w.gather(1, torch.tensor([[0], [2], [0], [0], [0]], device=dev)).cpu()
    with pytest.raises(IndexError, match="target out of bounds"):
        F.cross_entropy(torch.zeros(2, 3, device=dev), torch.tensor([0, 3], device=dev)).item()


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("op", ["index_copy_", "index_add_", "index_fill_", "index_put_", "index_put_(accumulate)",
                                "scatter_", "scatter_(value)", "scatter_add_"])
def test_an_index_update_with_an_index_out_of_range_leaves_its_tensor_bit_for_bit(dev, mode, op):
    """These ops keep their tensor unchanged themselves (they write back what they would replace,
    or add -0): signed zeros, NaN and the other rows stay exactly, a view's base included."""
    name = op.split("_(")[0].rstrip("_")
    base = torch.tensor([[-0.0, float("nan")], [1.5, -2.0], [0.0, 3.0], [4.0, -0.0]])
    bits = base.view(torch.int32).clone()
    w = base.to(dev)
    rows = w[1:]  # a view: the write goes through to the base's storage
    idx = torch.tensor([0, 9, 1], device=dev)
    idx2 = torch.tensor([[0, 1], [1, 9], [2, 0]], device=dev)  # scatter's: one index per element
    source = torch.full((3, 2), 7.0, device=dev)
    with torch_pjrt.eager_mode(mode):
        update = {"index_copy_": lambda: rows.index_copy_(0, idx, source),
                  "index_add_": lambda: rows.index_add_(0, idx, source),
                  "index_fill_": lambda: rows.index_fill_(0, idx, 7.0),
                  "index_put_": lambda: rows.index_put_((idx,), source),
                  "index_put_(accumulate)": lambda: rows.index_put_((idx,), source, accumulate=True),
                  "scatter_": lambda: rows.scatter_(0, idx2, source),
                  "scatter_(value)": lambda: rows.scatter_(0, idx2, 7.0),
                  "scatter_add_": lambda: rows.scatter_add_(0, idx2, source)}[op]
        update()
        with pytest.raises(IndexError, match=rf"index out of range in aten::{name}_? \("):
            torch_pjrt.synchronize()
    assert torch.equal(w.cpu().view(torch.int32), bits)


def test_out_of_range_index_debug_raises_at_the_line(dev):
    w = torch.arange(6.0, device=dev)
    with torch_pjrt.debug_mode():
        with pytest.raises(IndexError, match="aten::index_select") as info:
            w.index_select(0, torch.tensor([6], device=dev))
    # The traceback ends in this test's own line, not at a later sync point.
    assert any("test_errors.py" in str(tb.path) for tb in info.traceback)
    assert w.sum().item() == 15


def test_debug_mode_catches_nan(dev):
    x = torch.tensor([1.0, -1.0], device=dev)
    with torch_pjrt.debug_mode():
        with pytest.raises(RuntimeError, match="aten::log produced NaN"):
            torch.log(x)
        torch.exp(x)  # fine
    assert torch.isnan(torch.log(x)).any().item()  # strict mode does not check


def test_debug_mode_stops_inf_made_from_finite_values_at_the_line(dev):
    x = torch.tensor([1.0, 100.0], device=dev)
    with torch_pjrt.debug_mode():
        with pytest.raises(RuntimeError, match=r"aten::exp produced Inf from finite inputs") as info:
            torch.exp(x)  # overflow
        assert any("test_errors.py" in str(tb.path) for tb in info.traceback)
        with pytest.raises(RuntimeError, match=r"aten::div produced Inf from finite inputs"):
            x / torch.zeros(2, device=dev)  # division by zero
        y = torch.full((2,), 3e38, device=dev)
        with pytest.raises(RuntimeError, match=r"aten::mul_? produced Inf from finite inputs"):
            y.mul_(10)  # in place: the written storage is checked too
        with pytest.raises(RuntimeError, match=r"aten::add produced NaN"):
            torch.tensor([float("inf")], device=dev) + torch.tensor([float("-inf")], device=dev)


def test_debug_mode_lets_intended_infinities_through(dev):
    """Masks fill with -inf on purpose; what is computed from an Inf stays quiet, NaN does not."""
    scores = torch.randn(2, 4, 4, device=dev)
    with torch_pjrt.debug_mode():
        causal = torch.ones(4, 4, dtype=torch.bool, device=dev).triu(1)
        masked = scores.masked_fill(causal, float("-inf"))
        additive = torch.full((4, 4), float("-inf"), device=dev).triu(1)
        where = torch.where(causal, torch.tensor(float("-inf")), scores)
        both = masked + additive + where
        probs = torch.softmax(both, dim=-1)
        best = both.amax(dim=-1)  # finite: the diagonal is never masked
        logs = torch.log_softmax(both, dim=-1)  # -inf where masked, from an input that held -inf
        log_probs = torch.log(probs)  # log(0) = -inf exactly: the logarithms' infinities are not blow-ups
    expected = torch.softmax(scores.cpu().masked_fill(causal.cpu(), float("-inf")) * 2, dim=-1)
    torch.testing.assert_close(probs.cpu(), expected)
    assert torch.isfinite(best.cpu()).all()
    assert torch.isneginf(logs.cpu()[causal.cpu().expand(2, 4, 4)]).all()
    assert torch.isneginf(log_probs.cpu()[causal.cpu().expand(2, 4, 4)]).all()


def test_safe_softmax_of_a_fully_masked_row_is_zero_without_nan(dev):
    """SDPA's softmax (aten::_safe_softmax): a row of only -inf gives zeros, as on the CPU, and
    debug mode sees no NaN (torch's composite would make one in _softmax and mask it after)."""
    x = torch.randn(3, 5)
    x[1] = float("-inf")
    x[2, :3] = float("-inf")
    expected = torch._safe_softmax(x, -1)
    with torch_pjrt.debug_mode():
        got = torch._safe_softmax(x.to(dev), -1)
    torch.testing.assert_close(got.cpu(), expected)
    assert (got.cpu()[1] == 0).all()


def test_debug_mode_from_environment():
    code = "import torch, torch_pjrt; print(torch_pjrt.eager_mode())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, TORCH_PJRT_EAGER_MODE="debug"), timeout=120)
    assert r.stdout.strip() == "debug", r.stderr


def test_out_of_memory_is_torch_oom_and_keeps_tensors():
    code = (
        "import resource, torch, torch_pjrt\n"
        "resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))\n"
        "keep = torch.arange(4.0, device='pjrt').reshape(2, 2)\n"
        "torch.pjrt.synchronize()\n"
        "try:\n"
        "    keep.add_(1)  # fused mode: in the graph that fails, so not applied\n"
        "    big = torch.ones(2**33, device='pjrt')  # held: fused mode must materialize it too\n"
        "    big.sum().item()\n"
        "except torch.OutOfMemoryError as e:\n"
        "    print('OOM', 'aten::' in str(e))\n"
        "try:\n"
        "    print((keep * 2).cpu().tolist(), torch_pjrt.eager_mode())\n"
        "except RuntimeError as e:\n"
        "    print('LOST', torch_pjrt.eager_mode(), str(e).splitlines()[0])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "OOM True" in r.stdout
    # The tensor stays usable (its dims and dtype are those of the buffer it kept).
    if "fused" in r.stdout and "LOST" not in r.stdout:
        assert "[[0.0, 2.0], [4.0, 6.0]] fused" in r.stdout, r.stdout
    elif "fused" in r.stdout:
        # Newer XLA CPU plugins (fastatomstruct-xla-cpu 2026.6.23) release a buffer donated to a
        # program whose execution then fails for memory; the old contents are gone, and reading
        # them raises, naming the op and the donation or the failure (when the plugin refuses
        # the program at dispatch: "Error dispatching computation: Out of memory"), never a wrong value.
        # (Known gap: the executor could hold such buffers back; see the README's status.)
        lost = r.stdout.split("LOST fused", 1)[-1]
        assert "LOST fused" in r.stdout and "aten::" in lost, r.stdout
        assert "donated" in lost or "out of memory" in lost.lower(), r.stdout
    else:
        assert "[[2.0, 4.0], [6.0, 8.0]]" in r.stdout, r.stdout


def test_generator_of_another_device_is_an_error():
    code = (
        "import torch, torch_pjrt\n"
        "g = torch.Generator('pjrt:0')\n"
        "try:\n"
        "    torch.normal(torch.zeros(3, device='pjrt:1'), torch.ones(3, device='pjrt:1'), generator=g)\n"
        "    torch.pjrt.synchronize()\n"
        "except RuntimeError as e:\n"
        "    print('refused:', 'generator' in str(e).lower() or 'device' in str(e).lower())\n"
        "g.manual_seed(1)\n"
        "print(torch.rand(2, device='pjrt:0', generator=g).cpu().shape, (torch.ones(2, device='pjrt:1') + 1).cpu().tolist())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, TORCH_PJRT_CPU_DEVICES="2"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused: True" in r.stdout, r.stdout
    assert "torch.Size([2]) [2.0, 2.0]" in r.stdout, r.stdout


def test_bad_arguments(dev):
    x = torch.ones(3, 4, device=dev)
    with pytest.raises(IndexError):
        x.sum(dim=5)
    with pytest.raises(RuntimeError, match="rounding_mode"):
        torch.div(x, x, rounding_mode="bogus")
    with pytest.raises(RuntimeError, match="normalized_shape"):
        F.layer_norm(x, (5,))
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        torch.cat([x, torch.ones(3, 5, device=dev)], 0)
    assert x.sum().item() == 12


def test_messages_match_torch_where_its_tests_match_them(dev):
    # PyTorch's own tests match these texts (test_ops' test_errors): the same check, the same words.
    x, w = torch.randn(1, 1, 4), torch.randn(1, 2, 2)
    for device in ("cpu", dev):
        with pytest.raises(RuntimeError, match="non-positive stride is not supported"):
            F.conv1d(x.to(device), w.to(device), stride=0)  # the stride is named before the channel mismatch
        with pytest.raises(RuntimeError, match=r"Expected non-empty vector or matrix with optional 0-dim batch size"):
            F.multilabel_margin_loss(torch.randn(5, 0, device=device), torch.zeros(5, 0, dtype=torch.long, device=device))
        with pytest.raises(RuntimeError, match=r"Optional dtype must be either a floating point or complex dtype"):
            torch.mean(torch.ones(3, dtype=torch.long, device=device), dtype=torch.long)


def _expanded(device: str) -> torch.Tensor:
    return torch.zeros(1, device=device).expand(3)  # three elements, one memory location


# Bad input that PyTorch's own tests feed (test_ops' test_errors), with the type and words they
# expect: each case raises on the CPU too, so the table checks pjrt against PyTorch itself.
BAD_INPUT = {
    "roll of a 0-d tensor": (IndexError, "Dimension specified as 0",
                             lambda d: torch.roll(torch.tensor(1.0, device=d), 0, 0)),
    "arange with a step that truncates to 0": (ValueError, "step must be nonzero",
                                               lambda d: torch.arange(0, 64, 0.5, out=torch.empty(0, dtype=torch.long, device=d))),
    "gather out= that is the input": (RuntimeError, "unsupported operation",
                                      lambda d: (lambda s: torch.gather(s, 0, torch.tensor([2, 1, 0], device=d), out=s[:3]))(torch.rand(6, device=d))),
    "gather out= of another dtype": (RuntimeError, "Expected out tensor to have dtype float, but got double",
                                     lambda d: torch.gather(torch.ones(2, 2, device=d), 1, torch.zeros(2, 2, dtype=torch.long, device=d),
                                                            out=torch.empty(2, 2, dtype=torch.float64, device=d))),
    "take out= overlapping itself": (RuntimeError, "unsupported operation",
                                     lambda d: torch.take(torch.rand(6, device=d), torch.tensor([2, 1, 0], device=d), out=_expanded(d))),
    "index_select out= overlapping itself": (RuntimeError, "unsupported operation",
                                             lambda d: torch.index_select(torch.rand(3, 6, device=d), 1, torch.tensor([0, 1], device=d),
                                                                          out=torch.rand(1, 6, device=d).expand(2, 6))),
    "masked_select out= that is the input": (RuntimeError, "unsupported operation",
                                             lambda d: (lambda y: torch.masked_select(y, y > 0.5, out=y))(torch.rand(6, device=d))),
    "kthvalue values= that is the input": (RuntimeError, "unsupported operation",
                                           lambda d: (lambda t: torch.kthvalue(t, 5, out=(t, torch.empty((), dtype=torch.long, device=d))))(torch.rand(10, device=d))),
    "cat out= that is an input": (RuntimeError, "refer to a single memory location",
                                  lambda d: (lambda y: torch.cat((y, y), out=y))(torch.rand(4, 6, device=d))),
    "scatter of another dtype": (RuntimeError, "Expected self.dtype to be equal to src.dtype",
                                 lambda d: torch.zeros(3, 5, dtype=torch.float64, device=d).scatter(
                                     0, torch.tensor([[0, 1], [1, 2]], device=d), torch.ones(2, 5, device=d))),
    "scatter_add with an index of another rank": (RuntimeError, "Index tensor must have the same number of dimensions as self tensor",
                                                  lambda d: torch.zeros(3, 5, 3, device=d).scatter_add(
                                                      0, torch.tensor([[0, 1], [1, 2]], device=d), torch.ones(2, 5, device=d))),
    "scatter with a src of another rank": (RuntimeError, "Index tensor must have the same number of dimensions as src tensor",
                                           lambda d: torch.zeros(3, 5, device=d).scatter(
                                               0, torch.tensor([[0, 1], [1, 2]], device=d), torch.ones(2, 5, 2, device=d))),
    "masked_fill of a long tensor with a complex tensor": (RuntimeError, "value cannot be converted to type .* without overflow",
                                                           lambda d: torch.ones(2, dtype=torch.long, device=d).masked_fill(
                                                               torch.tensor(True, device=d), torch.tensor(1j, device=d))),
    "aminmax over 65 dimensions": (RuntimeError, "only tensors with up to 64 dims are supported",
                                   lambda d: torch.aminmax(torch.ones([1] * 65, device=d), dim=-1)),
    "aminmax over an empty dimension": (IndexError, "reduction",
                                        lambda d: torch.aminmax(torch.ones(2, 0, 2, device=d), dim=1)),
    "neg of bool": (RuntimeError, "Negation, the `-` operator, on a bool tensor is not supported",
                    lambda d: -torch.ones(2, dtype=torch.bool, device=d)),
    "gelu with an unknown approximation": (RuntimeError, "approximate argument must be either none or tanh",
                                           lambda d: F.gelu(torch.ones(2, device=d), approximate="asdf")),
    "softshrink with a negative lambda": (RuntimeError, r"lambda must be in range \[0,.*found -0\.5",
                                          lambda d: F.softshrink(torch.ones(2, device=d), -0.5)),
    "multinomial out= of floats": (RuntimeError, "multinomial expects Long tensor out",
                                   lambda d: torch.multinomial(torch.ones(1, 2, dtype=torch.float64, device=d), 2,
                                                               out=torch.empty(1, 2, dtype=torch.float64, device=d))),
    "conv1d with a 2-d weight": (RuntimeError, "weight should have at least three dimensions",
                                 lambda d: F.conv1d(torch.ones(1, 1, 4, device=d), torch.ones(1, 2, device=d))),
    "conv2d with fewer filters than groups": (RuntimeError, "expected weight to be at least 3 at dimension 0",
                                              lambda d: F.conv2d(torch.ones(2, 2, 4, 3, device=d), torch.ones(2, 2, 1, 3, device=d), groups=3)),
    "max_pool2d with negative padding": (RuntimeError, "pad must be non-negative",
                                         lambda d: F.max_pool2d(torch.ones(0, 1, 49, device=d), 2, 50, -1)),
    "max_pool2d of an empty non-batch dimension": (RuntimeError, r"Expected 3D or 4D \(batch mode\) tensor with optional 0 dim batch size",
                                                   lambda d: F.max_pool2d(torch.ones(2, 1, 10, 0, device=d), 1)),
    "max_pool3d of an empty non-batch dimension": (RuntimeError, "Expected input's non-batch dimensions to have positive length",
                                                   lambda d: F.max_pool3d(torch.ones(2, 1, 0, 1, 2, device=d), 1)),
    "max_pool2d with a kernel larger than the input": (RuntimeError, "Output size is too small",
                                                       lambda d: F.max_pool2d(torch.ones(1, 1, 4, device=d), 2)),
    "layer_norm with an empty normalized_shape": (RuntimeError, "Expected normalized_shape to be at least 1-dimensional",
                                                  lambda d: torch.native_layer_norm(torch.ones(2, device=d), [], None, None, 1e-5)),
    "layer_norm with a weight of another shape": (RuntimeError, "Expected weight to be of same shape as normalized_shape",
                                                  lambda d: torch.native_layer_norm(torch.ones(2, 3, device=d), [3], torch.ones(2, device=d), None, 1e-5)),
    "multi_margin_loss with a 2-d target": (RuntimeError, r"Expected target size \[5\].*but got \[5, 4\]",
                                            lambda d: F.multi_margin_loss(torch.ones(5, 4, device=d), torch.zeros(5, 4, dtype=torch.long, device=d))),
    "multi_margin_loss with a float target": (RuntimeError, "expected scalar type Long but found Float",
                                              lambda d: F.multi_margin_loss(torch.ones(5, 4, device=d), torch.zeros(5, device=d))),
    "soft_margin_loss of shapes that do not broadcast": (RuntimeError, r"The size of tensor a \(4\) must match the size of tensor b \(5\)",
                                                         lambda d: F.soft_margin_loss(torch.ones(5, 4, device=d), torch.ones(5, device=d))),
    "sub of shapes that do not broadcast": (RuntimeError, r"The size of tensor a \(5\) must match the size of tensor b \(4\) at non-singleton dimension 1",
                                            lambda d: torch.ones(3, 5, device=d) - torch.ones(3, 4, device=d)),
    "dot of two dtypes": (RuntimeError, "dot : expected both vectors to have same dtype",
                          lambda d: torch.dot(torch.ones(1, device=d), torch.ones(3, dtype=torch.float64, device=d))),
    "narrow_copy from past the end": (IndexError, r"start out of range \(expected to be in range of \[-10, 10\], but got 11\)",
                                      lambda d: torch.narrow_copy(torch.ones(10, device=d), 0, 11, 1)),
    "eye with a negative m": (RuntimeError, "m must be greater or equal to 0, got -3",
                              lambda d: torch.eye(0, -3, device=d)),
    "histogramdd with too few bins": (RuntimeError, "histogramdd: The size of bins must be equal to the innermost dimension",
                                      lambda d: torch.histogramdd(torch.ones(5, 6, device=d), [1, 1, 1, 1, 1])),
    "ormqr with a tau too long": (RuntimeError, r"tau.shape\[-1\] must be equal to min\(other.shape\[-2\], input.shape\[-1\]\)",
                                  lambda d: torch.ormqr(torch.ones(5, 0, device=d), torch.ones(5, device=d), torch.ones(5, 5, device=d))),
    "complex of two dtypes": (RuntimeError, "Expected object of scalar type Float but got scalar type Double for second argument",
                              lambda d: torch.complex(torch.ones(2, device=d), torch.ones(2, dtype=torch.float64, device=d))),
    "in-place igamma_ whose argument broadcasts past self": (RuntimeError, "doesn't match the broadcast shape",
                                                             lambda d: torch.rand(3, 1, device=d).igamma_(torch.rand(3, 4, device=d))),
    "adaptive_max_pool2d with one output size": (RuntimeError, "internal error",
                                                 lambda d: torch.ops.aten.adaptive_max_pool2d(torch.ones(1, 4, 4, device=d), [2])),
    "cat into an integer out=": (TypeError, "torch.cat\\(\\): input types can't be cast to the desired output type Long",
                                 lambda d: torch.cat([torch.ones(2, device=d)] * 2, out=torch.empty(0, dtype=torch.long, device=d))),
    "addr into an integer out=": (RuntimeError, "can't be cast to the desired output type Long",
                                  lambda d: torch.addr(torch.ones(2, 3, device=d), torch.ones(2, device=d), torch.ones(3, device=d),
                                                       out=torch.empty(0, dtype=torch.long, device=d))),
    "linalg.vector_norm into a wider out=": (RuntimeError, "Expected out tensor to have dtype float, but got double",
                                             lambda d: torch.linalg.vector_norm(torch.ones(3, device=d),
                                                                                out=torch.empty(0, dtype=torch.float64, device=d))),
    "where into a wider out=": (RuntimeError, "Expected out type to be Float but got Double",
                                lambda d: torch.where(torch.tensor([True, False], device=d), torch.ones(2, device=d),
                                                      torch.zeros(2, device=d), out=torch.empty(2, dtype=torch.float64, device=d))),
    "nansum with a dtype that is not out's": (RuntimeError, "nansum: provided dtype must match dtype of result",
                                              lambda d: torch.nansum(torch.ones(3, device=d), 0, dtype=torch.float64,
                                                                     out=torch.empty(0, device=d))),
}


def test_tuple_out_on_another_device_is_refused(dev):
    # sort/topk/mode (and msort through sort) write values and indices into out=; on the CPU they are refused.
    x = torch.randn(4, 5, device=dev)
    calls = {
        "sort": lambda v, i: torch.sort(x, out=(v, i)),
        "topk": lambda v, i: torch.topk(x, 2, out=(v, i)),
        "mode": lambda v, i: torch.mode(x, out=(v, i)),
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeError, match=f"{name}: expected out on pjrt:0, got cpu"):
            call(torch.empty(0), torch.empty(0, dtype=torch.long))
    with pytest.raises(RuntimeError, match="expected out on pjrt:0, got cpu"):
        torch.msort(x, out=torch.empty(0))
    # Sorting into the input itself is allowed, as in ATen (test_sort_and_select's test_sort does it).
    y, index = x.clone(), torch.empty(0, dtype=torch.long, device=dev)
    torch.sort(y, out=(y, index))
    assert torch.equal(y.cpu(), torch.sort(x.cpu()).values) and torch.equal(index.cpu(), torch.sort(x.cpu()).indices)


def test_gather_with_an_empty_index_still_checks_the_out_device(dev):
    # Nothing is written, yet ATen still refuses an out= on another device (test_ops' test_out_gather).
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.gather(torch.ones(5, device=dev), 0, torch.empty(0, dtype=torch.uint8, device=dev), out=torch.empty(0))


@pytest.mark.parametrize("case", BAD_INPUT, ids=list(BAD_INPUT))
def test_bad_input_raises_as_pytorch_raises_it(case, dev):
    error, message, call = BAD_INPUT[case]
    try:
        expected = call("cpu")
    except error as e:
        assert re.search(message, str(e)), f"the CPU raised {e!r}"
    else:  # this torch accepts it (2.14 fills arange(0, 64, 0.5) into int64 with zeros): so must pjrt
        got = call(dev)
        if isinstance(expected, torch.Tensor):
            torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0, equal_nan=True)
        return
    with pytest.raises(error, match=message):
        out = call(dev)
        if isinstance(out, torch.Tensor):
            out.cpu()  # a deferred error surfaces here (it must not: these are checked up front)


def test_addmm_takes_complex_scalars(dev):
    a, b, s = (torch.randn(*shape, dtype=torch.complex64) for shape in ((3, 4), (4, 2), (3, 2)))
    for beta in (0.5 + 1j, 0j):
        ref = torch.addmm(s, a, b, beta=beta, alpha=2 - 1j)
        out = torch.addmm(s.to(dev), a.to(dev), b.to(dev), beta=beta, alpha=2 - 1j)
        torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)


def test_out_that_cannot_hold_the_result_is_refused(dev):
    # A float result into an integer out= tensor is an unsafe cast: ATen refuses it, so does pjrt.
    x = torch.randn(3, 4, device=dev)
    calls = {
        "addmm": lambda o: torch.addmm(torch.zeros(3, 3, device=dev), x, torch.randn(4, 3, device=dev), out=o),
        "nan_to_num": lambda o: torch.nan_to_num(x, out=o),
        "clamp": lambda o: torch.clamp(x, 0, 1, out=o),
        "polygamma": lambda o: torch.polygamma(0, x, out=o),
        "nansum": lambda o: torch.nansum(x, out=o),
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
            call(torch.empty(0, dtype=torch.long, device=dev))
        call(torch.empty(0, dtype=torch.float64, device=dev))  # a widening cast is fine
