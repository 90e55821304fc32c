// C ABI of residency resolution: the core checks every argument
// (core/resolve_residency_args.hpp), then the backend of the tensors' device
// runs the launch.
#include "abi/api_guard.hpp"
#include "core/backend.hpp"
#include "core/resolve_residency_args.hpp"

using namespace hisparse;

extern "C" {

HS_API hs_status_t hs_resolve_residency(const hs_resolve_residency_args_t* args, hs_stream_t stream) {
  return api_guard([&] {
    Device device;
    const ResolveResidencyParams params =
        resolve_residency_params(read_struct<HS_RESOLVE_RESIDENCY_ARGS_VERSION>(args, "args"), &device);
    backend_for(device, "topk_indices").resolve_residency(params, stream);
  });
}

}  // extern "C"
