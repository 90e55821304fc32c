// The CPU reference of residency resolution: sequential, written to be read
// next to docs/residency.md. The CUDA kernel must match it bit for bit.
#pragma once

#include "core/resolve_residency_params.hpp"

namespace hisparse {

void resolve_residency_reference(const ResolveResidencyParams& params);

}  // namespace hisparse
