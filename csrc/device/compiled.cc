#include "device/compiled.h"

#include <unordered_map>
#include <unordered_set>

namespace torch_pjrt::device {

namespace {
uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
  return h * 0xBF58476D1CE4E5B9ULL;
}

// Gives a storage's contents the type a program parameter wants (same bytes,
// other dims or element type): one small program, instead of a new capture
// whenever another op happened to produce the input.
void retype_contents(executor::DeviceGraph& graph, executor::Storage* s, const ir::Type& want) {
  executor::Fragment f;
  ir::Builder b(f.graph);
  ir::Type have{s->dtype, s->dims};
  ir::Value v = f.graph.param(have);
  f.params.push_back({s, nullptr});
  if (have.dtype != want.dtype) v = b.bitcast_flat(b.reshape(v, {have.numel()}), want.dtype);
  f.results.emplace_back(s, b.reshape(v, want.dims));
  f.record.op = "pjrt::retype (a compiled graph's input)";
  graph.record(std::move(f), executor::RecordMode::Run);
}

// A tensor over `storage` with this geometry: metadata only, no dispatch.
at::Tensor view_of(const c10::Storage& storage, const std::vector<int64_t>& sizes,
                   const std::vector<int64_t>& strides, int64_t offset, at::ScalarType dtype) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage),
                                                          c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                          c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  return t;
}
}  // namespace

void begin_capture(int device) {
  // The generator's state must exist before recording: creating it is a host upload.
  rng_storage(default_generator(device));
  try {
    graph_of(device).begin_capture();
  } catch (const executor::GraphError& e) {
    rethrow(e);
  }
  set_capturing(true);
}

void abort_capture(int device) {
  set_capturing(false);
  try {
    graph_of(device).abort_capture();
  } catch (const executor::GraphError& e) {
    rethrow(e);
  }
}

uint64_t layout_key(const std::vector<at::Tensor>& inputs, const std::vector<int64_t>& ints) {
  // A program carries the matmul precision it was captured with.
  uint64_t h = mix(0x7043, static_cast<uint64_t>(ir::dot_precision()));
  h = mix(h, ints.size());
  for (int64_t v : ints) h = mix(h, static_cast<uint64_t>(v));
  std::unordered_map<const void*, int> first_of;
  int device = -1;
  for (size_t j = 0; j < inputs.size(); ++j) {
    const at::Tensor& t = inputs[j];
    StorageState* st = state_of(t);
    if (!st || t.layout() != at::kStrided) return 0;  // not replayable as it is
    if (device < 0) device = st->device_index;
    if (st->device_index != device) return 0;
    h = mix(h, static_cast<uint64_t>(t.scalar_type()));
    h = mix(h, static_cast<uint64_t>(t.dim()));
    for (int64_t d = 0; d < t.dim(); ++d) h = mix(mix(h, t.size(d)), t.stride(d));
    h = mix(h, static_cast<uint64_t>(t.storage_offset()));
    h = mix(h, st->nbytes);  // not the contents' dims: run() reshapes them to the program's
    auto [it, fresh] = first_of.emplace(st, static_cast<int>(j));
    h = mix(h, fresh ? 3 : 1000 + static_cast<uint64_t>(it->second));
  }
  return h | 1;  // never 0
}

std::shared_ptr<CompiledGraph> CompiledGraph::finish(int device, const std::vector<at::Tensor>& inputs,
                                                     const std::vector<std::optional<at::Tensor>>& outputs,
                                                     const std::vector<at::Tensor>& constants, std::string* why) {
  set_capturing(false);
  std::unique_ptr<executor::Capture> cap;
  try {
    cap = graph_of(device).end_capture();
  } catch (const executor::GraphError& e) {
    rethrow(e);
  }
  if (!cap->broken.empty()) {
    *why = cap->broken;
    return nullptr;
  }
  auto g = std::shared_ptr<CompiledGraph>(new CompiledGraph());
  g->device_ = device;
  std::unordered_map<const executor::Storage*, int> input_of;
  for (size_t j = 0; j < inputs.size(); ++j) {
    StorageState* st = state_of(inputs[j]);
    if (!st || st->device_index != device) {
      *why = "input " + std::to_string(j) + " is not a tensor on pjrt:" + std::to_string(device);
      return nullptr;
    }
    input_of.emplace(st, static_cast<int>(j));
  }
  g->generator_ = default_generator(device);
  std::unordered_set<const executor::Storage*> fixed{&rng_storage(g->generator_)};
  for (const auto& c : constants) {
    if (StorageState* st = state_of(c)) {
      fixed.insert(st);
      g->constants_.push_back(c.storage());
    }
  }
  auto bind = [&](executor::Storage* s, Binding* b) {
    if (auto it = input_of.find(s); it != input_of.end()) {
      b->from = From::Input;
      b->index = it->second;
      return true;
    }
    if (fixed.count(s)) {
      b->from = From::Storage;
      b->storage = s;
      return true;
    }
    return false;
  };
  for (size_t p = 0; p < cap->param_storage.size(); ++p) {
    Binding b;
    executor::Storage* s = cap->param_storage[p];
    if (s && !bind(s, &b)) {
      *why = "the graph reads a pjrt tensor that is neither one of its inputs nor a constant it holds";
      return nullptr;
    }
    g->params_.push_back(b);
  }
  std::unordered_map<const executor::Storage*, int> fresh_of;
  for (executor::Storage* s : cap->out_storage) {
    Binding b;
    if (!bind(s, &b)) {
      b.from = From::Fresh;
      auto [it, added] = fresh_of.emplace(s, static_cast<int>(g->fresh_nbytes_.size()));
      if (added) g->fresh_nbytes_.push_back(static_cast<StorageState*>(s)->nbytes);
      b.index = it->second;
    }
    g->results_.push_back(b);
  }
  std::vector<bool> fresh_returned(g->fresh_nbytes_.size(), false);
  for (size_t i = 0; i < outputs.size(); ++i) {
    Output o;
    if (outputs[i] && outputs[i]->defined()) {
      const at::Tensor& t = *outputs[i];
      StorageState* st = state_of(t);
      if (!st) {
        *why = "output " + std::to_string(i) + " is not a pjrt tensor";
        return nullptr;
      }
      o.geometry = {t.sizes().vec(), t.strides().vec(), t.storage_offset(), t.scalar_type()};
      if (auto it = input_of.find(st); it != input_of.end()) {
        o.index = it->second;
        o.kind = t.is_same(inputs[o.index]) ? OutKind::SameInput : OutKind::InputView;
      } else if (auto f = fresh_of.find(st); f != fresh_of.end()) {
        o.kind = OutKind::FreshView;
        o.index = f->second;
        fresh_returned[o.index] = true;
      } else if (!st->has_contents()) {
        o.kind = OutKind::Empty;
        o.nbytes = st->nbytes;
      } else {
        *why = "output " + std::to_string(i) + " is a pjrt tensor the graph neither received nor computed";
        return nullptr;
      }
    }
    g->outputs_.push_back(std::move(o));
  }
  for (bool r : fresh_returned) {
    if (!r) {
      *why = "a value the graph computed is held outside its outputs";
      return nullptr;
    }
  }
  g->capture_ = std::move(cap);
  return g;
}

