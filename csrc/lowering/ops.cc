#include "lowering/ops.h"

#include <cmath>
#include <limits>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "kernels/few_row_product.h"
#include "kernels/host_kernels.h"

namespace torch_pjrt::lowering {

namespace {

bool low_precision(DType d) { return is_reduced_float(d); }
DType acc_type(DType d) { return low_precision(d) ? DType::F32 : d; }

std::vector<int64_t> normalize_dims(std::vector<int64_t> dims, int64_t rank) {
  if (dims.empty()) {
    dims.resize(rank);
    std::iota(dims.begin(), dims.end(), 0);
  }
  for (auto& d : dims) {
    if (d < 0) d += rank;
  }
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  return dims;
}

// Shape after reducing `dims` with keepdim.
std::vector<int64_t> kept_dims(const std::vector<int64_t>& in, const std::vector<int64_t>& dims) {
  std::vector<int64_t> out = in;
  for (int64_t d : dims) out[d] = 1;
  return out;
}

Value keep(Builder& b, Value reduced, const std::vector<int64_t>& in, const std::vector<int64_t>& dims,
           bool keepdim) {
  return keepdim ? b.reshape(reduced, kept_dims(in, dims)) : reduced;
}

int64_t count(const std::vector<int64_t>& in, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= in[d];
  return n;
}

// Broadcast a reduced-with-keepdim value back to `dims`.
Value expand_back(Builder& b, Value reduced_keep, const std::vector<int64_t>& dims) {
  return b.broadcast_to(reduced_keep, dims);
}

}  // namespace

DType accumulate_type(DType d) { return acc_type(d); }

namespace {
// Complex transforms (FFT or IFFT) along `dims` of v, at most 3 at a time (XLA's
// limit): each group is moved last, transformed, and moved back.
Value fft_complex_dims(Builder& b, Value v, std::vector<int64_t> dims, const std::string& type) {
  int64_t rank = b.type(v).rank();
  while (!dims.empty()) {
    size_t take = std::min<size_t>(3, dims.size());
    std::vector<int64_t> group(dims.end() - take, dims.end());
    dims.resize(dims.size() - take);
    std::vector<int64_t> perm, lengths;
    for (int64_t d = 0; d < rank; ++d)
      if (std::find(group.begin(), group.end(), d) == group.end()) perm.push_back(d);
    for (int64_t d : group) {
      perm.push_back(d);
      lengths.push_back(b.dims(v)[d]);
    }
    std::vector<int64_t> inv(rank);
    for (int64_t i = 0; i < rank; ++i) inv[perm[i]] = i;
    v = b.transpose(b.fft(b.transpose(v, perm), type, lengths), inv);
  }
  return v;
}

// One-sided real transform along `dim` (RFFT) or its inverse to `length` (IRFFT).
Value fft_real_dim(Builder& b, Value v, int64_t dim, const std::string& type, int64_t length) {
  int64_t rank = b.type(v).rank();
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < rank; ++d)
    if (d != dim) perm.push_back(d);
  perm.push_back(dim);
  std::vector<int64_t> inv(rank);
  for (int64_t i = 0; i < rank; ++i) inv[perm[i]] = i;
  return b.transpose(b.fft(b.transpose(v, perm), type, {length}), inv);
}
}  // namespace

Value fft(Builder& b, Value x, std::vector<int64_t> dims, const std::string& kind, bool forward,
          int64_t normalization, int64_t last_dim_size) {
  int64_t rank = b.type(x).rank();
  for (auto& d : dims) d = d < 0 ? d + rank : d;  // order matters (the last is halved): not sorted
  if (kind == "r2c" && b.dtype(x) != DType::F64) x = b.convert(x, DType::F32);
  if (kind != "r2c" && !ir::is_complex(b.dtype(x))) x = b.convert(x, ir::complex_of(b.dtype(x)));
  if (dims.empty()) return kind == "r2c" ? b.convert(x, ir::complex_of(b.dtype(x))) : x;
  double n = 1;  // the signal size: the real length along the halved dim
  for (size_t i = 0; i < dims.size(); ++i) {
    bool last = i + 1 == dims.size();
    n *= static_cast<double>(kind == "c2r" && last ? last_dim_size : b.dims(x)[dims[i]]);
  }
  std::vector<int64_t> leading(dims.begin(), dims.end() - 1);
  Value v;
  if (kind == "r2c") {
    v = fft_real_dim(b, x, dims.back(), "RFFT", b.dims(x)[dims.back()]);
    v = fft_complex_dims(b, v, leading, "FFT");
  } else if (kind == "c2r") {
    v = fft_complex_dims(b, x, leading, "IFFT");
    v = fft_real_dim(b, v, dims.back(), "IRFFT", last_dim_size);
  } else {
    v = fft_complex_dims(b, x, dims, forward ? "FFT" : "IFFT");
  }
  // XLA's inverse transforms already divide by their sizes (n in all).
  double scale = normalization == 1 ? 1.0 / std::sqrt(n) : normalization == 2 ? 1.0 / n : 1.0;
  if (kind == "c2r" || (kind == "c2c" && !forward)) scale *= n;
  if (scale != 1.0) v = b.binary("multiply", v, b.scalar_like(v, scale));
  return v;
}

