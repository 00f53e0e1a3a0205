// Complex dtypes and spectral ops: the complex views (view_as_real/complex
// share storage; a storage read in another dtype is split into or paired from
// (real, imag) components), conj_physical, complex/polar, and the _fft_* family
// through stablehlo.fft.
#include <ATen/WrapDimUtils.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <torch/library.h>

#include "device/context.h"
#include "aten/kernel_util.h"
#include "lowering/ops.h"

namespace torch_pjrt::device {
namespace {

using ir::Value;
namespace L = lowering;

at::Tensor& conj_physical_into(const at::Tensor& self, at::Tensor& out) {
  OpBuilder op("aten::conj_physical");
  Value r = op.b().conj(op.input(self));
  finish(op, r, self.scalar_type(), &out);
  return out;
}
at::Tensor& conj_physical_inplace(at::Tensor& self) {
  if (!self.is_complex()) return self;
  return conj_physical_into(self, self);
}

// complex(real, imag) and polar(abs, angle): float parts of one dtype, broadcast.
at::Tensor& complex_parts_out(const char* name, const at::Tensor& a, const at::Tensor& b, bool polar,
                              at::Tensor& out) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), name, ": Expected object of scalar type ", a.scalar_type(),
              " but got scalar type ", b.scalar_type(), " for second argument");
  TORCH_CHECK(a.scalar_type() == at::kFloat || a.scalar_type() == at::kDouble || a.scalar_type() == at::kHalf,
              name, ": expected float, double or half inputs, got ", a.scalar_type());
  at::ScalarType result = at::toComplexType(a.scalar_type() == at::kHalf ? at::kFloat : a.scalar_type());
  TORCH_CHECK(out.scalar_type() == result, name, ": Expected object of scalar type ", result, " but got scalar type ",
              out.scalar_type(), " for argument 'out'");
  OpBuilder op(std::string("aten::") + name);
  auto& bld = op.b();
  ir::DType part = ir::component_type(to_ir(result));
  Value x = bld.convert(op.input(a), part), y = bld.convert(op.input(b), part);
  auto shape = ir::broadcast_shapes(bld.dims(x), bld.dims(y));
  x = bld.broadcast_to(x, shape);
  y = bld.broadcast_to(y, shape);
  Value r = polar ? bld.complex(bld.binary("multiply", x, bld.unary("cosine", y)),
                                bld.binary("multiply", x, bld.unary("sine", y)))
                  : bld.complex(x, y);
  finish(op, r, result, &out);
  return out;
}
at::Tensor& complex_into(const at::Tensor& re, const at::Tensor& im, at::Tensor& out) {
  return complex_parts_out("complex", re, im, false, out);
}
at::Tensor& polar_into(const at::Tensor& abs, const at::Tensor& angle, at::Tensor& out) {
  return complex_parts_out("polar", abs, angle, true, out);
}

// ---------------------------------------------------------------- FFT

at::Tensor fft_impl(const char* name, const at::Tensor& self, c10::IntArrayRef dim, int64_t normalization,
                    const std::string& kind, bool forward, int64_t last_dim_size, at::Tensor* into) {
  TORCH_CHECK(normalization >= 0 && normalization <= 2, name, ": unknown normalization mode ", normalization);
  if (kind == "r2c") {
    TORCH_CHECK(at::isFloatingType(self.scalar_type()), name, ": expected a real floating input, got ",
                self.scalar_type());
  } else {
    TORCH_CHECK(self.is_complex(), name, ": expected a complex input, got ", self.scalar_type());
  }
  if (kind == "c2r") TORCH_CHECK(last_dim_size >= 1, name, ": invalid output size ", last_dim_size);
  std::vector<int64_t> dims;
  for (int64_t d : dim) {
    int64_t w = at::maybe_wrap_dim(d, self.dim());
    TORCH_CHECK(std::find(dims.begin(), dims.end(), w) == dims.end(), name, ": dims must be unique, got ", dim);
    dims.push_back(w);
  }
  at::ScalarType real = kind == "r2c" ? (self.scalar_type() == at::kDouble ? at::kDouble : at::kFloat)
                                      : at::toRealValueType(self.scalar_type());
  at::ScalarType result = kind == "c2r" ? real : at::toComplexType(real);
  OpBuilder op(std::string("aten::") + name);
  Value r = L::fft(op.b(), op.input(self), dims, kind, forward, normalization, last_dim_size);
  return finish(op, r, result, into);
}

at::Tensor fft_r2c(const at::Tensor& self, c10::IntArrayRef dim, int64_t normalization, bool onesided) {
  if (!onesided) {
    // The full spectrum: a complex transform of the real signal.
    at::Tensor z = self.to(at::toComplexType(self.scalar_type() == at::kDouble ? at::kDouble : at::kFloat));
    return fft_impl("_fft_r2c", z, dim, normalization, "c2c", true, 0, nullptr);
  }
  return fft_impl("_fft_r2c", self, dim, normalization, "r2c", true, 0, nullptr);
}
at::Tensor& fft_r2c_out(const at::Tensor& self, c10::IntArrayRef dim, int64_t normalization, bool onesided,
                        at::Tensor& out) {
  return write_out("_fft_r2c", fft_r2c(self, dim, normalization, onesided), out);
}
at::Tensor fft_c2r(const at::Tensor& self, c10::IntArrayRef dim, int64_t normalization, int64_t last_dim_size) {
  return fft_impl("_fft_c2r", self, dim, normalization, "c2r", false, last_dim_size, nullptr);
}
at::Tensor& fft_c2r_out(const at::Tensor& self, c10::IntArrayRef dim, int64_t normalization, int64_t last_dim_size,
                        at::Tensor& out) {
  return write_out("_fft_c2r", fft_c2r(self, dim, normalization, last_dim_size), out);
}
at::Tensor fft_c2c(const at::Tensor& self, c10::IntArrayRef dim, int64_t normalization, bool forward) {
  return fft_impl("_fft_c2c", self, dim, normalization, "c2c", forward, 0, nullptr);
}
at::Tensor& fft_c2c_out(const at::Tensor& self, c10::IntArrayRef dim, int64_t normalization, bool forward,
                        at::Tensor& out) {
  return write_out("_fft_c2c", fft_c2c(self, dim, normalization, forward), out);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("view_as_real", at::native::view_as_real);
  m.impl("view_as_complex", at::native::view_as_complex);
  m.impl("conj_physical.out", conj_physical_into);
  m.impl("conj_physical_", conj_physical_inplace);
  m.impl("complex.out", complex_into);
  m.impl("polar.out", polar_into);
  m.impl("_fft_r2c", fft_r2c);
  m.impl("_fft_r2c.out", fft_r2c_out);
  m.impl("_fft_c2r", fft_c2r);
  m.impl("_fft_c2r.out", fft_c2r_out);
  m.impl("_fft_c2c", fft_c2c);
  m.impl("_fft_c2c.out", fft_c2c_out);
}

}  // namespace torch_pjrt::device
