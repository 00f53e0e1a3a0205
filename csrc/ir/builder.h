// Typed helpers that append StableHLO ops to a Graph and infer result types.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace torch_pjrt::ir {

std::string i64_array(const std::vector<int64_t>& v);  // array<i64: 1, 2>
std::string int_list(const std::vector<int64_t>& v);   // [1, 2]

// The precision of dots and convolutions (torch.set_float32_matmul_precision:
// highest, high, medium), written into every program's precision_config. The
// device layer names where to read it; it is read only when a dot or a
// convolution is built (default: Highest).
enum class DotPrecision { Default, High, Highest };
using DotPrecisionSource = DotPrecision (*)();
void set_dot_precision_source(DotPrecisionSource source);
DotPrecision dot_precision();
// Whether long floating-point sums are emitted in blocks (Builder::blocked_sum): for plugins
// whose reductions add a long run into a few accumulators (XLA's CPU code). GPU and TPU
// compilers reduce in trees already, and the blocks' barrier would split their fusions.
void set_blocked_sums(bool on);
bool blocked_sums();

class Builder {
 public:
  explicit Builder(Graph& g) : g_(g) {}
  Graph& graph() { return g_; }
  const Type& type(Value v) const { return g_.type(v); }
  DType dtype(Value v) const { return g_.type(v).dtype; }
  const std::vector<int64_t>& dims(Value v) const { return g_.type(v).dims; }

  Value constant(DType dtype, double value, const std::vector<int64_t>& dims = {});
  Value constant_int(DType dtype, int64_t value, const std::vector<int64_t>& dims = {});
  Value iota(DType dtype, const std::vector<int64_t>& dims, int64_t dim);
  // A constant holding `values` (row-major) in dtype F32, F64 or S64.
  Value constant_array(DType dtype, const std::vector<double>& values, const std::vector<int64_t>& dims);

  Value convert(Value v, DType dtype);
  // Reinterprets bits; handles different element sizes by adding/removing a minor dim.
  Value bitcast_flat(Value flat, DType dtype);
  Value reshape(Value v, const std::vector<int64_t>& dims);
  Value broadcast_in_dim(Value v, const std::vector<int64_t>& dims,
                         const std::vector<int64_t>& mapping);
  // numpy-style broadcast of v to dims (trailing alignment).
  Value broadcast_to(Value v, const std::vector<int64_t>& dims);
  Value transpose(Value v, const std::vector<int64_t>& perm);
  Value slice(Value v, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
              const std::vector<int64_t>& strides);
  Value slice_dim(Value v, int64_t dim, int64_t start, int64_t limit, int64_t step = 1);
  Value dynamic_slice(Value v, const std::vector<Value>& starts, const std::vector<int64_t>& sizes);
  Value dynamic_update_slice(Value v, Value update, const std::vector<Value>& starts);
  Value concatenate(const std::vector<Value>& vs, int64_t dim);
  Value pad(Value v, Value pad_value, const std::vector<int64_t>& low,
            const std::vector<int64_t>& high, const std::vector<int64_t>& interior);
  Value reverse(Value v, const std::vector<int64_t>& dims);

  // "exponential", "log", "negate" ... (stablehlo); a dotted name ("chlo.lgamma") is used as is.
  Value unary(const std::string& op, Value v);
  Value binary(const std::string& op, Value a, Value b);  // same shapes and dtypes
  // Complex parts: real/imag of a real value are the value and zeros.
  Value real(Value v);
  Value imag(Value v);
  Value complex(Value re, Value im);  // f32 parts -> c64, f64 -> c128
  Value conj(Value v);                // identity on real values
  // stablehlo.fft over the trailing len(lengths) dims; type FFT, IFFT, RFFT
  // or IRFFT (XLA's IFFT and IRFFT divide by the transform size).
  Value fft(Value v, const std::string& fft_type, const std::vector<int64_t>& lengths);
  // Compare: direction EQ NE LT LE GT GE; result i1.
  Value compare(Value a, Value b, const std::string& direction);
  Value select(Value pred, Value on_true, Value on_false);
  Value clamp(Value lo, Value v, Value hi);

  Value dot_general(Value a, Value b, const std::vector<int64_t>& lhs_batch,
                    const std::vector<int64_t>& rhs_batch, const std::vector<int64_t>& lhs_contract,
                    const std::vector<int64_t>& rhs_contract, DType result);

  // Convolution with explicit dimension numbers ("[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]");
  // padding holds (low, high) per spatial dim.
  Value convolution(Value lhs, Value rhs, const std::string& dimension_numbers,
                    const std::vector<int64_t>& window_strides,
                    const std::vector<std::pair<int64_t, int64_t>>& padding,
                    const std::vector<int64_t>& lhs_dilation, const std::vector<int64_t>& rhs_dilation,
                    int64_t feature_group_count, int64_t batch_group_count,
                    const std::vector<int64_t>& result_dims, DType result);

