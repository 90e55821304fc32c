// C ABI of interprocess events: create, export, import, record, wait,
// synchronize, destroy.
#include <memory>

#include "abi/api_guard.hpp"
#include "abi/handles.hpp"
#include "core/error.hpp"
#include "core/ipc_event.hpp"
#include "hisparse/shared_host_pool.h"

using namespace hisparse;

namespace {

// The handle is the core event behind an opaque pointer, as for the other handles (abi/handles.hpp).
hs_ipc_event_t to_handle(std::unique_ptr<IpcEvent> event) {
  const auto handle = reinterpret_cast<hs_ipc_event_t>(event.release());
  list_handle(handle, HandleKind::kIpcEvent);
  return handle;
}
IpcEvent& require_event(hs_ipc_event_t event) {
  require_handle(event, HandleKind::kIpcEvent, "event", "hs_ipc_event_t");
  return *reinterpret_cast<IpcEvent*>(event);
}

}  // namespace

extern "C" {

HS_API hs_status_t hs_ipc_event_create(int32_t device_type, int32_t device_index, hs_ipc_event_t* event) {
  return api_guard([&] {
    require_pointer(event, "event");
    *event = nullptr;
    *event = to_handle(IpcEvent::create(device_type, device_index));
  });
}

HS_API hs_status_t hs_ipc_event_export(hs_ipc_event_t event, hs_ipc_event_handle_t* handle) {
  return api_guard([&] { *require_pointer(handle, "handle") = require_event(event).export_handle(); });
}

HS_API hs_status_t hs_ipc_event_import(const hs_ipc_event_handle_t* handle, int32_t device_index,
                                       hs_ipc_event_t* event) {
  return api_guard([&] {
    require_pointer(event, "event");
    *event = nullptr;
    *event = to_handle(IpcEvent::import(*require_pointer(handle, "handle"), device_index));
  });
}

HS_API hs_status_t hs_ipc_event_record(hs_ipc_event_t event, hs_stream_t stream) {
  return api_guard([&] { require_event(event).record(stream); });
}

HS_API hs_status_t hs_ipc_event_wait(hs_ipc_event_t event, hs_stream_t stream) {
  return api_guard([&] { require_event(event).wait(stream); });
}

HS_API hs_status_t hs_ipc_event_synchronize(hs_ipc_event_t event) {
  return api_guard([&] { require_event(event).synchronize(); });
}

HS_API hs_status_t hs_ipc_event_get_info(hs_ipc_event_t event, hs_ipc_event_info_t* info) {
  return api_guard([&] {
    const IpcEvent& e = require_event(event);
    require_struct_size(info, "info");
    hs_ipc_event_info_t value{};
    value.device_type = e.device().is_cuda() ? HS_DEVICE_CUDA : HS_DEVICE_CPU;
    value.device_index = e.device().index;
    value.imported = e.imported() ? 1 : 0;
    value.exporter_pid = e.exporter_pid();
    write_struct<HS_IPC_EVENT_INFO_VERSION>(info, value);
  });
}

HS_API hs_status_t hs_ipc_event_destroy(hs_ipc_event_t event) {
  return api_guard([&] {
    if (event != nullptr) {
      const int borrowers = require_event(event).borrowers();
      if (borrowers > 0) {
        fail(HS_ERROR_INVALID_STATE, "event: still held by ", borrowers,
             " runtime(s) (hs_runtime_set_host_sharing, or a KV cache's host_event); set another event on them or "
             "destroy them first");
      }
    }
    if (take_handle(event, HandleKind::kIpcEvent, "event", "hs_ipc_event_t")) delete reinterpret_cast<IpcEvent*>(event);
  });
}

}  // extern "C"
