// Losses: nll_loss (1d and 2d), mse, cross-entropy helpers, smooth l1, huber, bce, ctc and friends.
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/native/ReduceOpsUtils.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TypeProperties.h>
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

const L::BinaryOp& kSubRow = L::binary_op("sub");

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
  Value d = L::binary(b, kSubRow, op.input(self), op.input(target), to_ir(dt), to_ir(dt));
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
  Value d = L::binary(b, kSubRow, op.input(self), op.input(target), to_ir(dt), to_ir(dt));
  double scale = reduction == 1 ? 2.0 / static_cast<double>(std::max<int64_t>(self.numel(), 1)) : 2.0;
  Value g = b.broadcast_to(b.convert(op.input(grad), to_ir(dt)), b.dims(d));
  Value r = b.binary("multiply", b.binary("multiply", d, g), b.scalar_like(d, scale));
  return finish(op, r, dt, nullptr);
}

void check_same_size(const char* name, const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes().equals(b.sizes())) return;
  try {
    at::infer_size(a.sizes(), b.sizes());  // PyTorch's broadcast message where the shapes do not broadcast
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, name, ": ", e.what_without_backtrace());
  }
  TORCH_CHECK(false, name, ": target size (", b.sizes(), ") must be the same as input size (", a.sizes(), ")");
}

// Smooth L1 (huber=false, scaled by 1/beta) and Huber (huber=true) losses.
at::Tensor robust_loss_fn(const char* name, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
                          double param, bool huber) {
  check_same_size(name, self, target);
  TORCH_CHECK(!huber || param > 0, "huber_loss does not support non-positive values for delta, got ", param);
  TORCH_CHECK(param >= 0, name, ": beta must be non-negative, got ", param);
  OpBuilder op(std::string("aten::") + name);
  auto& b = op.b();
  ir::DType dt = to_ir(self.scalar_type());
  Value diff = b.unary("abs", b.binary("subtract", op.input(self), b.convert(op.input(target), dt)));
  Value half = b.scalar_like(diff, 0.5), p = b.scalar_like(diff, param);
  Value quad = b.binary("multiply", half, b.binary("multiply", diff, diff));
  Value lin = b.binary("subtract", diff, b.binary("multiply", half, p));
  if (huber) {
    lin = b.binary("multiply", p, lin);
  } else if (param > 0) {
    quad = b.binary("divide", quad, p);
  }
  Value loss = param == 0 && !huber ? diff : b.select(b.compare(diff, p, "LT"), quad, lin);
  return finish(op, L::reduce_loss(b, loss, reduction), self.scalar_type(), nullptr);
}

at::Tensor robust_loss_backward_fn(const char* name, const at::Tensor& grad, const at::Tensor& self,
                                   const at::Tensor& target, int64_t reduction, double param, bool huber) {
  OpBuilder op(std::string("aten::") + name);
  auto& b = op.b();
  ir::DType dt = to_ir(self.scalar_type());
  Value x = b.binary("subtract", op.input(self), b.convert(op.input(target), dt));
  Value p = b.scalar_like(x, param);
  Value neg_p = b.scalar_like(x, -param);
  // d/dx: x/beta (smooth L1) or x (huber) inside the band, else sign(x) (times delta for huber).
  Value inside = huber ? x : (param > 0 ? b.binary("divide", x, p) : b.scalar_like(x, 0));
  Value outside = huber ? L::clamp(b, x, &neg_p, &p, b.dtype(x)) : b.unary("sign", x);
  Value d = b.select(b.compare(b.unary("abs", x), p, "LT"), inside, outside);
  Value g = L::loss_grad_scale(b, b.convert(op.input(grad), dt), b.dims(x), reduction);
  return finish(op, b.binary("multiply", d, g), self.scalar_type(), nullptr);
}

at::Tensor smooth_l1_fn(const at::Tensor& s, const at::Tensor& t, int64_t r, double beta) {
  return robust_loss_fn("smooth_l1_loss", s, t, r, beta, false);
}
at::Tensor smooth_l1_backward_fn(const at::Tensor& g, const at::Tensor& s, const at::Tensor& t, int64_t r, double beta) {
  return robust_loss_backward_fn("smooth_l1_loss_backward", g, s, t, r, beta, false);
}
at::Tensor huber_fn(const at::Tensor& s, const at::Tensor& t, int64_t r, double delta) {
  return robust_loss_fn("huber_loss", s, t, r, delta, true);
}
at::Tensor huber_backward_fn(const at::Tensor& g, const at::Tensor& s, const at::Tensor& t, int64_t r, double delta) {
  return robust_loss_backward_fn("huber_loss_backward", g, s, t, r, delta, true);
}

