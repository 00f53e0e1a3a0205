// Indexing: cat, index_select, gather, scatter (and reduce), index/index_put, nonzero,
// masked_select, index_add/copy/fill, masked_scatter, take, put.
#include <ATen/Dispatch_v2.h>
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/native/ReduceOpsUtils.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TypeProperties.h>
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

at::Tensor cat_impl(const at::ITensorListRef& tensors, int64_t dim, const at::Tensor* into) {
  std::vector<at::Tensor> ts(tensors.begin(), tensors.end());
  TORCH_CHECK(!ts.empty(), "torch.cat(): expected a non-empty list of Tensors");
  at::ScalarType out = ts[0].scalar_type();
  for (auto& t : ts) out = at::promote_types(out, t.scalar_type());
  if (into) out = out_dtype("torch.cat()", out, *into);
  // Reference tensor: the first that is not a legacy empty 1-D tensor.
  const at::Tensor* ref = nullptr;
  for (auto& t : ts) {
    if (!(t.dim() == 1 && t.numel() == 0)) {
      ref = &t;
      break;
    }
  }
  if (ref == nullptr) {
    // Only legacy empty tensors: the result is one too, whatever dim says (as ATen).
    for (size_t i = 0; i < ts.size(); ++i) {
      TORCH_CHECK(ts[i].device() == ts[0].device(), "Expected all tensors to be on the same device");
    }
    if (!into) return at::empty({0}, ts[0].options().dtype(out));
    at::native::resize_output(*into, {0});
    return *into;
  }
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(ref->dim(), 1));
  OpBuilder op("aten::cat");
  std::vector<Value> vs;
  for (size_t i = 0; i < ts.size(); ++i) {
    TORCH_CHECK(ts[i].dim() > 0, "zero-dimensional tensor (at position ", i, ") cannot be concatenated");
  }
  for (auto& t : ts) {
    if (t.dim() == 1 && t.numel() == 0 && ref->dim() != 1) continue;
    TORCH_CHECK(t.dim() == ref->dim(), "torch.cat(): Tensors must have same number of dimensions: got ", ref->dim(),
                " and ", t.dim());
    for (int64_t k = 0; k < t.dim(); ++k) {
      TORCH_CHECK(k == d || t.size(k) == ref->size(k), "Sizes of tensors must match except in dimension ", d,
                  ". Expected size ", ref->size(k), " but got size ", t.size(k), " for tensor number ", vs.size(), " in the list.");
    }
    vs.push_back(op.input(t));
  }
  Value r = L::cat(op.b(), vs, d, to_ir(out));
  // ATen's result layout: the inputs' suggested memory format when they all agree.
  std::optional<at::MemoryFormat> format;
  for (auto& t : ts) {
    if (t.dim() == 1 && t.numel() == 0) continue;
    at::MemoryFormat f = t.suggest_memory_format();
    if (!format) format = f;
    else if (*format != f) format = at::MemoryFormat::Contiguous;
  }
  return finish(op, r, out, into, format.value_or(at::MemoryFormat::Contiguous));
}
at::Tensor cat_fn(const at::ITensorListRef& t, int64_t d) { return cat_impl(t, d, nullptr); }
at::Tensor& cat_out(const at::ITensorListRef& t, int64_t d, at::Tensor& o) {
  TORCH_CHECK(t.size() > 0, "torch.cat(): expected a non-empty list of Tensors");
  at::ScalarType inputs = t.front().scalar_type();
  for (const at::Tensor& input : t) inputs = at::promote_types(inputs, input.scalar_type());
  // A TypeError, as ATen raises it (test_ops' test_out expects that type for cat and its stacking variants).
  TORCH_CHECK_TYPE(c10::canCast(inputs, o.scalar_type()), "torch.cat(): input types can't be cast to the desired output type ",
                   o.scalar_type());
  at::assert_no_internal_overlap(o);
  for (const at::Tensor& input : t) at::assert_no_overlap(o, input);
  cat_impl(t, d, &o);
  return o;
}

void check_index_dtype(const char* name, const at::Tensor& index) {
  TORCH_CHECK_INDEX(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt, name,
                    "(): Expected dtype int32/int64 for index but got ", index.scalar_type());
}

at::Tensor index_select_impl(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor* into) {
  check_index_dtype("index_select", index);
  TORCH_CHECK_INDEX(index.dim() <= 1, "index_select(): Index is supposed to be a vector");
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  OpBuilder op("aten::index_select");
  Value x = op.input(self);
  if (self.dim() == 0) x = op.b().reshape(x, {1});
  int64_t size = op.b().dims(x)[d];
  Value idx = op.input(index);
  op.check_flag(L::index_out_of_range(op.b(), idx, size),
                "index out of range in aten::index_select (size " + std::to_string(size) + ")");
  Value r = L::index_select(op.b(), x, d, idx);
  if (self.dim() == 0) r = op.b().reshape(r, {});
  return finish(op, r, self.scalar_type(), into);
}
at::Tensor index_select_fn(const at::Tensor& s, int64_t d, const at::Tensor& i) { return index_select_impl(s, d, i, nullptr); }
at::Tensor& index_select_out(const at::Tensor& s, int64_t d, const at::Tensor& i, at::Tensor& o) {
  check_out_overlap(o, {s, i});  // before resizing, as ATen checks it
  index_select_impl(s, d, i, &o);
  return o;
}

