// Native kernels for indexing updates (index_add/copy/fill, masked_scatter,
// take/put, scatter_reduce, searchsorted), extra reductions, factories,
// small linear algebra, random distributions and embedding_bag.
#include <ATen/Dispatch_v2.h>
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/native/TypeProperties.h>
#include <torch/library.h>

#include <cstring>

#include "device/context.h"
#include "device/device_name.h"
#include "device/kernel_util.h"
#include "lowering/nn.h"

namespace torch_pjrt::device {
namespace {

using ir::Builder;
using ir::DType;
using ir::Value;
namespace L = lowering;

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

void check_index_dtype(const char* name, const at::Tensor& index) {
  TORCH_CHECK_INDEX(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt, name,
                    "(): Expected dtype int32/int64 for index but got ", index.scalar_type());
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
  check_index_dtype(name, index);
  int64_t rank = std::max<int64_t>(self.dim(), 1);
  int64_t d = at::maybe_wrap_dim(dim, rank);
  int64_t size = self.dim() == 0 ? 1 : self.size(d);
  OpBuilder op(std::string("aten::") + name);
  auto& b = op.b();
  Value x = op.input(self);
  if (self.dim() == 0) x = b.reshape(x, {1});
  Value idx = flat_index(b, op.input(index));
  op.check_flag(L::index_out_of_range(b, idx, size),
                std::string("index out of range in aten::") + name + " (dimension size " + std::to_string(size) + ")");
  auto perm = front_perm(rank, d);
  Value xt = b.transpose(x, perm);
  std::vector<int64_t> rows_shape = b.dims(xt);
  rows_shape[0] = b.type(idx).numel();
  Value v = b.convert(values(op, x, rows_shape), b.dtype(x));
  Value r = b.transpose(L::index_put(b, xt, {idx}, v, accumulate), inverse_perm(perm));
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
    out = L::binary(b, ir::is_floating(dt) || ir::is_complex(dt) ? "div" : "div_floor", out, count, dt, dt);
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
  check_index_dtype("index_reduce", index);
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
// ---------------------------------------------------------------- segment_reduce
// Segments along `axis` given by lengths (or offsets), per leading index: compositions of
// native kernels (searchsorted for each position's segment, then scatter_reduce / gather).
struct Segments {
  int64_t axis;
  at::Tensor lengths;  // [lead..., S] long
  at::Tensor index;    // data's shape: each element's segment
  at::Tensor valid;    // data's shape: inside some segment (unsafe lengths may fall short)
  std::vector<int64_t> out_shape;
};
Segments segments_of(const at::Tensor& data, const std::optional<at::Tensor>& lengths,
                     const std::optional<at::Tensor>& offsets, int64_t axis, bool unsafe) {
  bool by_lengths = lengths && lengths->defined(), by_offsets = offsets && offsets->defined();
  TORCH_CHECK(by_lengths || by_offsets, "segment_reduce(): Either lengths or offsets must be defined.");
  Segments s;
  s.axis = at::maybe_wrap_dim(axis, data.dim());
  // Segment bounds [lead..., S + 1]: the offsets, or 0 and the lengths' running sums.
  at::Tensor bounds;
  if (by_lengths) {
    s.lengths = lengths->to(at::kLong);
    std::vector<int64_t> first = s.lengths.sizes().vec();
    first.back() = 1;
    bounds = at::cat({at::zeros(first, s.lengths.options()), at::cumsum(s.lengths, -1)}, -1);
  } else {
    bounds = offsets->to(at::kLong);
    s.lengths = bounds.slice(-1, 1) - bounds.slice(-1, 0, bounds.size(-1) - 1);
  }
  TORCH_CHECK(s.lengths.dim() == s.axis + 1, "segment_reduce(): Expected ", by_lengths ? "lengths" : "offsets",
              " to have ", s.axis + 1, " dims (the data's before axis and one for the segments), got ", s.lengths.dim());
  if (!unsafe && by_lengths) {
    // One host read, as CPU's checks (it has none for offsets).
    TORCH_CHECK((s.lengths >= 0).all().item<bool>(), "lengths contains negative value!");
    TORCH_CHECK((s.lengths.sum(-1) == data.size(s.axis)).all().item<bool>(),
                "segment_reduce(): Expected all rows of lengths along axis to sum to data.size(lengths.dim()-1) when !unsafe.");
  }
  int64_t segments = s.lengths.size(-1), positions = data.size(s.axis);
  std::vector<int64_t> lead(data.sizes().begin(), data.sizes().begin() + s.axis), pos_shape = lead;
  pos_shape.push_back(positions);
  at::Tensor pos = at::arange(positions, s.lengths.options()).expand(pos_shape).contiguous();
  at::Tensor seg = at::searchsorted(bounds.contiguous(), pos, /*out_int32=*/false, /*right=*/true) - 1;
  std::vector<int64_t> view = pos_shape;
  view.resize(data.dim(), 1);
  s.valid = ((seg >= 0) & (seg < segments)).reshape(view).expand(data.sizes());
  s.index = seg.clamp(0, std::max<int64_t>(segments - 1, 0)).reshape(view).expand(data.sizes());
  s.out_shape = data.sizes().vec();
  s.out_shape[s.axis] = segments;
  return s;
}

// torch's reduction names: "amax"/"amin" are "max"/"min".
c10::string_view segment_reduction(c10::string_view reduce) {
  if (reduce == "amax") return "max";
  if (reduce == "amin") return "min";
  return reduce;
}

double segment_identity(c10::string_view reduce) {
  if (reduce == "prod") return 1.0;
  if (reduce == "max") return -INFINITY;
  if (reduce == "min") return INFINITY;
  TORCH_CHECK(reduce == "sum" || reduce == "mean", "segment_reduce(): unsupported reduction ", reduce);
  return 0.0;
}

// Per-segment lengths broadcast to the output's shape (as the data's dtype).
at::Tensor segment_counts(const Segments& s, const at::Tensor& data) {
  std::vector<int64_t> view(s.lengths.sizes().begin(), s.lengths.sizes().end());
  view.resize(data.dim(), 1);
  return s.lengths.to(data.scalar_type()).reshape(view).expand(s.out_shape);
}

at::Tensor segment_reduce_fn(const at::Tensor& data, c10::string_view reduce, const std::optional<at::Tensor>& lengths,
                             const std::optional<at::Tensor>& indices, const std::optional<at::Tensor>& offsets,
                             int64_t axis, bool unsafe, const std::optional<at::Scalar>& initial) {
  TORCH_CHECK(!indices || !indices->defined(), "segment_reduce(): indices based reduction is not supported yet.");
  reduce = segment_reduction(reduce);
  double identity = segment_identity(reduce);
  Segments s = segments_of(data, lengths, offsets, axis, unsafe);
  at::Tensor start = at::full(s.out_shape, initial ? *initial : at::Scalar(identity), data.options());
  at::Tensor src = at::where(s.valid, data, at::scalar_tensor(identity, data.options()));
  const char* op = reduce == "max" ? "amax" : reduce == "min" ? "amin" : reduce == "prod" ? "prod" : "sum";
  at::Tensor out = start.scatter_reduce(s.axis, s.index, src, op, /*include_self=*/true);
  if (reduce == "mean") {
    // (initial + sum) / length; an empty segment keeps `initial`, else NaN.
    at::Tensor count = segment_counts(s, data);
    at::Tensor empty = at::scalar_tensor(initial ? initial->toDouble() : NAN, data.options());
    out = at::where(count > 0, out / count, empty);
  }
  return out;
}

at::Tensor segment_reduce_backward_fn(const at::Tensor& grad, const at::Tensor& output, const at::Tensor& data,
                                      c10::string_view reduce, const std::optional<at::Tensor>& lengths,
                                      const std::optional<at::Tensor>& offsets, int64_t axis,
                                      const std::optional<at::Scalar>& initial) {
  reduce = segment_reduction(reduce);
  segment_identity(reduce);
  Segments s = segments_of(data, lengths, offsets, axis, /*unsafe=*/true);
  at::Tensor g = grad.gather(s.axis, s.index), o = output.gather(s.axis, s.index);
  at::Tensor zero = at::zeros({}, data.options()), zeros = at::zeros(s.out_shape, data.options());
  at::Tensor gi;
  if (reduce == "sum") {
    gi = g;
  } else if (reduce == "mean") {
    gi = g / segment_counts(s, data).gather(s.axis, s.index);
  } else if (reduce == "max" || reduce == "min") {
    // To the elements equal to the result (NaNs, where it is NaN). CPU's rule for ties:
    // a positive gradient is split equally among them, any other goes whole to each.
    at::Tensor hit = ((data == o) | (at::isnan(data) & at::isnan(o))) & s.valid;
    at::Tensor ties = zeros.scatter_add(s.axis, s.index, hit.to(data.scalar_type())).gather(s.axis, s.index);
    gi = at::where(hit, at::where(g > 0, g / ties, g), zero);
  } else {
    // prod: g * output / x, except at zeros and NaNs, whose gradient is the product of the
    // segment's other entries (and initial): that product is the non-special entries' when
    // x is the only special one, else 0 -- or NaN when another special entry is NaN or an
    // infinity meets the other zero.
    at::Tensor nan = at::isnan(data) & s.valid;
    at::Tensor special = ((data == 0) & s.valid) | nan;
    at::Tensor ones = at::ones({}, data.options());
    at::Tensor plain = at::where(special | ~s.valid, ones, data);
    at::Tensor others = at::full(s.out_shape, initial ? *initial : at::Scalar(1.0), data.options())
                            .scatter_reduce(s.axis, s.index, plain, "prod", /*include_self=*/true)
                            .gather(s.axis, s.index);
    at::Tensor specials = zeros.scatter_add(s.axis, s.index, special.to(data.scalar_type())).gather(s.axis, s.index);
    at::Tensor nans = zeros.scatter_add(s.axis, s.index, nan.to(data.scalar_type())).gather(s.axis, s.index);
    at::Tensor infs = zeros.scatter_add(s.axis, s.index, (at::isinf(data) & s.valid).to(data.scalar_type()))
                          .gather(s.axis, s.index);
    at::Tensor undefined = (nans - nan.to(data.scalar_type()) > 0) | (infs > 0);
    at::Tensor exclusive = at::where(specials == 1, others,
                                     at::where(undefined, at::scalar_tensor(NAN, data.options()), zero));
    gi = at::where(special, g * exclusive, g * o / data);
  }
  return at::where(s.valid, gi, zero);
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

// searchsorted / bucketize's out= tensor has exactly the index dtype out_int32 asks for.
void check_search_out(const char* name, const at::Tensor& out, bool out_int32) {
  TORCH_CHECK(out.scalar_type() == (out_int32 ? at::kInt : at::kLong), "torch.", name,
              "(): output tensor's dtype is wrong, it can only be Int(int32) or Long(int64) depending on whether out_int32 "
              "flag is True, but we got output tensor's dtype ", out.scalar_type(), " and out_int32 flag is ",
              out_int32 ? "True" : "False");
}

// searchsorted / bucketize: ATen's binary search (lowering::searchsorted).
at::Tensor searchsorted_impl(const at::Tensor& sorted, const at::Tensor& values, bool out_int32, bool right,
                             std::optional<c10::string_view> side, const std::optional<at::Tensor>& sorter) {
  if (side) {
    TORCH_CHECK(*side == "left" || *side == "right", "torch.searchsorted(): side can only be 'left' or 'right' but got ", *side);
    TORCH_CHECK(!right || *side == "right", "torch.searchsorted(): side and right can't be set to opposites, got side of ",
                *side, " while right was True");
    right = *side == "right";
  }
  TORCH_CHECK(sorted.dim() > 0, "torch.searchsorted(): boundaries tensor should have positive dimension, but got 0 dimension");
  TORCH_CHECK(sorted.dim() == 1 || !values.unsafeGetTensorImpl()->is_wrapped_number(),
              "torch.searchsorted(): input value can be a scalar only when boundaries tensor dimension is 1, but we got "
              "boundaries tensor dim(", sorted.dim(), ") and input value's dim(", values.dim(), ") numel(", values.numel(), ")");
  TORCH_CHECK(sorted.dim() == 1 || (sorted.dim() == values.dim() &&
                                    sorted.sizes().slice(0, sorted.dim() - 1).equals(values.sizes().slice(0, values.dim() - 1))),
              "torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 dimensions of boundaries tensor and input value tensor must match, but we got boundaries tensor ",
              sorted.sizes(), " and input value tensor ", values.sizes());
  // As ATen warns: a strided operand is gathered into order first, a copy the caller can save.
  for (auto [t, what] : {std::pair<const at::Tensor*, const char*>{&values, "input value"}, {&sorted, "boundary"},
                         {sorter && sorter->defined() ? &*sorter : nullptr, "sorter"}}) {
    if (t && !t->is_contiguous()) {
      TORCH_WARN_ONCE("torch.searchsorted(): ", what, " tensor is non-contiguous: pjrt reads it through a strided copy; "
                      "a contiguous ", what, " tensor saves it. This message appears once per program.");
    }
  }
  if (sorter && sorter->defined()) {
    TORCH_CHECK(sorter->sizes() == sorted.sizes(), "torch.searchsorted(): boundary and sorter must have the same size, but "
                "got boundary tensor ", sorted.sizes(), " and got sorter tensor ", sorter->sizes());
    TORCH_CHECK(sorter->scalar_type() == at::kLong, "torch.searchsorted(): sorter must be a tensor of long dtype but got dtype ",
                sorter->scalar_type());
    if (sorter->numel() > 0) {  // one host read, as ATen's own check reads it
      auto [lo, hi] = at::aminmax(*sorter);
      TORCH_CHECK(lo.item<int64_t>() >= 0 && hi.item<int64_t>() < sorted.size(-1), "torch.searchsorted(): sorter index out of range");
    }
  }
  OpBuilder op("aten::searchsorted");
  auto& b = op.b();
  at::ScalarType common = at::promote_types(sorted.scalar_type(), values.scalar_type());
  Value seq = b.convert(op.input(sorted), to_ir(common));
  if (sorter && sorter->defined()) seq = L::gather(b, seq, sorted.dim() - 1, op.input(*sorter));
  Value v = b.convert(op.input(values), to_ir(common));
  Value count = L::searchsorted(b, seq, v, right);
  at::ScalarType out = out_int32 ? at::kInt : at::kLong;
  return finish(op, b.convert(count, to_ir(out)), out, nullptr);
}
at::Tensor searchsorted_fn(const at::Tensor& seq, const at::Tensor& v, bool i32, bool right,
                           std::optional<c10::string_view> side, const std::optional<at::Tensor>& sorter) {
  return searchsorted_impl(seq, v, i32, right, side, sorter);
}
at::Tensor searchsorted_scalar_fn(const at::Tensor& seq, const at::Scalar& v, bool i32, bool right,
                                  std::optional<c10::string_view> side, const std::optional<at::Tensor>& sorter) {
  return searchsorted_impl(seq, scalar_tensor_like(v), i32, right, side, sorter);
}
at::Tensor bucketize_fn(const at::Tensor& self, const at::Tensor& boundaries, bool i32, bool right) {
  TORCH_CHECK(boundaries.dim() == 1, "boundaries tensor must be 1 dimension, but got dim(", boundaries.dim(), ")");
  return searchsorted_impl(boundaries, self, i32, right, std::nullopt, std::nullopt);
}
at::Tensor bucketize_scalar_fn(const at::Scalar& self, const at::Tensor& boundaries, bool i32, bool right) {
  return bucketize_fn(scalar_tensor_like(self), boundaries, i32, right);
}

// isin: every element compared with every test element (no host sync, no sort).
at::Tensor isin_impl(const at::Tensor& elements, const at::Tensor& test, bool invert, const at::Tensor* into) {
  OpBuilder op("aten::isin");
  auto& b = op.b();
  at::ScalarType common = at::promote_types(elements.scalar_type(), test.scalar_type());
  int64_t n = elements.numel(), m = test.numel();
  Value e = b.reshape(b.convert(op.input(elements), to_ir(common)), {n});
  Value t = b.reshape(b.convert(op.input(test), to_ir(common)), {m});
  Value eq = b.compare(b.broadcast_in_dim(e, {n, m}, {0}), b.broadcast_in_dim(t, {n, m}, {1}), "EQ");
  Value found = m == 0 ? b.constant_int(DType::Pred, 0, {n}) : L::any_all(b, eq, {1}, false, false);
  if (invert) found = b.unary("not", found);
  return finish(op, b.reshape(found, vec(elements.sizes())), at::kBool, into);
}
at::Tensor isin_tt(const at::Tensor& e, const at::Tensor& t, bool, bool inv) { return isin_impl(e, t, inv, nullptr); }
at::Tensor& isin_tt_out(const at::Tensor& e, const at::Tensor& t, bool, bool inv, at::Tensor& out) {
  isin_impl(e, t, inv, &out);
  return out;
}
at::Tensor isin_ts(const at::Tensor& e, const at::Scalar& t, bool, bool inv) {
  return isin_impl(e, scalar_tensor_like(t), inv, nullptr);
}
at::Tensor isin_st(const at::Scalar& e, const at::Tensor& t, bool, bool inv) {
  return isin_impl(at::scalar_tensor(e, t.options().device(at::kCPU).dtype(e.type())), t, inv, nullptr);
}

// ---------------------------------------------------------------- reductions


at::Tensor nansum_impl(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim,
                       std::optional<at::ScalarType> dtype, const at::Tensor* into) {
  const at::ScalarType natural = at::isIntegralType(self.scalar_type(), true) ? at::kLong : self.scalar_type();
  at::ScalarType out = dtype ? *dtype : (into ? into->scalar_type() : natural);
  if (into) {
    // As ATen: an explicit dtype must be out's, and out's must hold the input's values
    // (a float input summed into an integer out is refused, not truncated).
    TORCH_CHECK(!dtype || *dtype == into->scalar_type(), "nansum: provided dtype must match dtype of result. Got ",
                into->scalar_type(), " and ", *dtype, ".");
    out_dtype("nansum", self.scalar_type(), *into);
  }
  OpBuilder op("aten::nansum");
  auto& b = op.b();
  Value x = op.input(self);
  if (ir::is_floating(b.dtype(x))) x = b.select(b.compare(x, x, "NE"), b.scalar_like(x, 0), x);
  Value r = L::sum(b, x, reduce_dims(self, dims), keepdim && self.dim() > 0, to_ir(out));
  return finish(op, r, out, into);
}
at::Tensor nansum_fn(const at::Tensor& s, at::OptionalIntArrayRef d, bool k, std::optional<at::ScalarType> t) {
  return nansum_impl(s, d, k, t, nullptr);
}
at::Tensor& nansum_out(const at::Tensor& s, at::OptionalIntArrayRef d, bool k, std::optional<at::ScalarType> t,
                       at::Tensor& out) {
  nansum_impl(s, d, k, t, &out);
  return out;
}

std::tuple<at::Tensor, at::Tensor> moments(const char* name, const at::Tensor& self, at::OptionalIntArrayRef dims,
                                           const std::optional<at::Scalar>& correction, bool keepdim, bool take_sqrt) {
  TORCH_CHECK(at::isFloatingType(self.scalar_type()) || at::isComplexType(self.scalar_type()), name,
              ": only supports floating point and complex dtypes, got ", self.scalar_type());
  OpBuilder op(std::string("aten::") + name);
  auto& b = op.b();
  Value x = op.input(self);
  auto d = reduce_dims(self, dims);
  bool kd = keepdim && self.dim() > 0;
  DType dt = to_ir(self.scalar_type());
  at::ScalarType real = c10::toRealValueType(self.scalar_type());
  const double corr = correction ? correction->toDouble() : 1.0;
  warn_degrees_of_freedom(name, self, d, corr);
  Value v = L::var(b, x, d, corr, kd, to_ir(real));
  if (take_sqrt) v = b.unary("sqrt", v);
  Value m = L::mean(b, x, d, kd, dt);
  at::Tensor first = op.output(v, real);
  at::Tensor second = op.output(m, self.scalar_type());
  op.run();
  return {first, second};
}
std::tuple<at::Tensor, at::Tensor> std_mean_fn(const at::Tensor& s, at::OptionalIntArrayRef d,
                                               const std::optional<at::Scalar>& c, bool k) {
  return moments("std_mean", s, d, c, k, true);
}
std::tuple<at::Tensor, at::Tensor> var_mean_fn(const at::Tensor& s, at::OptionalIntArrayRef d,
                                               const std::optional<at::Scalar>& c, bool k) {
  return moments("var_mean", s, d, c, k, false);
}

std::tuple<at::Tensor, at::Tensor> aminmax_fn(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim) {
  TORCH_CHECK(!at::isComplexType(self.scalar_type()), "aminmax not implemented for ", self.scalar_type());
  TORCH_CHECK(self.dim() <= 64, "aminmax(): only tensors with up to 64 dims are supported, got ", self.dim());
  TORCH_CHECK(self.numel() > 0 || dim, "aminmax(): cannot compute aminmax over an empty dimension as the operation has no identity.");
  OpBuilder op("aten::aminmax");
  auto& b = op.b();
  Value x = op.input(self);
  std::vector<int64_t> d;
  if (dim && self.dim() > 0) {
    d.push_back(at::maybe_wrap_dim(*dim, self.dim()));
    check_reduction_dim_nonempty("aminmax", self, d[0]);
  }
  bool kd = keepdim && self.dim() > 0;
  Value lo = L::amax(b, x, d, kd, false), hi = L::amax(b, x, d, kd, true);
  if (!dim && keepdim) {
    lo = b.reshape(lo, std::vector<int64_t>(self.dim(), 1));
    hi = b.reshape(hi, std::vector<int64_t>(self.dim(), 1));
  }
  at::Tensor mn = op.output(lo, self.scalar_type());
  at::Tensor mx = op.output(hi, self.scalar_type());
  op.run();
  return {mn, mx};
}

at::Tensor count_nonzero_fn(const at::Tensor& self, c10::IntArrayRef dims) {
  OpBuilder op("aten::count_nonzero");
  auto& b = op.b();
  Value x = op.input(self);
  Value nz = b.convert(b.compare(x, b.scalar_like(x, 0), "NE"), DType::S64);
  return finish(op, L::sum(b, nz, reduce_dims(self, dims), false, DType::S64), at::kLong, nullptr);
}

// mode along dim: the most frequent value (the smallest among equally frequent ones) and the
// index of its last occurrence, like the CPU kernel. O(n^2) comparisons per row.
std::tuple<at::Tensor, at::Tensor> mode_fn(const at::Tensor& self, int64_t dim, bool keepdim) {
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  check_reduction_dim_nonempty("mode", self, d);
  OpBuilder op("aten::mode");
  auto& b = op.b();
  Value x = op.input(self);
  if (self.dim() == 0) x = b.reshape(x, {1});
  // Move dim last: [R, n].
  auto xd = b.dims(x);
  int64_t rank = static_cast<int64_t>(xd.size()), n = xd[d];
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < rank; ++i) {
    if (i != d) perm.push_back(i);
  }
  perm.push_back(d);
  Value xt = b.transpose(x, perm);
  std::vector<int64_t> rest(b.dims(xt).begin(), b.dims(xt).end() - 1);
  int64_t rows = 1;
  for (int64_t r : rest) rows *= r;
  Value flat = b.reshape(xt, {rows, n});
  Value eq = b.compare(b.broadcast_in_dim(flat, {rows, n, n}, {0, 1}), b.broadcast_in_dim(flat, {rows, n, n}, {0, 2}), "EQ");
  Value count = L::sum(b, b.convert(eq, DType::S64), {2}, false, DType::S64);  // [rows, n]
  Value best = b.broadcast_in_dim(L::amax(b, count, {1}, false, true), {rows, n}, {0});
  Value candidate = b.compare(count, best, "EQ");
  Value value = L::amax(b, b.select(candidate, flat, L::highest(b, b.dtype(flat), {rows, n})), {1}, false, false);
  Value at_value = b.compare(flat, b.broadcast_in_dim(value, {rows, n}, {0}), "EQ");
  Value pos = b.select(at_value, b.iota(DType::S64, {rows, n}, 1), b.constant_int(DType::S64, -1, {rows, n}));
  Value index = L::amax(b, pos, {1}, false, true);
  std::vector<int64_t> shape = vec(self.sizes());
  if (self.dim() > 0) {
    if (keepdim) shape[d] = 1;
    else shape.erase(shape.begin() + d);
  }
  at::Tensor values = op.output(b.reshape(value, shape), self.scalar_type());
  at::Tensor indices = op.output(b.reshape(index, shape), at::kLong);
  op.run();
  return {values, indices};
}

std::tuple<at::Tensor&, at::Tensor&> mode_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& values,
                                              at::Tensor& indices) {
  // mode's outs take its result types exactly (ATen's wording).
  for (auto [out, want, name] : {std::tuple<const at::Tensor&, at::ScalarType, const char*>{values, self.scalar_type(), "values"},
                                 {indices, at::kLong, "indices"}}) {
    TORCH_CHECK(out.scalar_type() == want, "mode(): expected scalar type '", want, "' but got '", out.scalar_type(),
                "' for ", name, " output");
  }
  auto [v, i] = mode_fn(self, dim, keepdim);
  write_outs("mode", {v, i}, {values, indices});
  return {values, indices};
}

at::Tensor trace_fn(const at::Tensor& self) {
  TORCH_CHECK(self.dim() == 2, "trace: expected a matrix, but got tensor with dim ", self.dim());
  OpBuilder op("aten::trace");
  auto& b = op.b();
  Value x = op.input(self);
  auto shape = b.dims(x);
  Value diag = b.compare(b.iota(DType::S64, shape, 0), b.iota(DType::S64, shape, 1), "EQ");
  at::ScalarType out = at::isIntegralType(self.scalar_type(), true) ? at::kLong : self.scalar_type();
  Value r = L::sum(b, b.select(diag, x, b.scalar_like(x, 0)), {}, false, to_ir(out));
  return finish(op, r, out, nullptr);
}

// ---------------------------------------------------------------- linear algebra

// beta * self + alpha * product; beta == 0 ignores self (NaN included), as torch does.
Value scaled_sum(OpBuilder& op, const at::Tensor& self, Value product, const at::Scalar& beta, const at::Scalar& alpha,
                 at::ScalarType t) {
  auto& b = op.b();
  auto shape = b.dims(product);
  Value r = b.binary("multiply", product, b.broadcast_to(op.scalar(alpha, t), shape));
  if (beta.toComplexDouble() == 0.0) return r;
  Value s = b.broadcast_to(b.convert(op.input(self), to_ir(t)), shape);
  return b.binary("add", r, b.binary("multiply", s, b.broadcast_to(op.scalar(beta, t), shape)));
}

at::Tensor addbmm_impl(const at::Tensor& self, const at::Tensor& b1, const at::Tensor& b2, const at::Scalar& beta,
                       const at::Scalar& alpha, const at::Tensor* into) {
  TORCH_CHECK(b1.dim() == 3 && b2.dim() == 3, "batch1 and batch2 must be 3D tensors");
  TORCH_CHECK(b1.size(0) == b2.size(0) && b1.size(2) == b2.size(1), "addbmm: incompatible batch matrices ", b1.sizes(),
              " and ", b2.sizes());
  OpBuilder op("aten::addbmm");
  auto& b = op.b();
  at::ScalarType t = self.scalar_type();
  // Contract over the batch and the inner dim at once.
  Value p = b.dot_general(op.input(b1), op.input(b2), {}, {}, {0, 2}, {0, 1}, to_ir(t));
  return finish(op, scaled_sum(op, self, p, beta, alpha, t), t, into);
}
at::Tensor addbmm_fn(const at::Tensor& s, const at::Tensor& a, const at::Tensor& c, const at::Scalar& be,
                     const at::Scalar& al) {
  return addbmm_impl(s, a, c, be, al, nullptr);
}
at::Tensor& addbmm_out(const at::Tensor& s, const at::Tensor& a, const at::Tensor& c, const at::Scalar& be,
                       const at::Scalar& al, at::Tensor& out) {
  addbmm_impl(s, a, c, be, al, &out);
  return out;
}
at::Tensor& addbmm_inplace(at::Tensor& s, const at::Tensor& a, const at::Tensor& c, const at::Scalar& be,
                           const at::Scalar& al) {
  addbmm_impl(s, a, c, be, al, &s);
  return s;
}

at::Tensor addr_impl(const at::Tensor& self, const at::Tensor& v1, const at::Tensor& v2, const at::Scalar& beta,
                     const at::Scalar& alpha, const at::Tensor* into) {
  TORCH_CHECK(v1.dim() == 1 && v2.dim() == 1, "addr: Expected 1-D argument vec1 and vec2, but got ", v1.dim(), "-D and ",
              v2.dim(), "-D");
  OpBuilder op("aten::addr");
  auto& b = op.b();
  at::ScalarType t = at::native::result_type(std::vector<at::Tensor>{self, v1, v2});
  if (into) t = out_dtype("addr", t, *into);
  std::vector<int64_t> shape{v1.size(0), v2.size(0)};
  Value a = b.broadcast_in_dim(b.convert(op.input(v1), to_ir(t)), shape, {0});
  Value c = b.broadcast_in_dim(b.convert(op.input(v2), to_ir(t)), shape, {1});
  Value p = t == at::kBool ? b.binary("and", a, c) : b.binary("multiply", a, c);
  if (t == at::kBool) {
    Value s = b.broadcast_to(op.input(self), shape);
    Value r = beta.toBool() ? b.binary("or", s, p) : p;
    return finish(op, alpha.toBool() ? r : (beta.toBool() ? s : b.constant_int(DType::Pred, 0, shape)), t, into);
  }
  return finish(op, scaled_sum(op, self, p, beta, alpha, t), t, into);
}
at::Tensor addr_fn(const at::Tensor& s, const at::Tensor& a, const at::Tensor& c, const at::Scalar& be,
                   const at::Scalar& al) {
  return addr_impl(s, a, c, be, al, nullptr);
}
at::Tensor& addr_out(const at::Tensor& s, const at::Tensor& a, const at::Tensor& c, const at::Scalar& be,
                     const at::Scalar& al, at::Tensor& out) {
  addr_impl(s, a, c, be, al, &out);
  return out;
}

at::Tensor linalg_cross_fn(const at::Tensor& self, const at::Tensor& other, int64_t dim) {
  TORCH_CHECK(self.dim() == other.dim(), "linalg.cross: inputs must have the same number of dimensions.");
  auto shape = at::infer_size(self.sizes(), other.sizes());
  int64_t d = at::maybe_wrap_dim(dim, static_cast<int64_t>(shape.size()));
  TORCH_CHECK(self.size(d) == 3 && other.size(d) == 3, "linalg.cross: inputs dimension ", dim, " must have length 3. Got ",
              self.size(d), " and ", other.size(d));
  OpBuilder op("aten::linalg_cross");
  auto& b = op.b();
  at::ScalarType t = at::result_type(self, other);
  Value x = b.broadcast_to(b.convert(op.input(self), to_ir(t)), vec(shape));
  Value y = b.broadcast_to(b.convert(op.input(other), to_ir(t)), vec(shape));
  auto comp = [&](Value v, int64_t i) { return b.slice_dim(v, d, i, i + 1); };
  auto term = [&](int64_t i, int64_t j) {
    return b.binary("subtract", b.binary("multiply", comp(x, i), comp(y, j)), b.binary("multiply", comp(x, j), comp(y, i)));
  };
  Value r = b.concatenate({term(1, 2), term(2, 0), term(0, 1)}, d);
  return finish(op, r, t, nullptr);
}

at::Tensor stack_fn(at::TensorList tensors, int64_t dim) {
  TORCH_CHECK(!tensors.empty(), "stack expects a non-empty TensorList");
  for (const auto& t : tensors) {
    TORCH_CHECK(t.sizes().equals(tensors[0].sizes()), "stack expects each tensor to be equal size, but got ",
                tensors[0].sizes(), " at entry 0 and ", t.sizes(), " at entry ", &t - tensors.data());
  }
  int64_t d = at::maybe_wrap_dim(dim, tensors[0].dim() + 1);
  OpBuilder op("aten::stack");
  auto& b = op.b();
  at::ScalarType t = at::native::result_type(tensors);
  std::vector<int64_t> one = vec(tensors[0].sizes());
  one.insert(one.begin() + d, 1);
  std::vector<Value> parts;
  for (const auto& x : tensors) parts.push_back(b.reshape(b.convert(op.input(x), to_ir(t)), one));
  return finish(op, b.concatenate(parts, d), t, nullptr);
}

// Functional scatters of a view (used by functionalization and autograd): copy into a clone's view.
at::Tensor slice_scatter_fn(const at::Tensor& self, const at::Tensor& src, int64_t dim, std::optional<int64_t> start,
                            std::optional<int64_t> end, int64_t step) {
  at::Tensor out = self.clone();
  out.slice(dim, start, end, step).copy_(src);
  return out;
}
at::Tensor select_scatter_fn(const at::Tensor& self, const at::Tensor& src, int64_t dim, int64_t index) {
  at::Tensor out = self.clone();
  out.select(dim, index).copy_(src);
  return out;
}
at::Tensor diagonal_scatter_fn(const at::Tensor& self, const at::Tensor& src, int64_t offset, int64_t d1, int64_t d2) {
  at::Tensor out = self.clone();
  out.diagonal(offset, d1, d2).copy_(src);
  return out;
}
at::Tensor as_strided_scatter_fn(const at::Tensor& self, const at::Tensor& src, c10::IntArrayRef size,
                                 c10::IntArrayRef stride, std::optional<int64_t> offset) {
  at::Tensor out = self.clone();
  out.as_strided(size, stride, offset).copy_(src);
  return out;
}

// Small compositions of native kernels (each step runs on the device).
at::Tensor rsub_fn(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  return at::sub(other, self, alpha);
}
at::Tensor rsub_scalar_fn(const at::Tensor& self, const at::Scalar& other, const at::Scalar& alpha) {
  return at::sub(scalar_tensor_like(other), self, alpha);
}
bool equal_fn(const at::Tensor& self, const at::Tensor& other) {
  if (!self.sizes().equals(other.sizes())) return false;
  return at::eq(self, other).all().item<bool>();  // one host sync, like CPU's answer
}
at::Tensor vdot_fn(const at::Tensor& self, const at::Tensor& other) {
  return at::dot(self.conj(), other);  // conjugates its first argument (dot reads the lazy conj bit)
}

at::Tensor round_decimals_impl(const at::Tensor& self, int64_t decimals, const at::Tensor* into) {
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "round_decimals: only floating point inputs are supported, got ",
              self.scalar_type());
  OpBuilder op("aten::round.decimals");
  auto& b = op.b();
  Value x = op.input(self);
  Value ten_pow = b.scalar_like(x, std::pow(10.0, static_cast<double>(std::abs(decimals))));
  Value r = decimals > 0 ? b.binary("divide", b.unary("round_nearest_even", b.binary("multiply", x, ten_pow)), ten_pow)
                         : b.binary("multiply", b.unary("round_nearest_even", b.binary("divide", x, ten_pow)), ten_pow);
  return finish(op, r, self.scalar_type(), into);
}
at::Tensor round_decimals_fn(const at::Tensor& s, int64_t d) { return round_decimals_impl(s, d, nullptr); }
at::Tensor& round_decimals_out(const at::Tensor& s, int64_t d, at::Tensor& out) {
  round_decimals_impl(s, d, &out);
  return out;
}
at::Tensor& round_decimals_inplace(at::Tensor& s, int64_t d) {
  round_decimals_impl(s, d, &s);
  return s;
}

// Backward of Tensor.unfold: every window element adds its gradient back to its source position.
at::Tensor unfold_backward_fn(const at::Tensor& grad, c10::IntArrayRef input_sizes, int64_t dim, int64_t size, int64_t step) {
  int64_t rank = static_cast<int64_t>(input_sizes.size());
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(rank, 1));
  OpBuilder op("aten::unfold_backward");
  auto& b = op.b();
  Value g = op.input(grad);
  if (rank == 0) return finish(op, b.reshape(g, {}), grad.scalar_type(), nullptr);
  // Overlap-add: window w's element k lands at w * step + k. Windows padded to
  // r = ceil(size / step) blocks of `step` put block j of window w at block
  // w + j, so the result is r shifted copies summed: O(r * elements), no
  // [in x windows*size] matrix (an istft has 10^5 windows' worth).
  int64_t windows = grad.size(d);
  int64_t blocks = (size + step - 1) / step;
  std::vector<int64_t> perm;  // [rest..., windows, size]
  for (int64_t i = 0; i < rank; ++i)
    if (i != d) perm.push_back(i);
  perm.push_back(d);
  perm.push_back(rank);
  g = b.convert(b.transpose(g, perm), L::accumulate_type(b.dtype(g)));
  std::vector<int64_t> shape = b.dims(g);
  int64_t lead = rank - 1;
  std::vector<int64_t> zeros(shape.size(), 0), high(shape.size(), 0);
  high.back() = blocks * step - size;
  g = b.pad(g, b.constant(b.dtype(g), 0), zeros, high, zeros);
  std::vector<int64_t> split(shape.begin(), shape.end() - 1);
  split.push_back(blocks);
  split.push_back(step);
  g = b.reshape(g, split);  // [rest..., windows, blocks, step]
  Value sum;
  for (int64_t j = 0; j < blocks; ++j) {
    Value piece = b.reshape(b.slice_dim(g, lead + 1, j, j + 1), [&] {
      std::vector<int64_t> s2(split);
      s2.erase(s2.begin() + lead + 1);
      return s2;
    }());
    std::vector<int64_t> lo(lead + 2, 0), hi(lead + 2, 0), in0(lead + 2, 0);
    lo[lead] = j;
    hi[lead] = blocks - 1 - j;
    piece = b.pad(piece, b.constant(b.dtype(piece), 0), lo, hi, in0);
    sum = sum.valid() ? b.binary("add", sum, piece) : piece;
  }
  std::vector<int64_t> flat(shape.begin(), shape.begin() + lead);
  int64_t covered = (windows + blocks - 1) * step;
  flat.push_back(covered);
  Value r = b.reshape(sum, flat);
  int64_t in = input_sizes[d];
  if (covered > in) {
    r = b.slice_dim(r, lead, 0, in);
  } else if (covered < in) {
    std::vector<int64_t> lo(lead + 1, 0), hi(lead + 1, 0), in0(lead + 1, 0);
    hi[lead] = in - covered;
    r = b.pad(r, b.constant(b.dtype(r), 0), lo, hi, in0);
  }
  std::vector<int64_t> back;  // move the last dim to d
  for (int64_t i = 0; i < rank; ++i) back.push_back(i < d ? i : i == d ? lead : i - 1);
  r = b.transpose(r, back);
  return finish(op, r, grad.scalar_type(), nullptr);
}

