// Random number kernels: uniform, normal, bernoulli, dropout, random_, the distributions, randperm,
// multinomial.
#include <ATen/Dispatch_v2.h>
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/native/ReduceOpsUtils.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TypeProperties.h>
#include <cstring>
#include <numeric>
#include <sstream>
#include <torch/library.h>

#include "aten/kernel_util.h"
#include "aten/nn_util.h"
#include "device/context.h"
#include "device/device_name.h"
#include "lowering/nn.h"
#include "lowering/ops.h"

namespace torch_pjrt::device {
namespace {

at::Tensor& uniform_fn(at::Tensor& self, double from, double to, std::optional<at::Generator> gen) {
  if (self.is_complex()) {  // as torch: each part uniform on [from, to)
    at::Tensor parts = at::view_as_real(self);
    return uniform_fn(parts, from, to, gen), self;
  }
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "uniform_ only supports floating point dtypes, got ", self.scalar_type());
  // ATen's bounds: both ends and their distance inside the dtype's range.
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, self.scalar_type(), "uniform_", [&] {
    const auto lo = static_cast<double>(std::numeric_limits<scalar_t>::lowest());
    const auto hi = static_cast<double>(std::numeric_limits<scalar_t>::max());
    TORCH_CHECK(from >= lo && from <= hi, "from is out of bounds for ", self.dtype());
    TORCH_CHECK(to >= lo && to <= hi, "to is out of bounds for ", self.dtype());
    TORCH_CHECK(from <= to, "uniform_ expects to return a [from, to) range, but found from=", from, " > to=", to);
    TORCH_CHECK(to - from <= hi, "uniform_ expects to-from <= std::numeric_limits<", self.scalar_type(),
                ">::max(), but found to=", to, " and from=", from, " which result in to-from to exceed the limit");
  });
  OpBuilder op("aten::uniform_");
  auto& b = op.b();
  op.set_device(self.device().index());
  auto r = L::uniform(b, op.rng_state(pick_generator(gen, self)), to_ir(self.scalar_type()), vec(self.sizes()));
  op.set_rng_state(r[0]);
  Value scale = b.broadcast_to(op.scalar(to - from, self.scalar_type()), vec(self.sizes()));
  Value lo = b.broadcast_to(op.scalar(from, self.scalar_type()), vec(self.sizes()));
  op.write(self, b.binary("add", b.binary("multiply", r[1], scale), lo));
  op.run();
  return self;
}

at::Tensor& normal_fn(at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  if (self.is_complex()) {
    // As torch: both parts normal with variance std^2 / 2 (a view of the same storage).
    at::Tensor parts = at::view_as_real(self);
    normal_fn(parts, mean, std / std::sqrt(2.0), gen);
    return self;
  }
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "normal_ only supports floating point dtypes");
  TORCH_CHECK(std >= 0.0, "normal expects std >= 0.0, but found std ", std);
  OpBuilder op("aten::normal_");
  auto& b = op.b();
  op.set_device(self.device().index());
  auto r = L::normal(b, op.rng_state(pick_generator(gen, self)), to_ir(self.scalar_type()), vec(self.sizes()));
  op.set_rng_state(r[0]);
  Value s = b.broadcast_to(op.scalar(std, self.scalar_type()), vec(self.sizes()));
  Value m = b.broadcast_to(op.scalar(mean, self.scalar_type()), vec(self.sizes()));
  op.write(self, b.binary("add", b.binary("multiply", r[1], s), m));
  op.run();
  return self;
}

at::Tensor& bernoulli_float(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  TORCH_CHECK(0 <= p && p <= 1, "bernoulli_ expects p to be in [0, 1], but got p=", p);
  OpBuilder op("aten::bernoulli_");
  auto& b = op.b();
  op.set_device(self.device().index());
  auto r = L::uniform(b, op.rng_state(pick_generator(gen, self)), ir::DType::F32, vec(self.sizes()));
  op.set_rng_state(r[0]);
  Value pv = b.broadcast_to(op.scalar(p, at::kFloat), vec(self.sizes()));
  op.write(self, b.compare(r[1], pv, "LT"));
  op.run();
  return self;
}

