#pragma once

#include <functional>
#include <string>

namespace torch_pjrt::device {

enum class FallbackMode { Warn = 0, Log = 1, Error = 2 };
using FallbackLogger = std::function<void(const std::string& op)>;

void set_fallback_mode(FallbackMode mode);
FallbackMode fallback_mode();
// Called for every fallback in Log mode (the Python side prints the user's line).
void set_fallback_logger(FallbackLogger logger);

}  // namespace torch_pjrt::device
