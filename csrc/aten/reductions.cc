// Reductions: sum, mean, prod, max/min, arg reductions, var/std, norms, logsumexp, softmax,
// any/all, nansum, aminmax, mode, segment_reduce, histc, trace.
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

// torch.hash_tensor (mode 0, xor_sum): the xor of the elements' 64-bit patterns, floats
// widened to double and integers to int64 first, as CPU.
at::Tensor& hash_tensor_out(const at::Tensor& self, at::IntArrayRef dim, bool keepdim, int64_t mode, at::Tensor& out) {
  TORCH_CHECK(mode == 0, "Unknown hash_tensor mode: ", mode);
  TORCH_CHECK(self.numel() > 0 || !dim.empty(), "hash_tensor: Expected reduction dim to be specified for input.numel() == 0. ",
              "Specify the reduction dim with the 'dim' argument.");
  at::ScalarType t = self.scalar_type();
  TORCH_CHECK(!at::isComplexType(t) && t != at::kUInt64, "\"xor_sum\" not implemented for '", t, "'");
  OpBuilder op("aten::hash_tensor");
  auto& b = op.b();
  std::vector<int64_t> in = vec(self.sizes()), dims = reduce_dims(self, dim);
  if (dims.empty()) {
    for (int64_t d = 0; d < self.dim(); ++d) dims.push_back(d);
  }
  int64_t n = self.numel();
  Value wide = b.convert(op.input(self), at::isFloatingType(t) ? ir::DType::F64 : ir::DType::S64);
  Value bits = b.reshape(b.bitcast_flat(b.reshape(wide, {n}), ir::DType::U64), in);
  Value r = b.reduce_simple(bits, b.constant_int(ir::DType::U64, 0), dims, "xor");
  std::vector<int64_t> shape;
  for (int64_t d = 0; d < self.dim(); ++d) {
    bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!reduced) shape.push_back(in[d]);
    else if (keepdim) shape.push_back(1);
  }
  return write_out("hash_tensor", finish(op, b.reshape(r, shape), at::kUInt64, nullptr), out);
}

at::Tensor sum_impl(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim,
                    std::optional<at::ScalarType> dtype, const at::Tensor* into) {
  at::ScalarType out = dtype ? *dtype
                             : (into ? into->scalar_type()
                                     : (at::isIntegralType(self.scalar_type(), true) ? at::kLong : self.scalar_type()));
  OpBuilder op("aten::sum");
  Value r = L::sum(op.b(), op.input(self), reduce_dims(self, dims), keepdim && self.dim() > 0, to_ir(out));
  return finish(op, r, out, into);
}
at::Tensor sum_dim(const at::Tensor& s, at::OptionalIntArrayRef d, bool k, std::optional<at::ScalarType> t) {
  return sum_impl(s, d, k, t, nullptr);
}
at::Tensor& sum_out(const at::Tensor& s, at::OptionalIntArrayRef d, bool k, std::optional<at::ScalarType> t, at::Tensor& out) {
  sum_impl(s, d, k, t, &out);
  return out;
}

at::Tensor mean_impl(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim,
                     std::optional<at::ScalarType> dtype, const at::Tensor* into) {
  at::ScalarType out = dtype ? *dtype : (into ? into->scalar_type() : self.scalar_type());
  TORCH_CHECK(at::isFloatingType(out) || at::isComplexType(out), "mean(): could not infer output dtype. ",
              dtype ? "Optional" : "Input", " dtype must be either a floating point or complex dtype. Got: ", out);
  OpBuilder op("aten::mean");
  Value r = L::mean(op.b(), op.input(self), reduce_dims(self, dims), keepdim && self.dim() > 0, to_ir(out));
  return finish(op, r, out, into);
}
at::Tensor mean_dim(const at::Tensor& s, at::OptionalIntArrayRef d, bool k, std::optional<at::ScalarType> t) {
  return mean_impl(s, d, k, t, nullptr);
}
at::Tensor& mean_out(const at::Tensor& s, at::OptionalIntArrayRef d, bool k, std::optional<at::ScalarType> t, at::Tensor& out) {
  mean_impl(s, d, k, t, &out);
  return out;
}

