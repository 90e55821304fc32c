// An interprocess event (the seed's create_ipc_event, export_event and
// import_event): the writer of a shared host pool records it after its
// mirror, the readers make their streams wait on it before their gathers.
// The contract, including what the CPU backend's events mean and what is
// capturable, is in hisparse/shared_host_pool.h.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "core/backend.hpp"
#include "core/tensor.hpp"
#include "hisparse/shared_host_pool.h"

namespace hisparse {

class IpcEvent {
 public:
  // A new event on device_type (HS_DEVICE_CPU or HS_DEVICE_CUDA) and
  // device_index (CUDA; -1 = current). Throws naming the argument.
  static std::unique_ptr<IpcEvent> create(int32_t device_type, int32_t device_index);
  // Opens an exported event on device_index (CUDA; -1 = current). Throws
  // naming `handle` for bytes that are not a handle or come from this process.
  static std::unique_ptr<IpcEvent> import(const hs_ipc_event_handle_t& handle, int32_t device_index);
  ~IpcEvent();
  IpcEvent(const IpcEvent&) = delete;
  IpcEvent& operator=(const IpcEvent&) = delete;

  // HS_ERROR_INVALID_STATE for an imported event.
  hs_ipc_event_handle_t export_handle() const;
  void record(hs_stream_t stream);
  void wait(hs_stream_t stream);
  void synchronize();

  const Device& device() const { return device_; }
  bool imported() const { return imported_; }
  int64_t exporter_pid() const { return exporter_pid_; }

  // The runtimes that hold the event (set_host_sharing, which a KV cache's
  // host_event goes through): hs_ipc_event_destroy refuses while any does.
  void borrow() { borrowers_.fetch_add(1, std::memory_order_relaxed); }
  void give_back() { borrowers_.fetch_sub(1, std::memory_order_relaxed); }
  int borrowers() const { return borrowers_.load(std::memory_order_relaxed); }

 private:
  IpcEvent(Backend& backend, const Device& device, Event event, bool imported, int64_t exporter_pid);

  Backend& backend_;
  Device device_;
  Event event_;
  bool imported_;
  int64_t exporter_pid_;
  std::atomic<int> borrowers_{0};
};

}  // namespace hisparse
