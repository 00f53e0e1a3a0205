#include "executor/deferred.h"
#include "executor/launch_barrier.h"
#include "executor/trace.h"

#include <unordered_map>

#include <algorithm>
#include <sstream>

namespace torch_pjrt::executor {

using ir::Value;

std::string recorded_at(const OpRecord& op) { return op.where ? " (recorded at " + *op.where + ")" : ""; }

std::string describe_op(const OpRecord& op) { return op.op + recorded_at(op); }

std::string program_label(const std::vector<OpRecord>& ops) {
  if (ops.empty()) return "";
  return ops.size() == 1 ? ops[0].op : "fused graph (" + std::to_string(ops.size()) + " ops)";
}

namespace {
// Launch ids of captured programs over a group's devices (the XLA transport's own
// collectives use bits 16-29 without this one).
constexpr uint32_t kCapturedLaunch = 0x40000000;
// A program launch as a trace event: from launch until its completion event
// (on the plugin's thread); nothing when no profiler listens.
class TracedLaunch {
 public:
  template <typename Label>
  TracedLaunch(int device, Label label) : on_(tracing()) {
    if (on_) event_ = trace_begin(TraceKind::Program, label(), device);
  }
  void until(runtime::Event* done) noexcept {
    if (!on_) return;
    on_ = false;
    trace_pending(1);
    auto finish = [e = std::move(event_)]() mutable {
      // The device runs its programs one after another: one still queued
      // starts when the one before it ends, not at its launch.
      static std::mutex mu;
      static std::unordered_map<int, int64_t> last_end;
      e.end_ns = trace_clock_ns();
      {
        std::lock_guard<std::mutex> lock(mu);
        int64_t& previous = last_end[e.device];
        e.start_ns = std::min(e.end_ns, std::max(e.start_ns, previous));
        previous = e.end_ns;
      }
      trace(std::move(e));
      trace_pending(-1);
    };
    try {
      if (done == nullptr) throw std::runtime_error("no completion event");
      done->on_ready(finish);
    } catch (...) {  // tracing never fails a program: time it up to now
      finish();
    }
  }

