// The C handle behind hs_host_pool_t, shared by the C ABI of the private and
// the shared pool: every hs_host_pool_* call reaches the pool through `pool`,
// whichever kind it is.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include "core/host_pool.hpp"

struct hs_host_pool {
  explicit hs_host_pool(std::unique_ptr<hisparse::HostPool> owned_pool) : owned(std::move(owned_pool)), pool(*owned) {}
  explicit hs_host_pool(const hisparse::HostPoolOptions& options)
      : hs_host_pool(std::make_unique<hisparse::HostPool>(options)) {}
  std::unique_ptr<hisparse::HostPool> owned;
  hisparse::HostPool& pool;
};

namespace hisparse {

// The pool behind a live hs_host_pool_t (see abi/handles.hpp), or a named error.
hs_host_pool& require_pool(hs_host_pool_t pool, const char* name = "pool");
// Lists a pool handle a create call returns.
hs_host_pool_t list_pool(hs_host_pool* pool);

// The backend that registers a pool under `registration` (hs_registration_t)
// and the device it registers with (`device_index` -1 = current), or nullptr
// when the pool stays unregistered. Throws naming the field.
Backend* choose_registrar(int32_t registration, int32_t device_index, int* device);

}  // namespace hisparse
