// Connectionist temporal classification loss: the forward (alpha) and
// backward (beta) recursions over the blank-extended label sequence as
// stablehlo.while loops over time, in log space; the gradient as PyTorch's
// CPU kernel defines it (with respect to the log-probabilities).
#include <cmath>
#include <limits>

#include "lowering/nn.h"
#include "lowering/ops.h"

namespace torch_pjrt::lowering {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// log(exp(a) + exp(b) + exp(c)), -inf when all are.
Value log_add3(Builder& b, Value x, Value y, Value z) {
  Value m = b.binary("maximum", b.binary("maximum", x, y), z);
  Value finite = b.compare(m, b.scalar_like(m, kNegInf), "NE");
  Value safe = b.select(finite, m, b.scalar_like(m, 0));
  auto e = [&](Value v) { return b.unary("exponential", b.binary("subtract", v, safe)); };
  Value s = b.binary("add", b.binary("add", e(x), e(y)), e(z));
  return b.select(finite, b.binary("add", b.unary("log", s), safe), b.scalar_like(m, kNegInf));
}

// v [N, L] shifted toward higher s by k (lower positions filled with -inf), or toward lower s.
Value shift_up(Builder& b, Value v, int64_t k) {
  const auto& d = b.dims(v);
  if (k >= d[1]) return b.scalar_like(v, kNegInf);
  return b.pad(b.slice_dim(v, 1, 0, d[1] - k), b.constant(b.dtype(v), kNegInf), {0, k}, {0, 0}, {0, 0});
}
Value shift_down(Builder& b, Value v, int64_t k) {
  const auto& d = b.dims(v);
  if (k >= d[1]) return b.scalar_like(v, kNegInf);
  return b.pad(b.slice_dim(v, 1, k, d[1]), b.constant(b.dtype(v), kNegInf), {0, 0}, {0, k}, {0, 0});
}

struct Extended {
  Value labels;      // [N, L] s64: blank, l1, blank, l2, ... blank
  Value lp;          // [T, N, L] log-probability of each extended label at each time
  Value skip;        // [N, L] pred: s may be reached from s - 2
  Value label_len;   // [N, 1] s64: 2 * target_length + 1
  Value input_len;   // [N] s64
  int64_t t, n, l;
};

Extended extend(Builder& b, Value log_probs, Value targets, Value input_lengths, Value target_lengths, int64_t blank) {
  const auto& lpd = b.dims(log_probs);
  Extended e;
  e.t = lpd[0];
  e.n = lpd[1];
  int64_t s_max = b.dims(targets)[1];
  e.l = 2 * s_max + 1;
  std::vector<int64_t> nl{e.n, e.l};
  Value s = b.iota(DType::S64, nl, 1);
  Value odd = b.compare(b.binary("remainder", s, b.constant_int(DType::S64, 2, nl)), b.constant_int(DType::S64, 1, nl), "EQ");
  Value pos = b.binary("divide", s, b.constant_int(DType::S64, 2, nl));  // (s - 1) / 2 for odd s
  Value pos_clamped = b.binary("minimum", pos, b.constant_int(DType::S64, std::max<int64_t>(s_max - 1, 0), nl));
  Value tgt = s_max > 0 ? gather(b, b.convert(targets, DType::S64), 1, pos_clamped) : b.constant_int(DType::S64, blank, nl);
  e.labels = b.select(odd, tgt, b.constant_int(DType::S64, blank, nl));
  std::vector<int64_t> tnl{e.t, e.n, e.l};
  e.lp = gather(b, log_probs, 2, b.broadcast_in_dim(e.labels, tnl, {1, 2}));
  Value prev2 = b.pad(b.slice_dim(e.labels, 1, 0, std::max<int64_t>(e.l - 2, 0)), b.constant_int(DType::S64, blank), {0, 2},
                      {0, 0}, {0, 0});
  if (e.l < 2) prev2 = b.constant_int(DType::S64, blank, nl);
  e.skip = b.binary("and", b.compare(e.labels, b.constant_int(DType::S64, blank, nl), "NE"),
                    b.compare(e.labels, prev2, "NE"));
  e.skip = b.binary("and", e.skip, b.compare(s, b.constant_int(DType::S64, 2, nl), "GE"));
  Value tl = b.convert(target_lengths, DType::S64);
  e.label_len = b.reshape(b.binary("add", b.binary("multiply", tl, b.constant_int(DType::S64, 2, {e.n})),
                                   b.constant_int(DType::S64, 1, {e.n})),
                          {e.n, 1});
  e.input_len = b.convert(input_lengths, DType::S64);
  return e;
}

// history[t] for t = T_n - 1 per sequence: [N, L] (-inf when T_n == 0).
Value at_last_time(Builder& b, Value history, Value input_len, int64_t t, int64_t n, int64_t l) {
  std::vector<int64_t> tnl{t, n, l};
  Value time = b.iota(DType::S64, tnl, 0);
  Value last = b.broadcast_in_dim(b.binary("subtract", input_len, b.constant_int(DType::S64, 1, {n})), tnl, {1});
  Value picked = b.select(b.compare(time, last, "EQ"), history, b.scalar_like(history, kNegInf));
  return b.reduce_simple(picked, b.constant(b.dtype(history), kNegInf), {0}, "maximum");
}

// Entry k of v [N, L] per row (k [N, 1] s64; -inf when k < 0).
Value take_at(Builder& b, Value v, Value k) {
  const auto& d = b.dims(v);
  Value s = b.iota(DType::S64, d, 1);
  Value hit = b.compare(s, b.broadcast_in_dim(b.reshape(k, {d[0]}), d, {0}), "EQ");
  return b.reduce_simple(b.select(hit, v, b.scalar_like(v, kNegInf)), b.constant(b.dtype(v), kNegInf), {1}, "maximum");
}

}  // namespace

