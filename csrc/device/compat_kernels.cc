// ATen's internal, fused and legacy entry points that user code reaches
// through PyTorch itself (fused optimizers, GradScaler, weight norm, masked
// softmax, shifts, async asserts, ...): each one program over existing
// lowerings, or a short composition of native kernels. Without these the
// calls land on the CPU fallback.
#include <ATen/WrapDimUtils.h>
#include <torch/library.h>

#include <cmath>

#include "device/context.h"
#include "device/device_name.h"
#include "device/kernel_util.h"
#include "lowering/nn.h"
#include "lowering/ops.h"

namespace torch_pjrt::device {

namespace {

using ir::Value;
namespace L = lowering;
using Tensor = at::Tensor;

// ---------------------------------------------------------------- shifts, add_relu, aminmax, stack

Tensor shift(const char* name, const Tensor& self, const Tensor& other, bool left, const Tensor* into) {
  at::ScalarType t = at::result_type(self, other);
  TORCH_CHECK(at::isIntegralType(t, /*includeBool=*/false), name, ": expected integer inputs, got ", t);
  OpBuilder op(std::string("aten::") + name);
  Value r = L::binary(op.b(), left ? "bitwise_left_shift" : "bitwise_right_shift", op.input(self), op.input(other),
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

Tensor addmm_activation(const Tensor& self, const Tensor& m1, const Tensor& m2, const at::Scalar& beta,
                        const at::Scalar& alpha, bool use_gelu) {
  Tensor r = at::addmm(self, m1, m2, beta, alpha);
  return use_gelu ? at::gelu(r) : r.relu_();
}
Tensor& addmm_activation_out(const Tensor& self, const Tensor& m1, const Tensor& m2, const at::Scalar& beta,
                             const at::Scalar& alpha, bool use_gelu, Tensor& out) {
  return write_out("_addmm_activation", addmm_activation(self, m1, m2, beta, alpha, use_gelu), out);
}

std::tuple<Tensor, Tensor> aminmax_all_legacy(const Tensor& self) {
  auto [mn, mx] = at::aminmax(self);
  return {mn, mx};
}
std::tuple<Tensor, Tensor> aminmax_dim_legacy(const Tensor& self, int64_t dim, bool keepdim) {
  auto [mn, mx] = at::aminmax(self, dim, keepdim);
  return {mn, mx};
}

Tensor stack_legacy(at::TensorList tensors, int64_t dim) { return at::stack(tensors, dim); }
Tensor& stack_legacy_out(at::TensorList tensors, int64_t dim, Tensor& out) {
  return write_out("_stack", at::stack(tensors, dim), out);
}

// ---------------------------------------------------------------- asserts

// Checked at the next sync point like an out-of-range index (no host read here).
void assert_async_msg(const Tensor& self, c10::string_view msg) {
  TORCH_CHECK(self.numel() == 1, "Boolean value of Tensor with more than one value is ambiguous");
  OpBuilder op("aten::_assert_async");
  auto& b = op.b();
  Value v = b.reshape(op.input(self), {});
  Value zero = b.convert(b.constant_int(ir::DType::S64, 0), b.dtype(v));
  op.check_flag(b.compare(v, zero, "EQ"),
                msg.empty() ? std::string("Expected Tensor with single nonzero value, but got zero") : std::string(msg));
  op.run();
}
void assert_async(const Tensor& self) { assert_async_msg(self, ""); }
Tensor functional_assert_async(const Tensor& self, c10::string_view msg, const Tensor& dep_token) {
  assert_async_msg(self, msg);
  return dep_token.clone();
}

// ---------------------------------------------------------------- small math

Tensor logcumsumexp_k(const Tensor& self, int64_t dim) {
  OpBuilder op("aten::_logcumsumexp");
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  Value x = op.input(self);
  if (self.dim() == 0) x = op.b().reshape(x, {1});
  Value r = L::cumulative(op.b(), x, d, "logsumexp");
  if (self.dim() == 0) r = op.b().reshape(r, {});
  return finish(op, r, self.scalar_type(), nullptr);
}
Tensor& logcumsumexp_out(const Tensor& self, int64_t dim, Tensor& out) {
  return write_out("_logcumsumexp", logcumsumexp_k(self, dim), out);
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
  if (dt == ir::DType::F16 || dt == ir::DType::BF16) dt = ir::DType::F32;
  Value i = b.convert(b.iota(ir::DType::S64, {n}, 0), dt);
  Value r = b.binary("add", b.broadcast_to(op.scalar(start, to_aten(dt)), {n}),
                     b.binary("multiply", i, b.broadcast_to(op.scalar(step, to_aten(dt)), {n})));
  return write_sequence(op, b.convert(r, to_ir(out.scalar_type())), n, out);
}

Tensor int_mm(const Tensor& self, const Tensor& mat2) {
  TORCH_CHECK(self.dim() == 2 && mat2.dim() == 2, "_int_mm: expected 2D tensors, got ", self.dim(), "D and ", mat2.dim(), "D");
  TORCH_CHECK(self.scalar_type() == at::kChar && mat2.scalar_type() == at::kChar,
              "_int_mm: expected int8 inputs, got ", self.scalar_type(), " and ", mat2.scalar_type());
  TORCH_CHECK(self.size(1) == mat2.size(0), "_int_mm: self.size(1) needs to match mat2.size(0), but got ", self.size(1),
              " and ", mat2.size(0));
  OpBuilder op("aten::_int_mm");
  auto& b = op.b();
  Value r = b.dot_general(b.convert(op.input(self), ir::DType::S32), b.convert(op.input(mat2), ir::DType::S32), {}, {},
                          {1}, {0}, ir::DType::S32);
  return finish(op, r, at::kInt, nullptr);
}
Tensor& int_mm_out(const Tensor& self, const Tensor& mat2, Tensor& out) { return write_out("_int_mm", int_mm(self, mat2), out); }

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

bool is_set_to(const Tensor& self, const Tensor& other) {
  return self.storage().is_alias_of(other.storage()) && self.storage_offset() == other.storage_offset() &&
         self.sizes().equals(other.sizes()) && self.strides().equals(other.strides());
}

Tensor channel_shuffle(const Tensor& self, int64_t groups) {
  TORCH_CHECK(groups > 0, "Number of groups to divide channels in must be positive. Value of groups:", groups);
  TORCH_CHECK(self.dim() >= 3, "channel_shuffle expects input to have at least 3 dimensions, but got input with sizes ",
              self.sizes());
  int64_t c = self.size(1);
  TORCH_CHECK(c % groups == 0, "Number of channels must be divisible by groups. Got ", c, " channels and ", groups, " groups.");
  std::vector<int64_t> split = vec(self.sizes());
  split[1] = c / groups;
  split.insert(split.begin() + 1, groups);
  return self.reshape(split).transpose(1, 2).reshape(self.sizes()).contiguous(self.suggest_memory_format());
}

// ---------------------------------------------------------------- weight norm, masked softmax, renorm

std::vector<int64_t> all_but(int64_t rank, int64_t dim) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < rank; ++d)
    if (d != dim) dims.push_back(d);
  return dims;
}

std::tuple<Tensor, Tensor> weight_norm(const Tensor& v, const Tensor& g, int64_t dim) {
  int64_t d = dim == -1 ? v.dim() - 1 : dim;
  Tensor norms = v.dim() == 0 ? v.abs() : at::linalg_vector_norm(v, 2, all_but(v.dim(), d), /*keepdim=*/true);
  return {v * (g / norms), norms};
}
std::tuple<Tensor, Tensor> weight_norm_backward(const Tensor& grad_w, const Tensor& v, const Tensor& g,
                                                const Tensor& norms, int64_t dim) {
  int64_t d = dim == -1 ? v.dim() - 1 : dim;
  auto dims = all_but(v.dim(), d);
  // w = g v / |v|: dg = sum(dw v) / |v|; dv = g / |v| (dw - v dg / |v|).
  Tensor dot = (grad_w * v).sum(dims, /*keepdim=*/true);
  Tensor grad_g = dot / norms;
  Tensor grad_v = (g / norms) * (grad_w - v * (grad_g / norms));
  return {grad_v, grad_g.reshape(g.sizes())};
}

Tensor masked_fill_for(const Tensor& self, const Tensor& mask, std::optional<int64_t> mask_type, int64_t dim) {
  Tensor m = mask;
  if (mask_type && *mask_type == 1 && self.dim() == 4 && m.dim() == 2) m = m.view({m.size(0), 1, 1, m.size(1)});
  TORCH_CHECK(m.scalar_type() == at::kBool, "Mask should be a boolean tensor");
  (void)dim;
  return m.expand(self.sizes());
}
Tensor masked_softmax(const Tensor& self, const Tensor& mask, std::optional<int64_t> dim, std::optional<int64_t> mask_type) {
  int64_t d = at::maybe_wrap_dim(dim.value_or(-1), self.dim());
  Tensor m = masked_fill_for(self, mask, mask_type, d);
  // Masked positions are -inf, so they get 0; a fully masked row is NaN, as on CPU.
  return at::softmax(self.masked_fill(m, -std::numeric_limits<double>::infinity()), d);
}
Tensor masked_softmax_backward(const Tensor& grad, const Tensor& output, const Tensor& mask, std::optional<int64_t> dim) {
  int64_t d = at::maybe_wrap_dim(dim.value_or(-1), output.dim());
  Tensor m = mask.expand(output.sizes());
  Tensor g = grad.masked_fill(m, 0);
  return (output * (g - (g * output).sum(d, /*keepdim=*/true))).masked_fill(m, 0);
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

// ---------------------------------------------------------------- mixed precision and fused optimizers

void amp_unscale(at::TensorList grads, Tensor& found_inf, const Tensor& inv_scale) {
  TORCH_CHECK(inv_scale.numel() == 1, "inv_scale must be a 1-element tensor.");
  TORCH_CHECK(found_inf.numel() == 1, "found_inf must be a 1-element tensor.");
  TORCH_CHECK(inv_scale.scalar_type() == at::kFloat && found_inf.scalar_type() == at::kFloat,
              "inv_scale and found_inf must be float tensors.");
  if (grads.empty()) return;
  // One program: every gradient scaled, found_inf set if any is not finite.
  OpBuilder op("aten::_amp_foreach_non_finite_check_and_unscale_");
  auto& b = op.b();
  Value inv = b.reshape(op.input(inv_scale), {});
  Value bad = b.reshape(b.convert(op.input(found_inf), ir::DType::Pred), {});
  for (const Tensor& g : grads) {
    Value v = op.input(g);
    int64_t n = g.numel();
    if (n > 0) {
      Value finite = b.unary("is_finite", b.reshape(v, {n}));
      Value all = b.reduce_simple(finite, b.constant_int(ir::DType::Pred, 1), {0}, "and");
      bad = b.binary("or", bad, b.unary("not", all));
    }
    Value scale = b.broadcast_to(b.convert(inv, b.dtype(v)), vec(g.sizes()));
    op.write(g, b.binary("multiply", v, scale));
  }
  op.write(found_inf, b.reshape(b.convert(bad, ir::DType::F32), vec(found_inf.sizes())));
  op.run();
}

Tensor& amp_update_scale(Tensor& scale, Tensor& growth_tracker, const Tensor& found_inf, double growth_factor,
                         double backoff_factor, int64_t growth_interval) {
  TORCH_CHECK(growth_tracker.scalar_type() == at::kInt, "growth_tracker must be an int tensor.");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && found_inf.scalar_type() == at::kFloat,
              "current_scale and found_inf must be float tensors.");
  OpBuilder op("aten::_amp_update_scale_");
  auto& b = op.b();
  Value s = b.reshape(op.input(scale), {}), t = b.reshape(op.input(growth_tracker), {});
  Value inf = b.compare(b.reshape(op.input(found_inf), {}), b.constant(ir::DType::F32, 0), "NE");
  Value next = b.binary("add", t, b.constant_int(ir::DType::S32, 1));
  Value grow = b.compare(next, b.constant_int(ir::DType::S32, growth_interval), "EQ");
  Value grown = b.binary("multiply", s, b.constant(ir::DType::F32, growth_factor));
  // A growth that overflows to inf is not taken (as on CPU).
  Value grown_ok = b.select(b.unary("is_finite", grown), grown, s);
  Value new_scale = b.select(inf, b.binary("multiply", s, b.constant(ir::DType::F32, backoff_factor)),
                             b.select(grow, grown_ok, s));
  Value new_t = b.select(inf, b.constant_int(ir::DType::S32, 0), b.select(grow, b.constant_int(ir::DType::S32, 0), next));
  op.write(scale, b.reshape(new_scale, vec(scale.sizes())));
  op.write(growth_tracker, b.reshape(new_t, vec(growth_tracker.sizes())));
  op.run();
  return scale;
}

// The gradient a fused optimizer step uses: negated when maximizing, unscaled by grad_scale.
Value step_grad(OpBuilder& op, const Tensor& grad, ir::DType dt, bool maximize, const std::optional<Tensor>& grad_scale) {
  auto& b = op.b();
  Value g = b.convert(op.input(grad), dt);
  if (maximize) g = b.unary("negate", g);
  if (grad_scale && grad_scale->defined()) {
    g = b.binary("divide", g, b.broadcast_to(b.convert(b.reshape(op.input(*grad_scale), {}), dt), b.dims(g)));
  }
  return g;
}
// found_inf set: the step is skipped (every write keeps the old value).
Value skip_flag(OpBuilder& op, const std::optional<Tensor>& found_inf) {
  if (!found_inf || !found_inf->defined()) return Value{};
  auto& b = op.b();
  Value f = b.reshape(op.input(*found_inf), {});
  return b.compare(f, b.scalar_like(f, 0), "NE");
}
void write_unless(OpBuilder& op, const Tensor& dst, Value v, Value skip) {
  auto& b = op.b();
  if (skip.valid()) v = b.select(b.broadcast_to(skip, b.dims(v)), b.convert(op.input(dst), b.dtype(v)), v);
  op.write(dst, v);
}

void fused_adam_impl(bool adamw, at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                     at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs, at::TensorList steps, double lr,
                     double beta1, double beta2, double weight_decay, double eps, bool amsgrad, bool maximize,
                     const std::optional<Tensor>& grad_scale, const std::optional<Tensor>& found_inf) {
  size_t n = params.size();
  TORCH_CHECK(grads.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n && steps.size() == n &&
                  (!amsgrad || max_exp_avg_sqs.size() == n),
              "_fused_adam: all tensor lists must have the same length");
  if (n == 0) return;
  OpBuilder op(adamw ? "aten::_fused_adamw_" : "aten::_fused_adam_");
  auto& b = op.b();
  Value skip = skip_flag(op, found_inf);
  for (size_t i = 0; i < n; ++i) {
    ir::DType dt = L::accumulate_type(to_ir(params[i].scalar_type()));
    auto c = [&](Value like, double v) { return b.scalar_like(like, v); };
    // What depends on the learning rate is a runtime scalar: a scheduler changes it every
    // step, and a constant would compile a new program each time.
    auto runtime = [&](double v) { return op.scalar(v, to_aten(dt)); };
    Value p = b.convert(op.input(params[i]), dt);
    Value g = step_grad(op, grads[i], dt, maximize, grad_scale);
    if (weight_decay != 0) {
      if (adamw) p = b.binary("multiply", p, b.broadcast_to(runtime(1 - lr * weight_decay), b.dims(p)));
      else g = b.binary("add", g, b.binary("multiply", p, c(p, weight_decay)));
    }
    Value m = b.convert(op.input(exp_avgs[i]), dt), v = b.convert(op.input(exp_avg_sqs[i]), dt);
    m = b.binary("add", b.binary("multiply", m, c(m, beta1)), b.binary("multiply", g, c(g, 1 - beta1)));
    v = b.binary("add", b.binary("multiply", v, c(v, beta2)), b.binary("multiply", b.binary("multiply", g, g), c(g, 1 - beta2)));
    Value step = b.convert(b.reshape(op.input(steps[i]), {}), dt);
    // 1 - beta^step as -expm1(step * log(beta)), log taken on the host in double: 1 - pow
    // of a beta rounded to float32 cancels (beta2 = 0.999 loses 4 of float32's 7 digits),
    // and CPU's kernel computes the correction in double.
    auto bias_correction = [&](double beta) {
      return b.unary("negate", b.unary("exponential_minus_one", b.binary("multiply", step, b.constant(dt, std::log(beta)))));
    };
    Value bc1 = bias_correction(beta1), bc2 = bias_correction(beta2);
    Value step_size = b.broadcast_to(b.binary("divide", runtime(lr), bc1), b.dims(p));
    Value bc2_sqrt = b.broadcast_to(b.unary("sqrt", bc2), b.dims(p));
    Value second = v;
    if (amsgrad) {
      second = b.binary("maximum", b.convert(op.input(max_exp_avg_sqs[i]), dt), v);
      write_unless(op, max_exp_avg_sqs[i], second, skip);
    }
    Value denom = b.binary("add", b.binary("divide", b.unary("sqrt", second), bc2_sqrt), c(p, eps));
    p = b.binary("subtract", p, b.binary("multiply", step_size, b.binary("divide", m, denom)));
    write_unless(op, exp_avgs[i], m, skip);
    write_unless(op, exp_avg_sqs[i], v, skip);
    write_unless(op, params[i], p, skip);
  }
  op.run();
}
void fused_adam(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                at::TensorList max_exp_avg_sqs, at::TensorList steps, double lr, double beta1, double beta2,
                double weight_decay, double eps, bool amsgrad, bool maximize, const std::optional<Tensor>& grad_scale,
                const std::optional<Tensor>& found_inf) {
  fused_adam_impl(false, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, beta1, beta2, weight_decay,
                  eps, amsgrad, maximize, grad_scale, found_inf);
}
void fused_adamw(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                 at::TensorList max_exp_avg_sqs, at::TensorList steps, double lr, double beta1, double beta2,
                 double weight_decay, double eps, bool amsgrad, bool maximize, const std::optional<Tensor>& grad_scale,
                 const std::optional<Tensor>& found_inf) {
  fused_adam_impl(true, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, beta1, beta2, weight_decay,
                  eps, amsgrad, maximize, grad_scale, found_inf);
}

void fused_sgd(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers, double weight_decay,
               double momentum, double lr, double dampening, bool nesterov, bool maximize, bool is_first_step,
               const std::optional<Tensor>& grad_scale, const std::optional<Tensor>& found_inf) {
  size_t n = params.size();
  TORCH_CHECK(grads.size() == n && (momentum == 0 || momentum_buffers.size() == n),
              "_fused_sgd: all tensor lists must have the same length");
  if (n == 0) return;
  OpBuilder op("aten::_fused_sgd_");
  auto& b = op.b();
  Value skip = skip_flag(op, found_inf);
  for (size_t i = 0; i < n; ++i) {
    ir::DType dt = L::accumulate_type(to_ir(params[i].scalar_type()));
    Value p = b.convert(op.input(params[i]), dt);
    Value g = step_grad(op, grads[i], dt, maximize, grad_scale);
    if (weight_decay != 0) g = b.binary("add", g, b.binary("multiply", p, b.scalar_like(p, weight_decay)));
    if (momentum != 0) {
      Value buf = g;
      if (!is_first_step) {
        Value old = b.convert(op.input(momentum_buffers[i]), dt);
        buf = b.binary("add", b.binary("multiply", old, b.scalar_like(old, momentum)),
                       b.binary("multiply", g, b.scalar_like(g, 1 - dampening)));
      }
      write_unless(op, momentum_buffers[i], buf, skip);
      g = nesterov ? b.binary("add", g, b.binary("multiply", buf, b.scalar_like(buf, momentum))) : buf;
    }
    // The learning rate is a runtime scalar (a scheduler changes it every step).
    Value rate = b.broadcast_to(op.scalar(lr, to_aten(dt)), b.dims(g));
    write_unless(op, params[i], b.binary("subtract", p, b.binary("multiply", g, rate)), skip);
  }
  op.run();
}

// ---------------------------------------------------------------- repeat_interleave

Tensor repeat_interleave_k(const Tensor& repeats, std::optional<int64_t> output_size) {
  TORCH_CHECK(repeats.dim() == 1, "repeat_interleave only accept 1D vector as repeat");
  TORCH_CHECK(repeats.scalar_type() == at::kLong || repeats.scalar_type() == at::kInt,
              "repeats has to be Long or Int tensor");
  int64_t total = output_size ? *output_size : (repeats.numel() ? repeats.sum().item<int64_t>() : 0);
  if (!output_size && repeats.numel()) {
    TORCH_CHECK(repeats.min().item<int64_t>() >= 0, "repeats can not be negative");
  }
  if (total == 0) return at::empty({0}, repeats.options().dtype(repeats.scalar_type()));
  // Output j belongs to the repeat whose cumulative end first exceeds j.
  Tensor ends = at::cumsum(repeats.to(at::kLong), 0);
  Tensor positions = at::arange(total, repeats.options().dtype(at::kLong));
  return at::searchsorted(ends, positions, /*out_int32=*/false, /*right=*/true).to(repeats.scalar_type());
}

// ---------------------------------------------------------------- transformer fast paths

// Attention of [B, T, E] inputs with packed projections, as the fused CPU
// kernels compute it; mask (bool: true is masked out, else additive) of
// mask_type 0 [T, S], 1 [B, S] (key padding) or 2 (broadcastable to [B, H, T, S]).
std::pair<Tensor, Tensor> packed_attention(const Tensor& query, const Tensor& key, const Tensor& value, int64_t heads,
                                           const Tensor& qkv_weight, const Tensor& qkv_bias, const Tensor& proj_weight,
                                           const Tensor& proj_bias, const std::optional<Tensor>& mask,
                                           std::optional<int64_t> mask_type) {
  TORCH_CHECK(query.dim() == 3, "attention fast path: expected [B, T, E] inputs, got ", query.sizes());
  int64_t b = query.size(0), t = query.size(1), e = query.size(2), s = key.size(1);
  TORCH_CHECK(e % heads == 0, "attention fast path: embed_dim must be divisible by num_heads");
  int64_t d = e / heads;
  auto w = qkv_weight.chunk(3, 0);
  auto bias = qkv_bias.chunk(3, 0);
  auto heads_of = [&](const Tensor& x, int64_t len) { return x.view({b, len, heads, d}).transpose(1, 2); };
  Tensor q = heads_of(at::linear(query, w[0], bias[0]), t);
  Tensor k = heads_of(at::linear(key, w[1], bias[1]), s);
  Tensor v = heads_of(at::linear(value, w[2], bias[2]), s);
  Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
  if (mask && mask->defined()) {
    Tensor m = *mask;
    if (mask_type && *mask_type == 1) m = m.view({b, 1, 1, s});
    if (m.scalar_type() == at::kBool) {
      scores = scores.masked_fill(m, -std::numeric_limits<double>::infinity());
    } else {
      scores = scores + m.to(scores.scalar_type());
    }
  }
  Tensor weights = at::softmax(scores, -1);
  Tensor out = at::matmul(weights, v).transpose(1, 2).reshape({b, t, e});
  return {at::linear(out, proj_weight, proj_bias), weights};
}

std::tuple<Tensor, Tensor> native_mha(const Tensor& query, const Tensor& key, const Tensor& value, int64_t embed_dim,
                                      int64_t num_heads, const Tensor& qkv_weight, const Tensor& qkv_bias,
                                      const Tensor& proj_weight, const Tensor& proj_bias, const std::optional<Tensor>& mask,
                                      bool need_weights, bool average_attn_weights, std::optional<int64_t> mask_type) {
  TORCH_CHECK(query.size(-1) == embed_dim, "_native_multi_head_attention: query's last dim must be embed_dim");
  auto [out, weights] = packed_attention(query, key, value, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                         mask, mask_type);
  if (!need_weights) return {out, at::empty({0}, query.options())};
  return {out, average_attn_weights ? weights.mean(1) : weights};
}

Tensor transformer_encoder_layer(const Tensor& src, int64_t embed_dim, int64_t num_heads, const Tensor& qkv_weight,
                                 const Tensor& qkv_bias, const Tensor& proj_weight, const Tensor& proj_bias,
                                 bool use_gelu, bool norm_first, double eps, const Tensor& norm_weight_1,
                                 const Tensor& norm_bias_1, const Tensor& norm_weight_2, const Tensor& norm_bias_2,
                                 const Tensor& ffn_weight_1, const Tensor& ffn_bias_1, const Tensor& ffn_weight_2,
                                 const Tensor& ffn_bias_2, const std::optional<Tensor>& mask,
                                 std::optional<int64_t> mask_type) {
  TORCH_CHECK(!src.is_nested(), "_transformer_encoder_layer_fwd: nested tensors are not supported on ", device_name());
  std::vector<int64_t> shape{embed_dim};
  auto norm = [&](const Tensor& x, const Tensor& w, const Tensor& b) { return at::layer_norm(x, shape, w, b, eps); };
  auto attend = [&](const Tensor& x) {
    return packed_attention(x, x, x, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type).first;
  };
  auto ffn = [&](const Tensor& x) {
    Tensor h = at::linear(x, ffn_weight_1, ffn_bias_1);
    h = use_gelu ? at::gelu(h) : at::relu(h);
    return at::linear(h, ffn_weight_2, ffn_bias_2);
  };
  Tensor x = src;
  if (norm_first) {
    x = x + attend(norm(x, norm_weight_1, norm_bias_1));
    return x + ffn(norm(x, norm_weight_2, norm_bias_2));
  }
  x = norm(x + attend(x), norm_weight_1, norm_bias_1);
  return norm(x + ffn(x), norm_weight_2, norm_bias_2);
}

// There are no nested tensors on pjrt: answering "not left aligned" makes
// nn.TransformerEncoder keep padded batches dense (masked attention through the
// kernels above) instead of converting them to nested tensors, which would fail.
bool nested_mask_left_aligned(const Tensor&, const Tensor&) { return false; }

// ---------------------------------------------------------------- convolution and pooling entry points

std::vector<int64_t> ones(size_t n) { return std::vector<int64_t>(n, 1); }
std::vector<int64_t> zeros(size_t n) { return std::vector<int64_t>(n, 0); }

// The legacy slow_conv* entry points are plain convolutions: the one native kernel.
Tensor slow_conv_k(const Tensor& self, const Tensor& weight, const std::optional<Tensor>& bias, c10::IntArrayRef stride,
                 c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding) {
  return at::convolution(self, weight, bias, stride, padding, dilation, transposed, output_padding, 1);
}
Tensor slow_conv3d_forward_k(const Tensor& s, const Tensor& w, c10::IntArrayRef, const std::optional<Tensor>& bias,
                           c10::IntArrayRef stride, c10::IntArrayRef padding) {
  return slow_conv_k(s, w, bias, stride, padding, ones(3), false, zeros(3));
}
Tensor& slow_conv3d_forward_out(const Tensor& s, const Tensor& w, c10::IntArrayRef k, const std::optional<Tensor>& bias,
                                c10::IntArrayRef stride, c10::IntArrayRef padding, Tensor& out) {
  return write_out("slow_conv3d_forward", slow_conv3d_forward_k(s, w, k, bias, stride, padding), out);
}
Tensor slow_conv2d_forward_k(const Tensor& s, const Tensor& w, c10::IntArrayRef, const std::optional<Tensor>& bias,
                           c10::IntArrayRef stride, c10::IntArrayRef padding) {
  return slow_conv_k(s, w, bias, stride, padding, ones(2), false, zeros(2));
}
Tensor& slow_conv2d_forward_out(const Tensor& s, const Tensor& w, c10::IntArrayRef k, const std::optional<Tensor>& bias,
                                c10::IntArrayRef stride, c10::IntArrayRef padding, Tensor& out) {
  return write_out("_slow_conv2d_forward", slow_conv2d_forward_k(s, w, k, bias, stride, padding), out);
}
std::tuple<Tensor, Tensor, Tensor> slow_conv2d_backward_k(const Tensor& grad, const Tensor& self, const Tensor& weight,
                                                        c10::IntArrayRef, c10::IntArrayRef stride,
                                                        c10::IntArrayRef padding, std::array<bool, 3> mask) {
  return at::convolution_backward(grad, self, weight, std::vector<int64_t>{weight.size(0)}, stride, padding, ones(2),
                                  false, zeros(2), 1, mask);
}
Tensor slow_conv_dilated_k(const Tensor& s, const Tensor& w, c10::IntArrayRef, const std::optional<Tensor>& bias,
                         c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  return slow_conv_k(s, w, bias, stride, padding, dilation, false, zeros(dilation.size()));
}
Tensor slow_conv_transpose_k(const Tensor& s, const Tensor& w, c10::IntArrayRef, const std::optional<Tensor>& bias,
                           c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef output_padding,
                           c10::IntArrayRef dilation) {
  return slow_conv_k(s, w, bias, stride, padding, dilation, true, output_padding);
}
Tensor& slow_conv_transpose_out(const Tensor& s, const Tensor& w, c10::IntArrayRef k, const std::optional<Tensor>& bias,
                                c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef output_padding,
                                c10::IntArrayRef dilation, Tensor& out) {
  return write_out("slow_conv_transpose", slow_conv_transpose_k(s, w, k, bias, stride, padding, output_padding, dilation), out);
}

Tensor& adaptive_avg_pool2d_out(const Tensor& self, c10::IntArrayRef output_size, Tensor& out) {
  return write_out("adaptive_avg_pool2d", at::_adaptive_avg_pool2d(self, output_size), out);
}
Tensor& adaptive_avg_pool3d_out(const Tensor& self, c10::IntArrayRef output_size, Tensor& out) {
  return write_out("adaptive_avg_pool3d", at::_adaptive_avg_pool3d(self, output_size), out);
}
Tensor& adaptive_avg_pool3d_backward_out(const Tensor& grad, const Tensor& self, Tensor& grad_input) {
  return write_out("adaptive_avg_pool3d_backward", at::_adaptive_avg_pool3d_backward(grad, self), grad_input);
}

// Batch statistics (biased variance) and the running-stat update with the unbiased one, as CPU.
std::tuple<Tensor, Tensor> batch_norm_update_stats_k(const Tensor& input, const std::optional<Tensor>& running_mean,
                                                   const std::optional<Tensor>& running_var, double momentum) {
  TORCH_CHECK(input.dim() >= 2, "batch_norm_update_stats: expected at least 2D input");
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  Tensor mean = input.mean(dims);
  Tensor var = input.var(dims, /*correction=*/0, /*keepdim=*/false);
  int64_t n = input.numel() / std::max<int64_t>(input.size(1), 1);
  if (running_mean && running_mean->defined()) running_mean->mul_(1 - momentum).add_(mean, momentum);
  if (running_var && running_var->defined()) {
    running_var->mul_(1 - momentum).add_(var * (static_cast<double>(n) / std::max<int64_t>(n - 1, 1)), momentum);
  }
  return {mean, var};
}

// ---------------------------------------------------------------- pairwise distances

Tensor cdist_forward_k(const Tensor& x1, const Tensor& x2, double p, std::optional<int64_t> compute_mode) {
  TORCH_CHECK(p >= 0, "cdist only supports non-negative p values");
  TORCH_CHECK(x1.dim() >= 2 && x2.dim() >= 2 && x1.size(-1) == x2.size(-1),
              "X1 and X2 must have the same number of columns. X1: ", x1.size(-1), " X2: ", x2.size(-1));
  // The direct form: torch.cdist takes the matmul form for p = 2 itself (above this op) when
  // compute_mode asks for it. It holds the [.., P, R, M] differences: large inputs with p != 2 are costly.
  (void)compute_mode;
  Tensor diff = x1.unsqueeze(-2) - x2.unsqueeze(-3);
  return at::linalg_vector_norm(diff, p, {-1});
}

Tensor cdist_backward_k(const Tensor& grad, const Tensor& x1, const Tensor& x2, double p, const Tensor& cdist) {
  Tensor diff = x1.unsqueeze(-2) - x2.unsqueeze(-3);  // [..., P, R, M]
  Tensor g = grad.unsqueeze(-1), d = cdist.unsqueeze(-1);
  Tensor per;
  if (p == 0) {
    per = at::zeros_like(diff);
  } else if (p == 1) {
    per = diff.sign();
  } else if (std::isinf(p)) {
    per = diff.sign() * (diff.abs() == d).to(diff.scalar_type());
  } else {
    // sign(diff) |diff|^(p-1) / d^(p-1) (as CPU; diff * |diff|^(p-2) would be 0 * inf at diff = 0 for p < 2).
    Tensor safe = at::where(d == 0, at::ones_like(d), d);
    per = at::where(diff == 0, at::zeros_like(diff), diff.sign() * diff.abs().pow(p - 1));
    per = at::where(d == 0, at::zeros_like(diff), per / safe.pow(p - 1));
  }
  return (g * per).sum(-2);
}

Tensor pdist_forward_k(const Tensor& self, double p) {
  TORCH_CHECK(self.dim() == 2, "pdist only supports 2D tensors, got: ", self.dim(), "D");
  TORCH_CHECK(p >= 0, "pdist only supports non-negative p values");
  int64_t n = self.size(0);
  if (n <= 1) return at::empty({0}, self.options());
  Tensor pairs = at::triu_indices(n, n, 1, self.options().dtype(at::kLong));
  return cdist_forward_k(self.index_select(0, pairs[0]).unsqueeze(-2), self.index_select(0, pairs[1]).unsqueeze(-2), p,
                       std::nullopt)
      .reshape({-1});
}

Tensor pdist_backward_k(const Tensor& grad, const Tensor& self, double p, const Tensor& pdist) {
  int64_t n = self.size(0);
  if (n <= 1) return at::zeros_like(self);
  Tensor pairs = at::triu_indices(n, n, 1, self.options().dtype(at::kLong));
  Tensor g = at::zeros({n, n}, grad.options()).index_put_({pairs[0], pairs[1]}, grad);
  Tensor d = at::zeros({n, n}, pdist.options()).index_put_({pairs[0], pairs[1]}, pdist);
  // d(x_i, x_j) depends on both rows: the pair's gradient reaches row i and row j.
  return cdist_backward_k(g + g.t(), self, self, p, d + d.t());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_native_multi_head_attention", native_mha);
  m.impl("_transformer_encoder_layer_fwd", transformer_encoder_layer);
  m.impl("_nested_tensor_from_mask_left_aligned", nested_mask_left_aligned);
  m.impl("slow_conv3d_forward", slow_conv3d_forward_k);
  m.impl("slow_conv3d_forward.output", slow_conv3d_forward_out);
  m.impl("_slow_conv2d_forward", slow_conv2d_forward_k);
  m.impl("_slow_conv2d_forward.output", slow_conv2d_forward_out);
  m.impl("_slow_conv2d_backward.output_mask", slow_conv2d_backward_k);
  m.impl("slow_conv_dilated2d", slow_conv_dilated_k);
  m.impl("slow_conv_dilated3d", slow_conv_dilated_k);
  m.impl("slow_conv_transpose2d", slow_conv_transpose_k);
  m.impl("slow_conv_transpose2d.out", slow_conv_transpose_out);
  m.impl("slow_conv_transpose3d", slow_conv_transpose_k);
  m.impl("slow_conv_transpose3d.out", slow_conv_transpose_out);
  m.impl("adaptive_avg_pool2d.out", adaptive_avg_pool2d_out);
  m.impl("adaptive_avg_pool3d.out", adaptive_avg_pool3d_out);
  m.impl("adaptive_avg_pool3d_backward.grad_input", adaptive_avg_pool3d_backward_out);
  m.impl("batch_norm_update_stats", batch_norm_update_stats_k);
  m.impl("_cdist_forward", cdist_forward_k);
  m.impl("_cdist_backward", cdist_backward_k);
  m.impl("_pdist_forward", pdist_forward_k);
  m.impl("_pdist_backward", pdist_backward_k);
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
  m.impl("_addmm_activation", addmm_activation);
  m.impl("_addmm_activation.out", addmm_activation_out);
  m.impl("_aminmax", aminmax_all_legacy);
  m.impl("_aminmax.dim", aminmax_dim_legacy);
  m.impl("_stack", stack_legacy);
  m.impl("_stack.out", stack_legacy_out);
  m.impl("_assert_async", assert_async);
  m.impl("_assert_async.msg", assert_async_msg);
  m.impl("_functional_assert_async.msg", functional_assert_async);
  m.impl("_logcumsumexp", logcumsumexp_k);
  m.impl("_logcumsumexp.out", logcumsumexp_out);
  m.impl("mvlgamma", mvlgamma_k);
  m.impl("mvlgamma.out", mvlgamma_out);
  m.impl("mvlgamma_", mvlgamma_inplace);
  m.impl("range.out", range_out);
  m.impl("_int_mm", int_mm);
  m.impl("_int_mm.out", int_mm_out);
  m.impl("_compute_linear_combination", linear_combination);
  m.impl("_compute_linear_combination.out", linear_combination_out);
  m.impl("is_set_to", is_set_to);
  m.impl("native_channel_shuffle", channel_shuffle);
  m.impl("_weight_norm_interface", weight_norm);
  m.impl("_weight_norm_interface_backward", weight_norm_backward);
  m.impl("_masked_softmax", masked_softmax);
  m.impl("_masked_softmax_backward", masked_softmax_backward);
  m.impl("embedding_renorm_", embedding_renorm);
  m.impl("_amp_foreach_non_finite_check_and_unscale_", amp_unscale);
  m.impl("_amp_update_scale_", amp_update_scale);
  m.impl("_fused_adam_", fused_adam);
  m.impl("_fused_adamw_", fused_adamw);
  m.impl("_fused_sgd_", fused_sgd);
  m.impl("repeat_interleave.Tensor", repeat_interleave_k);
}

}  // namespace torch_pjrt::device
