// Byte copy through device threads: reads registered host memory directly
// (zero-copy) or device memory, 16 bytes per thread where alignment allows.
#include <cstdint>

#include "cuda/cuda_kernels.hpp"
#include "cuda/kernel_launch.hpp"

namespace hisparse {
namespace cuda {
namespace {

__global__ void copy_vectors_kernel(uint4* __restrict__ dst, const uint4* __restrict__ src, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

__global__ void copy_bytes_kernel(uint8_t* __restrict__ dst, const uint8_t* __restrict__ src, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

}  // namespace

void launch_copy_bytes(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  constexpr int kThreads = 256;
  constexpr size_t kMaxBlocks = 4096;
  const bool vectorizable =
      reinterpret_cast<uintptr_t>(dst) % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 && bytes % 16 == 0;
  const size_t items = vectorizable ? bytes / 16 : bytes;
  const unsigned blocks = static_cast<unsigned>(std::min(kMaxBlocks, (items + kThreads - 1) / kThreads));
  if (vectorizable) {
    launch_kernel("copy_bytes kernel launch", copy_vectors_kernel, blocks, kThreads, 0, stream,
                  static_cast<uint4*>(dst), static_cast<const uint4*>(src), items);
  } else {
    launch_kernel("copy_bytes kernel launch", copy_bytes_kernel, blocks, kThreads, 0, stream,
                  static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), items);
  }
}

}  // namespace cuda
}  // namespace hisparse