// ---------------------------------------------------------------- reductions

Value sum(Builder& b, Value x, std::vector<int64_t> dims, bool keepdim, DType out) {
  auto in = b.dims(x);
  dims = normalize_dims(dims, static_cast<int64_t>(in.size()));
  DType acc = out == DType::Pred ? DType::S64 : acc_type(out);
  Value xc = b.convert(x, acc);
  Value r = b.reduce_simple(xc, b.constant(acc, 0), dims, "add");
  return b.convert(keep(b, r, in, dims, keepdim), out);
}

Value mean(Builder& b, Value x, std::vector<int64_t> dims, bool keepdim, DType out) {
  auto in = b.dims(x);
  dims = normalize_dims(dims, static_cast<int64_t>(in.size()));
  DType acc = acc_type(out);
  Value s = b.reduce_simple(b.convert(x, acc), b.constant(acc, 0), dims, "add");
  s = b.binary("divide", s, b.scalar_like(s, static_cast<double>(count(in, dims))));
  return b.convert(keep(b, s, in, dims, keepdim), out);
}

Value prod(Builder& b, Value x, std::vector<int64_t> dims, bool keepdim, DType out) {
  auto in = b.dims(x);
  dims = normalize_dims(dims, static_cast<int64_t>(in.size()));
  DType acc = out == DType::Pred ? DType::S64 : acc_type(out);
  Value r = b.reduce_simple(b.convert(x, acc), b.constant(acc, 1), dims, "multiply");
  return b.convert(keep(b, r, in, dims, keepdim), out);
}

Value amax(Builder& b, Value x, std::vector<int64_t> dims, bool keepdim, bool is_max) {
  auto in = b.dims(x);
  dims = normalize_dims(dims, static_cast<int64_t>(in.size()));
  DType d = b.dtype(x);
  Value init;
  if (ir::is_floating(d)) {
    init = b.constant(d, is_max ? -INFINITY : INFINITY);
  } else if (d == DType::Pred) {
    init = b.constant_int(d, is_max ? 0 : 1);
  } else {
    // Extremes of the integer type.
    int64_t bits = static_cast<int64_t>(ir::dtype_size(d)) * 8;
    if (ir::is_unsigned_int(d)) {
      init = is_max ? b.constant_int(d, 0) : b.constant_int(d, bits == 64 ? -1 : (int64_t(1) << bits) - 1);
    } else {
      int64_t mx = bits == 64 ? INT64_MAX : (int64_t(1) << (bits - 1)) - 1;
      init = b.constant_int(d, is_max ? -mx - 1 : mx);
    }
  }
  Value r = b.reduce_simple(x, init, dims, is_max ? "maximum" : "minimum");
  if (ir::is_floating(d)) {
    // torch's max/min reductions return NaN when a NaN is reduced; XLA's CPU reduction
    // drops NaNs (its fast min/max), and other plugins may differ: say it explicitly.
    Value nan_seen = b.reduce_simple(b.compare(x, x, "NE"), b.constant_int(DType::Pred, 0), dims, "or");
    r = b.select(nan_seen, b.scalar_like(r, NAN), r);
  }
  return keep(b, r, in, dims, keepdim);
}

Value any_all(Builder& b, Value x, std::vector<int64_t> dims, bool keepdim, bool is_all) {
  auto in = b.dims(x);
  dims = normalize_dims(dims, static_cast<int64_t>(in.size()));
  Value p = b.convert(x, DType::Pred);
  Value r = b.reduce_simple(p, b.constant_int(DType::Pred, is_all ? 1 : 0), dims, is_all ? "and" : "or");
  return keep(b, r, in, dims, keepdim);
}

std::vector<Value> arg_reduce(Builder& b, Value x, int64_t dim, bool keepdim, bool is_max) {
  auto in = b.dims(x);
  DType d = b.dtype(x);
  Value idx = b.iota(DType::S64, in, dim);
  Value init_v = ir::is_floating(d) ? b.constant(d, is_max ? -INFINITY : INFINITY)
                                    : amax(b, b.reshape(x, {b.type(x).numel()}), {}, false, !is_max);
  if (!ir::is_floating(d)) init_v = b.reshape(init_v, {});
  Value init_i = b.constant_int(DType::S64, 0);
  bool floating = ir::is_floating(d);
  auto body = [is_max, floating](Builder& rb, const std::vector<Value>& l, const std::vector<Value>& r) {
    Value better = rb.compare(l[0], r[0], is_max ? "GT" : "LT");
    Value eq = rb.compare(l[0], r[0], "EQ");
    if (floating) {
      Value lnan = rb.compare(l[0], l[0], "NE");
      Value rnan = rb.compare(r[0], r[0], "NE");
      better = rb.binary("or", better, rb.binary("and", lnan, rb.unary("not", rnan)));
      eq = rb.binary("or", eq, rb.binary("and", lnan, rnan));
    }
    Value pick_l = rb.binary("or", better, rb.binary("and", eq, rb.compare(l[1], r[1], "LT")));
    return std::vector<Value>{rb.select(pick_l, l[0], r[0]), rb.select(pick_l, l[1], r[1])};
  };
  auto res = b.reduce({x, idx}, {init_v, init_i}, {dim}, body);
  return {keep(b, res[0], in, {dim}, keepdim), keep(b, res[1], in, {dim}, keepdim)};
}

