#include "core/ipc_event.hpp"

#include <unistd.h>

#include <cstring>

#include "core/error.hpp"
#include "core/random.hpp"

namespace hisparse {
namespace {

constexpr uint32_t kHandleMagic = 0x5645'5348u;  // "HSEV"
constexpr uint16_t kHandleVersion = 1;

struct EncodedHandle {
  uint32_t magic;
  uint16_t version;
  uint16_t device_type;  // hs_device_type_t
  int32_t device_index;  // the exporter's
  uint32_t reserved;
  uint64_t process_nonce;  // with the pid, tells the exporting process apart from every other
  int64_t pid;
  IpcEventPayload payload;
};
static_assert(sizeof(EncodedHandle) <= HS_IPC_EVENT_HANDLE_BYTES, "the handle must fit hs_ipc_event_handle_t");

// Random once per process image. A forked child keeps it but has another
// pid; a process of another pid namespace with the same pid has another one.
uint64_t process_nonce() {
  static const uint64_t nonce = random_u64();
  return nonce;
}

Device resolve_device(int32_t device_type, int32_t device_index, const char* name) {
  if (device_type == HS_DEVICE_CPU) return Device{Device::kCpu, 0};
  if (device_type != HS_DEVICE_CUDA) {
    invalid_argument(name, ": expected HS_DEVICE_CPU (", HS_DEVICE_CPU, ") or HS_DEVICE_CUDA (", HS_DEVICE_CUDA,
                     "), got ", device_type);
  }
  if (device_index < -1) invalid_argument("device_index: expected -1 (current) or a device index, got ", device_index);
  Device device{Device::kCuda, device_index};
  if (device_index == -1) {
    // Without a usable backend, backend_for below says why.
    Backend* cuda = cuda_backend();
    device.index = cuda != nullptr && cuda->available() ? cuda->current_device() : 0;
  }
  backend_for(device, "device_index");
  return device;
}

}  // namespace

IpcEvent::IpcEvent(Backend& backend, const Device& device, Event event, bool imported, int64_t exporter_pid)
    : backend_(backend), device_(device), event_(event), imported_(imported), exporter_pid_(exporter_pid) {}

IpcEvent::~IpcEvent() { backend_.destroy_event(event_, device_.index); }

std::unique_ptr<IpcEvent> IpcEvent::create(int32_t device_type, int32_t device_index) {
  const Device device = resolve_device(device_type, device_index, "device_type");
  Backend& backend = backend_for(device, "device_index");
  Event event = backend.create_ipc_event(device.index);
  return std::unique_ptr<IpcEvent>(new IpcEvent(backend, device, event, false, static_cast<int64_t>(getpid())));
}

std::unique_ptr<IpcEvent> IpcEvent::import(const hs_ipc_event_handle_t& handle, int32_t device_index) {
  EncodedHandle encoded;
  std::memcpy(&encoded, handle.internal, sizeof(encoded));
  if (encoded.magic != kHandleMagic) {
    invalid_argument("handle: these ", HS_IPC_EVENT_HANDLE_BYTES,
                     " bytes are not an interprocess event handle (export one with hs_ipc_event_export and send its "
                     "bytes unchanged)");
  }
  if (encoded.version != kHandleVersion) {
    invalid_argument("handle: a version ", encoded.version, " event handle, this library reads version ",
                     kHandleVersion);
  }
  if (encoded.process_nonce == process_nonce() && encoded.pid == static_cast<int64_t>(getpid())) {
    invalid_argument("handle: this event was exported by this process (pid ", encoded.pid,
                     "); use the event itself (CUDA cannot open an interprocess handle in its own process)");
  }
  const Device device = resolve_device(encoded.device_type, device_index, "handle");
  Backend& backend = backend_for(device, "device_index");
  Event event = backend.import_ipc_event(encoded.payload, device.index);
  return std::unique_ptr<IpcEvent>(new IpcEvent(backend, device, event, true, encoded.pid));
}

hs_ipc_event_handle_t IpcEvent::export_handle() const {
  if (imported_) {
    fail(HS_ERROR_INVALID_STATE, "event: an imported event cannot be exported again; export the original (pid ",
         exporter_pid_, ")");
  }
  EncodedHandle encoded{};
  encoded.magic = kHandleMagic;
  encoded.version = kHandleVersion;
  encoded.device_type = static_cast<uint16_t>(device_.is_cuda() ? HS_DEVICE_CUDA : HS_DEVICE_CPU);
  encoded.device_index = device_.index;
  encoded.process_nonce = process_nonce();
  encoded.pid = exporter_pid_;
  encoded.payload = backend_.export_ipc_event(event_, device_.index);
  hs_ipc_event_handle_t handle{};
  std::memcpy(handle.internal, &encoded, sizeof(encoded));
  return handle;
}

void IpcEvent::record(hs_stream_t stream) { backend_.record_ipc_event(event_, device_.index, stream); }
void IpcEvent::wait(hs_stream_t stream) { backend_.wait_ipc_event(event_, device_.index, stream); }
void IpcEvent::synchronize() { backend_.synchronize_ipc_event(event_, device_.index); }

}  // namespace hisparse