std::vector<int> CompiledGraph::mutated_inputs() const {
  std::vector<int> out;
  for (const Binding& b : results_) {
    if (b.from == From::Input) out.push_back(b.index);
  }
  return out;
}

std::optional<std::vector<std::optional<at::Tensor>>> CompiledGraph::run(const std::vector<at::Tensor>& inputs) {
  executor::DeviceGraph& graph = graph_of(device_);
  const executor::Capture& cap = *capture_;
  std::vector<std::shared_ptr<runtime::Buffer>> args;
  args.reserve(params_.size());
  try {
    rng_storage(generator_);                      // uploads the state again after a manual_seed
    graph.flush(executor::FlushReason::Compile);  // eager work recorded before this call runs first
    for (size_t p = 0; p < params_.size(); ++p) {
      const Binding& b = params_[p];
      if (b.from == From::Fixed) {
        args.push_back(cap.fixed[p]);
        continue;
      }
      executor::Storage* s = b.from == From::Input ? state_of(inputs[b.index]) : b.storage;
      std::shared_ptr<runtime::Buffer> buffer = graph.materialize(s);
      const ir::Type& want = cap.param_types[p];
      if (!buffer) return std::nullopt;
      if (s->dtype != want.dtype || s->dims != want.dims) {
        int64_t have_bytes = ir::Type{s->dtype, s->dims}.numel() * static_cast<int64_t>(ir::dtype_size(s->dtype));
        if (have_bytes != want.numel() * static_cast<int64_t>(ir::dtype_size(want.dtype))) return std::nullopt;
        buffer.reset();
        retype_contents(graph, s, want);
        buffer = graph.materialize(s);
      }
      args.push_back(std::move(buffer));
    }
  } catch (const executor::GraphError& e) {
    rethrow(e);
  }
  std::vector<std::shared_ptr<runtime::Buffer>> outs;
  try {
    outs = graph.replay(cap, args);
  } catch (const executor::GraphError& e) {
    rethrow(e);
  }
  args.clear();
  std::vector<c10::Storage> fresh;
  fresh.reserve(fresh_nbytes_.size());
  for (size_t nbytes : fresh_nbytes_) {
    at::Tensor t = at::empty({static_cast<int64_t>(nbytes)},
                             at::TensorOptions().dtype(at::kByte).device(c10::DeviceType::PrivateUse1, device_));
    fresh.push_back(t.storage());
  }
  for (size_t k = 0; k < results_.size(); ++k) {
    const Binding& b = results_[k];
    executor::Storage* s = b.from == From::Input     ? state_of(inputs[b.index])
                           : b.from == From::Storage ? b.storage
                                                     : state_of(fresh[b.index]);
    const ir::Type& t = cap.out_types[k];
    graph.assign(s, std::move(outs[k]), t.dims, t.dtype, cap.ops);
  }
  std::vector<std::optional<at::Tensor>> result;
  result.reserve(outputs_.size());
  for (const Output& o : outputs_) {
    const Geometry& g = o.geometry;
    switch (o.kind) {
      case OutKind::None: result.emplace_back(std::nullopt); break;
      case OutKind::SameInput: result.emplace_back(inputs[o.index]); break;
      case OutKind::InputView:
        result.emplace_back(view_of(inputs[o.index].storage(), g.sizes, g.strides, g.offset, g.dtype));
        break;
      case OutKind::FreshView:
        result.emplace_back(view_of(fresh[o.index], g.sizes, g.strides, g.offset, g.dtype));
        break;
      case OutKind::Empty: {
        at::Tensor t = at::empty({static_cast<int64_t>(o.nbytes)},
                                 at::TensorOptions().dtype(at::kByte).device(c10::DeviceType::PrivateUse1, device_));
        result.emplace_back(view_of(t.storage(), g.sizes, g.strides, g.offset, g.dtype));
        break;
      }
    }
  }
  return result;
}

}  // namespace torch_pjrt::device