at::Tensor renorm_impl(const at::Tensor& self, const at::Scalar& p, int64_t dim, const at::Scalar& maxnorm,
                       const at::Tensor* into) {
  TORCH_CHECK(self.dim() > 1, "renorm: input needs at least 2 dimensions, got ", self.dim(), " dimensions");
  TORCH_CHECK(p.toDouble() > 0, "renorm: non-positive-norm not supported");
  TORCH_CHECK(maxnorm.toDouble() >= 0, "renorm: expected maxnorm to be >= 0 but got ", maxnorm.toDouble());
  TORCH_CHECK(at::isFloatingType(self.scalar_type()) || at::isComplexType(self.scalar_type()),
              "renorm: expected a floating point or complex input");
  int64_t d = at::maybe_wrap_dim(dim, self.dim());
  OpBuilder op("aten::renorm");
  auto& b = op.b();
  Value x = op.input(self);
  DType acc = L::accumulate_type(b.dtype(x));
  DType real = ir::is_complex(acc) ? ir::component_type(acc) : acc;  // of the norms and factors
  std::vector<int64_t> others;
  for (int64_t i = 0; i < self.dim(); ++i) {
    if (i != d) others.push_back(i);
  }
  Value norm = others.empty() ? b.unary("abs", b.convert(x, acc))
                              : b.broadcast_to(L::vector_norm(b, x, p.toDouble(), others, true, real), b.dims(x));
  Value mx = b.broadcast_to(op.scalar(maxnorm, to_aten(real)), b.dims(x));
  Value factor = b.select(b.compare(norm, mx, "GT"), b.binary("divide", mx, b.binary("add", norm, b.scalar_like(norm, 1e-7))),
                          b.scalar_like(norm, 1));
  Value r = b.binary("multiply", b.convert(x, acc), b.convert(factor, acc));
  return finish(op, b.convert(r, b.dtype(x)), self.scalar_type(), into);
}
at::Tensor renorm_fn(const at::Tensor& s, const at::Scalar& p, int64_t d, const at::Scalar& m) {
  return renorm_impl(s, p, d, m, nullptr);
}
at::Tensor& renorm_out(const at::Tensor& s, const at::Scalar& p, int64_t d, const at::Scalar& m, at::Tensor& out) {
  renorm_impl(s, p, d, m, &out);
  return out;
}

