#include "device/context.h"
#include "device/recorder.h"
#include "device/device_name.h"
#include "executor/trace.h"
#include "lowering/views.h"

#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/core/GeneratorImpl.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/TensorIterator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <mutex>
#include <numeric>
#include <optional>
#include <utility>

namespace torch_pjrt::device {

using ir::DType;
using ir::Value;
namespace L = lowering;

// ---------------------------------------------------------------- dtypes

namespace {
// ATen's dtypes the device holds, each with its IR dtype (in the IR's enum order).
constexpr std::pair<at::ScalarType, DType> kAtenDTypes[] = {
    {at::kBool, DType::Pred},
    {at::kChar, DType::S8},
    {at::kShort, DType::S16},
    {at::kInt, DType::S32},
    {at::kLong, DType::S64},
    {at::kByte, DType::U8},
    {at::kUInt16, DType::U16},
    {at::kUInt32, DType::U32},
    {at::kUInt64, DType::U64},
    {at::kHalf, DType::F16},
    {at::kBFloat16, DType::BF16},
    {at::kFloat, DType::F32},
    {at::kDouble, DType::F64},
    {at::kComplexFloat, DType::C64},
    {at::kComplexDouble, DType::C128},
    {at::kFloat8_e4m3fn, DType::F8E4M3FN},
    {at::kFloat8_e5m2, DType::F8E5M2},
    {at::kFloat8_e4m3fnuz, DType::F8E4M3FNUZ},
    {at::kFloat8_e5m2fnuz, DType::F8E5M2FNUZ},
    {at::kFloat8_e8m0fnu, DType::F8E8M0FNU},
};
}  // namespace

ir::DType to_ir(at::ScalarType t) {
  for (const auto& [aten, ir_dtype] : kAtenDTypes) {
    if (aten == t) return ir_dtype;
  }
  TORCH_CHECK_TYPE(false, device_name(), ": dtype ", t, " is not supported on the ", device_name(), " device");
}

at::ScalarType to_aten(ir::DType d) { return kAtenDTypes[static_cast<size_t>(d)].first; }

// ---------------------------------------------------------------- runtime

namespace {
// Never destroyed: buffers (in tensors, generators, caches) may be released
// during interpreter shutdown in any order, and must find their client alive.
std::unique_ptr<executor::Runtime>& runtime_slot() {
  static auto* r = new std::unique_ptr<executor::Runtime>();
  return *r;
}
std::atomic<int> g_mode{static_cast<int>(EagerMode::Strict)};
std::atomic<FrameCapture> g_frame_capture{nullptr};
}  // namespace

// Rethrows a PJRT error as the matching Python exception, naming the op.
// (Beside the GraphError overload, so that one name lookup finds both.)
[[noreturn]] void rethrow(const runtime::PjrtError& e, const std::string& op) {
  if (e.code() == runtime::ErrorCode::kResourceExhausted) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, device_name(), ": out of device memory in ", op, ": ", e.what());
  }
  if (e.code() == runtime::ErrorCode::kUnimplemented) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, device_name(), ": ", op, ": ", e.what());
  }
  TORCH_CHECK(false, device_name(), ": ", op, " failed: ", e.what());
}

// A program of recorded ops failed: name them, with the lines that recorded them.
[[noreturn]] void rethrow(const executor::GraphError& e) {
  std::string ops = e.ops().size() == 1 ? executor::describe_op(e.ops()[0])
                                        : "a fused graph of " + std::to_string(e.ops().size()) +
                                              " ops: " + executor::describe_ops(e.ops());
  if (e.ops().empty()) ops = "an op";
  if (e.code() == runtime::ErrorCode::kResourceExhausted) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, device_name(), ": out of device memory in ", ops, ": ", e.what());
  }
  if (e.code() == runtime::ErrorCode::kUnimplemented) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, device_name(), ": ", ops, ": ", e.what());
  }
  TORCH_CHECK(false, device_name(), ": ", ops, " failed: ", e.what(), ". Its writes were not applied.");
}

namespace {
std::string producer_name(const executor::ProgramOps& ops) {
  if (!ops || ops->empty()) return "device computation";
  if (ops->size() == 1) return executor::describe_op((*ops)[0]);
  return "a fused graph of " + std::to_string(ops->size()) + " ops (" + executor::describe_ops(*ops) + ")";
}
}  // namespace

