// Pointwise ATen kernels: the unary table's registrations, binary ops with their Tensor/Scalar
// overloads, ternary ops (where, clamp, addcmul, lerp), shifts and small math.
#include <ATen/Dispatch_v2.h>
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/native/ReduceOpsUtils.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TypeProperties.h>
#include <ATen/ops/isclose_native.h>
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

// A unary op from its row of lowering's table (the table also says which overloads it has).
at::Tensor unary_op(const L::UnaryOp& row, const at::Tensor& self, const at::Tensor* into) {
  OpBuilder op(std::string("aten::") + row.name);
  const bool to_bool = row.result == L::UnaryResult::boolean;
  at::ScalarType out = to_bool                                   ? at::kBool
                       : row.result == L::UnaryResult::floating ? float_result(self.scalar_type())
                                                                 : self.scalar_type();
  at::ScalarType compute = to_bool ? self.scalar_type() : out;
  if (self.is_complex() && row.complex_to_real) out = at::toRealValueType(self.scalar_type());  // |z|, arg z
  TORCH_CHECK(!(into == &self && self.is_complex() && row.complex_to_real), "In-place ", row.name,
              " is not supported for complex tensors.");
  TORCH_CHECK(!(self.scalar_type() == at::kBool && row.bool_error), row.name, ": ", row.bool_error);
  if (into && into != &self && row.out_must_be_bool) {
    TORCH_CHECK(into->scalar_type() == at::kBool, row.name, " does not support non-boolean outputs.");
  }
  if (into && !to_bool) {
    TORCH_CHECK(at::canCast(out, into->scalar_type()), device_name(), ": ", row.name, ": result type ", out,
                " can't be cast to the desired output type ", into->scalar_type());
  }
  Value r = L::unary(op.b(), row, op.input(self), to_ir(compute), to_ir(out));
  return finish(op, r, out, into, op.pointwise_layout(self.dim()));
}

// Every row of the unary table, with the overloads it names.
void register_unary_ops(torch::Library& m) {
  for (const L::UnaryOp& row : L::unary_ops()) {
    const L::UnaryOp* r = &row;
    const std::string name = row.name;
    if (row.variants & L::kFunctional) {
      m.impl(name.c_str(), [r](const at::Tensor& self) { return unary_op(*r, self, nullptr); });
    }
    if (row.variants & L::kInPlace) {
      m.impl((name + "_").c_str(), [r](at::Tensor& self) -> at::Tensor& {
        unary_op(*r, self, &self);
        return self;
      });
    }
    if (row.variants & L::kOut) {
      m.impl((name + ".out").c_str(), [r](const at::Tensor& self, at::Tensor& out) -> at::Tensor& {
        unary_op(*r, self, &out);
        return out;
      });
    }
  }
}

