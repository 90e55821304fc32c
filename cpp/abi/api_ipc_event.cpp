// C ABI of interprocess events: create, export, import, record, wait,
// synchronize, destroy.
#include <cstddef>
#include <memory>
#include <utility>

#include "core/error.hpp"
#include "core/ipc_event.hpp"
#include "hisparse/shared_host_pool.h"

struct hs_ipc_event {
  explicit hs_ipc_event(std::unique_ptr<hisparse::IpcEvent> owned) : event(std::move(owned)) {}
  std::unique_ptr<hisparse::IpcEvent> event;
};

using namespace hisparse;

namespace {

IpcEvent& require_event(hs_ipc_event_t event) { return *require_pointer(event, "event")->event; }

}  // namespace

extern "C" {

HS_API hs_status_t hs_ipc_event_create(int32_t device_type, int32_t device_index, hs_ipc_event_t* event) {
  return api_guard([&] {
    require_pointer(event, "event");
    *event = nullptr;
    *event = new hs_ipc_event(IpcEvent::create(device_type, device_index));
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
    *event = new hs_ipc_event(IpcEvent::import(*require_pointer(handle, "handle"), device_index));
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
    require_struct(info, "info", offsetof(hs_ipc_event_info_t, exporter_pid) + 8);
    hs_ipc_event_info_t value{};
    value.device_type = e.device().is_cuda() ? HS_DEVICE_CUDA : HS_DEVICE_CPU;
    value.device_index = e.device().index;
    value.imported = e.imported() ? 1 : 0;
    value.exporter_pid = e.exporter_pid();
    write_struct(info, value, HS_IPC_EVENT_INFO_VERSION);
  });
}

HS_API hs_status_t hs_ipc_event_destroy(hs_ipc_event_t event) {
  return api_guard([&] { delete event; });
}

}  // extern "C"
