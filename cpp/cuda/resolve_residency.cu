// CUDA residency resolution (docs/residency.md): one block per batch row,
// everything per request in shared memory (layout: resolver_shared_memory.hpp),
// bit-identical to resolve_residency_reference.cpp.
//
// Phases of an active request and the barriers that separate them:
//   A  fill shared memory, read the lru row, find the request's token rows   | B1
//   B  start the async copy of the dgi row; count slot occurrences; build
//      the union chunk by chunk (classify, insert, rank: 2 barriers a chunk) | B2
//      (kernel<true>, fused gather on sm_90: before the first B2a the dgi
//      row fills the held filter; new keys it proves absent are misses,
//      whose host rows start landing in the miss stage after the rank scan)
//   C1 per slot: usable? which member does it hold?                          | B3
//      (fused gather: the warps start reading the other misses' host rows
//      into the miss stage)
//   C2 per LRU position: hit (atomicMax on the member) or evictable; one
//      scan compacts E                                                       | B4 (in the scan)
//   D  per member: miss index (scan), assignment, dgi and swap list, row
//      and attention index of its slot; new LRU order into shared memory     | B5 (in the scan), B6
//   E  fused gather: each warp copies its assigned misses that were not staged
//      (skipped by a block whose assigned misses were all staged)
//   F  copy the new LRU out; per-entry outputs, valid counts, counters       | one per 32 token rows
//   G  fused gather: the staged rows go to their hot rows                    | B8
// Every shared array is written in one phase and read in a later one; the
// only same-phase sharing is through atomics.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <mutex>

#include "cuda/cuda_check.hpp"
#include "cuda/cuda_kernels.hpp"
#include "core/error.hpp"
#include "core/resolver_shared_memory.hpp"
#include "cuda/async_copy.cuh"
#include "cuda/block_scan.cuh"
#include "cuda/fast_divisor.cuh"
#include "cuda/hopper_sync.cuh"
#include "cuda/row_copy.cuh"
#include "cuda/union_table.cuh"

