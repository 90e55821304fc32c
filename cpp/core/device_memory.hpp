// RAII over a backend's streams and allocations, for objects that own
// device memory or initialise it on a stream of their own: each is freed
// with the backend (and device) that made it, on every path.
#pragma once

#include <cstddef>

#include "core/backend.hpp"

namespace hisparse {

// A stream of the object's own, so that initialisation is ordered on its
// device whatever the caller's current device and streams are.
class PrivateStream {
 public:
  PrivateStream(Backend& backend, int device)
      : backend_(backend), device_(device), stream_(backend.create_stream(device)) {}
  ~PrivateStream() { backend_.destroy_stream(stream_, device_); }
  PrivateStream(const PrivateStream&) = delete;
  PrivateStream& operator=(const PrivateStream&) = delete;
  hs_stream_t get() const { return stream_; }

 private:
  Backend& backend_;
  int device_;
  hs_stream_t stream_;
};

// One allocation of `bytes` of the backend's memory on `device`.
class DeviceBuffer {
 public:
  DeviceBuffer(Backend& backend, int device, size_t bytes)
      : backend_(backend), device_(device), data_(backend.allocate(bytes, device)) {}
  ~DeviceBuffer() { backend_.deallocate(data_, device_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T = char>
  T* data() const {
    return static_cast<T*>(data_);
  }

 private:
  Backend& backend_;
  int device_;
  void* data_;
};

}  // namespace hisparse
