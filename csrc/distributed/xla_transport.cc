#include "distributed/xla_transport.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>

#include "device/context.h"
#include "device/recorder.h"
#include "executor/launch_barrier.h"
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

// How metrics and errors name a collective program.
const char* op_name(lowering::CollectiveKind kind) {
  static const char* const kNames[] = {"c10d::all_reduce", "c10d::all_gather", "c10d::reduce_scatter",
                                       "c10d::all_to_all"};
  return kNames[static_cast<int>(kind)];
}

// Point to point between the ranks of this process: a send copies its tensor to the
// receiver's device (device to device) and posts it at once, as a buffered send. A receive
// is matched when it is posted, in posting order as gloo matches them: to the first message
// waiting for it from its source (any source: from anyone), else to the next that arrives.
class Mailbox {
 public:
  static Mailbox& get() {
    static Mailbox* mailbox = new Mailbox();  // leaked: holds device tensors past static teardown
    return *mailbox;
  }
  struct Letter {
    int source = -1;
    int destination = -1;
    int tag = 0;
    at::Tensor payload;  // on the destination's device (on the host where the plugin cannot copy)
  };
  // A posted receive: `letter` is set once a message is matched to it.
  struct Slot {
    int source = -1;  // -1: any
    int destination = -1;
    int tag = 0;
    std::optional<Letter> letter;
    bool matches(const Letter& l) const {
      return l.destination == destination && l.tag == tag && (source < 0 || l.source == source);
    }
  };

  void post(const std::string& group, Letter letter) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Group& g = groups_[group];
      auto it = std::find_if(g.receives.begin(), g.receives.end(), [&](const auto& r) { return r->matches(letter); });
      if (it == g.receives.end()) {
        g.letters.push_back(std::move(letter));
        return;
      }
      (*it)->letter = std::move(letter);
      g.receives.erase(it);
    }
    arrived_.notify_all();
  }
  std::shared_ptr<Slot> expect(const std::string& group, int source, int destination, int tag) {
    auto slot = std::make_shared<Slot>();
    slot->source = source;
    slot->destination = destination;
    slot->tag = tag;
    std::lock_guard<std::mutex> lock(mutex_);
    Group& g = groups_[group];
    auto it = std::find_if(g.letters.begin(), g.letters.end(), [&](const Letter& l) { return slot->matches(l); });
    if (it != g.letters.end()) {
      slot->letter = std::move(*it);
      g.letters.erase(it);
    } else {
      g.receives.push_back(slot);
    }
    return slot;
  }
  bool arrived(const Slot& slot) {
    std::lock_guard<std::mutex> lock(mutex_);
    return slot.letter.has_value();
  }
  // The slot's message, waiting up to `wait` for it; fails at once when its source (for any
  // source: every other rank) has left the group, or the whole group is gone.
  Letter wait(const std::string& group, int group_size, Slot& slot, std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto deadline = std::chrono::steady_clock::now() + std::min(wait, std::chrono::milliseconds(int64_t{1} << 40));
    for (;;) {
      if (slot.letter) {
        Letter letter = std::move(*slot.letter);
        slot.letter.reset();
        return letter;
      }
      auto g = groups_.find(group);
      const std::string from = slot.source >= 0 ? "rank " + std::to_string(slot.source) : "any rank";
      const bool gone = g == groups_.end() ||
                        (slot.source >= 0 ? g->second.left.count(slot.source) > 0
                                          : static_cast<int>(g->second.left.size() - g->second.left.count(slot.destination)) >=
                                                group_size - 1);
      if (gone) {
        unpost(group, slot);
        C10_THROW_ERROR(DistBackendError, "pjrt recv: " + (slot.source >= 0 ? "rank " + std::to_string(slot.source) + " has"
                                                                            : std::string("every other rank has")) +
                                              " left the group (destroyed its process group, or raised) without sending tag " +
                                              std::to_string(slot.tag) + " to rank " + std::to_string(slot.destination));
      }
      if (arrived_.wait_until(lock, deadline) == std::cv_status::timeout && !slot.letter) {
        unpost(group, slot);
        C10_THROW_ERROR(DistBackendError, "pjrt recv: rank " + std::to_string(slot.destination) + " waited " +
                                              std::to_string(wait.count() / 1000) + " s for tag " +
                                              std::to_string(slot.tag) + " from " + from + " (the group's timeout)");
      }
    }
  }
  // A member's process group is gone: receives waiting on it fail; the group's
  // messages are dropped once every member is gone.
  void leave(const std::string& group, int rank, int group_size) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Group& g = groups_[group];
      g.left.insert(rank);
      if (static_cast<int>(g.left.size()) == group_size) groups_.erase(group);
    }
    arrived_.notify_all();
  }

 private:
  struct Group {
    std::deque<Letter> letters;                 // sent, not yet matched
    std::deque<std::shared_ptr<Slot>> receives;  // posted, not yet matched
    std::set<int> left;
  };
  // A receive that gave up no longer takes messages (mutex_ held).
  void unpost(const std::string& group, const Slot& slot) {
    auto g = groups_.find(group);
    if (g == groups_.end()) return;
    auto& receives = g->second.receives;
    receives.erase(std::remove_if(receives.begin(), receives.end(), [&](const auto& r) { return r.get() == &slot; }),
                   receives.end());
  }
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<std::string, Group> groups_;
};

