// The thread-local last error and the status names.
#include "abi/api_guard.hpp"

namespace hisparse {
namespace {
thread_local std::string last_error;
}  // namespace

void set_last_error(const std::string& message) { last_error = message; }
void clear_last_error() { last_error.clear(); }

}  // namespace hisparse

extern "C" {

HS_API const char* hs_status_string(hs_status_t status) {
  switch (status) {
    case HS_SUCCESS: return "HS_SUCCESS";
    case HS_ERROR_INVALID_ARGUMENT: return "HS_ERROR_INVALID_ARGUMENT";
    case HS_ERROR_INVALID_DTYPE: return "HS_ERROR_INVALID_DTYPE";
    case HS_ERROR_INVALID_STATE: return "HS_ERROR_INVALID_STATE";
    case HS_ERROR_OUT_OF_MEMORY: return "HS_ERROR_OUT_OF_MEMORY";
    case HS_ERROR_UNSUPPORTED: return "HS_ERROR_UNSUPPORTED";
    case HS_ERROR_CUDA: return "HS_ERROR_CUDA";
    case HS_ERROR_SYSTEM: return "HS_ERROR_SYSTEM";
    case HS_ERROR_INTERNAL: return "HS_ERROR_INTERNAL";
    default: return "HS_UNKNOWN_STATUS";
  }
}

HS_API const char* hs_last_error(void) { return hisparse::last_error.c_str(); }

}  // extern "C"
