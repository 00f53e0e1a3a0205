// grid_sampler_2d/3d (torch.nn.functional.grid_sample on 4-d and 5-d inputs):
// source coordinates from the grid (unnormalized, then padded by clipping or
// reflection), taps gathered from the flattened image, weighted; backward
// scatters the weighted gradient to the taps and differentiates the weights
// for the grid. Bicubic is 2-d only, as in torch.
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
  Value flat;                   // [N, C, prod(spatial)]
  int64_t n, c;
  std::vector<int64_t> size;    // spatial sizes in the grid's component order (x: W, y: H, z: D)
  std::vector<int64_t> stride;  // their strides in `flat`
};

// Value of the taps at integer coordinates (one [N, P] per grid component; 0 outside), as
// [N, C, P]; also the flat index and validity for the backward scatter.
struct Tap {
  Value index;  // [N, C, P] s64
  Value valid;  // [N, C, P] pred
};
Tap tap_of(Builder& b, const Image& im, const std::vector<Value>& coords) {
  std::vector<int64_t> np = b.dims(coords[0]);  // [N, P]
  Value valid, idx;
  for (size_t k = 0; k < coords.size(); ++k) {
    Value x = coords[k];
    int64_t last = im.size[k] - 1;
    Value inside = b.binary("and", b.compare(x, cst(b, x, 0), "GE"), b.compare(x, cst(b, x, last), "LE"));
    Value xi = b.convert(b.binary("minimum", b.binary("maximum", x, cst(b, x, 0)), cst(b, x, last)), DType::S64);
    Value term = b.binary("multiply", xi, b.constant_int(DType::S64, im.stride[k], np));
    valid = valid.valid() ? b.binary("and", valid, inside) : inside;
    idx = idx.valid() ? b.binary("add", idx, term) : term;
  }
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
// Their derivatives with respect to t.
std::vector<Value> cubic_weight_slopes(Builder& b, Value t) {
  const double A = -0.75;
  auto dc1 = [&](Value x) {  // d/dx of ((A + 2) x - (A + 3)) x^2 + 1
    return b.binary("multiply", b.binary("subtract", b.binary("multiply", cst(b, x, 3 * (A + 2)), x), cst(b, x, 2 * (A + 3))), x);
  };
  auto dc2 = [&](Value x) {  // d/dx of ((A x - 5 A) x + 8 A) x - 4 A
    Value p = b.binary("subtract", b.binary("multiply", cst(b, x, 3 * A), x), cst(b, x, 10 * A));
    return b.binary("add", b.binary("multiply", p, x), cst(b, x, 8 * A));
  };
  Value one = cst(b, t, 1);
  return {dc2(b.binary("add", t, one)), dc1(t), b.unary("negate", dc1(b.binary("subtract", one, t))),
          b.unary("negate", dc2(b.binary("subtract", cst(b, t, 2), t)))};
}

struct Setup {
  Image im;
  std::vector<Axis> axes;            // per grid component
  std::vector<Value> g;              // [N, P] grid coordinates in [-1, 1], per component
  std::vector<int64_t> out_spatial;  // the grid's spatial dims
};
Setup setup(Builder& b, Value input, Value grid, int64_t padding, bool align) {
  const auto& in = b.dims(input);
  const auto& gd = b.dims(grid);
  int64_t spatial = static_cast<int64_t>(in.size()) - 2;
  Setup s;
  int64_t total = 1, p = 1;
  for (int64_t d = 2; d < 2 + spatial; ++d) total *= in[d];
  s.im = {b.reshape(input, {in[0], in[1], total}), in[0], in[1], {}, {}};
  int64_t stride = 1;
  for (int64_t k = 0; k < spatial; ++k) {  // component k indexes the k-th spatial dim from the last
    int64_t size = in[1 + spatial - k];
    s.im.size.push_back(size);
    s.im.stride.push_back(stride);
    s.axes.push_back({size, align, padding});
    stride *= size;
  }
  s.out_spatial.assign(gd.begin() + 1, gd.end() - 1);
  for (int64_t d : s.out_spatial) p *= d;
  Value g = b.reshape(b.convert(grid, b.dtype(input)), {gd[0], p, spatial});
  for (int64_t k = 0; k < spatial; ++k) s.g.push_back(b.reshape(b.slice_dim(g, 2, k, k + 1), {gd[0], p}));
  return s;
}

// The 2^S corners around x (S components): each corner takes floor(x_k) or floor(x_k) + 1
// per component, weighted by the product of (1 - f_k) or f_k.
struct Corner {
  std::vector<Value> coords;
  std::vector<Value> weights;  // per component
  std::vector<bool> upper;
};
std::vector<Corner> corners(Builder& b, const std::vector<Value>& x) {
  size_t n = x.size();
  std::vector<Value> lo, frac, rest;
  for (Value v : x) {
    Value f = b.unary("floor", v);
    lo.push_back(f);
    frac.push_back(b.binary("subtract", v, f));
    rest.push_back(b.binary("subtract", cst(b, v, 1), frac.back()));
  }
  std::vector<Corner> out;
  for (size_t mask = 0; mask < (size_t{1} << n); ++mask) {
    Corner c;
    for (size_t k = 0; k < n; ++k) {
      bool up = (mask >> k) & 1;
      c.coords.push_back(up ? b.binary("add", lo[k], cst(b, lo[k], 1)) : lo[k]);
      c.weights.push_back(up ? frac[k] : rest[k]);
      c.upper.push_back(up);
    }
    out.push_back(std::move(c));
  }
  return out;
}
Value product_except(Builder& b, const std::vector<Value>& w, size_t skip) {
  Value r;
  for (size_t k = 0; k < w.size(); ++k) {
    if (k == skip) continue;
    r = r.valid() ? b.binary("multiply", r, w[k]) : w[k];
  }
  return r.valid() ? r : cst(b, w[0], 1);
}

std::vector<int64_t> image_shape(const Setup& s) {
  std::vector<int64_t> shape{s.im.n, s.im.c};
  shape.insert(shape.end(), s.out_spatial.begin(), s.out_spatial.end());
  return shape;
}

}  // namespace