std::vector<Value> ctc_loss(Builder& b, Value log_probs, Value targets, Value input_lengths, Value target_lengths,
                            int64_t blank) {
  Extended e = extend(b, log_probs, targets, input_lengths, target_lengths, blank);
  std::vector<int64_t> nl{e.n, e.l}, tnl{e.t, e.n, e.l};
  DType dt = b.dtype(log_probs);
  Value s = b.iota(DType::S64, nl, 1);
  Value lp0 = b.reshape(b.slice_dim(e.lp, 0, 0, 1), nl);
  Value alpha0 = b.select(b.compare(s, b.constant_int(DType::S64, 2, nl), "LT"), lp0, b.constant(dt, kNegInf, nl));
  Value history = b.constant(dt, kNegInf, tnl);
  history = b.dynamic_update_slice(history, b.reshape(alpha0, {1, e.n, e.l}),
                                   {b.constant_int(DType::S64, 0), b.constant_int(DType::S64, 0), b.constant_int(DType::S64, 0)});
  auto out = b.while_loop(
      {b.constant_int(DType::S64, 1), alpha0, history, e.lp, e.skip},
      [t = e.t](Builder& c, const std::vector<Value>& st) { return c.compare(st[0], c.constant_int(DType::S64, t), "LT"); },
      [&](Builder& c, const std::vector<Value>& st) -> std::vector<Value> {
        Value t = st[0], alpha = st[1], hist = st[2], lp = st[3], skip = st[4];
        Value zero = c.constant_int(DType::S64, 0);
        Value lpt = c.reshape(c.dynamic_slice(lp, {t, zero, zero}, {1, e.n, e.l}), nl);
        Value from2 = c.select(skip, shift_up(c, alpha, 2), c.scalar_like(alpha, kNegInf));
        Value next = c.binary("add", log_add3(c, alpha, shift_up(c, alpha, 1), from2), lpt);
        hist = c.dynamic_update_slice(hist, c.reshape(next, {1, e.n, e.l}), {t, zero, zero});
        return {c.binary("add", t, c.constant_int(DType::S64, 1)), next, hist, lp, skip};
      });
  Value hist = out[2];
  Value final_alpha = at_last_time(b, hist, e.input_len, e.t, e.n, e.l);
  Value last = b.binary("subtract", e.label_len, b.constant_int(DType::S64, 1, {e.n, 1}));
  Value before = b.binary("subtract", e.label_len, b.constant_int(DType::S64, 2, {e.n, 1}));
  Value a = take_at(b, final_alpha, last), c2 = take_at(b, final_alpha, before);
  Value nll = b.unary("negate", log_add3(b, a, c2, b.scalar_like(a, kNegInf)));
  // No input frames: probability 1 of the empty labelling, 0 of any other.
  Value no_input = b.compare(e.input_len, b.constant_int(DType::S64, 0, {e.n}), "EQ");
  Value empty_target = b.compare(b.reshape(e.label_len, {e.n}), b.constant_int(DType::S64, 1, {e.n}), "EQ");
  nll = b.select(no_input, b.select(empty_target, b.scalar_like(nll, 0), b.scalar_like(nll, INFINITY)), nll);
  // log_alpha as CPU leaves it: -inf past each sequence's labels and frames.
  Value valid_s = b.compare(b.broadcast_in_dim(b.iota(DType::S64, nl, 1), tnl, {1, 2}),
                            b.broadcast_in_dim(b.reshape(e.label_len, {e.n}), tnl, {1}), "LT");
  Value valid_t = b.compare(b.iota(DType::S64, tnl, 0), b.broadcast_in_dim(e.input_len, tnl, {1}), "LT");
  hist = b.select(b.binary("and", valid_s, valid_t), hist, b.scalar_like(hist, kNegInf));
  return {nll, b.transpose(hist, {1, 0, 2})};
}