at::Tensor prod_all(const at::Tensor& s, std::optional<at::ScalarType> t) {
  at::ScalarType out = t ? *t : (at::isIntegralType(s.scalar_type(), true) ? at::kLong : s.scalar_type());
  OpBuilder op("aten::prod");
  return finish(op, L::prod(op.b(), op.input(s), {}, false, to_ir(out)), out, nullptr);
}
at::Tensor prod_dim(const at::Tensor& s, int64_t dim, bool keepdim, std::optional<at::ScalarType> t) {
  at::ScalarType out = t ? *t : (at::isIntegralType(s.scalar_type(), true) ? at::kLong : s.scalar_type());
  OpBuilder op("aten::prod");
  std::vector<int64_t> dims = reduce_dims(s, c10::IntArrayRef{dim});
  return finish(op, L::prod(op.b(), op.input(s), dims, keepdim && s.dim() > 0, to_ir(out)), out, nullptr);
}

at::Tensor amax_impl(const at::Tensor& self, c10::IntArrayRef dims, bool keepdim, bool is_max, const at::Tensor* into) {
  OpBuilder op(is_max ? "aten::amax" : "aten::amin");
  std::vector<int64_t> d = reduce_dims(self, dims);
  for (int64_t x : d) check_reduction_dim_nonempty(is_max ? "amax" : "amin", self, x);
  TORCH_CHECK(self.numel() > 0 || !d.empty(), is_max ? "amax" : "amin", "(): Expected reduction dim to be specified for "
              "input.numel() == 0. Specify the reduction dim with the 'dim' argument.");
  Value r = L::amax(op.b(), op.input(self), d, keepdim && self.dim() > 0, is_max);
  return finish(op, r, self.scalar_type(), into);
}
at::Tensor amax_fn(const at::Tensor& s, c10::IntArrayRef d, bool k) { return amax_impl(s, d, k, true, nullptr); }
at::Tensor amin_fn(const at::Tensor& s, c10::IntArrayRef d, bool k) { return amax_impl(s, d, k, false, nullptr); }
void check_amax_out(const at::Tensor& s, const at::Tensor& o) {
  TORCH_CHECK(s.scalar_type() == o.scalar_type(), "Expected the dtype for input and out to match, but got ",
              s.scalar_type(), " for input's dtype and ", o.scalar_type(), " for out's dtype.");
}
at::Tensor& amax_out(const at::Tensor& s, c10::IntArrayRef d, bool k, at::Tensor& o) {
  check_amax_out(s, o);
  amax_impl(s, d, k, true, &o);
  return o;
}
at::Tensor& amin_out(const at::Tensor& s, c10::IntArrayRef d, bool k, at::Tensor& o) {
  check_amax_out(s, o);
  amax_impl(s, d, k, false, &o);
  return o;
}
at::Tensor max_all(const at::Tensor& s) {
  TORCH_CHECK(s.numel() > 0, "max(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' argument.");
  return amax_impl(s, {}, false, true, nullptr);
}
at::Tensor min_all(const at::Tensor& s) {
  TORCH_CHECK(s.numel() > 0, "min(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' argument.");
  return amax_impl(s, {}, false, false, nullptr);
}

std::tuple<at::Tensor, at::Tensor> max_min_dim(const at::Tensor& self, int64_t dim, bool keepdim, bool is_max) {
  OpBuilder op(is_max ? "aten::max.dim" : "aten::min.dim");
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  Value x = op.input(self);
  if (self.dim() == 0) x = op.b().reshape(x, {1});
  check_reduction_dim_nonempty(is_max ? "max" : "min", self, d);
  auto r = L::arg_reduce(op.b(), x, d, keepdim || self.dim() == 0, is_max);
  if (self.dim() == 0) {
    r[0] = op.b().reshape(r[0], {});
    r[1] = op.b().reshape(r[1], {});
  }
  at::Tensor v = op.output(r[0], self.scalar_type());
  at::Tensor i = op.output(r[1], at::kLong);
  op.run();
  return {v, i};
}
// max.dim / min.dim are structured in ATen: their outs take the result types exactly.
void check_value_index_outs(const at::Tensor& self, const at::Tensor& values, const at::Tensor& indices) {
  TORCH_CHECK(values.scalar_type() == self.scalar_type(), "Expected out tensor to have dtype ", self.scalar_type(),
              ", but got ", values.scalar_type(), " instead");
  TORCH_CHECK(indices.scalar_type() == at::kLong, "Expected out tensor to have dtype Long, but got ",
              indices.scalar_type(), " instead");
}
std::tuple<at::Tensor, at::Tensor> max_dim(const at::Tensor& s, int64_t d, bool k) { return max_min_dim(s, d, k, true); }
std::tuple<at::Tensor, at::Tensor> min_dim(const at::Tensor& s, int64_t d, bool k) { return max_min_dim(s, d, k, false); }

