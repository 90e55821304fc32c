#include "core/backend.hpp"

namespace hisparse {

void Backend::check_available() const {
  if (!available()) fail(HS_ERROR_UNSUPPORTED, "hisparse ", name(), " backend is unavailable: ", unavailable_reason());
}

#ifndef HISPARSE_WITH_CUDA
Backend* cuda_backend() { return nullptr; }
#endif

Backend& backend_for(const Device& device) {
  if (!device.is_cuda()) return cpu_backend();
  Backend* cuda = cuda_backend();
  if (cuda == nullptr) {
    fail(HS_ERROR_UNSUPPORTED, "got tensors on ", device.describe(),
         " but hisparse was built without the CUDA backend (no nvcc at build time, or HISPARSE_CUDA=OFF)");
  }
  cuda->check_available();
  if (device.index < 0 || device.index >= cuda->device_count()) {
    invalid_argument("device ", device.describe(), " does not exist (", cuda->device_count(), " visible)");
  }
  return *cuda;
}

}  // namespace hisparse
