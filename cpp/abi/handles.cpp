#include "abi/handles.hpp"

#include "core/backend.hpp"

namespace hisparse {

Device device_from(int32_t device_type, int32_t device_index, const Device* fallback) {
  Device device;
  if (device_type == HS_DEVICE_CUDA) {
    device.kind = Device::kCuda;
    if (device_index < -1) {
      invalid_argument("device_index: expected -1 (current device) or a device index >= 0, got ", device_index);
    }
    if (device_index >= 0) {
      device.index = device_index;
    } else if (fallback != nullptr && fallback->is_cuda()) {
      device.index = fallback->index;
    } else {
      Backend* cuda = cuda_backend();
      if (cuda == nullptr) {
        fail(HS_ERROR_UNSUPPORTED, "device_type: HS_DEVICE_CUDA, but hisparse was built without the CUDA backend");
      }
      cuda->check_available();
      device.index = cuda->current_device();
    }
  } else if (device_type != HS_DEVICE_CPU) {
    invalid_argument("device_type: expected HS_DEVICE_CPU (", static_cast<int>(HS_DEVICE_CPU), ") or HS_DEVICE_CUDA (",
                     static_cast<int>(HS_DEVICE_CUDA), "), got ", device_type);
  }
  return device;
}

}  // namespace hisparse
