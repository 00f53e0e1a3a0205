// Native kernels for activation functions with parameters, and their backward
// kernels. Parameters are runtime scalars (one program serves every value);
// reduced-precision inputs compute in f32 like CPU's opmath.
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>
#include <torch/library.h>

#include <functional>

#include "device/context.h"
#include "aten/kernel_util.h"
#include "lowering/ops.h"

namespace torch_pjrt::device {
namespace {

using ir::Builder;
using ir::Value;
namespace L = lowering;

// What a pointwise body sees: the builder, its inputs (broadcast, in the compute
// dtype), and a maker for runtime scalars of that dtype and shape.
struct Pointwise {
  Builder& b;
  std::vector<Value> in;
  std::function<Value(const at::Scalar&)> scalar;
  Value c(double v) const { return b.scalar_like(in[0], v); }
  Value bin(const char* op, Value x, Value y) const { return b.binary(op, x, y); }
  Value cmp(Value x, Value y, const char* dir) const { return b.compare(x, y, dir); }
  Value sel(Value p, Value x, Value y) const { return b.select(p, x, y); }
};

at::Tensor pointwise(const char* name, const std::vector<at::Tensor>& inputs, const at::Tensor* into,
                     const std::function<Value(const Pointwise&)>& body) {
  OpBuilder op(std::string("aten::") + name);
  auto& b = op.b();
  at::ScalarType dtype = inputs.back().scalar_type();
  ir::DType compute = L::accumulate_type(to_ir(dtype));
  std::vector<Value> vals;
  std::vector<int64_t> shape;
  for (const auto& t : inputs) {
    vals.push_back(b.convert(op.input(t), compute));
    shape = ir::broadcast_shapes(shape, b.dims(vals.back()));
  }
  for (auto& v : vals) v = b.broadcast_to(v, shape);
  at::ScalarType compute_t = to_aten(compute);
  Pointwise pw{b, vals, [&](const at::Scalar& s) { return b.broadcast_to(op.scalar(s, compute_t), shape); }};
  Value r = b.convert(body(pw), to_ir(dtype));
  return finish(op, r, dtype, into, op.pointwise_layout(static_cast<int64_t>(shape.size())));
}

// Declares fn / in-place / out= kernels for a one-input activation with scalar parameters.
#define ACTIVATION(NAME, PARAMS, ARGS, ...)                                                   \
  Value NAME##_body(const Pointwise& p, PARAMS) __VA_ARGS__                                           \
  at::Tensor NAME##_fn(const at::Tensor& self, PARAMS) {                                       \
    return pointwise(#NAME, {self}, nullptr, [&](const Pointwise& p) { return NAME##_body(p, ARGS); }); \
  }                                                                                            \
  at::Tensor& NAME##_out(const at::Tensor& self, PARAMS, at::Tensor& out) {                    \
    pointwise(#NAME, {self}, &out, [&](const Pointwise& p) { return NAME##_body(p, ARGS); });  \
    return out;                                                                                \
  }                                                                                            \
  at::Tensor& NAME##_inplace(at::Tensor& self, PARAMS) {                                       \
    pointwise(#NAME, {self}, &self, [&](const Pointwise& p) { return NAME##_body(p, ARGS); }); \
    return self;                                                                               \
  }

// Backward kernels take (grad, self) plus parameters; the result has self's dtype.
#define ACTIVATION_BACKWARD(NAME, PARAMS, ARGS, ...)                                              \
  Value NAME##_body(const Pointwise& p, PARAMS) __VA_ARGS__                                               \
  at::Tensor NAME##_fn(const at::Tensor& grad, const at::Tensor& self, PARAMS) {                  \
    return pointwise(#NAME, {grad, self}, nullptr, [&](const Pointwise& p) { return NAME##_body(p, ARGS); }); \
  }                                                                                                \
  at::Tensor& NAME##_out(const at::Tensor& grad, const at::Tensor& self, PARAMS, at::Tensor& out) { \
    pointwise(#NAME, {grad, self}, &out, [&](const Pointwise& p) { return NAME##_body(p, ARGS); }); \
    return out;                                                                                    \
  }

#define COMMA ,

ACTIVATION(elu, const at::Scalar& alpha COMMA const at::Scalar& scale COMMA const at::Scalar& input_scale,
           alpha COMMA scale COMMA input_scale, {
             Value x = p.in[0];
             Value neg = p.bin("multiply",
                               p.b.unary("exponential_minus_one", p.bin("multiply", x, p.scalar(input_scale))),
                               p.bin("multiply", p.scalar(alpha), p.scalar(scale)));
             return p.sel(p.cmp(x, p.c(0), "LE"), neg, p.bin("multiply", x, p.scalar(scale)));
           })

Value elu_backward_body(const Pointwise& p, const at::Scalar& alpha, const at::Scalar& scale,
                        const at::Scalar& input_scale, bool is_result) {
  Value g = p.in[0], x = p.in[1];
  Value negcoef = p.bin("multiply", p.scalar(alpha), p.scalar(scale));
  Value neg = is_result ? p.bin("multiply", p.bin("multiply", g, p.scalar(input_scale)), p.bin("add", x, negcoef))
                        : p.bin("multiply", p.bin("multiply", g, p.bin("multiply", p.scalar(input_scale), negcoef)),
                                p.b.unary("exponential", p.bin("multiply", x, p.scalar(input_scale))));
  Value r = p.sel(p.cmp(x, p.c(0), "LE"), neg, p.bin("multiply", g, p.scalar(scale)));
  return p.sel(p.cmp(x, x, "NE"), x, r);  // NaN inputs give NaN gradients, as on CPU
}
at::Tensor elu_backward_fn(const at::Tensor& grad, const at::Scalar& alpha, const at::Scalar& scale,
                           const at::Scalar& input_scale, bool is_result, const at::Tensor& self_or_result) {
  TORCH_CHECK(!is_result || alpha.to<double>() >= 0.0, "In-place elu backward calculation is triggered with a negative slope which is not supported.");
  return pointwise("elu_backward", {grad, self_or_result}, nullptr,
                   [&](const Pointwise& p) { return elu_backward_body(p, alpha, scale, input_scale, is_result); });
}

ACTIVATION(leaky_relu, const at::Scalar& slope, slope, {
  Value x = p.in[0];
  return p.sel(p.cmp(x, p.c(0), "GT"), x, p.bin("multiply", x, p.scalar(slope)));
})
Value leaky_relu_backward_body(const Pointwise& p, const at::Scalar& slope) {
  Value g = p.in[0], x = p.in[1];
  return p.sel(p.cmp(x, p.c(0), "GT"), g, p.bin("multiply", g, p.scalar(slope)));
}
at::Tensor leaky_relu_backward_fn(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& slope, bool is_result) {
  TORCH_CHECK(!is_result || slope.to<double>() >= 0.0, "In-place leakyReLu backward calculation is triggered with a negative slope which is not supported.");
  return pointwise("leaky_relu_backward", {grad, self}, nullptr,
                   [&](const Pointwise& p) { return leaky_relu_backward_body(p, slope); });
}

ACTIVATION(softplus, const at::Scalar& beta COMMA const at::Scalar& threshold, beta COMMA threshold, {
  Value x = p.in[0];
  Value bx = p.bin("multiply", x, p.scalar(beta));
  Value soft = p.bin("divide", p.b.unary("log_plus_one", p.b.unary("exponential", bx)), p.scalar(beta));
  return p.sel(p.cmp(bx, p.scalar(threshold), "GT"), x, soft);
})
ACTIVATION_BACKWARD(softplus_backward, const at::Scalar& beta COMMA const at::Scalar& threshold, beta COMMA threshold, {
  Value g = p.in[0], x = p.in[1];
  Value bx = p.bin("multiply", x, p.scalar(beta));
  Value z = p.b.unary("exponential", bx);
  Value d = p.bin("divide", p.bin("multiply", g, z), p.bin("add", z, p.c(1)));
  return p.sel(p.cmp(bx, p.scalar(threshold), "GT"), g, d);
})

ACTIVATION(hardtanh, const at::Scalar& lo COMMA const at::Scalar& hi, lo COMMA hi, {
  Value l = p.scalar(lo), h = p.scalar(hi);
  return L::clamp(p.b, p.in[0], &l, &h, p.b.dtype(p.in[0]));  // NaN-propagating, unlike stablehlo.clamp
})
ACTIVATION_BACKWARD(hardtanh_backward, const at::Scalar& lo COMMA const at::Scalar& hi, lo COMMA hi, {
  Value g = p.in[0], x = p.in[1];
  Value outside = p.bin("or", p.cmp(x, p.scalar(lo), "LE"), p.cmp(x, p.scalar(hi), "GE"));
  return p.sel(outside, p.c(0), g);
})

Value shrink_band(const Pointwise& p, Value x, const at::Scalar& lambd) {
  Value l = p.scalar(lambd);
  return p.bin("and", p.cmp(x, p.b.unary("negate", l), "GE"), p.cmp(x, l, "LE"));
}
ACTIVATION(hardshrink, const at::Scalar& lambd, lambd, {
  return p.sel(shrink_band(p, p.in[0], lambd), p.c(0), p.in[0]);
})
ACTIVATION_BACKWARD(hardshrink_backward, const at::Scalar& lambd, lambd, {
  return p.sel(shrink_band(p, p.in[1], lambd), p.c(0), p.in[0]);
})
ACTIVATION(softshrink, const at::Scalar& lambd, lambd, {
  TORCH_CHECK(lambd.toDouble() >= 0, "softshrink: lambda must be in range [0, inf) for the input dtype, but found ",
              lambd.toDouble());
  Value x = p.in[0], l = p.scalar(lambd);
  Value r = p.sel(p.cmp(x, l, "GT"), p.bin("subtract", x, l), p.sel(p.cmp(x, p.b.unary("negate", l), "LT"), p.bin("add", x, l), p.c(0)));
  return p.sel(p.cmp(x, x, "NE"), x, r);
})
ACTIVATION_BACKWARD(softshrink_backward, const at::Scalar& lambd, lambd, {
  return p.sel(shrink_band(p, p.in[1], lambd), p.c(0), p.in[0]);
})

ACTIVATION(threshold, const at::Scalar& th COMMA const at::Scalar& value, th COMMA value, {
  return p.sel(p.cmp(p.in[0], p.scalar(th), "LE"), p.scalar(value), p.in[0]);
})

// Parameterless backward kernels.
#define SIMPLE_BACKWARD(NAME, ...)                                                               \
  Value NAME##_body(const Pointwise& p) __VA_ARGS__                                                      \
  at::Tensor NAME##_fn(const at::Tensor& grad, const at::Tensor& self) {                         \
    return pointwise(#NAME, {grad, self}, nullptr, [&](const Pointwise& p) { return NAME##_body(p); }); \
  }                                                                                               \
  at::Tensor& NAME##_out(const at::Tensor& grad, const at::Tensor& self, at::Tensor& out) {      \
    pointwise(#NAME, {grad, self}, &out, [&](const Pointwise& p) { return NAME##_body(p); });    \
    return out;                                                                                   \
  }

SIMPLE_BACKWARD(hardsigmoid_backward, {
  Value g = p.in[0], x = p.in[1];
  Value inside = p.bin("and", p.cmp(x, p.c(-3), "GT"), p.cmp(x, p.c(3), "LT"));
  return p.sel(inside, p.bin("divide", g, p.c(6)), p.c(0));
})
SIMPLE_BACKWARD(hardswish_backward, {
  Value g = p.in[0], x = p.in[1];
  Value mid = p.bin("multiply", g, p.bin("add", p.bin("divide", x, p.c(3)), p.c(0.5)));
  return p.sel(p.cmp(x, p.c(-3), "LT"), p.c(0), p.sel(p.cmp(x, p.c(3), "LE"), mid, g));
})
SIMPLE_BACKWARD(mish_backward, {
  Value g = p.in[0], x = p.in[1];
  Value sig = p.b.unary("logistic", x);
  Value tsp = p.b.unary("tanh", L::softplus(p.b, x));
  Value d = p.bin("add", tsp, p.bin("multiply", p.bin("multiply", x, sig), p.bin("subtract", p.c(1), p.bin("multiply", tsp, tsp))));
  return p.bin("multiply", g, d);
})

std::tuple<at::Tensor, at::Tensor> log_sigmoid_forward_fn(const at::Tensor& self) {
  at::Tensor out = pointwise("log_sigmoid_forward", {self}, nullptr, [](const Pointwise& p) {
    Value x = p.in[0];
    Value tail = p.b.unary("log_plus_one", p.b.unary("exponential", p.b.unary("negate", p.b.unary("abs", x))));
    return p.bin("subtract", p.bin("minimum", x, p.c(0)), tail);
  });
  return {out, at::empty({0}, self.options())};  // no buffer is needed
}
std::tuple<at::Tensor&, at::Tensor&> log_sigmoid_forward_out(const at::Tensor& self, at::Tensor& output,
                                                             at::Tensor& buffer) {
  write_out("log_sigmoid_forward", std::get<0>(log_sigmoid_forward_fn(self)), output);
  buffer.resize_({0});  // as the functional kernel: the backward reads no buffer
  return {output, buffer};
}
at::Tensor log_sigmoid_backward_fn(const at::Tensor& grad, const at::Tensor& self, const at::Tensor&) {
  return pointwise("log_sigmoid_backward", {grad, self}, nullptr, [](const Pointwise& p) {
    return p.bin("multiply", p.in[0], p.b.unary("logistic", p.b.unary("negate", p.in[1])));
  });
}

at::Tensor logit_backward_fn(const at::Tensor& grad, const at::Tensor& self, std::optional<double> eps) {
  return pointwise("logit_backward", {grad, self}, nullptr, [&](const Pointwise& p) {
    Value g = p.in[0], x = p.in[1];
    Value d = p.bin("divide", g, p.bin("multiply", x, p.bin("subtract", p.c(1), x)));
    if (!eps) return p.sel(p.bin("or", p.cmp(x, p.c(0), "LT"), p.cmp(x, p.c(1), "GT")), p.c(NAN), d);
    Value outside = p.bin("or", p.cmp(x, p.c(*eps), "LT"), p.cmp(x, p.c(1.0 - *eps), "GT"));
    return p.sel(outside, p.c(0), d);
  });
}

at::Tensor glu_impl(const at::Tensor& self, int64_t dim, const at::Tensor* grad) {
  TORCH_CHECK(self.dim() > 0, "glu does not support scalars because halving size must be even");
  int64_t d = at::maybe_wrap_dim(dim, self.dim());
  TORCH_CHECK(self.size(d) % 2 == 0, "Halving dimension must be even, but dimension ", d, " is size ", self.size(d));
  OpBuilder op(grad ? "aten::glu_backward" : "aten::glu");
  auto& b = op.b();
  ir::DType dt = to_ir(self.scalar_type()), acc = L::accumulate_type(dt);
  Value x = b.convert(op.input(self), acc);
  int64_t half = self.size(d) / 2;
  Value first = b.slice_dim(x, d, 0, half), second = b.slice_dim(x, d, half, 2 * half);
  Value sig = b.unary("logistic", second);
  if (!grad) return finish(op, b.convert(b.binary("multiply", first, sig), dt), self.scalar_type(), nullptr);
  Value g = b.convert(op.input(*grad), acc);
  Value ga = b.binary("multiply", g, sig);
  Value gb = b.binary("multiply", b.binary("multiply", ga, first), b.binary("subtract", b.scalar_like(sig, 1), sig));
  return finish(op, b.convert(b.concatenate({ga, gb}, d), dt), self.scalar_type(), nullptr);
}
at::Tensor glu_fn(const at::Tensor& self, int64_t dim) { return glu_impl(self, dim, nullptr); }
at::Tensor glu_backward_fn(const at::Tensor& grad, const at::Tensor& self, int64_t dim) {
  return glu_impl(self, dim, &grad);
}

at::Tensor prelu_fn(const at::Tensor& self, const at::Tensor& weight) {
  return pointwise("_prelu_kernel", {weight, self}, nullptr, [](const Pointwise& p) {
    Value w = p.in[0], x = p.in[1];
    return p.sel(p.cmp(x, p.c(0), "GT"), x, p.bin("multiply", w, x));
  });
}
std::tuple<at::Tensor, at::Tensor> prelu_backward_fn(const at::Tensor& grad, const at::Tensor& self,
                                                     const at::Tensor& weight) {
  OpBuilder op("aten::_prelu_kernel_backward");
  auto& b = op.b();
  ir::DType dt = to_ir(self.scalar_type()), acc = L::accumulate_type(dt);
  // Read in ATen's operand order (self, weight, grad): grad_input is laid out as its TensorIterator lays it out.
  Value x = b.convert(op.input(self), acc), w = b.convert(op.input(weight), acc), g = b.convert(op.input(grad), acc);
  auto shape = ir::broadcast_shapes(ir::broadcast_shapes(b.dims(g), b.dims(x)), b.dims(w));
  g = b.broadcast_to(g, shape);
  x = b.broadcast_to(x, shape);
  Value wb = b.broadcast_to(w, shape);
  Value pos = b.compare(x, b.scalar_like(x, 0), "GT");
  Value gi = b.select(pos, g, b.binary("multiply", wb, g));
  Value gw = b.select(pos, b.scalar_like(x, 0), b.binary("multiply", x, g));
  // Sum the weight gradient back to the weight's (broadcast) shape.
  std::vector<int64_t> wd = vec(weight.sizes()), reduce;
  size_t lead = shape.size() - wd.size();
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead || (wd[i - lead] == 1 && shape[i] != 1)) reduce.push_back(static_cast<int64_t>(i));
  }
  if (!reduce.empty()) gw = b.reshape(L::sum(b, gw, reduce, false, acc), wd);
  at::Tensor grad_input =
      op.output(b.convert(gi, dt), self.scalar_type(), op.pointwise_layout(static_cast<int64_t>(shape.size())));
  at::Tensor grad_weight = op.output(b.convert(gw, to_ir(weight.scalar_type())), weight.scalar_type());
  op.run();
  return {grad_input, grad_weight};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
#define REG_ALL(NAME)          \
  m.impl(#NAME, NAME##_fn);    \
  m.impl(#NAME ".out", NAME##_out);
  REG_ALL(elu) REG_ALL(leaky_relu) REG_ALL(softplus) REG_ALL(hardtanh) REG_ALL(hardshrink) REG_ALL(softshrink)
  REG_ALL(threshold)
#undef REG_ALL
  m.impl("elu_", elu_inplace);
  m.impl("leaky_relu_", leaky_relu_inplace);
  m.impl("hardtanh_", hardtanh_inplace);
  m.impl("threshold_", threshold_inplace);
#define REG_BACKWARD(NAME)   \
  m.impl(#NAME, NAME##_fn); \
  m.impl(#NAME ".grad_input", NAME##_out);
  REG_BACKWARD(softplus_backward) REG_BACKWARD(hardtanh_backward) REG_BACKWARD(hardshrink_backward)
  REG_BACKWARD(softshrink_backward) REG_BACKWARD(hardsigmoid_backward)
#undef REG_BACKWARD
  m.impl("hardswish_backward", hardswish_backward_fn);
  m.impl("hardswish_backward.out", hardswish_backward_out);
  m.impl("mish_backward", mish_backward_fn);
  m.impl("elu_backward", elu_backward_fn);
  m.impl("leaky_relu_backward", leaky_relu_backward_fn);
  m.impl("log_sigmoid_forward", log_sigmoid_forward_fn);
  m.impl("log_sigmoid_forward.output", log_sigmoid_forward_out);
  m.impl("log_sigmoid_backward", log_sigmoid_backward_fn);
  m.impl("logit_backward", logit_backward_fn);
  m.impl("glu", glu_fn);
  m.impl("glu_backward", glu_backward_fn);
  m.impl("_prelu_kernel", prelu_fn);
  m.impl("_prelu_kernel_backward", prelu_backward_fn);
}

}  // namespace torch_pjrt::device
// Activation and activation-gradient kernels with their own overloads (threshold_backward, gelu, silu/sigmoid/tanh backward).
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
#include "device/context.h"
#include "device/device_name.h"
#include "lowering/ops.h"

namespace torch_pjrt::device {
namespace {

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

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
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
}

}  // namespace torch_pjrt::device
