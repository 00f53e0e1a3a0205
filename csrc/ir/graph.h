// A small typed SSA graph that prints as a StableHLO module (generic MLIR
// syntax, which is stable across StableHLO versions). No torch headers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torch_pjrt::ir {

enum class DType { Pred, S8, S16, S32, S64, U8, U16, U32, U64, F16, BF16, F32, F64 };

const char* dtype_name(DType dtype);  // MLIR spelling: f32, i64, ui8, i1 ...
size_t dtype_size(DType dtype);       // bytes per element as stored by torch
bool is_floating(DType dtype);
bool is_signed_int(DType dtype);
bool is_unsigned_int(DType dtype);

struct Type {
  DType dtype = DType::F32;
  std::vector<int64_t> dims;
  int64_t numel() const;
  int64_t rank() const { return static_cast<int64_t>(dims.size()); }
  std::string str() const;  // tensor<2x3xf32>
  bool operator==(const Type& o) const { return dtype == o.dtype && dims == o.dims; }
};

// Result `index` of node `node`.
struct Value {
  int node = -1;
  int index = 0;
  bool valid() const { return node >= 0; }
};

class Graph;

struct Node {
  std::string op;  // "stablehlo.add"; "arg" for a parameter of the graph
  std::vector<Value> operands;
  std::vector<Type> results;
  std::string attrs;  // attribute dictionary body, e.g. "dimensions = array<i64: 1>"
  std::vector<std::shared_ptr<Graph>> regions;
};

class Graph {
 public:
  Value param(const Type& type);
  Value add(const std::string& op, std::vector<Value> operands, const Type& result,
            std::string attrs = "", std::vector<std::shared_ptr<Graph>> regions = {});
  std::vector<Value> add_multi(const std::string& op, std::vector<Value> operands,
                               std::vector<Type> results, std::string attrs = "",
                               std::vector<std::shared_ptr<Graph>> regions = {});
  void set_outputs(std::vector<Value> outputs) { outputs_ = std::move(outputs); }
  void add_output(Value v) { outputs_.push_back(v); }

  const Type& type(Value v) const;
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int>& params() const { return params_; }
  const std::vector<Value>& outputs() const { return outputs_; }
  size_t num_params() const { return params_.size(); }

  // The whole module: func.func @main(params) -> outputs.
  std::string to_mlir() const;
  // Structural hash (FNV-1a over the module text).
  uint64_t hash() const;

 private:
  friend class Printer;
  std::vector<Node> nodes_;
  std::vector<int> params_;
  std::vector<Value> outputs_;
};

uint64_t fnv1a(const std::string& text);

}  // namespace torch_pjrt::ir
