// C ABI of the configuration: validation, defaults, the resolver's shared
// memory and the host layout sizing.
#include "abi/api_guard.hpp"
#include "core/backend.hpp"
#include "core/config.hpp"
#include "core/layout.hpp"
#include "core/resolver_shared_memory.hpp"
#include "core/tensor.hpp"

using namespace hisparse;

extern "C" {

HS_API hs_status_t hs_config_validate(const hs_config_t* config, int device) {
  return api_guard([&] {
    resolve_config(read_struct<HS_CONFIG_VERSION>(config, "config"));
    if (device < 0) return;
    // Every valid shape runs on a CUDA device (with a workspace where it does
    // not fit shared memory); what remains to check is the device itself.
    resolver_shared_memory_limit(backend_for(Device{Device::kCuda, device}, "device"), device);
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
    // Rows of a device_global_indices tensor hisparse could be given; it
    // also keeps the product of rows and slice bytes far from overflowing.
    const int64_t max_rows = kMaxTensorBytes / (int64_t{4} * device_buffer_size);
    if (num_state_rows > max_rows) {
      invalid_argument("num_state_rows: expected at most ", max_rows, " state rows (device_global_indices of ",
                       device_buffer_size, " int32 per row within ", kMaxTensorBytes, " bytes), got ", num_state_rows);
    }
    if (device < 0) invalid_argument("device: expected a CUDA device index >= 0, got ", device);
    *bytes = resolver_workspace_bytes_on_device(backend_for(Device{Device::kCuda, device}, "device"), device,
                                                num_state_rows, device_buffer_size, max_union_rows);
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
