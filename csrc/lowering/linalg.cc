#include "lowering/linalg.h"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "lowering/ops.h"

namespace torch_pjrt::lowering {
namespace {

int64_t rank_of(Builder& b, Value v) { return b.type(v).rank(); }

// Mask [..., m, n] comparing (col - row) with k.
Value band_mask(Builder& b, const std::vector<int64_t>& dims, int64_t k, const std::string& direction) {
  int64_t r = static_cast<int64_t>(dims.size());
  Value diff = b.binary("subtract", b.iota(DType::S64, dims, r - 1), b.iota(DType::S64, dims, r - 2));
  return b.compare(diff, b.constant_int(DType::S64, k, dims), direction);
}

// Sum over the last dim (of s64 / float).
Value sum_last(Builder& b, Value v) {
  int64_t r = rank_of(b, v);
  DType d = b.dtype(v);
  return b.reduce_simple(v, b.constant(d, 0), {r - 1}, "add");
}

// i == j masks over [..., n] against a per-batch index [...] (s64).
Value one_hot_rows(Builder& b, Value index, const std::vector<int64_t>& dims) {
  int64_t r = static_cast<int64_t>(dims.size());
  std::vector<int64_t> batch(dims.begin(), dims.end() - 1);
  std::vector<int64_t> map(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) map[i] = static_cast<int64_t>(i);
  return b.compare(b.iota(DType::S64, dims, r - 1), b.broadcast_in_dim(index, dims, map), "EQ");
}

// Swaps entries k and p[...] of v [..., m] (or rows of v [..., m, n] when rows).
Value swap(Builder& b, Value v, Value k_scalar, Value p, bool rows) {
  const auto& dims = b.dims(v);
  int64_t r = static_cast<int64_t>(dims.size());
  std::vector<int64_t> vec_dims(dims.begin(), dims.end() - (rows ? 1 : 0));
  int64_t vr = static_cast<int64_t>(vec_dims.size());
  Value is_k = b.compare(b.iota(DType::S64, vec_dims, vr - 1), b.broadcast_to(k_scalar, vec_dims), "EQ");
  Value is_p = one_hot_rows(b, p, vec_dims);
  Value zero = b.constant(b.dtype(v), 0, dims);
  auto expand = [&](Value mask) {
    if (!rows) return mask;
    std::vector<int64_t> map(vr);
    for (int64_t i = 0; i < vr; ++i) map[i] = i;
    return b.broadcast_in_dim(mask, dims, map);
  };
  Value mk = expand(is_k), mp = expand(is_p);
  // The entry (row) at k and at p, broadcast back over the swapped axis.
  Value at_k = b.reduce_simple(b.select(mk, v, zero), b.constant(b.dtype(v), 0), {rows ? r - 2 : r - 1}, "add");
  Value at_p = b.reduce_simple(b.select(mp, v, zero), b.constant(b.dtype(v), 0), {rows ? r - 2 : r - 1}, "add");
  std::vector<int64_t> map;
  for (int64_t i = 0; i < r; ++i)
    if (i != (rows ? r - 2 : r - 1)) map.push_back(i);
  Value bk = b.broadcast_in_dim(at_k, dims, map), bp = b.broadcast_in_dim(at_p, dims, map);
  return b.select(mk, bp, b.select(mp, bk, v));
}

}  // namespace

Value matrix_transpose(Builder& b, Value a, bool conj) {
  int64_t r = rank_of(b, a);
  std::vector<int64_t> perm(r);
  for (int64_t i = 0; i < r; ++i) perm[i] = i;
  std::swap(perm[r - 1], perm[r - 2]);
  Value t = b.transpose(a, perm);
  return conj ? b.conj(t) : t;
}

Value eye(Builder& b, DType dtype, const std::vector<int64_t>& batch, int64_t n) {
  std::vector<int64_t> dims = batch;
  dims.push_back(n);
  dims.push_back(n);
  return b.convert(band_mask(b, dims, 0, "EQ"), dtype);
}

Value tril(Builder& b, Value a, int64_t k) {
  return b.select(band_mask(b, b.dims(a), k, "LE"), a, b.scalar_like(a, 0));
}

Value triu(Builder& b, Value a, int64_t k) {
  return b.select(band_mask(b, b.dims(a), k, "GE"), a, b.scalar_like(a, 0));
}

Value diagonal(Builder& b, Value a) {
  const auto& d = b.dims(a);
  int64_t r = static_cast<int64_t>(d.size());
  int64_t k = std::min(d[r - 2], d[r - 1]);
  std::vector<int64_t> limit = d;
  limit[r - 2] = limit[r - 1] = k;
  Value sq = b.slice(a, std::vector<int64_t>(r, 0), limit, std::vector<int64_t>(r, 1));
  Value masked = b.select(band_mask(b, b.dims(sq), 0, "EQ"), sq, b.scalar_like(sq, 0));
  return sum_last(b, masked);
}

std::vector<Value> cholesky(Builder& b, Value a, bool upper) {
  Value f = b.cholesky(a, !upper);
  f = upper ? triu(b, f, 0) : tril(b, f, 0);
  Value diag = b.real(diagonal(b, f));
  Value bad = b.binary("or", b.compare(diag, diag, "NE"), b.compare(diag, b.scalar_like(diag, 0), "LE"));
  const auto& dd = b.dims(diag);
  int64_t r = static_cast<int64_t>(dd.size());
  Value pos = b.binary("add", b.iota(DType::S32, dd, r - 1), b.constant_int(DType::S32, 1, dd));
  Value big = b.constant_int(DType::S32, std::numeric_limits<int32_t>::max(), dd);
  Value first = b.reduce_simple(b.select(bad, pos, big), b.constant_int(DType::S32, std::numeric_limits<int32_t>::max()),
                                {r - 1}, "minimum");
  Value none = b.compare(first, b.constant_int(DType::S32, std::numeric_limits<int32_t>::max(), b.dims(first)), "EQ");
  Value info = b.select(none, b.constant_int(DType::S32, 0, b.dims(first)), first);
  return {f, info};
}

std::vector<Value> eigh(Builder& b, Value a, bool lower) {
  // Symmetrize from the triangle torch reads, so the other one never matters.
  Value t = lower ? tril(b, a, -1) : triu(b, a, 1);
  Value d = b.select(band_mask(b, b.dims(a), 0, "EQ"), a, b.scalar_like(a, 0));
  if (ir::is_complex(b.dtype(d))) d = b.complex(b.real(d), b.scalar_like(b.real(d), 0));
  Value sym = b.binary("add", b.binary("add", t, matrix_transpose(b, t, true)), d);
  DType real = ir::component_type(b.dtype(a));
  std::vector<int64_t> wdims = b.dims(a);
  wdims.pop_back();
  double tol = real == DType::F64 ? 1e-15 : 1e-7;
  char config[64];
  std::snprintf(config, sizeof(config), "1,1,100,%g", tol);
  auto vw = b.custom_call("Eigh", {sym}, {b.type(a), ir::Type{real, wdims}}, config);
  return {vw[1], vw[0]};
}

std::vector<Value> geqrf(Builder& b, Value a) {
  const auto& d = b.dims(a);
  int64_t r = static_cast<int64_t>(d.size());
  std::vector<int64_t> tdims(d.begin(), d.end() - 2);
  tdims.push_back(std::min(d[r - 2], d[r - 1]));
  return b.custom_call("Qr", {a}, {b.type(a), ir::Type{b.dtype(a), tdims}});
}

Value householder_product(Builder& b, Value reflectors, Value tau) {
  return b.custom_call("ProductOfElementaryHouseholderReflectors", {reflectors, tau}, {b.type(reflectors)})[0];
}

std::vector<Value> qr(Builder& b, Value a, const std::string& mode) {
  const auto& d = b.dims(a);
  int64_t r = static_cast<int64_t>(d.size());
  int64_t m = d[r - 2], n = d[r - 1], k = std::min(m, n);
  auto f = geqrf(b, a);
  bool complete = mode == "complete";
  // R: the upper triangle of the leading rows (all m of them when complete).
  int64_t r_rows = complete ? m : k;
  std::vector<int64_t> limit = d;
  limit[r - 2] = r_rows;
  Value R = triu(b, b.slice(f[0], std::vector<int64_t>(r, 0), limit, std::vector<int64_t>(r, 1)), 0);
  if (mode == "r") {
    return {b.constant(b.dtype(a), 0, {0}), R};  // CPU's Q for mode "r": empty, 1-d
  }
  // Q from the reflectors: [m, k] (reduced) or [m, m] (complete, the reflectors padded with zero columns).
  Value refl = f[0];
  int64_t q_cols = complete ? m : k;
  if (q_cols < n) {
    std::vector<int64_t> lim = d;
    lim[r - 1] = q_cols;
    refl = b.slice(refl, std::vector<int64_t>(r, 0), lim, std::vector<int64_t>(r, 1));
  } else if (q_cols > n) {
    std::vector<int64_t> lo(r, 0), hi(r, 0), in(r, 0);
    hi[r - 1] = q_cols - n;
    refl = b.pad(refl, b.constant(b.dtype(refl), 0), lo, hi, in);
  }
  Value Q = householder_product(b, refl, f[1]);
  return {Q, R};
}

std::vector<Value> lu_factor(Builder& b, Value a) {
  const auto& d = b.dims(a);
  int64_t r = static_cast<int64_t>(d.size());
  int64_t m = d[r - 2], n = d[r - 1], k = std::min(m, n);
  std::vector<int64_t> batch(d.begin(), d.end() - 2);
  std::vector<int64_t> pdims = batch, permdims = batch;
  pdims.push_back(k);
  permdims.push_back(m);
  Value perm0 = b.iota(DType::S32, permdims, r - 2);
  if (b.type(a).numel() == 0) {
    // No elimination step (XLA refuses the loop's column slices of a zero-size dim):
    // identity pivots, info 0.
    Value piv = b.binary("add", b.iota(DType::S32, pdims, r - 2), b.constant_int(DType::S32, 1, pdims));
    return {a, piv, perm0, b.constant_int(DType::S32, 0, batch)};
  }
  Value piv0 = b.constant_int(DType::S32, 0, pdims);
  Value k0 = b.constant_int(DType::S64, 0);
  auto out = b.while_loop(
      {k0, a, perm0, piv0},
      [k](Builder& c, const std::vector<Value>& s) { return c.compare(s[0], c.constant_int(DType::S64, k), "LT"); },
      [&](Builder& c, const std::vector<Value>& s) -> std::vector<Value> {
        Value step = s[0], A = s[1], perm = s[2], piv = s[3];
        const auto& ad = c.dims(A);
        std::vector<int64_t> col_dims(ad.begin(), ad.end() - 1);  // [..., m]
        int64_t cr = static_cast<int64_t>(col_dims.size());
        std::vector<Value> starts(r, c.constant_int(DType::S64, 0));
        starts[r - 1] = step;
        std::vector<int64_t> sizes = ad;
        sizes[r - 1] = 1;
        Value col = c.reshape(c.dynamic_slice(A, starts, sizes), col_dims);
        // Pivot: the largest magnitude at or below the diagonal, first on ties; for complex
        // entries |re| + |im|, as LAPACK's i?amax measures it.
        Value rows = c.iota(DType::S64, col_dims, cr - 1);
        Value below = c.compare(rows, c.broadcast_to(step, col_dims), "GE");
        Value mag = ir::is_complex(c.dtype(col)) ? c.binary("add", c.unary("abs", c.real(col)), c.unary("abs", c.imag(col)))
                                                 : c.unary("abs", col);
        Value cand = c.select(below, mag, c.scalar_like(mag, -1));
        Value p = arg_reduce(c, cand, cr - 1, false, true)[1];  // [...] s64
        A = swap(c, A, step, p, true);
        perm = swap(c, perm, step, p, false);
        std::vector<Value> pstarts(r - 1, c.constant_int(DType::S64, 0));
        pstarts[r - 2] = step;
        std::vector<int64_t> one = c.dims(piv);
        one[r - 2] = 1;
        piv = c.dynamic_update_slice(piv, c.reshape(c.convert(c.binary("add", p, c.scalar_like(p, 1)), DType::S32), one),
                                     pstarts);
        // Eliminate below the pivot; multipliers stored in place (L's column).
        col = c.reshape(c.dynamic_slice(A, starts, sizes), col_dims);
        std::vector<Value> rstarts(r, c.constant_int(DType::S64, 0));
        rstarts[r - 2] = step;
        std::vector<int64_t> rsizes = ad;
        rsizes[r - 2] = 1;
        Value row = c.dynamic_slice(A, rstarts, rsizes);  // [..., 1, n]
        std::vector<int64_t> row_dims(ad.begin(), ad.end() - 2);
        row_dims.push_back(ad[r - 1]);
        row = c.reshape(row, row_dims);
        std::vector<int64_t> map(r - 2);
        for (int64_t i = 0; i < r - 2; ++i) map[i] = i;
        // The pivot per batch: col at row `step`.
        Value at_step = c.compare(rows, c.broadcast_to(step, col_dims), "EQ");
        Value pv = c.reduce_simple(c.select(at_step, col, c.scalar_like(col, 0)), c.constant(c.dtype(col), 0), {cr - 1},
                                   "add");
        Value pvb = c.broadcast_in_dim(pv, col_dims, map);
        Value strictly_below = c.compare(rows, c.broadcast_to(step, col_dims), "GT");
        Value nonzero = c.compare(pvb, c.scalar_like(pvb, 0), "NE");
        Value l = c.select(c.binary("and", strictly_below, nonzero), c.binary("divide", col, c.select(nonzero, pvb, c.scalar_like(pvb, 1))),
                           c.scalar_like(col, 0));
        Value cols = c.iota(DType::S64, row_dims, r - 2);
        Value right = c.compare(cols, c.broadcast_to(step, row_dims), "GT");
        Value urow = c.select(right, row, c.scalar_like(row, 0));
        std::vector<int64_t> lmap = map, umap = map;
        lmap.push_back(r - 2);
        umap.push_back(r - 1);
        Value update = c.binary("multiply", c.broadcast_in_dim(l, ad, lmap), c.broadcast_in_dim(urow, ad, umap));
        A = c.binary("subtract", A, update);
        // Column `step` below the diagonal: the multipliers (when the pivot is zero, the column stays).
        Value in_col = c.compare(c.iota(DType::S64, ad, r - 1), c.broadcast_to(step, ad), "EQ");
        Value below_full = c.compare(c.iota(DType::S64, ad, r - 2), c.broadcast_to(step, ad), "GT");
        Value nz_full = c.broadcast_in_dim(c.compare(pv, c.scalar_like(pv, 0), "NE"), ad, map);
        Value put = c.binary("and", c.binary("and", in_col, below_full), nz_full);
        A = c.select(put, c.broadcast_in_dim(l, ad, lmap), A);
        return {c.binary("add", step, c.constant_int(DType::S64, 1)), A, perm, piv};
      });
  Value lu = out[1];
  Value diag = diagonal(b, lu);
  const auto& dd = b.dims(diag);
  int64_t dr = static_cast<int64_t>(dd.size());
  Value zero = b.compare(diag, b.scalar_like(diag, 0), "EQ");
  Value pos = b.binary("add", b.iota(DType::S32, dd, dr - 1), b.constant_int(DType::S32, 1, dd));
  int32_t big = std::numeric_limits<int32_t>::max();
  Value first = b.reduce_simple(b.select(zero, pos, b.constant_int(DType::S32, big, dd)), b.constant_int(DType::S32, big),
                                {dr - 1}, "minimum");
  Value none = b.compare(first, b.constant_int(DType::S32, big, b.dims(first)), "EQ");
  Value info = b.select(none, b.constant_int(DType::S32, 0, b.dims(first)), first);
  return {lu, out[3], out[2], info};
}

Value permutation_of_pivots(Builder& b, Value pivots, int64_t m) {
  const auto& pd = b.dims(pivots);
  int64_t r = static_cast<int64_t>(pd.size());
  int64_t k = pd[r - 1];
  std::vector<int64_t> permdims(pd.begin(), pd.end() - 1);
  permdims.push_back(m);
  Value perm0 = b.iota(DType::S32, permdims, r - 1);
  auto out = b.while_loop(
      {b.constant_int(DType::S64, 0), perm0, b.convert(pivots, DType::S32)},
      [k](Builder& c, const std::vector<Value>& s) { return c.compare(s[0], c.constant_int(DType::S64, k), "LT"); },
      [&](Builder& c, const std::vector<Value>& s) -> std::vector<Value> {
        Value step = s[0], perm = s[1], piv = s[2];
        const auto& vd = c.dims(piv);
        int64_t vr = static_cast<int64_t>(vd.size());
        Value at = c.compare(c.iota(DType::S64, vd, vr - 1), c.broadcast_to(step, vd), "EQ");
        Value p = c.reduce_simple(c.select(at, piv, c.scalar_like(piv, 0)), c.constant_int(DType::S32, 0), {vr - 1}, "add");
        p = c.binary("subtract", c.convert(p, DType::S64), c.constant_int(DType::S64, 1, c.dims(p)));
        perm = swap(c, perm, step, p, false);
        return {c.binary("add", step, c.constant_int(DType::S64, 1)), perm, piv};
      });
  return out[1];
}

Value permutation_matrix(Builder& b, Value perm, DType dtype) {
  // P[perm[i], i] = 1: A = P L U.
  const auto& pd = b.dims(perm);
  int64_t r = static_cast<int64_t>(pd.size());
  int64_t m = pd[r - 1];
  std::vector<int64_t> dims = pd;
  dims.push_back(m);  // [..., row, col]
  std::vector<int64_t> map;
  for (int64_t i = 0; i < r - 1; ++i) map.push_back(i);
  map.push_back(r);  // perm indexed by column
  Value pc = b.broadcast_in_dim(b.convert(perm, DType::S64), dims, map);
  return b.convert(b.compare(b.iota(DType::S64, dims, r - 1), pc, "EQ"), dtype);
}

namespace {
// Rows of x [..., m, k] reordered: out[i] = x[perm[i]] (perm [..., m]).
Value take_rows(Builder& b, Value x, Value perm) {
  const auto& xd = b.dims(x);
  int64_t r = static_cast<int64_t>(xd.size());
  std::vector<int64_t> map;
  for (int64_t i = 0; i < r - 1; ++i) map.push_back(i);
  Value index = b.broadcast_in_dim(b.convert(perm, DType::S64), xd, map);
  return gather(b, x, r - 2, index);
}

Value inverse_permutation(Builder& b, Value perm) {
  int64_t r = rank_of(b, perm);
  Value idx = b.iota(DType::S32, b.dims(perm), r - 1);
  return b.sort({perm, idx}, r - 1, false, false)[1];
}
}  // namespace

Value lu_solve(Builder& b, Value lu, Value perm, Value rhs, const std::string& op) {
  if (op == "N") {
    Value y = take_rows(b, rhs, perm);  // P^T B
    y = b.triangular_solve(lu, y, true, true, true, "NO_TRANSPOSE");
    return b.triangular_solve(lu, y, true, false, false, "NO_TRANSPOSE");
  }
  std::string t = op == "H" ? "ADJOINT" : "TRANSPOSE";
  // op(A) = op(U) op(L) P^T: X = P op(L)^-1 op(U)^-1 B.
  Value y = b.triangular_solve(lu, rhs, true, false, false, t);
  y = b.triangular_solve(lu, y, true, true, true, t);
  return take_rows(b, y, inverse_permutation(b, perm));
}

namespace {
// (-1)^(number of pivots that swap), as a value of dtype [...].
Value pivot_parity(Builder& b, Value pivots, DType dtype) {
  const auto& pd = b.dims(pivots);
  int64_t r = static_cast<int64_t>(pd.size());
  Value expected = b.binary("add", b.iota(DType::S32, pd, r - 1), b.constant_int(DType::S32, 1, pd));
  Value swapped = b.convert(b.compare(b.convert(pivots, DType::S32), expected, "NE"), DType::S32);
  Value count = b.reduce_simple(swapped, b.constant_int(DType::S32, 0), {r - 1}, "add");
  Value odd = b.compare(b.binary("remainder", count, b.constant_int(DType::S32, 2, b.dims(count))),
                        b.constant_int(DType::S32, 0, b.dims(count)), "NE");
  return b.select(odd, b.constant(dtype, -1, b.dims(count)), b.constant(dtype, 1, b.dims(count)));
}
}  // namespace

Value lu_det(Builder& b, Value lu, Value pivots) {
  Value diag = diagonal(b, lu);
  int64_t r = rank_of(b, diag);
  Value prod = b.reduce_simple(diag, b.constant(b.dtype(diag), 1), {r - 1}, "multiply");
  return b.binary("multiply", prod, pivot_parity(b, pivots, b.dtype(diag)));
}

std::vector<Value> lu_slogdet(Builder& b, Value lu, Value pivots) {
  Value diag = diagonal(b, lu);
  int64_t r = rank_of(b, diag);
  Value mag = b.unary("abs", diag);
  Value logabs = b.reduce_simple(b.unary("log", mag), b.constant(b.dtype(mag), 0), {r - 1}, "add");
  Value unit;
  if (ir::is_complex(b.dtype(diag))) {
    Value safe = b.select(b.compare(mag, b.scalar_like(mag, 0), "EQ"), b.scalar_like(mag, 1), mag);
    unit = b.complex(b.binary("divide", b.real(diag), safe), b.binary("divide", b.imag(diag), safe));
    unit = b.select(b.compare(mag, b.scalar_like(mag, 0), "EQ"), b.scalar_like(diag, 0), unit);
  } else {
    unit = sign(b, diag);
  }
  Value sign = b.reduce_simple(unit, b.constant(b.dtype(diag), 1), {r - 1}, "multiply");
  sign = b.binary("multiply", sign, pivot_parity(b, pivots, b.dtype(diag)));
  return {sign, logabs};
}

std::vector<Value> svd(Builder& b, Value a, bool full_matrices) {
  const auto& d = b.dims(a);
  int64_t r = static_cast<int64_t>(d.size());
  int64_t m = d[r - 2], n = d[r - 1], k = std::min(m, n);
  std::vector<int64_t> batch(d.begin(), d.end() - 2);
  // H = [[0, A], [A^H, 0]] has eigenvalues +-s_i (and |m - n| zeros) with
  // eigenvectors [u_i; +-v_i] / sqrt(2): backward stable, unlike A^H A.
  auto zeros = [&](int64_t rows, int64_t cols) {
    std::vector<int64_t> z = batch;
    z.push_back(rows);
    z.push_back(cols);
    return b.constant(b.dtype(a), 0, z);
  };
  Value top = b.concatenate({zeros(m, m), a}, r - 1);
  Value bottom = b.concatenate({matrix_transpose(b, a, true), zeros(n, n)}, r - 1);
  Value h = b.concatenate({top, bottom}, r - 2);
  auto wv = eigh(b, h, true);  // ascending: the k largest are the last k
  int64_t size = m + n;
  Value s = b.reverse(b.slice_dim(wv[0], r - 2, size - k, size), {r - 2});
  s = b.binary("maximum", s, b.scalar_like(s, 0));
  Value vecs = b.reverse(b.slice_dim(wv[1], r - 1, size - k, size), {r - 1});  // [..., m + n, k]
  Value root2 = b.scalar_like(b.slice_dim(vecs, r - 2, 0, m), std::sqrt(2.0));
  Value U = b.binary("multiply", b.slice_dim(vecs, r - 2, 0, m), root2);
  Value V = b.binary("multiply", b.slice_dim(vecs, r - 2, m, size), b.scalar_like(b.slice_dim(vecs, r - 2, m, size), std::sqrt(2.0)));
  // Vectors of zero (or repeated) singular values come from one degenerate
  // eigenspace of H and need not be unit or orthogonal: re-orthonormalize by QR,
  // keeping each well-determined column (R's diagonal phase undone).
  auto orthonormal = [&](Value basis) {
    auto f = geqrf(b, basis);
    Value q = householder_product(b, f[0], f[1]);
    Value diag = diagonal(b, f[0]);
    Value mag = b.unary("abs", diag);
    Value nonzero = b.compare(mag, b.scalar_like(mag, 0), "NE");
    Value safe = b.select(nonzero, mag, b.scalar_like(mag, 1));
    Value phase = ir::is_complex(b.dtype(diag))
                      ? b.complex(b.binary("divide", b.real(diag), safe), b.binary("divide", b.imag(diag), safe))
                      : b.binary("divide", diag, safe);
    phase = b.select(nonzero, phase, b.scalar_like(phase, 1));
    std::vector<int64_t> map;
    for (int64_t i = 0; i < r - 2; ++i) map.push_back(i);
    map.push_back(r - 1);
    return b.binary("multiply", q, b.broadcast_in_dim(phase, b.dims(q), map));
  };
  U = orthonormal(U);
  V = orthonormal(V);
  if (full_matrices) {
    // Complete the bases: Q of [U | 0] spans U's columns first; keep U itself there.
    auto complete = [&](Value basis, int64_t rows) {
      if (rows == k) return basis;
      std::vector<int64_t> lo(r, 0), hi(r, 0), in(r, 0);
      hi[r - 1] = rows - k;
      Value padded = b.pad(basis, b.constant(b.dtype(basis), 0), lo, hi, in);
      Value q = qr(b, padded, "complete")[0];
      return b.concatenate({basis, b.slice_dim(q, r - 1, k, rows)}, r - 1);
    };
    U = complete(U, m);
    V = complete(V, n);
  }
  // The zero matrix: identity bases, as LAPACK gives (any orthonormal pair is its SVD;
  // the nuclear norm's subgradient there, U Vh, is read from them).
  Value zero_entry = b.compare(b.unary("abs", a), b.scalar_like(b.unary("abs", a), 0), "EQ");
  Value all_zero = b.reduce_simple(zero_entry, b.constant_int(DType::Pred, 1), {r - 2, r - 1}, "and");
  std::vector<int64_t> bmap;
  for (int64_t i = 0; i < r - 2; ++i) bmap.push_back(i);
  auto identity_if_zero = [&](Value basis) {
    const auto& bd = b.dims(basis);
    Value ident = b.convert(b.compare(b.iota(DType::S64, bd, r - 2), b.iota(DType::S64, bd, r - 1), "EQ"), b.dtype(basis));
    return b.select(b.broadcast_in_dim(all_zero, bd, bmap), ident, basis);
  };
  U = identity_if_zero(U);
  V = identity_if_zero(V);
  return {U, s, matrix_transpose(b, V, true)};
}

Value matrix_exp(Builder& b, Value a) {
  const auto& d = b.dims(a);
  int64_t r = static_cast<int64_t>(d.size());
  int64_t n = d[r - 1];
  std::vector<int64_t> batch(d.begin(), d.end() - 2);
  DType dt = b.dtype(a);
  DType real = ir::component_type(dt);
  std::vector<int64_t> bdims;
  for (int64_t i = 0; i < r - 2; ++i) bdims.push_back(i);
  auto mm = [&](Builder& bb, Value x, Value y) {
    return bb.dot_general(x, y, bdims, bdims, {r - 1}, {r - 2}, dt);
  };
  // s = max(0, ceil(log2(||A||_1))) per matrix.
  Value col_sums = b.reduce_simple(b.unary("abs", a), b.constant(real, 0), {r - 2}, "add");  // [..., n]
  Value norm = b.reduce_simple(col_sums, b.constant(real, 0), {r - 2}, "maximum");        // [...]
  Value s = b.unary("ceil", b.binary("divide", b.unary("log", b.binary("maximum", norm, b.scalar_like(norm, 1e-300))),
                                     b.scalar_like(norm, std::log(2.0))));
  s = b.binary("maximum", s, b.scalar_like(s, 0));
  s = b.select(b.unary("is_finite", s), s, b.scalar_like(s, 0));
  Value scale = b.binary("power", b.scalar_like(s, 2), b.unary("negate", s));
  std::vector<int64_t> map = bdims;
  Value scaled = b.binary("multiply", a, b.convert(b.broadcast_in_dim(scale, d, map), dt));
  Value eye = lowering::eye(b, dt, batch, n);
  int degree = real == DType::F64 ? 18 : 12;
  // Horner: E = I + A/k (I + A/(k-1) (...)).
  Value e = eye;
  for (int k = degree; k >= 1; --k) {
    e = b.binary("add", eye, b.binary("multiply", mm(b, scaled, e), b.scalar_like(e, 1.0 / k)));
  }
  Value steps = b.convert(s, DType::S64);
  int64_t count = b.type(steps).numel();
  Value max_steps = count == 0 ? b.constant_int(DType::S64, 0)
                               : b.reduce_simple(b.reshape(steps, {count}), b.constant_int(DType::S64, 0), {0}, "maximum");
  auto out = b.while_loop(
      {b.constant_int(DType::S64, 0), max_steps, steps, e},
      [](Builder& c, const std::vector<Value>& st) { return c.compare(st[0], st[1], "LT"); },
      [&](Builder& c, const std::vector<Value>& st) -> std::vector<Value> {
        Value k = st[0], x = st[3];
        Value more = c.compare(c.broadcast_to(k, c.dims(st[2])), st[2], "LT");
        Value sq = mm(c, x, x);
        x = c.select(c.broadcast_in_dim(more, d, map), sq, x);
        return {c.binary("add", k, c.constant_int(DType::S64, 1)), st[1], st[2], x};
      });
  return out[3];
}

}  // namespace torch_pjrt::lowering
