// Pointwise lowerings: the unary op table, the binary rules, complex rules, clamp, where, gelu.
#include "lowering/pointwise.h"

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "lowering/ops.h"

namespace torch_pjrt::lowering {

Value abs(Builder& b, Value x) {
  return ir::is_unsigned_int(b.dtype(x)) || b.dtype(x) == DType::Pred ? x : b.unary("abs", x);
}

namespace {

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
    case DType::F16:
    case DType::BF16: return DType::S16;
    default: return DType::S8;  // float8
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

// ---------------------------------------------------------------- unary rules
// Rules other rules (or other files) reuse are named; the rest are written in their row.

Value trunc_rule(Builder& b, Value x) {
  return b.select(b.compare(x, b.scalar_like(x, 0), "LT"), b.unary("ceil", x), b.unary("floor", x));
}

Value sign_rule(Builder& b, Value x) {
  if (!ir::is_floating(b.dtype(x))) return b.unary("sign", x);
  // torch: (0 < x) - (x < 0), so NaN and -0.0 give 0.
  Value zero = b.scalar_like(x, 0);
  Value pos = b.convert(b.compare(x, zero, "GT"), b.dtype(x)), neg = b.convert(b.compare(x, zero, "LT"), b.dtype(x));
  return b.binary("subtract", pos, neg);
}

Value signbit_rule(Builder& b, Value x) {
  if (!ir::is_floating(b.dtype(x))) return b.compare(x, b.scalar_like(x, 0), "LT");
  // The sign bit itself: set for -0.0 and for a negative NaN, as std::signbit.
  Value bits = float_bits(b, x);
  return b.compare(bits, b.scalar_like(bits, 0), "LT");
}

Value isinf_rule(Builder& b, Value x) { return b.compare(b.unary("abs", x), b.scalar_like(x, INFINITY), "EQ"); }
Value isnan_rule(Builder& b, Value x) { return b.compare(x, x, "NE"); }

Value sinh_rule(Builder& b, Value x) {
  return b.binary("multiply", b.binary("subtract", b.unary("exponential", x), b.unary("exponential", b.unary("negate", x))),
                  b.scalar_like(x, 0.5));
}

Value cosh_rule(Builder& b, Value x) {
  return b.binary("multiply", b.binary("add", b.unary("exponential", x), b.unary("exponential", b.unary("negate", x))),
                  b.scalar_like(x, 0.5));
}

Value acos_rule(Builder& b, Value x) {
  Value s = b.unary("sqrt", b.binary("subtract", b.scalar_like(x, 1), b.binary("multiply", x, x)));
  return b.binary("atan2", s, x);
}

Value hardsigmoid_rule(Builder& b, Value x) {
  Value y = b.binary("divide", b.binary("add", x, b.scalar_like(x, 3)), b.scalar_like(x, 6));
  return b.binary("minimum", b.binary("maximum", y, b.scalar_like(x, 0)), b.scalar_like(x, 1));  // NaN stays NaN
}

Value digamma_rule(Builder& b, Value x) {
  // At +-0 torch gives -+inf (the pole's one-sided limits); CHLO gives NaN.
  Value at_zero = b.compare(x, b.scalar_like(x, 0), "EQ");
  Value inf = b.select(signbit_rule(b, x), b.scalar_like(x, INFINITY), b.scalar_like(x, -INFINITY));
  return b.select(at_zero, inf, b.unary("chlo.digamma", x));
}

// |value| with the sign of `sign` (its sign bit: -0 counts as negative).
Value signed_as(Builder& b, Value value, Value sign) {
  Value magnitude = b.unary("abs", value);
  return b.select(signbit_rule(b, sign), b.unary("negate", magnitude), magnitude);
}

// ---------------------------------------------------------------- complex rules
// Complex inputs, for the ops whose real rule does not carry over.

Value either_part(Builder& b, Value z, Value (*predicate)(Builder&, Value)) {
  return b.binary("or", predicate(b, b.real(z)), predicate(b, b.imag(z)));
}

// Complex atanh with C99's (Annex G) values where a part is infinite, as numpy and the
// CPU: atanh(x +- inf i) and atanh(+-inf + y i) are +-0 +- pi/2 i (0 signed as x, pi/2 as
// y), with a NaN imaginary part when y is NaN. CHLO's expansion gives NaNs there.
Value complex_atanh(Builder& b, Value z) {
  Value re = b.real(z), im = b.imag(z);
  Value w = b.unary("chlo.atanh", z);
  Value zero = signed_as(b, b.scalar_like(re, 0), re);
  Value quarter_turn = b.select(b.compare(im, im, "NE"), im, signed_as(b, b.scalar_like(im, M_PI / 2), im));
  return b.select(either_part(b, z, isinf_rule), b.complex(zero, quarter_turn), w);
}

// z / |z|, and 0 at 0.
Value complex_sgn(Builder& b, Value x) {
  Value re = b.real(x), im = b.imag(x);
  Value mag = b.unary("abs", x);
  Value zero = b.scalar_like(mag, 0);
  Value is_zero = b.compare(mag, zero, "EQ");
  Value safe = b.select(is_zero, b.scalar_like(mag, 1), mag);
  Value r = b.complex(b.binary("divide", re, safe), b.binary("divide", im, safe));
  return b.select(is_zero, b.scalar_like(x, 0), r);
}

// f(conj z) = conj f(z): CHLO's result for |im|, its imaginary part signed as im (CHLO loses
// the side of the branch cut a signed zero names). asin's imaginary part has im's sign,
// acos's the opposite one. C99's asin(+-0 + NaN i) = +-0 + NaN i and acos(+-0 + NaN i) =
// pi/2 + NaN i, as on CPU.
Value complex_asin_acos(Builder& b, Value x, bool acos) {
  Value re = b.real(x), im = b.imag(x);
  Value r = b.unary(acos ? "chlo.acos" : "chlo.asin", b.complex(re, b.unary("abs", im)));
  Value mag = b.unary("abs", b.imag(r));
  Value neg = signbit_rule(b, im);
  if (acos) neg = b.unary("not", neg);
  Value out = b.complex(b.real(r), b.select(neg, b.unary("negate", mag), mag));
  Value zero_nan = b.binary("and", b.compare(re, b.scalar_like(re, 0), "EQ"), b.compare(im, im, "NE"));
  return b.select(zero_nan, b.complex(acos ? b.scalar_like(re, M_PI / 2) : re, im), out);
}

// atan(z) = -i atanh(i z). Its parts have the signs of z's (atan is odd and commutes with
// conj; on the cut, Re z = -0 names the side), and a NaN part makes both NaN, as on CPU.
Value complex_atan(Builder& b, Value x) {
  Value re = b.real(x), im = b.imag(x);
  Value w = complex_atanh(b, b.complex(b.unary("negate", im), re));
  Value r = b.complex(signed_as(b, b.imag(w), re), signed_as(b, b.real(w), im));
  // A NaN part with no infinite one: NaN + NaN i (with an infinite part, atanh's values).
  Value any_nan = b.binary("or", b.compare(re, re, "NE"), b.compare(im, im, "NE"));
  Value nan = b.scalar_like(re, NAN);
  return b.select(b.binary("and", any_nan, b.unary("not", either_part(b, x, isinf_rule))), b.complex(nan, nan), r);
}

// CHLO answers from one side of the branch cut whatever side a signed zero names: the part
// that changes sign across the cut takes it from z (Im for sqrt and acosh, Re for asinh).
Value complex_sqrt(Builder& b, Value x) {
  Value re = b.real(x), im = b.imag(x);
  Value r = b.unary("sqrt", x);
  r = b.complex(b.real(r), signed_as(b, b.imag(r), im));
  // C99 (Annex G), as numpy and torch's CPU: sqrt(x +- inf i) = inf +- inf i for every x,
  // NaN included; sqrt(-inf + y i) = 0 +- inf i and sqrt(inf + y i) = inf +- 0 i for finite y.
  Value inf = b.scalar_like(re, INFINITY), zero = b.scalar_like(re, 0);
  Value y_finite = b.unary("is_finite", im);
  Value re_pinf = b.compare(re, inf, "EQ"), re_ninf = b.compare(re, b.unary("negate", inf), "EQ");
  r = b.select(b.binary("and", re_ninf, y_finite), b.complex(zero, signed_as(b, inf, im)), r);
  r = b.select(b.binary("and", re_pinf, y_finite), b.complex(inf, signed_as(b, zero, im)), r);
  return b.select(isinf_rule(b, im), b.complex(inf, im), r);
}

Value complex_acosh(Builder& b, Value x) {
  Value r = b.unary("chlo.acosh", x);
  return b.complex(b.real(r), signed_as(b, b.imag(r), b.imag(x)));
}

Value complex_asinh(Builder& b, Value x) {
  Value r = b.unary("chlo.asinh", x);
  return b.complex(signed_as(b, b.real(r), b.real(x)), b.imag(r));
}

// |z| is inf when either part is, NaN or not (C99's hypot and cabs).
Value complex_abs(Builder& b, Value x) {
  Value mag = b.unary("abs", x);
  return b.select(either_part(b, x, isinf_rule), b.scalar_like(mag, INFINITY), mag);
}

// log |z| + i arg z, with |z| = inf when either part is, NaN or not (C99: log(inf + NaN i) is
// inf + NaN i; XLA's gives NaN there). log10 and log2 scale each part by the real log_b e (a
// complex product would turn the infinite part into NaNs; a product rather than a quotient by
// ln b rounds as numpy and torch's CPU do).
Value complex_log_scaled(Builder& b, Value x, double log_b_e) {
  Value re = b.real(x);
  Value r = b.unary("log", x);
  r = b.complex(b.select(either_part(b, x, isinf_rule), b.scalar_like(re, INFINITY), b.real(r)), b.imag(r));
  if (log_b_e == 1.0) return r;
  Value scale = b.scalar_like(re, log_b_e);
  return b.complex(b.binary("multiply", b.real(r), scale), b.binary("multiply", b.imag(r), scale));
}

// By parts: sinh(x + yi) = sinh x cos y + i cosh x sin y, cosh(x + yi) = cosh x cos y + i sinh x
// sin y, in float64 for complex64 (e^x / 2 overflows float32 before the product with cos y
// does; (e^z - e^-z) / 2 made that inf - inf = NaN). Infinite and NaN parts keep the
// expansion's special values.
Value complex_sinh_cosh(Builder& b, Value x, bool cosh) {
  Value re = b.real(x), im = b.imag(x);
  DType part = b.dtype(re), wide = part == DType::F32 ? DType::F64 : part;
  Value xr = b.convert(re, wide), yi = b.convert(im, wide);
  Value sh = sinh_rule(b, xr), ch = cosh_rule(b, xr);
  Value real = b.binary("multiply", cosh ? ch : sh, b.unary("cosine", yi));
  Value imag = b.binary("multiply", cosh ? sh : ch, b.unary("sine", yi));
  // On the real axis an overflowed sinh/cosh times sin 0 is inf * 0: the imaginary part is y's zero.
  imag = b.select(b.binary("and", b.compare(yi, b.scalar_like(yi, 0), "EQ"), b.compare(imag, imag, "NE")), yi, imag);
  Value parts = b.complex(b.convert(real, part), b.convert(imag, part));
  Value finite = b.binary("and", b.unary("is_finite", re), b.unary("is_finite", im));
  return b.select(finite, parts, cosh ? cosh_rule(b, x) : sinh_rule(b, x));
}

// C99 (Annex G), as numpy: exp(x + 0i) = e^x + 0i exactly (no inf * 0); exp(inf + y i) with y
// infinite or NaN is inf + NaN i, and exp(-inf + y i) is 0 + 0i.
Value complex_exp(Builder& b, Value x) {
  Value re = b.real(x), im = b.imag(x);
  Value r = b.unary("exponential", x);
  Value inf = b.scalar_like(re, INFINITY), zero = b.scalar_like(re, 0), nan = b.scalar_like(re, NAN);
  Value y_bad = b.unary("not", b.unary("is_finite", im));
  Value re_pinf = b.compare(re, inf, "EQ"), re_ninf = b.compare(re, b.unary("negate", inf), "EQ");
  r = b.select(b.binary("and", re_pinf, y_bad), b.complex(inf, nan), r);
  r = b.select(b.binary("and", re_ninf, y_bad), b.complex(zero, zero), r);
  return b.select(b.compare(im, zero, "EQ"), b.complex(b.unary("exponential", re), im), r);
}

// 2^z = e^(z ln 2), with exp's special values (as torch's CPU kernel computes it). Each part
// scaled by the real ln 2 (a complex product would make inf * 0 a NaN).
Value complex_exp2(Builder& b, Value x) {
  Value ln2 = b.scalar_like(b.real(x), M_LN2);
  return complex_exp(b, b.complex(b.binary("multiply", b.real(x), ln2), b.binary("multiply", b.imag(x), ln2)));
}

// 1 / (1 + e^-z) as torch's CPU kernel (and numpy) compute it: exp with C99's special values,
// then Smith's division. Where e^-z overflows to inf +- inf i that quotient is NaN (XLA's
// logistic gives the limit, 0; the test files compare with numpy).
Value complex_sigmoid(Builder& b, Value x) {
  Value w = b.binary("add", b.scalar_like(x, 1), complex_exp(b, b.unary("negate", x)));
  return complex_divide(b, b.scalar_like(x, 1), w);
}

// Real inputs of angle: pi for negatives, 0 otherwise, NaN stays NaN.
Value real_angle(Builder& b, Value x) {
  Value r = b.select(b.compare(x, b.scalar_like(x, 0), "LT"), b.scalar_like(x, M_PI), b.scalar_like(x, 0));
  return b.select(b.compare(x, x, "NE"), x, r);
}

Value softplus_rule(Builder& b, Value x) {
  // log(1 + exp(x)) computed stably.
  Value ax = b.unary("abs", x);
  return b.binary("add", b.binary("maximum", x, b.scalar_like(x, 0)),
                  b.unary("log_plus_one", b.unary("exponential", b.unary("negate", ax))));
}

// exp(x^2) erfc(x) without the overflow of its two factors: in float64, the product up to
// x = 26 (past which erfc(x) underflows), then its asymptotic series 1 / (x sqrt(pi)) sum_k
// (-1)^k (2k-1)!! / (2x^2)^k to k = 6, within 1e-16 there. Below about -26.6, exp(x^2)
// overflows: +inf, as on the CPU.
Value erfcx_rule(Builder& b, Value x) {
  Value w = b.convert(x, DType::F64);
  Value direct = b.binary("multiply", b.unary("exponential", b.binary("multiply", w, w)), b.unary("chlo.erfc", w));
  Value inv = b.binary("divide", b.scalar_like(w, 1), w);
  Value t = b.binary("multiply", inv, inv);
  Value series = b.scalar_like(w, 162.421875);
  for (double c : {-29.53125, 6.5625, -1.875, 0.75, -0.5, 1.0}) series = b.binary("add", b.binary("multiply", series, t), b.scalar_like(w, c));
  series = b.binary("multiply", series, b.binary("multiply", inv, b.scalar_like(w, 1 / std::sqrt(M_PI))));
  Value r = b.select(b.compare(w, b.scalar_like(w, 26), "GT"), series, direct);
  return b.convert(r, b.dtype(x));
}

using R = UnaryResult;
using I = OnIntegers;
constexpr uint8_t kAll = kFunctional | kInPlace | kOut;
constexpr uint8_t kNoInPlace = kFunctional | kOut;

// One row per op. A row's `real` rule also serves complex inputs unless it names a
// `complex` rule or refuses them.
const UnaryOp kUnaryOps[] = {
    {.name = "neg", .result = R::same, .variants = kAll, .real = [](Builder& b, Value x) { return b.unary("negate", x); },
     .bool_error = "Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a mask, "
                   "use the `~` or `logical_not()` operator instead."},
    {.name = "abs", .result = R::same, .variants = kAll, .real = abs, .complex = complex_abs, .complex_to_real = true},
    {.name = "exp", .result = R::floating, .variants = kAll, .real = [](Builder& b, Value x) { return b.unary("exponential", x); },
     .complex = complex_exp},
    // 2^x as a power, exact at integers (exp(x ln 2) is not), as torch's std::exp2.
    {.name = "exp2", .result = R::floating, .variants = kAll,
     .real = [](Builder& b, Value x) { return b.binary("power", b.scalar_like(x, 2.0), x); }, .complex = complex_exp2},
    {.name = "expm1", .result = R::floating, .variants = kAll,
     .real = [](Builder& b, Value x) { return b.unary("exponential_minus_one", x); }},
    {.name = "log", .result = R::floating, .variants = kAll, .real = [](Builder& b, Value x) { return b.unary("log", x); },
     .complex = [](Builder& b, Value x) { return complex_log_scaled(b, x, 1.0); }},
    {.name = "log2", .result = R::floating, .variants = kAll,
     .real = [](Builder& b, Value x) { return b.binary("divide", b.unary("log", x), b.scalar_like(x, std::log(2.0))); },
     .complex = [](Builder& b, Value x) { return complex_log_scaled(b, x, M_LOG2E); }},
    {.name = "log10", .result = R::floating, .variants = kAll,
     .real = [](Builder& b, Value x) { return b.binary("divide", b.unary("log", x), b.scalar_like(x, std::log(10.0))); },
     .complex = [](Builder& b, Value x) { return complex_log_scaled(b, x, M_LOG10E); }},
    {.name = "log1p", .result = R::floating, .variants = kAll,
     .real = [](Builder& b, Value x) { return b.unary("log_plus_one", x); }},
    {.name = "sqrt", .result = R::floating, .variants = kAll, .real = [](Builder& b, Value x) { return b.unary("sqrt", x); },
     .complex = complex_sqrt},
    // 1 / sqrt(z), as torch's CPU computes it: C99's square root, then Smith's division.
    {.name = "rsqrt", .result = R::floating, .variants = kAll, .real = [](Builder& b, Value x) { return b.unary("rsqrt", x); },
     .complex = [](Builder& b, Value x) { return complex_divide(b, b.scalar_like(x, 1), complex_sqrt(b, x)); }},
    {.name = "sin", .result = R::floating, .variants = kAll, .real = [](Builder& b, Value x) { return b.unary("sine", x); }},
    {.name = "cos", .result = R::floating, .variants = kAll, .real = [](Builder& b, Value x) { return b.unary("cosine", x); }},
    {.name = "tan", .result = R::floating, .variants = kAll, .real = [](Builder& b, Value x) { return b.unary("tan", x); }},
    {.name = "tanh", .result = R::floating, .variants = kAll, .real = [](Builder& b, Value x) { return b.unary("tanh", x); }},
    {.name = "sinh", .result = R::floating, .variants = kAll, .real = sinh_rule,
     .complex = [](Builder& b, Value x) { return complex_sinh_cosh(b, x, /*cosh=*/false); }},
    {.name = "cosh", .result = R::floating, .variants = kAll, .real = cosh_rule,
     .complex = [](Builder& b, Value x) { return complex_sinh_cosh(b, x, /*cosh=*/true); }},
    {.name = "asin", .result = R::floating, .variants = kAll,
     .real = [](Builder& b, Value x) {
       Value c = b.unary("sqrt", b.binary("subtract", b.scalar_like(x, 1), b.binary("multiply", x, x)));
       return b.binary("atan2", x, c);
     },
     .complex = [](Builder& b, Value x) { return complex_asin_acos(b, x, /*acos=*/false); }},
    {.name = "acos", .result = R::floating, .variants = kAll, .real = acos_rule,
     .complex = [](Builder& b, Value x) { return complex_asin_acos(b, x, /*acos=*/true); }},
    {.name = "atan", .result = R::floating, .variants = kAll,
     .real = [](Builder& b, Value x) { return b.binary("atan2", x, b.scalar_like(x, 1)); }, .complex = complex_atan},
    {.name = "sigmoid", .result = R::floating, .variants = kAll,
     .real = [](Builder& b, Value x) { return b.unary("logistic", x); }, .complex = complex_sigmoid},
    {.name = "erf", .result = R::floating, .variants = kAll, .real = erf, .refuses_complex = true},
    {.name = "reciprocal", .result = R::floating, .variants = kAll,
     .real = [](Builder& b, Value x) { return b.binary("divide", b.scalar_like(x, 1), x); },
     .complex = [](Builder& b, Value x) { return complex_divide(b, b.scalar_like(x, 1), x); }},
    // Rounding is the identity on integers.
    {.name = "floor", .result = R::same, .variants = kAll, .real = [](Builder& b, Value x) { return b.unary("floor", x); },
     .integers = I::identity, .refuses_complex = true},
    {.name = "ceil", .result = R::same, .variants = kAll, .real = [](Builder& b, Value x) { return b.unary("ceil", x); },
     .integers = I::identity, .refuses_complex = true},
    {.name = "round", .result = R::same, .variants = kAll,
     .real = [](Builder& b, Value x) { return b.unary("round_nearest_even", x); }, .integers = I::identity,
     .refuses_complex = true},
    {.name = "trunc", .result = R::same, .variants = kAll, .real = trunc_rule, .integers = I::identity,
     .refuses_complex = true},
    {.name = "frac", .result = R::same, .variants = kAll,
     .real = [](Builder& b, Value x) { return b.binary("subtract", x, trunc_rule(b, x)); }, .integers = I::zero,
     .refuses_complex = true},
    {.name = "sign", .result = R::same, .variants = kAll, .real = sign_rule, .integers = I::nonzero_if_unsigned,
     .refuses_complex = true},
    {.name = "sgn", .result = R::same, .variants = kAll, .real = sign_rule, .complex = complex_sgn,
     .integers = I::nonzero_if_unsigned},
    {.name = "bitwise_not", .result = R::same, .variants = kAll, .real = [](Builder& b, Value x) { return b.unary("not", x); }},
    {.name = "relu", .result = R::same, .variants = kFunctional | kInPlace,
     .real = [](Builder& b, Value x) { return b.binary("maximum", x, b.scalar_like(x, 0)); }, .refuses_complex = true},
    {.name = "silu", .result = R::same, .variants = kAll,
     .real = [](Builder& b, Value x) { return b.binary("multiply", x, b.unary("logistic", x)); }},
    {.name = "mish", .result = R::same, .variants = kAll,
     .real = [](Builder& b, Value x) { return b.binary("multiply", x, b.unary("tanh", softplus_rule(b, x))); }},
    {.name = "hardsigmoid", .result = R::same, .variants = kAll, .real = hardsigmoid_rule},
    {.name = "hardswish", .result = R::same, .variants = kAll,
     .real = [](Builder& b, Value x) { return b.binary("multiply", x, hardsigmoid_rule(b, x)); }},
    // XLA's CHLO decompositions (legalized by the plugin's compiler).
    {.name = "asinh", .result = R::floating, .variants = kAll,
     .real = [](Builder& b, Value x) { return b.unary("chlo.asinh", x); }, .complex = complex_asinh},
    {.name = "acosh", .result = R::floating, .variants = kAll,
     .real = [](Builder& b, Value x) { return b.unary("chlo.acosh", x); }, .complex = complex_acosh},
    {.name = "atanh", .result = R::floating, .variants = kAll,
     .real = [](Builder& b, Value x) { return b.unary("chlo.atanh", x); }, .complex = complex_atanh},
    {.name = "lgamma", .result = R::floating, .variants = kAll,
     .real = [](Builder& b, Value x) { return b.unary("chlo.lgamma", x); }},
    {.name = "digamma", .result = R::floating, .variants = kAll, .real = digamma_rule},
    {.name = "erfinv", .result = R::floating, .variants = kAll,
     .real = [](Builder& b, Value x) { return b.unary("chlo.erf_inv", x); }},
    {.name = "erfc", .result = R::floating, .variants = kAll, .real = [](Builder& b, Value x) { return b.unary("chlo.erfc", x); }},
    {.name = "sinc", .result = R::floating, .variants = kAll,
     .real = [](Builder& b, Value x) {
       Value px = b.binary("multiply", x, b.scalar_like(x, M_PI));
       Value r = b.binary("divide", b.unary("sine", px), px);
       return b.select(b.compare(x, b.scalar_like(x, 0), "EQ"), b.scalar_like(x, 1), r);
     }},
    {.name = "deg2rad", .result = R::floating, .variants = kAll,
     .real = [](Builder& b, Value x) { return b.binary("multiply", x, b.scalar_like(x, M_PI / 180.0)); }},
    {.name = "rad2deg", .result = R::floating, .variants = kAll,
     .real = [](Builder& b, Value x) { return b.binary("multiply", x, b.scalar_like(x, 180.0 / M_PI)); }},
    {.name = "i0", .result = R::floating, .variants = kAll,
     .real = [](Builder& b, Value x) { return bessel_i0(b, x, /*scaled=*/false); }},
    {.name = "special_i0e", .result = R::floating, .variants = kNoInPlace,
     .real = [](Builder& b, Value x) { return bessel_i0(b, x, /*scaled=*/true); }},
    {.name = "special_i1e", .result = R::floating, .variants = kNoInPlace,
     .real = [](Builder& b, Value x) { return b.unary("chlo.bessel_i1e", x); }},
    {.name = "special_i1", .result = R::floating, .variants = kNoInPlace,
     .real = [](Builder& b, Value x) {
       return b.binary("multiply", b.unary("chlo.bessel_i1e", x), b.unary("exponential", b.unary("abs", x)));
     }},
    {.name = "special_ndtri", .result = R::floating, .variants = kNoInPlace, .real = ndtri},
    {.name = "special_log_ndtr", .result = R::floating, .variants = kNoInPlace, .real = log_ndtr},
    {.name = "special_erfcx", .result = R::floating, .variants = kNoInPlace, .real = erfcx_rule},
    {.name = "special_entr", .result = R::floating, .variants = kNoInPlace,
     .real = [](Builder& b, Value x) {
       Value zero = b.scalar_like(x, 0);
       Value r = b.unary("negate", b.binary("multiply", x, b.unary("log", x)));
       r = b.select(b.compare(x, zero, "EQ"), zero, r);
       return b.select(b.compare(x, zero, "LT"), b.scalar_like(x, -INFINITY), r);
     }},
    {.name = "angle", .result = R::floating, .variants = kNoInPlace, .real = real_angle,
     .complex = [](Builder& b, Value x) { return b.binary("atan2", b.imag(x), b.real(x)); }, .complex_to_real = true},
    // Predicates: nothing integral is infinite or NaN, everything is finite.
    {.name = "isnan", .result = R::boolean, .variants = kFunctional, .real = isnan_rule,
     .complex = [](Builder& b, Value x) { return either_part(b, x, isnan_rule); }, .integers = I::none},
    {.name = "isinf", .result = R::boolean, .variants = kFunctional, .real = isinf_rule,
     .complex = [](Builder& b, Value x) { return either_part(b, x, isinf_rule); }, .integers = I::none},
    {.name = "isfinite", .result = R::boolean, .variants = kFunctional,
     .real = [](Builder& b, Value x) { return b.unary("is_finite", x); },
     .complex = [](Builder& b, Value x) { return b.binary("and", b.unary("is_finite", b.real(x)), b.unary("is_finite", b.imag(x))); },
     .integers = I::all},
    {.name = "isposinf", .result = R::boolean, .variants = kNoInPlace,
     .real = [](Builder& b, Value x) { return b.compare(x, b.scalar_like(x, INFINITY), "EQ"); }, .integers = I::none,
     .refuses_complex = true, .out_must_be_bool = true},
    {.name = "isneginf", .result = R::boolean, .variants = kNoInPlace,
     .real = [](Builder& b, Value x) { return b.compare(x, b.scalar_like(x, -INFINITY), "EQ"); }, .integers = I::none,
     .refuses_complex = true, .out_must_be_bool = true},
    {.name = "signbit", .result = R::boolean, .variants = kNoInPlace, .real = signbit_rule, .refuses_complex = true},
    {.name = "logical_not", .result = R::boolean, .variants = kAll,
     .real = [](Builder& b, Value x) { return b.unary("not", b.convert(x, DType::Pred)); }},
};

}  // namespace

std::span<const UnaryOp> unary_ops() { return kUnaryOps; }

const UnaryOp& unary_op(std::string_view name) {
  for (const UnaryOp& op : kUnaryOps) {
    if (name == op.name) return op;
  }
  throw std::invalid_argument("no unary op named " + std::string(name));
}

Value softplus(Builder& b, Value x) { return softplus_rule(b, x); }
Value digamma(Builder& b, Value x) { return digamma_rule(b, x); }
Value inverse_cosine(Builder& b, Value x) { return acos_rule(b, x); }
Value sign(Builder& b, Value x) { return sign_rule(b, x); }

Value unary(Builder& b, const UnaryOp& op, Value x, DType compute, DType out) {
  if (ir::is_complex(compute)) {
    if (op.refuses_complex) throw std::invalid_argument(std::string(op.name) + " is not supported for complex inputs");
    Value xc = b.convert(x, compute);
    return b.convert(op.complex ? op.complex(b, xc) : op.real(b, xc), out);
  }
  if (!ir::is_floating(compute)) {
    auto all = [&](bool value) { return b.convert(b.constant_int(DType::Pred, value ? 1 : 0, b.dims(x)), out); };
    switch (op.integers) {
      case OnIntegers::compute: break;
      case OnIntegers::identity: return b.convert(x, out);
      case OnIntegers::none: return all(false);
      case OnIntegers::all: return all(true);
      case OnIntegers::zero: return b.convert(b.constant_int(compute, 0, b.dims(x)), out);
      case OnIntegers::nonzero_if_unsigned:
        // The sign of a bool or an unsigned value is "non-zero".
        if (compute == DType::Pred || ir::is_unsigned_int(compute)) {
          return b.convert(b.compare(x, b.scalar_like(x, 0), "NE"), out);
        }
        break;
    }
  }
  // Half precision is computed in float32 and rounded once, as torch's kernels do: an
  // expansion (acosh, sinh, sinc ...) run in float16 rounds at every step, a unit off.
  if (is_reduced_float(compute)) compute = DType::F32;
  return b.convert(op.real(b, b.convert(x, compute)), out);
}

namespace {

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

Value true_divide(Builder& b, Value x, Value y) {
  return ir::is_complex(b.dtype(x)) ? complex_divide(b, x, y) : b.binary("divide", x, y);
}

Value trunc_divide(Builder& b, Value x, Value y) {
  Value q = b.binary("divide", x, y);
  return ir::is_floating(b.dtype(q)) ? trunc_rule(b, q) : q;
}

Value python_remainder(Builder& b, Value x, Value y) {
  // Python modulo: result has the sign of the divisor.
  Value r = b.binary("remainder", x, y);
  Value zero = b.scalar_like(x, 0);
  Value fix = b.binary("and", b.compare(r, zero, "NE"),
                       b.compare(b.compare(r, zero, "LT"), b.compare(y, zero, "LT"), "NE"));
  return b.select(fix, b.binary("add", r, y), r);
}

Value xlogy_rule(Builder& b, Value x, Value y) {
  Value r = b.binary("multiply", x, b.unary("log", y));
  r = b.select(b.compare(x, b.scalar_like(x, 0), "EQ"), b.scalar_like(x, 0), r);
  return b.select(b.compare(y, y, "NE"), y, r);  // NaN in y wins even when x == 0
}

Value xlog1py_rule(Builder& b, Value x, Value y) {
  Value r = b.binary("multiply", x, b.unary("log_plus_one", y));
  r = b.select(b.compare(x, b.scalar_like(x, 0), "EQ"), b.scalar_like(x, 0), r);
  return b.select(b.compare(y, y, "NE"), y, r);
}

Value logaddexp_rule(Builder& b, Value x, Value y) {
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
}

Value logaddexp2_rule(Builder& b, Value x, Value y) {
  Value ln2 = b.scalar_like(x, std::log(2.0));
  Value hi = b.binary("maximum", x, y), lo = b.binary("minimum", x, y);
  Value r = b.binary("add", hi, b.binary("divide", b.unary("log_plus_one", b.unary("exponential", b.binary("multiply", b.binary("subtract", lo, hi), ln2))), ln2));
  return b.select(b.binary("and", b.compare(x, y, "EQ"), b.compare(b.unary("abs", x), b.scalar_like(x, INFINITY), "EQ")), x, r);
}

Value hypot_rule(Builder& b, Value x, Value y) {
  Value ax = b.unary("abs", x), ay = b.unary("abs", y);
  Value hi = b.binary("maximum", ax, ay), lo = b.binary("minimum", ax, ay);
  Value ratio = b.binary("divide", lo, hi);
  Value r = b.binary("multiply", hi, b.unary("sqrt", b.binary("add", b.scalar_like(x, 1), b.binary("multiply", ratio, ratio))));
  r = b.select(b.compare(hi, b.scalar_like(x, 0), "EQ"), hi, r);
  // An infinite side wins over a NaN one (C's hypot, as torch): inf, not NaN.
  Value inf = b.scalar_like(x, INFINITY);
  Value any_inf = b.binary("or", b.compare(ax, inf, "EQ"), b.compare(ay, inf, "EQ"));
  return b.select(any_inf, inf, r);
}

Value copysign_rule(Builder& b, Value x, Value y) {
  // x's magnitude bits with y's sign bit: NaNs give and take signs as std::copysign.
  Value xb = float_bits(b, x), yb = float_bits(b, y);
  const DType bits = b.dtype(xb);
  const int64_t min = bits == DType::S64 ? std::numeric_limits<int64_t>::min()
                      : bits == DType::S32 ? std::numeric_limits<int32_t>::min() : std::numeric_limits<int16_t>::min();
  Value sign_mask = b.constant_int(bits, min, b.dims(xb)), magnitude_mask = b.constant_int(bits, -(min + 1), b.dims(xb));
  Value r = b.binary("or", b.binary("and", xb, magnitude_mask), b.binary("and", yb, sign_mask));
  return from_bits(b, r, b.dtype(x));
}

Value heaviside_rule(Builder& b, Value x, Value y) {
  Value zero = b.scalar_like(x, 0);
  Value r = b.select(b.compare(x, zero, "GT"), b.scalar_like(x, 1), zero);
  r = b.select(b.compare(x, zero, "EQ"), y, r);
  return b.select(b.compare(x, x, "NE"), x, r);
}

Value right_shift(Builder& b, Value x, Value y) {
  return b.binary(ir::is_unsigned_int(b.dtype(x)) ? "shift_right_logical" : "shift_right_arithmetic", x, y);
}

// fmax/fmin: a NaN operand loses to a number.
template <bool is_max>
Value nan_ignoring(Builder& b, Value x, Value y) {
  const char* op = is_max ? "maximum" : "minimum";
  if (!ir::is_floating(b.dtype(x))) return b.binary(op, x, y);
  Value r = b.binary(op, x, y);
  r = b.select(b.compare(x, x, "NE"), y, r);
  return b.select(b.compare(y, y, "NE"), x, r);
}

template <const char* Op>
Value simple(Builder& b, Value x, Value y) { return b.binary(Op, x, y); }
template <const char* Direction>
Value compare(Builder& b, Value x, Value y) { return b.compare(x, y, Direction); }
template <const char* Op>
Value logical(Builder& b, Value x, Value y) { return b.binary(Op, b.convert(x, DType::Pred), b.convert(y, DType::Pred)); }
constexpr char kAdd[] = "add", kSubtract[] = "subtract", kMultiply[] = "multiply", kMaximum[] = "maximum",
               kMinimum[] = "minimum", kPower[] = "power", kAtan2[] = "atan2", kAnd[] = "and", kOr[] = "or",
               kXor[] = "xor", kRemainder[] = "remainder", kShiftLeft[] = "shift_left", kNextAfter[] = "chlo.next_after";
constexpr char kEq[] = "EQ", kNe[] = "NE", kLt[] = "LT", kLe[] = "LE", kGt[] = "GT", kGe[] = "GE";

using B = BinaryResult;
// Overload names: name.Tensor, name_.Tensor, name.Tensor_out and the .Scalar forms.
#define TENSOR_AND_SCALAR_OVERLOADS(NAME) \
  .tensor = {NAME ".Tensor", NAME "_.Tensor", NAME ".Tensor_out"}, .scalar = {NAME ".Scalar", NAME "_.Scalar", NAME ".Scalar_out"}
// name, name_, name.out
#define PLAIN_OVERLOADS(NAME) .tensor = {NAME, NAME "_", NAME ".out"}

// One row per binary op. Rows with no overloads are rules other kernels call (add and sub
// take alpha, div its rounding mode, pow its scalar forms).
const BinaryOp kBinaryOps[] = {
    {.name = "add", .result = B::promoted, .rule = simple<kAdd>},
    {.name = "sub", .result = B::promoted, .rule = simple<kSubtract>},
    {.name = "div", .result = B::floating, .rule = true_divide, .scalar_in_opmath = true},
    {.name = "div_trunc", .result = B::promoted, .rule = trunc_divide},
    {.name = "pow", .result = B::promoted, .rule = simple<kPower>},
    {.name = "mul", .result = B::promoted, .rule = simple<kMultiply>,
     .tensor = {"mul.Tensor", "mul_.Tensor", "mul.out"}, .scalar_in_opmath = true},
    {.name = "eq", .result = B::boolean, .rule = compare<kEq>, TENSOR_AND_SCALAR_OVERLOADS("eq")},
    {.name = "ne", .result = B::boolean, .rule = compare<kNe>, TENSOR_AND_SCALAR_OVERLOADS("ne")},
    {.name = "lt", .result = B::boolean, .rule = compare<kLt>, TENSOR_AND_SCALAR_OVERLOADS("lt")},
    {.name = "le", .result = B::boolean, .rule = compare<kLe>, TENSOR_AND_SCALAR_OVERLOADS("le")},
    {.name = "gt", .result = B::boolean, .rule = compare<kGt>, TENSOR_AND_SCALAR_OVERLOADS("gt")},
    {.name = "ge", .result = B::boolean, .rule = compare<kGe>, TENSOR_AND_SCALAR_OVERLOADS("ge")},
    // Python's modulo: the result has the divisor's sign; fmod: the dividend's.
    {.name = "remainder", .result = B::promoted, .rule = python_remainder, TENSOR_AND_SCALAR_OVERLOADS("remainder")},
    {.name = "fmod", .result = B::promoted, .rule = simple<kRemainder>, TENSOR_AND_SCALAR_OVERLOADS("fmod")},
    {.name = "maximum", .result = B::promoted, .rule = simple<kMaximum>, PLAIN_OVERLOADS("maximum"), .refuses_complex = true},
    {.name = "minimum", .result = B::promoted, .rule = simple<kMinimum>, PLAIN_OVERLOADS("minimum"), .refuses_complex = true},
    {.name = "fmax", .result = B::promoted, .rule = nan_ignoring<true>, .tensor = {"fmax", nullptr, "fmax.out"},
     .refuses_complex = true},
    {.name = "fmin", .result = B::promoted, .rule = nan_ignoring<false>, .tensor = {"fmin", nullptr, "fmin.out"},
     .refuses_complex = true},
    {.name = "atan2", .result = B::floating, .rule = simple<kAtan2>, PLAIN_OVERLOADS("atan2")},
    {.name = "logical_and", .result = B::boolean, .rule = logical<kAnd>, PLAIN_OVERLOADS("logical_and")},
    {.name = "logical_or", .result = B::boolean, .rule = logical<kOr>, PLAIN_OVERLOADS("logical_or")},
    {.name = "logical_xor", .result = B::boolean, .rule = logical<kXor>, PLAIN_OVERLOADS("logical_xor")},
    {.name = "bitwise_and", .result = B::promoted, .rule = simple<kAnd>,
     .tensor = {"bitwise_and.Tensor", "bitwise_and_.Tensor", "bitwise_and.Tensor_out"}},
    {.name = "bitwise_or", .result = B::promoted, .rule = simple<kOr>,
     .tensor = {"bitwise_or.Tensor", "bitwise_or_.Tensor", "bitwise_or.Tensor_out"}},
    {.name = "bitwise_xor", .result = B::promoted, .rule = simple<kXor>,
     .tensor = {"bitwise_xor.Tensor", "bitwise_xor_.Tensor", "bitwise_xor.Tensor_out"}},
    {.name = "bitwise_left_shift", .result = B::promoted, .rule = simple<kShiftLeft>,
     .tensor = {"bitwise_left_shift.Tensor", "bitwise_left_shift_.Tensor", "bitwise_left_shift.Tensor_out"},
     .scalar = {"bitwise_left_shift.Tensor_Scalar", "bitwise_left_shift_.Tensor_Scalar", "bitwise_left_shift.Tensor_Scalar_out"}},
    {.name = "bitwise_right_shift", .result = B::promoted, .rule = right_shift,
     .tensor = {"bitwise_right_shift.Tensor", "bitwise_right_shift_.Tensor", "bitwise_right_shift.Tensor_out"},
     .scalar = {"bitwise_right_shift.Tensor_Scalar", "bitwise_right_shift_.Tensor_Scalar", "bitwise_right_shift.Tensor_Scalar_out"}},
    {.name = "xlogy", .result = B::floating, .rule = xlogy_rule, .tensor = {"xlogy.Tensor", "xlogy_.Tensor", "xlogy.OutTensor"}},
    {.name = "special_xlog1py", .result = B::floating, .rule = xlog1py_rule,
     .tensor = {"special_xlog1py", nullptr, "special_xlog1py.out"}},
    {.name = "special_zeta", .result = B::floating, .rule = [](Builder& b, Value x, Value y) { return hurwitz_zeta(b, x, y); },
     .tensor = {"special_zeta", nullptr, "special_zeta.out"}},
    {.name = "logaddexp", .result = B::floating, .rule = logaddexp_rule, .tensor = {"logaddexp", nullptr, "logaddexp.out"}},
    {.name = "logaddexp2", .result = B::floating, .rule = logaddexp2_rule, .tensor = {"logaddexp2", nullptr, "logaddexp2.out"}},
    {.name = "hypot", .result = B::floating, .rule = hypot_rule, PLAIN_OVERLOADS("hypot")},
    {.name = "copysign", .result = B::floating, .rule = copysign_rule,
     .tensor = {"copysign.Tensor", "copysign_.Tensor", "copysign.out"},
     .scalar = {"copysign.Scalar", "copysign_.Scalar", "copysign.Scalar_out"}},
    {.name = "nextafter", .result = B::promoted, .rule = simple<kNextAfter>, PLAIN_OVERLOADS("nextafter")},
    // heaviside checks its dtypes first: its kernels are written out (aten/pointwise.cc).
    {.name = "heaviside", .result = B::promoted, .rule = heaviside_rule},
    {.name = "div_floor", .result = B::promoted, .rule = floor_div,
     .tensor = {"floor_divide", "floor_divide_.Tensor", "floor_divide.out"},
     .scalar = {"floor_divide.Scalar", "floor_divide_.Scalar", nullptr}},
};
#undef TENSOR_AND_SCALAR_OVERLOADS
#undef PLAIN_OVERLOADS

}  // namespace


Value lowest(Builder& b, DType d, const std::vector<int64_t>& dims) {
  switch (d) {
    case DType::Pred: return b.constant_int(d, 0, dims);
    case DType::S8: return b.constant_int(d, INT8_MIN, dims);
    case DType::S16: return b.constant_int(d, INT16_MIN, dims);
    case DType::S32: return b.constant_int(d, INT32_MIN, dims);
    case DType::S64: return b.constant_int(d, INT64_MIN, dims);
    case DType::U8: case DType::U16: case DType::U32: case DType::U64: return b.constant_int(d, 0, dims);
    case DType::F8E4M3FNUZ: return b.constant(d, -240.0, dims);  // no infinities: the largest finite
    case DType::F8E5M2FNUZ: return b.constant(d, -57344.0, dims);
    default: return b.constant(d, -INFINITY, dims);  // (e4m3fn's convert saturates it to -448)
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
    case DType::F8E4M3FNUZ: return b.constant(d, 240.0, dims);
    case DType::F8E5M2FNUZ: return b.constant(d, 57344.0, dims);
    default: return b.constant(d, INFINITY, dims);
  }
}


Value erf(Builder& b, Value x) {
  // XLA's CHLO erf (its f32 rational approximation; NaN and infinities handled), in f32 for f16/bf16.
  DType d = b.dtype(x);
  return b.convert(b.unary("chlo.erf", b.convert(x, accumulate_type(d))), d);
}

std::span<const BinaryOp> binary_ops() { return kBinaryOps; }

const BinaryOp& binary_op(std::string_view name) {
  for (const BinaryOp& op : kBinaryOps) {
    if (name == op.name) return op;
  }
  throw std::invalid_argument("no binary op named " + std::string(name));
}

Value binary(Builder& b, const BinaryOp& op, Value x, Value y, DType compute, DType out) {
  // float8 in float32, rounded once by torch's conversion rules (XLA's own float8 arithmetic
  // overflows e4m3fn to NaN where torch saturates).
  if (ir::is_float8(compute)) compute = DType::F32;
  auto shape = ir::broadcast_shapes(b.dims(x), b.dims(y));
  Value xc = b.broadcast_to(b.convert(x, compute), shape);
  Value yc = b.broadcast_to(b.convert(y, compute), shape);
  return b.convert(op.rule(b, xc, yc), out);
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
  Value xf = b.convert(x, accumulate_type(d));
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
  Value xf = b.convert(x, accumulate_type(d));
  Value g = b.convert(grad, accumulate_type(d));
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

}  // namespace torch_pjrt::lowering