namespace hisparse {
namespace cuda {
namespace {

constexpr int kThreads = kResolverThreads;
constexpr int kWarps = kResolverWarps;
static_assert(kWarps == 32, "block scans give one warp total to each lane of a warp");

constexpr int64_t kInt32Max = INT32_MAX;
constexpr int64_t kMaxEntries = int64_t{1} << 30;

// slot_info after phase C1: usable bit, member rank + 1 (0: holds no member).
constexpr uint32_t kSlotUsable = 0x8000u;
constexpr uint32_t kSlotRankMask = 0x7FFFu;
// After phase D a served member has member_slots = its physical hot row and
// member_keys = its attention index; member_first = its first entry for an
// assigned miss, kServedHit for a hit, kNotServed otherwise.
constexpr int32_t kServedHit = -1;
constexpr int32_t kNotServed = INT32_MIN;
constexpr int32_t kSlotMask = 0xFFFF;
// Low half of an evictable-position word whose slot cannot take a miss.
constexpr int32_t kNoSlot = 0xFFFF;
// Entry codes below these are hash slots (capacity < 2^16 for H <= 32767).
constexpr uint16_t kCodeResident = 0xFFFE;
constexpr uint16_t kCodeInvalid = 0xFFFF;
static_assert(kResolverMaxHashCapacity == kCodeResident, "hash slots must stay below the entry code markers");

// Per-launch constants derived on the host.
struct ResolverConstants {
  FastDivisor top_k;             // K
  FastDivisor block_size;        // source table blocks (1 without a table)
  FastDivisor hot_block_size;    // hot and resident blocks
  // Hot blocks up to this one have attention indices within int32 for any
  // offset, so only larger ones need the 64-bit check.
  int32_t safe_hot_block;
  // Entries of a request's hot table row (ceil(H / hot_block_size)), and the
  // token rows per request when every request has T / B of them (else 0):
  // phase A's prefetches, without a division in every warp.
  int32_t hot_table_entries;
  int32_t rows_per_request;
  // 16-byte words of shared memory that start as all-ones (from hash_keys)
  // and as zero (from slot_info); see ResolverSharedLayout.
  int32_t ones_vectors;
  int32_t zero_vectors;
  // The row stride shared by the four per-entry outputs, or -1.
  int64_t entry_output_stride;
  // The fused gather's early staging area (rows = 0: none).
  ResolverMissStage miss_stage;
  // Staged rows arrive by one bulk (TMA) copy each, counted in by an
  // mbarrier (sm_90), instead of 16-byte cp.async copies (sm_80).
  bool bulk_stage;
  // The early stage (kernel<true>): the held filter's bits are key & mask
  // (a power of two minus one, within member_slots). The fused gather's
  // stage reads p.gather's fields from here (host rows clamped to int32),
  // a few parameter lines instead of the scattered fields of p.gather.
  uint32_t held_filter_mask;
  int32_t stage_host_rows;
  uint32_t stage_row_bytes;
  const uint8_t* stage_host;
  int64_t stage_host_pitch;
  // Phase G's destination: p.gather's hot cache fields, next to the stage's.
  uint8_t* stage_hot;
  int64_t stage_hot_block_stride;
  int64_t stage_hot_span_rows;
};

enum EntryKind : int32_t { kInvalid = 0, kResident = 1, kHot = 2 };

struct Entry {
  int32_t kind;
  int32_t host_slot;  // g (valid for kResident and kHot)
  int64_t row;        // physical row (kResident)
  int64_t address;    // attention index (kResident)
};

// Step 1 of docs/residency.md. Rows are block * size + offset with
// 0 <= offset < size, so row / size and row % size are block and offset:
// the attention index needs no 64-bit division.
// `source` and `resident` are the batch row's table rows (null when absent).
__device__ __forceinline__ Entry classify(const ResolveResidencyParams& p, const ResolverConstants& c,
                                          const int32_t* source, const int32_t* resident, int32_t position) {
  Entry entry{kInvalid, -1, -1, -1};
  if (position < 0) return entry;
  int64_t g = position;
  if (source != nullptr) {
    const int32_t block = c.block_size.quotient(position);
    if (block >= p.source_table_width) return entry;
    const int32_t host_block = __ldg(source + block);
    if (host_block <= 0) return entry;
    g = static_cast<int64_t>(host_block) * p.block_size + c.block_size.remainder(position, block);
  }
  if (g >= p.host_rows) return entry;
  entry.host_slot = static_cast<int32_t>(g);
  if (resident != nullptr) {
    // resident_block_size == hot_block_size (checked on the host).
    const int32_t page = c.hot_block_size.quotient(position);
    if (page < p.resident_table_width) {
      const int32_t resident_block = __ldg(resident + page);
      if (resident_block > 0) {
        const int32_t offset = c.hot_block_size.remainder(position, page);
        const int64_t address = static_cast<int64_t>(resident_block) * p.attention_block_stride + offset;
        if (address > kInt32Max) return Entry{kInvalid, -1, -1, -1};
        entry.kind = kResident;
        entry.row = static_cast<int64_t>(resident_block) * p.resident_block_size + offset;
        entry.address = address;
        return entry;
      }
    }
  }
  entry.kind = kHot;
  return entry;
}

// Fused gather's held filter: the words of member_slots (all ones until
// phase C2) with one bit per key & mask; each word of the dgi row clears
// its key's bit, so a set bit proves that no slot holds the key (a sure
// miss) and a cleared one proves nothing. Host slots of one request are
// mostly contiguous runs, which the low bits spread without collisions.
// Bit 31 of a word is never cleared (bit 30 stands in for it): a word stays
// negative, which is all phase C2 asks of a member without a hit position.
struct HeldFilterBit {
  uint32_t word;
  uint32_t mask;
};
__device__ __forceinline__ HeldFilterBit held_filter_bit(int32_t key, uint32_t filter_mask) {
  const uint32_t bit = static_cast<uint32_t>(key) & filter_mask;
  return {bit >> 5, 1u << min(bit & 31u, 30u)};
}

__device__ __forceinline__ void write_inactive_entry(const ResolveResidencyParams& p, int64_t t, int32_t k) {
  p.out_attention[t * p.out_attention_row_stride + k] = -1;
  p.out_hot_rows[t * p.out_hot_rows_row_stride + k] = -1;
  p.out_resolved[t * p.out_resolved_row_stride + k] = -1;
  p.out_miss_mask[t * p.out_miss_mask_row_stride + k] = 0;
}

// Token rows past num_valid_rows or naming no batch row, spread over all
// blocks (row t goes to block t % gridDim.x) so no single block writes them all.
// `first_owner` is req_id_per_token[blockIdx.x], loaded at kernel entry so
// that the usual single row per block costs no load latency here.
__device__ void write_orphan_rows(const ResolveResidencyParams& p, int32_t valid_rows, int32_t first_owner) {
  for (int32_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    const int32_t request = t == static_cast<int32_t>(blockIdx.x) ? first_owner : p.req_id_per_token[t];
    if (t < valid_rows && request >= 0 && request < p.num_batch_rows) continue;
    for (int32_t k = threadIdx.x; k < p.top_k; k += kThreads) write_inactive_entry(p, t, k);
    if (threadIdx.x == 0) {
      p.out_valid_counts[t] = 0;
      p.out_swap_counts[t] = 0;
    }
  }
}

// Padding and rejected requests: their rows (any t in [first, last] naming b).
__device__ void write_request_inactive(const ResolveResidencyParams& p, const ResolverConstants& c, int32_t b,
                                       int32_t first, int32_t last) {
  const int32_t span = last - first + 1;
  const int32_t entries = span * p.top_k;  // <= T * K <= 2^30 (checked by the launcher)
  for (int32_t e = threadIdx.x; e < entries; e += kThreads) {
    const int32_t r = c.top_k.quotient(e);
    if (p.req_id_per_token[first + r] == b) write_inactive_entry(p, first + r, c.top_k.remainder(e, r));
  }
  for (int32_t r = threadIdx.x; r < span; r += kThreads) {
    if (p.req_id_per_token[first + r] == b) {
      p.out_valid_counts[first + r] = 0;
      p.out_swap_counts[first + r] = 0;
    }
  }
}

__device__ __forceinline__ void add_stat(const ResolveResidencyParams& p, int index, int64_t value) {
  if (value != 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(p.stats + index), static_cast<unsigned long long>(value));
  }
}

// The short loops of phase A (a few iterations per thread) stay rolled:
// unrolled, every warp runs their trip-count and remainder code, and this
// kernel's time follows its instructions per warp (bench/NOTES.md).
__device__ __forceinline__ void fill_words(unsigned char* begin, int32_t count, uint32_t word) {
  uint4* vectors = reinterpret_cast<uint4*>(begin);
#pragma unroll 1
  for (int32_t v = threadIdx.x; v < count; v += kThreads) vectors[v] = make_uint4(word, word, word, word);
}

// Fused gather: the warp copies the rows of the lanes with `has_row` set
// (host slot `g`, physical hot row `row`), exactly as gather_compact would
// copy those swap entries: a destination outside the hot cache is skipped, a
// source past the host rows zero-fills.
__device__ __forceinline__ void warp_copy_assigned_rows(const GatherCompactParams& g_params, bool has_row,
                                                        int32_t g, int32_t row, int lane) {
  const uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  if (has_row) {
    const int64_t offset = hot_row_offset(row, g_params.hot_block_size, g_params.hot_block_stride);
    if (offset < g_params.hot_span_rows) {
      dst = g_params.hot + offset * g_params.row_bytes;
      if (g < g_params.host_rows) src = g_params.host + static_cast<int64_t>(g) * g_params.host_pitch;
    }
  }
  const unsigned rows = __ballot_sync(kFullMask, dst != nullptr);
  if (rows == 0) return;
  // Lane e takes the row of the e-th lane with one, as warp_copy_rows wants.
  const int n = __popc(rows);
  const int from = lane < n ? static_cast<int>(__fns(rows, 0, lane + 1)) : 0;
  const uint8_t* my_src = reinterpret_cast<const uint8_t*>(
      __shfl_sync(kFullMask, reinterpret_cast<uintptr_t>(src), from));
  uint8_t* my_dst = reinterpret_cast<uint8_t*>(__shfl_sync(kFullMask, reinterpret_cast<uintptr_t>(dst), from));
  // Four loads in flight per lane: the block already holds 64 registers per
  // thread, and one step's few misses fit one pass.
  warp_copy_rows<4>(n, my_src, my_dst, static_cast<int>(g_params.row_bytes / kChunkBytes), lane);
}

// kEarlyStage: the fused gather stages the misses the held filter proves
// in phase B (a bulk stage only); a separate instantiation, so that the
// other launches run none of its instructions.
template <bool kEarlyStage>
__global__ void __launch_bounds__(kThreads, 1)
    resolve_residency_kernel(const ResolveResidencyParams p, const ResolverConstants c,
                             const ResolverSharedLayout layout) {
  extern __shared__ __align__(16) unsigned char smem[];
  int32_t* const hash_keys = reinterpret_cast<int32_t*>(smem + layout.hash_keys);
  uint32_t* const hash_values = reinterpret_cast<uint32_t*>(smem + layout.hash_values);
  int32_t* const member_slots = reinterpret_cast<int32_t*>(smem + layout.member_slots);
  uint16_t* const slot_info = reinterpret_cast<uint16_t*>(smem + layout.slot_info);
  int32_t* const scratch = reinterpret_cast<int32_t*>(smem + layout.scratch);
  int32_t* const member_keys = reinterpret_cast<int32_t*>(smem + layout.member_keys);
  int32_t* const member_first = reinterpret_cast<int32_t*>(smem + layout.member_first);
  int16_t* const lru_copy = reinterpret_cast<int16_t*>(smem + layout.lru_copy);
  int32_t* const evictable = reinterpret_cast<int32_t*>(smem + layout.evictable);
  uint16_t* const entry_codes = reinterpret_cast<uint16_t*>(smem + layout.entry_codes);
  uint8_t* const member_held = smem + layout.member_held;
  const UnionTableView table{hash_keys, hash_values, layout.hash_capacity};

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int32_t b = blockIdx.x;
  const int32_t B = p.num_batch_rows;
  const int32_t T = p.num_tokens;
  const int32_t K = p.top_k;
  const int32_t H = p.hot_size;
  const int32_t max_union = p.max_union_rows;

  // ---- Phase A. Under a programmatic launch this block may start before
  // the kernel ahead of it in the stream (the indexer, or the last step's
  // resolver) has finished: only shared memory is touched until
  // wait_for_prior_grid().
  const ResolverMissStage& stage = c.miss_stage;
  const uint32_t stage_barrier =
      static_cast<uint32_t>(__cvta_generic_to_shared(scratch + kScratchStageBarrier));
  if (b < B) {
    fill_words(smem + layout.hash_keys, c.ones_vectors, 0xFFFFFFFFu);
    fill_words(smem + layout.slot_info, c.zero_vectors, 0u);
    if (tid == 0 && p.fused_gather && stage.rows > 0 && c.bulk_stage) mbarrier_init_one_arrival(stage_barrier);
  }
  wait_for_prior_grid();
  // Every load that depends only on b is issued first, so the scalar reads,
  // the request scan and the state row copies overlap instead of waiting on
  // one another.
  const int32_t* const valid_rows_ptr = p.num_valid_rows;
  const int32_t orphan_owner = b < T ? p.req_id_per_token[b] : -1;
  const int32_t s = b < B ? p.request_state_indices[b] : -1;
  const int32_t valid_rows = valid_rows_ptr != nullptr ? min(max(*valid_rows_ptr, 0), T) : T;
  if (b >= B) {
    write_orphan_rows(p, valid_rows, orphan_owner);
    return;
  }
  const bool state_in_range = s >= 0 && s < p.num_state_rows;
  const int32_t* const hot_table = p.hot_block_table + b * p.hot_table_row_stride;
  const int32_t* const source =
      p.source_block_table != nullptr ? p.source_block_table + b * p.source_table_row_stride : nullptr;
  const int32_t* const resident =
      p.resident_block_table != nullptr ? p.resident_block_table + b * p.resident_table_row_stride : nullptr;
  // Two commit groups: the lru row (needed at B1), then the dgi row (needed
  // in phase C1) into the evictable words, which are free until phase C2.
  int32_t* const held_copy = evictable;
  if (state_in_range) {
    start_int16_row_copy<kThreads>(lru_copy, p.lru_slots + static_cast<int64_t>(s) * H, H);
    start_int32_row_copy<kThreads>(held_copy, p.device_global_indices + static_cast<int64_t>(s) * H, H);
    prefetch_int32_row<kThreads>(hot_table, c.hot_table_entries);
    // The request's top-k rows are only known after the row scan (B1); in
    // the usual batch every request has T / B consecutive rows, so fetch
    // those now (a wrong guess costs bandwidth, never correctness).
    if (c.rows_per_request > 0) {
      const int32_t rows = c.rows_per_request;
      for (int32_t r = 0; r < min(rows, 4); ++r) {
        prefetch_int32_row<kThreads>(p.topk_indices + static_cast<int64_t>(b * rows + r) * p.topk_row_stride, K);
      }
    }
    if (source != nullptr) prefetch_int32_row<kThreads>(source, p.source_table_width);
    if (resident != nullptr) prefetch_int32_row<kThreads>(resident, p.resident_table_width);
  }
  {
    int first = INT_MAX, last = -1, count = 0, duplicate = 0;
    // Rows are read up to T, not valid_rows, so these loads need not wait
    // for num_valid_rows.
    for (int32_t t = tid; t < T; t += kThreads) {
      if (p.req_id_per_token[t] == b && t < valid_rows) {
        first = min(first, t);
        last = max(last, t);
        ++count;
      }
    }
    for (int32_t earlier = tid; earlier < b; earlier += kThreads) {
      duplicate |= p.request_state_indices[earlier] == s;
    }
    duplicate &= s >= 0;
    first = warp_min(first);
    last = warp_max(last);
    count = warp_sum(count);
    duplicate = warp_max(duplicate);
    if (lane == 0) {
      int32_t* reduce = scratch + kScratchRequestReduce;
      reduce[warp] = first;
      reduce[kWarps + warp] = last;
      reduce[2 * kWarps + warp] = count;
      reduce[3 * kWarps + warp] = duplicate;
    }
  }
  wait_async_copies<1>();  // the lru row (the dgi row may still be in flight)
  __syncthreads();  // B1
  write_orphan_rows(p, valid_rows, orphan_owner);
  const int32_t* reduce = scratch + kScratchRequestReduce;
  const int32_t t0 = warp_min(reduce[lane]);
  const int32_t last_row = warp_max(reduce[kWarps + lane]);
  const int32_t q = warp_sum(reduce[2 * kWarps + lane]);
  const bool duplicate_state = warp_max(reduce[3 * kWarps + lane]) != 0;

  if (q == 0 || s < 0 || !state_in_range || duplicate_state || last_row - t0 + 1 != q) {
    // Shared memory must not be released under an async copy still landing.
    wait_async_copies<0>();
    if (q == 0) return;
    write_request_inactive(p, c, b, t0, last_row);
    if (s >= 0 && tid == 0 && p.stats != nullptr) {
      add_stat(p, HS_STAT_LOOKUPS, static_cast<int64_t>(q) * K);
      add_stat(p, HS_STAT_INVALID, static_cast<int64_t>(q) * K);
    }
    return;
  }

  int32_t* const dgi_row = p.device_global_indices + static_cast<int64_t>(s) * H;
  int16_t* const lru_row = p.lru_slots + static_cast<int64_t>(s) * H;
  const int32_t* const topk = p.topk_indices + t0 * p.topk_row_stride;
  // Entry e of the request is topk[e / K][e % K]; a request of one token
  // row (a decode step without speculative rows) needs no division.
  const bool single_row = q == 1;
  const auto entry_position = [&](int32_t e) {
    if (single_row) return topk[e];
    const int32_t r = c.top_k.quotient(e);
    return topk[r * p.topk_row_stride + c.top_k.remainder(e, r)];
  };
  const int32_t entries = q * K;  // <= 2^30 (checked by the launcher)

  // ---- Phase B: slot occurrence counts (16-bit halves of 32-bit words) ...
  {
    uint32_t* const counts = reinterpret_cast<uint32_t*>(slot_info);
    const auto count_slot = [&](int32_t j) {
      if (j >= 0 && j < H) atomicAdd(counts + (j >> 1), 1u << ((j & 1) * 16));
    };
    const int32_t quads = H / 4;
    for (int32_t v = tid; v < quads; v += kThreads) {
      const uint2 four = reinterpret_cast<const uint2*>(lru_copy)[v];
      count_slot(static_cast<int16_t>(four.x & 0xFFFFu));
      count_slot(static_cast<int16_t>(four.x >> 16));
      count_slot(static_cast<int16_t>(four.y & 0xFFFFu));
      count_slot(static_cast<int16_t>(four.y >> 16));
    }
    if (tid < H - 4 * quads) count_slot(lru_copy[4 * quads + tid]);
  }

  // ... and the union, kResolverUnionChunk entries per chunk in entry
  // order, two consecutive entries per thread so that thread order is entry
  // order. Within a chunk each key's first entry is the smallest chunk index
  // that holds it (atomicMin on the pending marker); first entries are
  // ranked by a block scan. Once max_union_rows members exist nothing is
  // inserted any more: later keys are unknown to the table and their
  // entries overflow. A whole top-k row of k <= 2048 is one chunk: one
  // classification round trip and two barriers.
  constexpr int32_t kPerThread = kResolverUnionChunk / kThreads;
  static_assert(kPerThread == 2, "the union loop holds two entries per thread");
  int32_t union_size = 0;
  int32_t classified = 0;  // entries [0, classified) went through the union loop
  const int32_t coded = min(entries, max_union);  // entries that keep a code in shared memory
  // Fused gather, early stage: a new key of the union that the held filter
  // proves absent from the dgi row is a miss, known at B2a, a phase before
  // C1 names the rest; its host read starts after the chunk's rank scan.
  // At 100 requests the host reads of a step take longer than phases C2 to
  // F, so their start is the step's critical path.
  constexpr bool early_stage = kEarlyStage;
  uint32_t* const held_filter = reinterpret_cast<uint32_t*>(member_slots);
  int32_t* const stage_members = reinterpret_cast<int32_t*>(smem + stage.stage_members);
  const uint32_t stage_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem + stage.stage));
  int32_t staged_early = 0;  // stage rows taken in phase B (block-uniform)
  {
    const int32_t local = kPerThread * tid;  // index of the thread's first entry in a chunk
    int32_t next_position[kPerThread];
#pragma unroll
    for (int x = 0; x < kPerThread; ++x) next_position[x] = local + x < entries ? entry_position(local + x) : -1;
    for (int32_t base = 0; base < entries && union_size < max_union; base += kResolverUnionChunk) {
      int32_t position[kPerThread];
#pragma unroll
      for (int x = 0; x < kPerThread; ++x) {
        const int32_t e = base + local + x;
        position[x] = next_position[x];
        if (e < entries - kResolverUnionChunk) next_position[x] = entry_position(e + kResolverUnionChunk);
      }
      int32_t key[kPerThread];
      uint32_t h[kPerThread];
      uint16_t code[kPerThread];
#pragma unroll
      for (int x = 0; x < kPerThread; ++x) {
        const int32_t e = base + local + x;
        key[x] = -1;
        code[x] = kCodeInvalid;
        if (e < entries) {
          const Entry entry = classify(p, c, source, resident, position[x]);
          if (entry.kind == kResident) code[x] = kCodeResident;
          if (entry.kind == kHot) key[x] = entry.host_slot;
        }
      }
      table.insert(key, h);
      // Lanes leave the probe loop after different rounds; without this the
      // warp runs the rest of the chunk once per group of them.
      __syncwarp();
#pragma unroll
      for (int x = 0; x < kPerThread; ++x) {
        if (key[x] >= 0) {
          table.offer_first(h[x], local + x);
          code[x] = static_cast<uint16_t>(h[x]);
        }
      }
      // The thread's two codes as one 32-bit store (its first entry is even).
      const int32_t e = base + local;
      if (e + 1 < coded) {
        reinterpret_cast<uint32_t*>(entry_codes)[e / 2] = code[0] | (static_cast<uint32_t>(code[1]) << 16);
      } else if (e < coded) {
        entry_codes[e] = code[0];
      }
      if (early_stage && base == 0) {
        // The words of the dgi row this thread copied in phase A (landed by
        // now) clear their filter bits; B2a publishes the filter. (Empty
        // slots are skipped: a buffer that is not full yet would otherwise
        // send thousands of atomics to the one word of key -1.)
        wait_async_copies<0>();
        for_each_own_int32_copy<kThreads>(dgi_row, H, [&](int32_t j) {
          const int32_t held = held_copy[j];
          if (held < 0) return;
          const HeldFilterBit bit = held_filter_bit(held, c.held_filter_mask);
          atomicAnd(held_filter + bit.word, ~bit.mask);
        });
      }
      __syncthreads();  // B2a: every insertion and marker of the chunk is in place
      bool first_entry[kPerThread];
      // Early stage: per entry x, 16 bits at 16 * x with the stage row of a
      // sure miss, or all ones (one register across the scan).
      uint32_t stage_rows = kFullMask;
      int firsts = 0;
#pragma unroll
      for (int x = 0; x < kPerThread; ++x) {
        first_entry[x] = key[x] >= 0 && table.is_first_in_chunk(h[x], local + x);
        firsts += first_entry[x];
        if (early_stage && first_entry[x] && key[x] < c.stage_host_rows) {
          const HeldFilterBit bit = held_filter_bit(key[x], c.held_filter_mask);
          if (held_filter[bit.word] & bit.mask) {
            // (Past 0xFFFE sure misses the stage is long full: stage_now is false.)
            const uint32_t row = min(atomicAdd(scratch + kScratchSureMisses, 1), 0xFFFE);
            stage_rows &= ~(0xFFFFu << (16 * x)) | (row << (16 * x));
          }
        }
      }
      int32_t new_keys;
      int32_t rank = union_size + block_exclusive_sum_small<2>(firsts, scratch + kScratchUnionScan, &new_keys);
      // B2b (inside the scan); the next chunk's writes of the scan
      // buffer come after its own B2a.
      bool stage_now = false;
      if (early_stage) {
        // All or nothing, like the stage after C1 (the count runs over the
        // chunks, so once it outgrows the stage it stays so): a few misses
        // are worth a head start, many are better copied by phase E alone.
        const int32_t sure_misses = scratch[kScratchSureMisses];  // final since B2b
        stage_now = sure_misses <= stage.rows;
        if (stage_now) staged_early = sure_misses;
      }
#pragma unroll
      for (int x = 0; x < kPerThread; ++x) {
        if (!first_entry[x]) continue;
        const uint32_t stage_row = (stage_rows >> (16 * x)) & 0xFFFFu;
        if (stage_now && stage_row != 0xFFFFu) {
          // A key past max_union_rows is no member: its stage row stays unused.
          const bool member = rank < max_union;
          if (member) {
            bulk_copy_to_shared(stage_barrier, stage_base + stage_row * c.stage_row_bytes,
                                c.stage_host + static_cast<int64_t>(key[x]) * c.stage_host_pitch, c.stage_row_bytes);
            member_held[rank] = 2;
          }
          stage_members[stage_row] = member ? rank : -1;
        }
        table.set_rank(h[x], static_cast<uint32_t>(rank));
        if (rank < max_union) {
          member_keys[rank] = key[x];
          member_first[rank] = base + local + x;
        }
        ++rank;
      }
      union_size += new_keys;
      classified = min(entries, base + kResolverUnionChunk);
    }
  }
  const int32_t members = min(union_size, max_union);
  // The stage after C1 continues the early stage's rows. (A sure miss is
  // held by no slot, so C1 never marks the members staged here as held.)
  if (tid == 0 && staged_early > 0) scratch[kScratchStagedRows] = staged_early;
  wait_async_copies<0>();
  __syncthreads();  // B2: ranks, member keys, slot counts and the dgi row copy final