namespace {
struct RuntimeConfig {
  std::string plugin_path, cache_dir, missing_message;
  int64_t cpu_device_count = 0;
  std::vector<runtime::CompileOverride> compile_overrides;
  executor::DiskCachePolicy cache_policy;
  bool configured = false;
};
RuntimeConfig& config() {
  static RuntimeConfig c;
  return c;
}
std::mutex& init_mutex() {
  static std::mutex mu;
  return mu;
}
}  // namespace

void configure_runtime(const std::string& plugin_path, int64_t cpu_device_count, const std::string& cache_dir,
                       const std::string& missing_message,
                       const std::vector<runtime::CompileOverride>& compile_overrides,
                       const executor::DiskCachePolicy& cache_policy) {
  std::lock_guard<std::mutex> lock(init_mutex());
  config() = RuntimeConfig{plugin_path, cache_dir, missing_message, cpu_device_count, compile_overrides, cache_policy,
                           true};
}

bool runtime_ready() { return runtime_slot() != nullptr; }

namespace {
// Makes the runtime (init_mutex held), published only once complete: rt()'s fast path
// reads the slot without the lock. Throws PjrtError from the plugin.
void make_runtime(const RuntimeConfig& c, std::vector<runtime::ClientOption> options,
                  std::shared_ptr<runtime::KeyValueStore> store) {
  if (c.cpu_device_count > 0) options.push_back({"cpu_device_count", c.cpu_device_count});
  auto made = std::make_unique<executor::Runtime>(c.plugin_path, options, c.cache_dir, c.compile_overrides,
                                                  c.cache_policy, std::move(store));
  const std::string platform = made->client().platform_name();
  ir::set_blocked_sums(platform == "cpu" || platform == "host");
  runtime_slot() = std::move(made);
}

const RuntimeConfig& checked_config() {
  const RuntimeConfig& c = config();
  TORCH_CHECK(c.configured, device_name(), ": the PJRT runtime is not configured (import torch_pjrt first)");
  TORCH_CHECK(!c.plugin_path.empty(), device_name(), ": no PJRT plugin found. ", c.missing_message);
  return c;
}

[[noreturn]] void plugin_failed(const RuntimeConfig& c, const runtime::PjrtError& e) {
  TORCH_CHECK(false, device_name(), ": could not start the PJRT plugin '", c.plugin_path, "': ", e.what(), ". ",
              c.missing_message);
}
}  // namespace

executor::Runtime& rt() {
  if (runtime_slot()) return *runtime_slot();
  std::lock_guard<std::mutex> lock(init_mutex());
  if (runtime_slot()) return *runtime_slot();
  const RuntimeConfig& c = checked_config();
  try {
    make_runtime(c, {}, nullptr);
  } catch (const runtime::PjrtError& e) {
    plugin_failed(c, e);
  }
  return *runtime_slot();
}

std::string start_runtime_across_processes(int64_t node_id, int64_t num_nodes,
                                           std::shared_ptr<runtime::KeyValueStore> store) {
  std::lock_guard<std::mutex> lock(init_mutex());
  if (runtime_slot()) {
    return "the runtime had started before the process group (a device was used first), as a client of this "
           "process's devices only";
  }
  const RuntimeConfig& c = checked_config();
  std::string refused;
  try {
    make_runtime(c, {{"node_id", node_id}, {"num_nodes", num_nodes}}, std::move(store));
  } catch (const runtime::PjrtError& e) {
    refused = std::string("the plugin refused a client over ") + std::to_string(num_nodes) +
              " processes (node_id/num_nodes with key-value callbacks): " + e.what();
  }
  if (!refused.empty()) {
    try {
      make_runtime(c, {}, nullptr);
    } catch (const runtime::PjrtError& e) {
      plugin_failed(c, e);
    }
    return refused;
  }
  const runtime::Client& client = runtime_slot()->client();
  if (client.global_device_count() <= client.devices().size()) {
    return "the plugin took node_id/num_nodes but its client holds only this process's " +
           std::to_string(client.devices().size()) + " device(s)";
  }
  return "";
}

int device_count_or_zero() noexcept {
  if (runtime_slot()) return runtime_slot()->device_count();
  try {
    return rt().device_count();
  } catch (...) {
    return 0;  // the error is raised, with its reason, at the first real use
  }
}

EagerMode eager_mode() { return static_cast<EagerMode>(g_mode.load(std::memory_order_relaxed)); }

