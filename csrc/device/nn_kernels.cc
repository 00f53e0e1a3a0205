// Native ATen kernels for neural-network ops: convolution, pooling,
// normalization, resampling, padding, scans/sorting and losses. Each kernel
// checks its arguments like the CPU kernel does, then lowers through lowering/nn.h.
#include <ATen/WrapDimUtils.h>
#include <torch/library.h>

#include "device/context.h"
#include <ATen/ExpandUtils.h>

#include "device/kernel_util.h"
#include "lowering/nn.h"

namespace torch_pjrt::device {
namespace {

using ir::Builder;
using ir::Value;
namespace L = lowering;

// Expands a 1-element list (or an empty one, to `fallback`) to n entries.
std::vector<int64_t> expand_param(c10::IntArrayRef v, size_t n, const char* op, const char* what,
                                  c10::IntArrayRef fallback = {}) {
  if (v.empty() && !fallback.empty()) v = fallback;
  TORCH_CHECK(v.size() == 1 || v.size() == n, op, ": ", what, " must be a single int or a tuple of ", n,
              " ints, got ", v);
  return v.size() == 1 ? std::vector<int64_t>(n, v[0]) : vec(v);
}

std::vector<int64_t> spatial(const at::Tensor& t, size_t n) {
  return std::vector<int64_t>(t.sizes().end() - static_cast<int64_t>(n), t.sizes().end());
}

at::Tensor undefined_unless(bool keep, const at::Tensor& t) { return keep ? t : at::Tensor(); }

// ---------------------------------------------------------------- convolution

L::ConvParams conv_params(size_t n, c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                          int64_t groups) {
  L::ConvParams p;
  p.stride = expand_param(stride, n, "convolution", "stride");
  p.padding = expand_param(padding, n, "convolution", "padding");
  p.dilation = expand_param(dilation, n, "convolution", "dilation");
  p.groups = groups;
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK(p.stride[i] > 0, "convolution: non-positive stride is not supported");
    TORCH_CHECK(p.padding[i] >= 0, "convolution: negative padding is not supported");
    TORCH_CHECK(p.dilation[i] > 0, "convolution: dilation should be greater than zero");
  }
  TORCH_CHECK(groups > 0, "convolution: non-positive groups is not supported");
  return p;
}

// In ATen's order of checks, with its wording (callers match it).
// ATen's convolution backends lay out the result and both gradients channels-last when the
// input or the weight is (determine_backend_memory_format).
at::MemoryFormat conv_layout(const at::Tensor& input, const at::Tensor& weight) {
  if (input.dim() != 4 && input.dim() != 5) return at::MemoryFormat::Contiguous;
  const at::MemoryFormat cl = input.dim() == 4 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::ChannelsLast3d;
  return input.suggest_memory_format() == cl || weight.suggest_memory_format() == cl ? cl : at::MemoryFormat::Contiguous;
}

void check_conv(const at::Tensor& input, const at::Tensor& weight, bool transposed, int64_t groups) {
  TORCH_CHECK(weight.dim() >= 3, "convolution: weight should have at least three dimensions, got ", weight.sizes());
  TORCH_CHECK(weight.dim() == input.dim() && input.dim() <= 5, "convolution: Expected ", weight.dim(),
              "-dimensional input for ", weight.dim(), "-dimensional weight ", weight.sizes(), ", but got ",
              input.dim(), "-dimensional input of size ", input.sizes(), " instead");
  TORCH_CHECK(transposed || weight.size(0) >= groups, "convolution: Given groups=", groups,
              ", expected weight to be at least ", groups, " at dimension 0, but got weight of size ", weight.sizes(),
              " instead");
  TORCH_CHECK(input.scalar_type() == weight.scalar_type(), "convolution: input type (", input.scalar_type(),
              ") and weight type (", weight.scalar_type(), ") should be the same");
  int64_t in_channels = transposed ? weight.size(0) : weight.size(1) * groups;
  TORCH_CHECK(input.size(1) == in_channels, "convolution: Given groups=", groups, ", weight of size ",
              weight.sizes(), ", expected input", input.sizes(), " to have ", in_channels,
              " channels, but got ", input.size(1), " channels instead");
  TORCH_CHECK(weight.size(0) % (transposed ? groups : groups) == 0, "convolution: weight's first dimension ",
              weight.size(0), " is not divisible by groups=", groups);
}

at::Tensor convolution_fn(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                          c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                          bool transposed, c10::IntArrayRef output_padding, int64_t groups) {
  // The parameters first, as torch checks them (a bad stride is named before a channel mismatch).
  size_t n = input.dim() >= 3 ? input.dim() - 2 : 1;
  auto p = conv_params(n, stride, padding, dilation, groups);
  check_conv(input, weight, transposed, groups);
  OpBuilder op("aten::convolution");
  auto& b = op.b();
  Value x = op.input(input), w = op.input(weight);
  Value y;
  if (!transposed) {
    auto out = L::conv_output_size(spatial(input, n), spatial(weight, n), p);
    for (int64_t o : out) {
      TORCH_CHECK(o > 0, "convolution: calculated output size ", c10::IntArrayRef(out),
                  " is too small for input of size ", input.sizes(), " and kernel ", weight.sizes());
    }
    y = L::conv_forward(b, x, w, p);
  } else {
    auto op_pad = expand_param(output_padding, n, "conv_transpose", "output_padding");
    std::vector<int64_t> out;
    for (size_t i = 0; i < n; ++i) {
      TORCH_CHECK(op_pad[i] < p.stride[i] || op_pad[i] < p.dilation[i],
                  "conv_transpose: output padding must be smaller than either stride or dilation");
      out.push_back((input.size(2 + i) - 1) * p.stride[i] - 2 * p.padding[i] + p.dilation[i] * (weight.size(2 + i) - 1) +
                    op_pad[i] + 1);
    }
    y = L::conv_input_grad(b, x, w, p, out);
  }
  if (bias && bias->defined()) {
    y = b.binary("add", y, b.broadcast_in_dim(b.convert(op.input(*bias), b.dtype(y)), b.dims(y), {1}));
  }
  return finish(op, y, input.scalar_type(), nullptr, conv_layout(input, weight));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_impl(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, int64_t groups, std::array<bool, 3> mask) {
  // The parameters first, as torch checks them (a bad stride is named before a channel mismatch).
  size_t n = input.dim() >= 3 ? input.dim() - 2 : 1;
  auto p = conv_params(n, stride, padding, dilation, groups);
  check_conv(input, weight, transposed, groups);
  OpBuilder op("aten::convolution_backward");
  auto& b = op.b();
  Value g = op.input(grad), x = op.input(input), w = op.input(weight);
  at::Tensor gi, gw, gb;
  if (mask[0]) {
    Value v = transposed ? L::conv_forward(b, g, w, p) : L::conv_input_grad(b, g, w, p, spatial(input, n));
    if (transposed) {
      // output_padding >= stride (allowed when < dilation) gives the forward conv extra rows: drop them.
      std::vector<int64_t> limit = vec(input.sizes());
      if (b.dims(v) != limit) v = b.slice(v, std::vector<int64_t>(limit.size(), 0), limit, std::vector<int64_t>(limit.size(), 1));
    }
    gi = op.output(v, input.scalar_type(), conv_layout(input, weight));
  }
  if (mask[1]) {
    Value v = transposed ? L::conv_weight_grad(b, g, x, p, spatial(weight, n))
                         : L::conv_weight_grad(b, x, g, p, spatial(weight, n));
    gw = op.output(v, weight.scalar_type(), conv_layout(input, weight));
  }
  if (mask[2]) {
    std::vector<int64_t> dims{0};
    for (int64_t i = 2; i < grad.dim(); ++i) dims.push_back(i);
    gb = op.output(L::sum(b, g, dims, false, b.dtype(g)), grad.scalar_type());
  }
  op.run();
  return {gi, gw, gb};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_fn(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight, at::OptionalIntArrayRef,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef,
    int64_t groups, std::array<bool, 3> mask) {
  return convolution_backward_impl(grad, input, weight, stride, padding, dilation, transposed, groups, mask);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable_fn(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef, int64_t groups,
    std::array<bool, 3> mask) {
  return convolution_backward_impl(grad, input, weight, stride, padding, dilation, transposed, groups, mask);
}

// ---------------------------------------------------------------- pooling

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

// ---------------------------------------------------------------- im2col / col2im, pixel shuffles

L::Im2ColParams im2col_params(c10::IntArrayRef k, c10::IntArrayRef d, c10::IntArrayRef p, c10::IntArrayRef s) {
  L::Im2ColParams r{expand_param(k, 2, "im2col", "kernel_size"), expand_param(d, 2, "im2col", "dilation"),
                    expand_param(p, 2, "im2col", "padding"), expand_param(s, 2, "im2col", "stride")};
  for (size_t i = 0; i < 2; ++i) {
    TORCH_CHECK(r.kernel[i] > 0 && r.dilation[i] > 0 && r.stride[i] > 0 && r.padding[i] >= 0,
                "im2col/col2im: kernel size, dilation and stride should be greater than zero, padding non-negative");
  }
  return r;
}

at::Tensor im2col_fn(const at::Tensor& self, c10::IntArrayRef k, c10::IntArrayRef d, c10::IntArrayRef p,
                     c10::IntArrayRef s) {
  TORCH_CHECK(self.dim() == 3 || self.dim() == 4, "im2col: expected 3D or 4D input, got ", self.sizes());
  auto params = im2col_params(k, d, p, s);
  auto blocks = L::im2col_blocks(spatial(self, 2), params);
  TORCH_CHECK(blocks[0] > 0 && blocks[1] > 0, "im2col: given input with spatial size ", spatial(self, 2),
              ", the calculated shape of the array of sliding blocks is ", c10::IntArrayRef(blocks), ", which is too small");
  OpBuilder op("aten::im2col");
  auto& b = op.b();
  Value x = op.input(self);
  if (self.dim() == 3) x = b.reshape(x, {1, self.size(0), self.size(1), self.size(2)});
  Value r = L::im2col(b, x, params);
  if (self.dim() == 3) r = b.reshape(r, {b.dims(r)[1], b.dims(r)[2]});
  return finish(op, r, self.scalar_type(), nullptr);
}

at::Tensor col2im_fn(const at::Tensor& self, c10::IntArrayRef output_size, c10::IntArrayRef k, c10::IntArrayRef d,
                     c10::IntArrayRef p, c10::IntArrayRef s) {
  TORCH_CHECK(self.dim() == 2 || self.dim() == 3, "col2im: expected 2D or 3D input, got ", self.sizes());
  auto params = im2col_params(k, d, p, s);
  auto out = expand_param(output_size, 2, "col2im", "output_size");
  auto blocks = L::im2col_blocks(out, params);
  int64_t kk = params.kernel[0] * params.kernel[1];
  int64_t cols = self.size(-2), len = self.size(-1);
  TORCH_CHECK(cols % kk == 0, "col2im: expected size of input's dimension 1 to be divisible by the product of kernel_size, but got input.size(1)=",
              cols, " and kernel_size=", k);
  TORCH_CHECK(len == blocks[0] * blocks[1], "col2im: given output_size=", output_size, ", kernel_size=", k, ", dilation=", d,
              ", padding=", p, ", stride=", s, ", expected size of input's dimension 2 to match the calculated number of sliding blocks ",
              blocks[0], " * ", blocks[1], " = ", blocks[0] * blocks[1], ", but got input.size(2)=", len, ".");
  OpBuilder op("aten::col2im");
  auto& b = op.b();
  Value x = op.input(self);
  if (self.dim() == 2) x = b.reshape(x, {1, cols, len});
  Value r = L::col2im(b, x, out, params);
  if (self.dim() == 2) r = b.reshape(r, {cols / kk, out[0], out[1]});
  return finish(op, r, self.scalar_type(), nullptr);
}

// pixel_shuffle / pixel_unshuffle / channel_shuffle: pure reshapes and transposes.
at::Tensor regroup(const char* name, const at::Tensor& self, const std::vector<int64_t>& split,
                   const std::vector<int64_t>& perm, const std::vector<int64_t>& out) {
  OpBuilder op(std::string("aten::") + name);
  auto& b = op.b();
  Value r = b.reshape(b.transpose(b.reshape(op.input(self), split), perm), out);
  return finish(op, r, self.scalar_type(), nullptr);
}
at::Tensor pixel_shuffle_fn(const at::Tensor& self, int64_t r) {
  TORCH_CHECK(self.dim() >= 3, "pixel_shuffle expects input to have at least 3 dimensions, but got input with ", self.dim(), " dimension(s)");
  TORCH_CHECK(r > 0, "pixel_shuffle expects a positive upscale_factor, but got ", r);
  int64_t c = self.size(-3), h = self.size(-2), w = self.size(-1);
  TORCH_CHECK(c % (r * r) == 0, "pixel_shuffle expects its input's 'channel' dimension to be divisible by the square of upscale_factor, but input.size(-3)=",
              c, " is not divisible by ", r * r);
  std::vector<int64_t> lead(self.sizes().begin(), self.sizes().end() - 3);
  int64_t l = static_cast<int64_t>(lead.size());
  std::vector<int64_t> split = lead, out = lead, perm;
  split.insert(split.end(), {c / (r * r), r, r, h, w});
  out.insert(out.end(), {c / (r * r), h * r, w * r});
  for (int64_t i = 0; i < l; ++i) perm.push_back(i);
  perm.insert(perm.end(), {l, l + 3, l + 1, l + 4, l + 2});
  return regroup("pixel_shuffle", self, split, perm, out);
}
at::Tensor pixel_unshuffle_fn(const at::Tensor& self, int64_t r) {
  TORCH_CHECK(self.dim() >= 3, "pixel_unshuffle expects input to have at least 3 dimensions, but got input with ", self.dim(), " dimension(s)");
  TORCH_CHECK(r > 0, "pixel_unshuffle expects a positive downscale_factor, but got ", r);
  int64_t c = self.size(-3), h = self.size(-2), w = self.size(-1);
  TORCH_CHECK(h % r == 0 && w % r == 0, "pixel_unshuffle expects height and width to be divisible by downscale_factor, got ",
              self.sizes(), " and ", r);
  std::vector<int64_t> lead(self.sizes().begin(), self.sizes().end() - 3);
  int64_t l = static_cast<int64_t>(lead.size());
  std::vector<int64_t> split = lead, out = lead, perm;
  split.insert(split.end(), {c, h / r, r, w / r, r});
  out.insert(out.end(), {c * r * r, h / r, w / r});
  for (int64_t i = 0; i < l; ++i) perm.push_back(i);
  perm.insert(perm.end(), {l, l + 2, l + 4, l + 1, l + 3});
  return regroup("pixel_unshuffle", self, split, perm, out);
}
at::Tensor channel_shuffle_fn(const at::Tensor& self, int64_t groups) {
  TORCH_CHECK(self.dim() > 2, "channel_shuffle expects input to have at least 3 dimensions, but got input with ", self.dim(), " dimension(s)");
  TORCH_CHECK(groups > 0 && self.size(1) % groups == 0, "channel_shuffle expects number of channels (", self.size(1),
              ") to be divisible by groups (", groups, ")");
  std::vector<int64_t> split{self.size(0), groups, self.size(1) / groups}, perm{0, 2, 1};
  for (int64_t i = 2; i < self.dim(); ++i) {
    split.push_back(self.size(i));
    perm.push_back(i + 1);
  }
  return regroup("channel_shuffle", self, split, perm, vec(self.sizes()));
}

// ---------------------------------------------------------------- normalization

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

// ---------------------------------------------------------------- resampling

enum class Resample { Nearest, NearestExact, Linear, Cubic, LinearAA, CubicAA };

// Resamples the trailing output_size.size() dims of x (or, backward, maps a gradient back).
Value resample(Builder& b, Value x, const std::vector<int64_t>& in, const std::vector<int64_t>& out,
               const std::vector<double>& scales, Resample mode, bool align_corners, bool backward) {
  size_t n = out.size(), lead = b.dims(x).size() - n;
  ir::DType dt = b.dtype(x);
  bool weighted = mode != Resample::Nearest && mode != Resample::NearestExact;
  Value r = weighted ? b.convert(x, L::accumulate_type(dt)) : x;
  for (size_t i = 0; i < n; ++i) {
    int64_t dim = static_cast<int64_t>(lead + i);
    double scale = i < scales.size() ? scales[i] : -1.0;
    if (weighted) {
      auto m = mode == Resample::Linear  ? L::linear_weights(in[i], out[i], align_corners, scale)
               : mode == Resample::Cubic ? L::cubic_weights(in[i], out[i], align_corners, scale)
                                         : L::antialias_weights(in[i], out[i], align_corners, scale, mode == Resample::CubicAA);
      r = backward ? L::apply_along(b, r, dim, L::transpose_matrix(m, out[i], in[i]), in[i], out[i])
                   : L::apply_along(b, r, dim, m, out[i], in[i]);
    } else {
      auto idx = L::nearest_indices(in[i], out[i], scale, mode == Resample::NearestExact);
      r = backward ? L::take_along_backward(b, r, dim, idx, in[i]) : L::take_along(b, r, dim, idx);
    }
  }
  return b.convert(r, dt);
}

std::vector<double> scale_list(std::initializer_list<std::optional<double>> scales) {
  std::vector<double> s;
  for (const auto& v : scales) s.push_back(v ? *v : -1.0);
  return s;
}

at::Tensor upsample_fn(const char* name, const at::Tensor& self, c10::IntArrayRef output_size,
                       const std::vector<double>& scales, Resample mode, bool align_corners) {
  size_t n = output_size.size();
  TORCH_CHECK(self.dim() == static_cast<int64_t>(n) + 2, name, ": expected ", n + 2, "D input, got ", self.sizes());
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK(output_size[i] > 0 && self.size(2 + i) > 0, name, ": input and output sizes should be greater than 0, but got input ",
                self.sizes(), " output ", output_size);
  }
  OpBuilder op(std::string("aten::") + name);
  Value r = resample(op.b(), op.input(self), spatial(self, n), vec(output_size), scales, mode, align_corners, false);
  return finish(op, r, self.scalar_type(), nullptr);
}

at::Tensor upsample_backward_fn(const char* name, const at::Tensor& grad, c10::IntArrayRef output_size,
                                c10::IntArrayRef input_size, const std::vector<double>& scales, Resample mode,
                                bool align_corners) {
  size_t n = output_size.size();
  OpBuilder op(std::string("aten::") + name);
  std::vector<int64_t> in(input_size.end() - static_cast<int64_t>(n), input_size.end());
  Value r = resample(op.b(), op.input(grad), in, vec(output_size), scales, mode, align_corners, true);
  return finish(op, r, grad.scalar_type(), nullptr);
}

#define NEAREST_KERNELS(PREFIX, N, MODE, SCALE_PARAMS, SCALE_ARGS)                                               \
  at::Tensor PREFIX##N##d_fn(const at::Tensor& s, c10::IntArrayRef o, SCALE_PARAMS) {                           \
    return upsample_fn(#PREFIX #N "d", s, o, scale_list(SCALE_ARGS), MODE, false);                               \
  }                                                                                                              \
  at::Tensor PREFIX##N##d_backward_fn(const at::Tensor& g, c10::IntArrayRef o, c10::IntArrayRef i, SCALE_PARAMS) { \
    return upsample_backward_fn(#PREFIX #N "d_backward", g, o, i, scale_list(SCALE_ARGS), MODE, false);          \
  }
#define WEIGHTED_KERNELS(NAME, MODE, SCALE_PARAMS, SCALE_ARGS)                                                    \
  at::Tensor NAME##_fn(const at::Tensor& s, c10::IntArrayRef o, bool ac, SCALE_PARAMS) {                          \
    return upsample_fn(#NAME, s, o, scale_list(SCALE_ARGS), MODE, ac);                                            \
  }                                                                                                               \
  at::Tensor NAME##_backward_fn(const at::Tensor& g, c10::IntArrayRef o, c10::IntArrayRef i, bool ac,             \
                                SCALE_PARAMS) {                                                                   \
    return upsample_backward_fn(#NAME "_backward", g, o, i, scale_list(SCALE_ARGS), MODE, ac);                   \
  }
#define P1 std::optional<double> s1
#define P2 std::optional<double> s1, std::optional<double> s2
#define P3 std::optional<double> s1, std::optional<double> s2, std::optional<double> s3
#define A1 {s1}
#define COMMA ,
NEAREST_KERNELS(upsample_nearest, 1, Resample::Nearest, P1, A1)
NEAREST_KERNELS(upsample_nearest, 2, Resample::Nearest, P2, {s1 COMMA s2})
NEAREST_KERNELS(upsample_nearest, 3, Resample::Nearest, P3, {s1 COMMA s2 COMMA s3})
NEAREST_KERNELS(_upsample_nearest_exact, 1, Resample::NearestExact, P1, A1)
NEAREST_KERNELS(_upsample_nearest_exact, 2, Resample::NearestExact, P2, {s1 COMMA s2})
NEAREST_KERNELS(_upsample_nearest_exact, 3, Resample::NearestExact, P3, {s1 COMMA s2 COMMA s3})
WEIGHTED_KERNELS(upsample_linear1d, Resample::Linear, P1, A1)
WEIGHTED_KERNELS(upsample_bilinear2d, Resample::Linear, P2, {s1 COMMA s2})
WEIGHTED_KERNELS(upsample_trilinear3d, Resample::Linear, P3, {s1 COMMA s2 COMMA s3})
WEIGHTED_KERNELS(upsample_bicubic2d, Resample::Cubic, P2, {s1 COMMA s2})
WEIGHTED_KERNELS(_upsample_bilinear2d_aa, Resample::LinearAA, P2, {s1 COMMA s2})
WEIGHTED_KERNELS(_upsample_bicubic2d_aa, Resample::CubicAA, P2, {s1 COMMA s2})

// ---------------------------------------------------------------- padding

enum class PadMode { Reflect, Replicate };

at::Tensor pad_fn(const char* name, const at::Tensor& self, c10::IntArrayRef padding, PadMode mode,
                  const at::Tensor* grad) {
  size_t n = padding.size() / 2;
  TORCH_CHECK(self.dim() == static_cast<int64_t>(n) + 1 || self.dim() == static_cast<int64_t>(n) + 2, name,
              ": expected ", n + 1, "D or ", n + 2, "D input, got ", self.sizes());
  OpBuilder op(std::string("aten::") + name);
  auto& b = op.b();
  Value r = op.input(grad ? *grad : self);
  for (size_t i = 0; i < n; ++i) {
    int64_t dim = self.dim() - 1 - static_cast<int64_t>(i);
    int64_t in = self.size(dim), low = padding[2 * i], high = padding[2 * i + 1];
    if (mode == PadMode::Reflect) {
      TORCH_CHECK(low < in && high < in, name, ": padding size should be less than the corresponding input dimension, but got: padding (",
                  low, ", ", high, ") at dimension ", dim, " of input ", self.sizes());
    } else {
      TORCH_CHECK(in > 0 || (low <= 0 && high <= 0), name, ": input dimension ", dim, " is empty");
    }
    TORCH_CHECK(in + low + high > 0, name, ": input size ", in, " with padding (", low, ", ", high,
                ") gives an empty output");
    auto idx = mode == PadMode::Reflect ? L::reflect_indices(in, low, high) : L::replicate_indices(in, low, high);
    r = grad ? L::take_along_backward(b, r, dim, idx, in) : L::take_along(b, r, dim, idx);
  }
  // ATen's pads and their gradients take the input's suggested memory format (channels-last stays so).
  return finish(op, r, self.scalar_type(), nullptr, self.suggest_memory_format());
}

#define PAD_KERNELS(MODE_NAME, MODE, N)                                                                          \
  at::Tensor MODE_NAME##_pad##N##d_fn(const at::Tensor& s, c10::IntArrayRef p) {                                 \
    return pad_fn(#MODE_NAME "_pad" #N "d", s, p, MODE, nullptr);                                                \
  }                                                                                                              \
  at::Tensor MODE_NAME##_pad##N##d_backward_fn(const at::Tensor& g, const at::Tensor& s, c10::IntArrayRef p) {  \
    return pad_fn(#MODE_NAME "_pad" #N "d_backward", s, p, MODE, &g);                                            \
  }
PAD_KERNELS(reflection, PadMode::Reflect, 1)
PAD_KERNELS(reflection, PadMode::Reflect, 2)
PAD_KERNELS(reflection, PadMode::Reflect, 3)
PAD_KERNELS(replication, PadMode::Replicate, 1)
PAD_KERNELS(replication, PadMode::Replicate, 2)
PAD_KERNELS(replication, PadMode::Replicate, 3)

at::Tensor constant_pad_nd_fn(const at::Tensor& self, c10::IntArrayRef pad, const at::Scalar& value) {
  TORCH_CHECK(pad.size() % 2 == 0, "constant_pad_nd: length of pad must be even but instead it equals ", pad.size());
  TORCH_CHECK(static_cast<int64_t>(pad.size() / 2) <= self.dim(), "constant_pad_nd: length of pad should be no more than twice the number of dimensions of the input. Pad length is ",
              pad.size(), " while the input has ", self.dim(), " dimensions.");
  std::vector<int64_t> low(self.dim(), 0), high(self.dim(), 0);
  for (size_t i = 0; i < pad.size() / 2; ++i) {
    int64_t dim = self.dim() - 1 - static_cast<int64_t>(i);
    low[dim] = pad[2 * i];
    high[dim] = pad[2 * i + 1];
    TORCH_CHECK(self.size(dim) + low[dim] + high[dim] >= 0, "constant_pad_nd: the input size ", self.size(dim),
                ", plus negative padding ", low[dim], " and ", high[dim], " resulted in a negative output size");
  }
  OpBuilder op("aten::constant_pad_nd");
  auto& b = op.b();
  Value v = b.convert(op.scalar(value, self.scalar_type()), to_ir(self.scalar_type()));
  Value r = b.pad(op.input(self), v, low, high, std::vector<int64_t>(self.dim(), 0));
  bool narrows_only = std::all_of(pad.begin(), pad.end(), [](int64_t p) { return p <= 0; });
  if (narrows_only && self.dim() > 0) {
    // ATen narrows and clones: the clone keeps the input's dim order, dense.
    Layout layout;
    layout.strides = at::infer_dense_strides(b.dims(r), self.strides());
    return finish(op, r, self.scalar_type(), nullptr, layout);
  }
  return finish(op, r, self.scalar_type(), nullptr, self.suggest_memory_format());  // as ATen lays it out
}

// ---------------------------------------------------------------- shape

at::Tensor flip_fn(const at::Tensor& self, c10::IntArrayRef dims) {
  std::vector<int64_t> d;
  for (int64_t x : dims) d.push_back(at::maybe_wrap_dim(x, std::max<int64_t>(self.dim(), 1)));
  std::sort(d.begin(), d.end());
  TORCH_CHECK(std::adjacent_find(d.begin(), d.end()) == d.end(), "flip: dims has duplicates, original flip dims size=",
              dims.size());
  OpBuilder op("aten::flip");
  Value r = self.dim() == 0 ? op.input(self) : op.b().reverse(op.input(self), d);
  return finish(op, r, self.scalar_type(), nullptr);
}

at::Tensor roll_fn(const at::Tensor& self, c10::IntArrayRef shifts, c10::IntArrayRef dims) {
  TORCH_CHECK(!shifts.empty(), "roll: `shifts` required");
  TORCH_CHECK(dims.empty() ? shifts.size() == 1 : shifts.size() == dims.size(), "roll: shifts and dimensions must align. shifts: ",
              shifts.size(), ", dims:", dims.size());
  OpBuilder op("aten::roll");
  auto& b = op.b();
  Value x = op.input(self);
  auto roll_dim = [&b](Value v, int64_t dim, int64_t shift) {
    int64_t n = b.dims(v)[dim];
    if (n == 0) return v;
    shift = ((shift % n) + n) % n;
    if (shift == 0) return v;
    return b.concatenate({b.slice_dim(v, dim, n - shift, n), b.slice_dim(v, dim, 0, n - shift)}, dim);
  };
  if (dims.empty()) {
    Value flat = b.reshape(x, {self.numel()});
    x = b.reshape(roll_dim(flat, 0, shifts[0]), vec(self.sizes()));
  } else {
    for (size_t i = 0; i < dims.size(); ++i) {
      x = roll_dim(x, at::maybe_wrap_dim(dims[i], self.dim(), /*wrap_scalar=*/false), shifts[i]);
    }
  }
  return finish(op, x, self.scalar_type(), nullptr);
}

at::Tensor repeat_fn(const at::Tensor& self, c10::IntArrayRef repeats) {
  TORCH_CHECK(static_cast<int64_t>(repeats.size()) >= self.dim(), "Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor");
  for (int64_t r : repeats) TORCH_CHECK(r >= 0, "repeat: repeats can not be negative, got ", repeats);
  size_t n = repeats.size();
  std::vector<int64_t> padded(n - self.dim(), 1);
  for (int64_t s : self.sizes()) padded.push_back(s);
  // Broadcast [d0, d1, ...] to [r0, d0, r1, d1, ...], then merge pairs.
  std::vector<int64_t> wide, mapping, out;
  for (size_t i = 0; i < n; ++i) {
    wide.push_back(repeats[i]);
    wide.push_back(padded[i]);
    mapping.push_back(static_cast<int64_t>(2 * i + 1));
    out.push_back(repeats[i] * padded[i]);
  }
  OpBuilder op("aten::repeat");
  auto& b = op.b();
  Value x = b.reshape(op.input(self), padded);
  Value r = b.reshape(b.broadcast_in_dim(x, wide, mapping), out);
  return finish(op, r, self.scalar_type(), nullptr);
}

// ---------------------------------------------------------------- scans and sorting

at::Tensor scan_fn(const char* name, const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype,
                   const std::string& kind, const at::Tensor* into) {
  at::ScalarType out = dtype ? *dtype
                             : (into ? into->scalar_type()
                                     : (at::isIntegralType(self.scalar_type(), true) && kind != "logsumexp"
                                            ? at::kLong
                                            : self.scalar_type()));
  if (kind == "logsumexp") {
    TORCH_CHECK(at::isFloatingType(self.scalar_type()) || at::isComplexType(self.scalar_type()),
                "logcumsumexp: expected a floating point or complex input, got ", self.scalar_type());
  }
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  OpBuilder op(std::string("aten::") + name);
  auto& b = op.b();
  ir::DType acc = L::accumulate_type(to_ir(out));
  Value x = b.convert(op.input(self), acc);
  if (self.dim() == 0) x = b.reshape(x, {1});
  Value r = L::cumulative(b, x, d, kind);
  if (self.dim() == 0) r = b.reshape(r, {});
  return finish(op, b.convert(r, to_ir(out)), out, into);
}
#define SCAN_KERNELS(NAME, KIND)                                                                       \
  at::Tensor NAME##_fn(const at::Tensor& s, int64_t d, std::optional<at::ScalarType> t) {                 \
    return scan_fn(#NAME, s, d, t, KIND, nullptr);                                                        \
  }                                                                                                       \
  at::Tensor& NAME##_out(const at::Tensor& s, int64_t d, std::optional<at::ScalarType> t, at::Tensor& o) { \
    scan_fn(#NAME, s, d, t, KIND, &o);                                                                    \
    return o;                                                                                             \
  }                                                                                                       \
  at::Tensor& NAME##_inplace(at::Tensor& s, int64_t d, std::optional<at::ScalarType> t) {                 \
    scan_fn(#NAME, s, d, t, KIND, &s);                                                                    \
    return s;                                                                                             \
  }
SCAN_KERNELS(cumsum, "sum")
SCAN_KERNELS(cumprod, "prod")
#undef SCAN_KERNELS
at::Tensor logcumsumexp_fn(const at::Tensor& s, int64_t d) {
  return scan_fn("logcumsumexp", s, d, std::nullopt, "logsumexp", nullptr);
}
at::Tensor& logcumsumexp_out(const at::Tensor& s, int64_t d, at::Tensor& out) {
  scan_fn("logcumsumexp", s, d, std::nullopt, "logsumexp", &out);
  return out;
}

std::tuple<at::Tensor, at::Tensor> cum_extreme_fn(const at::Tensor& self, int64_t dim, bool is_max) {
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  OpBuilder op(is_max ? "aten::cummax" : "aten::cummin");
  auto& b = op.b();
  Value x = op.input(self);
  if (self.dim() == 0) x = b.reshape(x, {1});
  auto r = L::cum_extreme(b, x, d, is_max);
  if (self.dim() == 0) {
    r[0] = b.reshape(r[0], {});
    r[1] = b.reshape(r[1], {});
  }
  at::Tensor v = op.output(r[0], self.scalar_type());
  at::Tensor i = op.output(r[1], at::kLong);
  op.run();
  return {v, i};
}
std::tuple<at::Tensor, at::Tensor> cummax_fn(const at::Tensor& s, int64_t d) { return cum_extreme_fn(s, d, true); }
std::tuple<at::Tensor, at::Tensor> cummin_fn(const at::Tensor& s, int64_t d) { return cum_extreme_fn(s, d, false); }
void cummax_helper_fn(const at::Tensor& s, at::Tensor& values, at::Tensor& indices, int64_t d) {
  auto [v, i] = cum_extreme_fn(s, d, true);
  values.copy_(v);
  indices.copy_(i);
}
void cummin_helper_fn(const at::Tensor& s, at::Tensor& values, at::Tensor& indices, int64_t d) {
  auto [v, i] = cum_extreme_fn(s, d, false);
  values.copy_(v);
  indices.copy_(i);
}

// Sorts along dim and keeps positions [start, start + count) of the sorted order.
std::tuple<at::Tensor, at::Tensor> sorted_slice(const char* name, const at::Tensor& self, int64_t dim,
                                                bool descending, int64_t start, int64_t count, bool keepdim) {
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  OpBuilder op(std::string("aten::") + name);
  auto& b = op.b();
  Value x = op.input(self);
  if (self.dim() == 0) x = b.reshape(x, {1});
  auto r = L::sort_with_indices(b, x, d, descending);
  int64_t n = b.dims(x)[d];
  if (start != 0 || count != n) {
    r[0] = b.slice_dim(r[0], d, start, start + count);
    r[1] = b.slice_dim(r[1], d, start, start + count);
  }
  if (self.dim() == 0 || !keepdim) {
    // Only single-position slices (kthvalue) drop the dim.
    std::vector<int64_t> shape = vec(self.sizes());
    if (self.dim() > 0) shape.erase(shape.begin() + d);
    r[0] = b.reshape(r[0], shape);
    r[1] = b.reshape(r[1], shape);
  }
  at::Tensor v = op.output(r[0], self.scalar_type());
  at::Tensor i = op.output(r[1], at::kLong);
  op.run();
  return {v, i};
}

std::tuple<at::Tensor, at::Tensor> sort_fn(const at::Tensor& self, int64_t dim, bool descending) {
  int64_t n = self.dim() == 0 ? 1 : self.size(at::maybe_wrap_dim(dim, self.dim()));
  return sorted_slice("sort", self, dim, descending, 0, n, true);
}
std::tuple<at::Tensor, at::Tensor> sort_stable_fn(const at::Tensor& self, std::optional<bool>, int64_t dim,
                                                  bool descending) {
  return sort_fn(self, dim, descending);
}
std::tuple<at::Tensor&, at::Tensor&> sort_values_stable_fn(const at::Tensor& self, std::optional<bool>, int64_t dim,
                                                           bool descending, at::Tensor& values, at::Tensor& indices) {
  auto [v, i] = sort_fn(self, dim, descending);
  write_outs("sort", {v, i}, {values, indices});  // values may be self (ATen sorts into its input)
  return {values, indices};
}

std::tuple<at::Tensor, at::Tensor> topk_fn(const at::Tensor& self, int64_t k, int64_t dim, bool largest, bool) {
  int64_t n = self.dim() == 0 ? 1 : self.size(at::maybe_wrap_dim(dim, self.dim()));
  TORCH_CHECK(k >= 0 && k <= n, "selected index k out of range");
  return sorted_slice("topk", self, dim, largest, 0, k, true);
}
std::tuple<at::Tensor&, at::Tensor&> topk_out(const at::Tensor& self, int64_t k, int64_t dim, bool largest,
                                              bool sorted, at::Tensor& values, at::Tensor& indices) {
  auto [v, i] = topk_fn(self, k, dim, largest, sorted);
  write_outs("topk", {v, i}, {values, indices});
  return {values, indices};
}

std::tuple<at::Tensor, at::Tensor> kthvalue_fn(const at::Tensor& self, int64_t k, int64_t dim, bool keepdim) {
  int64_t n = self.dim() == 0 ? 1 : self.size(at::maybe_wrap_dim(dim, self.dim()));
  check_reduction_dim_nonempty("kthvalue", self, at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1)));
  TORCH_CHECK(k >= 1 && k <= n, "kthvalue(): selected number k out of range for dimension ", dim);
  return sorted_slice("kthvalue", self, dim, false, k - 1, 1, keepdim);
}

// median / nanmedian along dim: the lower median; a NaN in the row makes median NaN
// (its first NaN), nanmedian ignores NaNs.
std::tuple<at::Tensor, at::Tensor> median_impl(const at::Tensor& self, int64_t dim, bool keepdim, bool ignore_nan) {
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  check_reduction_dim_nonempty("median", self, d);  // ATen names nanmedian "median" here too
  OpBuilder op(ignore_nan ? "aten::nanmedian" : "aten::median");
  auto& b = op.b();
  Value x = op.input(self);
  if (self.dim() == 0) x = b.reshape(x, {1});
  auto sorted = L::sort_with_indices(b, x, d, false);
  auto xd = b.dims(x);
  int64_t n = xd[d];
  std::vector<int64_t> kept = xd;
  kept[d] = 1;
  Value pos;
  if (ir::is_floating(b.dtype(x))) {
    Value not_nan = b.convert(b.compare(x, x, "EQ"), ir::DType::S64);
    Value count = b.reshape(L::sum(b, not_nan, {d}, true, ir::DType::S64), kept);
    if (ignore_nan) {
      Value half = b.binary("divide", b.binary("subtract", count, b.scalar_like(count, 1)), b.scalar_like(count, 2));
      pos = b.binary("maximum", half, b.scalar_like(count, 0));
    } else {
      Value has_nan = b.compare(count, b.scalar_like(count, static_cast<double>(n)), "LT");
      pos = b.select(has_nan, count, b.constant_int(ir::DType::S64, (n - 1) / 2, kept));
    }
  } else {
    pos = b.constant_int(ir::DType::S64, (n - 1) / 2, kept);
  }
  Value v = L::gather(b, sorted[0], d, pos), i = L::gather(b, sorted[1], d, pos);
  std::vector<int64_t> shape = vec(self.sizes());
  if (self.dim() > 0) {
    if (keepdim) shape[d] = 1;
    else shape.erase(shape.begin() + d);
  }
  at::Tensor values = op.output(b.reshape(v, shape), self.scalar_type());
  at::Tensor indices = op.output(b.reshape(i, shape), at::kLong);
  op.run();
  return {values, indices};
}
std::tuple<at::Tensor, at::Tensor> median_dim_fn(const at::Tensor& s, int64_t d, bool k) {
  return median_impl(s, d, k, false);
}
std::tuple<at::Tensor, at::Tensor> nanmedian_dim_fn(const at::Tensor& s, int64_t d, bool k) {
  return median_impl(s, d, k, true);
}
at::Tensor median_all_fn(const at::Tensor& s) {
  if (s.numel() == 0) return at::full({}, NAN, s.options());  // as ATen: NaN (cast to the dtype)
  return std::get<0>(median_impl(s.reshape({-1}), 0, false, false));
}
at::Tensor nanmedian_all_fn(const at::Tensor& s) {
  if (s.numel() == 0) return at::full({}, NAN, s.options());
  return std::get<0>(median_impl(s.reshape({-1}), 0, false, true));
}

// ---------------------------------------------------------------- losses

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

}  // namespace

