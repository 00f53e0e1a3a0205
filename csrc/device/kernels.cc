// Native ATen kernels for the pjrt device: each translates ATen arguments into
// IR through OpBuilder and a lowering function, then runs it (strict eager).
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/native/Resize.h>
#include <ATen/native/ReduceOpsUtils.h>
#include <ATen/native/TypeProperties.h>
#include <torch/library.h>

#include <cstring>
#include <numeric>
#include <sstream>

#include "device/context.h"
#include "device/device_name.h"
#include "device/kernel_util.h"
#include "lowering/ops.h"

namespace torch_pjrt::device {
namespace {

using ir::Value;
namespace L = lowering;

// ---------------------------------------------------------------- elementwise

at::Tensor unary_op(const char* name, const at::Tensor& self, const at::Tensor* into, bool to_float,
                    bool to_bool = false) {
  OpBuilder op(std::string("aten::") + name);
  at::ScalarType out = to_bool ? at::kBool : (to_float ? float_result(self.scalar_type()) : self.scalar_type());
  at::ScalarType compute = to_bool ? self.scalar_type() : out;
  if (self.is_complex() && (std::strcmp(name, "abs") == 0 || std::strcmp(name, "angle") == 0)) {
    out = at::toRealValueType(self.scalar_type());  // |z| and arg z are real
  }
  TORCH_CHECK(!(into == &self && self.is_complex() && std::strcmp(name, "abs") == 0),
              "In-place abs is not supported for complex tensors.");
  TORCH_CHECK(!(self.scalar_type() == at::kBool && std::strcmp(name, "neg") == 0),
              "neg: Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a mask, "
              "use the `~` or `logical_not()` operator instead.");
  if (into && !to_bool) {
    TORCH_CHECK(at::canCast(out, into->scalar_type()), device_name(), ": ", name, ": result type ", out,
                " can't be cast to the desired output type ", into->scalar_type());
  }
  Value x = op.input(self);
  Value r = L::unary(op.b(), name, x, to_ir(compute), to_ir(out));
  return finish(op, r, out, into, op.pointwise_layout(self.dim()));
}

#define UNARY_KERNELS(NAME, TO_FLOAT)                                                               \
  at::Tensor NAME##_fn(const at::Tensor& self) { return unary_op(#NAME, self, nullptr, TO_FLOAT); }  \
  at::Tensor& NAME##_inplace(at::Tensor& self) {                                                    \
    unary_op(#NAME, self, &self, TO_FLOAT);                                                          \
    return self;                                                                                     \
  }                                                                                                  \
  at::Tensor& NAME##_out(const at::Tensor& self, at::Tensor& out) {                                \
    unary_op(#NAME, self, &out, TO_FLOAT);                                                           \
    return out;                                                                                      \
  }

UNARY_KERNELS(neg, false)
UNARY_KERNELS(abs, false)
UNARY_KERNELS(exp, true)
UNARY_KERNELS(exp2, true)
UNARY_KERNELS(expm1, true)
UNARY_KERNELS(log, true)
UNARY_KERNELS(log2, true)
UNARY_KERNELS(log10, true)
UNARY_KERNELS(log1p, true)
UNARY_KERNELS(sqrt, true)
UNARY_KERNELS(rsqrt, true)
UNARY_KERNELS(sin, true)
UNARY_KERNELS(cos, true)
UNARY_KERNELS(tan, true)
UNARY_KERNELS(tanh, true)
UNARY_KERNELS(sinh, true)
UNARY_KERNELS(cosh, true)
UNARY_KERNELS(asin, true)
UNARY_KERNELS(acos, true)
UNARY_KERNELS(atan, true)
UNARY_KERNELS(sigmoid, true)
UNARY_KERNELS(erf, true)
UNARY_KERNELS(reciprocal, true)
UNARY_KERNELS(floor, false)
UNARY_KERNELS(ceil, false)
UNARY_KERNELS(round, false)
UNARY_KERNELS(trunc, false)
UNARY_KERNELS(frac, false)
UNARY_KERNELS(sign, false)
UNARY_KERNELS(bitwise_not, false)
UNARY_KERNELS(silu, false)
UNARY_KERNELS(mish, false)
UNARY_KERNELS(hardsigmoid, false)
UNARY_KERNELS(hardswish, false)
UNARY_KERNELS(asinh, true)
UNARY_KERNELS(acosh, true)
UNARY_KERNELS(atanh, true)
UNARY_KERNELS(lgamma, true)
UNARY_KERNELS(digamma, true)
UNARY_KERNELS(erfinv, true)
UNARY_KERNELS(erfc, true)
UNARY_KERNELS(special_i1e, true)
UNARY_KERNELS(special_i1, true)
UNARY_KERNELS(special_ndtri, true)
UNARY_KERNELS(special_log_ndtr, true)
UNARY_KERNELS(special_entr, true)
UNARY_KERNELS(sinc, true)
UNARY_KERNELS(deg2rad, true)
UNARY_KERNELS(rad2deg, true)
UNARY_KERNELS(angle, true)
UNARY_KERNELS(sgn, false)
UNARY_KERNELS(i0, true)
UNARY_KERNELS(special_i0e, true)

at::Tensor relu_fn(const at::Tensor& self) { return unary_op("relu", self, nullptr, false); }
at::Tensor& relu_inplace(at::Tensor& self) {
  unary_op("relu", self, &self, false);
  return self;
}

#define PREDICATE_KERNEL(NAME) \
  at::Tensor NAME##_fn(const at::Tensor& self) { return unary_op(#NAME, self, nullptr, false, true); }
PREDICATE_KERNEL(isnan)
PREDICATE_KERNEL(isinf)
PREDICATE_KERNEL(isfinite)
PREDICATE_KERNEL(isposinf)
PREDICATE_KERNEL(isneginf)
PREDICATE_KERNEL(signbit)
at::Tensor& signbit_out(const at::Tensor& self, at::Tensor& out) {
  unary_op("signbit", self, &out, false, true);
  return out;
}
at::Tensor& isposinf_out(const at::Tensor& self, at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == at::kBool, "isposinf does not support non-boolean outputs.");
  unary_op("isposinf", self, &out, false, true);
  return out;
}
at::Tensor& isneginf_out(const at::Tensor& self, at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == at::kBool, "isneginf does not support non-boolean outputs.");
  unary_op("isneginf", self, &out, false, true);
  return out;
}

at::Tensor logical_not_fn(const at::Tensor& self) { return unary_op("logical_not", self, nullptr, false, true); }
at::Tensor& logical_not_out_k(const at::Tensor& self, at::Tensor& out) {
  OpBuilder op("aten::logical_not");
  Value r = L::unary(op.b(), "logical_not", op.input(self), to_ir(self.scalar_type()), to_ir(out.scalar_type()));
  finish(op, r, out.scalar_type(), &out);
  return out;
}
at::Tensor& logical_not_inplace(at::Tensor& self) { return logical_not_out_k(self, self); }

// Binary: `compute` is the promoted dtype; comparisons produce bool.
at::Tensor binary_op(const char* name, const at::Tensor& self, const at::Tensor& other, const at::Tensor* into,
                     bool comparison = false, bool true_div = false) {
  // Orderings of complex numbers are refused, in ATen's words (names compared only for
  // complex operands: this is every binary op's path).
  if (self.is_complex() || other.is_complex()) {
    for (const char* ordering : {"maximum", "minimum", "fmax", "fmin"}) {
      TORCH_CHECK(std::strcmp(name, ordering) != 0, name, " not implemented for complex tensors.");
    }
  }
  OpBuilder op(std::string("aten::") + name);
  at::ScalarType common = at::result_type(self, other);
  if (true_div) common = float_result(common);
  at::ScalarType out = comparison ? at::kBool : common;
  if (into) {
    TORCH_CHECK(at::canCast(out, into->scalar_type()), device_name(), ": ", name, ": result type ", out,
                " can't be cast to the desired output type ", into->scalar_type());
  }
  Value x = op.input(self);
  Value y = op.input(other);
  std::vector<int64_t> shape;
  try {
    shape = ir::broadcast_shapes(op.b().dims(x), op.b().dims(y));
  } catch (const std::invalid_argument&) {
    try {
      at::infer_size(self.sizes(), other.sizes());  // PyTorch's own message, which callers match
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, device_name(), ": ", name, ": ", e.what_without_backtrace());
    }
    throw;
  }
  if (into && into->is_same(self)) {
    TORCH_CHECK(self.sizes().equals(shape), device_name(), ": ", name, "_: output with shape ", self.sizes(),
                " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
  }
  // ATen multiplies and divides a half or bfloat16 tensor by a Python scalar in float (its
  // opmath type): the scalar is not rounded to the tensor's dtype first (1e5 is no half).
  const bool scalar_operand =
      self.unsafeGetTensorImpl()->is_wrapped_number() || other.unsafeGetTensorImpl()->is_wrapped_number();
  if (scalar_operand && (common == at::kHalf || common == at::kBFloat16) &&
      (std::strcmp(name, "mul") == 0 || std::strcmp(name, "div") == 0)) {
    Value r = L::binary(op.b(), name, x, y, ir::DType::F32, ir::DType::F32);
    return finish(op, op.b().convert(r, to_ir(out)), out, into, op.pointwise_layout(static_cast<int64_t>(shape.size())));
  }
  Value r = L::binary(op.b(), name, x, y, to_ir(common), to_ir(out));
  return finish(op, r, out, into, op.pointwise_layout(static_cast<int64_t>(shape.size())));
}


#define BINARY_KERNELS(NAME, OVERLOAD, CMP, TDIV)                                                          \
  at::Tensor NAME##_fn(const at::Tensor& self, const at::Tensor& other) {                                \
    return binary_op(#NAME, self, other, nullptr, CMP, TDIV);                                           \
  }                                                                                                       \
  at::Tensor& NAME##_inplace(at::Tensor& self, const at::Tensor& other) {                               \
    binary_op(#NAME, self, other, &self, CMP, TDIV);                                                     \
    return self;                                                                                          \
  }                                                                                                       \
  at::Tensor& NAME##_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {           \
    binary_op(#NAME, self, other, &out, CMP, TDIV);                                                      \
    return out;                                                                                           \
  }                                                                                                       \
  at::Tensor NAME##_s(const at::Tensor& self, const at::Scalar& other) {                                \
    return binary_op(#NAME, self, scalar_tensor_like(other), nullptr, CMP, TDIV);                       \
  }                                                                                                       \
  at::Tensor& NAME##_s_inplace(at::Tensor& self, const at::Scalar& other) {                             \
    binary_op(#NAME, self, scalar_tensor_like(other), &self, CMP, TDIV);                                 \
    return self;                                                                                          \
  }                                                                                                       \
  at::Tensor& NAME##_s_out(const at::Tensor& self, const at::Scalar& other, at::Tensor& out) {          \
    binary_op(#NAME, self, scalar_tensor_like(other), &out, CMP, TDIV);                                  \
    return out;                                                                                           \
  }