 private:
  bool on_;
  TraceEvent event_{};
};
}  // namespace

std::string describe_ops(const std::vector<OpRecord>& ops, size_t limit) {
  std::string s;
  size_t shown = std::min(limit, ops.size());
  for (size_t i = 0; i < shown; ++i) s += (i ? ", " : "") + describe_op(ops[i]);
  if (ops.size() > shown) s += ", ... and " + std::to_string(ops.size() - shown) + " more";
  return s;
}

const char* flush_reason_name(FlushReason r) {
  switch (r) {
    case FlushReason::Op: return "op";
    case FlushReason::Sync: return "sync";
    case FlushReason::Explicit: return "explicit";
    case FlushReason::OptimizerStep: return "optimizer_step";
    case FlushReason::Loop: return "loop";
    case FlushReason::Size: return "size";
    case FlushReason::ModeChange: return "mode_change";
    case FlushReason::Compile: return "compile";
    case FlushReason::Collective: return "collective";
    case FlushReason::Count: break;
  }
  return "?";
}

FusionPolicy& fusion_policy() {
  static FusionPolicy p;
  return p;
}

namespace {
int64_t bytes_of(const ir::Type& t) { return t.numel() * static_cast<int64_t>(ir::dtype_size(t.dtype)); }
}  // namespace

// ---------------------------------------------------------------- recording

Value DeviceGraph::bind_storage(Storage* s, const ir::Type& want, ir::Key& mapping, bool* reshaped) {
  Value v;
  if (s->pending.valid()) {
    v = s->pending;
    mapping.mix((1ULL << 40) | (static_cast<uint64_t>(v.node) << 8) | static_cast<uint64_t>(v.index));
  } else if (s->param_index >= 0) {
    v = Value{graph_.params()[s->param_index], 0};
    mapping.mix((2ULL << 40) | static_cast<uint64_t>(s->param_index));
  } else {
    if (!s->buffer) {
      if (s->failed) throw GraphError(runtime::ErrorCode::kFailedPrecondition, *s->failed, {});
      throw std::logic_error("pjrt: a recorded op reads a storage that has no contents");
    }
    s->param_index = static_cast<int>(args_.size());
    args_.push_back(s->buffer);
    param_storage_.push_back(s);
    v = graph_.param(ir::Type{s->dtype, s->dims});
    mapping.mix((3ULL << 40) | static_cast<uint64_t>(s->param_index));
  }
  const ir::Type& have = graph_.type(v);
  if (have == want) return v;
  // Another thread flushed between recording and splicing: same elements, other dims.
  if (have.dtype != want.dtype || have.numel() != want.numel()) {
    throw std::logic_error("pjrt: a storage changed its element type while an op was being recorded");
  }
  *reshaped = true;
  ir::Builder b(graph_);
  return b.reshape(v, want.dims);
}

ir::Key DeviceGraph::head_signature(const Fragment& f) const {
  // The op's structure alone: in a loop, its first op reads a buffer in the
  // first iteration and a pending value in the others.
  return f.graph.key();
}

std::vector<Check> DeviceGraph::record(Fragment&& f, RecordMode mode) {
  bool flush_now = mode != RecordMode::Defer;
  std::lock_guard<std::mutex> lock(mu_);
  metrics().ops_recorded++;
  const FusionPolicy& policy = fusion_policy();
  if (capture_) flush_now = false;  // a captured graph is one program: no cuts
  if (!flush_now && !capture_ && policy.detect_loops && ops_.size() >= policy.min_loop &&
      head_signature(f) == head_) {
    // The graph's first op comes again: a loop body ends here. Cutting at the
    // same place each iteration lets every iteration hit one cached program.
    flush_locked(FlushReason::Loop, false);
  }
  if (ops_.empty()) head_ = head_signature(f);

  for (const auto& p : f.params) {
    if (p.storage && p.storage->device_index != device_) {
      throw std::logic_error("pjrt: an op recorded for device " + std::to_string(device_) +
                             " reads a storage of device " + std::to_string(p.storage->device_index));
    }
  }
  for (const auto& r : f.results) {
    if (r.first->device_index != device_) {
      throw std::logic_error("pjrt: an op recorded for device " + std::to_string(device_) +
                             " writes a storage of device " + std::to_string(r.first->device_index));
    }
  }
  if (!f.replica_devices.empty()) {
    if (!capture_ || (!replica_devices_.empty() && replica_devices_ != f.replica_devices)) {
      throw std::logic_error("pjrt: a collective recorded outside a capture, or beside one over other devices");
    }
    replica_devices_ = f.replica_devices;
    collectives_ += f.collectives;
  }
  const auto& fparams = f.graph.params();
  bool can_adopt = graph_.empty();
  for (size_t k = 0; can_adopt && k < f.params.size(); ++k) {
    Storage* s = f.params[k].storage;
    if (s && !(s->buffer && !s->pending.valid() && s->param_index < 0 &&
               f.graph.type(Value{fparams[k], 0}) == ir::Type{s->dtype, s->dims})) {
      can_adopt = false;
    }
  }
  std::vector<int> node_map;
  std::vector<Value> bound(f.params.size());
  ir::Key mapping;
  if (can_adopt) {
    // Strict mode's path: the fragment becomes the graph as it is.
    for (size_t k = 0; k < f.params.size(); ++k) {
      auto& p = f.params[k];
      bound[k] = Value{fparams[k], 0};
      if (p.storage) {
        p.storage->param_index = static_cast<int>(k);
        args_.push_back(p.storage->buffer);
        param_storage_.push_back(p.storage);
        mapping.mix((3ULL << 40) | k);
      } else {
        args_.push_back(std::move(p.buffer));
        param_storage_.push_back(nullptr);
        mapping.mix((4ULL << 40) | k);
      }
    }
  } else {
    for (size_t k = 0; k < f.params.size(); ++k) {
      auto& p = f.params[k];
      if (p.storage) {
        bool reshaped = false;
        bound[k] = bind_storage(p.storage, f.graph.type(Value{fparams[k], 0}), mapping, &reshaped);
        if (reshaped) mapping.mix(0x52ULL);
      } else {
        mapping.mix((4ULL << 40) | args_.size());
        args_.push_back(std::move(p.buffer));
        param_storage_.push_back(nullptr);
        bound[k] = graph_.param(f.graph.type(Value{fparams[k], 0}));
      }
    }
  }
  // Where each fragment value lands in the graph (computed before the fragment moves).
  std::vector<int> param_pos(f.graph.nodes().size(), -1);
  for (size_t k = 0; k < fparams.size(); ++k) param_pos[fparams[k]] = static_cast<int>(k);
  if (can_adopt) {
    graph_.adopt(std::move(f.graph), mapping);
  } else {
    node_map = graph_.splice(f.graph, bound, mapping);
  }
  auto here = [&](Value v) {
    if (param_pos[v.node] >= 0) return bound[param_pos[v.node]];
    return can_adopt ? v : Value{node_map[v.node], v.index};
  };
  // Results last: an op that reads and writes one storage read its old contents above.
  std::vector<std::pair<Storage*, Value>> results;
  results.reserve(f.results.size());
  for (auto& [s, v] : f.results) results.emplace_back(s, here(v));
  for (auto& [s, v] : results) {
    s->pending = v;
    const ir::Type& t = graph_.type(v);
    s->dims = t.dims;
    s->dtype = t.dtype;
    s->failed.reset();
    if (s->live_index < 0) {
      s->live_index = static_cast<int>(live_.size());
      live_.push_back(s);
    }
  }
  for (auto& flag : f.flags) {
    flags_.push_back({here(flag.value), std::move(flag.message)});
    flag_ops_.push_back(f.record);
  }
  if (f.nonfinite.valid()) {
    Value nf = here(f.nonfinite);
    ir::Builder b(graph_);
    nonfinite_ = nonfinite_.valid() ? b.binary("or", nonfinite_, nf) : nf;
  }
  ops_.push_back(std::move(f.record));
  if (flush_now) return flush_locked(FlushReason::Op, mode == RecordMode::RunAndCheck);
  if (!capture_ && ops_.size() >= policy.max_ops) flush_locked(FlushReason::Size, false);
  return {};
}

// ---------------------------------------------------------------- flushing

void DeviceGraph::reset_locked() {
  for (Storage* s : live_) {
    if (!s) continue;
    s->pending = Value{};
    s->live_index = -1;
  }
  for (Storage* s : param_storage_) {
    if (s) s->param_index = -1;
  }
  graph_.clear();
  args_.clear();
  param_storage_.clear();
  live_.clear();
  flags_.clear();
  flag_ops_.clear();
  nonfinite_ = Value{};
  ops_.clear();
  head_ = ir::Key();
  replica_devices_.clear();
  collectives_ = 0;
}

void DeviceGraph::flush(FlushReason reason) {
  std::lock_guard<std::mutex> lock(mu_);
  flush_locked(reason, false);
}

std::vector<Check> DeviceGraph::flush_locked(FlushReason reason, bool return_checks) {
  if (capture_ && !capture_ending_ && !ops_.empty()) {
    break_capture_locked(std::string("a sync point (") + flush_reason_name(reason) + ") inside the graph");
  }
  if (ops_.empty()) return {};
  ir::Builder b(graph_);
  // Scratch lists kept across flushes (no allocation per op in strict mode).
  std::vector<Value>& outs = scratch_outs_;
  std::vector<Storage*>& out_storage = scratch_storage_;
  std::vector<std::pair<size_t, size_t>>& donated = scratch_donated_;  // (param, output)
  std::vector<PJRT_Buffer*>& raw = scratch_raw_;
  outs.clear();
  out_storage.clear();
  donated.clear();
  raw.clear();
  for (Storage* s : live_) {
    if (!s) continue;
    outs.push_back(s->pending);
    out_storage.push_back(s);
  }
  // Donation: a storage overwritten by this program whose old buffer nothing
  // else holds (no other storage, no pending host copy) gives that buffer to
  // its new contents, so in-place updates do not double peak memory.
  if (fusion_policy().donate) {
    for (size_t k = 0; k < out_storage.size(); ++k) {
      Storage* s = out_storage[k];
      if (s->param_index < 0 || !s->buffer) continue;
      size_t p = static_cast<size_t>(s->param_index);
      if (args_[p].get() != s->buffer.get() || args_[p].use_count() != 2) continue;
      const ir::Type& pt = graph_.type(Value{graph_.params()[p], 0});
      const ir::Type& vt = graph_.type(outs[k]);
      if (pt.dtype != vt.dtype || pt.numel() != vt.numel()) continue;
      outs[k] = b.reshape(outs[k], pt.dims);
      donated.emplace_back(p, k);
    }
  }
  if (outs.empty() && flags_.empty() && !nonfinite_.valid()) {
    // Nothing recorded is still referenced: there is nothing to compute.
    std::lock_guard<std::mutex> lock(metrics().mu);
    metrics().flush_reasons["nothing_live"]++;
    reset_locked();
    return {};
  }
  size_t first_flag = outs.size();
  for (auto& f : flags_) outs.push_back(f.value);
  size_t nonfinite_index = outs.size();
  if (nonfinite_.valid()) outs.push_back(nonfinite_);
  graph_.set_outputs(outs);
  if (!replica_devices_.empty()) graph_.set_replicas(static_cast<int>(replica_devices_.size()));
  ir::Key key = graph_.key();
  for (auto [p, k] : donated) {
    graph_.set_param_attr(p, "tf.aliasing_output = " + std::to_string(k) + " : i32");
    key.mix((static_cast<uint64_t>(p) << 32) | k);
  }
  key.mix(0xD0ULL + donated.size());
  // A program holding collectives runs as one replica per device of their group;
  // each member's first launch of it shares one launch id (replays count on).
  const uint32_t launch_base =
      replica_devices_.empty() ? 0 : kCapturedLaunch | (static_cast<uint32_t>(key.a >> 40) & 0x3FFF) << 16;

  auto label = [&] { return program_label(ops_); };
  std::vector<std::unique_ptr<runtime::Buffer>> results;
  std::unique_ptr<runtime::Event> done;
  std::shared_ptr<runtime::LoadedExecutable> exe;
  try {
    exe = rt_.get_executable(key, [&] { return graph_.to_mlir(); }, label, replica_devices_);
    for (auto& a : args_) raw.push_back(a->raw());
    TracedLaunch traced(device_, [&] { return label(); });
    auto unblocked = enter_blocking_scope();
    if (!replica_devices_.empty()) LaunchBarrier::get().arrive(launch_base, replica_devices_, rt_.device(device_).id());
    results = exe->execute(rt_.device(device_), raw, &done, nullptr, static_cast<int>(launch_base));
    unblocked.reset();
    traced.until(done.get());
  } catch (const runtime::PjrtError& e) {
    fail_locked(out_storage, e.code(), e.what());
  } catch (const std::exception& e) {
    fail_locked(out_storage, runtime::ErrorCode::kInternal, e.what());
  }
  if (capture_ && capture_ending_) {
    Capture& c = *capture_;
    c.exe = exe;
    for (int p : graph_.params()) c.param_types.push_back(graph_.type(Value{p, 0}));
    c.param_storage = param_storage_;
    for (size_t p = 0; p < args_.size(); ++p) c.fixed.push_back(param_storage_[p] ? nullptr : args_[p]);
    for (const Value& v : outs) c.out_types.push_back(graph_.type(v));
    c.out_storage = out_storage;
    c.donated = donated;
    for (const auto& f : flags_) c.flag_messages.push_back(f.message);
    c.flag_ops = flag_ops_;
    c.replica_devices = replica_devices_;
    c.collectives = collectives_;
    c.launch_base = launch_base;
    c.runs = 1;  // this launch was run 0
  }
  auto& m = metrics();
  m.collectives_in_programs += collectives_;
  m.executions++;
  m.graphs++;
  m.graph_ops += static_cast<int64_t>(ops_.size());
  int64_t n_ops = static_cast<int64_t>(ops_.size()), prev = m.max_graph_ops.load();
  while (n_ops > prev && !m.max_graph_ops.compare_exchange_weak(prev, n_ops)) {
  }
  m.graph_outputs += static_cast<int64_t>(out_storage.size());
  m.donated_buffers += static_cast<int64_t>(donated.size());
  if (reason != FlushReason::Op) {
    std::lock_guard<std::mutex> lock(m.mu);
    m.flush_reasons[flush_reason_name(reason)]++;
  }
  for (auto [p, k] : donated) args_[p]->mark_donated();

  runtime::MemoryCounter* counter = &memory_counter(device_);
  std::vector<std::shared_ptr<runtime::Buffer>> shared;
  shared.reserve(results.size());
  for (size_t i = 0; i < results.size(); ++i) {
    results[i]->track(counter, bytes_of(graph_.type(outs[i])));
    shared.emplace_back(std::move(results[i]));
  }
  auto program = std::make_shared<const std::vector<OpRecord>>(std::move(ops_));
  if (capture_ && capture_ending_) capture_->ops = program;
  for (size_t k = 0; k < out_storage.size(); ++k) {
    Storage* s = out_storage[k];
    const ir::Type& t = graph_.type(outs[k]);
    s->buffer = shared[k];
    s->dims = t.dims;
    s->dtype = t.dtype;
    s->producer = program;
    s->failed.reset();
  }
  std::vector<Check> checks;
  for (size_t i = 0; i < flags_.size(); ++i) {
    checks.push_back({shared[first_flag + i], std::move(flags_[i].message), flag_ops_[i]});
  }
  if (nonfinite_.valid()) {
    checks.push_back({shared[nonfinite_index], "", program->back(), true});
  }
  reset_locked();
  // Debug mode reads its checks at once; the others are read at the next sync.
  if (return_checks) {
    queue_launched(std::move(done), {});
    return checks;
  }
  queue_launched(std::move(done), std::move(checks));
  return {};
}

void DeviceGraph::queue_launched(std::unique_ptr<runtime::Event> done, std::vector<Check> checks) {
  std::lock_guard<std::mutex> lock(queue_mu_);
  if (done) {
    if (launched_.size() >= 256) {
      launched_.erase(std::remove_if(launched_.begin(), launched_.end(), [](auto& e) { return e->is_ready(); }),
                      launched_.end());
    }
    launched_.push_back(std::move(done));
  }
  for (auto& c : checks) checks_.push_back(std::move(c));
}

// ---------------------------------------------------------------- capture and replay

bool DeviceGraph::can_record_collective(const std::vector<int64_t>& devices) {
  std::lock_guard<std::mutex> lock(mu_);
  return capture_ && !capture_ending_ && capture_->broken.empty() &&
         (replica_devices_.empty() || replica_devices_ == devices);
}

void DeviceGraph::break_capture_locked(const std::string& why) {
  if (capture_ && capture_->broken.empty()) capture_->broken = why;
}

void DeviceGraph::begin_capture() {
  std::lock_guard<std::mutex> lock(mu_);
  if (capture_) throw std::logic_error("pjrt: a graph capture is already in progress on this device");
  flush_locked(FlushReason::Compile, false);
  capture_ = std::make_unique<Capture>();
}

std::unique_ptr<Capture> DeviceGraph::finish_capture_locked() {
  capture_ending_ = true;
  try {
    flush_locked(FlushReason::Compile, false);
  } catch (...) {
    capture_ending_ = false;
    capture_.reset();
    throw;
  }
  capture_ending_ = false;
  return std::move(capture_);
}

std::unique_ptr<Capture> DeviceGraph::end_capture() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!capture_) throw std::logic_error("pjrt: end_capture without begin_capture");
  return finish_capture_locked();
}

