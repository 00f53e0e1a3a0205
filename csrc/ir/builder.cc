#include "ir/builder.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace torch_pjrt::ir {

std::string i64_array(const std::vector<int64_t>& v) {
  if (v.empty()) return "array<i64>";
  std::string s = "array<i64: ";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + ">";
}

std::string int_list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::vector<int64_t> broadcast_shapes(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  size_t n = std::max(a.size(), b.size());
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) {
      throw std::invalid_argument("shapes cannot be broadcast together");
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {
std::string float_literal(DType dtype, double value) {
  std::ostringstream os;
  os << "0x" << std::hex << std::uppercase;
  if (dtype == DType::F64) {
    uint64_t bits;
    std::memcpy(&bits, &value, 8);
    os.width(16);
    os.fill('0');
    os << bits;
  } else {
    float f = static_cast<float>(value);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    os.width(8);
    os.fill('0');
    os << bits;
  }
  return os.str();
}
}  // namespace

Value Builder::constant(DType dtype, double value, const std::vector<int64_t>& dims) {
  if (is_complex(dtype)) {
    // value + 0i: a real constant widened (XLA folds the convert).
    return g_.add("stablehlo.convert", {constant(component_type(dtype), value, dims)}, Type{dtype, dims});
  }
  if (!is_floating(dtype)) {
    if (dtype == DType::Pred) return constant_int(dtype, value != 0.0, dims);
    return constant_int(dtype, static_cast<int64_t>(value), dims);
  }
  if (is_reduced_float(dtype)) {
    // Build in f32 and convert: XLA folds it and rounds as torch does (RNE).
    return convert(constant(DType::F32, value, dims), dtype);
  }
  Type t{dtype, dims};
  return g_.add("stablehlo.constant", {}, t,
                "value = dense<" + float_literal(dtype, value) + "> : " + t.str());
}

Value Builder::constant_array(DType dtype, const std::vector<double>& values, const std::vector<int64_t>& dims) {
  // A hex blob of the raw little-endian elements: exact, and compact for large tables.
  std::ostringstream os;
  os << "0x" << std::hex << std::uppercase;
  auto put = [&os](const void* p, size_t n) {
    const auto* bytes = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) {
      os.width(2);
      os.fill('0');
      os << static_cast<unsigned>(bytes[i]);
    }
  };
  for (double v : values) {
    if (dtype == DType::F32) {
      float f = static_cast<float>(v);
      put(&f, 4);
    } else if (dtype == DType::F64) {
      put(&v, 8);
    } else if (dtype == DType::S64) {
      int64_t i = static_cast<int64_t>(v);
      put(&i, 8);
    } else {
      throw std::invalid_argument("constant_array: unsupported dtype");
    }
  }
  Type t{dtype, dims};
  return g_.add("stablehlo.constant", {}, t, "value = dense<\"" + os.str() + "\"> : " + t.str());
}

Value Builder::constant_int(DType dtype, int64_t value, const std::vector<int64_t>& dims) {
  if (is_floating(dtype)) return constant(dtype, static_cast<double>(value), dims);
  Type t{dtype, dims};
  std::string lit;
  if (dtype == DType::Pred) {
    lit = value ? "true" : "false";
  } else if (dtype == DType::U64) {
    lit = std::to_string(static_cast<uint64_t>(value));
  } else {
    lit = std::to_string(value);
  }
  return g_.add("stablehlo.constant", {}, t, "value = dense<" + lit + "> : " + t.str());
}

Value Builder::iota(DType dtype, const std::vector<int64_t>& dims, int64_t dim) {
  return g_.add("stablehlo.iota", {}, Type{dtype, dims}, "iota_dimension = " + std::to_string(dim) + " : i64");
}

