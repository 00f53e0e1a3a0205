// Resampling and padding: upsampling, padding modes, the grid sampler.
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>
#include <torch/library.h>

#include "aten/kernel_util.h"
#include "aten/nn_util.h"
#include "device/context.h"
#include "lowering/nn.h"

namespace torch_pjrt::device {
namespace {

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

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("grid_sampler_2d", grid_sampler_2d_fn);
  m.impl("grid_sampler_2d_backward", grid_sampler_2d_backward_fn);
  m.impl("grid_sampler_3d", grid_sampler_3d_fn);
  m.impl("grid_sampler_3d_backward", grid_sampler_3d_backward_fn);
#define REG_RESAMPLE(NAME)    \
  m.impl(#NAME, NAME##_fn); \
  m.impl(#NAME "_backward", NAME##_backward_fn);
  REG_RESAMPLE(upsample_nearest1d)
  REG_RESAMPLE(upsample_nearest2d)
  REG_RESAMPLE(upsample_nearest3d)
  REG_RESAMPLE(_upsample_nearest_exact1d)
  REG_RESAMPLE(_upsample_nearest_exact2d)
  REG_RESAMPLE(_upsample_nearest_exact3d)
  REG_RESAMPLE(upsample_linear1d)
  REG_RESAMPLE(upsample_bilinear2d)
  REG_RESAMPLE(upsample_trilinear3d)
  REG_RESAMPLE(upsample_bicubic2d)
  REG_RESAMPLE(_upsample_bilinear2d_aa)
  REG_RESAMPLE(_upsample_bicubic2d_aa)
  REG_RESAMPLE(reflection_pad1d)
  REG_RESAMPLE(reflection_pad2d)
  REG_RESAMPLE(reflection_pad3d)
  REG_RESAMPLE(replication_pad1d)
  REG_RESAMPLE(replication_pad2d)
  REG_RESAMPLE(replication_pad3d)
#undef REG_RESAMPLE
  m.impl("constant_pad_nd", constant_pad_nd_fn);
}

}  // namespace torch_pjrt::device
