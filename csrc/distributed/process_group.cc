#include "distributed/process_group.h"

#include <ATen/ATen.h>
#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "device/context.h"
#include "distributed/xla_transport.h"

namespace torch_pjrt::distributed {
namespace {

using RedOp = c10d::ReduceOp::RedOpType;

const char* op_name(c10d::OpType type) {
  switch (type) {
    case c10d::OpType::BROADCAST: return "broadcast";
    case c10d::OpType::ALLREDUCE: return "all_reduce";
    case c10d::OpType::ALLREDUCE_COALESCED: return "all_reduce_coalesced";
    case c10d::OpType::REDUCE: return "reduce";
    case c10d::OpType::ALLGATHER: return "all_gather";
    case c10d::OpType::_ALLGATHER_BASE: return "all_gather_into_tensor";
    case c10d::OpType::ALLGATHER_COALESCED: return "all_gather_coalesced";
    case c10d::OpType::GATHER: return "gather";
    case c10d::OpType::SCATTER: return "scatter";
    case c10d::OpType::REDUCE_SCATTER: return "reduce_scatter";
    case c10d::OpType::_REDUCE_SCATTER_BASE: return "reduce_scatter_tensor";
    case c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED: return "reduce_scatter_tensor_coalesced";
    case c10d::OpType::ALLTOALL_BASE: return "all_to_all_single";
    case c10d::OpType::ALLTOALL: return "all_to_all";
    case c10d::OpType::SEND: return "send";
    case c10d::OpType::RECV: return "recv";
    case c10d::OpType::RECVANYSOURCE: return "recv";
    case c10d::OpType::BARRIER: return "barrier";
    default: return "collective";
  }
}

const char* reduce_op_name(int64_t op) {
  static const char* names[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"};
  return op >= 0 && op < 9 ? names[op] : "?";
}

std::string describe(at::ScalarType dtype, c10::IntArrayRef sizes) {
  std::ostringstream s;
  s << c10::toString(dtype) << sizes;
  return s.str();
}

// A device tensor's contents on the host, dense (counted: bytes through the host).
at::Tensor to_host(const at::Tensor& t) {
  count_host_bytes(static_cast<int64_t>(t.nbytes()));
  return t.to(at::kCPU).contiguous();
}
at::Tensor host_like(const at::Tensor& t) { return at::empty(t.sizes(), t.options().device(at::kCPU)); }
// Writes a dense tensor (host or device) of the same numel into a device tensor (any strides).
void write_back(const at::Tensor& device_tensor, const at::Tensor& host) {
  if (host.is_cpu()) count_host_bytes(static_cast<int64_t>(host.nbytes()));
  device_tensor.copy_(host.view(device_tensor.sizes()));
}
void wait(const c10::intrusive_ptr<c10d::Work>& work) { work->wait(); }

// Runs a transport step; its failures (a rank died, stopped answering, left the
// group) become torch.distributed.DistBackendError naming the collective.
template <typename F>
auto transported(const char* op, F&& step) -> decltype(step()) {
  try {
    return step();
  } catch (const c10::DistBackendError& e) {
    C10_THROW_ERROR(DistBackendError, std::string("pjrt ") + op + ": " + e.what_without_backtrace());
  } catch (const c10::Error&) {
    throw;  // a check of ours or of c10's: already says what is wrong
  } catch (const std::exception& e) {  // gloo's IoException: a peer died, or a timeout
    C10_THROW_ERROR(DistBackendError, std::string("pjrt ") + op + ": " + e.what());
  }
}

// A collective that completed before returning: its future holds the outputs
// (DDP's reducer reads them).
class DoneWork final : public c10d::Work {
 public:
  DoneWork(std::vector<at::Tensor> outputs, c10d::OpType type, const std::vector<c10::Device>& devices)
      : Work(-1, type), outputs_(std::move(outputs)) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
    future_->markCompleted(c10::IValue(outputs_));
    completed_ = true;
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// ------------------------------------------------------------------ point to point
// A message is a header (dtype and shape) on slot 2*tag, then the payload on
// slot 2*tag+1. The receiver sizes its buffer from the header: gloo aborts the
// process when a message is larger than the buffer posted for it.
constexpr int64_t kHeaderMagic = 0x706a7274;
constexpr int kHeaderDims = 8;
constexpr int kHeaderLength = 4 + kHeaderDims;

at::Tensor header_of(const at::Tensor& t) {
  at::Tensor h = at::full({kHeaderLength}, -1, at::kLong);
  int64_t* p = h.data_ptr<int64_t>();
  p[0] = kHeaderMagic;
  p[1] = static_cast<int64_t>(t.scalar_type());
  p[2] = t.numel();
  p[3] = t.dim();
  for (int64_t d = 0; d < std::min<int64_t>(t.dim(), kHeaderDims); ++d) p[4 + d] = t.size(d);
  return h;
}

void check_tag(const char* op, int tag) {
  TORCH_CHECK(tag >= 0 && tag < (1 << 29), "pjrt ", op, ": tag must be in [0, 2^29), got ", tag);
}

class SendWork final : public c10d::Work {
 public:
  SendWork(c10::intrusive_ptr<c10d::Work> header, c10::intrusive_ptr<c10d::Work> payload)
      : Work(-1, c10d::OpType::SEND), header_(std::move(header)), payload_(std::move(payload)) {}
  bool isCompleted() override { return header_->isCompleted() && payload_->isCompleted(); }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds timeout) override {
    return transported("send", [&] {
      header_->wait(timeout);
      payload_->wait(timeout);
      return true;
    });
  }

 private:
  c10::intrusive_ptr<c10d::Work> header_, payload_;
};

struct Received {
  c10::intrusive_ptr<c10d::Work> payload_work;
  at::Tensor payload;  // host
  int source = -1;
};

class RecvWork final : public c10d::Work {
 public:
  RecvWork(at::Tensor target, std::shared_future<Received> received, c10::Device device)
      : Work(-1, c10d::OpType::RECV), target_(std::move(target)), received_(std::move(received)) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       std::vector<c10::Device>{device});
  }
  bool isCompleted() override { return done_.load(); }
  bool isSuccess() const override { return true; }
  int sourceRank() const override { return source_; }
  bool wait(std::chrono::milliseconds timeout) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return true;
    const Received& r = transported("recv", [&]() -> const Received& {
      const Received& got = received_.get();  // rethrows the header's failure
      got.payload_work->wait(timeout);
      return got;
    });
    write_back(target_, r.payload);
    source_ = r.source;
    completed_ = true;
    done_ = true;
    future_->markCompleted(c10::IValue(std::vector<at::Tensor>{target_}));
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  at::Tensor target_;
  std::shared_future<Received> received_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  int source_ = -1;
  std::atomic<bool> done_{false};  // read without the lock wait() holds while it blocks
};

// The calls of one coalescing block: waits for each in order (a receive's
// second step runs on its lane, so no order of waits deadlocks).
class GroupWork final : public c10d::Work {
 public:
  explicit GroupWork(std::vector<c10::intrusive_ptr<c10d::Work>> works)
      : Work(-1, c10d::OpType::COALESCED), works_(std::move(works)) {}
  bool isCompleted() override {
    return std::all_of(works_.begin(), works_.end(), [](const auto& w) { return w->isCompleted(); });
  }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds timeout) override {
    for (const auto& w : works_) w->wait(timeout);
    return true;
  }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
};