at::Tensor bce_fn(const at::Tensor& self, const at::Tensor& target, const std::optional<at::Tensor>& weight,
                  int64_t reduction) {
  check_same_size("binary_cross_entropy", self, target);
  OpBuilder op("aten::binary_cross_entropy");
  auto& b = op.b();
  ir::DType dt = to_ir(self.scalar_type());
  Value x = op.input(self), y = b.convert(op.input(target), dt);
  Value floor = b.scalar_like(x, -100);
  Value log_x = b.binary("maximum", b.unary("log", x), floor);
  Value log_1mx = b.binary("maximum", b.unary("log_plus_one", b.unary("negate", x)), floor);
  Value one = b.scalar_like(x, 1);
  Value loss = b.unary("negate", b.binary("add", b.binary("multiply", y, log_x),
                                          b.binary("multiply", b.binary("subtract", one, y), log_1mx)));
  if (weight && weight->defined()) loss = b.bin_bcast("multiply", loss, b.convert(op.input(*weight), dt));
  // Inputs outside [0, 1] are an error on CPU; here they are checked at the next sync.
  Value bad = b.binary("or", b.compare(x, b.scalar_like(x, 0), "LT"), b.compare(x, one, "GT"));
  op.check_flag(L::any_all(b, b.reshape(bad, {b.type(bad).numel()}), {}, false, false),
                "all elements of input should be between 0 and 1 (aten::binary_cross_entropy)");
  return finish(op, L::reduce_loss(b, loss, reduction), self.scalar_type(), nullptr);
}

at::Tensor bce_backward_fn(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                           const std::optional<at::Tensor>& weight, int64_t reduction) {
  OpBuilder op("aten::binary_cross_entropy_backward");
  auto& b = op.b();
  ir::DType dt = to_ir(self.scalar_type());
  Value x = op.input(self), y = b.convert(op.input(target), dt);
  Value denom = b.binary("maximum", b.binary("multiply", b.binary("subtract", b.scalar_like(x, 1), x), x),
                         b.scalar_like(x, 1e-12));
  Value d = b.binary("divide", b.binary("subtract", x, y), denom);
  if (weight && weight->defined()) d = b.bin_bcast("multiply", d, b.convert(op.input(*weight), dt));
  Value g = L::loss_grad_scale(b, b.convert(op.input(grad), dt), b.dims(x), reduction);
  return finish(op, b.binary("multiply", d, g), self.scalar_type(), nullptr);
}

at::Tensor bce_logits_fn(const at::Tensor& self, const at::Tensor& target, const std::optional<at::Tensor>& weight,
                         const std::optional<at::Tensor>& pos_weight, int64_t reduction) {
  check_same_size("binary_cross_entropy_with_logits", self, target);
  OpBuilder op("aten::binary_cross_entropy_with_logits");
  auto& b = op.b();
  ir::DType dt = to_ir(self.scalar_type());
  Value x = op.input(self), y = b.convert(op.input(target), dt);
  Value one = b.scalar_like(x, 1);
  // log(1 + exp(-x)) = max(-x, 0) + log1p(exp(-|x|)), stable for large |x|.
  Value log_sig_neg = b.binary("add", b.binary("maximum", b.unary("negate", x), b.scalar_like(x, 0)),
                               b.unary("log_plus_one", b.unary("exponential", b.unary("negate", b.unary("abs", x)))));
  Value loss;
  if (pos_weight && pos_weight->defined()) {
    Value pw = b.convert(op.input(*pos_weight), dt);
    Value coeff = b.bin_bcast("add", one, b.bin_bcast("multiply", b.bin_bcast("subtract", pw, one), y));
    loss = b.bin_bcast("add", b.binary("multiply", b.binary("subtract", one, y), x), b.bin_bcast("multiply", coeff, log_sig_neg));
  } else {
    loss = b.binary("add", b.binary("multiply", b.binary("subtract", one, y), x), log_sig_neg);
  }
  if (weight && weight->defined()) loss = b.bin_bcast("multiply", loss, b.convert(op.input(*weight), dt));
  return finish(op, L::reduce_loss(b, loss, reduction), self.scalar_type(), nullptr);
}

at::Tensor soft_margin_fn(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  check_same_size("soft_margin_loss", self, target);
  OpBuilder op("aten::soft_margin_loss");
  auto& b = op.b();
  ir::DType dt = to_ir(self.scalar_type());
  Value z = b.unary("negate", b.binary("multiply", op.input(self), b.convert(op.input(target), dt)));
  Value loss = b.unary("log_plus_one", b.unary("exponential", z));
  return finish(op, L::reduce_loss(b, loss, reduction), self.scalar_type(), nullptr);
}

