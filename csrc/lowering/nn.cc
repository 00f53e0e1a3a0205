#include "lowering/nn.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace torch_pjrt::lowering {
namespace {

std::vector<int64_t> range(int64_t from, int64_t to) {
  std::vector<int64_t> r;
  for (int64_t i = from; i < to; ++i) r.push_back(i);
  return r;
}

std::vector<int64_t> tail(const std::vector<int64_t>& v, size_t n) {
  return std::vector<int64_t>(v.end() - static_cast<int64_t>(n), v.end());
}

int64_t product(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{1}, std::multiplies<>());
}

// "[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]" for n spatial dims.
std::string conv_dims(const std::string& lhs, const std::string& rhs, const std::string& out, size_t n) {
  std::string sp;
  for (size_t i = 0; i < n; ++i) sp += ", " + std::to_string(i);
  return "[" + lhs + sp + "]x[" + rhs + sp + "]->[" + out + sp + "]";
}

// Per-channel vector [C] broadcast along dim 1 of `dims`.
Value channel(Builder& b, Value v, const std::vector<int64_t>& dims) { return b.broadcast_in_dim(v, dims, {1}); }

Value logical(Builder& b, const char* op, Value x, Value y) { return b.binary(op, x, y); }

}  // namespace

// ---------------------------------------------------------------- convolution

std::vector<int64_t> conv_output_size(const std::vector<int64_t>& in, const std::vector<int64_t>& k,
                                      const ConvParams& p) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < in.size(); ++i) {
    out.push_back((in[i] + 2 * p.padding[i] - p.dilation[i] * (k[i] - 1) - 1) / p.stride[i] + 1);
  }
  return out;
}

Value conv_forward(Builder& b, Value x, Value w, const ConvParams& p) {
  const auto& xd = b.dims(x);
  const auto& wd = b.dims(w);
  size_t n = xd.size() - 2;
  auto out_sp = conv_output_size(tail(xd, n), tail(wd, n), p);
  std::vector<std::pair<int64_t, int64_t>> pads;
  for (size_t i = 0; i < n; ++i) pads.emplace_back(p.padding[i], p.padding[i]);
  std::vector<int64_t> result{xd[0], wd[0]};
  result.insert(result.end(), out_sp.begin(), out_sp.end());
  return b.convolution(x, w, conv_dims("b, f", "o, i", "b, f", n), p.stride, pads, std::vector<int64_t>(n, 1),
                       p.dilation, p.groups, 1, result, b.dtype(x));
}

Value conv_input_grad(Builder& b, Value grad, Value w, const ConvParams& p, const std::vector<int64_t>& in_sp) {
  const auto& gd = b.dims(grad);
  std::vector<int64_t> wd = b.dims(w);
  size_t n = gd.size() - 2;
  int64_t g = p.groups, cout = wd[0], per_group_in = wd[1];
  auto k = tail(wd, n);
  Value wt = w;
  if (g > 1) {
    // [Cout, I, K] -> [Cout/g, g*I, K]: each group's output channels become input features.
    std::vector<int64_t> split{g, cout / g, per_group_in};
    split.insert(split.end(), k.begin(), k.end());
    wt = b.reshape(w, split);
    std::vector<int64_t> perm{1, 0};
    for (int64_t i = 2; i < static_cast<int64_t>(split.size()); ++i) perm.push_back(i);
    wt = b.transpose(wt, perm);
    std::vector<int64_t> merged{cout / g, g * per_group_in};
    merged.insert(merged.end(), k.begin(), k.end());
    wt = b.reshape(wt, merged);
  }
  wt = b.reverse(wt, range(2, 2 + static_cast<int64_t>(n)));
  std::vector<std::pair<int64_t, int64_t>> pads;
  for (size_t i = 0; i < n; ++i) {
    int64_t ke = p.dilation[i] * (k[i] - 1) + 1, o = gd[2 + i];
    pads.emplace_back(ke - 1 - p.padding[i], in_sp[i] - (o - 1) * p.stride[i] - 1 + p.padding[i]);
  }
  std::vector<int64_t> result{gd[0], g * per_group_in};
  result.insert(result.end(), in_sp.begin(), in_sp.end());
  return b.convolution(grad, wt, conv_dims("b, f", "i, o", "b, f", n), std::vector<int64_t>(n, 1), pads, p.stride,
                       p.dilation, g, 1, result, b.dtype(grad));
}

Value conv_weight_grad(Builder& b, Value x, Value grad, const ConvParams& p, const std::vector<int64_t>& k) {
  const auto& xd = b.dims(x);
  const auto& gd = b.dims(grad);
  size_t n = xd.size() - 2;
  std::vector<std::pair<int64_t, int64_t>> pads;
  for (size_t i = 0; i < n; ++i) {
    int64_t ke = p.dilation[i] * (k[i] - 1) + 1, o = gd[2 + i], s = xd[2 + i];
    pads.emplace_back(p.padding[i], ((o - 1) * p.stride[i] + 1) - s + (ke - p.padding[i] - 1));
  }
  // Batch becomes the contracted feature; input channels are split into `groups` batch groups.
  std::vector<int64_t> result{gd[1], xd[1] / p.groups};
  result.insert(result.end(), k.begin(), k.end());
  return b.convolution(x, grad, conv_dims("f, b", "i, o", "f, b", n), p.dilation, pads, std::vector<int64_t>(n, 1),
                       p.stride, 1, p.groups, result, b.dtype(x));
}

// ---------------------------------------------------------------- pooling

std::vector<int64_t> pool_output_size(const std::vector<int64_t>& in, const PoolParams& p) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < in.size(); ++i) {
    int64_t d = p.dilation.empty() ? 1 : p.dilation[i];
    int64_t num = in[i] + 2 * p.padding[i] - d * (p.kernel[i] - 1) - 1 + (p.ceil_mode ? p.stride[i] - 1 : 0);
    int64_t o = (num >= 0 ? num / p.stride[i] : -((-num + p.stride[i] - 1) / p.stride[i])) + 1;
    // The last window must start inside the input or the left padding.
    if (p.ceil_mode && (o - 1) * p.stride[i] >= in[i] + p.padding[i]) --o;
    out.push_back(o);
  }
  return out;
}