Value ctc_loss_backward(Builder& b, Value grad, Value log_probs, Value targets, Value input_lengths, Value target_lengths,
                        Value nll, Value log_alpha, int64_t blank, bool zero_infinity) {
  Extended e = extend(b, log_probs, targets, input_lengths, target_lengths, blank);
  std::vector<int64_t> nl{e.n, e.l}, tnl{e.t, e.n, e.l};
  DType dt = b.dtype(log_probs);
  Value s = b.iota(DType::S64, nl, 1);
  Value ll = b.broadcast_in_dim(b.reshape(e.label_len, {e.n}), nl, {0});
  Value at_end = b.binary("or", b.compare(s, b.binary("subtract", ll, b.constant_int(DType::S64, 1, nl)), "EQ"),
                          b.compare(s, b.binary("subtract", ll, b.constant_int(DType::S64, 2, nl)), "EQ"));
  // Reached from s + 2 when the label at s + 2 may skip back to s.
  Value skip_next = shift_down(b, b.convert(e.skip, dt), 2);
  Value can_skip = b.compare(skip_next, b.scalar_like(skip_next, 1), "EQ");
  Value history = b.constant(dt, kNegInf, tnl);
  Value last_frame = b.binary("subtract", e.input_len, b.constant_int(DType::S64, 1, {e.n}));
  auto out = b.while_loop(
      {b.constant_int(DType::S64, e.t - 1), b.constant(dt, kNegInf, nl), history, e.lp, can_skip, at_end, last_frame},
      [](Builder& c, const std::vector<Value>& st) { return c.compare(st[0], c.constant_int(DType::S64, 0), "GE"); },
      [&](Builder& c, const std::vector<Value>& st) -> std::vector<Value> {
        Value t = st[0], beta = st[1], hist = st[2], lp = st[3], skip = st[4], end = st[5], lastf = st[6];
        Value zero = c.constant_int(DType::S64, 0);
        Value lpt = c.reshape(c.dynamic_slice(lp, {t, zero, zero}, {1, e.n, e.l}), nl);
        Value from2 = c.select(skip, shift_down(c, beta, 2), c.scalar_like(beta, kNegInf));
        Value rec = c.binary("add", log_add3(c, beta, shift_down(c, beta, 1), from2), lpt);
        Value init = c.select(end, lpt, c.scalar_like(lpt, kNegInf));
        Value lastb = c.broadcast_in_dim(lastf, nl, {0});
        Value tb = c.broadcast_to(t, nl);
        Value next = c.select(c.compare(tb, lastb, "EQ"), init,
                              c.select(c.compare(tb, lastb, "LT"), rec, c.scalar_like(rec, kNegInf)));
        hist = c.dynamic_update_slice(hist, c.reshape(next, {1, e.n, e.l}), {t, zero, zero});
        return {c.binary("subtract", t, c.constant_int(DType::S64, 1)), next, hist, lp, skip, end, lastf};
      });
  Value log_beta = out[2];  // [T, N, L]
  Value la = b.transpose(log_alpha, {1, 0, 2});
  Value ab = b.binary("add", la, log_beta);
  // log sum over the extended positions carrying each class: scattered in a shifted linear scale.
  Value m = b.reduce_simple(ab, b.constant(dt, kNegInf), {2}, "maximum");  // [T, N]
  Value finite = b.compare(m, b.scalar_like(m, kNegInf), "NE");
  Value safe_m = b.select(finite, m, b.scalar_like(m, 0));
  Value scaled = b.unary("exponential", b.binary("subtract", ab, b.broadcast_in_dim(safe_m, tnl, {0, 1})));
  const auto& lpd = b.dims(log_probs);
  int64_t classes = lpd[2];
  Value sums = scatter(b, b.constant(dt, 0, {e.t, e.n, classes}), 2, b.broadcast_in_dim(e.labels, tnl, {1, 2}), scaled, "add");
  std::vector<int64_t> tnc{e.t, e.n, classes};
  Value lcab = b.binary("add", b.unary("log", sums), b.broadcast_in_dim(safe_m, tnc, {0, 1}));
  Value nll_b = b.broadcast_in_dim(nll, tnc, {1});
  Value g = b.binary("subtract", b.unary("exponential", log_probs),
                     b.unary("exponential", b.binary("subtract", b.binary("add", lcab, nll_b), log_probs)));
  g = b.binary("multiply", g, b.broadcast_in_dim(b.convert(grad, dt), tnc, {1}));
  Value in_time = b.compare(b.iota(DType::S64, tnc, 0), b.broadcast_in_dim(e.input_len, tnc, {1}), "LT");
  Value keep = in_time;
  if (zero_infinity) keep = b.binary("and", keep, b.compare(nll_b, b.scalar_like(nll_b, INFINITY), "NE"));
  return b.select(keep, g, b.scalar_like(g, 0));
}

}  // namespace torch_pjrt::lowering