at::Tensor gather_impl(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor* into) {
  if (index.numel() == 0) return into ? *into : at::empty(index.sizes(), self.options());  // any index dtype, like CPU
  TORCH_CHECK(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt,
              "gather(): Expected dtype int32/int64 for index");
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  TORCH_CHECK(index.dim() == self.dim() || (self.dim() == 0 && index.dim() <= 1),
              "Index tensor must have the same number of dimensions as input tensor");
  for (int64_t k = 0; k < index.dim(); ++k) {
    if (k != d) {
      TORCH_CHECK(index.size(k) <= self.size(k), "Size does not match at dimension ", k, " expected index ",
                  index.sizes(), " to be no larger than self ", self.sizes(), " apart from dimension ", d);
    }
  }
  OpBuilder op("aten::gather");
  Value x = op.input(self), idx = op.input(index);
  if (self.dim() == 0) x = op.b().reshape(x, {1});
  int64_t size = op.b().dims(x)[d];
  op.check_flag(L::index_out_of_range(op.b(), idx, size), "index out of range in aten::gather (size " + std::to_string(size) + ")");
  Value r = L::gather(op.b(), x, d, idx);
  return finish(op, r, self.scalar_type(), into);
}
at::Tensor gather_fn(const at::Tensor& s, int64_t d, const at::Tensor& i, bool) { return gather_impl(s, d, i, nullptr); }
at::Tensor& gather_out(const at::Tensor& s, int64_t d, const at::Tensor& i, bool, at::Tensor& o) {
  TORCH_CHECK(o.scalar_type() == s.scalar_type(), "gather(): Expected out tensor to have dtype ", s.dtype(),
              ", but got ", o.dtype(), " instead");
  // Checked here too: an empty index writes nothing, so no op would see `o`.
  TORCH_CHECK(o.device() == s.device(), "Expected all tensors to be on the same device, but found at least two devices, ",
              s.device(), " and ", o.device(), "!");
  at::native::resize_output(o, i.sizes());
  check_out_overlap(o, {s, i});
  gather_impl(s, d, i, &o);
  return o;
}

at::Tensor scatter_impl(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                        const std::string& reduce, const at::Tensor* into, bool src_is_value = false) {
  check_scatter(reduce == "add" ? "scatter_add" : "scatter", self, dim, index, src_is_value ? nullptr : &src);
  if (index.numel() == 0) {
    // Nothing to scatter (any index dtype, as on CPU): self unchanged.
    if (!into) return self.clone();
    if (!into->is_same(self)) into->copy_(self);
    return *into;
  }
  TORCH_CHECK(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt, "scatter(): Expected dtype int32/int64 for index");
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  const std::string name = reduce.empty() ? "aten::scatter" : "aten::scatter_" + reduce;
  OpBuilder op(name);
  Value x = op.input(self), idx = op.input(index);
  if (self.dim() == 0) x = op.b().reshape(x, {1});
  int64_t size = op.b().dims(x)[d];
  Value s = src.dim() == 0 ? op.b().broadcast_to(op.input(src), vec(index.sizes())) : op.input(src);
  Value bad;
  Value r = L::guarded_scatter(op.b(), x, d, idx, s, reduce, &bad);
  op.check_flag_guarded_by_op(bad, "index out of range in " + name + " (size " + std::to_string(size) + ")");
  if (self.dim() == 0) r = op.b().reshape(r, {});
  return finish(op, r, self.scalar_type(), into);
}
at::Tensor scatter_src(const at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& src) {
  return scatter_impl(s, d, i, src, "", nullptr);
}
at::Tensor& scatter_src_inplace(at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& src) {
  scatter_impl(s, d, i, src, "", &s);
  return s;
}
at::Tensor scatter_value(const at::Tensor& s, int64_t d, const at::Tensor& i, const at::Scalar& v) {
  return scatter_impl(s, d, i, at::scalar_tensor(v, at::TensorOptions().dtype(s.scalar_type())), "", nullptr, true);
}
at::Tensor& scatter_value_inplace(at::Tensor& s, int64_t d, const at::Tensor& i, const at::Scalar& v) {
  scatter_impl(s, d, i, at::scalar_tensor(v, at::TensorOptions().dtype(s.scalar_type())), "", &s, true);
  return s;
}
at::Tensor scatter_add_fn(const at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& src) {
  return scatter_impl(s, d, i, src, "add", nullptr);
}
at::Tensor& scatter_add_inplace(at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& src) {
  scatter_impl(s, d, i, src, "add", &s);
  return s;
}

// Data-dependent output shape: the mask is read on the host (a sync, as
// nonzero is on every device), the indices are computed there and uploaded.
at::Tensor nonzero_fn(const at::Tensor& self) {
  at::Tensor host = to_cpu(self);
  return host.nonzero().to(self.device());
}
at::Tensor& nonzero_out(const at::Tensor& self, at::Tensor& out) {
  // As torch's own kernels: indices are Long, never cast into another out type.
  TORCH_CHECK(out.scalar_type() == at::kLong, "nonzero: Expected out tensor to have scalar type Long but got scalar type ",
              out.scalar_type());
  TORCH_CHECK(out.device() == self.device(), "nonzero: Expected out tensor to be on the same device as the input (",
              self.device(), "), but got ", out.device());
  return write_out("nonzero", nonzero_fn(self), out);
}

at::Tensor masked_select_fn(const at::Tensor& self, const at::Tensor& mask) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "masked_select: expected BoolTensor for mask");
  auto shape = at::infer_size(self.sizes(), mask.sizes());
  at::Tensor m = mask.expand(shape);
  at::Tensor idx = nonzero_fn(m);
  c10::List<std::optional<at::Tensor>> indices;
  for (int64_t k = 0; k < idx.size(1); ++k) indices.push_back(idx.select(1, k));
  if (shape.empty()) return self.reshape({1}).index({m.reshape({1})});
  return self.expand(shape).index(indices);
}

