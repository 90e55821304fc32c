#include "abi/host_pool_handle.hpp"

#include <string>

#include "abi/handles.hpp"
#include "core/backend.hpp"
#include "core/error.hpp"

namespace hisparse {

hs_host_pool& require_pool(hs_host_pool_t pool, const char* name) {
  require_handle(pool, HandleKind::kHostPool, name, "hs_host_pool_t");
  return *pool;
}

hs_host_pool_t list_pool(hs_host_pool* pool) {
  list_handle(pool, HandleKind::kHostPool);
  return pool;
}

Backend* choose_registrar(int32_t registration, int32_t device_index, int* device) {
  if (registration < HS_REGISTER_AUTO || registration > HS_REGISTER_NEVER) {
    invalid_argument("registration: expected HS_REGISTER_AUTO, _ALWAYS or _NEVER, got ", registration);
  }
  if (device_index < -1) {
    invalid_argument("device_index: expected -1 (the current device) or a device index, got ", device_index);
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
