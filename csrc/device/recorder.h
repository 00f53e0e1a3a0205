// The recorder: OpBuilder turns one ATen call into a program fragment that the
// device graph runs at once (strict, debug) or as part of one program (fused).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/SmallVector.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "device/context.h"
#include "executor/deferred.h"
#include "ir/builder.h"
#include "lowering/views.h"

namespace torch_pjrt::device {

// A fresh result's layout: a memory format, or explicit dense strides (those TensorIterator
// gives a pointwise result over permuted inputs), which win when set.
struct Layout {
  Layout(at::MemoryFormat f = at::MemoryFormat::Contiguous) : format(f) {}  // NOLINT: implicit on purpose
  at::MemoryFormat format;
  std::vector<int64_t> strides;
};

// Records one ATen op: reads through views, fresh results, writes back into
// storages, deferred asserts; run() hands the fragment to the device graph,
// which runs it at once (strict, debug) or later as part of one program (fused).
class OpBuilder {
 public:
  explicit OpBuilder(std::string op_name);
  ir::Builder& b() { return builder_; }
  ir::Graph& graph() { return frag_.graph; }
  const std::string& name() const { return op_; }
  void set_device(int device) { device_ = device; }

  // Reads a tensor (through its view, with its lazy conj/neg bits applied) as
  // an IR value of its sizes and dtype.
  // CPU tensors (wrapped Python scalars, 0-d CPU tensors) are uploaded.
  ir::Value input(const at::Tensor& t);
  // A runtime scalar (not baked into the program: no recompiles per value).
  ir::Value scalar(const at::Scalar& s, at::ScalarType dtype);
  // Reads/advances the generator's state.
  ir::Value rng_state(const at::Generator& gen);
  void set_rng_state(ir::Value new_state);

  // Declares a fresh result, contiguous, channels-last or with the layout's strides (v is in
  // logical order either way).
  at::Tensor output(ir::Value v, at::ScalarType dtype, const Layout& layout = {});
  // Writes v into dst (through dst's view and its lazy bits); converts to dst's dtype.
  // allow_overlap: dst may have elements sharing memory (only for writes of one value, fill_).
  void write(const at::Tensor& dst, ir::Value v, bool allow_overlap = false);
  // Replaces a storage's whole contents with `flat` (any dtype/length).
  void replace_contents(StorageState* st, ir::Value flat);
  // Marks an out-of-range condition (i1 scalar): checked at the next sync point,
  // and writes of this op are suppressed when it holds (a select over each written storage).
  void check_flag(ir::Value flag, const std::string& message);
  // The same for an op that already leaves what it writes unchanged when the flag holds (its
  // scatter writes back the values it would overwrite): no pass over the written storages, so
  // a small update of a large tensor (a KV cache) costs the update, and can run in place.
  void check_flag_guarded_by_op(ir::Value flag, const std::string& message);

  // The layout PyTorch's CPU kernels give a fresh result of `rank` dims: that of
  // the first input of rank 4 or 5 whose layout is unambiguous (channels-last
  // or contiguous), when the ranks match; else contiguous.
  at::MemoryFormat suggested_layout(int64_t rank) const {
    return rank == layout_rank_ ? layout_ : at::MemoryFormat::Contiguous;
  }
  // A pointwise result's layout, as ATen's TensorIterator lays it out from the op's device
  // inputs: their common dense strides, or their dims' order (a transposed input gives a
  // transposed result, as torch.compile's fake tensors expect).
  Layout pointwise_layout(int64_t rank) const;

  // The op is a collective among the devices of a group (global ids, in replica order):
  // the program it lands in runs as one replica per device (only while capturing).
  void set_collective(const std::vector<int64_t>& devices) {
    frag_.replica_devices = devices;
    ++frag_.collectives;
  }

  // Records the op; in strict and debug modes it also runs.
  void run();

  // Whether the op reads t's storage (an in-place or out= target that is also an input).
  bool reads(const at::Tensor& t) const;

 private:
  struct StorageSlot {
    executor::Storage* state;
    ir::Value param;  // the contents as read (invalid: never written, read as zeros)
    ir::Value flat;   // current contents, flat, in its current dtype
    bool written = false;
  };
  StorageSlot& slot(executor::Storage* s, ir::DType read_dtype, int64_t empty_elements);
  ir::Value param(std::shared_ptr<runtime::Buffer> buffer, const ir::Type& type);
  ir::Value input_raw(const at::Tensor& t);  // the stored values, lazy conj/neg bits not applied
  ir::Value offset_param(int64_t offset);
  ir::Value scalar_param(ir::DType dtype, const void* bytes);
  ir::Value storage_flat(const at::Tensor& t, StorageSlot** slot_out);
  // How views' offsets enter this op's program (lowering/views.h).
  lowering::ViewOffsets view_offsets(int64_t offset);
  int device_for(const at::Tensor& t);
  // Debug mode: u8[] of kProducedNaN / kProducedInf bits for the op's results
  // (invalid when nothing floating is produced).
  ir::Value nonfinite_code();

  std::string op_;
  c10::SmallVector<at::Tensor, 4> operands_;  // device tensors read with input()
  int64_t layout_rank_ = -1;
  at::MemoryFormat layout_ = at::MemoryFormat::Contiguous;
  executor::Fragment frag_;
  ir::Builder builder_;
  int device_ = -1;
  // Inline capacity: most ops touch a few storages; no heap allocation for them.
  c10::SmallVector<StorageSlot, 4> slots_;
  c10::SmallVector<at::Tensor, 4> keep_;  // tensors read or written: their storages outlive the recording
  c10::SmallVector<std::pair<at::Tensor, ir::Value>, 2> outputs_;
  struct Flag {
    ir::Value holds;  // i1[]: the error condition
    std::string message;
    bool guarded_by_op;  // the op keeps its writes unchanged itself: no select over written storages
  };
  std::vector<Flag> flags_;
  struct PendingScalar {
    size_t param;  // index in the fragment's params
    ir::DType dtype;
    uint64_t bits;
  };
  c10::SmallVector<PendingScalar, 4> scalars_;
  at::Generator gen_;
};

}  // namespace torch_pjrt::device
