// The CPU fallback for ops without a pjrt kernel: counted, warned once per op,
// optionally logged with the user's line, or forbidden (TORCH_PJRT_FALLBACK=error).
#include <ATen/native/CPUFallback.h>
#include <torch/library.h>

#include <mutex>
#include <set>

#include "device/context.h"
#include "device/device_name.h"
#include "device/fallback.h"

namespace torch_pjrt::device {
namespace {
std::atomic<int> g_fallback_mode{static_cast<int>(FallbackMode::Warn)};
std::mutex g_mu;
std::set<std::string> g_warned;
FallbackLogger g_logger;

void pjrt_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  note_cpu_fallback(op);
  at::native::cpu_fallback(op, stack);
}
}  // namespace

void note_cpu_fallback(const c10::OperatorHandle& op) {
  std::string name = c10::toString(op.schema().operator_name());
  auto mode = static_cast<FallbackMode>(g_fallback_mode.load());
  TORCH_CHECK_NOT_IMPLEMENTED(mode != FallbackMode::Error, device_name(), ": ", name,
                              " has no pjrt kernel, and TORCH_PJRT_FALLBACK=error forbids running it on the CPU");
  {
    std::lock_guard<std::mutex> lock(executor::metrics().mu);
    executor::metrics().fallbacks[name]++;
  }
  bool first;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    first = g_warned.insert(name).second;
  }
  if (first && mode == FallbackMode::Warn) {
    TORCH_WARN(device_name(), ": ", name, " has no pjrt kernel; it runs on the CPU (copies to host and back). "
               "Set TORCH_PJRT_FALLBACK=error to forbid this, or =log to see every call.");
  }
  if (mode == FallbackMode::Log && g_logger) g_logger(name);
}

// An op run on the CPU on purpose (a case its pjrt kernel does not cover): counted like any fallback.
void run_on_cpu(const c10::OperatorHandle& op, std::vector<c10::IValue>* stack) { pjrt_cpu_fallback(op, stack); }

void set_fallback_mode(FallbackMode mode) { g_fallback_mode = static_cast<int>(mode); }
FallbackMode fallback_mode() { return static_cast<FallbackMode>(g_fallback_mode.load()); }
void set_fallback_logger(FallbackLogger logger) { g_logger = std::move(logger); }

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&pjrt_cpu_fallback>());
}

}  // namespace torch_pjrt::device