Value vector_norm(Builder& b, Value x, double p, std::vector<int64_t> dims, bool keepdim, DType out) {
  auto in = b.dims(x);
  dims = normalize_dims(dims, static_cast<int64_t>(in.size()));
  DType acc = acc_type(out);
  // Complex entries: their moduli (out is the real counterpart).
  Value a = b.unary("abs", b.convert(x, ir::is_complex(b.dtype(x)) ? ir::complex_of(acc) : acc));
  Value r;
  if (std::isinf(p)) {
    r = amax(b, a, dims, false, p > 0);
  } else if (p == 0) {
    r = sum(b, b.convert(b.compare(a, b.scalar_like(a, 0), "NE"), acc), dims, false, acc);
  } else if (p == 1) {
    r = sum(b, a, dims, false, acc);
  } else if (p == 2) {
    r = b.unary("sqrt", sum(b, b.binary("multiply", a, a), dims, false, acc));
  } else {
    Value s = sum(b, b.binary("power", a, b.scalar_like(a, p)), dims, false, acc);
    r = b.binary("power", s, b.scalar_like(s, 1.0 / p));
  }
  return b.convert(keep(b, r, in, dims, keepdim), out);
}

Value var(Builder& b, Value x, std::vector<int64_t> dims, double correction, bool keepdim, DType out) {
  auto in = b.dims(x);
  dims = normalize_dims(dims, static_cast<int64_t>(in.size()));
  DType acc = acc_type(out);
  // Complex entries: the mean squared modulus of the deviations (out is real).
  bool complex = ir::is_complex(b.dtype(x));
  Value xc = b.convert(x, complex ? ir::complex_of(acc) : acc);
  Value m = mean(b, xc, dims, true, b.dtype(xc));
  Value diff = b.binary("subtract", xc, expand_back(b, m, in));
  Value sq = complex ? b.binary("add", b.binary("multiply", b.real(diff), b.real(diff)),
                                b.binary("multiply", b.imag(diff), b.imag(diff)))
                     : b.binary("multiply", diff, diff);
  Value ss = b.reduce_simple(sq, b.constant(acc, 0), dims, "add");
  double n = static_cast<double>(count(in, dims)) - correction;
  Value r = b.binary("divide", ss, b.scalar_like(ss, n > 0 ? n : 0.0));
  return b.convert(keep(b, r, in, dims, keepdim), out);
}

Value logsumexp(Builder& b, Value x, std::vector<int64_t> dims, bool keepdim, DType out) {
  auto in = b.dims(x);
  dims = normalize_dims(dims, static_cast<int64_t>(in.size()));
  DType acc = acc_type(out);
  Value xc = b.convert(x, acc);
  // The shift: the largest (real part); infinite maxima would give inf - inf, so zero there.
  Value m = amax(b, ir::is_complex(acc) ? b.real(xc) : xc, dims, true, true);
  m = b.convert(b.select(b.unary("is_finite", m), m, b.scalar_like(m, 0)), acc);
  Value e = b.unary("exponential", b.binary("subtract", xc, expand_back(b, m, in)));
  Value s = b.reduce_simple(e, b.constant(acc, 0), dims, "add");
  Value r = b.binary("add", b.unary("log", s), b.reshape(m, b.dims(s)));
  return b.convert(keep(b, r, in, dims, keepdim), out);
}

Value softmax(Builder& b, Value x, int64_t dim, bool log, DType out, bool zero_empty_rows) {
  auto in = b.dims(x);
  if (in.empty()) {
    return b.convert(b.scalar_like(x, log ? 0.0 : 1.0), out);
  }
  DType acc = acc_type(out);
  Value xc = b.convert(x, acc);
  Value m = amax(b, xc, {dim}, true, true);
  m = b.select(b.unary("is_finite", m), m, b.scalar_like(m, 0));
  Value shifted = b.binary("subtract", xc, expand_back(b, m, in));
  Value e = b.unary("exponential", shifted);
  Value s = b.reduce_simple(e, b.constant(acc, 0), {dim}, "add");
  Value sk = expand_back(b, b.reshape(s, kept_dims(in, {dim})), in);
  Value r = log ? b.binary("subtract", shifted, b.unary("log", sk)) : b.binary("divide", e, sk);
  if (zero_empty_rows) {
    // Every element -inf (a fully masked attention row): zeros, not 0/0.
    r = b.select(b.compare(sk, b.scalar_like(sk, 0), "EQ"), b.scalar_like(r, 0), r);
  }
  return b.convert(r, out);
}