std::string describe_tensor(at::ScalarType dtype, c10::IntArrayRef sizes) {
  std::ostringstream s;
  s << c10::toString(dtype) << sizes;
  return s.str();
}

// A receive: its message is matched when it is posted; wait() (or isCompleted() once the
// message is there) writes it into the tensor given.
class MailboxRecvWork final : public c10d::Work {
 public:
  MailboxRecvWork(at::Tensor target, std::string group, int group_size, std::shared_ptr<Mailbox::Slot> slot,
                  std::chrono::milliseconds timeout)
      : Work(-1, c10d::OpType::RECV), target_(std::move(target)), group_(std::move(group)), group_size_(group_size),
        slot_(std::move(slot)), timeout_(timeout.count() > 0 ? timeout : std::chrono::minutes(30)) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       std::vector<c10::Device>{target_.device()});
  }
  bool isCompleted() override {
    if (done_) return true;
    {
      std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);  // not while another thread waits on it
      if (!lock.owns_lock() || completed_ || !Mailbox::get().arrived(*slot_)) return done_;
      deliver(Mailbox::get().wait(group_, group_size_, *slot_, timeout_));  // (there: returns at once)
    }
    publish();
    return true;
  }
  bool isSuccess() const override { return true; }
  int sourceRank() const override { return source_; }
  bool wait(std::chrono::milliseconds timeout) override {
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!completed_) deliver(Mailbox::get().wait(group_, group_size_, *slot_, timeout.count() > 0 ? timeout : timeout_));
    } catch (...) {
      future_->setErrorIfNeeded(std::current_exception());
      throw;
    }
    publish();
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  void deliver(const Mailbox::Letter& letter) {  // mutex_ held
    const at::Tensor& sent = letter.payload;
    TORCH_CHECK(sent.scalar_type() == target_.scalar_type() && sent.numel() == target_.numel(), "pjrt recv: rank ",
                letter.source, " sent ", describe_tensor(sent.scalar_type(), sent.sizes()),
                ", this rank receives into ", describe_tensor(target_.scalar_type(), target_.sizes()));
    if (sent.is_cpu()) count_host_bytes(static_cast<int64_t>(sent.nbytes()));
    target_.copy_(sent.view(target_.sizes()));
    source_ = letter.source;
    completed_ = true;
    done_ = true;
  }
  void publish() {  // outside mutex_: the future's callbacks may call back into this work
    if (!published_.exchange(true)) future_->markCompleted(c10::IValue(std::vector<at::Tensor>{target_}));
  }
  at::Tensor target_;
  std::string group_;
  int group_size_;
  std::shared_ptr<Mailbox::Slot> slot_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  int source_ = -1;
  std::atomic<bool> done_{false};
  std::atomic<bool> published_{false};
};

// A send: posted before it returns.
class PostedWork final : public c10d::Work {
 public:
  explicit PostedWork(at::Tensor sent) : Work(-1, c10d::OpType::SEND) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       std::vector<c10::Device>{sent.device()});
    future_->markCompleted(c10::IValue(std::vector<at::Tensor>{std::move(sent)}));
    completed_ = true;
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// The groups made so far over the same devices, as seen by the member on `own_device`:
// members make their groups in the same order, so the n-th group over the same
// devices is the same group for each of them.
std::string group_identity(const std::vector<int64_t>& device_ids, int64_t own_device) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, int64_t>, int> made;
  std::string devices;
  for (int64_t d : device_ids) devices += std::to_string(d) + ",";
  std::lock_guard<std::mutex> lock(mutex);
  return devices + "#" + std::to_string(made[{devices, own_device}]++);
}

