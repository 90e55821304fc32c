// Prefill staging on the GPU (docs/staging.md): the block renumbering (a
// radix sort and a unique pass of CUB over the slots' block ids, then one
// binary search per slot), the plan's packing of slots into requests, the
// GPU sources of ensure_gpu_sources, and the resident-row gather. Every
// kernel grid-strides over one index space and calls one device function
// per element; all work is enqueued on the caller's stream with the scratch
// the plan laid out, so nothing syncs or allocates and all of it captures.
#include <algorithm>
#include <cstdint>

#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>

#include "cuda/cuda_check.hpp"
#include "cuda/cuda_kernels.hpp"
#include "cuda/kernel_launch.hpp"
#include "cuda/row_copy.cuh"

namespace hisparse {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kScanThreads = 1024;
constexpr int kCopyUnroll = 8;
constexpr int64_t kMaxGrid = 4096;
constexpr size_t kAlignment = 256;
// Staged block ids are < 2^31: the sort needs bits [0, 31) of the keys.
constexpr int kKeyBits = 31;

unsigned grid_for(int64_t count) {
  return static_cast<unsigned>(std::clamp<int64_t>((count + kThreads - 1) / kThreads, 1, kMaxGrid));
}

size_t align_up(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

#define HS_GRID_STRIDE(i, count)                                                             \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (count); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// ------------------------------------------------------------------ remap

// The remap's scratch: keys {0} + the entries' block ids, the same sorted,
// the distinct ones and their count, then CUB's temporary storage.
struct RemapScratch {
  uint32_t* keys = nullptr;
  uint32_t* sorted = nullptr;
  uint32_t* distinct = nullptr;
  int32_t* num_distinct = nullptr;
  void* temp = nullptr;
  size_t temp_bytes = 0;
};

// Three key arrays, the count, and the slack to start them on a 256-byte
// boundary of a workspace that is only 16-byte aligned.
size_t remap_arrays_bytes(int64_t keys) {
  return 3 * align_up(static_cast<size_t>(keys) * sizeof(uint32_t)) + 2 * kAlignment;
}

size_t remap_temp_bytes(int64_t keys) {
  size_t sort_bytes = 0, unique_bytes = 0;
  cuda_check(cub::DeviceRadixSort::SortKeys(nullptr, sort_bytes, static_cast<const uint32_t*>(nullptr),
                                            static_cast<uint32_t*>(nullptr), static_cast<int>(keys), 0, kKeyBits),
             "cub::DeviceRadixSort::SortKeys (size query)");
  cuda_check(cub::DeviceSelect::Unique(nullptr, unique_bytes, static_cast<const uint32_t*>(nullptr),
                                       static_cast<uint32_t*>(nullptr), static_cast<int32_t*>(nullptr), keys),
             "cub::DeviceSelect::Unique (size query)");
  return std::max(sort_bytes, unique_bytes);
}

RemapScratch carve_remap_scratch(const StagingRemapParams& p) {
  const int64_t keys = p.count + 1;
  const size_t array_bytes = align_up(static_cast<size_t>(keys) * sizeof(uint32_t));
  // The plan and hs_staging_remap align the workspace to 16 bytes; start the
  // arrays at the next 256-byte boundary, which remap_arrays_bytes leaves room for.
  const uintptr_t base = reinterpret_cast<uintptr_t>(p.workspace);
  uint8_t* start = reinterpret_cast<uint8_t*>((base + kAlignment - 1) / kAlignment * kAlignment);
  RemapScratch s;
  s.keys = reinterpret_cast<uint32_t*>(start);
  s.sorted = reinterpret_cast<uint32_t*>(start + array_bytes);
  s.distinct = reinterpret_cast<uint32_t*>(start + 2 * array_bytes);
  s.num_distinct = reinterpret_cast<int32_t*>(start + 3 * array_bytes);
  s.temp = start + 3 * array_bytes + kAlignment;
  const size_t used = static_cast<size_t>(static_cast<uint8_t*>(s.temp) - static_cast<uint8_t*>(p.workspace));
  if (used > p.workspace_bytes) {
    fail(HS_ERROR_INTERNAL, "staging_remap: workspace of ", p.workspace_bytes, " bytes too small");
  }
  s.temp_bytes = p.workspace_bytes - used;
  return s;
}

__device__ __forceinline__ uint32_t remap_key(const StagingRemapParams& p, int64_t i, int64_t max_block) {
  return static_cast<uint32_t>(staged_block_id(load_index(p.block_ids, p.block_ids_int64, i), max_block));
}

// Index of `key` among the n ascending distinct keys (it is always there).
__device__ __forceinline__ int32_t rank_of(const uint32_t* distinct, int32_t n, uint32_t key) {
  int32_t lo = 0, hi = n;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (distinct[mid] < key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

__global__ void load_remap_keys_kernel(StagingRemapParams p, uint32_t* keys) {
  const int64_t max_block = max_staged_block_id(p.block_size);
  HS_GRID_STRIDE(i, p.count + 1) { keys[i] = i == 0 ? 0u : remap_key(p, i - 1, max_block); }
}

__global__ void compact_ids_kernel(StagingRemapParams p, const uint32_t* distinct, const int32_t* num_distinct) {
  const int64_t max_block = max_staged_block_id(p.block_size);
  const int32_t n = *num_distinct;
  HS_GRID_STRIDE(i, p.count) { p.out_table[i] = rank_of(distinct, n, remap_key(p, i, max_block)); }
}

__global__ void remap_row_ids_kernel(StagingRemapParams p, const uint32_t* distinct, const int32_t* num_distinct) {
  const int64_t n = *num_distinct;
  HS_GRID_STRIDE(j, (p.count + 1) * p.block_size) {
    const int64_t k = j / p.block_size;
    p.out_row_ids[j] = k < n ? static_cast<int32_t>(distinct[k] * p.block_size + j % p.block_size) : -1;
  }
}

// ------------------------------------------------------------------ build

// Prefix sums saturated at the capacity: every term is in [0, capacity], so
// min(cap, a + b) is associative and never overflows.
struct SaturatingSum {
  int64_t cap;
  __device__ __forceinline__ int64_t operator()(const int64_t& a, const int64_t& b) const { return min(cap, a + b); }
};

// block_ends[b] = min(capacity, u_0 + ... + u_b), one block scanning the rows.
__global__ void __launch_bounds__(kScanThreads) block_ends_kernel(StagingBuildParams p) {
  using Scan = cub::BlockScan<int64_t, kScanThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int64_t carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  const SaturatingSum sum{p.capacity};
  for (int64_t first = 0; first < p.num_rows; first += kScanThreads) {
    const int64_t b = first + threadIdx.x;
    const int64_t used =
        b < p.num_rows ? blocks_used(load_index(p.seq_lens, p.seq_lens_int64, b), p.block_size, p.capacity) : 0;
    int64_t end = 0;
    Scan(scan_storage).InclusiveScan(used, end, sum);
    end = sum(end, carry);
    if (b < p.num_rows) p.block_ends[b] = end;
    __syncthreads();
    if (threadIdx.x == kScanThreads - 1) carry = end;
    __syncthreads();
  }
}

// The request that owns packed slot k: the first row whose blocks end past k.
__device__ __forceinline__ int64_t slot_owner(const int64_t* ends, int64_t rows, int64_t k) {
  int64_t lo = 0, hi = rows;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (ends[mid] > k) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

__device__ __forceinline__ void pack_slot(const StagingBuildParams& p, int64_t k, int64_t max_block) {
  int32_t id = 0;
  int32_t entry = -1;
  const int64_t b = slot_owner(p.block_ends, p.num_rows, k);
  if (b < p.num_rows) {
    const int64_t col = k - (b > 0 ? p.block_ends[b - 1] : 0);
    if (col < p.num_cols) {
      id = staged_block_id(load_index(p.block_table, p.block_table_int64, b * p.block_table_row_stride + col),
                           max_block);
      entry = static_cast<int32_t>(b * p.num_cols + col);
    }
  }
  p.slot_block_ids[k] = id;
  p.slot_entries[k] = entry;
}

__global__ void clear_table_kernel(int32_t* table, int64_t entries) {
  HS_GRID_STRIDE(e, entries) { table[e] = 0; }
}

__global__ void pack_slots_kernel(StagingBuildParams p) {
  const int64_t max_block = max_staged_block_id(p.block_size);
  HS_GRID_STRIDE(k, p.capacity) { pack_slot(p, k, max_block); }
}

__global__ void scatter_compact_ids_kernel(StagingBuildParams p) {
  HS_GRID_STRIDE(k, p.capacity) {
    const int32_t entry = p.slot_entries[k];
    if (entry >= 0) p.out_block_table[entry] = p.slot_compact_ids[k];
  }
}

__global__ void plan_rows_kernel(StagingBuildParams p) {
  HS_GRID_STRIDE(j, (p.capacity + 1) * p.block_size) {
    p.dst_rows[j] = static_cast<int32_t>(j);
    p.miss_mask[j] = p.row_ids[j] >= 0 ? 1 : 0;
  }
}

// ------------------------------------------------------------------ GPU sources

__global__ void init_first_entries_kernel(int32_t* first_entries, int64_t num_blocks, int32_t entries) {
  HS_GRID_STRIDE(k, num_blocks) { first_entries[k] = entries; }
}

__global__ void first_entries_kernel(StagingGpuSourcesParams p) {
  HS_GRID_STRIDE(e, p.num_rows * p.num_cols) {
    const int32_t k = p.block_table[e];
    if (k >= 0 && k < p.num_blocks) atomicMin(p.first_entries + k, static_cast<int32_t>(e));
  }
}

// The resident page of row o of staged block k: taken from the state row of
// the block's representative entry, 0 when there is none.
__device__ __forceinline__ int64_t representative_page(const StagingGpuSourcesParams& p, int64_t k, int64_t o) {
  const int64_t entries = p.num_rows * p.num_cols;
  const int64_t first = p.first_entries[k];
  if (first >= entries) return 0;
  const int64_t state = load_index(p.state_indices, p.state_indices_int64, first / p.num_cols);
  const int64_t col = (first % p.num_cols) * (p.block_size / p.resident_block_size) + o / p.resident_block_size;
  if (state < 0 || state >= p.num_states || col >= p.resident_cols) return 0;
  return load_index(p.resident_state_rows, p.resident_int64, state * p.resident_row_stride + col);
}

__device__ __forceinline__ void resolve_source_row(const StagingGpuSourcesParams& p, int64_t j, bool with_table) {
  const int64_t k = j / p.block_size;
  const int64_t o = j % p.block_size;
  const bool valid = p.row_ids[j] >= 0;
  const bool real_host_block = p.row_ids[k * p.block_size] >= p.block_size;  // never the null block
  const int64_t page = with_table && valid && real_host_block ? representative_page(p, k, o) : 0;
  const bool resident = valid && real_host_block && page > 0 && page <= max_staged_block_id(p.resident_block_size);
  p.gpu_row_ids[j] = resident ? static_cast<int32_t>(page * p.resident_block_size + o % p.resident_block_size) : -1;
  p.miss_mask[j] = valid && !resident ? 1 : 0;
}

__global__ void gpu_source_rows_kernel(StagingGpuSourcesParams p, bool with_table) {
  HS_GRID_STRIDE(j, p.num_blocks * p.block_size) { resolve_source_row(p, j, with_table); }
}

// ------------------------------------------------------------------ resident rows

__global__ void __launch_bounds__(kThreads)
    gather_resident_rows_kernel(GatherResidentRowsParams p, int rows_per_group) {
  copy_row_groups<kThreads, kCopyUnroll>(p.count, rows_per_group, p.row_bytes,
                                         [&](int64_t j, const uint8_t*& src, uint8_t*& dst) {
                                           const int64_t row = load_index(p.row_ids, p.row_ids_int64, j);
                                           if (p.skip_negative && row < 0)
                                             return;  // neither pointer set: the row keeps its bytes
                                           src = p.source + resident_row_offset(p, row);
                                           dst = p.destination + j * p.destination_pitch;
                                         });
}

#undef HS_GRID_STRIDE

}  // namespace

size_t staging_remap_workspace_bytes(int64_t count) {
  const int64_t keys = count + 1;
  return remap_arrays_bytes(keys) + remap_temp_bytes(keys);
}

void launch_staging_remap(const StagingRemapParams& p, cudaStream_t stream) {
  const int64_t keys = p.count + 1;
  const RemapScratch s = carve_remap_scratch(p);
  launch_kernel("staging_remap: key kernel launch", load_remap_keys_kernel, grid_for(keys), kThreads, 0, stream, p,
                s.keys);
  size_t temp_bytes = s.temp_bytes;
  cuda_check(
      cub::DeviceRadixSort::SortKeys(s.temp, temp_bytes, s.keys, s.sorted, static_cast<int>(keys), 0, kKeyBits, stream),
      "staging_remap: cub::DeviceRadixSort::SortKeys");
  temp_bytes = s.temp_bytes;
  cuda_check(cub::DeviceSelect::Unique(s.temp, temp_bytes, s.sorted, s.distinct, s.num_distinct, keys, stream),
             "staging_remap: cub::DeviceSelect::Unique");
  if (p.count > 0) {
    launch_kernel("staging_remap: compact-id kernel launch", compact_ids_kernel, grid_for(p.count), kThreads, 0, stream,
                  p, s.distinct, s.num_distinct);
  }
  launch_kernel("staging_remap: row-id kernel launch", remap_row_ids_kernel, grid_for(keys * p.block_size), kThreads, 0,
                stream, p, s.distinct, s.num_distinct);
}

void launch_build_staging_plan(const StagingBuildParams& p, cudaStream_t stream) {
  const int64_t entries = p.num_rows * p.num_cols;
  if (entries > 0) {
    launch_kernel("build_staging_plan: clear kernel launch", clear_table_kernel, grid_for(entries), kThreads, 0, stream,
                  p.out_block_table, entries);
  }
  if (p.capacity > 0) {
    if (p.num_rows > 0) {
      launch_kernel("build_staging_plan: block-ends kernel launch", block_ends_kernel, 1, kScanThreads, 0, stream, p);
    }
    launch_kernel("build_staging_plan: packing kernel launch", pack_slots_kernel, grid_for(p.capacity), kThreads, 0,
                  stream, p);
  }
  launch_staging_remap(p.remap, stream);
  if (p.capacity > 0) {
    launch_kernel("build_staging_plan: scatter kernel launch", scatter_compact_ids_kernel, grid_for(p.capacity),
                  kThreads, 0, stream, p);
  }
  launch_kernel("build_staging_plan: rows kernel launch", plan_rows_kernel, grid_for((p.capacity + 1) * p.block_size),
                kThreads, 0, stream, p);
}

void launch_staging_gpu_sources(const StagingGpuSourcesParams& p, cudaStream_t stream) {
  const int64_t entries = p.num_rows * p.num_cols;
  const bool with_table = p.num_states > 0 && p.resident_cols > 0 && entries > 0;
  if (with_table) {
    launch_kernel("ensure_gpu_sources: init kernel launch", init_first_entries_kernel, grid_for(p.num_blocks), kThreads,
                  0, stream, p.first_entries, p.num_blocks, static_cast<int32_t>(entries));
    launch_kernel("ensure_gpu_sources: representative kernel launch", first_entries_kernel, grid_for(entries), kThreads,
                  0, stream, p);
  }
  launch_kernel("ensure_gpu_sources: rows kernel launch", gpu_source_rows_kernel, grid_for(p.num_blocks * p.block_size),
                kThreads, 0, stream, p, with_table);
}

void launch_gather_resident_rows(const GatherResidentRowsParams& p, cudaStream_t stream) {
  if (p.count <= 0) return;
  const RowCopyGrid grid = row_copy_grid<kThreads, kCopyUnroll>("gather_resident_rows", p.count, p.row_bytes);
  launch_kernel("gather_resident_rows kernel launch", gather_resident_rows_kernel, grid.blocks, kThreads, 0, stream, p,
                grid.rows_per_group);
}

}  // namespace cuda
}  // namespace hisparse