// ---------------------------------------------------------------- recurrent cells
// nn.LSTM / nn.GRU (and their cells) call these with the gate projections done.
namespace {
bool defined(const std::optional<at::Tensor>& t) { return t && t->defined(); }
// An optional operand: its value in `slot`, or null when absent.
const Value* optional_input(OpBuilder& op, const std::optional<at::Tensor>& t, Value* slot) {
  if (!defined(t)) return nullptr;
  *slot = op.input(*t);
  return slot;
}

void check_cell(const char* name, const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                const at::Tensor& state, int64_t gates) {
  TORCH_CHECK(input_gates.dim() == 2 && state.dim() == 2 && input_gates.sizes() == hidden_gates.sizes() &&
                  input_gates.size(0) == state.size(0) && input_gates.size(1) == gates * state.size(1),
              name, ": expected gates of shape [batch, ", gates, " * hidden] and a state [batch, hidden], got ",
              input_gates.sizes(), ", ", hidden_gates.sizes(), " and ", state.sizes());
}
// ---------------------------------------------------------------- grid sampling

// spatial: 2 or 3 (grid_sampler_2d / _3d), with CPU's checks and messages.
void check_grid_sampler(const at::Tensor& input, const at::Tensor& grid, int64_t mode, int64_t padding, int64_t spatial) {
  int64_t rank = spatial + 2;
  TORCH_CHECK(input.dim() == rank && grid.dim() == rank, "grid_sampler(): expected ", rank,
              "D input and grid with same number of dimensions, but got input with sizes ", input.sizes(),
              " and grid with sizes ", grid.sizes());
  TORCH_CHECK(input.size(0) == grid.size(0), "grid_sampler(): expected grid and input to have same batch size, but got input with sizes ",
              input.sizes(), " and grid with sizes ", grid.sizes());
  TORCH_CHECK(grid.size(-1) == spatial, "grid_sampler(): expected grid to have size ", spatial,
              " in last dimension, but got grid with sizes ", grid.sizes());
  TORCH_CHECK(mode >= 0 && mode <= 2 && padding >= 0 && padding <= 2, "grid_sampler(): unknown interpolation or padding mode");
  TORCH_CHECK(spatial == 2 || mode != 2, "grid_sampler(): bicubic interpolation only supports 4D input");
  for (int64_t d = 2; d < rank; ++d) {
    TORCH_CHECK(input.size(d) > 0, "grid_sampler(): expected input to have non-empty spatial dimensions, but input has sizes ",
                input.sizes(), " with dimension ", d, " being empty");
  }
}

at::Tensor grid_sampler_fn(const char* name, int64_t spatial, const at::Tensor& input, const at::Tensor& grid,
                           int64_t mode, int64_t padding, bool align) {
  check_grid_sampler(input, grid, mode, padding, spatial);
  OpBuilder op(std::string("aten::") + name);
  auto& b = op.b();
  ir::DType dt = L::accumulate_type(to_ir(input.scalar_type()));
  Value r = L::grid_sample(b, b.convert(op.input(input), dt), op.input(grid), mode, padding, align);
  return finish(op, r, input.scalar_type(), nullptr);
}
at::Tensor grid_sampler_2d_fn(const at::Tensor& input, const at::Tensor& grid, int64_t mode, int64_t padding, bool align) {
  return grid_sampler_fn("grid_sampler_2d", 2, input, grid, mode, padding, align);
}
at::Tensor grid_sampler_3d_fn(const at::Tensor& input, const at::Tensor& grid, int64_t mode, int64_t padding, bool align) {
  return grid_sampler_fn("grid_sampler_3d", 3, input, grid, mode, padding, align);
}

std::tuple<at::Tensor, at::Tensor> grid_sampler_backward_fn(const char* name, int64_t spatial, const at::Tensor& grad,
                                                            const at::Tensor& input, const at::Tensor& grid, int64_t mode,
                                                            int64_t padding, bool align, std::array<bool, 2> mask) {
  check_grid_sampler(input, grid, mode, padding, spatial);
  OpBuilder op(std::string("aten::") + name);
  auto& b = op.b();
  ir::DType dt = L::accumulate_type(to_ir(input.scalar_type()));
  auto r = L::grid_sample_backward(b, op.input(grad), b.convert(op.input(input), dt), op.input(grid), mode, padding, align);
  at::Tensor gi = mask[0] ? op.output(r[0], input.scalar_type()) : at::Tensor();
  at::Tensor gg = mask[1] ? op.output(r[1], grid.scalar_type()) : at::Tensor();
  op.run();
  return {gi, gg};
}
std::tuple<at::Tensor, at::Tensor> grid_sampler_2d_backward_fn(const at::Tensor& grad, const at::Tensor& input,
                                                               const at::Tensor& grid, int64_t mode, int64_t padding,
                                                               bool align, std::array<bool, 2> mask) {
  return grid_sampler_backward_fn("grid_sampler_2d_backward", 2, grad, input, grid, mode, padding, align, mask);
}
std::tuple<at::Tensor, at::Tensor> grid_sampler_3d_backward_fn(const at::Tensor& grad, const at::Tensor& input,
                                                               const at::Tensor& grid, int64_t mode, int64_t padding,
                                                               bool align, std::array<bool, 2> mask) {
  return grid_sampler_backward_fn("grid_sampler_3d_backward", 3, grad, input, grid, mode, padding, align, mask);
}

// ---------------------------------------------------------------- CTC loss

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

// ---------------------------------------------------------------- fractional max pooling

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

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> thnn_fused_lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  check_cell("_thnn_fused_lstm_cell", input_gates, hidden_gates, cx, 4);
  OpBuilder op("aten::_thnn_fused_lstm_cell");
  Value ib, hb;
  auto r = L::lstm_cell(op.b(), op.input(input_gates), op.input(hidden_gates), op.input(cx),
                        optional_input(op, input_bias, &ib), optional_input(op, hidden_bias, &hb));
  const auto dtype = input_gates.scalar_type();
  at::Tensor hy = op.output(r[0], dtype), cy = op.output(r[1], dtype), workspace = op.output(r[2], dtype);
  op.run();
  return {hy, cy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> thnn_fused_lstm_cell_backward_impl(
    const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy, const at::Tensor& cx,
    const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  if (!defined(grad_hy) && !defined(grad_cy)) return {at::Tensor(), at::Tensor(), at::Tensor()};
  OpBuilder op("aten::_thnn_fused_lstm_cell_backward_impl");
  Value ghy, gcy;
  auto r = L::lstm_cell_backward(op.b(), optional_input(op, grad_hy, &ghy), optional_input(op, grad_cy, &gcy),
                                 op.input(cx), op.input(cy), op.input(workspace), has_bias);
  const auto dtype = workspace.scalar_type();
  at::Tensor grad_gates = op.output(r[0], dtype), grad_cx = op.output(r[1], dtype);
  at::Tensor grad_bias = has_bias ? op.output(r[2], dtype) : at::Tensor();
  op.run();
  return {grad_gates, grad_cx, grad_bias};
}

std::tuple<at::Tensor, at::Tensor> thnn_fused_gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                       const at::Tensor& hx,
                                                       const std::optional<at::Tensor>& input_bias,
                                                       const std::optional<at::Tensor>& hidden_bias) {
  check_cell("_thnn_fused_gru_cell", input_gates, hidden_gates, hx, 3);
  OpBuilder op("aten::_thnn_fused_gru_cell");
  Value ib, hb;
  auto r = L::gru_cell(op.b(), op.input(input_gates), op.input(hidden_gates), op.input(hx),
                       optional_input(op, input_bias, &ib), optional_input(op, hidden_bias, &hb));
  const auto dtype = input_gates.scalar_type();
  at::Tensor hy = op.output(r[0], dtype), workspace = op.output(r[1], dtype);
  op.run();
  return {hy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> thnn_fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  OpBuilder op("aten::_thnn_fused_gru_cell_backward");
  auto r = L::gru_cell_backward(op.b(), op.input(grad_hy), op.input(workspace), has_bias);
  const auto dtype = workspace.scalar_type();
  at::Tensor gi = op.output(r[0], dtype), gh = op.output(r[1], dtype), ghx = op.output(r[2], dtype);
  at::Tensor gib = has_bias ? op.output(r[3], dtype) : at::Tensor();
  at::Tensor ghb = has_bias ? op.output(r[4], dtype) : at::Tensor();
  op.run();
  return {gi, gh, ghx, gib, ghb};
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("fractional_max_pool2d", fractional_max_pool2d_fn);
  m.impl("fractional_max_pool2d.output", fractional_max_pool2d_out);
  m.impl("fractional_max_pool3d", fractional_max_pool3d_fn);
  m.impl("fractional_max_pool3d.output", fractional_max_pool3d_out);
  m.impl("fractional_max_pool2d_backward", fractional_max_pool2d_backward_fn);
  m.impl("fractional_max_pool2d_backward.grad_input", fractional_max_pool2d_backward_out);
  m.impl("fractional_max_pool3d_backward", fractional_max_pool3d_backward_fn);
  m.impl("fractional_max_pool3d_backward.grad_input", fractional_max_pool3d_backward_out);
  m.impl("_ctc_loss", ctc_loss_fn);
  m.impl("_ctc_loss.Tensor", ctc_loss_tensor_fn);
  m.impl("_ctc_loss_backward", ctc_loss_backward_fn);
  m.impl("_ctc_loss_backward.Tensor", ctc_loss_backward_tensor_fn);
  m.impl("grid_sampler_2d", grid_sampler_2d_fn);
  m.impl("grid_sampler_2d_backward", grid_sampler_2d_backward_fn);
  m.impl("grid_sampler_3d", grid_sampler_3d_fn);
  m.impl("grid_sampler_3d_backward", grid_sampler_3d_backward_fn);
  m.impl("_thnn_fused_lstm_cell", thnn_fused_lstm_cell);
  m.impl("_thnn_fused_lstm_cell_backward_impl", thnn_fused_lstm_cell_backward_impl);
  m.impl("_thnn_fused_gru_cell", thnn_fused_gru_cell);
  m.impl("_thnn_fused_gru_cell_backward", thnn_fused_gru_cell_backward);
  m.impl("convolution", convolution_fn);
  m.impl("convolution_overrideable", convolution_fn);
  m.impl("convolution_backward", convolution_backward_fn);
  m.impl("convolution_backward_overrideable", convolution_backward_overrideable_fn);

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
  m.impl("im2col", im2col_fn);
  m.impl("col2im", col2im_fn);
  m.impl("pixel_shuffle", pixel_shuffle_fn);
  m.impl("pixel_unshuffle", pixel_unshuffle_fn);
  m.impl("channel_shuffle", channel_shuffle_fn);

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

#define REG_RESAMPLE(NAME)    \
  m.impl(#NAME, NAME##_fn); \
  m.impl(#NAME "_backward", NAME##_backward_fn);
  REG_RESAMPLE(upsample_nearest1d) REG_RESAMPLE(upsample_nearest2d) REG_RESAMPLE(upsample_nearest3d)
  REG_RESAMPLE(_upsample_nearest_exact1d) REG_RESAMPLE(_upsample_nearest_exact2d)
  REG_RESAMPLE(_upsample_nearest_exact3d) REG_RESAMPLE(upsample_linear1d) REG_RESAMPLE(upsample_bilinear2d)
  REG_RESAMPLE(upsample_trilinear3d) REG_RESAMPLE(upsample_bicubic2d)
  REG_RESAMPLE(_upsample_bilinear2d_aa) REG_RESAMPLE(_upsample_bicubic2d_aa)
  REG_RESAMPLE(reflection_pad1d) REG_RESAMPLE(reflection_pad2d) REG_RESAMPLE(reflection_pad3d)
  REG_RESAMPLE(replication_pad1d) REG_RESAMPLE(replication_pad2d) REG_RESAMPLE(replication_pad3d)
#undef REG_RESAMPLE
  m.impl("constant_pad_nd", constant_pad_nd_fn);
  m.impl("flip", flip_fn);
  m.impl("roll", roll_fn);
  m.impl("repeat", repeat_fn);

  m.impl("cumsum", cumsum_fn);
  m.impl("cumsum.out", cumsum_out);
  m.impl("cumsum_", cumsum_inplace);
  m.impl("cumprod", cumprod_fn);
  m.impl("cumprod.out", cumprod_out);
  m.impl("cumprod_", cumprod_inplace);
  m.impl("logcumsumexp", logcumsumexp_fn);
  m.impl("logcumsumexp.out", logcumsumexp_out);
  m.impl("cummax", cummax_fn);
  m.impl("cummin", cummin_fn);
  m.impl("_cummax_helper", cummax_helper_fn);
  m.impl("_cummin_helper", cummin_helper_fn);
  m.impl("sort", sort_fn);
  m.impl("sort.stable", sort_stable_fn);
  m.impl("sort.values_stable", sort_values_stable_fn);
  m.impl("topk", topk_fn);
  m.impl("topk.values", topk_out);
  m.impl("kthvalue", kthvalue_fn);
  m.impl("kthvalue.values", [](const at::Tensor& s, int64_t k, int64_t d, bool keep, at::Tensor& values,
                               at::Tensor& indices) {
    auto [v, i] = kthvalue_fn(s, k, d, keep);
    write_outs("kthvalue", {v, i}, {values, indices}, {s});
    return std::tuple<at::Tensor&, at::Tensor&>(values, indices);
  });
  m.impl("median", median_all_fn);
  m.impl("median.dim", median_dim_fn);
  m.impl("nanmedian", nanmedian_all_fn);
  m.impl("nanmedian.dim", nanmedian_dim_fn);

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
