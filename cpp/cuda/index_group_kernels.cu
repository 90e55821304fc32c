// CUDA kernels of the index-group state: reset of the hot region and
// invalidation of listed host slots (ascending lists are searched, others
// scanned). One block walks one state row at a
// time (grid-stride over rows), its threads stride over the row's hot slots,
// so memory accesses are coalesced along a row. Both kernels are plain
// launches on the caller's stream: no host sync, no allocation, capturable.
#include <algorithm>
#include <cstdint>

#include "cuda/cuda_kernels.hpp"
#include "cuda/kernel_launch.hpp"

namespace hisparse {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

__global__ void reset_hot_state_kernel(int32_t* __restrict__ device_global_indices, int16_t* __restrict__ lru_slots,
                                       const int16_t* __restrict__ lru_init, int64_t num_state_rows, int32_t hot_size,
                                       int64_t* __restrict__ counters, int32_t num_counters) {
  if (blockIdx.x == 0 && counters != nullptr) {
    for (int32_t i = threadIdx.x; i < num_counters; i += blockDim.x) counters[i] = 0;
  }
  for (int64_t s = blockIdx.x; s < num_state_rows; s += gridDim.x) {
    int32_t* indices = device_global_indices + s * hot_size;
    int16_t* lru = lru_slots + s * hot_size;
    for (int32_t j = threadIdx.x; j < hot_size; j += blockDim.x) {
      indices[j] = -1;
      lru[j] = lru_init[j];
    }
  }
}

// Whether slots[0 .. n) is non-decreasing, decided by the whole block (every
// thread of the block calls it and gets the same answer).
__device__ bool block_slots_ascending(const int32_t* __restrict__ slots, int64_t n) {
  int descending = 0;
  for (int64_t i = threadIdx.x + 1; i < n && !descending; i += blockDim.x) descending = slots[i - 1] > slots[i];
  return __syncthreads_or(descending) == 0;
}

// Duplicate state rows may be handled by two blocks at once: both write -1
// to the same slots, and a slot read after the other block's write is -1,
// whose membership test gives the same result, so the outcome is that of
// the rows handled one after the other whatever the interleaving.
__global__ void invalidate_sorted_slots_kernel(int32_t* __restrict__ device_global_indices, int64_t num_state_rows,
                                               int32_t hot_size, const int32_t* __restrict__ sorted_slots,
                                               int64_t num_slots, const int32_t* __restrict__ state_indices,
                                               int64_t num_state_indices) {
  const bool ascending = block_slots_ascending(sorted_slots, num_slots);
  for (int64_t i = blockIdx.x; i < num_state_indices; i += gridDim.x) {
    const int64_t s = state_indices[i];
    if (s < 0 || s >= num_state_rows) continue;
    int32_t* row = device_global_indices + s * hot_size;
    for (int32_t j = threadIdx.x; j < hot_size; j += blockDim.x) {
      if (slot_listed(sorted_slots, num_slots, row[j], ascending)) row[j] = -1;
    }
  }
}

}  // namespace

void launch_reset_hot_state(const ResetHotStateParams& p, cudaStream_t stream) {
  // At least one block, so that the counters are zeroed even without rows.
  const unsigned blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min(p.num_state_rows, kMaxBlocks)));
  launch_kernel("reset_hot_state kernel launch", reset_hot_state_kernel, blocks, kThreads, 0, stream,
                p.device_global_indices, p.lru_slots, p.lru_init, p.num_state_rows, p.hot_size, p.counters,
                p.num_counters);
}

void launch_invalidate_sorted_slots(const InvalidateSortedSlotsParams& p, cudaStream_t stream) {
  if (p.num_slots == 0 || p.num_state_indices == 0 || p.hot_size == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min(p.num_state_indices, kMaxBlocks));
  launch_kernel("invalidate_sorted_slots kernel launch", invalidate_sorted_slots_kernel, blocks, kThreads, 0, stream,
                p.device_global_indices, p.num_state_rows, p.hot_size, p.sorted_slots, p.num_slots, p.state_indices,
                p.num_state_indices);
}

}  // namespace cuda
}  // namespace hisparse