at::Tensor bernoulli_tensor(const at::Tensor& p, std::optional<at::Generator> gen) {
  OpBuilder op("aten::bernoulli");
  auto& b = op.b();
  Value pv = b.convert(op.input(p), ir::DType::F32);
  auto r = L::uniform(b, op.rng_state(pick_generator(gen, p)), ir::DType::F32, vec(p.sizes()));
  op.set_rng_state(r[0]);
  return finish(op, b.compare(r[1], pv, "LT"), p.scalar_type(), nullptr, op.pointwise_layout(p.dim()));
}
at::Tensor& bernoulli_out(const at::Tensor& p, std::optional<at::Generator> gen, at::Tensor& out) {
  return write_out("bernoulli", bernoulli_tensor(p, std::move(gen)), out);
}

std::tuple<at::Tensor, at::Tensor> native_dropout_fn(const at::Tensor& input, double p, std::optional<bool> train) {
  OpBuilder op("aten::native_dropout");
  auto& b = op.b();
  Value x = op.input(input);
  if (train.has_value() && !*train) {
    at::Tensor out = op.output(x, input.scalar_type());
    at::Tensor mask = op.output(b.constant_int(ir::DType::Pred, 1, vec(input.sizes())), at::kBool);
    op.run();
    return {out, mask};
  }
  auto r = L::uniform(b, op.rng_state(pick_generator(std::nullopt, input)), ir::DType::F32, vec(input.sizes()));
  op.set_rng_state(r[0]);
  Value keep = b.compare(r[1], b.constant(ir::DType::F32, 1.0 - p, vec(input.sizes())), "LT");
  double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
  Value scaled = b.binary("multiply", x, b.broadcast_to(op.scalar(scale, input.scalar_type()), vec(input.sizes())));
  Value out = b.select(keep, scaled, b.scalar_like(x, 0));
  at::Tensor o = op.output(out, input.scalar_type());
  at::Tensor m = op.output(keep, at::kBool);
  op.run();
  return {o, m};
}

at::Tensor native_dropout_backward_fn(const at::Tensor& grad, const at::Tensor& mask, double scale) {
  OpBuilder op("aten::native_dropout_backward");
  auto& b = op.b();
  // grad * mask * scale: a Python float scale makes integer gradients float, as on CPU.
  at::ScalarType out = float_result(grad.scalar_type());
  Value g = b.convert(op.input(grad), to_ir(out));
  Value m = b.convert(op.input(mask), ir::DType::Pred);
  Value r = b.select(m, b.binary("multiply", g, b.broadcast_to(op.scalar(scale, out), b.dims(g))), b.scalar_like(g, 0));
  return finish(op, r, out, nullptr, op.pointwise_layout(grad.dim()));
}