// A binary op from its row of lowering's table: `compute` is the operands' promoted dtype
// (floating for true division and the like); comparisons and logical ops produce bool.
at::Tensor binary_op(const L::BinaryOp& row, const at::Tensor& self, const at::Tensor& other, const at::Tensor* into) {
  // Orderings of complex numbers are refused, in ATen's words.
  TORCH_CHECK(!(row.refuses_complex && (self.is_complex() || other.is_complex())), row.name,
              " not implemented for complex tensors.");
  OpBuilder op(std::string("aten::") + row.name);
  at::ScalarType common = at::result_type(self, other);
  if (row.result == L::BinaryResult::floating) common = float_result(common);
  at::ScalarType out = row.result == L::BinaryResult::boolean ? at::kBool : common;
  if (into) {
    TORCH_CHECK(at::canCast(out, into->scalar_type()), device_name(), ": ", row.name, ": result type ", out,
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
      TORCH_CHECK(false, device_name(), ": ", row.name, ": ", e.what_without_backtrace());
    }
    throw;
  }
  if (into && into->is_same(self)) {
    TORCH_CHECK(self.sizes().equals(shape), device_name(), ": ", row.name, "_: output with shape ", self.sizes(),
                " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
  }
  // ATen multiplies and divides a half or bfloat16 tensor by a Python scalar in float (its
  // opmath type): the scalar is not rounded to the tensor's dtype first (1e5 is no half).
  const bool scalar_operand =
      self.unsafeGetTensorImpl()->is_wrapped_number() || other.unsafeGetTensorImpl()->is_wrapped_number();
  const ir::DType compute =
      row.scalar_in_opmath && scalar_operand && (common == at::kHalf || common == at::kBFloat16) ? ir::DType::F32
                                                                                                : to_ir(common);
  Value r = L::binary(op.b(), row, x, y, compute, to_ir(out));
  return finish(op, r, out, into, op.pointwise_layout(static_cast<int64_t>(shape.size())));
}

// The rows the kernels written out below use, found once.
const L::BinaryOp& kAddRow = L::binary_op("add");
const L::BinaryOp& kSubRow = L::binary_op("sub");
const L::BinaryOp& kDivRow = L::binary_op("div");
const L::BinaryOp& kTruncDivRow = L::binary_op("div_trunc");
const L::BinaryOp& kFloorDivRow = L::binary_op("div_floor");
const L::BinaryOp& kPowRow = L::binary_op("pow");
const L::BinaryOp& kHeavisideRow = L::binary_op("heaviside");
const L::BinaryOp& kLeftShiftRow = L::binary_op("bitwise_left_shift");
const L::BinaryOp& kRightShiftRow = L::binary_op("bitwise_right_shift");

// Every overload each row of the binary table names (Scalar forms: the scalar as a wrapped number).
void register_binary_ops(torch::Library& m) {
  for (const L::BinaryOp& row : L::binary_ops()) {
    const L::BinaryOp* r = &row;
    if (row.tensor.functional) {
      m.impl(row.tensor.functional, [r](const at::Tensor& self, const at::Tensor& other) {
        return binary_op(*r, self, other, nullptr);
      });
    }
    if (row.tensor.inplace) {
      m.impl(row.tensor.inplace, [r](at::Tensor& self, const at::Tensor& other) -> at::Tensor& {
        binary_op(*r, self, other, &self);
        return self;
      });
    }
    if (row.tensor.out) {
      m.impl(row.tensor.out, [r](const at::Tensor& self, const at::Tensor& other, at::Tensor& out) -> at::Tensor& {
        binary_op(*r, self, other, &out);
        return out;
      });
    }
    if (row.scalar.functional) {
      m.impl(row.scalar.functional, [r](const at::Tensor& self, const at::Scalar& other) {
        return binary_op(*r, self, scalar_tensor_like(other), nullptr);
      });
    }
    if (row.scalar.inplace) {
      m.impl(row.scalar.inplace, [r](at::Tensor& self, const at::Scalar& other) -> at::Tensor& {
        binary_op(*r, self, scalar_tensor_like(other), &self);
        return self;
      });
    }
    if (row.scalar.out) {
      m.impl(row.scalar.out, [r](const at::Tensor& self, const at::Scalar& other, at::Tensor& out) -> at::Tensor& {
        binary_op(*r, self, scalar_tensor_like(other), &out);
        return out;
      });
    }
  }
}

// heaviside: ATen's checks (same dtypes everywhere, no complex), then the pointwise kernel.
void check_heaviside(const at::Tensor& self, const at::Tensor& values, const at::Tensor* out) {
  TORCH_CHECK(!self.is_complex() && !values.is_complex() && (!out || !out->is_complex()),
              "heaviside is not yet implemented for complex tensors.");
  TORCH_CHECK(self.dtype() == values.dtype() && (!out || out->dtype() == self.dtype()),
              "heaviside is not yet implemented for tensors with different dtypes.");
}
at::Tensor heaviside_fn(const at::Tensor& self, const at::Tensor& values) {
  check_heaviside(self, values, nullptr);
  return binary_op(kHeavisideRow, self, values, nullptr);
}
at::Tensor& heaviside_inplace(at::Tensor& self, const at::Tensor& values) {
  check_heaviside(self, values, &self);
  binary_op(kHeavisideRow, self, values, &self);
  return self;
}
at::Tensor& heaviside_out(const at::Tensor& self, const at::Tensor& values, at::Tensor& out) {
  check_heaviside(self, values, &out);
  binary_op(kHeavisideRow, self, values, &out);
  return out;
}

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
  return binary_op(subtract ? kSubRow : kAddRow, self, other, into);
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
  if (!mode) return binary_op(kDivRow, self, other, into);
  if (*mode == "trunc") return binary_op(kTruncDivRow, self, other, into);
  TORCH_CHECK(*mode == "floor", "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '", *mode, "'");
  return binary_op(kFloorDivRow, self, other, into);
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
at::Tensor pow_tt(const at::Tensor& s, const at::Tensor& e) { return binary_op(kPowRow, s, e, nullptr); }
at::Tensor& pow_tt_out(const at::Tensor& s, const at::Tensor& e, at::Tensor& out) {
  binary_op(kPowRow, s, e, &out);
  return out;
}
at::Tensor& pow_tt_inplace(at::Tensor& s, const at::Tensor& e) {
  binary_op(kPowRow, s, e, &s);
  return s;
}
// As ATen: an integer tensor to a negative integer scalar power is refused (its result is no integer).
void check_integer_power(const at::Tensor& base, const at::Scalar& exponent) {
  TORCH_CHECK(!(at::isIntegralType(base.scalar_type(), true) && exponent.isIntegral(true) && exponent.toLong() < 0),
              "Integers to negative integer powers are not allowed.");
}
at::Tensor pow_ts(const at::Tensor& s, const at::Scalar& e) {
  check_integer_power(s, e);
  return binary_op(kPowRow, s, scalar_tensor_like(e), nullptr);
}
at::Tensor& pow_ts_out(const at::Tensor& s, const at::Scalar& e, at::Tensor& out) {
  check_integer_power(s, e);
  binary_op(kPowRow, s, scalar_tensor_like(e), &out);
  return out;
}
at::Tensor& pow_ts_inplace(at::Tensor& s, const at::Scalar& e) {
  check_integer_power(s, e);
  binary_op(kPowRow, s, scalar_tensor_like(e), &s);
  return s;
}
at::Tensor pow_st(const at::Scalar& s, const at::Tensor& e) { return binary_op(kPowRow, scalar_tensor_like(s), e, nullptr); }

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

// Small compositions of native kernels (each step runs on the device).
at::Tensor rsub_fn(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  return at::sub(other, self, alpha);
}
at::Tensor rsub_scalar_fn(const at::Tensor& self, const at::Scalar& other, const at::Scalar& alpha) {
  return at::sub(scalar_tensor_like(other), self, alpha);
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
at::Tensor& round_decimals_out(const at::Tensor& s, int64_t d, at::Tensor& out) {
  round_decimals_impl(s, d, &out);
  return out;
}
at::Tensor& round_decimals_inplace(at::Tensor& s, int64_t d) {
  round_decimals_impl(s, d, &s);
  return s;
}

Tensor shift(const char* name, const Tensor& self, const Tensor& other, bool left, const Tensor* into) {
  at::ScalarType t = at::result_type(self, other);
  TORCH_CHECK(at::isIntegralType(t, /*includeBool=*/false), name, ": expected integer inputs, got ", t);
  OpBuilder op(std::string("aten::") + name);
  Value r = L::binary(op.b(), left ? kLeftShiftRow : kRightShiftRow, op.input(self), op.input(other),
                      to_ir(t), to_ir(t));
  return finish(op, r, t, into);
}
Tensor lshift_t(const Tensor& s, const Tensor& o) { return shift("__lshift__", s, o, true, nullptr); }
Tensor lshift_s(const Tensor& s, const at::Scalar& o) { return shift("__lshift__", s, scalar_tensor_like(o), true, nullptr); }
Tensor rshift_t(const Tensor& s, const Tensor& o) { return shift("__rshift__", s, o, false, nullptr); }
Tensor rshift_s(const Tensor& s, const at::Scalar& o) { return shift("__rshift__", s, scalar_tensor_like(o), false, nullptr); }
Tensor& ilshift_t(Tensor& s, const Tensor& o) { return shift("__ilshift__", s, o, true, &s), s; }
Tensor& ilshift_s(Tensor& s, const at::Scalar& o) { return shift("__ilshift__", s, scalar_tensor_like(o), true, &s), s; }
Tensor& irshift_t(Tensor& s, const Tensor& o) { return shift("__irshift__", s, o, false, &s), s; }
Tensor& irshift_s(Tensor& s, const at::Scalar& o) { return shift("__irshift__", s, scalar_tensor_like(o), false, &s), s; }

Tensor add_relu(const Tensor& self, const Tensor& other, const at::Scalar& alpha) {
  return at::add(self, other, alpha).relu_();
}
Tensor add_relu_s(const Tensor& self, const at::Scalar& other, const at::Scalar& alpha) {
  return at::add(self, other, alpha).relu_();
}
Tensor& add_relu_out(const Tensor& self, const Tensor& other, const at::Scalar& alpha, Tensor& out) {
  return write_out("_add_relu", add_relu(self, other, alpha), out);
}
Tensor& add_relu_inplace(Tensor& self, const Tensor& other, const at::Scalar& alpha) {
  return self.add_(other, alpha).relu_();
}

// sum_{i<p} lgamma(x - i/2) + p(p-1)/4 log(pi); every element must exceed (p-1)/2.
Tensor mvlgamma_k(const Tensor& self, int64_t p) {
  // torch checks no domain (outside it lgamma's log|Gamma| or inf), so no host sync here.
  TORCH_CHECK(self.scalar_type() != at::kBool, "The input tensor may not be a boolean tensor.");
  TORCH_CHECK(p >= 1, "p has to be greater than or equal to 1");
  at::ScalarType out = float_result(self.scalar_type());
  OpBuilder op("aten::mvlgamma");
  auto& b = op.b();
  ir::DType dt = L::accumulate_type(to_ir(out));
  Value x = b.convert(op.input(self), dt);
  Value sum = b.scalar_like(x, p * (p - 1) / 4.0 * std::log(M_PI));
  for (int64_t i = 0; i < p; ++i) sum = b.binary("add", sum, b.unary("chlo.lgamma", b.binary("subtract", x, b.scalar_like(x, i / 2.0))));
  return finish(op, sum, out, nullptr);
}
Tensor& mvlgamma_out(const Tensor& self, int64_t p, Tensor& out) { return write_out("mvlgamma", mvlgamma_k(self, p), out); }
Tensor& mvlgamma_inplace(Tensor& self, int64_t p) { return self.copy_(mvlgamma_k(self, p)); }

// result[i] = sum_j coefficients[i, j] * input[j].
Tensor linear_combination(const Tensor& input, const Tensor& coefficients) {
  TORCH_CHECK(coefficients.dim() == 2 && input.dim() >= 1 && coefficients.size(1) == input.size(0),
              "_compute_linear_combination: coefficients must be [m, n] for an input of n rows");
  std::vector<int64_t> shape = vec(input.sizes());
  shape[0] = coefficients.size(0);
  return at::mm(coefficients.to(input.scalar_type()), input.reshape({input.size(0), -1})).reshape(shape);
}
Tensor& linear_combination_out(const Tensor& input, const Tensor& coefficients, Tensor& out) {
  return write_out("_compute_linear_combination", linear_combination(input, coefficients), out);
}

// isclose as one program (ATen's composite records about ten ops, each its own program in
// strict mode, for every shape it meets: the comparisons of tests and training loops).
// Native for float32/float64 pairs on the device, where each step below rounds exactly as
// ATen's composite does (|rtol * other| keeps the product and the sum apart, so no fused
// multiply-add); other dtypes and mixed devices take the composite.
at::Tensor isclose_fn(const at::Tensor& self, const at::Tensor& other, double rtol, double atol, bool equal_nan) {
  const at::ScalarType t = self.scalar_type();
  if (t != other.scalar_type() || (t != at::kFloat && t != at::kDouble) || !other.device().is_privateuseone() ||
      rtol < 0 || atol < 0) {
    return at::native::isclose(self, other, rtol, atol, equal_nan);  // its checks and messages too
  }
  OpBuilder op("aten::isclose");
  auto& b = op.b();
  Value x = op.input(self), y = op.input(other);
  const auto shape = ir::broadcast_shapes(b.dims(x), b.dims(y));
  x = b.broadcast_to(x, shape);
  y = b.broadcast_to(y, shape);
  auto either = [&](Value p, Value q) { return b.select(p, p, q); };
  auto both = [&](Value p, Value q) { return b.select(p, q, p); };
  Value close = b.compare(x, y, "EQ");
  if (equal_nan) close = either(close, both(b.compare(x, x, "NE"), b.compare(y, y, "NE")));
  if (rtol != 0 || atol != 0) {
    Value allowed = b.binary("add", b.scalar_like(x, atol), b.unary("abs", b.binary("multiply", b.scalar_like(y, rtol), y)));
    Value actual = b.unary("abs", b.binary("subtract", x, y));
    close = either(close, both(b.compare(actual, b.scalar_like(actual, INFINITY), "LT"), b.compare(actual, allowed, "LE")));
  }
  return finish(op, close, at::kBool, nullptr, op.pointwise_layout(static_cast<int64_t>(shape.size())));
}

at::Tensor round_decimals_fn(const at::Tensor& s, int64_t d) { return round_decimals_impl(s, d, nullptr); }

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  register_unary_ops(m);
  register_binary_ops(m);
#define REG_FUNCTIONAL_AND_OUT(NAME) \
  m.impl(#NAME, NAME##_fn);        \
  m.impl(#NAME ".out", NAME##_out);
  REG_FUNCTIONAL_AND_OUT(polygamma)
  REG_FUNCTIONAL_AND_OUT(nan_to_num)
  REG_FUNCTIONAL_AND_OUT(logit)
#undef REG_FUNCTIONAL_AND_OUT
  m.impl("nan_to_num_", nan_to_num_inplace);
#define REG_ONE_SIDED_CLAMP(NAME)                   \
  m.impl(#NAME, NAME##_s);                          \
  m.impl(#NAME ".Tensor", NAME##_t);                \
  m.impl(#NAME "_", NAME##_s_inplace);              \
  m.impl(#NAME "_.Tensor", NAME##_t_inplace);       \
  m.impl(#NAME ".out", NAME##_s_out);               \
  m.impl(#NAME ".Tensor_out", NAME##_t_out);
  REG_ONE_SIDED_CLAMP(clamp_min)
  REG_ONE_SIDED_CLAMP(clamp_max)
#undef REG_ONE_SIDED_CLAMP
  m.impl("_efficientzerotensor", efficient_zero_tensor);
  m.impl("isclose", isclose_fn);
  m.impl("logit_", logit_inplace);
  m.impl("heaviside", heaviside_fn);
  m.impl("heaviside_", heaviside_inplace);
  m.impl("heaviside.out", heaviside_out);
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
  m.impl("rsub.Tensor", rsub_fn);
  m.impl("rsub.Scalar", rsub_scalar_fn);
  m.impl("round.decimals_out", round_decimals_out);
  m.impl("round_.decimals", round_decimals_inplace);
  m.impl("__lshift__.Tensor", lshift_t);
  m.impl("__lshift__.Scalar", lshift_s);
  m.impl("__rshift__.Tensor", rshift_t);
  m.impl("__rshift__.Scalar", rshift_s);
  m.impl("__ilshift__.Tensor", ilshift_t);
  m.impl("__ilshift__.Scalar", ilshift_s);
  m.impl("__irshift__.Tensor", irshift_t);
  m.impl("__irshift__.Scalar", irshift_s);
  m.impl("_add_relu.Tensor", add_relu);
  m.impl("_add_relu.Scalar", add_relu_s);
  m.impl("_add_relu.out", add_relu_out);
  m.impl("_add_relu_.Tensor", add_relu_inplace);
  m.impl("mvlgamma", mvlgamma_k);
  m.impl("mvlgamma.out", mvlgamma_out);
  m.impl("mvlgamma_", mvlgamma_inplace);
  m.impl("_compute_linear_combination", linear_combination);
  m.impl("_compute_linear_combination.out", linear_combination_out);
  m.impl("round.decimals", round_decimals_fn);
}

}  // namespace torch_pjrt::device
