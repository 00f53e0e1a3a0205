// Transformer fast paths: packed attention, native multi-head attention, the encoder layer, masked
// softmax.
#include <ATen/WrapDimUtils.h>
#include <cmath>
#include <torch/library.h>

#include "aten/kernel_util.h"
#include "aten/nn_util.h"
#include "device/context.h"
#include "device/device_name.h"
#include "lowering/nn.h"
#include "lowering/ops.h"

namespace torch_pjrt::device {
namespace {

Tensor masked_fill_for(const Tensor& self, const Tensor& mask, std::optional<int64_t> mask_type, int64_t dim) {
  Tensor m = mask;
  if (mask_type && *mask_type == 1 && self.dim() == 4 && m.dim() == 2) m = m.view({m.size(0), 1, 1, m.size(1)});
  TORCH_CHECK(m.scalar_type() == at::kBool, "Mask should be a boolean tensor");
  (void)dim;
  return m.expand(self.sizes());
}
Tensor masked_softmax(const Tensor& self, const Tensor& mask, std::optional<int64_t> dim, std::optional<int64_t> mask_type) {
  int64_t d = at::maybe_wrap_dim(dim.value_or(-1), self.dim());
  Tensor m = masked_fill_for(self, mask, mask_type, d);
  // Masked positions are -inf, so they get 0; a fully masked row is NaN, as on CPU.
  return at::softmax(self.masked_fill(m, -std::numeric_limits<double>::infinity()), d);
}
Tensor masked_softmax_backward(const Tensor& grad, const Tensor& output, const Tensor& mask, std::optional<int64_t> dim) {
  int64_t d = at::maybe_wrap_dim(dim.value_or(-1), output.dim());
  Tensor m = mask.expand(output.sizes());
  Tensor g = grad.masked_fill(m, 0);
  return (output * (g - (g * output).sum(d, /*keepdim=*/true))).masked_fill(m, 0);
}

// Attention of [B, T, E] inputs with packed projections, as the fused CPU
// kernels compute it; mask (bool: true is masked out, else additive) of
// mask_type 0 [T, S], 1 [B, S] (key padding) or 2 (broadcastable to [B, H, T, S]).
std::pair<Tensor, Tensor> packed_attention(const Tensor& query, const Tensor& key, const Tensor& value, int64_t heads,
                                           const Tensor& qkv_weight, const Tensor& qkv_bias, const Tensor& proj_weight,
                                           const Tensor& proj_bias, const std::optional<Tensor>& mask,
                                           std::optional<int64_t> mask_type) {
  TORCH_CHECK(query.dim() == 3, "attention fast path: expected [B, T, E] inputs, got ", query.sizes());
  int64_t b = query.size(0), t = query.size(1), e = query.size(2), s = key.size(1);
  TORCH_CHECK(e % heads == 0, "attention fast path: embed_dim must be divisible by num_heads");
  int64_t d = e / heads;
  auto w = qkv_weight.chunk(3, 0);
  auto bias = qkv_bias.chunk(3, 0);
  auto heads_of = [&](const Tensor& x, int64_t len) { return x.view({b, len, heads, d}).transpose(1, 2); };
  Tensor q = heads_of(at::linear(query, w[0], bias[0]), t);
  Tensor k = heads_of(at::linear(key, w[1], bias[1]), s);
  Tensor v = heads_of(at::linear(value, w[2], bias[2]), s);
  Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
  if (mask && mask->defined()) {
    Tensor m = *mask;
    if (mask_type && *mask_type == 1) m = m.view({b, 1, 1, s});
    if (m.scalar_type() == at::kBool) {
      scores = scores.masked_fill(m, -std::numeric_limits<double>::infinity());
    } else {
      scores = scores + m.to(scores.scalar_type());
    }
  }
  Tensor weights = at::softmax(scores, -1);
  Tensor out = at::matmul(weights, v).transpose(1, 2).reshape({b, t, e});
  return {at::linear(out, proj_weight, proj_bias), weights};
}

std::tuple<Tensor, Tensor> native_mha(const Tensor& query, const Tensor& key, const Tensor& value, int64_t embed_dim,
                                      int64_t num_heads, const Tensor& qkv_weight, const Tensor& qkv_bias,
                                      const Tensor& proj_weight, const Tensor& proj_bias, const std::optional<Tensor>& mask,
                                      bool need_weights, bool average_attn_weights, std::optional<int64_t> mask_type) {
  TORCH_CHECK(query.size(-1) == embed_dim, "_native_multi_head_attention: query's last dim must be embed_dim");
  auto [out, weights] = packed_attention(query, key, value, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                         mask, mask_type);
  if (!need_weights) return {out, at::empty({0}, query.options())};
  return {out, average_attn_weights ? weights.mean(1) : weights};
}

Tensor transformer_encoder_layer(const Tensor& src, int64_t embed_dim, int64_t num_heads, const Tensor& qkv_weight,
                                 const Tensor& qkv_bias, const Tensor& proj_weight, const Tensor& proj_bias,
                                 bool use_gelu, bool norm_first, double eps, const Tensor& norm_weight_1,
                                 const Tensor& norm_bias_1, const Tensor& norm_weight_2, const Tensor& norm_bias_2,
                                 const Tensor& ffn_weight_1, const Tensor& ffn_bias_1, const Tensor& ffn_weight_2,
                                 const Tensor& ffn_bias_2, const std::optional<Tensor>& mask,
                                 std::optional<int64_t> mask_type) {
  TORCH_CHECK(!src.is_nested(), "_transformer_encoder_layer_fwd: nested tensors are not supported on ", device_name());
  std::vector<int64_t> shape{embed_dim};
  auto norm = [&](const Tensor& x, const Tensor& w, const Tensor& b) { return at::layer_norm(x, shape, w, b, eps); };
  auto attend = [&](const Tensor& x) {
    return packed_attention(x, x, x, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type).first;
  };
  auto ffn = [&](const Tensor& x) {
    Tensor h = at::linear(x, ffn_weight_1, ffn_bias_1);
    h = use_gelu ? at::gelu(h) : at::relu(h);
    return at::linear(h, ffn_weight_2, ffn_bias_2);
  };
  Tensor x = src;
  if (norm_first) {
    x = x + attend(norm(x, norm_weight_1, norm_bias_1));
    return x + ffn(norm(x, norm_weight_2, norm_bias_2));
  }
  x = norm(x + attend(x), norm_weight_1, norm_bias_1);
  return norm(x + ffn(x), norm_weight_2, norm_bias_2);
}

// There are no nested tensors on pjrt: answering "not left aligned" makes
// nn.TransformerEncoder keep padded batches dense (masked attention through the
// kernels above) instead of converting them to nested tensors, which would fail.
bool nested_mask_left_aligned(const Tensor&, const Tensor&) { return false; }

constexpr const char* kPagedAttention = "torch_pjrt::paged_attention";

void check_paged_attention(const Tensor& query, const Tensor& kv_cache, const Tensor& block_rows, const Tensor& positions, int64_t sliding_window, double soft_cap,
                           int64_t chunk_blocks) {
  const char* op = kPagedAttention;
  TORCH_CHECK(query.dim() == 4, op, ": expected query [tiles, rows per tile, heads, head_size], got ", query.sizes());
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2, op,
              ": expected kv_cache [2 (keys, values), blocks, kv_heads, block_size, head_size], got ", kv_cache.sizes());
  TORCH_CHECK(at::isFloatingType(query.scalar_type()) && at::isFloatingType(kv_cache.scalar_type()), op,
              ": expected a floating-point query and kv_cache, got ", query.scalar_type(), " and ",
              kv_cache.scalar_type());
  TORCH_CHECK(kv_cache.size(4) == query.size(3), op, ": the cache's head size ", kv_cache.size(4),
              " is not the query's ", query.size(3));
  TORCH_CHECK(kv_cache.size(2) > 0 && query.size(2) % kv_cache.size(2) == 0, op, ": ", query.size(2),
              " query heads are not a multiple of ", kv_cache.size(2), " key/value heads");
  auto integers = [](const Tensor& t) { return !at::isFloatingType(t.scalar_type()) && t.scalar_type() != at::kBool; };
  TORCH_CHECK(block_rows.dim() == 2 && block_rows.size(0) == query.size(0) && block_rows.size(1) > 0 &&
                  integers(block_rows),
              op, ": expected block_rows [tiles, blocks per request] of integers for ", query.size(0), " tiles, got ",
              block_rows.scalar_type(), " ", block_rows.sizes());
  TORCH_CHECK(positions.dim() == 2 && positions.size(0) == query.size(0) && positions.size(1) == query.size(1) &&
                  integers(positions),
              op, ": expected positions [tiles, rows per tile] of integers for ", query.size(0), " x ", query.size(1),
              " query rows, got ", positions.scalar_type(), " ", positions.sizes());
  TORCH_CHECK(sliding_window >= 0 && soft_cap >= 0 && chunk_blocks >= 1, op,
              ": expected sliding_window >= 0, soft_cap >= 0 and chunk_blocks >= 1, got ", sliding_window, ", ",
              soft_cap, " and ", chunk_blocks);
}

// The definition, on any device: every row scores its tile's whole block table, masked to the
// positions it sees (the pjrt kernel computes the same over the chunks in use).
Tensor paged_attention_reference(const Tensor& query, const Tensor& kv_cache, const Tensor& block_rows,
                                 const Tensor& positions, double scale, int64_t sliding_window, double soft_cap,
                                 int64_t chunk_blocks) {
  check_paged_attention(query, kv_cache, block_rows, positions, sliding_window, soft_cap, chunk_blocks);
  const int64_t tiles = query.size(0), rows = query.size(1), heads = query.size(2), head_size = query.size(3);
  const int64_t kv_heads = kv_cache.size(2), table = block_rows.size(1), block_size = kv_cache.size(3);
  const int64_t context = table * block_size;
  const at::ScalarType acc_type = query.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;  // at least float32
  auto gathered = [&](const Tensor& cache) {  // [S, L, KVH, D], in position order
    return cache.index_select(0, block_rows.reshape(-1).to(at::kLong))
        .view({tiles, table, kv_heads, block_size, head_size})
        .transpose(2, 3)
        .reshape({tiles, context, kv_heads, head_size})
        .to(acc_type);
  };
  Tensor q = query.reshape({tiles, rows, kv_heads, heads / kv_heads, head_size}).to(acc_type);
  Tensor scores = at::einsum("sqkgd,slkd->sqkgl", {q, gathered(kv_cache[0])}) * scale;
  if (soft_cap > 0) scores = at::tanh(scores / soft_cap) * soft_cap;
  Tensor place = at::arange(context, positions.options().dtype(at::kLong)).view({1, 1, context});
  Tensor own = positions.to(at::kLong).unsqueeze(2);
  Tensor visible = place <= own;
  if (sliding_window > 0) visible = visible & (place > own - sliding_window);
  visible = visible.view({tiles, rows, 1, 1, context});
  scores = scores.masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity());
  // A padding row (position -1) sees nothing: 0, not softmax's NaN.
  Tensor weights = at::softmax(scores, -1).masked_fill(visible.logical_not(), 0);
  Tensor out = at::einsum("sqkgl,slkd->sqkgd", {weights, gathered(kv_cache[1])});
  return out.reshape({tiles, rows, heads, head_size}).to(query.scalar_type());
}

