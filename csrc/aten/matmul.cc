// Products: mm, bmm, addmm, addmv, dot, vdot, cross, int_mm, scaled_mm (float8), cdist/pdist.
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

void check_matmul_dtypes(const char* name, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "expected m1 and m2 to have the same dtype, but got: ",
              a.scalar_type(), " != ", b.scalar_type());
}

// a @ b for 2-D operands. A few rows (a decode step's tokens) times a large float32 weight go to
// the host kernel, which reads the weight once where it lies: a transposed view (a linear
// layer's weight.t()) as the [N, K] matrix it views, not a transposed copy.
Value product_2d(OpBuilder& op, const at::Tensor& a, const at::Tensor& b, ir::DType dt) {
  const bool as_is = b.is_contiguous();  // else a transposed view, if any layout the kernel reads
  if (L::few_row_product_fits(to_ir(a.scalar_type()), to_ir(b.scalar_type()), dt, a.size(0), a.size(1), b.size(1),
                              !as_is) &&
      rt().host_kernels()) {
    if (as_is) return L::few_row_product(op.b(), op.input(a), op.input(b), false);
    if (b.t().is_contiguous()) return L::few_row_product(op.b(), op.input(a), op.input(b.t()), true);
  }
  return L::matmul_2d(op.b(), op.input(a), op.input(b), dt);
}

at::Tensor mm_impl(const at::Tensor& a, const at::Tensor& b, const at::Tensor* into) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected 2-D tensors, got ", a.dim(), "-D and ", b.dim(), "-D");
  TORCH_CHECK(a.size(1) == b.size(0), "mat1 and mat2 shapes cannot be multiplied (", a.size(0), "x", a.size(1),
              " and ", b.size(0), "x", b.size(1), ")");
  check_matmul_dtypes("mm", a, b);
  OpBuilder op("aten::mm");
  Value r = product_2d(op, a, b, to_ir(a.scalar_type()));
  return finish(op, r, a.scalar_type(), into);
}
at::Tensor mm_fn(const at::Tensor& a, const at::Tensor& b) { return mm_impl(a, b, nullptr); }
at::Tensor& mm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& o) {
  mm_impl(a, b, &o);
  return o;
}

at::Tensor bmm_impl(const at::Tensor& a, const at::Tensor& b, const at::Tensor* into) {
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3, "batch1 must be a 3D tensor");
  TORCH_CHECK(a.size(0) == b.size(0) && a.size(2) == b.size(1), "Expected size for first two dimensions of batch2 tensor to be: [",
              a.size(0), ", ", a.size(2), "] but got: [", b.size(0), ", ", b.size(1), "].");
  check_matmul_dtypes("bmm", a, b);
  OpBuilder op("aten::bmm");
  Value r = L::bmm(op.b(), op.input(a), op.input(b), to_ir(a.scalar_type()));
  return finish(op, r, a.scalar_type(), into);
}
at::Tensor bmm_fn(const at::Tensor& a, const at::Tensor& b) { return bmm_impl(a, b, nullptr); }
at::Tensor& bmm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& o) {
  bmm_impl(a, b, &o);
  return o;
}

// beta * self + alpha * (a @ b); beta == 0 ignores self (even NaN), as torch does.
bool is_zero(const at::Scalar& s) {
  if (s.isComplex()) return s.toComplexDouble() == c10::complex<double>(0, 0);
  return s.isIntegral(false) ? s.toLong() == 0 : s.toDouble() == 0.0;
}

