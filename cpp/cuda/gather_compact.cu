// gather_compact: swap list -> hot cache, reading registered host memory
// zero-copy. Three schedules of the same copy (hs_gather_variant_t), all
// writing exactly the bytes of the CPU reference:
//
//   warp_per_row    one warp per swap entry, a load then a store per chunk:
//                   the plain grid of K x R warps.
//   row_persistent  one warp per used entry, all of a row's loads before
//                   its stores, on a fixed grid (max_blocks, else one block
//                   per SM) that strides over the used entries. The default:
//                   it holds up for misses local to each request (the decode
//                   case) without a sorting pass or shared-memory staging.
//   group           (hs_gather_compact_group) row_persistent for a slot of
//                   several layers' rows side by side: one contiguous read
//                   of all pieces, each piece written to its own hot cache.
//   sorted          per token row, a block sorts the entries by host slot in
//                   shared memory (bitonic, no allocation) and copies them
//                   in address order as one flat stream of chunks: adjacent
//                   host rows become contiguous 512-byte warp reads that
//                   share their boundary cache lines, and each host page's
//                   translation is used by consecutive requests. A token row
//                   can be split over several blocks that each sort and copy
//                   their share. Rows scattered over the pool gain most.
//
// row_persistent, group and sorted hand out only used work: per window of
// token rows, every block scans the clamped counts into a shared-memory
// prefix of work units (entries, or sort shares), and its warps (sorted: the
// block) take units round-robin, finding a unit's token row by binary search
// in the prefix. A launch then costs a scan of R counts plus the used
// entries, not R x K count reads. Windows bound the shared memory for any R;
// the unit numbering continues across windows, so the round-robin is the same
// as over one prefix of all rows.
#include <algorithm>
#include <cstdint>

#include "cuda/cuda_check.hpp"
#include "cuda/cuda_kernels.hpp"
#include "cuda/kernel_launch.hpp"
#include "cuda/row_copy.cuh"
#include "hisparse/hisparse.h"

namespace hisparse {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpUnroll = 8;
constexpr int kSortThreads = 512;
constexpr int kSortUnroll = 4;
constexpr uint64_t kInvalidKey = ~0ull;
constexpr int kDefaultSharedBytes = 48 * 1024;
// Token rows per prefix window: rows per thread x threads. 16 KiB of
// row_persistent's shared memory; sorted's window is smaller so that its
// prefix plus a 2048-entry share still fits in the default 48 KiB.
constexpr int kPersistentRowsPerThread = 16;
constexpr int kPersistentWindow = kPersistentRowsPerThread * kThreads;
constexpr int kSortRowsPerThread = 2;
constexpr int kSortWindow = kSortRowsPerThread * kSortThreads;
// Fewest entries a sort share takes while a row is split over blocks, so
// that each block still has enough rows to keep its loads in flight.
constexpr int kMinSortShare = 32;

__device__ __forceinline__ int32_t clamped_count(const GatherCompactParams& p, int t) {
  return min(max(p.swap_counts[t], 0), p.top_k);
}

// ceil(a / b) for a >= 0, b > 0, without overflow near INT32_MAX.
__device__ __forceinline__ int32_t ceil_div(int32_t a, int32_t b) { return a / b + (a % b != 0); }

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

// Exclusive prefix of units(t) over token rows [t0, t0 + n) into prefix[0, n],
// n <= kBlockThreads * kRowsPerThread; returns prefix[n], the window's units.
// Thread j takes ceil(n / threads) consecutive rows, so the block scan runs
// over one partial sum per thread. Every thread of the block calls this; the
// caller syncs before it when prefix or warp_sums were read since the last call.
template <int kBlockThreads, int kRowsPerThread, typename Units>
__device__ int32_t window_prefix(int32_t t0, int n, int32_t* prefix, int32_t* warp_sums, Units units) {
  constexpr int kWarps = kBlockThreads / kWarpSize;
  static_assert(kWarps <= kWarpSize, "one warp scans the warp sums");
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int per = (n + kBlockThreads - 1) / kBlockThreads;
  const int first = static_cast<int>(threadIdx.x) * per;
  int32_t own[kRowsPerThread];
  int32_t sum = 0;
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    own[i] = (i < per && first + i < n) ? units(t0 + first + i) : 0;
    sum += own[i];
  }
  int32_t inclusive = sum;
#pragma unroll
  for (int d = 1; d < kWarpSize; d <<= 1) {
    const int32_t up = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += up;
  }
  if (lane == kWarpSize - 1) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int32_t total = lane < kWarps ? warp_sums[lane] : 0;
#pragma unroll
    for (int d = 1; d < kWarpSize; d <<= 1) {
      const int32_t up = __shfl_up_sync(0xffffffffu, total, d);
      if (lane >= d) total += up;
    }
    if (lane < kWarps) warp_sums[lane] = total;
  }
  __syncthreads();
  int32_t running = (warp > 0 ? warp_sums[warp - 1] : 0) + inclusive - sum;
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    if (i < per && first + i < n) {
      prefix[first + i] = running;
      running += own[i];
    }
  }
  if (threadIdx.x == 0) prefix[n] = warp_sums[kWarps - 1];
  __syncthreads();
  return prefix[n];
}

