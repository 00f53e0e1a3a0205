// User kernels as StableHLO functions (torch_pjrt.library): a call records one op of the
// device graph, so the kernel runs inside fused graphs and compiled programs.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace torch_pjrt::device {

// Binds `name` (a StableHLO symbol) to `definitions`, the func.func text whose entry is @name.
void define_user_kernel(const std::string& name, const std::string& definitions);

// Calls kernel `name` on pjrt tensors; its results have the shapes and dtypes of `like`
// (tensors of any device, meta included). `op_name` names the op in errors and profiles.
std::vector<at::Tensor> call_user_kernel(const std::string& op_name, const std::string& name,
                                         const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& like);

}  // namespace torch_pjrt::device
