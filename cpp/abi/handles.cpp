#include "abi/handles.hpp"

#include <mutex>
#include <unordered_map>

#include "core/backend.hpp"

namespace hisparse {
namespace {

struct HandleList {
  std::mutex mutex;
  std::unordered_map<const void*, HandleKind> live;
};

HandleList& handle_list() {
  static HandleList* list = new HandleList;  // never destroyed: handles may be freed during static teardown
  return *list;
}

}  // namespace

void list_handle(const void* handle, HandleKind kind) {
  HandleList& list = handle_list();
  std::lock_guard<std::mutex> lock(list.mutex);
  list.live[handle] = kind;
}

void unlist_handle(const void* handle) {
  HandleList& list = handle_list();
  std::lock_guard<std::mutex> lock(list.mutex);
  list.live.erase(handle);
}

void require_handle(const void* handle, HandleKind kind, const char* name, const char* type, const HandleKind* also) {
  if (handle == nullptr) invalid_argument(name, ": expected a non-NULL pointer (an ", type, "), got NULL");
  HandleList& list = handle_list();
  std::lock_guard<std::mutex> lock(list.mutex);
  const auto found = list.live.find(handle);
  if (found == list.live.end() || (found->second != kind && (also == nullptr || found->second != *also))) {
    invalid_argument(name, ": not a live ", type,
                     " (never returned by its create call, already destroyed, or a handle of another kind)");
  }
}

bool take_handle(const void* handle, HandleKind kind, const char* name, const char* type) {
  if (handle == nullptr) return false;
  HandleList& list = handle_list();
  std::lock_guard<std::mutex> lock(list.mutex);
  const auto found = list.live.find(handle);
  if (found == list.live.end() || found->second != kind) {
    const HandleKind given = found != list.live.end() ? found->second : kind;
    if (kind == HandleKind::kIndexGroup && given == HandleKind::kRuntimeIndexGroup) {
      invalid_argument(name, ": the index group of a runtime (hs_runtime_get_index_group) lives with its runtimes and "
                             "is not destroyed on its own");
    }
    if (kind == HandleKind::kRuntime && given == HandleKind::kKvCacheRuntime) {
      invalid_argument(name, ": the runtime of a KV cache (hs_kv_cache_get_runtime) lives with its cache and is not "
                             "destroyed on its own");
    }
    invalid_argument(name, ": not a live ", type,
                     " (never returned by its create call, already destroyed, or a handle of another kind)");
  }
  list.live.erase(found);
  return true;
}

Device device_from(int32_t device_type, int32_t device_index, const Device* fallback) {
  Device device;
  if (device_type == HS_DEVICE_CUDA) {
    device.kind = Device::kCuda;
    if (device_index < -1) {
      invalid_argument("device_index: expected -1 (current device) or a device index >= 0, got ", device_index);
    }
    if (device_index >= 0) {
      device.index = device_index;
    } else if (fallback != nullptr && fallback->is_cuda()) {
      device.index = fallback->index;
    } else {
      Backend* cuda = cuda_backend();
      if (cuda == nullptr) {
        fail(HS_ERROR_UNSUPPORTED, "device_type: HS_DEVICE_CUDA, but hisparse was built without the CUDA backend");
      }
      cuda->check_available();
      device.index = cuda->current_device();
    }
  } else if (device_type != HS_DEVICE_CPU) {
    invalid_argument("device_type: expected HS_DEVICE_CPU (", static_cast<int>(HS_DEVICE_CPU), ") or HS_DEVICE_CUDA (",
                     static_cast<int>(HS_DEVICE_CUDA), "), got ", device_type);
  }
  return device;
}

Runtime& bindable_runtime(hs_runtime_t runtime, const char* name) {
  Runtime& r = from_handle(runtime, name);
  HandleList& list = handle_list();
  std::lock_guard<std::mutex> lock(list.mutex);
  if (list.live.at(runtime) == HandleKind::kKvCacheRuntime) {
    invalid_argument(name, ": the runtime of a KV cache (hs_kv_cache_get_runtime) is bound by its cache, and is not "
                           "rebound or unbound on its own");
  }
  return r;
}

}  // namespace hisparse