// random_'s bounds as ATen checks them (DistributionTemplates.h): for float dtypes `from`
// and `to` moved to values the dtype holds, both ends inside the dtype's range (a warning
// past the integers it holds exactly), the bounds' wording kept.
template <typename T>
int64_t representable_from(int64_t from) {
  const auto from_plus_1 = static_cast<int64_t>(static_cast<T>(from + 1));
  if (from_plus_1 < from) {
    int64_t magnitude = std::abs(from + 1);
    int n = 0;
    while (magnitude >>= 1) ++n;
    from = from_plus_1 + (int64_t{1} << (n - std::numeric_limits<T>::digits + 1));
  }
  return from;
}
template <typename T>
int64_t representable_to(int64_t to) {
  const auto to_minus_1 = static_cast<int64_t>(static_cast<T>(to - 1));
  if (to_minus_1 >= to) {
    int64_t magnitude = std::abs(to - 1);
    int n = 0;
    while (magnitude >>= 1) ++n;
    to = to_minus_1 - (int64_t{1} << (n - std::numeric_limits<T>::digits + 1));
  }
  return to;
}
void check_random_bounds(int64_t from, int64_t to_inc, at::ScalarType dtype) {
  auto check = [&](int64_t v, const char* name, double lo, double hi) {
    TORCH_CHECK(static_cast<double>(v) >= lo && static_cast<double>(v) <= hi, name, " is out of bounds for ",
                c10::scalarTypeToTypeMeta(dtype));
  };
  if (at::isFloatingType(dtype)) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "random_", [&] {
      check(from, "from", static_cast<double>(std::numeric_limits<scalar_t>::lowest()),
            static_cast<double>(std::numeric_limits<scalar_t>::max()));
      check(to_inc, "to - 1", static_cast<double>(std::numeric_limits<scalar_t>::lowest()),
            static_cast<double>(std::numeric_limits<scalar_t>::max()));
      constexpr int digits = std::numeric_limits<scalar_t>::digits;
      for (auto [v, name] : {std::pair{from, "from"}, std::pair{to_inc, "to - 1"}}) {
        if (v < -(int64_t{1} << digits) || v > (int64_t{1} << digits)) {
          TORCH_WARN(name, " is out of bounds [-(2^", digits, "), 2^", digits, "]. Due to precision limitations ",
                     c10::scalarTypeToTypeMeta(dtype), " can support discrete uniform distribution only within this range. ",
                     "This warning will become an error in version 1.7 release, please fix the code in advance");
        }
      }
    });
  } else if (dtype == at::kUInt64) {
    check(from, "from", 0, static_cast<double>(INT64_MAX));
    check(to_inc, "to - 1", 0, static_cast<double>(INT64_MAX));
  } else {
    AT_DISPATCH_V2(dtype, "random_", AT_WRAP([&] {
      const auto lo = static_cast<int64_t>(std::numeric_limits<scalar_t>::lowest());
      const auto hi = static_cast<int64_t>(std::numeric_limits<scalar_t>::max());
      TORCH_CHECK(from >= lo && from <= hi, "from is out of bounds for ", c10::scalarTypeToTypeMeta(dtype));
      TORCH_CHECK(to_inc >= lo && to_inc <= hi, "to - 1 is out of bounds for ", c10::scalarTypeToTypeMeta(dtype));
    }), AT_EXPAND(AT_INTEGRAL_TYPES), at::kUInt16, at::kUInt32, at::kBool);
  }
}