namespace {
Builder::Window pool_window(const std::vector<int64_t>& xd, const PoolParams& p) {
  size_t n = p.kernel.size(), lead = xd.size() - n;
  auto in = tail(xd, n);
  auto out = pool_output_size(in, p);
  Builder::Window w;
  w.dims.assign(lead, 1);
  w.strides.assign(lead, 1);
  w.window_dilations.assign(lead, 1);
  w.padding.assign(lead, {0, 0});
  for (size_t i = 0; i < n; ++i) {
    int64_t d = p.dilation.empty() ? 1 : p.dilation[i];
    w.dims.push_back(p.kernel[i]);
    w.strides.push_back(p.stride[i]);
    w.window_dilations.push_back(d);
    int64_t high = (out[i] - 1) * p.stride[i] + d * (p.kernel[i] - 1) + 1 - in[i] - p.padding[i];
    w.padding.emplace_back(p.padding[i], std::max<int64_t>(high, 0));
  }
  return w;
}

// Divisor of each average-pooling window (host-computed), broadcast to the output dims.
Value avg_divisor(Builder& b, const std::vector<int64_t>& out_dims, const std::vector<int64_t>& in, const PoolParams& p,
                  bool count_include_pad, int64_t divisor_override, DType dtype) {
  size_t n = in.size();
  if (divisor_override != 0) return b.constant(dtype, static_cast<double>(divisor_override), out_dims);
  auto out = tail(out_dims, n);
  std::vector<std::vector<double>> per_dim(n);
  for (size_t i = 0; i < n; ++i) {
    for (int64_t o = 0; o < out[i]; ++o) {
      int64_t start = o * p.stride[i] - p.padding[i];
      int64_t end = std::min(start + p.kernel[i], in[i] + p.padding[i]);
      int64_t size = end - start;
      if (!count_include_pad) size = std::min(end, in[i]) - std::max<int64_t>(start, 0);
      per_dim[i].push_back(static_cast<double>(size));
    }
  }
  std::vector<double> table(product(out), 1.0);
  for (size_t flat = 0; flat < table.size(); ++flat) {
    size_t rest = flat;
    for (size_t i = n; i-- > 0;) {
      table[flat] *= per_dim[i][rest % out[i]];
      rest /= out[i];
    }
  }
  Value t = b.constant_array(dtype == DType::F64 ? DType::F64 : DType::F32, table, out);
  t = b.convert(t, dtype);
  return b.broadcast_in_dim(t, out_dims, range(static_cast<int64_t>(out_dims.size() - n), out_dims.size()));
}
}  // namespace

std::vector<Value> max_pool(Builder& b, Value x, const PoolParams& p) {
  const auto& xd = b.dims(x);
  size_t n = p.kernel.size(), lead = xd.size() - n;
  auto in = tail(xd, n);
  // Flat index of each element within its spatial plane.
  Value idx = b.constant_int(DType::S64, 0, xd);
  int64_t stride = 1;
  for (size_t i = n; i-- > 0;) {
    Value part = b.binary("multiply", b.iota(DType::S64, xd, static_cast<int64_t>(lead + i)),
                          b.constant_int(DType::S64, stride, xd));
    idx = b.binary("add", idx, part);
    stride *= in[i];
  }
  DType dt = b.dtype(x);
  bool floating = ir::is_floating(dt);
  auto body = [floating](Builder& rb, const std::vector<Value>& l, const std::vector<Value>& r) {
    // Larger value wins; NaN beats numbers; ties go to the earlier element (as torch scans).
    Value earlier = rb.compare(r[1], l[1], "LT");
    Value pick_r = logical(rb, "or", rb.compare(r[0], l[0], "GT"),
                           logical(rb, "and", rb.compare(r[0], l[0], "EQ"), earlier));
    if (floating) {
      Value rn = rb.compare(r[0], r[0], "NE"), ln = rb.compare(l[0], l[0], "NE");
      Value both = logical(rb, "and", rn, ln);
      pick_r = rb.select(both, earlier,
                         rb.select(rn, rb.constant_int(DType::Pred, 1), logical(rb, "and", rb.unary("not", ln), pick_r)));
    }
    return std::vector<Value>{rb.select(pick_r, r[0], l[0]), rb.select(pick_r, r[1], l[1])};
  };
  return b.reduce_window({x, idx}, {lowest(b, dt), b.constant_int(DType::S64, INT64_MAX)}, pool_window(xd, p), body);
}

Value max_pool_backward(Builder& b, Value grad, Value indices, const std::vector<int64_t>& input_dims,
                        int64_t spatial_dims) {
  const auto& gd = b.dims(grad);
  size_t lead = gd.size() - spatial_dims;
  std::vector<int64_t> lead_dims(gd.begin(), gd.begin() + lead);
  int64_t planes = product(lead_dims);
  int64_t out_flat = product(tail(gd, spatial_dims)), in_flat = product(tail(input_dims, spatial_dims));
  Value g = b.reshape(grad, {planes, out_flat});
  Value i = b.reshape(indices, {planes, out_flat});
  Value zeros = b.constant(accumulate_type(b.dtype(grad)), 0, {planes, in_flat});
  Value r = scatter(b, zeros, 1, i, b.convert(g, b.dtype(zeros)), "add");
  return b.convert(b.reshape(r, input_dims), b.dtype(grad));
}

Value avg_pool(Builder& b, Value x, const PoolParams& p, bool count_include_pad, int64_t divisor_override) {
  DType dt = b.dtype(x), acc = accumulate_type(dt);
  const auto& xd = b.dims(x);
  Value sum = b.reduce_window_simple(b.convert(x, acc), b.constant(acc, 0), pool_window(xd, p), "add");
  Value div = avg_divisor(b, b.dims(sum), tail(xd, p.kernel.size()), p, count_include_pad, divisor_override, acc);
  return b.convert(b.binary("divide", sum, div), dt);
}

Value avg_pool_backward(Builder& b, Value grad, const std::vector<int64_t>& input_dims, const PoolParams& p,
                        bool count_include_pad, int64_t divisor_override) {
  DType dt = b.dtype(grad), acc = accumulate_type(dt);
  size_t n = p.kernel.size(), lead = input_dims.size() - n;
  auto in = tail(input_dims, n);
  Value g = b.convert(grad, acc);
  g = b.binary("divide", g, avg_divisor(b, b.dims(g), in, p, count_include_pad, divisor_override, acc));
  // Each padded input position sums the (divided) gradients of the windows covering it:
  // dilate the gradient by the stride and slide a window of the kernel size over it.
  Builder::Window fwd = pool_window(input_dims, p);
  Builder::Window w;
  w.dims.assign(lead, 1);
  w.base_dilations.assign(lead, 1);
  w.padding.assign(lead, {0, 0});
  std::vector<int64_t> start(lead, 0), limit(input_dims.begin(), input_dims.begin() + lead);
  auto out = tail(b.dims(g), n);
  for (size_t i = 0; i < n; ++i) {
    int64_t padded = in[i] + fwd.padding[lead + i].first + fwd.padding[lead + i].second;
    w.dims.push_back(p.kernel[i]);
    w.base_dilations.push_back(p.stride[i]);
    w.padding.emplace_back(p.kernel[i] - 1, padded - (out[i] - 1) * p.stride[i] - 1);
    start.push_back(p.padding[i]);
    limit.push_back(p.padding[i] + in[i]);
  }
  Value r = b.reduce_window_simple(g, b.constant(acc, 0), w, "add");
  r = b.slice(r, start, limit, std::vector<int64_t>(input_dims.size(), 1));
  return b.convert(r, dt);
}