// Advanced indexing. Bool masks need data-dependent shapes: they go through
// nonzero (a host sync), as on every backend.
std::vector<at::Tensor> expand_index_list(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices) {
  std::vector<at::Tensor> out;
  for (const std::optional<at::Tensor>& i : indices) {
    if (!i.has_value() || !i->defined()) {
      out.emplace_back();
      continue;
    }
    // CPU index tensors are allowed, as on CUDA: move them over.
    at::Tensor ix = i->device() == self.device() ? *i : i->to(self.device());
    if (ix.scalar_type() == at::kBool || ix.scalar_type() == at::kByte) {
      if (ix.scalar_type() == at::kByte) {
        TORCH_WARN("indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead.");
      }
      // A mask covers as many dims as it has, and must match them (as CPU checks).
      int64_t pos = static_cast<int64_t>(out.size());
      TORCH_CHECK_INDEX(pos + ix.dim() <= self.dim(), "too many indices for tensor of dimension ", self.dim());
      for (int64_t j = 0; j < ix.dim(); ++j) {
        TORCH_CHECK_INDEX(ix.size(j) == self.size(pos + j), "The shape of the mask ", ix.sizes(), " at index ", j,
                          " does not match the shape of the indexed tensor ", self.sizes(), " at index ", pos + j);
      }
      at::Tensor nz = ix.nonzero();
      for (int64_t k = 0; k < ix.dim(); ++k) out.push_back(nz.select(1, k));
    } else {
      check_index_dtype("index", ix);
      out.push_back(ix);
    }
  }
  return out;
}

// Moves indexed dims to the front (PyTorch's rule for where the result dims go).
struct IndexPlan {
  at::Tensor src;                 // self, permuted so indexed dims lead
  std::vector<at::Tensor> index;  // index tensors for the leading dims
  bool adjacent = true;           // indexed dims were contiguous in self
  int64_t first = 0;              // position of the first indexed dim
};
IndexPlan plan_index(const at::Tensor& self, const std::vector<at::Tensor>& idx) {
  TORCH_CHECK_INDEX(static_cast<int64_t>(idx.size()) <= self.dim(), "too many indices for tensor of dimension ",
                    self.dim(), " (got ", idx.size(), ")");
  IndexPlan p;
  std::vector<int64_t> indexed, rest;
  for (int64_t d = 0; d < self.dim(); ++d) {
    bool has = d < static_cast<int64_t>(idx.size()) && idx[d].defined();
    (has ? indexed : rest).push_back(d);
  }
  for (size_t k = 1; k < indexed.size(); ++k) p.adjacent &= indexed[k] == indexed[k - 1] + 1;
  p.first = indexed.empty() ? 0 : indexed[0];
  std::vector<int64_t> perm = indexed;
  perm.insert(perm.end(), rest.begin(), rest.end());
  p.src = self.permute(perm);
  for (int64_t d : indexed) p.index.push_back(idx[d]);
  return p;
}

// The index tensors must broadcast together: ATen's IndexError and wording, before any other check.
void check_indices_broadcast(const IndexPlan& p) {
  std::vector<int64_t> shape;
  for (const at::Tensor& i : p.index) {
    try {
      shape = ir::broadcast_shapes(shape, vec(i.sizes()));
    } catch (const std::invalid_argument&) {
      std::ostringstream shapes;
      for (size_t k = 0; k < p.index.size(); ++k) shapes << (k ? ", " : "") << p.index[k].sizes();
      TORCH_CHECK_INDEX(false, "shape mismatch: indexing tensors could not be broadcast together with shapes ",
                        shapes.str());
    }
  }
}

// A dim of size 0 indexed by a non-empty index: every index is out of range,
// known without reading it (CPU raises at once too).
void check_indexing_empty_dims(const IndexPlan& p) {
  for (size_t k = 0; k < p.index.size(); ++k) {
    TORCH_CHECK_INDEX(p.src.size(static_cast<int64_t>(k)) > 0 || p.index[k].numel() == 0,
                      "index is out of bounds for dimension with size 0");
  }
}

bool indexing_is_empty(const IndexPlan& p) {
  if (p.src.numel() == 0) return true;
  for (const at::Tensor& i : p.index)
    if (i.numel() == 0) return true;
  return false;
}

// The shape of self[idx], from the meta device (for an empty result: no program with
// zero-size slices).
std::vector<int64_t> indexing_shape(const at::Tensor& self, const std::vector<at::Tensor>& idx) {
  c10::List<std::optional<at::Tensor>> meta;
  for (const at::Tensor& i : idx) {
    meta.push_back(i.defined() ? std::optional<at::Tensor>(at::empty(i.sizes(), i.options().device(at::kMeta)))
                               : std::optional<at::Tensor>());
  }
  return vec(at::index(at::empty(self.sizes(), self.options().device(at::kMeta)), meta).sizes());
}

