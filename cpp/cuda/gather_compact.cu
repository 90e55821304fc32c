// gather_compact: swap list -> hot cache, reading registered host memory
// zero-copy. Four schedules of the same copy (hs_gather_variant_t), all
// writing exactly the bytes of the CPU reference:
//
//   warp_per_row  one warp per swap entry, a load then a store per chunk:
//                 the plain baseline (22-40 GB/s for 656-byte rows).
//   unrolled      a warp takes a group of rows of one token row and issues
//                 all of the group's loads before its stores.
//   persistent    unrolled on a fixed grid (max_blocks, else half the SMs)
//                 that strides over the groups. The default: bounding the
//                 rows in flight bounds the host pages being translated at
//                 once, which is what scattered rows are limited by.
//   sorted        per token row, a block sorts the entries by host slot in
//                 shared memory (bitonic, no allocation) and copies them in
//                 address order as one flat stream of chunks: adjacent host
//                 rows become contiguous 512-byte warp reads that share their
//                 boundary cache lines, and each host page's translation is
//                 used by consecutive requests. A token row can be split over
//                 several blocks that each sort and copy their share.
#include <algorithm>
#include <cstdint>

#include "cuda_check.hpp"
#include "cuda_kernels.hpp"
#include "hisparse/hisparse.h"
#include "row_copy.cuh"

namespace hisparse {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpUnroll = 8;
constexpr int kSortThreads = 512;
constexpr int kSortUnroll = 4;
constexpr uint64_t kInvalidKey = ~0ull;
constexpr int kDefaultSharedBytes = 48 * 1024;

__device__ __forceinline__ int32_t clamped_count(const GatherCompactParams& p, int t) {
  return min(max(p.swap_counts[t], 0), p.top_k);
}

// Source and destination of entry (t, k); dst null = skip, src null = zero-fill.
__device__ __forceinline__ void resolve_entry(const GatherCompactParams& p, int t, int k, const uint8_t** src,
                                              uint8_t** dst) {
  const int64_t h = p.swap_host_rows[t * p.swap_host_row_stride + k];
  const int64_t d = p.swap_device_rows[t * p.swap_device_row_stride + k];
  *src = nullptr;
  *dst = nullptr;
  if (h < 0 || d < 0) return;
  const int64_t offset = hot_row_offset(d, p.hot_block_size, p.hot_block_stride);
  if (offset >= p.hot_span_rows) return;
  *dst = p.hot + offset * p.row_bytes;
  if (h < p.host_rows) *src = p.host + h * p.host_pitch;
}

__global__ void __launch_bounds__(kThreads) gather_warp_per_row_kernel(GatherCompactParams p) {
  const int lane = threadIdx.x % kWarpSize;
  const int k = blockIdx.x * (kThreads / kWarpSize) + threadIdx.x / kWarpSize;
  const int chunks = static_cast<int>(p.row_bytes / kChunkBytes);
  for (int t = blockIdx.y; t < p.num_token_rows; t += gridDim.y) {
    if (k >= clamped_count(p, t)) continue;
    const uint8_t* src;
    uint8_t* dst;
    resolve_entry(p, t, k, &src, &dst);
    if (dst == nullptr) continue;
    for (int c = lane; c < chunks; c += kWarpSize) {
      const uint4 value = src != nullptr ? load_chunk(src + c * kChunkBytes) : make_uint4(0, 0, 0, 0);
      store_chunk(dst + c * kChunkBytes, value);
    }
  }
}

// One group: rows [g * rows_per_group, ...) of token row t, if any are used.
__device__ __forceinline__ void copy_group(const GatherCompactParams& p, int t, int g, int rows_per_group,
                                           int chunks, int lane) {
  const int first = g * rows_per_group;
  const int n = min(rows_per_group, clamped_count(p, t) - first);
  if (n <= 0) return;
  const uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  if (lane < n) resolve_entry(p, t, first + lane, &src, &dst);
  warp_copy_rows<kWarpUnroll>(n, src, dst, chunks, lane);
}

__global__ void __launch_bounds__(kThreads) gather_unrolled_kernel(GatherCompactParams p, int rows_per_group) {
  const int lane = threadIdx.x % kWarpSize;
  const int g = blockIdx.x * (kThreads / kWarpSize) + threadIdx.x / kWarpSize;
  const int chunks = static_cast<int>(p.row_bytes / kChunkBytes);
  for (int t = blockIdx.y; t < p.num_token_rows; t += gridDim.y) copy_group(p, t, g, rows_per_group, chunks, lane);
}

__global__ void __launch_bounds__(kThreads) gather_persistent_kernel(GatherCompactParams p, int rows_per_group) {
  const int lane = threadIdx.x % kWarpSize;
  const int chunks = static_cast<int>(p.row_bytes / kChunkBytes);
  const int64_t groups_per_row = (p.top_k + rows_per_group - 1) / rows_per_group;
  const int64_t total = groups_per_row * p.num_token_rows;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / kWarpSize);
  for (int64_t w = blockIdx.x * (kThreads / kWarpSize) + threadIdx.x / kWarpSize; w < total; w += warps) {
    const int t = static_cast<int>(w / groups_per_row);
    copy_group(p, t, static_cast<int>(w - t * groups_per_row), rows_per_group, chunks, lane);
  }
}