Value Builder::convert(Value v, DType dtype) {
  if (this->dtype(v) == dtype) return v;
  if (this->dtype(v) == DType::F8E8M0FNU) {
    // As torch widens e8m0fnu: 2^(e - 127) through float32, e = 0 being 2^-127 (a float32
    // subnormal) and 255 NaN (torch's bits, 0x7f800001).
    const std::vector<int64_t> shape = dims(v);
    // Every value is non-zero (NaN too): true (a compare of 2^-127 with zero would see a
    // subnormal XLA's CPU code flushes).
    if (dtype == DType::Pred) return constant_int(DType::Pred, 1, shape);
    Value e = convert(g_.add("stablehlo.bitcast_convert", {v}, Type{DType::U8, shape}), DType::U32);
    auto is = [&](int64_t value) { return compare(e, constant_int(DType::U32, value, shape), "EQ"); };
    Value bits = select(is(0), constant_int(DType::U32, 0x00400000, shape),
                        select(is(255), constant_int(DType::U32, 0x7F800001, shape),
                               binary("shift_left", e, constant_int(DType::U32, 23, shape))));
    return convert(g_.add("stablehlo.bitcast_convert", {bits}, Type{DType::F32, shape}), dtype);
  }
  if (is_complex(this->dtype(v)) && !is_complex(dtype)) {
    // torch's complex -> real cast keeps the real part (XLA has no such convert).
    if (dtype == DType::Pred) {
      Value zero = scalar_like(v, 0);
      return compare(v, zero, "NE");
    }
    return convert(real(v), dtype);
  }
  if (dtype == DType::Pred) {
    // Non-zero is true, as in torch (a plain convert would do the same, but be explicit).
    return compare(v, scalar_like(v, 0), "NE");
  }
  if (is_floating(this->dtype(v)) && (is_signed_int(dtype) || is_unsigned_int(dtype))) {
    // As torch's CPU casts a float to an integer on x86 (XLA would saturate): truncated through
    // a 32-bit integer (64-bit for 64-bit and uint32 targets), where a value out of that range
    // or NaN becomes its most negative value, then narrowed modulo 2^n (-2.0 -> uint8 254,
    // float max -> int32 INT32_MIN, -> int8 0).
    const bool wide = dtype == DType::S64 || dtype == DType::U64 || dtype == DType::U32;
    const DType via = wide ? DType::S64 : DType::S32;
    const double limit = wide ? 9223372036854775808.0 : 2147483648.0;  // exact in every float type used
    Value x = is_reduced_float(this->dtype(v)) ? convert(v, DType::F32) : v;
    Value in_range = binary("and", compare(x, constant(this->dtype(x), -limit, dims(x)), "GE"),
                            compare(x, constant(this->dtype(x), limit, dims(x)), "LT"));  // NaN is neither
    Value truncated = g_.add("stablehlo.convert", {x}, Type{via, dims(x)});
    const int64_t lowest = wide ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int32_t>::min();
    v = select(in_range, truncated, constant_int(via, lowest, dims(x)));
    if (dtype == via) return v;
  }
  if (dtype == DType::F8E8M0FNU) {
    // As torch narrows to e8m0fnu: through float32, its exponent rounded to nearest on the
    // mantissa (ties to even, the implied bit being the LSB: 1 for normal numbers, 0 for
    // subnormals); the sign ignored; infinities and NaN (and what rounds past 2^127) to 255.
    const Value x = convert(v, DType::F32);
    const std::vector<int64_t> shape = dims(x);
    auto u32 = [&](int64_t value) { return constant_int(DType::U32, value, shape); };
    Value bits = g_.add("stablehlo.bitcast_convert", {x}, Type{DType::U32, shape});
    Value e = binary("and", binary("shift_right_logical", bits, u32(23)), u32(0xFF));
    auto nonzero = [&](Value a) { return compare(a, u32(0), "NE"); };
    Value guard = nonzero(binary("and", bits, u32(0x400000)));
    Value below = nonzero(binary("and", bits, u32(0x3FFFFF)));  // the round and sticky bits
    Value up = binary("and", guard, binary("or", below, nonzero(e)));
    Value rounded = select(compare(e, u32(0xFF), "EQ"), e, binary("add", e, convert(up, DType::U32)));
    if (this->dtype(v) == DType::F64) {
      // Below 2^-126 the float32 value is subnormal, which XLA's f64 -> f32 convert may flush
      // to zero: its multiple k of 2^-149 is rounded here (RNE) instead, and the rule above
      // gives 1 exactly when k > 2^22 (guard bit set, a bit below it too; 2^23 is 2^-126).
      Value magnitude = unary("abs", v);
      Value k = unary("round_nearest_even", binary("multiply", magnitude, constant(DType::F64, std::ldexp(1.0, 149), shape)));
      Value tiny = select(compare(k, constant(DType::F64, std::ldexp(1.0, 22), shape), "GT"), u32(1), u32(0));
      rounded = select(compare(magnitude, constant(DType::F64, std::ldexp(1.0, -126), shape), "LT"), tiny, rounded);
    }
    return g_.add("stablehlo.bitcast_convert", {convert(rounded, DType::U8)}, Type{dtype, shape});
  }
  if (is_float8(this->dtype(v)) && !is_floating(dtype)) return convert(convert(v, DType::F32), dtype);
  if (is_float8(dtype)) {
    // As torch converts to float8: through float32 (one rounding from f32, as its casts go),
    // e4m3fn saturating to its largest finite value (infinities included: it has none; NaN
    // stays NaN); the other formats overflow as XLA's convert does (e5m2 to infinity, the
    // fnuz formats to their NaN), which is torch's behaviour too.
    const Value x = convert(v, DType::F32);
    const std::vector<int64_t> shape = dims(x);
    Value in_range = x;
    if (dtype == DType::F8E4M3FN) {
      in_range = g_.add("stablehlo.clamp", {constant(DType::F32, -448.0, {}), x, constant(DType::F32, 448.0, {})},
                        Type{DType::F32, shape});
    }
    Value converted = g_.add("stablehlo.convert", {in_range}, Type{dtype, shape});
    // NaN as torch writes it (XLA may pick another NaN pattern): the format's NaN, with the
    // input's sign where the format has signed NaNs.
    const bool unsigned_nan = dtype == DType::F8E4M3FNUZ || dtype == DType::F8E5M2FNUZ;
    // (the sign read from the input's own bits: converting a NaN to f32 may drop its sign)
    const DType source = this->dtype(v);
    const size_t width = dtype_size(source);
    const DType same_width = width == 8 ? DType::S64 : width == 4 ? DType::S32 : width == 2 ? DType::S16 : DType::S8;
    const bool signed_nan_source = is_floating(source) && source != DType::F8E4M3FNUZ && source != DType::F8E5M2FNUZ;
    Value negative = signed_nan_source ? compare(g_.add("stablehlo.bitcast_convert", {v}, Type{same_width, shape}),
                                                   constant_int(same_width, 0, shape), "LT")
                                         : compare(x, constant(DType::F32, 0.0, shape), "LT");
    Value nan_bits = unsigned_nan ? constant_int(DType::S8, -128, shape)
                                  : select(negative, constant_int(DType::S8, -1, shape), constant_int(DType::S8, 0x7F, shape));
    // (chosen on the bits: XLA's CPU compiler computes a select of float8 values in a wider
    // type and back, which loses the NaN's sign)
    Value converted_bits = g_.add("stablehlo.bitcast_convert", {converted}, Type{DType::S8, shape});
    return g_.add("stablehlo.bitcast_convert", {select(compare(x, x, "NE"), nan_bits, converted_bits)},
                  Type{dtype, shape});
  }
  return g_.add("stablehlo.convert", {v}, Type{dtype, dims(v)});
}

