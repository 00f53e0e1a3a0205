#include "distributed/xla_transport.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <set>
#include <stdexcept>

#include "device/context.h"
#include "lowering/collectives.h"

namespace torch_pjrt::distributed {
namespace {

using lowering::CollectiveKind;
using lowering::CollectiveSpec;
using lowering::Reduction;
using RedOp = c10d::ReduceOp::RedOpType;

std::mutex g_stats_mutex;
TransportStats g_stats;

Reduction reduction_of(RedOp op) {
  switch (op) {
    case RedOp::SUM: return Reduction::Sum;
    case RedOp::PRODUCT: return Reduction::Product;
    case RedOp::MIN: return Reduction::Min;
    case RedOp::MAX: return Reduction::Max;
    case RedOp::BAND: return Reduction::BitAnd;
    case RedOp::BOR: return Reduction::BitOr;
    case RedOp::BXOR: return Reduction::BitXor;
    default: TORCH_CHECK(false, "pjrt: the XLA transport has no reduction ", static_cast<int>(op));
  }
}

// Compiled collective programs of this process, shared by its ranks (threads
// compiling the same program wait for the first).
class ProgramCache {
 public:
  static ProgramCache& get() {
    static ProgramCache* cache = new ProgramCache();  // leaked: executables outlive static teardown order issues
    return *cache;
  }
  const runtime::LoadedExecutable& program(const std::string& module, const std::vector<int64_t>& devices) {
    std::string key = module;
    for (int64_t d : devices) key += "," + std::to_string(d);
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      auto it = programs_.find(key);
      if (it != programs_.end()) return *it->second;
      if (!compiling_.count(key)) break;
      ready_.wait(lock);
    }
    compiling_.insert(key);
    lock.unlock();
    std::unique_ptr<runtime::LoadedExecutable> exe;
    try {
      exe = device::rt().client().compile(module, devices);
    } catch (...) {
      lock.lock();
      compiling_.erase(key);
      ready_.notify_all();
      throw;
    }
    lock.lock();
    compiling_.erase(key);
    auto& slot = programs_[key];
    slot = std::move(exe);
    ready_.notify_all();
    return *slot;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::map<std::string, std::unique_ptr<runtime::LoadedExecutable>> programs_;
  std::set<std::string> compiling_;
};

class XlaTransport final : public Transport {
 public:
  XlaTransport(std::unique_ptr<Transport> control, int rank, int size, std::vector<int64_t> device_ids)
      : control_(std::move(control)), rank_(rank), size_(size), device_ids_(std::move(device_ids)) {
    TORCH_CHECK(static_cast<int>(device_ids_.size()) == size_, "pjrt: the XLA transport needs one device per rank");
    uint64_t h = 1469598103934665603ull;
    for (int64_t d : device_ids_) h = (h ^ static_cast<uint64_t>(d + 1)) * 1099511628211ull;
    group_hash_ = static_cast<int>(h & 0x3fff) << 16;
  }

  std::string name() const override { return "xla"; }

  std::vector<std::vector<int64_t>> exchange(const std::vector<int64_t>& values) override {
    return control_->exchange(values);
  }

