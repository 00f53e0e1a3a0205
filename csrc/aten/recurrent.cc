// Fused recurrent cells (LSTM, GRU) over precomputed gate projections.
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>
#include <torch/library.h>

#include "aten/kernel_util.h"
#include "aten/nn_util.h"
#include "device/context.h"
#include "lowering/nn.h"

namespace torch_pjrt::device {
namespace {

// nn.LSTM / nn.GRU (and their cells) call these with the gate projections done.
bool defined(const std::optional<at::Tensor>& t) { return t && t->defined(); }
// An optional operand: its value in `slot`, or null when absent.
const Value* optional_input(OpBuilder& op, const std::optional<at::Tensor>& t, Value* slot) {
  if (!defined(t)) return nullptr;
  *slot = op.input(*t);
  return slot;
}

void check_cell(const char* name, const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                const at::Tensor& state, int64_t gates) {
  TORCH_CHECK(input_gates.dim() == 2 && state.dim() == 2 && input_gates.sizes() == hidden_gates.sizes() &&
                  input_gates.size(0) == state.size(0) && input_gates.size(1) == gates * state.size(1),
              name, ": expected gates of shape [batch, ", gates, " * hidden] and a state [batch, hidden], got ",
              input_gates.sizes(), ", ", hidden_gates.sizes(), " and ", state.sizes());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> thnn_fused_lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  check_cell("_thnn_fused_lstm_cell", input_gates, hidden_gates, cx, 4);
  OpBuilder op("aten::_thnn_fused_lstm_cell");
  Value ib, hb;
  auto r = L::lstm_cell(op.b(), op.input(input_gates), op.input(hidden_gates), op.input(cx),
                        optional_input(op, input_bias, &ib), optional_input(op, hidden_bias, &hb));
  const auto dtype = input_gates.scalar_type();
  at::Tensor hy = op.output(r[0], dtype), cy = op.output(r[1], dtype), workspace = op.output(r[2], dtype);
  op.run();
  return {hy, cy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> thnn_fused_lstm_cell_backward_impl(
    const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy, const at::Tensor& cx,
    const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  if (!defined(grad_hy) && !defined(grad_cy)) return {at::Tensor(), at::Tensor(), at::Tensor()};
  OpBuilder op("aten::_thnn_fused_lstm_cell_backward_impl");
  Value ghy, gcy;
  auto r = L::lstm_cell_backward(op.b(), optional_input(op, grad_hy, &ghy), optional_input(op, grad_cy, &gcy),
                                 op.input(cx), op.input(cy), op.input(workspace), has_bias);
  const auto dtype = workspace.scalar_type();
  at::Tensor grad_gates = op.output(r[0], dtype), grad_cx = op.output(r[1], dtype);
  at::Tensor grad_bias = has_bias ? op.output(r[2], dtype) : at::Tensor();
  op.run();
  return {grad_gates, grad_cx, grad_bias};
}

std::tuple<at::Tensor, at::Tensor> thnn_fused_gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                       const at::Tensor& hx,
                                                       const std::optional<at::Tensor>& input_bias,
                                                       const std::optional<at::Tensor>& hidden_bias) {
  check_cell("_thnn_fused_gru_cell", input_gates, hidden_gates, hx, 3);
  OpBuilder op("aten::_thnn_fused_gru_cell");
  Value ib, hb;
  auto r = L::gru_cell(op.b(), op.input(input_gates), op.input(hidden_gates), op.input(hx),
                       optional_input(op, input_bias, &ib), optional_input(op, hidden_bias, &hb));
  const auto dtype = input_gates.scalar_type();
  at::Tensor hy = op.output(r[0], dtype), workspace = op.output(r[1], dtype);
  op.run();
  return {hy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> thnn_fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  OpBuilder op("aten::_thnn_fused_gru_cell_backward");
  auto r = L::gru_cell_backward(op.b(), op.input(grad_hy), op.input(workspace), has_bias);
  const auto dtype = workspace.scalar_type();
  at::Tensor gi = op.output(r[0], dtype), gh = op.output(r[1], dtype), ghx = op.output(r[2], dtype);
  at::Tensor gib = has_bias ? op.output(r[3], dtype) : at::Tensor();
  at::Tensor ghb = has_bias ? op.output(r[4], dtype) : at::Tensor();
  op.run();
  return {gi, gh, ghx, gib, ghb};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", thnn_fused_lstm_cell);
  m.impl("_thnn_fused_lstm_cell_backward_impl", thnn_fused_lstm_cell_backward_impl);
  m.impl("_thnn_fused_gru_cell", thnn_fused_gru_cell);
  m.impl("_thnn_fused_gru_cell_backward", thnn_fused_gru_cell_backward);
}

}  // namespace torch_pjrt::device