namespace {
thread_local bool t_capturing = false;
}
bool capturing() { return t_capturing; }
void set_capturing(bool on) { t_capturing = on; }

void set_eager_mode(EagerMode mode) {
  if (mode != eager_mode() && runtime_ready()) flush_all(executor::FlushReason::ModeChange);
  g_mode = static_cast<int>(mode);
}

EagerMode parse_eager_mode(const std::string& name) {
  if (name == "strict") return EagerMode::Strict;
  if (name == "fused") return EagerMode::Fused;
  if (name == "debug") return EagerMode::Debug;
  TORCH_CHECK_VALUE(false, device_name(), ": eager mode must be 'strict', 'fused' or 'debug', got '", name, "'");
}

const char* eager_mode_name(EagerMode mode) {
  switch (mode) {
    case EagerMode::Fused: return "fused";
    case EagerMode::Debug: return "debug";
    default: return "strict";
  }
}

void set_frame_capture(FrameCapture capture) { g_frame_capture = capture; }
FrameCapture frame_capture() { return g_frame_capture.load(std::memory_order_relaxed); }

executor::DeviceGraph& graph_of(int device) { return executor::device_graph(rt(), device < 0 ? 0 : device); }

namespace {
void flush_graph(executor::DeviceGraph& g, executor::FlushReason reason) {
  try {
    g.flush(reason);
  } catch (const executor::GraphError& e) {
    rethrow(e);
  }
}
}  // namespace

void flush_all(executor::FlushReason reason) {
  if (!runtime_ready()) return;
  for (auto* g : executor::device_graphs()) flush_graph(*g, reason);
}

void flush_device(int device, executor::FlushReason reason) {
  if (runtime_ready()) flush_graph(graph_of(device), reason);
}

std::shared_ptr<runtime::Buffer> materialize(StorageState* st) {
  if (!runtime_ready()) return nullptr;
  try {
    return graph_of(st->device_index).materialize(st);
  } catch (const executor::GraphError& e) {
    rethrow(e);
  }
}

void assign(StorageState* st, std::shared_ptr<runtime::Buffer> buffer, std::vector<int64_t> dims, ir::DType dtype) {
  graph_of(st->device_index).assign(st, std::move(buffer), std::move(dims), dtype, nullptr);
}

std::shared_ptr<runtime::Buffer> upload(const void* data, DType dtype, const std::vector<int64_t>& dims, int device,
                                        const char* what) {
  std::shared_ptr<runtime::Buffer> buf;
  int64_t bytes = static_cast<int64_t>(ir::dtype_size(dtype));
  for (int64_t d : dims) bytes *= d;
  executor::TraceScope traced(executor::TraceKind::HostToDevice, what, device, bytes);
  try {
    buf = rt().client().buffer_from_host(data, ir::pjrt_type(dtype), dims, rt().device(device));
  } catch (const runtime::PjrtError& e) {
    rethrow(e, what);
  }
  buf->track(&executor::memory_counter(device), bytes);
  executor::metrics().host_to_device_bytes += bytes;
  return buf;
}

// ---------------------------------------------------------------- scalars

std::shared_ptr<runtime::Buffer> device_scalar(int device, DType dtype, const void* bytes) {
  struct ScalarKey {
    uint64_t bits;
    int dtype, device;
    bool operator==(const ScalarKey& o) const { return bits == o.bits && dtype == o.dtype && device == o.device; }
  };
  struct ScalarKeyHash {
    size_t operator()(const ScalarKey& k) const {
      return std::hash<uint64_t>()(k.bits * 31 + static_cast<uint64_t>(k.dtype) * 131 + k.device);
    }
  };
  static std::mutex mu;
  // Leaked on purpose (see runtime_slot): no PJRT calls during static destruction.
  static auto& cache = *new std::unordered_map<ScalarKey, std::shared_ptr<runtime::Buffer>, ScalarKeyHash>();
  ScalarKey key{0, static_cast<int>(dtype), device};
  std::memcpy(&key.bits, bytes, ir::dtype_size(dtype));
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  auto buf = upload(bytes, dtype, {}, device, "scalar upload");
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() > 4096) cache.clear();  // bounded; scalars are cheap to re-upload
  cache.emplace(key, buf);
  return buf;
}

// ---------------------------------------------------------------- sync points

