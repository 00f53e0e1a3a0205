// torch.linalg natively: Cholesky and triangular solves (StableHLO ops), eigh
// and QR (custom calls XLA expands), LU with partial pivoting and everything
// built on it (solve, inv, det, slogdet, lu_solve, lu_unpack), and SVD through
// eigh. Each op is one program; the _ex variants' info is computed on the
// device and checked on the host only when asked (check_errors), as on CPU.
#include <ATen/ExpandUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_linalg_check_errors.h>
#include <torch/library.h>

#include "device/context.h"
#include "device/fallback.h"
#include "aten/kernel_util.h"
#include "lowering/linalg.h"

namespace torch_pjrt::device {
namespace {

using ir::Value;
namespace L = lowering;
using Tensor = at::Tensor;

// half: float16/bfloat16 accepted too (ops CPU has for them).
void check_matrix(const char* name, const Tensor& a, bool square = true, bool half = false) {
  TORCH_CHECK(a.dim() >= 2, name, ": The input tensor A must have at least 2 dimensions.");
  if (square) {
    TORCH_CHECK(a.size(-1) == a.size(-2), name, ": A must be batches of square matrices, but they are ", a.size(-2),
                " by ", a.size(-1), " matrices");
  }
  at::ScalarType t = a.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kDouble || t == at::kComplexFloat || t == at::kComplexDouble ||
                  (half && (t == at::kHalf || t == at::kBFloat16)),
              name,
              ": Expected a floating point or complex tensor as input. Got ", t);
}

// One result of a program; column_major: laid out as LAPACK leaves it and ATen returns it
// (each matrix column by column: strides [..., 1, rows]), which torch.compile's fake tensors
// predict for factorizations and solves.
struct Result {
  Value value;
  at::ScalarType dtype;
  bool column_major = false;
};

Layout column_major_layout(const std::vector<int64_t>& dims) {
  Layout layout;
  auto rank = static_cast<int64_t>(dims.size());
  if (rank < 2) return layout;
  layout.strides.assign(rank, 1);
  layout.strides[rank - 2] = 1;
  layout.strides[rank - 1] = std::max<int64_t>(dims[rank - 2], 1);
  int64_t step = std::max<int64_t>(dims[rank - 2], 1) * std::max<int64_t>(dims[rank - 1], 1);
  for (int64_t d = rank - 3; d >= 0; --d) {
    layout.strides[d] = step;
    step *= std::max<int64_t>(dims[d], 1);
  }
  return layout;
}

// The outputs of one program: fresh tensors, written into `outs` when given (out= variants).
std::vector<Tensor> finish_all(OpBuilder& op, const std::vector<Result>& results, const std::vector<Tensor*>& outs = {}) {
  std::vector<Tensor> fresh;
  for (const auto& r : results) {
    fresh.push_back(r.column_major ? op.output(r.value, r.dtype, column_major_layout(op.b().dims(r.value)))
                                   : op.output(r.value, r.dtype));
  }
  op.run();
  for (size_t i = 0; i < outs.size() && i < fresh.size(); ++i) {
    if (outs[i]) write_out(op.name().c_str(), fresh[i], *outs[i]);
  }
  return fresh;
}

Tensor empty_like_batch(const Tensor& a, at::ScalarType dtype) { return at::empty({0}, a.options().dtype(dtype)); }

// Broadcast batch dims of A [..., n, n] and B [..., n, k].
std::pair<Tensor, Tensor> broadcast_batches(const Tensor& a, const Tensor& b) {
  auto ab = a.sizes().slice(0, a.dim() - 2), bb = b.sizes().slice(0, b.dim() - 2);
  std::vector<int64_t> batch = at::infer_size(ab, bb);
  std::vector<int64_t> as = batch, bs = batch;
  as.insert(as.end(), a.sizes().end() - 2, a.sizes().end());
  bs.insert(bs.end(), b.sizes().end() - 2, b.sizes().end());
  return {a.expand(as), b.expand(bs)};
}

// ---------------------------------------------------------------- Cholesky

std::tuple<Tensor, Tensor> cholesky_ex_impl(const Tensor& a, bool upper, bool check_errors, Tensor* l_out,
                                            Tensor* info_out) {
  check_matrix("linalg.cholesky", a);
  OpBuilder op("aten::linalg_cholesky_ex");
  auto r = L::cholesky(op.b(), op.input(a), upper);
  auto t = finish_all(op, {{r[0], a.scalar_type(), true}, {r[1], at::kInt}}, {l_out, info_out});
  if (check_errors) at::_linalg_check_errors(t[1], "linalg.cholesky_ex", a.dim() == 2);
  return {l_out ? *l_out : t[0], info_out ? *info_out : t[1]};
}
std::tuple<Tensor, Tensor> cholesky_ex_k(const Tensor& a, bool upper, bool check_errors) {
  return cholesky_ex_impl(a, upper, check_errors, nullptr, nullptr);
}
std::tuple<Tensor&, Tensor&> cholesky_ex_out(const Tensor& a, bool upper, bool check_errors, Tensor& l, Tensor& info) {
  cholesky_ex_impl(a, upper, check_errors, &l, &info);
  return {l, info};
}
Tensor cholesky_old(const Tensor& a, bool upper) {
  auto [l, info] = cholesky_ex_impl(a, upper, false, nullptr, nullptr);
  at::_linalg_check_errors(info, "cholesky", a.dim() == 2);
  return l;
}
Tensor& cholesky_old_out(const Tensor& a, bool upper, Tensor& out) { return write_out("cholesky", cholesky_old(a, upper), out); }

// L L^H X = B (upper: U^H U X = B).
Value cholesky_solve_value(ir::Builder& b, Value factor, Value rhs, bool upper) {
  if (upper) {
    Value y = b.triangular_solve(factor, rhs, true, false, false, "ADJOINT");
    return b.triangular_solve(factor, y, true, false, false, "NO_TRANSPOSE");
  }
  Value y = b.triangular_solve(factor, rhs, true, true, false, "NO_TRANSPOSE");
  return b.triangular_solve(factor, y, true, true, false, "ADJOINT");
}

Tensor cholesky_solve_helper(const Tensor& self, const Tensor& factor, bool upper) {
  OpBuilder op("aten::_cholesky_solve_helper");
  Value x = cholesky_solve_value(op.b(), op.input(factor), op.input(self), upper);
  return finish_all(op, {{x, self.scalar_type()}})[0];
}

Tensor cholesky_inverse_k(const Tensor& factor, bool upper) {
  check_matrix("cholesky_inverse", factor);
  OpBuilder op("aten::cholesky_inverse");
  auto& b = op.b();
  Value f = op.input(factor);
  Value eye = L::eye(b, to_ir(factor.scalar_type()), vec(factor.sizes().slice(0, factor.dim() - 2)), factor.size(-1));
  return finish_all(op, {{cholesky_solve_value(b, f, eye, upper), factor.scalar_type()}})[0];
}
Tensor& cholesky_inverse_out(const Tensor& factor, bool upper, Tensor& out) {
  return write_out("cholesky_inverse", cholesky_inverse_k(factor, upper), out);
}

// The right-hand side of a solve with the square (checked) matrix a: B a matrix of
// a's dtype whose rows (left: A X = B) or columns (right: X A = B) match a.
void check_rhs(const char* name, const char* a_label, const Tensor& a, const Tensor& rhs, bool left) {
  TORCH_CHECK(rhs.dim() >= 2, name, ": The input tensor B must have at least 2 dimensions.");
  TORCH_CHECK(a.scalar_type() == rhs.scalar_type(), name, ": Expected ", a_label, " and B to have the same dtype, but found ",
              a_label, " of type ", a.scalar_type(), " and B of type ", rhs.scalar_type(), " instead");
  int64_t n = a.size(-1);
  TORCH_CHECK((left ? rhs.size(-2) : rhs.size(-1)) == n, name, ": Incompatible shapes of A and B for the equation ",
              left ? "AX = B" : "XA = B", " (", a.size(-2), "x", a.size(-1), " and ", rhs.size(-2), "x", rhs.size(-1), ")");
}

// ---------------------------------------------------------------- triangular solves

Tensor solve_triangular_k(const Tensor& a, const Tensor& rhs, bool upper, bool left, bool unitriangular) {
  check_matrix("linalg.solve_triangular", a);
  check_rhs("linalg.solve_triangular", "A", a, rhs, left);
  auto [ae, be] = broadcast_batches(a, rhs);
  OpBuilder op("aten::linalg_solve_triangular");
  Value av = op.input(ae), bv = op.input(be);
  Value x = op.b().triangular_solve(av, bv, left, !upper, unitriangular, "NO_TRANSPOSE");
  return finish_all(op, {{x, a.scalar_type(), true}})[0];
}
Tensor& solve_triangular_out(const Tensor& a, const Tensor& rhs, bool upper, bool left, bool unitriangular, Tensor& out) {
  return write_out("linalg.solve_triangular", solve_triangular_k(a, rhs, upper, left, unitriangular), out);
}

std::tuple<Tensor, Tensor> triangular_solve_k(const Tensor& self, const Tensor& a, bool upper, bool transpose,
                                            bool unitriangular) {
  check_matrix("triangular_solve", a);
  TORCH_CHECK(self.dim() >= 2, "triangular_solve: The input tensor b must have at least 2 dimensions.");
  auto [ae, be] = broadcast_batches(a, self);
  OpBuilder op("aten::triangular_solve");
  Value av = op.input(ae);
  Value x = op.b().triangular_solve(av, op.input(be), true, !upper, unitriangular, transpose ? "TRANSPOSE" : "NO_TRANSPOSE");
  auto t = finish_all(op, {{x, self.scalar_type(), true}, {av, a.scalar_type()}});
  return {t[0], t[1]};
}
std::tuple<Tensor&, Tensor&> triangular_solve_out(const Tensor& self, const Tensor& a, bool upper, bool transpose,
                                                  bool unitriangular, Tensor& x, Tensor& m) {
  auto [xs, ms] = triangular_solve_k(self, a, upper, transpose, unitriangular);
  write_outs("triangular_solve", {xs, ms}, {x, m});
  return {x, m};
}

// ---------------------------------------------------------------- eigh, QR

std::tuple<Tensor, Tensor> eigh_impl(const Tensor& a, c10::string_view uplo, bool compute_v, Tensor* w_out,
                                     Tensor* v_out) {
  check_matrix("linalg.eigh", a);
  TORCH_CHECK(uplo == "L" || uplo == "U" || uplo == "l" || uplo == "u",
              "Expected UPLO argument to be 'L' or 'U', but got ", uplo);
  OpBuilder op("aten::_linalg_eigh");
  auto r = L::eigh(op.b(), op.input(a), uplo == "L" || uplo == "l");
  at::ScalarType real = at::toRealValueType(a.scalar_type());
  if (!compute_v) {
    auto t = finish_all(op, {{r[0], real}}, {w_out});
    Tensor v = empty_like_batch(a, a.scalar_type());
    if (v_out) v_out->resize_({0});
    return {w_out ? *w_out : t[0], v_out ? *v_out : v};
  }
  auto t = finish_all(op, {{r[0], real}, {r[1], a.scalar_type()}}, {w_out, v_out});
  return {w_out ? *w_out : t[0], v_out ? *v_out : t[1]};
}
std::tuple<Tensor, Tensor> eigh_k(const Tensor& a, c10::string_view uplo, bool compute_v) {
  return eigh_impl(a, uplo, compute_v, nullptr, nullptr);
}
std::tuple<Tensor&, Tensor&> eigh_out(const Tensor& a, c10::string_view uplo, bool compute_v, Tensor& w, Tensor& v) {
  eigh_impl(a, uplo, compute_v, &w, &v);
  return {w, v};
}

std::tuple<Tensor, Tensor> qr_k(const Tensor& a, c10::string_view mode) {
  check_matrix("linalg.qr", a, false);
  TORCH_CHECK(mode == "reduced" || mode == "complete" || mode == "r",
              "qr received unrecognized mode '", mode, "' but expected one of 'reduced' (default), 'r', or 'complete'");
  OpBuilder op("aten::linalg_qr");
  auto r = L::qr(op.b(), op.input(a), std::string(mode));
  auto t = finish_all(op, {{r[0], a.scalar_type()}, {r[1], a.scalar_type()}});
  return {t[0], t[1]};
}
std::tuple<Tensor&, Tensor&> qr_out(const Tensor& a, c10::string_view mode, Tensor& q, Tensor& r) {
  auto [qs, rs] = qr_k(a, mode);
  write_outs("linalg.qr", {qs, rs}, {q, r});
  return {q, r};
}

std::tuple<Tensor, Tensor> geqrf_k(const Tensor& a) {
  check_matrix("geqrf", a, false);
  OpBuilder op("aten::geqrf");
  auto r = L::geqrf(op.b(), op.input(a));
  auto t = finish_all(op, {{r[0], a.scalar_type()}, {r[1], a.scalar_type()}});
  return {t[0], t[1]};
}
std::tuple<Tensor&, Tensor&> geqrf_out(const Tensor& a, Tensor& ra, Tensor& tau) {
  auto [x, t] = geqrf_k(a);
  write_outs("geqrf", {x, t}, {ra, tau});
  return {ra, tau};
}

Tensor householder_product_k(const Tensor& input, const Tensor& tau) {
  check_matrix("torch.linalg.householder_product", input, false);
  TORCH_CHECK(input.size(-2) >= input.size(-1),
              "torch.linalg.householder_product: input.shape[-2] must be greater than or equal to input.shape[-1]");
  TORCH_CHECK(input.size(-1) >= tau.size(-1),
              "torch.linalg.householder_product: input.shape[-1] must be greater than or equal to tau.shape[-1]");
  TORCH_CHECK(tau.dim() == input.dim() - 1, "torch.linalg.householder_product: Expected tau to have one dimension less than input");
  OpBuilder op("aten::linalg_householder_product");
  auto& b = op.b();
  Value refl = op.input(input), t = op.input(tau);
  // XLA's product takes as many taus as columns: missing ones are identity reflectors (tau 0).
  if (tau.size(-1) < input.size(-1)) {
    int64_t r = tau.dim();
    std::vector<int64_t> lo(r, 0), hi(r, 0), in(r, 0);
    hi[r - 1] = input.size(-1) - tau.size(-1);
    t = b.pad(t, b.constant(b.dtype(t), 0), lo, hi, in);
  }
  return finish_all(op, {{L::householder_product(b, refl, t), input.scalar_type()}})[0];
}
Tensor& householder_product_out(const Tensor& input, const Tensor& tau, Tensor& out) {
  return write_out("linalg.householder_product", householder_product_k(input, tau), out);
}

// C multiplied by Q (or Q^H) from geqrf's reflectors, on the left or right (LAPACK ormqr).
// Shapes first, then dtypes, as ATen checks them (callers match its wording).
Tensor ormqr_k(const Tensor& reflectors, const Tensor& tau, const Tensor& other, bool left, bool transpose) {
  TORCH_CHECK(reflectors.dim() >= 2, "torch.ormqr: input must have at least 2 dimensions.");
  TORCH_CHECK(other.dim() >= 2, "torch.ormqr: other must have at least 2 dimensions.");
  int64_t side = left ? -2 : -1;
  int64_t m = other.size(side);
  TORCH_CHECK(tau.dim() >= 1 && tau.size(-1) <= std::min(m, reflectors.size(-1)), "torch.ormqr: tau.shape[-1] must be equal to min(other.shape[",
              side, "], input.shape[-1])");
  TORCH_CHECK(reflectors.size(-2) == m, "torch.ormqr: other.shape[", side, "] must be equal to input.shape[-2]");
  check_matrix("torch.ormqr", reflectors, false);
  OpBuilder op("aten::ormqr");
  auto& b = op.b();
  Value refl = op.input(reflectors), t = op.input(tau);
  // The full m x m Q: reflectors padded with zero columns and identity reflectors (tau 0).
  int64_t r = reflectors.dim();
  auto pad_last = [&](Value v, int64_t to) {
    int64_t rank = b.type(v).rank();
    int64_t have = b.dims(v).back();
    if (have >= to) return b.slice_dim(v, rank - 1, 0, to);
    std::vector<int64_t> lo(rank, 0), hi(rank, 0), in(rank, 0);
    hi[rank - 1] = to - have;
    return b.pad(v, b.constant(b.dtype(v), 0), lo, hi, in);
  };
  (void)r;
  Value q = L::householder_product(b, pad_last(refl, m), pad_last(t, m));
  if (transpose) q = L::matrix_transpose(b, q, true);
  Value c = op.input(other);
  int64_t rank = b.type(c).rank();
  std::vector<int64_t> batch;
  for (int64_t i = 0; i < rank - 2; ++i) batch.push_back(i);
  Value out = left ? b.dot_general(q, c, batch, batch, {rank - 1}, {rank - 2}, b.dtype(c))
                   : b.dot_general(c, q, batch, batch, {rank - 1}, {rank - 2}, b.dtype(c));
  return finish_all(op, {{out, other.scalar_type()}})[0];
}
Tensor& ormqr_out(const Tensor& reflectors, const Tensor& tau, const Tensor& other, bool left, bool transpose, Tensor& out) {
  return write_out("ormqr", ormqr_k(reflectors, tau, other, left, transpose), out);
}

// ---------------------------------------------------------------- LU family

// CPU's det and slogdet factor A^T when A is contiguous and real (LAPACK
// is column-major), and their backward formulas read the factors that way: so
// do the same, or the gradients would be of the transposed system.
bool factor_transposed(const Tensor& a) { return a.is_contiguous() && !a.is_complex(); }
Value factor_input(OpBuilder& op, const Tensor& a) {
  Value v = op.input(a);
  return factor_transposed(a) ? L::matrix_transpose(op.b(), v, false) : v;
}

void check_pivot(const char* name, bool pivot) {
  TORCH_CHECK(pivot, name, ": LU without pivoting is not implemented on the CPU");
}

std::tuple<Tensor, Tensor, Tensor> lu_factor_ex_k(const Tensor& a, bool pivot, bool check_errors) {
  check_matrix("torch.lu_factor", a, false);
  check_pivot("linalg.lu_factor", pivot);
  OpBuilder op("aten::linalg_lu_factor_ex");
  auto r = L::lu_factor(op.b(), op.input(a));
  auto t = finish_all(op, {{r[0], a.scalar_type(), true}, {r[1], at::kInt}, {r[3], at::kInt}});
  if (check_errors) at::_linalg_check_errors(t[2], "torch.linalg.lu_factor_ex", a.dim() == 2);
  return {t[0], t[1], t[2]};
}
std::tuple<Tensor&, Tensor&, Tensor&> lu_factor_ex_out(const Tensor& a, bool pivot, bool check_errors, Tensor& lu,
                                                        Tensor& piv, Tensor& info) {
  auto [l, p, i] = lu_factor_ex_k(a, pivot, check_errors);
  write_outs("linalg.lu_factor_ex", {l, p, i}, {lu, piv, info});
  return {lu, piv, info};
}

// P, L, U from a packed LU and its permutation, inside the same program.
std::vector<Value> unpack_k(ir::Builder& b, Value lu, Value perm, int64_t m, int64_t n) {
  int64_t k = std::min(m, n);
  int64_t r = b.type(lu).rank();
  auto corner = [&](int64_t rows, int64_t cols) {
    std::vector<int64_t> limit = b.dims(lu);
    limit[r - 2] = rows;
    limit[r - 1] = cols;
    return b.slice(lu, std::vector<int64_t>(r, 0), limit, std::vector<int64_t>(r, 1));
  };
  std::vector<int64_t> batch(b.dims(lu).begin(), b.dims(lu).end() - 2);
  Value l = L::tril(b, corner(m, k), -1);
  std::vector<int64_t> ld = b.dims(l);
  Value unit = b.convert(b.compare(b.iota(ir::DType::S64, ld, r - 2), b.iota(ir::DType::S64, ld, r - 1), "EQ"), b.dtype(lu));
  l = b.binary("add", l, unit);
  Value u = L::triu(b, corner(k, n), 0);
  return {L::permutation_matrix(b, perm, b.dtype(lu)), l, u};
}

std::tuple<Tensor, Tensor, Tensor> linalg_lu_k(const Tensor& a, bool pivot) {
  check_matrix("linalg.lu", a, false);
  check_pivot("linalg.lu", pivot);
  OpBuilder op("aten::linalg_lu");
  auto& b = op.b();
  auto r = L::lu_factor(b, op.input(a));
  auto plu = unpack_k(b, r[0], r[2], a.size(-2), a.size(-1));
  auto t = finish_all(op, {{plu[0], a.scalar_type()}, {plu[1], a.scalar_type()}, {plu[2], a.scalar_type()}});
  return {t[0], t[1], t[2]};
}
std::tuple<Tensor&, Tensor&, Tensor&> linalg_lu_out(const Tensor& a, bool pivot, Tensor& p, Tensor& l, Tensor& u) {
  auto [ps, ls, us] = linalg_lu_k(a, pivot);
  write_outs("linalg.lu", {ps, ls, us}, {p, l, u});
  return {p, l, u};
}

std::tuple<Tensor, Tensor, Tensor> lu_unpack_k(const Tensor& lu, const Tensor& pivots, bool unpack_data, bool unpack_pivots) {
  TORCH_CHECK(lu.dim() >= 2, "torch.lu_unpack: Expected tensor with 2 or more dimensions. Got size: ", lu.sizes(), " instead");
  TORCH_CHECK(pivots.scalar_type() == at::kInt, "torch.lu_unpack: LU_pivots is expected to be a contiguous tensor of torch.int32 dtype.");
  int64_t m = lu.size(-2), n = lu.size(-1);
  OpBuilder op("aten::lu_unpack");
  auto& b = op.b();
  Value perm = L::permutation_of_pivots(b, op.input(pivots), m);
  auto plu = unpack_k(b, op.input(lu), perm, m, n);
  std::vector<Result> results;
  if (unpack_pivots) results.push_back({plu[0], lu.scalar_type()});
  if (unpack_data) {
    results.push_back({plu[1], lu.scalar_type()});
    results.push_back({plu[2], lu.scalar_type()});
  }
  auto t = finish_all(op, results);
  Tensor empty = at::empty({0}, lu.options());
  size_t i = 0;
  Tensor p = unpack_pivots ? t[i++] : empty;
  Tensor l = unpack_data ? t[i++] : empty;
  Tensor u = unpack_data ? t[i++] : empty;
  return {p, l, u};
}
std::tuple<Tensor&, Tensor&, Tensor&> lu_unpack_out(const Tensor& lu, const Tensor& pivots, bool unpack_data,
                                                     bool unpack_pivots, Tensor& p, Tensor& l, Tensor& u) {
  auto [ps, ls, us] = lu_unpack_k(lu, pivots, unpack_data, unpack_pivots);
  write_outs("lu_unpack", {ps, ls, us}, {p, l, u});
  return {p, l, u};
}

// Solves op(A) X = B (left) or X op(A) = B from A's LU; the right-hand forms
// are left solves of the transposed system.
Value lu_solve_value(ir::Builder& b, Value lu, Value perm, Value rhs, bool left, bool adjoint) {
  if (left) return L::lu_solve(b, lu, perm, rhs, adjoint ? "H" : "N");
  // X A = B  <=>  A^T X^T = B^T;  X A^H = B  <=>  A X^H = B^H.
  if (!adjoint) return L::matrix_transpose(b, L::lu_solve(b, lu, perm, L::matrix_transpose(b, rhs, false), "T"), false);
  return L::matrix_transpose(b, L::lu_solve(b, lu, perm, L::matrix_transpose(b, rhs, true), "N"), true);
}

Tensor lu_solve_k(const Tensor& lu, const Tensor& pivots, const Tensor& rhs, bool left, bool adjoint) {
  check_matrix("linalg.lu_solve", lu);
  check_rhs("linalg.lu_solve", "LU", lu, rhs, left);
  int64_t n = lu.size(-1);
  auto [le, be] = broadcast_batches(lu, rhs);
  std::vector<int64_t> pshape = vec(le.sizes());
  pshape.pop_back();
  Tensor pe = pivots.expand(pshape);
  OpBuilder op("aten::linalg_lu_solve");
  auto& b = op.b();
  Value perm = L::permutation_of_pivots(b, op.input(pe), n);
  Value x = lu_solve_value(b, op.input(le), perm, op.input(be), left, adjoint);
  return finish_all(op, {{x, rhs.scalar_type()}})[0];
}
Tensor& lu_solve_out(const Tensor& lu, const Tensor& pivots, const Tensor& rhs, bool left, bool adjoint, Tensor& out) {
  return write_out("linalg.lu_solve", lu_solve_k(lu, pivots, rhs, left, adjoint), out);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> solve_ex_k(const Tensor& a, const Tensor& rhs, bool left, bool check_errors) {
  check_matrix("linalg.solve", a);
  TORCH_CHECK(a.scalar_type() == rhs.scalar_type(), "linalg.solve: Expected A and B to have the same dtype, but found A of type ",
              a.scalar_type(), " and B of type ", rhs.scalar_type(), " instead");
  // B is a vector (batch) when it has one dim less than A and matches A's leading shape.
  bool vector_case = rhs.dim() == 1 || (a.dim() - 1 == rhs.dim() && rhs.sizes().equals(a.sizes().slice(0, a.dim() - 1)));
  Tensor b2 = vector_case ? rhs.unsqueeze(left ? -1 : -2) : rhs;
  int64_t n = a.size(-1);
  TORCH_CHECK((left ? b2.size(-2) : b2.size(-1)) == n, "linalg.solve: Incompatible shapes of A and B for the equation ",
              left ? "AX = B" : "XA = B", " (", a.size(-2), "x", a.size(-1), " and ", b2.size(-2), "x", b2.size(-1), ")");
  auto [ae, be] = broadcast_batches(a, b2);
  OpBuilder op("aten::_linalg_solve_ex");
  auto& b = op.b();
  // The factorization is of A itself (not broadcast), as the CPU kernel returns it.
  auto f = L::lu_factor(b, op.input(ae));  // of A itself (unlike det), as CPU's solve returns it
  Value x = lu_solve_value(b, f[0], f[2], op.input(be), left, false);
  if (vector_case) x = b.reshape(x, [&] {
      std::vector<int64_t> d = b.dims(x);
      d.erase(d.end() - (left ? 1 : 2));
      return d;
    }());
  auto t = finish_all(op, {{x, rhs.scalar_type(), !vector_case}, {f[0], a.scalar_type(), true}, {f[1], at::kInt},
                           {f[3], at::kInt}});
  if (check_errors) at::_linalg_check_errors(t[3], "torch.linalg.solve_ex", a.dim() == 2);
  return {t[0], t[1], t[2], t[3]};
}
std::tuple<Tensor&, Tensor&, Tensor&, Tensor&> solve_ex_out(const Tensor& a, const Tensor& rhs, bool left, bool check_errors,
                                                            Tensor& result, Tensor& lu, Tensor& piv, Tensor& info) {
  auto [x, l, p, i] = solve_ex_k(a, rhs, left, check_errors);
  write_outs("linalg.solve_ex", {x, l, p, i}, {result, lu, piv, info});
  return {result, lu, piv, info};
}

std::tuple<Tensor, Tensor> inv_ex_k(const Tensor& a, bool check_errors) {
  check_matrix("linalg.inv", a);
  OpBuilder op("aten::linalg_inv_ex");
  auto& b = op.b();
  auto f = L::lu_factor(b, op.input(a));
  Value eye = L::eye(b, to_ir(a.scalar_type()), vec(a.sizes().slice(0, a.dim() - 2)), a.size(-1));
  Value x = L::lu_solve(b, f[0], f[2], eye, "N");
  auto t = finish_all(op, {{x, a.scalar_type(), true}, {f[3], at::kInt}});
  if (check_errors) at::_linalg_check_errors(t[1], "linalg.inv_ex", a.dim() == 2);
  return {t[0], t[1]};
}
std::tuple<Tensor&, Tensor&> inv_ex_out(const Tensor& a, bool check_errors, Tensor& inverse, Tensor& info) {
  auto [x, i] = inv_ex_k(a, check_errors);
  write_outs("linalg.inv_ex", {x, i}, {inverse, info});
  return {inverse, info};
}

std::tuple<Tensor, Tensor, Tensor> det_k(const Tensor& a) {
  check_matrix("linalg.det", a);
  OpBuilder op("aten::_linalg_det");
  auto& b = op.b();
  auto f = L::lu_factor(b, factor_input(op, a));
  auto t = finish_all(op, {{L::lu_det(b, f[0], f[1]), a.scalar_type()}, {f[0], a.scalar_type()}, {f[1], at::kInt}});
  return {t[0], t[1], t[2]};
}
std::tuple<Tensor&, Tensor&, Tensor&> det_out(const Tensor& a, Tensor& result, Tensor& lu, Tensor& piv) {
  auto [d, l, p] = det_k(a);
  write_outs("linalg.det", {d, l, p}, {result, lu, piv});
  return {result, lu, piv};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> slogdet_k(const Tensor& a) {
  check_matrix("linalg.slogdet", a);
  OpBuilder op("aten::_linalg_slogdet");
  auto& b = op.b();
  auto f = L::lu_factor(b, factor_input(op, a));
  auto sl = L::lu_slogdet(b, f[0], f[1]);
  auto t = finish_all(op, {{sl[0], a.scalar_type()}, {sl[1], at::toRealValueType(a.scalar_type())},
                           {f[0], a.scalar_type()}, {f[1], at::kInt}});
  return {t[0], t[1], t[2], t[3]};
}
std::tuple<Tensor&, Tensor&, Tensor&, Tensor&> slogdet_out(const Tensor& a, Tensor& sign, Tensor& logabs, Tensor& lu,
                                                           Tensor& piv) {
  auto [s, l, f, p] = slogdet_k(a);
  write_outs("linalg.slogdet", {s, l, f, p}, {sign, logabs, lu, piv});
  return {sign, logabs, lu, piv};
}

Tensor matrix_exp_k(const Tensor& a) {
  at::ScalarType t = a.scalar_type();
  bool half = t == at::kHalf || t == at::kBFloat16;  // CPU has these too; computed in float32
  check_matrix("linalg.matrix_exp", a, true, half);
  OpBuilder op("aten::linalg_matrix_exp");
  auto& b = op.b();
  Value x = half ? b.convert(op.input(a), ir::DType::F32) : op.input(a);
  return finish_all(op, {{b.convert(L::matrix_exp(b, x), to_ir(t)), t}})[0];
}

// Least squares, per LAPACK driver as CPU: gels and gelsy by QR (gelsy's rank
// from the singular values; rank-deficient systems, where gelsy's basic
// solution is defined by its pivoting, go to the CPU kernel, counted), gelsd
// and gelss by the SVD (minimum-norm solutions, singular values returned).
std::tuple<Tensor, Tensor, Tensor, Tensor> lstsq_k(const Tensor& a, const Tensor& b_in, std::optional<double> rcond,
                                                   std::optional<c10::string_view> driver_opt) {
  check_matrix("torch.linalg.lstsq", a, false);
  std::string driver(driver_opt.value_or("gelsy"));
  TORCH_CHECK(driver == "gels" || driver == "gelsy" || driver == "gelsd" || driver == "gelss",
              "torch.linalg.lstsq: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)");
  TORCH_CHECK(a.scalar_type() == b_in.scalar_type(), "torch.linalg.lstsq: Expected input and other to have the same dtype, but got input's dtype ",
              a.scalar_type(), " and other's dtype ", b_in.scalar_type());
  bool vector_case = b_in.dim() == a.dim() - 1;
  Tensor rhs = vector_case ? b_in.unsqueeze(-1) : b_in;
  int64_t m = a.size(-2), n = a.size(-1), k = std::min(m, n);
  TORCH_CHECK(rhs.size(-2) == m, "torch.linalg.lstsq: input.size(-2) should match other.size(-2)");
  auto [ae, be] = broadcast_batches(a, rhs);
  double eps = a.scalar_type() == at::kDouble || a.scalar_type() == at::kComplexDouble ? 2.220446049250313e-16 : 1.1920928955078125e-07;
  double rc = rcond.value_or(eps * static_cast<double>(std::max(m, n)));
  Tensor empty = at::empty({0}, a.options().dtype(at::toRealValueType(a.scalar_type())));
  Tensor empty_long = at::empty({0}, a.options().dtype(at::kLong));
  auto rank_of = [&](const Tensor& sv) {
    Tensor top = std::get<0>(sv.max(-1, /*keepdim=*/true));
    return (sv > top * rc).sum(-1);
  };
  Tensor x, residuals = empty, rank = empty_long, singular_values = empty;
  if (driver == "gelsd" || driver == "gelss") {
    auto [u, sv, vh] = at::linalg_svd(ae, /*full_matrices=*/false);
    Tensor top = std::get<0>(sv.max(-1, /*keepdim=*/true));
    Tensor keep = sv > top * rc;
    Tensor inv = at::where(keep, 1.0 / sv, at::zeros_like(sv)).to(a.scalar_type());
    x = at::matmul(vh.mH(), inv.unsqueeze(-1) * at::matmul(u.mH(), be));
    rank = keep.sum(-1);
    singular_values = sv;
  } else {
    if (driver == "gelsy") {
      rank = rank_of(at::linalg_svdvals(ae));
      if (rank.numel() > 0 && rank.min().item<int64_t>() < k) {  // one host read
        static auto handle = c10::Dispatcher::singleton().findSchemaOrThrow("aten::linalg_lstsq", "");
        torch::jit::Stack stack{a, b_in, rcond, driver_opt};
        run_on_cpu(handle, &stack);
        return {stack[0].toTensor(), stack[1].toTensor(), stack[2].toTensor(), stack[3].toTensor()};
      }
    }
    if (m >= n) {
      auto [q, r] = at::linalg_qr(ae, "reduced");
      x = at::linalg_solve_triangular(r, at::matmul(q.mH(), be), /*upper=*/true);
    } else {
      auto [q, r] = at::linalg_qr(ae.mH(), "reduced");
      x = at::matmul(q, at::linalg_solve_triangular(r.mH(), be, /*upper=*/false));
    }
  }
  // Squared residuals: for m > n, when every matrix has full rank (gels assumes it).
  bool want_residuals = m > n && driver != "gelsy" &&
                        (driver == "gels" || (rank.numel() > 0 && rank.min().item<int64_t>() == n));
  if (want_residuals) residuals = (at::matmul(ae, x) - be).abs().pow(2).sum(-2);
  if (vector_case) x = x.squeeze(-1);  // residuals keep their trailing 1, as on CPU
  return {x, residuals, rank, singular_values};
}
std::tuple<Tensor&, Tensor&, Tensor&, Tensor&> lstsq_out(const Tensor& a, const Tensor& b, std::optional<double> rcond,
                                                         std::optional<c10::string_view> driver, Tensor& solution,
                                                         Tensor& residuals, Tensor& rank, Tensor& singular_values) {
  auto [x, r, k, s] = lstsq_k(a, b, rcond, driver);
  write_outs("linalg.lstsq", {x, r, k, s}, {solution, residuals, rank, singular_values});
  return {solution, residuals, rank, singular_values};
}

// ---------------------------------------------------------------- SVD

std::tuple<Tensor, Tensor, Tensor> svd_k(const Tensor& a, bool full_matrices, bool compute_uv,
                                       std::optional<c10::string_view> driver) {
  check_matrix("linalg.svd", a, false);
  TORCH_CHECK(!driver.has_value(), "torch.linalg.svd: keyword argument `driver=` is only supported on CUDA inputs with cuSOLVER backend.");
  OpBuilder op("aten::_linalg_svd");
  auto r = L::svd(op.b(), op.input(a), full_matrices && compute_uv);
  at::ScalarType real = at::toRealValueType(a.scalar_type());
  if (!compute_uv) {
    Tensor s = finish_all(op, {{r[1], real}})[0];
    Tensor empty = at::empty({0}, a.options());
    return {empty, s, empty};
  }
  auto t = finish_all(op, {{r[0], a.scalar_type()}, {r[1], real}, {r[2], a.scalar_type()}});
  return {t[0], t[1], t[2]};
}
std::tuple<Tensor&, Tensor&, Tensor&> svd_out(const Tensor& a, bool full_matrices, bool compute_uv,
                                              std::optional<c10::string_view> driver, Tensor& u, Tensor& s, Tensor& vh) {
  auto [us, ss, vs] = svd_k(a, full_matrices, compute_uv, driver);
  write_outs("linalg.svd", {us, ss, vs}, {u, s, vh});
  return {u, s, vh};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("linalg_cholesky_ex", cholesky_ex_k);
  m.impl("linalg_cholesky_ex.L", cholesky_ex_out);
  m.impl("cholesky", cholesky_old);
  m.impl("cholesky.out", cholesky_old_out);
  m.impl("_cholesky_solve_helper", cholesky_solve_helper);
  m.impl("cholesky_inverse", cholesky_inverse_k);
  m.impl("cholesky_inverse.out", cholesky_inverse_out);
  m.impl("linalg_solve_triangular", solve_triangular_k);
  m.impl("linalg_solve_triangular.out", solve_triangular_out);
  m.impl("triangular_solve", triangular_solve_k);
  m.impl("triangular_solve.X", triangular_solve_out);
  m.impl("_linalg_eigh", eigh_k);
  m.impl("_linalg_eigh.eigenvalues", eigh_out);
  m.impl("linalg_qr", qr_k);
  m.impl("linalg_qr.out", qr_out);
  m.impl("geqrf", geqrf_k);
  m.impl("geqrf.a", geqrf_out);
  m.impl("linalg_householder_product", householder_product_k);
  m.impl("linalg_householder_product.out", householder_product_out);
  m.impl("ormqr", ormqr_k);
  m.impl("ormqr.out", ormqr_out);
  m.impl("linalg_lu_factor_ex", lu_factor_ex_k);
  m.impl("linalg_lu_factor_ex.out", lu_factor_ex_out);
  m.impl("linalg_lu", linalg_lu_k);
  m.impl("linalg_lu.out", linalg_lu_out);
  m.impl("lu_unpack", lu_unpack_k);
  m.impl("lu_unpack.out", lu_unpack_out);
  m.impl("linalg_lu_solve", lu_solve_k);
  m.impl("linalg_lu_solve.out", lu_solve_out);
  m.impl("_linalg_solve_ex", solve_ex_k);
  m.impl("_linalg_solve_ex.result", solve_ex_out);
  m.impl("linalg_inv_ex", inv_ex_k);
  m.impl("linalg_inv_ex.inverse", inv_ex_out);
  m.impl("_linalg_det", det_k);
  m.impl("_linalg_det.result", det_out);
  m.impl("_linalg_slogdet", slogdet_k);
  m.impl("_linalg_slogdet.sign", slogdet_out);
  m.impl("linalg_matrix_exp", matrix_exp_k);
  m.impl("linalg_lstsq", lstsq_k);
  m.impl("linalg_lstsq.out", lstsq_out);
  m.impl("_linalg_svd", svd_k);
  m.impl("_linalg_svd.U", svd_out);
}

}  // namespace torch_pjrt::device
