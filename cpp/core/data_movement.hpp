// Validation of the data-movement kernels' arguments (DESIGN.md "Data
// movement"): shapes, dtypes, devices, strides, 16-byte alignment and the
// reachability of host memory, checked on the host into the raw params the
// backends read. Device data (the indices inside the tensors) is never read
// here. The C ABI calls these once per call; the runtime calls the pieces it
// needs once per binding (gather_cache_params) or per call (the tensors a
// caller passes in), never for memory the library allocated itself.
#pragma once

#include <cstdint>
#include <vector>

#include "core/data_movement_params.hpp"
#include "core/tensor.hpp"
#include "hisparse/data_movement.h"

namespace hisparse {

// A tensor seen as rows of its last dimension: row i at base + i * pitch.
struct Rows {
  uint8_t* base = nullptr;
  int64_t count = 0;
  int64_t pitch = 0;      // bytes
  int64_t row_bytes = 0;  // bytes
  int64_t extent = 0;     // bytes from base to the end of the last row
};

// Rows of `t`: a last dimension of a positive multiple of 16 bytes at unit
// stride, leading dimensions that flatten to one pitch (a multiple of 16
// bytes), a 16-byte aligned base. Errors name `t`.
Rows rows_of(const TensorArg& t);

// The host cache and hot cache of a gather: `host` (rows as rows_of, the
// dtype and row width of `hot`, host memory or memory of hot's device) and
// `hot` (rows contiguous within a block; a 3-D view must agree with
// hot_block_size and the stride), then that a kernel of hot's device can
// reach both. `hot_block_stride` of 0 means hot_block_size; a smaller
// non-zero value fails naming `stride_name`. Fills device, host, host_rows,
// host_pitch, hot, hot_span_rows, hot_block_size, hot_block_stride and
// row_bytes of *params (the swap-list fields are the caller's) and returns
// hot's device.
Device gather_cache_params(const TensorArg& host, const TensorArg& hot, int64_t hot_block_size,
                           int64_t hot_block_stride, const char* stride_name, GatherCompactParams* params);

// The schedule HS_GATHER_AUTO runs, and the name of each schedule.
int32_t gather_default_variant();
const char* gather_variant_name(int32_t variant);

// Every argument of hs_gather_compact / hs_gather_compact_group, checked;
// *device is the executing device. A call with no token rows or no columns
// has num_token_rows or top_k 0 and launches nothing.
GatherCompactParams gather_compact_params(const hs_gather_compact_args_t& args, Device* device);
GatherCompactParams gather_compact_group_params(const hs_gather_compact_group_args_t& args, Device* device);

GatherPlanParams gather_plan_params(const hs_tensor_t* src_rows, const hs_tensor_t* staged, const hs_tensor_t* row_ids,
                                    const hs_tensor_t* dst_rows, const hs_tensor_t* miss_mask, Device* device);

// The source side of a mirror into host rows already checked (`host`, whose
// dtype and row bytes `src` must have): src_rows on `device`, slot_mapping
// int32 or int64 with one slot per source row. Fills every field of *params
// but host, host_rows and host_pitch.
void mirror_source_params(const TensorArg& src, const TensorArg& slot_mapping, const TensorArg& host,
                          int64_t host_row_bytes, const Device& device, MirrorRowsParams* params);
MirrorRowsParams mirror_rows_params(const hs_tensor_t* src_rows, const hs_tensor_t* host_cache,
                                    const hs_tensor_t* slot_mapping, Device* device);

// The per-call inputs of invalidate_written_slots (request_state_indices,
// req_id_per_token, written_slots: int32 1-D on `device`, the device of
// `reference`); the tables are the caller's.
void invalidation_inputs(const TensorArg& request_state_indices, const TensorArg& req_id_per_token,
                         const TensorArg& written_slots, const Device& device, const char* reference,
                         InvalidateSlotsParams* params);
// Every argument of hs_invalidate_written_slots; `tables` receives the table
// pointers params.tables points to.
InvalidateSlotsParams invalidate_written_slots_params(const hs_invalidate_written_slots_args_t& args,
                                                      std::vector<int32_t*>* tables, Device* device);

SwapBlocksParams swap_blocks_params(const hs_tensor_t* src, const hs_tensor_t* dst, const hs_tensor_t* sizes,
                                    Device* device);

// Every argument of hs_warm_host_pages; *device is the executing device (the
// block table's).
WarmHostPagesParams warm_host_pages_params(const hs_tensor_t* host_cache, const hs_tensor_t* block_table,
                                           const hs_tensor_t* seq_lens, int64_t block_size, int64_t page_bytes,
                                           const hs_tensor_t* out, Device* device);

}  // namespace hisparse