at::Tensor index_fn(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices) {
  std::vector<at::Tensor> idx = expand_index_list(self, indices);
  IndexPlan p = plan_index(self, idx);
  TORCH_CHECK_INDEX(!p.index.empty(), "at least one index must be provided");
  check_indices_broadcast(p);
  check_indexing_empty_dims(p);
  if (indexing_is_empty(p)) return at::empty(indexing_shape(self, idx), self.options());
  OpBuilder op("aten::index");
  std::vector<Value> vs;
  for (size_t k = 0; k < p.index.size(); ++k) {
    Value v = op.input(p.index[k]);
    int64_t size = p.src.size(static_cast<int64_t>(k));
    op.check_flag(L::index_out_of_range(op.b(), v, size), "index out of range in aten::index (dimension size " +
                                                              std::to_string(size) + ")");
    vs.push_back(v);
  }
  Value r;
  try {
    r = L::index(op.b(), op.input(p.src), vs);
  } catch (const std::invalid_argument&) {
    TORCH_CHECK_INDEX(false, "shape mismatch: indexing tensors could not be broadcast together");
  }
  // Result layout: broadcast dims first; if indexed dims were adjacent, they go
  // where the first indexed dim was.
  if (p.adjacent && p.first > 0) {
    auto shape = op.b().dims(r);
    int64_t nb = static_cast<int64_t>(shape.size()) - (self.dim() - static_cast<int64_t>(p.index.size()));
    std::vector<int64_t> perm;
    for (int64_t k = 0; k < p.first; ++k) perm.push_back(nb + k);
    for (int64_t k = 0; k < nb; ++k) perm.push_back(k);
    for (int64_t k = nb + p.first; k < static_cast<int64_t>(shape.size()); ++k) perm.push_back(k);
    r = op.b().transpose(r, perm);
  }
  return finish(op, r, self.scalar_type(), nullptr);
}

at::Tensor& index_put_impl(at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices,
                           const at::Tensor& values, bool accumulate, bool unsafe) {
  std::vector<at::Tensor> idx = expand_index_list(self, indices);  // checks masks' shapes first, as CPU does
  if (!accumulate && indices.size() == 1 && indices.get(0).has_value() && indices.get(0)->scalar_type() == at::kByte &&
      values.numel() == 1) {
    // CPU turns this form into masked_fill_, which refuses uint8 masks.
    TORCH_CHECK(false, "masked_fill_ only supports boolean masks, but got mask with dtype unsigned char");
  }
  IndexPlan p = plan_index(self, idx);
  // A RuntimeError, as on CPU (where this form fails inside ATen's kernel).
  TORCH_CHECK(!p.index.empty(), "index_put_: at least one index must be a tensor");
  check_indices_broadcast(p);
  check_indexing_empty_dims(p);
  // The values must fit the result (even an empty one, where nothing is written), checked
  // before their dtype, as ATen does.
  const std::vector<int64_t> indexed_shape = indexing_shape(self, idx);
  TORCH_CHECK(at::is_expandable_to(values.sizes(), indexed_shape), "shape mismatch: value tensor of shape ", values.sizes(),
              " cannot be broadcast to indexing result of shape ", c10::IntArrayRef(indexed_shape));
  if (indexing_is_empty(p)) return self;
  TORCH_CHECK(values.scalar_type() == self.scalar_type() || values.dim() == 0,
              "Index put requires the source and destination dtypes match, got ", self.scalar_type(),
              " for the destination and ", values.scalar_type(), " for the source.");
  OpBuilder op(accumulate ? "aten::index_put_(accumulate)" : "aten::index_put_");
  std::vector<Value> vs;
  auto& b = op.b();
  for (const at::Tensor& index : p.index) vs.push_back(op.input(index));
  Value vals = op.input(values);
  // Values are given in the result layout of self[indices]; bring them to the
  // [broadcast..., rest...] layout that the lowering uses.
  std::vector<int64_t> batch;
  for (Value v : vs) batch = ir::broadcast_shapes(batch, b.dims(v));
  int64_t nb = static_cast<int64_t>(batch.size());
  int64_t nrest = self.dim() - static_cast<int64_t>(p.index.size());
  std::vector<int64_t> result_shape;
  if (p.adjacent && p.first > 0) {
    for (int64_t k = 0; k < p.first; ++k) result_shape.push_back(p.src.size(p.index.size() + k));
    result_shape.insert(result_shape.end(), batch.begin(), batch.end());
    for (int64_t k = p.first; k < nrest; ++k) result_shape.push_back(p.src.size(p.index.size() + k));
  } else {
    result_shape = batch;
    for (int64_t k = 0; k < nrest; ++k) result_shape.push_back(p.src.size(p.index.size() + k));
  }
  try {
    vals = b.broadcast_to(vals, result_shape);
  } catch (const std::invalid_argument&) {
    TORCH_CHECK(false, "shape mismatch: value tensor of shape ", values.sizes(),
                " cannot be broadcast to indexing result of shape ", c10::IntArrayRef(result_shape));
  }
  if (p.adjacent && p.first > 0) {
    std::vector<int64_t> perm;
    for (int64_t k = 0; k < nb; ++k) perm.push_back(p.first + k);
    for (int64_t k = 0; k < p.first; ++k) perm.push_back(k);
    for (int64_t k = p.first + nb; k < static_cast<int64_t>(result_shape.size()); ++k) perm.push_back(k);
    vals = b.transpose(vals, perm);
  }
  std::vector<Value> bad;
  Value r = L::guarded_index_put(b, op.input(p.src), vs, vals, accumulate, &bad);
  for (size_t k = 0; k < bad.size(); ++k) {
    op.check_flag_guarded_by_op(bad[k], "index out of range in aten::index_put_ (dimension size " +
                                            std::to_string(p.src.size(static_cast<int64_t>(k))) + ")");
  }
  // Write through the permuted view of self.
  op.write(p.src, r);
  op.run();
  return self;
}

// Moves `dim` to the front (and back): index_put works on leading dims.
std::vector<int64_t> front_perm(int64_t rank, int64_t dim) {
  std::vector<int64_t> perm{dim};
  for (int64_t i = 0; i < rank; ++i) {
    if (i != dim) perm.push_back(i);
  }
  return perm;
}
std::vector<int64_t> inverse_perm(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i);
  return inv;
}

Value flat_index(Builder& b, Value index) { return b.reshape(b.convert(index, DType::S64), {b.type(index).numel()}); }

