#include "kernels/host_kernels.h"

#ifdef TORCH_PJRT_HOST_KERNELS

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace torch_pjrt::kernels {
namespace {

namespace ffi = xla::ffi;

// An integer operand's element, s32 or s64.
int64_t integer_at(const ffi::AnyBuffer& b, int64_t i) {
  return b.element_type() == ffi::DataType::S32 ? b.typed_data<int32_t>()[i] : b.typed_data<int64_t>()[i];
}

// One tile's query rows over one key/value head: the lanes (rows x the heads that share the
// key/value head) walk the tile's context a chunk of positions at a time, each chunk's keys
// and values read once for every lane, folded into each lane's running softmax.
struct TileWork {
  const float* q;  // [S, Q, H, D]
  const float* keys;  // [N, KVH, B, D]
  const float* values;
  float* out;
  const ffi::AnyBuffer* block_rows;
  const ffi::AnyBuffer* positions;
  int64_t rows, heads, head_size, blocks, kv_heads, block_size, table, group;
  float scale, soft_cap;
  int64_t sliding_window;
};

__attribute__((target_clones("avx512f", "avx2", "default")))
void attend_tile(const TileWork& w, int64_t s, int64_t kvh) {
  constexpr int64_t kChunk = 64;
  const int64_t D = w.head_size, lanes = w.rows * w.group, context = w.table * w.block_size;
  std::vector<int64_t> first(lanes), last(lanes);
  std::vector<float> top(lanes, -std::numeric_limits<float>::infinity()), total(lanes, 0.f), acc(lanes * D, 0.f);
  std::vector<float> scores(kChunk);
  std::vector<const float*> key_at(kChunk), value_at(kChunk);
  int64_t lo = context, hi = -1;
  for (int64_t r = 0; r < w.rows; ++r) {
    const int64_t own = integer_at(*w.positions, s * w.rows + r);
    const int64_t a = w.sliding_window > 0 ? std::max<int64_t>(0, own - w.sliding_window + 1) : 0;
    const int64_t b = std::min(own, context - 1);  // a row sees positions <= its own
    for (int64_t g = 0; g < w.group; ++g) {
      first[r * w.group + g] = a;
      last[r * w.group + g] = b;
    }
    if (b >= a) {
      lo = std::min(lo, a);
      hi = std::max(hi, b);
    }
  }
  for (int64_t c0 = lo; c0 <= hi; c0 += kChunk) {
    const int64_t n = std::min(kChunk, hi - c0 + 1);
    for (int64_t j = 0; j < n; ++j) {  // block ids clamped, as a gather does
      const int64_t l = c0 + j;
      const int64_t block =
          std::clamp<int64_t>(integer_at(*w.block_rows, s * w.table + l / w.block_size), 0, w.blocks - 1);
      const int64_t at = ((block * w.kv_heads + kvh) * w.block_size + l % w.block_size) * D;
      key_at[j] = w.keys + at;
      value_at[j] = w.values + at;
    }
    for (int64_t i = 0; i < lanes; ++i) {
      const int64_t from = std::max(first[i], c0) - c0, to = std::min(last[i], c0 + n - 1) - c0;
      if (to < from) continue;
      const int64_t r = i / w.group, h = kvh * w.group + i % w.group;
      const float* qv = w.q + ((s * w.rows + r) * w.heads + h) * D;
      float chunk_top = top[i];
      for (int64_t j = from; j <= to; ++j) {
        const float* k = key_at[j];
        float dot = 0.f;
        for (int64_t d = 0; d < D; ++d) dot += qv[d] * k[d];
        float score = dot * w.scale;
        if (w.soft_cap > 0) score = std::tanh(score / w.soft_cap) * w.soft_cap;
        scores[j] = score;
        chunk_top = std::max(chunk_top, score);
      }
      float* a = acc.data() + i * D;
      const float rescale = std::exp(top[i] - chunk_top);  // 0 on the first chunk (top = -inf)
      total[i] *= rescale;
      for (int64_t d = 0; d < D; ++d) a[d] *= rescale;
      for (int64_t j = from; j <= to; ++j) {
        const float p = std::exp(scores[j] - chunk_top);
        total[i] += p;
        const float* v = value_at[j];
        for (int64_t d = 0; d < D; ++d) a[d] += p * v[d];
      }
      top[i] = chunk_top;
    }
  }
  for (int64_t i = 0; i < lanes; ++i) {
    const int64_t r = i / w.group, h = kvh * w.group + i % w.group;
    float* ov = w.out + ((s * w.rows + r) * w.heads + h) * D;
    const float* a = acc.data() + i * D;
    // A padding row (position -1) sees nothing: zeros.
    for (int64_t d = 0; d < D; ++d) ov[d] = total[i] > 0 ? a[d] / total[i] : 0.f;
  }
}

ffi::Error paged_attention(ffi::ThreadPool pool, ffi::AnyBuffer query, ffi::AnyBuffer kv_cache,
                           ffi::AnyBuffer block_rows, ffi::AnyBuffer positions, ffi::Result<ffi::AnyBuffer> out,
                           double scale, int64_t sliding_window, double soft_cap) {
  auto integers = [](const ffi::AnyBuffer& b) {
    return b.element_type() == ffi::DataType::S32 || b.element_type() == ffi::DataType::S64;
  };
  if (query.element_type() != ffi::DataType::F32 || kv_cache.element_type() != ffi::DataType::F32 ||
      out->element_type() != ffi::DataType::F32 || !integers(block_rows) || !integers(positions) ||
      query.dimensions().size() != 4 || kv_cache.dimensions().size() != 5 || block_rows.dimensions().size() != 2 ||
      positions.dimensions().size() != 2) {
    return ffi::Error::InvalidArgument("torch_pjrt_paged_attention: unexpected operand types or ranks");
  }
  const auto qd = query.dimensions(), kd = kv_cache.dimensions();
  const int64_t tiles = qd[0], heads = qd[2], kv_heads = kd[2];
  if (kd[0] != 2 || kd[4] != qd[3] || kv_heads <= 0 || heads % kv_heads != 0 || kd[1] <= 0) {
    return ffi::Error::InvalidArgument("torch_pjrt_paged_attention: the cache does not match the query");
  }
  const float* keys = kv_cache.typed_data<float>();
  TileWork w{query.typed_data<float>(), keys, keys + kd[1] * kv_heads * kd[3] * qd[3], out->typed_data<float>(),
             &block_rows, &positions, qd[1], heads, qd[3], kd[1], kv_heads, kd[3], block_rows.dimensions()[1],
             heads / kv_heads, static_cast<float>(scale), static_cast<float>(soft_cap), sliding_window};
  // Work items (tile, key/value head) shared by the plugin's threads and this one. The state is
  // shared: a helper that starts after the last item finished (this call may have returned)
  // finds nothing left and touches only its own copy.
  struct Shared {
    TileWork work;
    int64_t items;
    std::atomic<int64_t> next{0}, finished{0};
    std::mutex mu;
    std::condition_variable all_done;
  };
  auto shared = std::make_shared<Shared>();
  shared->work = w;
  shared->items = tiles * kv_heads;
  auto drain = [shared] {
    Shared& st = *shared;
    for (int64_t item; (item = st.next.fetch_add(1)) < st.items;) {
      attend_tile(st.work, item / st.work.kv_heads, item % st.work.kv_heads);
      if (st.finished.fetch_add(1) + 1 == st.items) {
        std::lock_guard<std::mutex> lock(st.mu);
        st.all_done.notify_all();
      }
    }
  };
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), shared->items - 1);
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([drain] { drain(); });
  drain();
  std::unique_lock<std::mutex> lock(shared->mu);
  shared->all_done.wait(lock, [&] { return shared->finished.load() == shared->items; });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(kPagedAttentionHandler, paged_attention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<double>("scale")
                                  .Attr<int64_t>("sliding_window")
                                  .Attr<double>("soft_cap"));

}  // namespace

void* host_paged_attention_handler() { return reinterpret_cast<void*>(kPagedAttentionHandler); }

}  // namespace torch_pjrt::kernels

#else

namespace torch_pjrt::kernels {
void* host_paged_attention_handler() { return nullptr; }
}  // namespace torch_pjrt::kernels

#endif