BINARY_KERNELS(mul, Tensor, false, false)
BINARY_KERNELS(eq, Tensor, true, false)
BINARY_KERNELS(ne, Tensor, true, false)
BINARY_KERNELS(lt, Tensor, true, false)
BINARY_KERNELS(le, Tensor, true, false)
BINARY_KERNELS(gt, Tensor, true, false)
BINARY_KERNELS(ge, Tensor, true, false)
BINARY_KERNELS(maximum, Tensor, false, false)
BINARY_KERNELS(minimum, Tensor, false, false)
BINARY_KERNELS(atan2, Tensor, false, true)
BINARY_KERNELS(remainder, Tensor, false, false)
BINARY_KERNELS(fmod, Tensor, false, false)
BINARY_KERNELS(bitwise_and, Tensor, false, false)
BINARY_KERNELS(bitwise_or, Tensor, false, false)
BINARY_KERNELS(bitwise_xor, Tensor, false, false)
BINARY_KERNELS(logical_and, Tensor, true, false)
BINARY_KERNELS(logical_or, Tensor, true, false)
BINARY_KERNELS(logical_xor, Tensor, true, false)
BINARY_KERNELS(xlogy, Tensor, false, true)
BINARY_KERNELS(special_xlog1py, Tensor, false, true)
BINARY_KERNELS(special_zeta, Tensor, false, true)
BINARY_KERNELS(logaddexp, Tensor, false, true)
BINARY_KERNELS(logaddexp2, Tensor, false, true)
BINARY_KERNELS(hypot, Tensor, false, true)
BINARY_KERNELS(copysign, Tensor, false, true)
BINARY_KERNELS(nextafter, Tensor, false, false)
BINARY_KERNELS(fmax, Tensor, false, false)
BINARY_KERNELS(fmin, Tensor, false, false)
// heaviside: ATen's checks (same dtypes everywhere, no complex), then the pointwise kernel.
void check_heaviside(const at::Tensor& self, const at::Tensor& values, const at::Tensor* out) {
  TORCH_CHECK(!self.is_complex() && !values.is_complex() && (!out || !out->is_complex()),
              "heaviside is not yet implemented for complex tensors.");
  TORCH_CHECK(self.dtype() == values.dtype() && (!out || out->dtype() == self.dtype()),
              "heaviside is not yet implemented for tensors with different dtypes.");
}
at::Tensor heaviside_fn(const at::Tensor& self, const at::Tensor& values) {
  check_heaviside(self, values, nullptr);
  return binary_op("heaviside", self, values, nullptr, false, false);
}
at::Tensor& heaviside_inplace(at::Tensor& self, const at::Tensor& values) {
  check_heaviside(self, values, &self);
  binary_op("heaviside", self, values, &self, false, false);
  return self;
}
at::Tensor& heaviside_out(const at::Tensor& self, const at::Tensor& values, at::Tensor& out) {
  check_heaviside(self, values, &out);
  binary_op("heaviside", self, values, &out, false, false);
  return out;
}
BINARY_KERNELS(bitwise_left_shift, Tensor, false, false)
BINARY_KERNELS(bitwise_right_shift, Tensor, false, false)
BINARY_KERNELS(div_floor, Tensor, false, false)

// Autograd's placeholder for gradients known to be zero.
at::Tensor efficient_zero_tensor(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                                 std::optional<at::Layout> layout, std::optional<at::Device> device,
                                 std::optional<bool> pin_memory) {
  return at::zeros(size, at::TensorOptions().dtype(dtype).layout(layout).device(device).pinned_memory(pin_memory));
}

at::Tensor polygamma_impl(int64_t n, const at::Tensor& self, const at::Tensor* into) {
  TORCH_CHECK(n >= 0, "polygamma(n, x) does not support negative n.");
  OpBuilder op("aten::polygamma");
  at::ScalarType out = float_result(self.scalar_type());
  auto& b = op.b();
  ir::DType acc = L::accumulate_type(to_ir(out));
  Value r = L::polygamma(b, n, b.convert(op.input(self), acc));
  return finish(op, b.convert(r, to_ir(out)), out, into, op.pointwise_layout(self.dim()));
}
at::Tensor polygamma_fn(int64_t n, const at::Tensor& s) { return polygamma_impl(n, s, nullptr); }
at::Tensor& polygamma_out(int64_t n, const at::Tensor& s, at::Tensor& out) {
  polygamma_impl(n, s, &out);
  return out;
}

at::Tensor nan_to_num_impl(const at::Tensor& self, std::optional<double> nan, std::optional<double> posinf,
                           std::optional<double> neginf, const at::Tensor* into) {
  OpBuilder op("aten::nan_to_num");
  auto& b = op.b();
  Value x = op.input(self);
  if (!at::isFloatingType(self.scalar_type())) return finish(op, x, self.scalar_type(), into, op.pointwise_layout(self.dim()));
  double big = 0;
  switch (self.scalar_type()) {
    case at::kHalf: big = 65504.0; break;
    case at::kBFloat16: big = 3.3895313892515355e38; break;
    case at::kDouble: big = std::numeric_limits<double>::max(); break;
    default: big = std::numeric_limits<float>::max(); break;
  }
  at::ScalarType t = self.scalar_type();
  Value r = b.select(b.compare(x, x, "NE"), b.broadcast_to(op.scalar(nan.value_or(0.0), t), b.dims(x)), x);
  r = b.select(b.compare(x, b.scalar_like(x, INFINITY), "EQ"), b.broadcast_to(op.scalar(posinf.value_or(big), t), b.dims(x)), r);
  r = b.select(b.compare(x, b.scalar_like(x, -INFINITY), "EQ"), b.broadcast_to(op.scalar(neginf.value_or(-big), t), b.dims(x)), r);
  return finish(op, r, self.scalar_type(), into, op.pointwise_layout(self.dim()));
}
at::Tensor nan_to_num_fn(const at::Tensor& s, std::optional<double> n, std::optional<double> p, std::optional<double> m) {
  return nan_to_num_impl(s, n, p, m, nullptr);
}
at::Tensor& nan_to_num_out(const at::Tensor& s, std::optional<double> n, std::optional<double> p, std::optional<double> m,
                           at::Tensor& out) {
  nan_to_num_impl(s, n, p, m, &out);
  return out;
}
at::Tensor& nan_to_num_inplace(at::Tensor& s, std::optional<double> n, std::optional<double> p, std::optional<double> m) {
  nan_to_num_impl(s, n, p, m, &s);
  return s;
}

at::Tensor logit_impl(const at::Tensor& self, std::optional<double> eps, const at::Tensor* into) {
  OpBuilder op("aten::logit");
  at::ScalarType out = float_result(self.scalar_type());
  auto& b = op.b();
  Value x = b.convert(op.input(self), to_ir(out));
  if (eps) {
    Value lo = b.scalar_like(x, *eps), hi = b.scalar_like(x, 1.0 - *eps);
    x = L::clamp(b, x, &lo, &hi, b.dtype(x));
  }
  Value r = b.unary("log", b.binary("divide", x, b.binary("subtract", b.scalar_like(x, 1), x)));
  return finish(op, r, out, into, op.pointwise_layout(self.dim()));
}
at::Tensor logit_fn(const at::Tensor& s, std::optional<double> eps) { return logit_impl(s, eps, nullptr); }
at::Tensor& logit_out(const at::Tensor& s, std::optional<double> eps, at::Tensor& out) {
  logit_impl(s, eps, &out);
  return out;
}
at::Tensor& logit_inplace(at::Tensor& s, std::optional<double> eps) {
  logit_impl(s, eps, &s);
  return s;
}