// ---------------------------------------------------------------- factories

// triu_indices / tril_indices: the coordinates are known on the host; one upload.
at::Tensor tri_indices(int64_t row, int64_t col, int64_t offset, bool upper, std::optional<at::ScalarType> dtype,
                       std::optional<at::Layout> layout, std::optional<at::Device> device, std::optional<bool> pin) {
  TORCH_CHECK(row >= 0 && col >= 0, "row and col must be non-negative, got ", row, " and ", col);
  std::vector<int64_t> rows, cols;
  for (int64_t r = 0; r < row; ++r)
    for (int64_t c = 0; c < col; ++c)
      if (upper ? c - r >= offset : c - r <= offset) {
        rows.push_back(r);
        cols.push_back(c);
      }
  int64_t n = static_cast<int64_t>(rows.size());
  rows.insert(rows.end(), cols.begin(), cols.end());
  at::Tensor host = at::tensor(rows, at::TensorOptions().dtype(at::kLong)).reshape({2, n});
  return host.to(at::TensorOptions().dtype(dtype.value_or(at::kLong)).layout(layout).device(device).pinned_memory(pin));
}
at::Tensor triu_indices_fn(int64_t r, int64_t c, int64_t o, std::optional<at::ScalarType> t, std::optional<at::Layout> l,
                           std::optional<at::Device> d, std::optional<bool> p) {
  return tri_indices(r, c, o, true, t, l, d, p);
}
at::Tensor tril_indices_fn(int64_t r, int64_t c, int64_t o, std::optional<at::ScalarType> t, std::optional<at::Layout> l,
                           std::optional<at::Device> d, std::optional<bool> p) {
  return tri_indices(r, c, o, false, t, l, d, p);
}

