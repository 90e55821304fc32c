// Launchers of the CUDA kernels: raw pointers, sizes and a stream in; launch
// errors out as exceptions. Kept apart from the backend glue and bindings.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/data_movement_params.hpp"
#include "core/index_group_params.hpp"
#include "core/kv_params.hpp"
#include "core/resolve_residency_params.hpp"
#include "core/staging_params.hpp"

namespace hisparse {
namespace cuda {

void launch_copy_bytes(void* dst, const void* src, size_t bytes, cudaStream_t stream);
void launch_resolve_residency(const ResolveResidencyParams& params, cudaStream_t stream);
void launch_reset_hot_state(const ResetHotStateParams& params, cudaStream_t stream);
void launch_invalidate_sorted_slots(const InvalidateSortedSlotsParams& params, cudaStream_t stream);
void launch_gather_compact(const GatherCompactParams& params, cudaStream_t stream);
// gather_compact's row_persistent schedule over every token row but a
// request's first one with at most local_rows entries (the resolver's tail
// gather, resolver_tail_gather.hpp).
void launch_gather_compact_tail(const GatherCompactParams& params, const int32_t* req_id_per_token, int32_t local_rows,
                                cudaStream_t stream);
void launch_gather_plan(const GatherPlanParams& params, cudaStream_t stream);
void launch_invalidate_written_slots(const InvalidateSlotsParams& params, cudaStream_t stream);
void launch_mirror_rows(const MirrorRowsParams& params, cudaStream_t stream);
void launch_swap_blocks_batch(const SwapBlocksParams& params, cudaStream_t stream);
void launch_warm_host_pages(const WarmHostPagesParams& params, cudaStream_t stream);
// KV cache (reset_request.cu, prepare_topk.cu, write_rows.cu, read_rows.cu, update_residency.cu).
void launch_reset_request(const ResetRequestParams& params, cudaStream_t stream);
void launch_prepare_topk(const PrepareTopkParams& params, cudaStream_t stream);
void launch_write_rows(const WriteRowsParams& params, cudaStream_t stream);
void launch_read_rows(const ReadRowsParams& params, cudaStream_t stream);
void launch_update_residency(const ResidencyParams& params, cudaStream_t stream);
// Index groups' residency hint (residency_hint.cu).
void launch_build_residency_hint(const ResidencyHintParams& params, cudaStream_t stream);
// Prefill staging (staging.cu). The workspace size asks the current device.
size_t staging_remap_workspace_bytes(int64_t count);
void launch_staging_remap(const StagingRemapParams& params, cudaStream_t stream);
void launch_build_staging_plan(const StagingBuildParams& params, cudaStream_t stream);
void launch_staging_gpu_sources(const StagingGpuSourcesParams& params, cudaStream_t stream);
void launch_gather_resident_rows(const GatherResidentRowsParams& params, cudaStream_t stream);

}  // namespace cuda
}  // namespace hisparse
