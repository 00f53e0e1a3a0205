// Sparse layouts (COO, and the compressed CSR/CSC/BSR/BSC) on pjrt. A sparse tensor
// keeps its indices and values as ordinary pjrt tensors. The kernels registered here
// are PyTorch's own device-generic ones: construction, metadata, and the accessors
// that return views of the components (so `s._values()[i] = v` writes the tensor).
// Every other op on a sparse pjrt tensor runs on the CPU through the counted fallback
// (forbidden with TORCH_PJRT_FALLBACK=error), as the dense fallback does.
#include <ATen/Functions.h>
#include <ATen/NativeFunctions.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "device/fallback.h"

namespace torch_pjrt::device {
namespace {

bool on_device(const at::Tensor& t) { return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1; }

// The sparse fallback. PyTorch's CPU fallback redispatches to the dense CPU kernel, so
// sparse ops get their own: the arguments go to the CPU with their layout, the op is
// dispatched there as a user call would be, results come back to the device, and the
// arguments the op writes are copied back into (sparse copy_ moves the components).
void sparse_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  note_cpu_fallback(op);
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t first_arg = stack->size() - num_args;
  std::optional<c10::Device> device;
  std::vector<std::pair<at::Tensor, at::Tensor>> written;  // (device argument, its CPU stand-in)
  auto to_cpu = [&](const at::Tensor& t, bool is_written) {
    if (!on_device(t)) return t;
    device = t.device();
    at::Tensor host = t.cpu();
    // Some CPU kernels save what their backward needs only for inputs that require grad
    // (_sparse_mm_reduce_impl's argmax indices: without them its backward reads out of
    // bounds). No graph is recorded here (autograd already ran for the device call).
    if (t.requires_grad() && (host.is_floating_point() || host.is_complex())) host.requires_grad_(true);
    if (is_written) written.emplace_back(t, host);
    return host;
  };
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& arg = (*stack)[first_arg + i];
    const auto* alias = schema.arguments()[i].alias_info();
    const bool is_written = alias != nullptr && alias->isWrite();
    if (arg.isTensor()) {
      arg = to_cpu(arg.toTensor(), is_written);
    } else if (arg.isTensorList()) {
      std::vector<at::Tensor> host;
      for (const at::Tensor& t : arg.toTensorList()) host.push_back(to_cpu(t, is_written));
      arg = c10::IValue(host);
    } else if (arg.isDevice() && arg.toDevice().type() == c10::DeviceType::PrivateUse1) {
      device = arg.toDevice();  // a factory asked for this device: build on the CPU, move after
      arg = c10::IValue(c10::Device(c10::DeviceType::CPU));
    }
  }
  TORCH_CHECK(device.has_value(), op.schema().name(), ": a sparse pjrt call with no pjrt tensor or device argument");
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // autograd already ran for the device call
    op.callBoxed(stack);
  }
  for (auto& [target, host] : written) at::_copy_from_and_resize(host, target);
  const auto& returns = schema.returns();
  const size_t first_return = stack->size() - returns.size();
  for (size_t i = 0; i < returns.size(); ++i) {
    c10::IValue& ret = (*stack)[first_return + i];
    const auto* alias = returns[i].alias_info();
    if (alias != nullptr && alias->isWrite() && ret.isTensor()) {
      // An in-place or out= op returns the argument it wrote: hand back the device one.
      for (auto& [target, host] : written) {
        if (host.is_same(ret.toTensor())) ret = target;
      }
    } else if (ret.isTensor()) {
      const at::Tensor t = ret.toTensor();
      if (t.defined()) ret = t.to(*device);
    } else if (ret.isTensorList()) {
      std::vector<at::Tensor> moved;
      for (const at::Tensor& t : ret.toTensorList()) moved.push_back(t.defined() ? t.to(*device) : t);
      ret = c10::IValue(moved);
    }
  }
}

