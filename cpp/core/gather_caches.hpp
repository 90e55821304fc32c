// The host cache and hot cache of a gather_compact, validated. Shared by
// hs_gather_compact and the fused gather of hs_resolve_residency, so both
// accept exactly the same tensors and fail with the same messages (each
// naming the caller's own argument). Defined in api_data_movement.cpp.
#pragma once

#include <cstdint>

#include "core/data_movement_params.hpp"
#include "core/tensor.hpp"

namespace hisparse {

// Checks `host` (rows of a multiple of 16 bytes at one 16-byte pitch, the
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

}  // namespace hisparse