// add/sub with alpha (a runtime scalar, never baked into the program).
at::Tensor add_sub(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha, const at::Tensor* into,
                   bool subtract) {
  const char* name = subtract ? "sub" : "add";
  if (subtract) {
    TORCH_CHECK(self.scalar_type() != at::kBool || other.scalar_type() != at::kBool,
                "Subtraction, the `-` operator, with two bool tensors is not supported. "
                "Use the `^` or `logical_xor()` operator instead.");
  }
  if (alpha.isFloatingPoint() || !(alpha.isIntegral(false) && alpha.toLong() == 1)) {
    OpBuilder op(std::string("aten::") + name);
    at::ScalarType common = at::result_type(self, other);
    // ATen's alpha_check, in its order.
    TORCH_CHECK(!alpha.isBoolean() || common == at::kBool, "Boolean alpha only supported for Boolean results.");
    TORCH_CHECK(at::isFloatingType(common) || at::isComplexType(common) || alpha.isIntegral(/*includeBool=*/true),
                "For integral input tensors, argument alpha must not be a floating point number.");
    TORCH_CHECK(at::isComplexType(common) || !alpha.isComplex(),
                "For non-complex input tensors, argument alpha must not be a complex number.");
    Value x = op.input(self), y = op.input(other);
    auto shape = ir::broadcast_shapes(op.b().dims(x), op.b().dims(y));
    if (into && into->is_same(self)) {
      TORCH_CHECK(self.sizes().equals(shape), device_name(), ": ", name, "_: output with shape ", self.sizes(),
                  " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
    }
    Value r = L::add_scaled(op.b(), x, y, op.scalar(alpha, common), to_ir(common), subtract);
    return finish(op, r, common, into, op.pointwise_layout(static_cast<int64_t>(shape.size())));
  }
  return binary_op(name, self, other, into);
}

at::Tensor add_fn(const at::Tensor& s, const at::Tensor& o, const at::Scalar& a) { return add_sub(s, o, a, nullptr, false); }
at::Tensor& add_inplace(at::Tensor& s, const at::Tensor& o, const at::Scalar& a) {
  add_sub(s, o, a, &s, false);
  return s;
}
at::Tensor& add_out(const at::Tensor& s, const at::Tensor& o, const at::Scalar& a, at::Tensor& out) {
  add_sub(s, o, a, &out, false);
  return out;
}
at::Tensor sub_fn(const at::Tensor& s, const at::Tensor& o, const at::Scalar& a) { return add_sub(s, o, a, nullptr, true); }
at::Tensor& sub_inplace(at::Tensor& s, const at::Tensor& o, const at::Scalar& a) {
  add_sub(s, o, a, &s, true);
  return s;
}
at::Tensor& sub_out(const at::Tensor& s, const at::Tensor& o, const at::Scalar& a, at::Tensor& out) {
  add_sub(s, o, a, &out, true);
  return out;
}

at::Tensor div_mode(const at::Tensor& self, const at::Tensor& other, std::optional<c10::string_view> mode,
                    const at::Tensor* into) {
  if (!mode) return binary_op("div", self, other, into, false, true);
  if (*mode == "trunc") return binary_op("div_trunc", self, other, into);
  TORCH_CHECK(*mode == "floor", "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '", *mode, "'");
  return binary_op("div_floor", self, other, into);
}
at::Tensor div_fn(const at::Tensor& s, const at::Tensor& o) { return div_mode(s, o, std::nullopt, nullptr); }
at::Tensor& div_inplace(at::Tensor& s, const at::Tensor& o) {
  div_mode(s, o, std::nullopt, &s);
  return s;
}
at::Tensor& div_out(const at::Tensor& s, const at::Tensor& o, at::Tensor& out) {
  div_mode(s, o, std::nullopt, &out);
  return out;
}
at::Tensor div_mode_fn(const at::Tensor& s, const at::Tensor& o, std::optional<c10::string_view> m) {
  return div_mode(s, o, m, nullptr);
}
at::Tensor& div_mode_inplace(at::Tensor& s, const at::Tensor& o, std::optional<c10::string_view> m) {
  div_mode(s, o, m, &s);
  return s;
}
at::Tensor& div_mode_out(const at::Tensor& s, const at::Tensor& o, std::optional<c10::string_view> m, at::Tensor& out) {
  div_mode(s, o, m, &out);
  return out;
}

// pow: computed in the promoted dtype.
at::Tensor pow_tt(const at::Tensor& s, const at::Tensor& e) { return binary_op("pow", s, e, nullptr); }
at::Tensor& pow_tt_out(const at::Tensor& s, const at::Tensor& e, at::Tensor& out) {
  binary_op("pow", s, e, &out);
  return out;
}
at::Tensor& pow_tt_inplace(at::Tensor& s, const at::Tensor& e) {
  binary_op("pow", s, e, &s);
  return s;
}
// As ATen: an integer tensor to a negative integer scalar power is refused (its result is no integer).
void check_integer_power(const at::Tensor& base, const at::Scalar& exponent) {
  TORCH_CHECK(!(at::isIntegralType(base.scalar_type(), true) && exponent.isIntegral(true) && exponent.toLong() < 0),
              "Integers to negative integer powers are not allowed.");
}
at::Tensor pow_ts(const at::Tensor& s, const at::Scalar& e) {
  check_integer_power(s, e);
  return binary_op("pow", s, scalar_tensor_like(e), nullptr);
}
at::Tensor& pow_ts_out(const at::Tensor& s, const at::Scalar& e, at::Tensor& out) {
  check_integer_power(s, e);
  binary_op("pow", s, scalar_tensor_like(e), &out);
  return out;
}
at::Tensor& pow_ts_inplace(at::Tensor& s, const at::Scalar& e) {
  check_integer_power(s, e);
  binary_op("pow", s, scalar_tensor_like(e), &s);
  return s;
}
at::Tensor pow_st(const at::Scalar& s, const at::Tensor& e) { return binary_op("pow", scalar_tensor_like(s), e, nullptr); }

// ---------------------------------------------------------------- ternary

at::Tensor where_self(const at::Tensor& cond, const at::Tensor& self, const at::Tensor& other) {
  OpBuilder op("aten::where");
  at::ScalarType out = at::result_type(self, other);
  Value c = op.input(cond), x = op.input(self), y = op.input(other);  // in order: the layout follows it
  Value r = L::where(op.b(), c, x, y, to_ir(out));
  return finish(op, r, out, nullptr, op.pointwise_layout(self.dim()));
}
at::Tensor& where_out(const at::Tensor& cond, const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  const at::ScalarType result = at::result_type(self, other);
  TORCH_CHECK(out.scalar_type() == result, "Expected out type to be ", result, " but got ", out.scalar_type());
  OpBuilder op("aten::where");
  Value c = op.input(cond), x = op.input(self), y = op.input(other);
  Value r = L::where(op.b(), c, x, y, to_ir(out.scalar_type()));
  finish(op, r, out.scalar_type(), &out);
  return out;
}

at::Tensor& masked_fill_impl(at::Tensor& self, const at::Tensor& mask, const at::Tensor& value) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "masked_fill_ only supports boolean masks, but got mask with dtype ",
              mask.scalar_type());
  TORCH_CHECK(value.dim() == 0, "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with ",
              value.dim(), " dimension(s).");
  OpBuilder op("aten::masked_fill_");
  Value x = op.input(self);
  Value m = op.input(mask);
  auto shape = ir::broadcast_shapes(op.b().dims(x), op.b().dims(m));
  TORCH_CHECK(self.sizes().equals(shape), device_name(), ": masked_fill_: mask of shape ", mask.sizes(),
              " cannot be broadcast to ", self.sizes());
  Value r = L::where(op.b(), m, op.input(value), x, to_ir(self.scalar_type()));
  finish(op, r, self.scalar_type(), &self);
  return self;
}
at::Tensor& masked_fill_scalar(at::Tensor& self, const at::Tensor& mask, const at::Scalar& value) {
  return masked_fill_impl(self, mask, at::scalar_tensor(value, at::TensorOptions().dtype(self.scalar_type())));
}
at::Tensor& masked_fill_tensor(at::Tensor& self, const at::Tensor& mask, const at::Tensor& value) {
  // A complex value into a real tensor: ATen converts the value as a scalar, refusing a lost imaginary part.
  if (value.is_complex() && !self.is_complex() && value.dim() == 0) return masked_fill_scalar(self, mask, value.item());
  return masked_fill_impl(self, mask, value);
}

at::Tensor clamp_impl(const at::Tensor& self, const std::optional<at::Tensor>& lo, const std::optional<at::Tensor>& hi,
                      const at::Tensor* into) {
  TORCH_CHECK(lo.has_value() || hi.has_value(), "torch.clamp: At least one of 'min' or 'max' must not be None");
  OpBuilder op("aten::clamp");
  at::ScalarType out = self.scalar_type();
  if (lo) out = at::promote_types(out, at::native::result_type(self, *lo));
  if (hi) out = at::promote_types(out, at::native::result_type(self, *hi));
  if (into) out = out_dtype("clamp", out, *into);
  Value x = op.input(self);
  Value l, h;
  if (lo) l = op.input(*lo);
  if (hi) h = op.input(*hi);
  Value r = L::clamp(op.b(), x, lo ? &l : nullptr, hi ? &h : nullptr, to_ir(out));
  return finish(op, r, out, into, op.pointwise_layout(self.dim()));
}
std::optional<at::Tensor> opt_scalar(const std::optional<at::Scalar>& s) {
  if (!s) return std::nullopt;
  return scalar_tensor_like(*s);
}
at::Tensor clamp_fn(const at::Tensor& s, const std::optional<at::Scalar>& lo, const std::optional<at::Scalar>& hi) {
  return clamp_impl(s, opt_scalar(lo), opt_scalar(hi), nullptr);
}
at::Tensor& clamp_inplace(at::Tensor& s, const std::optional<at::Scalar>& lo, const std::optional<at::Scalar>& hi) {
  clamp_impl(s, opt_scalar(lo), opt_scalar(hi), &s);
  return s;
}
at::Tensor& clamp_out(const at::Tensor& s, const std::optional<at::Scalar>& lo, const std::optional<at::Scalar>& hi,
                      at::Tensor& out) {
  clamp_impl(s, opt_scalar(lo), opt_scalar(hi), &out);
  return out;
}
at::Tensor clamp_t(const at::Tensor& s, const std::optional<at::Tensor>& lo, const std::optional<at::Tensor>& hi) {
  return clamp_impl(s, lo, hi, nullptr);
}
at::Tensor& clamp_t_inplace(at::Tensor& s, const std::optional<at::Tensor>& lo, const std::optional<at::Tensor>& hi) {
  clamp_impl(s, lo, hi, &s);
  return s;
}
at::Tensor& clamp_t_out(const at::Tensor& s, const std::optional<at::Tensor>& lo, const std::optional<at::Tensor>& hi,
                        at::Tensor& out) {
  clamp_impl(s, lo, hi, &out);
  return out;
}

// clamp_min / clamp_max: one-sided clamp, Scalar or Tensor bound, functional / in-place / out=.
#define ONE_SIDED_CLAMP(NAME, LO, HI)                                                                  \
  at::Tensor NAME##_s(const at::Tensor& s, const at::Scalar& v) {                                      \
    return clamp_impl(s, LO(scalar_tensor_like(v)), HI(scalar_tensor_like(v)), nullptr);              \
  }                                                                                                    \
  at::Tensor NAME##_t(const at::Tensor& s, const at::Tensor& v) { return clamp_impl(s, LO(v), HI(v), nullptr); } \
  at::Tensor& NAME##_s_inplace(at::Tensor& s, const at::Scalar& v) {                                   \
    clamp_impl(s, LO(scalar_tensor_like(v)), HI(scalar_tensor_like(v)), &s);                          \
    return s;                                                                                          \
  }                                                                                                    \
  at::Tensor& NAME##_t_inplace(at::Tensor& s, const at::Tensor& v) {                                   \
    clamp_impl(s, LO(v), HI(v), &s);                                                                   \
    return s;                                                                                          \
  }                                                                                                    \
  at::Tensor& NAME##_s_out(const at::Tensor& s, const at::Scalar& v, at::Tensor& out) {                \
    clamp_impl(s, LO(scalar_tensor_like(v)), HI(scalar_tensor_like(v)), &out);                        \
    return out;                                                                                        \
  }                                                                                                    \
  at::Tensor& NAME##_t_out(const at::Tensor& s, const at::Tensor& v, at::Tensor& out) {                \
    clamp_impl(s, LO(v), HI(v), &out);                                                                 \
    return out;                                                                                        \
  }