namespace {
std::vector<double> adaptive_matrix(int64_t in, int64_t out) {
  std::vector<double> m(out * in, 0.0);
  for (int64_t o = 0; o < out; ++o) {
    int64_t start = (o * in) / out, end = ((o + 1) * in + out - 1) / out;
    for (int64_t i = start; i < end; ++i) m[o * in + i] = 1.0 / static_cast<double>(end - start);
  }
  return m;
}
}  // namespace

std::vector<double> transpose_matrix(const std::vector<double>& m, int64_t rows, int64_t cols) {
  std::vector<double> t(m.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = m[r * cols + c];
  return t;
}

Value adaptive_avg_pool(Builder& b, Value x, const std::vector<int64_t>& out) {
  DType dt = b.dtype(x);
  Value r = b.convert(x, accumulate_type(dt));
  size_t n = out.size(), lead = b.dims(x).size() - n;
  for (size_t i = 0; i < n; ++i) {
    int64_t in = b.dims(r)[lead + i];
    r = apply_along(b, r, static_cast<int64_t>(lead + i), adaptive_matrix(in, out[i]), out[i], in);
  }
  return b.convert(r, dt);
}

Value adaptive_avg_pool_backward(Builder& b, Value grad, const std::vector<int64_t>& input_dims) {
  DType dt = b.dtype(grad);
  Value r = b.convert(grad, accumulate_type(dt));
  // Dims whose size did not change were not pooled (the adaptive matrix would be the identity).
  for (size_t d = 0; d < input_dims.size(); ++d) {
    int64_t out = b.dims(r)[d], in = input_dims[d];
    if (out == in) continue;
    r = apply_along(b, r, static_cast<int64_t>(d), transpose_matrix(adaptive_matrix(in, out), out, in), in, out);
  }
  return b.convert(r, dt);
}

namespace {
// Max over the adaptive windows along one dim: {values, int64 position along dim}.
std::vector<Value> adaptive_max_along(Builder& b, Value x, int64_t dim, int64_t out) {
  auto xd = b.dims(x);
  int64_t in = xd[dim], widest = 0;
  std::vector<int64_t> starts, idx;
  for (int64_t o = 0; o < out; ++o) {
    int64_t start = (o * in) / out, end = ((o + 1) * in + out - 1) / out;
    starts.push_back(start);
    widest = std::max(widest, end - start);
  }
  // Narrow windows repeat their last element: it never changes the first maximum.
  for (int64_t o = 0; o < out; ++o) {
    int64_t end = ((o + 1) * in + out - 1) / out;
    for (int64_t k = 0; k < widest; ++k) idx.push_back(std::min(starts[o] + k, end - 1));
  }
  Value g = take_along(b, x, dim, idx);
  std::vector<int64_t> split = xd;
  split[dim] = out;
  split.insert(split.begin() + dim + 1, widest);
  auto r = arg_reduce(b, b.reshape(g, split), dim + 1, false, true);
  std::vector<double> s(starts.begin(), starts.end());
  Value start = b.broadcast_in_dim(b.constant_array(DType::S64, s, {out}), b.dims(r[1]), {dim});
  return {r[0], b.binary("add", r[1], start)};
}
}  // namespace

std::vector<Value> adaptive_max_pool(Builder& b, Value x, const std::vector<int64_t>& out) {
  auto xd = b.dims(x);
  size_t n = out.size(), lead = xd.size() - n;
  Value vals = x;
  std::vector<std::pair<size_t, Value>> positions;  // (spatial dim, chosen position)
  for (size_t i = n; i-- > 0;) {
    int64_t dim = static_cast<int64_t>(lead + i);
    auto r = adaptive_max_along(b, vals, dim, out[i]);
    // Positions found for inner dims follow the rows chosen along this dim.
    for (auto& q : positions) q.second = gather(b, q.second, dim, r[1]);
    vals = r[0];
    positions.emplace_back(i, r[1]);
  }
  Value flat = b.constant_int(DType::S64, 0, b.dims(vals));
  for (auto& [i, pos] : positions) {
    int64_t stride = 1;
    for (size_t j = i + 1; j < n; ++j) stride *= xd[lead + j];
    flat = b.binary("add", flat, b.binary("multiply", pos, b.constant_int(DType::S64, stride, b.dims(vals))));
  }
  return {vals, flat};
}

std::vector<int64_t> im2col_blocks(const std::vector<int64_t>& sp, const Im2ColParams& p) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < 2; ++i) {
    out.push_back((sp[i] + 2 * p.padding[i] - (p.dilation[i] * (p.kernel[i] - 1) + 1)) / p.stride[i] + 1);
  }
  return out;
}

Value im2col(Builder& b, Value x, const Im2ColParams& p) {
  auto xd = b.dims(x);
  int64_t n = xd[0], c = xd[1];
  auto blocks = im2col_blocks({xd[2], xd[3]}, p);
  Value xp = b.pad(x, b.constant(b.dtype(x), 0), {0, 0, p.padding[0], p.padding[1]},
                   {0, 0, p.padding[0], p.padding[1]}, {0, 0, 0, 0});
  std::vector<Value> parts;
  for (int64_t ki = 0; ki < p.kernel[0]; ++ki) {
    for (int64_t kj = 0; kj < p.kernel[1]; ++kj) {
      int64_t h0 = ki * p.dilation[0], w0 = kj * p.dilation[1];
      Value blk = b.slice(xp, {0, 0, h0, w0},
                          {n, c, h0 + (blocks[0] - 1) * p.stride[0] + 1, w0 + (blocks[1] - 1) * p.stride[1] + 1},
                          {1, 1, p.stride[0], p.stride[1]});
      parts.push_back(b.reshape(blk, {n, c, 1, blocks[0] * blocks[1]}));
    }
  }
  return b.reshape(b.concatenate(parts, 2), {n, c * p.kernel[0] * p.kernel[1], blocks[0] * blocks[1]});
}