// index_add/copy/fill's index: a vector of int32/int64.
void check_index_vector(const char* name, const at::Tensor& index) {
  check_index_dtype(name, index);
  TORCH_CHECK_INDEX(index.dim() <= 1, name, "(): Index is supposed to be a vector, got ", index.dim(), "-D");
}

// self with rows `index` along dim replaced by (or accumulated with) `values` [len(index), rest...] along dim.
at::Tensor index_update(const char* name, const at::Tensor& self, int64_t dim, const at::Tensor& index,
                        const std::function<Value(OpBuilder&, Value self_value, const std::vector<int64_t>& rows_shape)>& values,
                        bool accumulate, const at::Tensor* into) {
  // ATen's index_copy and index_fill take int64 indices only (on every device), index_add int32 too.
  if (std::strcmp(name, "index_copy") == 0) {
    TORCH_CHECK(index.scalar_type() == at::kLong, "index_copy_(): Expected a long tensor for index, but got ",
                index.scalar_type());
  } else if (std::strcmp(name, "index_fill") == 0) {
    TORCH_CHECK_INDEX(index.scalar_type() == at::kLong, "index_fill_(): Expected dtype int64 for index.");
  }
  check_index_vector(name, index);
  int64_t rank = std::max<int64_t>(self.dim(), 1);
  int64_t d = at::maybe_wrap_dim(dim, rank);
  int64_t size = self.dim() == 0 ? 1 : self.size(d);
  OpBuilder op(std::string("aten::") + name);
  auto& b = op.b();
  Value x = op.input(self);
  if (self.dim() == 0) x = b.reshape(x, {1});
  Value idx = flat_index(b, op.input(index));
  auto perm = front_perm(rank, d);
  Value xt = b.transpose(x, perm);
  std::vector<int64_t> rows_shape = b.dims(xt);
  rows_shape[0] = b.type(idx).numel();
  std::vector<Value> bad;
  Value r = L::guarded_index_put(b, xt, {idx}, values(op, x, rows_shape), accumulate, &bad);
  op.check_flag_guarded_by_op(bad[0], std::string("index out of range in aten::") + name + " (dimension size " +
                                          std::to_string(size) + ")");
  r = b.transpose(r, inverse_perm(perm));
  if (self.dim() == 0) r = b.reshape(r, {});
  return finish(op, r, self.scalar_type(), into);
}

// The source tensor's rows, moved like self (dim first), checked against the expected shape.
std::function<Value(OpBuilder&, Value, const std::vector<int64_t>&)> source_rows(const char* name, const at::Tensor& self,
                                                                             int64_t dim, const at::Tensor& source,
                                                                             const at::Scalar* alpha) {
  return [=](OpBuilder& op, Value, const std::vector<int64_t>& rows_shape) {
    auto& b = op.b();
    int64_t rank = std::max<int64_t>(self.dim(), 1);
    int64_t d = at::maybe_wrap_dim(dim, rank);
    if (source.dim() > 0 && rows_shape[0] != source.size(d)) {
      // CPU's wording and error type differ between the two ops.
      if (std::strcmp(name, "index_copy") == 0) {
        TORCH_CHECK_INDEX(false, name, "_(): Number of indices (", rows_shape[0], ") should be equal to source.size(dim) (",
                          source.size(d), ")");
      }
      TORCH_CHECK(false, name, "_(): Number of indices (", rows_shape[0], ") should be equal to source.size(dim): (",
                  source.size(d), "), for dim: ", d);
    }
    Value s = op.input(source);
    if (source.dim() == 0) s = b.reshape(s, {1});
    Value st = b.transpose(s, front_perm(rank, d));
    TORCH_CHECK(b.dims(st) == rows_shape, name, "(): source of shape ", source.sizes(),
                " does not match self of shape ", self.sizes(), " with ", rows_shape[0], " indices along dim ", d);
    if (alpha) {
      at::ScalarType t = self.scalar_type();
      st = b.binary("multiply", b.convert(st, to_ir(t)), b.broadcast_to(op.scalar(*alpha, t), rows_shape));
    }
    return st;
  };
}

at::Tensor index_add_fn(const at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& src, const at::Scalar& a) {
  return index_update("index_add", s, d, i, source_rows("index_add", s, d, src, &a), true, nullptr);
}
at::Tensor& index_add_out(const at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& src, const at::Scalar& a,
                          at::Tensor& out) {
  index_update("index_add", s, d, i, source_rows("index_add", s, d, src, &a), true, &out);
  return out;
}
at::Tensor& index_add_inplace(at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& src, const at::Scalar& a) {
  index_update("index_add", s, d, i, source_rows("index_add", s, d, src, &a), true, &s);
  return s;
}
at::Tensor index_copy_fn(const at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& src) {
  return index_update("index_copy", s, d, i, source_rows("index_copy", s, d, src, nullptr), false, nullptr);
}
at::Tensor& index_copy_out(const at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& src, at::Tensor& out) {
  index_update("index_copy", s, d, i, source_rows("index_copy", s, d, src, nullptr), false, &out);
  return out;
}
at::Tensor& index_copy_inplace(at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& src) {
  index_update("index_copy", s, d, i, source_rows("index_copy", s, d, src, nullptr), false, &s);
  return s;
}

