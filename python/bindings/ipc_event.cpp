// hisparse._C.IpcEvent: an interprocess event that owns its hs_ipc_event_t;
// handles cross processes as bytes, streams as integer handles.
#include <nanobind/stl/string.h>

#include <cstring>
#include <memory>
#include <string>

#include "bindings.hpp"

namespace hisparse_py {
namespace {

// The event itself, shared by the Python object and whatever borrows it (a
// runtime's or a KV cache's host sharing), so that it outlives them all.
struct EventState {
  hs_ipc_event_t handle = nullptr;
  ~EventState() { hs_ipc_event_destroy(handle); }
};

class IpcEvent {
 public:
  IpcEvent(const PyInt& device_type, const PyInt& device_index) : state_(std::make_shared<EventState>()) {
    check(hs_ipc_event_create(int32_arg(device_type, "device_type"), int32_arg(device_index, "device_index"),
                              &state_->handle));
  }

  static IpcEvent open(const PyBytes& handle, const PyInt& device_index) {
    const std::string given = bytes_arg(handle, "handle", HS_IPC_EVENT_HANDLE_BYTES);
    hs_ipc_event_handle_t bytes;
    std::memcpy(bytes.internal, given.data(), HS_IPC_EVENT_HANDLE_BYTES);
    IpcEvent event;
    check(hs_ipc_event_import(&bytes, int32_arg(device_index, "device_index"), &event.state_->handle));
    return event;
  }

  nb::bytes export_handle() const {
    hs_ipc_event_handle_t bytes;
    check(hs_ipc_event_export(get(), &bytes));
    return nb::bytes(bytes.internal, HS_IPC_EVENT_HANDLE_BYTES);
  }
  void record(const PyInt& stream) { check(hs_ipc_event_record(get(), stream_arg(stream))); }
  void wait(const PyInt& stream) { check(hs_ipc_event_wait(get(), stream_arg(stream))); }
  void synchronize() {
    hs_status_t status;
    {
      nb::gil_scoped_release release;
      status = hs_ipc_event_synchronize(get());
    }
    check(status);
  }
  // The hs_ipc_event_t, for C calls that borrow the event (host sharing).
  uintptr_t handle() const { return reinterpret_cast<uintptr_t>(state_->handle); }
  const std::shared_ptr<EventState>& state() const { return state_; }
  nb::dict info() const {
    hs_ipc_event_info_t info{};
    info.struct_size = sizeof(info);
    check(hs_ipc_event_get_info(get(), &info));
    nb::dict out;
    out["device_type"] = info.device_type;
    out["device_index"] = info.device_index;
    out["imported"] = info.imported != 0;
    out["exporter_pid"] = info.exporter_pid;
    return out;
  }

 private:
  IpcEvent() : state_(std::make_shared<EventState>()) {}
  hs_ipc_event_t get() const { return state_->handle; }
  std::shared_ptr<EventState> state_;
};

}  // namespace

std::shared_ptr<void> borrow_ipc_event(nb::handle value, const char* name, hs_ipc_event_t* handle) {
  *handle = nullptr;
  const IpcEvent* event = object_arg<IpcEvent>(value, name, "a hisparse._C.IpcEvent", true);
  if (event == nullptr) return nullptr;
  *handle = event->state()->handle;
  return event->state();
}

void register_ipc_event(nb::module_& m) {
  nb::class_<IpcEvent>(m, "IpcEvent")
      .def(nb::init<const PyInt&, const PyInt&>(), nb::arg("device_type"), nb::arg("device_index") = -1)
      .def_static("open", &IpcEvent::open, nb::arg("handle"), nb::arg("device_index") = -1)
      .def("export_handle", &IpcEvent::export_handle)
      .def("record", &IpcEvent::record, nb::arg("stream") = 0)
      .def("wait", &IpcEvent::wait, nb::arg("stream") = 0)
      .def("synchronize", &IpcEvent::synchronize)
      .def("info", &IpcEvent::info)
      .def_prop_ro("handle", &IpcEvent::handle);
  m.attr("IPC_EVENT_HANDLE_BYTES") = HS_IPC_EVENT_HANDLE_BYTES;
}

}  // namespace hisparse_py