Value Builder::bitcast_flat(Value flat, DType dtype) {
  DType from = this->dtype(flat);
  if (from == dtype) return flat;
  // XLA cannot bitcast complex values: split them into (real, imag) pairs of
  // their component type, or pair up components, and bitcast those.
  if (is_complex(from)) {
    int64_t n = dims(flat)[0];
    Value pairs = concatenate({reshape(real(flat), {n, 1}), reshape(imag(flat), {n, 1})}, 1);
    return bitcast_flat(reshape(pairs, {2 * n}), dtype);
  }
  if (is_complex(dtype)) {
    Value parts = bitcast_flat(flat, component_type(dtype));
    int64_t m = dims(parts)[0] / 2;
    Value pairs = reshape(parts, {m, 2});
    return complex(reshape(slice_dim(pairs, 1, 0, 1), {m}), reshape(slice_dim(pairs, 1, 1, 2), {m}));
  }
  if (from == DType::Pred || dtype == DType::Pred) {
    // i1 has no bit pattern in XLA; bool <-> uint8/int8 reinterpret as 0/1.
    if (dtype == DType::Pred) return convert(flat, dtype);
    return convert(convert(flat, DType::U8), dtype);
  }
  size_t fs = dtype_size(from), ts = dtype_size(dtype);
  int64_t n = dims(flat)[0];
  if (fs == ts) return g_.add("stablehlo.bitcast_convert", {flat}, Type{dtype, {n}});
  if (fs > ts) {
    int64_t k = static_cast<int64_t>(fs / ts);
    Value v = g_.add("stablehlo.bitcast_convert", {flat}, Type{dtype, {n, k}});
    return reshape(v, {n * k});
  }
  int64_t k = static_cast<int64_t>(ts / fs);
  Value v = reshape(flat, {n / k, k});
  return g_.add("stablehlo.bitcast_convert", {v}, Type{dtype, {n / k}});
}

Value Builder::reshape(Value v, const std::vector<int64_t>& dims) {
  if (this->dims(v) == dims) return v;
  return g_.add("stablehlo.reshape", {v}, Type{dtype(v), dims});
}

Value Builder::broadcast_in_dim(Value v, const std::vector<int64_t>& dims,
                                const std::vector<int64_t>& mapping) {
  bool identity = this->dims(v) == dims;
  for (size_t i = 0; identity && i < mapping.size(); ++i) identity = mapping[i] == static_cast<int64_t>(i);
  if (identity) return v;
  return g_.add("stablehlo.broadcast_in_dim", {v}, Type{dtype(v), dims},
                "broadcast_dimensions = " + i64_array(mapping));
}

Value Builder::broadcast_to(Value v, const std::vector<int64_t>& dims) {
  const auto& src = this->dims(v);
  if (src == dims) return v;
  if (src.size() > dims.size()) throw std::invalid_argument("broadcast_to: rank too large");
  std::vector<int64_t> mapping;
  size_t off = dims.size() - src.size();
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] != 1 && src[i] != dims[off + i]) throw std::invalid_argument("broadcast_to: bad shape");
    mapping.push_back(static_cast<int64_t>(off + i));
  }
  return broadcast_in_dim(v, dims, mapping);
}

Value Builder::transpose(Value v, const std::vector<int64_t>& perm) {
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity &= perm[i] == static_cast<int64_t>(i);
  if (identity) return v;
  std::vector<int64_t> out;
  for (int64_t p : perm) out.push_back(dims(v)[p]);
  return g_.add("stablehlo.transpose", {v}, Type{dtype(v), out}, "permutation = " + i64_array(perm));
}