void check_deferred_errors() {
  if (!runtime_ready()) return;
  std::vector<executor::Check> checks;
  for (auto* g : executor::device_graphs()) {
    auto c = g->take_checks();
    checks.insert(checks.end(), std::make_move_iterator(c.begin()), std::make_move_iterator(c.end()));
  }
  std::string first;
  for (const auto& c : checks) {
    bool bad = false;
    try {
      c.flag->to_host(&bad, 1);
    } catch (const runtime::PjrtError& e) {
      rethrow(e, executor::describe_op(c.op));
    }
    if (bad && first.empty()) first = c.message + executor::recorded_at(c.op);
  }
  TORCH_CHECK_INDEX(first.empty(), device_name(), ": ", first,
                    " (detected at this sync point; the op's writes were not applied)");
}

void synchronize(int device) {
  if (!runtime_ready()) return;
  executor::metrics().host_syncs++;
  executor::TraceScope traced(executor::TraceKind::Sync, "synchronize", device < 0 ? 0 : device);
  std::vector<executor::DeviceGraph*> graphs;
  if (device >= 0) {
    graphs.push_back(&graph_of(device));
  } else {
    graphs = executor::device_graphs();
  }
  for (auto* g : graphs) {
    try {
      g->flush(executor::FlushReason::Sync);
      g->await_all();
    } catch (const executor::GraphError& e) {
      rethrow(e);
    } catch (const runtime::PjrtError& e) {
      rethrow(e, "an earlier asynchronous op");
    }
  }
  check_deferred_errors();
}

// ---------------------------------------------------------------- copies

StorageState* state_of(const c10::Storage& s);

namespace {
// A storage's buffer (or its first `bytes`) into host memory, traced and counted.
void download(const StorageState* st, runtime::Buffer& buffer, void* dst, size_t bytes) {
  executor::TraceScope traced(executor::TraceKind::DeviceToHost, "to_cpu", st->device_index,
                              static_cast<int64_t>(bytes));
  try {
    buffer.to_host(dst, bytes);
  } catch (const runtime::PjrtError& e) {
    rethrow(e, producer_name(st->producer));
  }
  executor::metrics().device_to_host_bytes += static_cast<int64_t>(bytes);
}
}  // namespace

std::shared_ptr<runtime::Buffer> dense_buffer(const at::Tensor& t, at::Tensor& holder) {
  holder = t;
  StorageState* st = state_of(t);
  TORCH_CHECK(st, device_name(), ": a tensor without pjrt storage");
  TORCH_CHECK(st->has_contents() || !st->failed, device_name(), ": this tensor cannot be read: ", *st->failed);
  bool direct = t.is_contiguous() && t.storage_offset() == 0 &&
                static_cast<size_t>(t.numel()) * t.element_size() == st->nbytes &&
                st->dtype == to_ir(t.scalar_type()) && !t.is_conj() && !t.is_neg();
  if (!direct && st->has_contents()) {
    OpBuilder op("dense copy");
    Value v = op.input(t);
    holder = op.output(v, t.scalar_type());
    op.run();
    st = state_of(holder);
  }
  std::shared_ptr<runtime::Buffer> buffer = materialize(st);
  TORCH_CHECK(buffer || !st->failed, device_name(), ": this tensor cannot be read: ", *st->failed);
  return buffer;
}

