#include "device/context.h"
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

namespace torch_pjrt::device {

using ir::DType;
using ir::Value;
namespace L = lowering;

// ---------------------------------------------------------------- dtypes

ir::DType to_ir(at::ScalarType t) {
  switch (t) {
    case at::kBool: return DType::Pred;
    case at::kChar: return DType::S8;
    case at::kShort: return DType::S16;
    case at::kInt: return DType::S32;
    case at::kLong: return DType::S64;
    case at::kByte: return DType::U8;
    case at::kUInt16: return DType::U16;
    case at::kUInt32: return DType::U32;
    case at::kUInt64: return DType::U64;
    case at::kHalf: return DType::F16;
    case at::kBFloat16: return DType::BF16;
    case at::kFloat: return DType::F32;
    case at::kDouble: return DType::F64;
    case at::kComplexFloat: return DType::C64;
    case at::kComplexDouble: return DType::C128;
    default:
      TORCH_CHECK_TYPE(false, device_name(), ": dtype ", t, " is not supported on the ", device_name(), " device");
  }
}

at::ScalarType to_aten(ir::DType d) {
  switch (d) {
    case DType::Pred: return at::kBool;
    case DType::S8: return at::kChar;
    case DType::S16: return at::kShort;
    case DType::S32: return at::kInt;
    case DType::S64: return at::kLong;
    case DType::U8: return at::kByte;
    case DType::U16: return at::kUInt16;
    case DType::U32: return at::kUInt32;
    case DType::U64: return at::kUInt64;
    case DType::F16: return at::kHalf;
    case DType::BF16: return at::kBFloat16;
    case DType::F32: return at::kFloat;
    case DType::F64: return at::kDouble;
    case DType::C64: return at::kComplexFloat;
    case DType::C128: return at::kComplexDouble;
  }
  return at::kFloat;
}

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
[[noreturn]] static void rethrow(const runtime::PjrtError& e, const std::string& op) {
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

executor::Runtime& rt() {
  if (runtime_slot()) return *runtime_slot();
  std::lock_guard<std::mutex> lock(init_mutex());
  if (runtime_slot()) return *runtime_slot();
  const RuntimeConfig& c = config();
  TORCH_CHECK(c.configured, device_name(), ": the PJRT runtime is not configured (import torch_pjrt first)");
  TORCH_CHECK(!c.plugin_path.empty(), device_name(), ": no PJRT plugin found. ", c.missing_message);
  std::vector<runtime::ClientOption> options;
  if (c.cpu_device_count > 0) options.push_back({"cpu_device_count", c.cpu_device_count});
  try {
    runtime_slot() = std::make_unique<executor::Runtime>(c.plugin_path, options, c.cache_dir, c.compile_overrides,
                                                             c.cache_policy);
    const std::string platform = runtime_slot()->client().platform_name();
    ir::set_blocked_sums(platform == "cpu" || platform == "host");
  } catch (const runtime::PjrtError& e) {
    TORCH_CHECK(false, device_name(), ": could not start the PJRT plugin '", c.plugin_path, "': ", e.what(), ". ",
                c.missing_message);
  }
  return *runtime_slot();
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

executor::DeviceGraph& graph_of(int device) { return executor::device_graph(rt(), device < 0 ? 0 : device); }

void flush_all(executor::FlushReason reason) {
  if (!runtime_ready()) return;
  for (auto* g : executor::device_graphs()) {
    try {
      g->flush(reason);
    } catch (const executor::GraphError& e) {
      rethrow(e);
    }
  }
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
    buf = rt().client().buffer_from_host(data, executor::to_pjrt(dtype), dims, rt().device(device));
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

at::Tensor to_cpu(const at::Tensor& t) {
  // Materialize the view as a dense result on the device, then download it.
  at::Tensor dense = t;
  StorageState* st = state_of(t);
  TORCH_CHECK(st, device_name(), ": to_cpu of a tensor without pjrt storage");
  TORCH_CHECK(st->has_contents() || !st->failed, device_name(), ": this tensor cannot be read: ", *st->failed);
  bool direct = t.is_contiguous() && t.storage_offset() == 0 &&
                static_cast<size_t>(t.numel()) * t.element_size() == st->nbytes &&
                st->dtype == to_ir(t.scalar_type()) && !t.is_conj() && !t.is_neg();
  if (!direct && st->has_contents()) {
    OpBuilder op("to_cpu");
    Value v = op.input(t);
    dense = op.output(v, t.scalar_type());
    op.run();
    st = state_of(dense);
  }
  std::shared_ptr<runtime::Buffer> buffer = materialize(st);  // held: no later program may take it
  check_deferred_errors();
  executor::metrics().host_syncs++;
  auto out = at::empty(t.sizes(), t.options().device(at::kCPU));
  if (t.numel() == 0) return out;
  if (!buffer) {
    TORCH_CHECK(!st->failed, device_name(), ": this tensor cannot be read: ", *st->failed);
    return out.zero_();
  }
  size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  executor::TraceScope traced(executor::TraceKind::DeviceToHost, "to_cpu", st->device_index,
                              static_cast<int64_t>(bytes));
  try {
    buffer->to_host(out.data_ptr(), bytes);
  } catch (const runtime::PjrtError& e) {
    rethrow(e, producer_name(st->producer));
  }
  executor::metrics().device_to_host_bytes += static_cast<int64_t>(bytes);
  return out;
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

// ---------------------------------------------------------------- OpBuilder

ir::DotPrecision torch_matmul_precision() {
  switch (at::globalContext().float32MatmulPrecision()) {
    case at::Float32MatmulPrecision::HIGH: return ir::DotPrecision::High;
    case at::Float32MatmulPrecision::MEDIUM: return ir::DotPrecision::Default;
    default: return ir::DotPrecision::Highest;
  }
}

OpBuilder::OpBuilder(std::string op_name) : op_(std::move(op_name)), builder_(frag_.graph) {
  frag_.graph.reserve(6);  // a typical op's nodes (small enough for malloc's fast path)
}

int OpBuilder::device_for(const at::Tensor& t) {
  int d = t.device().index();
  if (device_ < 0) device_ = d;
  TORCH_CHECK(device_ == d, device_name(), ": ", op_, ": expected all tensors on ", device_name(), ":", device_,
              " but found one on ", device_name(), ":", d);
  return d;
}

Value OpBuilder::param(std::shared_ptr<runtime::Buffer> buffer, const ir::Type& type) {
  frag_.params.push_back({nullptr, std::move(buffer)});
  return frag_.graph.param(type);
}

OpBuilder::StorageSlot& OpBuilder::slot(executor::Storage* s, DType read_dtype, int64_t empty_elements) {
  for (auto& entry : slots_) {
    if (entry.state == s) return entry;
  }
  StorageSlot slot{s, Value{}, Value{}, false};
  if (s->has_contents()) {
    frag_.params.push_back({s, nullptr});
    slot.param = frag_.graph.param(ir::Type{s->dtype, s->dims});
    int64_t n = 1;
    for (int64_t d : s->dims) n *= d;
    slot.flat = builder_.reshape(slot.param, {n});
  } else {
    TORCH_CHECK(!s->failed, device_name(), ": ", op_, ": an input cannot be read: ", *s->failed);
    // Never written: torch.empty's contents are unspecified; read as zeros.
    slot.flat = builder_.constant(read_dtype, 0, {empty_elements});
  }
  slots_.push_back(slot);
  return slots_.back();
}

namespace {
L::ViewGeometry view_geometry(const at::Tensor& t) {
  return {std::vector<int64_t>(t.sizes().begin(), t.sizes().end()),
          std::vector<int64_t>(t.strides().begin(), t.strides().end()), t.storage_offset()};
}
}  // namespace

L::ViewOffsets OpBuilder::view_offsets(int64_t offset) {
  return {[this, offset] { return offset_param(offset); }, capturing()};
}

Value OpBuilder::offset_param(int64_t offset) {
  // A runtime parameter, so views at different offsets share one program (a
  // captured graph, specialized to its inputs' layout, gets a constant: XLA
  // then turns the dynamic slice into a static one).
  return scalar_param(DType::S64, &offset);
}

bool OpBuilder::reads(const at::Tensor& t) const {
  const StorageState* st = state_of(t);
  return st && std::any_of(slots_.begin(), slots_.end(), [st](const StorageSlot& s) { return s.state == st; });
}

Value OpBuilder::storage_flat(const at::Tensor& t, StorageSlot** slot_out) {
  // The tensor's whole storage, as a flat array of the tensor's dtype.
  device_for(t);
  StorageState* st = state_of(t);
  TORCH_CHECK(st, device_name(), ": ", op_, ": tensor has no pjrt storage");
  keep_.push_back(t);
  DType dtype = to_ir(t.scalar_type());
  StorageSlot& s = slot(st, dtype, static_cast<int64_t>(st->nbytes / ir::dtype_size(dtype)));
  if (slot_out) *slot_out = &s;
  return builder_.bitcast_flat(s.flat, dtype);
}

Value OpBuilder::input(const at::Tensor& t) {
  Value v = input_raw(t);
  if (t.device().is_privateuseone()) operands_.push_back(t);
  if (layout_rank_ < 0 && (t.dim() == 4 || t.dim() == 5) && t.device().is_privateuseone()) {
    at::MemoryFormat cl = t.dim() == 4 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::ChannelsLast3d;
    bool dense = t.is_contiguous(), channels_last = t.is_contiguous(cl);
    if (dense != channels_last) {
      layout_rank_ = t.dim();
      layout_ = channels_last ? cl : at::MemoryFormat::Contiguous;
    }
  }
  // Conjugate and negative views are lazy bits: ops see the values they denote.
  if (t.is_conj()) v = builder_.conj(v);
  if (t.is_neg()) v = builder_.unary("negate", v);
  return v;
}

Value OpBuilder::input_raw(const at::Tensor& t) {
  TORCH_CHECK(t.defined(), device_name(), ": ", op_, ": undefined tensor argument");
  DType T = to_ir(t.scalar_type());
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  if (!t.device().is_privateuseone()) {
    TORCH_CHECK(t.device().is_cpu(), device_name(), ": ", op_, ": cannot mix ", device_name(), " and ", t.device(), " tensors");
    TORCH_CHECK(t.dim() == 0, device_name(), ": ", op_, ": Expected all tensors to be on the same device, but got a CPU tensor with shape ",
                t.sizes(), " among ", device_name(), " tensors (move it with .to('", device_name(), "'))");
    if (ir::is_complex(T)) return scalar(t.item(), t.scalar_type());  // two real scalars
    at::Tensor c = t.contiguous();
    return scalar_param(T, c.data_ptr());
  }
  Value flat = storage_flat(t, nullptr);
  int64_t len = builder_.dims(flat)[0];
  int64_t numel = t.numel();
  if (numel == 0) return builder_.constant(T, 0, sizes);
  int64_t offset = t.storage_offset();
  if (t.is_contiguous() && offset == 0 && numel == len) return builder_.reshape(flat, sizes);
  return L::read_view(builder_, flat, view_geometry(t), view_offsets(offset));
}

void OpBuilder::write(const at::Tensor& dst, Value v, bool allow_overlap) {
  TORCH_CHECK(dst.device().is_privateuseone(), device_name(), ": ", op_, ": output must be a pjrt tensor");
  if (!allow_overlap) at::assert_no_internal_overlap(dst);
  DType T = to_ir(dst.scalar_type());
  std::vector<int64_t> sizes(dst.sizes().begin(), dst.sizes().end());
  v = builder_.broadcast_to(builder_.convert(v, T), sizes);
  if (dst.is_conj()) v = builder_.conj(v);  // stored so that dst's lazy bits read back as v
  if (dst.is_neg()) v = builder_.unary("negate", v);
  StorageSlot* slot_ptr = nullptr;
  Value flat = storage_flat(dst, &slot_ptr);
  StorageSlot& s = *slot_ptr;
  int64_t len = builder_.dims(flat)[0];
  int64_t numel = dst.numel();
  if (numel == 0) return;
  int64_t offset = dst.storage_offset();
  s.written = true;
  if (dst.is_contiguous() && offset == 0 && numel == len) {
    s.flat = builder_.reshape(v, {len});
    return;
  }
  s.flat = L::write_view(builder_, flat, view_geometry(dst), v, view_offsets(offset));
}

namespace {
// A scalar's value as a constant of a captured program (its variant is fixed:
// a Python number in the FX graph is the same every call). Null when the dtype
// is not one we fold.
std::optional<Value> scalar_constant(ir::Builder& b, DType dtype, const void* bytes) {
  auto load = [&](auto v) {
    std::memcpy(&v, bytes, sizeof(v));
    return v;
  };
  switch (dtype) {
    case DType::F32: return b.constant(dtype, load(float{}));
    case DType::F64: return b.constant(dtype, load(double{}));
    case DType::BF16: return b.constant(dtype, static_cast<float>(load(c10::BFloat16{})));
    case DType::F16: return b.constant(dtype, static_cast<float>(load(c10::Half{})));
    case DType::S64: return b.constant_int(dtype, load(int64_t{}));
    case DType::S32: return b.constant_int(dtype, load(int32_t{}));
    case DType::S16: return b.constant_int(dtype, load(int16_t{}));
    case DType::S8: return b.constant_int(dtype, load(int8_t{}));
    case DType::U8: return b.constant_int(dtype, load(uint8_t{}));
    case DType::Pred: return b.constant_int(dtype, load(uint8_t{}) != 0);
    default: return std::nullopt;
  }
}
}  // namespace

Value OpBuilder::scalar_param(DType dtype, const void* bytes) {
  // Scalars stay runtime parameters in eager modes (no recompile per value);
  // a captured graph folds them, so XLA can simplify around them.
  if (t_capturing) {
    if (auto c = scalar_constant(builder_, dtype, bytes)) return *c;
  }
  // The device may not be known yet (a scalar read before any tensor): the
  // buffer is found when the op is recorded.
  PendingScalar p{frag_.params.size(), dtype, 0};
  std::memcpy(&p.bits, bytes, ir::dtype_size(dtype));
  scalars_.push_back(p);
  return param(nullptr, ir::Type{dtype, {}});
}

Value OpBuilder::scalar(const at::Scalar& s, at::ScalarType dtype) {
  DType T = to_ir(dtype);
  if (ir::is_complex(T)) {
    // Two real runtime scalars, paired on the device.
    c10::complex<double> z = s.toComplexDouble();
    at::ScalarType part = at::toRealValueType(dtype);
    return builder_.complex(scalar(z.real(), part), scalar(z.imag(), part));
  }
  // Convert on the host with torch's own rules (fill_'s Scalar::to), then ship the bytes.
  alignas(8) unsigned char bytes[8] = {0};
  auto put = [&](auto v) { std::memcpy(bytes, &v, sizeof(v)); };
  switch (dtype) {
    case at::kFloat: put(s.to<float>()); break;
    case at::kDouble: put(s.to<double>()); break;
    case at::kBFloat16: put(s.to<at::BFloat16>()); break;
    case at::kHalf: put(s.to<at::Half>()); break;
    case at::kLong: put(s.to<int64_t>()); break;
    case at::kInt: put(s.to<int32_t>()); break;
    case at::kBool: put(s.to<bool>()); break;
    default: {
      at::Tensor host = at::scalar_tensor(s, at::TensorOptions().dtype(dtype));
      std::memcpy(bytes, host.data_ptr(), host.element_size());
    }
  }
  return scalar_param(T, bytes);
}

Value OpBuilder::rng_state(const at::Generator& gen) {
  gen_ = gen;
  int gen_device = gen.device().index() < 0 ? 0 : gen.device().index();
  if (device_ < 0) device_ = gen_device;
  TORCH_CHECK(device_ == gen_device, device_name(), ": ", op_, ": the generator is on ", device_name(), ":", gen_device,
              " but the op runs on ", device_name(), ":", device_);
  executor::Storage& st = rng_storage(gen);
  return slot(&st, DType::U64, 2).flat;
}

void OpBuilder::set_rng_state(Value new_state) {
  TORCH_CHECK(gen_.defined(), device_name(), ": ", op_, ": set_rng_state without rng_state");
  StorageSlot& s = slot(&rng_storage(gen_), DType::U64, 2);
  s.flat = builder_.reshape(new_state, {2});
  s.written = true;
}

Layout OpBuilder::pointwise_layout(int64_t rank) const {
  bool plain = true;
  for (const at::Tensor& t : operands_) plain &= t.dim() == 0 || t.is_contiguous();
  if (plain) return suggested_layout(rank);
  // ATen's own rule, run on meta tensors of the inputs' sizes and strides, in the order the
  // kernel read them (TensorIterator's operand order breaks ties: read them in ATen's order).
  at::TensorIteratorConfig config;
  config.resize_outputs(true);
  config.add_owned_output(at::Tensor());
  for (const at::Tensor& t : operands_) {
    config.add_owned_const_input(at::empty_strided(t.sizes(), t.strides(), at::TensorOptions().dtype(at::kFloat).device(at::kMeta)));
  }
  std::optional<at::TensorIterator> iter;
  try {
    iter.emplace(config.build());
  } catch (const c10::Error&) {
    return suggested_layout(rank);  // inputs that do not broadcast together: not a pointwise op's
  }
  const at::Tensor& out = iter->output();
  if (out.dim() != rank || out.is_contiguous()) return suggested_layout(rank);
  Layout layout;
  layout.strides.assign(out.strides().begin(), out.strides().end());
  return layout;
}

at::Tensor OpBuilder::output(Value v, at::ScalarType dtype, const Layout& layout) {
  v = builder_.convert(v, to_ir(dtype));
  int device = device_ >= 0 ? device_ : 0;
  if (device_ < 0) device_ = device;
  auto options = at::TensorOptions().dtype(dtype).device(c10::DeviceType::PrivateUse1, device);
  int64_t rank = builder_.type(v).rank();
  const auto& dims = builder_.dims(v);
  std::vector<int64_t> strides = layout.strides;
  if (strides.empty() && layout.format == at::MemoryFormat::ChannelsLast && rank == 4) {
    strides = c10::get_channels_last_strides_2d(dims);
  } else if (strides.empty() && layout.format == at::MemoryFormat::ChannelsLast3d && rank == 5) {
    strides = c10::get_channels_last_strides_3d(dims);
  }
  if (static_cast<int64_t>(strides.size()) != rank) {
    auto t = at::empty(dims, options);
    outputs_.emplace_back(t, v);
    return t;
  }
  // Stored with its dims from the largest stride to the smallest (size-1 dims anywhere): a
  // channels-last result channels-minor, v transposed to N, spatial..., C.
  auto t = at::empty_strided(dims, strides, options);
  std::vector<int64_t> perm(rank);
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t c) {
    return (dims[a] == 1 ? 0 : strides[a]) > (dims[c] == 1 ? 0 : strides[c]);
  });
  bool identity = std::is_sorted(perm.begin(), perm.end());
  outputs_.emplace_back(t, identity ? v : builder_.transpose(v, perm));
  return t;
}

void OpBuilder::replace_contents(StorageState* st, Value flat) {
  StorageSlot& s = slot(st, builder_.dtype(flat), builder_.type(flat).numel());
  s.flat = flat;
  s.written = true;
}

void OpBuilder::check_flag(Value flag, const std::string& message) {
  flags_.emplace_back(builder_.reshape(builder_.convert(flag, DType::Pred), {}), message);
}

namespace {
// Debug mode's verdict on one op, a u8 of these bits.
constexpr uint8_t kProducedNaN = 1;
constexpr uint8_t kProducedInf = 2;

// True (i1[]) when `test` holds for any element of v.
Value any_element(ir::Builder& b, Value v, const std::string& test) {
  Value hits;
  if (test == "nan") {
    hits = b.compare(v, v, "NE");
  } else if (test == "inf") {
    hits = b.compare(b.unary("abs", v), b.constant(b.dtype(v), INFINITY, b.dims(v)), "EQ");
  } else {
    hits = b.unary("not", b.unary("is_finite", v));
  }
  int64_t n = b.type(hits).numel();
  return b.reduce_simple(b.reshape(hits, {n}), b.constant_int(DType::Pred, 0), {0}, "or");
}

bool infinity_is_exact(const std::string& op) {
  // log(0) = -inf by definition, and models take it on purpose (T5's relative
  // position buckets take the log of position 0, then discard it).
  static const char* const kLogs[] = {"aten::log", "aten::log2", "aten::log10", "aten::log1p"};
  for (const char* name : kLogs) {
    if (op == name || op == std::string(name) + "_") return true;
  }
  return false;
}
}  // namespace

Value OpBuilder::nonfinite_code() {
  // NaN is never an intended result, so any NaN an op leaves is flagged. Inf
  // is: -inf fills masked attention scores, and sums, maxima and exps of
  // them stay infinite. So an Inf is flagged only when the op made it from
  // finite values (every floating input, scalars included, was finite): an
  // overflow or a division by zero, the first op where a blow-up shows. The
  // logarithms' -inf at 0 is exact, not a blow-up.
  auto is_checked = [&](Value v) {
    return ir::is_floating(builder_.dtype(v)) && builder_.type(v).numel() > 0;
  };
  std::vector<Value> results;
  for (auto& o : outputs_) results.push_back(o.second);
  for (auto& s : slots_) {
    if (s.written) results.push_back(s.flat);
  }
  auto combine = [&](Value acc, Value v) { return acc.valid() ? builder_.binary("or", acc, v) : v; };
  Value nan, inf, inputs_nonfinite;
  for (Value r : results) {
    if (!is_checked(r)) continue;
    nan = combine(nan, any_element(builder_, r, "nan"));
    inf = combine(inf, any_element(builder_, r, "inf"));
  }
  if (!nan.valid()) return Value{};
  for (int node : frag_.graph.params()) {
    Value p{node, 0};
    if (is_checked(p)) inputs_nonfinite = combine(inputs_nonfinite, any_element(builder_, p, "nonfinite"));
  }
  if (infinity_is_exact(op_)) inf = builder_.constant_int(DType::Pred, 0);
  Value new_inf = inputs_nonfinite.valid() ? builder_.binary("and", inf, builder_.unary("not", inputs_nonfinite)) : inf;
  Value u8_zero = builder_.constant_int(DType::U8, 0);
  return builder_.binary("or", builder_.select(nan, builder_.constant_int(DType::U8, kProducedNaN), u8_zero),
                         builder_.select(new_inf, builder_.constant_int(DType::U8, kProducedInf), u8_zero));
}

void OpBuilder::run() {
  if (device_ < 0) device_ = 0;
  for (const auto& p : scalars_) frag_.params[p.param].buffer = device_scalar(device_, p.dtype, &p.bits);
  Value any_bad;
  for (auto& f : flags_) {
    any_bad = any_bad.valid() ? builder_.binary("or", any_bad, f.first) : f.first;
  }
  EagerMode mode = t_capturing ? EagerMode::Fused : eager_mode();
  bool debug = mode == EagerMode::Debug;
  for (auto& o : outputs_) frag_.results.emplace_back(state_of(o.first), o.second);
  for (auto& s : slots_) {
    if (!s.written) continue;
    Value nv = s.flat;
    if (any_bad.valid()) {
      // Keep the written storage unchanged when an index was out of range.
      Value orig;
      if (s.param.valid()) {
        orig = builder_.bitcast_flat(builder_.reshape(s.param, {builder_.type(s.param).numel()}), builder_.dtype(nv));
      } else {
        orig = builder_.constant(builder_.dtype(nv), 0, builder_.dims(nv));
      }
      nv = builder_.select(builder_.broadcast_to(any_bad, builder_.dims(nv)), orig, nv);
    }
    frag_.results.emplace_back(s.state, nv);
  }
  for (auto& f : flags_) frag_.flags.push_back({f.first, f.second});
  if (debug) frag_.nonfinite = nonfinite_code();
  frag_.record.op = op_;
  if (mode == EagerMode::Fused && !t_capturing) {
    if (FrameCapture capture = g_frame_capture.load(std::memory_order_relaxed)) frag_.record.where = capture();
  }
  auto record_mode = mode == EagerMode::Fused   ? executor::RecordMode::Defer
                     : mode == EagerMode::Debug ? executor::RecordMode::RunAndCheck
                                                : executor::RecordMode::Run;
  std::vector<executor::Check> checks;
  try {
    checks = graph_of(device_).record(std::move(frag_), record_mode);
  } catch (const executor::GraphError& e) {
    rethrow(e);
  }
  if (!debug) return;
  for (auto& c : checks) {
    uint8_t bad = 0;
    try {
      c.flag->to_host(&bad, 1);
    } catch (const runtime::PjrtError& e) {
      rethrow(e, op_);
    }
    if (c.nonfinite) {
      TORCH_CHECK(!(bad & kProducedNaN), device_name(), " debug mode: ", op_, " produced NaN");
      TORCH_CHECK(!(bad & kProducedInf), device_name(), " debug mode: ", op_,
                  " produced Inf from finite inputs (an overflow or a division by zero)");
    } else {
      TORCH_CHECK_INDEX(!bad, device_name(), ": ", c.message);
    }
  }
}

}  // namespace torch_pjrt::device
