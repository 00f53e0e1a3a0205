#pragma once

#include <functional>
#include <string>
#include <vector>

namespace c10 {
class OperatorHandle;
struct IValue;
}  // namespace c10

namespace torch_pjrt::device {

enum class FallbackMode { Warn = 0, Log = 1, Error = 2 };
using FallbackLogger = std::function<void(const std::string& op)>;

void set_fallback_mode(FallbackMode mode);
FallbackMode fallback_mode();
// Called for every fallback in Log mode (the Python side prints the user's line).
void set_fallback_logger(FallbackLogger logger);

// Checks the fallback policy (throws under TORCH_PJRT_FALLBACK=error), counts the
// fallback, and warns or logs it: every CPU fallback passes here first.
void note_cpu_fallback(const c10::OperatorHandle& op);

// Runs an op on the CPU on purpose (a case its pjrt kernel does not cover),
// counted, warned and forbidden like any fallback. `stack` is the boxed call.
void run_on_cpu(const c10::OperatorHandle& op, std::vector<c10::IValue>* stack);

}  // namespace torch_pjrt::device
