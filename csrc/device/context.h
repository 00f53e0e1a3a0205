// Glue between ATen tensors and the torch-free core: storage state, the
// process-wide runtime and its configuration, memory counters, the eager mode,
// device graphs, host copies and RNG state. The recorder (OpBuilder) is in recorder.h.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/SmallVector.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "executor/deferred.h"
#include "executor/executor.h"
#include "ir/builder.h"

namespace torch_pjrt::device {

// One PyTorch storage: its contents (a swappable immutable PJRT buffer, or a
// value pending in the device graph) plus allocation facts. Every tensor and
// view of the storage sees a swap, because they all hold the same DataPtr context.
struct StorageState : executor::Storage {
  size_t nbytes = 0;
  uintptr_t address = 0;  // a unique fake address: data_ptr() identity and overlap checks
  // Scalar reads of the current buffer, and its whole contents on the host once they pay
  // for themselves (read_scalar); a new buffer (new contents) starts over.
  struct ScalarReads {
    std::weak_ptr<runtime::Buffer> of;
    int64_t count = 0;
    at::Tensor host;
  } scalar_reads;
};

StorageState* state_of(const at::Tensor& t);  // null if not a pjrt tensor
StorageState* state_of(const c10::Storage& s);
// The same storage state behind a new address range of `new_nbytes` (resize).
c10::DataPtr readdress(StorageState* st, size_t new_nbytes);

// Process-wide runtime: configured by torch_pjrt at import, started on first use.
// `compile_overrides`: XLA DebugOptions fields set for every compile; `cache_policy`:
// the disk tier's size bound and waits for other processes' compiles.
void configure_runtime(const std::string& plugin_path, int64_t cpu_device_count, const std::string& cache_dir,
                       const std::string& missing_message,
                       const std::vector<runtime::CompileOverride>& compile_overrides,
                       const executor::DiskCachePolicy& cache_policy);
bool runtime_ready();
executor::Runtime& rt();
// Starts the runtime with a client spanning `num_nodes` processes, this one
// `node_id`, the plugin exchanging its topology through `store`. Returns "" when
// the client spans them; else why not, the runtime then started (or already
// running) as a client of this process's devices.
std::string start_runtime_across_processes(int64_t node_id, int64_t num_nodes,
                                           std::shared_ptr<runtime::KeyValueStore> store);
int device_count_or_zero() noexcept;

c10::DeviceAllocator* allocator();
// Host memory pinned for the device, and whether a host pointer lies in such memory.
c10::Allocator* pinned_host_allocator();
bool is_pinned_host_pointer(const void* p);
struct MemoryCounters {
  int64_t allocated = 0, peak = 0, num_allocs = 0, num_frees = 0;
  int64_t bytes_allocated_total = 0, bytes_freed_total = 0;
};
MemoryCounters memory_counters(int device);
void reset_peak_memory(int device);
// Zeroes the cumulative counts (allocations, frees, bytes allocated and freed).
void reset_accumulated_memory(int device);
// (free, total) bytes of the device's memory: the plugin's own figures when it has
// them, the host's (MemAvailable, MemTotal) for a CPU plugin, an error otherwise.
std::pair<int64_t, int64_t> memory_info(int device);

ir::DType to_ir(at::ScalarType t);
at::ScalarType to_aten(ir::DType d);

// strict: every op runs at once (asynchronously); fused: ops are recorded and
// run as one program at the next sync point or cut; debug: every op runs
// synchronously with NaN/Inf and index checks.
enum class EagerMode { Strict, Fused, Debug };
EagerMode eager_mode();
void set_eager_mode(EagerMode mode);  // flushes what fused mode recorded
EagerMode parse_eager_mode(const std::string& name);  // throws on an unknown name
const char* eager_mode_name(EagerMode mode);

// torch.compile: while this thread captures a graph (see compiled.h), its ops
// are recorded, never run, and scalars and view offsets are constants of the program.
bool capturing();
void set_capturing(bool on);

// The pending graph of a device.
executor::DeviceGraph& graph_of(int device);
// Launches every device's pending graph (a mark_step); does not wait.
void flush_all(executor::FlushReason reason);
// Launches one device's pending graph; does not wait.
void flush_device(int device, executor::FlushReason reason);
// The calling thread's current pjrt device (the device guard's; registration.cc).
int current_device_index();
// Flushes the storage's device graph if its contents are pending; returns its
// buffer (taken under the graph's lock; null when never written).
std::shared_ptr<runtime::Buffer> materialize(StorageState* st);
// Sets a storage's contents to a host-made buffer.
void assign(StorageState* st, std::shared_ptr<runtime::Buffer> buffer, std::vector<int64_t> dims, ir::DType dtype);
// Uploads dense host data to a new (memory-counted) device buffer.
std::shared_ptr<runtime::Buffer> upload(const void* data, ir::DType dtype, const std::vector<int64_t>& dims,
                                        int device, const char* what);

// torch.set_float32_matmul_precision as the programs' dot precision (the IR's
// precision source, set at registration).
ir::DotPrecision torch_matmul_precision();
// Raises a failed program's error as the matching Python exception, naming its
// ops and the lines that recorded them.
[[noreturn]] void rethrow(const executor::GraphError& e);
// A plugin error of one op (or of what produced a value), as the matching Python exception.
[[noreturn]] void rethrow(const runtime::PjrtError& e, const std::string& op);

// Where the user's Python code recorded the current op (fused mode's error
// messages); set by the Python module. Returns an interned string or null.
using FrameCapture = const std::string* (*)();
void set_frame_capture(FrameCapture capture);
FrameCapture frame_capture();

// Flushes and waits for all work enqueued on the device (all devices for -1),
// then checks deferred errors (out-of-range indices).
void synchronize(int device = -1);
// Checks deferred device-side asserts; throws c10::IndexError naming the op.
void check_deferred_errors();

// t's elements in order as one buffer of their own on t's device: its storage's buffer where
// that is exactly them, else a dense copy made there (held by `holder`). Null when the
// storage has no contents yet (never written: reads as zeros).
std::shared_ptr<runtime::Buffer> dense_buffer(const at::Tensor& t, at::Tensor& holder);

// Host <-> device copies of whole tensors.
at::Tensor to_cpu(const at::Tensor& t);
// t's values (conj and neg bits applied) as a new contiguous tensor on pjrt device `device`,
// copied device to device by the plugin; undefined where the plugin has no such copy.
at::Tensor to_device(const at::Tensor& t, int device, const char* what);
// One element's value (item(), bool(), _local_scalar_dense).
at::Scalar read_scalar(const at::Tensor& t);
void copy_from_cpu(const at::Tensor& dst, const at::Tensor& src_cpu);

// Device RNG state: THREE_FRY key + counter, u64[2], held like a storage's
// contents (so it can be pending in a fused graph).
executor::Storage& rng_storage(const at::Generator& gen);
at::Generator default_generator(int device);
at::Generator make_generator(int device);

// Shared scalar buffers (device scalars reused across calls: no per-call upload).
std::shared_ptr<runtime::Buffer> device_scalar(int device, ir::DType dtype, const void* bytes);

}  // namespace torch_pjrt::device