at::Tensor addmm_impl(const char* name, const at::Tensor& self, const at::Tensor& a, const at::Tensor& b,
                      const at::Scalar& beta, const at::Scalar& alpha, const at::Tensor* into, bool batched) {
  check_matmul_dtypes(name, a, b);
  if (batched) {
    TORCH_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(2) == b.size(1), name, ": incompatible shapes");
  } else {
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2, name, ": expected 2-D matrices");
    TORCH_CHECK(a.size(1) == b.size(0), "mat1 and mat2 shapes cannot be multiplied (", a.size(0), "x", a.size(1),
                " and ", b.size(0), "x", b.size(1), ")");
  }
  OpBuilder op(std::string("aten::") + name);
  auto& bd = op.b();
  auto dt = to_ir(a.scalar_type());
  Value prod = batched ? L::bmm(bd, op.input(a), op.input(b), dt) : product_2d(op, a, b, dt);
  auto shape = bd.dims(prod);
  Value r = bd.binary("multiply", prod, bd.broadcast_to(op.scalar(alpha, a.scalar_type()), shape));
  if (!is_zero(beta)) {
    Value c = bd.broadcast_to(bd.convert(op.input(self), dt), shape);
    c = bd.binary("multiply", c, bd.broadcast_to(op.scalar(beta, a.scalar_type()), shape));
    r = bd.binary("add", r, c);
  }
  return finish(op, r, a.scalar_type(), into);
}
at::Tensor addmm_fn(const at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta, const at::Scalar& alpha) {
  return addmm_impl("addmm", s, a, b, beta, alpha, nullptr, false);
}
at::Tensor& addmm_out(const at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                      const at::Scalar& alpha, at::Tensor& o) {
  addmm_impl("addmm", s, a, b, beta, alpha, &o, false);
  return o;
}
at::Tensor& addmm_inplace(at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta, const at::Scalar& alpha) {
  addmm_impl("addmm", s, a, b, beta, alpha, &s, false);
  return s;
}
at::Tensor baddbmm_fn(const at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta, const at::Scalar& alpha) {
  return addmm_impl("baddbmm", s, a, b, beta, alpha, nullptr, true);
}
at::Tensor& baddbmm_out(const at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                        const at::Scalar& alpha, at::Tensor& o) {
  addmm_impl("baddbmm", s, a, b, beta, alpha, &o, true);
  return o;
}

at::Tensor dot_fn(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "dot : expected both vectors to have same dtype, but found ",
              a.scalar_type(), " and ", b.scalar_type());
  TORCH_CHECK(a.dim() == 1 && b.dim() == 1, "1D tensors expected, but got ", a.dim(), "D and ", b.dim(), "D tensors");
  TORCH_CHECK(a.size(0) == b.size(0), "inconsistent tensor size, expected tensor [", a.size(0),
              "] and src [", b.size(0), "] to have the same number of elements, but got ", a.size(0), " and ", b.size(0),
              " elements respectively");
  check_matmul_dtypes("dot", a, b);
  OpBuilder op("aten::dot");
  return finish(op, L::dot(op.b(), op.input(a), op.input(b), to_ir(a.scalar_type())), a.scalar_type(), nullptr);
}

at::Tensor addmv_impl(const at::Tensor& self, const at::Tensor& mat, const at::Tensor& v, const at::Scalar& beta,
                      const at::Scalar& alpha, const at::Tensor* into) {
  TORCH_CHECK(mat.dim() == 2 && v.dim() == 1 && mat.size(1) == v.size(0), "size mismatch, got input (",
              self.sizes(), "), mat (", mat.sizes(), "), vec (", v.sizes(), ")");
  check_matmul_dtypes("addmv", mat, v);
  OpBuilder op("aten::addmv");
  auto& bd = op.b();
  auto dt = to_ir(mat.scalar_type());
  Value prod = bd.dot_general(op.input(mat), op.input(v), {}, {}, {1}, {0}, dt);
  auto shape = bd.dims(prod);
  Value r = bd.binary("multiply", prod, bd.broadcast_to(op.scalar(alpha, mat.scalar_type()), shape));
  if (!is_zero(beta)) {
    Value c = bd.broadcast_to(bd.convert(op.input(self), dt), shape);
    r = bd.binary("add", r, bd.binary("multiply", c, bd.broadcast_to(op.scalar(beta, mat.scalar_type()), shape)));
  }
  return finish(op, r, mat.scalar_type(), into);
}
at::Tensor addmv_fn(const at::Tensor& s, const at::Tensor& m, const at::Tensor& v, const at::Scalar& b, const at::Scalar& a) {
  return addmv_impl(s, m, v, b, a, nullptr);
}
at::Tensor& addmv_out(const at::Tensor& s, const at::Tensor& m, const at::Tensor& v, const at::Scalar& b,
                      const at::Scalar& a, at::Tensor& o) {
  addmv_impl(s, m, v, b, a, &o);
  return o;
}

