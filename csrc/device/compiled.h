// torch.compile's graphs on the deferred core: an FX graph run once over its
// real inputs is recorded (never run op by op) and kept as one program; later
// calls bind the inputs' buffers to it and run it, with no ATen dispatch per op.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "device/context.h"

namespace torch_pjrt::device {

// Starts recording on `device` for this thread (flushes what is pending).
void begin_capture(int device);
// Stops recording after an error; what was recorded still runs.
void abort_capture(int device);

// A layout key of a call's inputs: dtype, sizes, strides, offset, storage size,
// and which inputs share a storage, plus the int inputs of a dynamic-shape
// graph (each concrete size is its own program). A captured program is valid
// exactly for inputs of its key. 0 when the tensors are not all dense pjrt
// tensors of one device (they are not replayed as they are).
uint64_t layout_key(const std::vector<at::Tensor>& tensors, const std::vector<int64_t>& ints);

class CompiledGraph {
 public:
  // Ends the capture: runs what was recorded (these are the first call's
  // results). When the recording stayed one program whose parameters and
  // results map onto the inputs, the device generator and `constants` (tensors
  // the graph holds), returns the replayable graph; else null, `why` set.
  static std::shared_ptr<CompiledGraph> finish(int device, const std::vector<at::Tensor>& inputs,
                                               const std::vector<std::optional<at::Tensor>>& outputs,
                                               const std::vector<at::Tensor>& constants, std::string* why);

  // One call: inputs of the captured layout key. Returns the outputs (null
  // where the graph returned no tensor), or nullopt when an input storage has
  // no contents or other bytes than at capture (the caller captures again).
  // Contents of other dims or element type (produced by another op) are first
  // given the captured type by a small program.
  std::optional<std::vector<std::optional<at::Tensor>>> run(const std::vector<at::Tensor>& inputs);

  // Inputs whose storage the program writes (in-place ops on graph inputs).
  std::vector<int> mutated_inputs() const;

 private:
  enum class From { Input, Storage, Fixed, Fresh };
  struct Binding {
    From from = From::Fixed;
    int index = -1;                      // input index (Input) or fresh storage index (Fresh)
    executor::Storage* storage = nullptr;  // Storage: generator state or a constant's storage
  };
  struct Geometry {
    std::vector<int64_t> sizes, strides;
    int64_t offset = 0;
    at::ScalarType dtype = at::kFloat;
  };
  enum class OutKind { None, SameInput, InputView, FreshView, Empty };
  struct Output {
    OutKind kind = OutKind::None;
    int index = -1;  // input or fresh storage (Empty: a new storage of `nbytes`)
    Geometry geometry;
    size_t nbytes = 0;
  };

  int device_ = 0;
  std::unique_ptr<executor::Capture> capture_;
  std::vector<Binding> params_;   // per program parameter
  std::vector<Binding> results_;  // per storage output of the program
  std::vector<size_t> fresh_nbytes_;
  std::vector<Output> outputs_;
  at::Generator generator_;            // keeps the generator state alive
  std::vector<c10::Storage> constants_;  // keeps constants' storages alive (a tensor's may be swapped: set_data)
};

}  // namespace torch_pjrt::device