at::Tensor soft_margin_backward_fn(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                                   int64_t reduction) {
  OpBuilder op("aten::soft_margin_loss_backward");
  auto& b = op.b();
  ir::DType dt = to_ir(self.scalar_type());
  Value y = b.convert(op.input(target), dt);
  Value e = b.unary("exponential", b.unary("negate", b.binary("multiply", op.input(self), y)));
  Value d = b.unary("negate", b.binary("divide", b.binary("multiply", y, e), b.binary("add", b.scalar_like(e, 1), e)));
  Value g = L::loss_grad_scale(b, b.convert(op.input(grad), dt), b.dims(d), reduction);
  return finish(op, b.binary("multiply", d, g), self.scalar_type(), nullptr);
}

// multi_margin_loss on [N, C] (or [C]) scores: per row, sum over i != y of
// max(0, margin - x[y] + x[i])^p * w[y], divided by C.
struct MarginTerms {
  Value hinge;    // margin - x[y] + x[i], zero at i == y  [N, C]
  Value active;   // i != y and hinge > 0
  Value onehot;   // i == y
  Value scale;    // w[y] / C broadcast to [N, C]
};
// multi_margin_loss's argument checks, in ATen's order and wording (callers match it).
void check_multi_margin(const at::Tensor& self, const at::Tensor& target, const std::optional<at::Tensor>& weight) {
  int64_t dims = self.dim();
  TORCH_CHECK(dims == 0 || (dims <= 2 && self.size(-1) != 0), "multi_margin_loss: Expected non-empty vector or matrix with optional 0-dim batch size, but got: ",
              self.sizes());
  int64_t frames = dims <= 1 ? 1 : self.size(0), classes = dims == 0 ? 1 : self.size(-1);
  TORCH_CHECK(target.dim() <= 1 && target.numel() == frames,
              "multi_margin_loss: target tensor should be 1-D with size equal to the input's batch size. Expected target size [",
              frames, "], but got ", target.sizes());
  TORCH_CHECK(!weight || !weight->defined() || (weight->dim() <= 1 && weight->numel() == classes),
              "multi_margin_loss: inconsistent weight size, expected ", classes, " but got ", weight->sizes());
  TORCH_CHECK(target.scalar_type() == at::kLong, "multi_margin_loss: expected scalar type Long but found ",
              target.scalar_type());
}

MarginTerms margin_terms(OpBuilder& op, const at::Tensor& self, const at::Tensor& target, const at::Scalar& margin,
                         const std::optional<at::Tensor>& weight) {
  check_multi_margin(self, target, weight);
  auto& b = op.b();
  ir::DType dt = L::accumulate_type(to_ir(self.scalar_type()));
  int64_t c = self.dim() == 0 ? 1 : self.size(-1), n = self.dim() == 2 ? self.size(0) : 1;
  Value x = b.reshape(b.convert(op.input(self), dt), {n, c});
  Value y = b.reshape(b.convert(op.input(target), ir::DType::S64), {n});
  op.check_flag(L::index_out_of_range(b, y, c), "target out of bounds in aten::multi_margin_loss (classes " + std::to_string(c) + ")");
  Value onehot = b.compare(b.iota(ir::DType::S64, {n, c}, 1), b.broadcast_in_dim(y, {n, c}, {0}), "EQ");
  Value xy = L::sum(b, b.select(onehot, x, b.constant(dt, 0, {n, c})), {1}, false, dt);
  Value hinge = b.binary("add", b.binary("subtract", b.broadcast_to(op.scalar(margin, to_aten(dt)), {n, c}),
                                         b.broadcast_in_dim(xy, {n, c}, {0})), x);
  Value active = b.binary("and", b.unary("not", onehot), b.compare(hinge, b.constant(dt, 0, {n, c}), "GT"));
  Value scale = b.constant(dt, 1.0 / static_cast<double>(c), {n, c});
  if (weight && weight->defined()) {
    Value wy = L::index_select(b, b.convert(op.input(*weight), dt), 0, y);
    scale = b.binary("multiply", scale, b.broadcast_in_dim(wy, {n, c}, {0}));
  }
  return {hinge, active, onehot, scale};
}

at::Tensor multi_margin_fn(const at::Tensor& self, const at::Tensor& target, const at::Scalar& p,
                           const at::Scalar& margin, const std::optional<at::Tensor>& weight, int64_t reduction) {
  TORCH_CHECK(p.toLong() == 1 || p.toLong() == 2, "multi_margin_loss: only p == 1 and p == 2 supported");
  OpBuilder op("aten::multi_margin_loss");
  auto& b = op.b();
  auto t = margin_terms(op, self, target, margin, weight);
  ir::DType dt = b.dtype(t.hinge);
  Value z = b.select(t.active, t.hinge, b.scalar_like(t.hinge, 0));
  if (p.toLong() == 2) z = b.binary("multiply", z, z);
  Value loss = L::sum(b, b.binary("multiply", z, t.scale), {1}, false, dt);
  if (self.dim() < 2 && reduction == 0 && target.dim() == 0) loss = b.reshape(loss, {});  // [1] for a [1] target, as on CPU
  return finish(op, b.convert(L::reduce_loss(b, loss, reduction), to_ir(self.scalar_type())), self.scalar_type(), nullptr);
}

