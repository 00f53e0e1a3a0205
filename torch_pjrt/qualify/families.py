"""The model families differential training runs: small configs at widths where
XLA CPU's kernels switch (hidden >= 96, vocabulary >= 384), seeded, built on the CPU.

Each family gives a model factory, fixed batches and a loss; each optimizer
setting a factory. Hugging Face families need transformers (skipped, and said
so, without it).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .differential import Batch, LossFn, MakeOptimizer, Problem

VOCAB, WIDTH, SEQ, BATCH = 384, 96, 48, 4


@dataclass(frozen=True)
class Family:
    name: str
    build: Callable[[], tuple[Callable[[], nn.Module], list[Batch], LossFn]]
    lr: dict[str, float]  # per optimizer kind
    needs: str | None = None  # a module that must be importable


def _seeded(seed: int, make: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(seed)
        return make()
    return build


def _tokens(n: int, seed: int) -> list[Batch]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),) for _ in range(n)]


class EmbeddingHead(nn.Module):
    """The smallest model that showed stale XNNPACK weights: embedding, then a linear LM head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids))


def _lm_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    (ids,) = batch
    logits = model(ids[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def embedding_head() -> tuple[Callable[[], nn.Module], list[Batch], LossFn]:
    return _seeded(0, EmbeddingHead), _tokens(2, 1), _lm_loss


def mlp() -> tuple[Callable[[], nn.Module], list[Batch], LossFn]:
    def make() -> nn.Module:
        return nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, 2 * WIDTH), nn.SiLU(),
                             nn.Linear(2 * WIDTH, 10))
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randn(64, WIDTH, generator=g), torch.randint(0, 10, (64,), generator=g)) for _ in range(2)]
    return _seeded(0, make), batches, lambda m, b: F.cross_entropy(m(b[0]), b[1])


class ConvNet(nn.Module):
    """Convolutions with BatchNorm (running statistics are compared too), pooling, a linear head.

    Smooth on purpose, like every family here: at a kink (ReLU at 0, a max-pool near-tie) two
    correct float32 runs can take different branches by chance and part by ~1e-3 at that step,
    which no bound measured from a few float32 runs can tell from a bug (seen: xla-cpu-pjrt in
    fused mode, one gradient jumping 1000x at step 8 and back at step 9)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.SiLU(), nn.AvgPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.SiLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def cnn() -> tuple[Callable[[], nn.Module], list[Batch], LossFn]:
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(16, 3, 16, 16, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(2)]
    return _seeded(0, ConvNet), batches, lambda m, b: F.cross_entropy(m(b[0]), b[1])


class LSTMClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(WIDTH, WIDTH, num_layers=2, batch_first=True)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def lstm() -> tuple[Callable[[], nn.Module], list[Batch], LossFn]:
    g = torch.Generator().manual_seed(4)
    batches = [(torch.randn(8, 12, WIDTH, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(2)]
    return _seeded(0, LSTMClassifier), batches, lambda m, b: F.cross_entropy(m(b[0]), b[1])


def _hf_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    (ids,) = batch
    return model(input_ids=ids, labels=ids).loss


def _transformers():  # noqa: ANN202  (the module, imported lazily: it is optional)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import transformers
    return transformers


def gpt2() -> tuple[Callable[[], nn.Module], list[Batch], LossFn]:
    def make() -> nn.Module:
        t = _transformers()
        cfg = t.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=WIDTH, n_layer=2, n_head=4, resid_pdrop=0.0,
                           embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1,
                           attn_implementation="sdpa")
        return t.GPT2LMHeadModel(cfg)
    return _seeded(0, make), _tokens(2, 5), _hf_loss


def llama() -> tuple[Callable[[], nn.Module], list[Batch], LossFn]:
    def make() -> nn.Module:
        t = _transformers()
        cfg = t.LlamaConfig(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=2 * WIDTH, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                            attn_implementation="sdpa")
        return t.LlamaForCausalLM(cfg)
    return _seeded(0, make), _tokens(2, 6), _hf_loss


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("embedding-head", embedding_head, {"sgd": 0.5, "adamw": 1e-2, "adamw-fused": 1e-2}),
    Family("mlp", mlp, {"sgd": 0.05, "adamw": 1e-3, "adamw-fused": 1e-3}),
    Family("cnn-batchnorm", cnn, {"sgd": 0.05, "adamw": 1e-3, "adamw-fused": 1e-3}),
    Family("lstm", lstm, {"sgd": 0.1, "adamw": 1e-3, "adamw-fused": 1e-3}),
    Family("hf-gpt2", gpt2, {"sgd": 0.1, "adamw": 1e-3, "adamw-fused": 1e-3}, needs="transformers"),
    Family("hf-llama", llama, {"sgd": 0.1, "adamw": 1e-3, "adamw-fused": 1e-3}, needs="transformers"),
)}

# sgd: plain SGD the first family's way, with momentum elsewhere (the default foreach path on the
# device, the for-loop on the CPU); adamw: the single-tensor for-loop; adamw-fused: the fused kernel.
OPTIMIZERS = ("sgd", "adamw", "adamw-fused")


def make_optimizer(kind: str, lr: float, momentum: float) -> MakeOptimizer:
    if kind == "sgd":
        return lambda params: torch.optim.SGD(params, lr=lr, momentum=momentum)
    if kind == "adamw":
        return lambda params: torch.optim.AdamW(params, lr=lr, foreach=False)
    if kind == "adamw-fused":
        return lambda params: torch.optim.AdamW(params, lr=lr, fused=True)
    raise ValueError(f"unknown optimizer {kind!r}; choose from {', '.join(OPTIMIZERS)}")


def missing_requirement(family: Family) -> str | None:
    """Why the family cannot run here, or None."""
    if family.needs and importlib.util.find_spec(family.needs) is None:
        return f"needs {family.needs}, not installed"
    return None


def problem(family: str, optimizer: str, steps: int = 10) -> Problem:
    fam = FAMILIES[family]
    make_model, batches, loss = fam.build()
    momentum = 0.0 if family == "embedding-head" else 0.9
    return Problem(make_model, batches, loss, make_optimizer(optimizer, fam.lr[optimizer], momentum), steps)
