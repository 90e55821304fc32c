#include "core/config.hpp"

#include <cstddef>

#include "core/backend.hpp"
#include "core/error.hpp"
#include "core/resolver_shared_memory.hpp"

namespace hisparse {

void validate_config(const hs_config_t& c) {
  if (c.top_k < 1) invalid_argument("top_k: expected a positive number of positions, got ", c.top_k);
  if (c.device_buffer_size < 1 || c.device_buffer_size > kMaxDeviceBufferSize) {
    invalid_argument("device_buffer_size: expected 1 <= device_buffer_size <= ", kMaxDeviceBufferSize,
                     " (hot slots are int16), got ", c.device_buffer_size);
  }
  if (c.max_union_rows < c.top_k || c.max_union_rows > c.device_buffer_size) {
    invalid_argument("max_union_rows: expected top_k (", c.top_k, ") <= max_union_rows <= device_buffer_size (",
                     c.device_buffer_size, "), got ", c.max_union_rows);
  }
  if (c.row_bytes <= 0 || c.row_bytes % 16 != 0) {
    invalid_argument("row_bytes: hisparse requires 16-byte aligned KV rows, got ", c.row_bytes, " B");
  }
  if (c.block_size < 1) invalid_argument("block_size: expected a positive number of tokens, got ", c.block_size);
  if (c.hot_block_size < 1) {
    invalid_argument("hot_block_size: expected a positive number of tokens, got ", c.hot_block_size);
  }
  if (c.eager_host_mirror != 0 && c.eager_host_mirror != 1) {
    invalid_argument("eager_host_mirror: expected 0 or 1, got ", c.eager_host_mirror);
  }
}

uint64_t resolver_shared_memory_limit(int device) {
  Backend* cuda = cuda_backend();
  if (cuda == nullptr) fail(HS_ERROR_UNSUPPORTED, "hisparse was built without the CUDA backend");
  return cuda->device_properties(device).max_shared_memory_per_block;
}

uint64_t resolver_workspace_bytes_on_device(int64_t num_state_rows, int32_t device_buffer_size, int32_t max_union_rows,
                                            int device) {
  return resolver_workspace_bytes(num_state_rows, device_buffer_size, max_union_rows,
                                  resolver_shared_memory_limit(device));
}

namespace {

// The arguments of the resolver's size queries.
void check_resolver_shape(int32_t device_buffer_size, int32_t max_union_rows) {
  if (device_buffer_size < 1 || device_buffer_size > kMaxDeviceBufferSize) {
    invalid_argument("device_buffer_size: expected 1 <= device_buffer_size <= ", kMaxDeviceBufferSize, ", got ",
                     device_buffer_size);
  }
  if (max_union_rows < 1 || max_union_rows > device_buffer_size) {
    invalid_argument("max_union_rows: expected 1 <= max_union_rows <= device_buffer_size (", device_buffer_size,
                     "), got ", max_union_rows);
  }
}

}  // namespace
}  // namespace hisparse

using namespace hisparse;

extern "C" {

HS_API hs_status_t hs_config_validate(const hs_config_t* config, int device) {
  return api_guard([&] {
    const hs_config_t& c = require_struct(config, "config", offsetof(hs_config_t, eager_host_mirror) + 4);
    validate_config(c);
    // Every valid shape runs on a CUDA device (with a workspace where it does
    // not fit shared memory); what remains to check is the device itself.
    if (device >= 0) resolver_shared_memory_limit(device);
  });
}

HS_API hs_status_t hs_resolver_shared_memory_bytes(int32_t device_buffer_size, int32_t max_union_rows,
                                                   uint64_t* bytes) {
  return api_guard([&] {
    require_pointer(bytes, "bytes");
    check_resolver_shape(device_buffer_size, max_union_rows);
    *bytes = resolver_shared_layout(device_buffer_size, max_union_rows).total_bytes;
  });
}

HS_API hs_status_t hs_resolver_workspace_bytes(int64_t num_state_rows, int32_t device_buffer_size,
                                               int32_t max_union_rows, int device, uint64_t* bytes) {
  return api_guard([&] {
    require_pointer(bytes, "bytes");
    if (num_state_rows < 0) {
      invalid_argument("num_state_rows: expected a non-negative number of state rows, got ", num_state_rows);
    }
    check_resolver_shape(device_buffer_size, max_union_rows);
    if (device < 0) invalid_argument("device: expected a CUDA device index >= 0, got ", device);
    *bytes = resolver_workspace_bytes_on_device(num_state_rows, device_buffer_size, max_union_rows, device);
  });
}

}  // extern "C"