at::Tensor& eye_out(int64_t n, int64_t m, at::Tensor& out) {
  TORCH_CHECK(n >= 0, "eye: n must be greater or equal to 0, got ", n);
  TORCH_CHECK(m >= 0, "eye: m must be greater or equal to 0, got ", m);
  at::native::resize_output(out, {n, m});
  OpBuilder op("aten::eye");
  op.set_device(out.device().index());
  auto& b = op.b();
  Value diag = b.compare(b.iota(DType::S64, {n, m}, 0), b.iota(DType::S64, {n, m}, 1), "EQ");
  finish(op, b.convert(diag, to_ir(out.scalar_type())), out.scalar_type(), &out);
  return out;
}
at::Tensor& eye_n_out(int64_t n, at::Tensor& out) { return eye_out(n, n, out); }

// linspace's points as ATen's CPU kernel computes them: start and end converted to the
// result's dtype first (overflow refused), the step and each point in that dtype's
// arithmetic (double for integers, then truncated), from the start for the first half and
// from the end for the second. Complex dtypes likewise in complex arithmetic.
struct LinspaceEnds {
  at::Scalar start, end, step;
  at::ScalarType arithmetic;  // the dtype the points are computed in
};
LinspaceEnds linspace_ends(const at::Scalar& start, const at::Scalar& end, int64_t steps,
                           at::ScalarType dtype) {
  LinspaceEnds r;
  AT_DISPATCH_V2(dtype, "linspace", AT_WRAP([&] {
    using step_t = std::conditional_t<std::is_integral_v<scalar_t>, double, scalar_t>;
    const scalar_t s = start.to<scalar_t>();
    const scalar_t e = end.to<scalar_t>();
    const step_t step = (static_cast<step_t>(e) - static_cast<step_t>(s)) / (steps - 1);
    r = {at::Scalar(static_cast<step_t>(s)), at::Scalar(static_cast<step_t>(e)), at::Scalar(step),
         std::is_integral_v<scalar_t> ? at::kDouble : dtype};
  }), AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), at::kHalf, at::kBFloat16, AT_EXPAND(AT_BAREBONES_UNSIGNED_TYPES));
  return r;
}
Value linspace_points(OpBuilder& op, const LinspaceEnds& ends, int64_t steps) {
  auto& b = op.b();
  const at::ScalarType t = ends.arithmetic;
  const DType T = to_ir(t);
  Value s = b.broadcast_to(op.scalar(ends.start, t), {steps});
  if (steps == 1) return s;
  Value e = b.broadcast_to(op.scalar(ends.end, t), {steps});
  Value step = b.broadcast_to(op.scalar(ends.step, t), {steps});
  Value i = b.iota(DType::S64, {steps}, 0);
  Value from_end_count = b.binary("subtract", b.constant_int(DType::S64, steps - 1, {steps}), i);
  Value from_start = b.binary("add", s, b.binary("multiply", step, b.convert(i, T)));
  Value from_end = b.binary("subtract", e, b.binary("multiply", step, b.convert(from_end_count, T)));
  Value first_half = b.compare(i, b.constant_int(DType::S64, steps / 2, {steps}), "LT");
  return b.select(first_half, from_start, from_end);
}
at::Tensor& linspace_out(const at::Scalar& start, const at::Scalar& end, int64_t steps, at::Tensor& out) {
  TORCH_CHECK(steps >= 0, "number of steps must be non-negative");
  if (steps == 0) {
    if (out.numel() != 0) at::native::resize_output(out, {0});
    return out;
  }
  LinspaceEnds ends = linspace_ends(start, end, steps, out.scalar_type());
  OpBuilder op("aten::linspace");
  op.set_device(out.device().index());
  Value v = op.b().convert(linspace_points(op, ends, steps), to_ir(out.scalar_type()));
  return write_sequence(op, v, steps, out);
}
at::Tensor& logspace_out(const at::Scalar& start, const at::Scalar& end, int64_t steps, double base, at::Tensor& out) {
  TORCH_CHECK(steps >= 0, "number of steps must be non-negative");
  if (steps == 0) {
    if (out.numel() != 0) at::native::resize_output(out, {0});
    return out;
  }
  LinspaceEnds ends = linspace_ends(start, end, steps, out.scalar_type());
  OpBuilder op("aten::logspace");
  op.set_device(out.device().index());
  auto& b = op.b();
  // std::pow(double base, exponent): the power in double (complex<double> for complex dtypes).
  Value exponent = linspace_points(op, ends, steps);
  const DType wide = ir::is_complex(b.dtype(exponent)) ? DType::C128 : DType::F64;
  exponent = b.convert(exponent, wide);
  Value r = b.binary("power", b.constant(wide, base, {steps}), exponent);
  return write_sequence(op, b.convert(r, to_ir(out.scalar_type())), steps, out);
}

