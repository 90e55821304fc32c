// C ABI of the runtime calls a model-level KV cache builds on: the write op,
// the per-request reset, the counter reset and the host-sharing role. Each
// converts its arguments and calls the Runtime core.
#include "abi/api_guard.hpp"
#include "abi/handles.hpp"
#include "core/ipc_event.hpp"
#include "core/runtime.hpp"

using namespace hisparse;

extern "C" {

HS_API hs_status_t hs_runtime_reset_request(hs_runtime_t runtime, int32_t state_row, hs_stream_t stream) {
  return api_guard([&] { from_handle(runtime, "runtime").reset_request(state_row, stream); });
}

HS_API hs_status_t hs_runtime_reset_stats(hs_runtime_t runtime, hs_stream_t stream) {
  return api_guard([&] { from_handle(runtime, "runtime").reset_stats(stream); });
}

HS_API hs_status_t hs_runtime_write(hs_runtime_t runtime, const hs_runtime_write_args_t* args, hs_stream_t stream) {
  return api_guard([&] {
    Runtime& r = from_handle(runtime, "runtime");
    r.write(read_struct<HS_RUNTIME_WRITE_ARGS_VERSION>(args, "args"), stream);
  });
}

HS_API hs_status_t hs_runtime_set_host_sharing(hs_runtime_t runtime, const hs_runtime_host_sharing_t* sharing) {
  return api_guard([&] {
    Runtime& r = from_handle(runtime, "runtime");
    const hs_runtime_host_sharing_t s = read_struct<HS_RUNTIME_HOST_SHARING_VERSION>(sharing, "sharing");
    if (s.event != nullptr) require_handle(s.event, HandleKind::kIpcEvent, "sharing->event", "hs_ipc_event_t");
    r.set_host_sharing(s.role, reinterpret_cast<IpcEvent*>(s.event));
  });
}

}  // extern "C"
