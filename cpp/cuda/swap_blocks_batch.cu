// swap_blocks_batch: a batch of (src, dst, bytes) copies done by one kernel
// reading the address arrays from device memory, so the batch is
// stream-ordered and capturable (cudaMemcpyAsync per block is neither fast
// nor free of host work). Each copy is spread over kSplit blocks; the widest
// access that the three values' alignment allows is used.
#include <algorithm>
#include <cstdint>

#include "cuda/cuda_kernels.hpp"
#include "cuda/kernel_launch.hpp"

namespace hisparse {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kSplit = 4;
constexpr int64_t kMaxGridX = 1 << 20;

template <typename Word>
__device__ __forceinline__ void copy_words(uint8_t* dst, const uint8_t* src, int64_t bytes) {
  const int64_t words = bytes / static_cast<int64_t>(sizeof(Word));
  const int64_t step = static_cast<int64_t>(gridDim.y) * kThreads;
  for (int64_t i = blockIdx.y * static_cast<int64_t>(kThreads) + threadIdx.x; i < words; i += step) {
    reinterpret_cast<Word*>(dst)[i] = reinterpret_cast<const Word*>(src)[i];
  }
}

__global__ void __launch_bounds__(kThreads)
    swap_blocks_batch_kernel(const int64_t* src, const int64_t* dst, const int64_t* sizes, int64_t count) {
  for (int64_t i = blockIdx.x; i < count; i += gridDim.x) {
    const int64_t bytes = sizes[i];
    const uint64_t from = static_cast<uint64_t>(src[i]);
    const uint64_t to = static_cast<uint64_t>(dst[i]);
    if (bytes <= 0 || from == 0 || to == 0) continue;
    auto* d = reinterpret_cast<uint8_t*>(to);
    const auto* s = reinterpret_cast<const uint8_t*>(from);
    const uint64_t alignment = from | to | static_cast<uint64_t>(bytes);
    if (alignment % 16 == 0) {
      copy_words<uint4>(d, s, bytes);
    } else if (alignment % 8 == 0) {
      copy_words<uint2>(d, s, bytes);
    } else if (alignment % 4 == 0) {
      copy_words<uint32_t>(d, s, bytes);
    } else {
      copy_words<uint8_t>(d, s, bytes);
    }
  }
}

}  // namespace

void launch_swap_blocks_batch(const SwapBlocksParams& params, cudaStream_t stream) {
  if (params.count <= 0) return;
  const dim3 grid(static_cast<unsigned>(std::min(params.count, kMaxGridX)), kSplit);
  launch_kernel("swap_blocks_batch kernel launch", swap_blocks_batch_kernel, grid, kThreads, 0, stream, params.src,
                params.dst, params.sizes, params.count);
}

}  // namespace cuda
}  // namespace hisparse