// ---------------------------------------------------------------- random distributions

// Fills self with f(u) for uniform u in [0, 1) drawn in f32 (f64 for double).
at::Tensor& fill_from_uniform(const char* name, at::Tensor& self, std::optional<at::Generator> gen,
                              const std::function<Value(OpBuilder&, Value)>& transform) {
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), name, " only supports floating point dtypes, got ", self.scalar_type());
  OpBuilder op(std::string("aten::") + name);
  op.set_device(self.device().index());
  DType acc = self.scalar_type() == at::kDouble ? DType::F64 : DType::F32;
  auto r = L::uniform(op.b(), op.rng_state(pick_generator(gen, self)), acc, vec(self.sizes()));
  op.set_rng_state(r[0]);
  op.write(self, op.b().convert(transform(op, r[1]), to_ir(self.scalar_type())));
  op.run();
  return self;
}

at::Tensor& exponential_fn(at::Tensor& self, double lambd, std::optional<at::Generator> gen) {
  TORCH_CHECK(lambd > 0.0, "exponential_ expects lambda > 0.0, but found lambda=", lambd);
  return fill_from_uniform("exponential_", self, gen, [&](OpBuilder& op, Value u) {
    auto& b = op.b();
    Value l = b.broadcast_to(op.scalar(lambd, to_aten(b.dtype(u))), b.dims(u));
    return b.binary("divide", b.unary("negate", b.unary("log_plus_one", b.unary("negate", u))), l);
  });
}
at::Tensor& geometric_fn(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  TORCH_CHECK(0 < p && p < 1, "geometric_ expects p to be in (0, 1), but got p=", p);
  auto draw = [&](OpBuilder& op, Value u) {
    auto& b = op.b();
    Value lp = b.broadcast_to(op.scalar(std::log1p(-p), to_aten(b.dtype(u))), b.dims(u));
    return b.unary("ceil", b.binary("divide", b.unary("log_plus_one", b.unary("negate", u)), lp));
  };
  if (at::isFloatingType(self.scalar_type())) return fill_from_uniform("geometric_", self, gen, draw);
  at::Tensor tmp = at::empty(self.sizes(), self.options().dtype(at::kFloat));
  fill_from_uniform("geometric_", tmp, gen, draw);
  self.copy_(tmp);
  return self;
}
at::Tensor& log_normal_fn(at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  TORCH_CHECK(std > 0.0, "log_normal_ expects std > 0.0, but found std=", std);
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "log_normal_ only supports floating point dtypes");
  OpBuilder op("aten::log_normal_");
  op.set_device(self.device().index());
  auto& b = op.b();
  DType acc = self.scalar_type() == at::kDouble ? DType::F64 : DType::F32;
  auto r = L::normal(b, op.rng_state(pick_generator(gen, self)), acc, vec(self.sizes()));
  op.set_rng_state(r[0]);
  Value s = b.broadcast_to(op.scalar(std, to_aten(acc)), vec(self.sizes()));
  Value m = b.broadcast_to(op.scalar(mean, to_aten(acc)), vec(self.sizes()));
  op.write(self, b.convert(b.unary("exponential", b.binary("add", b.binary("multiply", r[1], s), m)), to_ir(self.scalar_type())));
  op.run();
  return self;
}
at::Tensor& cauchy_fn(at::Tensor& self, double median, double sigma, std::optional<at::Generator> gen) {
  TORCH_CHECK(sigma > 0.0, "cauchy_ expects sigma > 0.0, but found sigma=", sigma);
  return fill_from_uniform("cauchy_", self, gen, [&](OpBuilder& op, Value u) {
    auto& b = op.b();
    at::ScalarType t = to_aten(b.dtype(u));
    Value angle = b.binary("multiply", b.binary("subtract", u, b.scalar_like(u, 0.5)), b.scalar_like(u, M_PI));
    return b.binary("add", b.broadcast_to(op.scalar(median, t), b.dims(u)),
                    b.binary("multiply", b.broadcast_to(op.scalar(sigma, t), b.dims(u)), b.unary("tan", angle)));
  });
}