// Ascending bitonic sort of keys[0, n), n a power of two, by the whole block.
__device__ void block_bitonic_sort(uint64_t* keys, int n) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
        const int lo = 2 * i - (i & (stride - 1));
        const int hi = lo + stride;
        const uint64_t a = keys[lo];
        const uint64_t b = keys[hi];
        if ((a > b) == ((lo & size) == 0)) {
          keys[lo] = b;
          keys[hi] = a;
        }
      }
      __syncthreads();
    }
  }
}

// Block `part` of a token row takes its share of the row's used columns,
// [count * part / parts, count * (part + 1) / parts), sorts that share and
// copies it, so a split row costs each block a smaller sort, not the whole.
// Shared memory: keys[capacity] (host slot << 32 | index in the share,
// kInvalidKey for skipped entries), then dst_offset[capacity] (hot row offset
// by index, filled in the same pass as the keys so the copy starts right
// after the sort, without another round trip to the swap list).
__global__ void __launch_bounds__(kSortThreads) gather_sorted_kernel(GatherCompactParams p, int parts, int capacity) {
  extern __shared__ uint64_t shared[];
  uint64_t* keys = shared;
  int64_t* dst_offset = reinterpret_cast<int64_t*>(shared + capacity);
  const int chunks = static_cast<int>(p.row_bytes / kChunkBytes);
  const int part = blockIdx.x % parts;
  const int row_step = gridDim.x / parts;
  for (int t = blockIdx.x / parts; t < p.num_token_rows; t += row_step) {
    const int count = clamped_count(p, t);
    const int first = static_cast<int>(static_cast<int64_t>(count) * part / parts);
    const int size = static_cast<int>(static_cast<int64_t>(count) * (part + 1) / parts) - first;
    if (size == 0) continue;
    int n = 1;
    while (n < size) n <<= 1;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      uint64_t key = kInvalidKey;
      if (i < size) {
        const int64_t h = p.swap_host_rows[t * p.swap_host_row_stride + first + i];
        const int64_t d = p.swap_device_rows[t * p.swap_device_row_stride + first + i];
        const int64_t offset = d >= 0 ? hot_row_offset(d, p.hot_block_size, p.hot_block_stride) : -1;
        if (h >= 0 && d >= 0 && offset < p.hot_span_rows) {
          key = (static_cast<uint64_t>(h) << 32) | static_cast<uint32_t>(i);
          dst_offset[i] = offset;
        }
      }
      keys[i] = key;
    }
    __syncthreads();
    block_bitonic_sort(keys, n);
    // Skipped entries sorted last: the first invalid key ends the used ones.
    int lo = 0, hi = n;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (keys[mid] == kInvalidKey) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    const int used = lo;
    const int total = used * chunks;
    for (int base = 0; base < total; base += kSortUnroll * kSortThreads) {
      uint4 value[kSortUnroll];
      uint8_t* target[kSortUnroll];
#pragma unroll
      for (int u = 0; u < kSortUnroll; ++u) {
        const int c = base + u * kSortThreads + threadIdx.x;
        target[u] = nullptr;
        value[u] = make_uint4(0, 0, 0, 0);
        if (c < total) {
          const int e = c / chunks;
          const int chunk = c - e * chunks;
          const uint64_t key = keys[e];
          const int64_t h = static_cast<int64_t>(key >> 32);
          target[u] = p.hot + dst_offset[key & 0xffffffffu] * p.row_bytes + static_cast<int64_t>(chunk) * kChunkBytes;
          if (h < p.host_rows) value[u] = load_chunk(p.host + h * p.host_pitch + static_cast<int64_t>(chunk) * kChunkBytes);
        }
      }
#pragma unroll
      for (int u = 0; u < kSortUnroll; ++u) {
        if (target[u] != nullptr) store_chunk(target[u], value[u]);
      }
    }
    __syncthreads();  // keys and offsets are rewritten for the next token row
  }
}

