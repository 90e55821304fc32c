// CPU references of the index-group kernels (reset of the hot-region state,
// invalidation of sorted host slots, the residency hint rebuilt from the
// state). The CUDA kernels match them bit for bit.
#pragma once

#include "core/index_group_params.hpp"

namespace hisparse {

void reset_hot_state_reference(const ResetHotStateParams& params);
void invalidate_sorted_slots_reference(const InvalidateSortedSlotsParams& params);
void build_residency_hint_reference(const ResidencyHintParams& params);

}  // namespace hisparse
