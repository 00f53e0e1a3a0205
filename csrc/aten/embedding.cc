// Embeddings: embedding, its backward, embedding_bag, embedding_renorm.
#include <ATen/Dispatch_v2.h>
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/native/ReduceOpsUtils.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TypeProperties.h>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>
#include <torch/library.h>

#include "aten/kernel_util.h"
#include "aten/nn_util.h"
#include "device/context.h"
#include "device/device_name.h"
#include "lowering/nn.h"
#include "lowering/ops.h"

namespace torch_pjrt::device {
namespace {

at::Tensor embedding_fn(const at::Tensor& weight, const at::Tensor& indices, int64_t padding_idx, bool scale_grad,
                        bool sparse) {
  TORCH_CHECK(weight.dim() == 2, "'weight' must be 2-D");
  // ATen's checkScalarTypes wording (a RuntimeError).
  TORCH_CHECK(indices.scalar_type() == at::kLong || indices.scalar_type() == at::kInt,
              "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; but got torch.",
              device_name(), ".", c10::toString(indices.scalar_type()), "Tensor instead (while checking arguments for embedding)");
  OpBuilder op("aten::embedding");
  Value idx = op.input(indices);
  int64_t n = weight.size(0);
  op.check_flag(L::index_out_of_range(op.b(), idx, n), "index out of range in aten::embedding (num_embeddings " +
                                                           std::to_string(n) + ")");
  Value flat = op.b().reshape(idx, {indices.numel()});
  Value r = L::index_select(op.b(), op.input(weight), 0, flat);
  std::vector<int64_t> shape = vec(indices.sizes());
  shape.push_back(weight.size(1));
  return finish(op, op.b().reshape(r, shape), weight.scalar_type(), nullptr);
}

at::Tensor embedding_backward_fn(const at::Tensor& grad, const at::Tensor& indices, int64_t num_weights,
                                 int64_t padding_idx, bool scale_grad_by_freq) {
  TORCH_CHECK_NOT_IMPLEMENTED(!scale_grad_by_freq, device_name(), ": embedding backward with scale_grad_by_freq");
  OpBuilder op("aten::embedding_dense_backward");
  Value r = L::embedding_backward(op.b(), op.input(grad), op.input(indices), num_weights, padding_idx);
  return finish(op, r, grad.scalar_type(), nullptr);
}

struct BagInfo {
  Value offset2bag, bag_size, keep;  // keep: entry is not padding_idx (i1 [L])
};

BagInfo bag_info(Builder& b, Value indices, Value offsets, int64_t bags, bool include_last_offset, int64_t padding_idx) {
  int64_t len = b.dims(indices)[0];
  int64_t starts = b.dims(offsets)[0] - (include_last_offset ? 1 : 0);
  Value off = b.slice_dim(b.convert(offsets, DType::S64), 0, 0, std::max<int64_t>(starts, 0));
  // Entry i belongs to the last bag whose start offset <= i.
  Value pos = b.iota(DType::S64, {len, starts}, 0);
  Value started = b.compare(b.broadcast_in_dim(off, {len, starts}, {1}), pos, "LE");
  Value bag = b.binary("subtract", L::sum(b, b.convert(started, DType::S64), {1}, false, DType::S64),
                       b.constant_int(DType::S64, 1, {len}));
  bag = b.clamp(b.constant_int(DType::S64, 0, {len}), bag, b.constant_int(DType::S64, std::max<int64_t>(bags - 1, 0), {len}));
  Value keep = b.compare(indices, b.constant_int(DType::S64, padding_idx, {len}), "NE");
  if (padding_idx < 0) keep = b.constant_int(DType::Pred, 1, {len});
  Value counts = L::scatter(b, b.constant_int(DType::S64, 0, {bags}), 0, bag, b.convert(keep, DType::S64), "add");
  return {bag, counts, keep};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> embedding_bag_fn(
    const at::Tensor& weight, const at::Tensor& indices, const at::Tensor& offsets, bool, int64_t mode, bool sparse,
    const std::optional<at::Tensor>& per_sample_weights, bool include_last_offset, int64_t padding_idx) {
  TORCH_CHECK(indices.dim() == 1 && offsets.dim() == 1, "embedding_bag: expected 1-D indices and offsets, got ",
              indices.sizes(), " and ", offsets.sizes());
  TORCH_CHECK(mode >= 0 && mode <= 2, "embedding_bag: mode must be sum (0), mean (1) or max (2), got ", mode);
  // sparse=True changes only the gradient's layout: the forward runs, its backward refuses (below).
  bool has_psw = per_sample_weights && per_sample_weights->defined();
  TORCH_CHECK(!has_psw || mode == 0, "embedding_bag: per_sample_weights is only supported for mode='sum' (got mode=", mode, ")");
  int64_t bags = offsets.size(0) - (include_last_offset ? 1 : 0);
  TORCH_CHECK(bags >= 0, "embedding_bag: include_last_offset needs at least one offset");
  int64_t len = indices.size(0), dim = weight.size(1), rows = weight.size(0);
  if (padding_idx < 0 && padding_idx != -1) padding_idx += rows;  // torch passes -1 for "none"
  OpBuilder op("aten::_embedding_bag");
  auto& b = op.b();
  Value idx = b.convert(op.input(indices), DType::S64);
  op.check_flag(L::index_out_of_range(b, idx, rows),
                "index out of range in aten::_embedding_bag (num_embeddings " + std::to_string(rows) + ")");
  auto info = bag_info(b, idx, op.input(offsets), bags, include_last_offset, padding_idx);
  DType dt = to_ir(weight.scalar_type()), acc = L::accumulate_type(dt);
  Value gathered = b.convert(L::index_select(b, op.input(weight), 0, idx), acc);  // [L, D]
  Value keep2 = b.broadcast_in_dim(info.keep, {len, dim}, {0});
  Value bag2 = b.broadcast_in_dim(info.offset2bag, {len, dim}, {0});
  Value out, max_idx;
  if (mode == 2) {
    // CPU's running `>`: a NaN is skipped, unless it is the bag's first entry, which then stays.
    Value lowest = L::lowest(b, acc, {len, dim});
    Value vals = b.select(keep2, gathered, lowest);
    Value numbers = b.select(b.compare(vals, vals, "NE"), lowest, vals);
    out = L::scatter(b, L::lowest(b, acc, {bags, dim}), 0, bag2, numbers, "max");
    Value iota = b.iota(DType::S64, {len, dim}, 0), none = b.constant_int(DType::S64, len, {len, dim});
    Value first_pos = L::scatter(b, b.constant_int(DType::S64, len, {bags, dim}), 0, bag2, b.select(keep2, iota, none), "amin");
    Value padded_vals = b.concatenate({vals, b.constant(acc, 0, {1, dim})}, 0);
    // The first entry holding each bag's maximum gives max_indices.
    Value is_max = b.binary("and", keep2, b.compare(vals, L::gather(b, out, 0, bag2), "EQ"));
    Value first = L::scatter(b, b.constant_int(DType::S64, len, {bags, dim}), 0, bag2, b.select(is_max, iota, none), "amin");
    Value idx2 = b.broadcast_in_dim(idx, {len, dim}, {0});
    Value padded_idx = b.concatenate({idx2, b.constant_int(DType::S64, -1, {1, dim})}, 0);
    Value first_val = L::gather(b, padded_vals, 0, first_pos);
    Value starts_nan = b.compare(first_val, first_val, "NE");
    out = b.select(starts_nan, first_val, out);
    max_idx = L::gather(b, padded_idx, 0, b.select(starts_nan, first_pos, first));
    Value empty = b.compare(b.broadcast_in_dim(info.bag_size, {bags, dim}, {0}), b.constant_int(DType::S64, 0, {bags, dim}), "EQ");
    out = b.select(empty, b.constant(acc, 0, {bags, dim}), out);
    max_idx = b.select(empty, b.constant_int(DType::S64, -1, {bags, dim}), max_idx);
  } else {
    Value vals = b.select(keep2, gathered, b.constant(acc, 0, {len, dim}));
    if (has_psw) vals = b.binary("multiply", vals, b.broadcast_in_dim(b.convert(op.input(*per_sample_weights), acc), {len, dim}, {0}));
    out = L::scatter(b, b.constant(acc, 0, {bags, dim}), 0, bag2, vals, "add");
    if (mode == 1) {
      Value count = b.convert(b.binary("maximum", info.bag_size, b.constant_int(DType::S64, 1, {bags})), acc);
      out = b.binary("divide", out, b.broadcast_in_dim(count, {bags, dim}, {0}));
    }
    max_idx = b.constant_int(DType::S64, 0, {bags});
  }
  at::Tensor o = op.output(b.convert(out, dt), weight.scalar_type());
  at::Tensor o2b = op.output(info.offset2bag, at::kLong);
  at::Tensor bs = op.output(info.bag_size, at::kLong);
  at::Tensor mi = op.output(max_idx, at::kLong);
  op.run();
  return {o, o2b, bs, mi};
}

at::Tensor embedding_bag_dense_backward_fn(const at::Tensor& grad, const at::Tensor& indices, const at::Tensor& offset2bag,
                                           const at::Tensor& bag_size, const at::Tensor& max_indices, int64_t num_weights,
                                           bool scale_grad_by_freq, int64_t mode,
                                           const std::optional<at::Tensor>& per_sample_weights, int64_t padding_idx) {
  OpBuilder op("aten::_embedding_bag_dense_backward");
  auto& b = op.b();
  int64_t len = indices.numel(), dim = grad.size(1), bags = grad.size(0);
  DType dt = to_ir(grad.scalar_type()), acc = L::accumulate_type(dt);
  Value g = b.convert(op.input(grad), acc);
  Value idx = b.reshape(b.convert(op.input(indices), DType::S64), {len});
  Value zeros = b.constant(acc, 0, {num_weights, dim});
  if (padding_idx < 0 && padding_idx != -1) padding_idx += num_weights;
  Value r;
  if (mode == 2) {
    Value mi = b.convert(op.input(max_indices), DType::S64);
    Value valid = b.compare(mi, b.constant_int(DType::S64, 0, {bags, dim}), "GE");
    Value target = b.select(valid, mi, b.constant_int(DType::S64, 0, {bags, dim}));
    r = L::scatter(b, zeros, 0, target, b.select(valid, g, b.constant(acc, 0, {bags, dim})), "add");
  } else {
    Value bag = b.reshape(b.convert(op.input(offset2bag), DType::S64), {len});
    Value rows = L::index_select(b, g, 0, bag);  // [L, D]
    if (mode == 1) {
      Value count = b.convert(b.binary("maximum", b.convert(op.input(bag_size), DType::S64), b.constant_int(DType::S64, 1, {bags})), acc);
      rows = b.binary("divide", rows, b.broadcast_in_dim(L::index_select(b, count, 0, bag), {len, dim}, {0}));
    }
    if (per_sample_weights && per_sample_weights->defined()) {
      rows = b.binary("multiply", rows, b.broadcast_in_dim(b.convert(op.input(*per_sample_weights), acc), {len, dim}, {0}));
    }
    if (scale_grad_by_freq) {
      Value freq = L::scatter(b, b.constant(acc, 0, {num_weights}), 0, idx, b.constant(acc, 1, {len}), "add");
      rows = b.binary("divide", rows, b.broadcast_in_dim(L::index_select(b, freq, 0, idx), {len, dim}, {0}));
    }
    if (padding_idx >= 0) {
      Value keep = b.compare(idx, b.constant_int(DType::S64, padding_idx, {len}), "NE");
      rows = b.select(b.broadcast_in_dim(keep, {len, dim}, {0}), rows, b.constant(acc, 0, {len, dim}));
    }
    r = L::scatter(b, zeros, 0, b.broadcast_in_dim(idx, {len, dim}, {0}), rows, "add");
  }
  return finish(op, b.convert(r, dt), grad.scalar_type(), nullptr);
}

at::Tensor embedding_bag_backward_fn(const at::Tensor& grad, const at::Tensor& indices, const at::Tensor&,
                                     const at::Tensor& offset2bag, const at::Tensor& bag_size,
                                     const at::Tensor& max_indices, int64_t num_weights, bool scale_grad_by_freq,
                                     int64_t mode, bool sparse, const std::optional<at::Tensor>& per_sample_weights,
                                     int64_t padding_idx) {
  TORCH_CHECK(!sparse, device_name(), ": embedding_bag with sparse=True gradients is not supported");
  return embedding_bag_dense_backward_fn(grad, indices, offset2bag, bag_size, max_indices, num_weights,
                                         scale_grad_by_freq, mode, per_sample_weights, padding_idx);
}

at::Tensor embedding_bag_psw_backward_fn(const at::Tensor& grad, const at::Tensor& weight, const at::Tensor& indices,
                                         const at::Tensor&, const at::Tensor& offset2bag, int64_t mode, int64_t padding_idx) {
  TORCH_CHECK(mode == 0, "embedding_bag_backward: per_sample_weights only supported for mode='sum'");
  OpBuilder op("aten::_embedding_bag_per_sample_weights_backward");
  auto& b = op.b();
  int64_t len = indices.numel();
  DType dt = to_ir(grad.scalar_type()), acc = L::accumulate_type(dt);
  Value idx = b.reshape(b.convert(op.input(indices), DType::S64), {len});
  Value rows = b.convert(L::index_select(b, op.input(weight), 0, idx), acc);
  Value g = b.convert(L::index_select(b, op.input(grad), 0, b.reshape(b.convert(op.input(offset2bag), DType::S64), {len})), acc);
  Value r = L::sum(b, b.binary("multiply", rows, g), {1}, false, acc);
  if (padding_idx >= 0) {
    r = b.select(b.compare(idx, b.constant_int(DType::S64, padding_idx, {len}), "NE"), r, b.constant(acc, 0, {len}));
  }
  return finish(op, b.convert(r, dt), grad.scalar_type(), nullptr);
}

Tensor& embedding_renorm(Tensor& self, const Tensor& indices, double max_norm, double norm_type) {
  TORCH_CHECK(self.dim() == 2, "embedding_renorm_: weight must be 2-D");
  TORCH_CHECK(indices.scalar_type() == at::kLong || indices.scalar_type() == at::kInt,
              "embedding_renorm_: Expected indices to have type Long or Int");
  // Rows that are looked up and whose norm exceeds max_norm shrink to it (one program, no host read).
  Tensor used = at::zeros({self.size(0)}, self.options().dtype(at::kBool));
  used.index_fill_(0, indices.reshape({-1}).to(at::kLong), true);
  Tensor norms = at::linalg_vector_norm(self, norm_type, {1}, /*keepdim=*/true);
  Tensor scale = at::where(used.unsqueeze(1).logical_and(norms > max_norm), max_norm / (norms + 1e-7), at::ones_like(norms));
  return self.mul_(scale);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("embedding", embedding_fn);
  m.impl("embedding_dense_backward", embedding_backward_fn);
  m.impl("_embedding_bag", embedding_bag_fn);
  m.impl("_embedding_bag_forward_only", embedding_bag_fn);
  m.impl("_embedding_bag_dense_backward", embedding_bag_dense_backward_fn);
  m.impl("_embedding_bag_backward", embedding_bag_backward_fn);
  m.impl("_embedding_bag_per_sample_weights_backward", embedding_bag_psw_backward_fn);
  m.impl("embedding_renorm_", embedding_renorm);
}

}  // namespace torch_pjrt::device