Value col2im(Builder& b, Value cols, const std::vector<int64_t>& output_size, const Im2ColParams& p) {
  auto cd = b.dims(cols);
  int64_t n = cd[0], k = p.kernel[0] * p.kernel[1], c = cd[1] / k;
  auto blocks = im2col_blocks(output_size, p);
  int64_t hp = output_size[0] + 2 * p.padding[0], wp = output_size[1] + 2 * p.padding[1];
  Value grid = b.reshape(cols, {n, c, k, blocks[0], blocks[1]});
  Value zero = b.constant(b.dtype(cols), 0);
  Value acc = b.constant(b.dtype(cols), 0, {n, c, hp, wp});
  // Each kernel offset's block lands on a strided grid of the padded image: place it with
  // interior padding and add (overlapping windows sum, as in torch's col2im).
  for (int64_t ki = 0; ki < p.kernel[0]; ++ki) {
    for (int64_t kj = 0; kj < p.kernel[1]; ++kj) {
      int64_t idx = ki * p.kernel[1] + kj, h0 = ki * p.dilation[0], w0 = kj * p.dilation[1];
      Value blk = b.reshape(b.slice(grid, {0, 0, idx, 0, 0}, {n, c, idx + 1, blocks[0], blocks[1]}, {1, 1, 1, 1, 1}),
                            {n, c, blocks[0], blocks[1]});
      int64_t span_h = (blocks[0] - 1) * p.stride[0] + 1, span_w = (blocks[1] - 1) * p.stride[1] + 1;
      Value placed = b.pad(blk, zero, {0, 0, h0, w0}, {0, 0, hp - h0 - span_h, wp - w0 - span_w},
                           {0, 0, p.stride[0] - 1, p.stride[1] - 1});
      acc = b.binary("add", acc, placed);
    }
  }
  return b.slice(acc, {0, 0, p.padding[0], p.padding[1]},
                 {n, c, p.padding[0] + output_size[0], p.padding[1] + output_size[1]}, {1, 1, 1, 1});
}

// ---------------------------------------------------------------- resampling helpers

Value apply_along(Builder& b, Value x, int64_t dim, const std::vector<double>& m, int64_t out, int64_t in) {
  DType dt = b.dtype(x);
  DType table_type = dt == DType::F64 ? DType::F64 : DType::F32;
  Value mat = b.convert(b.constant_array(table_type, m, {out, in}), dt);
  Value r = b.dot_general(x, mat, {}, {}, {dim}, {1}, dt);
  // dot_general puts the new dim last; move it back to `dim`.
  int64_t rank = static_cast<int64_t>(b.dims(x).size());
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < rank - 1; ++i) {
    if (i == dim) perm.push_back(rank - 1);
    perm.push_back(i);
  }
  if (dim == rank - 1) perm.push_back(rank - 1);
  return b.transpose(r, perm);
}

Value take_along(Builder& b, Value x, int64_t dim, const std::vector<int64_t>& idx) {
  std::vector<double> v(idx.begin(), idx.end());
  return index_select(b, x, dim, b.constant_array(DType::S64, v, {static_cast<int64_t>(idx.size())}));
}

Value take_along_backward(Builder& b, Value grad, int64_t dim, const std::vector<int64_t>& idx, int64_t in) {
  // Each output's gradient added into the input it read: a scatter-add. (A dense
  // [in x out] matrix product did the same in O(in * out) memory: 12 s and half a GB
  // of constant for the reflection pad of an 8000-sample signal.)
  DType dt = b.dtype(grad), acc = accumulate_type(dt);
  Value g = b.convert(grad, acc);
  std::vector<int64_t> dims = b.dims(g), input_dims = dims;
  input_dims[dim] = in;
  std::vector<double> v(idx.begin(), idx.end());
  Value index = b.broadcast_in_dim(b.constant_array(DType::S64, v, {static_cast<int64_t>(idx.size())}), dims, {dim});
  Value r = scatter(b, b.constant(acc, 0, input_dims), dim, index, g, "add");
  return b.convert(r, dt);
}

std::vector<int64_t> nearest_indices(int64_t in, int64_t out, double scale, bool exact) {
  float s = scale > 0 ? static_cast<float>(1.0 / scale) : static_cast<float>(in) / static_cast<float>(out);
  std::vector<int64_t> idx;
  for (int64_t o = 0; o < out; ++o) {
    float src = exact ? std::floor((static_cast<float>(o) + 0.5f) * s) : std::floor(static_cast<float>(o) * s);
    idx.push_back(std::min(static_cast<int64_t>(src), in - 1));
  }
  return idx;
}

namespace {
// Source-per-output scale of linear/cubic resampling, in float like torch's CPU kernels.
float area_scale(int64_t in, int64_t out, bool align_corners, double scale) {
  if (align_corners) return out > 1 ? static_cast<float>(in - 1) / static_cast<float>(out - 1) : 0.0f;
  return scale > 0 ? static_cast<float>(1.0 / scale) : static_cast<float>(in) / static_cast<float>(out);
}
}  // namespace

std::vector<double> linear_weights(int64_t in, int64_t out, bool align_corners, double scale) {
  float s = area_scale(in, out, align_corners, scale);
  std::vector<double> m(out * in, 0.0);
  for (int64_t o = 0; o < out; ++o) {
    // torch's CPU kernel evaluates scale * (o + 0.5) - 0.5 as one fused multiply-add in float.
    float src = align_corners ? s * static_cast<float>(o)
                              : std::max(static_cast<float>(static_cast<double>(s) * (o + 0.5) - 0.5), 0.0f);
    int64_t i0 = std::min(static_cast<int64_t>(std::floor(src)), in - 1);
    float l1 = std::min(std::max(src - static_cast<float>(i0), 0.0f), 1.0f);
    int64_t i1 = i0 + (i0 < in - 1 ? 1 : 0);
    m[o * in + i0] += 1.0f - l1;
    m[o * in + i1] += l1;
  }
  return m;
}

std::vector<double> antialias_weights(int64_t in, int64_t out, bool align_corners, double scale, bool cubic) {
  double s = align_corners ? (out > 1 ? static_cast<double>(in - 1) / static_cast<double>(out - 1) : 0.0)
                           : (scale > 0 ? 1.0 / scale : static_cast<double>(in) / static_cast<double>(out));
  double support = (cubic ? 2.0 : 1.0) * (s >= 1.0 ? s : 1.0);
  double invscale = s >= 1.0 ? 1.0 / s : 1.0;
  auto filter = [cubic](double x) {
    x = std::abs(x);
    if (!cubic) return x < 1.0 ? 1.0 - x : 0.0;
    const double a = -0.5;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
    return 0.0;
  };
  std::vector<double> m(out * in, 0.0);
  for (int64_t o = 0; o < out; ++o) {
    double center = s * (static_cast<double>(o) + 0.5);
    int64_t lo = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    int64_t hi = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in);
    double total = 0.0;
    for (int64_t j = lo; j < hi; ++j) total += m[o * in + j] = filter((static_cast<double>(j) - center + 0.5) * invscale);
    if (total != 0.0)
      for (int64_t j = lo; j < hi; ++j) m[o * in + j] /= total;
  }
  return m;
}

