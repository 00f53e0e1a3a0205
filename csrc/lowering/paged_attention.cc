// Paged attention (see nn.h): a loop over the chunks of context the batch uses, each chunk's keys
// and values gathered through the block table and folded into a running softmax.
#include <algorithm>
#include <cmath>

#include "lowering/nn.h"

namespace torch_pjrt::lowering {

Value paged_attention(Builder& b, Value query, Value key_cache, Value value_cache, Value block_rows, Value positions,
                      const PagedAttentionParams& p) {
  const std::vector<int64_t> qd = b.dims(query), kd = b.dims(key_cache);
  const int64_t tokens = qd[0], heads = qd[1], head_size = qd[2];
  const int64_t block_size = kd[1], kv_heads = kd[2];
  const int64_t group = heads / kv_heads;
  const int64_t table = b.dims(block_rows)[1];
  const int64_t chunk = std::max<int64_t>(1, std::min(p.chunk_blocks, table));
  const int64_t chunks = (table + chunk - 1) / chunk;
  const int64_t slots = chunk * block_size;  // context positions per chunk
  const DType acc_type = b.dtype(query) == DType::F64 ? DType::F64 : DType::F32;  // at least float32

  // Block 0 pads the table to whole chunks: its slots lie past every token's position.
  Value rows = b.convert(block_rows, DType::S64);
  if (chunks * chunk > table) {
    rows = b.pad(rows, b.constant_int(DType::S64, 0), {0, 0}, {0, chunks * chunk - table}, {0, 0});
  }
  Value pos = b.convert(positions, DType::S64);
  Value q = b.convert(b.reshape(query, {tokens, kv_heads, group, head_size}), acc_type);
  // Chunks the longest context needs (padding tokens sit at position 0).
  Value longest = b.reduce_simple(pos, b.constant_int(DType::S64, 0), {0}, "maximum");
  Value needed = b.binary("minimum", b.binary("add", b.binary("divide", longest, b.constant_int(DType::S64, slots)),
                                              b.constant_int(DType::S64, 1)),
                          b.constant_int(DType::S64, chunks));

  const std::vector<int64_t> row_dims = {tokens, kv_heads, group};
  const std::vector<int64_t> score_dims = {tokens, kv_heads, group, slots};
  // Carried: chunk index, chunks needed, inputs, running max, running sum, running output.
  auto out = b.while_loop(
      {b.constant_int(DType::S64, 0), needed, q, key_cache, value_cache, rows, pos,
       b.constant(acc_type, -INFINITY, row_dims), b.constant(acc_type, 0, row_dims),
       b.constant(acc_type, 0, {tokens, kv_heads, group, head_size})},
      [](Builder& bb, const std::vector<Value>& s) { return bb.compare(s[0], s[1], "LT"); },
      [&](Builder& bb, const std::vector<Value>& s) -> std::vector<Value> {
        Value i = s[0], qv = s[2], keys = s[3], values = s[4], all_rows = s[5], mine = s[6];
        Value m = s[7], l = s[8], acc = s[9];
        Value first_block = bb.binary("multiply", i, bb.constant_int(DType::S64, chunk));
        Value chunk_rows = bb.dynamic_slice(all_rows, {bb.constant_int(DType::S64, 0), first_block}, {tokens, chunk});
        // [N, B, KVH, D] gathered by [T, C] block ids -> [T, C * B, KVH, D].
        auto gather = [&](Value cache) {
          Value g = bb.gather(cache, chunk_rows, {2, 3, 4}, {0}, {0}, 2, {1, block_size, kv_heads, head_size},
                              {tokens, chunk, block_size, kv_heads, head_size});
          return bb.convert(bb.reshape(g, {tokens, slots, kv_heads, head_size}), acc_type);
        };
        Value scores = bb.dot_general(qv, gather(keys), {0, 1}, {0, 2}, {3}, {3}, acc_type);  // [T, KVH, G, L]
        scores = bb.binary("multiply", scores, bb.scalar_like(scores, p.scale));
        if (p.soft_cap > 0) {
          scores = bb.binary("multiply", bb.unary("tanh", bb.binary("divide", scores, bb.scalar_like(scores, p.soft_cap))),
                             bb.scalar_like(scores, p.soft_cap));
        }
        Value place = bb.binary("add", bb.iota(DType::S64, score_dims, 3),
                                bb.broadcast_to(bb.binary("multiply", i, bb.constant_int(DType::S64, slots)), score_dims));
        Value own = bb.broadcast_in_dim(mine, score_dims, {0});
        Value visible = bb.compare(place, own, "LE");
        if (p.sliding_window > 0) {
          Value from = bb.binary("subtract", own, bb.constant_int(DType::S64, p.sliding_window, score_dims));
          visible = bb.binary("and", visible, bb.compare(place, from, "GT"));
        }
        scores = bb.select(visible, scores, bb.constant(acc_type, -INFINITY, score_dims));
        Value chunk_max = bb.reduce_simple(scores, bb.constant(acc_type, -INFINITY), {3}, "maximum");
        Value new_max = bb.binary("maximum", m, chunk_max);
        // A row with nothing visible yet keeps max -inf: shift by 0 there (exp(-inf) = 0, no NaN).
        Value shift = bb.select(bb.compare(new_max, bb.constant(acc_type, -INFINITY, row_dims), "EQ"),
                                bb.constant(acc_type, 0, row_dims), new_max);
        Value weights = bb.unary("exponential", bb.binary("subtract", scores, bb.broadcast_in_dim(shift, score_dims, {0, 1, 2})));
        Value rescale = bb.unary("exponential", bb.binary("subtract", m, shift));
        Value sum = bb.binary("add", bb.binary("multiply", l, rescale),
                              bb.reduce_simple(weights, bb.constant(acc_type, 0), {3}, "add"));
        Value weighted = bb.dot_general(weights, gather(values), {0, 1}, {0, 2}, {3}, {1}, acc_type);  // [T, KVH, G, D]
        const std::vector<int64_t> acc_dims = {tokens, kv_heads, group, head_size};
        Value next = bb.binary("add", bb.binary("multiply", acc, bb.broadcast_in_dim(rescale, acc_dims, {0, 1, 2})), weighted);
        return {bb.binary("add", i, bb.constant_int(DType::S64, 1)), s[1], qv, keys, values, all_rows, mine,
                new_max, sum, next};
      });
  // Every token sees its own position, so each running sum is positive.
  Value result = b.binary("divide", out[9], b.broadcast_in_dim(out[8], {tokens, kv_heads, group, head_size}, {0, 1, 2}));
  return b.reshape(result, {tokens, heads, head_size});
}

}  // namespace torch_pjrt::lowering