Value Builder::slice(Value v, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
                     const std::vector<int64_t>& strides) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < start.size(); ++i) {
    out.push_back(std::max<int64_t>(0, (limit[i] - start[i] + strides[i] - 1) / strides[i]));
  }
  if (out == dims(v)) return v;
  return g_.add("stablehlo.slice", {v}, Type{dtype(v), out},
                "start_indices = " + i64_array(start) + ", limit_indices = " + i64_array(limit) +
                    ", strides = " + i64_array(strides));
}

namespace {
// A dimension an op works along, refused (not indexed past the end) when v has no such dimension.
void check_axis(const char* op, const std::vector<int64_t>& shape, int64_t dim) {
  if (dim < 0 || dim >= static_cast<int64_t>(shape.size())) {
    throw std::invalid_argument(std::string(op) + ": dimension " + std::to_string(dim) + " out of range for rank " +
                                std::to_string(shape.size()));
  }
}
}  // namespace

Value Builder::slice_dim(Value v, int64_t dim, int64_t start, int64_t limit, int64_t step) {
  check_axis("slice", dims(v), dim);
  std::vector<int64_t> s(dims(v).size(), 0), l = dims(v), st(dims(v).size(), 1);
  s[dim] = start;
  l[dim] = limit;
  st[dim] = step;
  return slice(v, s, l, st);
}

Value Builder::dynamic_slice(Value v, const std::vector<Value>& starts,
                             const std::vector<int64_t>& sizes) {
  std::vector<Value> operands{v};
  operands.insert(operands.end(), starts.begin(), starts.end());
  return g_.add("stablehlo.dynamic_slice", operands, Type{dtype(v), sizes},
                "slice_sizes = " + i64_array(sizes));
}

Value Builder::dynamic_update_slice(Value v, Value update, const std::vector<Value>& starts) {
  std::vector<Value> operands{v, update};
  operands.insert(operands.end(), starts.begin(), starts.end());
  return g_.add("stablehlo.dynamic_update_slice", operands, type(v));
}

Value Builder::concatenate(const std::vector<Value>& vs, int64_t dim) {
  if (vs.size() == 1) return vs[0];
  std::vector<int64_t> out = dims(vs[0]);
  check_axis("concatenate", out, dim);
  out[dim] = 0;
  for (Value v : vs) {
    if (dims(v).size() != dims(vs[0]).size()) throw std::invalid_argument("concatenate: operands of different ranks");
    out[dim] += dims(v)[dim];
  }
  return g_.add("stablehlo.concatenate", vs, Type{dtype(vs[0]), out},
                "dimension = " + std::to_string(dim) + " : i64");
}

Value Builder::pad(Value v, Value pad_value, const std::vector<int64_t>& low,
                   const std::vector<int64_t>& high, const std::vector<int64_t>& interior) {
  std::vector<int64_t> out = dims(v);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = low[i] + high[i] + out[i] + std::max<int64_t>(0, out[i] - 1) * interior[i];
  }
  return g_.add("stablehlo.pad", {v, pad_value}, Type{dtype(v), out},
                "edge_padding_low = " + i64_array(low) + ", edge_padding_high = " + i64_array(high) +
                    ", interior_padding = " + i64_array(interior));
}

Value Builder::reverse(Value v, const std::vector<int64_t>& rdims) {
  if (rdims.empty()) return v;
  return g_.add("stablehlo.reverse", {v}, type(v), "dimensions = " + i64_array(rdims));
}

Value Builder::unary(const std::string& op, Value v) {
  if (op == "is_finite") return g_.add("stablehlo.is_finite", {v}, Type{DType::Pred, dims(v)});
  if (op == "abs" && is_complex(dtype(v))) return g_.add("stablehlo.abs", {v}, Type{component_type(dtype(v)), dims(v)});
  if (op.find('.') != std::string::npos) return g_.add(op, {v}, type(v));
  return g_.add("stablehlo." + op, {v}, type(v));
}

Value Builder::binary(const std::string& op, Value a, Value b) {
  if (!(type(a) == type(b))) {
    throw std::invalid_argument("ir: " + op + " operands differ: " + type(a).str() + " vs " + type(b).str());
  }
  // Nothing to compute on zero elements, and the plugin's constant folder divides
  // splat constants of an empty shape element by element: 0 / 0 raised SIGFPE.
  if (type(a).numel() == 0) return constant(dtype(a), 0, dims(a));
  std::string name = op.find('.') != std::string::npos ? op : "stablehlo." + op;
  // Complex numbers have no order; the CPU plugin's compiler crashed (SIGSEGV) on it.
  if (is_complex(dtype(a)) && (name == "stablehlo.maximum" || name == "stablehlo.minimum")) {
    throw std::invalid_argument("ir: " + op + " of complex values (complex numbers are not ordered)");
  }
  return g_.add(name, {a, b}, type(a));
}

Value Builder::real(Value v) {
  if (!is_complex(dtype(v))) return v;
  return g_.add("stablehlo.real", {v}, Type{component_type(dtype(v)), dims(v)});
}

Value Builder::imag(Value v) {
  if (!is_complex(dtype(v))) return scalar_like(v, 0);
  return g_.add("stablehlo.imag", {v}, Type{component_type(dtype(v)), dims(v)});
}

