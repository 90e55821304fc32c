#include "abi/host_pool_handle.hpp"

#include <string>

#include "core/backend.hpp"
#include "core/error.hpp"

namespace hisparse {

Backend* choose_registrar(int32_t registration, int32_t device_index, int* device) {
  if (registration < HS_REGISTER_AUTO || registration > HS_REGISTER_NEVER) {
    invalid_argument("registration: expected HS_REGISTER_AUTO, _ALWAYS or _NEVER, got ", registration);
  }
  if (registration == HS_REGISTER_NEVER) return nullptr;
  Backend* cuda = cuda_backend();
  const bool possible = cuda != nullptr && cuda->available();
  if (!possible) {
    if (registration == HS_REGISTER_ALWAYS) {
      fail(HS_ERROR_UNSUPPORTED, "registration: HS_REGISTER_ALWAYS needs a CUDA device, but ",
           cuda == nullptr ? std::string("hisparse was built without the CUDA backend") : cuda->unavailable_reason());
    }
    return nullptr;
  }
  *device = device_index >= 0 ? device_index : cuda->current_device();
  if (*device >= cuda->device_count()) {
    invalid_argument("device_index: expected -1 or 0 <= device_index < ", cuda->device_count(), ", got ", device_index);
  }
  return cuda;
}

}  // namespace hisparse
