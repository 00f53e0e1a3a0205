// Glue between ATen tensors and the torch-free core: storage state, the
// process-wide runtime, and OpBuilder, which turns one ATen call into one
// compiled StableHLO program (reads through views, writes back into storage).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "executor/executor.h"
#include "ir/builder.h"

namespace torch_pjrt::device {

// The contents of one PyTorch storage: an immutable PJRT buffer that is swapped
// whenever the storage is written. Every tensor and view of the storage sees the
// swap, because they all hold the same DataPtr context.
struct StorageState {
  int device_index = 0;
  size_t nbytes = 0;
  uintptr_t address = 0;  // a unique fake address: data_ptr() identity and overlap checks
  std::shared_ptr<runtime::Buffer> buffer;  // null until first written ("empty")
  std::vector<int64_t> dims;                 // dims of `buffer`
  ir::DType dtype = ir::DType::U8;          // element type of `buffer`
  std::string producer;                      // op that produced `buffer` (error messages)
};

StorageState* state_of(const at::Tensor& t);  // null if not a pjrt tensor
StorageState* state_of(const c10::Storage& s);

// Process-wide runtime: configured by torch_pjrt at import, started on first use.
void configure_runtime(const std::string& plugin_path, int64_t cpu_device_count, const std::string& cache_dir,
                       const std::string& missing_message);
void init_runtime(const std::string& plugin_path, int64_t cpu_device_count, const std::string& cache_dir);
bool runtime_ready();
executor::Runtime& rt();
int device_count_or_zero() noexcept;

c10::DeviceAllocator* allocator();
struct MemoryCounters {
  int64_t allocated = 0, peak = 0, num_allocs = 0, num_frees = 0;
};
MemoryCounters memory_counters(int device);
void reset_peak_memory(int device);

ir::DType to_ir(at::ScalarType t);
at::ScalarType to_aten(ir::DType d);

enum class EagerMode { Strict, Debug };
EagerMode eager_mode();
void set_eager_mode(EagerMode mode);

// Waits for all outstanding work and checks deferred errors (out-of-range indices).
void synchronize(int device = -1);
// Checks deferred device-side asserts; throws c10::IndexError naming the op.
void check_deferred_errors();

// Host <-> device copies of whole tensors.
at::Tensor to_cpu(const at::Tensor& t);
void copy_from_cpu(const at::Tensor& dst, const at::Tensor& src_cpu);

// Device RNG state (THREE_FRY key + counter held in a u64[2] buffer on the device).
std::shared_ptr<runtime::Buffer> rng_state(const at::Generator& gen, int device);
void set_rng_state(const at::Generator& gen, std::shared_ptr<runtime::Buffer> state);
at::Generator default_generator(int device);
at::Generator make_generator(int device);

class OpBuilder {
 public:
  explicit OpBuilder(std::string op_name);
  ir::Builder& b() { return builder_; }
  ir::Graph& graph() { return graph_; }
  const std::string& name() const { return op_; }
  void set_device(int device) { device_ = device; }

  // Reads a tensor (through its view) as an IR value of its sizes and dtype.
  // CPU tensors (wrapped Python scalars, 0-d CPU tensors) are uploaded.
  ir::Value input(const at::Tensor& t);
  // A runtime scalar (not baked into the program: no recompiles per value).
  ir::Value scalar(const at::Scalar& s, at::ScalarType dtype);
  // Reads/advances the generator's state.
  ir::Value rng_state(const at::Generator& gen);
  void set_rng_state(ir::Value new_state);

  // Declares a fresh contiguous result.
  at::Tensor output(ir::Value v, at::ScalarType dtype);
  // Writes v into dst (through dst's view); converts to dst's dtype.
  void write(const at::Tensor& dst, ir::Value v);
  // Marks an out-of-range condition (i1 scalar): checked at the next sync point,
  // and writes of this op are suppressed when it holds.
  void check_flag(ir::Value flag, const std::string& message);

  // Compiles (or finds) and executes the program; fills the declared results.
  void run();

 private:
  struct StorageSlot {
    StorageState* state;
    ir::Value flat;  // current contents, flat, in its current dtype
    bool written = false;
  };
  StorageSlot& slot(StorageState* s, ir::DType read_dtype);
  ir::Value param(std::shared_ptr<runtime::Buffer> buffer, const ir::Type& type);
  ir::Value offset_param(int64_t offset);
  ir::Value storage_flat(const at::Tensor& t, StorageSlot** slot_out);
  ir::Value element_offsets(const at::Tensor& t);
  int device_for(const at::Tensor& t);

  std::string op_;
  ir::Graph graph_;
  ir::Builder builder_;
  int device_ = -1;
  std::vector<std::shared_ptr<runtime::Buffer>> args_;
  std::vector<std::pair<StorageState*, StorageSlot>> slots_;
  std::vector<std::pair<at::Tensor, ir::Value>> outputs_;
  std::vector<std::pair<ir::Value, std::string>> flags_;
  at::Generator gen_;
  ir::Value new_rng_state_;
};

// Shared scalar buffers (device scalars reused across calls: no per-call upload).
std::shared_ptr<runtime::Buffer> device_scalar(int device, ir::DType dtype, const void* bytes);

}  // namespace torch_pjrt::device
