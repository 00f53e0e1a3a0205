#include "lowering/ops.h"

#include <cmath>
#include <limits>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>

namespace torch_pjrt::lowering {

Value abs(Builder& b, Value x) {
  return ir::is_unsigned_int(b.dtype(x)) || b.dtype(x) == DType::Pred ? x : b.unary("abs", x);
}

namespace {

bool low_precision(DType d) { return d == DType::F16 || d == DType::BF16; }
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

Value poly(Builder& b, Value x, const std::vector<double>& coeffs) {
  Value p = b.scalar_like(x, coeffs[0]);
  for (size_t i = 1; i < coeffs.size(); ++i) {
    p = b.binary("add", b.binary("multiply", p, x), b.scalar_like(x, coeffs[i]));
  }
  return p;
}

// Modified Bessel function I0 (scaled: times exp(-|x|)). Below a switch point S the power
// series sum_k (x^2/4)^k / (k!)^2, above it the asymptotic series exp(x) / sqrt(2 pi x) *
// sum_k ((2k-1)!!)^2 / (k! (8x)^k); both sum positive terms. Against mpmath, float64 (S = 20,
// 37 and 23 terms) is within 2e-16 of I0 on each side, and float32 (S = 12, 21 and 18 terms,
// fewer roundings) within 5e-11. Unscaled, it is exp(|x|) times the scaled value: infinite from
// where exp overflows (|x| > 88.7 in float32, 709.8 in float64), as on torch's CPU, a little before
// I0 itself does (kaiser_window's NaNs past there match the CPU's); at +-inf it is NaN, as torch
// and scipy give it.
Value bessel_i0(Builder& b, Value x, bool scaled) {
  const bool f64 = b.dtype(x) == DType::F64;
  const double switch_point = f64 ? 20.0 : 12.0;
  // The power series in u = x^2 / 2^m <= 1 (a power of two: no rounding beyond x^2's): its
  // coefficients (2^m / 4)^k / (k!)^2 stay in float32's range (1 / (4^k (k!)^2) underflows there
  // from k = 17). Highest degree first, as poly() takes them.
  const double u_scale = f64 ? 1.0 / 512 : 1.0 / 256;
  std::vector<double> series_coeffs(f64 ? 37 : 21), asymptotic_coeffs(f64 ? 23 : 18);
  double term = 1;
  for (size_t k = 0; k < series_coeffs.size(); ++k) {
    if (k > 0) term *= 1 / (4 * u_scale) / (double(k) * k);
    series_coeffs[series_coeffs.size() - 1 - k] = term;
  }
  term = 1;
  for (size_t k = 0; k < asymptotic_coeffs.size(); ++k) {
    if (k > 0) term *= (2.0 * k - 1) * (2.0 * k - 1) / (8.0 * k);
    asymptotic_coeffs[asymptotic_coeffs.size() - 1 - k] = term;
  }
  auto c = [&](double v) { return b.scalar_like(x, v); };
  Value ax = b.unary("abs", x);
  Value is_small = b.compare(ax, c(switch_point), "LE");
  Value xs = b.binary("minimum", ax, c(switch_point)), xl = b.binary("maximum", ax, c(switch_point));  // each branch finite
  Value series = poly(b, b.binary("multiply", b.binary("multiply", xs, xs), c(u_scale)), series_coeffs);
  Value scaled_large = b.binary("divide", poly(b, b.binary("divide", c(1), xl), asymptotic_coeffs),
                                b.binary("multiply", b.unary("sqrt", xl), c(std::sqrt(2 * M_PI))));  // 2 pi x may overflow
  if (scaled) return b.select(is_small, b.binary("multiply", series, b.unary("exponential", b.unary("negate", ax))), scaled_large);
  Value large = b.binary("multiply", b.unary("exponential", xl), scaled_large);
  large = b.select(b.compare(ax, c(INFINITY), "EQ"), c(NAN), large);  // torch's (and scipy's) I0(+-inf)
  return b.select(is_small, series, large);
}

// log(Phi(x)), the standard normal CDF's logarithm, in three ranges, each without underflow
// or cancellation:
//   x > 0:    log1p(-Phi(-x)), so that a Phi close to 1 keeps its tiny logarithm;
//   x < -T:   the asymptotic series of Mills' ratio (erfc underflows there);
//   between:  log(erfc(-x / sqrt 2) / 2).
// T is where 10 terms of the series are exact to the dtype's precision.
Value log_ndtr(Builder& b, Value x) {
  double tail = b.dtype(x) == ir::DType::F64 ? -20.0 : -10.0;
  auto c = [&](double v) { return b.scalar_like(x, v); };
  Value upper = b.unary("log_plus_one", b.binary("multiply", b.unary("chlo.erfc", b.binary("multiply", x, c(M_SQRT1_2))), c(-0.5)));
  Value middle = b.unary("log", b.binary("multiply", b.unary("chlo.erfc", b.binary("multiply", x, c(-M_SQRT1_2))), c(0.5)));
  Value xs = b.select(b.compare(x, c(tail), "LT"), x, c(tail));  // keeps the unused branch finite
  Value inv_x2 = b.binary("divide", c(1), b.binary("multiply", xs, xs));
  Value series = c(0), term = c(1);
  for (int k = 1; k <= 10; ++k) {
    term = b.binary("multiply", term, b.binary("multiply", inv_x2, c(-(2.0 * k - 1))));
    series = b.binary("add", series, term);
  }
  Value lower = b.binary("subtract", b.binary("multiply", b.binary("multiply", xs, xs), c(-0.5)),
                         b.binary("add", b.unary("log", b.unary("negate", xs)), c(0.5 * std::log(2 * M_PI))));
  lower = b.binary("add", lower, b.unary("log_plus_one", series));
  Value r = b.select(b.compare(x, c(0), "GT"), upper, middle);
  return b.select(b.compare(x, c(tail), "LT"), lower, r);
}

// The inverse of the standard normal CDF. In the centre (1/4 <= p <= 3/4), sqrt(2) erfinv(2p - 1),
// whose argument is exact there. In the tails 2p - 1 would drop p's low bits, so from q = min(p, 1 - p)
// (exact for p >= 1/2): a rational first guess (Abramowitz & Stegun 26.2.23, within 4.5e-4) refined
// by three Newton steps on log Phi(x) = log q (log_ndtr keeps its accuracy deep in the tail, where
// erfc's relative error grows with x^2).
Value ndtri(Builder& b, Value p) {
  auto c = [&](double v) { return b.scalar_like(p, v); };
  Value central = b.binary("multiply", b.unary("chlo.erf_inv", b.binary("subtract", b.binary("multiply", p, c(2)), c(1))),
                           c(M_SQRT2));
  Value upper = b.compare(p, c(0.5), "GT");
  Value q = b.select(upper, b.binary("subtract", c(1), p), p);
  // Clamped to the smallest normal number, so that each branch stays finite.
  double smallest = b.dtype(p) == DType::F64 ? 2.2250738585072014e-308 : 1.1754943508222875e-38;
  q = b.binary("maximum", b.binary("minimum", q, c(0.25)), c(smallest));
  Value log_q = b.unary("log", q);
  Value t = b.unary("sqrt", b.binary("multiply", log_q, c(-2)));
  Value x = b.binary("subtract", b.binary("divide", poly(b, t, {0.010328, 0.802853, 2.515517}),
                                          poly(b, t, {0.001308, 0.189269, 1.432788, 1.0})), t);  // x < 0
  for (int step = 0; step < 3; ++step) {  // on log Phi: nearly quadratic, and exact to the ulp of log q
    Value log_cdf = log_ndtr(b, x);
    Value log_pdf = b.binary("subtract", b.binary("multiply", b.binary("multiply", x, x), c(-0.5)), c(0.5 * std::log(2 * M_PI)));
    Value cdf_over_pdf = b.unary("exponential", b.binary("subtract", log_cdf, log_pdf));
    x = b.binary("subtract", x, b.binary("multiply", b.binary("subtract", log_cdf, log_q), cdf_over_pdf));
  }
  Value tail = b.select(upper, b.unary("negate", x), x);
  Value in_centre = b.binary("and", b.compare(p, c(0.25), "GE"), b.compare(p, c(0.75), "LE"));
  Value r = b.select(in_centre, central, tail);
  r = b.select(b.compare(p, c(0), "EQ"), c(-INFINITY), r);
  r = b.select(b.compare(p, c(1), "EQ"), c(INFINITY), r);
  Value outside = b.binary("or", b.compare(p, c(0), "LT"), b.compare(p, c(1), "GT"));
  return b.select(outside, c(NAN), r);  // NaN stays NaN: it falls in no range
}

// Complex division as torch's CPU (c10::complex) and numpy compute it: Smith's algorithm, scaled
// by the larger part of the divisor, with no recovery of infinities (XLA's division returns C99's
// limits, e.g. 1 / (inf + inf i) = 0 where the CPU gives NaN). A zero divisor gives a / 0 and b / 0.
// A float's bits as the signed integer of its width, and back: the sign bit read and set
// exactly, NaN's included (arithmetic on a NaN keeps no sign XLA promises).
DType same_width_int(DType d) {
  switch (d) {
    case DType::F64: return DType::S64;
    case DType::F32: return DType::S32;
    default: return DType::S16;  // F16, BF16
  }
}
Value float_bits(Builder& b, Value x) {
  auto dims = b.dims(x);
  return b.reshape(b.bitcast_flat(b.reshape(x, {b.type(x).numel()}), same_width_int(b.dtype(x))), dims);
}
Value from_bits(Builder& b, Value bits, DType d) {
  auto dims = b.dims(bits);
  return b.reshape(b.bitcast_flat(b.reshape(bits, {b.type(bits).numel()}), d), dims);
}

Value complex_divide(Builder& b, Value x, Value y) {
  Value a = b.real(x), bi = b.imag(x), c = b.real(y), d = b.imag(y);
  Value abs_c = b.unary("abs", c), abs_d = b.unary("abs", d), zero = b.scalar_like(c, 0);
  Value real_wider = b.compare(abs_c, abs_d, "GE");  // false for a NaN part, as on CPU
  Value rat = b.select(real_wider, b.binary("divide", d, c), b.binary("divide", c, d));
  Value scale = b.select(real_wider, b.binary("add", c, b.binary("multiply", d, rat)),
                         b.binary("add", d, b.binary("multiply", c, rat)));
  auto mul = [&](Value p, Value q) { return b.binary("multiply", p, q); };
  Value re = b.select(real_wider, b.binary("add", a, mul(bi, rat)), b.binary("add", mul(a, rat), bi));
  Value im = b.select(real_wider, b.binary("subtract", bi, mul(a, rat)), b.binary("subtract", mul(bi, rat), a));
  // Multiplied by the scale's reciprocal, the CPU's rounding; but where that reciprocal is
  // subnormal (a scale past 1 / the dtype's smallest normal), XLA's CPU flushes it to zero:
  // there divided by the scale.
  const double inverse_tiny = b.dtype(c) == DType::F64 ? 1.0 / std::numeric_limits<double>::min()
                                                      : 1.0 / static_cast<double>(std::numeric_limits<float>::min());
  Value huge = b.compare(b.unary("abs", scale), b.scalar_like(scale, inverse_tiny), "GE");
  Value scl = b.binary("divide", b.scalar_like(c, 1), scale);
  re = b.select(huge, b.binary("divide", re, scale), mul(re, scl));
  im = b.select(huge, b.binary("divide", im, scale), mul(im, scl));
  Value both_zero = b.binary("and", b.compare(abs_c, zero, "EQ"), b.compare(abs_d, zero, "EQ"));
  re = b.select(both_zero, b.binary("divide", a, abs_c), re);
  im = b.select(both_zero, b.binary("divide", bi, abs_d), im);
  return b.complex(re, im);
}

using UnaryFn = std::function<Value(Builder&, Value)>;

const std::map<std::string, UnaryFn>& unary_table() {
  static const std::map<std::string, UnaryFn> table = [] {
    std::map<std::string, UnaryFn> t;
    auto simple = [&t](const std::string& name, const std::string& op) {
      t[name] = [op](Builder& b, Value x) { return b.unary(op, x); };
    };
    simple("neg", "negate");
    t["abs"] = [](Builder& b, Value x) { return abs(b, x); };
    simple("exp", "exponential");
    simple("log", "log");
    simple("log1p", "log_plus_one");
    simple("expm1", "exponential_minus_one");
    simple("sqrt", "sqrt");
    simple("rsqrt", "rsqrt");
    simple("sin", "sine");
    simple("cos", "cosine");
    simple("tan", "tan");
    simple("tanh", "tanh");
    simple("sigmoid", "logistic");
    simple("floor", "floor");
    simple("ceil", "ceil");
    simple("round", "round_nearest_even");
    t["sign"] = [](Builder& b, Value x) {
      if (!ir::is_floating(b.dtype(x))) return b.unary("sign", x);
      // torch: (0 < x) - (x < 0), so NaN and -0.0 give 0.
      Value zero = b.scalar_like(x, 0);
      Value pos = b.convert(b.compare(x, zero, "GT"), b.dtype(x)), neg = b.convert(b.compare(x, zero, "LT"), b.dtype(x));
      return b.binary("subtract", pos, neg);
    };
    simple("bitwise_not", "not");
    t["trunc"] = [](Builder& b, Value x) {
      return b.select(b.compare(x, b.scalar_like(x, 0), "LT"), b.unary("ceil", x), b.unary("floor", x));
    };
    t["frac"] = [](Builder& b, Value x) { return b.binary("subtract", x, unary_table().at("trunc")(b, x)); };
    t["reciprocal"] = [](Builder& b, Value x) { return b.binary("divide", b.scalar_like(x, 1), x); };
    t["square"] = [](Builder& b, Value x) { return b.binary("multiply", x, x); };
    t["relu"] = [](Builder& b, Value x) { return b.binary("maximum", x, b.scalar_like(x, 0)); };
    t["silu"] = [](Builder& b, Value x) { return b.binary("multiply", x, b.unary("logistic", x)); };
    t["erf"] = [](Builder& b, Value x) { return erf(b, x); };
    t["log2"] = [](Builder& b, Value x) { return b.binary("divide", b.unary("log", x), b.scalar_like(x, std::log(2.0))); };
    t["log10"] = [](Builder& b, Value x) { return b.binary("divide", b.unary("log", x), b.scalar_like(x, std::log(10.0))); };
    // 2^x as a power, exact at integers (exp(x ln 2) is not), as torch's std::exp2.
    t["exp2"] = [](Builder& b, Value x) { return b.binary("power", b.scalar_like(x, 2.0), x); };
    t["sinh"] = [](Builder& b, Value x) {
      return b.binary("multiply", b.binary("subtract", b.unary("exponential", x), b.unary("exponential", b.unary("negate", x))), b.scalar_like(x, 0.5));
    };
    t["cosh"] = [](Builder& b, Value x) {
      return b.binary("multiply", b.binary("add", b.unary("exponential", x), b.unary("exponential", b.unary("negate", x))), b.scalar_like(x, 0.5));
    };
    t["atan"] = [](Builder& b, Value x) { return b.binary("atan2", x, b.scalar_like(x, 1)); };
    t["asin"] = [](Builder& b, Value x) {
      Value c = b.unary("sqrt", b.binary("subtract", b.scalar_like(x, 1), b.binary("multiply", x, x)));
      return b.binary("atan2", x, c);
    };
    t["acos"] = [](Builder& b, Value x) {
      Value s = b.unary("sqrt", b.binary("subtract", b.scalar_like(x, 1), b.binary("multiply", x, x)));
      return b.binary("atan2", s, x);
    };
    t["isnan"] = [](Builder& b, Value x) { return b.compare(x, x, "NE"); };
    t["isinf"] = [](Builder& b, Value x) {
      return b.compare(b.unary("abs", x), b.scalar_like(x, INFINITY), "EQ");
    };
    t["isposinf"] = [](Builder& b, Value x) { return b.compare(x, b.scalar_like(x, INFINITY), "EQ"); };
    t["isneginf"] = [](Builder& b, Value x) { return b.compare(x, b.scalar_like(x, -INFINITY), "EQ"); };
    t["isfinite"] = [](Builder& b, Value x) { return b.unary("is_finite", x); };
    t["logical_not"] = [](Builder& b, Value x) { return b.unary("not", b.convert(x, DType::Pred)); };
    t["softplus"] = [](Builder& b, Value x) {
      // log(1 + exp(x)) computed stably.
      Value ax = b.unary("abs", x);
      Value r = b.binary("add", b.binary("maximum", x, b.scalar_like(x, 0)),
                         b.unary("log_plus_one", b.unary("exponential", b.unary("negate", ax))));
      return r;
    };
    t["mish"] = [](Builder& b, Value x) {
      return b.binary("multiply", x, b.unary("tanh", unary_table().at("softplus")(b, x)));
    };
    t["hardsigmoid"] = [](Builder& b, Value x) {
      Value y = b.binary("divide", b.binary("add", x, b.scalar_like(x, 3)), b.scalar_like(x, 6));
      return b.binary("minimum", b.binary("maximum", y, b.scalar_like(x, 0)), b.scalar_like(x, 1));  // NaN stays NaN
    };
    t["hardswish"] = [](Builder& b, Value x) {
      return b.binary("multiply", x, unary_table().at("hardsigmoid")(b, x));
    };
    // XLA's CHLO decompositions (legalized by the plugin's compiler).
    simple("asinh", "chlo.asinh");
    simple("acosh", "chlo.acosh");
    simple("atanh", "chlo.atanh");
    simple("lgamma", "chlo.lgamma");
    t["digamma"] = [](Builder& b, Value x) {
      // At +-0 torch gives -+inf (the pole's one-sided limits); CHLO gives NaN.
      Value at_zero = b.compare(x, b.scalar_like(x, 0), "EQ");
      Value inf = b.select(unary_table().at("signbit")(b, x), b.scalar_like(x, INFINITY), b.scalar_like(x, -INFINITY));
      return b.select(at_zero, inf, b.unary("chlo.digamma", x));
    };
    simple("erfinv", "chlo.erf_inv");
    simple("erfc", "chlo.erfc");
    simple("special_i1e", "chlo.bessel_i1e");
    t["sgn"] = [](Builder& b, Value x) { return unary_table().at("sign")(b, x); };
    t["special_i1"] = [](Builder& b, Value x) {
      return b.binary("multiply", b.unary("chlo.bessel_i1e", x), b.unary("exponential", b.unary("abs", x)));
    };
    t["special_i0e"] = [](Builder& b, Value x) { return bessel_i0(b, x, /*scaled=*/true); };
    t["i0"] = [](Builder& b, Value x) { return bessel_i0(b, x, /*scaled=*/false); };
    t["sinc"] = [](Builder& b, Value x) {
      Value px = b.binary("multiply", x, b.scalar_like(x, M_PI));
      Value r = b.binary("divide", b.unary("sine", px), px);
      return b.select(b.compare(x, b.scalar_like(x, 0), "EQ"), b.scalar_like(x, 1), r);
    };
    t["deg2rad"] = [](Builder& b, Value x) { return b.binary("multiply", x, b.scalar_like(x, M_PI / 180.0)); };
    t["rad2deg"] = [](Builder& b, Value x) { return b.binary("multiply", x, b.scalar_like(x, 180.0 / M_PI)); };
    t["signbit"] = [](Builder& b, Value x) {
      if (!ir::is_floating(b.dtype(x))) return b.compare(x, b.scalar_like(x, 0), "LT");
      // The sign bit itself: set for -0.0 and for a negative NaN, as std::signbit.
      Value bits = float_bits(b, x);
      return b.compare(bits, b.scalar_like(bits, 0), "LT");
    };
    t["special_ndtri"] = [](Builder& b, Value x) { return ndtri(b, x); };
    t["special_log_ndtr"] = [](Builder& b, Value x) { return log_ndtr(b, x); };
    t["special_entr"] = [](Builder& b, Value x) {
      Value zero = b.scalar_like(x, 0);
      Value r = b.unary("negate", b.binary("multiply", x, b.unary("log", x)));
      r = b.select(b.compare(x, zero, "EQ"), zero, r);
      return b.select(b.compare(x, zero, "LT"), b.scalar_like(x, -INFINITY), r);
    };
    t["angle"] = [](Builder& b, Value x) {
      // Real inputs: pi for negatives, 0 otherwise, NaN stays NaN.
      Value r = b.select(b.compare(x, b.scalar_like(x, 0), "LT"), b.scalar_like(x, M_PI), b.scalar_like(x, 0));
      return b.select(b.compare(x, x, "NE"), x, r);
    };
    return t;
  }();
  return table;
}

using BinaryFn = std::function<Value(Builder&, Value, Value)>;

Value floor_div(Builder& b, Value x, Value y) {
  DType d = b.dtype(x);
  if (ir::is_floating(d)) {
    // torch's (and Python's) floor division: from the exact remainder, not floor(x / y),
    // whose rounded quotient can land on the wrong side of an integer.
    Value zero = b.scalar_like(x, 0);
    Value mod = b.binary("remainder", x, y);
    Value div = b.binary("divide", b.binary("subtract", x, mod), y);
    Value signs_differ = b.compare(b.compare(y, zero, "LT"), b.compare(mod, zero, "LT"), "NE");
    div = b.select(b.binary("and", b.compare(mod, zero, "NE"), signs_differ), b.binary("subtract", div, b.scalar_like(div, 1)), div);
    Value floored = b.unary("floor", div);
    floored = b.select(b.compare(b.binary("subtract", div, floored), b.scalar_like(div, 0.5), "GT"),
                       b.binary("add", floored, b.scalar_like(floored, 1)), floored);
    Value quotient = b.binary("divide", x, y);
    Value signed_zero = b.binary("multiply", zero, quotient);  // copysign(0, x / y): |x / y| < 1 here, finite
    Value r = b.select(b.compare(div, zero, "NE"), floored, signed_zero);
    return b.select(b.compare(y, zero, "EQ"), quotient, r);
  }
  // Integer floor division: truncate, then step down when signs differ and there is a remainder.
  Value q = b.binary("divide", x, y);
  if (ir::is_unsigned_int(d)) return q;
  Value r = b.binary("remainder", x, y);
  Value zero = b.scalar_like(x, 0);
  Value adjust = b.binary("and", b.compare(r, zero, "NE"),
                          b.compare(b.compare(r, zero, "LT"), b.compare(y, zero, "LT"), "NE"));
  return b.select(adjust, b.binary("subtract", q, b.scalar_like(q, 1)), q);
}

const std::map<std::string, BinaryFn>& binary_table() {
  static const std::map<std::string, BinaryFn> table = [] {
    std::map<std::string, BinaryFn> t;
    auto simple = [&t](const std::string& name, const std::string& op) {
      t[name] = [op](Builder& b, Value x, Value y) { return b.binary(op, x, y); };
    };
    simple("add", "add");
    simple("sub", "subtract");
    simple("mul", "multiply");
    simple("maximum", "maximum");
    simple("minimum", "minimum");
    simple("pow", "power");
    simple("atan2", "atan2");
    simple("bitwise_and", "and");
    simple("bitwise_or", "or");
    simple("bitwise_xor", "xor");
    t["div"] = [](Builder& b, Value x, Value y) {
      return ir::is_complex(b.dtype(x)) ? complex_divide(b, x, y) : b.binary("divide", x, y);
    };
    t["div_trunc"] = [](Builder& b, Value x, Value y) {
      Value q = b.binary("divide", x, y);
      return ir::is_floating(b.dtype(q)) ? unary_table().at("trunc")(b, q) : q;
    };
    t["div_floor"] = floor_div;
    t["fmod"] = [](Builder& b, Value x, Value y) { return b.binary("remainder", x, y); };
    t["remainder"] = [](Builder& b, Value x, Value y) {
      // Python modulo: result has the sign of the divisor.
      Value r = b.binary("remainder", x, y);
      Value zero = b.scalar_like(x, 0);
      Value fix = b.binary("and", b.compare(r, zero, "NE"),
                           b.compare(b.compare(r, zero, "LT"), b.compare(y, zero, "LT"), "NE"));
      return b.select(fix, b.binary("add", r, y), r);
    };
    auto cmp = [&t](const std::string& name, const std::string& dir) {
      t[name] = [dir](Builder& b, Value x, Value y) { return b.compare(x, y, dir); };
    };
    cmp("eq", "EQ");
    cmp("ne", "NE");
    cmp("lt", "LT");
    cmp("le", "LE");
    cmp("gt", "GT");
    cmp("ge", "GE");
    auto logical = [&t](const std::string& name, const std::string& op) {
      t[name] = [op](Builder& b, Value x, Value y) {
        return b.binary(op, b.convert(x, DType::Pred), b.convert(y, DType::Pred));
      };
    };
    logical("logical_and", "and");
    logical("logical_or", "or");
    logical("logical_xor", "xor");
    t["xlogy"] = [](Builder& b, Value x, Value y) {
      Value r = b.binary("multiply", x, b.unary("log", y));
      r = b.select(b.compare(x, b.scalar_like(x, 0), "EQ"), b.scalar_like(x, 0), r);
      return b.select(b.compare(y, y, "NE"), y, r);  // NaN in y wins even when x == 0
    };
    t["special_xlog1py"] = [](Builder& b, Value x, Value y) {
      Value r = b.binary("multiply", x, b.unary("log_plus_one", y));
      r = b.select(b.compare(x, b.scalar_like(x, 0), "EQ"), b.scalar_like(x, 0), r);
      return b.select(b.compare(y, y, "NE"), y, r);
    };
    t["logaddexp"] = [](Builder& b, Value x, Value y) {
      if (ir::is_complex(b.dtype(x))) {
        // torch's rule: ordered by real part (x is lo only when strictly smaller), then
        // log1p(exp(lo - hi)) + hi; a NaN in either gives NaN; equal infinite real parts
        // give lo (-inf) or log(exp(lo) + exp(hi)) (+inf).
        Value x_lower = b.compare(b.real(x), b.real(y), "LT");
        Value lo = b.select(x_lower, x, y);
        Value hi = b.select(x_lower, y, x);
        Value r = b.binary("add", b.unary("log_plus_one", b.unary("exponential", b.binary("subtract", lo, hi))), hi);
        Value lr = b.real(lo), hr = b.real(hi);
        Value both_inf = b.binary("and", b.unary("not", b.unary("is_finite", lr)), b.compare(lr, hr, "EQ"));
        Value pos_inf = b.unary("log", b.binary("add", b.unary("exponential", lo), b.unary("exponential", hi)));
        r = b.select(both_inf, b.select(b.compare(lr, b.scalar_like(lr, 0), "LT"), lo, pos_inf), r);
        auto has_nan = [&](Value z) {
          return b.binary("or", b.compare(b.real(z), b.real(z), "NE"), b.compare(b.imag(z), b.imag(z), "NE"));
        };
        Value nan = b.binary("or", has_nan(x), has_nan(y));
        Value nn = b.complex(b.scalar_like(lr, NAN), b.scalar_like(lr, NAN));
        return b.select(nan, nn, r);
      }
      Value hi = b.binary("maximum", x, y), lo = b.binary("minimum", x, y);
      Value r = b.binary("add", hi, b.unary("log_plus_one", b.unary("exponential", b.binary("subtract", lo, hi))));
      // Equal infinities: the difference would be NaN.
      return b.select(b.binary("and", b.compare(x, y, "EQ"), b.compare(b.unary("abs", x), b.scalar_like(x, INFINITY), "EQ")), x, r);
    };
    t["logaddexp2"] = [](Builder& b, Value x, Value y) {
      Value ln2 = b.scalar_like(x, std::log(2.0));
      Value hi = b.binary("maximum", x, y), lo = b.binary("minimum", x, y);
      Value r = b.binary("add", hi, b.binary("divide", b.unary("log_plus_one", b.unary("exponential", b.binary("multiply", b.binary("subtract", lo, hi), ln2))), ln2));
      return b.select(b.binary("and", b.compare(x, y, "EQ"), b.compare(b.unary("abs", x), b.scalar_like(x, INFINITY), "EQ")), x, r);
    };
    t["hypot"] = [](Builder& b, Value x, Value y) {
      Value ax = b.unary("abs", x), ay = b.unary("abs", y);
      Value hi = b.binary("maximum", ax, ay), lo = b.binary("minimum", ax, ay);
      Value ratio = b.binary("divide", lo, hi);
      Value r = b.binary("multiply", hi, b.unary("sqrt", b.binary("add", b.scalar_like(x, 1), b.binary("multiply", ratio, ratio))));
      r = b.select(b.compare(hi, b.scalar_like(x, 0), "EQ"), hi, r);
      // An infinite side wins over a NaN one (C's hypot, as torch): inf, not NaN.
      Value inf = b.scalar_like(x, INFINITY);
      Value any_inf = b.binary("or", b.compare(ax, inf, "EQ"), b.compare(ay, inf, "EQ"));
      return b.select(any_inf, inf, r);
    };
    t["copysign"] = [](Builder& b, Value x, Value y) {
      // x's magnitude bits with y's sign bit: NaNs give and take signs as std::copysign.
      Value xb = float_bits(b, x), yb = float_bits(b, y);
      const DType bits = b.dtype(xb);
      const int64_t min = bits == DType::S64 ? std::numeric_limits<int64_t>::min()
                          : bits == DType::S32 ? std::numeric_limits<int32_t>::min() : std::numeric_limits<int16_t>::min();
      Value sign_mask = b.constant_int(bits, min, b.dims(xb)), magnitude_mask = b.constant_int(bits, -(min + 1), b.dims(xb));
      Value r = b.binary("or", b.binary("and", xb, magnitude_mask), b.binary("and", yb, sign_mask));
      return from_bits(b, r, b.dtype(x));
    };
    t["nextafter"] = [](Builder& b, Value x, Value y) { return b.binary("chlo.next_after", x, y); };
    t["special_zeta"] = [](Builder& b, Value x, Value y) { return hurwitz_zeta(b, x, y); };
    auto nan_ignoring = [&t](const std::string& name, const std::string& op) {
      t[name] = [op](Builder& b, Value x, Value y) {
        if (!ir::is_floating(b.dtype(x))) return b.binary(op, x, y);
        Value r = b.binary(op, x, y);
        r = b.select(b.compare(x, x, "NE"), y, r);
        return b.select(b.compare(y, y, "NE"), x, r);
      };
    };
    nan_ignoring("fmax", "maximum");
    nan_ignoring("fmin", "minimum");
    t["heaviside"] = [](Builder& b, Value x, Value y) {
      Value zero = b.scalar_like(x, 0);
      Value r = b.select(b.compare(x, zero, "GT"), b.scalar_like(x, 1), zero);
      r = b.select(b.compare(x, zero, "EQ"), y, r);
      return b.select(b.compare(x, x, "NE"), x, r);
    };
    t["bitwise_left_shift"] = [](Builder& b, Value x, Value y) { return b.binary("shift_left", x, y); };
    t["bitwise_right_shift"] = [](Builder& b, Value x, Value y) {
      return b.binary(ir::is_unsigned_int(b.dtype(x)) ? "shift_right_logical" : "shift_right_arithmetic", x, y);
    };
    return t;
  }();
  return table;
}

}  // namespace

DType accumulate_type(DType d) { return acc_type(d); }

Value lowest(Builder& b, DType d, const std::vector<int64_t>& dims) {
  switch (d) {
    case DType::Pred: return b.constant_int(d, 0, dims);
    case DType::S8: return b.constant_int(d, INT8_MIN, dims);
    case DType::S16: return b.constant_int(d, INT16_MIN, dims);
    case DType::S32: return b.constant_int(d, INT32_MIN, dims);
    case DType::S64: return b.constant_int(d, INT64_MIN, dims);
    case DType::U8: case DType::U16: case DType::U32: case DType::U64: return b.constant_int(d, 0, dims);
    default: return b.constant(d, -INFINITY, dims);
  }
}

Value highest(Builder& b, DType d, const std::vector<int64_t>& dims) {
  switch (d) {
    case DType::Pred: return b.constant_int(d, 1, dims);
    case DType::S8: return b.constant_int(d, INT8_MAX, dims);
    case DType::S16: return b.constant_int(d, INT16_MAX, dims);
    case DType::S32: return b.constant_int(d, INT32_MAX, dims);
    case DType::S64: return b.constant_int(d, INT64_MAX, dims);
    case DType::U8: return b.constant_int(d, UINT8_MAX, dims);
    case DType::U16: return b.constant_int(d, UINT16_MAX, dims);
    case DType::U32: return b.constant_int(d, UINT32_MAX, dims);
    case DType::U64: return b.constant_int(d, -1, dims);
    default: return b.constant(d, INFINITY, dims);
  }
}

bool has_unary(const std::string& name) { return unary_table().count(name) > 0; }
bool has_binary(const std::string& name) { return binary_table().count(name) > 0; }

Value erf(Builder& b, Value x) {
  // XLA's CHLO erf (its f32 rational approximation; NaN and infinities handled), in f32 for f16/bf16.
  DType d = b.dtype(x);
  return b.convert(b.unary("chlo.erf", b.convert(x, acc_type(d))), d);
}

namespace {
// |value| with the sign of `sign` (its sign bit: -0 counts as negative).
Value signed_as(Builder& b, Value value, Value sign) {
  Value magnitude = b.unary("abs", value);
  return b.select(unary_table().at("signbit")(b, sign), b.unary("negate", magnitude), magnitude);
}

// Complex atanh with C99's (Annex G) values where a part is infinite, as numpy and the
// CPU: atanh(x +- inf i) and atanh(+-inf + y i) are +-0 +- pi/2 i (0 signed as x, pi/2 as
// y), with a NaN imaginary part when y is NaN. CHLO's expansion gives NaNs there.
Value complex_atanh(Builder& b, Value z) {
  Value re = b.real(z), im = b.imag(z);
  const auto& isinf = unary_table().at("isinf");
  Value w = b.unary("chlo.atanh", z);
  Value zero = signed_as(b, b.scalar_like(re, 0), re);
  Value quarter_turn = b.select(b.compare(im, im, "NE"), im, signed_as(b, b.scalar_like(im, M_PI / 2), im));
  return b.select(b.binary("or", isinf(b, re), isinf(b, im)), b.complex(zero, quarter_turn), w);
}

// Complex inputs: the ops whose real lowering does not carry over.
std::optional<Value> complex_unary(Builder& b, const std::string& name, Value x) {
  Value re = b.real(x), im = b.imag(x);
  auto either = [&](const std::string& pred) {
    const auto& f = unary_table().at(pred);
    return b.binary("or", f(b, re), f(b, im));
  };
  if (name == "angle") return b.binary("atan2", im, re);
  if (name == "sgn") {
    // z / |z|, and 0 at 0.
    Value mag = b.unary("abs", x);
    Value zero = b.scalar_like(mag, 0);
    Value is_zero = b.compare(mag, zero, "EQ");
    Value safe = b.select(is_zero, b.scalar_like(mag, 1), mag);
    Value r = b.complex(b.binary("divide", re, safe), b.binary("divide", im, safe));
    return b.select(is_zero, b.scalar_like(x, 0), r);
  }
  if (name == "asin" || name == "acos") {
    // f(conj z) = conj f(z): CHLO's result for |im|, its imaginary part signed as im
    // (CHLO loses the side of the branch cut a signed zero names).
    // asin's imaginary part has im's sign, acos's the opposite one.
    Value r = b.unary("chlo." + name, b.complex(re, b.unary("abs", im)));
    Value mag = b.unary("abs", b.imag(r));
    Value neg = unary_table().at("signbit")(b, im);
    if (name == "acos") neg = b.unary("not", neg);
    Value out = b.complex(b.real(r), b.select(neg, b.unary("negate", mag), mag));
    // C99's asin(+-0 + NaN i) = +-0 + NaN i and acos(+-0 + NaN i) = pi/2 + NaN i, as on CPU.
    Value zero_nan = b.binary("and", b.compare(re, b.scalar_like(re, 0), "EQ"), b.compare(im, im, "NE"));
    return b.select(zero_nan, b.complex(name == "asin" ? re : b.scalar_like(re, M_PI / 2), im), out);
  }
  if (name == "atan") {
    // atan(z) = -i atanh(i z). Its parts have the signs of z's (atan is odd and commutes with
    // conj; on the cut, Re z = -0 names the side), and a NaN part makes both NaN, as on CPU.
    Value w = complex_atanh(b, b.complex(b.unary("negate", im), re));
    Value r = b.complex(signed_as(b, b.imag(w), re), signed_as(b, b.real(w), im));
    // A NaN part with no infinite one: NaN + NaN i (with an infinite part, atanh's values).
    Value any_nan = b.binary("or", b.compare(re, re, "NE"), b.compare(im, im, "NE"));
    Value any_inf = either("isinf");
    Value nan = b.scalar_like(re, NAN);
    return b.select(b.binary("and", any_nan, b.unary("not", any_inf)), b.complex(nan, nan), r);
  }
  if (name == "atanh") return complex_atanh(b, x);
  if (name == "sqrt" || name == "acosh" || name == "asinh") {
    // CHLO answers from one side of the branch cut whatever side a signed zero names: the
    // part that changes sign across the cut takes it from z (Im for sqrt and acosh, Re for asinh).
    Value r = b.unary(name == "sqrt" ? "sqrt" : "chlo." + name, x);
    if (name == "asinh") return b.complex(signed_as(b, b.real(r), re), b.imag(r));
    r = b.complex(b.real(r), signed_as(b, b.imag(r), im));
    if (name == "sqrt") {
      // C99 (Annex G), as numpy and torch's CPU: sqrt(x +- inf i) = inf +- inf i for every x,
      // NaN included; sqrt(-inf + y i) = 0 +- inf i and sqrt(inf + y i) = inf +- 0 i for finite y.
      Value inf = b.scalar_like(re, INFINITY), zero = b.scalar_like(re, 0);
      Value im_inf = unary_table().at("isinf")(b, im);
      Value y_finite = b.unary("is_finite", im);
      Value re_pinf = b.compare(re, inf, "EQ"), re_ninf = b.compare(re, b.unary("negate", inf), "EQ");
      r = b.select(b.binary("and", re_ninf, y_finite), b.complex(zero, signed_as(b, inf, im)), r);
      r = b.select(b.binary("and", re_pinf, y_finite), b.complex(inf, signed_as(b, zero, im)), r);
      r = b.select(im_inf, b.complex(inf, im), r);
    }
    return r;
  }
  if (name == "abs") {
    // |z| is inf when either part is, NaN or not (C99's hypot and cabs).
    Value mag = b.unary("abs", x);
    return b.select(either("isinf"), b.scalar_like(mag, INFINITY), mag);
  }
  if (name == "log" || name == "log10" || name == "log2") {
    // log |z| + i arg z, with |z| = inf when either part is, NaN or not (C99: log(inf + NaN i)
    // is inf + NaN i; XLA's gives NaN there). log10 and log2 scale each part by the real
    // log_b e (a complex product would turn the infinite part into NaNs; a product rather
    // than a quotient by ln b rounds as numpy and torch's CPU do).
    Value r = b.unary("log", x);
    r = b.complex(b.select(either("isinf"), b.scalar_like(re, INFINITY), b.real(r)), b.imag(r));
    if (name == "log") return r;
    Value scale = b.scalar_like(re, name == "log10" ? M_LOG10E : M_LOG2E);
    return b.complex(b.binary("multiply", b.real(r), scale), b.binary("multiply", b.imag(r), scale));
  }
  if (name == "sinh" || name == "cosh") {
    // By parts: sinh(x + yi) = sinh x cos y + i cosh x sin y, cosh(x + yi) = cosh x cos y +
    // i sinh x sin y, in float64 for complex64 (e^x / 2 overflows float32 before the product
    // with cos y does; (e^z - e^-z) / 2 made that inf - inf = NaN). Infinite and NaN parts
    // keep the expansion's special values.
    DType part = b.dtype(re), wide = part == DType::F32 ? DType::F64 : part;
    Value xr = b.convert(re, wide), yi = b.convert(im, wide);
    Value sh = unary_table().at("sinh")(b, xr), ch = unary_table().at("cosh")(b, xr);
    Value real = b.binary("multiply", name == "sinh" ? sh : ch, b.unary("cosine", yi));
    Value imag = b.binary("multiply", name == "sinh" ? ch : sh, b.unary("sine", yi));
    // On the real axis an overflowed sinh/cosh times sin 0 is inf * 0: the imaginary part is y's zero.
    imag = b.select(b.binary("and", b.compare(yi, b.scalar_like(yi, 0), "EQ"), b.compare(imag, imag, "NE")), yi, imag);
    Value parts = b.complex(b.convert(real, part), b.convert(imag, part));
    Value finite = b.binary("and", b.unary("is_finite", re), b.unary("is_finite", im));
    return b.select(finite, parts, unary_table().at(name)(b, x));
  }
  if (name == "exp2") {
    // 2^z = e^(z ln 2), with exp's special values (as torch's CPU kernel computes it).
    // Each part scaled by the real ln 2 (a complex product would make inf * 0 a NaN).
    Value ln2 = b.scalar_like(re, M_LN2);
    return complex_unary(b, "exp", b.complex(b.binary("multiply", re, ln2), b.binary("multiply", im, ln2)));
  }
  if (name == "exp") {
    // C99 (Annex G), as numpy: exp(x + 0i) = e^x + 0i exactly (no inf * 0); exp(inf + y i) with y
    // infinite or NaN is inf + NaN i, and exp(-inf + y i) is 0 + 0i.
    Value r = b.unary("exponential", x);
    Value inf = b.scalar_like(re, INFINITY), zero = b.scalar_like(re, 0), nan = b.scalar_like(re, NAN);
    Value y_bad = b.unary("not", b.unary("is_finite", im));
    Value re_pinf = b.compare(re, inf, "EQ"), re_ninf = b.compare(re, b.unary("negate", inf), "EQ");
    r = b.select(b.binary("and", re_pinf, y_bad), b.complex(inf, nan), r);
    r = b.select(b.binary("and", re_ninf, y_bad), b.complex(zero, zero), r);
    return b.select(b.compare(im, zero, "EQ"), b.complex(b.unary("exponential", re), im), r);
  }
  if (name == "reciprocal") return complex_divide(b, b.scalar_like(x, 1), x);
  // 1 / sqrt(z), as torch's CPU computes it: C99's square root, then Smith's division.
  if (name == "rsqrt") return complex_divide(b, b.scalar_like(x, 1), *complex_unary(b, "sqrt", x));
  if (name == "sigmoid") {
    // 1 / (1 + e^-z) as torch's CPU kernel (and numpy) compute it: exp with C99's special values,
    // then Smith's division. Where e^-z overflows to inf +- inf i that quotient is NaN (XLA's
    // logistic gives the limit, 0; the test files compare with numpy).
    Value w = b.binary("add", b.scalar_like(x, 1), *complex_unary(b, "exp", b.unary("negate", x)));
    return complex_divide(b, b.scalar_like(x, 1), w);
  }
  if (name == "isnan" || name == "isinf") return either(name);
  if (name == "isfinite") return b.binary("and", b.unary("is_finite", re), b.unary("is_finite", im));
  if (name == "isposinf" || name == "isneginf" || name == "sign" || name == "floor" || name == "ceil" ||
      name == "round" || name == "trunc" || name == "frac" || name == "relu" || name == "erf" || name == "signbit" ||
      name == "atan2") {
    throw std::invalid_argument(name + " is not supported for complex inputs");
  }
  return std::nullopt;
}
}  // namespace

Value unary(Builder& b, const std::string& name, Value x, DType compute, DType out) {
  auto it = unary_table().find(name);
  if (it == unary_table().end()) throw std::invalid_argument("no lowering for unary op " + name);
  if (ir::is_complex(compute)) {
    Value xc = b.convert(x, compute);
    if (auto r = complex_unary(b, name, xc)) return b.convert(*r, out);
    return b.convert(it->second(b, xc), out);
  }
  if (!ir::is_floating(compute)) {
    // Integers and bools: sign of bool/unsigned is "non-zero"; nothing is infinite or NaN.
    if ((name == "sign" || name == "sgn") && (compute == DType::Pred || ir::is_unsigned_int(compute))) {
      return b.convert(b.compare(x, b.scalar_like(x, 0), "NE"), out);
    }
    if (name == "isinf" || name == "isposinf" || name == "isneginf" || name == "isnan") {
      return b.convert(b.constant_int(DType::Pred, 0, b.dims(x)), out);
    }
    // Rounding is the identity on integers, and every integer is finite.
    if (name == "floor" || name == "ceil" || name == "round" || name == "trunc") return b.convert(x, out);
    if (name == "isfinite") return b.convert(b.constant_int(DType::Pred, 1, b.dims(x)), out);
    if (name == "frac") return b.convert(b.constant_int(compute, 0, b.dims(x)), out);
  }
  // Half precision is computed in float32 and rounded once, as torch's kernels do: an
  // expansion (acosh, sinh, sinc ...) run in float16 rounds at every step, a unit off.
  if (compute == DType::F16 || compute == DType::BF16) compute = DType::F32;
  Value r = it->second(b, b.convert(x, compute));
  return b.convert(r, out);
}

Value binary(Builder& b, const std::string& name, Value x, Value y, DType compute, DType out) {
  auto it = binary_table().find(name);
  if (it == binary_table().end()) throw std::invalid_argument("no lowering for binary op " + name);
  auto shape = ir::broadcast_shapes(b.dims(x), b.dims(y));
  Value xc = b.broadcast_to(b.convert(x, compute), shape);
  Value yc = b.broadcast_to(b.convert(y, compute), shape);
  return b.convert(it->second(b, xc, yc), out);
}

Value orthogonal_polynomial(Builder& b, const std::string& family, Value x, Value n) {
  auto shape = ir::broadcast_shapes(b.dims(x), b.dims(n));
  x = b.broadcast_to(x, shape);
  n = b.broadcast_to(n, shape);
  if (ir::is_floating(b.dtype(n))) {
    // torch truncates a float degree to int64 with C's cast: on x86 an
    // out-of-range or NaN degree becomes INT64_MIN (a polynomial of 0), where
    // XLA's convert would saturate to a huge degree.
    Value nf = b.convert(n, DType::F64);
    Value ok = b.binary("and", b.unary("is_finite", nf), b.compare(b.unary("abs", nf), b.scalar_like(nf, 9.2e18), "LT"));
    nf = b.select(ok, nf, b.scalar_like(nf, -1));
    n = b.convert(nf, DType::S64);
  } else {
    n = b.convert(n, DType::S64);
  }
  std::string f = family;
  if (f.rfind("shifted_", 0) == 0) {  // T*_n(x) = T_n(2x - 1)
    x = b.binary("subtract", b.binary("multiply", x, b.scalar_like(x, 2)), b.scalar_like(x, 1));
    f = f.substr(8);
  }
  auto c = [&](Builder& bb, Value like, double v) { return bb.scalar_like(like, v); };
  Value one = c(b, x, 1);
  Value p1;  // degree 1
  if (f == "chebyshev_t" || f == "hermite_he" || f == "legendre_p") p1 = x;
  else if (f == "chebyshev_u" || f == "hermite_h") p1 = b.binary("multiply", x, c(b, x, 2));
  else if (f == "chebyshev_v") p1 = b.binary("subtract", b.binary("multiply", x, c(b, x, 2)), one);
  else if (f == "chebyshev_w") p1 = b.binary("add", b.binary("multiply", x, c(b, x, 2)), one);
  else if (f == "laguerre_l") p1 = b.binary("subtract", one, x);
  else throw std::invalid_argument("no orthogonal polynomial family " + family);
  Value zero = c(b, x, 0);
  auto is_deg = [&](Builder& bb, Value nv, int64_t k) {
    return bb.compare(nv, bb.constant_int(DType::S64, k, bb.dims(nv)), "EQ");
  };
  Value result = b.select(is_deg(b, n, 0), one, b.select(is_deg(b, n, 1), p1, zero));
  // Chebyshev kinds as torch's CPU kernels: closed forms at |x| = 1, and in terms of
  // theta = acos(x) for |x| < 1 and n past a small degree; the recurrence only
  // for the rest, so a huge degree inside (-1, 1) costs nothing.
  Value closed, closed_value;
  if (f.rfind("chebyshev_", 0) == 0) {
    char kind = f.back();
    Value ax = b.unary("abs", x);
    Value nf = b.convert(n, b.dtype(x));
    Value even = b.compare(b.binary("remainder", n, b.constant_int(DType::S64, 2, b.dims(n))), b.constant_int(DType::S64, 0, b.dims(n)), "EQ");
    Value pos = b.compare(x, zero, "GT");
    auto sel = [&](Value p, Value a, Value c2) { return b.select(p, a, c2); };
    auto neg = [&](Value v) { return b.unary("negate", v); };
    Value n1 = b.binary("add", nf, one), n21 = b.binary("add", b.binary("add", nf, nf), one);
    Value at_one;  // value at x = +-1
    if (kind == 't') at_one = sel(b.binary("or", pos, even), one, neg(one));
    else if (kind == 'u') at_one = sel(b.binary("or", pos, even), n1, neg(n1));
    else if (kind == 'v') at_one = sel(pos, one, sel(even, n21, neg(n21)));
    else at_one = sel(pos, n21, sel(even, one, neg(one)));
    Value theta = unary_table().at("acos")(b, b.binary("minimum", b.binary("maximum", x, c(b, x, -1)), one));
    Value half_theta = b.binary("multiply", theta, c(b, theta, 0.5));
    Value nh = b.binary("add", nf, c(b, nf, 0.5));
    Value trig;
    if (kind == 't') {
      trig = b.unary("cosine", b.binary("multiply", nf, theta));
    } else if (kind == 'u') {
      Value st = b.unary("sine", theta);
      Value nz = b.compare(st, zero, "NE");
      trig = sel(nz, b.binary("divide", b.unary("sine", b.binary("multiply", n1, theta)), sel(nz, st, one)),
                 b.binary("divide", b.binary("multiply", n1, b.unary("cosine", b.binary("multiply", n1, theta))), x));
    } else if (kind == 'v') {
      trig = b.binary("divide", b.unary("cosine", b.binary("multiply", nh, theta)), b.unary("cosine", half_theta));
    } else {
      trig = b.binary("divide", b.unary("sine", b.binary("multiply", nh, theta)), b.unary("sine", half_theta));
    }
    int64_t past = kind == 't' ? 6 : 8;
    Value inside = b.binary("and", b.compare(ax, one, "LT"), b.compare(n, b.constant_int(DType::S64, past, b.dims(n)), "GT"));
    Value edge = b.compare(ax, one, "EQ");
    Value nonneg = b.compare(n, b.constant_int(DType::S64, 0, b.dims(n)), "GE");
    closed = b.binary("and", nonneg, b.binary("or", inside, edge));
    closed_value = sel(edge, at_one, trig);
  }
  if (f == "legendre_p" || f == "laguerre_l") {  // CPU's shortcuts before its loop
    Value nonneg = b.compare(n, b.constant_int(DType::S64, 0, b.dims(n)), "GE");
    if (f == "legendre_p") {
      Value even = b.compare(b.binary("remainder", n, b.constant_int(DType::S64, 2, b.dims(n))), b.constant_int(DType::S64, 0, b.dims(n)), "EQ");
      Value edge = b.compare(b.unary("abs", x), one, "EQ");
      closed = b.binary("and", nonneg, edge);
      closed_value = b.select(b.binary("or", b.compare(x, zero, "GT"), even), one, b.unary("negate", one));
    } else {
      closed = b.binary("and", nonneg, b.compare(x, zero, "EQ"));
      closed_value = one;
    }
  }
  // The recurrence runs up to the largest degree not answered above.
  Value loop_n = closed.valid() ? b.select(closed, b.constant_int(DType::S64, 0, b.dims(n)), n) : n;
  int64_t numel = b.type(n).numel();
  Value max_n = numel == 0 ? b.constant_int(DType::S64, 0)
                           : b.reduce_simple(b.reshape(loop_n, {numel}), b.constant_int(DType::S64, 0), {0}, "maximum");
  // Carried: degree k of `cur`, the largest degree, x, n, P_{k-1}, P_k, the result.
  auto out = b.while_loop(
      {b.constant_int(DType::S64, 1), max_n, x, n, one, p1, result},
      [](Builder& bb, const std::vector<Value>& s) { return bb.compare(s[0], s[1], "LT"); },
      [f](Builder& bb, const std::vector<Value>& s) -> std::vector<Value> {
        Value k = s[0], xv = s[2], nv = s[3], prev = s[4], cur = s[5], res = s[6];
        Value kf = bb.broadcast_to(bb.convert(k, bb.dtype(xv)), bb.dims(xv));
        auto mul = [&](Value a, Value b2) { return bb.binary("multiply", a, b2); };
        auto cst = [&](double v) { return bb.scalar_like(xv, v); };
        Value next;
        if (f == "hermite_h") {  // H_{k+1} = 2x H_k - 2k H_{k-1}
          next = bb.binary("subtract", mul(mul(cst(2), xv), cur), mul(mul(cst(2), kf), prev));
        } else if (f == "hermite_he") {  // He_{k+1} = x He_k - k He_{k-1}
          next = bb.binary("subtract", mul(xv, cur), mul(kf, prev));
        } else if (f == "laguerre_l") {  // (k+1) L_{k+1} = (2k+1-x) L_k - k L_{k-1}
          Value a = bb.binary("subtract", bb.binary("add", mul(cst(2), kf), cst(1)), xv);
          next = bb.binary("divide", bb.binary("subtract", mul(a, cur), mul(kf, prev)), bb.binary("add", kf, cst(1)));
        } else if (f == "legendre_p") {  // (k+1) P_{k+1} = (2k+1) x P_k - k P_{k-1}
          Value a = mul(bb.binary("add", mul(cst(2), kf), cst(1)), xv);
          next = bb.binary("divide", bb.binary("subtract", mul(a, cur), mul(kf, prev)), bb.binary("add", kf, cst(1)));
        } else {  // Chebyshev kinds: P_{k+1} = 2x P_k - P_{k-1}
          next = bb.binary("subtract", mul(mul(cst(2), xv), cur), prev);
        }
        Value k1 = bb.binary("add", k, bb.constant_int(DType::S64, 1));
        Value at = bb.compare(nv, bb.broadcast_to(k1, bb.dims(nv)), "EQ");
        return {k1, s[1], xv, nv, cur, next, bb.select(at, next, res)};
      });
  return closed.valid() ? b.select(closed, closed_value, out[6]) : out[6];
}

// Large a with x near a: the series and the continued fraction need O(sqrt(a)) terms
// (millions for a = 1e12), so P and Q come from Temme's uniform asymptotic expansion
// (DLMF 8.12.17-8.12.18): Q = erfc(eta sqrt(a/2)) / 2 + R, P = erfc(-eta sqrt(a/2)) / 2 - R,
// R = exp(-a eta^2 / 2) / sqrt(2 pi a) (c0(eta) + c1(eta) / a), with eta^2 / 2 = lambda - 1 - ln lambda,
// lambda = x / a, eta of the sign of lambda - 1. The next term is below 1e-9 of R for a > 200.
Value temme_region(Builder& b, Value a, Value x) {
  Value large = b.compare(a, b.scalar_like(a, 200), "GT");
  Value near = b.compare(b.unary("abs", b.binary("subtract", x, a)), b.binary("multiply", a, b.scalar_like(a, 0.3)), "LT");
  return b.binary("and", large, near);
}

Value temme_igamma(Builder& b, Value a, Value x, bool upper) {
  auto c = [&](double v) { return b.scalar_like(a, v); };
  auto add = [&](Value l, Value r) { return b.binary("add", l, r); };
  auto sub = [&](Value l, Value r) { return b.binary("subtract", l, r); };
  auto mul = [&](Value l, Value r) { return b.binary("multiply", l, r); };
  auto div = [&](Value l, Value r) { return b.binary("divide", l, r); };
  Value mu = div(sub(x, a), a);  // lambda - 1
  // eta^2 / 2 = mu - log1p(mu); its Taylor series where the difference would cancel.
  Value mu2 = mul(mu, mu);
  Value half_eta2_series = mul(mu2, add(c(0.5), mul(mu, add(c(-1.0 / 3), mul(mu, add(c(0.25), mul(mu, c(-0.2))))))));
  Value small_mu = b.compare(b.unary("abs", mu), c(1e-3), "LT");
  Value half_eta2 = b.select(small_mu, half_eta2_series, sub(mu, b.unary("log_plus_one", mu)));
  Value eta = mul(b.unary("sqrt", mul(c(2), half_eta2)), b.unary("sign", mu));
  // c0 = 1/mu - 1/eta and c1 = 1/eta^3 - 1/mu^3 - 1/mu^2 - 1/(12 mu) cancel near eta = 0: their series there.
  Value c0 = sub(div(c(1), mu), div(c(1), eta));
  Value mu3 = mul(mu2, mu), eta3 = mul(mul(eta, eta), eta);
  Value c1 = sub(sub(sub(div(c(1), eta3), div(c(1), mu3)), div(c(1), mu2)), div(c(1), mul(c(12), mu)));
  Value c0_series = add(c(-1.0 / 3), mul(eta, add(c(1.0 / 12), mul(eta, add(c(-2.0 / 135), mul(eta, c(1.0 / 864)))))));
  Value c1_series = add(c(-1.0 / 540), mul(eta, add(c(-1.0 / 288), mul(eta, c(1.0 / 378)))));
  Value small_eta = b.compare(b.unary("abs", eta), c(2e-2), "LT");
  c0 = b.select(small_eta, c0_series, c0);
  c1 = b.select(b.compare(b.unary("abs", eta), c(0.2), "LT"), c1_series, c1);
  Value r = mul(div(b.unary("exponential", mul(mul(c(-1), a), half_eta2)), b.unary("sqrt", mul(c(2 * M_PI), a))),
                add(c0, div(c1, a)));
  Value y = mul(eta, b.unary("sqrt", mul(a, c(0.5))));
  return upper ? add(mul(c(0.5), b.unary("chlo.erfc", y)), r) : sub(mul(c(0.5), b.unary("chlo.erfc", b.unary("negate", y))), r);
}

Value igamma(Builder& b, Value a, Value x, bool upper) {
  auto shape = ir::broadcast_shapes(b.dims(a), b.dims(x));
  DType out = b.dtype(a);
  a = b.convert(b.broadcast_to(a, shape), DType::F64);
  x = b.convert(b.broadcast_to(x, shape), DType::F64);
  auto c = [&](Builder& bb, Value like, double v) { return bb.scalar_like(like, v); };
  Value use_series = b.compare(x, b.binary("add", a, c(b, a, 1)), "LT");
  // x^a e^-x / Gamma(a), the common factor.
  Value log_front = b.binary("subtract", b.binary("subtract", b.binary("multiply", a, b.unary("log", x)), x), b.unary("chlo.lgamma", a));
  const double tiny = 1e-300, eps = 1e-15;
  // Series: sum = 1/a + x/(a(a+1)) + ...; term_n = term_{n-1} x / (a + n).
  Value term0 = b.binary("divide", c(b, a, 1), a);
  // Continued fraction state (Lentz): bcf = x + 1 - a, c = 1/tiny, d = 1/bcf, h = d.
  Value bcf = b.binary("subtract", b.binary("add", x, c(b, x, 1)), a);
  Value dcf = b.binary("divide", c(b, x, 1), bcf);
  int64_t numel = b.type(a).numel();
  auto out_loop = b.while_loop(
      {b.constant_int(DType::S64, 0), a, x, term0, term0, bcf, b.broadcast_to(c(b, x, 1.0 / tiny), shape), dcf, dcf,
       b.constant_int(DType::Pred, 1), use_series},
      [](Builder& bb, const std::vector<Value>& st) {
        return bb.binary("and", bb.compare(st[0], bb.constant_int(DType::S64, 2000), "LT"), st[9]);
      },
      [&](Builder& bb, const std::vector<Value>& st) -> std::vector<Value> {
        Value i = st[0], av = st[1], xv = st[2], term = st[3], sum = st[4], bv = st[5], cv = st[6], dv = st[7], h = st[8];
        Value n = bb.broadcast_to(bb.convert(bb.binary("add", i, bb.constant_int(DType::S64, 1)), DType::F64), bb.dims(av));
        // Series step.
        term = bb.binary("multiply", term, bb.binary("divide", xv, bb.binary("add", av, n)));
        sum = bb.binary("add", sum, term);
        // Continued fraction step.
        Value an = bb.binary("multiply", bb.unary("negate", n), bb.binary("subtract", n, av));
        bv = bb.binary("add", bv, bb.scalar_like(bv, 2));
        auto floor_tiny = [&](Value v) {
          return bb.select(bb.compare(bb.unary("abs", v), bb.scalar_like(v, tiny), "LT"), bb.scalar_like(v, tiny), v);
        };
        dv = floor_tiny(bb.binary("add", bb.binary("multiply", an, dv), bv));
        cv = floor_tiny(bb.binary("add", bv, bb.binary("divide", an, cv)));
        dv = bb.binary("divide", bb.scalar_like(dv, 1), dv);
        Value del = bb.binary("multiply", dv, cv);
        h = bb.binary("multiply", h, del);
        // Converged when both steps stopped moving their value (or it is not finite).
        Value series_done = bb.compare(bb.unary("abs", term), bb.binary("multiply", bb.unary("abs", sum), bb.scalar_like(sum, eps)), "LE");
        Value cf_done = bb.compare(bb.unary("abs", bb.binary("subtract", del, bb.scalar_like(del, 1))), bb.scalar_like(del, eps), "LE");
        // Each element needs only the method it uses.
        Value done = bb.select(st[10], bb.binary("or", series_done, bb.unary("not", bb.unary("is_finite", sum))), cf_done);
        // Edge inputs (answered after the loop) never hold it up.
        // (A non-finite fraction matters only where the fraction is used: at x = a - 1 it starts
        // infinite, and those elements take the series.)
        Value cf_broken = bb.binary("and", bb.unary("not", st[10]), bb.unary("not", bb.unary("is_finite", h)));
        Value edge = bb.binary("or", bb.unary("not", bb.unary("is_finite", xv)), cf_broken);
        edge = bb.binary("or", edge, bb.compare(xv, bb.scalar_like(xv, 0), "LE"));
        edge = bb.binary("or", edge, bb.binary("or", bb.compare(av, bb.scalar_like(av, 0), "LE"), bb.compare(av, av, "NE")));
        edge = bb.binary("or", edge, temme_region(bb, av, xv));
        done = bb.binary("or", done, edge);
        Value all_done = numel == 0 ? bb.constant_int(DType::Pred, 1)
                                    : bb.reduce_simple(bb.reshape(done, {numel}), bb.constant_int(DType::Pred, 1), {0}, "and");
        return {bb.binary("add", i, bb.constant_int(DType::S64, 1)), av, xv, term, sum, bv, cv, dv, h, bb.unary("not", all_done),
                st[10]};
      });
  Value front = b.unary("exponential", log_front);
  Value p_series = b.binary("multiply", front, out_loop[4]);
  Value q_cf = b.binary("multiply", front, out_loop[8]);
  Value p = b.select(use_series, p_series, b.binary("subtract", c(b, x, 1), q_cf));
  Value r = upper ? b.binary("subtract", c(b, p, 1), p) : p;
  if (upper) r = b.select(use_series, b.binary("subtract", c(b, p, 1), p_series), q_cf);
  r = b.select(temme_region(b, a, x), temme_igamma(b, a, x, upper), r);
  // Edges in torch's order of checks (its calc_igamma): a or x negative: NaN; a = 0: P = 1
  // for x > 0, else NaN; x = 0: P = 0; a = inf: NaN for x = inf, else P = 0; x = inf: P = 1.
  // A NaN fails every comparison, so igamma(nan, 0) = 0 and igamma(inf, nan) = 0 as on CPU;
  // other NaN inputs give NaN. Applied from the last check to the first.
  auto p_or_q = [&](double p) { return c(b, r, upper ? 1 - p : p); };
  Value nan = c(b, r, NAN);
  Value zero_x = b.compare(x, c(b, x, 0), "EQ");
  Value inf_x = b.compare(x, c(b, x, INFINITY), "EQ");
  Value inf_a = b.compare(a, c(b, a, INFINITY), "EQ");
  r = b.select(b.binary("or", b.compare(a, a, "NE"), b.compare(x, x, "NE")), nan, r);
  r = b.select(inf_x, p_or_q(1), r);
  r = b.select(inf_a, b.select(inf_x, nan, p_or_q(0)), r);
  r = b.select(zero_x, p_or_q(0), r);
  r = b.select(b.compare(a, c(b, a, 0), "EQ"), b.select(b.compare(x, c(b, x, 0), "GT"), p_or_q(1), nan), r);
  r = b.select(b.binary("or", b.compare(a, c(b, a, 0), "LT"), b.compare(x, c(b, x, 0), "LT")), nan, r);
  return b.convert(r, out);
}

Value bessel_jy(Builder& b, Value x_in, int order, bool second_kind) {
  DType out = b.dtype(x_in);
  Value x = b.convert(x_in, DType::F64);
  auto c = [&](Builder& bb, Value like, double v) { return bb.scalar_like(like, v); };
  const double kGamma = 0.57721566490153286061, kPi = M_PI, kSwitch = 12.0;
  Value ax = b.unary("abs", x);
  // Series at s = min(|x|, 12) (the other branch serves larger |x|), in one loop of 60 terms.
  Value sv = b.binary("maximum", b.binary("minimum", ax, c(b, ax, kSwitch)), c(b, ax, 1e-300));
  Value half = b.binary("multiply", sv, c(b, sv, 0.5));
  Value z = b.binary("multiply", half, half);
  // u_k = (-z)^k / (k!)^2 (J0 terms), v_k = (s/2) (-z)^k / (k!(k+1)!) (J1 terms).
  Value one = c(b, sv, 1), zero = c(b, sv, 0);
  auto loop = b.while_loop(
      {b.constant_int(DType::S64, 1), z, one, one, zero, half, half, b.binary("multiply", half, c(b, half, 1 - 2 * kGamma + 0.0)),
       zero},
      [](Builder& bb, const std::vector<Value>& st) { return bb.compare(st[0], bb.constant_int(DType::S64, 60), "LT"); },
      [&](Builder& bb, const std::vector<Value>& st) -> std::vector<Value> {
        Value k = st[0], zz = st[1], u = st[2], sum_u = st[3], sum_hu = st[4], v = st[5], sum_v = st[6], sum_pv = st[7],
              h = st[8];
        Value kf = bb.broadcast_to(bb.convert(k, DType::F64), bb.dims(zz));
        Value h_k = bb.binary("add", h, bb.binary("divide", bb.scalar_like(kf, 1), kf));  // H_k
        u = bb.binary("divide", bb.binary("multiply", u, bb.unary("negate", zz)), bb.binary("multiply", kf, kf));
        v = bb.binary("divide", bb.binary("multiply", v, bb.unary("negate", zz)), bb.binary("multiply", kf, bb.binary("add", kf, bb.scalar_like(kf, 1))));
        // psi(k+1) + psi(k+2) = -2 gamma + 2 H_k + 1/(k+1).
        Value psi = bb.binary("add", bb.binary("add", bb.scalar_like(kf, -2 * kGamma), bb.binary("multiply", h_k, bb.scalar_like(h_k, 2))),
                              bb.binary("divide", bb.scalar_like(kf, 1), bb.binary("add", kf, bb.scalar_like(kf, 1))));
        return {bb.binary("add", k, bb.constant_int(DType::S64, 1)), zz, u, bb.binary("add", sum_u, u),
                bb.binary("add", sum_hu, bb.binary("multiply", h_k, u)), v, bb.binary("add", sum_v, v),
                bb.binary("add", sum_pv, bb.binary("multiply", psi, v)), h_k};
      });
  Value j0s = loop[3], j1s = loop[6];
  Value log_half = b.unary("log", half);
  Value series;
  if (!second_kind) {
    series = order == 0 ? j0s : j1s;
  } else if (order == 0) {
    series = b.binary("multiply", c(b, sv, 2 / kPi),
                      b.binary("subtract", b.binary("multiply", b.binary("add", log_half, c(b, sv, kGamma)), j0s), loop[4]));
  } else {
    // -2/(pi s) + (2/pi) ln(s/2) J1 - (1/pi) sum (psi(k+1) + psi(k+2)) v_k   (k = 0 term: 1 - 2 gamma).
    series = b.binary("add", b.binary("divide", c(b, sv, -2 / kPi), sv),
                      b.binary("subtract", b.binary("multiply", c(b, sv, 2 / kPi), b.binary("multiply", log_half, j1s)),
                               b.binary("multiply", c(b, sv, 1 / kPi), loop[7])));
  }
  // Hankel's expansion at a = max(|x|, 12).
  Value a = b.binary("maximum", ax, c(b, ax, kSwitch));
  double mu = 4.0 * order * order;
  Value p = c(b, a, 1), q = c(b, a, 0), power = c(b, a, 1);
  double coef = 1.0;
  for (int k = 1; k <= 20; ++k) {
    coef *= (mu - (2.0 * k - 1) * (2.0 * k - 1)) / (8.0 * k);
    power = b.binary("divide", power, a);
    Value t = b.binary("multiply", power, c(b, a, coef));
    // P takes the even terms with alternating signs, Q the odd ones.
    double sign = ((k / 2) % 2 == 0) ? 1.0 : -1.0;
    if (k % 2 == 0) p = b.binary("add", p, b.binary("multiply", t, c(b, t, sign)));
    else q = b.binary("add", q, b.binary("multiply", t, c(b, t, sign)));
  }
  Value chi = b.binary("subtract", a, c(b, a, (order / 2.0 + 0.25) * kPi));
  Value amp = b.unary("sqrt", b.binary("divide", c(b, a, 2 / kPi), a));
  Value cs = b.unary("cosine", chi), sn = b.unary("sine", chi);
  Value asym = second_kind ? b.binary("multiply", amp, b.binary("add", b.binary("multiply", p, sn), b.binary("multiply", q, cs)))
                           : b.binary("multiply", amp, b.binary("subtract", b.binary("multiply", p, cs), b.binary("multiply", q, sn)));
  Value r = b.select(b.compare(ax, c(b, ax, kSwitch), "LT"), series, asym);
  if (!second_kind) {
    if (order == 1) r = b.select(b.compare(x, c(b, x, 0), "LT"), b.unary("negate", r), r);  // odd
    r = b.select(b.compare(ax, c(b, ax, 0), "EQ"), c(b, r, order == 0 ? 1 : 0), r);
  } else {
    r = b.select(b.compare(x, c(b, x, 0), "EQ"), c(b, r, -INFINITY), r);
    r = b.select(b.compare(x, c(b, x, 0), "LT"), c(b, r, NAN), r);
  }
  r = b.select(b.compare(ax, c(b, ax, INFINITY), "EQ"), c(b, r, NAN), r);  // as torch's CPU kernels
  r = b.select(b.compare(x, x, "NE"), x, r);
  return b.convert(r, out);
}

Value gcd(Builder& b, Value x, Value y) {
  auto shape = ir::broadcast_shapes(b.dims(x), b.dims(y));
  x = abs(b, b.broadcast_to(x, shape));
  y = abs(b, b.broadcast_to(y, shape));
  auto out = b.while_loop(
      {x, y},
      [](Builder& bb, const std::vector<Value>& s) {
        Value nz = bb.compare(s[1], bb.scalar_like(s[1], 0), "NE");
        int64_t numel = bb.type(nz).numel();
        if (numel == 0) return bb.constant_int(DType::Pred, 0);
        return bb.reduce_simple(bb.reshape(nz, {numel}), bb.constant_int(DType::Pred, 0), {0}, "or");
      },
      [](Builder& bb, const std::vector<Value>& s) -> std::vector<Value> {
        Value a = s[0], d = s[1];
        Value done = bb.compare(d, bb.scalar_like(d, 0), "EQ");
        Value safe = bb.select(done, bb.scalar_like(d, 1), d);
        Value r = bb.binary("remainder", a, safe);
        return {bb.select(done, a, d), bb.select(done, d, r)};
      });
  return out[0];
}

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

Value add_scaled(Builder& b, Value x, Value y, Value alpha, DType compute, bool subtract) {
  auto shape = ir::broadcast_shapes(b.dims(x), b.dims(y));
  Value xc = b.broadcast_to(b.convert(x, compute), shape);
  Value yc = b.broadcast_to(b.convert(y, compute), shape);
  Value a = b.broadcast_to(b.convert(alpha, compute), shape);
  Value scaled = b.binary("multiply", yc, a);
  return b.binary(subtract ? "subtract" : "add", xc, scaled);
}

Value where(Builder& b, Value cond, Value x, Value y, DType out) {
  auto shape = ir::broadcast_shapes(ir::broadcast_shapes(b.dims(cond), b.dims(x)), b.dims(y));
  return b.select(b.broadcast_to(b.convert(cond, DType::Pred), shape),
                  b.broadcast_to(b.convert(x, out), shape), b.broadcast_to(b.convert(y, out), shape));
}

Value clamp(Builder& b, Value x, const Value* lo, const Value* hi, DType out) {
  // The result has the broadcast shape of all three (a bound may be larger than x).
  std::vector<int64_t> shape = b.dims(x);
  if (lo) shape = ir::broadcast_shapes(shape, b.dims(*lo));
  if (hi) shape = ir::broadcast_shapes(shape, b.dims(*hi));
  Value r = b.broadcast_to(b.convert(x, out), shape);
  // max then min, NaN propagating like torch.clamp.
  if (lo) r = b.binary("maximum", r, b.broadcast_to(b.convert(*lo, out), b.dims(r)));
  if (hi) r = b.binary("minimum", r, b.broadcast_to(b.convert(*hi, out), b.dims(r)));
  return r;
}

Value gelu(Builder& b, Value x, bool tanh_approx) {
  DType d = b.dtype(x);
  Value xf = b.convert(x, acc_type(d));
  Value r;
  if (tanh_approx) {
    Value inner = b.binary("multiply", b.scalar_like(xf, std::sqrt(2.0 / M_PI)),
                           b.binary("add", xf, b.binary("multiply", b.scalar_like(xf, 0.044715),
                                                        b.binary("multiply", xf, b.binary("multiply", xf, xf)))));
    r = b.binary("multiply", b.binary("multiply", b.scalar_like(xf, 0.5), xf),
                 b.binary("add", b.scalar_like(xf, 1), b.unary("tanh", inner)));
  } else {
    Value e = erf(b, b.binary("multiply", xf, b.scalar_like(xf, M_SQRT1_2)));
    r = b.binary("multiply", b.binary("multiply", b.scalar_like(xf, 0.5), xf),
                 b.binary("add", b.scalar_like(xf, 1), e));
  }
  return b.convert(r, d);
}

Value gelu_backward(Builder& b, Value grad, Value x, bool tanh_approx) {
  DType d = b.dtype(x);
  Value xf = b.convert(x, acc_type(d));
  Value g = b.convert(grad, acc_type(d));
  Value deriv;
  if (tanh_approx) {
    double k = std::sqrt(2.0 / M_PI);
    Value x2 = b.binary("multiply", xf, xf);
    Value inner = b.binary("multiply", b.scalar_like(xf, k),
                           b.binary("add", xf, b.binary("multiply", b.scalar_like(xf, 0.044715), b.binary("multiply", x2, xf))));
    Value t = b.unary("tanh", inner);
    Value dinner = b.binary("multiply", b.scalar_like(xf, k),
                            b.binary("add", b.scalar_like(xf, 1), b.binary("multiply", b.scalar_like(xf, 3 * 0.044715), x2)));
    Value sech2 = b.binary("subtract", b.scalar_like(xf, 1), b.binary("multiply", t, t));
    deriv = b.binary("add", b.binary("multiply", b.scalar_like(xf, 0.5), b.binary("add", b.scalar_like(xf, 1), t)),
                     b.binary("multiply", b.binary("multiply", b.scalar_like(xf, 0.5), xf), b.binary("multiply", sech2, dinner)));
  } else {
    Value cdf = b.binary("multiply", b.scalar_like(xf, 0.5),
                         b.binary("add", b.scalar_like(xf, 1), erf(b, b.binary("multiply", xf, b.scalar_like(xf, M_SQRT1_2)))));
    Value pdf = b.binary("multiply", b.scalar_like(xf, 1.0 / std::sqrt(2.0 * M_PI)),
                         b.unary("exponential", b.binary("multiply", b.scalar_like(xf, -0.5), b.binary("multiply", xf, xf))));
    deriv = b.binary("add", cdf, b.binary("multiply", xf, pdf));
  }
  return b.convert(b.binary("multiply", g, deriv), d);
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

Value hurwitz_zeta(Builder& b, Value s, Value q) {
  auto zeta = [&](Value qq) { return b.binary("chlo.zeta", s, qq); };
  // CHLO sums 9 terms from q before its Euler-Maclaurin tail, which is only accurate for
  // positive q. For negative q = floor(q) + g (0 < g < 1), the terms from q up to g are
  // (-1)^s times those of zeta(s, 1 - g) less those of zeta(s, 1 - q), so
  // zeta(s, q) = (-1)^s (zeta(s, 1 - g) - zeta(s, 1 - q)) + zeta(s, g)   (integer s; else NaN, as Cephes).
  Value one = b.scalar_like(q, 1);
  Value g = b.binary("subtract", q, b.unary("floor", q));
  Value odd = b.compare(b.binary("remainder", s, b.scalar_like(s, 2)), b.scalar_like(s, 0), "NE");
  Value tail = b.binary("subtract", zeta(b.binary("subtract", one, g)), zeta(b.binary("subtract", one, q)));
  Value shifted = b.binary("add", b.select(odd, b.unary("negate", tail), tail), zeta(g));
  Value negative = b.compare(q, b.scalar_like(q, 0), "LT");
  Value integer_s = b.compare(s, b.unary("floor", s), "EQ");
  Value r = b.select(negative, b.select(integer_s, shifted, b.scalar_like(q, NAN)), zeta(q));
  // Poles: +inf at non-positive integer q (s > 1) and at s = 1; NaN for s < 1, as Cephes.
  Value pole = b.binary("and", b.compare(q, b.scalar_like(q, 0), "LE"), b.compare(q, b.unary("floor", q), "EQ"));
  r = b.select(pole, b.scalar_like(q, INFINITY), r);
  r = b.select(b.compare(s, b.scalar_like(s, 1), "EQ"), b.scalar_like(q, INFINITY), r);
  return b.select(b.compare(s, b.scalar_like(s, 1), "LT"), b.scalar_like(q, NAN), r);
}

Value polygamma(Builder& b, int64_t n, Value x) {
  if (n == 0) return unary_table().at("digamma")(b, x);
  Value one = b.scalar_like(x, 1);
  Value one_minus = b.binary("subtract", one, x);
  Value negative = b.compare(x, b.scalar_like(x, 0), "LT");
  if (n == 1) {
    // CHLO's trigamma is inaccurate for negative x: reflect as torch does in the input's
    // precision, psi1(x) = pi^2 / sin^2(pi x) - psi1(1 - x).
    Value sin_pi = b.unary("sine", b.binary("multiply", x, b.scalar_like(x, M_PI)));
    Value reflected = b.binary("subtract", b.binary("divide", b.scalar_like(x, M_PI * M_PI), b.binary("multiply", sin_pi, sin_pi)),
                               b.binary("chlo.polygamma", one, one_minus));
    Value r = b.select(negative, reflected, b.binary("chlo.polygamma", one, x));
    return b.select(b.compare(x, b.scalar_like(x, INFINITY), "EQ"), b.scalar_like(x, 0), r);
  }
  // Negative x: psi_n(x) = (-1)^n psi_n(1 - x) - pi^(n+1) cot^(n)(pi x). torch sums zeta's series
  // in double there; in the input's precision only the reflection keeps its accuracy, with
  // cot(pi x) = +-tan(pi (1/2 - |x - round(x)|)) from exactly reduced arguments and the n-th
  // derivative of cot a polynomial in cot: P_0(c) = c, P_{k+1}(c) = -(1 + c^2) P_k'(c).
  std::vector<double> poly{0, 1};
  for (int64_t k = 0; k < n; ++k) {
    std::vector<double> next(poly.size() + 1, 0.0);
    for (size_t i = 1; i < poly.size(); ++i) {
      double d = poly[i] * static_cast<double>(i);  // coefficient of c^(i-1) in P_k'
      next[i - 1] -= d;
      next[i + 1] -= d;
    }
    poly = std::move(next);
  }
  Value frac = b.binary("subtract", x, b.unary("round_nearest_even", x));
  Value abs_frac = b.unary("abs", frac);
  Value pi = b.scalar_like(x, M_PI);
  // tan's argument stays within [0, pi/4], where it is well conditioned.
  Value near_pole = b.compare(abs_frac, b.scalar_like(x, 0.25), "LT");
  Value cot = b.select(near_pole, b.binary("divide", one, b.unary("tan", b.binary("multiply", abs_frac, pi))),
                       b.unary("tan", b.binary("multiply", b.binary("subtract", b.scalar_like(x, 0.5), abs_frac), pi)));
  cot = b.select(b.compare(frac, b.scalar_like(x, 0), "LT"), b.unary("negate", cot), cot);
  Value p = b.scalar_like(x, poly.back());
  for (size_t i = poly.size() - 1; i-- > 0;) p = b.binary("add", b.binary("multiply", p, cot), b.scalar_like(x, poly[i]));
  Value at_one_minus = b.binary("chlo.polygamma", b.scalar_like(x, static_cast<double>(n)), one_minus);
  if (n % 2) at_one_minus = b.unary("negate", at_one_minus);
  Value reflected = b.binary("subtract", at_one_minus, b.binary("multiply", b.scalar_like(x, std::pow(M_PI, n + 1.0)), p));
  Value r = b.select(negative, reflected, b.binary("chlo.polygamma", b.scalar_like(x, static_cast<double>(n)), x));
  // Non-positive integers: +-inf, as torch's zeta.
  Value pole = b.binary("and", b.compare(x, b.scalar_like(x, 0), "LE"), b.compare(x, b.unary("floor", x), "EQ"));
  return b.select(pole, b.scalar_like(x, n % 2 ? INFINITY : -INFINITY), r);
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
