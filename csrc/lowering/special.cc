// Special functions with loops or series: orthogonal polynomials, incomplete gamma, Bessel J/Y,
// gcd, Hurwitz zeta and polygamma.
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "lowering/ops.h"
#include "lowering/pointwise.h"

namespace torch_pjrt::lowering {

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
    Value theta = inverse_cosine(b, b.binary("minimum", b.binary("maximum", x, c(b, x, -1)), one));
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
  if (n == 0) return digamma(b, x);
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

}  // namespace torch_pjrt::lowering
