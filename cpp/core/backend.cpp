#include "core/backend.hpp"

namespace hisparse {

void Backend::check_available() const {
  if (!available()) fail(HS_ERROR_UNSUPPORTED, "hisparse ", name(), " backend is unavailable: ", unavailable_reason());
}

#ifndef HISPARSE_WITH_CUDA
Backend* cuda_backend() { return nullptr; }
#endif

Backend& backend_for(const Device& device, const char* name) {
  if (!device.is_cuda()) return cpu_backend();
  Backend* cuda = cuda_backend();
  if (cuda == nullptr) {
    fail(HS_ERROR_UNSUPPORTED, name, ": on ", device.describe(),
         ", but hisparse was built without the CUDA backend (no nvcc at build time, or HISPARSE_CUDA=OFF)");
  }
  if (!cuda->available()) {
    fail(HS_ERROR_UNSUPPORTED, name, ": on ", device.describe(),
         ", but the CUDA backend is unavailable: ", cuda->unavailable_reason());
  }
  if (device.index < 0 || device.index >= cuda->device_count()) {
    invalid_argument(name, ": expected a CUDA device 0 <= index < ", cuda->device_count(),
                     " (the devices visible), got ", device.describe());
  }
  return *cuda;
}

}  // namespace hisparse
