// Pooling: max/avg pooling with indices, adaptive pooling, fractional max pooling.
#include <ATen/ExpandUtils.h>
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

L::PoolParams pool_params(const char* op, size_t n, c10::IntArrayRef kernel, c10::IntArrayRef stride,
                          c10::IntArrayRef padding, c10::IntArrayRef dilation, bool ceil_mode, const at::Tensor& self) {
  TORCH_CHECK(self.dim() == static_cast<int64_t>(n) + 1 || self.dim() == static_cast<int64_t>(n) + 2, op,
              ": non-empty ", n + 1, "D or ", n + 2, "D (batch mode) tensor expected for input, got ", self.sizes());
  L::PoolParams p;
  p.kernel = expand_param(kernel, n, op, "kernel_size");
  p.stride = expand_param(stride, n, op, "stride", kernel);
  p.padding = expand_param(padding, n, op, "padding");
  p.dilation = dilation.empty() ? std::vector<int64_t>(n, 1) : expand_param(dilation, n, op, "dilation");
  p.ceil_mode = ceil_mode;
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK(p.kernel[i] > 0 && p.stride[i] > 0 && p.dilation[i] > 0, op,
                ": kernel size, stride and dilation should be greater than zero");
    TORCH_CHECK(p.padding[i] >= 0, op, ": pad must be non-negative, but got pad: ", p.padding[i]);
    TORCH_CHECK(p.padding[i] <= p.kernel[i] / 2, op,
                ": pad should be at most half of effective kernel size, but got pad=", p.padding[i],
                ", kernel_size=", p.kernel[i]);
  }
  // Every dimension but the batch one must be non-empty (ATen's wording differs for 3-D pooling).
  for (int64_t d = self.dim() - static_cast<int64_t>(n) - 1; d < self.dim(); ++d) {
    if (n == 3) {
      TORCH_CHECK(self.size(d) > 0, op, ": Expected input's non-batch dimensions to have positive length, but input has a shape of ",
                  self.sizes(), " and non-batch dimension ", d, " has length zero!");
    } else {
      TORCH_CHECK(self.size(d) > 0, op, ": Expected ", n + 1, "D or ", n + 2,
                  "D (batch mode) tensor with optional 0 dim batch size for input, but got: ", self.sizes());
    }
  }
  auto out = L::pool_output_size(spatial(self, n), p);
  for (int64_t o : out) {
    TORCH_CHECK(o > 0, op, ": Given input size: ", self.sizes(), ". Calculated output size: ", c10::IntArrayRef(out),
                ". Output size is too small");
  }
  return p;
}

std::tuple<at::Tensor, at::Tensor> max_pool_fn(size_t n, const char* name, const at::Tensor& self,
                                               c10::IntArrayRef kernel, c10::IntArrayRef stride,
                                               c10::IntArrayRef padding, c10::IntArrayRef dilation, bool ceil_mode) {
  auto p = pool_params(name, n, kernel, stride, padding, dilation, ceil_mode, self);
  OpBuilder op(std::string("aten::") + name);
  auto r = L::max_pool(op.b(), op.input(self), p);
  at::MemoryFormat layout = op.suggested_layout(self.dim());
  at::Tensor v = op.output(r[0], self.scalar_type(), layout);
  at::Tensor i = op.output(r[1], at::kLong, layout);
  op.run();
  return {v, i};
}

at::Tensor max_pool_backward_fn(size_t n, const char* name, const at::Tensor& grad, const at::Tensor& self,
                                const at::Tensor& indices) {
  OpBuilder op(std::string("aten::") + name);
  Value r = L::max_pool_backward(op.b(), op.input(grad), op.input(indices), vec(self.sizes()), n);
  return finish(op, r, self.scalar_type(), nullptr, layout_like(self));
}

