#include "aten/user_kernels.h"

#include "device/context.h"
#include "device/recorder.h"
#include "device/device_name.h"
#include "ir/functions.h"

namespace torch_pjrt::device {

void define_user_kernel(const std::string& name, const std::string& definitions) {
  TORCH_CHECK(!name.empty() && name.find_first_of(" @{}()") == std::string::npos, device_name(),
              ": a kernel's symbol must be a plain name, got '", name, "'");
  TORCH_CHECK(definitions.find("@" + name) != std::string::npos ||
                  definitions.find("sym_name = \"" + name + "\"") != std::string::npos,
              device_name(), ": the StableHLO given for @", name, " does not define it");
  try {
    ir::define_function(name, definitions);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, device_name(), ": ", e.what());
  }
}

std::vector<at::Tensor> call_user_kernel(const std::string& op_name, const std::string& name,
                                         const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& like) {
  TORCH_CHECK(ir::function_defined(name), device_name(), ": ", op_name, ": kernel @", name, " is not defined");
  OpBuilder op(op_name);
  std::vector<ir::Value> operands;
  for (const at::Tensor& t : inputs) {
    TORCH_CHECK(t.device().is_privateuseone(), device_name(), ": ", op_name, ": expected ", device_name(),
                " tensors, got one on ", t.device());
    operands.push_back(op.input(t));
  }
  std::vector<ir::Type> types;
  for (const at::Tensor& t : like) types.push_back(ir::Type{to_ir(t.scalar_type()), std::vector<int64_t>(t.sizes().begin(), t.sizes().end())});
  auto values = op.b().graph().add_multi("func.call", operands, types, "callee = @" + name);
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < values.size(); ++i) out.push_back(op.output(values[i], like[i].scalar_type()));
  op.run();
  return out;
}

}  // namespace torch_pjrt::device