// Runs jobs one after another on its own thread. A receive's second step
// (post the payload's receive once the header is in) runs here, so it does not
// wait for the user to call wait(): two ranks that each wait on their send
// before their receive still make progress. One lane per (source, tag) keeps
// headers and payloads in the order gloo matches them.
class Lane {
 public:
  Lane() : thread_([this] { run(); }) {}
  ~Lane() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  void push(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, nothing left
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the rest is built
};

// ------------------------------------------------------------------ host transport
class HostTransport final : public Transport {
 public:
  HostTransport(c10::intrusive_ptr<c10d::Backend> host, int rank, int size)
      : host_(std::move(host)), name_("host (" + host_->getBackendName() + ")"), rank_(rank), size_(size) {}
  ~HostTransport() override { stop_lanes(); }

  // The group is destroyed: besides the lanes, the host group goes, and with it its connections,
  // so that every peer's pending or next operation with this rank fails at once instead of
  // waiting out the group's timeout (the backend object may live on: a device mesh, a DTensor
  // or a compiled function's cache can hold the process group).
  void shutdown() override {
    stop_lanes();
    host_.reset();
  }

  std::string name() const override { return name_; }

  std::vector<std::vector<int64_t>> exchange(const std::vector<int64_t>& values) override {
    at::Tensor in = at::tensor(values, at::kLong);
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int r = 0; r < size_; ++r) outs[0].push_back(at::empty_like(in));
    std::vector<at::Tensor> ins{in};
    wait(host().allgather(outs, ins));
    std::vector<std::vector<int64_t>> result;
    for (const at::Tensor& o : outs[0]) result.emplace_back(o.data_ptr<int64_t>(), o.data_ptr<int64_t>() + o.numel());
    return result;
  }

  void all_reduce(const at::Tensor& t, RedOp op) override {
    std::vector<at::Tensor> h{to_host(t)};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp(op);
    wait(host().allreduce(h, o));
    write_back(t, h[0]);
  }

  void broadcast(const at::Tensor& t, int root) override {
    std::vector<at::Tensor> h{rank_ == root ? to_host(t) : host_like(t)};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    wait(host().broadcast(h, o));
    if (rank_ != root) write_back(t, h[0]);
  }

  void reduce(const at::Tensor& t, int root, RedOp op) override {
    std::vector<at::Tensor> h{to_host(t)};
    c10d::ReduceOptions o;
    o.rootRank = root;
    o.reduceOp = c10d::ReduceOp(op);
    wait(host().reduce(h, o));
    if (rank_ == root) write_back(t, h[0]);
  }

  void all_gather(const at::Tensor& out, const at::Tensor& in) override {
    std::vector<at::Tensor> h{to_host(in)};
    at::Tensor flat = at::empty({out.numel()}, h[0].options());
    std::vector<std::vector<at::Tensor>> outs{chunks(flat, h[0])};
    wait(host().allgather(outs, h));
    write_back(out, flat);
  }

  void gather(const at::Tensor& out, const at::Tensor& in, int root) override {
    std::vector<at::Tensor> h{to_host(in)};
    at::Tensor flat;
    std::vector<std::vector<at::Tensor>> outs;
    if (rank_ == root) {
      flat = at::empty({out.numel()}, h[0].options());
      outs.push_back(chunks(flat, h[0]));
    }
    c10d::GatherOptions o;
    o.rootRank = root;
    wait(host().gather(outs, h, o));
    if (rank_ == root) write_back(out, flat);
  }

  void scatter(const at::Tensor& out, const at::Tensor& in, int root) override {
    std::vector<at::Tensor> h{host_like(out)};
    std::vector<std::vector<at::Tensor>> ins;
    if (rank_ == root) ins.push_back(chunks(to_host(in).view(-1), h[0]));
    c10d::ScatterOptions o;
    o.rootRank = root;
    wait(host().scatter(h, ins, o));
    write_back(out, h[0]);
  }

  void reduce_scatter(const at::Tensor& out, const at::Tensor& in, RedOp op) override {
    // Through all_reduce: every gloo build has it for every dtype and op.
    std::vector<at::Tensor> h{to_host(in).view(-1)};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp(op);
    wait(host().allreduce(h, o));
    write_back(out, h[0].narrow(0, rank_ * out.numel(), out.numel()));
  }

