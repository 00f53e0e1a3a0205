// ATen-level lowerings: one function per op family, building IR with PyTorch's
// semantics. Torch-free: callers translate tensors/scalars into ir::Values and
// pass resolved dtypes and dims. Every execution mode (strict eager, fused
// eager, torch.compile) calls these; none may assume it runs alone.
#pragma once

#include <string>
#include <vector>

#include "ir/builder.h"
#include "lowering/pointwise.h"

namespace torch_pjrt::lowering {

using ir::Builder;
using ir::DType;
using ir::Value;

// The dtype reductions accumulate in: f32 for f16/bf16, else the dtype itself.
DType accumulate_type(DType d);
// Smallest / largest value of a dtype (-inf / +inf for floats), as a splat of `dims`.
Value lowest(Builder& b, DType d, const std::vector<int64_t>& dims = {});
Value highest(Builder& b, DType d, const std::vector<int64_t>& dims = {});

// Reductions over `dims` (empty = all). Low-precision floats accumulate in f32.
Value sum(Builder& b, Value x, std::vector<int64_t> dims, bool keepdim, DType out);
Value mean(Builder& b, Value x, std::vector<int64_t> dims, bool keepdim, DType out);
Value prod(Builder& b, Value x, std::vector<int64_t> dims, bool keepdim, DType out);
Value amax(Builder& b, Value x, std::vector<int64_t> dims, bool keepdim, bool is_max);
Value any_all(Builder& b, Value x, std::vector<int64_t> dims, bool keepdim, bool is_all);
// Returns {values, int64 indices} of max/min along dim (first occurrence, NaN wins).
std::vector<Value> arg_reduce(Builder& b, Value x, int64_t dim, bool keepdim, bool is_max);
// Vector p-norm over `dims` (empty = all): p in {inf, -inf, 0, 1, 2} or any p > 0.
Value vector_norm(Builder& b, Value x, double p, std::vector<int64_t> dims, bool keepdim, DType out);
Value var(Builder& b, Value x, std::vector<int64_t> dims, double correction, bool keepdim, DType out);
// The Hurwitz zeta function zeta(s, q) = sum_k (q + k)^-s with Cephes' (torch's) domain:
// negative non-integer q for integer s, +inf at poles, NaN for s < 1.
Value hurwitz_zeta(Builder& b, Value s, Value q);
// The n-th derivative of digamma, accurate for negative x (reflected), with torch's poles.
Value polygamma(Builder& b, int64_t n, Value x);
Value logsumexp(Builder& b, Value x, std::vector<int64_t> dims, bool keepdim, DType out);
// zero_empty_rows: rows of only -inf give zeros (torch's _safe_softmax) instead of NaN.
Value softmax(Builder& b, Value x, int64_t dim, bool log, DType out, bool zero_empty_rows = false);
Value softmax_backward(Builder& b, Value grad, Value out, int64_t dim, bool log, DType dtype);

// Linear algebra.
Value matmul_2d(Builder& b, Value x, Value y, DType out);  // [n,k]x[k,m]
// Whether the host kernel kernels::kHostFewRowProduct serves a float32 product of these sizes
// better than XLA's dot: few rows, weights large enough that reading them is the work.
bool few_row_product_fits(DType x, DType w, DType out, int64_t rows, int64_t depth, int64_t columns,
                          bool weight_transposed);
// x [M,K] times w [K,N], or times the transpose of w [N,K] (weight_transposed: w as a linear
// layer keeps it), by that host kernel (Runtime::host_kernels() must hold).
Value few_row_product(Builder& b, Value x, Value w, bool weight_transposed);
Value bmm(Builder& b, Value x, Value y, DType out);        // [b,n,k]x[b,k,m]
Value dot(Builder& b, Value x, Value y, DType out);

// Orthogonal polynomials of degree n (truncated to an integer; negative: 0)
// by their three-term recurrences, in one loop up to the largest n:
// "chebyshev_t/u/v/w", "shifted_chebyshev_t/u/v/w", "hermite_h", "hermite_he",
// "laguerre_l", "legendre_p". x is in the compute dtype; n any numeric type.
Value orthogonal_polynomial(Builder& b, const std::string& family, Value x, Value n);
// Regularized incomplete gamma functions P(a, x) (upper: Q = 1 - P), computed
// in f64: the power series below x = a + 1, a continued fraction (modified
// Lentz) above, both in one loop until every element converged.
Value igamma(Builder& b, Value a, Value x, bool upper);
// Bessel functions of the first (J) and second (Y) kind of order 0 or 1, in
// f64: power series (A&S 9.1.10/9.1.11) below |x| = 12, Hankel's asymptotic
// expansion (20 terms, coefficients generated) above.
Value bessel_jy(Builder& b, Value x, int order, bool second_kind);
// Elementwise gcd of integers (Euclid's algorithm in one loop), non-negative.
Value gcd(Builder& b, Value x, Value y);

// Discrete Fourier transforms over `dims` (ATen's _fft_* contract): kind "c2c"
// (forward or inverse), "r2c" (one-sided: the last of dims is halved) or "c2r"
// (last_dim_size: the real length of the last of dims). normalization: 0 none,
// 1 by 1/sqrt(n), 2 by 1/n, n the product of the transformed (signal) sizes.
Value fft(Builder& b, Value x, std::vector<int64_t> dims, const std::string& kind, bool forward,
          int64_t normalization, int64_t last_dim_size);

// Shapes and indexing.
Value cat(Builder& b, const std::vector<Value>& xs, int64_t dim, DType out);
Value index_select(Builder& b, Value x, int64_t dim, Value index);
// out[i][j] = x[i][index[i][j]] along dim (torch.gather).
Value gather(Builder& b, Value x, int64_t dim, Value index);
// torch.searchsorted: for each value, the index ATen's binary search over the last dim of
// `sorted` ends at (its first element not < v; not <= v with `right`), so an unsorted row
// or a NaN gives the same answer as there. sorted is 1-D, or shaped like values but for
// its last dim; both of one dtype. Result S64, shaped like values.
Value searchsorted(Builder& b, Value sorted, Value values, bool right);
// torch.scatter / scatter_add along dim; reduce "" (overwrite), "add", "mul", "amax", "amin"
// (NaN-propagating, as scatter_reduce), or "max" (XLA's maximum, as embedding_bag's running `>`).
Value scatter(Builder& b, Value x, int64_t dim, Value index, Value src, const std::string& reduce);
// Advanced indexing: x[indices...] where indices[k] (or invalid) index dim k, all
// broadcast together; the indexed dims must be adjacent or leading (caller permutes).
Value index(Builder& b, Value x, const std::vector<Value>& indices);
Value index_put(Builder& b, Value x, const std::vector<Value>& indices, Value values, bool accumulate);
// True if any index is outside [-size, size): out-of-range detection for sync-time checks.
Value index_out_of_range(Builder& b, Value index, int64_t size);
Value wrap_index(Builder& b, Value index, int64_t size);
// Updates that keep x unchanged when an index is out of range, as ATen does by raising before it
// writes (here the error comes at the next sync): indices are clamped into range and, when one
// was bad, every update writes back the element it would replace or adds -0. That costs the
// update, not a pass over x, so a small write into a large tensor (a KV cache) stays small and
// can run in place. The out-of-range condition (i1[], for the sync-time error) goes to `bad`:
// one per index for index_put, one for scatter.
Value guarded_index_put(Builder& b, Value x, const std::vector<Value>& indices, Value values, bool accumulate,
                        std::vector<Value>* bad);
// scatter with reduce "" (overwrite) or "add".
Value guarded_scatter(Builder& b, Value x, int64_t dim, Value index, Value src, const std::string& reduce, Value* bad);

// Normalization and losses.
std::vector<Value> layer_norm(Builder& b, Value x, const Value* weight, const Value* bias,
                              int64_t normalized_ndim, double eps);
std::vector<Value> layer_norm_backward(Builder& b, Value grad, Value x, Value mean, Value rstd,
                                       const Value* weight, int64_t normalized_ndim);
// nll_loss on [N, C] or [C] log-probabilities; reduction 0 none, 1 mean, 2 sum.
std::vector<Value> nll_loss(Builder& b, Value logp, Value target, const Value* weight,
                            int64_t reduction, int64_t ignore_index);
Value nll_loss_backward(Builder& b, Value grad, Value logp, Value target, const Value* weight,
                        int64_t reduction, int64_t ignore_index, Value total_weight);
Value embedding_backward(Builder& b, Value grad, Value indices, int64_t num_weights,
                         int64_t padding_idx);

// Random: uniform [0,1) in dtype from fresh bits; returns {new_state, values}.
std::vector<Value> uniform(Builder& b, Value state, DType dtype, const std::vector<int64_t>& dims);
std::vector<Value> normal(Builder& b, Value state, DType dtype, const std::vector<int64_t>& dims);

}  // namespace torch_pjrt::lowering