at::Tensor multi_margin_backward_fn(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                                    const at::Scalar& p, const at::Scalar& margin,
                                    const std::optional<at::Tensor>& weight, int64_t reduction) {
  OpBuilder op("aten::multi_margin_loss_backward");
  auto& b = op.b();
  auto t = margin_terms(op, self, target, margin, weight);
  ir::DType dt = b.dtype(t.hinge);
  auto nc = b.dims(t.hinge);
  Value d = p.toLong() == 2 ? b.binary("multiply", t.hinge, b.scalar_like(t.hinge, 2)) : b.scalar_like(t.hinge, 1);
  Value gi = b.select(t.active, b.binary("multiply", d, t.scale), b.scalar_like(t.hinge, 0));
  Value gy = b.unary("negate", L::sum(b, gi, {1}, false, dt));
  Value g = b.select(t.onehot, b.broadcast_in_dim(gy, nc, {0}), gi);
  Value up = b.convert(op.input(grad), dt);
  up = reduction == 0 ? b.broadcast_in_dim(b.reshape(up, {nc[0]}), nc, {0}) : L::loss_grad_scale(b, up, {nc[0]}, reduction);
  if (reduction != 0) up = b.broadcast_in_dim(up, nc, {0});
  Value r = b.reshape(b.binary("multiply", g, up), vec(self.sizes()));
  return finish(op, b.convert(r, to_ir(self.scalar_type())), self.scalar_type(), nullptr);
}

// multilabel_margin_loss on [N, C] (or [C]) scores and per-row target lists (class indices
// up to the first -1): per row, the sum over listed targets j and non-target classes i of
// max(0, 1 - x[y_j] + x[i]), divided by C. Terms are [N, j, i]; a duplicate target counts twice, as on CPU.
struct MultilabelTerms {
  Value active;     // [N, C, C]: j listed, i not a target, hinge > 0
  Value hinge;      // [N, C, C]: 1 - x[y_j] + x[i]
  Value picks;      // [N, C, C]: j listed and y_j == k (k the last dim)
  Value is_target;  // [N, C]
};
MultilabelTerms multilabel_terms(OpBuilder& op, const at::Tensor& self, const at::Tensor& target) {
  TORCH_CHECK(self.dim() <= 2 && (self.dim() == 0 || self.size(-1) > 0),
              "Expected non-empty vector or matrix with optional 0-dim batch size, but got: ", self.sizes());
  TORCH_CHECK(target.sizes() == self.sizes(), "multilabel_margin_loss: inconsistent target size: ", target.sizes(),
              " for input of size: ", self.sizes());
  auto& b = op.b();
  ir::DType dt = L::accumulate_type(to_ir(self.scalar_type()));
  int64_t c = self.dim() == 0 ? 1 : self.size(-1), n = self.dim() == 2 ? self.size(0) : 1;
  std::vector<int64_t> sq{n, c, c};
  Value x = b.reshape(b.convert(op.input(self), dt), {n, c});
  Value y = b.reshape(b.convert(op.input(target), ir::DType::S64), {n, c});
  // Listed: the positions before the first negative entry (a running product of y >= 0).
  Value nonneg = b.convert(b.compare(y, b.scalar_like(y, 0), "GE"), ir::DType::S64);
  Value listed = b.compare(L::cumulative(b, nonneg, 1, "prod"), b.scalar_like(y, 0), "NE");
  // Every entry, listed or not, in [-1, C), as CPU checks.
  Value bad = b.binary("or", b.compare(y, b.scalar_like(y, -1), "LT"), b.compare(y, b.scalar_like(y, static_cast<double>(c)), "GE"));
  op.check_flag(L::any_all(b, b.reshape(bad, {n * c}), {}, false, false), "argument #2 'target' is out of range");
  Value picks = b.binary("and", b.compare(b.broadcast_in_dim(y, sq, {0, 1}), b.iota(ir::DType::S64, sq, 2), "EQ"),
                         b.broadcast_in_dim(listed, sq, {0, 1}));
  Value is_target = b.reduce_simple(picks, b.constant_int(ir::DType::Pred, 0), {1}, "or");
  Value xy = b.reduce_simple(b.select(picks, b.broadcast_in_dim(x, sq, {0, 2}), b.constant(dt, 0, sq)), b.constant(dt, 0),
                             {2}, "add");  // [N, j]
  Value hinge = b.binary("add", b.binary("subtract", b.constant(dt, 1, sq), b.broadcast_in_dim(xy, sq, {0, 1})),
                         b.broadcast_in_dim(x, sq, {0, 2}));
  Value active = b.binary("and", b.binary("and", b.broadcast_in_dim(listed, sq, {0, 1}),
                                          b.unary("not", b.broadcast_in_dim(is_target, sq, {0, 2}))),
                          b.compare(hinge, b.constant(dt, 0, sq), "GT"));
  return {active, hinge, picks, is_target};
}