at::Tensor index_fill_impl(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& value,
                           const at::Tensor* into) {
  TORCH_CHECK(value.dim() == 0, "index_fill_ only supports a 0-dimensional value tensor, but got tensor with ",
              value.dim(), " dimension(s).");
  // A host index is accepted, as torch's CUDA kernel accepts one (an upload).
  const at::Tensor idx = index.device().is_cpu() ? index.to(self.device()) : index;
  return index_update("index_fill", self, dim, idx,
                      [&](OpBuilder& op, Value, const std::vector<int64_t>& rows_shape) {
                        auto& b = op.b();
                        return b.broadcast_to(b.convert(op.input(value), to_ir(self.scalar_type())), rows_shape);
                      },
                      false, into);
}
void check_index_fill_value(const at::Tensor& self, const at::Scalar& v) {
  TORCH_CHECK(!v.isComplex() || self.is_complex(), "index_fill_(): Converting complex Scalar to non-complex type is not supported");
}
at::Tensor index_fill_s(const at::Tensor& s, int64_t d, const at::Tensor& i, const at::Scalar& v) {
  check_index_fill_value(s, v);
  return index_fill_impl(s, d, i, at::scalar_tensor(v, at::TensorOptions().dtype(s.scalar_type())), nullptr);
}
at::Tensor index_fill_t(const at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& v) {
  return index_fill_impl(s, d, i, v, nullptr);
}
at::Tensor& index_fill_s_inplace(at::Tensor& s, int64_t d, const at::Tensor& i, const at::Scalar& v) {
  check_index_fill_value(s, v);
  index_fill_impl(s, d, i, at::scalar_tensor(v, at::TensorOptions().dtype(s.scalar_type())), &s);
  return s;
}
at::Tensor& index_fill_t_inplace(at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& v) {
  index_fill_impl(s, d, i, v, &s);
  return s;
}

at::Tensor masked_scatter_impl(const at::Tensor& self, const at::Tensor& mask, const at::Tensor& source,
                               const at::Tensor* into) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "masked_scatter_ only supports boolean masks, but got mask with dtype ",
              mask.scalar_type());
  TORCH_CHECK(self.scalar_type() == source.scalar_type(), "masked_scatter: expected self and source to have same dtypes but got ",
              self.scalar_type(), " and ", source.scalar_type());
  OpBuilder op("aten::masked_scatter");
  auto& b = op.b();
  Value x = op.input(self);
  std::vector<int64_t> shape = into ? vec(self.sizes()) : ir::broadcast_shapes(b.dims(x), vec(mask.sizes()));
  x = b.broadcast_to(x, shape);
  Value m = b.broadcast_to(op.input(mask), shape);
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  // The k-th true position (row-major) takes source element k.
  Value pos = b.binary("subtract", L::cumulative(b, b.reshape(b.convert(m, DType::S64), {n}), 0, "sum"),
                       b.constant_int(DType::S64, 1, {n}));
  int64_t available = std::max<int64_t>(source.numel(), 1);
  Value src = b.reshape(op.input(source), {source.numel()});
  if (source.numel() == 0) src = b.constant(to_ir(self.scalar_type()), 0, {1});
  Value clipped = b.clamp(b.constant_int(DType::S64, 0, {n}), pos, b.constant_int(DType::S64, available - 1, {n}));
  Value taken = b.reshape(L::index_select(b, src, 0, clipped), shape);
  Value mf = b.reshape(m, {n});
  Value too_few = L::any_all(b, b.binary("and", mf, b.compare(pos, b.constant_int(DType::S64, source.numel(), {n}), "GE")),
                             {}, false, false);
  op.check_flag(too_few, "aten::masked_scatter: number of true mask elements exceeds the number of source elements");
  return finish(op, b.select(m, taken, x), self.scalar_type(), into);
}
at::Tensor masked_scatter_fn(const at::Tensor& s, const at::Tensor& m, const at::Tensor& src) {
  return masked_scatter_impl(s, m, src, nullptr);
}
at::Tensor& masked_scatter_inplace(at::Tensor& s, const at::Tensor& m, const at::Tensor& src) {
  masked_scatter_impl(s, m, src, &s);
  return s;
}

at::Tensor take_fn(const at::Tensor& self, const at::Tensor& index) {
  TORCH_CHECK_INDEX(index.scalar_type() == at::kLong, "take(): Expected a long tensor for index, but got ", index.scalar_type());
  TORCH_CHECK_INDEX(self.numel() > 0 || index.numel() == 0, "take(): tried to take from an empty tensor");
  OpBuilder op("aten::take");
  auto& b = op.b();
  Value idx = flat_index(b, op.input(index));
  op.check_flag(L::index_out_of_range(b, idx, self.numel()),
                "index out of range in aten::take (numel " + std::to_string(self.numel()) + ")");
  Value flat = b.reshape(op.input(self), {self.numel()});
  if (self.numel() == 0) flat = b.constant(to_ir(self.scalar_type()), 0, {1});
  Value r = b.reshape(L::index_select(b, flat, 0, idx), vec(index.sizes()));
  return finish(op, r, self.scalar_type(), nullptr);
}

at::Tensor put_impl(const at::Tensor& self, const at::Tensor& index, const at::Tensor& source, bool accumulate,
                    const at::Tensor* into) {
  TORCH_CHECK_INDEX(index.scalar_type() == at::kLong, "put_(): Expected a long tensor for index, but got ", index.scalar_type());
  TORCH_CHECK(index.numel() == source.numel(), "put_(): Expected source and index to have the same number of elements, but got source.numel() = ",
              source.numel(), ", index.numel() = ", index.numel());
  OpBuilder op("aten::put");
  auto& b = op.b();
  Value idx = flat_index(b, op.input(index));
  op.check_flag(L::index_out_of_range(b, idx, self.numel()),
                "index out of range in aten::put (numel " + std::to_string(self.numel()) + ")");
  Value flat = b.reshape(op.input(self), {self.numel()});
  Value src = b.convert(b.reshape(op.input(source), {source.numel()}), to_ir(self.scalar_type()));
  Value r = b.reshape(L::index_put(b, flat, {idx}, src, accumulate), vec(self.sizes()));
  return finish(op, r, self.scalar_type(), into);
}
at::Tensor put_fn(const at::Tensor& s, const at::Tensor& i, const at::Tensor& src, bool acc) {
  return put_impl(s, i, src, acc, nullptr);
}
at::Tensor& put_inplace(at::Tensor& s, const at::Tensor& i, const at::Tensor& src, bool acc) {
  put_impl(s, i, src, acc, &s);
  return s;
}

