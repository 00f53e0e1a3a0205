// Collectives over a group of devices in StableHLO: as a program of their own (one
// per signature: kind, dtype, sizes, reduction, group size), or as ops inside a
// larger program (a captured torch.compile graph). Either program is compiled with
// one replica per device of the group (runtime::Client::compile with replica
// devices) and launched by every member on its own device. Torch-free: the
// distributed layer maps c10d's collectives onto these.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "ir/builder.h"
#include "ir/graph.h"

namespace torch_pjrt::lowering {

enum class CollectiveKind {
  AllReduce,      // every member gets the reduction of all inputs
  AllGather,      // every member gets every input, member-major
  ReduceScatter,  // input: `replicas` chunks; member r gets the reduction of chunk r
  AllToAll,       // input: `replicas` chunks; member r gets every member's chunk r, member-major
};

enum class Reduction { Sum, Product, Min, Max, BitAnd, BitOr, BitXor };

struct CollectiveSpec {
  CollectiveKind kind = CollectiveKind::AllReduce;
  ir::DType dtype = ir::DType::F32;
  std::vector<int64_t> input_dims;  // the input buffer's dims as it is on the device
  int replicas = 1;                 // the group's size
  Reduction reduction = Reduction::Sum;
  // >= 0: the result is only this member's chunk of what the collective gives
  // (broadcast is an all-gather keeping the root's chunk; scatter an all-to-all).
  int keep_chunk = -1;
};

// Appends the collective to b's graph (whose replicas are the group's members): `input`
// is this member's part (spec.input_dims, spec.dtype), read flat; returns the flat
// result of collective_output_elements(spec) elements. Throws std::invalid_argument
// for a reduction the dtype has no meaning for (bitwise ops on floats, min/max on
// complex) or chunks that do not split evenly.
ir::Value collective(ir::Builder& b, ir::Value input, const CollectiveSpec& spec);

// The collective as a program of its own (MLIR text, @main: the input as it is on
// the device, one flat output), spec.replicas replicas.
std::string collective_module(const CollectiveSpec& spec);

// Elements of the program's output.
int64_t collective_output_elements(const CollectiveSpec& spec);

}  // namespace torch_pjrt::lowering
