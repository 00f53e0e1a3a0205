// Small helpers shared by the ATen kernel translation units.
#pragma once

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/native/Resize.h>

#include <algorithm>
#include <vector>

#include "device/context.h"
#include "device/recorder.h"

namespace torch_pjrt::lowering {}

namespace torch_pjrt::device {

// The names every kernel file uses.
using at::Tensor;
using ir::Builder;
using ir::DType;
using ir::Value;
namespace L = lowering;

inline std::vector<int64_t> vec(c10::IntArrayRef a) { return std::vector<int64_t>(a.begin(), a.end()); }

// The layout of a result shaped like `t` (a gradient of it): channels-last when
// t is (and not also contiguous), as PyTorch's CPU kernels choose it.
inline at::MemoryFormat layout_like(const at::Tensor& t) {
  if (t.dim() == 4 && t.is_contiguous(at::MemoryFormat::ChannelsLast) && !t.is_contiguous()) return at::MemoryFormat::ChannelsLast;
  if (t.dim() == 5 && t.is_contiguous(at::MemoryFormat::ChannelsLast3d) && !t.is_contiguous()) return at::MemoryFormat::ChannelsLast3d;
  return at::MemoryFormat::Contiguous;
}

// The dtype an out= tensor receives a `result`-typed value in, refused as ATen refuses it.
inline at::ScalarType out_dtype(const char* op, at::ScalarType result, const at::Tensor& out) {
  TORCH_CHECK(c10::canCast(result, out.scalar_type()), op, ": result type ", result,
              " can't be cast to the desired output type ", out.scalar_type());
  return out.scalar_type();
}

// ATen's checks of scatter's arguments (scatter, scatter_add, scatter_reduce), in its order
// and wording; an empty index passes every shape check. `src` is null for the value overloads.
inline void check_scatter(const char* name, const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor* src) {
  TORCH_CHECK(!src || self.scalar_type() == src->scalar_type(), name, "(): Expected self.dtype to be equal to src.dtype");
  if (index.numel() == 0) return;
  auto rank = [](const at::Tensor& t) { return std::max<int64_t>(t.dim(), 1); };
  auto size = [](const at::Tensor& t, int64_t k) { return t.dim() == 0 ? int64_t{1} : t.size(k); };
  TORCH_CHECK(rank(self) == rank(index), name, "(): Index tensor must have the same number of dimensions as self tensor");
  TORCH_CHECK(!src || rank(*src) == rank(index), name, "(): Index tensor must have the same number of dimensions as src tensor");
  int64_t d = at::maybe_wrap_dim(dim, rank(self));
  for (int64_t k = 0; k < index.dim(); ++k) {
    TORCH_CHECK((k == d || index.size(k) <= size(self, k)) && (!src || index.size(k) <= size(*src, k)), name,
                "(): Expected index ", index.sizes(), " to be no larger than self ", self.sizes(), " apart from dimension ", d,
                src ? " and to be no larger than src " : "", src ? src->sizes() : c10::IntArrayRef());
  }
}

// The dimensions a reduction reduces (empty: all), refused as ATen's make_dim_mask refuses
// them: a list of dims is wrapped, checked for repeats and needs a tensor of at most 64
// dims; no list (or an empty one) reduces every dim, unchecked. A 0-d tensor accepts dim 0
// or -1 and reduces nothing.
inline std::vector<int64_t> reduce_dims(const at::Tensor& self, at::OptionalIntArrayRef dims) {
  std::vector<int64_t> out;
  if (!dims || dims->empty()) return out;  // all
  TORCH_CHECK(self.dim() <= 64, "only tensors with up to 64 dims are supported");
  for (int64_t d : *dims) {
    int64_t wrapped = at::maybe_wrap_dim(d, std::max<int64_t>(self.dim(), 1));
    TORCH_CHECK(std::find(out.begin(), out.end(), wrapped) == out.end(), "dim ", wrapped,
                " appears multiple times in the list of dims");
    out.push_back(wrapped);
  }
  if (self.dim() == 0) out.clear();
  return out;
}

// nll_loss / nll_loss2d's checks of target and weight, in ATen's wording (`per_class`:
// nll_loss names the class count in the weight message, nll_loss2d does not).
inline void check_nll_loss_args(const at::Tensor& self, const at::Tensor& target, const std::optional<at::Tensor>& weight,
                                bool per_class) {
  TORCH_CHECK(target.scalar_type() == at::kLong || target.scalar_type() == at::kByte,
              "expected target dtype to be Long or Byte, but got ", target.scalar_type());
  if (!weight || !weight->defined()) return;
  const int64_t classes = self.dim() == 0 ? 1 : self.size(self.dim() == 1 ? 0 : 1);
  if (per_class) {
    TORCH_CHECK(weight->numel() == classes, "weight tensor should be defined either for all ", classes,
                " classes or no classes but got weight tensor of shape: ", weight->sizes());
  } else {
    TORCH_CHECK(weight->numel() == classes, "weight tensor should be defined either for all or no classes");
  }
  TORCH_CHECK(weight->scalar_type() == self.scalar_type(), "expected scalar type ", self.scalar_type(), " but found ",
              weight->scalar_type());
}

// A reduction along dim `d` (wrapped) with no identity refuses an empty dim, as ATen's
// zero_numel_check_dims does (an IndexError in Python).
inline void check_reduction_dim_nonempty(const char* name, const at::Tensor& self, int64_t d) {
  TORCH_CHECK_INDEX(self.dim() == 0 || self.size(d) != 0, name, "(): Expected reduction dim ", d, " to have non-zero size.");
}

// var / std (and their _mean forms) over `dims` (reduce_dims' answer; empty: all): warned
// as ATen warns when the correction leaves no degrees of freedom.
inline void warn_degrees_of_freedom(const char* name, const at::Tensor& self, const std::vector<int64_t>& dims,
                                    double correction) {
  int64_t n = 1;
  if (dims.empty()) {
    n = self.numel();
  } else {
    for (int64_t d : dims) n *= self.size(d);
  }
  if (self.numel() > 0 && n - correction <= 0) {
    TORCH_WARN(name, "(): degrees of freedom is <= 0. Correction should be strictly less than the reduction factor "
               "(input numel divided by output numel).");
  }
}

// Finishes an op: a fresh result (in `format`: pointwise, convolution, pooling
// and normalization kernels pass op.suggested_layout, the rest are contiguous
// as on CPU), or a write into `into` (in-place / out=).
inline at::Tensor finish(OpBuilder& op, ir::Value v, at::ScalarType dtype, const at::Tensor* into,
                         const Layout& format = {}) {
  if (into) {
    at::Tensor dst = *into;
    // As ATen refuses it: an out= (or in-place) tensor whose dtype cannot hold the result.
    out_dtype(op.name().c_str(), dtype, dst);
    auto shape = op.b().dims(v);
    if (!dst.sizes().equals(shape)) {
      // A target the op also reads cannot grow under it: an in-place op whose inputs broadcast past self.
      TORCH_CHECK(!op.reads(dst), op.name(), ": output with shape ", dst.sizes(), " doesn't match the broadcast shape ",
                  c10::IntArrayRef(shape));
      at::native::resize_output(dst, shape);
    }
    op.write(dst, v);
    op.run();
    return dst;
  }
  at::Tensor t = op.output(v, dtype, format);
  op.run();
  return t;
}

// A factory's `n` values (arange, range, linspace, logspace) written into out as ATen does:
// out is resized only when its element count differs, else filled in its own row-major
// order whatever its shape and strides (a narrowed view keeps its shape).
inline at::Tensor& write_sequence(OpBuilder& op, ir::Value values, int64_t n, at::Tensor& out) {
  if (out.numel() != n) at::native::resize_output(out, {n});
  finish(op, op.b().reshape(values, vec(out.sizes())), out.scalar_type(), &out);
  return out;
}

// An out= tensor that overlaps itself or one of the op's inputs, refused as
// ATen refuses it ("unsupported operation: ... refer to a single memory location").
inline void check_out_overlap(const at::Tensor& out, std::initializer_list<at::Tensor> inputs) {
  at::assert_no_internal_overlap(out);
  for (const at::Tensor& input : inputs) {
    if (input.defined()) at::assert_no_overlap(out, input);
  }
}

// An out= variant's result: `result` (computed by the functional kernel)
// resized into and written to `out`, refused as ATen refuses it when its
// dtype cannot hold the result, it is on another device or it overlaps
// itself or one of `inputs`.
inline at::Tensor& write_out(const char* op, const at::Tensor& result, at::Tensor& out,
                             std::initializer_list<at::Tensor> inputs = {}) {
  TORCH_CHECK(out.device() == result.device(), op, ": expected out on ", result.device(), ", got ", out.device());
  out_dtype(op, result.scalar_type(), out);
  at::native::resize_output(out, result.sizes());
  check_out_overlap(out, inputs);
  out.copy_(result);
  return out;
}

// A tuple out= variant's results, each written to its out as write_out does.
inline void write_outs(const char* op, std::initializer_list<at::Tensor> results,
                       std::initializer_list<std::reference_wrapper<at::Tensor>> outs,
                       std::initializer_list<at::Tensor> inputs = {}) {
  TORCH_CHECK(results.size() == outs.size(), op, ": ", results.size(), " results for ", outs.size(), " outs");
  auto result = results.begin();
  for (at::Tensor& out : outs) write_out(op, *result++, out, inputs);
}

// Integer/bool inputs produce the default float dtype (torch's "int to float" ops).
inline at::ScalarType float_result(at::ScalarType t) {
  return at::isIntegralType(t, /*includeBool=*/true) ? c10::typeMetaToScalarType(c10::get_default_dtype()) : t;
}

// A wrapped-number 0-d CPU tensor (type promotion treats it like a Python scalar).
inline at::Tensor scalar_tensor_like(const at::Scalar& s) {
  at::Tensor t = at::scalar_tensor(s, at::TensorOptions().dtype(s.type()));
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

// The generator an RNG op uses: the given one, else the device's default.
inline at::Generator pick_generator(const std::optional<at::Generator>& gen, const at::Tensor& self) {
  if (gen.has_value() && gen->defined()) return *gen;
  return default_generator(self.device().index());
}

}  // namespace torch_pjrt::device
