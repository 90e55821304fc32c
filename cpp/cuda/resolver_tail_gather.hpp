// The second launch of the resolver's automatic gather schedule
// (HS_RESOLVE_GATHER_AUTO, docs/residency.md "Fused gather"): the rows of
// the requests that the resolve launch left uncopied.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/resolve_residency_params.hpp"

namespace hisparse {
namespace cuda {

// Copies, as gather_compact would, the swap entries of every request whose
// assigned misses exceed local_rows (< top_k): the rows the resolve launch
// of params (an AutoGather instantiation with the same local_rows) did not
// copy, on the resolve's stream right after it.
void launch_resolver_tail_gather(const ResolveResidencyParams& params, int32_t local_rows, cudaStream_t stream);

}  // namespace cuda
}  // namespace hisparse
