// C ABI of the data-movement kernels: each entry point reads its arguments,
// has the core check them (core/data_movement.hpp) and runs the backend of
// the executing device.
#include <vector>

#include "abi/api_guard.hpp"
#include "core/backend.hpp"
#include "core/data_movement.hpp"

using namespace hisparse;

extern "C" {

HS_API const char* hs_gather_variant_name(int32_t variant) { return gather_variant_name(variant); }

HS_API int32_t hs_gather_default_variant(void) { return gather_default_variant(); }

HS_API hs_status_t hs_gather_compact(const hs_gather_compact_args_t* args, hs_stream_t stream) {
  return api_guard([&] {
    Device device;
    const GatherCompactParams params =
        gather_compact_params(read_struct<HS_GATHER_COMPACT_ARGS_VERSION>(args, "args"), &device);
    if (params.num_token_rows == 0 || params.top_k == 0) return;
    backend_for(device, "hot_cache").gather_compact(params, stream);
  });
}

HS_API hs_status_t hs_gather_compact_group(const hs_gather_compact_group_args_t* args, hs_stream_t stream) {
  return api_guard([&] {
    Device device;
    const GatherCompactParams params =
        gather_compact_group_params(read_struct<HS_GATHER_COMPACT_GROUP_ARGS_VERSION>(args, "args"), &device);
    if (params.num_token_rows == 0 || params.top_k == 0) return;
    backend_for(device, "hot_caches[0]").gather_compact(params, stream);
  });
}

HS_API hs_status_t hs_gather_plan(const hs_tensor_t* src_rows, const hs_tensor_t* staged, const hs_tensor_t* row_ids,
                                  const hs_tensor_t* dst_rows, const hs_tensor_t* miss_mask, hs_stream_t stream) {
  return api_guard([&] {
    Device device;
    const GatherPlanParams params = gather_plan_params(src_rows, staged, row_ids, dst_rows, miss_mask, &device);
    if (params.count == 0) return;
    backend_for(device, "staged").gather_plan(params, stream);
  });
}

HS_API hs_status_t hs_invalidate_written_slots(const hs_invalidate_written_slots_args_t* args, hs_stream_t stream) {
  return api_guard([&] {
    Device device;
    std::vector<int32_t*> tables;
    const InvalidateSlotsParams p = invalidate_written_slots_params(
        read_struct<HS_INVALIDATE_WRITTEN_SLOTS_ARGS_VERSION>(args, "args"), &tables, &device);
    if (p.num_tables == 0 || p.num_tokens == 0 || p.num_state_rows == 0 || p.hot_size == 0) return;
    backend_for(device, "request_state_indices").invalidate_written_slots(p, stream);
  });
}

HS_API hs_status_t hs_mirror_rows(const hs_tensor_t* src_rows, const hs_tensor_t* host_cache,
                                  const hs_tensor_t* slot_mapping, hs_stream_t stream) {
  return api_guard([&] {
    Device device;
    const MirrorRowsParams params = mirror_rows_params(src_rows, host_cache, slot_mapping, &device);
    if (params.count == 0) return;
    backend_for(device, "src_rows").mirror_rows(params, stream);
  });
}

HS_API hs_status_t hs_swap_blocks_batch(const hs_tensor_t* src, const hs_tensor_t* dst, const hs_tensor_t* sizes,
                                        hs_stream_t stream) {
  return api_guard([&] {
    Device device;
    const SwapBlocksParams params = swap_blocks_params(src, dst, sizes, &device);
    if (params.count == 0) return;
    backend_for(device, "src").swap_blocks_batch(params, stream);
  });
}

HS_API hs_status_t hs_warm_host_pages(const hs_tensor_t* host_cache, const hs_tensor_t* block_table,
                                      const hs_tensor_t* seq_lens, int64_t block_size, int64_t page_bytes,
                                      const hs_tensor_t* out, hs_stream_t stream) {
  return api_guard([&] {
    Device device;
    const WarmHostPagesParams params =
        warm_host_pages_params(host_cache, block_table, seq_lens, block_size, page_bytes, out, &device);
    // With an output to write, an empty table still writes its zeros.
    if (params.out == nullptr && (params.num_requests == 0 || params.table_width == 0)) return;
    backend_for(device, "block_table").warm_host_pages(params, stream);
  });
}

}  // extern "C"