// Entries one block sorts at most, rounded up to a power of two.
int sorted_capacity(int top_k, int parts) {
  const int share = (top_k + parts - 1) / parts;
  int capacity = 1;
  while (capacity < share) capacity <<= 1;
  return capacity;
}

// Opt into the dynamic shared memory the sorted kernel needs; false when the
// device cannot give that much (the caller then runs the persistent variant).
bool prepare_sorted(size_t shared_bytes) {
  if (shared_bytes <= static_cast<size_t>(kDefaultSharedBytes)) return true;
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  int limit = 0;
  cuda_check(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "cudaDeviceGetAttribute(maxSharedMemoryPerBlockOptin)");
  if (shared_bytes > static_cast<size_t>(limit)) return false;
  cuda_check(cudaFuncSetAttribute(gather_sorted_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(shared_bytes)),
             "cudaFuncSetAttribute(gather_sorted_kernel)");
  return true;
}

unsigned grid_rows(int32_t rows) { return static_cast<unsigned>(std::min<int32_t>(rows, 65535)); }

// Thread blocks of the persistent and sorted schedules when the caller sets
// no cap: half the SMs. Measured on an H200 (bench/bench_gather.py), more
// concurrent rows only add host-page translations in flight: random
// 656-byte rows ran at 0.35-0.5 of memcpy on every SM and at 0.6-0.77 on 66,
// and local rows lost nothing. The other half stays free for compute.
int64_t automatic_blocks() { return std::max(1, multiprocessor_count() / 2); }

}  // namespace

void launch_gather_compact(const GatherCompactParams& params, cudaStream_t stream) {
  if (params.num_token_rows <= 0 || params.top_k <= 0) return;
  const int64_t chunks = params.row_bytes / kChunkBytes;
  // Chunk indices of one token row are 32-bit inside the kernels.
  if (chunks * params.top_k > INT32_MAX) {
    invalid_argument("gather_compact: rows of ", params.row_bytes, " bytes times ", params.top_k,
                     " swap columns exceed the CUDA kernel's 2^31 chunk index range");
  }
  const int rows_per_group = rows_per_warp_group(static_cast<int>(chunks), kWarpUnroll);
  const int warps_per_block = kThreads / kWarpSize;
  int variant = params.variant;
  if (variant == HS_GATHER_SORTED) {
    // Token rows are split into parts only while that stays within the
    // block budget; past it, blocks stride over whole token rows.
    const int64_t target = params.max_blocks > 0 ? params.max_blocks : automatic_blocks();
    const int64_t rows = params.num_token_rows;
    // Each part needs enough rows to keep its block's loads in flight.
    const int parts = static_cast<int>(std::clamp<int64_t>(target / rows, 1, std::max(1, params.top_k / 32)));
    const int64_t blocks = parts > 1 ? rows * parts : std::min(rows, target);
    const int capacity = sorted_capacity(params.top_k, parts);
    const size_t shared_bytes = static_cast<size_t>(capacity) * (sizeof(uint64_t) + sizeof(int64_t));
    if (prepare_sorted(shared_bytes)) {
      gather_sorted_kernel<<<static_cast<unsigned>(blocks), kSortThreads, shared_bytes, stream>>>(params, parts,
                                                                                                  capacity);
      cuda_check(cudaGetLastError(), "gather_compact (sorted) kernel launch");
      return;
    }
    variant = HS_GATHER_PERSISTENT;
  }
  switch (variant) {
    case HS_GATHER_WARP_PER_ROW: {
      const dim3 grid((params.top_k + warps_per_block - 1) / warps_per_block, grid_rows(params.num_token_rows));
      gather_warp_per_row_kernel<<<grid, kThreads, 0, stream>>>(params);
      break;
    }
    case HS_GATHER_UNROLLED: {
      const int groups = (params.top_k + rows_per_group - 1) / rows_per_group;
      const dim3 grid((groups + warps_per_block - 1) / warps_per_block, grid_rows(params.num_token_rows));
      gather_unrolled_kernel<<<grid, kThreads, 0, stream>>>(params, rows_per_group);
      break;
    }
    default: {
      const int64_t groups = static_cast<int64_t>((params.top_k + rows_per_group - 1) / rows_per_group) *
                             params.num_token_rows;
      const int64_t needed = (groups + warps_per_block - 1) / warps_per_block;
      const int64_t blocks =
          std::min(needed, params.max_blocks > 0 ? static_cast<int64_t>(params.max_blocks) : automatic_blocks());
      gather_persistent_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(params, rows_per_group);
      break;
    }
  }
  cuda_check(cudaGetLastError(), "gather_compact kernel launch");
}

}  // namespace cuda
}  // namespace hisparse
