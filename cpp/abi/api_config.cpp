// C ABI of the configuration: validation, defaults, the resolver's shared
// memory and the host layout sizing.
#include "abi/api_guard.hpp"
#include "core/backend.hpp"
#include "core/config.hpp"
#include "core/layout.hpp"
#include "core/resolver_shared_memory.hpp"

using namespace hisparse;

extern "C" {

HS_API hs_status_t hs_config_validate(const hs_config_t* config, int device) {
  return api_guard([&] {
    const hs_config_t c = resolve_config(read_struct<HS_CONFIG_VERSION>(config, "config"));
    if (device < 0) return;
    Backend& cuda = backend_for(Device{Device::kCuda, device}, "device");
    check_resolver_shared_memory(cuda, device, c.device_buffer_size, c.max_union_rows);
  });
}

HS_API hs_status_t hs_default_max_union_rows(int32_t top_k, int32_t num_speculative_tokens, int32_t* max_union_rows) {
  return api_guard([&] {
    *require_pointer(max_union_rows, "max_union_rows") = default_max_union_rows(top_k, num_speculative_tokens);
  });
}

HS_API hs_status_t hs_default_max_swap_rows(int32_t max_num_reqs, int32_t num_speculative_tokens,
                                            int32_t* max_swap_rows) {
  return api_guard([&] {
    *require_pointer(max_swap_rows, "max_swap_rows") = default_max_swap_rows(max_num_reqs, num_speculative_tokens);
  });
}

HS_API hs_status_t hs_resolver_shared_memory_bytes(int32_t device_buffer_size, int32_t max_union_rows,
                                                   uint64_t* bytes) {
  return api_guard([&] {
    require_pointer(bytes, "bytes");
    if (device_buffer_size < 1 || device_buffer_size > kMaxDeviceBufferSize) {
      invalid_argument("device_buffer_size: expected 1 <= device_buffer_size <= ", kMaxDeviceBufferSize, ", got ",
                       device_buffer_size);
    }
    if (max_union_rows < 1 || max_union_rows > device_buffer_size) {
      invalid_argument("max_union_rows: expected 1 <= max_union_rows <= device_buffer_size (", device_buffer_size,
                       "), got ", max_union_rows);
    }
    *bytes = resolver_shared_layout(device_buffer_size, max_union_rows).total_bytes;
  });
}

HS_API hs_status_t hs_plan_host_layout(uint64_t page_size_bytes, int64_t block_size, int64_t max_model_len,
                                       uint64_t host_budget_bytes, hs_host_layout_t* layout) {
  return api_guard([&] {
    require_struct_size(layout, "layout");
    const HostLayout plan = plan_host_layout(page_size_bytes, block_size, max_model_len, host_budget_bytes);
    hs_host_layout_t value{};
    value.host_num_blocks = plan.host_num_blocks;
    value.host_block_stride = plan.host_block_stride;
    value.min_host_blocks = plan.min_host_blocks;
    write_struct<HS_HOST_LAYOUT_VERSION>(layout, value);
  });
}

}  // extern "C"