at::Tensor argmax_impl(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim, bool is_max) {
  OpBuilder op(is_max ? "aten::argmax" : "aten::argmin");
  Value x = op.input(self);
  TORCH_CHECK_INDEX(self.numel() > 0 || dim, is_max ? "argmax" : "argmin", "(): Expected reduction dim to be specified for input.numel() == 0.");
  int64_t d;
  if (!dim) {
    x = op.b().reshape(x, {self.numel()});
    d = 0;
  } else {
    reduce_dims(self, c10::IntArrayRef{*dim});  // ATen's checks of a dim
    d = at::maybe_wrap_dim(*dim, std::max<int64_t>(self.dim(), 1));
    check_reduction_dim_nonempty(is_max ? "argmax" : "argmin", self, d);
    if (self.dim() == 0) x = op.b().reshape(x, {1});
  }
  auto r = L::arg_reduce(op.b(), x, d, keepdim && dim && self.dim() > 0, is_max);
  Value idx = r[1];
  if (!dim && keepdim) idx = op.b().reshape(idx, std::vector<int64_t>(self.dim(), 1));
  if (dim && self.dim() == 0) idx = op.b().reshape(idx, {});
  return finish(op, idx, at::kLong, nullptr);
}
at::Tensor argmax_fn(const at::Tensor& s, std::optional<int64_t> d, bool k) { return argmax_impl(s, d, k, true); }
at::Tensor argmin_fn(const at::Tensor& s, std::optional<int64_t> d, bool k) { return argmax_impl(s, d, k, false); }

at::Tensor var_std(const at::Tensor& self, at::OptionalIntArrayRef dims, const std::optional<at::Scalar>& correction,
                   bool keepdim, bool take_sqrt) {
  OpBuilder op(take_sqrt ? "aten::std" : "aten::var");
  TORCH_CHECK(at::isFloatingType(self.scalar_type()) || at::isComplexType(self.scalar_type()),
              "std and var only support floating point and complex dtypes");
  at::ScalarType out = c10::toRealValueType(self.scalar_type());
  double corr = correction ? correction->toDouble() : 1.0;
  std::vector<int64_t> d = reduce_dims(self, dims);
  warn_degrees_of_freedom(take_sqrt ? "std" : "var", self, d, corr);
  Value r = L::var(op.b(), op.input(self), d, corr, keepdim && self.dim() > 0, to_ir(out));
  if (take_sqrt) r = op.b().unary("sqrt", r);
  return finish(op, r, out, nullptr);
}
at::Tensor var_fn(const at::Tensor& s, at::OptionalIntArrayRef d, const std::optional<at::Scalar>& c, bool k) {
  return var_std(s, d, c, k, false);
}
at::Tensor std_fn(const at::Tensor& s, at::OptionalIntArrayRef d, const std::optional<at::Scalar>& c, bool k) {
  return var_std(s, d, c, k, true);
}

at::Tensor vector_norm_impl(const at::Tensor& self, const at::Scalar& ord, at::OptionalIntArrayRef dims, bool keepdim,
                            std::optional<at::ScalarType> dtype, const at::Tensor* into) {
  TORCH_CHECK(at::isFloatingType(self.scalar_type()) || at::isComplexType(self.scalar_type()),
              "linalg.vector_norm: Expected a floating point or complex tensor as input. Got ", self.scalar_type());
  if (dtype) {
    bool complex_in = at::isComplexType(self.scalar_type());
    TORCH_CHECK(at::isComplexType(*dtype) == complex_in, "linalg.vector_norm: dtype should be ",
                complex_in ? "complex" : "real", " for ", complex_in ? "complex" : "real", " inputs, but got ", *dtype);
  }
  at::ScalarType out = c10::toRealValueType(dtype ? *dtype : self.scalar_type());
  // As ATen's structured out=: exactly the result's dtype, no casting.
  TORCH_CHECK(!into || into->scalar_type() == out, "linalg.vector_norm: Expected out tensor to have dtype ",
              c10::scalarTypeToTypeMeta(out), ", but got ", into->dtype(), " instead");
  double p = ord.toDouble();
  OpBuilder op("aten::linalg_vector_norm");
  Value r = L::vector_norm(op.b(), op.input(self), p, reduce_dims(self, dims), keepdim && self.dim() > 0, to_ir(out));
  return finish(op, r, out, into);
}
at::Tensor vector_norm_fn(const at::Tensor& s, const at::Scalar& o, at::OptionalIntArrayRef d, bool k,
                          std::optional<at::ScalarType> t) {
  return vector_norm_impl(s, o, d, k, t, nullptr);
}
at::Tensor& vector_norm_out(const at::Tensor& s, const at::Scalar& o, at::OptionalIntArrayRef d, bool k,
                            std::optional<at::ScalarType> t, at::Tensor& out) {
  vector_norm_impl(s, o, d, k, t, &out);
  return out;
}

