// Device helpers shared by the row-moving kernels (gather_compact,
// gather_plan, mirror_rows, read_rows, the resolver's copies): 16-byte chunk
// copies of whole rows, with many loads in flight per thread before any
// store.
//
// Why loads before stores: a zero-copy read of host memory over PCIe takes
// a microsecond or more, and a thread that stores each chunk right after
// loading it keeps one or two reads in flight. Issuing U loads first keeps
// U reads in flight per thread. Two lane mappings:
//   warp_copy_rows          consecutive lanes read consecutive 16-byte
//                           chunks, so a warp instruction covers 512
//                           contiguous bytes whenever the rows it spans are
//                           adjacent in memory;
//   warp_copy_rows_by_line  eight lanes read the eight chunks of one
//                           128-byte line of the source, so an instruction
//                           covers four whole lines and no line of a row is
//                           read by two instructions (SMs read host memory a
//                           line at a time; the lanes of a partial first or
//                           last line that lie outside the row stay idle).
// The resolver's copies, a warp moving several rows per pass, are faster by
// line; gather_compact's one row per warp, at its occupancy, measured slower
// by line at large batches (docs/performance.md, "Physical bounds"), so it
// keeps chunk order.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/error.hpp"
#include "cuda/cuda_check.hpp"

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
      const uint8_t* row_src =
          reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(src), row));
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

constexpr int kLineBytes = 128;
constexpr int kChunksPerLine = kLineBytes / kChunkBytes;
constexpr int kLinesPerInstruction = kWarpSize / kChunksPerLine;

// Line slots one row of `chunks` chunks takes: the most 128-byte lines it
// can touch from any 16-byte aligned start (six for 656-byte rows).
__host__ __device__ inline int row_line_slots(int chunks) {
  return (chunks * kChunkBytes + (kLineBytes - kChunkBytes) + kLineBytes - 1) / kLineBytes;
}

// warp_copy_rows' contract, with lanes over the source's lines: a pass of U
// instructions covers 4U line slots, row_line_slots(chunks) per row, from
// the line that holds the row's first source byte (its first destination
// byte for a zero-filled row). Row addresses are 16-byte aligned.
template <int U>
__device__ __forceinline__ void warp_copy_rows_by_line(int n, const uint8_t* src, uint8_t* dst, int chunks, int lane) {
  const int slots = row_line_slots(chunks);
  const int total = n * slots;
  const int row_bytes = chunks * kChunkBytes;
  const int line_of_lane = lane / kChunksPerLine;
  const int byte_in_line = (lane % kChunksPerLine) * kChunkBytes;
  for (int base = 0; base < total; base += U * kLinesPerInstruction) {
    uint4 value[U];
    uint8_t* target[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int slot = base + u * kLinesPerInstruction + line_of_lane;
      const int row = min(slot / slots, n - 1);
      const uint8_t* row_src =
          reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(src), row));
      uint8_t* row_dst = reinterpret_cast<uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(dst), row));
      const uintptr_t anchor = reinterpret_cast<uintptr_t>(row_src != nullptr ? row_src : row_dst);
      // This lane's byte of the row: its line's start within the row's lines, less the bytes of the first line before
      // the row.
      const int offset = (slot - row * slots) * kLineBytes + byte_in_line - static_cast<int>(anchor % kLineBytes);
      const bool in_row = slot < total && offset >= 0 && offset < row_bytes;
      target[u] = in_row && row_dst != nullptr ? row_dst + offset : nullptr;
      value[u] = make_uint4(0, 0, 0, 0);
      if (target[u] != nullptr && row_src != nullptr) value[u] = load_chunk(row_src + offset);
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

// Grid-stride copy of `count` rows of row_bytes in groups of rows_per_group: each warp
// takes a group at a time, and lane e < n asks `row_of(j, src, dst)` for
// row j = first + e of its group (leave src or dst null to skip the row; a
// null src with a dst zero-fills it). Launch shape: row_copy_grid().
template <int kThreads, int kUnroll, typename RowOf>
__device__ __forceinline__ void copy_row_groups(int64_t count, int rows_per_group, int64_t row_bytes, RowOf row_of) {
  const int lane = threadIdx.x % kWarpSize;
  const int chunks = static_cast<int>(row_bytes / kChunkBytes);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / kWarpSize);
  for (int64_t first =
           (blockIdx.x * static_cast<int64_t>(kThreads / kWarpSize) + threadIdx.x / kWarpSize) * rows_per_group;
       first < count; first += warps * rows_per_group) {
    const int n = static_cast<int>(std::min<int64_t>(rows_per_group, count - first));
    const uint8_t* src = nullptr;
    uint8_t* dst = nullptr;
    if (lane < n) row_of(first + lane, src, dst);
    warp_copy_rows<kUnroll>(n, src, dst, chunks, lane);
  }
}

inline int multiprocessor_count() {
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  int count = 0;
  cuda_check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(multiProcessorCount)");
  return count;
}

// Launch shape of copy_row_groups over `count` rows of row_bytes: enough
// blocks of kThreads for every group, but no more than fit on the GPU at
// once (the grid strides). `what` names the kernel in the error for rows
// too long for its int32 chunk indices.
struct RowCopyGrid {
  int rows_per_group = 1;
  unsigned blocks = 0;
};

template <int kThreads, int kUnroll>
RowCopyGrid row_copy_grid(const char* what, int64_t count, int64_t row_bytes) {
  const int64_t chunks = row_bytes / kChunkBytes;
  if (chunks * kWarpSize > INT32_MAX) {
    invalid_argument(what, ": rows of ", row_bytes, " bytes exceed the CUDA kernel's chunk index range");
  }
  RowCopyGrid grid;
  grid.rows_per_group = rows_per_warp_group(static_cast<int>(chunks), kUnroll);
  const int64_t groups = (count + grid.rows_per_group - 1) / grid.rows_per_group;
  const int64_t needed = (groups + kThreads / kWarpSize - 1) / (kThreads / kWarpSize);
  const int64_t resident = static_cast<int64_t>(multiprocessor_count()) * (2048 / kThreads);
  grid.blocks = static_cast<unsigned>(needed < resident ? needed : resident);
  return grid;
}

}  // namespace cuda
}  // namespace hisparse
