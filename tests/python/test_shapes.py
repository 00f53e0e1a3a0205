"""torch_pjrt.shapes: bucketing helpers that bound the programs a varying shape compiles."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close

import torch_pjrt
from torch_pjrt.shapes import bucket_collate, bucket_for, pad_sequences, pad_to_bucket, precompile


def test_bucket_for_and_its_error():
    assert [bucket_for(n, [8, 16, 32]) for n in (1, 8, 9, 32)] == [8, 8, 16, 32]
    with pytest.raises(ValueError, match="size 33 is larger than the largest bucket 32"):
        bucket_for(33, [8, 16, 32])


def test_pad_to_bucket_pads_and_masks(dev):
    x = torch.arange(10).reshape(2, 5).to(dev)
    padded, mask = pad_to_bucket(x, dim=1, buckets=[4, 8])
    assert padded.shape == (2, 8) and mask.shape == (2, 8)
    assert padded.cpu()[:, :5].tolist() == x.cpu().tolist() and padded.cpu()[:, 5:].eq(0).all()
    assert mask.cpu().tolist() == [[1] * 5 + [0] * 3] * 2


def test_pad_sequences_pads_the_batch_too():
    seqs = [torch.ones(3, 2), torch.ones(5, 2) * 2]
    out, mask = pad_sequences(seqs, buckets=[4, 8], batch_buckets=[4])
    assert out.shape == (4, 8, 2) and mask.shape == (4, 8)
    assert mask.sum(1).tolist() == [3, 5, 0, 0]
    assert out[1, :5].eq(2).all() and out[1, 5:].eq(0).all() and out[2:].eq(0).all()
    with pytest.raises(ValueError, match="trailing shape"):
        pad_sequences([torch.ones(3, 2), torch.ones(3, 4)], buckets=[4])


def test_bucket_collate_for_tensors_tuples_and_dicts():
    collate = bucket_collate([4, 8], pad_value=-1, pad_values={"labels": -100})
    batch, mask = collate([torch.arange(3), torch.arange(6)])
    assert batch.shape == (2, 8) and batch[0, 3:].eq(-1).all() and mask.sum().item() == 9
    ids, labels, mask = collate([(torch.arange(2), torch.arange(2)), (torch.arange(3), torch.arange(3))])
    assert ids.shape == labels.shape == mask.shape == (2, 4)
    out = collate([{"input_ids": torch.arange(2), "labels": torch.arange(2)}])
    assert out["labels"][0, 2:].eq(-100).all() and out["attention_mask"].tolist() == [[1, 1, 0, 0]]
    loader = torch.utils.data.DataLoader([torch.arange(n) for n in (1, 2, 3, 5, 7)], batch_size=2,
                                         collate_fn=bucket_collate([4, 8], batch_buckets=[2]))
    assert {tuple(b.shape) for b, _ in loader} == {(2, 4), (2, 8)}  # the short last batch padded too


def test_padding_to_buckets_bounds_programs_and_precompile_fills_the_cache(dev):
    torch._dynamo.reset()
    torch_pjrt.reset_metrics()
    emb = torch.nn.Embedding(16, 8).to(dev)

    @torch.compile(backend="pjrt", dynamic=False)
    def masked_mean(ids, mask):
        h = emb(ids) * mask.unsqueeze(-1)
        return h.sum(1) / mask.sum(1, keepdim=True)

    buckets = [4, 8]
    report = precompile(masked_mean, [pad_to_bucket(torch.zeros(2, b, dtype=torch.long, device=dev), 1, buckets)
                                      for b in buckets])
    assert report["calls"] == 2
    programs = torch_pjrt.metrics()["compiled"]
    before = sum(s["programs"] for s in programs.values())
    for length in (1, 3, 4, 5, 7, 8):
        ids = torch.randint(0, 16, (2, length))
        got = masked_mean(*pad_to_bucket(ids.to(dev), 1, buckets))
        ref = torch.nn.functional.embedding(ids, emb.weight.detach().cpu()).mean(1)
        assert_close(got.detach(), ref, rtol=1e-5, atol=1e-6)
    after = sum(s["programs"] for s in torch_pjrt.metrics()["compiled"].values())
    assert after == before  # six lengths, no new program: precompile covered both buckets
    torch._dynamo.reset()
