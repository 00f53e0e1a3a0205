// Assertions and whole-tensor comparisons: _assert_async, equal, is_set_to.
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

bool equal_fn(const at::Tensor& self, const at::Tensor& other) {
  if (!self.sizes().equals(other.sizes())) return false;
  return at::eq(self, other).all().item<bool>();  // one host sync, like CPU's answer
}

// Checked at the next sync point like an out-of-range index (no host read here).
void assert_async_msg(const Tensor& self, c10::string_view msg) {
  TORCH_CHECK(self.numel() == 1, "Boolean value of Tensor with more than one value is ambiguous");
  OpBuilder op("aten::_assert_async");
  auto& b = op.b();
  Value v = b.reshape(op.input(self), {});
  Value zero = b.convert(b.constant_int(ir::DType::S64, 0), b.dtype(v));
  op.check_flag(b.compare(v, zero, "EQ"),
                msg.empty() ? std::string("Expected Tensor with single nonzero value, but got zero") : std::string(msg));
  op.run();
}
void assert_async(const Tensor& self) { assert_async_msg(self, ""); }
Tensor functional_assert_async(const Tensor& self, c10::string_view msg, const Tensor& dep_token) {
  assert_async_msg(self, msg);
  return dep_token.clone();
}

bool is_set_to(const Tensor& self, const Tensor& other) {
  return self.storage().is_alias_of(other.storage()) && self.storage_offset() == other.storage_offset() &&
         self.sizes().equals(other.sizes()) && self.strides().equals(other.strides());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("equal", equal_fn);
  m.impl("_assert_async", assert_async);
  m.impl("_assert_async.msg", assert_async_msg);
  m.impl("_functional_assert_async.msg", functional_assert_async);
  m.impl("is_set_to", is_set_to);
}

}  // namespace torch_pjrt::device
