"""Small models used by the example, the benchmark and the tests."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class MLP(nn.Module):
    def __init__(self, d_in: int = 32, hidden: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.SiLU(),
                                 nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Block(nn.Module):
    """Pre-norm decoder block. attention="sdpa": fused qkv projection and
    F.scaled_dot_product_attention(is_causal=True); "mha": nn.MultiheadAttention
    with a boolean causal mask."""

    def __init__(self, dim: int, heads: int, dropout: float, attention: str = "sdpa") -> None:
        super().__init__()
        if attention not in ("sdpa", "mha"):
            raise ValueError(f"attention must be 'sdpa' or 'mha', not {attention!r}")
        self.heads = heads
        self.attention = attention
        self.ln1 = nn.LayerNorm(dim)
        if attention == "sdpa":
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
        else:
            self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.attention == "mha":
            t = x.shape[1]
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)  # True: not allowed
            h = self.ln1(x)
            x = x + self.drop(self.attn(h, h, h, attn_mask=mask, need_weights=False)[0])
            return x + self.drop(self.mlp(self.ln2(x)))
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.mlp(self.ln2(x)))


class TinyTransformer(nn.Module):
    """A GPT-style decoder: token + position embeddings, causal blocks, LM head.

    tied=True shares the LM head's weight with the token embedding (GPT-2 style).
    """

    def __init__(self, vocab: int = 256, dim: int = 64, heads: int = 4, layers: int = 2, seq: int = 32,
                 dropout: float = 0.0, attention: str = "sdpa", tied: bool = False) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout, attention) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        if tied:
            self.head.weight = self.tok.weight
            nn.init.normal_(self.tok.weight, std=0.02)  # GPT-2's scale; N(0, 1) logits would start near 40 nats

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


class SmallCNN(nn.Module):
    """A CIFAR-style convnet: conv-BN-ReLU stages with max and average pooling, global pooling, linear head.

    smooth=True uses SiLU and average pooling only: no kink (ReLU at 0, a max-pool near-tie)
    where two float32 runs can part by chance, so training can be judged step by step."""

    def __init__(self, in_ch: int = 3, classes: int = 10, width: int = 16, smooth: bool = False) -> None:
        super().__init__()

        def stage(cin: int, cout: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                    nn.SiLU() if smooth else nn.ReLU()]

        self.features = nn.Sequential(
            *stage(in_ch, width), nn.AvgPool2d(2) if smooth else nn.MaxPool2d(2),  # 16x16 -> 8x8
            *stage(width, 2 * width), nn.AvgPool2d(2),      # 8x8 -> 4x4
            *stage(2 * width, 4 * width), nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(4 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


def synthetic_images(batch: int, classes: int = 10, size: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """CIFAR-like 3 x size x size images: a fixed random template per class plus noise, and the labels."""
    templates = torch.randn(classes, 3, size, size, generator=torch.Generator().manual_seed(1234))
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (batch,), generator=g)
    images = templates[labels] + 0.5 * torch.randn(batch, 3, size, size, generator=g)
    return images, labels


def synthetic_tokens(batch: int, seq: int, vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable synthetic language: each token predicts a fixed function of the previous one."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (batch, 1), generator=g)
    steps = torch.arange(seq + 1).unsqueeze(0)
    seqs = (start * 7 + steps * 13) % vocab
    return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()
