// Argument helpers shared by the neural-network kernels (convolution, pooling, resampling ...).
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "aten/kernel_util.h"

namespace torch_pjrt::device {



// Expands a 1-element list (or an empty one, to `fallback`) to n entries.
inline std::vector<int64_t> expand_param(c10::IntArrayRef v, size_t n, const char* op, const char* what,
                                  c10::IntArrayRef fallback = {}) {
  if (v.empty() && !fallback.empty()) v = fallback;
  TORCH_CHECK(v.size() == 1 || v.size() == n, op, ": ", what, " must be a single int or a tuple of ", n,
              " ints, got ", v);
  return v.size() == 1 ? std::vector<int64_t>(n, v[0]) : vec(v);
}

inline std::vector<int64_t> spatial(const at::Tensor& t, size_t n) {
  return std::vector<int64_t>(t.sizes().end() - static_cast<int64_t>(n), t.sizes().end());
}

inline at::Tensor undefined_unless(bool keep, const at::Tensor& t) { return keep ? t : at::Tensor(); }

}  // namespace torch_pjrt::device