std::vector<double> cubic_weights(int64_t in, int64_t out, bool align_corners, double scale) {
  float s = area_scale(in, out, align_corners, scale);
  constexpr double A = -0.75;  // torch's cubic convolution coefficient
  auto near = [](double x) { return ((A + 2) * x - (A + 3)) * x * x + 1; };
  auto far = [](double x) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; };
  std::vector<double> m(out * in, 0.0);
  for (int64_t o = 0; o < out; ++o) {
    // Cubic sampling does not clamp the source position at 0 (taps are clamped instead).
    float src = align_corners ? s * static_cast<float>(o) : static_cast<float>(static_cast<double>(s) * (o + 0.5) - 0.5);
    int64_t i0 = std::min(static_cast<int64_t>(std::floor(src)), in - 1);
    float t = std::min(std::max(src - static_cast<float>(i0), 0.0f), 1.0f);
    float coeffs[4] = {static_cast<float>(far(t + 1.0)), static_cast<float>(near(t)), static_cast<float>(near(1.0 - t)),
                       static_cast<float>(far(2.0 - t))};
    for (int64_t k = 0; k < 4; ++k) m[o * in + std::clamp<int64_t>(i0 - 1 + k, 0, in - 1)] += coeffs[k];
  }
  return m;
}

std::vector<int64_t> reflect_indices(int64_t in, int64_t low, int64_t high) {
  std::vector<int64_t> idx;
  for (int64_t j = 0; j < in + low + high; ++j) {
    int64_t src = j - low;
    if (src < 0) src = -src;
    if (src >= in) src = 2 * (in - 1) - src;
    idx.push_back(src);
  }
  return idx;
}

std::vector<int64_t> replicate_indices(int64_t in, int64_t low, int64_t high) {
  std::vector<int64_t> idx;
  for (int64_t j = 0; j < in + low + high; ++j) idx.push_back(std::clamp<int64_t>(j - low, 0, in - 1));
  return idx;
}

// ---------------------------------------------------------------- normalization

namespace {
// Every dim but the channel dim 1, and how many elements each channel reduces over.
std::vector<int64_t> per_channel_dims(const std::vector<int64_t>& xd, int64_t* count) {
  std::vector<int64_t> rdims{0};
  for (int64_t i = 2; i < static_cast<int64_t>(xd.size()); ++i) rdims.push_back(i);
  *count = 1;
  for (int64_t d : rdims) *count *= xd[d];
  return rdims;
}
}  // namespace