// Legacy torch.norm overloads: vector norms over dims (all when empty), p defaulting to 2.
at::Tensor norm_dims(const at::Tensor& s, const std::optional<at::Scalar>& p, c10::IntArrayRef d, bool k) {
  return vector_norm_impl(s, p.value_or(2.0), d, k, std::nullopt, nullptr);
}
at::Tensor norm_dims_dtype(const at::Tensor& s, const std::optional<at::Scalar>& p, c10::IntArrayRef d, bool k,
                           at::ScalarType t) {
  return vector_norm_impl(s, p.value_or(2.0), d, k, t, nullptr);
}
at::Tensor& norm_dims_out(const at::Tensor& s, const std::optional<at::Scalar>& p, c10::IntArrayRef d, bool k,
                          at::Tensor& out) {
  vector_norm_impl(s, p.value_or(2.0), d, k, std::nullopt, &out);
  return out;
}
at::Tensor& norm_dims_dtype_out(const at::Tensor& s, const std::optional<at::Scalar>& p, c10::IntArrayRef d, bool k,
                                at::ScalarType t, at::Tensor& out) {
  vector_norm_impl(s, p.value_or(2.0), d, k, t, &out);
  return out;
}
at::Tensor norm_all(const at::Tensor& s, const at::Scalar& p) { return vector_norm_impl(s, p, {}, false, std::nullopt, nullptr); }
at::Tensor norm_all_dtype(const at::Tensor& s, const std::optional<at::Scalar>& p, at::ScalarType t) {
  return vector_norm_impl(s, p.value_or(2.0), {}, false, t, nullptr);
}

at::Tensor logsumexp_fn(const at::Tensor& self, c10::IntArrayRef dims, bool keepdim) {
  OpBuilder op("aten::logsumexp");
  at::ScalarType out = float_result(self.scalar_type());
  Value r = L::logsumexp(op.b(), op.input(self), reduce_dims(self, dims), keepdim && self.dim() > 0, to_ir(out));
  return finish(op, r, out, nullptr);
}

at::Tensor any_all_impl(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim, bool is_all) {
  // Unlike other reductions (ATen's allow_empty_dims): no dims reduce every dim, checked as
  // a list of them; an empty list reduces none.
  std::vector<int64_t> every(self.dim());
  std::iota(every.begin(), every.end(), int64_t{0});
  OpBuilder op(is_all ? "aten::all" : "aten::any");
  at::ScalarType out = self.scalar_type() == at::kByte ? at::kByte : at::kBool;
  Value x = op.input(self);
  if (dims && dims->empty()) return finish(op, op.b().convert(op.b().convert(x, ir::DType::Pred), to_ir(out)), out, nullptr);
  Value r = L::any_all(op.b(), x, reduce_dims(self, dims ? *dims : c10::IntArrayRef(every)), keepdim && self.dim() > 0, is_all);
  return finish(op, r, out, nullptr);
}
// all/any write only into bool or uint8 tensors (ATen's check_result_is_bytebool).
at::Tensor& check_bool_result(const char* name, at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == at::kBool || out.scalar_type() == at::kByte, name,
              " only supports bool tensor for result, got: ", out.scalar_type());
  return out;
}
at::Tensor all_fn(const at::Tensor& s) { return any_all_impl(s, std::nullopt, false, true); }
at::Tensor any_fn(const at::Tensor& s) { return any_all_impl(s, std::nullopt, false, false); }
at::Tensor all_dims(const at::Tensor& s, at::OptionalIntArrayRef d, bool k) { return any_all_impl(s, d, k, true); }
at::Tensor any_dims(const at::Tensor& s, at::OptionalIntArrayRef d, bool k) { return any_all_impl(s, d, k, false); }
at::Tensor all_dim(const at::Tensor& s, int64_t d, bool k) { return any_all_impl(s, c10::IntArrayRef{d}, k, true); }
at::Tensor any_dim(const at::Tensor& s, int64_t d, bool k) { return any_all_impl(s, c10::IntArrayRef{d}, k, false); }