std::optional<at::Tensor> bound(const at::Tensor& t) { return t; }
std::optional<at::Tensor> no_bound(const at::Tensor&) { return std::nullopt; }
ONE_SIDED_CLAMP(clamp_min, bound, no_bound)
ONE_SIDED_CLAMP(clamp_max, no_bound, bound)

// addcmul/addcdiv/lerp (optimizer updates).
at::Tensor addc(const char* name, const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2,
                const at::Scalar& value, const at::Tensor* into, bool divide) {
  OpBuilder op(std::string("aten::") + name);
  at::ScalarType common = at::native::result_type(std::vector<at::Tensor>{self, t1, t2});
  auto c = to_ir(common);
  auto& b = op.b();
  Value x = b.convert(op.input(self), c), a = b.convert(op.input(t1), c), d = b.convert(op.input(t2), c);
  auto shape = ir::broadcast_shapes(ir::broadcast_shapes(b.dims(x), b.dims(a)), b.dims(d));
  x = b.broadcast_to(x, shape);
  a = b.broadcast_to(a, shape);
  d = b.broadcast_to(d, shape);
  Value v = b.broadcast_to(op.scalar(value, common), shape);
  Value prod = b.binary(divide ? "divide" : "multiply", a, d);
  Value r = b.binary("add", x, b.binary("multiply", v, prod));
  return finish(op, r, common, into, op.pointwise_layout(self.dim()));
}
at::Tensor& addcmul_out(const at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& v, at::Tensor& out) {
  addc("addcmul", s, a, b, v, &out, false);
  return out;
}
at::Tensor addcmul_fn(const at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& v) {
  return addc("addcmul", s, a, b, v, nullptr, false);
}
at::Tensor& addcmul_inplace(at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& v) {
  addc("addcmul", s, a, b, v, &s, false);
  return s;
}
at::Tensor& addcdiv_out(const at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& v, at::Tensor& out) {
  addc("addcdiv", s, a, b, v, &out, true);
  return out;
}
at::Tensor addcdiv_fn(const at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& v) {
  return addc("addcdiv", s, a, b, v, nullptr, true);
}
at::Tensor& addcdiv_inplace(at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& v) {
  addc("addcdiv", s, a, b, v, &s, true);
  return s;
}

at::Tensor lerp_impl(const at::Tensor& self, const at::Tensor& end, const at::Tensor& weight, const at::Tensor* into) {
  OpBuilder op("aten::lerp");
  auto& b = op.b();
  auto c = to_ir(self.scalar_type());
  Value x = op.input(self), e = b.convert(op.input(end), c), w = b.convert(op.input(weight), c);
  auto shape = ir::broadcast_shapes(ir::broadcast_shapes(b.dims(x), b.dims(e)), b.dims(w));
  x = b.broadcast_to(x, shape);
  e = b.broadcast_to(e, shape);
  w = b.broadcast_to(w, shape);
  Value r = b.binary("add", x, b.binary("multiply", w, b.binary("subtract", e, x)));
  return finish(op, r, self.scalar_type(), into, op.pointwise_layout(self.dim()));
}
at::Tensor& lerp_s_inplace(at::Tensor& s, const at::Tensor& e, const at::Scalar& w) {
  lerp_impl(s, e, at::scalar_tensor(w, at::TensorOptions().dtype(s.scalar_type())), &s);
  return s;
}
at::Tensor& lerp_t_inplace(at::Tensor& s, const at::Tensor& e, const at::Tensor& w) {
  lerp_impl(s, e, w, &s);
  return s;
}
at::Tensor lerp_s(const at::Tensor& s, const at::Tensor& e, const at::Scalar& w) {
  return lerp_impl(s, e, at::scalar_tensor(w, at::TensorOptions().dtype(s.scalar_type())), nullptr);
}
at::Tensor lerp_t(const at::Tensor& s, const at::Tensor& e, const at::Tensor& w) { return lerp_impl(s, e, w, nullptr); }

// ---------------------------------------------------------------- fills and factories

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
  // ATen steps integer outputs by the step converted to the integer type: a fractional step below 1 would never move.
  TORCH_CHECK_VALUE(!at::isIntegralType(out.scalar_type(), false) || static_cast<int64_t>(st) != 0, "arange: step must be nonzero in the output's dtype ",
                    out.scalar_type(), ", got ", st);
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

// ---------------------------------------------------------------- reductions

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

// ---------------------------------------------------------------- matmul

void check_matmul_dtypes(const char* name, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "expected m1 and m2 to have the same dtype, but got: ",
              a.scalar_type(), " != ", b.scalar_type());
}

at::Tensor mm_impl(const at::Tensor& a, const at::Tensor& b, const at::Tensor* into) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected 2-D tensors, got ", a.dim(), "-D and ", b.dim(), "-D");
  TORCH_CHECK(a.size(1) == b.size(0), "mat1 and mat2 shapes cannot be multiplied (", a.size(0), "x", a.size(1),
              " and ", b.size(0), "x", b.size(1), ")");
  check_matmul_dtypes("mm", a, b);
  OpBuilder op("aten::mm");
  Value r = L::matmul_2d(op.b(), op.input(a), op.input(b), to_ir(a.scalar_type()));
  return finish(op, r, a.scalar_type(), into);
}
at::Tensor mm_fn(const at::Tensor& a, const at::Tensor& b) { return mm_impl(a, b, nullptr); }
at::Tensor& mm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& o) {
  mm_impl(a, b, &o);
  return o;
}

at::Tensor bmm_impl(const at::Tensor& a, const at::Tensor& b, const at::Tensor* into) {
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3, "batch1 must be a 3D tensor");
  TORCH_CHECK(a.size(0) == b.size(0) && a.size(2) == b.size(1), "Expected size for first two dimensions of batch2 tensor to be: [",
              a.size(0), ", ", a.size(2), "] but got: [", b.size(0), ", ", b.size(1), "].");
  check_matmul_dtypes("bmm", a, b);
  OpBuilder op("aten::bmm");
  Value r = L::bmm(op.b(), op.input(a), op.input(b), to_ir(a.scalar_type()));
  return finish(op, r, a.scalar_type(), into);
}
at::Tensor bmm_fn(const at::Tensor& a, const at::Tensor& b) { return bmm_impl(a, b, nullptr); }
at::Tensor& bmm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& o) {
  bmm_impl(a, b, &o);
  return o;
}

// beta * self + alpha * (a @ b); beta == 0 ignores self (even NaN), as torch does.
bool is_zero(const at::Scalar& s) {
  if (s.isComplex()) return s.toComplexDouble() == c10::complex<double>(0, 0);
  return s.isIntegral(false) ? s.toLong() == 0 : s.toDouble() == 0.0;
}

at::Tensor addmm_impl(const char* name, const at::Tensor& self, const at::Tensor& a, const at::Tensor& b,
                      const at::Scalar& beta, const at::Scalar& alpha, const at::Tensor* into, bool batched) {
  check_matmul_dtypes(name, a, b);
  if (batched) {
    TORCH_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(2) == b.size(1), name, ": incompatible shapes");
  } else {
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2, name, ": expected 2-D matrices");
    TORCH_CHECK(a.size(1) == b.size(0), "mat1 and mat2 shapes cannot be multiplied (", a.size(0), "x", a.size(1),
                " and ", b.size(0), "x", b.size(1), ")");
  }
  OpBuilder op(std::string("aten::") + name);
  auto& bd = op.b();
  auto dt = to_ir(a.scalar_type());
  Value prod = batched ? L::bmm(bd, op.input(a), op.input(b), dt) : L::matmul_2d(bd, op.input(a), op.input(b), dt);
  auto shape = bd.dims(prod);
  Value r = bd.binary("multiply", prod, bd.broadcast_to(op.scalar(alpha, a.scalar_type()), shape));
  if (!is_zero(beta)) {
    Value c = bd.broadcast_to(bd.convert(op.input(self), dt), shape);
    c = bd.binary("multiply", c, bd.broadcast_to(op.scalar(beta, a.scalar_type()), shape));
    r = bd.binary("add", r, c);
  }
  return finish(op, r, a.scalar_type(), into);
}
at::Tensor addmm_fn(const at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta, const at::Scalar& alpha) {
  return addmm_impl("addmm", s, a, b, beta, alpha, nullptr, false);
}
at::Tensor& addmm_out(const at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                      const at::Scalar& alpha, at::Tensor& o) {
  addmm_impl("addmm", s, a, b, beta, alpha, &o, false);
  return o;
}
at::Tensor& addmm_inplace(at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta, const at::Scalar& alpha) {
  addmm_impl("addmm", s, a, b, beta, alpha, &s, false);
  return s;
}
at::Tensor baddbmm_fn(const at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta, const at::Scalar& alpha) {
  return addmm_impl("baddbmm", s, a, b, beta, alpha, nullptr, true);
}
at::Tensor& baddbmm_out(const at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                        const at::Scalar& alpha, at::Tensor& o) {
  addmm_impl("baddbmm", s, a, b, beta, alpha, &o, true);
  return o;
}

at::Tensor dot_fn(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "dot : expected both vectors to have same dtype, but found ",
              a.scalar_type(), " and ", b.scalar_type());
  TORCH_CHECK(a.dim() == 1 && b.dim() == 1, "1D tensors expected, but got ", a.dim(), "D and ", b.dim(), "D tensors");
  TORCH_CHECK(a.size(0) == b.size(0), "inconsistent tensor size, expected tensor [", a.size(0),
              "] and src [", b.size(0), "] to have the same number of elements, but got ", a.size(0), " and ", b.size(0),
              " elements respectively");
  check_matmul_dtypes("dot", a, b);
  OpBuilder op("aten::dot");
  return finish(op, L::dot(op.b(), op.input(a), op.input(b), to_ir(a.scalar_type())), a.scalar_type(), nullptr);
}

