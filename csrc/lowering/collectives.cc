#include "lowering/collectives.h"

#include <memory>

namespace torch_pjrt::lowering {
namespace {

int64_t elements(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
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

// Every replica of the program in one group, in order.
std::string replica_groups(int replicas) {
  std::string s = "replica_groups = dense<[[";
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

// The (a, b) -> a op b region of a reducing collective.
std::shared_ptr<ir::Graph> combiner_region(const CollectiveSpec& spec) {
  auto region = std::make_shared<ir::Graph>();
  const ir::Type scalar{spec.dtype, {}};
  ir::Value a = region->param(scalar), b = region->param(scalar);
  region->set_outputs({region->add(combiner(spec.reduction, spec.dtype), {a, b}, scalar)});
  return region;
}

// The reduction of every member's `flat` (n elements), gathered and reduced here.
ir::Value local_reduction(ir::Builder& b, ir::Value flat, const CollectiveSpec& spec) {
  const int64_t n = b.type(flat).numel();
  combiner(spec.reduction, spec.dtype);  // throws before anything is added for a meaningless reduction
  ir::Value all = b.graph().add("stablehlo.all_gather", {flat}, ir::Type{spec.dtype, {n * spec.replicas}},
                                "all_gather_dim = 0 : i64, " + replica_groups(spec.replicas));
  ir::Value rows = b.reshape(all, {spec.replicas, n});
  auto region = combiner_region(spec);
  const bool all_ones = std::string(combiner(spec.reduction, spec.dtype)) == "stablehlo.and";
  const int bits = static_cast<int>(ir::dtype_size(spec.dtype) * 8);
  // The identity of `and`: every bit set (true for i1; an unsigned type's largest value).
  const int64_t ones = ir::is_unsigned_int(spec.dtype) && bits < 64 ? (int64_t{1} << bits) - 1 : -1;
  ir::Value init = b.constant_int(spec.dtype, all_ones ? ones : 0);
  return b.graph().add("stablehlo.reduce", {rows, init}, ir::Type{spec.dtype, {n}}, "dimensions = array<i64: 0>",
                       {region});
}

}  // namespace

int64_t collective_output_elements(const CollectiveSpec& spec) {
  const int64_t n = elements(spec.input_dims);
  int64_t out = n;
  if (spec.kind == CollectiveKind::AllGather) out = n * spec.replicas;
  if (spec.kind == CollectiveKind::ReduceScatter) out = n / spec.replicas;
  return spec.keep_chunk >= 0 ? out / spec.replicas : out;
}

ir::Value collective(ir::Builder& b, ir::Value input, const CollectiveSpec& spec) {
  if (spec.replicas < 1) throw std::invalid_argument("collective: a group has at least one member");
  const int64_t n = elements(spec.input_dims);
  const bool chunked = spec.kind == CollectiveKind::ReduceScatter || spec.kind == CollectiveKind::AllToAll;
  if (chunked && n % spec.replicas != 0) {
    throw std::invalid_argument("collective: " + std::to_string(n) + " elements do not split into " +
                                std::to_string(spec.replicas) + " equal chunks");
  }
  if (spec.keep_chunk >= spec.replicas) throw std::invalid_argument("collective: no such member's chunk");
  if (b.type(input).numel() != n || b.dtype(input) != spec.dtype) {
    throw std::invalid_argument("collective: the input is " + b.type(input).str() + ", the spec's " +
                                ir::Type{spec.dtype, spec.input_dims}.str());
  }
  ir::Graph& g = b.graph();
  const ir::Value flat = b.reshape(input, {n});
  const std::string groups = replica_groups(spec.replicas);
  ir::Value result;
  switch (spec.kind) {
    case CollectiveKind::AllReduce:
      result = reduced_locally(spec) ? local_reduction(b, flat, spec)
                                     : g.add("stablehlo.all_reduce", {flat}, ir::Type{spec.dtype, {n}}, groups,
                                             {combiner_region(spec)});
      break;
    case CollectiveKind::AllGather:
      result = g.add("stablehlo.all_gather", {flat}, ir::Type{spec.dtype, {n * spec.replicas}},
                     "all_gather_dim = 0 : i64, " + groups);
      break;
    case CollectiveKind::ReduceScatter: {
      const int64_t chunk = n / spec.replicas;
      if (reduced_locally(spec)) {  // the whole reduction, then this member's chunk
        ir::Value whole = local_reduction(b, flat, spec);
        ir::Value member = b.convert(g.add("stablehlo.replica_id", {}, ir::Type{ir::DType::U32, {}}), ir::DType::S64);
        ir::Value start = b.binary("multiply", member, b.constant_int(ir::DType::S64, chunk));
        result = b.dynamic_slice(whole, {start}, {chunk});
        break;
      }
      result = g.add("stablehlo.reduce_scatter", {flat}, ir::Type{spec.dtype, {chunk}},
                     "scatter_dimension = 0 : i64, " + groups, {combiner_region(spec)});
      break;
    }
    case CollectiveKind::AllToAll:
      result = g.add("stablehlo.all_to_all", {flat}, ir::Type{spec.dtype, {n}},
                     "split_dimension = 0 : i64, concat_dimension = 0 : i64, split_count = " +
                         std::to_string(spec.replicas) + " : i64, " + groups);
      break;
  }
  if (spec.keep_chunk >= 0) {
    const int64_t out = b.type(result).numel() / spec.replicas;
    result = b.slice_dim(result, 0, out * spec.keep_chunk, out * (spec.keep_chunk + 1));
  }
  return result;
}

std::string collective_module(const CollectiveSpec& spec) {
  ir::Graph g;
  ir::Builder b(g);
  ir::Value input = g.param(ir::Type{spec.dtype, spec.input_dims});
  g.set_outputs({collective(b, input, spec)});
  g.set_replicas(spec.replicas);
  return g.to_mlir();
}

}  // namespace torch_pjrt::lowering
