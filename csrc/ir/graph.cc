#include "ir/graph.h"
#include "ir/functions.h"

#include <cstring>
#include <iterator>
#include <string>
#include <sstream>
#include <stdexcept>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace torch_pjrt::ir {

namespace {
// The one dtype table: a row per DType, in its enum order, with its MLIR spelling, its
// bytes per element (as torch stores it) and its PJRT buffer type.
struct DTypeRow {
  DType dtype;
  const char* mlir;
  size_t bytes;
  PJRT_Buffer_Type pjrt;
};
constexpr DTypeRow kDTypes[] = {
    {DType::Pred, "i1", 1, PJRT_Buffer_Type_PRED},
    {DType::S8, "i8", 1, PJRT_Buffer_Type_S8},
    {DType::S16, "i16", 2, PJRT_Buffer_Type_S16},
    {DType::S32, "i32", 4, PJRT_Buffer_Type_S32},
    {DType::S64, "i64", 8, PJRT_Buffer_Type_S64},
    {DType::U8, "ui8", 1, PJRT_Buffer_Type_U8},
    {DType::U16, "ui16", 2, PJRT_Buffer_Type_U16},
    {DType::U32, "ui32", 4, PJRT_Buffer_Type_U32},
    {DType::U64, "ui64", 8, PJRT_Buffer_Type_U64},
    {DType::F16, "f16", 2, PJRT_Buffer_Type_F16},
    {DType::BF16, "bf16", 2, PJRT_Buffer_Type_BF16},
    {DType::F32, "f32", 4, PJRT_Buffer_Type_F32},
    {DType::F64, "f64", 8, PJRT_Buffer_Type_F64},
    {DType::C64, "complex<f32>", 8, PJRT_Buffer_Type_C64},
    {DType::C128, "complex<f64>", 16, PJRT_Buffer_Type_C128},
    {DType::F8E4M3FN, "f8E4M3FN", 1, PJRT_Buffer_Type_F8E4M3FN},
    {DType::F8E5M2, "f8E5M2", 1, PJRT_Buffer_Type_F8E5M2},
    {DType::F8E4M3FNUZ, "f8E4M3FNUZ", 1, PJRT_Buffer_Type_F8E4M3FNUZ},
    {DType::F8E5M2FNUZ, "f8E5M2FNUZ", 1, PJRT_Buffer_Type_F8E5M2FNUZ},
    {DType::F8E8M0FNU, "f8E8M0FNU", 1, PJRT_Buffer_Type_F8E8M0FNU},
};
constexpr bool in_enum_order() {
  for (size_t i = 0; i < std::size(kDTypes); ++i) {
    if (static_cast<size_t>(kDTypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(in_enum_order(), "kDTypes must list the DTypes in their enum order");
const DTypeRow& row(DType d) { return kDTypes[static_cast<size_t>(d)]; }
}  // namespace

const char* dtype_name(DType d) { return row(d).mlir; }
size_t dtype_size(DType d) { return row(d).bytes; }
PJRT_Buffer_Type pjrt_type(DType d) { return row(d).pjrt; }
DType from_pjrt_type(PJRT_Buffer_Type t) {
  for (const DTypeRow& r : kDTypes) {
    if (r.pjrt == t) return r.dtype;
  }
  throw std::invalid_argument("unsupported PJRT element type " + std::to_string(static_cast<int>(t)));
}

bool is_floating(DType d) {
  return d == DType::F16 || d == DType::BF16 || d == DType::F32 || d == DType::F64 || is_float8(d);
}
bool is_float8(DType d) {
  return d == DType::F8E4M3FN || d == DType::F8E5M2 || d == DType::F8E4M3FNUZ || d == DType::F8E5M2FNUZ ||
         d == DType::F8E8M0FNU;
}
bool is_reduced_float(DType d) { return d == DType::F16 || d == DType::BF16 || is_float8(d); }
bool is_complex(DType d) { return d == DType::C64 || d == DType::C128; }
DType component_type(DType d) {
  if (d == DType::C64) return DType::F32;
  if (d == DType::C128) return DType::F64;
  return d;
}
DType complex_of(DType real) { return real == DType::F64 || real == DType::C128 ? DType::C128 : DType::C64; }
bool is_signed_int(DType d) {
  return d == DType::S8 || d == DType::S16 || d == DType::S32 || d == DType::S64;
}
bool is_unsigned_int(DType d) {
  return d == DType::U8 || d == DType::U16 || d == DType::U32 || d == DType::U64;
}

int64_t Type::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::string Type::str() const {
  std::string s = "tensor<";
  for (int64_t d : dims) s += std::to_string(d) + "x";
  s += dtype_name(dtype);
  s += ">";
  return s;
}

void Key::mix_bytes(const char* p, size_t n) {
  uint64_t word = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::memcpy(&word, p + i, 8);
    mix(word);
  }
  word = n;
  for (size_t k = 0; i < n; ++i, ++k) word ^= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * k);
  mix(word);
}

void Graph::mix_type(const Type& t) {
  key_.mix((static_cast<uint64_t>(t.dtype) << 8) | t.dims.size());
  for (int64_t d : t.dims) key_.mix(static_cast<uint64_t>(d));
}

Key Graph::key() const {
  Key k = key_;
  if (replicas_) k.mix(0x5E91CA00ULL + static_cast<uint64_t>(replicas_));
  k.mix(0xA5A5A5A5ULL + outputs_.size());
  for (const Value& v : outputs_) k.mix((static_cast<uint64_t>(v.node) << 16) ^ static_cast<uint64_t>(v.index));
  return k;
}

void Graph::set_param_attr(size_t i, std::string attr) {
  if (param_attrs_.size() < params_.size()) param_attrs_.resize(params_.size());
  param_attrs_.at(i) = std::move(attr);
}

void Graph::clear() {
  nodes_.clear();
  params_.clear();
  outputs_.clear();
  param_attrs_.clear();
  replicas_ = 0;
  key_ = Key();
}

std::vector<int> Graph::splice(const Graph& other, const std::vector<Value>& param_values, const Key& mapping_key) {
  if (param_values.size() != other.params_.size()) throw std::logic_error("ir: splice: parameter count mismatch");
  std::vector<Value> base(other.nodes_.size());
  std::vector<int> node_map(other.nodes_.size(), -1);
  for (size_t k = 0; k < other.params_.size(); ++k) base[other.params_[k]] = param_values[k];
  for (size_t id = 0; id < other.nodes_.size(); ++id) {
    const Node& n = other.nodes_[id];
    if (n.op == "arg") continue;
    Node copy;
    copy.op = n.op;
    copy.operands.reserve(n.operands.size());
    for (const Value& v : n.operands) {
      if (other.nodes_[v.node].op == "arg") {
        copy.operands.push_back(base[v.node]);
      } else {
        copy.operands.push_back(Value{node_map[v.node], v.index});
      }
    }
    copy.results = n.results;
    copy.attrs = n.attrs;
    copy.regions = n.regions;
    nodes_.push_back(std::move(copy));
    node_map[id] = static_cast<int>(nodes_.size()) - 1;
  }
  key_.mix(other.key_);
  key_.mix(mapping_key);
  return node_map;
}

void Graph::adopt(Graph&& other, const Key& mapping_key) {
  if (!empty()) throw std::logic_error("ir: adopt into a non-empty graph");
  Key k;
  k.mix(other.key_);
  k.mix(mapping_key);
  *this = std::move(other);
  key_ = k;
}

Value Graph::param(const Type& type) {
  mix_type(type);
  key_.mix(0x5041ULL);
  Node n;
  n.op = "arg";
  n.results = {type};
  nodes_.push_back(std::move(n));
  params_.push_back(static_cast<int>(nodes_.size()) - 1);
  return Value{static_cast<int>(nodes_.size()) - 1, 0};
}

Value Graph::add(const std::string& op, std::vector<Value> operands, const Type& result,
                 std::string attrs, std::vector<std::shared_ptr<Graph>> regions) {
  return add_multi(op, std::move(operands), {result}, std::move(attrs), std::move(regions))[0];
}

std::vector<Value> Graph::add_multi(const std::string& op, std::vector<Value> operands,
                                    std::vector<Type> results, std::string attrs,
                                    std::vector<std::shared_ptr<Graph>> regions) {
  for (const Value& v : operands) {
    if (v.node < 0 || v.node >= static_cast<int>(nodes_.size())) {
      throw std::logic_error("ir: operand of " + op + " is not a value of this graph");
    }
  }
  key_.mix(op);
  key_.mix(operands.size());
  for (const Value& v : operands) key_.mix((static_cast<uint64_t>(v.node) << 16) ^ static_cast<uint64_t>(v.index));
  key_.mix(results.size());
  for (const Type& t : results) mix_type(t);
  key_.mix(attrs);
  for (const auto& r : regions) key_.mix(r->key());
  Node n;
  n.op = op;
  n.operands = std::move(operands);
  n.results = std::move(results);
  n.attrs = std::move(attrs);
  n.regions = std::move(regions);
  nodes_.push_back(std::move(n));
  int id = static_cast<int>(nodes_.size()) - 1;
  std::vector<Value> out;
  for (size_t i = 0; i < nodes_.back().results.size(); ++i) out.push_back({id, static_cast<int>(i)});
  return out;
}

const Type& Graph::type(Value v) const {
  if (v.node < 0 || v.node >= static_cast<int>(nodes_.size()) ||
      v.index >= static_cast<int>(nodes_[v.node].results.size())) {
    throw std::logic_error("ir: invalid value");
  }
  return nodes_[v.node].results[v.index];
}

namespace {
std::mutex& functions_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<std::string, std::string>& functions() {
  static std::unordered_map<std::string, std::string> f;
  return f;
}
}  // namespace

void define_function(const std::string& name, const std::string& text) {
  std::lock_guard<std::mutex> lock(functions_mutex());
  auto [it, inserted] = functions().emplace(name, text);
  if (!inserted && it->second != text) {
    throw std::invalid_argument("ir: function @" + name + " is already defined with another body");
  }
}

bool function_defined(const std::string& name) {
  std::lock_guard<std::mutex> lock(functions_mutex());
  return functions().count(name) > 0;
}

std::string function_definitions(const std::vector<std::string>& callees) {
  std::lock_guard<std::mutex> lock(functions_mutex());
  std::string out;
  std::unordered_set<std::string> seen;
  for (const std::string& name : callees) {
    if (!seen.insert(name).second) continue;
    auto it = functions().find(name);
    if (it == functions().end()) throw std::invalid_argument("ir: call of undefined function @" + name);
    out += it->second;
    out += "\n";
  }
  return out;
}

// Prints graphs with names unique across nested regions (MLIR forbids shadowing).
class Printer {
 public:
  std::string module(const Graph& g) {
    std::ostringstream os;
    os << "module ";
    if (g.replicas_) os << "attributes {mhlo.num_replicas = " << g.replicas_ << " : i32, mhlo.num_partitions = 1 : i32} ";
    os << "{\n  func.func public @main(";
    std::vector<std::string> names(g.nodes_.size());
    for (size_t i = 0; i < g.params_.size(); ++i) {
      int id = g.params_[i];
      names[id] = "%arg" + std::to_string(i);
      os << (i ? ", " : "") << names[id] << ": " << g.nodes_[id].results[0].str();
      if (i < g.param_attrs_.size() && !g.param_attrs_[i].empty()) os << " {" << g.param_attrs_[i] << "}";
    }
    os << ") -> (";
    for (size_t i = 0; i < g.outputs_.size(); ++i) os << (i ? ", " : "") << g.type(g.outputs_[i]).str();
    os << ") {\n";
    body(g, names, os, "    ");
    os << "    \"func.return\"(" << refs(g, names, g.outputs_) << ") : (" << types(g, g.outputs_)
       << ") -> ()\n  }\n";
    if (!callees_.empty()) os << function_definitions(callees_);
    os << "}\n";
    return os.str();
  }

 private:
  int counter_ = 0;
  std::vector<std::string> callees_;  // of the func.call nodes printed, in order

  // "callee = @name" -> "name".
  static std::string callee(const std::string& attrs) {
    auto at = attrs.find('@');
    auto end = attrs.find_first_of(" ,}", at);
    return attrs.substr(at + 1, end == std::string::npos ? std::string::npos : end - at - 1);
  }
  static std::string ref(const Graph& g, const std::vector<std::string>& names, Value v) {
    if (g.nodes_[v.node].results.size() == 1) return names[v.node];
    return names[v.node] + "#" + std::to_string(v.index);
  }
  static std::string refs(const Graph& g, const std::vector<std::string>& names,
                          const std::vector<Value>& vs) {
    std::string s;
    for (size_t i = 0; i < vs.size(); ++i) s += (i ? ", " : "") + ref(g, names, vs[i]);
    return s;
  }
  static std::string types(const Graph& g, const std::vector<Value>& vs) {
    std::string s;
    for (size_t i = 0; i < vs.size(); ++i) s += (i ? ", " : "") + g.type(vs[i]).str();
    return s;
  }

  void body(const Graph& g, std::vector<std::string>& names, std::ostringstream& os,
            const std::string& indent) {
    for (size_t id = 0; id < g.nodes_.size(); ++id) {
      const Node& n = g.nodes_[id];
      if (n.op == "arg") continue;
      if (n.op == "func.call") callees_.push_back(callee(n.attrs));
      names[id] = "%v" + std::to_string(counter_++);
      os << indent << names[id];
      if (n.results.size() > 1) os << ":" << n.results.size();
      os << " = \"" << n.op << "\"(" << refs(g, names, n.operands) << ")";
      if (!n.regions.empty()) {
        os << " (";
        for (size_t r = 0; r < n.regions.size(); ++r) {
          os << (r ? ", " : "") << "{\n";
          region(*n.regions[r], os, indent + "  ");
          os << indent << "}";
        }
        os << ")";
      }
      if (!n.attrs.empty()) os << " {" << n.attrs << "}";
      os << " : (" << types(g, n.operands) << ") -> ";
      if (n.results.size() == 1) {
        os << n.results[0].str();
      } else {
        os << "(";
        for (size_t i = 0; i < n.results.size(); ++i) os << (i ? ", " : "") << n.results[i].str();
        os << ")";
      }
      os << "\n";
    }
  }

  void region(const Graph& g, std::ostringstream& os, const std::string& indent) {
    std::vector<std::string> names(g.nodes_.size());
    os << indent << "^bb0(";
    for (size_t i = 0; i < g.params_.size(); ++i) {
      int id = g.params_[i];
      names[id] = "%b" + std::to_string(counter_++);
      os << (i ? ", " : "") << names[id] << ": " << g.nodes_[id].results[0].str();
    }
    os << "):\n";
    body(g, names, os, indent + "  ");
    os << indent << "  \"stablehlo.return\"(" << refs(g, names, g.outputs_) << ") : ("
       << types(g, g.outputs_) << ") -> ()\n";
  }
};

std::string Graph::to_mlir() const { return Printer().module(*this); }

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}


}  // namespace torch_pjrt::ir
