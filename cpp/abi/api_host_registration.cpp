// C ABI of the registration of caller-owned host memory.
#include "abi/api_guard.hpp"
#include "abi/handles.hpp"
#include "core/host_registration.hpp"

using namespace hisparse;

extern "C" {

HS_API hs_status_t hs_host_register(void* data, uint64_t bytes, int32_t device_type, int32_t device_index) {
  return api_guard([&] { register_host_memory(data, bytes, device_from(device_type, device_index)); });
}

HS_API hs_status_t hs_host_unregister(void* data) {
  return api_guard([&] { unregister_host_memory(data); });
}

HS_API hs_status_t hs_host_is_registered(const void* data, uint64_t bytes, int32_t* registered) {
  return api_guard([&] { *require_pointer(registered, "registered") = host_memory_registered(data, bytes) ? 1 : 0; });
}

}  // extern "C"