Value Builder::complex(Value re, Value im) {
  if (!(type(re) == type(im))) {
    throw std::invalid_argument("ir: complex parts differ: " + type(re).str() + " vs " + type(im).str());
  }
  return g_.add("stablehlo.complex", {re, im}, Type{complex_of(dtype(re)), dims(re)});
}

Value Builder::conj(Value v) {
  if (!is_complex(dtype(v))) return v;
  return complex(real(v), unary("negate", imag(v)));
}

Value Builder::fft(Value v, const std::string& fft_type, const std::vector<int64_t>& lengths) {
  std::vector<int64_t> out = dims(v);
  DType dt = dtype(v);
  size_t r = out.size();
  if (fft_type == "RFFT") {
    out[r - 1] = lengths.back() / 2 + 1;
    dt = complex_of(dt);
  } else if (fft_type == "IRFFT") {
    out[r - 1] = lengths.back();
    dt = component_type(dt);
  }
  return g_.add("stablehlo.fft", {v}, Type{dt, out},
                "fft_type = #stablehlo<fft_type " + fft_type + ">, fft_length = " + i64_array(lengths));
}

Value Builder::compare(Value a, Value b, const std::string& direction) {
  std::string attrs = "comparison_direction = #stablehlo<comparison_direction " + direction + ">";
  return g_.add("stablehlo.compare", {a, b}, Type{DType::Pred, dims(a)}, attrs);
}

Value Builder::select(Value pred, Value on_true, Value on_false) {
  return g_.add("stablehlo.select", {pred, on_true, on_false}, type(on_true));
}

Value Builder::clamp(Value lo, Value v, Value hi) {
  return g_.add("stablehlo.clamp", {lo, v, hi}, type(v));
}

namespace {
std::atomic<DotPrecisionSource> g_dot_precision_source{nullptr};

std::string precision_attr() {
  const char* p = "HIGHEST";
  switch (dot_precision()) {
    case DotPrecision::Default: p = "DEFAULT"; break;
    case DotPrecision::High: p = "HIGH"; break;
    case DotPrecision::Highest: break;
  }
  return std::string(", precision_config = [#stablehlo<precision ") + p + ">, #stablehlo<precision " + p + ">]";
}
}  // namespace

void set_dot_precision_source(DotPrecisionSource source) { g_dot_precision_source = source; }

namespace {
std::atomic<bool> g_blocked_sums{false};
}  // namespace
void set_blocked_sums(bool on) { g_blocked_sums = on; }
bool blocked_sums() { return g_blocked_sums.load(std::memory_order_relaxed); }
DotPrecision dot_precision() {
  DotPrecisionSource source = g_dot_precision_source.load(std::memory_order_relaxed);
  return source ? source() : DotPrecision::Highest;
}

Value Builder::dot_general(Value a, Value b, const std::vector<int64_t>& lb,
                           const std::vector<int64_t>& rb, const std::vector<int64_t>& lc,
                           const std::vector<int64_t>& rc, DType result) {
  // Result dims: batch, lhs free, rhs free.
  std::vector<int64_t> out;
  for (int64_t d : lb) out.push_back(dims(a)[d]);
  auto contains = [](const std::vector<int64_t>& v, int64_t x) {
    for (int64_t y : v) if (y == x) return true;
    return false;
  };
  for (int64_t d = 0; d < type(a).rank(); ++d)
    if (!contains(lb, d) && !contains(lc, d)) out.push_back(dims(a)[d]);
  for (int64_t d = 0; d < type(b).rank(); ++d)
    if (!contains(rb, d) && !contains(rc, d)) out.push_back(dims(b)[d]);
  std::string dn = "dot_dimension_numbers = #stablehlo.dot<";
  std::vector<std::string> parts;
  if (!lb.empty()) parts.push_back("lhs_batching_dimensions = " + int_list(lb));
  if (!rb.empty()) parts.push_back("rhs_batching_dimensions = " + int_list(rb));
  parts.push_back("lhs_contracting_dimensions = " + int_list(lc));
  parts.push_back("rhs_contracting_dimensions = " + int_list(rc));
  for (size_t i = 0; i < parts.size(); ++i) dn += (i ? ", " : "") + parts[i];
  dn += ">" + precision_attr();
  return g_.add("stablehlo.dot_general", {a, b}, Type{result, out}, dn);
}

std::shared_ptr<Graph> Builder::combiner_region(const std::vector<Value>& inputs, const ReduceBody& body) {
  auto region = std::make_shared<Graph>();
  Builder rb(*region);
  std::vector<Value> lhs, rhs;
  for (Value v : inputs) lhs.push_back(region->param(Type{dtype(v), {}}));
  for (Value v : inputs) rhs.push_back(region->param(Type{dtype(v), {}}));
  region->set_outputs(body(rb, lhs, rhs));
  return region;
}