at::Tensor to_cpu(const at::Tensor& t) {
  at::Tensor dense;
  std::shared_ptr<runtime::Buffer> buffer = dense_buffer(t, dense);  // held: no later program may take it
  check_deferred_errors();
  executor::metrics().host_syncs++;
  auto out = at::empty(t.sizes(), t.options().device(at::kCPU));
  if (t.numel() == 0) return out;
  if (!buffer) return out.zero_();
  download(state_of(dense), *buffer, out.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
  return out;
}

at::Tensor to_device(const at::Tensor& t, int device, const char* what) {
  at::Tensor dense;
  std::shared_ptr<runtime::Buffer> buffer = dense_buffer(t, dense);
  at::Tensor out = at::empty(t.sizes(), t.options().device(c10::Device(c10::DeviceType::PrivateUse1, device))
                                            .memory_format(at::MemoryFormat::Contiguous));
  if (t.numel() == 0) return out;
  if (!buffer) return out.zero_();
  const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
  std::shared_ptr<runtime::Buffer> copied;
  {
    executor::TraceScope traced(executor::TraceKind::DeviceToDevice, what, device, bytes);
    try {
      copied = buffer->copy_to_device(rt().device(device));
    } catch (const runtime::PjrtError& e) {
      if (e.code() == runtime::ErrorCode::kUnimplemented) return {};
      rethrow(e, what);
    }
  }
  copied->track(&executor::memory_counter(device), bytes);
  executor::metrics().device_to_device_bytes += bytes;
  std::vector<int64_t> dims = copied->dims();  // the storage's own shape (a [2, 3] buffer read as [6] stays [2, 3])
  assign(state_of(out), std::move(copied), std::move(dims), to_ir(t.scalar_type()));
  return out;
}

at::Scalar read_scalar(const at::Tensor& t) {
  // Reading a tensor element by element (`for x in t`, `all(t)`, `t[i].item()` in a loop)
  // costs a slice program and a transfer per element. Once one buffer's scalar reads have
  // cost about what downloading it whole does (kReadCostBytes each, about a read's fixed
  // cost at host-link bandwidth), the whole buffer comes to the host once and later reads
  // are host reads: never more than about twice the cheaper of the two. Buffers are
  // immutable, so the copy is valid exactly while the storage holds the same buffer.
  constexpr int64_t kReadCostBytes = 256 << 10;
  constexpr size_t kMaxHostCopyBytes = size_t{64} << 20;  // bounds the host memory held per storage
  StorageState* st = state_of(t);
  TORCH_CHECK(st, device_name(), ": item() of a tensor without pjrt storage");
  bool whole_buffer_readable = !capturing() && st->has_contents() && !st->failed && st->nbytes <= kMaxHostCopyBytes &&
                               st->dtype == to_ir(t.scalar_type()) &&
                               static_cast<size_t>(c10::multiply_integers(st->dims)) * t.element_size() == st->nbytes;
  if (!whole_buffer_readable) return to_cpu(t).item();
  std::shared_ptr<runtime::Buffer> buffer = materialize(st);
  auto& reads = st->scalar_reads;
  if (!buffer || reads.of.lock() != buffer) reads = {buffer, 0, {}};
  if (!reads.host.defined()) {
    if (!buffer || ++reads.count * kReadCostBytes < static_cast<int64_t>(st->nbytes)) return to_cpu(t).item();
    at::Tensor host = at::empty({static_cast<int64_t>(st->nbytes / t.element_size())}, t.options().device(at::kCPU));
    download(st, *buffer, host.data_ptr(), st->nbytes);
    reads.host = std::move(host);
  }
  check_deferred_errors();
  executor::metrics().host_syncs++;
  at::Tensor element = reads.host.as_strided(t.sizes(), t.strides(), t.storage_offset());
  if (t.is_conj()) element = element.conj();
  if (t.is_neg()) element = element.neg();
  return element.item();
}

void copy_from_cpu(const at::Tensor& dst, const at::Tensor& src_cpu) {
  at::Tensor src = src_cpu.resolve_conj().resolve_neg().to(dst.scalar_type()).expand(dst.sizes()).contiguous();
  StorageState* st = state_of(dst);
  TORCH_CHECK(st, device_name(), ": copy_ destination is not a pjrt tensor");
  int device = dst.device().index();
  std::vector<int64_t> dims(dst.sizes().begin(), dst.sizes().end());
  if (t_capturing && src_cpu.numel() == 1) {
    // One value (torch.tensor(x, device=...), as a higher-order op's implementation such
    // as FlexAttention's makes inside a compiled graph): a constant of an op rather than
    // an upload, which would stop the capture. Host data met during a capture come from
    // the graph itself (a host read of device data stops it first), so folding is sound.
    // The value was converted to dst's dtype above, so it is exact.
    OpBuilder op("copy_");
    op.write(dst, op.b().broadcast_to(op.scalar(src.reshape({-1})[0].item(), dst.scalar_type()), dims));
    op.run();
    return;
  }
  auto buf = upload(src.data_ptr(), to_ir(dst.scalar_type()), dims, device, "copy to pjrt");
  bool whole = dst.is_contiguous() && dst.storage_offset() == 0 &&
               static_cast<size_t>(dst.numel()) * dst.element_size() == st->nbytes && !dst.is_conj() && !dst.is_neg();
  if (whole) {
    assign(st, std::move(buf), dims, to_ir(dst.scalar_type()));
    return;
  }
  // Partial write through a view: stage in a temporary, then write on the device.
  at::Tensor tmp = at::empty(dst.sizes(), dst.options().memory_format(at::MemoryFormat::Contiguous));
  assign(state_of(tmp), std::move(buf), dims, to_ir(dst.scalar_type()));
  OpBuilder op("copy_");
  op.write(dst, op.input(tmp));
  op.run();
}

// ---------------------------------------------------------------- generator

namespace {
struct PjrtGenerator : public c10::GeneratorImpl {
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }
  explicit PjrtGenerator(c10::DeviceIndex device)
      : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {
    state_.device_index = device;
    state_.dims = {2};
    state_.dtype = DType::U64;
  }
  ~PjrtGenerator() override {
    if (state_.live_index >= 0 || state_.param_index >= 0) graph_of(state_.device_index).forget(&state_);
  }
  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;  // a new seed starts its stream from the beginning (after a set_state too), as CUDA's does
    reset_state();
  }
  void set_offset(uint64_t offset) override {
    offset_ = offset;
    reset_state();
  }
  uint64_t get_offset() const override { return offset_; }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    set_current_seed(c10::detail::getNonDeterministicRandom());
    return seed_;
  }
  void set_state(const c10::TensorImpl& new_state) override {
    TORCH_CHECK(new_state.numel() == 16 && new_state.dtype() == at::kByte,
                device_name(), ": generator state must be a uint8 tensor of 16 bytes");
    const auto* bytes = static_cast<const uint64_t*>(new_state.data());
    seed_ = bytes[0];
    offset_ = bytes[1];
    reset_state();
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    uint64_t words[2] = {seed_, offset_};
    auto* self = const_cast<PjrtGenerator*>(this);
    if (auto buffer = self->materialize_state()) buffer->to_host(words, sizeof(words));
    auto t = at::empty({16}, at::TensorOptions().dtype(at::kByte));
    std::memcpy(t.data_ptr(), words, sizeof(words));
    return t.getIntrusivePtr();
  }
  PjrtGenerator* clone_impl() const override {
    auto buffer = const_cast<PjrtGenerator*>(this)->materialize_state();
    auto* g = new PjrtGenerator(device().index());
    g->seed_ = seed_;
    g->offset_ = offset_;
    g->state_.buffer = std::move(buffer);
    return g;
  }
  // The state as storage contents: uploaded from (seed, offset) when first used.
  executor::Storage& storage() {
    if (!state_.has_contents()) {
      uint64_t words[2] = {seed_, offset_};
      auto buf = upload(words, DType::U64, {2}, device().index(), "generator state");
      graph_of(device().index()).assign(&state_, std::move(buf), {2}, DType::U64, nullptr);
    }
    return state_;
  }
  std::shared_ptr<runtime::Buffer> materialize_state() {
    if (!runtime_ready()) return nullptr;
    try {
      return graph_of(state_.device_index).materialize(&state_);
    } catch (const executor::GraphError& e) {
      rethrow(e);
    }
  }
  void reset_state() {
    if (runtime_ready()) {
      graph_of(state_.device_index).assign(&state_, nullptr, {2}, DType::U64, nullptr);
    } else {
      state_.buffer.reset();
    }
  }
  uint64_t seed_ = 67280421310721ULL;
  uint64_t offset_ = 0;
  executor::Storage state_;
};
}  // namespace