at::Tensor addmv_impl(const at::Tensor& self, const at::Tensor& mat, const at::Tensor& v, const at::Scalar& beta,
                      const at::Scalar& alpha, const at::Tensor* into) {
  TORCH_CHECK(mat.dim() == 2 && v.dim() == 1 && mat.size(1) == v.size(0), "size mismatch, got input (",
              self.sizes(), "), mat (", mat.sizes(), "), vec (", v.sizes(), ")");
  check_matmul_dtypes("addmv", mat, v);
  OpBuilder op("aten::addmv");
  auto& bd = op.b();
  auto dt = to_ir(mat.scalar_type());
  Value prod = bd.dot_general(op.input(mat), op.input(v), {}, {}, {1}, {0}, dt);
  auto shape = bd.dims(prod);
  Value r = bd.binary("multiply", prod, bd.broadcast_to(op.scalar(alpha, mat.scalar_type()), shape));
  if (!is_zero(beta)) {
    Value c = bd.broadcast_to(bd.convert(op.input(self), dt), shape);
    r = bd.binary("add", r, bd.binary("multiply", c, bd.broadcast_to(op.scalar(beta, mat.scalar_type()), shape)));
  }
  return finish(op, r, mat.scalar_type(), into);
}
at::Tensor addmv_fn(const at::Tensor& s, const at::Tensor& m, const at::Tensor& v, const at::Scalar& b, const at::Scalar& a) {
  return addmv_impl(s, m, v, b, a, nullptr);
}
at::Tensor& addmv_out(const at::Tensor& s, const at::Tensor& m, const at::Tensor& v, const at::Scalar& b,
                      const at::Scalar& a, at::Tensor& o) {
  addmv_impl(s, m, v, b, a, &o);
  return o;
}

// ---------------------------------------------------------------- shapes and indexing

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
  OpBuilder op(reduce.empty() ? "aten::scatter" : "aten::scatter_" + reduce);
  Value x = op.input(self), idx = op.input(index);
  if (self.dim() == 0) x = op.b().reshape(x, {1});
  int64_t size = op.b().dims(x)[d];
  op.check_flag(L::index_out_of_range(op.b(), idx, size), "index out of range in aten::scatter (size " + std::to_string(size) + ")");
  Value s = src.dim() == 0 ? op.b().broadcast_to(op.input(src), vec(index.sizes())) : op.input(src);
  Value r = L::scatter(op.b(), x, d, idx, s, reduce);
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
  for (size_t k = 0; k < p.index.size(); ++k) {
    Value v = op.input(p.index[k]);
    int64_t size = p.src.size(static_cast<int64_t>(k));
    op.check_flag(L::index_out_of_range(op.b(), v, size), "index out of range in aten::index_put_ (dimension size " +
                                                              std::to_string(size) + ")");
    vs.push_back(v);
  }
  Value vals = op.input(values);
  auto& b = op.b();
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
  Value r = L::index_put(b, op.input(p.src), vs, vals, accumulate);
  // Write through the permuted view of self.
  op.write(p.src, r);
  op.run();
  return self;
}

// ---------------------------------------------------------------- nn

at::Tensor threshold_backward_fn(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& threshold) {
  OpBuilder op("aten::threshold_backward");
  auto& b = op.b();
  Value g = op.input(grad), x = b.convert(op.input(self), to_ir(grad.scalar_type()));
  auto shape = ir::broadcast_shapes(b.dims(g), b.dims(x));
  g = b.broadcast_to(g, shape);
  x = b.broadcast_to(x, shape);
  Value t = b.broadcast_to(op.scalar(threshold, grad.scalar_type()), shape);
  Value r = b.select(b.compare(x, t, "LE"), b.scalar_like(g, 0), g);
  return finish(op, r, grad.scalar_type(), nullptr, op.pointwise_layout(grad.dim()));
}

// "none" or "tanh", as ATen accepts them.
bool gelu_uses_tanh(c10::string_view approximate) {
  TORCH_CHECK(approximate == "none" || approximate == "tanh",
              "gelu: approximate argument must be either none or tanh, got '", approximate, "'");
  return approximate == "tanh";
}

at::Tensor gelu_fn(const at::Tensor& self, c10::string_view approximate) {
  bool tanh = gelu_uses_tanh(approximate);
  OpBuilder op("aten::gelu");
  Value r = L::gelu(op.b(), op.input(self), tanh);  // read first: the layout follows the input
  return finish(op, r, self.scalar_type(), nullptr, op.pointwise_layout(self.dim()));
}
at::Tensor& gelu_inplace(at::Tensor& self, c10::string_view approximate) {
  bool tanh = gelu_uses_tanh(approximate);
  OpBuilder op("aten::gelu_");
  finish(op, L::gelu(op.b(), op.input(self), tanh), self.scalar_type(), &self);
  return self;
}
at::Tensor gelu_backward_fn(const at::Tensor& grad, const at::Tensor& self, c10::string_view approximate) {
  bool tanh = gelu_uses_tanh(approximate);
  OpBuilder op("aten::gelu_backward");
  Value g = op.input(grad), x = op.input(self);
  Value r = L::gelu_backward(op.b(), g, x, tanh);
  return finish(op, r, self.scalar_type(), nullptr, op.pointwise_layout(grad.dim()));
}

// The (grad, value) pair of a pointwise backward, broadcast together as TensorIterator
// broadcasts them (vmap's batched gradients give grad a leading batch dim).
std::pair<Value, Value> broadcast_pair(ir::Builder& b, Value g, Value y) {
  const std::vector<int64_t> shape = ir::broadcast_shapes(b.dims(g), b.dims(y));
  return {b.broadcast_to(g, shape), b.broadcast_to(y, shape)};
}

at::Tensor silu_backward_fn(const at::Tensor& grad, const at::Tensor& self) {
  OpBuilder op("aten::silu_backward");
  auto& b = op.b();
  Value grad_in = op.input(grad), self_in = op.input(self);
  auto [g, x] = broadcast_pair(b, grad_in, self_in);
  Value s = b.unary("logistic", x);
  Value d = b.binary("multiply", s, b.binary("add", b.scalar_like(x, 1), b.binary("multiply", x, b.binary("subtract", b.scalar_like(s, 1), s))));
  return finish(op, b.binary("multiply", g, d), grad.scalar_type(), nullptr, op.pointwise_layout(grad.dim()));
}

at::Tensor sigmoid_backward_fn(const at::Tensor& grad, const at::Tensor& out) {
  OpBuilder op("aten::sigmoid_backward");
  auto& b = op.b();
  Value grad_in = op.input(grad), out_in = op.input(out);
  auto [g, y] = broadcast_pair(b, grad_in, out_in);
  // Complex inputs: PyTorch's convention multiplies by the conjugate derivative.
  Value r = b.binary("multiply", g, b.conj(b.binary("multiply", y, b.binary("subtract", b.scalar_like(y, 1), y))));
  return finish(op, r, grad.scalar_type(), nullptr, op.pointwise_layout(grad.dim()));
}