Value softmax_backward(Builder& b, Value grad, Value out, int64_t dim, bool log, DType dtype) {
  auto in = b.dims(out);
  DType acc = acc_type(dtype);
  Value g = b.convert(grad, acc);
  Value o = b.convert(out, acc);
  Value r;
  if (log) {
    Value s = b.reduce_simple(g, b.constant(acc, 0), {dim}, "add");
    Value sk = expand_back(b, b.reshape(s, kept_dims(in, {dim})), in);
    r = b.binary("subtract", g, b.binary("multiply", b.unary("exponential", o), sk));
  } else {
    Value go = b.binary("multiply", g, o);
    Value s = b.reduce_simple(go, b.constant(acc, 0), {dim}, "add");
    Value sk = expand_back(b, b.reshape(s, kept_dims(in, {dim})), in);
    r = b.binary("subtract", go, b.binary("multiply", o, sk));
  }
  return b.convert(r, dtype);
}

// ---------------------------------------------------------------- linear algebra

Value matmul_2d(Builder& b, Value x, Value y, DType out) {
  Value r = b.dot_general(b.convert(x, out), b.convert(y, out), {}, {}, {1}, {0}, out);
  return r;
}

bool few_row_product_fits(DType x, DType w, DType out, int64_t rows, int64_t depth, int64_t columns,
                          bool weight_transposed) {
  // One row times a [K, N] weight: XLA's dot streams the weight's rows whole, faster than the
  // kernel's panels (1x2048x8192: 3.6 against 4.9 ms).
  // Fewer than two panels of columns would leave a thread idle.
  return x == DType::F32 && w == DType::F32 && out == DType::F32 && rows >= (weight_transposed ? 1 : 2) &&
         rows <= kernels::kFewRowProductMaxRows && depth * columns >= kernels::kFewRowProductMinWeights &&
         columns >= 2 * kernels::kProductPanelColumns;
}

Value few_row_product(Builder& b, Value x, Value w, bool weight_transposed) {
  const int64_t columns = b.dims(w)[weight_transposed ? 0 : 1];
  return b.ffi_call(kernels::kHostFewRowProduct, {x, w}, {ir::Type{DType::F32, {b.dims(x)[0], columns}}},
                    std::string("weight_transposed = ") + (weight_transposed ? "1" : "0") + " : i64")[0];
}

Value bmm(Builder& b, Value x, Value y, DType out) {
  return b.dot_general(b.convert(x, out), b.convert(y, out), {0}, {0}, {2}, {1}, out);
}

Value dot(Builder& b, Value x, Value y, DType out) {
  return b.dot_general(b.convert(x, out), b.convert(y, out), {}, {}, {0}, {0}, out);
}

// ---------------------------------------------------------------- shapes/indexing

Value cat(Builder& b, const std::vector<Value>& xs, int64_t dim, DType out) {
  std::vector<Value> parts;
  for (Value v : xs) {
    // Legacy: 1-D empty tensors are skipped by torch.cat.
    if (b.type(v).rank() == 1 && b.dims(v)[0] == 0 && b.type(xs[0]).rank() != 1) continue;
    parts.push_back(b.convert(v, out));
  }
  return b.concatenate(parts, dim);
}

Value wrap_index(Builder& b, Value index, int64_t size) {
  Value i = b.convert(index, DType::S64);
  Value neg = b.compare(i, b.scalar_like(i, 0), "LT");
  return b.select(neg, b.binary("add", i, b.scalar_like(i, static_cast<double>(size))), i);
}

Value index_out_of_range(Builder& b, Value index, int64_t size) {
  Value i = b.convert(index, DType::S64);
  Value bad = b.binary("or", b.compare(i, b.scalar_like(i, static_cast<double>(-size)), "LT"),
                       b.compare(i, b.scalar_like(i, static_cast<double>(size)), "GE"));
  int64_t n = b.type(bad).numel();
  return any_all(b, b.reshape(bad, {n}), {}, false, false);
}

Value index_select(Builder& b, Value x, int64_t dim, Value index) {
  auto in = b.dims(x);
  Value idx = b.reshape(wrap_index(b, index, in[dim]), {b.type(index).numel(), 1});
  std::vector<int64_t> slice = in;
  slice[dim] = 1;
  std::vector<int64_t> offset_dims, out = in;
  out[dim] = b.type(index).numel();
  for (int64_t d = 0; d < static_cast<int64_t>(in.size()); ++d)
    if (d != dim) offset_dims.push_back(d);
  return b.gather(x, idx, offset_dims, {dim}, {dim}, 1, slice, out);
}

namespace {
// Full coordinates [..., rank] for torch.gather/scatter along `dim`.
Value coordinates(Builder& b, Value index, int64_t dim, int64_t size) {
  auto shape = b.dims(index);
  int64_t rank = static_cast<int64_t>(shape.size());
  std::vector<int64_t> one = shape;
  one.push_back(1);
  std::vector<Value> parts;
  for (int64_t d = 0; d < rank; ++d) {
    Value c = d == dim ? wrap_index(b, index, size) : b.iota(DType::S64, shape, d);
    parts.push_back(b.reshape(c, one));
  }
  return b.concatenate(parts, rank);
}
}  // namespace