  // ---- Phase C1: per slot j, usable (docs step 3) and the member it holds.
  int held_here = 0;  // members this thread found held (fused gather's miss estimate)
  for (int32_t base = 0; base < H; base += 4 * kThreads) {
    int32_t held[4];
    int32_t block[4];
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      // Past H, slot H - 1 is read and its values ignored below: loads
      // without a predicate let every slot share one table address.
      const int32_t j = min(base + x * kThreads + tid, H - 1);
      held[x] = held_copy[j];
      block[x] = __ldg(hot_table + c.hot_block_size.quotient(j));
    }
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int32_t j = base + x * kThreads + tid;
      if (j < H) {
        uint32_t info = 0;
        const int32_t hot_block = c.hot_block_size.quotient(j);
        if (slot_info[j] == 1 && block[x] >= 0 &&
            (block[x] <= c.safe_hot_block ||
             static_cast<int64_t>(block[x]) * p.attention_block_stride + c.hot_block_size.remainder(j, hot_block) <=
                 kInt32Max)) {
          info = kSlotUsable;
          if (held[x] >= 0) {
            const uint32_t rank = table.find(held[x]);
            if (rank < static_cast<uint32_t>(max_union)) {
              info |= rank + 1;
              member_held[rank] = 1;
              ++held_here;
            }
          }
        }
        slot_info[j] = static_cast<uint16_t>(info);
      }
    }
  }
  if (p.fused_gather) {
    const int held_sum = warp_sum(held_here);
    if (lane == 0 && held_sum != 0) atomicAdd(scratch + kScratchHeldMembers, held_sum);
  }
  __syncthreads();  // B3

  // Members, a contiguous run of ranks per thread (<= 32), for phases D-G.
  const int32_t member_run = (members + kThreads - 1) / kThreads;
  const int32_t member_begin = min(tid * member_run, members);
  const int32_t member_end = min(member_begin + member_run, members);

  // ---- Fused gather, after C1: a member that no usable slot holds misses
  // this step (phase D may still find no slot for it). When all of the
  // request's misses fit the miss stage, the warps start reading the host
  // rows of those phase B did not stage into it right away, so the round
  // trip to host memory (a page walk and a PCIe read, several microseconds)
  // overlaps phases C2, D and F instead of following them (in kernel<true>
  // only the held filter's misses of it: collisions, or keys that the
  // filter could not see). Larger swap lists go through phase E alone:
  // async copies from host memory are slow in bulk, and a few staged rows
  // of many only cost bandwidth. (members - held members seen in C1 is
  // the miss count, or less when a corrupt table holds a member twice;
  // either way only the choice, never the bytes, depends on it.)
  const int32_t misses_seen = members - scratch[kScratchHeldMembers];
  if (p.fused_gather && stage.rows > 0 && misses_seen <= stage.rows && misses_seen > staged_early) {
    const uint32_t row_bytes = c.stage_row_bytes;
    const int32_t chunks = static_cast<int32_t>(row_bytes / kChunkBytes);
    for (int32_t i = 0; i < member_run; ++i) {
      const int32_t r = member_begin + i;
      int32_t g = -1;
      // A source past the host rows zero-fills: phase E does that directly.
      if (r < member_end && member_held[r] == 0 && member_keys[r] < c.stage_host_rows) g = member_keys[r];
      const unsigned wanted = __ballot_sync(kFullMask, g >= 0);
      if (wanted == 0) continue;
      int32_t first = 0;
      if (lane == 0) first = atomicAdd(scratch + kScratchStagedRows, __popc(wanted));
      first = __shfl_sync(kFullMask, first, 0);
      const int32_t index = first + __popc(wanted & ((1u << lane) - 1u));
      const bool staged_here = g >= 0 && index < stage.rows;
      if (staged_here) {
        stage_members[index] = r;
        member_held[r] = 2;
      }
      const uint8_t* const src = g >= 0 ? c.stage_host + static_cast<int64_t>(g) * c.stage_host_pitch : nullptr;
      const uint32_t dst = stage_base + static_cast<uint32_t>(index) * row_bytes;
      if (c.bulk_stage) {
        // One bulk copy per row, from the lane that owns it.
        if (staged_here) bulk_copy_to_shared(stage_barrier, dst, src, row_bytes);
        continue;
      }
      // Sixteen bytes per lane: the warp moves the rows one after another.
      // Indices grow with the lane, so the first one past the stage ends it.
      for (unsigned left = wanted; left != 0; left &= left - 1u) {
        const int from = __ffs(left) - 1;
        const int32_t row_index = __shfl_sync(kFullMask, index, from);
        if (row_index >= stage.rows) break;
        const uint8_t* const row_src =
            reinterpret_cast<const uint8_t*>(__shfl_sync(kFullMask, reinterpret_cast<uintptr_t>(src), from));
        const uint32_t row_dst = __shfl_sync(kFullMask, dst, from);
        for (int32_t chunk = lane; chunk < chunks; chunk += kWarpSize) {
          start_chunk_copy_to_shared(row_dst + kChunkBytes * chunk,
                                     smem + stage.stage + (row_dst - stage_base) + kChunkBytes * chunk,
                                     row_src + kChunkBytes * chunk);
        }
      }
    }
    if (!c.bulk_stage) commit_async_copies();
  }

  // ---- Phase C2: LRU positions, a contiguous run per thread (<= 32). A
  // hit position offers itself to its member (the largest position wins);
  // the rest are evictable, compacted in order with one scan that also
  // counts the unusable ones (high half) for the renumbering of misses.
  const int32_t per_thread = (H + kThreads - 1) / kThreads;
  const int32_t begin = min(tid * per_thread, H);
  const int32_t end = min(begin + per_thread, H);
  uint32_t hit_bits = 0, unusable_bits = 0;
  int32_t evictable_here = 0, unusable_here = 0;
  for (int32_t i = begin; i < end; ++i) {
    const int32_t j = lru_copy[i];
    const uint32_t info = j >= 0 && j < H ? slot_info[j] : 0u;
    const uint32_t bit = 1u << (i - begin);
    if (info & kSlotRankMask) {
      hit_bits |= bit;
      atomicMax(member_slots + (info & kSlotRankMask) - 1, i);
    } else {
      ++evictable_here;
      if (!(info & kSlotUsable)) {
        unusable_bits |= bit;
        ++unusable_here;
      }
    }
  }
  int32_t packed_total;
  const int32_t packed_before =
      block_exclusive_sum(evictable_here | (unusable_here << 16), scratch + kScratchPositionScan, &packed_total);
  // B4 (inside the scan): member_slots hold the last hit positions.
  const int32_t evictable_total = packed_total & 0xFFFF;
  const int32_t evictable_before = packed_before & 0xFFFF;
  {
    int32_t x = evictable_before;
    int32_t usable_before = evictable_before - (packed_before >> 16);
    for (int32_t i = begin; i < end; ++i) {
      const uint32_t bit = 1u << (i - begin);
      if (hit_bits & bit) continue;
      const bool usable = !(unusable_bits & bit);
      evictable[x++] = (usable_before << 16) | (usable ? static_cast<int32_t>(lru_copy[i]) : kNoSlot);
      usable_before += usable;
    }
  }

  // ---- Phase D: members. Misses are numbered in rank order by a scan;
  // miss m takes E[m].
  uint32_t miss_bits = 0;
  int32_t misses_here = 0;
  for (int32_t r = member_begin; r < member_end; ++r) {
    if (member_slots[r] < 0) {
      miss_bits |= 1u << (r - member_begin);
      ++misses_here;
    }
  }
  int32_t miss_total;
  // Runs of up to three members (a union of at most 3072) take the ballot scan.
  int32_t m = member_run <= 3 ? block_exclusive_sum_small<2>(misses_here, scratch + kScratchMemberScan, &miss_total)
                              : block_exclusive_sum(misses_here, scratch + kScratchMemberScan, &miss_total);
  // B5 (inside the scan): E is complete.
  const int32_t taken = min(miss_total, evictable_total);  // n
  int32_t assigned_total = 0;
  if (taken > 0) {
    const int32_t word = evictable[taken - 1];
    assigned_total = (word >> 16) + ((word & kSlotMask) != kNoSlot);
  }
  int32_t unstaged_here = 0;  // fused gather: assigned misses phase E must copy
  for (int32_t r = member_begin; r < member_end; ++r) {
    int32_t j = -1;      // the member's slot once served
    int32_t order = -1;  // m' (index among assigned misses) for an assigned miss
    if (!(miss_bits & (1u << (r - member_begin)))) {
      j = lru_copy[member_slots[r]];  // the last hit position's slot
      member_first[r] = kServedHit;
    } else {
      const int32_t word = m < taken ? evictable[m] : kNoSlot;
      if ((word & kSlotMask) != kNoSlot) {
        j = word & kSlotMask;
        order = word >> 16;
      } else {
        member_first[r] = kNotServed;  // dropped, or no evictable position left
      }
      ++m;
    }
    if (j < 0) continue;
    // Physical row and attention index of the slot (usable: both fit int32).
    const int32_t hot_block = c.hot_block_size.quotient(j);
    const int32_t block = __ldg(hot_table + hot_block);
    const int32_t offset = c.hot_block_size.remainder(j, hot_block);
    const int32_t row = static_cast<int32_t>(static_cast<int64_t>(block) * p.hot_block_size + offset);
    const int32_t key = member_keys[r];
    member_slots[r] = row;
    member_keys[r] = static_cast<int32_t>(static_cast<int64_t>(block) * p.attention_block_stride + offset);
    if (order >= 0) {
      if (p.fused_gather) unstaged_here += member_held[r] != 2;
      dgi_row[j] = key;
      const int32_t swap_row = c.top_k.quotient(order);
      const int64_t t = t0 + swap_row;
      const int32_t column = c.top_k.remainder(order, swap_row);
      p.out_swap_host_rows[t * p.out_swap_host_rows_row_stride + column] = key;
      p.out_swap_device_rows[t * p.out_swap_device_rows_row_stride + column] = row;
    }
  }
  if (p.fused_gather) {
    const int unstaged_sum = warp_sum(unstaged_here);
    if (lane == 0 && unstaged_sum != 0) atomicAdd(scratch + kScratchUnstagedMisses, unstaged_sum);
  }
  for (int32_t r = tid; r < q; r += kThreads) {
    const int64_t remaining = static_cast<int64_t>(assigned_total) - static_cast<int64_t>(r) * K;
    p.out_swap_counts[t0 + r] = static_cast<int32_t>(min(max(remaining, int64_t{0}), static_cast<int64_t>(K)));
  }
  {
    // New LRU order E[n:], E[:n], P into the (now free) slot_info words.
    int16_t* const next_lru = reinterpret_cast<int16_t*>(slot_info);
    int32_t x = evictable_before;
    for (int32_t i = begin; i < end; ++i) {
      int32_t destination;
      if (hit_bits & (1u << (i - begin))) {
        destination = evictable_total + (i - x);
      } else {
        destination = x >= taken ? x - taken : evictable_total - taken + x;
        ++x;
      }
      next_lru[destination] = lru_copy[i];
    }
  }
  __syncthreads();  // B6: member slots final, new LRU complete

  // A block left with no host reads of its own (phase E) lets the next
  // programmatic launch start now, so its launch and shared-memory fill
  // overlap phases F and G here; one with phase-E copies lets it start only
  // at its exit. (Triggering early in blocks that copy many rows made fused
  // steps at 5% and 20% misses 13-30% slower on an H200: bench/NOTES.md.)
  // The next kernel still sees all of this one's writes: it waits for the
  // whole grid in its wait_for_prior_grid().
  const bool phase_e = p.fused_gather && scratch[kScratchUnstagedMisses] > 0;  // final since B6
  if (!phase_e) allow_dependent_launch();

  // ---- Phase E (fused gather only): each warp copies the rows of its own
  // assigned misses that were not staged (member_first still holds their
  // first entry), so the host reads overlap phase F of the other warps.
  // Skipped when the stage holds every one.
  if (phase_e) {
    for (int32_t i = 0; i < member_run; ++i) {
      const int32_t r = member_begin + i;
      const bool assigned = r < member_end && member_first[r] >= 0 && member_held[r] != 2;
      int32_t g = -1, row = -1;
      if (assigned) {
        const int32_t e = member_first[r];
        row = member_slots[r];
        if (e < classified && e < coded) {
          g = table.key_at(entry_codes[e]);
        } else {
          g = classify(p, c, source, resident, entry_position(e)).host_slot;
        }
      }
      warp_copy_assigned_rows(p.gather, assigned, g, row, lane);
    }
  }

  // ---- Phase F: state out, then per-entry outputs.
  copy_int16_row<kThreads>(lru_row, reinterpret_cast<const int16_t*>(slot_info), H);

  int32_t* const row_counts = scratch + kScratchRowCounts;
  int32_t* const totals = scratch + kScratchTotals;
  int valid_here = 0, resident_here = 0;
  const int32_t groups = (q + 31) / 32;
  for (int32_t group = 0; group < groups; ++group) {
    int32_t* const counts = row_counts + (group & 1) * 32;
    const int32_t row_begin = group * 32;
    const int32_t row_end = min(q, row_begin + 32);
    const int32_t group_end = row_end * K;
    for (int32_t group_base = row_begin * K; group_base < group_end; group_base += kThreads) {
      const int32_t e = group_base + tid;
      const bool inside = e < group_end;
      int32_t local_row = -1;
      bool valid = false;
      if (inside) {
        const int32_t r = single_row ? 0 : c.top_k.quotient(e);
        const int32_t k = single_row ? e : c.top_k.remainder(e, r);
        const int64_t t = t0 + r;
        local_row = r - row_begin;
        // Entries the union loop saw keep their code; the rest (past the
        // codes, or after the union filled up) are classified again.
        const uint16_t code = e < classified && e < coded ? entry_codes[e] : kCodeResident;
        Entry entry{kInvalid, -1, -1, -1};
        uint32_t rank = kNoRank;
        if (code < kCodeResident) {
          entry.kind = kHot;
          entry.host_slot = table.key_at(code);
          rank = table.value_at(code);
        } else if (code == kCodeResident) {
          entry = classify(p, c, source, resident, topk[r * p.topk_row_stride + k]);
          if (entry.kind == kHot) rank = table.find(entry.host_slot);
        }
        int32_t row = -1, address = -1;
        int32_t miss = 0;
        if (entry.kind == kResident) {
          row = static_cast<int32_t>(entry.row);
          address = static_cast<int32_t>(entry.address);
          valid = true;
          ++resident_here;
        } else if (entry.kind == kHot && rank < static_cast<uint32_t>(max_union)) {
          const int32_t first = member_first[rank];
          if (first != kNotServed) {
            row = member_slots[rank];
            address = member_keys[rank];
            valid = true;
            miss = first == e;
          }
        }
        valid_here += valid;
        const int32_t hot_row_out = row;
        const int32_t attention_out = address;
        const int32_t resolved_out = valid ? entry.host_slot : -1;
        if (c.entry_output_stride >= 0) {
          const int64_t offset = t * c.entry_output_stride + k;
          p.out_hot_rows[offset] = hot_row_out;
          p.out_attention[offset] = attention_out;
          p.out_resolved[offset] = resolved_out;
          p.out_miss_mask[offset] = miss;
        } else {
          p.out_hot_rows[t * p.out_hot_rows_row_stride + k] = hot_row_out;
          p.out_attention[t * p.out_attention_row_stride + k] = attention_out;
          p.out_resolved[t * p.out_resolved_row_stride + k] = resolved_out;
          p.out_miss_mask[t * p.out_miss_mask_row_stride + k] = miss;
        }
      }
      // One shared atomic per run of lanes on one token row (rows grow with
      // the lane; lanes past the group form the last run). A single row's
      // count is the request's valid total.
      if (single_row) continue;
      const int32_t previous_row = __shfl_up_sync(kFullMask, local_row, 1);
      const unsigned heads = __ballot_sync(kFullMask, lane == 0 || previous_row != local_row);
      const unsigned valid_lanes = __ballot_sync(kFullMask, valid);
      if (inside && ((heads >> lane) & 1u)) {
        const unsigned later_heads = heads & ~((2u << lane) - 1u);
        const unsigned run = (later_heads != 0 ? (later_heads & (0u - later_heads)) - 1u : kFullMask) &
                             ~((1u << lane) - 1u);
        const int count = __popc(valid_lanes & run);
        if (count != 0) atomicAdd(counts + local_row, count);
      }
    }
    if (group == groups - 1) {
      const int valid_sum = warp_sum(valid_here);
      const int resident_sum = warp_sum(resident_here);
      if (lane == 0) {
        atomicAdd(totals, valid_sum);
        atomicAdd(totals + 1, resident_sum);
      }
    }
    __syncthreads();  // B7: this group's row counts (and, last, the totals) complete
    if (tid < row_end - row_begin) {
      p.out_valid_counts[t0 + row_begin + tid] = single_row ? totals[0] : counts[tid];
      counts[tid] = 0;  // reused by group + 2, after the next barrier
    }
  }

  if (tid == 0 && p.stats != nullptr) {
    const int64_t lookups = static_cast<int64_t>(entries);
    add_stat(p, HS_STAT_LOOKUPS, lookups);
    add_stat(p, HS_STAT_HITS, members - miss_total);
    add_stat(p, HS_STAT_MISSES, assigned_total);
    add_stat(p, HS_STAT_RESIDENT, totals[1]);
    add_stat(p, HS_STAT_INVALID, lookups - totals[0]);
  }

  // ---- Phase G (fused gather, staged misses): every thread waits for its
  // own async copies and the barrier publishes all of them; then the warps
  // move the staged rows of the misses that got a slot to their hot rows.
  if (p.fused_gather && stage.rows > 0) {
    const int32_t staged = min(scratch[kScratchStagedRows], stage.rows);  // final since B4
    if (staged > 0) {
      if (c.bulk_stage) {
        // Every bulk copy was announced before B4 (in phase B or after C1);
        // warp 0 always waits, so the block outlives the copies into its
        // shared memory.
        if (tid == 0) mbarrier_arrive(stage_barrier);
        if (warp >= staged) return;
        mbarrier_wait_first_phase(stage_barrier);
      } else {
        wait_async_copies<0>();
        __syncthreads();  // B8
      }
      const int32_t chunks = static_cast<int32_t>(c.stage_row_bytes / kChunkBytes);
      for (int32_t index = warp; index < staged; index += kWarps) {
        const int32_t r = stage_members[index];
        if (r < 0 || member_first[r] < 0) continue;  // no member, or no slot was left for it
        // hot_row_offset of the physical row (< 2^31), by the launch's
        // divisor: the gather's hot block size is the resolver's.
        const int32_t row = member_slots[r];
        const int32_t block = c.hot_block_size.quotient(row);
        const int64_t offset =
            static_cast<int64_t>(block) * c.stage_hot_block_stride + c.hot_block_size.remainder(row, block);
        if (offset >= c.stage_hot_span_rows) continue;
        uint8_t* const dst = c.stage_hot + offset * c.stage_row_bytes;
        const uint8_t* const src = smem + stage.stage + index * c.stage_row_bytes;
        for (int32_t chunk = lane; chunk < chunks; chunk += kWarpSize) {
          store_chunk(dst + kChunkBytes * chunk, load_chunk(src + kChunkBytes * chunk));
        }
      }
    }
  }
}