at::Generator make_generator(int device) { return at::make_generator<PjrtGenerator>(device); }

at::Generator default_generator(int device) {
  static std::mutex mu;
  static auto& gens = *new std::vector<at::Generator>();  // leaked, as above
  std::lock_guard<std::mutex> lock(mu);
  if (gens.empty()) {
    int n = std::max(1, device_count_or_zero());
    for (int i = 0; i < n; ++i) {
      gens.push_back(make_generator(i));
      gens.back().set_current_seed(c10::default_rng_seed_val);
    }
  }
  if (device < 0) device = 0;
  TORCH_CHECK(device < static_cast<int>(gens.size()), device_name(), ": no generator for device ", device);
  return gens[device];
}

executor::Storage& rng_storage(const at::Generator& gen) { return at::check_generator<PjrtGenerator>(gen)->storage(); }

// ---------------------------------------------------------------- matmul precision

ir::DotPrecision torch_matmul_precision() {
  switch (at::globalContext().float32MatmulPrecision()) {
    case at::Float32MatmulPrecision::HIGH: return ir::DotPrecision::High;
    case at::Float32MatmulPrecision::MEDIUM: return ir::DotPrecision::Default;
    default: return ir::DotPrecision::Highest;
  }
}

}  // namespace torch_pjrt::device
