// The device allocator: each allocation is a StorageState (a slot for a PJRT
// buffer) behind a unique fake address. Memory is counted here because PJRT
// plugins (the CPU one among them) may have no memory statistics.
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

struct Counters {
  std::atomic<int64_t> allocated{0}, peak{0}, num_allocs{0}, num_frees{0};
};
Counters& counters(int device) {
  static Counters c[kMaxDevices];
  return c[device];
}

std::atomic<uint64_t> next_address{4096};

void delete_state(void* ctx) {
  auto* st = static_cast<StorageState*>(ctx);
  Counters& c = counters(st->device_index);
  c.allocated -= static_cast<int64_t>(st->nbytes);
  c.num_frees++;
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
    uint64_t span = ((nbytes + 255) / 256 + 1) * 256;
    st->address = (static_cast<uint64_t>(device + 1) << kDeviceShift) | next_address.fetch_add(span);
    Counters& c = counters(device);
    int64_t now = c.allocated += static_cast<int64_t>(nbytes);
    int64_t prev = c.peak.load();
    while (now > prev && !c.peak.compare_exchange_weak(prev, now)) {
    }
    c.num_allocs++;
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
    Counters& c = counters(device < 0 ? 0 : device);
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
  Counters& c = counters(device);
  return {c.allocated, c.peak, c.num_allocs, c.num_frees};
}

void reset_peak_memory(int device) {
  Counters& c = counters(device);
  c.peak = c.allocated.load();
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