// random_: from + bits % range from 64 random bits, in 64-bit integer arithmetic (range 0
// meaning all 2^64 values), then converted to self's dtype (floats round to nearest, as on CPU).
at::Tensor& random_from_to(at::Tensor& self, int64_t from, std::optional<int64_t> to, std::optional<at::Generator> gen) {
  const at::ScalarType dtype = self.scalar_type();
  TORCH_CHECK(at::isFloatingType(dtype) || at::isIntegralType(dtype, /*includeBool=*/true),
              "random_ handles only integral, floating-point and boolean types, got ", dtype);
  uint64_t range = 0;
  if (to.has_value()) {  // [from, to)
    int64_t hi = *to;
    TORCH_CHECK(from < hi, "random_ expects 'from' to be less than 'to', but got from=", from, " >= to=", hi);
    if (at::isFloatingType(dtype)) {
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "random_", [&] {
        from = representable_from<scalar_t>(from);
        hi = representable_to<scalar_t>(hi);
        TORCH_CHECK(from < hi, "random_ expects 'from' casted to dtype to be less than 'to' casted to dtype, but got from=",
                    from, " >= to=", hi);
      });
    }
    check_random_bounds(from, hi - 1, dtype);
    range = static_cast<uint64_t>(hi) - static_cast<uint64_t>(from);
  } else if (from != std::numeric_limits<int64_t>::lowest()) {  // [from, the dtype's largest integer]
    int64_t to_inc = 0;
    if (at::isFloatingType(dtype)) {
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "random_", [&] {
        constexpr int digits = std::numeric_limits<scalar_t>::digits;
        to_inc = digits >= 63 ? std::numeric_limits<int64_t>::max() : (int64_t{1} << digits);
        from = representable_from<scalar_t>(from);
        TORCH_CHECK(from < to_inc, "random_ expects 'from' casted to dtype to be less than or equal to 'to_inc' casted to dtype, but got from=",
                    from, " > to_inc=", to_inc);
      });
    } else if (dtype == at::kBool) {
      to_inc = 1;
    } else {
      AT_DISPATCH_V2(dtype, "random_", AT_WRAP([&] {
        to_inc = static_cast<int64_t>(std::numeric_limits<scalar_t>::max());
      }), AT_EXPAND(AT_INTEGRAL_TYPES), at::kUInt16, at::kUInt32, at::kUInt64);
    }
    check_random_bounds(from, to_inc, dtype);
    range = static_cast<uint64_t>(to_inc) - static_cast<uint64_t>(from) + 1;
  }
  if (self.numel() == 0) return self;
  OpBuilder op("aten::random_");
  auto& b = op.b();
  op.set_device(self.device().index());
  const std::vector<int64_t> dims = vec(self.sizes());
  auto r = b.rng_bits(op.rng_state(pick_generator(gen, self)), ir::DType::U64, dims);
  op.set_rng_state(r[0]);
  Value bits = r[1];
  if (range != 0) {
    // The range travels as int64 bits (past 2^63 it reads negative there) and is reinterpreted.
    Value span = b.convert(op.scalar(static_cast<int64_t>(range), at::kLong), ir::DType::U64);
    bits = b.binary("remainder", bits, b.broadcast_to(span, dims));
  }
  Value v = b.binary("add", b.convert(bits, ir::DType::S64), b.broadcast_to(op.scalar(from, at::kLong), dims));
  op.write(self, v);
  op.run();
  return self;
}
at::Tensor& random_to(at::Tensor& self, int64_t to, std::optional<at::Generator> gen) {
  return random_from_to(self, 0, to, gen);
}
at::Tensor& random_plain(at::Tensor& self, std::optional<at::Generator> gen) {
  return random_from_to(self, 0, std::nullopt, gen);
}

// Fills self with f(u) for uniform u in [0, 1) drawn in f32 (f64 for double).
at::Tensor& fill_from_uniform(const char* name, at::Tensor& self, std::optional<at::Generator> gen,
                              const std::function<Value(OpBuilder&, Value)>& transform) {
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), name, " only supports floating point dtypes, got ", self.scalar_type());
  OpBuilder op(std::string("aten::") + name);
  op.set_device(self.device().index());
  DType acc = self.scalar_type() == at::kDouble ? DType::F64 : DType::F32;
  auto r = L::uniform(op.b(), op.rng_state(pick_generator(gen, self)), acc, vec(self.sizes()));
  op.set_rng_state(r[0]);
  op.write(self, op.b().convert(transform(op, r[1]), to_ir(self.scalar_type())));
  op.run();
  return self;
}

