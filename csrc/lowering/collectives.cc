#include "lowering/collectives.h"

#include <sstream>

namespace torch_pjrt::lowering {
namespace {

int64_t elements(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::string tensor_type(int64_t n, ir::DType dtype) {
  return "tensor<" + std::to_string(n) + "x" + ir::dtype_name(dtype) + ">";
}

std::string dims_type(const std::vector<int64_t>& dims, ir::DType dtype) {
  std::string s = "tensor<";
  for (int64_t d : dims) s += std::to_string(d) + "x";
  return s + ir::dtype_name(dtype) + ">";
}

// The StableHLO op combining two scalars of `dtype` for `reduction`.
const char* combiner(Reduction reduction, ir::DType dtype) {
  const bool boolean = dtype == ir::DType::Pred;
  const bool integral = boolean || ir::is_signed_int(dtype) || ir::is_unsigned_int(dtype);
  const bool complex = ir::is_complex(dtype);
  switch (reduction) {
    case Reduction::Sum: return boolean ? "stablehlo.or" : "stablehlo.add";
    case Reduction::Product: return boolean ? "stablehlo.and" : "stablehlo.multiply";
    case Reduction::Min:
      if (complex) break;
      return boolean ? "stablehlo.and" : "stablehlo.minimum";
    case Reduction::Max:
      if (complex) break;
      return boolean ? "stablehlo.or" : "stablehlo.maximum";
    case Reduction::BitAnd: if (integral) return "stablehlo.and"; break;
    case Reduction::BitOr: if (integral) return "stablehlo.or"; break;
    case Reduction::BitXor: if (integral) return "stablehlo.xor"; break;
  }
  throw std::invalid_argument(std::string("collective: this reduction has no meaning for ") + ir::dtype_name(dtype));
}

std::string replica_groups(int replicas) {
  std::string s = "dense<[[";
  for (int r = 0; r < replicas; ++r) s += (r ? ", " : "") + std::to_string(r);
  return s + "]]> : tensor<1x" + std::to_string(replicas) + "xi64>";
}

// XLA's CPU all-reduce takes sums, products, minima and maxima only: the bitwise
// reductions (and every reduction of booleans) gather the members' inputs and
// reduce them locally, exact in any order.
bool reduced_locally(const CollectiveSpec& spec) {
  return spec.dtype == ir::DType::Pred || spec.reduction == Reduction::BitAnd || spec.reduction == Reduction::BitOr ||
         spec.reduction == Reduction::BitXor;
}

// The identity of a local reduction, as a scalar constant's value.
std::string identity(const CollectiveSpec& spec) {
  const char* op = combiner(spec.reduction, spec.dtype);
  const bool all_ones = std::string(op) == "stablehlo.and";
  if (spec.dtype == ir::DType::Pred) return all_ones ? "true" : "false";
  if (!all_ones) return "0";
  if (ir::is_unsigned_int(spec.dtype)) {
    const int bits = static_cast<int>(ir::dtype_size(spec.dtype) * 8);
    return std::to_string(bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1);
  }
  return "-1";
}

std::string region(const CollectiveSpec& spec) {
  const std::string scalar = std::string("tensor<") + ir::dtype_name(spec.dtype) + ">";
  return std::string("({\n    ^bb0(%a: ") + scalar + ", %b: " + scalar + "):\n      %r = " +
         combiner(spec.reduction, spec.dtype) + " %a, %b : " + scalar + "\n      stablehlo.return %r : " + scalar +
         "\n    })";
}

// %c: the reduction of every member's %flat (n elements), gathered and reduced here.
std::string local_reduction(const CollectiveSpec& spec, int64_t n, const std::string& groups) {
  const std::string scalar = std::string("tensor<") + ir::dtype_name(spec.dtype) + ">";
  const std::string rows = "tensor<" + std::to_string(spec.replicas) + "x" + std::to_string(n) + "x" +
                           ir::dtype_name(spec.dtype) + ">";
  std::ostringstream s;
  s << "    %all = \"stablehlo.all_gather\"(%flat) {all_gather_dim = 0 : i64, replica_groups = " << groups
    << "} : (" << tensor_type(n, spec.dtype) << ") -> " << tensor_type(n * spec.replicas, spec.dtype) << "\n"
    << "    %rows = \"stablehlo.reshape\"(%all) : (" << tensor_type(n * spec.replicas, spec.dtype) << ") -> " << rows
    << "\n"
    << "    %init = stablehlo.constant dense<" << identity(spec) << "> : " << scalar << "\n"
    << "    %c = \"stablehlo.reduce\"(%rows, %init) " << region(spec) << " {dimensions = array<i64: 0>} : (" << rows
    << ", " << scalar << ") -> " << tensor_type(n, spec.dtype) << "\n";
  return s.str();
}

}  // namespace

int64_t collective_output_elements(const CollectiveSpec& spec) {
  const int64_t n = elements(spec.input_dims);
  int64_t out = n;
  if (spec.kind == CollectiveKind::AllGather) out = n * spec.replicas;
  if (spec.kind == CollectiveKind::ReduceScatter) out = n / spec.replicas;
  return spec.keep_chunk >= 0 ? out / spec.replicas : out;
}

std::string collective_module(const CollectiveSpec& spec) {
  if (spec.replicas < 1) throw std::invalid_argument("collective: a group has at least one member");
  const int64_t n = elements(spec.input_dims);
  const bool chunked = spec.kind == CollectiveKind::ReduceScatter || spec.kind == CollectiveKind::AllToAll;
  if (chunked && n % spec.replicas != 0) {
    throw std::invalid_argument("collective: " + std::to_string(n) + " elements do not split into " +
                                std::to_string(spec.replicas) + " equal chunks");
  }
  if (spec.keep_chunk >= spec.replicas) throw std::invalid_argument("collective: no such member's chunk");
  const std::string flat = tensor_type(n, spec.dtype);
  const std::string groups = replica_groups(spec.replicas);
  std::ostringstream body;
  body << "    %flat = \"stablehlo.reshape\"(%arg0) : (" << dims_type(spec.input_dims, spec.dtype) << ") -> " << flat
       << "\n";
  int64_t produced = n;
  std::string result_name = "%c";
  switch (spec.kind) {
    case CollectiveKind::AllReduce:
      if (reduced_locally(spec)) {
        body << local_reduction(spec, n, groups);
        break;
      }
      body << "    %c = \"stablehlo.all_reduce\"(%flat) " << region(spec) << " {replica_groups = " << groups
           << "} : (" << flat << ") -> " << flat << "\n";
      break;
    case CollectiveKind::AllGather:
      produced = n * spec.replicas;
      body << "    %c = \"stablehlo.all_gather\"(%flat) {all_gather_dim = 0 : i64, replica_groups = " << groups
           << "} : (" << flat << ") -> " << tensor_type(produced, spec.dtype) << "\n";
      break;
    case CollectiveKind::ReduceScatter:
      produced = n / spec.replicas;
      if (reduced_locally(spec)) {  // the whole reduction, then this member's chunk
        body << local_reduction(spec, n, groups);
        body << "    %member = \"stablehlo.replica_id\"() : () -> tensor<ui32>\n"
             << "    %member64 = \"stablehlo.convert\"(%member) : (tensor<ui32>) -> tensor<i64>\n"
             << "    %chunk = stablehlo.constant dense<" << produced << "> : tensor<i64>\n"
             << "    %start = \"stablehlo.multiply\"(%member64, %chunk) : (tensor<i64>, tensor<i64>) -> tensor<i64>\n"
             << "    %mine = \"stablehlo.dynamic_slice\"(%c, %start) {slice_sizes = array<i64: " << produced
             << ">} : (" << flat << ", tensor<i64>) -> " << tensor_type(produced, spec.dtype) << "\n";
        result_name = "%mine";
        break;
      }
      body << "    %c = \"stablehlo.reduce_scatter\"(%flat) " << region(spec)
           << " {scatter_dimension = 0 : i64, replica_groups = " << groups << "} : (" << flat << ") -> "
           << tensor_type(produced, spec.dtype) << "\n";
      break;
    case CollectiveKind::AllToAll:
      body << "    %c = \"stablehlo.all_to_all\"(%flat) {split_dimension = 0 : i64, concat_dimension = 0 : i64, "
           << "split_count = " << spec.replicas << " : i64, replica_groups = " << groups << "} : (" << flat
           << ") -> " << flat << "\n";
      break;
  }
  std::string result = result_name;
  int64_t out = produced;
  if (spec.keep_chunk >= 0) {
    out = produced / spec.replicas;
    const int64_t start = out * spec.keep_chunk;
    body << "    %kept = \"stablehlo.slice\"(" << result << ") {start_indices = array<i64: " << start
         << ">, limit_indices = array<i64: " << start + out << ">, strides = array<i64: 1>} : ("
         << tensor_type(produced, spec.dtype) << ") -> " << tensor_type(out, spec.dtype) << "\n";
    result = "%kept";
  }
  std::ostringstream module;
  module << "module @collective attributes {mhlo.num_replicas = " << spec.replicas
         << " : i32, mhlo.num_partitions = 1 : i32} {\n"
         << "  func.func public @main(%arg0: " << dims_type(spec.input_dims, spec.dtype) << ") -> "
         << tensor_type(out, spec.dtype) << " {\n"
         << body.str() << "    return " << result << " : " << tensor_type(out, spec.dtype) << "\n  }\n}\n";
  return module.str();
}

}  // namespace torch_pjrt::lowering
