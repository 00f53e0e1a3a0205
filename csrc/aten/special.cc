// Special functions and integer math natively: the orthogonal polynomial
// families (torch.special.*_polynomial_*), Bessel aliases, gcd/lcm, frexp; and
// small data movers CPU has and the device lacked (narrow_copy, bincount,
// nonzero_static, histc.out).
#include <ATen/WrapDimUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "device/context.h"
#include "device/fallback.h"
#include "aten/kernel_util.h"
#include "lowering/nn.h"
#include "lowering/ops.h"

namespace torch_pjrt::device {
namespace {

using ir::Value;
namespace L = lowering;
using Tensor = at::Tensor;

Tensor polynomial(const char* family, const Tensor& x, const Tensor& n, const Tensor* into) {
  at::ScalarType out = float_result(at::result_type(x, n));
  TORCH_CHECK(!at::isComplexType(out), "special_", family, "_polynomial: complex inputs are not supported");
  OpBuilder op(std::string("aten::special_") + family + "_polynomial");
  ir::DType compute = L::accumulate_type(to_ir(out));
  Value r = L::orthogonal_polynomial(op.b(), family, op.b().convert(op.input(x), compute), op.input(n));
  return finish(op, r, out, into);
}

#define POLYNOMIAL_KERNELS(NAME, FAMILY)                                                            \
  Tensor NAME##_fn(const Tensor& x, const Tensor& n) { return polynomial(FAMILY, x, n, nullptr); }  \
  Tensor& NAME##_out(const Tensor& x, const Tensor& n, Tensor& out) {                              \
    Tensor r = polynomial(FAMILY, x, n, nullptr);                                                   \
    return write_out("special_" FAMILY "_polynomial", r, out);                                      \
  }
POLYNOMIAL_KERNELS(cheb_t, "chebyshev_t")
POLYNOMIAL_KERNELS(cheb_u, "chebyshev_u")
POLYNOMIAL_KERNELS(cheb_v, "chebyshev_v")
POLYNOMIAL_KERNELS(cheb_w, "chebyshev_w")
POLYNOMIAL_KERNELS(scheb_t, "shifted_chebyshev_t")
POLYNOMIAL_KERNELS(scheb_u, "shifted_chebyshev_u")
POLYNOMIAL_KERNELS(scheb_v, "shifted_chebyshev_v")
POLYNOMIAL_KERNELS(scheb_w, "shifted_chebyshev_w")
POLYNOMIAL_KERNELS(hermite_h, "hermite_h")
POLYNOMIAL_KERNELS(hermite_he, "hermite_he")
POLYNOMIAL_KERNELS(laguerre_l, "laguerre_l")
POLYNOMIAL_KERNELS(legendre_p, "legendre_p")

// Bessel functions that are another name of an existing lowering.
Tensor unary_alias(const char* name, const char* lowering, const Tensor& self) {
  OpBuilder op(std::string("aten::") + name);
  at::ScalarType out = float_result(self.scalar_type());
  Value r = L::unary(op.b(), L::unary_op(lowering), op.input(self), L::accumulate_type(to_ir(out)), to_ir(out));
  return finish(op, r, out, nullptr);
}
Tensor modified_bessel_i0(const Tensor& s) { return unary_alias("special_modified_bessel_i0", "i0", s); }
Tensor& modified_bessel_i0_out(const Tensor& s, Tensor& out) {
  return write_out("special_modified_bessel_i0", modified_bessel_i0(s), out);
}
Tensor modified_bessel_i1(const Tensor& s) { return unary_alias("special_modified_bessel_i1", "special_i1", s); }
Tensor& modified_bessel_i1_out(const Tensor& s, Tensor& out) {
  return write_out("special_modified_bessel_i1", modified_bessel_i1(s), out);
}
Tensor spherical_bessel_j0(const Tensor& self) {
  // sin(x) / x, 1 at 0.
  OpBuilder op("aten::special_spherical_bessel_j0");
  auto& b = op.b();
  at::ScalarType out = float_result(self.scalar_type());
  Value x = b.convert(op.input(self), L::accumulate_type(to_ir(out)));
  Value r = b.select(b.compare(x, b.scalar_like(x, 0), "EQ"), b.scalar_like(x, 1),
                     b.binary("divide", b.unary("sine", x), x));
  r = b.select(b.compare(b.unary("abs", x), b.scalar_like(x, INFINITY), "EQ"), b.scalar_like(x, 0), r);
  return finish(op, r, out, nullptr);
}
Tensor& spherical_bessel_j0_out(const Tensor& s, Tensor& out) {
  return write_out("special_spherical_bessel_j0", spherical_bessel_j0(s), out);
}

// Regularized incomplete gamma (torch.igamma / igammac, special.gammainc / gammaincc).
Tensor igamma_impl(const char* name, const Tensor& self, const Tensor& other, bool upper, const Tensor* into) {
  at::ScalarType out = float_result(at::result_type(self, other));
  TORCH_CHECK(at::isFloatingType(out), name, ": expected floating point inputs, got ", out);
  OpBuilder op(std::string("aten::") + name);
  auto& b = op.b();
  Value r = L::igamma(b, b.convert(op.input(self), to_ir(out)), b.convert(op.input(other), to_ir(out)), upper);
  return finish(op, r, out, into);
}
Tensor igamma_fn(const Tensor& s, const Tensor& o) { return igamma_impl("igamma", s, o, false, nullptr); }
Tensor& igamma_out(const Tensor& s, const Tensor& o, Tensor& out) { return write_out("igamma", igamma_fn(s, o), out); }
Tensor& igamma_inplace(Tensor& s, const Tensor& o) { return igamma_impl("igamma", s, o, false, &s), s; }
Tensor igammac_fn(const Tensor& s, const Tensor& o) { return igamma_impl("igammac", s, o, true, nullptr); }
Tensor& igammac_out(const Tensor& s, const Tensor& o, Tensor& out) { return write_out("igammac", igammac_fn(s, o), out); }
Tensor& igammac_inplace(Tensor& s, const Tensor& o) { return igamma_impl("igammac", s, o, true, &s), s; }

Tensor bessel_impl(const char* name, const Tensor& self, int order, bool second_kind) {
  at::ScalarType out = float_result(self.scalar_type());
  TORCH_CHECK(at::isFloatingType(out), name, ": expected a real input, got ", self.scalar_type());
  OpBuilder op(std::string("aten::") + name);
  Value r = L::bessel_jy(op.b(), op.b().convert(op.input(self), to_ir(out)), order, second_kind);
  return finish(op, r, out, nullptr);
}
#define BESSEL_KERNELS(NAME, ORDER, SECOND)                                                     \
  Tensor NAME##_fn(const Tensor& s) { return bessel_impl("special_" #NAME, s, ORDER, SECOND); } \
  Tensor& NAME##_out(const Tensor& s, Tensor& out) { return write_out("special_" #NAME, NAME##_fn(s), out); }
BESSEL_KERNELS(bessel_j0, 0, false)
BESSEL_KERNELS(bessel_j1, 1, false)
BESSEL_KERNELS(bessel_y0, 0, true)
BESSEL_KERNELS(bessel_y1, 1, true)

// ---------------------------------------------------------------- integers

Tensor gcd_lcm(const char* name, const Tensor& self, const Tensor& other, bool lcm, const Tensor* into) {
  at::ScalarType t = at::result_type(self, other);
  TORCH_CHECK(at::isIntegralType(t, /*includeBool=*/false), name, ": expected integer inputs, got ", self.scalar_type(),
              " and ", other.scalar_type());
  OpBuilder op(std::string("aten::") + name);
  auto& b = op.b();
  Value x = b.convert(op.input(self), to_ir(t)), y = b.convert(op.input(other), to_ir(t));
  Value g = L::gcd(b, x, y);
  if (lcm) {
    auto shape = b.dims(g);
    x = b.broadcast_to(x, shape);
    y = b.broadcast_to(y, shape);
    Value zero = b.compare(g, b.scalar_like(g, 0), "EQ");
    Value q = b.binary("divide", x, b.select(zero, b.scalar_like(g, 1), g));
    g = b.select(zero, b.scalar_like(g, 0), L::abs(b, b.binary("multiply", q, y)));
  }
  return finish(op, g, t, into);
}
Tensor gcd_fn(const Tensor& s, const Tensor& o) { return gcd_lcm("gcd", s, o, false, nullptr); }
Tensor& gcd_out(const Tensor& s, const Tensor& o, Tensor& out) { return write_out("gcd", gcd_fn(s, o), out); }
Tensor& gcd_inplace(Tensor& s, const Tensor& o) {
  gcd_lcm("gcd", s, o, false, &s);
  return s;
}
Tensor lcm_fn(const Tensor& s, const Tensor& o) { return gcd_lcm("lcm", s, o, true, nullptr); }
Tensor& lcm_out(const Tensor& s, const Tensor& o, Tensor& out) { return write_out("lcm", lcm_fn(s, o), out); }
Tensor& lcm_inplace(Tensor& s, const Tensor& o) {
  gcd_lcm("lcm", s, o, true, &s);
  return s;
}

std::tuple<Tensor, Tensor> frexp_fn(const Tensor& self) {
  TORCH_CHECK(at::isFloatingType(self.scalar_type()),
              "torch.frexp() only supports floating-point dtypes");
  OpBuilder op("aten::frexp");
  auto& b = op.b();
  ir::DType dt = to_ir(self.scalar_type());
  ir::DType acc = L::accumulate_type(dt) == ir::DType::F64 ? ir::DType::F64 : ir::DType::F32;
  Value x = b.convert(op.input(self), acc);
  // x = m * 2^e with 0.5 <= |m| < 1: e from log2, then corrected by one either way.
  Value ax = b.unary("abs", x);
  Value finite_nonzero = b.binary("and", b.unary("is_finite", x), b.compare(ax, b.scalar_like(ax, 0), "NE"));
  Value safe = b.select(finite_nonzero, ax, b.scalar_like(ax, 1));
  Value e = b.binary("add", b.unary("floor", b.binary("divide", b.unary("log", safe), b.scalar_like(safe, std::log(2.0)))),
                     b.scalar_like(safe, 1));
  auto scaled = [&](Value ev) { return b.binary("multiply", safe, b.binary("power", b.scalar_like(safe, 2), b.unary("negate", ev))); };
  Value m = scaled(e);
  Value too_big = b.compare(m, b.scalar_like(m, 1), "GE"), too_small = b.compare(m, b.scalar_like(m, 0.5), "LT");
  e = b.select(too_big, b.binary("add", e, b.scalar_like(e, 1)), b.select(too_small, b.binary("subtract", e, b.scalar_like(e, 1)), e));
  m = scaled(e);
  m = b.select(b.compare(x, b.scalar_like(x, 0), "LT"), b.unary("negate", m), m);
  // Zero, inf and NaN: the mantissa is x itself and the exponent 0 (as C's frexp).
  m = b.select(finite_nonzero, m, x);
  e = b.select(finite_nonzero, e, b.scalar_like(e, 0));
  Tensor mant = op.output(b.convert(m, dt), self.scalar_type());
  Tensor expo = op.output(b.convert(e, ir::DType::S32), at::kInt);
  op.run();
  return {mant, expo};
}
std::tuple<Tensor&, Tensor&> frexp_out(const Tensor& self, Tensor& mantissa, Tensor& exponent) {
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "torch.frexp() only supports floating-point dtypes");
  TORCH_CHECK(mantissa.scalar_type() == self.scalar_type(), "torch.frexp() expects mantissa to have dtype ",
              self.scalar_type(), " but got ", mantissa.scalar_type());
  TORCH_CHECK(exponent.scalar_type() == at::kInt, "torch.frexp() expects exponent to have int dtype but got ",
              exponent.scalar_type());
  auto [m, e] = frexp_fn(self);
  write_outs("frexp", {m, e}, {mantissa, exponent});
  return {mantissa, exponent};
}

