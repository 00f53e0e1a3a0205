// Scans and sorting: cumulative ops, sort, topk, searchsorted, bucketize, isin.
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>
#include <torch/library.h>

#include "aten/kernel_util.h"
#include "aten/nn_util.h"
#include "device/context.h"
#include "lowering/nn.h"

namespace torch_pjrt::device {
namespace {

at::Tensor scan_fn(const char* name, const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype,
                   const std::string& kind, const at::Tensor* into) {
  at::ScalarType out = dtype ? *dtype
                             : (into ? into->scalar_type()
                                     : (at::isIntegralType(self.scalar_type(), true) && kind != "logsumexp"
                                            ? at::kLong
                                            : self.scalar_type()));
  if (kind == "logsumexp") {
    TORCH_CHECK(at::isFloatingType(self.scalar_type()) || at::isComplexType(self.scalar_type()),
                "logcumsumexp: expected a floating point or complex input, got ", self.scalar_type());
  }
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  OpBuilder op(std::string("aten::") + name);
  auto& b = op.b();
  ir::DType acc = L::accumulate_type(to_ir(out));
  Value x = b.convert(op.input(self), acc);
  if (self.dim() == 0) x = b.reshape(x, {1});
  Value r = L::cumulative(b, x, d, kind);
  if (self.dim() == 0) r = b.reshape(r, {});
  return finish(op, b.convert(r, to_ir(out)), out, into);
}
#define SCAN_KERNELS(NAME, KIND)                                                                       \
  at::Tensor NAME##_fn(const at::Tensor& s, int64_t d, std::optional<at::ScalarType> t) {                 \
    return scan_fn(#NAME, s, d, t, KIND, nullptr);                                                        \
  }                                                                                                       \
  at::Tensor& NAME##_out(const at::Tensor& s, int64_t d, std::optional<at::ScalarType> t, at::Tensor& o) { \
    scan_fn(#NAME, s, d, t, KIND, &o);                                                                    \
    return o;                                                                                             \
  }                                                                                                       \
  at::Tensor& NAME##_inplace(at::Tensor& s, int64_t d, std::optional<at::ScalarType> t) {                 \
    scan_fn(#NAME, s, d, t, KIND, &s);                                                                    \
    return s;                                                                                             \
  }
SCAN_KERNELS(cumsum, "sum")
SCAN_KERNELS(cumprod, "prod")
at::Tensor logcumsumexp_fn(const at::Tensor& s, int64_t d) {
  return scan_fn("logcumsumexp", s, d, std::nullopt, "logsumexp", nullptr);
}

std::tuple<at::Tensor, at::Tensor> cum_extreme_fn(const at::Tensor& self, int64_t dim, bool is_max) {
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  OpBuilder op(is_max ? "aten::cummax" : "aten::cummin");
  auto& b = op.b();
  Value x = op.input(self);
  if (self.dim() == 0) x = b.reshape(x, {1});
  auto r = L::cum_extreme(b, x, d, is_max);
  if (self.dim() == 0) {
    r[0] = b.reshape(r[0], {});
    r[1] = b.reshape(r[1], {});
  }
  at::Tensor v = op.output(r[0], self.scalar_type());
  at::Tensor i = op.output(r[1], at::kLong);
  op.run();
  return {v, i};
}
std::tuple<at::Tensor, at::Tensor> cummax_fn(const at::Tensor& s, int64_t d) { return cum_extreme_fn(s, d, true); }
std::tuple<at::Tensor, at::Tensor> cummin_fn(const at::Tensor& s, int64_t d) { return cum_extreme_fn(s, d, false); }
void cummax_helper_fn(const at::Tensor& s, at::Tensor& values, at::Tensor& indices, int64_t d) {
  auto [v, i] = cum_extreme_fn(s, d, true);
  values.copy_(v);
  indices.copy_(i);
}
void cummin_helper_fn(const at::Tensor& s, at::Tensor& values, at::Tensor& indices, int64_t d) {
  auto [v, i] = cum_extreme_fn(s, d, false);
  values.copy_(v);
  indices.copy_(i);
}

// Sorts along dim and keeps positions [start, start + count) of the sorted order.
std::tuple<at::Tensor, at::Tensor> sorted_slice(const char* name, const at::Tensor& self, int64_t dim,
                                                bool descending, int64_t start, int64_t count, bool keepdim) {
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  OpBuilder op(std::string("aten::") + name);
  auto& b = op.b();
  Value x = op.input(self);
  if (self.dim() == 0) x = b.reshape(x, {1});
  auto r = L::sort_with_indices(b, x, d, descending);
  int64_t n = b.dims(x)[d];
  if (start != 0 || count != n) {
    r[0] = b.slice_dim(r[0], d, start, start + count);
    r[1] = b.slice_dim(r[1], d, start, start + count);
  }
  if (self.dim() == 0 || !keepdim) {
    // Only single-position slices (kthvalue) drop the dim.
    std::vector<int64_t> shape = vec(self.sizes());
    if (self.dim() > 0) shape.erase(shape.begin() + d);
    r[0] = b.reshape(r[0], shape);
    r[1] = b.reshape(r[1], shape);
  }
  at::Tensor v = op.output(r[0], self.scalar_type());
  at::Tensor i = op.output(r[1], at::kLong);
  op.run();
  return {v, i};
}

std::tuple<at::Tensor, at::Tensor> sort_fn(const at::Tensor& self, int64_t dim, bool descending) {
  int64_t n = self.dim() == 0 ? 1 : self.size(at::maybe_wrap_dim(dim, self.dim()));
  return sorted_slice("sort", self, dim, descending, 0, n, true);
}
std::tuple<at::Tensor, at::Tensor> sort_stable_fn(const at::Tensor& self, std::optional<bool>, int64_t dim,
                                                  bool descending) {
  return sort_fn(self, dim, descending);
}
std::tuple<at::Tensor&, at::Tensor&> sort_values_stable_fn(const at::Tensor& self, std::optional<bool>, int64_t dim,
                                                           bool descending, at::Tensor& values, at::Tensor& indices) {
  auto [v, i] = sort_fn(self, dim, descending);
  write_outs("sort", {v, i}, {values, indices});  // values may be self (ATen sorts into its input)
  return {values, indices};
}

std::tuple<at::Tensor, at::Tensor> topk_fn(const at::Tensor& self, int64_t k, int64_t dim, bool largest, bool) {
  int64_t n = self.dim() == 0 ? 1 : self.size(at::maybe_wrap_dim(dim, self.dim()));
  TORCH_CHECK(k >= 0 && k <= n, "selected index k out of range");
  return sorted_slice("topk", self, dim, largest, 0, k, true);
}
std::tuple<at::Tensor&, at::Tensor&> topk_out(const at::Tensor& self, int64_t k, int64_t dim, bool largest,
                                              bool sorted, at::Tensor& values, at::Tensor& indices) {
  auto [v, i] = topk_fn(self, k, dim, largest, sorted);
  write_outs("topk", {v, i}, {values, indices});
  return {values, indices};
}

std::tuple<at::Tensor, at::Tensor> kthvalue_fn(const at::Tensor& self, int64_t k, int64_t dim, bool keepdim) {
  int64_t n = self.dim() == 0 ? 1 : self.size(at::maybe_wrap_dim(dim, self.dim()));
  check_reduction_dim_nonempty("kthvalue", self, at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1)));
  TORCH_CHECK(k >= 1 && k <= n, "kthvalue(): selected number k out of range for dimension ", dim);
  return sorted_slice("kthvalue", self, dim, false, k - 1, 1, keepdim);
}