std::vector<Value> Builder::reduce(const std::vector<Value>& inputs, const std::vector<Value>& inits,
                                   const std::vector<int64_t>& rdims, const ReduceBody& body) {
  auto region = combiner_region(inputs, body);
  std::vector<int64_t> out;
  const auto& in = dims(inputs[0]);
  for (int64_t d = 0; d < static_cast<int64_t>(in.size()); ++d) {
    bool reduced = false;
    for (int64_t r : rdims) reduced |= r == d;
    if (!reduced) out.push_back(in[d]);
  }
  std::vector<Type> results;
  for (Value v : inputs) results.push_back(Type{dtype(v), out});
  std::vector<Value> operands = inputs;
  operands.insert(operands.end(), inits.begin(), inits.end());
  return g_.add_multi("stablehlo.reduce", operands, results, "dimensions = " + i64_array(rdims),
                      {region});
}

namespace {
std::string padding_attr(const std::vector<std::pair<int64_t, int64_t>>& padding) {
  std::string s = "dense<[";
  for (size_t i = 0; i < padding.size(); ++i) {
    if (i) s += ", ";
    s += "[" + std::to_string(padding[i].first) + ", " + std::to_string(padding[i].second) + "]";
  }
  return s + "]> : tensor<" + std::to_string(padding.size()) + "x2xi64>";
}
}  // namespace

Value Builder::convolution(Value lhs, Value rhs, const std::string& dimension_numbers,
                           const std::vector<int64_t>& window_strides,
                           const std::vector<std::pair<int64_t, int64_t>>& padding,
                           const std::vector<int64_t>& lhs_dilation, const std::vector<int64_t>& rhs_dilation,
                           int64_t feature_group_count, int64_t batch_group_count,
                           const std::vector<int64_t>& result_dims, DType result) {
  std::string attrs = "batch_group_count = " + std::to_string(batch_group_count) +
                      " : i64, dimension_numbers = #stablehlo.conv<" + dimension_numbers +
                      ">, feature_group_count = " + std::to_string(feature_group_count) +
                      " : i64, lhs_dilation = " + i64_array(lhs_dilation) +
                      ", padding = " + padding_attr(padding) + ", rhs_dilation = " + i64_array(rhs_dilation) +
                      ", window_strides = " + i64_array(window_strides) + precision_attr();
  return g_.add("stablehlo.convolution", {lhs, rhs}, Type{result, result_dims}, attrs);
}

std::vector<Value> Builder::reduce_window(const std::vector<Value>& inputs, const std::vector<Value>& inits,
                                          const Window& w, const ReduceBody& body) {
  auto region = combiner_region(inputs, body);
  const auto& in = dims(inputs[0]);
  size_t r = in.size();
  auto get = [r](const std::vector<int64_t>& v, size_t i) { return v.empty() ? int64_t{1} : v[i]; };
  std::vector<int64_t> out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t dilated_in = in[i] == 0 ? 0 : (in[i] - 1) * get(w.base_dilations, i) + 1;
    int64_t padded = dilated_in + (w.padding.empty() ? 0 : w.padding[i].first + w.padding[i].second);
    int64_t dilated_window = (w.dims[i] - 1) * get(w.window_dilations, i) + 1;
    out[i] = padded < dilated_window ? 0 : (padded - dilated_window) / get(w.strides, i) + 1;
  }
  std::string attrs = "window_dimensions = " + i64_array(w.dims);
  if (!w.strides.empty()) attrs += ", window_strides = " + i64_array(w.strides);
  if (!w.base_dilations.empty()) attrs += ", base_dilations = " + i64_array(w.base_dilations);
  if (!w.window_dilations.empty()) attrs += ", window_dilations = " + i64_array(w.window_dilations);
  if (!w.padding.empty()) attrs += ", padding = " + padding_attr(w.padding);
  std::vector<Type> results;
  for (Value v : inputs) results.push_back(Type{dtype(v), out});
  std::vector<Value> operands = inputs;
  operands.insert(operands.end(), inits.begin(), inits.end());
  return g_.add_multi("stablehlo.reduce_window", operands, results, attrs, {region});
}

Value Builder::reduce_window_simple(Value input, Value init, const Window& window, const std::string& op) {
  return reduce_window({input}, {init}, window,
                       [&](Builder& b, const std::vector<Value>& l, const std::vector<Value>& r) {
                         return std::vector<Value>{b.binary(op, l[0], r[0])};
                       })[0];
}

Value Builder::reduce_simple(Value input, Value init, const std::vector<int64_t>& rdims,
                             const std::string& op) {
  bool add = op == "add" || op == "stablehlo.add";
  DType t = dtype(input);
  if (add && is_floating(t) && !is_complex(t) && blocked_sums()) {
    int64_t count = 1;
    for (int64_t d : rdims) count *= dims(input)[d];
    if (count >= kBlockedSumFrom) return blocked_sum(input, init, rdims);
  }
  return reduce({input}, {init}, rdims,
                [&](Builder& b, const std::vector<Value>& l, const std::vector<Value>& r) {
                  return std::vector<Value>{b.binary(op, l[0], r[0])};
                })[0];
}