namespace {
// Index tensors of gather/scatter must match the operand's rank (callers turn 0-d into 1-d).
void check_same_rank(Builder& b, Value x, int64_t dim, Value index, const char* what) {
  int64_t rank = static_cast<int64_t>(b.dims(x).size());
  if (static_cast<int64_t>(b.dims(index).size()) != rank || (rank > 0 && (dim < 0 || dim >= rank))) {
    throw std::invalid_argument(std::string(what) + ": index rank " + std::to_string(b.dims(index).size()) +
                                " / dim " + std::to_string(dim) + " do not fit an operand of rank " + std::to_string(rank));
  }
}
}  // namespace

Value gather(Builder& b, Value x, int64_t dim, Value index) {
  auto shape = b.dims(index);
  int64_t rank = static_cast<int64_t>(shape.size());
  if (rank > 0) check_same_rank(b, x, dim, index, "gather");
  if (rank == 0) {
    return b.reshape(gather(b, b.reshape(x, {1}), 0, b.reshape(index, {1})), {});
  }
  Value coords = coordinates(b, index, dim, b.dims(x)[dim]);
  std::vector<int64_t> all(rank);
  std::iota(all.begin(), all.end(), 0);
  return b.gather(x, coords, {}, all, all, rank, std::vector<int64_t>(rank, 1), shape);
}

Value searchsorted(Builder& b, Value sorted, Value values, bool right) {
  auto value_dims = b.dims(values);
  const int64_t m = b.dims(sorted).back();
  if (m == 0) return b.constant_int(DType::S64, 0, value_dims);
  // One 1-D row for every value: searched with the values flattened.
  const bool one_row = b.dims(sorted).size() == 1;
  Value v = one_row ? b.reshape(values, {b.type(values).numel()}) : values;
  auto dims = b.dims(v);
  const int64_t last = static_cast<int64_t>(dims.size()) - 1;
  if (dims.empty() || dims[last] == 0) return b.constant_int(DType::S64, 0, value_dims);
  Value start = b.constant_int(DType::S64, 0, dims), end = b.constant_int(DType::S64, m, dims);
  Value one = b.constant_int(DType::S64, 1, dims), two = b.constant_int(DType::S64, 2, dims);
  Value zero = b.constant_int(DType::S64, 0, dims), top = b.constant_int(DType::S64, m - 1, dims);
  // ceil(log2(m + 1)) halvings close every interval [start, end); a closed one stays put.
  for (int64_t width = m; width > 0; width /= 2) {
    Value open = b.compare(start, end, "LT");
    Value mid = b.binary("add", start, b.binary("divide", b.binary("subtract", end, start), two));
    Value at_mid = gather(b, sorted, one_row ? 0 : last, b.clamp(zero, mid, top));
    Value stop = b.compare(at_mid, v, right ? "GT" : "GE");  // false for a NaN either side
    start = b.select(b.binary("and", open, b.unary("not", stop)), b.binary("add", mid, one), start);
    end = b.select(b.binary("and", open, stop), mid, end);
  }
  return b.reshape(start, value_dims);
}

Value scatter(Builder& b, Value x, int64_t dim, Value index, Value src, const std::string& reduce) {
  auto shape = b.dims(index);
  int64_t rank = static_cast<int64_t>(shape.size());
  if (rank > 0) check_same_rank(b, x, dim, index, "scatter");
  if (rank == 0) {
    Value r = scatter(b, b.reshape(x, {1}), 0, b.reshape(index, {1}), b.reshape(src, {1}), reduce);
    return b.reshape(r, {});
  }
  Value coords = coordinates(b, index, dim, b.dims(x)[dim]);
  std::vector<int64_t> zeros(rank, 0);
  Value updates = b.dims(src) == shape ? src : b.slice(src, zeros, shape, std::vector<int64_t>(rank, 1));
  updates = b.convert(updates, b.dtype(x));
  std::vector<int64_t> all(rank);
  std::iota(all.begin(), all.end(), 0);
  std::string combiner;
  if (reduce == "add" || reduce == "sum") combiner = "stablehlo.add";
  else if (reduce == "mul" || reduce == "multiply" || reduce == "prod") combiner = "stablehlo.multiply";
  else if (reduce == "amax") combiner = "nan_maximum";  // torch's scatter_reduce: NaN wins
  else if (reduce == "amin") combiner = "nan_minimum";
  else if (reduce == "max") combiner = "stablehlo.maximum";  // a NaN arriving later is kept only by chance
  return b.scatter(x, coords, updates, {}, all, all, rank, combiner);
}

namespace {
// Stacks broadcast index tensors into [B..., k] (wrapped, int64).
Value stack_indices(Builder& b, Value x, const std::vector<Value>& indices, std::vector<int64_t>* batch) {
  std::vector<int64_t> shape;
  for (Value i : indices) shape = ir::broadcast_shapes(shape, b.dims(i));
  *batch = shape;
  std::vector<int64_t> one = shape;
  one.push_back(1);
  std::vector<Value> parts;
  for (size_t k = 0; k < indices.size(); ++k) {
    Value i = wrap_index(b, indices[k], b.dims(x)[k]);
    parts.push_back(b.reshape(b.broadcast_to(i, shape), one));
  }
  return b.concatenate(parts, static_cast<int64_t>(shape.size()));
}
}  // namespace