// median / nanmedian along dim: the lower median; a NaN in the row makes median NaN
// (its first NaN), nanmedian ignores NaNs.
std::tuple<at::Tensor, at::Tensor> median_impl(const at::Tensor& self, int64_t dim, bool keepdim, bool ignore_nan) {
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  check_reduction_dim_nonempty("median", self, d);  // ATen names nanmedian "median" here too
  OpBuilder op(ignore_nan ? "aten::nanmedian" : "aten::median");
  auto& b = op.b();
  Value x = op.input(self);
  if (self.dim() == 0) x = b.reshape(x, {1});
  auto sorted = L::sort_with_indices(b, x, d, false);
  auto xd = b.dims(x);
  int64_t n = xd[d];
  std::vector<int64_t> kept = xd;
  kept[d] = 1;
  Value pos;
  if (ir::is_floating(b.dtype(x))) {
    Value not_nan = b.convert(b.compare(x, x, "EQ"), ir::DType::S64);
    Value count = b.reshape(L::sum(b, not_nan, {d}, true, ir::DType::S64), kept);
    if (ignore_nan) {
      Value half = b.binary("divide", b.binary("subtract", count, b.scalar_like(count, 1)), b.scalar_like(count, 2));
      pos = b.binary("maximum", half, b.scalar_like(count, 0));
    } else {
      Value has_nan = b.compare(count, b.scalar_like(count, static_cast<double>(n)), "LT");
      pos = b.select(has_nan, count, b.constant_int(ir::DType::S64, (n - 1) / 2, kept));
    }
  } else {
    pos = b.constant_int(ir::DType::S64, (n - 1) / 2, kept);
  }
  Value v = L::gather(b, sorted[0], d, pos), i = L::gather(b, sorted[1], d, pos);
  std::vector<int64_t> shape = vec(self.sizes());
  if (self.dim() > 0) {
    if (keepdim) shape[d] = 1;
    else shape.erase(shape.begin() + d);
  }
  at::Tensor values = op.output(b.reshape(v, shape), self.scalar_type());
  at::Tensor indices = op.output(b.reshape(i, shape), at::kLong);
  op.run();
  return {values, indices};
}
std::tuple<at::Tensor, at::Tensor> median_dim_fn(const at::Tensor& s, int64_t d, bool k) {
  return median_impl(s, d, k, false);
}
std::tuple<at::Tensor, at::Tensor> nanmedian_dim_fn(const at::Tensor& s, int64_t d, bool k) {
  return median_impl(s, d, k, true);
}
at::Tensor median_all_fn(const at::Tensor& s) {
  if (s.numel() == 0) return at::full({}, NAN, s.options());  // as ATen: NaN (cast to the dtype)
  return std::get<0>(median_impl(s.reshape({-1}), 0, false, false));
}
at::Tensor nanmedian_all_fn(const at::Tensor& s) {
  if (s.numel() == 0) return at::full({}, NAN, s.options());
  return std::get<0>(median_impl(s.reshape({-1}), 0, false, true));
}