// beta * self + alpha * product; beta == 0 ignores self (NaN included), as torch does.
Value scaled_sum(OpBuilder& op, const at::Tensor& self, Value product, const at::Scalar& beta, const at::Scalar& alpha,
                 at::ScalarType t) {
  auto& b = op.b();
  auto shape = b.dims(product);
  Value r = b.binary("multiply", product, b.broadcast_to(op.scalar(alpha, t), shape));
  if (beta.toComplexDouble() == 0.0) return r;
  Value s = b.broadcast_to(b.convert(op.input(self), to_ir(t)), shape);
  return b.binary("add", r, b.binary("multiply", s, b.broadcast_to(op.scalar(beta, t), shape)));
}

at::Tensor addbmm_impl(const at::Tensor& self, const at::Tensor& b1, const at::Tensor& b2, const at::Scalar& beta,
                       const at::Scalar& alpha, const at::Tensor* into) {
  TORCH_CHECK(b1.dim() == 3 && b2.dim() == 3, "batch1 and batch2 must be 3D tensors");
  TORCH_CHECK(b1.size(0) == b2.size(0) && b1.size(2) == b2.size(1), "addbmm: incompatible batch matrices ", b1.sizes(),
              " and ", b2.sizes());
  OpBuilder op("aten::addbmm");
  auto& b = op.b();
  at::ScalarType t = self.scalar_type();
  // Contract over the batch and the inner dim at once.
  Value p = b.dot_general(op.input(b1), op.input(b2), {}, {}, {0, 2}, {0, 1}, to_ir(t));
  return finish(op, scaled_sum(op, self, p, beta, alpha, t), t, into);
}
at::Tensor addbmm_fn(const at::Tensor& s, const at::Tensor& a, const at::Tensor& c, const at::Scalar& be,
                     const at::Scalar& al) {
  return addbmm_impl(s, a, c, be, al, nullptr);
}
at::Tensor& addbmm_out(const at::Tensor& s, const at::Tensor& a, const at::Tensor& c, const at::Scalar& be,
                       const at::Scalar& al, at::Tensor& out) {
  addbmm_impl(s, a, c, be, al, &out);
  return out;
}
at::Tensor& addbmm_inplace(at::Tensor& s, const at::Tensor& a, const at::Tensor& c, const at::Scalar& be,
                           const at::Scalar& al) {
  addbmm_impl(s, a, c, be, al, &s);
  return s;
}

at::Tensor addr_impl(const at::Tensor& self, const at::Tensor& v1, const at::Tensor& v2, const at::Scalar& beta,
                     const at::Scalar& alpha, const at::Tensor* into) {
  TORCH_CHECK(v1.dim() == 1 && v2.dim() == 1, "addr: Expected 1-D argument vec1 and vec2, but got ", v1.dim(), "-D and ",
              v2.dim(), "-D");
  OpBuilder op("aten::addr");
  auto& b = op.b();
  at::ScalarType t = at::native::result_type(std::vector<at::Tensor>{self, v1, v2});
  if (into) t = out_dtype("addr", t, *into);
  std::vector<int64_t> shape{v1.size(0), v2.size(0)};
  Value a = b.broadcast_in_dim(b.convert(op.input(v1), to_ir(t)), shape, {0});
  Value c = b.broadcast_in_dim(b.convert(op.input(v2), to_ir(t)), shape, {1});
  Value p = t == at::kBool ? b.binary("and", a, c) : b.binary("multiply", a, c);
  if (t == at::kBool) {
    Value s = b.broadcast_to(op.input(self), shape);
    Value r = beta.toBool() ? b.binary("or", s, p) : p;
    return finish(op, alpha.toBool() ? r : (beta.toBool() ? s : b.constant_int(DType::Pred, 0, shape)), t, into);
  }
  return finish(op, scaled_sum(op, self, p, beta, alpha, t), t, into);
}
at::Tensor addr_fn(const at::Tensor& s, const at::Tensor& a, const at::Tensor& c, const at::Scalar& be,
                   const at::Scalar& al) {
  return addr_impl(s, a, c, be, al, nullptr);
}
at::Tensor& addr_out(const at::Tensor& s, const at::Tensor& a, const at::Tensor& c, const at::Scalar& be,
                     const at::Scalar& al, at::Tensor& out) {
  addr_impl(s, a, c, be, al, &out);
  return out;
}