class XlaTransport final : public Transport {
 public:
  XlaTransport(std::unique_ptr<Transport> control, int rank, int size, std::vector<int64_t> device_ids,
               std::chrono::milliseconds timeout, bool in_programs)
      : control_(std::move(control)), rank_(rank), size_(size), device_ids_(std::move(device_ids)),
        timeout_(timeout), in_programs_(in_programs) {
    TORCH_CHECK(static_cast<int>(device_ids_.size()) == size_, "pjrt: the XLA transport needs one device per rank");
    uint64_t h = 1469598103934665603ull;
    for (int64_t d : device_ids_) h = (h ^ static_cast<uint64_t>(d + 1)) * 1099511628211ull;
    group_hash_ = static_cast<int>(h & 0x3fff) << 16;
    group_ = group_identity(device_ids_, device_ids_[rank_]);
    const int count = device::rt().device_count();
    for (int64_t id : device_ids_) {
      int local = -1;
      for (int i = 0; i < count && local < 0; ++i) {
        if (device::rt().device(i).id() == id) local = i;
      }
      TORCH_CHECK(local >= 0, "pjrt: the XLA transport's device ", id, " is not one of this process's");
      local_index_.push_back(local);
    }
    executor::LaunchBarrier::get().join(device_ids_[rank_]);
  }
  ~XlaTransport() override { shutdown(); }

  void shutdown() override {
    if (left_.exchange(true)) return;
    Mailbox::get().leave(group_, rank_, size_);
    executor::LaunchBarrier::get().leave(device_ids_[rank_]);  // compiled programs' peers stop waiting for it
    control_->shutdown();  // peers waiting in an agreement or exchange with this rank fail at once
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
    // The ranks agree first on the longest chunk any of them sends and whether every rank's
    // chunks are all of one size (then one equal all-to-all of the tensors as they are);
    // else every chunk is padded to the longest, one equal all-to-all, the padding dropped.
    // (Decided together: ranks taking different paths would wait on each other for ever.)
    auto splits_or_equal = [&](const std::vector<int64_t>& given, const at::Tensor& t) {
      return given.empty() ? std::vector<int64_t>(size_, t.size(0) / size_) : given;
    };
    const std::vector<int64_t> sends = splits_or_equal(in_splits, in), receives = splits_or_equal(out_splits, out);
    int64_t longest = 0;
    for (int64_t s : sends) longest = std::max(longest, s);
    for (int64_t s : receives) longest = std::max(longest, s);
    auto all_equal = [&](const std::vector<int64_t>& v) {
      return std::all_of(v.begin(), v.end(), [&](int64_t s) { return s == longest; });
    };
    const int64_t uniform = all_equal(sends) && all_equal(receives) ? 1 : 0;
    bool everyone_uniform = true;
    int64_t agreed = -1;
    for (const auto& theirs : control_->exchange({longest, uniform})) {
      everyone_uniform = everyone_uniform && theirs.at(1) == 1 && (agreed < 0 || theirs.at(0) == agreed);
      agreed = std::max(agreed, theirs.at(0));
    }
    longest = agreed;
    if (everyone_uniform) {
      if (in.numel() > 0) write(out, run({CollectiveKind::AllToAll}, in));
      return;
    }
    if (longest == 0) return;
    const int64_t row = c10::multiply_integers(in.sizes().slice(1));
    const at::Tensor rows = in.reshape({in.size(0), row});
    std::vector<at::Tensor> padded;
    int64_t offset = 0;
    for (int64_t s : sends) {
      padded.push_back(at::constant_pad_nd(rows.narrow(0, offset, s), {0, 0, 0, longest - s}));
      offset += s;
    }
    const at::Tensor got = run({CollectiveKind::AllToAll}, at::cat(padded).reshape({-1})).view({size_, longest, row});
    std::vector<at::Tensor> kept;
    for (int r = 0; r < size_; ++r) kept.push_back(got[r].narrow(0, 0, receives[r]));
    out.copy_(at::cat(kept).view(out.sizes()));
  }
  // With in_programs: while torch.compile captures a graph on this rank's device, the group's
  // collectives become ops of that program (one replica per member; no program of their own, no
  // flush): what FSDP2's and DTensor's functional collectives need to stay in one step.
  bool in_program(const at::Tensor& t) override {
    return in_programs_ && device::capturing() && t.defined() && t.device().is_privateuseone() && t.numel() > 0 &&
           device::graph_of(t.device().index()).can_record_collective(device_ids_);
  }
  c10::intrusive_ptr<c10d::Work> send(const at::Tensor& t, int dst, int tag) override {
    at::Tensor payload = device::to_device(t, local_index_.at(dst), "send");
    if (!payload.defined()) {  // the plugin has no device-to-device copy: through the host
      payload = t.to(at::kCPU).contiguous();
      count_host_bytes(static_cast<int64_t>(payload.nbytes()));
    }
    Mailbox::get().post(group_, {rank_, dst, tag, payload});
    return c10::make_intrusive<PostedWork>(t);
  }
  c10::intrusive_ptr<c10d::Work> recv(const at::Tensor& t, int src, int tag) override {
    return c10::make_intrusive<MailboxRecvWork>(t, group_, size_, Mailbox::get().expect(group_, src, rank_, tag),
                                                timeout_);
  }