at::Tensor& logcumsumexp_out(const at::Tensor& s, int64_t d, at::Tensor& out) {
  scan_fn("logcumsumexp", s, d, std::nullopt, "logsumexp", &out);
  return out;
}

Tensor private_logcumsumexp(const Tensor& self, int64_t dim) {
  OpBuilder op("aten::_logcumsumexp");
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  Value x = op.input(self);
  if (self.dim() == 0) x = op.b().reshape(x, {1});
  Value r = L::cumulative(op.b(), x, d, "logsumexp");
  if (self.dim() == 0) r = op.b().reshape(r, {});
  return finish(op, r, self.scalar_type(), nullptr);
}

Tensor& private_logcumsumexp_out(const Tensor& self, int64_t dim, Tensor& out) {
  return write_out("_logcumsumexp", private_logcumsumexp(self, dim), out);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("cumsum", cumsum_fn);
  m.impl("cumsum.out", cumsum_out);
  m.impl("cumsum_", cumsum_inplace);
  m.impl("cumprod", cumprod_fn);
  m.impl("cumprod.out", cumprod_out);
  m.impl("cumprod_", cumprod_inplace);
  m.impl("logcumsumexp", logcumsumexp_fn);
  m.impl("cummax", cummax_fn);
  m.impl("cummin", cummin_fn);
  m.impl("_cummax_helper", cummax_helper_fn);
  m.impl("_cummin_helper", cummin_helper_fn);
  m.impl("sort", sort_fn);
  m.impl("sort.stable", sort_stable_fn);
  m.impl("sort.values_stable", sort_values_stable_fn);
  m.impl("topk", topk_fn);
  m.impl("topk.values", topk_out);
  m.impl("kthvalue", kthvalue_fn);
  m.impl("kthvalue.values", [](const at::Tensor& s, int64_t k, int64_t d, bool keep, at::Tensor& values,
                               at::Tensor& indices) {
    auto [v, i] = kthvalue_fn(s, k, d, keep);
    write_outs("kthvalue", {v, i}, {values, indices}, {s});
    return std::tuple<at::Tensor&, at::Tensor&>(values, indices);
  });
  m.impl("median", median_all_fn);
  m.impl("median.dim", median_dim_fn);
  m.impl("nanmedian", nanmedian_all_fn);
  m.impl("nanmedian.dim", nanmedian_dim_fn);
  m.impl("logcumsumexp.out", logcumsumexp_out);
  m.impl("_logcumsumexp", private_logcumsumexp);
  m.impl("_logcumsumexp.out", private_logcumsumexp_out);
}

}  // namespace torch_pjrt::device
