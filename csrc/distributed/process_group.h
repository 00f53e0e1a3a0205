// torch.distributed on pjrt: the c10d backend "pjrt" and the transport under it.
//
// ProcessGroupPjrt is what c10d calls for pjrt tensors (dist.all_reduce, DDP,
// FSDP2, DTensor's functional collectives). It checks the call, makes every rank
// agree on what is being run (a mismatch raises on every rank instead of
// hanging or aborting in the transport), maps each collective onto a few flat
// primitives, and hands those to a Transport.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace pybind11 {
class module_;
}

namespace torch_pjrt::distributed {

// How a group's bytes move between its processes. Tensors are pjrt tensors of
// this process's device (any strides); results are written into the tensors
// given, so every view of their storage sees them. Collectives complete before
// they return (the device executes in order); point to point is asynchronous.
// Reduce ops are only SUM, PRODUCT, MIN, MAX, BAND, BOR and BXOR: the process
// group rewrites AVG and PREMUL_SUM. A plugin with its own collectives would
// implement this interface by running the collectives inside programs.
class Transport {
 public:
  using RedOp = c10d::ReduceOp::RedOpType;
  virtual ~Transport() = default;
  virtual std::string name() const = 0;
  // Every rank's `values` (all of one length), rank-major. The control channel:
  // it also synchronizes the ranks.
  virtual std::vector<std::vector<int64_t>> exchange(const std::vector<int64_t>& values) = 0;
  virtual void all_reduce(const at::Tensor& t, RedOp op) = 0;
  virtual void broadcast(const at::Tensor& t, int root) = 0;
  virtual void reduce(const at::Tensor& t, int root, RedOp op) = 0;  // the result lands on root only
  // out: every rank's `in`, rank-major (out.numel() == size * in.numel()).
  virtual void all_gather(const at::Tensor& out, const at::Tensor& in) = 0;
  // out (root only, else undefined): as all_gather's.
  virtual void gather(const at::Tensor& out, const at::Tensor& in, int root) = 0;
  // in (root only): rank r receives its r-th chunk.
  virtual void scatter(const at::Tensor& out, const at::Tensor& in, int root) = 0;
  // in: size chunks of out's numel; rank r receives the reduction of chunk r.
  virtual void reduce_scatter(const at::Tensor& out, const at::Tensor& in, RedOp op) = 0;
  // Rows (dim 0) split by the sizes given; empty sizes: equal splits.
  virtual void all_to_all(const at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                          const std::vector<int64_t>& in_splits) = 0;
  // Whether a collective on `t` goes into the program being captured on t's device
  // (torch.compile) rather than running now: then nothing pending is flushed first.
  virtual bool in_program(const at::Tensor& /*t*/) { return false; }
  // The group is destroyed (c10d's shutdown or abort), though the backend object may live
  // on (a compiled function's cache keeps it): peers must stop waiting for this rank.
  virtual void shutdown() {}
  virtual c10::intrusive_ptr<c10d::Work> send(const at::Tensor& t, int dst, int tag) = 0;
  // src < 0: from any rank (Work::sourceRank says which).
  virtual c10::intrusive_ptr<c10d::Work> recv(const at::Tensor& t, int src, int tag) = 0;
};

// Host-staged transport: device buffer -> host -> `host` (a c10d backend over
// CPU tensors, gloo) -> a new device buffer written into the tensor.
std::unique_ptr<Transport> make_host_transport(c10::intrusive_ptr<c10d::Backend> host, int rank, int size);

class ProcessGroupPjrt final : public c10d::Backend {
 public:
  // Makes the backend of a subgroup: (the subgroup's store, this rank's rank in
  // it, its size, the timeout). Given by whoever builds the transports (Python).
  using MakeSubgroup = std::function<c10::intrusive_ptr<c10d::Backend>(const c10::intrusive_ptr<c10d::Store>&, int,
                                                                       int, std::chrono::milliseconds)>;
  // check: exchange a signature of every collective first (shapes, dtypes,
  // roots, reduce ops) so that a mismatch raises on every rank.
  ProcessGroupPjrt(std::unique_ptr<Transport> transport, int rank, int size, bool check,
                   MakeSubgroup make_subgroup = {},
                   std::chrono::milliseconds timeout = ::kBackendDefaultTimeout);
  ~ProcessGroupPjrt() override;
  // destroy_process_group: this rank leaves its transport's group at once.
  void shutdown() override;
  void abort() override;

  const std::string getBackendName() const override { return "pjrt"; }
  std::string transport_name() const { return transport_->name(); }

  // c10d's split_group (what DeviceMesh uses once init_process_group was given a
  // device_id): the members of each split build its backend together.
  bool supportsSplitting() const override { return static_cast<bool>(make_subgroup_); }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  c10::intrusive_ptr<Options> getBackendOptions() override;
  void setSequenceNumberForGroup() override {}  // every collective is matched by its signature instead
  uint64_t getSequenceNumberForGroup() override { return 0; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  // _coalescing_manager(device=...): the calls in between run as they come
  // (collectives complete at once); endCoalescing's Work waits for them all.
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

 private:
  struct Signature;
  // Every rank's signature of this call must match (a no-op unless check_).
  void agree(const Signature& sig);
  // Before a collective on `tensors`: launches what is pending on their devices, unless
  // the transport records the collective into the program being captured there.
  void prepare(const std::vector<at::Tensor>& tensors);
  c10::intrusive_ptr<c10d::Work> done(std::vector<at::Tensor> outputs, c10d::OpType type);
  c10::intrusive_ptr<c10d::Work> track(c10::intrusive_ptr<c10d::Work> work);  // kept while coalescing

  std::unique_ptr<Transport> transport_;
  bool check_;
  MakeSubgroup make_subgroup_;
  std::chrono::milliseconds timeout_;
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;
};

// torch_pjrt._C._ProcessGroupPjrt(host_backend, rank, size, check).
void add_python_bindings(pybind11::module_& m);

}  // namespace torch_pjrt::distributed