// The row r in [0, n) with prefix[r] <= unit < prefix[r + 1] (unit < prefix[n]):
// the last row whose prefix does not exceed the unit, which skips rows of no units.
__device__ __forceinline__ int find_row(const int32_t* prefix, int n, int32_t unit) {
  int lo = 0;
  int hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (prefix[mid] <= unit) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// First unit of a window that worker `worker` of `workers` takes when units are
// dealt round-robin from the first window on and `before` units came earlier.
__device__ __forceinline__ int64_t first_unit(int64_t worker, int64_t workers, int64_t before) {
  return ((worker - before % workers) % workers + workers) % workers;
}

// Every warp of a persistent grid visits its share of the used work units
// of all token rows: units(t) per token row t, dealt round-robin over the
// grid's warps, window by window; body(t, unit index within row t).
// window_rows (<= kPersistentWindow) keeps a window's unit count in int32.
template <typename Units, typename Body>
__device__ void for_each_used_unit(int32_t num_token_rows, int window_rows, Units units, Body body) {
  __shared__ int32_t prefix[kPersistentWindow + 1];
  __shared__ int32_t warp_sums[kThreads / kWarpSize];
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / kWarpSize);
  const int64_t worker = static_cast<int64_t>(blockIdx.x) * (kThreads / kWarpSize) + threadIdx.x / kWarpSize;
  int64_t before = 0;
  // 64-bit so that the last window's step cannot overflow for R near 2^31.
  for (int64_t window = 0; window < num_token_rows; window += window_rows) {
    const int32_t t0 = static_cast<int32_t>(window);
    const int n = static_cast<int>(min(static_cast<int64_t>(window_rows), num_token_rows - window));
    __syncthreads();  // the previous window's prefix is still being searched
    const int32_t window_units = window_prefix<kThreads, kPersistentRowsPerThread>(t0, n, prefix, warp_sums, units);
    for (int64_t u = first_unit(worker, warps, before); u < window_units; u += warps) {
      const int r = find_row(prefix, n, static_cast<int32_t>(u));
      body(t0 + r, static_cast<int>(u - prefix[r]));
    }
    before += window_units;
  }
}

// One warp per used entry (row_persistent) of the first entries(t) entries
// of each token row t: lane 0 resolves the entry, the warp copies the row
// with all of its loads in flight before the stores.
template <typename Entries>
__device__ void copy_entries_row_persistent(const GatherCompactParams& p, int window_rows, Entries entries) {
  const int lane = threadIdx.x % kWarpSize;
  const int chunks = static_cast<int>(p.row_bytes / kChunkBytes);
  for_each_used_unit(p.num_token_rows, window_rows, entries, [&](int32_t t, int k) {
    const uint8_t* src = nullptr;
    uint8_t* dst = nullptr;
    if (lane == 0) resolve_entry(p, t, k, &src, &dst);
    warp_copy_rows<kWarpUnroll>(1, src, dst, chunks, lane);
  });
}

__global__ void __launch_bounds__(kThreads) gather_row_persistent_kernel(GatherCompactParams p, int window_rows) {
  copy_entries_row_persistent(p, window_rows, [&](int32_t t) { return clamped_count(p, t); });
}

