// Launchers of the CUDA kernels: raw pointers, sizes and a stream in; launch
// errors out as exceptions. Kept apart from the backend glue and bindings.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

#include "resolve_residency_params.hpp"

namespace hisparse {
namespace cuda {

void launch_copy_bytes(void* dst, const void* src, size_t bytes, cudaStream_t stream);
void launch_resolve_residency(const ResolveResidencyParams& params, cudaStream_t stream);

}  // namespace cuda
}  // namespace hisparse