at::Tensor scatter_reduce_impl(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                               c10::string_view reduce, bool include_self, const at::Tensor* into) {
  TORCH_CHECK(reduce == "sum" || reduce == "prod" || reduce == "mean" || reduce == "amax" || reduce == "amin",
              "reduce argument must be either sum, prod, mean, amax or amin, got ", reduce);
  check_scatter("scatter_reduce", self, dim, index, &src);
  TORCH_CHECK(!self.is_complex() || (reduce != "amax" && reduce != "amin"), "scatter_reduce(): reduce=\"", reduce,
              "\" is not implemented for complex tensors (", self.scalar_type(), "): complex numbers are not ordered");
  if (index.numel() == 0) {
    // ATen's rule: an empty index (any shape or dtype) scatters nothing; self unchanged.
    if (!into) return self.clone();
    if (!into->is_same(self)) into->copy_(self);
    return *into;
  }
  TORCH_CHECK(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt,
              "scatter_reduce(): Expected dtype int32/int64 for index");
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  int64_t size = self.dim() == 0 ? 1 : self.size(d);
  OpBuilder op("aten::scatter_reduce");
  auto& b = op.b();
  Value x = op.input(self), idx = op.input(index), s = op.input(src);
  if (self.dim() == 0) {
    // A 0-d self is a 1-element vector; its index and source are (at most) one element too.
    x = b.reshape(x, {1});
    idx = b.reshape(idx, {index.numel()});
    s = b.reshape(b.slice(b.reshape(s, {src.numel()}), {0}, {index.numel()}, {1}), {index.numel()});
  }
  op.check_flag(L::index_out_of_range(b, idx, size), "index out of range in aten::scatter_reduce (size " + std::to_string(size) + ")");
  DType dt = b.dtype(x);
  std::string r(reduce);
  Value base = x;
  if (!include_self) {
    // Scattered positions start from the reduction's identity instead of self.
    Value identity;
    if (r == "sum" || r == "mean") identity = b.constant(dt, 0, b.dims(idx));
    else if (r == "prod") identity = b.constant(dt, 1, b.dims(idx));
    else if (r == "amax") identity = L::lowest(b, dt, b.dims(idx));
    else identity = L::highest(b, dt, b.dims(idx));
    base = L::scatter(b, x, d, idx, identity, "");
  }
  Value out = L::scatter(b, base, d, idx, s, r == "mean" ? "add" : r);
  if (r == "mean") {
    // Counted in a real type (XLA has no maximum of complex numbers), then divided as self's dtype.
    DType count_type = ir::is_complex(dt) ? ir::component_type(dt) : dt;
    Value ones = b.constant(count_type, 1, b.dims(idx));
    Value count = L::scatter(b, b.constant(count_type, include_self ? 1 : 0, b.dims(x)), d, idx, ones, "add");
    count = b.convert(b.binary("maximum", count, b.scalar_like(count, 1)), dt);
    // Complex: Smith's division, as torch's CPU divides (and pjrt's div).
    out = L::binary(b, L::binary_op(ir::is_floating(dt) || ir::is_complex(dt) ? "div" : "div_floor"), out, count, dt, dt);
  }
  if (self.dim() == 0) out = b.reshape(out, {});
  return finish(op, out, self.scalar_type(), into);
}
at::Tensor scatter_reduce_fn(const at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& src,
                             c10::string_view r, bool inc) {
  return scatter_reduce_impl(s, d, i, src, r, inc, nullptr);
}
at::Tensor& scatter_reduce_inplace(at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& src,
                                   c10::string_view r, bool inc) {
  scatter_reduce_impl(s, d, i, src, r, inc, &s);
  return s;
}
at::Tensor& scatter_reduce_out(const at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& src,
                               c10::string_view r, bool inc, at::Tensor& out) {
  scatter_reduce_impl(s, d, i, src, r, inc, &out);
  return out;
}

// scatter with the legacy reduce strings ("add", "multiply"), always including self.
std::string legacy_reduce(c10::string_view reduce) {
  TORCH_CHECK(reduce == "add" || reduce == "multiply", "reduce argument must be either add or multiply, got ", reduce);
  return reduce == "add" ? "sum" : "prod";
}
at::Tensor scatter_reduce_src(const at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& src, c10::string_view r) {
  return scatter_reduce_impl(s, d, i, src, legacy_reduce(r), true, nullptr);
}
at::Tensor& scatter_reduce_src_inplace(at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& src, c10::string_view r) {
  scatter_reduce_impl(s, d, i, src, legacy_reduce(r), true, &s);
  return s;
}
at::Tensor scatter_reduce_value(const at::Tensor& s, int64_t d, const at::Tensor& i, const at::Scalar& v, c10::string_view r) {
  return scatter_reduce_impl(s, d, i, at::full(i.sizes(), v, s.options()), legacy_reduce(r), true, nullptr);
}
at::Tensor& scatter_reduce_value_inplace(at::Tensor& s, int64_t d, const at::Tensor& i, const at::Scalar& v, c10::string_view r) {
  scatter_reduce_impl(s, d, i, at::full(i.sizes(), v, s.options()), legacy_reduce(r), true, &s);
  return s;
}

