// Normalization: batch, group, layer and weight norm; renorm.
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

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_impl(const at::Tensor& input,
                                                              const std::optional<at::Tensor>& weight,
                                                              const std::optional<at::Tensor>& bias,
                                                              const std::optional<at::Tensor>& running_mean,
                                                              const std::optional<at::Tensor>& running_var,
                                                              bool training, double momentum, double eps) {
  TORCH_CHECK(input.dim() >= 2, "batch_norm: expected at least 2D input (got ", input.dim(), "D input)");
  bool has_stats = running_mean && running_mean->defined() && running_var && running_var->defined();
  TORCH_CHECK(training || has_stats, "batch_norm: running_mean and running_var must be defined in evaluation mode");
  int64_t c = input.size(1);
  auto check_c = [c](const std::optional<at::Tensor>& t, const char* what) {
    if (t && t->defined()) {
      TORCH_CHECK(t->numel() == c, "batch_norm: expected ", what, " to have ", c, " elements, but got ", t->numel());
    }
  };
  check_c(weight, "weight");
  check_c(bias, "bias");
  check_c(running_mean, "running_mean");
  check_c(running_var, "running_var");
  if (training) {
    TORCH_CHECK(input.numel() / c > 1 || input.numel() == 0,
                "Expected more than 1 value per channel when training, got input size ", input.sizes());
  }
  OpBuilder op("aten::native_batch_norm");
  auto& b = op.b();
  auto opt = [&](const std::optional<at::Tensor>& t, Value* v) -> const Value* {
    if (!t || !t->defined()) return nullptr;
    *v = b.reshape(op.input(*t), {c});
    return v;
  };
  Value w, bi, rm, rv;
  const Value* wp = opt(weight, &w);
  const Value* bp = opt(bias, &bi);
  const Value* rmp = opt(running_mean, &rm);
  const Value* rvp = opt(running_var, &rv);
  auto r = L::batch_norm(b, op.input(input), wp, bp, rmp, rvp, training, momentum, eps);
  at::ScalarType stat_type = has_stats ? running_mean->scalar_type() : to_aten(b.dtype(r[1]));
  at::Tensor out = op.output(r[0], input.scalar_type(), op.suggested_layout(input.dim()));
  at::Tensor save_mean, save_invstd;
  if (training) {
    save_mean = op.output(b.convert(r[1], to_ir(stat_type)), stat_type);
    save_invstd = op.output(b.convert(r[2], to_ir(stat_type)), stat_type);
    if (has_stats) {
      op.write(*running_mean, b.reshape(r[3], vec(running_mean->sizes())));
      op.write(*running_var, b.reshape(r[4], vec(running_var->sizes())));
    }
  }
  op.run();
  if (!training) {
    // Evaluation mode saves no statistics (as on CPU).
    save_mean = at::empty({0}, input.options().dtype(stat_type));
    save_invstd = at::empty({0}, input.options().dtype(stat_type));
  }
  return {out, save_mean, save_invstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm_fn(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, bool training,
    double momentum, double eps) {
  return batch_norm_impl(input, weight, bias, running_mean, running_var, training, momentum, eps);
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_legit_fn(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    at::Tensor& running_mean, at::Tensor& running_var, bool training, double momentum, double eps) {
  return batch_norm_impl(input, weight, bias, running_mean, running_var, training, momentum, eps);
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_legit_no_stats_fn(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    bool training, double momentum, double eps) {
  return batch_norm_impl(input, weight, bias, std::nullopt, std::nullopt, training, momentum, eps);
}
// out= variants: the functional kernels' results written to the outs.
std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> batch_norm_outs(const char* name,
                                                                  std::tuple<at::Tensor, at::Tensor, at::Tensor> r,
                                                                  at::Tensor& out, at::Tensor& mean, at::Tensor& invstd) {
  write_outs(name, {std::get<0>(r), std::get<1>(r), std::get<2>(r)}, {out, mean, invstd});
  return {out, mean, invstd};
}
std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> native_batch_norm_out(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, bool training,
    double momentum, double eps, at::Tensor& out, at::Tensor& mean, at::Tensor& invstd) {
  return batch_norm_outs("native_batch_norm",
                         native_batch_norm_fn(input, weight, bias, running_mean, running_var, training, momentum, eps),
                         out, mean, invstd);
}
std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> batch_norm_legit_out(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    at::Tensor& running_mean, at::Tensor& running_var, bool training, double momentum, double eps, at::Tensor& out,
    at::Tensor& mean, at::Tensor& invstd) {
  return batch_norm_outs("_native_batch_norm_legit",
                         batch_norm_legit_fn(input, weight, bias, running_mean, running_var, training, momentum, eps),
                         out, mean, invstd);
}
std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> batch_norm_legit_no_stats_out(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    bool training, double momentum, double eps, at::Tensor& out, at::Tensor& mean, at::Tensor& invstd) {
  return batch_norm_outs("_native_batch_norm_legit",
                         batch_norm_legit_no_stats_fn(input, weight, bias, training, momentum, eps), out, mean, invstd);
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_legit_no_training_fn(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const at::Tensor& running_mean, const at::Tensor& running_var, double momentum, double eps) {
  return batch_norm_impl(input, weight, bias, running_mean, running_var, false, momentum, eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm_backward_fn(
    const at::Tensor& grad, const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
    const std::optional<at::Tensor>& save_mean, const std::optional<at::Tensor>& save_invstd, bool train, double eps,
    std::array<bool, 3> mask) {
  OpBuilder op("aten::native_batch_norm_backward");
  auto& b = op.b();
  int64_t c = input.size(1);
  Value w;
  bool has_w = weight && weight->defined();
  if (has_w) w = b.reshape(op.input(*weight), {c});
  Value mean, invstd;
  if (train) {
    TORCH_CHECK(save_mean && save_mean->defined() && save_invstd && save_invstd->defined(),
                "batch_norm_backward: training mode needs the saved statistics");
    mean = b.reshape(op.input(*save_mean), {c});
    invstd = b.reshape(op.input(*save_invstd), {c});
  } else {
    TORCH_CHECK(running_mean && running_mean->defined() && running_var && running_var->defined(),
                "batch_norm_backward: evaluation mode needs running statistics");
    mean = b.reshape(op.input(*running_mean), {c});
    Value rv = b.convert(b.reshape(op.input(*running_var), {c}), L::accumulate_type(to_ir(input.scalar_type())));
    invstd = b.unary("rsqrt", b.binary("add", rv, b.scalar_like(rv, eps)));
  }
  auto r = L::batch_norm_backward(b, op.input(grad), op.input(input), has_w ? &w : nullptr, mean, invstd, train);
  at::ScalarType param_type = has_w ? weight->scalar_type() : input.scalar_type();
  at::Tensor gi = mask[0] ? op.output(r[0], input.scalar_type(), layout_like(input)) : at::Tensor();
  at::Tensor gw = mask[1] ? op.output(b.convert(r[1], to_ir(param_type)), param_type) : at::Tensor();
  at::Tensor gb = mask[2] ? op.output(b.convert(r[2], to_ir(param_type)), param_type) : at::Tensor();
  op.run();
  return {gi, gw, gb};
}

// The newer batch-norm entry points (training update / evaluation, with an unused reserve tensor).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_with_update_fn(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    at::Tensor& running_mean, at::Tensor& running_var, double momentum, double eps) {
  auto [out, mean, invstd] = batch_norm_impl(input, weight, bias, running_mean, running_var, true, momentum, eps);
  return {out, mean, invstd, at::empty({0}, input.options().dtype(at::kByte))};
}
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_no_update_fn(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, double momentum,
    double eps) {
  bool has_stats = running_mean && running_mean->defined() && running_var && running_var->defined();
  auto [out, mean, invstd] = batch_norm_impl(input, weight, bias, running_mean, running_var, !has_stats, momentum, eps);
  return {out, mean, invstd, at::empty({0}, input.options().dtype(at::kByte))};
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_backward_fn(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
    const std::optional<at::Tensor>& save_mean, const std::optional<at::Tensor>& save_var, bool update, double eps,
    std::array<bool, 3> mask, const at::Tensor&) {
  bool saved = save_mean && save_mean->defined() && save_mean->numel() > 0;
  return native_batch_norm_backward_fn(grad, input, weight, running_mean, running_var, save_mean, save_var,
                                       update || saved, eps, mask);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_group_norm_fn(const at::Tensor& input,
                                                                   const std::optional<at::Tensor>& weight,
                                                                   const std::optional<at::Tensor>& bias, int64_t n,
                                                                   int64_t c, int64_t hw, int64_t groups, double eps) {
  TORCH_CHECK(groups > 0 && c % groups == 0, "group_norm: expected number of channels in input to be divisible by ",
              "num_groups, but got input of shape ", input.sizes(), " and num_groups=", groups);
  TORCH_CHECK(input.numel() == n * c * hw, "group_norm: input of size ", input.sizes(), " does not match N=", n,
              ", C=", c, ", HxW=", hw);
  OpBuilder op("aten::native_group_norm");
  auto& b = op.b();
  Value x = b.reshape(op.input(input), {n, c, hw});
  Value w, bi;
  bool has_w = weight && weight->defined(), has_b = bias && bias->defined();
  if (has_w) w = b.reshape(op.input(*weight), {c});
  if (has_b) bi = b.reshape(op.input(*bias), {c});
  auto r = L::group_norm(b, x, has_w ? &w : nullptr, has_b ? &bi : nullptr, groups, eps);
  ir::DType dt = to_ir(input.scalar_type());
  at::Tensor out = op.output(b.reshape(r[0], vec(input.sizes())), input.scalar_type(), input.suggest_memory_format());
  at::Tensor mean = op.output(b.convert(r[1], dt), input.scalar_type());
  at::Tensor rstd = op.output(b.convert(r[2], dt), input.scalar_type());
  op.run();
  return {out, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_group_norm_backward_fn(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& rstd,
    const std::optional<at::Tensor>& weight, int64_t n, int64_t c, int64_t hw, int64_t groups,
    std::array<bool, 3> mask) {
  OpBuilder op("aten::native_group_norm_backward");
  auto& b = op.b();
  Value w;
  bool has_w = weight && weight->defined();
  if (has_w) w = b.reshape(op.input(*weight), {c});
  Value x = b.reshape(op.input(input), {n, c, hw});
  Value g = b.reshape(op.input(grad), {n, c, hw});
  auto r = L::group_norm_backward(b, g, x, b.reshape(op.input(mean), {n, groups}),
                                  b.reshape(op.input(rstd), {n, groups}), has_w ? &w : nullptr, groups);
  at::ScalarType param_type = has_w ? weight->scalar_type() : input.scalar_type();
  at::Tensor gi = mask[0] ? op.output(b.reshape(r[0], vec(input.sizes())), input.scalar_type(), input.suggest_memory_format())
                          : at::Tensor();
  at::Tensor gw = mask[1] ? op.output(b.convert(r[1], to_ir(param_type)), param_type) : at::Tensor();
  at::Tensor gb = mask[2] ? op.output(b.convert(r[2], to_ir(param_type)), param_type) : at::Tensor();
  op.run();
  return {gi, gw, gb};
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

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_layer_norm", layer_norm_fn);
  m.impl("native_layer_norm_backward", layer_norm_backward_fn);
  m.impl("native_batch_norm", native_batch_norm_fn);
  m.impl("_native_batch_norm_legit", batch_norm_legit_fn);
  m.impl("_native_batch_norm_legit.no_stats", batch_norm_legit_no_stats_fn);
  m.impl("native_batch_norm.out", native_batch_norm_out);
  m.impl("_native_batch_norm_legit.out", batch_norm_legit_out);
  m.impl("_native_batch_norm_legit.no_stats_out", batch_norm_legit_no_stats_out);
  m.impl("_native_batch_norm_legit_no_training", batch_norm_legit_no_training_fn);
  m.impl("native_batch_norm_backward", native_batch_norm_backward_fn);
  m.impl("_batch_norm_with_update", batch_norm_with_update_fn);
  m.impl("_batch_norm_no_update", batch_norm_no_update_fn);
  m.impl("batch_norm_backward", batch_norm_backward_fn);
  m.impl("native_group_norm", native_group_norm_fn);
  m.impl("native_group_norm_backward", native_group_norm_backward_fn);
  m.impl("renorm", renorm_fn);
  m.impl("renorm.out", renorm_out);
  m.impl("batch_norm_update_stats", batch_norm_update_stats_k);
  m.impl("_weight_norm_interface", weight_norm);
  m.impl("_weight_norm_interface_backward", weight_norm_backward);
}

}  // namespace torch_pjrt::device