  void all_to_all(const at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                  const std::vector<int64_t>& in_splits) override {
    at::Tensor hin = to_host(in);
    at::Tensor hout = host_like(out);
    std::vector<int64_t> os = out_splits, is = in_splits;
    wait(host().alltoall_base(hout, hin, os, is));
    write_back(out, hout);
  }

  c10::intrusive_ptr<c10d::Work> send(const at::Tensor& t, int dst, int tag) override {
    std::vector<at::Tensor> header{header_of(t)};
    std::vector<at::Tensor> payload{to_host(t)};
    auto header_work = host().send(header, dst, 2 * tag);
    auto payload_work = host().send(payload, dst, 2 * tag + 1);
    return c10::make_intrusive<SendWork>(std::move(header_work), std::move(payload_work));
  }

  c10::intrusive_ptr<c10d::Work> recv(const at::Tensor& t, int src, int tag) override {
    std::vector<at::Tensor> header{at::empty({kHeaderLength}, at::kLong)};
    auto header_work = src >= 0 ? host().recv(header, src, 2 * tag) : host().recvAnysource(header, 2 * tag);
    auto promise = std::make_shared<std::promise<Received>>();
    std::shared_future<Received> received = promise->get_future().share();
    const at::ScalarType dtype = t.scalar_type();
    const int64_t numel = t.numel();
    const std::vector<int64_t> sizes = t.sizes().vec();
    const uint64_t id = track_waiting(header_work);
    lane(src, tag).push([this, id, header_work, header = header[0], promise, src, tag, dtype, numel, sizes] {
      try {
        header_work->wait();
        untrack_waiting(id);
        const int64_t* p = header.data_ptr<int64_t>();
        const int source = src >= 0 ? src : header_work->sourceRank();
        TORCH_CHECK(p[0] == kHeaderMagic, "pjrt recv: the message from rank ", source,
                    " is not from a pjrt send (mixed send/recv across backends?)");
        const auto sent_dtype = static_cast<at::ScalarType>(p[1]);
        std::vector<int64_t> sent_sizes(p + 4, p + 4 + std::min<int64_t>(p[3], kHeaderDims));
        if (p[3] > kHeaderDims) sent_sizes = {p[2]};
        std::vector<at::Tensor> payload{at::empty(sent_sizes, at::TensorOptions().dtype(sent_dtype))};
        auto payload_work = host().recv(payload, source, 2 * tag + 1);
        if (sent_dtype != dtype || p[2] != numel) {
          payload_work->wait();  // take the message off the wire, then fail
          TORCH_CHECK(false, "pjrt recv: rank ", source, " sent ", describe(sent_dtype, sent_sizes),
                      ", this rank receives into ", describe(dtype, sizes));
        }
        promise->set_value(Received{payload_work, payload[0], source});
      } catch (...) {
        untrack_waiting(id);
        promise->set_exception(std::current_exception());
      }
    });
    return c10::make_intrusive<RecvWork>(t, std::move(received), t.device());
  }

 private:
  // `flat` as one view per rank shaped like `like`.
  std::vector<at::Tensor> chunks(const at::Tensor& flat, const at::Tensor& like) const {
    std::vector<at::Tensor> out;
    const int64_t n = like.numel();
    for (int r = 0; r < size_; ++r) out.push_back(flat.narrow(0, r * n, n).view(like.sizes()));
    return out;
  }

  c10d::Backend& host() const {
    TORCH_CHECK(host_, "pjrt process group: used after it was destroyed (destroy_process_group)");
    return *host_;
  }

  // Receives nobody will send to stop waiting; each lane finishes its jobs and stops.
  void stop_lanes() {
    std::map<std::pair<int, int>, std::unique_ptr<Lane>> lanes;
    {
      std::lock_guard<std::mutex> lock(lanes_mutex_);
      for (auto& [id, work] : waiting_) {
        try {
          work->abort();
        } catch (...) {
        }
      }
      lanes.swap(lanes_);
    }
    lanes.clear();  // joins each lane (its jobs take lanes_mutex_: not held here)
  }

  uint64_t track_waiting(const c10::intrusive_ptr<c10d::Work>& work) {
    std::lock_guard<std::mutex> lock(lanes_mutex_);
    waiting_[++next_waiting_] = work;
    return next_waiting_;
  }
  void untrack_waiting(uint64_t id) {
    std::lock_guard<std::mutex> lock(lanes_mutex_);
    waiting_.erase(id);
  }

  Lane& lane(int src, int tag) {
    std::lock_guard<std::mutex> lock(lanes_mutex_);
    auto& slot = lanes_[{src, tag}];
    if (!slot) slot = std::make_unique<Lane>();
    return *slot;
  }

  c10::intrusive_ptr<c10d::Backend> host_;
  const std::string name_;  // kept: a destroyed group still says what it was
  const int rank_, size_;
  std::mutex lanes_mutex_;
  std::map<std::pair<int, int>, std::unique_ptr<Lane>> lanes_;  // destroyed (joined) before host_
  std::map<uint64_t, c10::intrusive_ptr<c10d::Work>> waiting_;  // header receives not yet in
  uint64_t next_waiting_ = 0;
};