#define MAX_POOL_KERNELS(N)                                                                                    \
  std::tuple<at::Tensor, at::Tensor> max_pool##N##d_fn(const at::Tensor& s, c10::IntArrayRef k,                \
                                                       c10::IntArrayRef st, c10::IntArrayRef p,                \
                                                       c10::IntArrayRef d, bool c) {                           \
    return max_pool_fn(N, "max_pool" #N "d_with_indices", s, k, st, p, d, c);                                  \
  }                                                                                                            \
  at::Tensor max_pool##N##d_backward_fn(const at::Tensor& g, const at::Tensor& s, c10::IntArrayRef,            \
                                        c10::IntArrayRef, c10::IntArrayRef, c10::IntArrayRef, bool,            \
                                        const at::Tensor& i) {                                                 \
    return max_pool_backward_fn(N, "max_pool" #N "d_with_indices_backward", g, s, i);                          \
  }
MAX_POOL_KERNELS(2)
MAX_POOL_KERNELS(3)

at::Tensor avg_pool_fn(size_t n, const char* name, const at::Tensor& self, c10::IntArrayRef kernel,
                       c10::IntArrayRef stride, c10::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                       std::optional<int64_t> divisor) {
  TORCH_CHECK(!divisor || *divisor != 0, name, ": divisor must be not zero");
  auto p = pool_params(name, n, kernel, stride, padding, {}, ceil_mode, self);
  OpBuilder op(std::string("aten::") + name);
  Value r = L::avg_pool(op.b(), op.input(self), p, count_include_pad, divisor.value_or(0));
  return finish(op, r, self.scalar_type(), nullptr, op.suggested_layout(self.dim()));
}

at::Tensor avg_pool_backward_fn(size_t n, const char* name, const at::Tensor& grad, const at::Tensor& self,
                                c10::IntArrayRef kernel, c10::IntArrayRef stride, c10::IntArrayRef padding,
                                bool ceil_mode, bool count_include_pad, std::optional<int64_t> divisor) {
  auto p = pool_params(name, n, kernel, stride, padding, {}, ceil_mode, self);
  OpBuilder op(std::string("aten::") + name);
  Value r = L::avg_pool_backward(op.b(), op.input(grad), vec(self.sizes()), p, count_include_pad, divisor.value_or(0));
  return finish(op, r, self.scalar_type(), nullptr, layout_like(self));
}

#define AVG_POOL_KERNELS(N)                                                                                      \
  at::Tensor avg_pool##N##d_fn(const at::Tensor& s, c10::IntArrayRef k, c10::IntArrayRef st, c10::IntArrayRef p, \
                               bool c, bool cip, std::optional<int64_t> d) {                                     \
    return avg_pool_fn(N, "avg_pool" #N "d", s, k, st, p, c, cip, d);                                            \
  }                                                                                                              \
  at::Tensor avg_pool##N##d_backward_fn(const at::Tensor& g, const at::Tensor& s, c10::IntArrayRef k,           \
                                        c10::IntArrayRef st, c10::IntArrayRef p, bool c, bool cip,               \
                                        std::optional<int64_t> d) {                                              \
    return avg_pool_backward_fn(N, "avg_pool" #N "d_backward", g, s, k, st, p, c, cip, d);                      \
  }
AVG_POOL_KERNELS(2)
AVG_POOL_KERNELS(3)

at::Tensor adaptive_avg_pool_fn(size_t n, const char* name, const at::Tensor& self, c10::IntArrayRef output_size) {
  TORCH_CHECK(output_size.size() == n, name, "(): internal error: output_size.size() must be ", n);
  TORCH_CHECK(self.dim() == static_cast<int64_t>(n) + 1 || self.dim() == static_cast<int64_t>(n) + 2, name,
              ": expected ", n + 1, "D or ", n + 2, "D tensor, got ", self.sizes());
  for (int64_t i = 1; i < self.dim(); ++i) {
    TORCH_CHECK(self.size(i) > 0, name, ": expected input to have non-zero size for non-batch dimensions, but input has sizes ",
                self.sizes());
  }
  OpBuilder op(std::string("aten::") + name);
  Value r = L::adaptive_avg_pool(op.b(), op.input(self), vec(output_size));
  return finish(op, r, self.scalar_type(), nullptr, op.suggested_layout(self.dim()));
}
at::Tensor adaptive_avg_pool2d_fn(const at::Tensor& s, c10::IntArrayRef o) {
  return adaptive_avg_pool_fn(2, "_adaptive_avg_pool2d", s, o);
}
at::Tensor adaptive_avg_pool3d_fn(const at::Tensor& s, c10::IntArrayRef o) {
  return adaptive_avg_pool_fn(3, "_adaptive_avg_pool3d", s, o);
}
at::Tensor adaptive_avg_pool_backward_fn(const at::Tensor& grad, const at::Tensor& self) {
  OpBuilder op("aten::_adaptive_avg_pool_backward");
  Value r = L::adaptive_avg_pool_backward(op.b(), op.input(grad), vec(self.sizes()));
  return finish(op, r, self.scalar_type(), nullptr, layout_like(self));
}

std::tuple<at::Tensor, at::Tensor> adaptive_max_pool_fn(size_t n, const char* name, const at::Tensor& self,
                                                        c10::IntArrayRef output_size) {
  TORCH_CHECK(output_size.size() == n, name, "(): internal error: output_size.size() must be ", n);
  TORCH_CHECK(self.dim() == static_cast<int64_t>(n) + 1 || self.dim() == static_cast<int64_t>(n) + 2, name,
              ": expected ", n + 1, "D or ", n + 2, "D tensor, got ", self.sizes());
  for (int64_t i = 1; i < self.dim(); ++i) {
    TORCH_CHECK(self.size(i) > 0, name, ": expected input to have non-zero size for non-batch dimensions, but input has sizes ",
                self.sizes());
  }
  OpBuilder op(std::string("aten::") + name);
  auto r = L::adaptive_max_pool(op.b(), op.input(self), vec(output_size));
  // As the CPU kernel: both results in the input's suggested layout.
  at::Tensor v = op.output(r[0], self.scalar_type(), self.suggest_memory_format());
  at::Tensor i = op.output(r[1], at::kLong, self.suggest_memory_format());
  op.run();
  return {v, i};
}
std::tuple<at::Tensor, at::Tensor> adaptive_max_pool2d_fn(const at::Tensor& s, c10::IntArrayRef o) {
  return adaptive_max_pool_fn(2, "adaptive_max_pool2d", s, o);
}
std::tuple<at::Tensor, at::Tensor> adaptive_max_pool3d_fn(const at::Tensor& s, c10::IntArrayRef o) {
  return adaptive_max_pool_fn(3, "adaptive_max_pool3d", s, o);
}
at::Tensor adaptive_max_pool2d_backward_fn(const at::Tensor& g, const at::Tensor& s, const at::Tensor& i) {
  return max_pool_backward_fn(2, "adaptive_max_pool2d_backward", g, s, i);
}
at::Tensor adaptive_max_pool3d_backward_fn(const at::Tensor& g, const at::Tensor& s, const at::Tensor& i) {
  return max_pool_backward_fn(3, "adaptive_max_pool3d_backward", g, s, i);
}

// max_unpool: values written at their recorded flat positions in a zero plane.
at::Tensor max_unpool_fn(const char* name, const at::Tensor& self, const at::Tensor& indices,
                         c10::IntArrayRef output_size) {
  size_t n = output_size.size();
  TORCH_CHECK(self.sizes().equals(indices.sizes()), name, ": Expected shape of indices to be same as that of the input tensor (",
              self.sizes(), ") but got indices tensor with shape: ", indices.sizes());
  TORCH_CHECK(self.dim() == static_cast<int64_t>(n) + 1 || self.dim() == static_cast<int64_t>(n) + 2, name,
              ": expected ", n + 1, "D or ", n + 2, "D input, got ", self.sizes());
  OpBuilder op(std::string("aten::") + name);
  auto& b = op.b();
  int64_t lead = self.dim() - static_cast<int64_t>(n), planes = 1, in_flat = 1, out_flat = 1;
  for (int64_t i = 0; i < lead; ++i) planes *= self.size(i);
  for (size_t i = 0; i < n; ++i) {
    in_flat *= self.size(lead + i);
    out_flat *= output_size[i];
  }
  Value idx = b.reshape(op.input(indices), {planes, in_flat});
  op.check_flag(L::index_out_of_range(b, idx, out_flat),
                std::string("aten::") + name + ": found an invalid max index (output plane size " + std::to_string(out_flat) + ")");
  Value zeros = b.constant(to_ir(self.scalar_type()), 0, {planes, out_flat});
  Value r = L::scatter(b, zeros, 1, idx, b.reshape(op.input(self), {planes, in_flat}), "");
  std::vector<int64_t> shape(self.sizes().begin(), self.sizes().begin() + lead);
  shape.insert(shape.end(), output_size.begin(), output_size.end());
  return finish(op, b.reshape(r, shape), self.scalar_type(), nullptr);
}
at::Tensor max_unpool2d_fn(const at::Tensor& s, const at::Tensor& i, c10::IntArrayRef o) {
  return max_unpool_fn("max_unpool2d", s, i, o);
}
at::Tensor max_unpool3d_fn(const at::Tensor& s, const at::Tensor& i, c10::IntArrayRef o, c10::IntArrayRef,
                           c10::IntArrayRef) {
  return max_unpool_fn("max_unpool3d", s, i, o);
}

std::tuple<at::Tensor, at::Tensor> fractional_max_pool_fn(size_t k, const char* name, const at::Tensor& self,
                                                          c10::IntArrayRef kernel, c10::IntArrayRef output,
                                                          const at::Tensor& samples) {
  TORCH_CHECK(kernel.size() == k && output.size() == k, name, ": kernel_size and output_size must have ", k, " elements");
  int64_t batched = self.dim() == static_cast<int64_t>(k) + 2;
  TORCH_CHECK(batched || self.dim() == static_cast<int64_t>(k) + 1, name, ": expected ", k + 1, "D or ", k + 2,
              "D input, got ", self.sizes());
  at::Tensor x = batched ? self : self.unsqueeze(0);
  // ATen's rules: [at least N, C, k]; the first N rows are used (an unbatched input is N = 1).
  TORCH_CHECK(samples.dim() == 3, name, ": expected _random_samples to have 3 dimensions, got ", samples.dim());
  TORCH_CHECK(samples.size(0) >= x.size(0), name, ": expected _random_samples.size(0) (", samples.size(0),
              ") to be at least the input's batch size (", x.size(0), ")");
  TORCH_CHECK(samples.size(1) == x.size(1), name, ": expected _random_samples.size(1) (", samples.size(1),
              ") to equal the input's channel count (", x.size(1), ")");
  TORCH_CHECK(samples.size(2) == static_cast<int64_t>(k), name, ": expected _random_samples.size(2) to be ", k,
              ", got ", samples.size(2));
  at::Tensor u = samples.size(0) == x.size(0) ? samples : samples.narrow(0, 0, x.size(0));
  for (size_t d = 0; d < k; ++d) {
    TORCH_CHECK(output[d] + kernel[d] - 1 <= x.size(2 + d), name, ": output_size[", d, "] + pool_size[", d,
                "] - 1 (", output[d] + kernel[d] - 1, ") is too large relative to input size (", x.size(2 + d), ")");
  }
  OpBuilder op(std::string("aten::") + name);
  auto& b = op.b();
  auto r = L::fractional_max_pool(b, op.input(x), op.input(u), vec(kernel), vec(output));
  Value values = r[0], indices = r[1];
  if (!batched) {
    values = b.reshape(values, std::vector<int64_t>(b.dims(values).begin() + 1, b.dims(values).end()));
    indices = b.reshape(indices, std::vector<int64_t>(b.dims(indices).begin() + 1, b.dims(indices).end()));
  }
  at::Tensor v = op.output(values, self.scalar_type());
  at::Tensor i = op.output(indices, at::kLong);
  op.run();
  return {v, i};
}
std::tuple<at::Tensor, at::Tensor> fractional_max_pool2d_fn(const at::Tensor& s, c10::IntArrayRef k, c10::IntArrayRef o,
                                                            const at::Tensor& u) {
  return fractional_max_pool_fn(2, "fractional_max_pool2d", s, k, o, u);
}
std::tuple<at::Tensor, at::Tensor> fractional_max_pool3d_fn(const at::Tensor& s, c10::IntArrayRef k, c10::IntArrayRef o,
                                                            const at::Tensor& u) {
  return fractional_max_pool_fn(3, "fractional_max_pool3d", s, k, o, u);
}
std::tuple<at::Tensor&, at::Tensor&> fractional_max_pool2d_out(const at::Tensor& s, c10::IntArrayRef k, c10::IntArrayRef o,
                                                               const at::Tensor& u, at::Tensor& out, at::Tensor& idx) {
  auto [v, i] = fractional_max_pool2d_fn(s, k, o, u);
  write_outs("fractional_max_pool2d", {v, i}, {out, idx});
  return {out, idx};
}
std::tuple<at::Tensor&, at::Tensor&> fractional_max_pool3d_out(const at::Tensor& s, c10::IntArrayRef k, c10::IntArrayRef o,
                                                               const at::Tensor& u, at::Tensor& out, at::Tensor& idx) {
  auto [v, i] = fractional_max_pool3d_fn(s, k, o, u);
  write_outs("fractional_max_pool3d", {v, i}, {out, idx});
  return {out, idx};
}
// The gradient goes to each window's maximum, as max pooling's does.
at::Tensor fractional_max_pool2d_backward_fn(const at::Tensor& g, const at::Tensor& s, c10::IntArrayRef, c10::IntArrayRef,
                                             const at::Tensor& i) {
  return max_pool_backward_fn(2, "fractional_max_pool2d_backward", g, s, i);
}
at::Tensor fractional_max_pool3d_backward_fn(const at::Tensor& g, const at::Tensor& s, c10::IntArrayRef, c10::IntArrayRef,
                                             const at::Tensor& i) {
  return max_pool_backward_fn(3, "fractional_max_pool3d_backward", g, s, i);
}
at::Tensor& fractional_max_pool2d_backward_out(const at::Tensor& g, const at::Tensor& s, c10::IntArrayRef k,
                                               c10::IntArrayRef o, const at::Tensor& i, at::Tensor& out) {
  return write_out("fractional_max_pool2d_backward", fractional_max_pool2d_backward_fn(g, s, k, o, i), out);
}
at::Tensor& fractional_max_pool3d_backward_out(const at::Tensor& g, const at::Tensor& s, c10::IntArrayRef k,
                                               c10::IntArrayRef o, const at::Tensor& i, at::Tensor& out) {
  return write_out("fractional_max_pool3d_backward", fractional_max_pool3d_backward_fn(g, s, k, o, i), out);
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

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("fractional_max_pool2d", fractional_max_pool2d_fn);
  m.impl("fractional_max_pool2d.output", fractional_max_pool2d_out);
  m.impl("fractional_max_pool3d", fractional_max_pool3d_fn);
  m.impl("fractional_max_pool3d.output", fractional_max_pool3d_out);
  m.impl("fractional_max_pool2d_backward", fractional_max_pool2d_backward_fn);
  m.impl("fractional_max_pool2d_backward.grad_input", fractional_max_pool2d_backward_out);
  m.impl("fractional_max_pool3d_backward", fractional_max_pool3d_backward_fn);
  m.impl("fractional_max_pool3d_backward.grad_input", fractional_max_pool3d_backward_out);
  m.impl("max_pool2d_with_indices", max_pool2d_fn);
  m.impl("max_pool2d_with_indices_backward", max_pool2d_backward_fn);
  m.impl("max_pool3d_with_indices", max_pool3d_fn);
  m.impl("max_pool3d_with_indices_backward", max_pool3d_backward_fn);
  m.impl("avg_pool2d", avg_pool2d_fn);
  m.impl("avg_pool2d.out", [](const at::Tensor& s, c10::IntArrayRef k, c10::IntArrayRef st, c10::IntArrayRef p, bool c,
                              bool cip, std::optional<int64_t> d, at::Tensor& out) -> at::Tensor& {
    return write_out("avg_pool2d", avg_pool2d_fn(s, k, st, p, c, cip, d), out);
  });
  m.impl("avg_pool3d.out", [](const at::Tensor& s, c10::IntArrayRef k, c10::IntArrayRef st, c10::IntArrayRef p, bool c,
                              bool cip, std::optional<int64_t> d, at::Tensor& out) -> at::Tensor& {
    return write_out("avg_pool3d", avg_pool3d_fn(s, k, st, p, c, cip, d), out);
  });
  m.impl("avg_pool2d_backward", avg_pool2d_backward_fn);
  m.impl("avg_pool3d", avg_pool3d_fn);
  m.impl("avg_pool3d_backward", avg_pool3d_backward_fn);
  m.impl("_adaptive_avg_pool2d", adaptive_avg_pool2d_fn);
  m.impl("_adaptive_avg_pool2d_backward", adaptive_avg_pool_backward_fn);
  m.impl("_adaptive_avg_pool3d", adaptive_avg_pool3d_fn);
  m.impl("_adaptive_avg_pool3d_backward", adaptive_avg_pool_backward_fn);
  m.impl("adaptive_max_pool2d", adaptive_max_pool2d_fn);
  m.impl("adaptive_max_pool2d_backward", adaptive_max_pool2d_backward_fn);
  m.impl("adaptive_max_pool3d", adaptive_max_pool3d_fn);
  m.impl("adaptive_max_pool3d_backward", adaptive_max_pool3d_backward_fn);
  m.impl("max_unpool2d", max_unpool2d_fn);
  m.impl("max_unpool3d", max_unpool3d_fn);
  m.impl("adaptive_avg_pool2d.out", adaptive_avg_pool2d_out);
  m.impl("adaptive_avg_pool3d.out", adaptive_avg_pool3d_out);
  m.impl("adaptive_avg_pool3d_backward.grad_input", adaptive_avg_pool3d_backward_out);
}

}  // namespace torch_pjrt::device
