// Linear algebra over batched matrices [..., m, n] (torch.linalg's contracts).
// Cholesky and triangular solves are StableHLO ops; eigh and Householder QR
// are custom calls XLA's compiler expands on every backend; LU with partial
// pivoting is a stablehlo.while loop here. Torch-free.
#pragma once

#include <vector>

#include "ir/builder.h"

namespace torch_pjrt::lowering {

using ir::Builder;
using ir::DType;
using ir::Value;

// Swaps the last two dims, conjugating when `conj` (the adjoint).
Value matrix_transpose(Builder& b, Value a, bool conj);
// Identity matrices [batch..., n, n] of a dtype.
Value eye(Builder& b, DType dtype, const std::vector<int64_t>& batch, int64_t n);
// Lower (k <= 0 below the diagonal) / upper triangle; the rest zero.
Value tril(Builder& b, Value a, int64_t k);
Value triu(Builder& b, Value a, int64_t k);
// The main diagonal [..., min(m, n)].
Value diagonal(Builder& b, Value a);

// Cholesky factor; where the input is not positive definite the factor holds
// NaN. info: first 1-based column with a non-positive or NaN pivot, else 0 (s32).
std::vector<Value> cholesky(Builder& b, Value a, bool upper);

// Eigenvalues (ascending, real) and eigenvectors of Hermitian matrices,
// reading the `lower` triangle.
std::vector<Value> eigh(Builder& b, Value a, bool lower);

// Householder QR in LAPACK's geqrf form: {reflectors and R, tau}.
std::vector<Value> geqrf(Builder& b, Value a);
// The product of the reflectors (LAPACK orgqr / torch.linalg.householder_product): [..., m, tau's length... n].
Value householder_product(Builder& b, Value reflectors, Value tau);
// mode: "reduced", "complete" or "r" (Q is then empty).
std::vector<Value> qr(Builder& b, Value a, const std::string& mode);

// LU with partial pivoting: {LU (L unit lower, U upper, packed), pivots (s32,
// 1-based, LAPACK's), permutation (s32: row i of P^T A is row perm[i] of A),
// info (s32: first 1-based zero pivot, else 0)}.
std::vector<Value> lu_factor(Builder& b, Value a);
// The row permutation of LAPACK pivots (sequential swaps), [..., m] s32.
Value permutation_of_pivots(Builder& b, Value pivots, int64_t m);
// Solves op(A) X = B from A's LU (op: "N", "T" or "H"); B [..., n, k].
Value lu_solve(Builder& b, Value lu, Value perm, Value rhs, const std::string& op);
// P (as a matrix of lu's dtype) from a permutation.
Value permutation_matrix(Builder& b, Value perm, DType dtype);
// Determinant from an LU factorization: {det}, and {sign, log|det|}.
Value lu_det(Builder& b, Value lu, Value pivots);
std::vector<Value> lu_slogdet(Builder& b, Value lu, Value pivots);

// Thin or full SVD through the Hermitian eigenproblem of [[0, A], [A^H, 0]]:
// {U, S (descending, real), Vh}.
std::vector<Value> svd(Builder& b, Value a, bool full_matrices);

// exp(A) by scaling and squaring: each matrix scaled by 2^-s to 1-norm <= 1, a
// Taylor polynomial (degree 18 in f64, 12 in f32; truncation below the
// dtype's rounding), then squared s times in a loop (s per matrix).
Value matrix_exp(Builder& b, Value a);

}  // namespace torch_pjrt::lowering