// The resolver's tail gather (launch_gather_compact_tail): row_persistent
// over every token row but a request's first one with at most local_rows
// entries. Launched right behind the resolve that wrote the swap list.
__global__ void __launch_bounds__(kThreads)
    gather_tail_kernel(GatherCompactParams p, int window_rows, const int32_t* req_id_per_token, int32_t local_rows) {
  copy_entries_row_persistent(p, window_rows, [&](int32_t t) {
    const int32_t count = clamped_count(p, t);
    const bool first_row = t == 0 || req_id_per_token[t - 1] != req_id_per_token[t];
    return first_row && count <= local_rows ? 0 : count;
  });
}

// Group gather (p.pieces > 1): one warp per used entry reads the slot's
// pieces as one contiguous span, kWarpUnroll chunks per lane in flight
// before any store; chunk c of the span belongs to piece c / piece_chunks.
// The params live in constant space (__grid_constant__), so indexing
// piece_hot by a computed piece needs no local copy of the array.
__global__ void __launch_bounds__(kThreads)
    gather_group_kernel(const __grid_constant__ GatherCompactParams p, int window_rows) {
  const int lane = threadIdx.x % kWarpSize;
  const int piece_chunks = static_cast<int>(p.row_bytes / kChunkBytes);
  const int total = p.pieces * piece_chunks;
  const auto entries = [&](int32_t t) { return clamped_count(p, t); };
  for_each_used_unit(p.num_token_rows, window_rows, entries, [&](int32_t t, int k) {
    const int64_t h = p.swap_host_rows[t * p.swap_host_row_stride + k];
    const int64_t d = p.swap_device_rows[t * p.swap_device_row_stride + k];
    if (h < 0 || d < 0) return;
    const int64_t offset = hot_row_offset(d, p.hot_block_size, p.hot_block_stride);
    if (offset >= p.hot_span_rows) return;
    const uint8_t* const src = h < p.host_rows ? p.host + h * p.host_pitch : nullptr;
    const int64_t dst_offset = offset * p.row_bytes;
    for (int base = 0; base < total; base += kWarpUnroll * kWarpSize) {
      uint4 value[kWarpUnroll];
      uint8_t* target[kWarpUnroll];
#pragma unroll
      for (int u = 0; u < kWarpUnroll; ++u) {
        const int c = base + u * kWarpSize + lane;
        target[u] = nullptr;
        value[u] = make_uint4(0, 0, 0, 0);
        if (c < total) {
          const int piece = c / piece_chunks;
          target[u] = p.piece_hot[piece] + dst_offset + static_cast<int64_t>(c - piece * piece_chunks) * kChunkBytes;
          if (src != nullptr) value[u] = load_chunk(src + static_cast<int64_t>(c) * kChunkBytes);
        }
      }
#pragma unroll
      for (int u = 0; u < kWarpUnroll; ++u) {
        if (target[u] != nullptr) store_chunk(target[u], value[u]);
      }
    }
  });
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

// The block sorts entries [first, first + size) of token row t by host slot
// and copies them. Shared memory: keys[capacity] (host slot << 32 | index in
// the share, kInvalidKey for skipped entries), then dst_offset[capacity] (hot
// row offset by index, filled in the same pass as the keys so the copy starts
// right after the sort, without another round trip to the swap list).
// Every thread of the block calls this with the same arguments.
__device__ void sort_and_copy_share(const GatherCompactParams& p, int32_t t, int first, int size, uint64_t* keys,
                                    int64_t* dst_offset, int chunks) {
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
        if (h < p.host_rows)
          value[u] = load_chunk(p.host + h * p.host_pitch + static_cast<int64_t>(chunk) * kChunkBytes);
      }
    }
#pragma unroll
    for (int u = 0; u < kSortUnroll; ++u) {
      if (target[u] != nullptr) store_chunk(target[u], value[u]);
    }
  }
  __syncthreads();  // keys and offsets are rewritten for the next share
}

// Sort shares of a token row of clamped count c: up to `parts`, each of at
// least kMinSortShare entries (a short row is one share, not `parts` slivers).
__device__ __forceinline__ int sort_shares(int32_t c, int parts) { return min(parts, ceil_div(c, kMinSortShare)); }

