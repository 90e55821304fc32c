// Validation of the residency resolver's arguments into the raw params the
// backends read (docs/residency.md has the semantics). Each function checks
// one part of a launch on the host (shapes, dtypes, devices, strides,
// scalars; device data is never read) and fills its fields of *params.
// hs_resolve_residency checks every part; an index group or a runtime checks
// the parts its caller gives and fills the rest from memory it owns and
// checked once (the group's state and shared outputs, the runtime's bound
// hot block table and caches).
#pragma once

#include <cstdint>

#include "core/resolve_residency_params.hpp"
#include "core/tensor.hpp"
#include "hisparse/hisparse.h"

namespace hisparse {

// topk_indices: int32 [T, K], unit column stride. Fills topk_indices, its
// row stride, num_tokens, top_k and device, and returns the device: every
// other tensor of the launch must be on it.
Device resolve_topk_params(const TensorArg& topk_indices, ResolveResidencyParams* params);

// req_id_per_token: int32 [>= T]; request_state_indices: int32 [B]. Needs
// num_tokens.
void resolve_batch_params(const TensorArg& req_id_per_token, const TensorArg& request_state_indices,
                          const Device& device, ResolveResidencyParams* params);

// device_global_indices int32 [S, H] and lru_slots int16 [S, H], contiguous.
void resolve_state_params(const TensorArg& device_global_indices, const TensorArg& lru_slots, const Device& device,
                          ResolveResidencyParams* params);

// hot_block_size > 0, hot_block_size <= attention_block_stride <= INT32_MAX,
// 0 <= host_rows <= INT32_MAX, 1 <= max_union_rows <= H. Needs hot_size.
void resolve_scalar_params(int64_t hot_block_size, int64_t attention_block_stride, int64_t host_rows,
                           int64_t max_union_rows, ResolveResidencyParams* params);

// An int32 block table [>= rows, W] with unit column stride on `device`:
// fills *row_stride and *width, returns its data. Errors name `table`.
const int32_t* resolve_block_table(const TensorArg& table, int64_t rows, const Device& device, int64_t* row_stride,
                                   int32_t* width);

// hot_block_table: a block table with at least ceil(H / hot_block_size)
// columns. Needs num_batch_rows, hot_size and hot_block_size.
void resolve_hot_table_params(const TensorArg& hot_block_table, const Device& device, ResolveResidencyParams* params);

// The optional inputs (absent TensorArgs skip): source_block_table with a
// positive block_size, resident_block_table with resident_block_size equal
// to hot_block_size, num_valid_rows int32 with one element. Needs
// num_batch_rows and hot_block_size.
void resolve_optional_params(const TensorArg& source_block_table, int64_t block_size,
                             const TensorArg& resident_block_table, int64_t resident_block_size,
                             const TensorArg& num_valid_rows, const Device& device, ResolveResidencyParams* params);

// One [>= T, K] int32 output with unit column stride, or one [>= T] output:
// fills *row_stride (matrices) and returns the data. Needs num_tokens and top_k.
int32_t* resolve_output_matrix(const TensorArg& out, const Device& device, const ResolveResidencyParams& params,
                               int64_t* row_stride);
int32_t* resolve_output_vector(const TensorArg& out, const Device& device, const ResolveResidencyParams& params);

// stats (optional): int64 [>= HS_NUM_STATS].
void resolve_stats_params(const TensorArg& stats, const Device& device, ResolveResidencyParams* params);

// The fused gather (both tensors absent = off, then gather_hot_block_stride
// must be 0): gather_compact's checks of the two caches, the swap list being
// the launch's own out_swap_* outputs. Needs the outputs and hot_block_size.
void resolve_fused_gather_params(const TensorArg& gather_host_cache, const TensorArg& gather_hot_cache,
                                 int64_t gather_hot_block_stride, const Device& device, ResolveResidencyParams* params);
// The fused gather with caches checked earlier: `gather` holds their fields
// (gather_cache_params); the swap list and sizes come from *params.
void resolve_fused_gather_params(const GatherCompactParams& gather, ResolveResidencyParams* params);

// gather_schedule: an hs_resolve_gather_schedule_t with a fused gather, 0
// without one. Needs fused_gather.
void resolve_gather_schedule(int32_t gather_schedule, ResolveResidencyParams* params);

// The CUDA resolver's workspace (optional), where the launch's shape needs
// one on its device: a contiguous, 16-byte aligned uint8 tensor of at least
// resolver_workspace_bytes for the state rows; not read where the shape fits
// shared memory, nor by the CPU backend. Needs num_state_rows, hot_size and
// max_union_rows.
void resolve_workspace_params(const TensorArg& workspace, const Device& device, ResolveResidencyParams* params);

// The automatic schedule's handoff array (optional): int32 [S, 4]
// contiguous on the launch's device; read only by the CUDA backend's
// automatic schedule. Needs num_state_rows.
void resolve_handoff_params(const TensorArg& handoff, const Device& device, ResolveResidencyParams* params);

// Every argument of hs_resolve_residency, checked; *device is the launch's.
ResolveResidencyParams resolve_residency_params(const hs_resolve_residency_args_t& args, Device* device);

}  // namespace hisparse
