#include "device/context.h"

#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/core/GeneratorImpl.h>
#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <numeric>

namespace torch_pjrt::device {

using ir::DType;
using ir::Value;

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
    default:
      TORCH_CHECK_TYPE(false, "pjrt: dtype ", t, " is not supported on the pjrt device");
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

// Rethrows a PJRT error as the matching Python exception, naming the op.
[[noreturn]] void rethrow(const runtime::PjrtError& e, const std::string& op) {
  if (e.code() == runtime::ErrorCode::kResourceExhausted) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "pjrt: out of device memory in ", op, ": ", e.what());
  }
  if (e.code() == runtime::ErrorCode::kUnimplemented) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "pjrt: ", op, ": ", e.what());
  }
  TORCH_CHECK(false, "pjrt: ", op, " failed: ", e.what());
}

struct Pending {
  std::mutex mu;
  std::vector<std::weak_ptr<runtime::Buffer>> buffers;  // produced since the last sync
  struct Flag {
    std::shared_ptr<runtime::Buffer> flag;
    std::string message;
  };
  std::vector<Flag> flags;
};
Pending& pending() {
  static Pending p;
  return p;
}
}  // namespace

namespace {
struct RuntimeConfig {
  std::string plugin_path, cache_dir, missing_message;
  int64_t cpu_device_count = 0;
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
                       const std::string& missing_message) {
  std::lock_guard<std::mutex> lock(init_mutex());
  config() = RuntimeConfig{plugin_path, cache_dir, missing_message, cpu_device_count, true};
}

void init_runtime(const std::string& plugin_path, int64_t cpu_device_count, const std::string& cache_dir) {
  configure_runtime(plugin_path, cpu_device_count, cache_dir, "");
  rt();
}

bool runtime_ready() { return runtime_slot() != nullptr; }

executor::Runtime& rt() {
  if (runtime_slot()) return *runtime_slot();
  std::lock_guard<std::mutex> lock(init_mutex());
  if (runtime_slot()) return *runtime_slot();
  const RuntimeConfig& c = config();
  TORCH_CHECK(c.configured, "pjrt: the PJRT runtime is not configured (import torch_pjrt first)");
  TORCH_CHECK(!c.plugin_path.empty(), "pjrt: no PJRT plugin found. ", c.missing_message);
  std::vector<runtime::ClientOption> options;
  if (c.cpu_device_count > 0) options.push_back({"cpu_device_count", c.cpu_device_count});
  try {
    runtime_slot() = std::make_unique<executor::Runtime>(c.plugin_path, options, c.cache_dir);
  } catch (const runtime::PjrtError& e) {
    TORCH_CHECK(false, "pjrt: could not start the PJRT plugin '", c.plugin_path, "': ", e.what(), ". ",
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

EagerMode eager_mode() { return static_cast<EagerMode>(g_mode.load()); }
void set_eager_mode(EagerMode mode) { g_mode = static_cast<int>(mode); }

// ---------------------------------------------------------------- scalars

std::shared_ptr<runtime::Buffer> device_scalar(int device, DType dtype, const void* bytes) {
  static std::mutex mu;
  // Leaked on purpose (see runtime_slot): no PJRT calls during static destruction.
  static auto& cache = *new std::unordered_map<std::string, std::shared_ptr<runtime::Buffer>>();
  size_t n = ir::dtype_size(dtype);
  std::string key(reinterpret_cast<const char*>(bytes), n);
  key += static_cast<char>(dtype);
  key += std::to_string(device);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::shared_ptr<runtime::Buffer> buf;
  try {
    buf = rt().client().buffer_from_host(bytes, executor::to_pjrt(dtype), {}, rt().device(device));
  } catch (const runtime::PjrtError& e) {
    rethrow(e, "scalar upload");
  }
  executor::metrics().host_to_device_bytes += static_cast<int64_t>(n);
  if (cache.size() > 4096) cache.clear();  // bounded; scalars are cheap to re-upload
  cache.emplace(key, buf);
  return buf;
}

// ---------------------------------------------------------------- sync points

void check_deferred_errors() {
  std::vector<Pending::Flag> flags;
  {
    std::lock_guard<std::mutex> lock(pending().mu);
    flags.swap(pending().flags);
  }
  std::string first;
  for (const auto& f : flags) {
    bool bad = false;
    try {
      f.flag->to_host(&bad, 1);
    } catch (const runtime::PjrtError& e) {
      rethrow(e, f.message);
    }
    if (bad && first.empty()) first = f.message;
  }
  TORCH_CHECK_INDEX(first.empty(), "pjrt: ", first,
                    " (detected at this sync point; the op's writes were not applied)");
}

void synchronize(int device) {
  std::vector<std::weak_ptr<runtime::Buffer>> buffers;
  {
    std::lock_guard<std::mutex> lock(pending().mu);
    buffers.swap(pending().buffers);
  }
  executor::metrics().host_syncs++;
  for (auto& w : buffers) {
    if (auto b = w.lock()) {
      try {
        b->await_ready();
      } catch (const runtime::PjrtError& e) {
        rethrow(e, "an earlier asynchronous op");
      }
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
  bool direct = st && st->buffer && t.is_contiguous() && t.storage_offset() == 0 &&
                static_cast<size_t>(t.numel()) * t.element_size() == st->nbytes &&
                st->dtype == to_ir(t.scalar_type());
  if (!direct) {
    OpBuilder op("to_cpu");
    Value v = op.input(t);
    dense = op.output(v, t.scalar_type());
    op.run();
    st = state_of(dense);
  }
  check_deferred_errors();
  executor::metrics().host_syncs++;
  auto out = at::empty(t.sizes(), t.options().device(at::kCPU));
  if (t.numel() == 0) return out;
  if (!st->buffer) return out.zero_();
  size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  try {
    st->buffer->to_host(out.data_ptr(), bytes);
  } catch (const runtime::PjrtError& e) {
    rethrow(e, st->producer.empty() ? std::string("device computation") : st->producer);
  }
  executor::metrics().device_to_host_bytes += static_cast<int64_t>(bytes);
  return out;
}

void copy_from_cpu(const at::Tensor& dst, const at::Tensor& src_cpu) {
  at::Tensor src = src_cpu.to(dst.scalar_type()).expand(dst.sizes()).contiguous();
  StorageState* st = state_of(dst);
  TORCH_CHECK(st, "pjrt: copy_ destination is not a pjrt tensor");
  int device = dst.device().index();
  std::vector<int64_t> dims(dst.sizes().begin(), dst.sizes().end());
  std::shared_ptr<runtime::Buffer> buf;
  try {
    buf = rt().client().buffer_from_host(src.data_ptr(), executor::to_pjrt(to_ir(dst.scalar_type())),
                                         dims, rt().device(device));
  } catch (const runtime::PjrtError& e) {
    rethrow(e, "copy to pjrt");
  }
  executor::metrics().host_to_device_bytes += static_cast<int64_t>(src.numel() * src.element_size());
  bool whole = dst.is_contiguous() && dst.storage_offset() == 0 &&
               static_cast<size_t>(dst.numel()) * dst.element_size() == st->nbytes;
  if (whole) {
    st->buffer = std::move(buf);
    st->dims = dims;
    st->dtype = to_ir(dst.scalar_type());
    st->producer = "copy to pjrt";
    return;
  }
  // Partial write through a view: stage in a temporary, then write on the device.
  at::Tensor tmp = at::empty(dst.sizes(), dst.options().memory_format(at::MemoryFormat::Contiguous));
  StorageState* ts = state_of(tmp);
  ts->buffer = std::move(buf);
  ts->dims = dims;
  ts->dtype = to_ir(dst.scalar_type());
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
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}
  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    state_.reset();
  }
  void set_offset(uint64_t offset) override {
    offset_ = offset;
    state_.reset();
  }
  uint64_t get_offset() const override { return offset_; }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    set_current_seed(c10::detail::getNonDeterministicRandom());
    return seed_;
  }
  void set_state(const c10::TensorImpl& new_state) override {
    TORCH_CHECK(new_state.numel() == 16 && new_state.dtype() == at::kByte,
                "pjrt: generator state must be a uint8 tensor of 16 bytes");
    const auto* bytes = static_cast<const uint64_t*>(new_state.data());
    seed_ = bytes[0];
    offset_ = bytes[1];
    state_.reset();
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    uint64_t words[2] = {seed_, offset_};
    if (state_) state_->to_host(words, sizeof(words));
    auto t = at::empty({16}, at::TensorOptions().dtype(at::kByte));
    std::memcpy(t.data_ptr(), words, sizeof(words));
    return t.getIntrusivePtr();
  }
  PjrtGenerator* clone_impl() const override {
    auto* g = new PjrtGenerator(device().index());
    g->seed_ = seed_;
    g->offset_ = offset_;
    g->state_ = state_;
    return g;
  }
  std::shared_ptr<runtime::Buffer> state() {
    if (!state_) {
      uint64_t words[2] = {seed_, offset_};
      state_ = rt().client().buffer_from_host(words, PJRT_Buffer_Type_U64, {2}, rt().device(device().index()));
    }
    return state_;
  }
  uint64_t seed_ = 67280421310721ULL;
  uint64_t offset_ = 0;
  std::shared_ptr<runtime::Buffer> state_;
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
  TORCH_CHECK(device < static_cast<int>(gens.size()), "pjrt: no generator for device ", device);
  return gens[device];
}

std::shared_ptr<runtime::Buffer> rng_state(const at::Generator& gen, int) {
  return at::check_generator<PjrtGenerator>(gen)->state();
}

void set_rng_state(const at::Generator& gen, std::shared_ptr<runtime::Buffer> state) {
  at::check_generator<PjrtGenerator>(gen)->state_ = std::move(state);
}

// ---------------------------------------------------------------- OpBuilder

OpBuilder::OpBuilder(std::string op_name) : op_(std::move(op_name)), builder_(graph_) {}

int OpBuilder::device_for(const at::Tensor& t) {
  int d = t.device().index();
  if (device_ < 0) device_ = d;
  TORCH_CHECK(device_ == d, "pjrt: ", op_, ": expected all tensors on pjrt:", device_,
              " but found one on pjrt:", d);
  return d;
}

Value OpBuilder::param(std::shared_ptr<runtime::Buffer> buffer, const ir::Type& type) {
  args_.push_back(std::move(buffer));
  return graph_.param(type);
}

OpBuilder::StorageSlot& OpBuilder::slot(StorageState* s, DType read_dtype) {
  for (auto& entry : slots_) {
    if (entry.first == s) return entry.second;
  }
  StorageSlot slot{s, Value{}, false};
  if (s->buffer) {
    Value p = param(s->buffer, ir::Type{s->dtype, s->dims});
    int64_t n = 1;
    for (int64_t d : s->dims) n *= d;
    slot.flat = builder_.reshape(p, {n});
  } else {
    // Never written: torch.empty's contents are unspecified; read as zeros.
    int64_t n = static_cast<int64_t>(s->nbytes / ir::dtype_size(read_dtype));
    slot.flat = builder_.constant(read_dtype, 0, {n});
  }
  slots_.emplace_back(s, slot);
  return slots_.back().second;
}

namespace {
struct DenseBlock {
  bool ok = false;
  std::vector<int64_t> order;     // kept dims, by decreasing stride
  std::vector<int64_t> kept;      // kept dims, in original order
  int64_t size = 1;
};

// Is the view a permutation of a dense block (plus size-1 and broadcast dims)?
DenseBlock dense_block(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  DenseBlock blk;
  for (int64_t d = 0; d < static_cast<int64_t>(sizes.size()); ++d) {
    if (sizes[d] != 1 && strides[d] != 0) blk.kept.push_back(d);
  }
  blk.order = blk.kept;
  std::stable_sort(blk.order.begin(), blk.order.end(),
                   [&](int64_t a, int64_t b) { return strides[a] > strides[b]; });
  int64_t expect = 1;
  for (auto it = blk.order.rbegin(); it != blk.order.rend(); ++it) {
    if (strides[*it] != expect) return blk;
    expect *= sizes[*it];
  }
  blk.size = expect;
  blk.ok = true;
  return blk;
}

int64_t position(const std::vector<int64_t>& v, int64_t x) {
  return std::find(v.begin(), v.end(), x) - v.begin();
}
}  // namespace

Value OpBuilder::offset_param(int64_t offset) {
  // A runtime parameter, so views at different offsets share one program.
  return param(device_scalar(device_, DType::S64, &offset), ir::Type{DType::S64, {}});
}

Value OpBuilder::element_offsets(const at::Tensor& t) {
  // offset + sum_d(i_d * stride_d), shaped [sizes..., 1] for gather/scatter.
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  Value idx = builder_.broadcast_to(offset_param(t.storage_offset()), sizes);
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 1 || t.stride(d) == 0) continue;
    Value term = builder_.binary("multiply", builder_.iota(DType::S64, sizes, d),
                                 builder_.constant_int(DType::S64, t.stride(d), sizes));
    idx = builder_.binary("add", idx, term);
  }
  sizes.push_back(1);
  return builder_.reshape(idx, sizes);
}

Value OpBuilder::storage_flat(const at::Tensor& t, StorageSlot** slot_out) {
  // The tensor's whole storage, as a flat array of the tensor's dtype.
  device_for(t);
  StorageState* st = state_of(t);
  TORCH_CHECK(st, "pjrt: ", op_, ": tensor has no pjrt storage");
  DType dtype = to_ir(t.scalar_type());
  StorageSlot& s = slot(st, dtype);
  if (slot_out) *slot_out = &s;
  return builder_.bitcast_flat(s.flat, dtype);
}

Value OpBuilder::input(const at::Tensor& t) {
  TORCH_CHECK(t.defined(), "pjrt: ", op_, ": undefined tensor argument");
  DType T = to_ir(t.scalar_type());
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  if (!t.device().is_privateuseone()) {
    TORCH_CHECK(t.device().is_cpu(), "pjrt: ", op_, ": cannot mix pjrt and ", t.device(), " tensors");
    TORCH_CHECK(t.dim() == 0, "pjrt: ", op_, ": expected all tensors on the pjrt device, but got a CPU tensor with shape ",
                t.sizes(), " (move it with .to('pjrt'))");
    int device = device_ >= 0 ? device_ : 0;
    at::Tensor c = t.contiguous();
    return param(device_scalar(device, T, c.data_ptr()), ir::Type{T, {}});
  }
  Value flat = storage_flat(t, nullptr);
  int64_t len = builder_.dims(flat)[0];
  int64_t numel = t.numel();
  if (numel == 0) return builder_.constant(T, 0, sizes);
  int64_t offset = t.storage_offset();
  if (t.is_contiguous() && offset == 0 && numel == len) return builder_.reshape(flat, sizes);
  DenseBlock blk = dense_block(t.sizes(), t.strides());
  if (blk.ok) {
    Value block = (offset == 0 && blk.size == len)
                      ? flat
                      : builder_.dynamic_slice(flat, {offset_param(offset)}, {blk.size});
    std::vector<int64_t> sorted_sizes, perm;
    for (int64_t d : blk.order) sorted_sizes.push_back(t.size(d));
    block = builder_.reshape(block, sorted_sizes);
    for (int64_t d : blk.kept) perm.push_back(position(blk.order, d));
    block = builder_.transpose(block, perm);
    return builder_.broadcast_in_dim(block, sizes, blk.kept);
  }
  // General strided view: gather the elements at its offsets.
  return builder_.gather(flat, element_offsets(t), {}, {0}, {0}, t.dim(), {1}, sizes);
}

void OpBuilder::write(const at::Tensor& dst, Value v) {
  TORCH_CHECK(dst.device().is_privateuseone(), "pjrt: ", op_, ": output must be a pjrt tensor");
  at::assert_no_internal_overlap(dst);
  DType T = to_ir(dst.scalar_type());
  std::vector<int64_t> sizes(dst.sizes().begin(), dst.sizes().end());
  v = builder_.broadcast_to(builder_.convert(v, T), sizes);
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
  DenseBlock blk = dense_block(dst.sizes(), dst.strides());
  if (blk.ok) {
    // Drop broadcast (stride 0) and size-1 dims, then undo the permutation.
    std::vector<int64_t> start(sizes.size(), 0), limit = sizes, step(sizes.size(), 1);
    for (size_t d = 0; d < sizes.size(); ++d)
      if (dst.stride(d) == 0) limit[d] = std::min<int64_t>(1, sizes[d]);
    Value u = builder_.slice(v, start, limit, step);
    std::vector<int64_t> kept_sizes, perm;
    for (int64_t d : blk.kept) kept_sizes.push_back(sizes[d]);
    u = builder_.reshape(u, kept_sizes);
    for (int64_t d : blk.order) perm.push_back(position(blk.kept, d));
    u = builder_.reshape(builder_.transpose(u, perm), {blk.size});
    s.flat = builder_.dynamic_update_slice(flat, u, {offset_param(offset)});
    return;
  }
  std::vector<int64_t> inserted{0};
  s.flat = builder_.scatter(flat, element_offsets(dst), v, {}, inserted, inserted, dst.dim(), "");
}

Value OpBuilder::scalar(const at::Scalar& s, at::ScalarType dtype) {
  DType T = to_ir(dtype);
  int device = device_ >= 0 ? device_ : 0;
  // Convert on the host with torch's own rules, then ship the bytes.
  at::Tensor host = at::scalar_tensor(s, at::TensorOptions().dtype(dtype));
  return param(device_scalar(device, T, host.data_ptr()), ir::Type{T, {}});
}

Value OpBuilder::rng_state(const at::Generator& gen) {
  gen_ = gen;
  auto state = device::rng_state(gen, device_);
  return param(state, ir::Type{DType::U64, {2}});
}

void OpBuilder::set_rng_state(Value new_state) { new_rng_state_ = new_state; }

at::Tensor OpBuilder::output(Value v, at::ScalarType dtype) {
  v = builder_.convert(v, to_ir(dtype));
  int device = device_ >= 0 ? device_ : 0;
  auto t = at::empty(builder_.dims(v), at::TensorOptions().dtype(dtype).device(c10::DeviceType::PrivateUse1, device));
  outputs_.emplace_back(t, v);
  if (device_ < 0) device_ = device;
  return t;
}

void OpBuilder::check_flag(Value flag, const std::string& message) {
  flags_.emplace_back(builder_.reshape(builder_.convert(flag, DType::Pred), {}), message);
}

void OpBuilder::run() {
  if (device_ < 0) device_ = 0;
  std::vector<Value> outs;
  std::vector<std::pair<StorageState*, Value>> writes;
  Value any_bad;
  for (auto& f : flags_) {
    any_bad = any_bad.valid() ? builder_.binary("or", any_bad, f.first) : f.first;
  }
  for (auto& o : outputs_) outs.push_back(o.second);
  for (auto& entry : slots_) {
    if (!entry.second.written) continue;
    writes.emplace_back(entry.first, entry.second.flat);
  }
  // Keep the written storages unchanged when an index was out of range.
  for (auto& w : writes) {
    Value nv = w.second;
    if (any_bad.valid()) {
      // The original contents, in the written dtype, for the select.
      Value orig;
      if (w.first->buffer) {
        // The slot's param is the first arg bound to this storage.
        int64_t n = 1;
        for (int64_t d : w.first->dims) n *= d;
        size_t i = 0;
        for (; i < args_.size(); ++i) if (args_[i] == w.first->buffer) break;
        Value p{graph_.params()[i], 0};
        orig = builder_.bitcast_flat(builder_.reshape(p, {n}), builder_.dtype(nv));
      } else {
        orig = builder_.constant(builder_.dtype(nv), 0, builder_.dims(nv));
      }
      nv = builder_.select(builder_.broadcast_to(any_bad, builder_.dims(nv)), orig, nv);
    }
    outs.push_back(nv);
  }
  size_t rng_index = outs.size();
  if (new_rng_state_.valid()) outs.push_back(new_rng_state_);
  size_t flag_index = outs.size();
  if (any_bad.valid()) outs.push_back(any_bad);
  bool debug = eager_mode() == EagerMode::Debug;
  size_t nan_index = outs.size();
  Value nonfinite;
  if (debug) {
    for (auto& o : outputs_) {
      if (!ir::is_floating(builder_.dtype(o.second)) || builder_.type(o.second).numel() == 0) continue;
      Value f = builder_.unary("not", builder_.unary("is_finite", o.second));
      int64_t n = builder_.type(f).numel();
      Value any = builder_.reduce_simple(builder_.reshape(f, {n}), builder_.constant_int(DType::Pred, 0), {0}, "or");
      nonfinite = nonfinite.valid() ? builder_.binary("or", nonfinite, any) : any;
    }
    if (nonfinite.valid()) outs.push_back(nonfinite);
  }
  graph_.set_outputs(outs);
  std::string text = graph_.to_mlir();
  std::vector<std::unique_ptr<runtime::Buffer>> results;
  try {
    auto exe = rt().get_executable(text, op_);
    std::vector<PJRT_Buffer*> raw;
    raw.reserve(args_.size());
    for (auto& a : args_) raw.push_back(a->raw());
    results = exe->execute(rt().device(device_), raw);
  } catch (const runtime::PjrtError& e) {
    rethrow(e, op_);
  }
  executor::metrics().executions++;
  std::vector<std::shared_ptr<runtime::Buffer>> shared;
  for (auto& r : results) shared.emplace_back(std::move(r));
  if (debug) {
    for (auto& b : shared) {
      try {
        b->await_ready();
      } catch (const runtime::PjrtError& e) {
        rethrow(e, op_);
      }
    }
  }
  // Check flags before publishing anything, so a failed op changes nothing.
  if (any_bad.valid()) {
    if (debug) {
      bool bad = false;
      shared[flag_index]->to_host(&bad, 1);
      TORCH_CHECK_INDEX(!bad, "pjrt: ", flags_[0].second);
    } else {
      std::lock_guard<std::mutex> lock(pending().mu);
      pending().flags.push_back({shared[flag_index], flags_[0].second});
    }
  }
  if (debug && nonfinite.valid()) {
    bool bad = false;
    shared[nan_index]->to_host(&bad, 1);
    TORCH_CHECK(!bad, "pjrt debug mode: ", op_, " produced NaN or Inf");
  }
  size_t k = 0;
  for (auto& o : outputs_) {
    StorageState* st = state_of(o.first);
    st->buffer = shared[k];
    st->dims = builder_.dims(o.second);
    st->dtype = builder_.dtype(o.second);
    st->producer = op_;
    ++k;
  }
  for (auto& w : writes) {
    w.first->buffer = shared[k];
    w.first->dims = builder_.dims(w.second);
    w.first->dtype = builder_.dtype(w.second);
    w.first->producer = op_;
    ++k;
  }
  if (new_rng_state_.valid()) device::set_rng_state(gen_, shared[rng_index]);
  std::lock_guard<std::mutex> lock(pending().mu);
  auto& pb = pending().buffers;
  if (pb.size() > 4096) {
    pb.erase(std::remove_if(pb.begin(), pb.end(), [](auto& w) { return w.expired(); }), pb.end());
  }
  for (auto& b : shared) pb.push_back(b);
}

}  // namespace torch_pjrt::device
