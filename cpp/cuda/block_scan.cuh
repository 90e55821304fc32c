// Warp and block prefix sums and reductions over int values.
//
// Warp functions take every lane of a full warp. Block functions take every
// thread of a block of exactly 32 full warps (1024 threads), so that the 32
// warp totals fit one warp: each lane reads one of them. They return in
// thread order (thread i's prefix covers threads 0 .. i-1).
#pragma once

namespace hisparse {
namespace cuda {

constexpr unsigned kFullMask = 0xFFFFFFFFu;

__device__ __forceinline__ int warp_inclusive_sum(int value) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int delta = 1; delta < 32; delta <<= 1) {
    const int other = __shfl_up_sync(kFullMask, value, delta);
    if (lane >= delta) value += other;
  }
  return value;
}

// Warp reductions: one REDUX instruction from sm_80 on.
__device__ __forceinline__ int warp_sum(int value) {
#if __CUDA_ARCH__ >= 800
  return __reduce_add_sync(kFullMask, value);
#else
#pragma unroll
  for (int delta = 16; delta > 0; delta >>= 1) value += __shfl_xor_sync(kFullMask, value, delta);
  return value;
#endif
}
__device__ __forceinline__ int warp_min(int value) {
#if __CUDA_ARCH__ >= 800
  return __reduce_min_sync(kFullMask, value);
#else
#pragma unroll
  for (int delta = 16; delta > 0; delta >>= 1) value = min(value, __shfl_xor_sync(kFullMask, value, delta));
  return value;
#endif
}
__device__ __forceinline__ int warp_max(int value) {
#if __CUDA_ARCH__ >= 800
  return __reduce_max_sync(kFullMask, value);
#else
#pragma unroll
  for (int delta = 16; delta > 0; delta >>= 1) value = max(value, __shfl_xor_sync(kFullMask, value, delta));
  return value;
#endif
}

// Inclusive prefix sum over the lanes of values in [0, 2^Bits): one ballot
// per bit instead of five dependent shuffles.
template <int Bits>
__device__ __forceinline__ int warp_inclusive_sum_small(int value) {
  const unsigned up_to_lane = kFullMask >> (31 - (threadIdx.x & 31));
  int sum = 0;
#pragma unroll
  for (int bit = 0; bit < Bits; ++bit) {
    sum += __popc(__ballot_sync(kFullMask, (value >> bit) & 1) & up_to_lane) << bit;
  }
  return sum;
}

// Exclusive prefix sum over the block's threads, plus the block total
// (*block_total), from each thread's value and its inclusive prefix within
// the warp. `warp_totals` is 32 ints of shared memory. Contains the one
// barrier between writing `warp_totals` and reading it; the caller keeps a
// barrier between this read and the next write of the buffer.
__device__ __forceinline__ int block_exclusive_sum_from_warp(int value, int inclusive, int* warp_totals,
                                                             int* block_total) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  // Every warp sums the warp totals itself (two reductions, no second
  // barrier): lane i holds warp i's total.
  const int total = warp_totals[lane];
  *block_total = warp_sum(total);
  return warp_sum(lane < warp ? total : 0) + inclusive - value;
}

__device__ __forceinline__ int block_exclusive_sum(int value, int* warp_totals, int* block_total) {
  return block_exclusive_sum_from_warp(value, warp_inclusive_sum(value), warp_totals, block_total);
}

// The same for values in [0, 2^Bits).
template <int Bits>
__device__ __forceinline__ int block_exclusive_sum_small(int value, int* warp_totals, int* block_total) {
  return block_exclusive_sum_from_warp(value, warp_inclusive_sum_small<Bits>(value), warp_totals, block_total);
}

}  // namespace cuda
}  // namespace hisparse