at::Tensor& exponential_fn(at::Tensor& self, double lambd, std::optional<at::Generator> gen) {
  TORCH_CHECK(lambd > 0.0, "exponential_ expects lambda > 0.0, but found lambda=", lambd);
  return fill_from_uniform("exponential_", self, gen, [&](OpBuilder& op, Value u) {
    auto& b = op.b();
    Value l = b.broadcast_to(op.scalar(lambd, to_aten(b.dtype(u))), b.dims(u));
    return b.binary("divide", b.unary("negate", b.unary("log_plus_one", b.unary("negate", u))), l);
  });
}
at::Tensor& geometric_fn(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  TORCH_CHECK(0 < p && p < 1, "geometric_ expects p to be in (0, 1), but got p=", p);
  auto draw = [&](OpBuilder& op, Value u) {
    auto& b = op.b();
    Value lp = b.broadcast_to(op.scalar(std::log1p(-p), to_aten(b.dtype(u))), b.dims(u));
    return b.unary("ceil", b.binary("divide", b.unary("log_plus_one", b.unary("negate", u)), lp));
  };
  if (at::isFloatingType(self.scalar_type())) return fill_from_uniform("geometric_", self, gen, draw);
  at::Tensor tmp = at::empty(self.sizes(), self.options().dtype(at::kFloat));
  fill_from_uniform("geometric_", tmp, gen, draw);
  self.copy_(tmp);
  return self;
}
at::Tensor& log_normal_fn(at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  TORCH_CHECK(std > 0.0, "log_normal_ expects std > 0.0, but found std=", std);
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "log_normal_ only supports floating point dtypes");
  OpBuilder op("aten::log_normal_");
  op.set_device(self.device().index());
  auto& b = op.b();
  DType acc = self.scalar_type() == at::kDouble ? DType::F64 : DType::F32;
  auto r = L::normal(b, op.rng_state(pick_generator(gen, self)), acc, vec(self.sizes()));
  op.set_rng_state(r[0]);
  Value s = b.broadcast_to(op.scalar(std, to_aten(acc)), vec(self.sizes()));
  Value m = b.broadcast_to(op.scalar(mean, to_aten(acc)), vec(self.sizes()));
  op.write(self, b.convert(b.unary("exponential", b.binary("add", b.binary("multiply", r[1], s), m)), to_ir(self.scalar_type())));
  op.run();
  return self;
}
at::Tensor& cauchy_fn(at::Tensor& self, double median, double sigma, std::optional<at::Generator> gen) {
  TORCH_CHECK(sigma > 0.0, "cauchy_ expects sigma > 0.0, but found sigma=", sigma);
  return fill_from_uniform("cauchy_", self, gen, [&](OpBuilder& op, Value u) {
    auto& b = op.b();
    at::ScalarType t = to_aten(b.dtype(u));
    Value angle = b.binary("multiply", b.binary("subtract", u, b.scalar_like(u, 0.5)), b.scalar_like(u, M_PI));
    return b.binary("add", b.broadcast_to(op.scalar(median, t), b.dims(u)),
                    b.binary("multiply", b.broadcast_to(op.scalar(sigma, t), b.dims(u)), b.unary("tan", angle)));
  });
}