// ------------------------------------------------------------------ checks
void check_tensors(const char* op, const std::vector<at::Tensor>& tensors, int expected_count = -1) {
  if (expected_count >= 0) {
    TORCH_CHECK(static_cast<int>(tensors.size()) == expected_count, "pjrt ", op, ": expected ", expected_count,
                " tensor(s) per process, got ", tensors.size());
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK(t.defined(), "pjrt ", op, ": tensor ", i, " is undefined");
    TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "pjrt ", op, ": tensor ", i, " is on ",
                t.device(), "; this process group moves pjrt tensors (for CPU tensors use a group such as ",
                "'cpu:gloo,pjrt:pjrt')");
    TORCH_CHECK(t.layout() == at::kStrided, "pjrt ", op, ": tensor ", i, " has layout ", t.layout(),
                "; only dense tensors are supported");
    TORCH_CHECK(t.device() == tensors[0].device(), "pjrt ", op, ": tensors on ", tensors[0].device(), " and ",
                t.device(), " in one call");
  }
}

void check_root(const char* op, int64_t root, int size) {
  TORCH_CHECK(root >= 0 && root < size, "pjrt ", op, ": root ", root, " is not a rank of this group of ", size);
}

void check_same(const char* op, const at::Tensor& t, const at::Tensor& like, const char* what) {
  TORCH_CHECK(t.scalar_type() == like.scalar_type() && t.numel() == like.numel(), "pjrt ", op, ": ", what, " is ",
              describe(t.scalar_type(), t.sizes()), ", expected ", describe(like.scalar_type(), like.sizes()));
}

// The transport's op for `op` on `dtype` (AVG and PREMUL_SUM reduce as SUM).
RedOp base_op(const char* op_name, const c10d::ReduceOp& op, at::ScalarType dtype) {
  switch (op.op_) {
    case RedOp::SUM:
    case RedOp::PRODUCT:
    case RedOp::MIN:
    case RedOp::MAX:
      return op.op_;
    case RedOp::AVG:
    case RedOp::PREMUL_SUM:
      TORCH_CHECK(dtype != at::kBool, "pjrt ", op_name, ": ", reduce_op_name(op.op_), " of bool tensors");
      return RedOp::SUM;
    case RedOp::BAND:
    case RedOp::BOR:
    case RedOp::BXOR:
      TORCH_CHECK(at::isIntegralType(dtype, /*includeBool=*/true), "pjrt ", op_name, ": ",
                  reduce_op_name(op.op_), " needs an integer or bool tensor, not ", c10::toString(dtype));
      return op.op_;
    default:
      TORCH_CHECK(false, "pjrt ", op_name, ": unsupported reduce op ", static_cast<int>(op.op_));
  }
}

// PREMUL_SUM: the input times its factor (a new tensor); else `in` itself.
at::Tensor premultiplied(const c10d::ReduceOp& op, const at::Tensor& in) {
  if (op.op_ != RedOp::PREMUL_SUM) return in;
  auto* factor = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(factor, "pjrt: PREMUL_SUM without its factor");
  return factor->tensor_factor.defined() ? in.mul(factor->tensor_factor.to(in.device()))
                                         : in.mul(factor->double_factor);
}

// AVG: the sum divided by the group size (integers truncate, as NCCL's do).
void average(const c10d::ReduceOp& op, const at::Tensor& out, int size) {
  if (op.op_ != RedOp::AVG) return;
  if (at::isFloatingType(out.scalar_type()) || at::isComplexType(out.scalar_type())) {
    out.div_(size);
  } else {
    out.copy_(at::div(out, size, "trunc"));
  }
}

// Launches what is pending on the devices of a collective's tensors (the caller's
// device when none is a pjrt tensor), not on every device: where ranks are threads
// of one process, another rank's graph may be held by that rank while its launch
// waits, inside PJRT, for this rank's part of an earlier collective.
void flush_pending(const std::vector<at::Tensor>& tensors = {}) {
  std::vector<int> devices;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || !t.device().is_privateuseone()) continue;
    const int d = t.device().index();
    if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
  }
  if (devices.empty()) devices.push_back(device::current_device_index());
  for (int d : devices) device::flush_device(d, executor::FlushReason::Collective);
}


}  // namespace

// What every rank must agree on before a collective runs.
struct ProcessGroupPjrt::Signature {
  c10d::OpType type;
  std::vector<at::Tensor> tensors;  // described by dtype and shape
  int64_t root = -1;
  int64_t reduce_op = -1;
  bool rows_vary = false;  // all_to_all: dim 0 differs by rank
  std::vector<int64_t> in_splits, out_splits;  // all_to_all, one per rank
};

std::unique_ptr<Transport> make_host_transport(c10::intrusive_ptr<c10d::Backend> host, int rank, int size) {
  return std::make_unique<HostTransport>(std::move(host), rank, size);
}

ProcessGroupPjrt::ProcessGroupPjrt(std::unique_ptr<Transport> transport, int rank, int size, bool check,
                                   MakeSubgroup make_subgroup, std::chrono::milliseconds timeout)
    : Backend(rank, size),
      transport_(std::move(transport)),
      check_(check),
      make_subgroup_(std::move(make_subgroup)),
      timeout_(timeout) {}

c10::intrusive_ptr<c10d::Backend> ProcessGroupPjrt::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                          const std::vector<int>& ranks,
                                                          const c10::intrusive_ptr<Options>& opts) {
  TORCH_CHECK(make_subgroup_, "pjrt process group: this group cannot be split");
  const auto me = std::find(ranks.begin(), ranks.end(), getRank());
  if (me == ranks.end()) return nullptr;  // not in this split: c10d gives this rank no group
  return make_subgroup_(store, static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()),
                        opts ? opts->timeout : timeout_);
}

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupPjrt::getBackendOptions() {
  return c10::make_intrusive<Options>("pjrt", timeout_);
}

ProcessGroupPjrt::~ProcessGroupPjrt() = default;

void ProcessGroupPjrt::shutdown() { transport_->shutdown(); }

void ProcessGroupPjrt::abort() { transport_->shutdown(); }