// normal with tensor mean and/or std: mean + std * N(0, 1) over the broadcast shape.
at::Tensor normal_tensors(const at::Tensor& mean, const at::Tensor& std, std::optional<at::Generator> gen) {
  TORCH_CHECK(!std.is_complex(), "normal expects standard deviation to be non-complex");
  // As ATen on every device: the smallest std is read on the host (a sync).
  TORCH_CHECK(std.numel() == 0 || std.min().ge(0).item<bool>(), "normal expects all elements of std >= 0.0");
  at::ScalarType t = at::result_type(mean, std);
  TORCH_CHECK(at::isFloatingType(t), "normal expects floating point mean and std, got ", t);
  OpBuilder op("aten::normal");
  auto& b = op.b();
  Value m = b.convert(op.input(mean), to_ir(t)), s = b.convert(op.input(std), to_ir(t));
  auto shape = ir::broadcast_shapes(b.dims(m), b.dims(s));
  const at::Tensor& device_tensor = mean.device().type() == c10::DeviceType::PrivateUse1 ? mean : std;
  auto r = L::normal(b, op.rng_state(pick_generator(gen, device_tensor)), to_ir(t), shape);
  op.set_rng_state(r[0]);
  Value out = b.binary("add", b.broadcast_to(m, shape), b.binary("multiply", b.broadcast_to(s, shape), r[1]));
  return finish(op, out, t, nullptr);
}
at::Tensor normal_tt(const at::Tensor& m, const at::Tensor& s, std::optional<at::Generator> g) { return normal_tensors(m, s, g); }
at::Tensor normal_tf(const at::Tensor& m, double s, std::optional<at::Generator> g) {
  TORCH_CHECK(s >= 0.0, "normal expects std >= 0.0, but found std ", s);
  return normal_tensors(m, at::scalar_tensor(s, m.options().device(at::kCPU)), g);
}
at::Tensor normal_ft(double m, const at::Tensor& s, std::optional<at::Generator> g) {
  return normal_tensors(at::scalar_tensor(m, s.options().device(at::kCPU)), s, g);
}
at::Tensor& normal_tt_out(const at::Tensor& m, const at::Tensor& s, std::optional<at::Generator> g, at::Tensor& out) {
  return write_out("normal", normal_tt(m, s, std::move(g)), out);
}
at::Tensor& normal_tf_out(const at::Tensor& m, double s, std::optional<at::Generator> g, at::Tensor& out) {
  return write_out("normal", normal_tf(m, s, std::move(g)), out);
}
at::Tensor& normal_ft_out(double m, const at::Tensor& s, std::optional<at::Generator> g, at::Tensor& out) {
  return write_out("normal", normal_ft(m, s, std::move(g)), out);
}

