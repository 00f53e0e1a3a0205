"""Bounded dynamic shapes: a dim marked ``torch._dynamo.mark_dynamic(x, d, min=, max=)``
compiles one padded, masked program for the whole range (torch_pjrt/_bounded.py).

Each result is judged against a float64 CPU reference, with a bound measured from the
per-size pjrt program's own distance to it (what the bounded program must match), and
the programs are counted."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
import trajectory
from conftest import compiled_stats
from torch.fx.experimental import _config as fx_config

import torch_pjrt
from torch_pjrt.qualify import differential

DEV = torch_pjrt.DEVICE_NAME
EPS = torch.finfo(torch.float32).eps


@pytest.fixture(autouse=True)
def _sizes_from_one(fresh_dynamo):
    # Dynamo specializes sizes 0 and 1 unless told not to; with it, a range can start at 1.
    with fx_config.patch(backed_size_oblivious=True):
        yield




def bounded(x: torch.Tensor, dim: int, high: int, low: int = 1) -> torch.Tensor:
    torch._dynamo.mark_dynamic(x, dim, min=low, max=high)
    return x


def assert_close_as_per_size(bounded_out, per_size_out, exact_out, what: str) -> None:
    """The bounded program is as close to float64 as the per-size program is (up to the
    harness's factor for a different summation order), or within a few ulps."""
    for b, p, e in zip(bounded_out, per_size_out, exact_out):
        b, p, e = b.cpu().double(), p.cpu().double(), e.double()
        assert b.shape == e.shape, (what, b.shape, e.shape)
        if not e.is_floating_point():
            assert torch.equal(b, e), what
            continue
        floor = differential.ULPS * EPS * max(e.abs().max().item(), 1e-30)
        bound = max(differential.FACTOR * (p - e).abs().max().item(), floor)
        err = (b - e).abs().max().item()
        assert err <= bound, f"{what}: |bounded - float64| = {err:.3g} > {bound:.3g}"


def reductions(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Work across the varying dim 1 of x ([4, n, 8]): sums, means, maxima, a softmax,
    a contraction, the last element, and the size used as a value."""
    scores = torch.softmax(x @ w, dim=1)  # [4, n, 8], normalized over n
    # bmm, not @: matmul's decomposition guards on a contraction of size 1 (Dynamo's, with any backend)
    pooled = torch.bmm(scores.transpose(1, 2), x)  # [4, 8, 8], contracted over n
    return (pooled, x.sum(1), x.mean(1), x.amax(1), x.logsumexp(1), x[:, -1] * x.shape[1],
            torch.cumsum(x, 1)[:, -1], scores * 2, x.argmax(1))


def test_one_program_serves_every_size_in_the_bound():
    w = torch.randn(8, 8)
    wd = w.to(DEV)
    per_size = torch.compile(lambda x, w: reductions(x, w), backend="pjrt", dynamic=False)  # a frame of its own
    one = torch.compile(reductions, backend="pjrt")
    sizes = [17, 1, 2, 3, 64, 255, 511, 512]  # the first traced size is a general one
    for n in sizes:
        x = torch.randn(4, n, 8)
        exact = reductions(x.double(), w.double())
        reference = per_size(x.to(DEV), wd)
        out = one(bounded(x.to(DEV), 1, 512), wd)
        assert_close_as_per_size(out, reference, exact, f"n={n}")
    one_stats = next(v for k, v in torch_pjrt.metrics()["compiled"].items() if k.startswith("reductions"))
    [note] = one_stats["bounded"]["graphs"]
    assert note.startswith("inference: one program for ") and note.endswith(" in [1, 512]"), note
    assert one_stats["programs"] == 1 and one_stats["dynamo_graphs"] == 1, one_stats
    assert not one_stats["eager_graphs"], one_stats
    real, padded = one_stats["bounded"]["real_elements"], one_stats["bounded"]["padded_elements"]
    # the padding's cost, over the inputs with a bounded size (x; w is the same at every size)
    assert real == sum(4 * n * 8 for n in sizes) and padded == len(sizes) * 4 * 512 * 8, one_stats


def test_a_size_outside_the_bound_is_a_clear_error_or_a_new_graph():
    f = torch.compile(lambda x: x.sum(0), backend="pjrt")
    f(bounded(torch.randn(5, 3, device=DEV), 0, 16))
    # Dynamo's guard on the range sends a larger size to a graph of its own: still right.
    x = torch.randn(40, 3)
    assert torch.allclose(f(x.to(DEV)).cpu(), x.sum(0), atol=1e-5)


def test_a_graph_without_a_padding_rule_gets_a_program_per_size_and_says_why():
    f = torch.compile(lambda x: torch.sort(x, dim=0).values, backend="pjrt")
    for n in (3, 7):
        x = torch.randn(n, 2)
        assert torch.equal(f(bounded(x.to(DEV), 0, 32)).cpu(), torch.sort(x, dim=0).values)
    s = compiled_stats()
    assert s["programs"] == 2, s
    [note] = s["bounded"]["graphs"]
    assert note.startswith("inference: a program per size (aten.sort.default: along a padded dimension at "
                           "test_bounded_shapes.py:"), note


def sequence_ops(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """x: [2, 4, n] (channels, then the varying length). A convolution along n (its zero
    padding meets ours), statistics over n, a sort across channels of every position, a
    concatenation and a constant pad along n, gathers by positions, the last element."""
    conv = F.conv1d(torch.cos(x), w, padding=1)  # [2, 3, n]; cos: not 0 over the padding
    var, mean = torch.var_mean(conv, dim=2)
    top = torch.topk(x, 2, dim=1).values  # across channels: each position alone
    joined = torch.cat([x, conv.sum(1, keepdim=True), x[:, :1]], dim=1)  # [2, 8, n]
    doubled = torch.cat([x, 2 * x], dim=2)  # [2, 4, 2n]
    padded = F.pad(x, (1, 2), value=-3.0)  # [2, 4, n + 3]
    positions = torch.arange(x.shape[2], device=x.device)
    picked = x[:, :, positions.flip(0)]  # reversed along n
    return (conv, var, mean, x.std(2), top, joined.sum(2), doubled, padded.cumsum(2), picked[:, :, -1],
            doubled[..., -1])


def test_convolution_statistics_and_concatenation_along_the_range():
    w = torch.randn(3, 4, 3)
    per_size = torch.compile(lambda x, w: sequence_ops(x, w), backend="pjrt", dynamic=False)
    one = torch.compile(sequence_ops, backend="pjrt")
    for n in (9, 2, 30, 64):
        x = torch.randn(2, 4, n)
        exact = sequence_ops(x.double(), w.double())
        assert_close_as_per_size(one(bounded(x.to(DEV), 2, 64, low=2), w.to(DEV)), per_size(x.to(DEV), w.to(DEV)),
                                 exact, f"n={n}")
    s = next(v for k, v in torch_pjrt.metrics()["compiled"].items() if k.startswith("sequence_ops"))
    assert s["programs"] == 1 and [g.split(" for ")[0] for g in s["bounded"]["graphs"]] == \
        ["inference: one program"], s


def test_convolution_gradients_along_the_range():
    def loss(x, w):
        return (F.conv1d(x, w, padding=2, dilation=2).tanh() * torch.arange(x.shape[2], device=x.device) * 0.1).sum()

    one = torch.compile(loss, backend="pjrt")
    w = torch.randn(3, 4, 3, dtype=torch.float64)
    for n in (5, 40, 17):
        x = torch.randn(2, 4, n, dtype=torch.float64)
        xd = bounded(x.float().to(DEV), 2, 48, low=2).requires_grad_()
        wd = w.float().to(DEV).requires_grad_()
        one(xd, wd).backward()
        x64, w64 = x.clone().requires_grad_(), w.clone().requires_grad_()
        loss(x64, w64).backward()
        x32, w32 = x.float().requires_grad_(), w.float().requires_grad_()
        loss(x32, w32).backward()
        for got, exact, cpu in ((xd.grad, x64.grad, x32.grad), (wd.grad, w64.grad, w32.grad)):
            assert_close_as_per_size([got], [cpu], [exact], f"n={n}")
    s = compiled_stats()
    assert s["programs"] == 2 and all(" one program for " in g for g in s["bounded"]["graphs"]), s


def test_mark_bounded_marks_the_range_and_refuses_a_size_outside_it():
    f = torch.compile(lambda x: (x * x).sum(1), backend="pjrt")
    for n in (3, 9, 1, 20):
        x = torch.randn(2, n)
        out = f(torch_pjrt.shapes.mark_bounded(x.to(DEV), 1, 32, low=1))
        assert torch.allclose(out.cpu(), (x * x).sum(1), rtol=1e-6, atol=1e-6)
    s = compiled_stats()
    assert s["programs"] == 1 and s["dynamo_graphs"] == 1, s
    with pytest.raises(ValueError, match=r"mark_bounded: size 40 of dim 1 is outside \[1, 32\]"):
        torch_pjrt.shapes.mark_bounded(torch.zeros(2, 40), 1, 32, low=1)


class TinyLM(torch.nn.Module):
    """A one-block causal language model: every op a sequence-length-dependent graph has
    (embeddings of tokens and positions, attention masked causally and softmaxed over the
    keys, layer norms, an MLP, cross-entropy over the tokens)."""

    def __init__(self, vocab: int = 32, width: int = 16, length: int = 64) -> None:
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, width)
        self.positions = torch.nn.Embedding(length, width)
        self.norm1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.norm2 = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.GELU(),
                                       torch.nn.Linear(2 * width, width))
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        h = self.tokens(ids) + self.positions(torch.arange(t, device=ids.device))
        q, k, v = self.qkv(self.norm1(h)).chunk(3, dim=-1)
        scores = (q @ k.transpose(1, 2)) / math.sqrt(q.shape[-1])
        causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).triu(1)
        attn = scores.masked_fill(causal, float("-inf")).softmax(-1) @ v
        h = h + self.proj(attn)
        h = h + self.mlp(self.norm2(h))
        return self.head(h)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def test_training_with_a_varying_sequence_length_is_one_forward_and_one_backward_program():
    torch.manual_seed(0)
    model = TinyLM()
    lengths = [7, 33, 64, 2, 50, 3, 19, 64]  # from 2: `attn @ v` guards on a contraction of size 1
    batches = []
    for t in lengths:
        ids = torch.randint(0, 32, (3, t))
        batches.append((ids, torch.roll(ids, -1, dims=1)))
    prob = trajectory.problem(model, batches, lm_loss, lambda p: torch.optim.SGD(p, lr=0.5), steps=len(lengths))

    def mark(batch: differential.Batch) -> None:
        for t in batch:
            torch._dynamo.mark_dynamic(t, 1, min=2, max=64)

    trajectory.assert_trains_like_float64(prob, compiled=True, mark=mark)
    s = compiled_stats()
    assert s["dynamo_graphs"] == 1 and s["programs"] == 2, s  # one forward, one backward, every length
    assert [g.split(":")[0] for g in s["bounded"]["graphs"]] == ["forward", "backward"], s
    assert all("one program for" in g for g in s["bounded"]["graphs"]), s
    assert not s["eager_graphs"], s


def tiny_llama() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                      max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config)
    model.config._attn_implementation = "sdpa"
    return model


# GPT-2 (its loss a frame of its own: a pad, a cat, advanced indexing) and the zoo's other
# text architectures: scripts/bounded_sweep.py.
def test_transformers_llama_training_with_a_varying_sequence_length_is_one_program_per_graph():
    """Unmodified transformers Llama (SDPA attention, rotary positions, its own shifted
    causal-LM loss) trained with sequences of 2 to 64 tokens: every step against float64,
    one program forward and one backward."""
    model = tiny_llama()
    lengths = [9, 17, 40, 5, 64, 2]
    batches = [(torch.randint(0, 64, (2, t)),) for t in lengths]
    prob = differential.Problem(lambda: copy.deepcopy(model), batches,
                                lambda m, b: m(input_ids=b[0], labels=b[0], use_cache=False).loss,
                                lambda p: torch.optim.SGD(p, lr=0.5), steps=len(lengths))
    trajectory.assert_trains_like_float64(prob, compiled=True,
                                          mark=lambda b: torch._dynamo.mark_dynamic(b[0], 1, min=2, max=64))
    compiled = torch_pjrt.metrics()["compiled"]
    for name, s in compiled.items():
        assert s["dynamo_graphs"] == 1 and s["programs"] == 2, (name, s)
        assert [g.split(":")[0] for g in s["bounded"]["graphs"]] == ["forward", "backward"], (name, s)
        assert all(" one program for " in g for g in s["bounded"]["graphs"]), (name, s)
        assert not s["eager_graphs"], (name, s)


def test_dropout_draws_over_the_padded_shape_and_says_so():
    f = torch.compile(lambda x: F.dropout(x.exp(), 0.5, training=True), backend="pjrt")
    for n in (7, 30):
        x = torch.randn(3, n)
        out = f(bounded(x.to(DEV), 1, 64, low=2)).cpu()
        kept = out != 0  # each element dropped, or kept and scaled by 1 / (1 - p)
        assert out.shape == x.shape and 0 < kept.sum() < out.numel()
        assert torch.allclose(out[kept], 2 * x.exp()[kept], rtol=1e-6)
    [note] = compiled_stats()["bounded"]["graphs"]
    assert note.startswith("inference: one program for ") and "native_dropout draw over the padded shape" in note, \
        note


# Each a use of a varying size that padding could get wrong (a start, an index or a
# position taken at the bound, a position across padding inside a dim, an index from the
# end, half-precision sums): its result must be right, bounded or refused.
TRICKY = {
    "a varying start on a static dim": lambda x, table: table[x.shape[1]:].sum(0),
    "a varying index": lambda x, table: table[x.shape[1] - 1],
    "a position over every dim": lambda x, table: x.argmax(),
    "a position in a dim with padding inside": lambda x, table: x.reshape(-1).argmax(0),
    "an element of a flattened dim": lambda x, table: x.reshape(-1)[5] + x.reshape(-1)[-2],
    "indices from the end": lambda x, table: x[:, torch.tensor([-1, 0, -3], device=x.device)],
    "a varying arange start": lambda x, table: torch.arange(x.shape[1], 2 * x.shape[1], device=x.device) * x[0],
    "a half mean and variance": lambda x, table: torch.var_mean((x + 3000).half(), dim=1),  # a half sum overflows
    "a max with its positions": lambda x, table: x.view(2, -1).max(1),
}


@pytest.mark.parametrize("case", list(TRICKY))
def test_uses_of_a_varying_size_stay_right(case):
    fn = TRICKY[case]
    table = torch.randn(48, 3)
    per_size = torch.compile(lambda x, t: fn(x, t), backend="pjrt", dynamic=False)
    one = torch.compile(fn, backend="pjrt")
    for n in (40, 3, 17):
        x = torch.randn(4, n)
        exact = fn(x.double(), table.double())
        exact = [exact] if isinstance(exact, torch.Tensor) else list(exact)
        reference = per_size(x.to(DEV), table.to(DEV))
        got = one(bounded(x.to(DEV), 1, 48, low=3), table.to(DEV))
        listed = (lambda v: [v] if isinstance(v, torch.Tensor) else list(v))
        exact = [e.to(g.dtype) if not g.is_floating_point() else e for e, g in zip(exact, listed(got))]
        assert_close_as_per_size(listed(got), listed(reference), exact, f"{case}, n={n}")


def test_gradients_through_padding_inside_dims_and_non_finite_padding():
    """An embedding's gradient through flattened indices (its rows' padding interleaved),
    and a layer norm whose padding rows are -inf (their statistics NaN): the weight
    gradients sum real rows only."""
    emb = torch.nn.Embedding(16, 4)
    norm = torch.nn.LayerNorm(4)

    def loss(ids, x, emb_w, norm_w, norm_b):
        e = F.embedding(ids.reshape(-1), emb_w).pow(2).sum()
        return e + F.layer_norm(torch.log(x), (4,), norm_w, norm_b).pow(2).sum()

    one = torch.compile(loss, backend="pjrt")
    for n in (9, 30, 4):
        ids = torch.randint(0, 16, (2, n))
        x = torch.rand(2, n, 4) + 0.5
        params = [emb.weight.detach(), norm.weight.detach() + 0.1, norm.bias.detach() + 0.2]
        exact = [p.double().requires_grad_() for p in params]
        loss(ids, x.double(), *exact).backward()
        cpu = [p.clone().requires_grad_() for p in params]
        loss(ids, x, *cpu).backward()
        dev = [p.to(DEV).requires_grad_() for p in params]
        one(bounded(ids.to(DEV), 1, 32, low=2), bounded(x.to(DEV), 1, 32, low=2), *dev).backward()
        assert_close_as_per_size([p.grad for p in dev], [p.grad for p in cpu], [p.grad for p in exact], f"n={n}")
    s = compiled_stats()
    assert s["programs"] == 2 and all(" one program for " in g for g in s["bounded"]["graphs"]), s
