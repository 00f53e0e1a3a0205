"""Recurrent layers natively: nn.RNN / nn.LSTM / nn.GRU and their cells
(forward and backward through pjrt's fused cell kernels, no CPU fallback)
against CPU, and an LSTM / GRU language model training like CPU."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import assert_close
from models import synthetic_tokens
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from trajectory import assert_trains_like_float64, problem

import torch_pjrt

LAYOUTS = [dict(num_layers=1), dict(num_layers=2, batch_first=True, bidirectional=True), dict(num_layers=1, bias=False)]


def _compare_grads(cpu: nn.Module, dev: nn.Module) -> None:
    for p, q in zip(cpu.parameters(), dev.parameters()):
        assert_close(q.grad, p.grad)


@pytest.mark.parametrize("cls", [nn.RNN, nn.LSTM, nn.GRU])
@pytest.mark.parametrize("layout", LAYOUTS, ids=["1-layer", "2-layer-bi-batch-first", "no-bias"])
def test_recurrent_layer_matches_cpu(dev: torch.device, cls: type, layout: dict) -> None:
    torch.manual_seed(0)
    cpu = cls(4, 8, **layout)
    device_model = copy.deepcopy(cpu).to(dev)
    x = torch.randn(3, 5, 4, requires_grad=True)
    xd = x.detach().to(dev).requires_grad_()
    with torch_pjrt.fallback_mode("error"):
        yd, hd = device_model(xd)
        hd = hd[0] if isinstance(hd, tuple) else hd
        (yd.square().sum() + hd.sum()).backward()
    y, h = cpu(x)
    h = h[0] if isinstance(h, tuple) else h
    (y.square().sum() + h.sum()).backward()
    assert_close(yd, y.detach())
    assert_close(hd, h.detach())
    assert_close(xd.grad, x.grad)
    _compare_grads(cpu, device_model)


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_packed_sequences_and_initial_state(dev: torch.device, cls: type) -> None:
    torch.manual_seed(1)
    cpu = cls(4, 6, num_layers=2, batch_first=True)
    device_model = copy.deepcopy(cpu).to(dev)
    x, lengths = torch.randn(3, 5, 4), torch.tensor([5, 3, 2])
    h0 = torch.randn(2, 3, 6)
    state = (h0, torch.randn(2, 3, 6)) if cls is nn.LSTM else h0
    state_d = tuple(s.to(dev) for s in state) if cls is nn.LSTM else h0.to(dev)
    with torch_pjrt.fallback_mode("error"):
        out_d, _ = device_model(pack_padded_sequence(x.to(dev), lengths, batch_first=True), state_d)
        padded_d, lengths_d = pad_packed_sequence(out_d, batch_first=True)
    padded, _ = pad_packed_sequence(cpu(pack_padded_sequence(x, lengths, batch_first=True), state)[0],
                                    batch_first=True)
    assert_close(padded_d, padded.detach())
    assert lengths_d.tolist() == [5, 3, 2]


@pytest.mark.parametrize("cls", [nn.RNNCell, nn.LSTMCell, nn.GRUCell])
def test_cells_match_cpu(dev: torch.device, cls: type) -> None:
    torch.manual_seed(2)
    cpu = cls(4, 8)
    device_model = copy.deepcopy(cpu).to(dev)
    x = torch.randn(3, 4)
    with torch_pjrt.fallback_mode("error"):
        out_d = device_model(x.to(dev))
        out_d = out_d[0] if isinstance(out_d, tuple) else out_d
        out_d.sum().backward()
    out = cpu(x)
    out = out[0] if isinstance(out, tuple) else out
    out.sum().backward()
    assert_close(out_d, out.detach())
    _compare_grads(cpu, device_model)


def test_dropout_between_layers_runs_natively(dev: torch.device) -> None:
    model = nn.LSTM(4, 8, num_layers=3, dropout=0.5).to(dev).train()
    with torch_pjrt.fallback_mode("error"):
        y, _ = model(torch.randn(5, 2, 4, device=dev))
        y.sum().backward()
    assert all(torch.isfinite(p.grad.cpu()).all() for p in model.parameters())


class RecurrentLM(nn.Module):
    def __init__(self, cls: type, vocab: int = 64, dim: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = cls(dim, dim, num_layers=2, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(idx))[0])


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_recurrent_language_model_trains_like_cpu(cls: type) -> None:
    vocab, seq, steps = 64, 16, 30
    torch.manual_seed(0)
    model = RecurrentLM(cls, vocab)
    batches = [synthetic_tokens(8, seq, vocab, seed=s) for s in range(4)]

    def lm_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))

    make_opt = lambda p: torch.optim.Adam(p, lr=1e-2)  # noqa: E731
    losses, _ = assert_trains_like_float64(problem(model, batches, lm_loss, make_opt, steps))
    assert losses[-1] < 0.5 * losses[0], losses
