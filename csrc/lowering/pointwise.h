// Pointwise lowerings. Unary and binary ops are tables: a row names the ATen op,
// the overloads ATen defines for it, its result dtype and its rules (for unary ops:
// real, complex, what integers give). The ATen layer registers every row's kernels
// from them, so a new pointwise op is one row here (plus its rule, when it is
// longer than the row).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "ir/builder.h"

namespace torch_pjrt::lowering {

using ir::Builder;
using ir::DType;
using ir::Value;

using UnaryRule = Value (*)(Builder&, Value);

// The result dtype of a unary op, from its input's.
enum class UnaryResult : uint8_t {
  same,      // the input's dtype
  floating,  // integers and bools give the default float dtype
  boolean,   // a predicate: bool
};

// What an integer or bool input gives (the real rule is written for floats).
enum class OnIntegers : uint8_t {
  compute,              // the real rule, applied to the integers
  identity,             // the input itself (rounding)
  none,                 // all false (nothing integral is NaN or infinite)
  all,                  // all true (everything integral is finite)
  zero,                 // zeros (frac)
  nonzero_if_unsigned,  // x != 0 for bools and unsigned types, else the real rule (sign)
};

// Which of ATen's overloads an op has: `name`, `name_`, `name.out`.
enum UnaryVariant : uint8_t { kFunctional = 1, kInPlace = 2, kOut = 4 };

struct UnaryOp {
  const char* name;  // ATen's name of the functional form
  UnaryResult result;
  uint8_t variants;
  UnaryRule real;               // floats (half precision computed in float32 and rounded once)
  UnaryRule complex = nullptr;  // complex inputs; nullptr: `real` carries over
  OnIntegers integers = OnIntegers::compute;
  bool complex_to_real = false;   // a complex input gives a real result (abs, angle); in place is refused
  bool refuses_complex = false;   // complex inputs are refused
  bool out_must_be_bool = false;  // the out= overload takes a bool tensor only
  const char* bool_error = nullptr;  // bool inputs are refused with this message
};

// Every unary op, in the table's order.
std::span<const UnaryOp> unary_ops();
// The row of `name` (std::invalid_argument if none): for lookups made once, at registration.
const UnaryOp& unary_op(std::string_view name);
// op on x: x converted to `compute` first, the result converted to `out`.
Value unary(Builder& b, const UnaryOp& op, Value x, DType compute, DType out);

// Rules other lowerings use directly.
Value softplus(Builder& b, Value x);        // log(1 + e^x), stable
Value digamma(Builder& b, Value x);         // with torch's values at the pole 0
Value inverse_cosine(Builder& b, Value x);  // real acos
Value sign(Builder& b, Value x);            // (0 < x) - (x < 0): NaN and -0.0 give 0
// |x|: unsigned and bool values are their own magnitude (stablehlo.abs takes signed types only).
Value abs(Builder& b, Value x);
Value erf(Builder& b, Value x);

// Binary ops are one table too: a row names the op, its result dtype, its rule (on
// operands converted to the computation dtype and broadcast) and ATen's overloads of it
// for a Tensor and for a Scalar `other` (functional, in-place, out=; null: none or
// written out by hand). The ATen layer registers every overload a row names.
using BinaryRule = Value (*)(Builder&, Value, Value);

enum class BinaryResult : uint8_t {
  promoted,  // the operands' promoted dtype
  floating,  // promoted, integers to the default float dtype (true division, atan2 ...)
  boolean,   // comparisons and logical ops
};

struct BinaryOverloads {
  const char* functional = nullptr;
  const char* inplace = nullptr;
  const char* out = nullptr;
};

struct BinaryOp {
  const char* name;  // in messages and the recorded op's name: aten::<name>
  BinaryResult result;
  BinaryRule rule;
  BinaryOverloads tensor = {};
  BinaryOverloads scalar = {};
  bool refuses_complex = false;   // orderings: "not implemented for complex tensors"
  bool scalar_in_opmath = false;  // a half/bfloat16 tensor and a Python scalar are computed in float32, as ATen does
};

std::span<const BinaryOp> binary_ops();
// The row of `name` (std::invalid_argument if none): for lookups made once.
const BinaryOp& binary_op(std::string_view name);
// op on x and y, broadcast and converted to `compute`; the result converted to `out`.
Value binary(Builder& b, const BinaryOp& op, Value x, Value y, DType compute, DType out);
// add/sub with alpha: x + alpha * y.
Value add_scaled(Builder& b, Value x, Value y, Value alpha, DType compute, bool subtract);
Value where(Builder& b, Value cond, Value x, Value y, DType out);
Value clamp(Builder& b, Value x, const Value* lo, const Value* hi, DType out);
Value gelu(Builder& b, Value x, bool tanh_approx);
Value gelu_backward(Builder& b, Value grad, Value x, bool tanh_approx);

}  // namespace torch_pjrt::lowering