std::tuple<at::Tensor, at::Tensor> multilabel_margin_forward_fn(const at::Tensor& self, const at::Tensor& target,
                                                                int64_t reduction) {
  OpBuilder op("aten::multilabel_margin_loss_forward");
  auto& b = op.b();
  auto t = multilabel_terms(op, self, target);
  ir::DType dt = b.dtype(t.hinge);
  double c = static_cast<double>(b.dims(t.hinge)[2]);
  Value per_row = b.reduce_simple(b.select(t.active, t.hinge, b.scalar_like(t.hinge, 0)), b.constant(dt, 0), {1, 2}, "add");
  Value loss = b.binary("divide", per_row, b.scalar_like(per_row, c));
  if (self.dim() < 2 && reduction == 0) loss = b.reshape(loss, {});
  at::ScalarType st = self.scalar_type();
  at::Tensor out = op.output(b.convert(L::reduce_loss(b, loss, reduction), to_ir(st)), st);
  at::Tensor is_target = op.output(b.reshape(b.convert(t.is_target, to_ir(st)), vec(self.sizes())), st);
  op.run();
  return {out, is_target};
}

at::Tensor multilabel_margin_backward_fn(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                                         int64_t reduction, const at::Tensor& /*is_target: recomputed*/) {
  OpBuilder op("aten::multilabel_margin_loss_backward");
  auto& b = op.b();
  auto t = multilabel_terms(op, self, target);
  ir::DType dt = b.dtype(t.hinge);
  auto sq = b.dims(t.hinge);
  std::vector<int64_t> nc{sq[0], sq[1]};
  Value unit = b.select(t.active, b.scalar_like(t.hinge, 1.0 / static_cast<double>(sq[2])), b.scalar_like(t.hinge, 0));
  Value gi = b.reduce_simple(unit, b.constant(dt, 0), {1}, "add");                      // +d/dx[i], [N, C]
  Value gy = b.reduce_simple(unit, b.constant(dt, 0), {2}, "add");                      // -d/dx[y_j], [N, j]
  Value to_classes = b.select(t.picks, b.broadcast_in_dim(gy, sq, {0, 1}), b.scalar_like(t.hinge, 0));
  Value g = b.binary("subtract", gi, b.reduce_simple(to_classes, b.constant(dt, 0), {1}, "add"));
  Value up = b.convert(op.input(grad), dt);
  up = reduction == 0 ? b.broadcast_in_dim(b.reshape(up, {nc[0]}), nc, {0})
                      : b.broadcast_in_dim(L::loss_grad_scale(b, up, {nc[0]}, reduction), nc, {0});
  Value r = b.reshape(b.binary("multiply", g, up), vec(self.sizes()));
  return finish(op, b.convert(r, to_ir(self.scalar_type())), self.scalar_type(), nullptr);
}

// rrelu: random negative slopes in [lower, upper) while training (recorded in `noise`), their mean otherwise.
at::Tensor rrelu_with_noise_impl(const at::Tensor& self, at::Tensor& noise, const at::Scalar& lower,
                                 const at::Scalar& upper, bool training, std::optional<at::Generator> gen,
                                 const at::Tensor* into) {
  OpBuilder op(into ? "aten::rrelu_with_noise_" : "aten::rrelu_with_noise");
  auto& b = op.b();
  ir::DType dt = to_ir(self.scalar_type()), acc = L::accumulate_type(dt);
  Value x = b.convert(op.input(self), acc);
  auto shape = b.dims(x);
  Value zero = b.constant(acc, 0, shape);
  Value slope;
  if (training) {
    auto r = L::uniform(b, op.rng_state(pick_generator(gen, self)), acc, shape);
    op.set_rng_state(r[0]);
    Value lo = b.broadcast_to(op.scalar(lower, to_aten(acc)), shape), hi = b.broadcast_to(op.scalar(upper, to_aten(acc)), shape);
    slope = b.binary("add", lo, b.binary("multiply", r[1], b.binary("subtract", hi, lo)));
    Value noise_v = b.select(b.compare(x, zero, "GE"), b.constant(acc, 1, shape), slope);
    op.write(noise, b.reshape(b.convert(noise_v, to_ir(noise.scalar_type())), vec(noise.sizes())));
  } else {
    slope = b.broadcast_to(op.scalar((lower.toDouble() + upper.toDouble()) / 2, to_aten(acc)), shape);
  }
  Value out = b.select(b.compare(x, zero, "GE"), x, b.binary("multiply", x, slope));
  return finish(op, b.convert(out, dt), self.scalar_type(), into);
}
at::Tensor rrelu_with_noise_fn(const at::Tensor& self, at::Tensor& noise, const at::Scalar& lower,
                               const at::Scalar& upper, bool training, std::optional<at::Generator> gen) {
  return rrelu_with_noise_impl(self, noise, lower, upper, training, std::move(gen), nullptr);
}
// In place on the device, so that F.rrelu(inplace=True) draws from pjrt's generator as the functional form does.
at::Tensor& rrelu_with_noise_inplace(at::Tensor& self, at::Tensor& noise, const at::Scalar& lower,
                                     const at::Scalar& upper, bool training, std::optional<at::Generator> gen) {
  rrelu_with_noise_impl(self, noise, lower, upper, training, std::move(gen), &self);
  return self;
}
at::Tensor& rrelu_with_noise_out(const at::Tensor& self, at::Tensor& noise, const at::Scalar& lower,
                                 const at::Scalar& upper, bool training, std::optional<at::Generator> gen,
                                 at::Tensor& out) {
  return write_out("rrelu_with_noise", rrelu_with_noise_fn(self, noise, lower, upper, training, std::move(gen)), out,
                   {self, noise});
}

