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
#include "kernels/few_row_product.h"
#include "xla/ffi/api/ffi.h"

namespace torch_pjrt::kernels {
namespace {

namespace ffi = xla::ffi;

IntegerOperand integers_of(const ffi::AnyBuffer& b) {
  return {b.untyped_data(), b.element_type() == ffi::DataType::S64};
}

// Runs work(0 .. items - 1) on the plugin's threads and this one, and returns when all are done.
// The state is shared: a helper that starts after the last item finished (this call may have
// returned) finds nothing left and touches only its own copy.
template <typename Work>
void run_items(ffi::ThreadPool& pool, int64_t items, Work work) {
  if (items <= 0) return;
  struct Shared {
    explicit Shared(Work w, int64_t n) : work(std::move(w)), items(n) {}
    Work work;
    int64_t items;
    std::atomic<int64_t> next{0}, finished{0};
    std::mutex mu;
    std::condition_variable all_done;
  };
  auto shared = std::make_shared<Shared>(std::move(work), items);
  auto drain = [shared] {
    Shared& st = *shared;
    for (int64_t item; (item = st.next.fetch_add(1)) < st.items;) {
      st.work(item);
      if (st.finished.fetch_add(1) + 1 == st.items) {
        std::lock_guard<std::mutex> lock(st.mu);
        st.all_done.notify_all();
      }
    }
  };
  // This thread works too: helpers up to the pool's size minus one (the pool has a thread per
  // core). One thread more than the cores made a decode step 8% slower: a preempted thread
  // holds its item while the others wait at the end.
  const int64_t helpers = std::min<int64_t>(pool.num_threads() - 1, items - 1);
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([drain] { drain(); });
  drain();
  std::unique_lock<std::mutex> lock(shared->mu);
  shared->all_done.wait(lock, [&] { return shared->finished.load() == shared->items; });
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
  const AttendTile attend = attend_for_this_cpu();  // chosen once (chosen_variant)
  // Work items (tile, key/value head), a key/value head's tiles one after another: a request's
  // tiles (adjacent in a step) read the same keys and values, which then stay in the core's
  // cache from one tile to the next.
  run_items(pool, tiles * kv_heads, [w, tiles, attend](int64_t item) { attend(w, item % tiles, item / tiles); });
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

ffi::Error few_row_product(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> out,
                           int64_t weight_transposed) {
  if (x.element_type() != ffi::DataType::F32 || w.element_type() != ffi::DataType::F32 ||
      out->element_type() != ffi::DataType::F32 || x.dimensions().size() != 2 || w.dimensions().size() != 2 ||
      out->dimensions().size() != 2) {
    return ffi::Error::InvalidArgument("torch_pjrt::few_row_product (host kernel): expected float32 matrices");
  }
  const auto xd = x.dimensions(), wd = w.dimensions();
  const int64_t rows = xd[0], depth = xd[1], columns = weight_transposed ? wd[0] : wd[1];
  if ((weight_transposed ? wd[1] : wd[0]) != depth || out->dimensions()[0] != rows || out->dimensions()[1] != columns) {
    return ffi::Error::InvalidArgument("torch_pjrt::few_row_product (host kernel): the shapes do not match");
  }
  float* y = out->typed_data<float>();
  if (depth == 0) {
    std::fill(y, y + rows * columns, 0.f);
    return ffi::Error::Success();
  }
  const ProductWork work{x.typed_data<float>(), w.typed_data<float>(), y, rows, depth, columns, weight_transposed != 0};
  const MultiplyPanels multiply = multiply_panels_for_this_cpu();
  // Up to four panels per work item: a [K, N] weight's rows are then read 1 KB at a time
  // (16x512x3072: 0.66 ms against 0.75 one panel at a time); still two items per thread.
  const int64_t panels = (columns + kProductPanelColumns - 1) / kProductPanelColumns;
  const int64_t per_item = std::clamp<int64_t>(panels / (2 * std::max<int64_t>(1, pool.num_threads())), 1, 4);
  run_items(pool, (panels + per_item - 1) / per_item,
            [work, multiply, per_item](int64_t item) { multiply(work, item * per_item, (item + 1) * per_item); });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(kFewRowProductHandler, few_row_product,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("weight_transposed"));

}  // namespace

std::vector<HostKernel> host_kernel_handlers() {
  return {{kHostPagedAttention, reinterpret_cast<void*>(kPagedAttentionHandler)},
          {kHostFewRowProduct, reinterpret_cast<void*>(kFewRowProductHandler)}};
}

std::vector<HostKernelVariant> host_kernel_variants() {
  std::vector<HostKernelVariant> found;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    found.push_back({"x86-64-v4", x86_64_v4::attend, x86_64_v4::multiply_panels});
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) found.push_back({"x86-64-v3", x86_64_v3::attend, x86_64_v3::multiply_panels});
#endif
  found.push_back({"baseline", baseline::attend, baseline::multiply_panels});
  return found;
}

namespace {

// The best variant, or the one TORCH_PJRT_HOST_KERNEL_ISA names where this CPU runs it.
const HostKernelVariant& chosen_variant() {
  static const HostKernelVariant chosen = [] {
    const std::vector<HostKernelVariant> found = host_kernel_variants();
    const char* asked = std::getenv("TORCH_PJRT_HOST_KERNEL_ISA");
    for (const HostKernelVariant& v : found) {
      if (asked != nullptr && std::strcmp(asked, v.name) == 0) return v;
    }
    return found.front();
  }();
  return chosen;
}

}  // namespace

AttendTile attend_for_this_cpu() { return chosen_variant().attend; }

MultiplyPanels multiply_panels_for_this_cpu() { return chosen_variant().multiply; }

std::string host_kernel_isa() { return chosen_variant().name; }

std::vector<std::string> host_kernel_isas() {
  std::vector<std::string> names;
  for (const HostKernelVariant& v : host_kernel_variants()) names.emplace_back(v.name);
  return names;
}

}  // namespace torch_pjrt::kernels

#else

namespace torch_pjrt::kernels {
std::vector<HostKernel> host_kernel_handlers() { return {}; }
std::vector<HostKernelVariant> host_kernel_variants() { return {}; }
std::string host_kernel_isa() { return ""; }
std::vector<std::string> host_kernel_isas() { return {}; }
}  // namespace torch_pjrt::kernels

#endif