// normal with tensor mean and/or std: mean + std * N(0, 1) over the broadcast shape.
at::Tensor normal_tensors(const at::Tensor& mean, const at::Tensor& std, std::optional<at::Generator> gen) {
  TORCH_CHECK(!std.is_complex(), "normal expects standard deviation to be non-complex");
  // As ATen on every device: the smallest std is read on the host (a sync).
  TORCH_CHECK(std.numel() == 0 || std.min().ge(0).item<bool>(), "normal expects all elements of std >= 0.0");
  at::ScalarType t = at::result_type(mean, std);
  TORCH_CHECK(at::isFloatingType(t), "normal expects floating point mean and std, got ", t);
  OpBuilder op("aten::normal");
  auto& b = op.b();
  Value m = b.convert(op.input(mean), to_ir(t)), s = b.convert(op.input(std), to_ir(t));
  auto shape = ir::broadcast_shapes(b.dims(m), b.dims(s));
  const at::Tensor& device_tensor = mean.device().type() == c10::DeviceType::PrivateUse1 ? mean : std;
  auto r = L::normal(b, op.rng_state(pick_generator(gen, device_tensor)), to_ir(t), shape);
  op.set_rng_state(r[0]);
  Value out = b.binary("add", b.broadcast_to(m, shape), b.binary("multiply", b.broadcast_to(s, shape), r[1]));
  return finish(op, out, t, nullptr);
}
at::Tensor normal_tt(const at::Tensor& m, const at::Tensor& s, std::optional<at::Generator> g) { return normal_tensors(m, s, g); }
at::Tensor normal_tf(const at::Tensor& m, double s, std::optional<at::Generator> g) {
  TORCH_CHECK(s >= 0.0, "normal expects std >= 0.0, but found std ", s);
  return normal_tensors(m, at::scalar_tensor(s, m.options().device(at::kCPU)), g);
}
at::Tensor normal_ft(double m, const at::Tensor& s, std::optional<at::Generator> g) {
  return normal_tensors(at::scalar_tensor(m, s.options().device(at::kCPU)), s, g);
}
at::Tensor& normal_tt_out(const at::Tensor& m, const at::Tensor& s, std::optional<at::Generator> g, at::Tensor& out) {
  return write_out("normal", normal_tt(m, s, std::move(g)), out);
}
at::Tensor& normal_tf_out(const at::Tensor& m, double s, std::optional<at::Generator> g, at::Tensor& out) {
  return write_out("normal", normal_tf(m, s, std::move(g)), out);
}
at::Tensor& normal_ft_out(double m, const at::Tensor& s, std::optional<at::Generator> g, at::Tensor& out) {
  return write_out("normal", normal_ft(m, s, std::move(g)), out);
}

at::Tensor& randperm_out(int64_t n, std::optional<at::Generator> gen, at::Tensor& out) {
  TORCH_CHECK(n >= 0, "randperm: n must be non-negative, got ", n);
  // ATen's checks: n - 1 must fit the result's dtype, and floats must tell the values apart.
  TORCH_CHECK(at::scalar_tensor(n > 0 ? n - 1 : n, at::TensorOptions().dtype(out.scalar_type())).defined(),
              "n is too large for result tensor type: '", out.toString(), "'");
  switch (out.scalar_type()) {
    case at::kHalf: TORCH_CHECK(n <= (int64_t{1} << 11) + 1, "n cannot be greater than 2049 for Half type."); break;
    case at::kFloat: TORCH_CHECK(n <= (int64_t{1} << 24) + 1, "n cannot be greater than 2^24+1 for Float type."); break;
    case at::kDouble: TORCH_CHECK(n <= (int64_t{1} << 53) + 1, "n cannot be greater than 2^53+1 for Double type."); break;
    default: break;
  }
  at::native::resize_output(out, {n});
  if (n == 0) return out;
  OpBuilder op("aten::randperm");
  op.set_device(out.device().index());
  auto& b = op.b();
  // Sorting random keys gives a uniformly random permutation (ties have probability ~n^2/2^64).
  auto r = L::uniform(b, op.rng_state(pick_generator(gen, out)), DType::F64, {n});
  op.set_rng_state(r[0]);
  auto sorted = L::sort_with_indices(b, r[1], 0, false);
  finish(op, b.convert(sorted[1], to_ir(out.scalar_type())), out.scalar_type(), &out);
  return out;
}

