// The device's name as users see it: "pjrt", or what TORCH_PJRT_DEVICE_NAME renamed it to.
#pragma once

#include <c10/core/DeviceType.h>

#include <string>

namespace torch_pjrt::device {

inline std::string device_name() { return c10::get_privateuse1_backend(); }

}  // namespace torch_pjrt::device