void ProcessGroupPjrt::agree(const Signature& sig) {
  if (!check_) return;
  // [type, root, reduce op, count, dtype, ndim, dims..., shape hash, splits...]
  constexpr int kDims = 6;
  std::vector<int64_t> v = {static_cast<int64_t>(sig.type), sig.root, sig.reduce_op,
                            static_cast<int64_t>(sig.tensors.size())};
  const at::Tensor* first = sig.tensors.empty() ? nullptr : &sig.tensors[0];
  v.push_back(first ? static_cast<int64_t>(first->scalar_type()) : -1);
  v.push_back(first ? first->dim() : -1);
  for (int d = 0; d < kDims; ++d) {
    const bool has = first && d < first->dim();
    v.push_back(!has ? -1 : (d == 0 && sig.rows_vary) ? -2 : first->size(d));
  }
  uint64_t hash = 1469598103934665603ull;
  for (const at::Tensor& t : sig.tensors) {
    hash = (hash ^ static_cast<uint64_t>(t.scalar_type())) * 1099511628211ull;
    for (int64_t d = sig.rows_vary ? 1 : 0; d < t.dim(); ++d)
      hash = (hash ^ static_cast<uint64_t>(t.size(d))) * 1099511628211ull;
  }
  v.push_back(static_cast<int64_t>(hash >> 1));
  const size_t fixed = v.size();
  for (int r = 0; r < size_; ++r) v.push_back(r < static_cast<int>(sig.in_splits.size()) ? sig.in_splits[r] : -1);
  for (int r = 0; r < size_; ++r) v.push_back(r < static_cast<int>(sig.out_splits.size()) ? sig.out_splits[r] : -1);

  const char* op = op_name(sig.type);
  const auto all = transported(op, [&] { return transport_->exchange(v); });
  auto shape_of = [&](const std::vector<int64_t>& w) {
    std::vector<int64_t> dims;
    for (int d = 0; d < std::min<int64_t>(w[5], kDims); ++d) dims.push_back(w[6 + d]);
    return describe(static_cast<at::ScalarType>(w[4]), dims);
  };
  for (int r = 0; r < size_; ++r) {
    const auto& w = all[r];
    const auto& mine = all[0];
    if (w[0] != mine[0]) {
      TORCH_CHECK(false, "pjrt: ranks called different collectives: rank 0 called ",
                  op_name(static_cast<c10d::OpType>(mine[0])), ", rank ", r, " called ",
                  op_name(static_cast<c10d::OpType>(w[0])));
    }
    TORCH_CHECK(w[1] == mine[1], "pjrt ", op, ": ranks disagree on the root: rank 0 names ", mine[1], ", rank ", r,
                " names ", w[1]);
    TORCH_CHECK(w[2] == mine[2], "pjrt ", op, ": ranks disagree on the reduce op: rank 0 uses ",
                reduce_op_name(mine[2]), ", rank ", r, " uses ", reduce_op_name(w[2]));
    TORCH_CHECK(w[3] == mine[3], "pjrt ", op, ": rank 0 passes ", mine[3], " tensor(s), rank ", r, " passes ", w[3]);
    TORCH_CHECK(std::equal(w.begin() + 4, w.begin() + fixed - 1, mine.begin() + 4), "pjrt ", op,
                ": the ranks' tensors differ: rank 0 has ", shape_of(mine), ", rank ", r, " has ", shape_of(w));
    TORCH_CHECK(w[fixed - 1] == mine[fixed - 1], "pjrt ", op,
                ": the ranks' tensor lists differ in shapes or dtypes (rank 0 and rank ", r, ")");
  }
  if (!sig.in_splits.empty()) {
    for (int src = 0; src < size_; ++src) {
      for (int dst = 0; dst < size_; ++dst) {
        const int64_t sent = all[src][fixed + dst];
        const int64_t expected = all[dst][fixed + size_ + src];
        TORCH_CHECK(sent == expected, "pjrt ", op, ": rank ", src, " sends ", sent, " rows to rank ", dst,
                    ", which expects ", expected);
      }
    }
  }
}