// zero_empty_rows: SDPA's _safe_softmax, where a fully masked row gives zeros (as CPU) and no
// intermediate NaN (debug mode checks every op's results).
at::Tensor softmax_impl(const at::Tensor& self, int64_t dim, at::ScalarType out, bool log, const at::Tensor* into,
                        bool zero_empty_rows = false) {
  OpBuilder op(zero_empty_rows ? "aten::_safe_softmax" : log ? "aten::_log_softmax" : "aten::_softmax");
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  auto& b = op.b();
  Value x = op.input(self);
  if (self.dim() == 0) x = b.reshape(x, {1});  // a 0-d tensor is one row of one element
  Value r = L::softmax(b, x, d, log, to_ir(out), zero_empty_rows);
  if (self.dim() == 0) r = b.reshape(r, {});
  return finish(op, r, out, into);
}
at::ScalarType softmax_out_type(const at::Tensor& s, bool half_to_float) {
  return half_to_float ? at::kFloat : s.scalar_type();
}
at::Tensor softmax_fn(const at::Tensor& s, int64_t d, bool h) {
  return softmax_impl(s, d, softmax_out_type(s, h), false, nullptr);
}
at::Tensor safe_softmax_fn(const at::Tensor& s, int64_t d, std::optional<at::ScalarType> dtype) {
  return softmax_impl(s, d, dtype.value_or(s.scalar_type()), false, nullptr, /*zero_empty_rows=*/true);
}
at::Tensor log_softmax_fn(const at::Tensor& s, int64_t d, bool h) { return softmax_impl(s, d, softmax_out_type(s, h), true, nullptr); }
at::Tensor& softmax_out(const at::Tensor& s, int64_t d, bool h, at::Tensor& o) {
  softmax_impl(s, d, softmax_out_type(s, h), false, &o);
  return o;
}
at::Tensor& log_softmax_out(const at::Tensor& s, int64_t d, bool h, at::Tensor& o) {
  softmax_impl(s, d, softmax_out_type(s, h), true, &o);
  return o;
}
at::Tensor softmax_bw(const at::Tensor& grad, const at::Tensor& out, int64_t dim, at::ScalarType in_dtype, bool log) {
  OpBuilder op(log ? "aten::_log_softmax_backward_data" : "aten::_softmax_backward_data");
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(out.dim(), 1));
  auto& b = op.b();
  Value g = op.input(grad), y = op.input(out);
  if (out.dim() == 0) {
    g = b.reshape(g, {1});
    y = b.reshape(y, {1});
  }
  Value r = L::softmax_backward(b, g, y, d, log, to_ir(in_dtype));
  if (out.dim() == 0) r = b.reshape(r, {});
  return finish(op, r, in_dtype, nullptr);
}
at::Tensor softmax_backward_fn(const at::Tensor& g, const at::Tensor& o, int64_t d, at::ScalarType t) {
  return softmax_bw(g, o, d, t, false);
}
at::Tensor log_softmax_backward_fn(const at::Tensor& g, const at::Tensor& o, int64_t d, at::ScalarType t) {
  return softmax_bw(g, o, d, t, true);
}
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

