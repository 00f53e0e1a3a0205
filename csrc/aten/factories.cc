// Fills and factories: fill_, zero_, arange, range, linspace, logspace, eye, triu/tril.
#include <torch/version.h>
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

at::Tensor& fill_impl(at::Tensor& self, const at::Tensor& value) {
  TORCH_CHECK(value.dim() == 0, "fill_ only supports 0-dimension value tensor but got tensor with ", value.dim(),
              " dimensions.");
  OpBuilder op("aten::fill_");
  Value v = op.b().convert(op.input(value), to_ir(self.scalar_type()));
  // One value everywhere: a self whose elements share memory (a 0 stride) is filled too, as ATen allows.
  op.write(self, op.b().broadcast_to(v, vec(self.sizes())), /*allow_overlap=*/true);
  op.run();
  return self;
}
at::Tensor& fill_scalar(at::Tensor& self, const at::Scalar& value) {
  return fill_impl(self, at::scalar_tensor(value, at::TensorOptions().dtype(self.scalar_type())));
}
at::Tensor& fill_tensor(at::Tensor& self, const at::Tensor& value) { return fill_impl(self, value); }
at::Tensor& zero_fn(at::Tensor& self) { return fill_scalar(self, 0); }

at::Tensor& arange_out(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step, at::Tensor& out) {
  // Size with torch's own rule (computed on the host, like every backend).
  double s = start.toDouble(), e = end.toDouble(), st = step.toDouble();
  TORCH_CHECK(st != 0, "step must be nonzero");
  // ATen steps integer outputs by the step converted to the integer type: torch 2.13 refuses a
  // fractional step below 1 (it would never move); 2.14 fills the size its double step gives with
  // the start, as the conversion makes it.
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 14
  TORCH_CHECK_VALUE(!at::isIntegralType(out.scalar_type(), false) || static_cast<int64_t>(st) != 0, "arange: step must be nonzero in the output's dtype ",
                    out.scalar_type(), ", got ", st);
#endif
  TORCH_CHECK(std::isfinite(s) && std::isfinite(e), "unsupported range: ", s, " -> ", e);
  TORCH_CHECK((st > 0 && e >= s) || (st < 0 && e <= s), "upper bound and larger bound inconsistent with step sign");
  const double count = std::ceil((e - s) / st);
  TORCH_CHECK(count >= 0 && count <= static_cast<double>(std::numeric_limits<int64_t>::max()),
              "invalid size, possible overflow?");
  int64_t n;
  if (at::isIntegralType(out.scalar_type(), false) && start.isIntegral(false) && end.isIntegral(false) && step.isIntegral(false)) {
    int64_t a = start.toLong(), z = end.toLong(), k = step.toLong();
    n = k > 0 ? (z - a + k - 1) / k : (a - z + (-k) - 1) / (-k);
  } else {
    n = static_cast<int64_t>(std::ceil((e - s) / st));
  }
  if (out.numel() != n) {
    // ATen's own warning for arange (rounding can make the count differ from what was meant).
    if (out.numel() > 0) {
      TORCH_WARN("The number of elements in the out tensor of shape ", out.sizes(), " is ", out.numel(),
                 " which does not match the computed number of elements ", n,
                 ". Note that this may occur as a result of rounding error. "
                 "The out tensor will be resized to a tensor of shape (", n, ",).");
    }
    out.resize_({n});
  }
  OpBuilder op("aten::arange");
  op.set_device(out.device().index());
  ir::DType d = to_ir(out.scalar_type());
  ir::DType acc = ir::is_floating(d) ? (d == ir::DType::F64 ? ir::DType::F64 : ir::DType::F32) : ir::DType::S64;
  auto& b = op.b();
  Value i = b.iota(acc, {n}, 0);
  at::ScalarType acc_t = to_aten(acc);
  Value r = b.binary("add", b.broadcast_to(op.scalar(start, acc_t), {n}),
                     b.binary("multiply", i, b.broadcast_to(op.scalar(step, acc_t), {n})));
  return write_sequence(op, r, n, out);
}