void DeviceGraph::abort_capture() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!capture_) return;
  capture_->broken = "aborted";
  if (!replica_devices_.empty()) {
    // Its collectives would wait for the other members' parts, which an error on this
    // rank alone never launches: nothing of it runs (what it wrote keeps its old contents).
    std::vector<Storage*> written;
    for (Storage* s : live_) {
      if (s) written.push_back(s);
    }
    try {
      fail_locked(written, runtime::ErrorCode::kAborted,
                  "the capture holding a collective was aborted by an error on this rank");
    } catch (const GraphError&) {
    }
    capture_.reset();
    return;
  }
  // What was recorded still runs (as the eager ops it came from would have).
  finish_capture_locked();
}

std::vector<std::shared_ptr<runtime::Buffer>> DeviceGraph::replay(
    const Capture& c, const std::vector<std::shared_ptr<runtime::Buffer>>& args) {
  if (!c.exe) return {};
  std::vector<PJRT_Buffer*> raw;
  raw.reserve(args.size());
  for (const auto& a : args) raw.push_back(a->raw());
  // Donate only what nothing but the caller's vector and its storage holds.
  std::vector<int64_t> keep;
  std::vector<size_t> given;
  for (auto [p, k] : c.donated) {
    if (!fusion_policy().donate || args[p].use_count() != 2) {
      keep.push_back(static_cast<int64_t>(p));
    } else {
      given.push_back(p);
    }
  }
  std::vector<std::unique_ptr<runtime::Buffer>> results;
  std::unique_ptr<runtime::Event> done;
  try {
    TracedLaunch traced(device_, [&] { return "compiled: " + (c.ops ? program_label(*c.ops) : std::string()); });
    const uint32_t launch = c.replica_devices.empty() ? 0 : c.launch_base | (c.runs++ & 0xFFFF);
    auto unblocked = enter_blocking_scope();
    if (launch) LaunchBarrier::get().arrive(launch, c.replica_devices, rt_.device(device_).id());
    results = c.exe->execute(rt_.device(device_), raw, &done, &keep, static_cast<int>(launch));
    unblocked.reset();
    traced.until(done.get());
  } catch (const runtime::PjrtError& e) {
    throw GraphError(e.code(), e.what(), c.ops ? *c.ops : std::vector<OpRecord>{});
  }
  auto& m = metrics();
  m.executions++;
  m.compiled_runs++;
  m.collectives_in_programs += c.collectives;
  m.donated_buffers += static_cast<int64_t>(given.size());
  for (size_t p : given) args[p]->mark_donated();
  runtime::MemoryCounter* counter = &memory_counter(device_);
  std::vector<std::shared_ptr<runtime::Buffer>> shared;
  shared.reserve(results.size());
  for (size_t i = 0; i < results.size(); ++i) {
    results[i]->track(counter, bytes_of(c.out_types[i]));
    shared.emplace_back(std::move(results[i]));
  }
  std::vector<Check> checks;
  size_t first_flag = c.out_storage.size();
  for (size_t i = 0; i < c.flag_messages.size(); ++i) {
    checks.push_back({shared[first_flag + i], c.flag_messages[i], c.flag_ops[i]});
  }
  queue_launched(std::move(done), std::move(checks));
  return shared;
}