std::tuple<Tensor, Tensor> aminmax_all_legacy(const Tensor& self) {
  auto [mn, mx] = at::aminmax(self);
  return {mn, mx};
}
std::tuple<Tensor, Tensor> aminmax_dim_legacy(const Tensor& self, int64_t dim, bool keepdim) {
  auto [mn, mx] = at::aminmax(self, dim, keepdim);
  return {mn, mx};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("norm.ScalarOpt_dim", norm_dims);
  m.impl("norm.ScalarOpt_dim_dtype", norm_dims_dtype);
  m.impl("norm.out", norm_dims_out);
  m.impl("norm.dtype_out", norm_dims_dtype_out);
  m.impl("norm.Scalar", norm_all);
  m.impl("norm.ScalarOpt_dtype", norm_all_dtype);
  m.impl("sum.dim_IntList", sum_dim);
  m.impl("sum.IntList_out", sum_out);
  m.impl("mean.dim", mean_dim);
  m.impl("mean.out", mean_out);
  m.impl("prod", prod_all);
  m.impl("prod.dim_int", prod_dim);
  m.impl("amax", amax_fn);
  m.impl("amin", amin_fn);
  m.impl("amax.out", amax_out);
  m.impl("amin.out", amin_out);
  m.impl("max", max_all);
  m.impl("min", min_all);
  m.impl("max.dim", max_dim);
  m.impl("min.dim", min_dim);
  m.impl("argmax", argmax_fn);
  m.impl("argmax.out", [](const at::Tensor& s, std::optional<int64_t> d, bool k, at::Tensor& out) -> at::Tensor& {
    return write_out("argmax", argmax_fn(s, d, k), out);
  });
  m.impl("argmin.out", [](const at::Tensor& s, std::optional<int64_t> d, bool k, at::Tensor& out) -> at::Tensor& {
    return write_out("argmin", argmin_fn(s, d, k), out);
  });
  m.impl("max.unary_out", [](const at::Tensor& s, at::Tensor& out) -> at::Tensor& {
    return write_out("max", max_all(s), out);
  });
  m.impl("min.unary_out", [](const at::Tensor& s, at::Tensor& out) -> at::Tensor& {
    return write_out("min", min_all(s), out);
  });
  m.impl("max.dim_max", [](const at::Tensor& s, int64_t d, bool k, at::Tensor& values, at::Tensor& indices) {
    check_value_index_outs(s, values, indices);
    auto [v, i] = max_dim(s, d, k);
    write_outs("max", {v, i}, {values, indices});
    return std::tuple<at::Tensor&, at::Tensor&>(values, indices);
  });
  m.impl("min.dim_min", [](const at::Tensor& s, int64_t d, bool k, at::Tensor& values, at::Tensor& indices) {
    check_value_index_outs(s, values, indices);
    auto [v, i] = min_dim(s, d, k);
    write_outs("min", {v, i}, {values, indices});
    return std::tuple<at::Tensor&, at::Tensor&>(values, indices);
  });
  m.impl("argmin", argmin_fn);
  m.impl("var.correction", var_fn);
  m.impl("var.correction_out", [](const at::Tensor& s, at::OptionalIntArrayRef d, const std::optional<at::Scalar>& c,
                                  bool k, at::Tensor& out) -> at::Tensor& {
    return write_out("var", var_fn(s, d, c, k), out);
  });
  m.impl("std.correction_out", [](const at::Tensor& s, at::OptionalIntArrayRef d, const std::optional<at::Scalar>& c,
                                  bool k, at::Tensor& out) -> at::Tensor& {
    return write_out("std", std_fn(s, d, c, k), out);
  });
  m.impl("std.correction", std_fn);
  m.impl("logsumexp", logsumexp_fn);
  m.impl("hash_tensor.out", hash_tensor_out);
  m.impl("linalg_vector_norm", vector_norm_fn);
  m.impl("linalg_vector_norm.out", vector_norm_out);
  m.impl("all", all_fn);
  m.impl("all.all_out", [](const at::Tensor& s, at::Tensor& out) -> at::Tensor& {
    return write_out("all", all_fn(s), check_bool_result("all", out));
  });
  m.impl("all.out", [](const at::Tensor& s, int64_t d, bool k, at::Tensor& out) -> at::Tensor& {
    return write_out("all", all_dim(s, d, k), check_bool_result("all", out));
  });
  m.impl("any.all_out", [](const at::Tensor& s, at::Tensor& out) -> at::Tensor& {
    return write_out("any", any_fn(s), check_bool_result("any", out));
  });
  m.impl("any.out", [](const at::Tensor& s, int64_t d, bool k, at::Tensor& out) -> at::Tensor& {
    return write_out("any", any_dim(s, d, k), check_bool_result("any", out));
  });
  m.impl("any", any_fn);
  m.impl("all.dims", all_dims);
  m.impl("any.dims", any_dims);
  m.impl("all.dim", all_dim);
  m.impl("any.dim", any_dim);
  m.impl("_softmax", softmax_fn);
  m.impl("_safe_softmax", safe_softmax_fn);
  m.impl("_softmax.out", softmax_out);
  m.impl("_log_softmax", log_softmax_fn);
  m.impl("_log_softmax.out", log_softmax_out);
  m.impl("_softmax_backward_data", softmax_backward_fn);
  m.impl("_log_softmax_backward_data", log_softmax_backward_fn);
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
  m.impl("segment_reduce", segment_reduce_fn);
  m.impl("_segment_reduce_backward", segment_reduce_backward_fn);
  m.impl("histc", histc_fn);
  m.impl("histc.out", histc_out);
  m.impl("_aminmax", aminmax_all_legacy);
  m.impl("_aminmax.dim", aminmax_dim_legacy);
}

}  // namespace torch_pjrt::device