  // Reduces `inputs` over `dims` with a body built by `body(builder, lhs_args, rhs_args)`.
  using ReduceBody =
      std::function<std::vector<Value>(Builder&, const std::vector<Value>&, const std::vector<Value>&)>;
  std::vector<Value> reduce(const std::vector<Value>& inputs, const std::vector<Value>& inits,
                            const std::vector<int64_t>& dims, const ReduceBody& body);
  // Windowed reduction (pooling, cumulative scans); padding holds (low, high) per dim.
  struct Window {
    std::vector<int64_t> dims, strides, base_dilations, window_dilations;
    std::vector<std::pair<int64_t, int64_t>> padding;
  };
  std::vector<Value> reduce_window(const std::vector<Value>& inputs, const std::vector<Value>& inits,
                                   const Window& window, const ReduceBody& body);
  Value reduce_window_simple(Value input, Value init, const Window& window, const std::string& op);
  // op: "stablehlo.add", "stablehlo.maximum" ... With blocked_sums(), a floating-point sum of
  // kBlockedSumFrom or more elements is taken in blocks (blocked_sum).
  Value reduce_simple(Value input, Value init, const std::vector<int64_t>& dims,
                      const std::string& op);
  // Sums of kSumBlock elements, then sums of those (again in blocks while many): the rounding
  // error grows with the blocks' lengths rather than with n, as ATen's cascade sum keeps it
  // (XLA's CPU code adds a long row into a few accumulators: 10x the CPU's error at 8k elements).
  Value blocked_sum(Value input, Value init, const std::vector<int64_t>& dims);
  static constexpr int64_t kSumBlock = 128;
  static constexpr int64_t kBlockedSumFrom = 4096;

  // Gathers rows: operand[indices[..., :]] with explicit dimension numbers.
  Value gather(Value operand, Value indices, const std::vector<int64_t>& offset_dims,
               const std::vector<int64_t>& collapsed_slice_dims,
               const std::vector<int64_t>& start_index_map, int64_t index_vector_dim,
               const std::vector<int64_t>& slice_sizes, const std::vector<int64_t>& result_dims);
  // Scatter with combiner op ("" = overwrite, "stablehlo.add" = accumulate; "nan_maximum" /
  // "nan_minimum": a NaN on either side wins).
  Value scatter(Value operand, Value indices, Value updates,
                const std::vector<int64_t>& update_window_dims,
                const std::vector<int64_t>& inserted_window_dims,
                const std::vector<int64_t>& scatter_dims_to_operand_dims, int64_t index_vector_dim,
                const std::string& combiner);
  // Sorts along dim; comparator compares the first operand (ascending or descending).
  std::vector<Value> sort(const std::vector<Value>& operands, int64_t dim, bool descending,
                          bool stable);
  // rng_bit_generator (THREE_FRY): returns {new_state, bits}.
  std::vector<Value> rng_bits(Value state, DType bits_dtype, const std::vector<int64_t>& dims);

  // stablehlo.while over loop-carried `init` values (regions see only the
  // carried values: anything else a body needs is carried too).
  using LoopCond = std::function<Value(Builder&, const std::vector<Value>&)>;
  using LoopBody = std::function<std::vector<Value>(Builder&, const std::vector<Value>&)>;
  std::vector<Value> while_loop(const std::vector<Value>& init, const LoopCond& cond, const LoopBody& body);
  // A custom call the plugin's compiler expands itself (XLA's "Eigh", "Qr" ...).
  std::vector<Value> custom_call(const std::string& target, const std::vector<Value>& operands,
                                 const std::vector<Type>& results, const std::string& backend_config = "");
  // A typed FFI custom call (api_version 4): a handler registered with the plugin;
  // `attributes` is the body of its backend_config dictionary ("scale = 1.0 : f64").
  std::vector<Value> ffi_call(const std::string& target, const std::vector<Value>& operands,
                              const std::vector<Type>& results, const std::string& attributes);
  // Batched [..., n, n] factorizations and solves (XLA expands both on every backend).
  Value cholesky(Value a, bool lower);
  // transpose_a: NO_TRANSPOSE, TRANSPOSE or ADJOINT.
  Value triangular_solve(Value a, Value b, bool left_side, bool lower, bool unit_diagonal,
                         const std::string& transpose_a);

  // Broadcasted elementwise helpers (numpy rules).
  Value bin_bcast(const std::string& op, Value a, Value b);
  Value cmp_bcast(Value a, Value b, const std::string& direction);
  Value scalar_like(Value like, double value);  // splat constant of like's dtype and shape

 private:
  // The scalar (lhs..., rhs...) -> results region of reduce and reduce_window.
  std::shared_ptr<Graph> combiner_region(const std::vector<Value>& inputs, const ReduceBody& body);
  Graph& g_;
};

std::vector<int64_t> broadcast_shapes(const std::vector<int64_t>& a, const std::vector<int64_t>& b);

}  // namespace torch_pjrt::ir