void DeviceGraph::fail_locked(const std::vector<Storage*>& outputs, runtime::ErrorCode code, const std::string& what) {
  // Nothing of this program is applied: written storages keep their old
  // buffers (and get the buffers' dims and dtype back); fresh results
  // remember why they have no contents.
  auto why = std::make_shared<const std::string>("its value was never computed: " + what);
  for (Storage* s : outputs) {
    if (s->buffer) {
      try {
        s->dims = s->buffer->dims();
        s->dtype = ir::from_pjrt_type(s->buffer->element_type());
      } catch (const std::exception&) {
        s->buffer.reset();
        s->failed = why;
      }
    } else {
      s->failed = why;
    }
  }
  std::vector<OpRecord> ops = std::move(ops_);
  reset_locked();
  throw GraphError(code, what, std::move(ops));
}

std::shared_ptr<runtime::Buffer> DeviceGraph::materialize(Storage* s) {
  std::lock_guard<std::mutex> lock(mu_);
  break_capture_locked("the graph reads device data on the host");
  if (s->pending.valid()) flush_locked(FlushReason::Sync, false);
  return s->buffer;
}

void DeviceGraph::forget(Storage* s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (s->param_index >= 0) break_capture_locked("a tensor the graph reads was freed while it was recorded");
  if (s->live_index >= 0) {
    live_[s->live_index] = nullptr;
    metrics().dropped_values++;
  }
  if (s->param_index >= 0) param_storage_[s->param_index] = nullptr;
  s->pending = Value{};
  s->live_index = -1;
  s->param_index = -1;
}