// ---------------------------------------------------------------- data movers

Tensor narrow_copy_fn(const Tensor& self, int64_t dim, int64_t start, int64_t length) {
  TORCH_CHECK(self.dim() > 0, "narrow() cannot be applied to a 0-dim tensor.");
  int64_t d = at::maybe_wrap_dim(dim, self.dim());
  int64_t size = self.size(d);
  TORCH_CHECK_INDEX(start >= -size && start <= size, "start out of range (expected to be in range of [", -size, ", ", size,
              "], but got ", start, ")");
  if (start < 0) start += size;
  TORCH_CHECK(length >= 0, "narrow(): length must be non-negative.");
  TORCH_CHECK(start <= size - length, "start (", start, ") + length (", length,
              ") exceeds dimension size (", size, ").");
  OpBuilder op("aten::narrow_copy");
  Value r = op.b().slice_dim(op.input(self), d, start, start + length);
  return finish(op, r, self.scalar_type(), nullptr);
}
Tensor& narrow_copy_out(const Tensor& self, int64_t dim, int64_t start, int64_t length, Tensor& out) {
  return write_out("narrow_copy", narrow_copy_fn(self, dim, start, length), out);
}

Tensor bincount_fn(const Tensor& self, const std::optional<Tensor>& weights, int64_t minlength) {
  // ATen dispatches on the dtype before it checks the shape.
  TORCH_CHECK_NOT_IMPLEMENTED(at::isIntegralType(self.scalar_type(), /*includeBool=*/false), "\"bincount\" not implemented for '",
              self.scalar_type(), "'");
  TORCH_CHECK(self.dim() == 1, "bincount only supports 1-d non-negative integral inputs.");
  TORCH_CHECK(minlength >= 0, "minlength should be >= 0");
  bool weighted = weights && weights->defined();
  if (weighted) {
    TORCH_CHECK(weights->dim() == 1 && weights->size(0) == self.size(0),
                "weights should be 1-d and have the same length as input");
  }
  // The length depends on the data: one host read (like nonzero).
  int64_t length = minlength;
  if (self.numel() > 0) {
    TORCH_CHECK(self.min().item<int64_t>() >= 0, "bincount only supports 1-d non-negative integral inputs.");
    length = std::max<int64_t>(length, self.max().item<int64_t>() + 1);
  }
  at::ScalarType out = !weighted ? at::kLong : weights->scalar_type() == at::kFloat ? at::kFloat : at::kDouble;
  OpBuilder op("aten::bincount");
  auto& b = op.b();
  Value idx = b.convert(op.input(self), ir::DType::S64);
  Value w = weighted ? b.convert(op.input(*weights), to_ir(out)) : b.constant_int(to_ir(out), 1, {self.size(0)});
  Value zeros = b.constant(to_ir(out), 0, {length});
  Value r = self.numel() == 0 ? zeros : L::scatter(b, zeros, 0, idx, w, "add");
  return finish(op, r, out, nullptr);
}