at::Tensor tanh_backward_fn(const at::Tensor& grad, const at::Tensor& out) {
  OpBuilder op("aten::tanh_backward");
  auto& b = op.b();
  Value grad_in = op.input(grad), out_in = op.input(out);
  auto [g, y] = broadcast_pair(b, grad_in, out_in);
  Value r = b.binary("multiply", g, b.conj(b.binary("subtract", b.scalar_like(y, 1), b.binary("multiply", y, y))));
  return finish(op, r, grad.scalar_type(), nullptr, op.pointwise_layout(grad.dim()));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_fn(const at::Tensor& input, c10::IntArrayRef normalized_shape,
                                                             const std::optional<at::Tensor>& weight,
                                                             const std::optional<at::Tensor>& bias, double eps) {
  int64_t k = static_cast<int64_t>(normalized_shape.size());
  TORCH_CHECK(k >= 1, "layer_norm: Expected normalized_shape to be at least 1-dimensional, i.e., containing at least one element, but got normalized_shape = ",
              normalized_shape);
  for (const auto& [param, name] : {std::pair{weight, "weight"}, std::pair{bias, "bias"}}) {
    TORCH_CHECK(!param || !param->defined() || param->sizes().equals(normalized_shape), "layer_norm: Expected ", name,
                " to be of same shape as normalized_shape, but got ", name, " of shape ", param->sizes(),
                " and normalized_shape = ", normalized_shape);
  }
  TORCH_CHECK(input.dim() >= k && input.sizes().slice(input.dim() - k).equals(normalized_shape),
              "Given normalized_shape=", normalized_shape, ", expected input with shape [*, ",
              normalized_shape, "], but got input of size", input.sizes());
  OpBuilder op("aten::native_layer_norm");
  Value w, bb;
  bool has_w = weight && weight->defined(), has_b = bias && bias->defined();
  if (has_w) w = op.input(*weight);
  if (has_b) bb = op.input(*bias);
  auto r = L::layer_norm(op.b(), op.input(input), has_w ? &w : nullptr, has_b ? &bb : nullptr, k, eps);
  // Statistics are returned in the input's dtype, as on CPU (computed in f32 for bf16/f16).
  at::ScalarType stat = input.scalar_type();
  at::Tensor out = op.output(r[0], input.scalar_type());
  at::Tensor mean = op.output(op.b().convert(r[1], to_ir(stat)), stat);
  at::Tensor rstd = op.output(op.b().convert(r[2], to_ir(stat)), stat);
  op.run();
  return {out, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_fn(
    const at::Tensor& grad, const at::Tensor& input, c10::IntArrayRef normalized_shape, const at::Tensor& mean,
    const at::Tensor& rstd, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    std::array<bool, 3> mask) {
  OpBuilder op("aten::native_layer_norm_backward");
  Value w;
  bool has_w = weight && weight->defined();
  if (has_w) w = op.input(*weight);
  auto r = L::layer_norm_backward(op.b(), op.input(grad), op.input(input), op.input(mean), op.input(rstd),
                                  has_w ? &w : nullptr, static_cast<int64_t>(normalized_shape.size()));
  at::Tensor dx, dw, db;
  if (mask[0]) dx = op.output(r[0], input.scalar_type());
  if (mask[1] && has_w) dw = op.output(op.b().reshape(r[1], vec(weight->sizes())), weight->scalar_type());
  if (mask[2] && bias && bias->defined()) db = op.output(op.b().reshape(r[2], vec(bias->sizes())), bias->scalar_type());
  op.run();
  return {dx, dw, db};
}

std::tuple<at::Tensor, at::Tensor> nll_loss_forward_fn(const at::Tensor& self, const at::Tensor& target,
                                                       const std::optional<at::Tensor>& weight, int64_t reduction,
                                                       int64_t ignore_index) {
  TORCH_CHECK(self.dim() >= 1 && self.dim() <= 2, "input tensor should be 1D or 2D");
  TORCH_CHECK(target.dim() <= 1, "0D or 1D target tensor expected, multi-target not supported");
  TORCH_CHECK(self.dim() == 1 || self.size(0) == target.size(0), "size mismatch (got input: ", self.sizes(),
              ", target: ", target.sizes(), ")");
  check_nll_loss_args(self, target, weight, /*per_class=*/true);
  OpBuilder op("aten::nll_loss_forward");
  Value w;
  bool has_w = weight && weight->defined();
  if (has_w) w = op.input(*weight);
  Value t = op.input(target);
  int64_t classes = self.size(-1);
  // Targets outside [0, C) other than ignore_index are device-side errors.
  {
    auto& b = op.b();
    Value ti = b.convert(t, ir::DType::S64);
    Value bad = b.binary("and", b.compare(ti, b.scalar_like(ti, static_cast<double>(ignore_index)), "NE"),
                         b.binary("or", b.compare(ti, b.scalar_like(ti, 0), "LT"),
                                  b.compare(ti, b.scalar_like(ti, static_cast<double>(classes)), "GE")));
    int64_t n = b.type(bad).numel();
    op.check_flag(L::any_all(b, b.reshape(bad, {n}), {}, false, false),
                  "target out of bounds in aten::nll_loss_forward (classes " + std::to_string(classes) + ")");
  }
  auto r = L::nll_loss(op.b(), op.input(self), t, has_w ? &w : nullptr, reduction, ignore_index);
  at::Tensor out = op.output(r[0], self.scalar_type());
  at::Tensor total = op.output(r[1], self.scalar_type());
  op.run();
  return {out, total};
}

at::Tensor nll_loss_backward_fn(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                                const std::optional<at::Tensor>& weight, int64_t reduction, int64_t ignore_index,
                                const at::Tensor& total_weight) {
  OpBuilder op("aten::nll_loss_backward");
  Value w;
  bool has_w = weight && weight->defined();
  if (has_w) w = op.input(*weight);
  Value r = L::nll_loss_backward(op.b(), op.input(grad), op.input(self), op.input(target), has_w ? &w : nullptr,
                                 reduction, ignore_index, op.input(total_weight));
  return finish(op, r, self.scalar_type(), nullptr);
}

at::Tensor mse_impl(const at::Tensor& self, const at::Tensor& target, int64_t reduction, const at::Tensor* into) {
  OpBuilder op("aten::mse_loss");
  auto& b = op.b();
  at::ScalarType dt = at::result_type(self, target);
  Value d = L::binary(b, "sub", op.input(self), op.input(target), to_ir(dt), to_ir(dt));
  Value sq = b.binary("multiply", d, d);
  if (reduction == 1) sq = L::mean(b, sq, {}, false, to_ir(dt));
  if (reduction == 2) sq = L::sum(b, sq, {}, false, to_ir(dt));
  return finish(op, sq, dt, into);
}
at::Tensor mse_fn(const at::Tensor& s, const at::Tensor& t, int64_t r) { return mse_impl(s, t, r, nullptr); }
at::Tensor& mse_out(const at::Tensor& s, const at::Tensor& t, int64_t r, at::Tensor& o) {
  mse_impl(s, t, r, &o);
  return o;
}
at::Tensor mse_backward_fn(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  OpBuilder op("aten::mse_loss_backward");
  auto& b = op.b();
  at::ScalarType dt = self.scalar_type();
  Value d = L::binary(b, "sub", op.input(self), op.input(target), to_ir(dt), to_ir(dt));
  double scale = reduction == 1 ? 2.0 / static_cast<double>(std::max<int64_t>(self.numel(), 1)) : 2.0;
  Value g = b.broadcast_to(b.convert(op.input(grad), to_ir(dt)), b.dims(d));
  Value r = b.binary("multiply", b.binary("multiply", d, g), b.scalar_like(d, scale));
  return finish(op, r, dt, nullptr);
}

// ---------------------------------------------------------------- random


at::Tensor& uniform_fn(at::Tensor& self, double from, double to, std::optional<at::Generator> gen) {
  if (self.is_complex()) {  // as torch: each part uniform on [from, to)
    at::Tensor parts = at::view_as_real(self);
    return uniform_fn(parts, from, to, gen), self;
  }
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "uniform_ only supports floating point dtypes, got ", self.scalar_type());
  // ATen's bounds: both ends and their distance inside the dtype's range.
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, self.scalar_type(), "uniform_", [&] {
    const auto lo = static_cast<double>(std::numeric_limits<scalar_t>::lowest());
    const auto hi = static_cast<double>(std::numeric_limits<scalar_t>::max());
    TORCH_CHECK(from >= lo && from <= hi, "from is out of bounds for ", self.dtype());
    TORCH_CHECK(to >= lo && to <= hi, "to is out of bounds for ", self.dtype());
    TORCH_CHECK(from <= to, "uniform_ expects to return a [from, to) range, but found from=", from, " > to=", to);
    TORCH_CHECK(to - from <= hi, "uniform_ expects to-from <= std::numeric_limits<", self.scalar_type(),
                ">::max(), but found to=", to, " and from=", from, " which result in to-from to exceed the limit");
  });
  OpBuilder op("aten::uniform_");
  auto& b = op.b();
  op.set_device(self.device().index());
  auto r = L::uniform(b, op.rng_state(pick_generator(gen, self)), to_ir(self.scalar_type()), vec(self.sizes()));
  op.set_rng_state(r[0]);
  Value scale = b.broadcast_to(op.scalar(to - from, self.scalar_type()), vec(self.sizes()));
  Value lo = b.broadcast_to(op.scalar(from, self.scalar_type()), vec(self.sizes()));
  op.write(self, b.binary("add", b.binary("multiply", r[1], scale), lo));
  op.run();
  return self;
}

at::Tensor& normal_fn(at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  if (self.is_complex()) {
    // As torch: both parts normal with variance std^2 / 2 (a view of the same storage).
    at::Tensor parts = at::view_as_real(self);
    normal_fn(parts, mean, std / std::sqrt(2.0), gen);
    return self;
  }
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "normal_ only supports floating point dtypes");
  TORCH_CHECK(std >= 0.0, "normal expects std >= 0.0, but found std ", std);
  OpBuilder op("aten::normal_");
  auto& b = op.b();
  op.set_device(self.device().index());
  auto r = L::normal(b, op.rng_state(pick_generator(gen, self)), to_ir(self.scalar_type()), vec(self.sizes()));
  op.set_rng_state(r[0]);
  Value s = b.broadcast_to(op.scalar(std, self.scalar_type()), vec(self.sizes()));
  Value m = b.broadcast_to(op.scalar(mean, self.scalar_type()), vec(self.sizes()));
  op.write(self, b.binary("add", b.binary("multiply", r[1], s), m));
  op.run();
  return self;
}

at::Tensor& bernoulli_float(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  TORCH_CHECK(0 <= p && p <= 1, "bernoulli_ expects p to be in [0, 1], but got p=", p);
  OpBuilder op("aten::bernoulli_");
  auto& b = op.b();
  op.set_device(self.device().index());
  auto r = L::uniform(b, op.rng_state(pick_generator(gen, self)), ir::DType::F32, vec(self.sizes()));
  op.set_rng_state(r[0]);
  Value pv = b.broadcast_to(op.scalar(p, at::kFloat), vec(self.sizes()));
  op.write(self, b.compare(r[1], pv, "LT"));
  op.run();
  return self;
}

at::Tensor bernoulli_tensor(const at::Tensor& p, std::optional<at::Generator> gen) {
  OpBuilder op("aten::bernoulli");
  auto& b = op.b();
  Value pv = b.convert(op.input(p), ir::DType::F32);
  auto r = L::uniform(b, op.rng_state(pick_generator(gen, p)), ir::DType::F32, vec(p.sizes()));
  op.set_rng_state(r[0]);
  return finish(op, b.compare(r[1], pv, "LT"), p.scalar_type(), nullptr, op.pointwise_layout(p.dim()));
}
at::Tensor& bernoulli_out(const at::Tensor& p, std::optional<at::Generator> gen, at::Tensor& out) {
  return write_out("bernoulli", bernoulli_tensor(p, std::move(gen)), out);
}

std::tuple<at::Tensor, at::Tensor> native_dropout_fn(const at::Tensor& input, double p, std::optional<bool> train) {
  OpBuilder op("aten::native_dropout");
  auto& b = op.b();
  Value x = op.input(input);
  if (train.has_value() && !*train) {
    at::Tensor out = op.output(x, input.scalar_type());
    at::Tensor mask = op.output(b.constant_int(ir::DType::Pred, 1, vec(input.sizes())), at::kBool);
    op.run();
    return {out, mask};
  }
  auto r = L::uniform(b, op.rng_state(pick_generator(std::nullopt, input)), ir::DType::F32, vec(input.sizes()));
  op.set_rng_state(r[0]);
  Value keep = b.compare(r[1], b.constant(ir::DType::F32, 1.0 - p, vec(input.sizes())), "LT");
  double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
  Value scaled = b.binary("multiply", x, b.broadcast_to(op.scalar(scale, input.scalar_type()), vec(input.sizes())));
  Value out = b.select(keep, scaled, b.scalar_like(x, 0));
  at::Tensor o = op.output(out, input.scalar_type());
  at::Tensor m = op.output(keep, at::kBool);
  op.run();
  return {o, m};
}

at::Tensor native_dropout_backward_fn(const at::Tensor& grad, const at::Tensor& mask, double scale) {
  OpBuilder op("aten::native_dropout_backward");
  auto& b = op.b();
  // grad * mask * scale: a Python float scale makes integer gradients float, as on CPU.
  at::ScalarType out = float_result(grad.scalar_type());
  Value g = b.convert(op.input(grad), to_ir(out));
  Value m = b.convert(op.input(mask), ir::DType::Pred);
  Value r = b.select(m, b.binary("multiply", g, b.broadcast_to(op.scalar(scale, out), b.dims(g))), b.scalar_like(g, 0));
  return finish(op, r, out, nullptr, op.pointwise_layout(grad.dim()));
}

