// The device allocator: each allocation is a StorageState (a slot for a PJRT
// buffer or a pending value) behind a unique fake address. No device memory
// is taken here: memory is counted by the buffers themselves (PJRT plugins,
// the CPU one among them, may have no memory statistics), so the statistics
// show what is really held: a pending value that is never materialized, or a
// buffer donated to a program, costs nothing.
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <mutex>
#include <unordered_map>

#include "device/context.h"
#include "device/device_name.h"

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

// Every live allocation by its address: a storage made around a pjrt address by other code
// (DLPack's from_dlpack, from_blob) is found through it and aliases the allocation, as
// on CUDA. That storage keeps the original alive (DLPack's deleter holds its tensor).
struct AddressBook {
  std::mutex mutex;
  std::unordered_map<uint64_t, StorageState*> states;
};
AddressBook& addresses() {
  static auto* book = new AddressBook();  // never destroyed: tensors are still freed during exit
  return *book;
}
void register_address(StorageState* st) {
  std::lock_guard<std::mutex> lock(addresses().mutex);
  addresses().states[st->address] = st;
}
void unregister_address(uint64_t address) {
  std::lock_guard<std::mutex> lock(addresses().mutex);
  addresses().states.erase(address);
}
StorageState* state_at(const void* p) {
  std::lock_guard<std::mutex> lock(addresses().mutex);
  auto it = addresses().states.find(reinterpret_cast<uint64_t>(p));
  return it == addresses().states.end() ? nullptr : it->second;
}

void delete_state(void* ctx) {
  auto* st = static_cast<StorageState*>(ctx);
  unregister_address(st->address);
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
    register_address(st.get());
    void* ptr = reinterpret_cast<void*>(st->address);
    return {ptr, st.release(), &delete_state, c10::Device(c10::DeviceType::PrivateUse1, device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void*, const void*, std::size_t) const override {
    TORCH_CHECK(false, device_name(), ": device memory is not host-addressable; use tensor copies");
  }
  bool initialized() override { return runtime_ready(); }
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    return device_stats(device < 0 ? 0 : device);
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    auto [free, total] = memory_info(device < 0 ? 0 : device);
    return {static_cast<size_t>(free), static_cast<size_t>(total)};
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override { reset_accumulated_memory(device < 0 ? 0 : device); }
  void resetPeakStats(c10::DeviceIndex device) override { reset_peak_memory(device < 0 ? 0 : device); }

 private:
  // There is no cache: every allocation is one buffer, held ("reserved") exactly
  // while a tensor uses it, so allocated = reserved = active and a segment is an
  // allocation. A plugin that reports its own use (GPU, TPU) counts program
  // temporaries too: that is its reserved figure. Pools are not split by size.
  static c10::CachingDeviceAllocator::DeviceStats device_stats(int device) {
    using c10::CachingDeviceAllocator::StatType;
    c10::CachingDeviceAllocator::DeviceStats stats;
    auto c = memory_counters(device);
    auto all = [](auto& array) -> c10::CachingDeviceAllocator::Stat& {
      return array[static_cast<size_t>(StatType::AGGREGATE)];
    };
    auto fill = [](c10::CachingDeviceAllocator::Stat& st, int64_t current, int64_t peak, int64_t allocated,
                   int64_t freed) {
      st.current = current;
      st.peak = peak;
      st.allocated = allocated;
      st.freed = freed;
    };
    for (auto* bytes : {&stats.allocated_bytes, &stats.active_bytes, &stats.reserved_bytes, &stats.requested_bytes}) {
      fill(all(*bytes), c.allocated, c.peak, c.bytes_allocated_total, c.bytes_freed_total);
    }
    for (auto* count : {&stats.allocation, &stats.active, &stats.segment}) {
      fill(all(*count), c.num_allocs - c.num_frees, c.num_allocs - c.num_frees, c.num_allocs, c.num_frees);
    }
    runtime::Device::MemoryStats plugin;
    if (runtime_ready() && rt().device(device).memory_stats(&plugin) && plugin.bytes_in_use > c.allocated) {
      auto& reserved = all(stats.reserved_bytes);
      reserved.current = plugin.bytes_in_use;
      reserved.peak = std::max(plugin.peak_bytes_in_use, plugin.bytes_in_use);
    }
    stats.num_device_alloc = c.num_allocs;
    stats.num_device_free = c.num_frees;
    return stats;
  }
};

PjrtAllocator g_allocator;

// Host memory "pinned" for the device (tensor.pin_memory(), DataLoader(pin_memory=True),
// DDP's unused-parameter map). Uploads copy host memory during the call, so any host
// memory would do; pinned allocations are remembered so that is_pinned() is true for
// them, and for views into them, as libraries check.
class PinnedHostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    c10::DataPtr inner = c10::GetAllocator(c10::DeviceType::CPU)->allocate(nbytes);
    void* data = inner.get();
    auto owner = std::make_unique<Pinned>(Pinned{std::move(inner), this});
    if (data != nullptr) {
      std::lock_guard<std::mutex> lock(mutex_);
      live_[reinterpret_cast<uintptr_t>(data)] = std::max<size_t>(nbytes, 1);
    }
    return {data, owner.release(), &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

  bool contains(const void* p) {
    auto address = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.upper_bound(address);
    if (it == live_.begin()) return false;
    --it;
    return address < it->first + it->second;
  }

 private:
  struct Pinned {
    c10::DataPtr memory;
    PinnedHostAllocator* allocator;
  };
  static void release(void* ctx) {
    std::unique_ptr<Pinned> pinned(static_cast<Pinned*>(ctx));
    if (void* data = pinned->memory.get()) {
      std::lock_guard<std::mutex> lock(pinned->allocator->mutex_);
      pinned->allocator->live_.erase(reinterpret_cast<uintptr_t>(data));
    }
  }
  std::mutex mutex_;
  std::map<uintptr_t, size_t> live_;  // start address -> bytes
};

PinnedHostAllocator g_pinned_allocator;

}  // namespace