void DeviceGraph::assign(Storage* s, std::shared_ptr<runtime::Buffer> buffer, std::vector<int64_t> dims,
                         ir::DType dtype, ProgramOps producer) {
  std::lock_guard<std::mutex> lock(mu_);
  break_capture_locked("the graph writes host data into a device tensor");
  if (s->live_index >= 0) live_[s->live_index] = nullptr;
  // Ops recorded earlier keep reading the old buffer through their parameter.
  if (s->param_index >= 0) param_storage_[s->param_index] = nullptr;
  s->pending = Value{};
  s->live_index = -1;
  s->param_index = -1;
  s->buffer = std::move(buffer);
  s->dims = std::move(dims);
  s->dtype = dtype;
  s->producer = std::move(producer);
  s->failed.reset();
}

void DeviceGraph::await_all() {
  std::vector<std::unique_ptr<runtime::Event>> events;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    events.swap(launched_);
  }
  std::exception_ptr first;
  for (auto& e : events) {
    try {
      e->await();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

std::vector<Check> DeviceGraph::take_checks() {
  std::lock_guard<std::mutex> lock(queue_mu_);
  std::vector<Check> out;
  out.swap(checks_);
  return out;
}

size_t DeviceGraph::pending_ops() {
  std::lock_guard<std::mutex> lock(mu_);
  return ops_.size();
}

namespace {
constexpr int kMaxGraphs = 64;
std::atomic<DeviceGraph*>* graph_slots() {
  static auto* slots = new std::atomic<DeviceGraph*>[kMaxGraphs]();  // leaked: storages may die at exit
  return slots;
}
}  // namespace

DeviceGraph& device_graph(Runtime& rt, int device) {
  if (device < 0 || device >= kMaxGraphs) device = 0;
  auto& slot = graph_slots()[device];
  DeviceGraph* g = slot.load(std::memory_order_acquire);
  if (g) return *g;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  g = slot.load();
  if (!g) {
    g = new DeviceGraph(rt, device);
    slot.store(g, std::memory_order_release);
  }
  return *g;
}

std::vector<DeviceGraph*> device_graphs() {
  std::vector<DeviceGraph*> out;
  for (int i = 0; i < kMaxGraphs; ++i) {
    if (DeviceGraph* g = graph_slots()[i].load()) out.push_back(g);
  }
  return out;
}

}  // namespace torch_pjrt::executor