Value Builder::blocked_sum(Value x, Value init, const std::vector<int64_t>& rdims) {
  const std::vector<int64_t> in = dims(x);
  const auto rank = static_cast<int64_t>(in.size());
  std::vector<bool> reduced(in.size(), false);
  for (int64_t d : rdims) reduced[d] = true;
  // The reduced dims last, flattened into one of n elements, in blocks of kSumBlock.
  std::vector<int64_t> perm, kept;
  int64_t n = 1;
  for (int64_t d = 0; d < rank; ++d)
    if (!reduced[d]) perm.push_back(d), kept.push_back(in[d]);
  for (int64_t d = 0; d < rank; ++d)
    if (reduced[d]) perm.push_back(d), n *= in[d];
  bool identity = true;
  for (int64_t d = 0; d < rank; ++d) identity &= perm[d] == d;
  if (!identity) x = transpose(x, perm);
  std::vector<int64_t> flat = kept;
  flat.push_back(n);
  x = reshape(x, flat);
  int64_t blocks = (n + kSumBlock - 1) / kSumBlock;
  Value zero = constant(dtype(x), 0);
  if (blocks * kSumBlock != n) {  // zeros after the last element leave every sum as it is
    std::vector<int64_t> low(flat.size(), 0), high(flat.size(), 0), interior(flat.size(), 0);
    high.back() = blocks * kSumBlock - n;
    x = pad(x, zero, low, high, interior);
  }
  std::vector<int64_t> split = kept;
  split.push_back(blocks);
  split.push_back(kSumBlock);
  x = reshape(x, split);
  auto k = static_cast<int64_t>(kept.size());
  Value partial = reduce({x}, {zero}, {k + 1},
                         [](Builder& b, const std::vector<Value>& l, const std::vector<Value>& r) {
                           return std::vector<Value>{b.binary("stablehlo.add", l[0], r[0])};
                         })[0];
  // XLA's simplifier would fold a reduce of a reduce back into one (and the blocks with it).
  partial = g_.add_multi("stablehlo.optimization_barrier", {partial}, {type(partial)})[0];
  return reduce_simple(partial, init, {k}, "stablehlo.add");  // blocked again while there are many
}

Value Builder::gather(Value operand, Value indices, const std::vector<int64_t>& offset_dims,
                      const std::vector<int64_t>& collapsed, const std::vector<int64_t>& start_map,
                      int64_t index_vector_dim, const std::vector<int64_t>& slice_sizes,
                      const std::vector<int64_t>& result_dims) {
  // Nothing to read: XLA refuses a size-1 slice of a zero-size dim, even when no index uses it.
  if (Type{dtype(operand), result_dims}.numel() == 0 || type(operand).numel() == 0)
    return constant(dtype(operand), 0, result_dims);
  std::vector<std::string> parts;
  if (!offset_dims.empty()) parts.push_back("offset_dims = " + int_list(offset_dims));
  if (!collapsed.empty()) parts.push_back("collapsed_slice_dims = " + int_list(collapsed));
  parts.push_back("start_index_map = " + int_list(start_map));
  parts.push_back("index_vector_dim = " + std::to_string(index_vector_dim));
  std::string dn = "dimension_numbers = #stablehlo.gather<";
  for (size_t i = 0; i < parts.size(); ++i) dn += (i ? ", " : "") + parts[i];
  dn += ">, indices_are_sorted = false, slice_sizes = " + i64_array(slice_sizes);
  return g_.add("stablehlo.gather", {operand, indices}, Type{dtype(operand), result_dims}, dn);
}

Value Builder::scatter(Value operand, Value indices, Value updates,
                       const std::vector<int64_t>& update_window_dims,
                       const std::vector<int64_t>& inserted_window_dims,
                       const std::vector<int64_t>& to_operand, int64_t index_vector_dim,
                       const std::string& combiner) {
  if (type(updates).numel() == 0 || type(operand).numel() == 0) return operand;  // nothing written
  auto region = std::make_shared<Graph>();
  Builder rb(*region);
  Value old_v = region->param(Type{dtype(operand), {}});
  Value new_v = region->param(Type{dtype(operand), {}});
  bool nan_wins = combiner == "nan_maximum" || combiner == "nan_minimum";
  std::string op = nan_wins ? (combiner == "nan_maximum" ? "stablehlo.maximum" : "stablehlo.minimum") : combiner;
  Value combined = op.empty() ? new_v : rb.binary(op, old_v, new_v);
  if (nan_wins && is_floating(dtype(operand))) {
    // XLA's scatter keeps the other operand; here a NaN on either side wins.
    Value nan = rb.binary("or", rb.compare(old_v, old_v, "NE"), rb.compare(new_v, new_v, "NE"));
    combined = rb.select(nan, rb.binary("stablehlo.add", old_v, new_v), combined);
  }
  region->set_outputs({combined});
  std::vector<std::string> parts;
  if (!update_window_dims.empty()) parts.push_back("update_window_dims = " + int_list(update_window_dims));
  if (!inserted_window_dims.empty())
    parts.push_back("inserted_window_dims = " + int_list(inserted_window_dims));
  parts.push_back("scatter_dims_to_operand_dims = " + int_list(to_operand));
  parts.push_back("index_vector_dim = " + std::to_string(index_vector_dim));
  std::string dn = "scatter_dimension_numbers = #stablehlo.scatter<";
  for (size_t i = 0; i < parts.size(); ++i) dn += (i ? ", " : "") + parts[i];
  dn += ">, indices_are_sorted = false, unique_indices = false";
  return g_.add("stablehlo.scatter", {operand, indices, updates}, type(operand), dn, {region});
}

