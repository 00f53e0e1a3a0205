// OpBuilder: one ATen call recorded as a program fragment (reads through views,
// fresh results, writes back into storages, deferred asserts).
#include "device/recorder.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/TensorIterator.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "device/device_name.h"
#include "executor/trace.h"
#include "lowering/views.h"

namespace torch_pjrt::device {

using ir::DType;
using ir::Value;
namespace L = lowering;

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
    case DType::F8E4M3FN: return b.constant(dtype, static_cast<float>(load(c10::Float8_e4m3fn{})));
    case DType::F8E5M2: return b.constant(dtype, static_cast<float>(load(c10::Float8_e5m2{})));
    case DType::F8E4M3FNUZ: return b.constant(dtype, static_cast<float>(load(c10::Float8_e4m3fnuz{})));
    case DType::F8E5M2FNUZ: return b.constant(dtype, static_cast<float>(load(c10::Float8_e5m2fnuz{})));
    case DType::F8E8M0FNU: return b.constant(dtype, static_cast<float>(load(c10::Float8_e8m0fnu{})));
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
  if (capturing()) {
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
  flags_.push_back({builder_.reshape(builder_.convert(flag, DType::Pred), {}), message, false});
}

void OpBuilder::check_flag_guarded_by_op(Value flag, const std::string& message) {
  check_flag(flag, message);
  flags_.back().guarded_by_op = true;
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
  Value any_bad;  // of the flags whose op does not guard its writes itself
  for (const Flag& f : flags_) {
    if (!f.guarded_by_op) any_bad = any_bad.valid() ? builder_.binary("or", any_bad, f.holds) : f.holds;
  }
  EagerMode mode = capturing() ? EagerMode::Fused : eager_mode();
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
  for (const Flag& f : flags_) frag_.flags.push_back({f.holds, f.message});
  if (debug) frag_.nonfinite = nonfinite_code();
  frag_.record.op = op_;
  if (mode == EagerMode::Fused && !capturing()) {
    if (FrameCapture capture = frame_capture()) frag_.record.where = capture();
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