 private:
  // Runs `spec` on `input` (this rank's part; every rank launches its own);
  // the result as a new flat pjrt tensor.
  at::Tensor run(CollectiveSpec spec, const at::Tensor& input) {
    TORCH_CHECK(input.device().is_privateuseone(), "pjrt: the XLA transport takes pjrt tensors, got one on ",
                input.device());
    if (in_program(input)) return record(spec, input);
    at::Tensor dense;
    std::shared_ptr<runtime::Buffer> buffer = device::dense_buffer(input, dense);
    if (!buffer) buffer = device::dense_buffer(at::zeros_like(input, at::MemoryFormat::Contiguous), dense);  // never written
    TORCH_CHECK(buffer, "pjrt: the XLA transport could not take the contents of a ", input.scalar_type(), " tensor");
    spec.dtype = device::to_ir(input.scalar_type());
    spec.input_dims = buffer->dims();
    spec.replicas = size_;
    std::string module;
    try {
      module = lowering::collective_module(spec);
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK(false, "pjrt: ", e.what());
    }
    // The runtime's cache: threads asking for a program another is compiling share its
    // executable (the replicas of one executable join), and the disk tier keeps it.
    ir::Key key;
    key.mix(0xC011EC7ULL);  // a collective program's text, not a graph's structure
    key.mix(module);
    auto exe = device::rt().get_executable(key, [&] { return module; },
                                           [&] { return std::string(op_name(spec.kind)); },
                                           device_ids_);
    const int index = static_cast<int>(input.device().index());
    const int launch = group_hash_ | static_cast<int>(++launches_ & 0xffff);
    auto outputs = exe->execute(device::rt().device(index), {buffer->raw()}, nullptr, nullptr, launch);
    const int64_t n = lowering::collective_output_elements(spec);
    at::Tensor result = at::empty({n}, input.options());
    device::assign(device::state_of(result), std::shared_ptr<runtime::Buffer>(std::move(outputs.at(0))), {n},
                   spec.dtype);
    return result;
  }

  // `spec` on `input` as ops of the program being captured; the result is pending there.
  at::Tensor record(CollectiveSpec spec, const at::Tensor& input) {
    device::OpBuilder op(op_name(spec.kind));
    op.set_device(static_cast<int>(input.device().index()));
    ir::Value value = op.input(input);
    spec.dtype = device::to_ir(input.scalar_type());
    spec.input_dims = input.sizes().vec();
    spec.replicas = size_;
    ir::Value result;
    try {
      result = lowering::collective(op.b(), value, spec);
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK(false, "pjrt: ", e.what());
    }
    at::Tensor out = op.output(result, input.scalar_type());
    op.set_collective(device_ids_);
    op.run();
    return out;
  }

  static void write(const at::Tensor& target, const at::Tensor& flat) {
    target.copy_(flat.view(target.sizes()));
  }

  std::unique_ptr<Transport> control_;
  int rank_;
  int size_;
  std::vector<int64_t> device_ids_;
  std::vector<int> local_index_;  // each member's device as this process numbers them
  std::chrono::milliseconds timeout_;
  bool in_programs_;
  std::atomic<bool> left_{false};  // shut down: this rank is out of the group's mailbox and launch barrier
  std::string group_;  // the mailbox's name for this group
  int group_hash_ = 0;
  uint64_t launches_ = 0;
};

}  // namespace

std::unique_ptr<Transport> make_xla_transport(std::unique_ptr<Transport> control, int rank, int size,
                                              std::vector<int64_t> device_ids, std::chrono::milliseconds timeout,
                                              bool in_programs) {
  return std::make_unique<XlaTransport>(std::move(control), rank, size, std::move(device_ids), timeout, in_programs);
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
