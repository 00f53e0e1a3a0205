"""TorchRec on pjrt (torch_pjrt/integrations/torchrec.py): its jagged-tensor operators against
fbgemm's CPU kernels, and a DLRM-style model's training against the CPU, with no CPU
fallback."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
import torchrec  # noqa: F401  (registers the pjrt kernels of fbgemm's operators)
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, JaggedTensor, KeyedJaggedTensor, KeyedTensor
from torchrec.models.dlrm import DLRM

FEATURES = ["f0", "f1", "f2"]


def _kjt(device: torch.device | str, seed: int, batch: int = 5, weighted: bool = False) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(FEATURES) * batch,), generator=g)
    lengths[1] = 0  # an empty bag, and a feature with none at all
    lengths[batch:2 * batch] = 0
    values = torch.randint(0, 50, (int(lengths.sum()),), generator=g)
    weights = torch.rand(values.shape, generator=g) if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(keys=FEATURES, values=values.to(device), lengths=lengths.to(device),
                                               weights=None if weights is None else weights.to(device))


def _same(got: torch.Tensor | None, want: torch.Tensor | None, what: str) -> None:
    assert (got is None) == (want is None), what
    if want is not None:
        assert torch.equal(got.cpu(), want), f"{what}: {got.cpu()} != {want}"


def test_keyed_jagged_tensor_methods_equal_cpu_with_no_fallback(dev: torch.device) -> None:
    assert "torchrec.fbgemm_kernels" in torch_pjrt.integrations.applied()
    torch_pjrt.reset_metrics()
    with torch_pjrt.fallback_mode("error"):
        for seed in range(3):
            for weighted in (False, True):
                cpu, ours = _kjt("cpu", seed, weighted=weighted), _kjt(dev, seed, weighted=weighted)
                for order in ([2, 0, 1], [1, 2, 0], [0, 1, 2]):
                    a, b = ours.permute(order), cpu.permute(order)
                    _same(a.values(), b.values(), f"permute {order} values")
                    _same(a.lengths(), b.lengths(), f"permute {order} lengths")
                    _same(a.weights_or_none(), b.weights_or_none(), f"permute {order} weights")
                _same(ours.offsets(), cpu.offsets(), "offsets")
                for key in FEATURES:
                    _same(ours[key].to_padded_dense(desired_length=3), cpu[key].to_padded_dense(desired_length=3),
                          f"{key} to_padded_dense")
                    for got, want in zip(ours[key].to_dense(), cpu[key].to_dense()):
                        _same(got, want, f"{key} to_dense")
        pooled = torch.randn(4, 2 + 3 + 5)
        regrouped = [KeyedTensor.regroup([KeyedTensor(keys=["x", "y", "z"], length_per_key=[2, 3, 5],
                                                      values=pooled.to(device))], [["z", "x"], ["y"]])
                     for device in ("cpu", dev)]
        for got, want in zip(regrouped[1], regrouped[0]):
            _same(got, want, "KeyedTensor.regroup")
    assert torch_pjrt.metrics()["fallbacks"] == {}


def test_fbgemm_operators_equal_cpu_on_random_layouts(dev: torch.device) -> None:
    fbgemm = torch.ops.fbgemm
    g = torch.Generator().manual_seed(0)
    with torch_pjrt.fallback_mode("error"):
        for dtype in (torch.int32, torch.int64):
            lengths = torch.randint(0, 5, (4, 6), generator=g).to(dtype)
            _same(fbgemm.asynchronous_complete_cumsum(lengths.to(dev)), fbgemm.asynchronous_complete_cumsum(lengths),
                  f"complete_cumsum 2-D {dtype}")
            flat = lengths.reshape(-1)
            _same(fbgemm.asynchronous_complete_cumsum(flat.to(dev)), fbgemm.asynchronous_complete_cumsum(flat),
                  f"complete_cumsum {dtype}")
            values = torch.randn(int(lengths.sum()), generator=g)
            weights = torch.rand(values.shape, generator=g)
            # a permutation, repeats and omissions; the total given, and read from the device
            for permute in ([3, 1, 0, 2], [2, 2, 0], [1]):
                p = torch.tensor(permute, dtype=torch.int32)  # fbgemm takes int32 permutations only
                for total in (None, int(lengths[permute].sum())):
                    want = fbgemm.permute_2D_sparse_data(p, lengths, values, weights, total)
                    got = fbgemm.permute_2D_sparse_data(p.to(dev), lengths.to(dev), values.to(dev), weights.to(dev),
                                                        total)
                    for name, a, b in zip(("lengths", "values", "weights"), got, want):
                        _same(a, b, f"permute_2D_sparse_data {permute} {dtype} {name}, total {total}")
            stride = lengths.shape[1]
            p = torch.tensor([3, 0, 2, 1], dtype=torch.int32)
            want = fbgemm.permute_2D_sparse_data_input1D(p, flat, values, stride, weights)
            got = fbgemm.permute_2D_sparse_data_input1D(p.to(dev), flat.to(dev), values.to(dev), stride, weights.to(dev))
            for name, a, b in zip(("lengths", "values", "weights"), got, want):
                _same(a, b, f"permute_2D_sparse_data_input1D {dtype} {name}")
            _same(fbgemm.invert_permute(p.to(dev)), fbgemm.invert_permute(p), "invert_permute")
        # no batch at all: nothing to move
        empty = torch.zeros(3, 0, dtype=torch.int64)
        p = torch.tensor([2, 0], dtype=torch.int32)
        for a, b in zip(fbgemm.permute_2D_sparse_data(p.to(dev), empty.to(dev), torch.zeros(0).to(dev), None, 0),
                        fbgemm.permute_2D_sparse_data(p, empty, torch.zeros(0), None, 0)):
            _same(a, b, "permute_2D_sparse_data of an empty batch")
        wide = torch.tensor([1, 0])
        for device in ("cpu", dev):
            with pytest.raises(RuntimeError, match="Int|int32"):
                fbgemm.permute_2D_sparse_data(wide.to(device), lengths[:2].to(device), values.to(device))
        # padding and its gradient: rows cut short, padded, and empty
        values = torch.randn(8, 2, generator=g)
        grad_output = torch.randn(4, 5, 2, generator=g)
        for offsets_dtype in (torch.int64, torch.int32):
            offsets = torch.tensor([0, 3, 3, 7, 8], dtype=offsets_dtype)
            results = []
            for device in ("cpu", dev):
                v = values.detach().clone().to(device).requires_grad_()
                dense = fbgemm.jagged_to_padded_dense(v, [offsets.to(device)], [5], -1.5)
                dense.backward(grad_output.to(device))
                results.append((dense.detach().cpu(), v.grad.cpu()))
            _same(results[1][0], results[0][0], f"jagged_to_padded_dense, {offsets_dtype} offsets")
            _same(results[1][1], results[0][1], f"jagged_to_padded_dense gradient, {offsets_dtype} offsets")
        # the pooled embeddings' permutation and its gradient (the inverse permutation)
        dims = torch.tensor([0, 2, 5, 10])
        permute, inverse = torch.tensor([2, 0, 1]), torch.tensor([1, 2, 0])
        inverse_dims = torch.tensor([0, 5, 7, 10])
        pooled = torch.randn(3, 10, generator=g)
        grad = torch.randn(3, 10, generator=g)
        results = []
        for device in ("cpu", dev):
            x = pooled.detach().clone().to(device).requires_grad_()
            out = fbgemm.permute_pooled_embs_auto_grad(x, dims.to(device), permute.to(device),
                                                       inverse_dims.to(device), inverse.to(device))
            out.backward(grad.to(device))
            results.append((out.detach().cpu(), x.grad.cpu()))
        _same(results[1][0], results[0][0], "permute_pooled_embs")
        _same(results[1][1], results[0][1], "permute_pooled_embs gradient")
    # A list that is not a permutation of the keys is refused (fbgemm's CPU kernel does not
    # check, and reads out of bounds).
    with pytest.raises(RuntimeError, match="permute_list must name each"):
        fbgemm.permute_pooled_embs(pooled.to(dev), dims.to(dev), torch.tensor([2, 0]).to(dev), inverse_dims.to(dev),
                                   inverse.to(dev))


def test_padding_over_two_jagged_dimensions_runs_on_the_cpu_and_is_counted(dev: torch.device) -> None:
    # [rows][up to 2][up to 3]: outer offsets per row, inner offsets per inner row
    outer, inner = torch.tensor([0, 2, 3]), torch.tensor([0, 1, 3, 6])
    values = torch.arange(12.0).reshape(6, 2)
    want = torch.ops.fbgemm.jagged_to_padded_dense(values, [outer, inner], [2, 3], 0.0)
    torch_pjrt.reset_metrics()
    got = torch.ops.fbgemm.jagged_to_padded_dense(values.to(dev), [outer.to(dev), inner.to(dev)], [2, 3], 0.0)
    _same(got, want, "two jagged dimensions")
    assert got.device.type == dev.type
    assert torch_pjrt.metrics()["fallbacks"] == {"fbgemm::jagged_to_padded_dense_forward": 1}


def _dlrm() -> DLRM:
    torch.manual_seed(0)
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=50, feature_names=[name],
                                 pooling=torchrec.PoolingType.MEAN if i == 1 else torchrec.PoolingType.SUM)
              for i, name in enumerate(FEATURES)]
    return DLRM(embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("cpu")),
                dense_in_features=5, dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[16, 1])


def test_a_dlrm_trains_like_float64_step_by_step(dev: torch.device) -> None:
    # The qualification battery's differential harness: after every SGD step, the gradients
    # and parameters against a float64 replay of that step from the same state, within a
    # bound measured from float32 replays of it; the sparse features are KeyedJaggedTensors
    # made on the device from each batch's values and lengths; no CPU fallback.
    from torch_pjrt.qualify import differential

    batches = []
    for step in range(20):
        kjt = _kjt("cpu", 100 + step)
        g = torch.Generator().manual_seed(200 + step)
        batches.append((torch.randn(5, 5, generator=g), kjt.values(), kjt.lengths(), torch.rand(5, 1, generator=g)))

    def loss(model: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        dense, values, lengths, labels = batch
        sparse = KeyedJaggedTensor.from_lengths_sync(keys=FEATURES, values=values, lengths=lengths)
        return F.binary_cross_entropy_with_logits(model(dense, sparse), labels)

    problem = differential.Problem(_dlrm, batches, loss, lambda params: torch.optim.SGD(params, lr=0.5), len(batches))
    torch_pjrt.reset_metrics()
    with torch_pjrt.fallback_mode("error"):
        result = differential.run(problem, dev.type)
    assert result.passed, differential.describe(result)
    assert result.steps == 20 and torch_pjrt.metrics()["fallbacks"] == {}