void ProcessGroupPjrt::prepare(const std::vector<at::Tensor>& tensors) {
  if (!tensors.empty() && tensors[0].defined() && transport_->in_program(tensors[0])) return;
  flush_pending(tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::done(std::vector<at::Tensor> outputs, c10d::OpType type) {
  count_collective(transport_->name());
  std::vector<c10::Device> devices;
  if (!outputs.empty()) devices.push_back(outputs[0].device());
  return track(c10::make_intrusive<DoneWork>(std::move(outputs), type, devices));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::track(c10::intrusive_ptr<c10d::Work> work) {
  if (coalescing_) coalesced_.push_back(work);
  return work;
}

void ProcessGroupPjrt::startCoalescing() {
  // A block that raised never ended its coalescing (torch's manager has no
  // finally): start afresh.
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::endCoalescing() {
  TORCH_CHECK(coalescing_, "pjrt: endCoalescing without startCoalescing");
  coalescing_ = false;
  return c10::make_intrusive<GroupWork>(std::move(coalesced_));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  check_tensors("broadcast", tensors, 1);
  check_root("broadcast", opts.rootRank, size_);
  agree({c10d::OpType::BROADCAST, tensors, opts.rootRank});
  prepare(tensors);
  transported("broadcast", [&] { return transport_->broadcast(tensors[0], static_cast<int>(opts.rootRank)); });
  return done(tensors, c10d::OpType::BROADCAST);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  check_tensors("all_reduce", tensors, 1);
  const RedOp op = base_op("all_reduce", opts.reduceOp, tensors[0].scalar_type());
  agree({c10d::OpType::ALLREDUCE, tensors, -1, opts.reduceOp.op_});
  prepare(tensors);
  at::Tensor& t = tensors[0];
  at::Tensor x = premultiplied(opts.reduceOp, t);
  transported("all_reduce", [&] { return transport_->all_reduce(x, op); });
  if (!x.is_same(t)) t.copy_(x);
  average(opts.reduceOp, t, size_);
  return done(tensors, c10d::OpType::ALLREDUCE);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                     const c10d::AllreduceCoalescedOptions& opts) {
  check_tensors("all_reduce_coalesced", tensors);
  std::vector<RedOp> ops;
  for (const at::Tensor& t : tensors) ops.push_back(base_op("all_reduce_coalesced", opts.reduceOp, t.scalar_type()));
  agree({c10d::OpType::ALLREDUCE_COALESCED, tensors, -1, opts.reduceOp.op_});
  prepare(tensors);
  for (size_t i = 0; i < tensors.size(); ++i) {
    at::Tensor x = premultiplied(opts.reduceOp, tensors[i]);
    transported("all_reduce_coalesced", [&] { return transport_->all_reduce(x, ops[i]); });
    if (!x.is_same(tensors[i])) tensors[i].copy_(x);
    average(opts.reduceOp, tensors[i], size_);
  }
  return done(tensors, c10d::OpType::ALLREDUCE_COALESCED);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  check_tensors("reduce", tensors, 1);
  check_root("reduce", opts.rootRank, size_);
  const RedOp op = base_op("reduce", opts.reduceOp, tensors[0].scalar_type());
  agree({c10d::OpType::REDUCE, tensors, opts.rootRank, opts.reduceOp.op_});
  prepare(tensors);
  at::Tensor& t = tensors[0];
  at::Tensor x = premultiplied(opts.reduceOp, t);
  transported("reduce", [&] { return transport_->reduce(x, static_cast<int>(opts.rootRank), op); });
  if (rank_ == opts.rootRank) {
    if (!x.is_same(t)) t.copy_(x);
    average(opts.reduceOp, t, size_);
  }
  return done(tensors, c10d::OpType::REDUCE);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllgatherOptions& /*opts*/) {
  check_tensors("all_gather", inputs, 1);
  TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_, "pjrt all_gather: expected a list of ",
              size_, " output tensors");
  check_tensors("all_gather", outputs[0]);
  for (const at::Tensor& o : outputs[0]) check_same("all_gather", o, inputs[0], "an output");
  agree({c10d::OpType::ALLGATHER, inputs});
  prepare(inputs);
  const at::Tensor& in = inputs[0];
  at::Tensor flat = at::empty({size_ * in.numel()}, in.options());
  transported("all_gather", [&] { return transport_->all_gather(flat, in); });
  for (int r = 0; r < size_; ++r) write_back(outputs[0][r], flat.narrow(0, r * in.numel(), in.numel()));
  return done(outputs[0], c10d::OpType::ALLGATHER);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::AllgatherOptions& /*opts*/) {
  check_tensors("all_gather_into_tensor", {output, input});
  TORCH_CHECK(output.scalar_type() == input.scalar_type() && output.numel() == size_ * input.numel(),
              "pjrt all_gather_into_tensor: the output is ", describe(output.scalar_type(), output.sizes()),
              ", expected ", size_, " times the input ", describe(input.scalar_type(), input.sizes()));
  agree({c10d::OpType::_ALLGATHER_BASE, {input}});
  prepare({input});
  transported("all_gather_into_tensor", [&] { return transport_->all_gather(output, input); });
  return done({output}, c10d::OpType::_ALLGATHER_BASE);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                     std::vector<at::Tensor>& inputs,
                                                                     const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "pjrt all_gather_coalesced: ", outputs.size(), " output lists for ",
              inputs.size(), " inputs");
  std::vector<at::Tensor> all;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<std::vector<at::Tensor>> one{outputs[i]};
    std::vector<at::Tensor> in{inputs[i]};
    allgather(one, in, opts);
    all.insert(all.end(), outputs[i].begin(), outputs[i].end());
  }
  return done(all, c10d::OpType::ALLGATHER_COALESCED);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                 std::vector<at::Tensor>& inputs,
                                                                                 const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "pjrt all_gather_into_tensor_coalesced: ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) _allgather_base(outputs[i], inputs[i], opts);
  return done(outputs, c10d::OpType::COALESCED);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::GatherOptions& opts) {
  check_tensors("gather", inputs, 1);
  check_root("gather", opts.rootRank, size_);
  const bool is_root = rank_ == opts.rootRank;
  if (is_root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                "pjrt gather: the root needs a list of ", size_, " output tensors");
    check_tensors("gather", outputs[0]);
    for (const at::Tensor& o : outputs[0]) check_same("gather", o, inputs[0], "an output");
  } else {
    TORCH_CHECK(outputs.empty() || outputs[0].empty(), "pjrt gather: only the root passes output tensors");
  }
  agree({c10d::OpType::GATHER, inputs, opts.rootRank});
  prepare(inputs);
  const at::Tensor& in = inputs[0];
  at::Tensor flat = is_root ? at::empty({size_ * in.numel()}, in.options()) : at::Tensor();
  transported("gather", [&] { return transport_->gather(flat, in, static_cast<int>(opts.rootRank)); });
  if (!is_root) return done({}, c10d::OpType::GATHER);
  for (int r = 0; r < size_; ++r) write_back(outputs[0][r], flat.narrow(0, r * in.numel(), in.numel()));
  return done(outputs[0], c10d::OpType::GATHER);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::scatter(std::vector<at::Tensor>& outputs,
                                                         std::vector<std::vector<at::Tensor>>& inputs,
                                                         const c10d::ScatterOptions& opts) {
  check_tensors("scatter", outputs, 1);
  check_root("scatter", opts.rootRank, size_);
  const bool is_root = rank_ == opts.rootRank;
  at::Tensor flat;
  if (is_root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                "pjrt scatter: the root needs a list of ", size_, " input tensors");
    check_tensors("scatter", inputs[0]);
    for (const at::Tensor& i : inputs[0]) check_same("scatter", i, outputs[0], "an input");
  } else {
    TORCH_CHECK(inputs.empty() || inputs[0].empty(), "pjrt scatter: only the root passes input tensors");
  }
  agree({c10d::OpType::SCATTER, outputs, opts.rootRank});
  prepare(outputs);
  if (is_root) {
    std::vector<at::Tensor> flattened;
    for (const at::Tensor& i : inputs[0]) flattened.push_back(i.reshape({-1}));
    flat = at::cat(flattened);
  }
  transported("scatter", [&] { return transport_->scatter(outputs[0], flat, static_cast<int>(opts.rootRank)); });
  return done(outputs, c10d::OpType::SCATTER);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                                const c10d::ReduceScatterOptions& opts) {
  check_tensors("reduce_scatter", outputs, 1);
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, "pjrt reduce_scatter: expected a list of ",
              size_, " input tensors");
  check_tensors("reduce_scatter", inputs[0]);
  for (const at::Tensor& i : inputs[0]) check_same("reduce_scatter", i, outputs[0], "an input");
  const RedOp op = base_op("reduce_scatter", opts.reduceOp, outputs[0].scalar_type());
  agree({c10d::OpType::REDUCE_SCATTER, outputs, -1, opts.reduceOp.op_});
  prepare(outputs);
  std::vector<at::Tensor> flattened;
  for (const at::Tensor& i : inputs[0]) flattened.push_back(i.reshape({-1}));
  at::Tensor in = premultiplied(opts.reduceOp, at::cat(flattened));
  transported("reduce_scatter", [&] { return transport_->reduce_scatter(outputs[0], in, op); });
  average(opts.reduceOp, outputs[0], size_);
  return done(outputs, c10d::OpType::REDUCE_SCATTER);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                      const c10d::ReduceScatterOptions& opts) {
  check_tensors("reduce_scatter_tensor", {output, input});
  TORCH_CHECK(output.scalar_type() == input.scalar_type() && input.numel() == size_ * output.numel(),
              "pjrt reduce_scatter_tensor: the input is ", describe(input.scalar_type(), input.sizes()),
              ", expected ", size_, " times the output ", describe(output.scalar_type(), output.sizes()));
  const RedOp op = base_op("reduce_scatter_tensor", opts.reduceOp, output.scalar_type());
  agree({c10d::OpType::_REDUCE_SCATTER_BASE, {output}, -1, opts.reduceOp.op_});
  prepare({input});
  transported("reduce_scatter_tensor", [&] { return transport_->reduce_scatter(output, premultiplied(opts.reduceOp, input), op); });
  average(opts.reduceOp, output, size_);
  return done({output}, c10d::OpType::_REDUCE_SCATTER_BASE);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "pjrt reduce_scatter_tensor_coalesced: ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) _reduce_scatter_base(outputs[i], inputs[i], opts);
  return done(outputs, c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                               std::vector<int64_t>& output_splits,
                                                               std::vector<int64_t>& input_splits,
                                                               const c10d::AllToAllOptions& /*opts*/) {
  check_tensors("all_to_all_single", {output, input});
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "pjrt all_to_all_single: input ",
              c10::toString(input.scalar_type()), " and output ", c10::toString(output.scalar_type()), " differ");
  auto splits = [&](const std::vector<int64_t>& given, const at::Tensor& t, const char* what) {
    if (given.empty()) {
      TORCH_CHECK(t.dim() > 0 && t.size(0) % size_ == 0, "pjrt all_to_all_single: the ", what, " has ",
                  t.dim() > 0 ? t.size(0) : 0, " rows, not divisible by the group size ", size_);
      return std::vector<int64_t>(size_, t.size(0) / size_);
    }
    TORCH_CHECK(static_cast<int>(given.size()) == size_, "pjrt all_to_all_single: ", given.size(), " ", what,
                " split sizes for a group of ", size_);
    int64_t total = 0;
    for (int64_t s : given) {
      TORCH_CHECK(s >= 0, "pjrt all_to_all_single: negative split size ", s);
      total += s;
    }
    TORCH_CHECK(t.dim() > 0 && total == t.size(0), "pjrt all_to_all_single: the ", what, " split sizes add up to ",
                total, ", the ", what, " has ", t.dim() > 0 ? t.size(0) : 0, " rows");
    return given;
  };
  TORCH_CHECK(input.dim() > 0 && output.dim() > 0 && input.sizes().slice(1) == output.sizes().slice(1),
              "pjrt all_to_all_single: rows of the input ", describe(input.scalar_type(), input.sizes()),
              " and of the output ", describe(output.scalar_type(), output.sizes()), " differ in shape");
  Signature sig{c10d::OpType::ALLTOALL_BASE, {input}};
  sig.rows_vary = true;
  sig.in_splits = splits(input_splits, input, "input");
  sig.out_splits = splits(output_splits, output, "output");
  agree(sig);
  prepare({input});
  transported("all_to_all_single", [&] { return transport_->all_to_all(output, input, output_splits, input_splits); });
  return done({output}, c10d::OpType::ALLTOALL_BASE);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions& opts) {
  check_tensors("all_to_all", inputs, size_);
  check_tensors("all_to_all", outputs, size_);
  std::vector<at::Tensor> flat_in;
  std::vector<int64_t> in_splits, out_splits;
  int64_t out_total = 0;
  for (int r = 0; r < size_; ++r) {
    TORCH_CHECK(inputs[r].scalar_type() == inputs[0].scalar_type() &&
                    outputs[r].scalar_type() == inputs[0].scalar_type(),
                "pjrt all_to_all: all tensors must have one dtype");
    flat_in.push_back(inputs[r].reshape({-1}));
    in_splits.push_back(inputs[r].numel());
    out_splits.push_back(outputs[r].numel());
    out_total += outputs[r].numel();
  }
  at::Tensor in = at::cat(flat_in);
  at::Tensor out = at::empty({out_total}, in.options());
  alltoall_base(out, in, out_splits, in_splits, opts);
  int64_t offset = 0;
  for (int r = 0; r < size_; ++r) {
    write_back(outputs[r], out.narrow(0, offset, outputs[r].numel()));
    offset += outputs[r].numel();
  }
  return done(outputs, c10d::OpType::ALLTOALL);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  check_tensors("send", tensors, 1);
  check_tag("send", tag);
  TORCH_CHECK(dst >= 0 && dst < size_ && dst != rank_, "pjrt send: destination ", dst, " is not another rank of ",
              "this group of ", size_);
  flush_pending(tensors);
  return track(transported("send", [&] { return transport_->send(tensors[0], dst, tag); }));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  check_tensors("recv", tensors, 1);
  check_tag("recv", tag);
  TORCH_CHECK(src >= 0 && src < size_ && src != rank_, "pjrt recv: source ", src, " is not another rank of ",
              "this group of ", size_);
  flush_pending(tensors);
  return track(transported("recv", [&] { return transport_->recv(tensors[0], src, tag); }));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  check_tensors("recv", tensors, 1);
  check_tag("recv", tag);
  flush_pending(tensors);
  return track(transported("recv", [&] { return transport_->recv(tensors[0], -1, tag); }));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPjrt::barrier(const c10d::BarrierOptions& /*opts*/) {
  flush_pending();
  if (check_) {
    agree({c10d::OpType::BARRIER, {}});  // the exchange is the barrier
  } else {
    transported("barrier", [&] { return transport_->exchange({0}); });
  }
  return done({}, c10d::OpType::BARRIER);
}

namespace {
// The plugin's key-value store over the job's c10d Store (torchrun's, or the one
// init_process_group was given).
class StoreKeyValues : public runtime::KeyValueStore {
 public:
  explicit StoreKeyValues(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    try {
      store_->wait({key}, timeout);
    } catch (const c10::DistStoreError& e) {  // the wait timed out (other failures stay errors of their own)
      throw runtime::PjrtError(runtime::ErrorCode::kDeadlineExceeded,
                               "no key " + key + " after " + std::to_string(timeout.count()) + " ms: " + e.what());
    }
    return text(store_->get(key));
  }

  std::optional<std::string> try_get(const std::string& key) override {
    if (!store_->check({key})) return std::nullopt;
    return text(store_->get(key));
  }

  void put(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }

 private:
  static std::string text(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }
  c10::intrusive_ptr<c10d::Store> store_;
};
}  // namespace

void add_python_bindings(pybind11::module_& m) {
  namespace py = pybind11;
  // Blocks while the plugin joins the other processes (their calls come through the store).
  m.def(
      "_start_runtime_across_processes",
      [](const c10::intrusive_ptr<c10d::Store>& store, int64_t node_id, int64_t num_nodes) {
        TORCH_CHECK(store, "pjrt: no store to start the runtime across processes with");
        TORCH_CHECK(num_nodes >= 1 && node_id >= 0 && node_id < num_nodes, "pjrt: process ", node_id, " of ",
                    num_nodes, " is not a process of the job");
        py::gil_scoped_release no_gil;
        return device::start_runtime_across_processes(node_id, num_nodes, std::make_shared<StoreKeyValues>(store));
      },
      py::arg("store"), py::arg("node_id"), py::arg("num_nodes"));
  py::class_<ProcessGroupPjrt, c10d::Backend, c10::intrusive_ptr<ProcessGroupPjrt>>(m, "_ProcessGroupPjrt")
      // device_ids (every rank's global device id, all addressable here): the XLA
      // transport, with the host backend as its control channel; else host-staged.
      .def(py::init([](const c10::intrusive_ptr<c10d::Backend>& host, int rank, int size, bool check,
                       ProcessGroupPjrt::MakeSubgroup make_subgroup, std::chrono::milliseconds timeout,
                       std::vector<int64_t> device_ids, bool in_programs) {
             TORCH_CHECK(host, "pjrt process group: no host backend");
             auto transport = make_host_transport(host, rank, size);
             if (!device_ids.empty()) {
               transport =
                   make_xla_transport(std::move(transport), rank, size, std::move(device_ids), timeout, in_programs);
             }
             return c10::make_intrusive<ProcessGroupPjrt>(std::move(transport), rank, size, check,
                                                          std::move(make_subgroup), timeout);
           }),
           py::arg("host"), py::arg("rank"), py::arg("size"), py::arg("check") = true,
           py::arg("make_subgroup") = ProcessGroupPjrt::MakeSubgroup{},
           py::arg("timeout") = std::chrono::milliseconds(::kBackendDefaultTimeout),
           py::arg("device_ids") = std::vector<int64_t>{}, py::arg("in_programs") = false)
      .def_property_readonly("transport", [](const ProcessGroupPjrt& pg) { return pg.transport_name(); })
      // What split_group deep-copies to pass back: torch's Options cannot be copied from
      // Python, and without them c10d asks getBackendOptions() (a new object each time).
      .def_property_readonly("options", [](const ProcessGroupPjrt&) { return py::none(); });
  m.def("_transport_stats", [] {
    TransportStats stats = transport_stats();
    py::dict out;
    out["collectives"] = stats.collectives;
    out["host_bytes"] = stats.host_bytes;
    return out;
  });
  m.def("_reset_transport_stats", &reset_transport_stats);
}

}  // namespace torch_pjrt::distributed
