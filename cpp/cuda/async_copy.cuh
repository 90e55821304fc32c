// Block-wide copies of rows between global and shared memory.
//
// start_*_row_copy issue asynchronous copies (cp.async, sm_80 and later)
// that hold no registers while they fly, one commit group per call;
// wait_async_copies completes them for the calling thread only, so a block
// barrier must follow before other threads read what landed. Before sm_80
// the same calls copy synchronously.
//
// Each function is called by all kBlockThreads threads of the block with
// the same arguments; thread i takes elements (or 16-byte vectors) i,
// i + kBlockThreads, ... Shared-memory sides are 16-byte aligned.
#pragma once

#include <cstdint>

namespace hisparse {
namespace cuda {

// Starts copying n int32 from global to shared memory, as one commit group.
template <int kBlockThreads>
__device__ __forceinline__ void start_int32_row_copy(int32_t* dst, const int32_t* src, int32_t n) {
#if __CUDA_ARCH__ >= 800
  const uint32_t shared = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  if (n % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
#pragma unroll 1
    for (int32_t v = threadIdx.x; v < n / 4; v += kBlockThreads) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared + 16 * v), "l"(src + 4 * v));
    }
  } else {
    for (int32_t i = threadIdx.x; i < n; i += kBlockThreads) {
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(shared + 4 * i), "l"(src + i));
    }
  }
  asm volatile("cp.async.commit_group;\n" ::);
#else
  for (int32_t i = threadIdx.x; i < n; i += kBlockThreads) dst[i] = src[i];
#endif
}

// The same for n int16 (cp.async moves 4, 8 or 16 bytes, so rows that are
// not 16-byte granular are copied synchronously); one commit group too.
template <int kBlockThreads>
__device__ __forceinline__ void start_int16_row_copy(int16_t* dst, const int16_t* src, int32_t n) {
#if __CUDA_ARCH__ >= 800
  if (n % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    const uint32_t shared = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
#pragma unroll 1
    for (int32_t v = threadIdx.x; v < n / 8; v += kBlockThreads) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared + 16 * v), "l"(src + 8 * v));
    }
  } else {
    for (int32_t i = threadIdx.x; i < n; i += kBlockThreads) dst[i] = src[i];
  }
  asm volatile("cp.async.commit_group;\n" ::);
#else
  for (int32_t i = threadIdx.x; i < n; i += kBlockThreads) dst[i] = src[i];
#endif
}

// One 16-byte copy from global memory `src` to shared memory: asynchronous
// (not committed; see commit_async_copies) from sm_80 on, where
// `shared_dst` is its shared-state-space address; synchronous to the
// generic address `dst` of the same bytes before.
__device__ __forceinline__ void start_chunk_copy_to_shared(uint32_t shared_dst, void* dst, const void* src) {
#if __CUDA_ARCH__ >= 800
  (void)dst;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_dst), "l"(src));
#else
  (void)shared_dst;
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
#endif
}

// Closes the async copies issued since the last commit into one group.
__device__ __forceinline__ void commit_async_copies() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits for all but the `pending` most recently committed copy groups.
template <int pending>
__device__ __forceinline__ void wait_async_copies() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
#endif
}

// Copies n int16 between a global row and shared memory (either way round),
// synchronously, with 16-byte accesses when both sides allow it.
template <int kBlockThreads>
__device__ __forceinline__ void copy_int16_row(int16_t* dst, const int16_t* src, int32_t n) {
  if (n % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    const int32_t vectors = n / 8;
#pragma unroll 1
    for (int32_t v = threadIdx.x; v < vectors; v += kBlockThreads) {
      reinterpret_cast<uint4*>(dst)[v] = reinterpret_cast<const uint4*>(src)[v];
    }
  } else {
    for (int32_t i = threadIdx.x; i < n; i += kBlockThreads) dst[i] = src[i];
  }
}

// Pulls the 128-byte lines of n int32 into this SM's L1, so that scattered
// __ldg reads of the row later hit L1 instead of waiting on L2 or DRAM.
template <int kBlockThreads>
__device__ __forceinline__ void prefetch_int32_row(const int32_t* row, int32_t n) {
#if defined(__CUDA_ARCH__)
  const uintptr_t begin = reinterpret_cast<uintptr_t>(row) & ~uintptr_t{127};
  const uintptr_t end = reinterpret_cast<uintptr_t>(row + n);
#pragma unroll 1
  for (uintptr_t line = begin + 128 * threadIdx.x; line < end; line += 128 * kBlockThreads) {
    asm volatile("prefetch.global.L1 [%0];\n" ::"l"(line));
  }
#else
  (void)row;
  (void)n;
#endif
}

}  // namespace cuda
}  // namespace hisparse
