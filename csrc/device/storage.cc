// The device allocator: each allocation is a StorageState (a slot for a PJRT
// buffer or a pending value) behind a unique fake address. No device memory
// is taken here: memory is counted by the buffers themselves (PJRT plugins,
// the CPU one among them, may have no memory statistics), so the statistics
// show what is really held: a pending value that is never materialized, or a
// buffer donated to a program, costs nothing.
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <mutex>

#include "device/context.h"

namespace torch_pjrt::device {
namespace {

constexpr int kMaxDevices = 64;
// Device index lives in the top bits of the fake address (for getDeviceFromPtr).
constexpr int kDeviceShift = 52;

std::atomic<uint64_t> next_address{4096};

uint64_t fresh_address(int device, size_t nbytes) {
  uint64_t span = ((nbytes + 255) / 256 + 1) * 256;
  return (static_cast<uint64_t>(device + 1) << kDeviceShift) | next_address.fetch_add(span);
}

void delete_state(void* ctx) {
  auto* st = static_cast<StorageState*>(ctx);
  // A pending value that nothing holds any more is dropped from the graph.
  if (st->live_index >= 0 || st->param_index >= 0) graph_of(st->device_index).forget(st);
  delete st;
}

int current_device();

class PjrtAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    int device = current_device();
    auto st = std::make_unique<StorageState>();
    st->device_index = device;
    st->nbytes = nbytes;
    st->address = fresh_address(device, nbytes);
    void* ptr = reinterpret_cast<void*>(st->address);
    return {ptr, st.release(), &delete_state, c10::Device(c10::DeviceType::PrivateUse1, device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void*, const void*, std::size_t) const override {
    TORCH_CHECK(false, "pjrt: device memory is not host-addressable; use tensor copies");
  }
  bool initialized() override { return runtime_ready(); }
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    c10::CachingDeviceAllocator::DeviceStats stats;
    auto& c = executor::memory_counter(device < 0 ? 0 : device);
    auto& agg = stats.allocated_bytes[static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)];
    agg.current = c.allocated;
    agg.peak = c.peak;
    auto& res = stats.reserved_bytes[static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)];
    res.current = c.allocated;
    res.peak = c.peak;
    auto& act = stats.active_bytes[static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)];
    act.current = c.allocated;
    act.peak = c.peak;
    stats.num_alloc_retries = 0;
    auto& n = stats.allocation[static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)];
    n.current = c.num_allocs - c.num_frees;
    n.allocated = c.num_allocs;
    n.freed = c.num_frees;
    return stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex) override {}
  void resetPeakStats(c10::DeviceIndex device) override { reset_peak_memory(device < 0 ? 0 : device); }
};

PjrtAllocator g_allocator;

}  // namespace

// Defined in registration.cc (the guard owns the current device).
int current_device_index();
namespace {
int current_device() { return current_device_index(); }
}  // namespace

c10::DeviceAllocator* allocator() { return &g_allocator; }

MemoryCounters memory_counters(int device) {
  auto& c = executor::memory_counter(device);
  return {c.allocated, c.peak, c.num_allocs, c.num_frees};
}

void reset_peak_memory(int device) {
  auto& c = executor::memory_counter(device);
  c.peak = c.allocated.load();
}

c10::DataPtr readdress(StorageState* st, size_t new_nbytes) {
  st->nbytes = new_nbytes;
  st->address = fresh_address(st->device_index, new_nbytes);
  return {reinterpret_cast<void*>(st->address), st, &delete_state,
          c10::Device(c10::DeviceType::PrivateUse1, st->device_index)};
}

StorageState* state_of(const c10::Storage& s) {
  if (!s || s.data_ptr().get_deleter() != &delete_state) return nullptr;
  return static_cast<StorageState*>(s.data_ptr().get_context());
}

StorageState* state_of(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return nullptr;
  return state_of(t.storage());
}

int device_of_address(const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  int d = static_cast<int>(a >> kDeviceShift) - 1;
  return d;
}

}  // namespace torch_pjrt::device