Tensor nonzero_static_fn(const Tensor& self, int64_t size, int64_t fill_value) {
  TORCH_CHECK(size >= 0, "nonzero_static: 'size' must be an non-negative integer");
  OpBuilder op("aten::nonzero_static");
  auto& b = op.b();
  int64_t n = self.numel(), rank = self.dim();
  std::vector<int64_t> out_dims{size, rank};
  Value fill = b.constant_int(ir::DType::S64, fill_value, {size + 1, rank});
  if (n == 0 || size == 0) return finish(op, b.slice_dim(fill, 0, 0, size), at::kLong, nullptr);
  Value flat = b.reshape(b.convert(op.input(self), ir::DType::Pred), {n});
  // Slot of each nonzero: the count of nonzeros before it; the rest go to a spare row.
  Value ones = b.convert(flat, ir::DType::S64);
  Value slot = b.binary("subtract", L::cumulative(b, ones, 0, "sum"), ones);
  Value keep = b.binary("and", flat, b.compare(slot, b.constant_int(ir::DType::S64, size, {n}), "LT"));
  slot = b.select(keep, slot, b.constant_int(ir::DType::S64, size, {n}));
  // Coordinates of every element, [n, rank].
  std::vector<Value> coords;
  Value rest = b.iota(ir::DType::S64, {n}, 0);
  std::vector<Value> per_dim(rank);
  for (int64_t d = rank - 1; d >= 0; --d) {
    Value sz = b.constant_int(ir::DType::S64, self.size(d), {n});
    per_dim[d] = b.reshape(b.binary("remainder", rest, sz), {n, 1});
    rest = b.binary("divide", rest, sz);
  }
  Value coord = rank == 0 ? b.constant_int(ir::DType::S64, 0, {n, 0}) : b.concatenate(per_dim, 1);
  Value rows = L::scatter(b, b.constant_int(ir::DType::S64, fill_value, {size + 1, rank}), 0,
                          b.broadcast_in_dim(slot, {n, rank}, {0}), coord, "");
  return finish(op, b.slice_dim(rows, 0, 0, size), at::kLong, nullptr);
}
Tensor& nonzero_static_out(const Tensor& self, int64_t size, int64_t fill_value, Tensor& out) {
  return write_out("nonzero_static", nonzero_static_fn(self, size, fill_value), out);
}

