// Convolution (forward and gradients, transposed, the slow_conv entry points), im2col/col2im, pixel
// shuffles.
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

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution", convolution_fn);
  m.impl("convolution_overrideable", convolution_fn);
  m.impl("convolution_backward", convolution_backward_fn);
  m.impl("convolution_backward_overrideable", convolution_backward_overrideable_fn);
  m.impl("im2col", im2col_fn);
  m.impl("col2im", col2im_fn);
  m.impl("pixel_shuffle", pixel_shuffle_fn);
  m.impl("pixel_unshuffle", pixel_unshuffle_fn);
  m.impl("channel_shuffle", channel_shuffle_fn);
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
}

}  // namespace torch_pjrt::device
