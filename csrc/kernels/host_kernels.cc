#include "kernels/host_kernels.h"

#ifdef TORCH_PJRT_HOST_KERNELS

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/attention_tile.h"
#include "xla/ffi/api/ffi.h"

namespace torch_pjrt::kernels {
namespace {

namespace ffi = xla::ffi;

IntegerOperand integers_of(const ffi::AnyBuffer& b) {
  return {b.untyped_data(), b.element_type() == ffi::DataType::S64};
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
    return ffi::Error::InvalidArgument("torch_pjrt::paged_attention (host kernel): unexpected operand types or ranks");
  }
  const auto qd = query.dimensions(), kd = kv_cache.dimensions();
  const int64_t tiles = qd[0], heads = qd[2], kv_heads = kd[2];
  if (kd[0] != 2 || kd[4] != qd[3] || kv_heads <= 0 || heads % kv_heads != 0 || kd[1] <= 0) {
    return ffi::Error::InvalidArgument("torch_pjrt::paged_attention (host kernel): the cache does not match the query");
  }
  const float* keys = kv_cache.typed_data<float>();
  TileWork w{query.typed_data<float>(), keys, keys + kd[1] * kv_heads * kd[3] * qd[3], out->typed_data<float>(),
             integers_of(block_rows), integers_of(positions), qd[1], heads, qd[3], kd[1], kv_heads, kd[3], block_rows.dimensions()[1],
             heads / kv_heads, static_cast<float>(scale), static_cast<float>(soft_cap), sliding_window};
  // Work items (tile, key/value head) shared by the plugin's threads and this one, a key/value
  // head's tiles one after another: a request's tiles (adjacent in a step) read the same keys
  // and values, which then stay in the core's cache from one tile to the next. The state is
  // shared: a helper that starts after the last item finished (this call may have returned)
  // finds nothing left and touches only its own copy.
  struct Shared {
    TileWork work;
    int64_t tiles, items;
    std::atomic<int64_t> next{0}, finished{0};
    std::mutex mu;
    std::condition_variable all_done;
  };
  const AttendTile attend = attend_for_this_cpu();  // chosen once (chosen_variant)
  auto shared = std::make_shared<Shared>();
  shared->work = w;
  shared->tiles = tiles;
  shared->items = tiles * kv_heads;
  auto drain = [shared, attend] {
    Shared& st = *shared;
    for (int64_t item; (item = st.next.fetch_add(1)) < st.items;) {
      attend(st.work, item % st.tiles, item / st.tiles);
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

namespace {

struct Variant {
  const char* name;
  AttendTile attend;
};

// The variants this CPU runs, best first.
std::vector<Variant> variants_for_this_cpu() {
  std::vector<Variant> found;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    found.push_back({"x86-64-v4", x86_64_v4::attend});
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) found.push_back({"x86-64-v3", x86_64_v3::attend});
#endif
  found.push_back({"baseline", baseline::attend});
  return found;
}

// The best variant, or the one TORCH_PJRT_HOST_KERNEL_ISA names where this CPU runs it.
const Variant& chosen_variant() {
  static const Variant chosen = [] {
    const std::vector<Variant> found = variants_for_this_cpu();
    const char* asked = std::getenv("TORCH_PJRT_HOST_KERNEL_ISA");
    for (const Variant& v : found) {
      if (asked != nullptr && std::strcmp(asked, v.name) == 0) return v;
    }
    return found.front();
  }();
  return chosen;
}

}  // namespace

AttendTile attend_for_this_cpu() { return chosen_variant().attend; }

std::string host_kernel_isa() { return chosen_variant().name; }

std::vector<std::string> host_kernel_isas() {
  std::vector<std::string> names;
  for (const Variant& v : variants_for_this_cpu()) names.emplace_back(v.name);
  return names;
}

}  // namespace torch_pjrt::kernels

#else

namespace torch_pjrt::kernels {
void* host_paged_attention_handler() { return nullptr; }
std::string host_kernel_isa() { return ""; }
std::vector<std::string> host_kernel_isas() { return {}; }
}  // namespace torch_pjrt::kernels

#endif