// ---------------------------------------------------------------- histograms
// torch.histogram / histogramdd as compositions of native kernels: a sample falls in
// bin i when edges[i] <= x < edges[i + 1] (the last bin closed), outside all bins
// it is dropped; the counts (or summed weights) are one index_add.

// samples: the input as histogramdd reads it, [..., D] (histogram's as [N, 1]).
void check_histogram_input(const char* name, const Tensor& samples, const std::optional<Tensor>& weight) {
  TORCH_CHECK(at::isFloatingType(samples.scalar_type()), name, ": input tensor must be floating point, got ",
              samples.scalar_type());
  TORCH_CHECK(samples.dim() >= 2, "torch.histogramdd: input tensor should have at least 2 dimensions");
  if (weight && weight->defined()) {
    TORCH_CHECK(weight->scalar_type() == samples.scalar_type(), name, ": weight should have the same dtype as input");
    auto outer = samples.sizes().slice(0, samples.dim() - 1);
    TORCH_CHECK(weight->sizes() == outer, "torch.histogramdd: if weight tensor is provided it should have the same shape ",
                "as the input tensor excluding its innermost dimension, but got input with shape ", samples.sizes(),
                " and weight with shape ", weight->sizes());
  }
}

// Counts of samples [N, D] over per-dimension edges: a tensor of shape (edges[d].numel() - 1)_d.
Tensor histogram_counts(const Tensor& samples, const std::vector<Tensor>& edges, const std::optional<Tensor>& weight,
                        bool density) {
  int64_t n = samples.size(0), dims = static_cast<int64_t>(edges.size());
  auto long_options = samples.options().dtype(at::kLong);
  Tensor flat_index = at::zeros({n}, long_options);
  Tensor inside = at::ones({n}, samples.options().dtype(at::kBool));
  std::vector<int64_t> shape;
  for (int64_t d = 0; d < dims; ++d) {
    const Tensor& e = edges[d];
    int64_t bins = e.numel() - 1;
    Tensor x = samples.select(1, d).contiguous();
    Tensor last = e.select(0, bins);
    Tensor pos = at::searchsorted(e, x, /*out_int32=*/false, /*right=*/true) - 1;
    pos = at::where(x == last, at::scalar_tensor(bins - 1, long_options), pos);  // the last bin is closed
    inside = inside & (x >= e.select(0, 0)) & (x <= last);
    flat_index = flat_index * bins + pos.clamp(0, bins - 1);
    shape.push_back(bins);
  }
  Tensor w = weight && weight->defined() ? weight->reshape({n}) : at::ones({n}, samples.options());
  w = at::where(inside, w, at::zeros({}, samples.options()));
  int64_t total = 1;
  for (int64_t s : shape) total *= s;
  Tensor hist = at::zeros({total}, samples.options()).index_add_(0, flat_index, w).reshape(shape);
  if (density) {
    // Divided by the total and by each bin's volume (the product of its widths).
    Tensor volume = at::ones(shape, samples.options());
    for (int64_t d = 0; d < dims; ++d) {
      int64_t bins = shape[d];
      Tensor width = edges[d].slice(0, 1, bins + 1) - edges[d].slice(0, 0, bins);
      std::vector<int64_t> view(dims, 1);
      view[d] = bins;
      volume = volume * width.reshape(view);
    }
    hist = hist / (hist.sum() * volume);
  }
  return hist;
}

