// Shape ops computed on device: stack, flips and rolls, repeat_interleave, select/diagonal scatter,
// unfold_backward.
#include <ATen/Dispatch_v2.h>
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/native/TypeProperties.h>
#include <cmath>
#include <cstring>
#include <torch/library.h>

#include "aten/kernel_util.h"
#include "aten/nn_util.h"
#include "device/context.h"
#include "device/device_name.h"
#include "lowering/nn.h"
#include "lowering/ops.h"

namespace torch_pjrt::device {
namespace {

at::Tensor flip_fn(const at::Tensor& self, c10::IntArrayRef dims) {
  std::vector<int64_t> d;
  for (int64_t x : dims) d.push_back(at::maybe_wrap_dim(x, std::max<int64_t>(self.dim(), 1)));
  std::sort(d.begin(), d.end());
  TORCH_CHECK(std::adjacent_find(d.begin(), d.end()) == d.end(), "flip: dims has duplicates, original flip dims size=",
              dims.size());
  OpBuilder op("aten::flip");
  Value r = self.dim() == 0 ? op.input(self) : op.b().reverse(op.input(self), d);
  return finish(op, r, self.scalar_type(), nullptr);
}

at::Tensor roll_fn(const at::Tensor& self, c10::IntArrayRef shifts, c10::IntArrayRef dims) {
  TORCH_CHECK(!shifts.empty(), "roll: `shifts` required");
  TORCH_CHECK(dims.empty() ? shifts.size() == 1 : shifts.size() == dims.size(), "roll: shifts and dimensions must align. shifts: ",
              shifts.size(), ", dims:", dims.size());
  OpBuilder op("aten::roll");
  auto& b = op.b();
  Value x = op.input(self);
  auto roll_dim = [&b](Value v, int64_t dim, int64_t shift) {
    int64_t n = b.dims(v)[dim];
    if (n == 0) return v;
    shift = ((shift % n) + n) % n;
    if (shift == 0) return v;
    return b.concatenate({b.slice_dim(v, dim, n - shift, n), b.slice_dim(v, dim, 0, n - shift)}, dim);
  };
  if (dims.empty()) {
    Value flat = b.reshape(x, {self.numel()});
    x = b.reshape(roll_dim(flat, 0, shifts[0]), vec(self.sizes()));
  } else {
    for (size_t i = 0; i < dims.size(); ++i) {
      x = roll_dim(x, at::maybe_wrap_dim(dims[i], self.dim(), /*wrap_scalar=*/false), shifts[i]);
    }
  }
  return finish(op, x, self.scalar_type(), nullptr);
}

at::Tensor repeat_fn(const at::Tensor& self, c10::IntArrayRef repeats) {
  TORCH_CHECK(static_cast<int64_t>(repeats.size()) >= self.dim(), "Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor");
  for (int64_t r : repeats) TORCH_CHECK(r >= 0, "repeat: repeats can not be negative, got ", repeats);
  size_t n = repeats.size();
  std::vector<int64_t> padded(n - self.dim(), 1);
  for (int64_t s : self.sizes()) padded.push_back(s);
  // Broadcast [d0, d1, ...] to [r0, d0, r1, d1, ...], then merge pairs.
  std::vector<int64_t> wide, mapping, out;
  for (size_t i = 0; i < n; ++i) {
    wide.push_back(repeats[i]);
    wide.push_back(padded[i]);
    mapping.push_back(static_cast<int64_t>(2 * i + 1));
    out.push_back(repeats[i] * padded[i]);
  }
  OpBuilder op("aten::repeat");
  auto& b = op.b();
  Value x = b.reshape(op.input(self), padded);
  Value r = b.reshape(b.broadcast_in_dim(x, wide, mapping), out);
  return finish(op, r, self.scalar_type(), nullptr);
}

at::Tensor stack_fn(at::TensorList tensors, int64_t dim) {
  TORCH_CHECK(!tensors.empty(), "stack expects a non-empty TensorList");
  for (const auto& t : tensors) {
    TORCH_CHECK(t.sizes().equals(tensors[0].sizes()), "stack expects each tensor to be equal size, but got ",
                tensors[0].sizes(), " at entry 0 and ", t.sizes(), " at entry ", &t - tensors.data());
  }
  int64_t d = at::maybe_wrap_dim(dim, tensors[0].dim() + 1);
  OpBuilder op("aten::stack");
  auto& b = op.b();
  at::ScalarType t = at::native::result_type(tensors);
  std::vector<int64_t> one = vec(tensors[0].sizes());
  one.insert(one.begin() + d, 1);
  std::vector<Value> parts;
  for (const auto& x : tensors) parts.push_back(b.reshape(b.convert(op.input(x), to_ir(t)), one));
  return finish(op, b.concatenate(parts, d), t, nullptr);
}
at::Tensor select_scatter_fn(const at::Tensor& self, const at::Tensor& src, int64_t dim, int64_t index) {
  at::Tensor out = self.clone();
  out.select(dim, index).copy_(src);
  return out;
}
at::Tensor diagonal_scatter_fn(const at::Tensor& self, const at::Tensor& src, int64_t offset, int64_t d1, int64_t d2) {
  at::Tensor out = self.clone();
  out.diagonal(offset, d1, d2).copy_(src);
  return out;
}

// Backward of Tensor.unfold: every window element adds its gradient back to its source position.
at::Tensor unfold_backward_fn(const at::Tensor& grad, c10::IntArrayRef input_sizes, int64_t dim, int64_t size, int64_t step) {
  int64_t rank = static_cast<int64_t>(input_sizes.size());
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(rank, 1));
  OpBuilder op("aten::unfold_backward");
  auto& b = op.b();
  Value g = op.input(grad);
  if (rank == 0) return finish(op, b.reshape(g, {}), grad.scalar_type(), nullptr);
  // Overlap-add: window w's element k lands at w * step + k. Windows padded to
  // r = ceil(size / step) blocks of `step` put block j of window w at block
  // w + j, so the result is r shifted copies summed: O(r * elements), no
  // [in x windows*size] matrix (an istft has 10^5 windows' worth).
  int64_t windows = grad.size(d);
  int64_t blocks = (size + step - 1) / step;
  std::vector<int64_t> perm;  // [rest..., windows, size]
  for (int64_t i = 0; i < rank; ++i)
    if (i != d) perm.push_back(i);
  perm.push_back(d);
  perm.push_back(rank);
  g = b.convert(b.transpose(g, perm), L::accumulate_type(b.dtype(g)));
  std::vector<int64_t> shape = b.dims(g);
  int64_t lead = rank - 1;
  std::vector<int64_t> zeros(shape.size(), 0), high(shape.size(), 0);
  high.back() = blocks * step - size;
  g = b.pad(g, b.constant(b.dtype(g), 0), zeros, high, zeros);
  std::vector<int64_t> split(shape.begin(), shape.end() - 1);
  split.push_back(blocks);
  split.push_back(step);
  g = b.reshape(g, split);  // [rest..., windows, blocks, step]
  Value sum;
  for (int64_t j = 0; j < blocks; ++j) {
    Value piece = b.reshape(b.slice_dim(g, lead + 1, j, j + 1), [&] {
      std::vector<int64_t> s2(split);
      s2.erase(s2.begin() + lead + 1);
      return s2;
    }());
    std::vector<int64_t> lo(lead + 2, 0), hi(lead + 2, 0), in0(lead + 2, 0);
    lo[lead] = j;
    hi[lead] = blocks - 1 - j;
    piece = b.pad(piece, b.constant(b.dtype(piece), 0), lo, hi, in0);
    sum = sum.valid() ? b.binary("add", sum, piece) : piece;
  }
  std::vector<int64_t> flat(shape.begin(), shape.begin() + lead);
  int64_t covered = (windows + blocks - 1) * step;
  flat.push_back(covered);
  Value r = b.reshape(sum, flat);
  int64_t in = input_sizes[d];
  if (covered > in) {
    r = b.slice_dim(r, lead, 0, in);
  } else if (covered < in) {
    std::vector<int64_t> lo(lead + 1, 0), hi(lead + 1, 0), in0(lead + 1, 0);
    hi[lead] = in - covered;
    r = b.pad(r, b.constant(b.dtype(r), 0), lo, hi, in0);
  }
  std::vector<int64_t> back;  // move the last dim to d
  for (int64_t i = 0; i < rank; ++i) back.push_back(i < d ? i : i == d ? lead : i - 1);
  r = b.transpose(r, back);
  return finish(op, r, grad.scalar_type(), nullptr);
}

Tensor stack_legacy(at::TensorList tensors, int64_t dim) { return at::stack(tensors, dim); }
Tensor& stack_legacy_out(at::TensorList tensors, int64_t dim, Tensor& out) {
  return write_out("_stack", at::stack(tensors, dim), out);
}

Tensor channel_shuffle(const Tensor& self, int64_t groups) {
  TORCH_CHECK(groups > 0, "Number of groups to divide channels in must be positive. Value of groups:", groups);
  TORCH_CHECK(self.dim() >= 3, "channel_shuffle expects input to have at least 3 dimensions, but got input with sizes ",
              self.sizes());
  int64_t c = self.size(1);
  TORCH_CHECK(c % groups == 0, "Number of channels must be divisible by groups. Got ", c, " channels and ", groups, " groups.");
  std::vector<int64_t> split = vec(self.sizes());
  split[1] = c / groups;
  split.insert(split.begin() + 1, groups);
  return self.reshape(split).transpose(1, 2).reshape(self.sizes()).contiguous(self.suggest_memory_format());
}

Tensor repeat_interleave_k(const Tensor& repeats, std::optional<int64_t> output_size) {
  TORCH_CHECK(repeats.dim() == 1, "repeat_interleave only accept 1D vector as repeat");
  TORCH_CHECK(repeats.scalar_type() == at::kLong || repeats.scalar_type() == at::kInt,
              "repeats has to be Long or Int tensor");
  int64_t total = output_size ? *output_size : (repeats.numel() ? repeats.sum().item<int64_t>() : 0);
  if (!output_size && repeats.numel()) {
    TORCH_CHECK(repeats.min().item<int64_t>() >= 0, "repeats can not be negative");
  }
  if (total == 0) return at::empty({0}, repeats.options().dtype(repeats.scalar_type()));
  // Output j belongs to the repeat whose cumulative end first exceeds j.
  Tensor ends = at::cumsum(repeats.to(at::kLong), 0);
  Tensor positions = at::arange(total, repeats.options().dtype(at::kLong));
  return at::searchsorted(ends, positions, /*out_int32=*/false, /*right=*/true).to(repeats.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("flip", flip_fn);
  m.impl("roll", roll_fn);
  m.impl("repeat", repeat_fn);
  m.impl("stack", stack_fn);
  m.impl("select_scatter", select_scatter_fn);
  m.impl("diagonal_scatter", diagonal_scatter_fn);
  m.impl("unfold_backward", unfold_backward_fn);
  m.impl("_stack", stack_legacy);
  m.impl("_stack.out", stack_legacy_out);
  m.impl("native_channel_shuffle", channel_shuffle);
  m.impl("repeat_interleave.Tensor", repeat_interleave_k);
}

}  // namespace torch_pjrt::device