// index_reduce: scatter_reduce with the index vector broadcast along the other dims.
at::Tensor index_reduce_impl(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source,
                             c10::string_view reduce, bool include_self, const at::Tensor* into) {
  TORCH_CHECK(reduce == "prod" || reduce == "mean" || reduce == "amax" || reduce == "amin",
              "index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got ", reduce, ".");
  check_index_vector("index_reduce", index);
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(source.dim(), 1));
  std::vector<int64_t> shape(std::max<int64_t>(source.dim(), 1), 1);
  shape[d] = index.numel();
  at::Tensor idx = index.to(at::kLong).reshape(shape).expand(source.dim() == 0 ? c10::IntArrayRef(shape) : source.sizes());
  return scatter_reduce_impl(self, d, idx, source.dim() == 0 ? source.reshape({1}) : source, reduce, include_self, into);
}
at::Tensor index_reduce_fn(const at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& src, c10::string_view r,
                           bool inc) {
  return index_reduce_impl(s, d, i, src, r, inc, nullptr);
}

at::Tensor& index_reduce_out(const at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& src, c10::string_view r,
                             bool inc, at::Tensor& out) {
  return write_out("index_reduce", index_reduce_fn(s, d, i, src, r, inc), out);
}

at::Tensor& index_reduce_inplace(at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& src, c10::string_view r,
                                 bool inc) {
  index_reduce_impl(s, d, i, src, r, inc, &s);
  return s;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("cat", cat_fn);
  m.impl("cat.out", cat_out);
  m.impl("index_select", index_select_fn);
  m.impl("index_select.out", index_select_out);
  m.impl("gather", gather_fn);
  m.impl("gather.out", gather_out);
  m.impl("scatter.src", scatter_src);
  m.impl("scatter.src_out", [](const at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& src,
                               at::Tensor& out) -> at::Tensor& { return write_out("scatter", scatter_src(s, d, i, src), out); });
  m.impl("scatter.value_out", [](const at::Tensor& s, int64_t d, const at::Tensor& i, const at::Scalar& v,
                                 at::Tensor& out) -> at::Tensor& { return write_out("scatter", scatter_value(s, d, i, v), out); });
  m.impl("scatter_.src", scatter_src_inplace);
  m.impl("scatter.value", scatter_value);
  m.impl("scatter_.value", scatter_value_inplace);
  m.impl("scatter_add", scatter_add_fn);
  m.impl("scatter_add.out", [](const at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& src,
                               at::Tensor& out) -> at::Tensor& {
    return write_out("scatter_add", scatter_add_fn(s, d, i, src), out);
  });
  m.impl("scatter_add_", scatter_add_inplace);
  m.impl("index.Tensor", index_fn);
  m.impl("nonzero", nonzero_fn);
  m.impl("nonzero.out", nonzero_out);
  m.impl("masked_select", masked_select_fn);
  m.impl("masked_select.out", [](const at::Tensor& s, const at::Tensor& mask, at::Tensor& out) -> at::Tensor& {
    return write_out("masked_select", masked_select_fn(s, mask), out, {s, mask});
  });
  m.impl("_index_put_impl_", index_put_impl);
  m.impl("index_add", index_add_fn);
  m.impl("index_add.out", index_add_out);
  m.impl("index_add_", index_add_inplace);
  m.impl("index_copy", index_copy_fn);
  m.impl("index_copy.out", index_copy_out);
  m.impl("index_copy_", index_copy_inplace);
  m.impl("index_fill.int_Scalar", index_fill_s);
  m.impl("index_fill.int_Tensor", index_fill_t);
  m.impl("index_fill_.int_Scalar", index_fill_s_inplace);
  m.impl("index_fill_.int_Tensor", index_fill_t_inplace);
  m.impl("masked_scatter", masked_scatter_fn);
  m.impl("masked_scatter_", masked_scatter_inplace);
  m.impl("take", take_fn);
  m.impl("take.out", [](const at::Tensor& s, const at::Tensor& i, at::Tensor& out) -> at::Tensor& {
    return write_out("take", take_fn(s, i), out, {s, i});
  });
  m.impl("put", put_fn);
  m.impl("put_", put_inplace);
  m.impl("scatter_reduce.two", scatter_reduce_fn);
  m.impl("scatter_reduce_.two", scatter_reduce_inplace);
  m.impl("scatter_reduce.two_out", scatter_reduce_out);
  m.impl("scatter.reduce", scatter_reduce_src);
  m.impl("scatter.reduce_out", [](const at::Tensor& s, int64_t d, const at::Tensor& i, const at::Tensor& src,
                                  c10::string_view r, at::Tensor& out) -> at::Tensor& {
    return write_out("scatter", scatter_reduce_src(s, d, i, src, r), out);
  });
  m.impl("scatter.value_reduce_out", [](const at::Tensor& s, int64_t d, const at::Tensor& i, const at::Scalar& v,
                                        c10::string_view r, at::Tensor& out) -> at::Tensor& {
    return write_out("scatter", scatter_reduce_value(s, d, i, v, r), out);
  });
  m.impl("scatter_.reduce", scatter_reduce_src_inplace);
  m.impl("scatter.value_reduce", scatter_reduce_value);
  m.impl("scatter_.value_reduce", scatter_reduce_value_inplace);
  m.impl("index_reduce", index_reduce_fn);
  m.impl("index_reduce.out", index_reduce_out);
  m.impl("index_reduce_", index_reduce_inplace);
}

}  // namespace torch_pjrt::device
