// warm_host_pages: one thread per block-table entry reads one word of every
// page its host block spans (warmed_range, shared with the CPU reference),
// so that the GPU's translations of those pages are warm when a later
// launch reads rows in them. The words are counted and XORed into `out`
// where one is given; the loads are volatile, so they stay without it.
#include <algorithm>
#include <cstdint>

#include "cuda/cuda_check.hpp"
#include "cuda/cuda_kernels.hpp"
#include "cuda/kernel_launch.hpp"

namespace hisparse {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

// One 32-bit word of host (or device) memory, read through to the memory
// system: a load whose value goes unused is still issued.
__device__ __forceinline__ uint32_t read_word(const uint8_t* address) {
#ifdef __CUDA_ARCH__
  uint32_t word;
  asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(word) : "l"(address));
  return word;
#else
  return *reinterpret_cast<const volatile uint32_t*>(address);
#endif
}

// The words of entry `entry` (request-major), XORed into `folded`; returns
// how many were read.
__device__ __forceinline__ int64_t warm_entry(const WarmHostPagesParams& p, int64_t entry, uint32_t& folded) {
  const auto b = static_cast<int32_t>(entry / p.table_width);
  const auto i = static_cast<int32_t>(entry - static_cast<int64_t>(b) * p.table_width);
  const WarmedRange range = warmed_range(p, b, i);
  int64_t words = 0;
  for (int64_t offset = range.first; offset < range.end; offset = next_page_offset(p, offset)) {
    folded ^= read_word(p.host + offset);
    ++words;
  }
  return words;
}

// The block's threads' totals into out: one atomic pair per warp.
__device__ __forceinline__ void add_totals(int64_t* out, int64_t words, uint32_t folded) {
  auto count = static_cast<unsigned long long>(words);
  auto bits = static_cast<unsigned long long>(folded);
  for (int lane_mask = 16; lane_mask > 0; lane_mask >>= 1) {
    count += __shfl_xor_sync(0xFFFFFFFFu, count, lane_mask);
    bits ^= __shfl_xor_sync(0xFFFFFFFFu, bits, lane_mask);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(out), count);
    atomicXor(reinterpret_cast<unsigned long long*>(out + 1), bits);
  }
}

__global__ void __launch_bounds__(kThreads) warm_host_pages_kernel(const WarmHostPagesParams p) {
  const int64_t entries = static_cast<int64_t>(p.num_requests) * p.table_width;
  int64_t words = 0;
  uint32_t folded = 0;
  for (int64_t entry = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; entry < entries;
       entry += static_cast<int64_t>(gridDim.x) * kThreads) {
    words += warm_entry(p, entry, folded);
  }
  if (p.out != nullptr) add_totals(p.out, words, folded);
}

}  // namespace

void launch_warm_host_pages(const WarmHostPagesParams& params, cudaStream_t stream) {
  if (params.out != nullptr) {
    cuda_check(cudaMemsetAsync(params.out, 0, 2 * sizeof(int64_t), stream), "warm_host_pages: clearing out");
  }
  const int64_t entries = static_cast<int64_t>(params.num_requests) * params.table_width;
  if (entries == 0) return;
  const int64_t blocks = std::min((entries + kThreads - 1) / kThreads, kMaxBlocks);
  launch_kernel("warm_host_pages kernel launch", warm_host_pages_kernel, dim3(static_cast<unsigned>(blocks)), kThreads,
                0, stream, params);
}

}  // namespace cuda
}  // namespace hisparse