at::Tensor linalg_cross_fn(const at::Tensor& self, const at::Tensor& other, int64_t dim) {
  TORCH_CHECK(self.dim() == other.dim(), "linalg.cross: inputs must have the same number of dimensions.");
  auto shape = at::infer_size(self.sizes(), other.sizes());
  int64_t d = at::maybe_wrap_dim(dim, static_cast<int64_t>(shape.size()));
  TORCH_CHECK(self.size(d) == 3 && other.size(d) == 3, "linalg.cross: inputs dimension ", dim, " must have length 3. Got ",
              self.size(d), " and ", other.size(d));
  OpBuilder op("aten::linalg_cross");
  auto& b = op.b();
  at::ScalarType t = at::result_type(self, other);
  Value x = b.broadcast_to(b.convert(op.input(self), to_ir(t)), vec(shape));
  Value y = b.broadcast_to(b.convert(op.input(other), to_ir(t)), vec(shape));
  auto comp = [&](Value v, int64_t i) { return b.slice_dim(v, d, i, i + 1); };
  auto term = [&](int64_t i, int64_t j) {
    return b.binary("subtract", b.binary("multiply", comp(x, i), comp(y, j)), b.binary("multiply", comp(x, j), comp(y, i)));
  };
  Value r = b.concatenate({term(1, 2), term(2, 0), term(0, 1)}, d);
  return finish(op, r, t, nullptr);
}

