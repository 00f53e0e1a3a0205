// Paged attention (see nn.h): a loop over the chunks of context the batch uses, each chunk's keys
// and values gathered once per tile through the tile's block table and folded into a running
// softmax for every query row of the tile.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "kernels/host_kernels.h"
#include "lowering/nn.h"

namespace torch_pjrt::lowering {

Value paged_attention(Builder& b, Value query, Value kv_cache, Value block_rows, Value positions,
                      const PagedAttentionParams& p) {
  if (p.host_kernel) {
    if (b.dtype(query) != DType::F32 || b.dtype(kv_cache) != DType::F32) {
      throw std::invalid_argument("paged_attention: the host kernel takes a float32 query and cache");
    }
    char attributes[160];
    std::snprintf(attributes, sizeof attributes, "scale = %.17e : f64, sliding_window = %lld : i64, soft_cap = %.17e : f64",
                  p.scale, static_cast<long long>(p.sliding_window), p.soft_cap);
    return b.ffi_call(kernels::kHostPagedAttention, {query, kv_cache, block_rows, positions}, {b.type(query)},
                      attributes)[0];
  }
  const std::vector<int64_t> qd = b.dims(query), kd = b.dims(kv_cache);
  const int64_t tiles = qd[0], rows = qd[1], heads = qd[2], head_size = qd[3];
  const int64_t kv_heads = kd[2], block_size = kd[3];
  const int64_t group = heads / kv_heads;
  const int64_t table = b.dims(block_rows)[1];
  const int64_t chunk = std::max<int64_t>(1, std::min(p.chunk_blocks, table));
  const int64_t chunks = (table + chunk - 1) / chunk;
  const int64_t slots = chunk * block_size;  // context positions per chunk
  const DType acc_type = b.dtype(query) == DType::F64 ? DType::F64 : DType::F32;  // at least float32
  // A tile's query rows and their heads, grouped by the key/value head they read: [S, KVH, Q * G].
  const int64_t lanes = rows * group;

  // Block 0 pads the table to whole chunks: its slots lie past every row's position.
  Value table_rows = b.convert(block_rows, DType::S64);
  if (chunks * chunk > table) {
    table_rows = b.pad(table_rows, b.constant_int(DType::S64, 0), {0, 0}, {0, chunks * chunk - table}, {0, 0});
  }
  Value pos = b.convert(positions, DType::S64);
  Value q = b.convert(b.reshape(query, {tiles, rows, kv_heads, group, head_size}), acc_type);
  q = b.reshape(b.transpose(q, {0, 2, 1, 3, 4}), {tiles, kv_heads, lanes, head_size});
  // Chunks the longest context needs (padding rows sit at position -1 and see nothing).
  Value longest = b.reduce_simple(b.reshape(pos, {tiles * rows}), b.constant_int(DType::S64, 0), {0}, "maximum");
  Value needed = b.binary("minimum", b.binary("add", b.binary("divide", longest, b.constant_int(DType::S64, slots)),
                                              b.constant_int(DType::S64, 1)),
                          b.constant_int(DType::S64, chunks));

  const std::vector<int64_t> lane_dims = {tiles, kv_heads, lanes};
  const std::vector<int64_t> score_dims = {tiles, kv_heads, lanes, slots};
  const std::vector<int64_t> out_dims = {tiles, kv_heads, lanes, head_size};
  // Each lane's position: its row's, repeated over the row's heads of one key/value head.
  Value lane_pos = b.reshape(b.broadcast_in_dim(pos, {tiles, kv_heads, rows, group}, {0, 2}), lane_dims);
  // Carried: chunk index, chunks needed, inputs, running max, running sum, running output.
  auto out = b.while_loop(
      {b.constant_int(DType::S64, 0), needed, q, kv_cache, table_rows, lane_pos,
       b.constant(acc_type, -INFINITY, lane_dims), b.constant(acc_type, 0, lane_dims), b.constant(acc_type, 0, out_dims)},
      [](Builder& bb, const std::vector<Value>& s) { return bb.compare(s[0], s[1], "LT"); },
      [&](Builder& bb, const std::vector<Value>& s) -> std::vector<Value> {
        Value i = s[0], qv = s[2], cache = s[3], all_rows = s[4], mine = s[5];
        Value m = s[6], l = s[7], acc = s[8];
        Value first_block = bb.binary("multiply", i, bb.constant_int(DType::S64, chunk));
        Value chunk_rows = bb.dynamic_slice(all_rows, {bb.constant_int(DType::S64, 0), first_block}, {tiles, chunk});
        // Keys (half 0) or values (half 1) of [2, N, KVH, B, D], gathered by [S, C] block ids
        // straight into [S, KVH, C, B, D] (the block index between the head and the slot), that
        // is [S, KVH, L, D]: the products' batch dims lead on both sides, with no transpose. The
        // cache is read whole: a slice of it would be copied out first.
        auto gather = [&](int64_t half) {
          Value at = bb.constant_int(DType::S64, half, {tiles, chunk, 1});
          Value starts = bb.concatenate({at, bb.reshape(chunk_rows, {tiles, chunk, 1})}, 2);
          Value g = bb.gather(cache, starts, {1, 3, 4}, {0, 1}, {0, 1}, 2, {1, 1, kv_heads, block_size, head_size},
                              {tiles, kv_heads, chunk, block_size, head_size});
          return bb.convert(bb.reshape(g, {tiles, kv_heads, slots, head_size}), acc_type);
        };
        Value scores = bb.dot_general(qv, gather(0), {0, 1}, {0, 1}, {3}, {3}, acc_type);  // [S, KVH, Q * G, L]
        scores = bb.binary("multiply", scores, bb.scalar_like(scores, p.scale));
        if (p.soft_cap > 0) {
          scores = bb.binary("multiply", bb.unary("tanh", bb.binary("divide", scores, bb.scalar_like(scores, p.soft_cap))),
                             bb.scalar_like(scores, p.soft_cap));
        }
        Value place = bb.binary("add", bb.iota(DType::S64, score_dims, 3),
                                bb.broadcast_to(bb.binary("multiply", i, bb.constant_int(DType::S64, slots)), score_dims));
        Value own = bb.broadcast_in_dim(mine, score_dims, {0, 1, 2});
        Value visible = bb.compare(place, own, "LE");
        if (p.sliding_window > 0) {
          Value from = bb.binary("subtract", own, bb.constant_int(DType::S64, p.sliding_window, score_dims));
          visible = bb.binary("and", visible, bb.compare(place, from, "GT"));
        }
        scores = bb.select(visible, scores, bb.constant(acc_type, -INFINITY, score_dims));
        Value chunk_max = bb.reduce_simple(scores, bb.constant(acc_type, -INFINITY), {3}, "maximum");
        Value new_max = bb.binary("maximum", m, chunk_max);
        // A lane with nothing visible yet keeps max -inf: shift by 0 there (exp(-inf) = 0, no NaN).
        Value shift = bb.select(bb.compare(new_max, bb.constant(acc_type, -INFINITY, lane_dims), "EQ"),
                                bb.constant(acc_type, 0, lane_dims), new_max);
        Value weights = bb.unary("exponential", bb.binary("subtract", scores, bb.broadcast_in_dim(shift, score_dims, {0, 1, 2})));
        Value rescale = bb.unary("exponential", bb.binary("subtract", m, shift));
        Value sum = bb.binary("add", bb.binary("multiply", l, rescale),
                              bb.reduce_simple(weights, bb.constant(acc_type, 0), {3}, "add"));
        Value weighted = bb.dot_general(weights, gather(1), {0, 1}, {0, 1}, {3}, {2}, acc_type);  // [S, KVH, Q * G, D]
        Value next = bb.binary("add", bb.binary("multiply", acc, bb.broadcast_in_dim(rescale, out_dims, {0, 1, 2})), weighted);
        return {bb.binary("add", i, bb.constant_int(DType::S64, 1)), s[1], qv, cache, all_rows, mine,
                new_max, sum, next};
      });
  // A padding row saw nothing (sum 0): its output is 0.
  Value sum = out[7];
  Value empty = b.compare(sum, b.constant(acc_type, 0, lane_dims), "EQ");
  Value divisor = b.select(empty, b.constant(acc_type, 1, lane_dims), sum);
  Value result = b.binary("divide", out[8], b.broadcast_in_dim(divisor, out_dims, {0, 1, 2}));
  result = b.transpose(b.reshape(result, {tiles, kv_heads, rows, group, head_size}), {0, 2, 1, 3, 4});
  return b.reshape(result, {tiles, rows, heads, head_size});
}

}  // namespace torch_pjrt::lowering