Tensor paged_attention(const Tensor& query, const Tensor& kv_cache, const Tensor& block_rows, const Tensor& positions,
                       double scale, int64_t sliding_window, double soft_cap, int64_t chunk_blocks) {
  check_paged_attention(query, kv_cache, block_rows, positions, sliding_window, soft_cap, chunk_blocks);
  for (const Tensor* t : {&kv_cache, &block_rows, &positions}) {
    TORCH_CHECK(t->device() == query.device(), kPagedAttention, ": expected every input on ", query.device(),
                ", got one on ", t->device());
  }
  OpBuilder op(kPagedAttention);
  L::PagedAttentionParams params{scale, sliding_window, soft_cap, chunk_blocks};
  params.host_kernel = query.scalar_type() == at::kFloat && kv_cache.scalar_type() == at::kFloat &&
                       device::rt().host_kernels();
  Value out = L::paged_attention(op.b(), op.input(query), op.input(kv_cache), op.input(block_rows),
                                 op.input(positions), params);
  return finish(op, op.b().convert(out, to_ir(query.scalar_type())), query.scalar_type(), nullptr);
}

}  // namespace

// torch_pjrt's own operators. paged_attention: vLLM's paged KV cache read by a ragged batch of queries
// in tiles of one request each (see lowering/nn.h); chunk_blocks sets the pjrt kernel's chunk of
// context, not the result.
TORCH_LIBRARY(torch_pjrt, m) {
  m.def("paged_attention(Tensor query, Tensor kv_cache, Tensor block_rows, Tensor positions, float scale, "
        "int sliding_window=0, float soft_cap=0., int chunk_blocks=16) -> Tensor");
}

TORCH_LIBRARY_IMPL(torch_pjrt, CompositeExplicitAutograd, m) {
  m.impl("paged_attention", paged_attention_reference);
}

TORCH_LIBRARY_IMPL(torch_pjrt, PrivateUse1, m) {
  m.impl("paged_attention", paged_attention);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_native_multi_head_attention", native_mha);
  m.impl("_transformer_encoder_layer_fwd", transformer_encoder_layer);
  m.impl("_nested_tensor_from_mask_left_aligned", nested_mask_left_aligned);
  m.impl("_masked_softmax", masked_softmax);
  m.impl("_masked_softmax_backward", masked_softmax_backward);
}

}  // namespace torch_pjrt::device