// Copying a CPU result back into a sparse pjrt argument (the fallback's in-place and
// out= path): copy_ moves the components to this device.
at::Tensor copy_from_and_resize_sparse(const at::Tensor& self, const at::Tensor& dst) {
  const_cast<at::Tensor&>(dst).copy_(self);
  return dst;
}

}  // namespace

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_on_cpu>());
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_on_cpu>());
}

TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  m.impl("_sparse_coo_tensor_with_dims", TORCH_FN(at::native::new_with_dims_sparse));
  m.impl("_sparse_coo_tensor_with_dims_and_tensors", TORCH_FN(at::native::new_with_dims_and_tensor_sparse_symint));
  m.impl("empty.memory_format", TORCH_FN(at::native::empty_sparse_symint));
  m.impl("sparse_resize_", TORCH_FN(at::native::sparse_resize_));
  m.impl("sparse_resize_and_clear_", TORCH_FN(at::native::sparse_resize_and_clear_));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("_dimV", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse));
  m.impl("is_coalesced", TORCH_FN(at::native::is_coalesced_sparse));
  m.impl("_coalesced_", TORCH_FN(at::native::_coalesced_sparse_));
  m.impl("_indices", TORCH_FN(at::native::_indices_sparse));
  m.impl("_values", TORCH_FN(at::native::_values_sparse));
  m.impl("indices", TORCH_FN(at::native::indices_sparse));
  m.impl("values", TORCH_FN(at::native::values_sparse));
  m.impl("copy_sparse_to_sparse_", TORCH_FN(at::native::copy_sparse_));
  m.impl("copy_", TORCH_FN(at::native::copy_sparse_wrapper_));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize_sparse));
}

TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse_csr));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse_csr));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse_csr));
  m.impl("values", TORCH_FN(at::native::values_sparse_csr));
  m.impl("crow_indices", TORCH_FN(at::native::crow_indices_sparse_csr));
  m.impl("col_indices", TORCH_FN(at::native::col_indices_sparse_csr));
  m.impl("ccol_indices", TORCH_FN(at::native::ccol_indices_sparse_csr));
  m.impl("row_indices", TORCH_FN(at::native::row_indices_sparse_csr));
  m.impl("copy_", TORCH_FN(at::native::copy_sparse_compressed_));
  m.impl("resize_as_sparse_", TORCH_FN(at::native::resize_as_sparse_compressed_));
  m.impl("clone", TORCH_FN(at::native::clone_sparse_compressed));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize_sparse));
}

namespace {
// The backend fallback above is not reached by ops with a composite kernel (structured
// elementwise ops such as add and mul): on the CPU those have a sparse kernel of their
// own that takes precedence. Every op the CPU's sparse keys implement is sent to the CPU
// explicitly, unless this file registered a device-generic kernel for it.
class SparseOpsToCpu {
 public:
  SparseOpsToCpu() {
    route(c10::DispatchKey::SparseCPU, c10::DispatchKey::SparsePrivateUse1);
    route(c10::DispatchKey::SparseCsrCPU, c10::DispatchKey::SparseCsrPrivateUse1);
  }

 private:
  void route(c10::DispatchKey cpu_key, c10::DispatchKey device_key) {
    auto& dispatcher = c10::Dispatcher::singleton();
    auto library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", device_key, __FILE__, __LINE__);
    for (const c10::OperatorName& name : dispatcher.getRegistrationsForDispatchKey(cpu_key)) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      auto op = dispatcher.findOp(name);
      if (!op || op->hasKernelForDispatchKey(device_key)) continue;
      const std::string unqualified = c10::toString(name).substr(6);
      library->impl(unqualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&sparse_on_cpu>());
    }
    libraries_.push_back(std::move(library));
  }
  std::vector<std::unique_ptr<torch::Library>> libraries_;
};
const SparseOpsToCpu g_sparse_ops_to_cpu;
}  // namespace

}  // namespace torch_pjrt::device