Value index(Builder& b, Value x, const std::vector<Value>& indices) {
  std::vector<int64_t> batch;
  Value idx = stack_indices(b, x, indices, &batch);
  auto in = b.dims(x);
  int64_t k = static_cast<int64_t>(indices.size());
  std::vector<int64_t> collapsed, offset_dims, slice, out = batch;
  for (int64_t d = 0; d < k; ++d) {
    collapsed.push_back(d);
    slice.push_back(1);
  }
  for (int64_t d = k; d < static_cast<int64_t>(in.size()); ++d) {
    offset_dims.push_back(static_cast<int64_t>(batch.size()) + d - k);
    slice.push_back(in[d]);
    out.push_back(in[d]);
  }
  return b.gather(x, idx, offset_dims, collapsed, collapsed, static_cast<int64_t>(batch.size()), slice, out);
}

Value index_put(Builder& b, Value x, const std::vector<Value>& indices, Value values, bool accumulate) {
  std::vector<int64_t> batch;
  Value idx = stack_indices(b, x, indices, &batch);
  auto in = b.dims(x);
  int64_t k = static_cast<int64_t>(indices.size());
  std::vector<int64_t> inserted, window, upd = batch;
  for (int64_t d = 0; d < k; ++d) inserted.push_back(d);
  for (int64_t d = k; d < static_cast<int64_t>(in.size()); ++d) {
    window.push_back(static_cast<int64_t>(batch.size()) + d - k);
    upd.push_back(in[d]);
  }
  Value v = b.broadcast_to(b.convert(values, b.dtype(x)), upd);
  return b.scatter(x, idx, v, window, inserted, inserted, static_cast<int64_t>(batch.size()),
                   accumulate ? "stablehlo.add" : "");
}

namespace {
Value clamped_index(Builder& b, Value index, int64_t size) {
  return b.clamp(b.constant_int(DType::S64, 0), wrap_index(b, index, size),
                 b.constant_int(DType::S64, std::max<int64_t>(size - 1, 0)));
}
Value or_flags(Builder& b, Value acc, Value flag) { return acc.valid() ? b.binary("or", acc, flag) : flag; }
// The update that leaves x's element as it is: -0 added (x + -0 is x, signed zeros and NaN
// included), or the element itself written back (`current`).
Value unchanging_update(Builder& b, Value updates, bool add, const std::function<Value()>& current) {
  if (!add) return current();
  return b.broadcast_to(b.scalar_like(updates, ir::is_floating(b.dtype(updates)) ? -0.0 : 0.0), b.dims(updates));
}
}  // namespace

Value guarded_index_put(Builder& b, Value x, const std::vector<Value>& indices, Value values, bool accumulate,
                        std::vector<Value>* bad) {
  auto in = b.dims(x);
  std::vector<Value> safe;
  std::vector<int64_t> update_shape;
  Value any_bad;
  bad->clear();
  for (size_t k = 0; k < indices.size(); ++k) {
    bad->push_back(index_out_of_range(b, indices[k], in[k]));
    any_bad = or_flags(b, any_bad, bad->back());
    safe.push_back(clamped_index(b, indices[k], in[k]));
    update_shape = ir::broadcast_shapes(update_shape, b.dims(indices[k]));
  }
  update_shape.insert(update_shape.end(), in.begin() + static_cast<int64_t>(indices.size()), in.end());
  Value v = b.broadcast_to(b.convert(values, b.dtype(x)), update_shape);
  Value unchanged = unchanging_update(b, v, accumulate, [&] { return index(b, x, safe); });
  v = b.select(b.broadcast_to(any_bad, update_shape), unchanged, v);
  return index_put(b, x, safe, v, accumulate);
}

Value guarded_scatter(Builder& b, Value x, int64_t dim, Value index, Value src, const std::string& reduce, Value* bad) {
  if (reduce != "" && reduce != "add") throw std::invalid_argument("guarded_scatter: reduce \"" + reduce + "\"");
  if (b.dims(index).empty()) {  // as scatter: a 0-d index into a one-element x
    Value r = guarded_scatter(b, b.reshape(x, {1}), 0, b.reshape(index, {1}), b.reshape(src, {1}), reduce, bad);
    return b.reshape(r, {});
  }
  int64_t size = b.dims(x)[dim];
  *bad = index_out_of_range(b, index, size);
  Value safe = clamped_index(b, index, size);
  auto shape = b.dims(index);
  Value updates = b.dims(src) == shape ? src : b.slice(src, std::vector<int64_t>(shape.size(), 0), shape,
                                                       std::vector<int64_t>(shape.size(), 1));
  updates = b.convert(updates, b.dtype(x));
  Value unchanged = unchanging_update(b, updates, reduce == "add", [&] { return gather(b, x, dim, safe); });
  updates = b.select(b.broadcast_to(*bad, shape), unchanged, updates);
  return scatter(b, x, dim, safe, updates, reduce);
}

// ---------------------------------------------------------------- normalization