// Functional scatters of a view (used by functionalization and autograd): copy into a clone's view.
at::Tensor slice_scatter_fn(const at::Tensor& self, const at::Tensor& src, int64_t dim, std::optional<int64_t> start,
                            std::optional<int64_t> end, int64_t step) {
  at::Tensor out = self.clone();
  out.slice(dim, start, end, step).copy_(src);
  return out;
}
at::Tensor as_strided_scatter_fn(const at::Tensor& self, const at::Tensor& src, c10::IntArrayRef size,
                                 c10::IntArrayRef stride, std::optional<int64_t> offset) {
  at::Tensor out = self.clone();
  out.as_strided(size, stride, offset).copy_(src);
  return out;
}
at::Tensor vdot_fn(const at::Tensor& self, const at::Tensor& other) {
  return at::dot(self.conj(), other);  // conjugates its first argument (dot reads the lazy conj bit)
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

// float8 products with scales (torchao's float8 training, float8 inference): as torch's CPU
// kernel computes them, (a * scale_a) @ (b * scale_b) in float32 (+ bias), divided by
// scale_result for a float8 result, then converted to out_dtype (float8 by torch's rules).
// Scales: one value each (tensor-wise), or scale_a [M, 1] and scale_b [1, N] (row-wise).
Tensor scaled_mm_impl(const Tensor& a, const Tensor& b, const Tensor& scale_a, const Tensor& scale_b,
                      const std::optional<Tensor>& bias, const std::optional<Tensor>& scale_result,
                      std::optional<at::ScalarType> out_dtype, const Tensor* into) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "_scaled_mm: expected 2-D tensors, got ", a.dim(), "-D and ", b.dim(), "-D");
  TORCH_CHECK(a.size(1) == b.size(0), "_scaled_mm: mat1 and mat2 shapes cannot be multiplied (", a.size(0), "x",
              a.size(1), " and ", b.size(0), "x", b.size(1), ")");
  TORCH_CHECK(at::isFloat8Type(a.scalar_type()) && at::isFloat8Type(b.scalar_type()),
              "_scaled_mm: expected float8 inputs, got ", a.scalar_type(), " and ", b.scalar_type());
  const int64_t m = a.size(0), n = b.size(1);
  const bool tensor_wise = scale_a.numel() == 1 && scale_b.numel() == 1;
  const bool row_wise = scale_a.dim() == 2 && scale_a.size(0) == m && scale_a.size(1) == 1 && scale_b.dim() == 2 &&
                        scale_b.size(0) == 1 && scale_b.size(1) == n;
  TORCH_CHECK(scale_a.scalar_type() == at::kFloat && scale_b.scalar_type() == at::kFloat && (tensor_wise || row_wise),
              "_scaled_mm: invalid scaling configuration: float32 scales of one element each (tensor-wise), or "
              "scale_a [", m, ", 1] and scale_b [1, ", n, "] (row-wise); got ", scale_a.scalar_type(),
              scale_a.sizes(), " and ", scale_b.scalar_type(), scale_b.sizes());
  const at::ScalarType result_dtype = out_dtype.value_or(a.scalar_type());
  if (bias) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n, "_scaled_mm: bias must be 1-D with ", n, " elements, got ",
                bias->sizes());
  }
  OpBuilder op("aten::_scaled_mm");
  auto& bld = op.b();
  using ir::DType;
  auto scaled = [&](const Tensor& t, const Tensor& scale) {
    Value x = bld.convert(op.input(t), DType::F32);
    Value s = bld.reshape(op.input(scale), tensor_wise ? std::vector<int64_t>{} : vec(scale.sizes()));
    return bld.binary("multiply", x, bld.broadcast_to(s, vec(t.sizes())));
  };
  Value r = bld.dot_general(scaled(a, scale_a), scaled(b, scale_b), {}, {}, {1}, {0}, DType::F32);
  if (bias) r = bld.binary("add", r, bld.broadcast_to(bld.convert(op.input(*bias), DType::F32), {m, n}));
  if (scale_result && at::isFloat8Type(result_dtype)) {
    Value inverse = bld.binary("divide", bld.constant(DType::F32, 1.0, {}),
                               bld.reshape(bld.convert(op.input(*scale_result), DType::F32), {}));
    r = bld.binary("multiply", r, bld.broadcast_to(inverse, {m, n}));
  }
  return finish(op, bld.convert(r, to_ir(result_dtype)), result_dtype, into);
}
Tensor scaled_mm(const Tensor& a, const Tensor& b, const Tensor& scale_a, const Tensor& scale_b,
                 const std::optional<Tensor>& bias, const std::optional<Tensor>& scale_result,
                 std::optional<at::ScalarType> out_dtype, bool /*use_fast_accum: float32 accumulation always*/) {
  return scaled_mm_impl(a, b, scale_a, scale_b, bias, scale_result, out_dtype, nullptr);
}
Tensor& scaled_mm_out(const Tensor& a, const Tensor& b, const Tensor& scale_a, const Tensor& scale_b,
                      const std::optional<Tensor>& bias, const std::optional<Tensor>& scale_result,
                      std::optional<at::ScalarType> out_dtype, bool use_fast_accum, Tensor& out) {
  return write_out("_scaled_mm", scaled_mm(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum),
                   out);
}

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
  m.impl("mm", mm_fn);
  m.impl("_scaled_mm", scaled_mm);
  m.impl("_scaled_mm.out", scaled_mm_out);
  m.impl("mm.out", mm_out);
  m.impl("bmm", bmm_fn);
  m.impl("bmm.out", bmm_out);
  m.impl("addmm", addmm_fn);
  m.impl("addmm.out", addmm_out);
  m.impl("addmm_", addmm_inplace);
  m.impl("baddbmm", baddbmm_fn);
  m.impl("baddbmm.out", baddbmm_out);
  m.impl("dot", dot_fn);
  m.impl("addmv", addmv_fn);
  m.impl("addmv.out", addmv_out);
  m.impl("addbmm", addbmm_fn);
  m.impl("addbmm.out", addbmm_out);
  m.impl("addbmm_", addbmm_inplace);
  m.impl("addr", addr_fn);
  m.impl("addr.out", addr_out);
  m.impl("linalg_cross", linalg_cross_fn);
  m.impl("linalg_cross.out", [](const at::Tensor& s, const at::Tensor& o, int64_t d, at::Tensor& out) -> at::Tensor& {
    return write_out("linalg_cross", linalg_cross_fn(s, o, d), out);
  });
  m.impl("slice_scatter", slice_scatter_fn);
  m.impl("as_strided_scatter", as_strided_scatter_fn);
  m.impl("vdot", vdot_fn);
  m.impl("_cdist_forward", cdist_forward_k);
  m.impl("_cdist_backward", cdist_backward_k);
  m.impl("_pdist_forward", pdist_forward_k);
  m.impl("_pdist_backward", pdist_backward_k);
  m.impl("_addmm_activation", addmm_activation);
  m.impl("_addmm_activation.out", addmm_activation_out);
  m.impl("_int_mm", int_mm);
  m.impl("_int_mm.out", int_mm_out);
}

}  // namespace torch_pjrt::device