// Per-dimension outer edges: the range given, else the samples' min and max (one host
// read), widened by 1/2 each way when they coincide; [0, 1] for no samples.
std::vector<std::pair<double, double>> outer_edges(const char* name, const Tensor& samples,
                                                   std::optional<at::ArrayRef<double>> range, int64_t dims) {
  std::vector<std::pair<double, double>> out(dims, {0.0, 1.0});
  if (range) {
    TORCH_CHECK(static_cast<int64_t>(range->size()) == 2 * dims, name, ": for a ", dims, "-dimensional histogram, range ",
                "should have ", 2 * dims, " elements, but got ", range->size());
    for (int64_t d = 0; d < dims; ++d) out[d] = {(*range)[2 * d], (*range)[2 * d + 1]};
  } else if (samples.size(0) > 0) {
    auto [lo, hi] = at::aminmax(samples, 0);
    Tensor both = at::stack({lo, hi}).to(at::kDouble).cpu();
    for (int64_t d = 0; d < dims; ++d) out[d] = {both[0][d].item<double>(), both[1][d].item<double>()};
  }
  for (int64_t d = 0; d < dims; ++d) {
    auto& [lo, hi] = out[d];
    // CPU's messages (which name histogramdd for both).
    TORCH_CHECK(std::isfinite(lo) && std::isfinite(hi), "torch.histogramdd: dimension ", d, "'s range [", lo, ", ", hi,
                "] is not finite");
    TORCH_CHECK(lo <= hi, "torch.histogramdd: min should not exceed max, but got min ", lo, " max ", hi,
                " for dimension ", d);
    if (lo == hi) {
      lo -= 0.5;
      hi += 0.5;
    }
  }
  return out;
}

Tensor samples_of(const Tensor& self, int64_t dims) { return self.reshape({-1, dims}); }

std::vector<Tensor> histogramdd_edges(const char* name, const Tensor& self, at::IntArrayRef bins,
                                      std::optional<at::ArrayRef<double>> range) {
  int64_t dims = self.dim() == 0 ? 1 : self.size(-1);
  TORCH_CHECK(static_cast<int64_t>(bins.size()) == dims, name,
              ": The size of bins must be equal to the innermost dimension of the input. Got ", bins.size(), " bins for ",
              dims, " dimensions");
  auto outer = outer_edges(name, samples_of(self, dims), range, dims);
  std::vector<Tensor> edges;
  for (int64_t d = 0; d < dims; ++d) {
    TORCH_CHECK(bins[d] > 0, name, ": bins must be > 0, but got ", bins[d], " for dimension ", d);
    edges.push_back(at::linspace(outer[d].first, outer[d].second, bins[d] + 1, self.options()));
  }
  return edges;
}