c10::Allocator* pinned_host_allocator() { return &g_pinned_allocator; }
bool is_pinned_host_pointer(const void* p) { return g_pinned_allocator.contains(p); }

// Defined in registration.cc (the guard owns the current device).
int current_device_index();
namespace {
int current_device() { return current_device_index(); }
}  // namespace

c10::DeviceAllocator* allocator() { return &g_allocator; }

MemoryCounters memory_counters(int device) {
  auto& c = executor::memory_counter(device);
  return {c.allocated, c.peak, c.num_allocs, c.num_frees, c.bytes_allocated_total, c.bytes_freed_total};
}

void reset_accumulated_memory(int device) {
  auto& c = executor::memory_counter(device);
  c.num_allocs = c.num_allocs - c.num_frees;
  c.num_frees = 0;
  c.bytes_allocated_total = c.allocated.load();
  c.bytes_freed_total = 0;
}

namespace {
// A /proc/meminfo field in bytes (0 when absent).
int64_t meminfo_bytes(const std::string& field) {
  std::ifstream in("/proc/meminfo");
  std::string name;
  int64_t kib = 0;
  std::string unit;
  while (in >> name >> kib) {
    std::getline(in, unit);
    if (name == field + ":") return kib * 1024;
  }
  return 0;
}
}  // namespace

std::pair<int64_t, int64_t> memory_info(int device) {
  runtime::Device::MemoryStats plugin;
  if (rt().device(device).memory_stats(&plugin) && plugin.bytes_limit > 0) {
    return {plugin.bytes_limit - plugin.bytes_in_use, plugin.bytes_limit};
  }
  const std::string platform = rt().client().platform_name();
  TORCH_CHECK(platform == "cpu" || platform == "host",
              device_name(), ": the ", platform, " plugin reports no memory figures for device ", device,
              " (PJRT_Device_MemoryStats gave no bytes_limit)");
  // The CPU plugin's device memory is the host's.
  return {meminfo_bytes("MemAvailable"), meminfo_bytes("MemTotal")};
}

void reset_peak_memory(int device) {
  auto& c = executor::memory_counter(device);
  c.peak = c.allocated.load();
}

c10::DataPtr readdress(StorageState* st, size_t new_nbytes) {
  st->nbytes = new_nbytes;
  unregister_address(st->address);
  st->address = fresh_address(st->device_index, new_nbytes);
  register_address(st);
  return {reinterpret_cast<void*>(st->address), st, &delete_state,
          c10::Device(c10::DeviceType::PrivateUse1, st->device_index)};
}

StorageState* state_of(const c10::Storage& s) {
  if (!s) return nullptr;
  if (s.data_ptr().get_deleter() == &delete_state) return static_cast<StorageState*>(s.data_ptr().get_context());
  // A storage around a pjrt allocation's address made elsewhere (DLPack): the same allocation.
  if (s.device_type() == c10::DeviceType::PrivateUse1 && s.data() != nullptr) return state_at(s.data());
  return nullptr;
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