// Blocks take the used shares round-robin (a unit = one share of one token
// row); share j of a row with s shares is its columns [c * j / s, c * (j + 1) / s).
// A share holds at most ceil(K / parts) <= capacity entries: a row of fewer
// than `parts` shares has shares of at most kMinSortShare entries, and
// parts > 1 only while parts <= K / kMinSortShare.
// window_rows (<= kSortWindow) keeps a window's unit count in int32.
__global__ void __launch_bounds__(kSortThreads)
    gather_sorted_kernel(GatherCompactParams p, int parts, int capacity, int window_rows) {
  extern __shared__ uint64_t shared[];
  __shared__ int32_t prefix[kSortWindow + 1];
  __shared__ int32_t warp_sums[kSortThreads / kWarpSize];
  uint64_t* keys = shared;
  int64_t* dst_offset = reinterpret_cast<int64_t*>(shared + capacity);
  const int chunks = static_cast<int>(p.row_bytes / kChunkBytes);
  const auto shares = [&](int32_t t) { return sort_shares(clamped_count(p, t), parts); };
  int64_t before = 0;
  // 64-bit so that the last window's step cannot overflow for R near 2^31.
  for (int64_t window = 0; window < p.num_token_rows; window += window_rows) {
    const int32_t t0 = static_cast<int32_t>(window);
    const int n = static_cast<int>(min(static_cast<int64_t>(window_rows), p.num_token_rows - window));
    __syncthreads();  // the previous window's prefix may still be read
    const int32_t units = window_prefix<kSortThreads, kSortRowsPerThread>(t0, n, prefix, warp_sums, shares);
    for (int64_t u = first_unit(blockIdx.x, gridDim.x, before); u < units; u += gridDim.x) {
      const int r = find_row(prefix, n, static_cast<int32_t>(u));
      const int32_t count = clamped_count(p, t0 + r);
      const int s = sort_shares(count, parts);
      const int j = static_cast<int>(u - prefix[r]);
      const int first = static_cast<int>(static_cast<int64_t>(count) * j / s);
      const int size = static_cast<int>(static_cast<int64_t>(count) * (j + 1) / s) - first;
      sort_and_copy_share(p, t0 + r, first, size, keys, dst_offset, chunks);
    }
    before += units;
  }
}

// Entries one block sorts at most, rounded up to a power of two.
int sorted_capacity(int top_k, int parts) {
  const int share = (top_k + parts - 1) / parts;
  int capacity = 1;
  while (capacity < share) capacity <<= 1;
  return capacity;
}

// Static shared memory of the sorted kernel (its prefix window), which
// counts against the same per-block limit as the dynamic part.
size_t sorted_static_shared_bytes() {
  static const size_t bytes = [] {
    cudaFuncAttributes attributes{};
    cuda_check(cudaFuncGetAttributes(&attributes, gather_sorted_kernel), "cudaFuncGetAttributes(gather_sorted_kernel)");
    return attributes.sharedSizeBytes;
  }();
  return bytes;
}

// Opt into the dynamic shared memory the sorted kernel needs; false when the
// device cannot give that much (the caller then runs row_persistent).
bool prepare_sorted(size_t shared_bytes) {
  const size_t static_bytes = sorted_static_shared_bytes();
  if (shared_bytes + static_bytes <= static_cast<size_t>(kDefaultSharedBytes)) return true;
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  int limit = 0;
  cuda_check(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "cudaDeviceGetAttribute(maxSharedMemoryPerBlockOptin)");
  if (shared_bytes + static_bytes > static_cast<size_t>(limit)) return false;
  cuda_check(cudaFuncSetAttribute(gather_sorted_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(shared_bytes)),
             "cudaFuncSetAttribute(gather_sorted_kernel)");
  return true;
}

unsigned grid_rows(int32_t rows) { return static_cast<unsigned>(std::min<int32_t>(rows, 65535)); }

// Token rows per prefix window: at most `window`, and few enough that the
// window's units (at most max_units_per_row each) stay within int32.
int window_rows(int64_t max_units_per_row, int window) {
  return static_cast<int>(std::clamp<int64_t>(INT32_MAX / std::max<int64_t>(max_units_per_row, 1), 1, window));
}