std::vector<Tensor> histogramdd_bin_edges_k(const Tensor& self, at::IntArrayRef bins, std::optional<at::ArrayRef<double>> range,
                                            const std::optional<Tensor>& weight, bool density) {
  check_histogram_input("torch.histogramdd", self, weight);
  return histogramdd_edges("torch.histogramdd", self, bins, range);
}
Tensor histogramdd_from_bin_cts_k(const Tensor& self, at::IntArrayRef bins, std::optional<at::ArrayRef<double>> range,
                                  const std::optional<Tensor>& weight, bool density) {
  check_histogram_input("torch.histogramdd", self, weight);
  auto edges = histogramdd_edges("torch.histogramdd", self, bins, range);
  return histogram_counts(samples_of(self, static_cast<int64_t>(edges.size())), edges, weight, density);
}
Tensor histogramdd_from_bin_tensors_k(const Tensor& self, at::TensorList bins, const std::optional<Tensor>& weight,
                                      bool density) {
  check_histogram_input("torch.histogramdd", self, weight);
  int64_t dims = self.dim() == 0 ? 1 : self.size(-1);
  TORCH_CHECK(static_cast<int64_t>(bins.size()) == dims, "torch.histogramdd: expected ", dims,
              " sequences of bin edges for a ", dims, "-dimensional histogram but got ", bins.size());
  std::vector<Tensor> edges(bins.begin(), bins.end());
  for (const Tensor& e : edges) {
    TORCH_CHECK(e.dim() == 1 && e.numel() > 0, "torch.histogramdd: bin edges must be non-empty 1-d tensors");
  }
  return histogram_counts(samples_of(self, dims), edges, weight, density);
}

// torch.histogram: the flattened input as one-dimensional samples [N, 1], weights flattened too.
std::optional<Tensor> flat_weight(const std::optional<Tensor>& weight) {
  return weight && weight->defined() ? std::optional<Tensor>(weight->reshape({-1})) : std::nullopt;
}
std::tuple<Tensor, Tensor> histogram_bin_ct(const Tensor& self, int64_t bins, std::optional<at::ArrayRef<double>> range,
                                            const std::optional<Tensor>& weight, bool density) {
  Tensor samples = self.reshape({-1, 1});
  auto w = flat_weight(weight);
  check_histogram_input("torch.histogram", samples, w);
  auto edges = histogramdd_edges("torch.histogram", samples, {bins}, range);
  return {histogram_counts(samples, edges, w, density), edges[0]};
}
std::tuple<Tensor, Tensor> histogram_bins_tensor(const Tensor& self, const Tensor& bins, const std::optional<Tensor>& weight,
                                                 bool density) {
  Tensor samples = self.reshape({-1, 1});
  auto w = flat_weight(weight);
  check_histogram_input("torch.histogram", samples, w);
  TORCH_CHECK(bins.dim() == 1 && bins.numel() > 0, "torch.histogram: bins tensor should have one dimension and at least 1 element");
  TORCH_CHECK(bins.scalar_type() == self.scalar_type(), "torch.histogram: input tensor and bins tensors should have the same dtype");
  return {histogram_counts(samples, {bins}, w, density), bins.clone()};
}
std::tuple<Tensor&, Tensor&> histogram_bin_ct_out(const Tensor& self, int64_t bins, std::optional<at::ArrayRef<double>> range,
                                                  const std::optional<Tensor>& weight, bool density, Tensor& hist,
                                                  Tensor& bin_edges) {
  auto [h, e] = histogram_bin_ct(self, bins, range, weight, density);
  write_outs("torch.histogram", {h, e}, {hist, bin_edges});
  return {hist, bin_edges};
}
std::tuple<Tensor&, Tensor&> histogram_bins_tensor_out(const Tensor& self, const Tensor& bins,
                                                       const std::optional<Tensor>& weight, bool density, Tensor& hist,
                                                       Tensor& bin_edges) {
  auto [h, e] = histogram_bins_tensor(self, bins, weight, density);
  write_outs("torch.histogram", {h, e}, {hist, bin_edges});
  return {hist, bin_edges};
}

// Unique slices along `dim` (rows of the input moved to [n, m], compared whole): sorted
// lexicographically (stable sorts of the row order by each column, last column first) or,
// without `sort`, consecutive runs. The number of groups is data: one host read of it,
// then one program for the results.
constexpr int64_t kMaxUniqueRowLength = 256;  // longer rows: the CPU kernel (one sort per column here)