at::Tensor rrelu_with_noise_backward_fn(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& noise,
                                        const at::Scalar& lower, const at::Scalar& upper, bool training, bool) {
  OpBuilder op("aten::rrelu_with_noise_backward");
  auto& b = op.b();
  ir::DType dt = to_ir(self.scalar_type()), acc = L::accumulate_type(dt);
  Value g = b.convert(op.input(grad), acc), x = b.convert(op.input(self), acc);
  auto shape = b.dims(x);
  Value r;
  if (training && upper.toDouble() - lower.toDouble() > 1e-6) {
    r = b.binary("multiply", g, b.convert(op.input(noise), acc));
  } else {
    Value slope = b.broadcast_to(op.scalar((lower.toDouble() + upper.toDouble()) / 2, to_aten(acc)), shape);
    r = b.select(b.compare(x, b.constant(acc, 0, shape), "GT"), g, b.binary("multiply", g, slope));
  }
  return finish(op, b.convert(r, dt), self.scalar_type(), nullptr);
}

// nll_loss2d: [N, C, d...] log-probabilities as [N*d..., C] rows for the 1-d lowering.
Value rows_of(Builder& b, Value x) {
  auto xd = b.dims(x);
  std::vector<int64_t> perm{0};
  for (int64_t i = 2; i < static_cast<int64_t>(xd.size()); ++i) perm.push_back(i);
  perm.push_back(1);
  int64_t c = xd[1];
  return b.reshape(b.transpose(x, perm), {b.type(x).numel() / std::max<int64_t>(c, 1), c});
}

std::tuple<at::Tensor, at::Tensor> nll_loss2d_fn(const at::Tensor& self, const at::Tensor& target,
                                                 const std::optional<at::Tensor>& weight, int64_t reduction,
                                                 int64_t ignore_index) {
  TORCH_CHECK(self.dim() == 4 && target.dim() == 3, "nll_loss2d: expected input of 4 dimensions and target of 3, got ",
              self.sizes(), " and ", target.sizes());
  TORCH_CHECK(self.size(0) == target.size(0) && self.size(2) == target.size(1) && self.size(3) == target.size(2),
              "nll_loss2d: input and target batch or spatial sizes don't match: target ", target.sizes(), ", input ",
              self.sizes());
  check_nll_loss_args(self, target, weight, /*per_class=*/false);
  OpBuilder op("aten::nll_loss2d_forward");
  auto& b = op.b();
  Value w;
  bool has_w = weight && weight->defined();
  if (has_w) w = op.input(*weight);
  Value t = b.reshape(op.input(target), {target.numel()});
  int64_t classes = self.size(1);
  Value ti = b.convert(t, ir::DType::S64);
  Value bad = b.binary("and", b.compare(ti, b.scalar_like(ti, static_cast<double>(ignore_index)), "NE"),
                       b.binary("or", b.compare(ti, b.scalar_like(ti, 0), "LT"),
                                b.compare(ti, b.scalar_like(ti, static_cast<double>(classes)), "GE")));
  op.check_flag(L::any_all(b, bad, {}, false, false),
                "target out of bounds in aten::nll_loss2d_forward (classes " + std::to_string(classes) + ")");
  auto r = L::nll_loss(b, rows_of(b, op.input(self)), t, has_w ? &w : nullptr, reduction, ignore_index);
  Value loss = reduction == 0 ? b.reshape(r[0], vec(target.sizes())) : r[0];
  at::Tensor out = op.output(loss, self.scalar_type());
  at::Tensor total = op.output(r[1], self.scalar_type());
  op.run();
  return {out, total};
}