  void all_reduce(const at::Tensor& t, RedOp op) override {
    write(t, run({CollectiveKind::AllReduce, {}, {}, size_, reduction_of(op)}, t));
  }
  void broadcast(const at::Tensor& t, int root) override {
    CollectiveSpec spec{CollectiveKind::AllGather};
    spec.keep_chunk = root;
    write(t, run(spec, t));
  }
  void reduce(const at::Tensor& t, int root, RedOp op) override {
    at::Tensor result = run({CollectiveKind::AllReduce, {}, {}, size_, reduction_of(op)}, t);
    if (rank_ == root) write(t, result);
  }
  void all_gather(const at::Tensor& out, const at::Tensor& in) override {
    write(out, run({CollectiveKind::AllGather}, in));
  }
  void gather(const at::Tensor& out, const at::Tensor& in, int root) override {
    at::Tensor result = run({CollectiveKind::AllGather}, in);
    if (rank_ == root) write(out, result);
  }
  void scatter(const at::Tensor& out, const at::Tensor& in, int root) override {
    // An all-to-all keeping the root's chunk: the others send chunks nobody keeps.
    CollectiveSpec spec{CollectiveKind::AllToAll};
    spec.keep_chunk = root;
    const at::Tensor source = rank_ == root ? in : at::zeros({out.numel() * size_}, out.options());
    write(out, run(spec, source));
  }
  void reduce_scatter(const at::Tensor& out, const at::Tensor& in, RedOp op) override {
    write(out, run({CollectiveKind::ReduceScatter, {}, {}, size_, reduction_of(op)}, in));
  }
  void all_to_all(const at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                  const std::vector<int64_t>& in_splits) override {
    const bool equal = std::all_of(out_splits.begin(), out_splits.end(), [&](int64_t s) { return s == out_splits[0]; }) &&
                       std::all_of(in_splits.begin(), in_splits.end(), [&](int64_t s) { return s == in_splits[0]; });
    if (!equal || (!out_splits.empty() && !in_splits.empty() && out_splits[0] != in_splits[0])) {
      control_->all_to_all(out, in, out_splits, in_splits);  // ragged rows: through the control transport
      return;
    }
    write(out, run({CollectiveKind::AllToAll}, in));
  }
  c10::intrusive_ptr<c10d::Work> send(const at::Tensor& t, int dst, int tag) override {
    return control_->send(t, dst, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(const at::Tensor& t, int src, int tag) override {
    return control_->recv(t, src, tag);
  }

 private:
  // A pjrt tensor's contents as one buffer of its own (a dense copy when the
  // tensor is a view, or its storage holds more or other-typed elements).
  std::pair<at::Tensor, std::shared_ptr<runtime::Buffer>> dense_buffer(const at::Tensor& t) {
    const ir::DType dtype = device::to_ir(t.scalar_type());
    auto usable = [&](const at::Tensor& x) -> std::shared_ptr<runtime::Buffer> {
      if (!x.is_contiguous() || x.storage_offset() != 0) return nullptr;
      auto buffer = device::materialize(device::state_of(x));
      if (!buffer || buffer->element_type() != ir::pjrt_type(dtype)) return nullptr;
      int64_t n = 1;
      for (int64_t d : buffer->dims()) n *= d;
      return n == x.numel() ? buffer : nullptr;
    };
    if (auto buffer = usable(t)) return {t, buffer};
    at::Tensor copy = t.clone(at::MemoryFormat::Contiguous);
    auto buffer = usable(copy);
    TORCH_CHECK(buffer, "pjrt: the XLA transport could not take the contents of a ", t.scalar_type(), " tensor");
    return {copy, buffer};
  }

  // Runs `spec` on `input` (this rank's part; every rank launches its own);
  // the result as a new flat pjrt tensor.
  at::Tensor run(CollectiveSpec spec, const at::Tensor& input) {
    TORCH_CHECK(input.device().is_privateuseone(), "pjrt: the XLA transport takes pjrt tensors, got one on ",
                input.device());
    auto [dense, buffer] = dense_buffer(input);
    spec.dtype = device::to_ir(input.scalar_type());
    spec.input_dims = buffer->dims();
    spec.replicas = size_;
    std::string module;
    try {
      module = lowering::collective_module(spec);
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK(false, "pjrt: ", e.what());
    }
    const runtime::LoadedExecutable& exe = ProgramCache::get().program(module, device_ids_);
    const int index = static_cast<int>(input.device().index());
    const int launch = group_hash_ | static_cast<int>(++launches_ & 0xffff);
    auto outputs = exe.execute(device::rt().device(index), {buffer->raw()}, nullptr, nullptr, launch);
    const int64_t n = lowering::collective_output_elements(spec);
    at::Tensor result = at::empty({n}, input.options());
    device::assign(device::state_of(result), std::shared_ptr<runtime::Buffer>(std::move(outputs.at(0))), {n},
                   spec.dtype);
    return result;
  }

  static void write(const at::Tensor& target, const at::Tensor& flat) {
    target.copy_(flat.view(target.sizes()));
  }

  std::unique_ptr<Transport> control_;
  int rank_;
  int size_;
  std::vector<int64_t> device_ids_;
  int group_hash_ = 0;
  uint64_t launches_ = 0;
};

}  // namespace

std::unique_ptr<Transport> make_xla_transport(std::unique_ptr<Transport> control, int rank, int size,
                                              std::vector<int64_t> device_ids) {
  return std::make_unique<XlaTransport>(std::move(control), rank, size, std::move(device_ids));
}

TransportStats transport_stats() {
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  return g_stats;
}

void reset_transport_stats() {
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  g_stats = TransportStats{};
}

void count_collective(const std::string& transport) {
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  ++g_stats.collectives[transport];
}

void count_host_bytes(int64_t bytes) {
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  g_stats.host_bytes += bytes;
}

}  // namespace torch_pjrt::distributed