// random_'s bounds as ATen checks them (DistributionTemplates.h): for float dtypes `from`
// and `to` moved to values the dtype holds, both ends inside the dtype's range (a warning
// past the integers it holds exactly), the bounds' wording kept.
template <typename T>
int64_t representable_from(int64_t from) {
  const auto from_plus_1 = static_cast<int64_t>(static_cast<T>(from + 1));
  if (from_plus_1 < from) {
    int64_t magnitude = std::abs(from + 1);
    int n = 0;
    while (magnitude >>= 1) ++n;
    from = from_plus_1 + (int64_t{1} << (n - std::numeric_limits<T>::digits + 1));
  }
  return from;
}
template <typename T>
int64_t representable_to(int64_t to) {
  const auto to_minus_1 = static_cast<int64_t>(static_cast<T>(to - 1));
  if (to_minus_1 >= to) {
    int64_t magnitude = std::abs(to - 1);
    int n = 0;
    while (magnitude >>= 1) ++n;
    to = to_minus_1 - (int64_t{1} << (n - std::numeric_limits<T>::digits + 1));
  }
  return to;
}
void check_random_bounds(int64_t from, int64_t to_inc, at::ScalarType dtype) {
  auto check = [&](int64_t v, const char* name, double lo, double hi) {
    TORCH_CHECK(static_cast<double>(v) >= lo && static_cast<double>(v) <= hi, name, " is out of bounds for ",
                c10::scalarTypeToTypeMeta(dtype));
  };
  if (at::isFloatingType(dtype)) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "random_", [&] {
      check(from, "from", static_cast<double>(std::numeric_limits<scalar_t>::lowest()),
            static_cast<double>(std::numeric_limits<scalar_t>::max()));
      check(to_inc, "to - 1", static_cast<double>(std::numeric_limits<scalar_t>::lowest()),
            static_cast<double>(std::numeric_limits<scalar_t>::max()));
      constexpr int digits = std::numeric_limits<scalar_t>::digits;
      for (auto [v, name] : {std::pair{from, "from"}, std::pair{to_inc, "to - 1"}}) {
        if (v < -(int64_t{1} << digits) || v > (int64_t{1} << digits)) {
          TORCH_WARN(name, " is out of bounds [-(2^", digits, "), 2^", digits, "]. Due to precision limitations ",
                     c10::scalarTypeToTypeMeta(dtype), " can support discrete uniform distribution only within this range. ",
                     "This warning will become an error in version 1.7 release, please fix the code in advance");
        }
      }
    });
  } else if (dtype == at::kUInt64) {
    check(from, "from", 0, static_cast<double>(INT64_MAX));
    check(to_inc, "to - 1", 0, static_cast<double>(INT64_MAX));
  } else {
    AT_DISPATCH_V2(dtype, "random_", AT_WRAP([&] {
      const auto lo = static_cast<int64_t>(std::numeric_limits<scalar_t>::lowest());
      const auto hi = static_cast<int64_t>(std::numeric_limits<scalar_t>::max());
      TORCH_CHECK(from >= lo && from <= hi, "from is out of bounds for ", c10::scalarTypeToTypeMeta(dtype));
      TORCH_CHECK(to_inc >= lo && to_inc <= hi, "to - 1 is out of bounds for ", c10::scalarTypeToTypeMeta(dtype));
    }), AT_EXPAND(AT_INTEGRAL_TYPES), at::kUInt16, at::kUInt32, at::kBool);
  }
}

