// CPU references of the prefill-staging kernels (docs/staging.md): plain
// loops in the order the spec states them, the reference the CUDA kernels
// are compared with bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/staging_params.hpp"

namespace hisparse {

// Scratch of staging_remap_reference over `count` entries: the sorted keys.
size_t staging_remap_reference_workspace_bytes(int64_t count);

void staging_remap_reference(const StagingRemapParams& params);
void build_staging_plan_reference(const StagingBuildParams& params);
void staging_gpu_sources_reference(const StagingGpuSourcesParams& params);
void gather_resident_rows_reference(const GatherResidentRowsParams& params);

}  // namespace hisparse