at::Tensor tri(const at::Tensor& self, int64_t diagonal, bool upper, const at::Tensor* into) {
  TORCH_CHECK(self.dim() >= 2, "tril/triu: input tensor must have at least 2 dimensions");
  OpBuilder op(upper ? "aten::triu" : "aten::tril");
  auto& b = op.b();
  Value x = op.input(self);
  auto shape = b.dims(x);
  int64_t r = static_cast<int64_t>(shape.size());
  Value row = b.iota(ir::DType::S64, shape, r - 2);
  Value col = b.iota(ir::DType::S64, shape, r - 1);
  Value diff = b.binary("subtract", col, row);  // col - row
  Value keep = b.compare(diff, b.constant_int(ir::DType::S64, diagonal, shape), upper ? "GE" : "LE");
  Value out = b.select(keep, x, b.scalar_like(x, 0));
  return finish(op, out, self.scalar_type(), into);
}
at::Tensor triu_fn(const at::Tensor& s, int64_t d) { return tri(s, d, true, nullptr); }
at::Tensor tril_fn(const at::Tensor& s, int64_t d) { return tri(s, d, false, nullptr); }
at::Tensor& triu_out(const at::Tensor& s, int64_t d, at::Tensor& out) {
  tri(s, d, true, &out);
  return out;
}
at::Tensor& tril_out(const at::Tensor& s, int64_t d, at::Tensor& out) {
  tri(s, d, false, &out);
  return out;
}
at::Tensor& triu_inplace(at::Tensor& s, int64_t d) {
  tri(s, d, true, &s);
  return s;
}
at::Tensor& tril_inplace(at::Tensor& s, int64_t d) {
  tri(s, d, false, &s);
  return s;
}

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

// torch.range: [start, end] inclusive, step apart (deprecated, still reached).
Tensor& range_out(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step, Tensor& out) {
  double s = start.toDouble(), e = end.toDouble(), st = step.toDouble();
  TORCH_CHECK(st != 0, "step must be nonzero");
  TORCH_CHECK(std::isfinite(s) && std::isfinite(e), "unsupported range: ", s, " -> ", e);
  TORCH_CHECK((st > 0 && e >= s) || (st < 0 && e <= s), "upper bound and larger bound inconsistent with step sign");
  int64_t n = static_cast<int64_t>(std::floor((e - s) / st)) + 1;
  OpBuilder op("aten::range");
  auto& b = op.b();
  ir::DType dt = at::isFloatingType(out.scalar_type()) ? to_ir(out.scalar_type()) : ir::DType::F64;
  if (ir::is_reduced_float(dt)) dt = ir::DType::F32;
  Value i = b.convert(b.iota(ir::DType::S64, {n}, 0), dt);
  Value r = b.binary("add", b.broadcast_to(op.scalar(start, to_aten(dt)), {n}),
                     b.binary("multiply", i, b.broadcast_to(op.scalar(step, to_aten(dt)), {n})));
  return write_sequence(op, b.convert(r, to_ir(out.scalar_type())), n, out);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("fill_.Scalar", fill_scalar);
  m.impl("fill_.Tensor", fill_tensor);
  m.impl("zero_", zero_fn);
  m.impl("arange.start_out", arange_out);
  m.impl("triu", triu_fn);
  m.impl("tril", tril_fn);
  m.impl("triu.out", triu_out);
  m.impl("tril.out", tril_out);
  m.impl("triu_", triu_inplace);
  m.impl("tril_", tril_inplace);
  m.impl("triu_indices", triu_indices_fn);
  m.impl("tril_indices", tril_indices_fn);
  m.impl("eye.out", eye_n_out);
  m.impl("eye.m_out", eye_out);
  m.impl("linspace.out", linspace_out);
  m.impl("logspace.out", logspace_out);
  m.impl("range.out", range_out);
}

}  // namespace torch_pjrt::device