std::vector<Value> layer_norm(Builder& b, Value x, const Value* weight, const Value* bias,
                              int64_t normalized_ndim, double eps) {
  auto in = b.dims(x);
  int64_t rank = static_cast<int64_t>(in.size());
  DType d = b.dtype(x);
  DType acc = acc_type(d);
  std::vector<int64_t> dims;
  for (int64_t i = rank - normalized_ndim; i < rank; ++i) dims.push_back(i);
  Value xc = b.convert(x, acc);
  Value m = mean(b, xc, dims, true, acc);
  Value diff = b.binary("subtract", xc, b.broadcast_to(m, in));
  Value v = mean(b, b.binary("multiply", diff, diff), dims, true, acc);
  Value rstd = b.unary("rsqrt", b.binary("add", v, b.scalar_like(v, eps)));
  Value y = b.binary("multiply", diff, b.broadcast_to(rstd, in));
  if (weight) y = b.binary("multiply", y, b.broadcast_to(b.convert(*weight, acc), in));
  if (bias) y = b.binary("add", y, b.broadcast_to(b.convert(*bias, acc), in));
  return {b.convert(y, d), m, rstd};
}

std::vector<Value> layer_norm_backward(Builder& b, Value grad, Value x, Value mean_v, Value rstd,
                                       const Value* weight, int64_t normalized_ndim) {
  auto in = b.dims(x);
  int64_t rank = static_cast<int64_t>(in.size());
  DType d = b.dtype(x);
  DType acc = acc_type(d);
  std::vector<int64_t> norm_dims, batch_dims;
  for (int64_t i = 0; i < rank; ++i) (i >= rank - normalized_ndim ? norm_dims : batch_dims).push_back(i);
  Value xc = b.convert(x, acc), g = b.convert(grad, acc);
  Value r = b.broadcast_to(b.convert(rstd, acc), in);
  Value xhat = b.binary("multiply", b.binary("subtract", xc, b.broadcast_to(b.convert(mean_v, acc), in)), r);
  Value gw = weight ? b.binary("multiply", g, b.broadcast_to(b.convert(*weight, acc), in)) : g;
  double n = static_cast<double>(count(in, norm_dims));
  Value s1 = b.broadcast_to(sum(b, gw, norm_dims, true, acc), in);
  Value s2 = b.broadcast_to(sum(b, b.binary("multiply", gw, xhat), norm_dims, true, acc), in);
  Value dx = b.binary("multiply", b.binary("divide", r, b.scalar_like(r, n)),
                      b.binary("subtract", b.binary("subtract", b.binary("multiply", gw, b.scalar_like(gw, n)), s1),
                               b.binary("multiply", xhat, s2)));
  // No batch dims (everything normalized): the parameter gradients are elementwise.
  Value dw = batch_dims.empty() ? b.binary("multiply", g, xhat) : sum(b, b.binary("multiply", g, xhat), batch_dims, false, acc);
  Value db = batch_dims.empty() ? g : sum(b, g, batch_dims, false, acc);
  return {b.convert(dx, d), b.convert(dw, d), b.convert(db, d)};
}

// ---------------------------------------------------------------- losses

namespace {
// [N, C] mask of target == class (false where target == ignore_index), and per-row weights.
void target_mask(Builder& b, Value logp, Value target, const Value* weight, int64_t ignore_index,
                 Value* onehot, Value* row_weight) {
  auto in = b.dims(logp);
  DType acc = b.dtype(logp);
  Value t = b.convert(target, DType::S64);
  Value cls = b.iota(DType::S64, in, static_cast<int64_t>(in.size()) - 1);
  Value tb = b.broadcast_in_dim(t, in, in.size() == 2 ? std::vector<int64_t>{0} : std::vector<int64_t>{});
  Value valid = b.compare(t, b.scalar_like(t, static_cast<double>(ignore_index)), "NE");
  Value validb = b.broadcast_in_dim(valid, in, in.size() == 2 ? std::vector<int64_t>{0} : std::vector<int64_t>{});
  *onehot = b.binary("and", b.compare(cls, tb, "EQ"), validb);
  Value w = weight ? b.broadcast_in_dim(b.convert(*weight, acc), in, {static_cast<int64_t>(in.size()) - 1})
                   : b.constant(acc, 1, in);
  Value wm = b.select(*onehot, w, b.constant(acc, 0, in));
  *row_weight = b.reduce_simple(wm, b.constant(acc, 0), {static_cast<int64_t>(in.size()) - 1}, "add");
}
}  // namespace

std::vector<Value> nll_loss(Builder& b, Value logp, Value target, const Value* weight,
                            int64_t reduction, int64_t ignore_index) {
  auto in = b.dims(logp);
  DType d = b.dtype(logp);
  DType acc = acc_type(d);
  Value lp = b.convert(logp, acc);
  Value onehot, roww;
  target_mask(b, lp, target, weight, ignore_index, &onehot, &roww);
  Value w = weight ? b.broadcast_in_dim(b.convert(*weight, acc), in, {static_cast<int64_t>(in.size()) - 1})
                   : b.constant(acc, 1, in);
  Value picked = b.select(onehot, b.binary("multiply", lp, w), b.constant(acc, 0, in));
  Value losses = b.unary("negate", b.reduce_simple(picked, b.constant(acc, 0), {static_cast<int64_t>(in.size()) - 1}, "add"));
  int64_t lrank = b.type(losses).rank();
  std::vector<int64_t> all(lrank);
  std::iota(all.begin(), all.end(), 0);
  Value total = b.reduce_simple(roww, b.constant(acc, 0), all, "add");
  if (reduction == 0) return {b.convert(losses, d), b.convert(total, d)};
  Value s = b.reduce_simple(losses, b.constant(acc, 0), all, "add");
  if (reduction == 1) s = b.binary("divide", s, total);
  return {b.convert(s, d), b.convert(total, d)};
}

