// grid_sampler_2d (torch.nn.functional.grid_sample on 4-d inputs): source
// coordinates from the grid (unnormalized, then padded by clipping or
// reflection), taps gathered from the flattened image, weighted; backward
// scatters the weighted gradient to the taps and differentiates the weights
// for the grid.
#include <cmath>
#include <stdexcept>

#include "lowering/nn.h"
#include "lowering/ops.h"

namespace torch_pjrt::lowering {
namespace {

struct Axis {
  int64_t size;
  bool align;
  int64_t padding;  // 0 zeros, 1 border, 2 reflection
};

Value cst(Builder& b, Value like, double v) { return b.scalar_like(like, v); }

// [-1, 1] -> pixel coordinates; also d(result)/d(g).
Value unnormalize(Builder& b, Value g, const Axis& a, double* slope) {
  if (a.align) {
    *slope = (a.size - 1) / 2.0;
    return b.binary("multiply", b.binary("add", g, cst(b, g, 1)), cst(b, g, *slope));
  }
  *slope = a.size / 2.0;
  return b.binary("divide", b.binary("subtract", b.binary("multiply", b.binary("add", g, cst(b, g, 1)), cst(b, g, a.size)),
                                     cst(b, g, 1)),
                  cst(b, g, 2));
}

// Clipped into [0, size - 1]; grad_scale *= 0 where clipped.
Value clip(Builder& b, Value x, int64_t size, Value* grad_scale) {
  Value lo = cst(b, x, 0), hi = cst(b, x, size - 1);
  if (grad_scale) {
    Value inside = b.binary("and", b.compare(x, lo, "GT"), b.compare(x, hi, "LT"));
    *grad_scale = b.select(inside, *grad_scale, cst(b, x, 0));
  }
  return b.binary("minimum", b.binary("maximum", x, lo), hi);
}

// Reflects x into [twice_low / 2, twice_high / 2]; grad_scale flips sign on odd reflections.
Value reflect(Builder& b, Value x, int64_t twice_low, int64_t twice_high, Value* grad_scale) {
  if (twice_low == twice_high) {
    if (grad_scale) *grad_scale = cst(b, x, 0);
    return cst(b, x, 0);
  }
  double min = twice_low / 2.0, span = (twice_high - twice_low) / 2.0;
  Value d = b.binary("subtract", x, cst(b, x, min));
  Value neg = b.compare(d, cst(b, x, 0), "LT");
  d = b.unary("abs", d);
  Value extra = b.binary("remainder", d, cst(b, x, span));
  Value flips = b.unary("floor", b.binary("divide", d, cst(b, x, span)));
  Value even = b.compare(b.binary("remainder", flips, cst(b, x, 2)), cst(b, x, 0), "EQ");
  Value r = b.select(even, b.binary("add", extra, cst(b, x, min)),
                     b.binary("add", b.binary("subtract", cst(b, x, span), extra), cst(b, x, min)));
  if (grad_scale) {
    Value sign = b.select(neg, cst(b, x, -1), cst(b, x, 1));
    sign = b.select(even, sign, b.unary("negate", sign));
    *grad_scale = b.binary("multiply", *grad_scale, sign);
  }
  return r;
}

// Padding applied to a source coordinate.
Value pad_coordinate(Builder& b, Value x, const Axis& a, Value* grad_scale) {
  if (a.padding == 1) return clip(b, x, a.size, grad_scale);
  if (a.padding == 2) {
    x = a.align ? reflect(b, x, 0, 2 * (a.size - 1), grad_scale) : reflect(b, x, -1, 2 * a.size - 1, grad_scale);
    return clip(b, x, a.size, grad_scale);
  }
  return x;
}

struct Image {
  Value flat;  // [N, C, H * W]
  int64_t n, c, h, w;
};

// Value of the taps at integer coordinates (x, y) [N, P] (0 outside), as [N, C, P]; also
// the flat index and validity for the backward scatter.
struct Tap {
  Value index;  // [N, C, P] s64
  Value valid;  // [N, 1 -> C, P] pred
};
Tap tap_of(Builder& b, const Image& im, Value x, Value y) {
  std::vector<int64_t> np = b.dims(x);  // [N, P]
  Value valid = b.binary("and", b.binary("and", b.compare(x, cst(b, x, 0), "GE"), b.compare(x, cst(b, x, im.w - 1), "LE")),
                         b.binary("and", b.compare(y, cst(b, y, 0), "GE"), b.compare(y, cst(b, y, im.h - 1), "LE")));
  Value xi = b.convert(b.binary("minimum", b.binary("maximum", x, cst(b, x, 0)), cst(b, x, im.w - 1)), DType::S64);
  Value yi = b.convert(b.binary("minimum", b.binary("maximum", y, cst(b, y, 0)), cst(b, y, im.h - 1)), DType::S64);
  Value idx = b.binary("add", b.binary("multiply", yi, b.constant_int(DType::S64, im.w, np)), xi);
  std::vector<int64_t> ncp{im.n, im.c, np[1]};
  return {b.broadcast_in_dim(idx, ncp, {0, 2}), b.broadcast_in_dim(valid, ncp, {0, 2})};
}
Value read(Builder& b, const Image& im, const Tap& t) {
  Value v = gather(b, im.flat, 2, t.index);
  return b.select(t.valid, v, b.scalar_like(v, 0));
}

Value bcast_np(Builder& b, Value v, const Image& im) {  // [N, P] -> [N, C, P]
  std::vector<int64_t> np = b.dims(v);
  return b.broadcast_in_dim(v, {im.n, im.c, np[1]}, {0, 2});
}

// Cubic convolution weights (A = -0.75) of the 4 taps around t in [0, 1).
std::vector<Value> cubic_weights(Builder& b, Value t) {
  const double A = -0.75;
  auto cc1 = [&](Value x) {  // |x| <= 1
    Value p = b.binary("subtract", b.binary("multiply", cst(b, x, A + 2), x), cst(b, x, A + 3));
    return b.binary("add", b.binary("multiply", b.binary("multiply", p, x), x), cst(b, x, 1));
  };
  auto cc2 = [&](Value x) {  // 1 < |x| < 2
    Value p = b.binary("subtract", b.binary("multiply", cst(b, x, A), x), cst(b, x, 5 * A));
    p = b.binary("add", b.binary("multiply", p, x), cst(b, x, 8 * A));
    return b.binary("subtract", b.binary("multiply", p, x), cst(b, x, 4 * A));
  };
  Value one = cst(b, t, 1);
  return {cc2(b.binary("add", t, one)), cc1(t), cc1(b.binary("subtract", one, t)), cc2(b.binary("subtract", cst(b, t, 2), t))};
}

struct Setup {
  Image im;
  Axis ax, ay;
  Value gx, gy;  // [N, P] grid coordinates in [-1, 1]
  int64_t ho, wo;
};
Setup setup(Builder& b, Value input, Value grid, int64_t padding, bool align) {
  const auto& in = b.dims(input);
  const auto& gd = b.dims(grid);
  Setup s;
  s.im = {b.reshape(input, {in[0], in[1], in[2] * in[3]}), in[0], in[1], in[2], in[3]};
  s.ho = gd[1];
  s.wo = gd[2];
  int64_t p = s.ho * s.wo;
  Value g = b.reshape(b.convert(grid, b.dtype(input)), {gd[0], p, 2});
  s.gx = b.reshape(b.slice_dim(g, 2, 0, 1), {gd[0], p});
  s.gy = b.reshape(b.slice_dim(g, 2, 1, 2), {gd[0], p});
  s.ax = {in[3], align, padding};
  s.ay = {in[2], align, padding};
  return s;
}

}  // namespace

Value grid_sample_2d(Builder& b, Value input, Value grid, int64_t mode, int64_t padding, bool align) {
  Setup s = setup(b, input, grid, padding, align);
  const Image& im = s.im;
  double sx, sy;
  Value x = unnormalize(b, s.gx, s.ax, &sx), y = unnormalize(b, s.gy, s.ay, &sy);
  Value out;
  if (mode == 2) {  // bicubic: taps padded one by one
    Value x0 = b.unary("floor", x), y0 = b.unary("floor", y);
    auto wx = cubic_weights(b, b.binary("subtract", x, x0)), wy = cubic_weights(b, b.binary("subtract", y, y0));
    for (int i = 0; i < 4; ++i) {
      Value row;
      Value yi = pad_coordinate(b, b.binary("add", y0, cst(b, y0, i - 1)), s.ay, nullptr);
      for (int j = 0; j < 4; ++j) {
        Value xj = pad_coordinate(b, b.binary("add", x0, cst(b, x0, j - 1)), s.ax, nullptr);
        Value v = b.binary("multiply", read(b, im, tap_of(b, im, xj, yi)), bcast_np(b, wx[j], im));
        row = row.valid() ? b.binary("add", row, v) : v;
      }
      Value v = b.binary("multiply", row, bcast_np(b, wy[i], im));
      out = out.valid() ? b.binary("add", out, v) : v;
    }
  } else {
    x = pad_coordinate(b, x, s.ax, nullptr);
    y = pad_coordinate(b, y, s.ay, nullptr);
    if (mode == 1) {  // nearest (ties to even, as nearbyint)
      out = read(b, im, tap_of(b, im, b.unary("round_nearest_even", x), b.unary("round_nearest_even", y)));
    } else {  // bilinear
      Value x0 = b.unary("floor", x), y0 = b.unary("floor", y);
      Value x1 = b.binary("add", x0, cst(b, x0, 1)), y1 = b.binary("add", y0, cst(b, y0, 1));
      Value fx = b.binary("subtract", x, x0), fy = b.binary("subtract", y, y0);
      Value gx1 = b.binary("subtract", cst(b, fx, 1), fx), gy1 = b.binary("subtract", cst(b, fy, 1), fy);
      auto term = [&](Value tx, Value ty, Value w) {
        return b.binary("multiply", read(b, im, tap_of(b, im, tx, ty)), bcast_np(b, w, im));
      };
      out = b.binary("add", b.binary("add", term(x0, y0, b.binary("multiply", gx1, gy1)), term(x1, y0, b.binary("multiply", fx, gy1))),
                     b.binary("add", term(x0, y1, b.binary("multiply", gx1, fy)), term(x1, y1, b.binary("multiply", fx, fy))));
    }
  }
  return b.reshape(out, {im.n, im.c, s.ho, s.wo});
}

std::vector<Value> grid_sample_2d_backward(Builder& b, Value grad, Value input, Value grid, int64_t mode, int64_t padding,
                                           bool align) {
  if (mode == 2) throw std::invalid_argument("grid_sample_2d_backward: bicubic has no lowering");
  Setup s = setup(b, input, grid, padding, align);
  const Image& im = s.im;
  int64_t p = s.ho * s.wo;
  Value g = b.reshape(b.convert(grad, b.dtype(input)), {im.n, im.c, p});
  double sx, sy;
  Value x = unnormalize(b, s.gx, s.ax, &sx), y = unnormalize(b, s.gy, s.ay, &sy);
  Value kx = b.broadcast_to(cst(b, x, sx), b.dims(x)), ky = b.broadcast_to(cst(b, y, sy), b.dims(y));
  x = pad_coordinate(b, x, s.ax, &kx);
  y = pad_coordinate(b, y, s.ay, &ky);
  Value grad_input = b.constant(b.dtype(input), 0, {im.n, im.c, im.h * im.w});
  auto scatter_tap = [&](const Tap& t, Value w) {
    Value contrib = b.binary("multiply", g, bcast_np(b, w, im));
    contrib = b.select(t.valid, contrib, b.scalar_like(contrib, 0));
    grad_input = scatter(b, grad_input, 2, t.index, contrib, "add");
  };
  Value grad_grid;
  if (mode == 1) {
    scatter_tap(tap_of(b, im, b.unary("round_nearest_even", x), b.unary("round_nearest_even", y)), cst(b, x, 1));
    grad_grid = b.constant(b.dtype(input), 0, {im.n, s.ho, s.wo, 2});
  } else {
    Value x0 = b.unary("floor", x), y0 = b.unary("floor", y);
    Value x1 = b.binary("add", x0, cst(b, x0, 1)), y1 = b.binary("add", y0, cst(b, y0, 1));
    Value fx = b.binary("subtract", x, x0), fy = b.binary("subtract", y, y0);
    Value gx1 = b.binary("subtract", cst(b, fx, 1), fx), gy1 = b.binary("subtract", cst(b, fy, 1), fy);
    Tap nw = tap_of(b, im, x0, y0), ne = tap_of(b, im, x1, y0), sw = tap_of(b, im, x0, y1), se = tap_of(b, im, x1, y1);
    scatter_tap(nw, b.binary("multiply", gx1, gy1));
    scatter_tap(ne, b.binary("multiply", fx, gy1));
    scatter_tap(sw, b.binary("multiply", gx1, fy));
    scatter_tap(se, b.binary("multiply", fx, fy));
    // d out / d x and d y, summed over channels against the incoming gradient.
    auto gv = [&](const Tap& t) { return b.binary("multiply", read(b, im, t), g); };
    Value vnw = gv(nw), vne = gv(ne), vsw = gv(sw), vse = gv(se);
    auto mul = [&](Value v, Value w) { return b.binary("multiply", v, bcast_np(b, w, im)); };
    Value dx = b.binary("add", b.binary("subtract", mul(vne, gy1), mul(vnw, gy1)), b.binary("subtract", mul(vse, fy), mul(vsw, fy)));
    Value dy = b.binary("add", b.binary("subtract", mul(vsw, gx1), mul(vnw, gx1)), b.binary("subtract", mul(vse, fx), mul(vne, fx)));
    dx = b.binary("multiply", b.reduce_simple(dx, b.constant(b.dtype(dx), 0), {1}, "add"), kx);
    dy = b.binary("multiply", b.reduce_simple(dy, b.constant(b.dtype(dy), 0), {1}, "add"), ky);
    grad_grid = b.reshape(b.concatenate({b.reshape(dx, {im.n, p, 1}), b.reshape(dy, {im.n, p, 1})}, 2), {im.n, s.ho, s.wo, 2});
  }
  return {b.reshape(grad_input, {im.n, im.c, im.h, im.w}), grad_grid};
}

}  // namespace torch_pjrt::lowering