Value grid_sample(Builder& b, Value input, Value grid, int64_t mode, int64_t padding, bool align) {
  Setup s = setup(b, input, grid, padding, align);
  const Image& im = s.im;
  size_t spatial = s.axes.size();
  std::vector<Value> x;
  for (size_t k = 0; k < spatial; ++k) {
    double slope;
    x.push_back(unnormalize(b, s.g[k], s.axes[k], &slope));
  }
  Value out;
  if (mode == 2) {  // bicubic (2-d only): taps padded one by one
    if (spatial != 2) throw std::invalid_argument("grid_sample: bicubic interpolation only supports 2 spatial dims");
    Value x0 = b.unary("floor", x[0]), y0 = b.unary("floor", x[1]);
    auto wx = cubic_weights(b, b.binary("subtract", x[0], x0)), wy = cubic_weights(b, b.binary("subtract", x[1], y0));
    for (int i = 0; i < 4; ++i) {
      Value row;
      Value yi = pad_coordinate(b, b.binary("add", y0, cst(b, y0, i - 1)), s.axes[1], nullptr);
      for (int j = 0; j < 4; ++j) {
        Value xj = pad_coordinate(b, b.binary("add", x0, cst(b, x0, j - 1)), s.axes[0], nullptr);
        Value v = b.binary("multiply", read(b, im, tap_of(b, im, {xj, yi})), bcast_np(b, wx[j], im));
        row = row.valid() ? b.binary("add", row, v) : v;
      }
      Value v = b.binary("multiply", row, bcast_np(b, wy[i], im));
      out = out.valid() ? b.binary("add", out, v) : v;
    }
  } else {
    for (size_t k = 0; k < spatial; ++k) x[k] = pad_coordinate(b, x[k], s.axes[k], nullptr);
    if (mode == 1) {  // nearest (ties to even, as nearbyint)
      std::vector<Value> r;
      for (Value v : x) r.push_back(b.unary("round_nearest_even", v));
      out = read(b, im, tap_of(b, im, r));
    } else {  // (bi/tri)linear
      for (const Corner& c : corners(b, x)) {
        Value w = product_except(b, c.weights, spatial);
        Value v = b.binary("multiply", read(b, im, tap_of(b, im, c.coords)), bcast_np(b, w, im));
        out = out.valid() ? b.binary("add", out, v) : v;
      }
    }
  }
  return b.reshape(out, image_shape(s));
}