Value nll_loss_backward(Builder& b, Value grad, Value logp, Value target, const Value* weight,
                        int64_t reduction, int64_t ignore_index, Value total_weight) {
  auto in = b.dims(logp);
  DType d = b.dtype(logp);
  DType acc = acc_type(d);
  Value onehot, roww;
  target_mask(b, b.convert(logp, acc), target, weight, ignore_index, &onehot, &roww);
  Value w = weight ? b.broadcast_in_dim(b.convert(*weight, acc), in, {static_cast<int64_t>(in.size()) - 1})
                   : b.constant(acc, 1, in);
  Value g = b.convert(grad, acc);
  Value scale;
  if (reduction == 0) {
    scale = in.size() == 2 ? b.broadcast_in_dim(g, in, {0}) : b.broadcast_to(g, in);
  } else {
    Value gs = b.reshape(g, {});
    if (reduction == 1) gs = b.binary("divide", gs, b.reshape(b.convert(total_weight, acc), {}));
    scale = b.broadcast_to(gs, in);
  }
  Value r = b.select(onehot, b.unary("negate", b.binary("multiply", w, scale)), b.constant(acc, 0, in));
  return b.convert(r, d);
}

Value embedding_backward(Builder& b, Value grad, Value indices, int64_t num_weights, int64_t padding_idx) {
  auto gd = b.dims(grad);
  int64_t dim = gd.back();
  int64_t n = b.type(indices).numel();
  DType d = b.dtype(grad);
  DType acc = acc_type(d);
  Value g = b.reshape(b.convert(grad, acc), {n, dim});
  Value idx = b.reshape(b.convert(indices, DType::S64), {n});
  if (padding_idx >= 0) {
    Value keep_rows = b.compare(idx, b.scalar_like(idx, static_cast<double>(padding_idx)), "NE");
    g = b.select(b.broadcast_in_dim(keep_rows, {n, dim}, {0}), g, b.constant(acc, 0, {n, dim}));
  }
  Value zeros = b.constant(acc, 0, {num_weights, dim});
  Value r = b.scatter(zeros, b.reshape(idx, {n, 1}), g, {1}, {0}, {0}, 1, "stablehlo.add");
  return b.convert(r, d);
}

// ---------------------------------------------------------------- random

std::vector<Value> uniform(Builder& b, Value state, DType dtype, const std::vector<int64_t>& dims) {
  if (dtype == DType::F64) {
    auto r = b.rng_bits(state, DType::U64, dims);
    Value mant = b.binary("shift_right_logical", r[1], b.constant_int(DType::U64, 12, dims));
    Value bits = b.binary("or", mant, b.constant_int(DType::U64, 0x3FF0000000000000LL, dims));
    Value one_two = b.graph().add("stablehlo.bitcast_convert", {bits}, ir::Type{DType::F64, dims});
    return {r[0], b.binary("subtract", one_two, b.constant(DType::F64, 1, dims))};
  }
  auto r = b.rng_bits(state, DType::U32, dims);
  Value mant = b.binary("shift_right_logical", r[1], b.constant_int(DType::U32, 9, dims));
  Value bits = b.binary("or", mant, b.constant_int(DType::U32, 0x3F800000, dims));
  Value one_two = b.graph().add("stablehlo.bitcast_convert", {bits}, ir::Type{DType::F32, dims});
  Value u = b.binary("subtract", one_two, b.constant(DType::F32, 1, dims));
  if (dtype != DType::F32) {
    Value c = b.convert(u, dtype);
    // Rounding to a narrower type may reach 1.0; keep the interval half-open.
    Value one = b.constant(dtype, 1, dims);
    c = b.select(b.compare(c, one, "GE"), b.constant(dtype, 0, dims), c);
    return {r[0], c};
  }
  return {r[0], u};
}

std::vector<Value> normal(Builder& b, Value state, DType dtype, const std::vector<int64_t>& dims) {
  DType acc = dtype == DType::F64 ? DType::F64 : DType::F32;
  auto u1 = uniform(b, state, acc, dims);
  auto u2 = uniform(b, u1[0], acc, dims);
  // Box-Muller; 1 - u is in (0, 1] so the log is finite.
  Value one = b.constant(acc, 1, dims);
  Value radius = b.unary("sqrt", b.binary("multiply", b.constant(acc, -2, dims),
                                          b.unary("log", b.binary("subtract", one, u1[1]))));
  Value angle = b.binary("multiply", b.constant(acc, 2 * M_PI, dims), u2[1]);
  Value z = b.binary("multiply", radius, b.unary("cosine", angle));
  return {u2[0], b.convert(z, dtype)};
}

}  // namespace torch_pjrt::lowering
