// Header-only C++ layer over hisparse/shared_host_pool.h: the shared pool id,
// a RAII shared host pool and interprocess events. Included by hisparse.hpp.
#ifndef HISPARSE_SHARED_HOST_POOL_HPP_
#define HISPARSE_SHARED_HOST_POOL_HPP_

#include <cstddef>
#include <cstdint>
#include <utility>

#include "hisparse/hisparse.hpp"
#include "hisparse/shared_host_pool.h"

namespace hs {

// A new shared pool id; send its bytes (id.internal) to every rank.
inline hs_shared_pool_id_t create_shared_pool_id() {
  hs_shared_pool_id_t id{};
  check(hs_shared_pool_id_create(&id));
  return id;
}

inline hs_shared_host_pool_options_t shared_host_pool_options(uint64_t size_bytes) {
  hs_shared_host_pool_options_t options;
  hs_shared_host_pool_options_init(&options);
  options.size_bytes = size_bytes;
  return options;
}

// This rank's view of a pool shared by the ranks of one id (collective
// construction, see hs_shared_host_pool_create): an hs::HostPool, released
// when destroyed, that also tells its sharing facts.
class SharedHostPool : public HostPool {
 public:
  SharedHostPool(const hs_shared_pool_id_t& id, int rank, int nranks, uint64_t size_bytes)
      : SharedHostPool(id, rank, nranks, shared_host_pool_options(size_bytes)) {}
  SharedHostPool(const hs_shared_pool_id_t& id, int rank, int nranks, const hs_shared_host_pool_options_t& options)
      : HostPool(create(id, rank, nranks, options)) {}

  hs_shared_host_pool_info_t shared_info() const {
    hs_shared_host_pool_info_t info{};
    info.struct_size = sizeof(info);
    check(hs_shared_host_pool_get_info(get(), &info));
    return info;
  }
  bool is_writer() const { return shared_info().is_writer != 0; }

 private:
  static hs_host_pool_t create(const hs_shared_pool_id_t& id, int rank, int nranks,
                               const hs_shared_host_pool_options_t& options) {
    hs_host_pool_t pool = nullptr;
    check(hs_shared_host_pool_create(&id, rank, nranks, &options, &pool));
    return pool;
  }
};

// An interprocess event that this object owns (created or imported). Let it
// outlive the runtimes and caches that hold it: while one does,
// hs_ipc_event_destroy refuses, so the event would stay allocated.
class IpcEvent {
 public:
  explicit IpcEvent(hs_device_type_t device_type = HS_DEVICE_CPU, int device_index = -1) {
    check(hs_ipc_event_create(device_type, device_index, &handle_));
  }
  // Opens an event another process exported.
  static IpcEvent import(const hs_ipc_event_handle_t& handle, int device_index = -1) {
    IpcEvent event(nullptr);
    check(hs_ipc_event_import(&handle, device_index, &event.handle_));
    return event;
  }
  ~IpcEvent() { hs_ipc_event_destroy(handle_); }
  IpcEvent(IpcEvent&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  IpcEvent& operator=(IpcEvent&& other) noexcept {
    if (this != &other) {
      hs_ipc_event_destroy(handle_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  IpcEvent(const IpcEvent&) = delete;
  IpcEvent& operator=(const IpcEvent&) = delete;

  hs_ipc_event_handle_t export_handle() const {
    hs_ipc_event_handle_t handle{};
    check(hs_ipc_event_export(handle_, &handle));
    return handle;
  }
  void record(hs_stream_t stream = nullptr) { check(hs_ipc_event_record(handle_, stream)); }
  void wait(hs_stream_t stream = nullptr) { check(hs_ipc_event_wait(handle_, stream)); }
  void synchronize() { check(hs_ipc_event_synchronize(handle_)); }
  hs_ipc_event_info_t info() const {
    hs_ipc_event_info_t info{};
    info.struct_size = sizeof(info);
    check(hs_ipc_event_get_info(handle_, &info));
    return info;
  }
  hs_ipc_event_t get() const { return handle_; }

 private:
  explicit IpcEvent(std::nullptr_t) {}
  hs_ipc_event_t handle_ = nullptr;
};

}  // namespace hs

#endif  // HISPARSE_SHARED_HOST_POOL_HPP_