// cudaFuncSetAttribute is a driver round trip: do it once per device and
// size, with a lock-free check on the launch path.
constexpr int kCachedDevices = 64;
std::atomic<uint32_t> g_configured_shared_bytes[2][kCachedDevices];  // per instantiation
std::mutex g_configure_mutex;

template <bool kEarlyStage>
void ensure_dynamic_shared_memory(int device, uint32_t bytes) {
  constexpr uint32_t kDefaultLimit = 48 * 1024;
  if (bytes <= kDefaultLimit) return;
  std::atomic<uint32_t>* const configured = g_configured_shared_bytes[kEarlyStage ? 1 : 0];
  const bool cached = device >= 0 && device < kCachedDevices;
  if (cached && configured[device].load(std::memory_order_acquire) >= bytes) return;
  std::lock_guard<std::mutex> lock(g_configure_mutex);
  if (cached && configured[device].load(std::memory_order_relaxed) >= bytes) return;
  cuda_check(cudaFuncSetAttribute(resolve_residency_kernel<kEarlyStage>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bytes)),
             "cudaFuncSetAttribute(resolve_residency, MaxDynamicSharedMemorySize)");
  if (cached) configured[device].store(bytes, std::memory_order_release);
}

// Rows the fused gather stages early, at most: every miss of a decode step
// at low miss rates (0.1% of k = 2048 is 2 per request), where the host
// round trip is the whole cost of the copy. Few on purpose: async copies
// from host memory ran at about 20 GB/s over 100 SMs on an H200 (a stage of
// 128 rows doubled the fused step at 5% misses), while phase E's loads
// reach the link; the rest of a large swap list goes through phase E.
constexpr int32_t kMissStageRows = 8;