std::vector<Value> grid_sample_backward(Builder& b, Value grad, Value input, Value grid, int64_t mode, int64_t padding,
                                        bool align) {
  Setup s = setup(b, input, grid, padding, align);
  const Image& im = s.im;
  size_t spatial = s.axes.size();
  int64_t p = b.dims(s.g[0])[1];
  Value g = b.reshape(b.convert(grad, b.dtype(input)), {im.n, im.c, p});
  // Linear and nearest: padded coordinates and d(coordinate)/d(grid component), the
  // unnormalizing slope through the padding (bicubic pads each tap instead).
  std::vector<Value> x, scale;
  for (size_t k = 0; k < spatial && mode != 2; ++k) {
    double slope;
    Value v = unnormalize(b, s.g[k], s.axes[k], &slope);
    Value kx = b.broadcast_to(cst(b, v, slope), b.dims(v));
    x.push_back(pad_coordinate(b, v, s.axes[k], &kx));
    scale.push_back(kx);
  }
  Value grad_input = b.constant(b.dtype(input), 0, {im.n, im.c, b.dims(im.flat)[2]});
  auto scatter_tap = [&](const Tap& t, Value w) {
    Value contrib = b.binary("multiply", g, bcast_np(b, w, im));
    contrib = b.select(t.valid, contrib, b.scalar_like(contrib, 0));
    grad_input = scatter(b, grad_input, 2, t.index, contrib, "add");
  };
  std::vector<int64_t> grid_shape{im.n};
  grid_shape.insert(grid_shape.end(), s.out_spatial.begin(), s.out_spatial.end());
  grid_shape.push_back(static_cast<int64_t>(spatial));
  Value grad_grid;
  if (mode == 2) {
    // Bicubic (2-d): 16 taps, each padded on its own; the grid gradient differentiates the
    // cubic weights (the padding is piecewise constant there), times the unnormalizing slope.
    if (spatial != 2) throw std::invalid_argument("grid_sample_backward: bicubic interpolation only supports 2 spatial dims");
    double sx, sy;
    Value ux = unnormalize(b, s.g[0], s.axes[0], &sx), uy = unnormalize(b, s.g[1], s.axes[1], &sy);
    Value x0 = b.unary("floor", ux), y0 = b.unary("floor", uy);
    Value tx = b.binary("subtract", ux, x0), ty = b.binary("subtract", uy, y0);
    auto wx = cubic_weights(b, tx), wy = cubic_weights(b, ty);
    auto dwx = cubic_weight_slopes(b, tx), dwy = cubic_weight_slopes(b, ty);
    Value dx, dy;
    for (int i = 0; i < 4; ++i) {
      Value yi = pad_coordinate(b, b.binary("add", y0, cst(b, y0, i - 1)), s.axes[1], nullptr);
      for (int j = 0; j < 4; ++j) {
        Value xj = pad_coordinate(b, b.binary("add", x0, cst(b, x0, j - 1)), s.axes[0], nullptr);
        Tap t = tap_of(b, im, {xj, yi});
        scatter_tap(t, b.binary("multiply", wx[j], wy[i]));
        Value v = b.binary("multiply", read(b, im, t), g);
        Value tdx = b.binary("multiply", v, bcast_np(b, b.binary("multiply", dwx[j], wy[i]), im));
        Value tdy = b.binary("multiply", v, bcast_np(b, b.binary("multiply", wx[j], dwy[i]), im));
        dx = dx.valid() ? b.binary("add", dx, tdx) : tdx;
        dy = dy.valid() ? b.binary("add", dy, tdy) : tdy;
      }
    }
    Value gx = b.binary("multiply", b.reduce_simple(dx, b.constant(b.dtype(dx), 0), {1}, "add"), cst(b, s.g[0], sx));
    Value gy = b.binary("multiply", b.reduce_simple(dy, b.constant(b.dtype(dy), 0), {1}, "add"), cst(b, s.g[1], sy));
    grad_grid = b.reshape(b.concatenate({b.reshape(gx, {im.n, p, 1}), b.reshape(gy, {im.n, p, 1})}, 2), grid_shape);
  } else if (mode == 1) {
    std::vector<Value> r;
    for (Value v : x) r.push_back(b.unary("round_nearest_even", v));
    scatter_tap(tap_of(b, im, r), cst(b, x[0], 1));
    grad_grid = b.constant(b.dtype(input), 0, grid_shape);
  } else {
    // d out / d x_k: each corner's value (against the incoming gradient) times +-1 for its side
    // of component k, times the other components' weights; summed over channels.
    std::vector<Value> d(spatial);
    for (const Corner& c : corners(b, x)) {
      Tap t = tap_of(b, im, c.coords);
      scatter_tap(t, product_except(b, c.weights, spatial));
      Value v = b.binary("multiply", read(b, im, t), g);
      for (size_t k = 0; k < spatial; ++k) {
        Value term = b.binary("multiply", v, bcast_np(b, product_except(b, c.weights, k), im));
        if (!c.upper[k]) term = b.unary("negate", term);
        d[k] = d[k].valid() ? b.binary("add", d[k], term) : term;
      }
    }
    std::vector<Value> parts;
    for (size_t k = 0; k < spatial; ++k) {
      Value dk = b.binary("multiply", b.reduce_simple(d[k], b.constant(b.dtype(d[k]), 0), {1}, "add"), scale[k]);
      parts.push_back(b.reshape(dk, {im.n, p, 1}));
    }
    grad_grid = b.reshape(b.concatenate(parts, 2), grid_shape);
  }
  return {b.reshape(grad_input, [&] {
            std::vector<int64_t> shape{im.n, im.c};
            const auto& in = b.dims(input);
            shape.insert(shape.end(), in.begin() + 2, in.end());
            return shape;
          }()),
          grad_grid};
}

}  // namespace torch_pjrt::lowering
