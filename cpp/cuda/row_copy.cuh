// Device helpers shared by the row-moving kernels (gather_compact,
// gather_plan, mirror_rows): 16-byte chunk copies of whole rows, with many
// loads in flight per thread before any store.
//
// Why loads before stores: a zero-copy read of host memory over PCIe takes
// a microsecond or more, and a thread that stores each chunk right after
// loading it keeps one or two reads in flight. Issuing U loads first keeps
// U reads in flight per thread; consecutive lanes read consecutive 16-byte
// chunks, so a warp instruction covers 512 contiguous bytes whenever the
// rows it spans are adjacent in memory.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "cuda_check.hpp"

namespace hisparse {
namespace cuda {

constexpr int kWarpSize = 32;
constexpr int kChunkBytes = 16;

__device__ __forceinline__ uint4 load_chunk(const uint8_t* src) { return *reinterpret_cast<const uint4*>(src); }
__device__ __forceinline__ void store_chunk(uint8_t* dst, const uint4& value) {
  *reinterpret_cast<uint4*>(dst) = value;
}

// The warp copies `n` (1..32) rows of `chunks` 16-byte chunks each. Lane e < n
// holds row e: `dst` (null = skip the row) and `src` (null = zero-fill).
// Every lane of the warp must call this with the same n and chunks.
template <int U>
__device__ __forceinline__ void warp_copy_rows(int n, const uint8_t* src, uint8_t* dst, int chunks, int lane) {
  const int total = n * chunks;
  for (int base = 0; base < total; base += U * kWarpSize) {
    uint4 value[U];
    uint8_t* target[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = base + u * kWarpSize + lane;
      const int row = min(c / chunks, n - 1);
      const int chunk = c - row * chunks;
      const uint8_t* row_src = reinterpret_cast<const uint8_t*>(
          __shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(src), row));
      uint8_t* row_dst = reinterpret_cast<uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(dst), row));
      target[u] = (c < total && row_dst != nullptr) ? row_dst + static_cast<int64_t>(chunk) * kChunkBytes : nullptr;
      value[u] = make_uint4(0, 0, 0, 0);
      if (target[u] != nullptr && row_src != nullptr) {
        value[u] = load_chunk(row_src + static_cast<int64_t>(chunk) * kChunkBytes);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (target[u] != nullptr) store_chunk(target[u], value[u]);
    }
  }
}

// Rows per warp group so that one pass of U loads per lane covers them.
__host__ __device__ inline int rows_per_warp_group(int chunks, int unroll) {
  const int rows = (unroll * kWarpSize) / chunks;
  return rows < 1 ? 1 : (rows > kWarpSize ? kWarpSize : rows);
}

inline int multiprocessor_count() {
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  int count = 0;
  cuda_check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(multiProcessorCount)");
  return count;
}

}  // namespace cuda
}  // namespace hisparse
