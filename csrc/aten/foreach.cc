// _foreach_* kernels: one program per call for the whole tensor list, so an
// optimizer step costs a handful of executions instead of several per parameter.
#include <ATen/native/TypeProperties.h>
#include <torch/library.h>

#include <functional>

#include "device/context.h"
#include "device/recorder.h"
#include "lowering/ops.h"

namespace torch_pjrt::device {
namespace {

using ir::Value;
using Step = std::function<Value(ir::Builder&, const std::vector<Value>& xs, Value scalar)>;

at::ScalarType compute_dtype(const std::vector<at::Tensor>& ts, const at::Scalar* s) {
  at::ScalarType t = at::native::result_type(ts);
  if (s && s->isFloatingPoint() && at::isIntegralType(t, true)) t = c10::typeMetaToScalarType(c10::get_default_dtype());
  return t;
}

bool one_device(const std::vector<at::TensorList>& lists) {
  c10::Device dev = lists[0][0].device();
  for (const auto& l : lists)
    for (const auto& t : l)
      if (t.device() != dev && !(t.device().is_cpu() && t.dim() == 0)) return false;
  return dev.is_privateuseone();
}

// Applies `step` to the i-th tensors of every list (and the i-th scalar, when
// given: `scalars` has 0, 1 or n entries); writes into `self` or returns new tensors.
std::vector<at::Tensor> foreach_apply(const char* name, const std::vector<at::TensorList>& lists,
                                      const std::vector<at::Scalar>& scalars, const Step& step, bool inplace) {
  size_t n = lists[0].size();
  for (const auto& l : lists) {
    TORCH_CHECK(l.size() == n, name, ": tensor lists must have the same number of tensors, got ", n, " and ", l.size());
  }
  TORCH_CHECK(scalars.size() <= 1 || scalars.size() == n, name, ": expected ", n, " scalars but got ", scalars.size());
  std::vector<at::Tensor> results(n);
  if (n == 0) return results;
  auto run_range = [&](size_t begin, size_t end) {
    OpBuilder op(std::string("aten::") + name);
    std::vector<std::pair<size_t, Value>> outs;
    for (size_t i = begin; i < end; ++i) {
      std::vector<at::Tensor> row;
      for (const auto& l : lists) row.push_back(l[i]);
      const at::Scalar* s = scalars.empty() ? nullptr : &scalars[std::min(i, scalars.size() - 1)];
      at::ScalarType dt = compute_dtype(row, s);
      std::vector<Value> xs;
      for (const auto& t : row) xs.push_back(op.b().convert(op.input(t), to_ir(dt)));
      Value sv = s ? op.scalar(*s, dt) : Value{};
      Value r = step(op.b(), xs, sv);
      if (inplace) {
        TORCH_CHECK(at::canCast(dt, lists[0][i].scalar_type()), name, ": result type ", dt,
                    " can't be cast to the desired output type ", lists[0][i].scalar_type());
        op.write(lists[0][i], r);
      } else {
        results[i] = op.output(r, dt);
      }
    }
    op.run();
  };
  if (one_device(lists)) {
    run_range(0, n);
  } else {
    for (size_t i = 0; i < n; ++i) run_range(i, i + 1);  // tensors on several devices
  }
  return results;
}

Value bcast(ir::Builder& b, Value v, Value like) { return b.broadcast_to(v, b.dims(like)); }

// x op s (scalar), x op y (list, with alpha for add/sub).
Step binary_step(const std::string& op, bool with_alpha) {
  return [op, with_alpha](ir::Builder& b, const std::vector<Value>& xs, Value s) {
    Value other = xs.size() > 1 ? xs[1] : s;
    if (with_alpha && s.valid()) other = b.binary("multiply", bcast(b, other, xs[0]), bcast(b, s, xs[0]));
    auto shape = ir::broadcast_shapes(b.dims(xs[0]), b.dims(other));
    return b.binary(op, b.broadcast_to(xs[0], shape), b.broadcast_to(other, shape));
  };
}

std::vector<at::Scalar> as_vector(at::ArrayRef<at::Scalar> s) { return std::vector<at::Scalar>(s.begin(), s.end()); }

std::vector<at::Scalar> scalars_from_tensor(const at::Tensor& t) {
  at::Tensor host = t.device().is_cpu() ? t : t.cpu();
  host = host.to(at::kDouble).contiguous();
  std::vector<at::Scalar> out;
  for (int64_t i = 0; i < host.numel(); ++i) out.emplace_back(host.data_ptr<double>()[i]);
  return out;
}

#define FOREACH_BINARY(NAME, OP)                                                                          \
  std::vector<at::Tensor> NAME##_scalar(at::TensorList self, const at::Scalar& s) {                       \
    return foreach_apply("_foreach_" #NAME, {self}, {s}, binary_step(OP, false), false);                 \
  }                                                                                                       \
  void NAME##_scalar_(at::TensorList self, const at::Scalar& s) {                                         \
    foreach_apply("_foreach_" #NAME "_", {self}, {s}, binary_step(OP, false), true);                     \
  }                                                                                                       \
  std::vector<at::Tensor> NAME##_scalarlist(at::TensorList self, at::ArrayRef<at::Scalar> s) {            \
    return foreach_apply("_foreach_" #NAME, {self}, as_vector(s), binary_step(OP, false), false);        \
  }                                                                                                       \
  void NAME##_scalarlist_(at::TensorList self, at::ArrayRef<at::Scalar> s) {                              \
    foreach_apply("_foreach_" #NAME "_", {self}, as_vector(s), binary_step(OP, false), true);            \
  }

FOREACH_BINARY(add, "add")
FOREACH_BINARY(sub, "subtract")
FOREACH_BINARY(mul, "multiply")
FOREACH_BINARY(div, "divide")

#define FOREACH_LIST_ALPHA(NAME, OP)                                                                      \
  std::vector<at::Tensor> NAME##_list(at::TensorList self, at::TensorList other, const at::Scalar& a) {   \
    return foreach_apply("_foreach_" #NAME, {self, other}, {a}, binary_step(OP, true), false);           \
  }                                                                                                       \
  void NAME##_list_(at::TensorList self, at::TensorList other, const at::Scalar& a) {                     \
    foreach_apply("_foreach_" #NAME "_", {self, other}, {a}, binary_step(OP, true), true);               \
  }
FOREACH_LIST_ALPHA(add, "add")
FOREACH_LIST_ALPHA(sub, "subtract")

#define FOREACH_LIST(NAME, OP)                                                                            \
  std::vector<at::Tensor> NAME##_list(at::TensorList self, at::TensorList other) {                        \
    return foreach_apply("_foreach_" #NAME, {self, other}, {}, binary_step(OP, false), false);           \
  }                                                                                                       \
  void NAME##_list_(at::TensorList self, at::TensorList other) {                                          \
    foreach_apply("_foreach_" #NAME "_", {self, other}, {}, binary_step(OP, false), true);               \
  }                                                                                                       \
  std::vector<at::Tensor> NAME##_tensor(at::TensorList self, const at::Tensor& other) {                   \
    std::vector<at::Tensor> others(self.size(), other);                                                   \
    return foreach_apply("_foreach_" #NAME, {self, others}, {}, binary_step(OP, false), false);          \
  }                                                                                                       \
  void NAME##_tensor_(at::TensorList self, const at::Tensor& other) {                                     \
    std::vector<at::Tensor> others(self.size(), other);                                                   \
    foreach_apply("_foreach_" #NAME "_", {self, others}, {}, binary_step(OP, false), true);              \
  }
FOREACH_LIST(mul, "multiply")
FOREACH_LIST(div, "divide")

// self + value * (t1 op t2)
Step addc_step(const std::string& op) {
  return [op](ir::Builder& b, const std::vector<Value>& xs, Value s) {
    auto shape = ir::broadcast_shapes(ir::broadcast_shapes(b.dims(xs[0]), b.dims(xs[1])), b.dims(xs[2]));
    Value r = b.binary(op, b.broadcast_to(xs[1], shape), b.broadcast_to(xs[2], shape));
    return b.binary("add", b.broadcast_to(xs[0], shape), b.binary("multiply", b.broadcast_to(s, shape), r));
  };
}

#define FOREACH_ADDC(NAME, OP)                                                                             \
  std::vector<at::Tensor> NAME##_scalar(at::TensorList self, at::TensorList t1, at::TensorList t2,         \
                                        const at::Scalar& v) {                                             \
    return foreach_apply("_foreach_" #NAME, {self, t1, t2}, {v}, addc_step(OP), false);                   \
  }                                                                                                        \
  void NAME##_scalar_(at::TensorList self, at::TensorList t1, at::TensorList t2, const at::Scalar& v) {    \
    foreach_apply("_foreach_" #NAME "_", {self, t1, t2}, {v}, addc_step(OP), true);                       \
  }                                                                                                        \
  std::vector<at::Tensor> NAME##_scalarlist(at::TensorList self, at::TensorList t1, at::TensorList t2,     \
                                            at::ArrayRef<at::Scalar> v) {                                  \
    return foreach_apply("_foreach_" #NAME, {self, t1, t2}, as_vector(v), addc_step(OP), false);          \
  }                                                                                                        \
  void NAME##_scalarlist_(at::TensorList self, at::TensorList t1, at::TensorList t2,                       \
                          at::ArrayRef<at::Scalar> v) {                                                    \
    foreach_apply("_foreach_" #NAME "_", {self, t1, t2}, as_vector(v), addc_step(OP), true);              \
  }                                                                                                        \
  std::vector<at::Tensor> NAME##_tensor(at::TensorList self, at::TensorList t1, at::TensorList t2,         \
                                        const at::Tensor& v) {                                             \
    return foreach_apply("_foreach_" #NAME, {self, t1, t2}, scalars_from_tensor(v), addc_step(OP), false); \
  }                                                                                                        \
  void NAME##_tensor_(at::TensorList self, at::TensorList t1, at::TensorList t2, const at::Tensor& v) {    \
    foreach_apply("_foreach_" #NAME "_", {self, t1, t2}, scalars_from_tensor(v), addc_step(OP), true);    \
  }
FOREACH_ADDC(addcmul, "multiply")
FOREACH_ADDC(addcdiv, "divide")

// self + w * (end - self)
Value lerp(ir::Builder& b, Value x, Value end, Value w) {
  auto shape = ir::broadcast_shapes(ir::broadcast_shapes(b.dims(x), b.dims(end)), b.dims(w));
  Value xb = b.broadcast_to(x, shape);
  return b.binary("add", xb, b.binary("multiply", b.broadcast_to(w, shape),
                                      b.binary("subtract", b.broadcast_to(end, shape), xb)));
}
Step lerp_scalar_step() {
  return [](ir::Builder& b, const std::vector<Value>& xs, Value s) { return lerp(b, xs[0], xs[1], s); };
}
Step lerp_list_step() {
  return [](ir::Builder& b, const std::vector<Value>& xs, Value) { return lerp(b, xs[0], xs[1], xs[2]); };
}
std::vector<at::Tensor> lerp_scalar(at::TensorList self, at::TensorList end, const at::Scalar& w) {
  return foreach_apply("_foreach_lerp", {self, end}, {w}, lerp_scalar_step(), false);
}
void lerp_scalar_(at::TensorList self, at::TensorList end, const at::Scalar& w) {
  foreach_apply("_foreach_lerp_", {self, end}, {w}, lerp_scalar_step(), true);
}
std::vector<at::Tensor> lerp_scalarlist(at::TensorList self, at::TensorList end, at::ArrayRef<at::Scalar> w) {
  return foreach_apply("_foreach_lerp", {self, end}, as_vector(w), lerp_scalar_step(), false);
}
void lerp_scalarlist_(at::TensorList self, at::TensorList end, at::ArrayRef<at::Scalar> w) {
  foreach_apply("_foreach_lerp_", {self, end}, as_vector(w), lerp_scalar_step(), true);
}
std::vector<at::Tensor> lerp_list(at::TensorList self, at::TensorList end, at::TensorList w) {
  return foreach_apply("_foreach_lerp", {self, end, w}, {}, lerp_list_step(), false);
}
void lerp_list_(at::TensorList self, at::TensorList end, at::TensorList w) {
  foreach_apply("_foreach_lerp_", {self, end, w}, {}, lerp_list_step(), true);
}

#define FOREACH_UNARY(NAME)                                                                                \
  Step NAME##_step() {                                                                                     \
    static const lowering::UnaryOp& row = lowering::unary_op(#NAME);                                      \
    return [](ir::Builder& b, const std::vector<Value>& xs, Value) {                                       \
      return lowering::unary(b, row, xs[0], b.dtype(xs[0]), b.dtype(xs[0]));                               \
    };                                                                                                     \
  }                                                                                                        \
  std::vector<at::Tensor> NAME##_fn(at::TensorList self) {                                                 \
    return foreach_apply("_foreach_" #NAME, {self}, {}, NAME##_step(), false);                            \
  }                                                                                                        \
  void NAME##_fn_(at::TensorList self) { foreach_apply("_foreach_" #NAME "_", {self}, {}, NAME##_step(), true); }
FOREACH_UNARY(sqrt)
FOREACH_UNARY(neg)
FOREACH_UNARY(abs)
FOREACH_UNARY(exp)
FOREACH_UNARY(reciprocal)
FOREACH_UNARY(sign)

void zero_(at::TensorList self) {
  foreach_apply("_foreach_zero_", {self}, {},
                [](ir::Builder& b, const std::vector<Value>& xs, Value) { return b.scalar_like(xs[0], 0); }, true);
}

// Vector norms (ord 1, 2, inf, -inf, or p) of each tensor, in one program.
std::vector<at::Tensor> norm(at::TensorList self, const at::Scalar& ord, std::optional<at::ScalarType> dtype) {
  double p = ord.toDouble();
  TORCH_CHECK(p > 0 || std::isinf(p), "_foreach_norm: ord must be positive, inf or -inf, got ", p);
  Step step = [p](ir::Builder& b, const std::vector<Value>& xs, Value) {
    ir::DType acc = b.dtype(xs[0]) == ir::DType::F64 ? ir::DType::F64 : ir::DType::F32;
    return lowering::vector_norm(b, xs[0], p, {}, false, acc);
  };
  auto out = foreach_apply("_foreach_norm", {self}, {}, step, false);
  at::ScalarType want = dtype.value_or(self.empty() ? at::kFloat : self[0].scalar_type());
  for (auto& t : out)
    if (t.scalar_type() != want) t = t.to(want);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
#define REG_SCALARS(NAME)                                   \
  m.impl("_foreach_" #NAME ".Scalar", NAME##_scalar);       \
  m.impl("_foreach_" #NAME "_.Scalar", NAME##_scalar_);     \
  m.impl("_foreach_" #NAME ".ScalarList", NAME##_scalarlist); \
  m.impl("_foreach_" #NAME "_.ScalarList", NAME##_scalarlist_);
  REG_SCALARS(add) REG_SCALARS(sub) REG_SCALARS(mul) REG_SCALARS(div)
#define REG_LIST(NAME)                                      \
  m.impl("_foreach_" #NAME ".List", NAME##_list);           \
  m.impl("_foreach_" #NAME "_.List", NAME##_list_);
  REG_LIST(add) REG_LIST(sub) REG_LIST(mul) REG_LIST(div)
  m.impl("_foreach_mul.Tensor", mul_tensor);
  m.impl("_foreach_mul_.Tensor", mul_tensor_);
  m.impl("_foreach_div.Tensor", div_tensor);
  m.impl("_foreach_div_.Tensor", div_tensor_);
#define REG_ADDC(NAME)                                       \
  m.impl("_foreach_" #NAME ".Scalar", NAME##_scalar);        \
  m.impl("_foreach_" #NAME "_.Scalar", NAME##_scalar_);      \
  m.impl("_foreach_" #NAME ".ScalarList", NAME##_scalarlist); \
  m.impl("_foreach_" #NAME "_.ScalarList", NAME##_scalarlist_); \
  m.impl("_foreach_" #NAME ".Tensor", NAME##_tensor);        \
  m.impl("_foreach_" #NAME "_.Tensor", NAME##_tensor_);
  REG_ADDC(addcmul) REG_ADDC(addcdiv)
  m.impl("_foreach_lerp.Scalar", lerp_scalar);
  m.impl("_foreach_lerp_.Scalar", lerp_scalar_);
  m.impl("_foreach_lerp.ScalarList", lerp_scalarlist);
  m.impl("_foreach_lerp_.ScalarList", lerp_scalarlist_);
  m.impl("_foreach_lerp.List", lerp_list);
  m.impl("_foreach_lerp_.List", lerp_list_);
#define REG_UNARY(NAME)                            \
  m.impl("_foreach_" #NAME, NAME##_fn);            \
  m.impl("_foreach_" #NAME "_", NAME##_fn_);
  REG_UNARY(sqrt) REG_UNARY(neg) REG_UNARY(abs) REG_UNARY(exp) REG_UNARY(reciprocal) REG_UNARY(sign)
  m.impl("_foreach_zero_", zero_);
  m.impl("_foreach_norm.Scalar", norm);
}

}  // namespace torch_pjrt::device
