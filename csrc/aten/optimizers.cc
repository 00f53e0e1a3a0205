// Mixed precision (AMP unscale and scale update) and the fused optimizers (Adam, AdamW, SGD).
#include <ATen/WrapDimUtils.h>
#include <cmath>
#include <torch/library.h>

#include "aten/kernel_util.h"
#include "aten/nn_util.h"
#include "device/context.h"
#include "device/device_name.h"
#include "lowering/nn.h"
#include "lowering/ops.h"

namespace torch_pjrt::device {
namespace {

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

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_amp_foreach_non_finite_check_and_unscale_", amp_unscale);
  m.impl("_amp_update_scale_", amp_update_scale);
  m.impl("_fused_adam_", fused_adam);
  m.impl("_fused_adamw_", fused_adamw);
  m.impl("_fused_sgd_", fused_sgd);
}

}  // namespace torch_pjrt::device
