// The CPU backend's data-movement kernels: plain loops in entry order, the
// reference the CUDA kernels are compared with byte for byte.
#pragma once

#include "core/data_movement_params.hpp"

namespace hisparse {

void gather_compact_reference(const GatherCompactParams& params);
void gather_plan_reference(const GatherPlanParams& params);
void invalidate_written_slots_reference(const InvalidateSlotsParams& params);
void mirror_rows_reference(const MirrorRowsParams& params);
void swap_blocks_batch_reference(const SwapBlocksParams& params);
void warm_host_pages_reference(const WarmHostPagesParams& params);

}  // namespace hisparse