std::tuple<Tensor, Tensor, Tensor> unique_rows(const char* name, const Tensor& self, int64_t dim, bool sort,
                                               bool return_inverse, bool return_counts) {
  int64_t d = at::maybe_wrap_dim(dim, self.dim());
  Tensor moved = self.movedim(d, 0);
  int64_t n = moved.size(0), m = 1;
  for (int64_t i = 1; i < moved.dim(); ++i) m *= moved.size(i);
  Tensor empty_long = at::empty({0}, self.options().dtype(at::kLong));
  if (n == 0) return {self.clone(), empty_long, empty_long};
  TORCH_CHECK(m > 0, "There are 0 sized dimensions, and they aren't selected, so unique cannot be applied");
  if (m > kMaxUniqueRowLength) {
    static auto unique_dim = c10::Dispatcher::singleton().findSchemaOrThrow("aten::unique_dim", "");
    static auto consecutive = c10::Dispatcher::singleton().findSchemaOrThrow("aten::unique_consecutive", "");
    torch::jit::Stack stack = sort ? torch::jit::Stack{self, d, true, return_inverse, return_counts}
                                   : torch::jit::Stack{self, return_inverse, return_counts, d};
    run_on_cpu(sort ? unique_dim : consecutive, &stack);
    return {stack[0].toTensor(), stack[1].toTensor(), stack[2].toTensor()};
  }
  auto groups = [&](ir::Builder& b, Value rows) -> std::vector<Value> {
    Value perm = b.iota(ir::DType::S64, {n}, 0);
    auto column = [&](int64_t j) { return b.reshape(b.slice_dim(rows, 1, j, j + 1), {n}); };
    if (sort && n > 1) {
      for (int64_t j = m - 1; j >= 0; --j) {
        Value key = L::gather(b, column(j), 0, perm);
        if (b.dtype(key) == ir::DType::Pred) key = b.convert(key, ir::DType::U8);
        perm = b.sort({key, perm}, 0, /*descending=*/false, /*stable=*/true)[1];
      }
    }
    Value sorted = L::index_select(b, rows, 0, perm);
    Value prev = b.concatenate({b.slice_dim(sorted, 0, 0, 1), b.slice_dim(sorted, 0, 0, n - 1)}, 0);
    Value differs = b.reduce_simple(b.compare(sorted, prev, "NE"), b.constant_int(ir::DType::Pred, 0), {1}, "or");
    Value first = b.compare(b.iota(ir::DType::S64, {n}, 0), b.constant_int(ir::DType::S64, 0, {n}), "EQ");
    Value is_new = b.binary("or", first, differs);
    Value g = b.binary("subtract", L::cumulative(b, b.convert(is_new, ir::DType::S64), 0, "sum"),
                       b.constant_int(ir::DType::S64, 1, {n}));
    return {sorted, perm, g, is_new};
  };
  int64_t u;
  {
    OpBuilder count(std::string("aten::") + name);
    auto& b = count.b();
    auto gr = groups(b, b.reshape(count.input(moved), {n, m}));
    Value total = b.reduce_simple(b.convert(gr[3], ir::DType::S64), b.constant_int(ir::DType::S64, 0), {0}, "add");
    Tensor t = count.output(total, at::kLong);
    count.run();
    u = t.item<int64_t>();
  }
  OpBuilder op(std::string("aten::") + name);
  auto& b = op.b();
  auto gr = groups(b, b.reshape(op.input(moved), {n, m}));
  Value index = b.broadcast_in_dim(gr[2], {n, m}, {0});
  std::vector<int64_t> shape = vec(moved.sizes());
  shape[0] = u;
  Value values = b.reshape(L::scatter(b, b.constant(b.dtype(gr[0]), 0, {u, m}), 0, index, gr[0], ""), shape);
  std::vector<std::pair<Value, at::ScalarType>> results{{values, self.scalar_type()}};
  if (return_inverse) results.push_back({L::scatter(b, b.constant_int(ir::DType::S64, 0, {n}), 0, gr[1], gr[2], ""), at::kLong});
  if (return_counts) {
    results.push_back({L::scatter(b, b.constant_int(ir::DType::S64, 0, {u}), 0, gr[2], b.constant_int(ir::DType::S64, 1, {n}), "add"),
                       at::kLong});
  }
  std::vector<Tensor> out;
  for (auto& [v, t] : results) out.push_back(op.output(v, t));
  op.run();
  size_t i = 1;
  Tensor inverse = return_inverse ? out[i++] : empty_long;
  Tensor counts = return_counts ? out[i++] : empty_long;
  return {out[0].movedim(0, d).contiguous(), inverse, counts};
}

// Unique values of the flattened input (its elements as rows of one), sorted or, without
// `sort`, consecutive runs; the inverse indices take the input's shape.
std::tuple<Tensor, Tensor, Tensor> unique_flat(const char* name, const Tensor& self, bool sort, bool return_inverse,
                                               bool return_counts) {
  auto [values, inverse, counts] = unique_rows(name, self.reshape({-1}), 0, sort, return_inverse, return_counts);
  return {values, return_inverse ? inverse.reshape(self.sizes()) : inverse, counts};
}

std::tuple<Tensor, Tensor, Tensor> unique_dim_k(const Tensor& self, int64_t dim, bool sorted, bool return_inverse,
                                                bool return_counts) {
  (void)sorted;  // CPU sorts whether or not it is asked to
  return unique_rows("unique_dim", self, dim, true, return_inverse, return_counts);
}