std::vector<Value> batch_norm(Builder& b, Value x, const Value* weight, const Value* bias, const Value* running_mean,
                              const Value* running_var, bool training, double momentum, double eps) {
  DType dt = b.dtype(x), acc = accumulate_type(dt);
  std::vector<int64_t> xd = b.dims(x);
  int64_t n = 0;
  std::vector<int64_t> rdims = per_channel_dims(xd, &n);
  Value xf = b.convert(x, acc);
  Value mean, invstd, var;
  std::vector<Value> extra;
  if (training) {
    mean = b.binary("divide", b.reduce_simple(xf, b.constant(acc, 0), rdims, "stablehlo.add"),
                    b.constant(acc, static_cast<double>(n), {xd[1]}));
    Value centered = b.binary("subtract", xf, channel(b, mean, xd));
    var = b.binary("divide",
                   b.reduce_simple(b.binary("multiply", centered, centered), b.constant(acc, 0), rdims, "stablehlo.add"),
                   b.constant(acc, static_cast<double>(n), {xd[1]}));
    if (running_mean && running_var) {
      auto update = [&](Value running, Value stat) {
        DType rt = b.dtype(running);
        Value r = b.convert(running, acc);
        Value m = b.constant(acc, momentum, {xd[1]});
        Value keep = b.constant(acc, 1.0 - momentum, {xd[1]});
        return b.convert(b.binary("add", b.binary("multiply", keep, r), b.binary("multiply", m, stat)), rt);
      };
      Value unbiased = b.binary("multiply", var,
                                b.constant(acc, n > 1 ? static_cast<double>(n) / (n - 1) : INFINITY, {xd[1]}));
      extra = {update(*running_mean, mean), update(*running_var, unbiased)};
    }
  } else {
    mean = b.convert(*running_mean, acc);
    var = b.convert(*running_var, acc);
  }
  invstd = b.unary("rsqrt", b.binary("add", var, b.constant(acc, eps, {xd[1]})));
  Value y = b.binary("multiply", b.binary("subtract", xf, channel(b, mean, xd)), channel(b, invstd, xd));
  if (weight) y = b.binary("multiply", y, channel(b, b.convert(*weight, acc), xd));
  if (bias) y = b.binary("add", y, channel(b, b.convert(*bias, acc), xd));
  std::vector<Value> out{b.convert(y, dt), mean, invstd};
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

std::vector<Value> batch_norm_backward(Builder& b, Value grad, Value x, const Value* weight, Value mean, Value invstd,
                                       bool training) {
  DType dt = b.dtype(x), acc = accumulate_type(dt);
  std::vector<int64_t> xd = b.dims(x);
  int64_t n = 0;
  std::vector<int64_t> rdims = per_channel_dims(xd, &n);
  Value g = b.convert(grad, acc), xf = b.convert(x, acc);
  mean = b.convert(mean, acc);
  invstd = b.convert(invstd, acc);
  Value xhat = b.binary("multiply", b.binary("subtract", xf, channel(b, mean, xd)), channel(b, invstd, xd));
  Value zero = b.constant(acc, 0);
  Value db = b.reduce_simple(g, zero, rdims, "stablehlo.add");
  Value dw = b.reduce_simple(b.binary("multiply", g, xhat), zero, rdims, "stablehlo.add");
  Value scale = invstd;
  if (weight) scale = b.binary("multiply", scale, b.convert(*weight, acc));
  Value dx;
  if (training) {
    Value inv_n = b.constant(acc, 1.0 / static_cast<double>(n), {xd[1]});
    Value centered = b.binary("subtract", g, channel(b, b.binary("multiply", db, inv_n), xd));
    centered = b.binary("subtract", centered,
                        b.binary("multiply", xhat, channel(b, b.binary("multiply", dw, inv_n), xd)));
    dx = b.binary("multiply", centered, channel(b, scale, xd));
  } else {
    dx = b.binary("multiply", g, channel(b, scale, xd));
  }
  return {b.convert(dx, dt), dw, db};
}

std::vector<Value> group_norm(Builder& b, Value x, const Value* weight, const Value* bias, int64_t groups, double eps) {
  DType dt = b.dtype(x), acc = accumulate_type(dt);
  std::vector<int64_t> xd = b.dims(x);
  int64_t n = xd[0], c = xd[1], hw = product(xd) / std::max<int64_t>(n * c, 1);
  int64_t per = c / groups * hw;
  Value xr = b.reshape(b.convert(x, acc), {n, groups, per});
  Value zero = b.constant(acc, 0);
  Value mean = b.binary("divide", b.reduce_simple(xr, zero, {2}, "stablehlo.add"),
                        b.constant(acc, static_cast<double>(per), {n, groups}));
  Value centered = b.binary("subtract", xr, b.broadcast_in_dim(mean, {n, groups, per}, {0, 1}));
  Value var = b.binary("divide", b.reduce_simple(b.binary("multiply", centered, centered), zero, {2}, "stablehlo.add"),
                       b.constant(acc, static_cast<double>(per), {n, groups}));
  Value rstd = b.unary("rsqrt", b.binary("add", var, b.constant(acc, eps, {n, groups})));
  Value y = b.binary("multiply", centered, b.broadcast_in_dim(rstd, {n, groups, per}, {0, 1}));
  y = b.reshape(y, {n, c, hw});
  if (weight) y = b.binary("multiply", y, b.broadcast_in_dim(b.convert(*weight, acc), {n, c, hw}, {1}));
  if (bias) y = b.binary("add", y, b.broadcast_in_dim(b.convert(*bias, acc), {n, c, hw}, {1}));
  return {b.convert(b.reshape(y, xd), dt), mean, rstd};
}

std::vector<Value> group_norm_backward(Builder& b, Value grad, Value x, Value mean, Value rstd, const Value* weight,
                                       int64_t groups) {
  DType dt = b.dtype(x), acc = accumulate_type(dt);
  std::vector<int64_t> xd = b.dims(x);
  int64_t n = xd[0], c = xd[1], hw = product(xd) / std::max<int64_t>(n * c, 1);
  int64_t per = c / groups * hw;
  std::vector<int64_t> grouped{n, groups, per}, chan{n, c, hw};
  mean = b.convert(mean, acc);
  rstd = b.convert(rstd, acc);
  Value xhat = b.binary("multiply",
                        b.binary("subtract", b.reshape(b.convert(x, acc), grouped), b.broadcast_in_dim(mean, grouped, {0, 1})),
                        b.broadcast_in_dim(rstd, grouped, {0, 1}));
  Value g = b.reshape(b.convert(grad, acc), chan);
  Value xhat_c = b.reshape(xhat, chan);
  Value zero = b.constant(acc, 0);
  Value dw = b.reduce_simple(b.binary("multiply", g, xhat_c), zero, {0, 2}, "stablehlo.add");
  Value db = b.reduce_simple(g, zero, {0, 2}, "stablehlo.add");
  Value dxhat = weight ? b.binary("multiply", g, b.broadcast_in_dim(b.convert(*weight, acc), chan, {1})) : g;
  dxhat = b.reshape(dxhat, grouped);
  Value inv = b.constant(acc, 1.0 / static_cast<double>(per), {n, groups});
  Value m1 = b.binary("multiply", b.reduce_simple(dxhat, zero, {2}, "stablehlo.add"), inv);
  Value m2 = b.binary("multiply", b.reduce_simple(b.binary("multiply", dxhat, xhat), zero, {2}, "stablehlo.add"), inv);
  Value dx = b.binary("subtract", b.binary("subtract", dxhat, b.broadcast_in_dim(m1, grouped, {0, 1})),
                      b.binary("multiply", xhat, b.broadcast_in_dim(m2, grouped, {0, 1})));
  dx = b.binary("multiply", dx, b.broadcast_in_dim(rstd, grouped, {0, 1}));
  return {b.convert(b.reshape(dx, xd), dt), dw, db};
}

// ---------------------------------------------------------------- scans and sorting

namespace {
Builder::Window scan_window(const std::vector<int64_t>& xd, int64_t dim) {
  Builder::Window w;
  w.dims.assign(xd.size(), 1);
  w.padding.assign(xd.size(), {0, 0});
  w.dims[dim] = xd[dim];
  w.padding[dim] = {xd[dim] - 1, 0};
  return w;
}
}  // namespace

Value cumulative(Builder& b, Value x, int64_t dim, const std::string& op) {
  const auto& xd = b.dims(x);
  if (xd.empty() || xd[dim] == 0) return x;
  DType dt = b.dtype(x);
  auto w = scan_window(xd, dim);
  if (op == "sum") return b.reduce_window_simple(x, b.constant(dt, 0), w, "add");
  if (op == "prod") return b.reduce_window_simple(x, b.constant(dt, 1), w, "multiply");
  if (op == "logsumexp" && ir::is_complex(dt)) {
    auto body = [dt](Builder& rb, const std::vector<Value>& l, const std::vector<Value>& r) {
      // torch's complex rule, the new element first as CPU's scan (ties pick differently).
      static const BinaryOp& logaddexp = binary_op("logaddexp");
      return std::vector<Value>{binary(rb, logaddexp, r[0], l[0], dt, dt)};
    };
    return b.reduce_window({x}, {b.constant(dt, -INFINITY)}, w, body)[0];
  }
  if (op == "logsumexp") {
    auto body = [](Builder& rb, const std::vector<Value>& l, const std::vector<Value>& r) {
      Value hi = rb.binary("maximum", l[0], r[0]), lo = rb.binary("minimum", l[0], r[0]);
      Value sum = rb.binary("add", hi, rb.unary("log_plus_one", rb.unary("exponential", rb.binary("subtract", lo, hi))));
      // -inf + -inf stays -inf (the formula would give NaN); NaN propagates through `sum`.
      Value hi_is_neg_inf = rb.compare(hi, rb.scalar_like(hi, -INFINITY), "EQ");
      return std::vector<Value>{rb.select(hi_is_neg_inf, hi, sum)};
    };
    return b.reduce_window({x}, {b.constant(dt, -INFINITY)}, w, body)[0];
  }
  throw std::invalid_argument("cumulative: unknown op " + op);
}

std::vector<Value> cum_extreme(Builder& b, Value x, int64_t dim, bool is_max) {
  const auto& xd = b.dims(x);
  DType dt = b.dtype(x);
  Value idx = b.iota(DType::S64, xd, dim);
  if (xd[dim] == 0) return {x, idx};
  bool floating = ir::is_floating(dt);
  auto body = [floating, is_max](Builder& rb, const std::vector<Value>& l, const std::vector<Value>& r) {
    // Total order (NaN above everything, then value, ties to the later index): torch's
    // running `x >= best || isnan(x)` scan keeps the last maximal element.
    Value later = rb.compare(r[1], l[1], "GT");
    Value pick_r = logical(rb, "or", rb.compare(r[0], l[0], is_max ? "GT" : "LT"),
                           logical(rb, "and", rb.compare(r[0], l[0], "EQ"), later));
    if (floating) {
      Value rn = rb.compare(r[0], r[0], "NE"), ln = rb.compare(l[0], l[0], "NE");
      pick_r = rb.select(logical(rb, "and", rn, ln), later,
                         rb.select(rn, rb.constant_int(DType::Pred, 1), logical(rb, "and", rb.unary("not", ln), pick_r)));
    }
    return std::vector<Value>{rb.select(pick_r, r[0], l[0]), rb.select(pick_r, r[1], l[1])};
  };
  Value init = is_max ? lowest(b, dt) : highest(b, dt);
  return b.reduce_window({x, idx}, {init, b.constant_int(DType::S64, -1)}, scan_window(xd, dim), body);
}

std::vector<Value> sort_with_indices(Builder& b, Value x, int64_t dim, bool descending) {
  Value idx = b.iota(DType::S64, b.dims(x), dim);
  if (b.dims(x).empty() || b.dims(x)[dim] <= 1) return {x, idx};
  return b.sort({x, idx}, dim, descending, /*stable=*/true);
}

// ---------------------------------------------------------------- losses

Value reduce_loss(Builder& b, Value loss, int64_t reduction) {
  if (reduction == 0) return loss;
  DType dt = b.dtype(loss);
  Value s = b.convert(loss, accumulate_type(dt));
  int64_t n = b.type(s).numel();
  auto all = range(0, static_cast<int64_t>(b.dims(s).size()));
  s = b.reduce_simple(s, b.constant(b.dtype(s), 0), all, "stablehlo.add");
  if (reduction == 1) s = b.binary("divide", s, b.constant(b.dtype(s), static_cast<double>(n)));
  return b.convert(s, dt);
}

Value loss_grad_scale(Builder& b, Value grad, const std::vector<int64_t>& dims, int64_t reduction) {
  Value g = b.broadcast_to(grad, dims);
  if (reduction == 1) g = b.binary("divide", g, b.scalar_like(g, static_cast<double>(product(dims))));
  return g;
}

// ---------------------------------------------------------------- recurrent cells
namespace {
struct Cell {
  Builder& b;
  DType compute;  // float32 for 16-bit inputs, as PyTorch's fused cells accumulate
  Value to(Value v) { return b.convert(v, compute); }
  Value sig(Value v) { return b.unary("logistic", v); }
  Value tanh(Value v) { return b.unary("tanh", v); }
  Value mul(Value x, Value y) { return b.binary("multiply", x, y); }
  Value add(Value x, Value y) { return b.binary("add", x, y); }
  Value sub(Value x, Value y) { return b.binary("subtract", x, y); }
  Value one_minus(Value v) { return sub(b.scalar_like(v, 1.0), v); }
  Value chunk(Value v, int64_t k, int64_t n) { return b.slice_dim(v, 1, k * n, (k + 1) * n); }
  // gates (+ bias broadcast over the batch)
  Value gates(Value g, const Value* bias) {
    Value x = to(g);
    return bias ? add(x, b.broadcast_in_dim(to(*bias), b.dims(x), {1})) : x;
  }
  Value bias_grad(Value grad) { return b.reduce_simple(grad, b.constant(compute, 0), {0}, "add"); }
};

DType cell_dtype(DType d) { return is_reduced_float(d) ? DType::F32 : d; }
}  // namespace

std::vector<Value> lstm_cell(Builder& b, Value input_gates, Value hidden_gates, Value cx, const Value* input_bias,
                             const Value* hidden_bias) {
  DType out = b.dtype(input_gates);
  Cell c{b, cell_dtype(out)};
  Value g = c.add(c.gates(input_gates, input_bias), c.gates(hidden_gates, hidden_bias));
  const int64_t n = b.dims(g)[1] / 4;
  Value i = c.sig(c.chunk(g, 0, n)), f = c.sig(c.chunk(g, 1, n)), cand = c.tanh(c.chunk(g, 2, n)),
        o = c.sig(c.chunk(g, 3, n));
  Value cy = c.add(c.mul(f, c.to(cx)), c.mul(i, cand));
  Value hy = c.mul(o, c.tanh(cy));
  Value workspace = b.concatenate({i, f, cand, o}, 1);
  return {b.convert(hy, out), b.convert(cy, out), b.convert(workspace, out)};
}

std::vector<Value> lstm_cell_backward(Builder& b, const Value* grad_hy, const Value* grad_cy, Value cx, Value cy,
                                      Value workspace, bool has_bias) {
  DType out = b.dtype(workspace);
  Cell c{b, cell_dtype(out)};
  Value ws = c.to(workspace);
  const int64_t n = b.dims(ws)[1] / 4;
  Value i = c.chunk(ws, 0, n), f = c.chunk(ws, 1, n), cand = c.chunk(ws, 2, n), o = c.chunk(ws, 3, n);
  Value tanh_cy = c.tanh(c.to(cy));
  Value zero = b.scalar_like(tanh_cy, 0.0);
  Value ghy = grad_hy ? c.to(*grad_hy) : zero;
  Value gcy = c.add(c.mul(c.mul(ghy, o), c.one_minus(c.mul(tanh_cy, tanh_cy))), grad_cy ? c.to(*grad_cy) : zero);
  Value gi = c.mul(c.mul(gcy, cand), c.mul(i, c.one_minus(i)));
  Value gf = c.mul(c.mul(gcy, c.to(cx)), c.mul(f, c.one_minus(f)));
  Value gg = c.mul(c.mul(gcy, i), c.one_minus(c.mul(cand, cand)));
  Value go = c.mul(c.mul(ghy, tanh_cy), c.mul(o, c.one_minus(o)));
  Value grad_gates = b.concatenate({gi, gf, gg, go}, 1);
  Value grad_cx = c.mul(gcy, f);
  Value grad_bias = has_bias ? b.convert(c.bias_grad(grad_gates), out) : Value{};
  return {b.convert(grad_gates, out), b.convert(grad_cx, out), grad_bias};
}

std::vector<Value> gru_cell(Builder& b, Value input_gates, Value hidden_gates, Value hx, const Value* input_bias,
                            const Value* hidden_bias) {
  DType out = b.dtype(input_gates);
  Cell c{b, cell_dtype(out)};
  Value gi = c.gates(input_gates, input_bias), gh = c.gates(hidden_gates, hidden_bias);
  const int64_t n = b.dims(gi)[1] / 3;
  Value r = c.sig(c.add(c.chunk(gi, 0, n), c.chunk(gh, 0, n)));
  Value z = c.sig(c.add(c.chunk(gi, 1, n), c.chunk(gh, 1, n)));
  Value hn = c.chunk(gh, 2, n);
  Value cand = c.tanh(c.add(c.chunk(gi, 2, n), c.mul(r, hn)));
  Value h = c.to(hx);
  Value hy = c.add(cand, c.mul(z, c.sub(h, cand)));  // (1 - z) * n + z * hx
  Value workspace = b.concatenate({r, z, cand, h, hn}, 1);
  return {b.convert(hy, out), b.convert(workspace, out)};
}

std::vector<Value> gru_cell_backward(Builder& b, Value grad_hy, Value workspace, bool has_bias) {
  DType out = b.dtype(workspace);
  Cell c{b, cell_dtype(out)};
  Value ws = c.to(workspace);
  const int64_t n = b.dims(ws)[1] / 5;
  Value r = c.chunk(ws, 0, n), z = c.chunk(ws, 1, n), cand = c.chunk(ws, 2, n), h = c.chunk(ws, 3, n),
        hn = c.chunk(ws, 4, n);
  Value g = c.to(grad_hy);
  Value gz = c.mul(c.mul(g, c.sub(h, cand)), c.mul(z, c.one_minus(z)));
  Value gn = c.mul(c.mul(g, c.one_minus(z)), c.one_minus(c.mul(cand, cand)));
  Value gr = c.mul(c.mul(gn, hn), c.mul(r, c.one_minus(r)));
  Value grad_input = b.concatenate({gr, gz, gn}, 1);
  Value grad_hidden = b.concatenate({gr, gz, c.mul(gn, r)}, 1);
  Value grad_hx = c.mul(g, z);
  Value gib = has_bias ? b.convert(c.bias_grad(grad_input), out) : Value{};
  Value ghb = has_bias ? b.convert(c.bias_grad(grad_hidden), out) : Value{};
  return {b.convert(grad_input, out), b.convert(grad_hidden, out), b.convert(grad_hx, out), gib, ghb};
}

std::vector<Value> fractional_max_pool(Builder& b, Value x, Value samples, const std::vector<int64_t>& kernel,
                                       const std::vector<int64_t>& output) {
  const auto& xd = b.dims(x);
  int64_t n = xd[0], c = xd[1];
  size_t k = kernel.size();
  std::vector<int64_t> in(xd.begin() + 2, xd.end());
  int64_t spatial = 1;
  for (int64_t s : in) spatial *= s;
  // Per spatial dim d: the input position of each (output, kernel tap) pair, [N, C, out_d, kernel_d].
  std::vector<Value> pos(k);
  for (size_t d = 0; d < k; ++d) {
    int64_t od = output[d], kd = kernel[d];
    // PyTorch's kernels: in 2-d sample 0 is W and 1 is H; in 3-d 0 is T, 1 is H, 2 is W.
    int64_t which = k == 2 ? static_cast<int64_t>(1 - d) : static_cast<int64_t>(d);
    Value u = b.reshape(b.slice_dim(samples, 2, which, which + 1), {n, c});
    std::vector<int64_t> nco{n, c, od};
    Value ub = b.broadcast_in_dim(u, nco, {0, 1});
    double alpha = od > 1 ? static_cast<double>(in[d] - kd) / static_cast<double>(od - 1) : 0.0;
    Value al = b.scalar_like(ub, alpha);
    Value i = b.convert(b.iota(DType::S64, nco, 2), b.dtype(ub));
    // int((i + u) * alpha) - int(u * alpha); the last window ends at the input's end.
    Value start = b.binary("subtract", b.convert(b.binary("multiply", b.binary("add", i, ub), al), DType::S64),
                           b.convert(b.binary("multiply", ub, al), DType::S64));
    Value last = b.compare(b.iota(DType::S64, nco, 2), b.constant_int(DType::S64, od - 1, nco), "EQ");
    start = b.select(last, b.constant_int(DType::S64, in[d] - kd, nco), start);
    std::vector<int64_t> ncok{n, c, od, kd};
    pos[d] = b.binary("add", b.broadcast_in_dim(start, ncok, {0, 1, 2}), b.iota(DType::S64, ncok, 3));
  }
  // Flat spatial index of every (output position, window tap): [N, C, out..., kernel...].
  std::vector<int64_t> full{n, c};
  for (int64_t o : output) full.push_back(o);
  for (int64_t kk : kernel) full.push_back(kk);
  Value flat = b.constant_int(DType::S64, 0, full);
  int64_t stride = 1;
  for (size_t d = k; d-- > 0;) {
    std::vector<int64_t> map{0, 1, static_cast<int64_t>(2 + d), static_cast<int64_t>(2 + k + d)};
    Value term = b.binary("multiply", b.broadcast_in_dim(pos[d], full, map), b.constant_int(DType::S64, stride, full));
    flat = b.binary("add", flat, term);
    stride *= in[d];
  }
  int64_t outs = 1, taps = 1;
  for (int64_t o : output) outs *= o;
  for (int64_t kk : kernel) taps *= kk;
  Value idx = b.reshape(flat, {n, c, outs * taps});
  Value vals = gather(b, b.reshape(x, {n, c, spatial}), 2, idx);
  vals = b.reshape(vals, {n, c, outs, taps});
  idx = b.reshape(idx, {n, c, outs, taps});
  auto best = arg_reduce(b, vals, 3, false, true);  // first maximum in the window's row-major order
  Value which = b.reshape(best[1], {n, c, outs, 1});
  Value picked = b.reshape(gather(b, idx, 3, which), {n, c, outs});
  std::vector<int64_t> out_dims{n, c};
  for (int64_t o : output) out_dims.push_back(o);
  return {b.reshape(best[0], out_dims), b.reshape(picked, out_dims)};
}

}  // namespace torch_pjrt::lowering