int compute_capability_major(int device) {
  static std::atomic<int> cached_major[kCachedDevices];
  const bool cached = device >= 0 && device < kCachedDevices;
  if (cached) {
    const int known = cached_major[device].load(std::memory_order_relaxed);
    if (known > 0) return known;
  }
  int major = 0;
  cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
             "cudaDeviceGetAttribute(ComputeCapabilityMajor)");
  if (cached) cached_major[device].store(major, std::memory_order_relaxed);
  return major;
}

uint64_t shared_memory_limit(int device) {
  int limit = 0;
  cuda_check(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  return static_cast<uint64_t>(limit);
}

}  // namespace

void launch_resolve_residency(const ResolveResidencyParams& params, cudaStream_t stream) {
  if (params.num_tokens <= 0) return;
  // Entry indices (and loop counters that step past them) are int32 inside
  // the kernel: 2^30 entries is a 4 GiB top-k tensor.
  if (static_cast<int64_t>(params.num_tokens) * params.top_k > kMaxEntries) {
    invalid_argument("topk_indices: the CUDA resolver handles at most ", kMaxEntries,
                     " entries (rows x top_k), got ", params.num_tokens, " x ", params.top_k);
  }
  int device = params.device;
  if (device < 0) cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  const uint64_t limit = shared_memory_limit(device);
  const int32_t max_slack_halves = kResolverMaxSlackHalves;
  const ResolverLaunchLayout chosen =
      resolver_launch_layout(params.hot_size, params.max_union_rows, params.fused_gather ? params.gather.row_bytes : 0,
                             params.fused_gather ? kMissStageRows : 0, limit, max_slack_halves);
  const ResolverSharedLayout& layout = chosen.layout;
  ResolverConstants constants;
  constants.miss_stage = chosen.stage;
  const uint32_t shared_bytes = constants.miss_stage.total_bytes;
  constants.top_k = FastDivisor::make(params.top_k);
  constants.block_size = FastDivisor::make(params.source_block_table != nullptr ? params.block_size : 1);
  constants.hot_block_size = FastDivisor::make(params.hot_block_size);
  constants.safe_hot_block = static_cast<int32_t>(std::min<int64_t>(
      INT32_MAX, (INT32_MAX - (params.hot_block_size - 1)) / params.attention_block_stride));
  constants.hot_table_entries = (params.hot_size + params.hot_block_size - 1) / params.hot_block_size;
  const bool hopper = compute_capability_major(device) >= 9;
  constants.bulk_stage = hopper;
  const bool early_stage = hopper && params.fused_gather && chosen.stage.rows > 0 && params.max_union_rows > 0;
  if (early_stage) {
    ensure_dynamic_shared_memory<true>(device, shared_bytes);
  } else {
    ensure_dynamic_shared_memory<false>(device, shared_bytes);
  }
  // The held filter's bits: the largest power of two within member_slots.
  uint32_t filter_bits = 32;
  while (filter_bits * 2 <= 32ull * static_cast<uint64_t>(std::max(params.max_union_rows, 1))) filter_bits *= 2;
  constants.held_filter_mask = filter_bits - 1;
  constants.stage_host = params.fused_gather ? params.gather.host : nullptr;
  constants.stage_host_pitch = params.fused_gather ? params.gather.host_pitch : 0;
  constants.stage_host_rows =
      params.fused_gather ? static_cast<int32_t>(std::min<int64_t>(params.gather.host_rows, INT32_MAX)) : 0;
  constants.stage_row_bytes = params.fused_gather ? static_cast<uint32_t>(params.gather.row_bytes) : 0;
  constants.stage_hot = params.fused_gather ? params.gather.hot : nullptr;
  constants.stage_hot_block_stride = params.fused_gather ? params.gather.hot_block_stride : 0;
  constants.stage_hot_span_rows = params.fused_gather ? params.gather.hot_span_rows : 0;
  constants.ones_vectors = static_cast<int32_t>((layout.slot_info - layout.hash_keys) / 16);
  constants.zero_vectors = static_cast<int32_t>((layout.scratch + 4 * kScratchZeroedWords - layout.slot_info) / 16);
  constants.rows_per_request =
      params.num_batch_rows > 0 && params.num_tokens % params.num_batch_rows == 0
          ? params.num_tokens / params.num_batch_rows
          : 0;
  const int64_t stride = params.out_attention_row_stride;
  const bool shared_stride = params.out_hot_rows_row_stride == stride && params.out_resolved_row_stride == stride &&
                             params.out_miss_mask_row_stride == stride;
  constants.entry_output_stride = shared_stride ? stride : -1;
  // One block per batch row plus one; every block also writes its share of
  // the orphan token rows, so B == 0 still launches the one that writes them.
  const unsigned blocks = static_cast<unsigned>(params.num_batch_rows) + 1u;

  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  // Programmatic serialization lets this launch and the kernel ahead of it
  // overlap up to the kernel's wait_for_prior_grid() (launch latency and the
  // shared-memory fill); Hopper and later.
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = hopper ? 1 : 0;
  cuda_check(early_stage ? cudaLaunchKernelEx(&config, resolve_residency_kernel<true>, params, constants, layout)
                         : cudaLaunchKernelEx(&config, resolve_residency_kernel<false>, params, constants, layout),
             "resolve_residency kernel launch");
}

}  // namespace cuda
}  // namespace hisparse
