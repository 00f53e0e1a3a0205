// Glue between ATen tensors and the torch-free core: storage state, the
// process-wide runtime, and OpBuilder, which turns one ATen call into one
// compiled StableHLO program (reads through views, writes back into storage).
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
#include "lowering/views.h"

namespace torch_pjrt::device {

// One PyTorch storage: its contents (a swappable immutable PJRT buffer, or a
// value pending in the device graph) plus allocation facts. Every tensor and
// view of the storage sees a swap, because they all hold the same DataPtr context.
struct StorageState : executor::Storage {
  size_t nbytes = 0;
  uintptr_t address = 0;  // a unique fake address: data_ptr() identity and overlap checks
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

// Where the user's Python code recorded the current op (fused mode's error
// messages); set by the Python module. Returns an interned string or null.
using FrameCapture = const std::string* (*)();
void set_frame_capture(FrameCapture capture);

// Flushes and waits for all work enqueued on the device (all devices for -1),
// then checks deferred errors (out-of-range indices).
void synchronize(int device = -1);
// Checks deferred device-side asserts; throws c10::IndexError naming the op.
void check_deferred_errors();

// Host <-> device copies of whole tensors.
at::Tensor to_cpu(const at::Tensor& t);
void copy_from_cpu(const at::Tensor& dst, const at::Tensor& src_cpu);

// Device RNG state: THREE_FRY key + counter, u64[2], held like a storage's
// contents (so it can be pending in a fused graph).
executor::Storage& rng_storage(const at::Generator& gen);
at::Generator default_generator(int device);
at::Generator make_generator(int device);

// A fresh result's layout: a memory format, or explicit dense strides (those TensorIterator
// gives a pointwise result over permuted inputs), which win when set.
struct Layout {
  Layout(at::MemoryFormat f = at::MemoryFormat::Contiguous) : format(f) {}  // NOLINT: implicit on purpose
  at::MemoryFormat format;
  std::vector<int64_t> strides;
};

// Records one ATen op: reads through views, fresh results, writes back into
// storages, deferred asserts; run() hands the fragment to the device graph,
// which runs it at once (strict, debug) or later as part of one program (fused).
class OpBuilder {
 public:
  explicit OpBuilder(std::string op_name);
  ir::Builder& b() { return builder_; }
  ir::Graph& graph() { return frag_.graph; }
  const std::string& name() const { return op_; }
  void set_device(int device) { device_ = device; }

  // Reads a tensor (through its view, with its lazy conj/neg bits applied) as
  // an IR value of its sizes and dtype.
  // CPU tensors (wrapped Python scalars, 0-d CPU tensors) are uploaded.
  ir::Value input(const at::Tensor& t);
  // A runtime scalar (not baked into the program: no recompiles per value).
  ir::Value scalar(const at::Scalar& s, at::ScalarType dtype);
  // Reads/advances the generator's state.
  ir::Value rng_state(const at::Generator& gen);
  void set_rng_state(ir::Value new_state);

  // Declares a fresh result, contiguous, channels-last or with the layout's strides (v is in
  // logical order either way).
  at::Tensor output(ir::Value v, at::ScalarType dtype, const Layout& layout = {});
  // Writes v into dst (through dst's view and its lazy bits); converts to dst's dtype.
  // allow_overlap: dst may have elements sharing memory (only for writes of one value, fill_).
  void write(const at::Tensor& dst, ir::Value v, bool allow_overlap = false);
  // Replaces a storage's whole contents with `flat` (any dtype/length).
  void replace_contents(StorageState* st, ir::Value flat);
  // Marks an out-of-range condition (i1 scalar): checked at the next sync point,
  // and writes of this op are suppressed when it holds.
  void check_flag(ir::Value flag, const std::string& message);

  // The layout PyTorch's CPU kernels give a fresh result of `rank` dims: that of
  // the first input of rank 4 or 5 whose layout is unambiguous (channels-last
  // or contiguous), when the ranks match; else contiguous.
  at::MemoryFormat suggested_layout(int64_t rank) const {
    return rank == layout_rank_ ? layout_ : at::MemoryFormat::Contiguous;
  }
  // A pointwise result's layout, as ATen's TensorIterator lays it out from the op's device
  // inputs: their common dense strides, or their dims' order (a transposed input gives a
  // transposed result, as torch.compile's fake tensors expect).
  Layout pointwise_layout(int64_t rank) const;

  // Records the op; in strict and debug modes it also runs.
  void run();

  // Whether the op reads t's storage (an in-place or out= target that is also an input).
  bool reads(const at::Tensor& t) const;

 private:
  struct StorageSlot {
    executor::Storage* state;
    ir::Value param;  // the contents as read (invalid: never written, read as zeros)
    ir::Value flat;   // current contents, flat, in its current dtype
    bool written = false;
  };
  StorageSlot& slot(executor::Storage* s, ir::DType read_dtype, int64_t empty_elements);
  ir::Value param(std::shared_ptr<runtime::Buffer> buffer, const ir::Type& type);
  ir::Value input_raw(const at::Tensor& t);  // the stored values, lazy conj/neg bits not applied
  ir::Value offset_param(int64_t offset);
  ir::Value scalar_param(ir::DType dtype, const void* bytes);
  ir::Value storage_flat(const at::Tensor& t, StorageSlot** slot_out);
  // How views' offsets enter this op's program (lowering/views.h).
  lowering::ViewOffsets view_offsets(int64_t offset);
  int device_for(const at::Tensor& t);
  // Debug mode: u8[] of kProducedNaN / kProducedInf bits for the op's results
  // (invalid when nothing floating is produced).
  ir::Value nonfinite_code();

  std::string op_;
  c10::SmallVector<at::Tensor, 4> operands_;  // device tensors read with input()
  int64_t layout_rank_ = -1;
  at::MemoryFormat layout_ = at::MemoryFormat::Contiguous;
  executor::Fragment frag_;
  ir::Builder builder_;
  int device_ = -1;
  // Inline capacity: most ops touch a few storages; no heap allocation for them.
  c10::SmallVector<StorageSlot, 4> slots_;
  c10::SmallVector<at::Tensor, 4> keep_;  // tensors read or written: their storages outlive the recording
  c10::SmallVector<std::pair<at::Tensor, ir::Value>, 2> outputs_;
  std::vector<std::pair<ir::Value, std::string>> flags_;
  struct PendingScalar {
    size_t param;  // index in the fragment's params
    ir::DType dtype;
    uint64_t bits;
  };
  c10::SmallVector<PendingScalar, 4> scalars_;
  at::Generator gen_;
};

// Shared scalar buffers (device scalars reused across calls: no per-call upload).
std::shared_ptr<runtime::Buffer> device_scalar(int device, ir::DType dtype, const void* bytes);

}  // namespace torch_pjrt::device