at::Tensor& randperm_out(int64_t n, std::optional<at::Generator> gen, at::Tensor& out) {
  TORCH_CHECK(n >= 0, "randperm: n must be non-negative, got ", n);
  // ATen's checks: n - 1 must fit the result's dtype, and floats must tell the values apart.
  TORCH_CHECK(at::scalar_tensor(n > 0 ? n - 1 : n, at::TensorOptions().dtype(out.scalar_type())).defined(),
              "n is too large for result tensor type: '", out.toString(), "'");
  switch (out.scalar_type()) {
    case at::kHalf: TORCH_CHECK(n <= (int64_t{1} << 11) + 1, "n cannot be greater than 2049 for Half type."); break;
    case at::kFloat: TORCH_CHECK(n <= (int64_t{1} << 24) + 1, "n cannot be greater than 2^24+1 for Float type."); break;
    case at::kDouble: TORCH_CHECK(n <= (int64_t{1} << 53) + 1, "n cannot be greater than 2^53+1 for Double type."); break;
    default: break;
  }
  at::native::resize_output(out, {n});
  if (n == 0) return out;
  OpBuilder op("aten::randperm");
  op.set_device(out.device().index());
  auto& b = op.b();
  // Sorting random keys gives a uniformly random permutation (ties have probability ~n^2/2^64).
  auto r = L::uniform(b, op.rng_state(pick_generator(gen, out)), DType::F64, {n});
  op.set_rng_state(r[0]);
  auto sorted = L::sort_with_indices(b, r[1], 0, false);
  finish(op, b.convert(sorted[1], to_ir(out.scalar_type())), out.scalar_type(), &out);
  return out;
}

at::Tensor multinomial_fn(const at::Tensor& self, int64_t n, bool replacement, std::optional<at::Generator> gen) {
  TORCH_CHECK(self.dim() == 1 || self.dim() == 2, "prob_dist must be 1 or 2 dim");
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "multinomial only supports floating-point dtypes for input, got: ",
              self.scalar_type());
  int64_t categories = self.size(-1);
  TORCH_CHECK(n > 0, "cannot sample n_sample <= 0 samples");
  TORCH_CHECK(replacement || n <= categories, "cannot sample n_sample > prob_dist.size(-1) samples without replacement");
  // As ATen: beyond 2^24 categories float32 cumulative sums cannot tell neighbours apart.
  TORCH_CHECK(categories <= (int64_t{1} << 24), "number of categories cannot exceed 2^24");
  OpBuilder op("aten::multinomial");
  auto& b = op.b();
  Value p = b.convert(op.input(self), DType::F32);
  if (self.dim() == 1) p = b.reshape(p, {1, categories});
  int64_t rows = b.dims(p)[0];
  Value bad = L::any_all(b, b.reshape(b.compare(p, b.scalar_like(p, 0), "LT"), {rows * categories}), {}, false, false);
  op.check_flag(bad, "aten::multinomial: probability tensor contains either `inf`, `nan` or element < 0");
  Value result;
  if (replacement) {
    // Inverse CDF: the number of cumulative weights <= u * total.
    auto r = L::uniform(b, op.rng_state(pick_generator(gen, self)), DType::F32, {rows, n});
    op.set_rng_state(r[0]);
    Value cdf = L::cumulative(b, p, 1, "sum");
    Value total = b.slice_dim(cdf, 1, categories - 1, categories);
    Value u = b.binary("multiply", r[1], b.broadcast_to(total, {rows, n}));
    Value cmp = b.compare(b.broadcast_in_dim(cdf, {rows, n, categories}, {0, 2}),
                          b.broadcast_in_dim(u, {rows, n, categories}, {0, 1}), "LE");
    result = L::sum(b, b.convert(cmp, DType::S64), {2}, false, DType::S64);
    result = b.binary("minimum", result, b.constant_int(DType::S64, categories - 1, {rows, n}));
  } else {
    // Gumbel top-k: the n largest log(p) - log(-log(u)) are a sample without replacement.
    auto r = L::uniform(b, op.rng_state(pick_generator(gen, self)), DType::F32, {rows, categories});
    op.set_rng_state(r[0]);
    Value u = b.binary("maximum", r[1], b.scalar_like(r[1], 1e-20));
    Value gumbel = b.unary("negate", b.unary("log", b.unary("negate", b.unary("log", u))));
    Value keys = b.binary("add", b.unary("log", p), gumbel);
    auto sorted = L::sort_with_indices(b, keys, 1, true);
    result = b.slice_dim(sorted[1], 1, 0, n);
  }
  if (self.dim() == 1) result = b.reshape(result, {n});
  return finish(op, result, at::kLong, nullptr);
}

// ---------------------------------------------------------------- histc