// Thread blocks of the sorted schedule when the caller sets no cap: half
// the SMs. Fewer concurrent rows translate fewer host pages at once, which
// is what rows scattered over a large pool are limited by, and the other
// half of the SMs stays free for compute.
int64_t automatic_blocks() { return std::max(1, multiprocessor_count() / 2); }

// row_persistent's grid: one block per SM (or max_blocks), no more blocks
// than the entries need. Larger grids did not move the resolver's swap
// lists faster on an H200 and cost microseconds when nearly empty.
unsigned row_persistent_blocks(const GatherCompactParams& params) {
  constexpr int kWarps = kThreads / kWarpSize;
  const int64_t needed = (static_cast<int64_t>(params.top_k) * params.num_token_rows + kWarps - 1) / kWarps;
  const int64_t cap = params.max_blocks > 0 ? static_cast<int64_t>(params.max_blocks) : multiprocessor_count();
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(needed, cap)));
}

}  // namespace

void launch_gather_compact(const GatherCompactParams& params, cudaStream_t stream) {
  if (params.num_token_rows <= 0 || params.top_k <= 0) return;
  const int64_t chunks = params.row_bytes / kChunkBytes;
  // Chunk indices of one token row are 32-bit inside the kernels.
  if (chunks * params.top_k > INT32_MAX) {
    invalid_argument("gather_compact: rows of ", params.row_bytes, " bytes times ", params.top_k,
                     " swap columns exceed the CUDA kernel's 2^31 chunk index range");
  }
  if (params.pieces > 1) {
    const int64_t blocks_needed =
        (static_cast<int64_t>(params.top_k) * params.num_token_rows + (kThreads / kWarpSize) - 1) /
        (kThreads / kWarpSize);
    const int64_t blocks = std::min(
        blocks_needed, params.max_blocks > 0 ? static_cast<int64_t>(params.max_blocks) : multiprocessor_count());
    launch_kernel("gather_compact_group kernel launch", gather_group_kernel, static_cast<unsigned>(blocks), kThreads, 0,
                  stream, params, window_rows(params.top_k, kPersistentWindow));
    return;
  }
  const int warps_per_block = kThreads / kWarpSize;
  if (params.variant == HS_GATHER_SORTED) {
    // Token rows are split into parts only while that stays within the
    // block budget; past it, blocks stride over whole token rows.
    const int64_t target = params.max_blocks > 0 ? params.max_blocks : automatic_blocks();
    const int64_t rows = params.num_token_rows;
    // Each part needs enough rows to keep its block's loads in flight.
    const int parts =
        static_cast<int>(std::clamp<int64_t>(target / rows, 1, std::max(1, params.top_k / kMinSortShare)));
    const int64_t blocks = parts > 1 ? rows * parts : std::min(rows, target);
    const int capacity = sorted_capacity(params.top_k, parts);
    const size_t shared_bytes = static_cast<size_t>(capacity) * (sizeof(uint64_t) + sizeof(int64_t));
    if (prepare_sorted(shared_bytes)) {
      launch_kernel("gather_compact (sorted) kernel launch", gather_sorted_kernel, static_cast<unsigned>(blocks),
                    kSortThreads, shared_bytes, stream, params, parts, capacity, window_rows(parts, kSortWindow));
      return;
    }
  }
  if (params.variant == HS_GATHER_WARP_PER_ROW) {
    const dim3 grid((params.top_k + warps_per_block - 1) / warps_per_block, grid_rows(params.num_token_rows));
    launch_kernel("gather_compact kernel launch", gather_warp_per_row_kernel, grid, kThreads, 0, stream, params);
  } else {
    // row_persistent, and sorted past the device's shared memory.
    launch_kernel("gather_compact kernel launch", gather_row_persistent_kernel, row_persistent_blocks(params), kThreads,
                  0, stream, params, window_rows(params.top_k, kPersistentWindow));
  }
}

void launch_gather_compact_tail(const GatherCompactParams& params, const int32_t* req_id_per_token, int32_t local_rows,
                                cudaStream_t stream) {
  if (params.num_token_rows <= 0 || params.top_k <= 0) return;
  launch_kernel("resolver tail gather launch", gather_tail_kernel, row_persistent_blocks(params), kThreads, 0, stream,
                params, window_rows(params.top_k, kPersistentWindow), req_id_per_token, local_rows);
}

}  // namespace cuda
}  // namespace hisparse
