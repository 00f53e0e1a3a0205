// Neural-network lowerings (torch-free): convolution, pooling, normalization,
// resampling, padding, scans and sorting, losses. Like ops.h, callers pass IR
// values and resolved attributes; every execution mode shares these.
#pragma once

#include <vector>

#include "lowering/ops.h"

namespace torch_pjrt::lowering {

// Convolution over N spatial dims. x [B, Cin, S...], w [Cout, Cin/groups, K...].
struct ConvParams {
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups = 1;
};
// Output spatial size of a forward convolution.
std::vector<int64_t> conv_output_size(const std::vector<int64_t>& in_spatial, const std::vector<int64_t>& kernel,
                                      const ConvParams& p);
Value conv_forward(Builder& b, Value x, Value w, const ConvParams& p);
// Gradient w.r.t. the input of conv_forward (also: transposed convolution), for input spatial size `in_spatial`.
Value conv_input_grad(Builder& b, Value grad, Value w, const ConvParams& p, const std::vector<int64_t>& in_spatial);
// Gradient w.r.t. the weight of conv_forward, for kernel spatial size `kernel`.
Value conv_weight_grad(Builder& b, Value x, Value grad, const ConvParams& p, const std::vector<int64_t>& kernel);

// Pooling over the trailing N dims of x.
struct PoolParams {
  std::vector<int64_t> kernel, stride, padding, dilation;
  bool ceil_mode = false;
};
std::vector<int64_t> pool_output_size(const std::vector<int64_t>& in_spatial, const PoolParams& p);
// Returns {values, int64 indices flat within each spatial plane} (torch's max_pool*_with_indices).
std::vector<Value> max_pool(Builder& b, Value x, const PoolParams& p);
Value max_pool_backward(Builder& b, Value grad, Value indices, const std::vector<int64_t>& input_dims,
                        int64_t spatial_dims);
// divisor_override 0 means none (torch rejects 0 itself).
Value avg_pool(Builder& b, Value x, const PoolParams& p, bool count_include_pad, int64_t divisor_override);
Value avg_pool_backward(Builder& b, Value grad, const std::vector<int64_t>& input_dims, const PoolParams& p,
                        bool count_include_pad, int64_t divisor_override);
// Adaptive average pooling of the trailing dims to `out` sizes, and its backward.
Value adaptive_avg_pool(Builder& b, Value x, const std::vector<int64_t>& out);
Value adaptive_avg_pool_backward(Builder& b, Value grad, const std::vector<int64_t>& input_dims);

// Adaptive max pooling of the trailing out.size() dims: {values, int64 flat indices within each plane}.
std::vector<Value> adaptive_max_pool(Builder& b, Value x, const std::vector<int64_t>& out);

// im2col / col2im (F.unfold / F.fold) on [N, C, H, W] / [N, C*kh*kw, L].
struct Im2ColParams {
  std::vector<int64_t> kernel, dilation, padding, stride;
};
std::vector<int64_t> im2col_blocks(const std::vector<int64_t>& spatial, const Im2ColParams& p);
Value im2col(Builder& b, Value x, const Im2ColParams& p);
Value col2im(Builder& b, Value cols, const std::vector<int64_t>& output_size, const Im2ColParams& p);

// Contracts dim `dim` of x with a host matrix m[out][in] (row-major), placing `out` at `dim`.
Value apply_along(Builder& b, Value x, int64_t dim, const std::vector<double>& m, int64_t out, int64_t in);
// The transpose of a row-major [rows][cols] host matrix.
std::vector<double> transpose_matrix(const std::vector<double>& m, int64_t rows, int64_t cols);
// y.index_select(dim, idx) for a host index vector, and its adjoint (sums into `in` positions).
Value take_along(Builder& b, Value x, int64_t dim, const std::vector<int64_t>& idx);
Value take_along_backward(Builder& b, Value grad, int64_t dim, const std::vector<int64_t>& idx, int64_t in);

// Resampling of the trailing dims. scales[i] <= 0 means "not given".
std::vector<int64_t> nearest_indices(int64_t in, int64_t out, double scale, bool exact);
std::vector<double> linear_weights(int64_t in, int64_t out, bool align_corners, double scale);  // [out][in]
std::vector<double> cubic_weights(int64_t in, int64_t out, bool align_corners, double scale);   // [out][in]
// Antialiased resampling (interpolate(antialias=True), PIL's filters): the
// triangle (linear) or a = -0.5 cubic filter widened by the scale when
// downsampling, normalized per output. [out][in].
std::vector<double> antialias_weights(int64_t in, int64_t out, bool align_corners, double scale, bool cubic);

// Padding of the trailing dims: pads (low, high) per dim, outermost first.
std::vector<int64_t> reflect_indices(int64_t in, int64_t low, int64_t high);
std::vector<int64_t> replicate_indices(int64_t in, int64_t low, int64_t high);

// Attention over a paged KV cache (vLLM's layout) for a ragged batch of queries in tiles: a tile
// holds up to Q query rows of one request (a decode token alone, or Q tokens of a prefill), so its
// context is gathered once for all of them. Row (s, r) attends to slots 0..positions[s, r] (within
// the sliding window, when there is one) of its tile's blocks, block_rows[s], in position order; a
// row at position -1 is padding and gives 0. The context is read in chunks of `chunk_blocks`
// blocks with an online softmax, for as many chunks as the longest context needs (a loop whose
// trip count comes from `positions` at run time): the work grows with the context used, not with
// the block table's length, and one program serves every context length.
struct PagedAttentionParams {
  double scale = 1.0;
  int64_t sliding_window = 0;  // 0: none
  double soft_cap = 0.0;       // 0: none; else scores become tanh(s / cap) * cap
  int64_t chunk_blocks = 1;
  // A float32 query and cache through kernels::kHostPagedAttention (a custom call the
  // runtime registered: Runtime::host_kernels()), whose work is each row's own context.
  bool host_kernel = false;
};
// query [S, Q, H, D]; kv_cache [2, N, KVH, B, D] (keys, values; H a multiple of KVH); block_rows
// [S, M] and positions [S, Q], integers. Returns [S, Q, H, D] in float32 (float64 for a float64
// query).
Value paged_attention(Builder& b, Value query, Value kv_cache, Value block_rows, Value positions,
                      const PagedAttentionParams& p);

// Normalization. Returns {out, mean, invstd[, new_running_mean, new_running_var]}.
std::vector<Value> batch_norm(Builder& b, Value x, const Value* weight, const Value* bias, const Value* running_mean,
                              const Value* running_var, bool training, double momentum, double eps);
// Returns {grad_input, grad_weight, grad_bias}; `mean`/`invstd` are the saved (training) or running stats.
std::vector<Value> batch_norm_backward(Builder& b, Value grad, Value x, const Value* weight, Value mean, Value invstd,
                                       bool training);
std::vector<Value> group_norm(Builder& b, Value x, const Value* weight, const Value* bias, int64_t groups, double eps);
std::vector<Value> group_norm_backward(Builder& b, Value grad, Value x, Value mean, Value rstd, const Value* weight,
                                       int64_t groups);

// Scans along dim: op "sum", "prod", "logsumexp"; cum_extreme returns {values, int64 indices}.
Value cumulative(Builder& b, Value x, int64_t dim, const std::string& op);
std::vector<Value> cum_extreme(Builder& b, Value x, int64_t dim, bool is_max);
// Stable sort along dim: {values, int64 indices}; NaN sorts as the largest value.
std::vector<Value> sort_with_indices(Builder& b, Value x, int64_t dim, bool descending);

// Pointwise losses before reduction (reduction 0 none, 1 mean, 2 sum applied by reduce_loss).
Value reduce_loss(Builder& b, Value loss, int64_t reduction);
// Scales a loss gradient for `reduction` (grad is the scalar or elementwise upstream gradient).
Value loss_grad_scale(Builder& b, Value grad, const std::vector<int64_t>& dims, int64_t reduction);

// Recurrent cells over precomputed gate projections ([batch, k*hidden]; biases
// [k*hidden] or null), PyTorch's gate order. LSTM (i, f, g, o): {hy, cy,
// workspace = the activated gates}; its backward takes either gradient as null
// (zero) and returns {grad_gates, grad_cx, grad_bias (sum over the batch, or
// an empty value without bias)}. GRU (r, z, n): {hy, workspace = r, z, n, hx,
// hn}; its backward returns {grad_input_gates, grad_hidden_gates, grad_hx,
// grad_input_bias, grad_hidden_bias}.
std::vector<Value> lstm_cell(Builder& b, Value input_gates, Value hidden_gates, Value cx, const Value* input_bias,
                             const Value* hidden_bias);
std::vector<Value> lstm_cell_backward(Builder& b, const Value* grad_hy, const Value* grad_cy, Value cx, Value cy,
                                      Value workspace, bool has_bias);
std::vector<Value> gru_cell(Builder& b, Value input_gates, Value hidden_gates, Value hx, const Value* input_bias,
                            const Value* hidden_bias);
std::vector<Value> gru_cell_backward(Builder& b, Value grad_hy, Value workspace, bool has_bias);

// grid_sampler_2d/3d: input [N, C, (D,) H, W] sampled at grid [N, (Do,) Ho, Wo, S]
// (x, y(, z) in [-1, 1]); mode 0 (bi/tri)linear, 1 nearest, 2 bicubic (2-d only);
// padding 0 zeros, 1 border, 2 reflection. Backward: {grad_input, grad_grid}.
Value grid_sample(Builder& b, Value input, Value grid, int64_t mode, int64_t padding, bool align_corners);
std::vector<Value> grid_sample_backward(Builder& b, Value grad, Value input, Value grid, int64_t mode, int64_t padding,
                                        bool align_corners);

// CTC loss over log_probs [T, N, C] with padded targets [N, S] and per-sequence
// lengths [N]: {neg_log_likelihood [N], log_alpha [N, T, 2S + 1]}; the
// backward is the gradient with respect to log_probs ([T, N, C]).
std::vector<Value> ctc_loss(Builder& b, Value log_probs, Value targets, Value input_lengths, Value target_lengths,
                            int64_t blank);
Value ctc_loss_backward(Builder& b, Value grad, Value log_probs, Value targets, Value input_lengths, Value target_lengths,
                        Value nll, Value log_alpha, int64_t blank, bool zero_infinity);

// Fractional max pooling over the trailing k = kernel.size() dims of x [N, C,
// spatial...]: window starts from samples [N, C, k] (ordered as PyTorch's
// kernels read them: (W, H) in 2-d, (T, H, W) in 3-d) by PyTorch's interval
// rule, computed in the samples' dtype. {values, int64 flat indices into the
// spatial dims}.
std::vector<Value> fractional_max_pool(Builder& b, Value x, Value samples, const std::vector<int64_t>& kernel,
                                       const std::vector<int64_t>& output);

}  // namespace torch_pjrt::lowering