at::Tensor nll_loss2d_backward_fn(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                                  const std::optional<at::Tensor>& weight, int64_t reduction, int64_t ignore_index,
                                  const at::Tensor& total_weight) {
  OpBuilder op("aten::nll_loss2d_backward");
  auto& b = op.b();
  Value w;
  bool has_w = weight && weight->defined();
  if (has_w) w = op.input(*weight);
  Value g = op.input(grad);
  if (reduction == 0) g = b.reshape(g, {grad.numel()});
  Value r = L::nll_loss_backward(b, g, rows_of(b, op.input(self)), b.reshape(op.input(target), {target.numel()}),
                                 has_w ? &w : nullptr, reduction, ignore_index, op.input(total_weight));
  // Back from [N*H*W, C] rows to [N, C, H, W].
  r = b.transpose(b.reshape(r, {self.size(0), self.size(2), self.size(3), self.size(1)}), {0, 3, 1, 2});
  return finish(op, r, self.scalar_type(), nullptr);
}

// The targets as [N, max target length], padded (1-d concatenated targets gathered by offsets).
at::Tensor padded_targets(const at::Tensor& log_probs, const at::Tensor& targets, c10::IntArrayRef target_lengths) {
  int64_t n = static_cast<int64_t>(target_lengths.size());
  int64_t max_len = 0;
  for (int64_t l : target_lengths) {
    TORCH_CHECK(l >= 0, "ctc_loss: target lengths must be non-negative");
    max_len = std::max(max_len, l);
  }
  at::Tensor t = targets.device() == log_probs.device() ? targets : targets.to(log_probs.device());
  if (t.dim() == 2) {
    TORCH_CHECK(t.size(0) == n && t.size(1) >= max_len, "ctc_loss: expected targets of shape [", n, ", >= ", max_len,
                "], got ", t.sizes());
    return t.slice(1, 0, max_len);
  }
  TORCH_CHECK(t.dim() == 1, "ctc_loss: targets must be 1-d (concatenated) or 2-d (padded), got ", t.dim(), "-d");
  std::vector<int64_t> idx;
  int64_t offset = 0;
  for (int64_t l : target_lengths) {
    for (int64_t s = 0; s < max_len; ++s) idx.push_back(l > 0 ? offset + std::min(s, l - 1) : 0);
    offset += l;
  }
  TORCH_CHECK(t.numel() >= offset, "ctc_loss: expected at least ", offset, " concatenated targets, got ", t.numel());
  if (max_len == 0 || t.numel() == 0) return at::zeros({n, max_len}, t.options().dtype(at::kLong));
  at::Tensor index = at::tensor(idx, at::TensorOptions().dtype(at::kLong)).to(log_probs.device());
  return t.index_select(0, index).view({n, max_len});
}

void check_ctc(const at::Tensor& log_probs, c10::IntArrayRef input_lengths, c10::IntArrayRef target_lengths, int64_t blank) {
  TORCH_CHECK(log_probs.dim() == 3, "ctc_loss: expected log_probs of shape [T, N, C], got ", log_probs.sizes());
  TORCH_CHECK(log_probs.scalar_type() == at::kFloat || log_probs.scalar_type() == at::kDouble,
              "ctc_loss: expected float or double log_probs, got ", log_probs.scalar_type());
  int64_t t = log_probs.size(0), n = log_probs.size(1), c = log_probs.size(2);
  TORCH_CHECK(blank >= 0 && blank < c, "blank must be in label range");
  TORCH_CHECK(static_cast<int64_t>(input_lengths.size()) == n, "input_lengths must be of size batch_size");
  TORCH_CHECK(static_cast<int64_t>(target_lengths.size()) == n, "target_lengths must be of size batch_size");
  for (int64_t l : input_lengths) {
    TORCH_CHECK(l >= 0 && l <= t, "Expected input_lengths to have value at most ", t, ", but got value ", l);
  }
}

at::Tensor lengths_on(const at::Tensor& like, c10::IntArrayRef lengths) {
  return at::tensor(std::vector<int64_t>(lengths.begin(), lengths.end()), at::TensorOptions().dtype(at::kLong)).to(like.device());
}