// Integer inputs are counted as CUDA's histc counts them (transformers' MoE routing
// calls histc on int32 expert ids on every device but the CPU): bounds truncated to
// integers, the bin by integer division, counts in the input's dtype.
at::Tensor histc_fn(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  TORCH_CHECK(bins > 0, "torch.histc: bins must be > 0, but got ", bins);
  const at::ScalarType dtype = self.scalar_type();
  const bool integral = at::isIntegralType(dtype, /*includeBool=*/false);
  TORCH_CHECK(at::isFloatingType(dtype) || integral, "torch.histc: input tensor must be floating point or integer, got ",
              dtype);
  double lo = integral ? static_cast<double>(min.toLong()) : min.toDouble();
  double hi = integral ? static_cast<double>(max.toLong()) : max.toDouble();
  const int64_t n = self.numel();
  if (lo == hi && n > 0) {
    // The range from the data, read on the host as CUDA's kernel reads it (the refusal of an
    // infinite or NaN range below needs the values).
    auto [data_lo, data_hi] = at::aminmax(self);
    lo = data_lo.item<double>();
    hi = data_hi.item<double>();
  }
  if (lo == hi) {  // a constant tensor widens by 1 on each side
    lo -= 1;
    hi += 1;
  }
  TORCH_CHECK(std::isfinite(lo) && std::isfinite(hi), "torch.histc: range of [", lo, ", ", hi, "] is not finite");
  TORCH_CHECK(lo <= hi, "torch.histc: max must be larger than min");
  OpBuilder op("aten::histc");
  auto& b = op.b();
  const DType work = integral ? DType::S64 : DType::F64;
  Value x = b.convert(b.reshape(op.input(self), {n}), work);
  Value vlo = b.constant(work, lo), vhi = b.constant(work, hi);
  Value lo_b = b.broadcast_to(vlo, {n}), hi_b = b.broadcast_to(vhi, {n});
  Value inside = b.binary("and", b.compare(x, lo_b, "GE"), b.compare(x, hi_b, "LE"));
  // (x - lo) * bins / (hi - lo): exact integer division for integers (x >= lo inside, so it
  // truncates as floor does), floor of the float64 quotient otherwise.
  Value scaled = b.binary("multiply", b.binary("subtract", x, lo_b), b.constant(work, static_cast<double>(bins), {n}));
  Value pos = b.binary("divide", scaled, b.binary("subtract", hi_b, lo_b));
  if (!integral) pos = b.unary("floor", pos);
  Value bin = b.clamp(b.constant_int(DType::S64, 0, {n}), b.convert(pos, DType::S64), b.constant_int(DType::S64, bins - 1, {n}));
  Value ones = b.convert(inside, work);
  Value hist = L::scatter(b, b.constant(work, 0, {bins}), 0, bin, ones, "add");
  return finish(op, b.convert(hist, to_ir(dtype)), dtype, nullptr);
}
at::Tensor& histc_out(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max, at::Tensor& out) {
  return write_out("histc", histc_fn(self, bins, min, max), out);
}
at::Tensor& multinomial_out(const at::Tensor& self, int64_t n, bool replacement, std::optional<at::Generator> gen,
                            at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == at::kLong, "multinomial expects Long tensor out, got: ", out.scalar_type());
  return write_out("multinomial", multinomial_fn(self, n, replacement, std::move(gen)), out, {self});
}

// ---------------------------------------------------------------- embedding_bag

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

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
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
  m.impl("searchsorted.Tensor", searchsorted_fn);
  m.impl("searchsorted.Tensor_out", [](const at::Tensor& seq, const at::Tensor& v, bool i32, bool right,
                                       std::optional<c10::string_view> side, const std::optional<at::Tensor>& sorter,
                                       at::Tensor& out) -> at::Tensor& {
    check_search_out("searchsorted", out, i32);
    return write_out("searchsorted", searchsorted_fn(seq, v, i32, right, side, sorter), out);
  });
  m.impl("searchsorted.Scalar", searchsorted_scalar_fn);
  m.impl("bucketize.Tensor", bucketize_fn);
  m.impl("bucketize.Scalar", bucketize_scalar_fn);
  m.impl("bucketize.Tensor_out", [](const at::Tensor& s, const at::Tensor& b, bool i32, bool right,
                                    at::Tensor& out) -> at::Tensor& {
    check_search_out("bucketize", out, i32);
    return write_out("bucketize", bucketize_fn(s, b, i32, right), out);
  });
  m.impl("isin.Tensor_Tensor", isin_tt);
  m.impl("isin.Tensor_Tensor_out", isin_tt_out);
  m.impl("isin.Tensor_Scalar", isin_ts);
  m.impl("isin.Scalar_Tensor", isin_st);

  m.impl("nansum", nansum_fn);
  m.impl("nansum.out", nansum_out);
  m.impl("std_mean.correction", std_mean_fn);
  m.impl("var_mean.correction", var_mean_fn);
  m.impl("aminmax", aminmax_fn);
  m.impl("aminmax.out", [](const at::Tensor& s, std::optional<int64_t> d, bool k, at::Tensor& lo, at::Tensor& hi) {
    for (const at::Tensor& out : {lo, hi}) {
      TORCH_CHECK(out.scalar_type() == s.scalar_type(), "aminmax(): Expected out tensor to have dtype ", s.dtype(),
                  ", but got ", out.dtype(), " instead");
    }
    auto [mn, mx] = aminmax_fn(s, d, k);
    write_outs("aminmax", {mn, mx}, {lo, hi}, {s});
    return std::tuple<at::Tensor&, at::Tensor&>(lo, hi);
  });
  m.impl("count_nonzero.dim_IntList", count_nonzero_fn);
  m.impl("trace", trace_fn);
  m.impl("mode", mode_fn);
  m.impl("mode.values", mode_out);

  m.impl("addbmm", addbmm_fn);
  m.impl("addbmm.out", addbmm_out);
  m.impl("addbmm_", addbmm_inplace);
  m.impl("addr", addr_fn);
  m.impl("addr.out", addr_out);
  m.impl("linalg_cross", linalg_cross_fn);
  m.impl("linalg_cross.out", [](const at::Tensor& s, const at::Tensor& o, int64_t d, at::Tensor& out) -> at::Tensor& {
    return write_out("linalg_cross", linalg_cross_fn(s, o, d), out);
  });
  m.impl("stack", stack_fn);
  m.impl("slice_scatter", slice_scatter_fn);
  m.impl("select_scatter", select_scatter_fn);
  m.impl("diagonal_scatter", diagonal_scatter_fn);
  m.impl("as_strided_scatter", as_strided_scatter_fn);

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
  m.impl("index_reduce_", index_reduce_inplace);
  m.impl("index_reduce.out", index_reduce_out);
  m.impl("segment_reduce", segment_reduce_fn);
  m.impl("_segment_reduce_backward", segment_reduce_backward_fn);
  m.impl("rsub.Tensor", rsub_fn);
  m.impl("rsub.Scalar", rsub_scalar_fn);
  m.impl("equal", equal_fn);
  m.impl("vdot", vdot_fn);
  m.impl("round.decimals", round_decimals_fn);
  m.impl("round.decimals_out", round_decimals_out);
  m.impl("round_.decimals", round_decimals_inplace);
  m.impl("unfold_backward", unfold_backward_fn);
  m.impl("renorm", renorm_fn);
  m.impl("renorm.out", renorm_out);
  m.impl("triu_indices", triu_indices_fn);
  m.impl("tril_indices", tril_indices_fn);
  m.impl("normal.Tensor_Tensor", normal_tt);
  m.impl("normal.Tensor_float", normal_tf);
  m.impl("normal.float_Tensor", normal_ft);
  m.impl("normal.Tensor_Tensor_out", normal_tt_out);
  m.impl("normal.Tensor_float_out", normal_tf_out);
  m.impl("normal.float_Tensor_out", normal_ft_out);
  m.impl("eye.out", eye_n_out);
  m.impl("eye.m_out", eye_out);
  m.impl("linspace.out", linspace_out);
  m.impl("logspace.out", logspace_out);

  m.impl("exponential_", exponential_fn);
  m.impl("geometric_", geometric_fn);
  m.impl("log_normal_", log_normal_fn);
  m.impl("cauchy_", cauchy_fn);
  m.impl("randperm.generator_out", randperm_out);
  m.impl("multinomial", multinomial_fn);
  m.impl("multinomial.out", multinomial_out);
  m.impl("histc", histc_fn);
  m.impl("histc.out", histc_out);

  m.impl("_embedding_bag", embedding_bag_fn);
  m.impl("_embedding_bag_forward_only", embedding_bag_fn);
  m.impl("_embedding_bag_dense_backward", embedding_bag_dense_backward_fn);
  m.impl("_embedding_bag_backward", embedding_bag_backward_fn);
  m.impl("_embedding_bag_per_sample_weights_backward", embedding_bag_psw_backward_fn);
}

}  // namespace torch_pjrt::device