std::vector<Value> Builder::sort(const std::vector<Value>& operands, int64_t dim, bool descending,
                                 bool stable) {
  auto region = std::make_shared<Graph>();
  Builder rb(*region);
  std::vector<Value> args;
  for (Value v : operands) {
    args.push_back(region->param(Type{dtype(v), {}}));
    args.push_back(region->param(Type{dtype(v), {}}));
  }
  std::string dir = descending ? "GT" : "LT";
  std::string attrs = "comparison_direction = #stablehlo<comparison_direction " + dir + ">";
  if (is_floating(dtype(operands[0]))) attrs += ", compare_type = #stablehlo<comparison_type TOTALORDER>";
  region->set_outputs({region->add("stablehlo.compare", {args[0], args[1]}, Type{DType::Pred, {}}, attrs)});
  std::vector<Type> results;
  for (Value v : operands) results.push_back(type(v));
  return g_.add_multi("stablehlo.sort", operands, results,
                      "dimension = " + std::to_string(dim) + " : i64, is_stable = " +
                          (stable ? "true" : "false"),
                      {region});
}

std::vector<Value> Builder::rng_bits(Value state, DType bits_dtype, const std::vector<int64_t>& dims) {
  return g_.add_multi("stablehlo.rng_bit_generator", {state}, {type(state), Type{bits_dtype, dims}},
                      "rng_algorithm = #stablehlo<rng_algorithm THREE_FRY>");
}

std::vector<Value> Builder::while_loop(const std::vector<Value>& init, const LoopCond& cond, const LoopBody& body) {
  std::vector<Type> types;
  for (Value v : init) types.push_back(type(v));
  auto cond_region = std::make_shared<Graph>();
  {
    Builder rb(*cond_region);
    std::vector<Value> args;
    for (const Type& t : types) args.push_back(cond_region->param(t));
    cond_region->set_outputs({rb.reshape(cond(rb, args), {})});
  }
  auto body_region = std::make_shared<Graph>();
  {
    Builder rb(*body_region);
    std::vector<Value> args;
    for (const Type& t : types) args.push_back(body_region->param(t));
    std::vector<Value> next = body(rb, args);
    if (next.size() != types.size()) throw std::logic_error("ir: while body returns a different number of values");
    for (size_t i = 0; i < next.size(); ++i) {
      if (!(rb.type(next[i]) == types[i])) {
        throw std::logic_error("ir: while body changes the type of carried value " + std::to_string(i) + ": " +
                               types[i].str() + " -> " + rb.type(next[i]).str());
      }
    }
    body_region->set_outputs(next);
  }
  return g_.add_multi("stablehlo.while", init, types, "", {cond_region, body_region});
}

std::vector<Value> Builder::custom_call(const std::string& target, const std::vector<Value>& operands,
                                        const std::vector<Type>& results, const std::string& backend_config) {
  std::string attrs = "call_target_name = \"" + target + "\"";
  if (!backend_config.empty()) attrs += ", backend_config = \"" + backend_config + "\"";
  return g_.add_multi("stablehlo.custom_call", operands, results, attrs);
}

std::vector<Value> Builder::ffi_call(const std::string& target, const std::vector<Value>& operands,
                                     const std::vector<Type>& results, const std::string& attributes) {
  const std::string attrs = "call_target_name = \"" + target + "\", api_version = 4 : i32, backend_config = {" +
                            attributes + "}";
  return g_.add_multi("stablehlo.custom_call", operands, results, attrs);
}

Value Builder::cholesky(Value a, bool lower) {
  return g_.add("stablehlo.cholesky", {a}, type(a), std::string("lower = ") + (lower ? "true" : "false"));
}

Value Builder::triangular_solve(Value a, Value b, bool left_side, bool lower, bool unit_diagonal,
                                const std::string& transpose_a) {
  auto flag = [](bool v) { return v ? "true" : "false"; };
  std::string attrs = std::string("left_side = ") + flag(left_side) + ", lower = " + flag(lower) +
                      ", unit_diagonal = " + flag(unit_diagonal) + ", transpose_a = #stablehlo<transpose " +
                      transpose_a + ">";
  return g_.add("stablehlo.triangular_solve", {a, b}, type(b), attrs);
}

Value Builder::bin_bcast(const std::string& op, Value a, Value b) {
  auto out = broadcast_shapes(dims(a), dims(b));
  return binary(op, broadcast_to(a, out), broadcast_to(b, out));
}

Value Builder::cmp_bcast(Value a, Value b, const std::string& direction) {
  auto out = broadcast_shapes(dims(a), dims(b));
  return compare(broadcast_to(a, out), broadcast_to(b, out), direction);
}

Value Builder::scalar_like(Value like, double value) {
  return constant(dtype(like), value, dims(like));
}

}  // namespace torch_pjrt::ir