std::tuple<Tensor, Tensor, Tensor> unique_consecutive_k(const Tensor& self, bool return_inverse, bool return_counts,
                                                        std::optional<int64_t> dim) {
  if (dim.has_value() && self.dim() > 1) {
    return unique_rows("unique_consecutive", self, *dim, false, return_inverse, return_counts);
  }
  // Flat (or 1-d along its only dim): consecutive runs, unsorted.
  return unique_flat("unique_consecutive", self, false, return_inverse, return_counts);
}

std::tuple<Tensor, Tensor, Tensor> unique2_fn(const Tensor& self, bool sorted, bool return_inverse, bool return_counts) {
  // CPU sorts whether or not `sorted` is asked for.
  (void)sorted;
  return unique_flat("_unique2", self, true, return_inverse, return_counts);
}
std::tuple<Tensor, Tensor> unique_fn(const Tensor& self, bool sorted, bool return_inverse) {
  auto [v, inv, c] = unique_flat("_unique", self, true, return_inverse, false);
  return {v, inv};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_unique2", unique2_fn);
  m.impl("unique_consecutive", unique_consecutive_k);
  m.impl("unique_dim", unique_dim_k);
  m.impl("histogram.bin_ct", histogram_bin_ct);
  m.impl("histogram.bins_tensor", histogram_bins_tensor);
  m.impl("histogram.bin_ct_out", histogram_bin_ct_out);
  m.impl("histogram.bins_tensor_out", histogram_bins_tensor_out);
  m.impl("_histogramdd_bin_edges", histogramdd_bin_edges_k);
  m.impl("_histogramdd_from_bin_cts", histogramdd_from_bin_cts_k);
  m.impl("_histogramdd_from_bin_tensors", histogramdd_from_bin_tensors_k);
  m.impl("_unique", unique_fn);
#define REG_POLY(NAME, OP)                       \
  m.impl("special_" OP, NAME##_fn);              \
  m.impl("special_" OP ".out", NAME##_out);
  REG_POLY(cheb_t, "chebyshev_polynomial_t") REG_POLY(cheb_u, "chebyshev_polynomial_u")
  REG_POLY(cheb_v, "chebyshev_polynomial_v") REG_POLY(cheb_w, "chebyshev_polynomial_w")
  REG_POLY(scheb_t, "shifted_chebyshev_polynomial_t") REG_POLY(scheb_u, "shifted_chebyshev_polynomial_u")
  REG_POLY(scheb_v, "shifted_chebyshev_polynomial_v") REG_POLY(scheb_w, "shifted_chebyshev_polynomial_w")
  REG_POLY(hermite_h, "hermite_polynomial_h") REG_POLY(hermite_he, "hermite_polynomial_he")
  REG_POLY(laguerre_l, "laguerre_polynomial_l") REG_POLY(legendre_p, "legendre_polynomial_p")
#undef REG_POLY
  m.impl("special_modified_bessel_i0", modified_bessel_i0);
  m.impl("special_modified_bessel_i0.out", modified_bessel_i0_out);
  m.impl("special_modified_bessel_i1", modified_bessel_i1);
  m.impl("special_modified_bessel_i1.out", modified_bessel_i1_out);
  m.impl("special_spherical_bessel_j0", spherical_bessel_j0);
  m.impl("special_spherical_bessel_j0.out", spherical_bessel_j0_out);
  m.impl("igamma", igamma_fn);
  m.impl("igamma.out", igamma_out);
  m.impl("igamma_", igamma_inplace);
  m.impl("igammac", igammac_fn);
  m.impl("igammac.out", igammac_out);
  m.impl("igammac_", igammac_inplace);
  m.impl("special_bessel_j0", bessel_j0_fn);
  m.impl("special_bessel_j0.out", bessel_j0_out);
  m.impl("special_bessel_j1", bessel_j1_fn);
  m.impl("special_bessel_j1.out", bessel_j1_out);
  m.impl("special_bessel_y0", bessel_y0_fn);
  m.impl("special_bessel_y0.out", bessel_y0_out);
  m.impl("special_bessel_y1", bessel_y1_fn);
  m.impl("special_bessel_y1.out", bessel_y1_out);
  m.impl("gcd", gcd_fn);
  m.impl("gcd.out", gcd_out);
  m.impl("gcd_", gcd_inplace);
  m.impl("lcm", lcm_fn);
  m.impl("lcm.out", lcm_out);
  m.impl("lcm_", lcm_inplace);
  m.impl("frexp.Tensor", frexp_fn);
  m.impl("frexp.Tensor_out", frexp_out);
  m.impl("narrow_copy", narrow_copy_fn);
  m.impl("narrow_copy.out", narrow_copy_out);
  m.impl("bincount", bincount_fn);
  m.impl("nonzero_static", nonzero_static_fn);
  m.impl("nonzero_static.out", nonzero_static_out);
}

}  // namespace torch_pjrt::device