// random_: from + bits % range from 64 random bits, in 64-bit integer arithmetic (range 0
// meaning all 2^64 values), then converted to self's dtype (floats round to nearest, as on CPU).
at::Tensor& random_from_to(at::Tensor& self, int64_t from, std::optional<int64_t> to, std::optional<at::Generator> gen) {
  const at::ScalarType dtype = self.scalar_type();
  TORCH_CHECK(at::isFloatingType(dtype) || at::isIntegralType(dtype, /*includeBool=*/true),
              "random_ handles only integral, floating-point and boolean types, got ", dtype);
  uint64_t range = 0;
  if (to.has_value()) {  // [from, to)
    int64_t hi = *to;
    TORCH_CHECK(from < hi, "random_ expects 'from' to be less than 'to', but got from=", from, " >= to=", hi);
    if (at::isFloatingType(dtype)) {
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "random_", [&] {
        from = representable_from<scalar_t>(from);
        hi = representable_to<scalar_t>(hi);
        TORCH_CHECK(from < hi, "random_ expects 'from' casted to dtype to be less than 'to' casted to dtype, but got from=",
                    from, " >= to=", hi);
      });
    }
    check_random_bounds(from, hi - 1, dtype);
    range = static_cast<uint64_t>(hi) - static_cast<uint64_t>(from);
  } else if (from != std::numeric_limits<int64_t>::lowest()) {  // [from, the dtype's largest integer]
    int64_t to_inc = 0;
    if (at::isFloatingType(dtype)) {
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "random_", [&] {
        constexpr int digits = std::numeric_limits<scalar_t>::digits;
        to_inc = digits >= 63 ? std::numeric_limits<int64_t>::max() : (int64_t{1} << digits);
        from = representable_from<scalar_t>(from);
        TORCH_CHECK(from < to_inc, "random_ expects 'from' casted to dtype to be less than or equal to 'to_inc' casted to dtype, but got from=",
                    from, " > to_inc=", to_inc);
      });
    } else if (dtype == at::kBool) {
      to_inc = 1;
    } else {
      AT_DISPATCH_V2(dtype, "random_", AT_WRAP([&] {
        to_inc = static_cast<int64_t>(std::numeric_limits<scalar_t>::max());
      }), AT_EXPAND(AT_INTEGRAL_TYPES), at::kUInt16, at::kUInt32, at::kUInt64);
    }
    check_random_bounds(from, to_inc, dtype);
    range = static_cast<uint64_t>(to_inc) - static_cast<uint64_t>(from) + 1;
  }
  if (self.numel() == 0) return self;
  OpBuilder op("aten::random_");
  auto& b = op.b();
  op.set_device(self.device().index());
  const std::vector<int64_t> dims = vec(self.sizes());
  auto r = b.rng_bits(op.rng_state(pick_generator(gen, self)), ir::DType::U64, dims);
  op.set_rng_state(r[0]);
  Value bits = r[1];
  if (range != 0) {
    // The range travels as int64 bits (past 2^63 it reads negative there) and is reinterpreted.
    Value span = b.convert(op.scalar(static_cast<int64_t>(range), at::kLong), ir::DType::U64);
    bits = b.binary("remainder", bits, b.broadcast_to(span, dims));
  }
  Value v = b.binary("add", b.convert(bits, ir::DType::S64), b.broadcast_to(op.scalar(from, at::kLong), dims));
  op.write(self, v);
  op.run();
  return self;
}
at::Tensor& random_to(at::Tensor& self, int64_t to, std::optional<at::Generator> gen) {
  return random_from_to(self, 0, to, gen);
}
at::Tensor& random_plain(at::Tensor& self, std::optional<at::Generator> gen) {
  return random_from_to(self, 0, std::nullopt, gen);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
#define REG_UNARY(NAME)                    \
  m.impl(#NAME, NAME##_fn);                \
  m.impl(#NAME "_", NAME##_inplace);       \
  m.impl(#NAME ".out", NAME##_out);
  REG_UNARY(neg) REG_UNARY(abs) REG_UNARY(exp) REG_UNARY(exp2) REG_UNARY(expm1) REG_UNARY(log) REG_UNARY(log2)
  REG_UNARY(log10) REG_UNARY(log1p) REG_UNARY(sqrt) REG_UNARY(rsqrt) REG_UNARY(sin) REG_UNARY(cos) REG_UNARY(tan)
  REG_UNARY(tanh) REG_UNARY(sinh) REG_UNARY(cosh) REG_UNARY(asin) REG_UNARY(acos) REG_UNARY(atan) REG_UNARY(sigmoid)
  REG_UNARY(erf) REG_UNARY(reciprocal) REG_UNARY(floor) REG_UNARY(ceil) REG_UNARY(round) REG_UNARY(trunc)
  REG_UNARY(frac) REG_UNARY(sign) REG_UNARY(bitwise_not) REG_UNARY(silu) REG_UNARY(mish) REG_UNARY(hardsigmoid)
  REG_UNARY(hardswish) REG_UNARY(asinh) REG_UNARY(acosh) REG_UNARY(atanh) REG_UNARY(lgamma) REG_UNARY(digamma)
  REG_UNARY(erfinv) REG_UNARY(erfc) REG_UNARY(sinc) REG_UNARY(deg2rad) REG_UNARY(rad2deg) REG_UNARY(sgn) REG_UNARY(i0)
#undef REG_UNARY
#define REG_UNARY_NO_INPLACE(NAME) \
  m.impl(#NAME, NAME##_fn);        \
  m.impl(#NAME ".out", NAME##_out);
  REG_UNARY_NO_INPLACE(special_i0e) REG_UNARY_NO_INPLACE(special_i1e) REG_UNARY_NO_INPLACE(special_i1) REG_UNARY_NO_INPLACE(special_ndtri)
  REG_UNARY_NO_INPLACE(special_log_ndtr) REG_UNARY_NO_INPLACE(special_entr) REG_UNARY_NO_INPLACE(angle)
  REG_UNARY_NO_INPLACE(signbit) REG_UNARY_NO_INPLACE(logaddexp) REG_UNARY_NO_INPLACE(logaddexp2)
  REG_UNARY_NO_INPLACE(fmax) REG_UNARY_NO_INPLACE(fmin) REG_UNARY_NO_INPLACE(special_xlog1py)
  REG_UNARY_NO_INPLACE(special_zeta) REG_UNARY_NO_INPLACE(polygamma) REG_UNARY_NO_INPLACE(nan_to_num)
  REG_UNARY_NO_INPLACE(logit)
#undef REG_UNARY_NO_INPLACE
  m.impl("nan_to_num_", nan_to_num_inplace);
  m.impl("norm.ScalarOpt_dim", norm_dims);
  m.impl("norm.ScalarOpt_dim_dtype", norm_dims_dtype);
  m.impl("norm.out", norm_dims_out);
  m.impl("norm.dtype_out", norm_dims_dtype_out);
  m.impl("norm.Scalar", norm_all);
  m.impl("norm.ScalarOpt_dtype", norm_all_dtype);
#define REG_ONE_SIDED_CLAMP(NAME)                   \
  m.impl(#NAME, NAME##_s);                          \
  m.impl(#NAME ".Tensor", NAME##_t);                \
  m.impl(#NAME "_", NAME##_s_inplace);              \
  m.impl(#NAME "_.Tensor", NAME##_t_inplace);       \
  m.impl(#NAME ".out", NAME##_s_out);               \
  m.impl(#NAME ".Tensor_out", NAME##_t_out);
  REG_ONE_SIDED_CLAMP(clamp_min) REG_ONE_SIDED_CLAMP(clamp_max)
#undef REG_ONE_SIDED_CLAMP
  m.impl("_efficientzerotensor", efficient_zero_tensor);
  m.impl("logit_", logit_inplace);
  m.impl("hypot", hypot_fn);
  m.impl("hypot_", hypot_inplace);
  m.impl("hypot.out", hypot_out);
  m.impl("nextafter", nextafter_fn);
  m.impl("nextafter_", nextafter_inplace);
  m.impl("nextafter.out", nextafter_out);
  m.impl("heaviside", heaviside_fn);
  m.impl("heaviside_", heaviside_inplace);
  m.impl("heaviside.out", heaviside_out);
  m.impl("copysign.Tensor", copysign_fn);
  m.impl("copysign_.Tensor", copysign_inplace);
  m.impl("copysign.out", copysign_out);
  m.impl("copysign.Scalar", copysign_s);
  m.impl("copysign_.Scalar", copysign_s_inplace);
  m.impl("copysign.Scalar_out", copysign_s_out);
  m.impl("floor_divide", div_floor_fn);
  m.impl("floor_divide_.Tensor", div_floor_inplace);
  m.impl("floor_divide.out", div_floor_out);
  m.impl("floor_divide.Scalar", div_floor_s);
  m.impl("floor_divide_.Scalar", div_floor_s_inplace);
#define REG_SHIFT(NAME)                                 \
  m.impl(#NAME ".Tensor", NAME##_fn);                   \
  m.impl(#NAME "_.Tensor", NAME##_inplace);             \
  m.impl(#NAME ".Tensor_out", NAME##_out);              \
  m.impl(#NAME ".Tensor_Scalar", NAME##_s);             \
  m.impl(#NAME "_.Tensor_Scalar", NAME##_s_inplace);    \
  m.impl(#NAME ".Tensor_Scalar_out", NAME##_s_out);
  REG_SHIFT(bitwise_left_shift) REG_SHIFT(bitwise_right_shift)
#undef REG_SHIFT
  m.impl("relu", relu_fn);
  m.impl("relu_", relu_inplace);
  m.impl("isnan", isnan_fn);
  m.impl("isinf", isinf_fn);
  m.impl("isfinite", isfinite_fn);
  m.impl("isposinf", isposinf_fn);
  m.impl("isneginf", isneginf_fn);
  m.impl("isposinf.out", isposinf_out);
  m.impl("isneginf.out", isneginf_out);
  m.impl("logical_not", logical_not_fn);
  m.impl("logical_not_", logical_not_inplace);
  m.impl("logical_not.out", logical_not_out_k);

#define REG_BINARY(NAME)                                \
  m.impl(#NAME ".Tensor", NAME##_fn);                   \
  m.impl(#NAME "_.Tensor", NAME##_inplace);             \
  m.impl(#NAME ".Tensor_out", NAME##_out);              \
  m.impl(#NAME ".Scalar", NAME##_s);                    \
  m.impl(#NAME "_.Scalar", NAME##_s_inplace);           \
  m.impl(#NAME ".Scalar_out", NAME##_s_out);
  REG_BINARY(eq) REG_BINARY(ne) REG_BINARY(lt) REG_BINARY(le) REG_BINARY(gt) REG_BINARY(ge)
  REG_BINARY(remainder) REG_BINARY(fmod)
#undef REG_BINARY
#define REG_BINARY_T(NAME)                              \
  m.impl(#NAME, NAME##_fn);                             \
  m.impl(#NAME "_", NAME##_inplace);                    \
  m.impl(#NAME ".out", NAME##_out);
  REG_BINARY_T(maximum) REG_BINARY_T(minimum) REG_BINARY_T(atan2) REG_BINARY_T(logical_and)
  REG_BINARY_T(logical_or) REG_BINARY_T(logical_xor)
#undef REG_BINARY_T
  m.impl("bitwise_and.Tensor", bitwise_and_fn);
  m.impl("bitwise_and_.Tensor", bitwise_and_inplace);
  m.impl("bitwise_and.Tensor_out", bitwise_and_out);
  m.impl("bitwise_or.Tensor", bitwise_or_fn);
  m.impl("bitwise_or_.Tensor", bitwise_or_inplace);
  m.impl("bitwise_or.Tensor_out", bitwise_or_out);
  m.impl("bitwise_xor.Tensor", bitwise_xor_fn);
  m.impl("bitwise_xor_.Tensor", bitwise_xor_inplace);
  m.impl("bitwise_xor.Tensor_out", bitwise_xor_out);
  m.impl("xlogy.Tensor", xlogy_fn);
  m.impl("xlogy_.Tensor", xlogy_inplace);
  m.impl("xlogy.OutTensor", xlogy_out);
  m.impl("mul.Tensor", mul_fn);
  m.impl("mul_.Tensor", mul_inplace);
  m.impl("mul.out", mul_out);
  m.impl("add.Tensor", add_fn);
  m.impl("add_.Tensor", add_inplace);
  m.impl("add.out", add_out);
  m.impl("sub.Tensor", sub_fn);
  m.impl("sub_.Tensor", sub_inplace);
  m.impl("sub.out", sub_out);
  m.impl("div.Tensor", div_fn);
  m.impl("div_.Tensor", div_inplace);
  m.impl("div.out", div_out);
  m.impl("div.Tensor_mode", div_mode_fn);
  m.impl("div_.Tensor_mode", div_mode_inplace);
  m.impl("div.out_mode", div_mode_out);
  m.impl("pow.Tensor_Tensor", pow_tt);
  m.impl("pow.Tensor_Tensor_out", pow_tt_out);
  m.impl("pow_.Tensor", pow_tt_inplace);
  m.impl("pow.Tensor_Scalar", pow_ts);
  m.impl("pow.Tensor_Scalar_out", pow_ts_out);
  m.impl("pow_.Scalar", pow_ts_inplace);
  m.impl("pow.Scalar", pow_st);
  m.impl("where.self", where_self);
  m.impl("where.self_out", where_out);
  m.impl("masked_fill_.Scalar", masked_fill_scalar);
  m.impl("masked_fill_.Tensor", masked_fill_tensor);
  m.impl("clamp", clamp_fn);
  m.impl("clamp_", clamp_inplace);
  m.impl("clamp.out", clamp_out);
  m.impl("clamp.Tensor", clamp_t);
  m.impl("clamp_.Tensor", clamp_t_inplace);
  m.impl("clamp.Tensor_out", clamp_t_out);
  m.impl("addcmul", addcmul_fn);
  m.impl("addcmul_", addcmul_inplace);
  m.impl("addcmul.out", addcmul_out);
  m.impl("addcdiv", addcdiv_fn);
  m.impl("addcdiv_", addcdiv_inplace);
  m.impl("addcdiv.out", addcdiv_out);
  m.impl("lerp.Scalar", lerp_s);
  m.impl("lerp.Scalar_out", [](const at::Tensor& s, const at::Tensor& e, const at::Scalar& w,
                               at::Tensor& out) -> at::Tensor& { return write_out("lerp", lerp_s(s, e, w), out); });
  m.impl("lerp.Tensor_out", [](const at::Tensor& s, const at::Tensor& e, const at::Tensor& w,
                               at::Tensor& out) -> at::Tensor& { return write_out("lerp", lerp_t(s, e, w), out); });
  m.impl("lerp_.Scalar", lerp_s_inplace);
  m.impl("lerp.Tensor", lerp_t);
  m.impl("lerp_.Tensor", lerp_t_inplace);
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

  m.impl("mm", mm_fn);
  m.impl("mm.out", mm_out);
  m.impl("bmm", bmm_fn);
  m.impl("bmm.out", bmm_out);
  m.impl("addmm", addmm_fn);
  m.impl("addmm.out", addmm_out);
  m.impl("addmm_", addmm_inplace);
  m.impl("baddbmm", baddbmm_fn);
  m.impl("baddbmm.out", baddbmm_out);
  m.impl("dot", dot_fn);
  m.impl("addmv", addmv_fn);
  m.impl("addmv.out", addmv_out);
  m.impl("mse_loss", mse_fn);
  m.impl("mse_loss.out", mse_out);
  m.impl("mse_loss_backward", mse_backward_fn);

  m.impl("cat", cat_fn);
  m.impl("cat.out", cat_out);
  m.impl("index_select", index_select_fn);
  m.impl("index_select.out", index_select_out);
  m.impl("embedding", embedding_fn);
  m.impl("embedding_dense_backward", embedding_backward_fn);
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

  m.impl("threshold_backward", threshold_backward_fn);
  m.impl("gelu", gelu_fn);
  m.impl("gelu.out", [](const at::Tensor& s, c10::string_view a, at::Tensor& out) -> at::Tensor& {
    return write_out("gelu", gelu_fn(s, a), out);
  });
  m.impl("gelu_", gelu_inplace);
  m.impl("gelu_backward", gelu_backward_fn);
  m.impl("silu_backward", silu_backward_fn);
  m.impl("sigmoid_backward", sigmoid_backward_fn);
  m.impl("tanh_backward", tanh_backward_fn);
  m.impl("native_layer_norm", layer_norm_fn);
  m.impl("native_layer_norm_backward", layer_norm_backward_fn);
  m.impl("nll_loss_forward", nll_loss_forward_fn);
  m.impl("nll_loss_backward", nll_loss_backward_fn);

  m.impl("uniform_", uniform_fn);
  m.impl("normal_", normal_fn);
  m.impl("bernoulli_.float", bernoulli_float);
  m.impl("bernoulli", bernoulli_tensor);
  m.impl("bernoulli.out", bernoulli_out);
  m.impl("native_dropout", native_dropout_fn);
  m.impl("native_dropout_backward", native_dropout_backward_fn);
  m.impl("random_.from", random_from_to);
  m.impl("random_.to", random_to);
  m.impl("random_", random_plain);
}

}  // namespace torch_pjrt::device