std::tuple<at::Tensor, at::Tensor> ctc_loss_fn(const at::Tensor& log_probs, const at::Tensor& targets,
                                               c10::IntArrayRef input_lengths, c10::IntArrayRef target_lengths,
                                               int64_t blank, bool zero_infinity) {
  (void)zero_infinity;  // applied by ctc_loss above this op (and in its backward), as on CPU
  check_ctc(log_probs, input_lengths, target_lengths, blank);
  at::Tensor tg = padded_targets(log_probs, targets, target_lengths);
  at::Tensor il = lengths_on(log_probs, input_lengths), tl = lengths_on(log_probs, target_lengths);
  OpBuilder op("aten::_ctc_loss");
  auto r = L::ctc_loss(op.b(), op.input(log_probs), op.input(tg), op.input(il), op.input(tl), blank);
  at::Tensor nll = op.output(r[0], log_probs.scalar_type());
  at::Tensor alpha = op.output(r[1], log_probs.scalar_type());
  op.run();
  return {nll, alpha};
}

std::vector<int64_t> host_lengths(const at::Tensor& t) {
  at::Tensor h = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(h.data_ptr<int64_t>(), h.data_ptr<int64_t>() + h.numel());
}

std::tuple<at::Tensor, at::Tensor> ctc_loss_tensor_fn(const at::Tensor& log_probs, const at::Tensor& targets,
                                                      const at::Tensor& input_lengths, const at::Tensor& target_lengths,
                                                      int64_t blank, bool zero_infinity) {
  return ctc_loss_fn(log_probs, targets, host_lengths(input_lengths), host_lengths(target_lengths), blank, zero_infinity);
}

at::Tensor ctc_loss_backward_fn(const at::Tensor& grad, const at::Tensor& log_probs, const at::Tensor& targets,
                                c10::IntArrayRef input_lengths, c10::IntArrayRef target_lengths, const at::Tensor& nll,
                                const at::Tensor& log_alpha, int64_t blank, bool zero_infinity) {
  check_ctc(log_probs, input_lengths, target_lengths, blank);
  at::Tensor tg = padded_targets(log_probs, targets, target_lengths);
  at::Tensor il = lengths_on(log_probs, input_lengths), tl = lengths_on(log_probs, target_lengths);
  OpBuilder op("aten::_ctc_loss_backward");
  Value r = L::ctc_loss_backward(op.b(), op.input(grad), op.input(log_probs), op.input(tg), op.input(il), op.input(tl),
                                 op.input(nll), op.input(log_alpha), blank, zero_infinity);
  return finish(op, r, log_probs.scalar_type(), nullptr);
}

at::Tensor ctc_loss_backward_tensor_fn(const at::Tensor& grad, const at::Tensor& log_probs, const at::Tensor& targets,
                                       const at::Tensor& input_lengths, const at::Tensor& target_lengths,
                                       const at::Tensor& nll, const at::Tensor& log_alpha, int64_t blank,
                                       bool zero_infinity) {
  return ctc_loss_backward_fn(grad, log_probs, targets, host_lengths(input_lengths), host_lengths(target_lengths), nll,
                              log_alpha, blank, zero_infinity);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("mse_loss", mse_fn);
  m.impl("mse_loss.out", mse_out);
  m.impl("mse_loss_backward", mse_backward_fn);
  m.impl("nll_loss_forward", nll_loss_forward_fn);
  m.impl("nll_loss_backward", nll_loss_backward_fn);
  m.impl("_ctc_loss", ctc_loss_fn);
  m.impl("_ctc_loss.Tensor", ctc_loss_tensor_fn);
  m.impl("_ctc_loss_backward", ctc_loss_backward_fn);
  m.impl("_ctc_loss_backward.Tensor", ctc_loss_backward_tensor_fn);
  m.impl("smooth_l1_loss", smooth_l1_fn);
  m.impl("smooth_l1_loss_backward", smooth_l1_backward_fn);
  m.impl("huber_loss", huber_fn);
  m.impl("huber_loss_backward", huber_backward_fn);
  m.impl("binary_cross_entropy", bce_fn);
  m.impl("binary_cross_entropy_backward", bce_backward_fn);
  m.impl("binary_cross_entropy_with_logits", bce_logits_fn);
  m.impl("soft_margin_loss", soft_margin_fn);
  m.impl("soft_margin_loss_backward", soft_margin_backward_fn);
  m.impl("nll_loss2d_forward", nll_loss2d_fn);
  m.impl("multi_margin_loss", multi_margin_fn);
  m.impl("multi_margin_loss_backward", multi_margin_backward_fn);
  m.impl("multilabel_margin_loss_forward", multilabel_margin_forward_fn);
  m.impl("multilabel_margin_loss_backward", multilabel_margin_backward_fn);
  m.impl("rrelu_with_noise", rrelu_with_noise_fn);
  m.impl("rrelu_with_noise_", rrelu_with_noise_inplace);
  m.impl("rrelu_with_noise.out", rrelu_with_noise_out);
  m.impl("rrelu_with_noise_backward", rrelu_with_noise_backward_fn);
  m.impl("nll_loss2d_backward", nll_loss2d_backward_fn);
}

}  // namespace torch_pjrt::device
