// One way to launch a kernel of the CUDA backend: cudaLaunchKernelEx, whose
// typed overload checks the arguments against the kernel's parameters (nvcc
// includes it in every .cu). The CPU emulation of the CUDA execution model
// (tests/cpp/emulated) answers the same call, so a kernel launched this way
// can have its source run on the host against the CPU reference.
#pragma once

#include <cstddef>
#include <utility>

#include <cuda_runtime_api.h>

#include "cuda/cuda_check.hpp"

namespace hisparse {
namespace cuda {

// Launches `kernel(args...)` on `stream` over `grid` blocks of `block`
// threads with `shared_bytes` of dynamic shared memory; a launch the runtime
// refuses throws an Error naming `what`, and leaves no error behind for a
// later cudaGetLastError to report as its own.
template <class... Params, class... Args>
void launch_kernel(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  const cudaError_t result = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (result != cudaSuccess) cudaGetLastError();
  cuda_check(result, what);
}

}  // namespace cuda
}  // namespace hisparse