at::Tensor multinomial_fn(const at::Tensor& self, int64_t n, bool replacement, std::optional<at::Generator> gen) {
  TORCH_CHECK(self.dim() == 1 || self.dim() == 2, "prob_dist must be 1 or 2 dim");
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "multinomial only supports floating-point dtypes for input, got: ",
              self.scalar_type());
  int64_t categories = self.size(-1);
  TORCH_CHECK(n > 0, "cannot sample n_sample <= 0 samples");
  TORCH_CHECK(replacement || n <= categories, "cannot sample n_sample > prob_dist.size(-1) samples without replacement");
  // As ATen: beyond 2^24 categories float32 cumulative sums cannot tell neighbours apart.
  TORCH_CHECK(categories <= (int64_t{1} << 24), "number of categories cannot exceed 2^24");
  OpBuilder op("aten::multinomial");
  auto& b = op.b();
  Value p = b.convert(op.input(self), DType::F32);
  if (self.dim() == 1) p = b.reshape(p, {1, categories});
  int64_t rows = b.dims(p)[0];
  Value bad = L::any_all(b, b.reshape(b.compare(p, b.scalar_like(p, 0), "LT"), {rows * categories}), {}, false, false);
  op.check_flag(bad, "aten::multinomial: probability tensor contains either `inf`, `nan` or element < 0");
  Value result;
  if (replacement) {
    // Inverse CDF: the number of cumulative weights <= u * total.
    auto r = L::uniform(b, op.rng_state(pick_generator(gen, self)), DType::F32, {rows, n});
    op.set_rng_state(r[0]);
    Value cdf = L::cumulative(b, p, 1, "sum");
    Value total = b.slice_dim(cdf, 1, categories - 1, categories);
    Value u = b.binary("multiply", r[1], b.broadcast_to(total, {rows, n}));
    Value cmp = b.compare(b.broadcast_in_dim(cdf, {rows, n, categories}, {0, 2}),
                          b.broadcast_in_dim(u, {rows, n, categories}, {0, 1}), "LE");
    result = L::sum(b, b.convert(cmp, DType::S64), {2}, false, DType::S64);
    result = b.binary("minimum", result, b.constant_int(DType::S64, categories - 1, {rows, n}));
  } else {
    // Gumbel top-k: the n largest log(p) - log(-log(u)) are a sample without replacement.
    auto r = L::uniform(b, op.rng_state(pick_generator(gen, self)), DType::F32, {rows, categories});
    op.set_rng_state(r[0]);
    Value u = b.binary("maximum", r[1], b.scalar_like(r[1], 1e-20));
    Value gumbel = b.unary("negate", b.unary("log", b.unary("negate", b.unary("log", u))));
    Value keys = b.binary("add", b.unary("log", p), gumbel);
    auto sorted = L::sort_with_indices(b, keys, 1, true);
    result = b.slice_dim(sorted[1], 1, 0, n);
  }
  if (self.dim() == 1) result = b.reshape(result, {n});
  return finish(op, result, at::kLong, nullptr);
}

at::Tensor& multinomial_out(const at::Tensor& self, int64_t n, bool replacement, std::optional<at::Generator> gen,
                            at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == at::kLong, "multinomial expects Long tensor out, got: ", out.scalar_type());
  return write_out("multinomial", multinomial_fn(self, n, replacement, std::move(gen)), out, {self});
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("uniform_", uniform_fn);
  m.impl("normal_", normal_fn);
  m.impl("bernoulli_.float", bernoulli_float);
  m.impl("bernoulli", bernoulli_tensor);
  m.impl("bernoulli.out", bernoulli_out);
  m.impl("native_dropout", native_dropout_fn);
  m.impl("native_dropout_backward", native_dropout_backward_fn);
  m.impl("random_.from", random_from_to);
  m.impl("random_.to", random_to);
  m.impl("random_", random_plain);
  m.impl("normal.Tensor_Tensor", normal_tt);
  m.impl("normal.Tensor_float", normal_tf);
  m.impl("normal.float_Tensor", normal_ft);
  m.impl("normal.Tensor_Tensor_out", normal_tt_out);
  m.impl("normal.Tensor_float_out", normal_tf_out);
  m.impl("normal.float_Tensor_out", normal_ft_out);
  m.impl("exponential_", exponential_fn);
  m.impl("geometric_", geometric_fn);
  m.impl("log_normal_", log_normal_fn);
  m.impl("cauchy_", cauchy_fn);
  m.impl("randperm.generator_out", randperm_out);
  m.impl("multinomial", multinomial_fn);
  m.impl("multinomial.out", multinomial_out);
}

}  // namespace torch_pjrt::device
