// A small typed SSA graph that prints as a StableHLO module (generic MLIR
// syntax, which is stable across StableHLO versions). No torch headers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pjrt_c_api.h"

namespace torch_pjrt::ir {

enum class DType {
  Pred, S8, S16, S32, S64, U8, U16, U32, U64, F16, BF16, F32, F64, C64, C128,
  F8E4M3FN, F8E5M2, F8E4M3FNUZ, F8E5M2FNUZ,  // float8: stored and converted; arithmetic in f32
  F8E8M0FNU,  // a power of two (MX scales): stored and converted only
};

const char* dtype_name(DType dtype);  // MLIR spelling: f32, i64, ui8, i1 ...
size_t dtype_size(DType dtype);       // bytes per element as stored by torch
PJRT_Buffer_Type pjrt_type(DType dtype);
DType from_pjrt_type(PJRT_Buffer_Type type);  // std::invalid_argument for a type with no DType
bool is_floating(DType dtype);  // real floating types only (float8 included)
bool is_float8(DType dtype);
// Floating types computed in f32 and rounded once, as torch's kernels do (f16, bf16, float8).
bool is_reduced_float(DType dtype);
bool is_complex(DType dtype);
// The real type of a complex type's components (f32 for c64); other types map to themselves.
DType component_type(DType dtype);
DType complex_of(DType real);  // c64 for f32 (and narrower), c128 for f64
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

// A 128-bit structural key, mixed incrementally as a graph is built, so a
// program can be looked up in the compile cache without printing it.
struct Key {
  uint64_t a = 0x9E3779B97F4A7C15ULL;
  uint64_t b = 0xC2B2AE3D27D4EB4FULL;
  void mix(uint64_t v) {
    a = (a ^ v) * 0xFF51AFD7ED558CCDULL;
    a ^= a >> 32;
    b = (b + v + 0x632BE59BD9B4E019ULL) * 0xC4CEB9FE1A85EC53ULL;
    b ^= b >> 29;
  }
  void mix(const Key& k) {
    mix(k.a);
    mix(k.b);
  }
  void mix_bytes(const char* p, size_t n);
  void mix(const std::string& s) { mix_bytes(s.data(), s.size()); }
  bool operator==(const Key& o) const { return a == o.a && b == o.b; }
};
struct KeyHash {
  size_t operator()(const Key& k) const { return static_cast<size_t>(k.a ^ (k.b >> 7)); }
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
  // Attribute of parameter i in @main's signature, e.g. "tf.aliasing_output = 0 : i32".
  void set_param_attr(size_t i, std::string attr);
  // A program of `n` replicas (one per device of a group, each running it on its own
  // device): its collectives' replica groups count them. 0: an ordinary program.
  void set_replicas(int n) { replicas_ = n; }
  int replicas() const { return replicas_; }

  // Appends `other`'s nodes; other's parameter k becomes `param_values[k]` (a
  // value of this graph). Returns, for each node of `other`, the node it became
  // (params: -1). Other's regions are shared, not copied. The key absorbs
  // other's key and `mapping_key` (how its parameters were bound).
  std::vector<int> splice(const Graph& other, const std::vector<Value>& param_values, const Key& mapping_key);
  // Takes `other` whole (this graph must be empty); the key absorbs it like splice.
  void adopt(Graph&& other, const Key& mapping_key);
  bool empty() const { return nodes_.empty(); }
  void reserve(size_t nodes) { nodes_.reserve(nodes); }
  void clear();

  const Type& type(Value v) const;
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int>& params() const { return params_; }
  const std::vector<Value>& outputs() const { return outputs_; }
  size_t num_params() const { return params_.size(); }

  // The whole module: func.func @main(params) -> outputs.
  std::string to_mlir() const;
  // Structural key of nodes and outputs (parameter attributes not included).
  Key key() const;
  uint64_t hash() const { return key().a; }

 private:
  friend class Printer;
  std::vector<Node> nodes_;
  std::vector<int> params_;
  std::vector<Value> outputs_;
  std::vector<std::string> param_attrs_;
  int replicas_ = 0;
  Key key_;  // nodes so far (outputs are mixed in by key())
  void mix_type(const Type& t);
};

uint64_t fnv1a(const std::string& text);

}  // namespace torch_pjrt::ir
