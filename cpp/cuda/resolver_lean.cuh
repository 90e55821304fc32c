// The lean resolver: a launch of more requests than the device has SMs (up
// to twice as many) resolves one request per 1024-thread block with two
// blocks per SM, so that every request starts at once instead of one block
// per SM resolving two in turn. Two blocks fit one SM where a block takes 32
// registers per thread and under half the SM's shared memory; this file's
// phases are written for that budget: a request's arrays are its union
// table, its state row and the evictable list, and a member's state lives in
// its table value instead of arrays of its own. Bit-identical to
// resolve_residency_reference.cpp for any input (any token rows per
// request, corrupt state rows, union overflow); fast for the usual one row
// per request.
//
// Phases, each ending at a block barrier (steps of docs/residency.md):
//   A  find the request's token rows and state row; start copying its LRU
//      and device_global_indices rows into shared memory (B1)
//   B  step 3's bits (slots listed once, slots on a usable hot block);
//      steps 1-2 row by row: each hot entry's
//      host row enters the union table and the key's first entry gets the
//      next rank (B2a, a scan, per row; B2)
//   C  step 4: every LRU position whose usable slot holds a member is a hit
//      position (the member's value keeps the last); the others form E,
//      with the usable ones counted (a scan; B3)
//   D  step 5: misses numbered in rank order take E oldest first, their
//      swap entries and, with a fused gather, their rows (a scan; the first
//      rows staged in shared memory, the others copied); step 6's new LRU
//      order (B4)
//   F  step 7's per-entry outputs and valid counts, row by row (a scan per
//      row); step 8's counters; the staged rows written out (B5)
//
// A member's table value after each phase:
//   B  its rank in bits 0-12 (max_union_rows for a key past the union)
//   C  and, for a hit, its last hit position + 1 in bits 16-28
//   D  and, for a miss, kAssigned with its slot in bits 16-28, or kNotServed
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/resolve_residency_params.hpp"
#include "core/resolver_shared_memory.hpp"
#include "cuda/async_copy.cuh"
#include "cuda/block_scan.cuh"
#include "cuda/hopper_sync.cuh"
#include "cuda/resolver_context.cuh"
#include "cuda/resolver_gather.cuh"
#include "cuda/resolver_inactive_rows.cuh"
#include "cuda/union_table.cuh"

namespace hisparse {
namespace cuda {
namespace lean {

constexpr int kThreads = kResolverThreads;
constexpr int kWarps = kResolverWarps;
constexpr int kEntries = 2;    // entries 2t and 2t + 1 of each token row for thread t
constexpr int kPositions = 4;  // LRU positions 4t .. 4t + 3 for thread t
constexpr int32_t kMaxTopK = kEntries * kThreads;
constexpr int32_t kMaxHotSize = kPositions * kThreads;
constexpr int32_t kMaxUnionRows = 4096;

// Member values (see the top of this file).
constexpr uint32_t kRankMask = 0x1FFFu;
constexpr int kFieldShift = 16;
constexpr uint32_t kFieldMask = 0x1FFFu;
constexpr uint32_t kNotServed = 1u << 29;
constexpr uint32_t kAssigned = 1u << 30;
static_assert(kMaxUnionRows <= kRankMask && kMaxHotSize <= kFieldMask, "ranks and positions + 1 fit their fields");

// The copies of a fused gather keep one load in flight per lane: more would
// not fit 32 registers, and two blocks of 32 warps per SM keep as many
// bytes in flight as the one-block kernels' four per lane.
constexpr int kCopyUnroll = 1;

// Rows a fused gather's block stages, at most: its first misses' host rows
// are read asynchronously into shared memory as they are assigned and
// written out after the outputs, so that the host round trip of a step's
// few misses overlaps phase F instead of holding it back (0.1% of k = 2048
// is 2 rows per request). The rest are copied by warps as assigned.
constexpr int32_t kStageRows = 8;

// Scratch words: two buffers of warp totals for block scans (consecutive
// scans with no barrier between them alternate), phase A's row scan, and
// the request's block-wide values (Uniform), which the phases read from
// here after a barrier instead of keeping them in registers across phases.
constexpr int kScratchTotals = 0;
constexpr int kScratchRequestReduce = 2 * kWarps;
constexpr int kScratchUniform = kScratchRequestReduce + 4 * kWarps;
constexpr int kScratchWords = kScratchUniform + 16;

enum Uniform : int {
  kStateRow,        // s (after B1b)
  kFirstRow,        // t0
  kRows,            // q
  kMembers,         // |U| (after B2)
  kEvictable,       // |E| (after B3)
  kUsableEvictable, // usable slots in E
  kMisses,          // members no hit position serves (after B4)
  kAssignedMisses,  // misses given a slot
};

// Byte offsets of the block's arrays in its dynamic shared memory. The
// union table's keys and values start as all-ones and the occurrence bits
// as zero, each one contiguous run.
struct LeanLayout {
  int32_t capacity = 0;          // union table slots
  uint32_t keys = 0;             // int32 [capacity]
  uint32_t values = 0;           // uint32 [capacity]
  uint32_t slot_once = 0;        // uint32 [ceil(H / 32)]: slot j listed at least once
  uint32_t slot_twice = 0;       // uint32 [ceil(H / 32)]: at least twice
  uint32_t slot_placed = 0;      // uint32 [ceil(H / 32)]: on a hot block, attention index within int32
  uint32_t staged_count = 0;     // int32: rows claimed in the stage (zeroed with the bits)
  uint32_t lru_copy = 0;         // int16 [H]: the request's LRU row as it was
  uint32_t held = 0;             // int32 [H]: its device_global_indices row as it was
  uint32_t evictable = 0;        // int16 [H]: E, the evictable positions in LRU order
  uint32_t usable_before = 0;    // int16 [H]: usable slots among E[0 .. m)
  uint32_t member_bucket = 0;    // int16 [max_union_rows]: each rank's table slot
  uint32_t member_first = 0;     // int32 [max_union_rows]: each rank's first entry
  uint32_t scratch = 0;          // int32 [kScratchWords]
  uint32_t stage_targets = 0;    // uint8_t* [stage_rows]: each staged row's hot row
  uint32_t stage = 0;            // stage_rows rows of stage_row_bytes
  int32_t stage_rows = 0;
  uint32_t stage_row_bytes = 0;
  uint32_t total_bytes = 0;
};

// The layout for H hot slots and max_union_rows, its table with
// slack_halves / 2 times the keys it can hold (resolver_hash_capacity).
inline LeanLayout lean_layout(int32_t hot_size, int32_t max_union_rows, int32_t slack_halves) {
  LeanLayout l;
  l.capacity = resolver_hash_capacity(max_union_rows, slack_halves);
  const uint64_t hot = static_cast<uint64_t>(hot_size);
  const uint64_t members = static_cast<uint64_t>(max_union_rows);
  uint64_t offset = 0;
  const auto take = [&offset](uint64_t bytes) {
    const uint32_t at = static_cast<uint32_t>(offset);
    offset += resolver_align16(bytes);
    return at;
  };
  l.keys = take(4ull * l.capacity);
  l.values = take(4ull * l.capacity);
  l.slot_once = take(4ull * ((hot + 31) / 32));
  l.slot_twice = take(4ull * ((hot + 31) / 32));
  l.slot_placed = take(4ull * ((hot + 31) / 32));
  l.staged_count = take(4);
  l.lru_copy = take(2ull * hot);
  l.held = take(4ull * hot);
  l.evictable = take(2ull * hot);
  l.usable_before = take(2ull * hot);
  l.member_bucket = take(2ull * members);
  l.member_first = take(4ull * members);
  l.scratch = take(4ull * kScratchWords);
  l.total_bytes = static_cast<uint32_t>(offset);
  return l;
}

// `l` with a stage of up to kStageRows rows of row_bytes (a fused gather's;
// 0: none) in what is left of `limit` bytes.
inline LeanLayout with_stage(LeanLayout l, uint32_t row_bytes, uint64_t limit) {
  if (row_bytes == 0 || row_bytes % 16 != 0) return l;
  const uint64_t room = limit > l.total_bytes ? limit - l.total_bytes : 0;
  const uint64_t per_row = 8 + static_cast<uint64_t>(row_bytes);
  const int32_t rows = static_cast<int32_t>(std::min<uint64_t>(kStageRows, room > 16 ? (room - 16) / per_row : 0));
  if (rows == 0) return l;
  uint64_t offset = l.total_bytes;
  l.stage_targets = static_cast<uint32_t>(offset);
  offset += resolver_align16(8ull * rows);
  l.stage = static_cast<uint32_t>(offset);
  offset += static_cast<uint64_t>(rows) * row_bytes;
  l.stage_rows = rows;
  l.stage_row_bytes = row_bytes;
  l.total_bytes = static_cast<uint32_t>(offset);
  return l;
}

// The layout of a lean launch within `limit` bytes per block, with the
// roomiest table that fits; total_bytes == 0 where the shape has no lean
// launch (k > 2048, H > 4096, max_union_rows > 4096, or too little memory).
inline LeanLayout lean_launch_layout(const ResolveResidencyParams& p, uint64_t limit) {
  if (p.top_k < 1 || p.top_k > kMaxTopK || p.hot_size < 1 || p.hot_size > kMaxHotSize || p.max_union_rows < 1 ||
      p.max_union_rows > kMaxUnionRows) {
    return LeanLayout{};
  }
  for (int32_t slack = kResolverMaxSlackHalves; slack >= kResolverMinSlackHalves; --slack) {
    const LeanLayout l = lean_layout(p.hot_size, p.max_union_rows, slack);
    if (l.total_bytes <= limit) {
      return with_stage(l, p.fused_gather ? static_cast<uint32_t>(std::min<int64_t>(p.gather.row_bytes, 1 << 20)) : 0,
                        limit);
    }
  }
  return LeanLayout{};
}

// The block's arrays, addressed from the shared-memory base and the layout
// (a kernel parameter, in constant memory) where used, rather than held as
// pointers in registers across the phases.
struct Workspace {
  unsigned char* smem;
  const LeanLayout& l;

  template <class T>
  __device__ __forceinline__ T* at(uint32_t offset) const {
    return reinterpret_cast<T*>(smem + offset);
  }
  __device__ __forceinline__ UnionTableView table() const {
    return UnionTableView{at<int32_t>(l.keys), at<uint32_t>(l.values), l.capacity};
  }
  __device__ __forceinline__ uint32_t* values() const { return at<uint32_t>(l.values); }
  __device__ __forceinline__ uint32_t* slot_once() const { return at<uint32_t>(l.slot_once); }
  __device__ __forceinline__ uint32_t* slot_twice() const { return at<uint32_t>(l.slot_twice); }
  __device__ __forceinline__ uint32_t* slot_placed() const { return at<uint32_t>(l.slot_placed); }
  __device__ __forceinline__ int32_t* staged_count() const { return at<int32_t>(l.staged_count); }
  __device__ __forceinline__ uint8_t** stage_targets() const { return at<uint8_t*>(l.stage_targets); }
  __device__ __forceinline__ int16_t* lru_copy() const { return at<int16_t>(l.lru_copy); }
  __device__ __forceinline__ int32_t* held() const { return at<int32_t>(l.held); }
  __device__ __forceinline__ int16_t* evictable() const { return at<int16_t>(l.evictable); }
  __device__ __forceinline__ int16_t* usable_before() const { return at<int16_t>(l.usable_before); }
  __device__ __forceinline__ int16_t* member_bucket() const { return at<int16_t>(l.member_bucket); }
  __device__ __forceinline__ int32_t* member_first() const { return at<int32_t>(l.member_first); }
  __device__ __forceinline__ int32_t* scratch() const { return at<int32_t>(l.scratch); }
  __device__ __forceinline__ int* totals(int buffer) const { return scratch() + kScratchTotals + buffer * kWarps; }
  __device__ __forceinline__ int32_t uniform(Uniform word) const { return scratch()[kScratchUniform + word]; }
  // Thread 0 sets a block-wide value; the others read it after the next barrier.
  __device__ __forceinline__ void set_uniform(Uniform word, int32_t value) const {
    if (threadIdx.x == 0) scratch()[kScratchUniform + word] = value;
  }
};

// The active request of the block: its batch row, state row and token rows
// t0 .. t0 + q - 1. Its table and state rows are addressed from these when
// used (from the kernel parameters, in constant memory) rather than kept in
// registers across the phases.
struct Request {
  int32_t b;
  int32_t s;
  int32_t t0;
  int32_t q;

  // The request as phase A left it in the uniform words (after B1b).
  static __device__ __forceinline__ Request of(const Workspace& ws) {
    return {static_cast<int32_t>(blockIdx.x), ws.uniform(kStateRow), ws.uniform(kFirstRow), ws.uniform(kRows)};
  }

  __device__ __forceinline__ const int32_t* hot_table(const ResolveResidencyParams& p) const {
    return p.hot_block_table + b * p.hot_table_row_stride;
  }
  __device__ __forceinline__ const int32_t* source(const ResolveResidencyParams& p) const {
    return p.source_block_table != nullptr ? p.source_block_table + b * p.source_table_row_stride : nullptr;
  }
  __device__ __forceinline__ const int32_t* resident(const ResolveResidencyParams& p) const {
    return p.resident_block_table != nullptr ? p.resident_block_table + b * p.resident_table_row_stride : nullptr;
  }
  __device__ __forceinline__ int32_t* dgi_row(const ResolveResidencyParams& p) const {
    return p.device_global_indices + static_cast<int64_t>(s) * p.hot_size;
  }
  __device__ __forceinline__ int16_t* lru_row(const ResolveResidencyParams& p) const {
    return p.lru_slots + static_cast<int64_t>(s) * p.hot_size;
  }
};

// ---- Phase A, ends at B1. Shared memory is filled before the wait for the
// prior grid, as the one-block kernels do; orphan rows, padding and rejected
// requests are written here, and only an active request returns true.
__device__ __forceinline__ void fill(const LeanLayout& l, unsigned char* smem) {
  const uint4 ones = make_uint4(~0u, ~0u, ~0u, ~0u);
  const uint4 zeros = make_uint4(0, 0, 0, 0);
  uint4* const table = reinterpret_cast<uint4*>(smem + l.keys);
  for (uint32_t v = threadIdx.x; v < (l.slot_once - l.keys) / 16; v += kThreads) table[v] = ones;
  uint4* const bits = reinterpret_cast<uint4*>(smem + l.slot_once);
  for (uint32_t v = threadIdx.x; v < (l.lru_copy - l.slot_once) / 16; v += kThreads) bits[v] = zeros;
}

__device__ __forceinline__ bool find_request(const ResolveResidencyParams& p, const ResolverConstants& c,
                                             const LeanLayout& l, unsigned char* smem, const Workspace& ws) {
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int32_t b = static_cast<int32_t>(blockIdx.x);
  const int32_t blocks = static_cast<int32_t>(gridDim.x);
  const int32_t B = p.num_batch_rows;
  const int32_t T = p.num_tokens;
  const int32_t H = p.hot_size;
  if (b < B) fill(l, smem);
  wait_for_prior_grid();
  const int32_t orphan_owner = b < T ? p.req_id_per_token[b] : -1;
  const int32_t s = b < B ? p.request_state_indices[b] : -1;
  const int32_t valid_rows = p.num_valid_rows != nullptr ? min(max(*p.num_valid_rows, 0), T) : T;
  if (b >= B) {
    write_orphan_rows<kThreads>(p, valid_rows, orphan_owner, b, blocks);
    return false;
  }
  const bool state_in_range = s >= 0 && s < p.num_state_rows;
  if (state_in_range) {
    start_int16_row_copy<kThreads>(ws.lru_copy(), p.lru_slots + static_cast<int64_t>(s) * H, H);
    start_int32_row_copy<kThreads>(ws.held(), p.device_global_indices + static_cast<int64_t>(s) * H, H);
  }
  {
    int first = INT_MAX, last = -1, count = 0, duplicate = 0;
    for (int32_t t = tid; t < T; t += kThreads) {
      if (p.req_id_per_token[t] == b && t < valid_rows) {
        first = min(first, t);
        last = max(last, t);
        ++count;
      }
    }
    for (int32_t earlier = tid; earlier < b; earlier += kThreads) duplicate |= p.request_state_indices[earlier] == s;
    duplicate &= s >= 0;
    first = warp_min(first);
    last = warp_max(last);
    count = warp_sum(count);
    duplicate = warp_max(duplicate);
    if (lane == 0) {
      int32_t* const reduce = ws.scratch() + kScratchRequestReduce;
      reduce[warp] = first;
      reduce[kWarps + warp] = last;
      reduce[2 * kWarps + warp] = count;
      reduce[3 * kWarps + warp] = duplicate;
    }
  }
  wait_async_copies<1>();  // the LRU row (the held row may still be in flight)
  __syncthreads();         // B1
  write_orphan_rows<kThreads>(p, valid_rows, orphan_owner, b, blocks);
  const int32_t* const reduce = ws.scratch() + kScratchRequestReduce;
  const int32_t t0 = warp_min(reduce[lane]);
  const int32_t last_row = warp_max(reduce[kWarps + lane]);
  const int32_t q = warp_sum(reduce[2 * kWarps + lane]);
  const bool duplicate_state = warp_max(reduce[3 * kWarps + lane]) != 0;
  if (q == 0 || s < 0 || !state_in_range || duplicate_state || last_row - t0 + 1 != q) {
    wait_async_copies<0>();  // nothing may land in shared memory after the block exits
    if (q == 0) return false;
    write_request_inactive<kThreads>(p, c.top_k, b, t0, last_row);
    if (s >= 0 && tid == 0 && p.stats != nullptr) {
      add_stat(p, HS_STAT_LOOKUPS, static_cast<int64_t>(q) * p.top_k);
      add_stat(p, HS_STAT_INVALID, static_cast<int64_t>(q) * p.top_k);
    }
    return false;
  }
  ws.set_uniform(kStateRow, s);
  ws.set_uniform(kFirstRow, t0);
  ws.set_uniform(kRows, q);
  return true;
}

// Physical hot row and attention index of slot j (0 <= j < H, a hot block
// >= 0); both fit int32 for a usable slot.
struct SlotRow {
  int32_t row;
  int32_t address;
};

__device__ __forceinline__ SlotRow slot_row(const ResolveResidencyParams& p, const ResolverConstants& c,
                                            const Request& r, int32_t j) {
  const int32_t hot_block = c.hot_block_size.quotient(j);
  const int32_t block = __ldg(r.hot_table(p) + hot_block);
  const int32_t offset = c.hot_block_size.remainder(j, hot_block);
  return {static_cast<int32_t>(static_cast<int64_t>(block) * p.hot_block_size + offset),
          static_cast<int32_t>(static_cast<int64_t>(block) * p.attention_block_stride + offset)};
}

// Step 3: slot j is in range, listed once in the LRU row, on a hot block,
// and its attention index fits int32 (the bits of phase B, after B2).
__device__ __forceinline__ bool usable_slot(const ResolveResidencyParams& p, const Workspace& ws, int32_t j) {
  if (j < 0 || j >= p.hot_size) return false;
  const int32_t word = j >> 5;
  return ((ws.slot_once()[word] & ~ws.slot_twice()[word] & ws.slot_placed()[word]) >> (j & 31) & 1u) != 0;
}

// ---- Phase B: step 3's bits. Each slot the LRU row lists sets its
// occurrence bits; each thread checks the hot blocks of slots 4t .. 4t + 3,
// so that the walk's usable test reads shared memory alone.
__device__ __forceinline__ void mark_slots(const ResolveResidencyParams& p, const ResolverConstants& c,
                                           const Workspace& ws) {
  const int32_t* const hot_table = p.hot_block_table + blockIdx.x * p.hot_table_row_stride;
  const int32_t begin = kPositions * static_cast<int32_t>(threadIdx.x);
  uint32_t placed = 0;
#pragma unroll
  for (int x = 0; x < kPositions; ++x) {
    const int32_t i = begin + x;
    if (i >= p.hot_size) break;
    const int32_t j = ws.lru_copy()[i];
    if (j >= 0 && j < p.hot_size) {
      const uint32_t bit = 1u << (j & 31);
      if (atomicOr(ws.slot_once() + (j >> 5), bit) & bit) atomicOr(ws.slot_twice() + (j >> 5), bit);
    }
    // Slot i (as a slot, not a position) of this thread.
    const int32_t hot_block = c.hot_block_size.quotient(i);
    const int32_t block = __ldg(hot_table + hot_block);
    if (block >= 0 && (block <= c.safe_hot_block || static_cast<int64_t>(block) * p.attention_block_stride +
                                                            c.hot_block_size.remainder(i, hot_block) <=
                                                        kInt32Max)) {
      placed |= 1u << x;
    }
  }
  // Slots 4t .. 4t + 3 are bits 4(t % 8) .. 4(t % 8) + 3 of word t / 8.
  if (placed != 0) atomicOr(ws.slot_placed() + (threadIdx.x >> 3), placed << ((threadIdx.x & 7) * kPositions));
}

// The thread's entries 2t and 2t + 1 of token row `row` as classified.
__device__ __forceinline__ Entry classify_entry(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                const Request& r, int32_t row, int32_t k) {
  const int32_t* const topk = p.topk_indices + static_cast<int64_t>(r.t0 + row) * p.topk_row_stride;
  return classify(p, c, r.source(p), r.resident(p), k < p.top_k ? topk[k] : -1);
}

// ---- Phase B, the union, ends at B2: row by row, every hot entry's host
// row enters the table and offers its index in the row; the entries that
// find their own offer are their keys' first occurrences and take the next
// ranks. Once max_union_rows keys are ranked, the later rows' new keys are
// past the union, and their rows need no pass (a lookup finds no key).
// Sets |U| (kMembers).
__device__ __forceinline__ void build_union(const ResolveResidencyParams& p, const ResolverConstants& c,
                                           const Workspace& ws) {
  const Request r = Request::of(ws);
  const int32_t K = p.top_k;
  const int32_t limit = p.max_union_rows;
  int32_t ranked = 0;
  for (int32_t row = 0; row < r.q && ranked < limit; ++row) {
    int32_t key[kEntries];
    uint32_t slot[kEntries];
#pragma unroll
    for (int x = 0; x < kEntries; ++x) {
      const Entry entry = classify_entry(p, c, r, row, kEntries * static_cast<int32_t>(threadIdx.x) + x);
      key[x] = entry.kind == kHot ? entry.host_slot : -1;
    }
    ws.table().insert(key, slot);
    __syncwarp();  // lanes leave the probe loop after different rounds
#pragma unroll
    for (int x = 0; x < kEntries; ++x) {
      if (key[x] >= 0) ws.table().offer_first(slot[x], kEntries * threadIdx.x + x);
    }
    __syncthreads();  // B2a: every offer of the row is in
    bool first[kEntries];
#pragma unroll
    for (int x = 0; x < kEntries; ++x) {
      first[x] = key[x] >= 0 && ws.table().is_first_in_chunk(slot[x], kEntries * threadIdx.x + x);
    }
    int total = 0;
    const int before = block_exclusive_sum_small<2>(int{first[0]} + int{first[1]}, ws.totals(0), &total);
#pragma unroll
    for (int x = 0; x < kEntries; ++x) {
      if (!first[x]) continue;
      const int32_t rank = ranked + before + (x == 1 && first[0] ? 1 : 0);
      ws.table().set_rank(slot[x], static_cast<uint32_t>(min(rank, limit)));
      if (rank < limit) {
        ws.member_bucket()[rank] = static_cast<int16_t>(slot[x]);
        ws.member_first()[rank] = row * K + kEntries * static_cast<int32_t>(threadIdx.x) + x;
      }
    }
    ranked += total;
  }
  ws.set_uniform(kMembers, min(ranked, limit));
  wait_async_copies<0>();  // the held row
  __syncthreads();         // B2: ranks, occurrence bits and the held row are complete
}

// What the walk of the LRU positions leaves the thread for step 6: which
// of its positions 4t .. 4t + 3 are evictable (bits 0-3), and how many
// evictable positions lie before 4t (the bits above).
struct Walk {
  uint32_t packed;

  __device__ __forceinline__ bool evictable(int x) const { return (packed >> x & 1u) != 0; }
  // Evictable positions before 4t + x.
  __device__ __forceinline__ int32_t evictable_before(int x) const {
    return static_cast<int32_t>(packed >> kPositions) + __popc(packed & ((1u << x) - 1));
  }
};

// ---- Phase C, ends at B3: each position of a usable slot that holds a
// member is a hit position and offers itself to the member (atomicMax: the
// last one serves); the others are listed in E, each with the usable slots
// before it.
__device__ __forceinline__ Walk walk_positions(const ResolveResidencyParams& p, const Workspace& ws) {
  const int32_t begin = kPositions * static_cast<int32_t>(threadIdx.x);
  uint32_t evictable_bits = 0, usable_bits = 0;
#pragma unroll
  for (int x = 0; x < kPositions; ++x) {
    const int32_t i = begin + x;
    if (i >= p.hot_size) break;
    const int32_t j = ws.lru_copy()[i];
    const bool usable = usable_slot(p, ws, j);
    bool hit = false;
    if (usable && ws.held()[j] >= 0) {
      const int32_t slot = ws.table().slot_of(ws.held()[j]);
      if (slot >= 0) {
        // An atomic read: other positions of the member raise its value meanwhile.
        const uint32_t rank = atomicOr(ws.values() + slot, 0u) & kRankMask;
        if (rank < static_cast<uint32_t>(p.max_union_rows)) {
          hit = true;
          atomicMax(ws.values() + slot, (static_cast<uint32_t>(i + 1) << kFieldShift) | rank);
        }
      }
    }
    if (!hit) {
      evictable_bits |= 1u << x;
      if (usable) usable_bits |= 1u << x;
    }
  }
  // Both counts in one scan: each stays below 2^16.
  int total = 0;
  const int before =
      block_exclusive_sum(__popc(evictable_bits) | (__popc(usable_bits) << 16), ws.totals(1), &total);
  ws.set_uniform(kEvictable, total & 0xFFFF);
  ws.set_uniform(kUsableEvictable, total >> 16);
  const Walk w{(static_cast<uint32_t>(before & 0xFFFF) << kPositions) | evictable_bits};
#pragma unroll
  for (int x = 0; x < kPositions; ++x) {
    if (!w.evictable(x)) continue;
    const uint32_t below = (1u << x) - 1;
    const int32_t m = w.evictable_before(x);
    ws.evictable()[m] = static_cast<int16_t>(begin + x);
    ws.usable_before()[m] = static_cast<int16_t>((before >> 16) + __popc(usable_bits & below));
  }
  __syncthreads();  // B3: hit positions and E are complete
  return w;
}

// After phase F: the staged rows to their hot rows, once every thread's
// asynchronous reads have landed.
__device__ __forceinline__ void write_staged_rows(const Workspace& ws) {
  wait_async_copies<0>();
  __syncthreads();  // B5: every staged row is in
  const int32_t rows = min(*ws.staged_count(), ws.l.stage_rows);
  const int32_t chunks = static_cast<int32_t>(ws.l.stage_row_bytes / 16);
  for (int32_t i = threadIdx.x; i < rows * chunks; i += kThreads) {
    const int32_t row = i / chunks;
    const int32_t chunk = i - row * chunks;
    const uint4* const staged = ws.at<uint4>(ws.l.stage + static_cast<uint32_t>(row) * ws.l.stage_row_bytes);
    reinterpret_cast<uint4*>(ws.stage_targets()[row])[chunk] = staged[chunk];
  }
}

// Step 6: the new LRU order E[n:], E[:n], then the hit positions, written
// from the copy of the row as it was (n: the misses that take a position).
__device__ __forceinline__ void write_lru_order(const ResolveResidencyParams& p, const Workspace& ws,
                                                const Request& r, const Walk& w, int32_t taken) {
  const int32_t evictable_total = ws.uniform(kEvictable);
  const int32_t begin = kPositions * static_cast<int32_t>(threadIdx.x);
#pragma unroll
  for (int x = 0; x < kPositions; ++x) {
    const int32_t i = begin + x;
    if (i >= p.hot_size) break;
    const int32_t m = w.evictable_before(x);
    int32_t to;
    if (w.evictable(x)) {
      to = m < taken ? evictable_total - taken + m : m - taken;
    } else {
      to = evictable_total + (i - m);
    }
    r.lru_row(p)[to] = ws.lru_copy()[i];
  }
}

// The warp reads the host rows of the lanes with a stage row `staged`
// (null: none) into it asynchronously, lanes over 16-byte chunks of one row
// at a time (consecutive lanes, consecutive chunks: whole lines per
// request), zero-filling the row of a lane whose `source` is null.
__device__ __forceinline__ void warp_stage_rows(const uint8_t* source, uint8_t* staged, uint32_t chunks) {
  const int lane = threadIdx.x & 31;
  uint32_t rows = __ballot_sync(kFullMask, staged != nullptr);
  while (rows != 0) {
    const int from = __ffs(rows) - 1;
    rows &= rows - 1;
    const uint8_t* const src =
        reinterpret_cast<const uint8_t*>(__shfl_sync(kFullMask, reinterpret_cast<uintptr_t>(source), from));
    uint8_t* const dst = reinterpret_cast<uint8_t*>(__shfl_sync(kFullMask, reinterpret_cast<uintptr_t>(staged), from));
    const uint32_t shared = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
    for (uint32_t chunk = lane; chunk < chunks; chunk += 32) {
      if (src != nullptr) {
        start_chunk_copy_to_shared(shared + 16 * chunk, dst + 16 * chunk, src + 16 * chunk);
      } else {
        reinterpret_cast<uint4*>(dst)[chunk] = make_uint4(0, 0, 0, 0);
      }
    }
  }
  commit_async_copies();
}

// A fused gather's rows, after the assignment: each assigned miss of the
// thread's ranks (miss_bits) has its row read from the host, the block's
// first kStageRows rows into the stage, the others by their warps now.
__device__ __forceinline__ void copy_assigned_rows(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                   const Workspace& ws, const Request& r, uint32_t miss_bits) {
  const int32_t first_rank = kPositions * static_cast<int32_t>(threadIdx.x);
#pragma unroll 1
  for (int x = 0; x < kPositions; ++x) {
    int32_t host_row = 0;
    uint8_t* target = nullptr;
    if (miss_bits >> x & 1u) {
      const uint32_t bucket = static_cast<uint16_t>(ws.member_bucket()[first_rank + x]);
      const uint32_t value = ws.values()[bucket];
      if (value & kAssigned) {
        host_row = ws.table().key_at(bucket);
        // A row outside the hot cache is skipped, as gather_compact skips it.
        target = assigned_row_destination(
            p.gather, slot_row(p, c, r, static_cast<int32_t>((value >> kFieldShift) & kFieldMask)).row);
      }
    }
    uint8_t* staged = nullptr;
    if (target != nullptr && ws.l.stage_rows > 0) {
      const int32_t claimed = atomicAdd(ws.staged_count(), 1);
      if (claimed < ws.l.stage_rows) {
        ws.stage_targets()[claimed] = target;
        staged = ws.at<uint8_t>(ws.l.stage + static_cast<uint32_t>(claimed) * ws.l.stage_row_bytes);
      }
    }
    const uint8_t* const source =
        host_row < p.gather.host_rows ? p.gather.host + static_cast<int64_t>(host_row) * p.gather.host_pitch : nullptr;
    if (ws.l.stage_rows > 0) warp_stage_rows(source, staged, ws.l.stage_row_bytes / 16);
    warp_copy_lane_rows<kCopyUnroll>(source, staged == nullptr ? target : nullptr,
                                     static_cast<int>(p.gather.row_bytes / kChunkBytes), threadIdx.x & 31);
  }
}

// ---- Phase D: members numbered in rank order (ranks 4t .. 4t + 3 for
// thread t); the m-th miss takes E[m] for m < n, where a usable slot gets
// the member's host row, its swap entry (the usable slots before E[m]
// number it) and, kCopies, its row from the host: the block's first
// kStageRows rows into the stage, the others copied by their warps now.
// The other misses are not served. Step 6's new LRU order is written first,
// as soon as n is known.
template <bool kCopies>
__device__ __forceinline__ void assign_misses(const ResolveResidencyParams& p, const ResolverConstants& c,
                                              const Workspace& ws, const Walk& w) {
  const Request r = Request::of(ws);
  const int32_t members = ws.uniform(kMembers);
  const int32_t first_rank = kPositions * static_cast<int32_t>(threadIdx.x);
  uint32_t miss_bits = 0;
#pragma unroll
  for (int x = 0; x < kPositions; ++x) {
    const int32_t rank = first_rank + x;
    if (rank < members && (ws.values()[ws.member_bucket()[rank]] >> kFieldShift) == 0) miss_bits |= 1u << x;
  }
  int miss_total = 0;
  const int misses_before = block_exclusive_sum_small<3>(__popc(miss_bits), ws.totals(0), &miss_total);
  const int32_t evictable_total = ws.uniform(kEvictable);
  const int32_t taken = min(miss_total, evictable_total);
  const int32_t assigned_total = taken < evictable_total ? ws.usable_before()[taken] : ws.uniform(kUsableEvictable);
  ws.set_uniform(kMisses, miss_total);
  ws.set_uniform(kAssignedMisses, assigned_total);
  write_lru_order(p, ws, r, w, taken);
  for (int32_t row = threadIdx.x; row < r.q; row += kThreads) {
    p.out_swap_counts[r.t0 + row] = min(max(assigned_total - row * p.top_k, 0), p.top_k);
  }
#pragma unroll 1
  for (int x = 0; x < kPositions; ++x) {
    if (miss_bits >> x & 1u) {
      const int32_t rank = first_rank + x;
      const uint32_t bucket = static_cast<uint16_t>(ws.member_bucket()[rank]);
      const int32_t m = misses_before + __popc(miss_bits & ((1u << x) - 1));
      uint32_t value = kNotServed | static_cast<uint32_t>(rank);
      if (m < taken) {
        const int32_t j = ws.lru_copy()[ws.evictable()[m]];
        if (usable_slot(p, ws, j)) {
          const int32_t swap = ws.usable_before()[m];
          const int32_t row_of_list = c.top_k.quotient(swap);
          const int32_t column = c.top_k.remainder(swap, row_of_list);
          const int64_t t = r.t0 + row_of_list;
          const int32_t host_row = ws.table().key_at(bucket);
          const int32_t hot_row = slot_row(p, c, r, j).row;
          r.dgi_row(p)[j] = host_row;
          p.out_swap_host_rows[t * p.out_swap_host_rows_row_stride + column] = host_row;
          p.out_swap_device_rows[t * p.out_swap_device_rows_row_stride + column] = hot_row;
          value = kAssigned | (static_cast<uint32_t>(j) << kFieldShift) | static_cast<uint32_t>(rank);
        }
      }
      ws.values()[bucket] = value;
    }
  }
  if constexpr (kCopies) copy_assigned_rows(p, c, ws, r, miss_bits);
}


// ---- Phase F (after B4): each entry's outputs, from its classification
// and its member's value; valid counts per token row (one scan each, in
// alternating buffers), then the request's counters.
__device__ __forceinline__ void write_entries(const ResolveResidencyParams& p, const ResolverConstants& c,
                                              const Workspace& ws) {
  const Request r = Request::of(ws);
  const int32_t K = p.top_k;
  int32_t valid_total = 0;
  int resident_here = 0;
  for (int32_t row = 0; row < r.q; ++row) {
    const int64_t t = r.t0 + row;
    int valid_here = 0;
#pragma unroll
    for (int x = 0; x < kEntries; ++x) {
      const int32_t k = kEntries * static_cast<int32_t>(threadIdx.x) + x;
      if (k >= K) break;
      const Entry entry = classify_entry(p, c, r, row, k);
      int32_t hot_row = -1, address = -1, miss = 0;
      if (entry.kind == kResident) {
        hot_row = static_cast<int32_t>(entry.row);
        address = static_cast<int32_t>(entry.address);
        ++resident_here;
      } else if (entry.kind == kHot) {
        const int32_t slot = ws.table().slot_of(entry.host_slot);
        const uint32_t value = slot >= 0 ? ws.values()[slot] : kNoRank;
        const int32_t rank = static_cast<int32_t>(value & kRankMask);
        if (rank < p.max_union_rows && (value & kNotServed) == 0) {
          const int32_t field = static_cast<int32_t>((value >> kFieldShift) & kFieldMask);
          const bool assigned = (value & kAssigned) != 0;
          const SlotRow served = slot_row(p, c, r, assigned ? field : ws.lru_copy()[field - 1]);
          hot_row = served.row;
          address = served.address;
          miss = assigned && ws.member_first()[rank] == row * K + k;
        }
      }
      const bool valid = entry.kind == kResident || address >= 0;
      valid_here += valid;
      p.out_attention[t * p.out_attention_row_stride + k] = address;
      p.out_hot_rows[t * p.out_hot_rows_row_stride + k] = hot_row;
      p.out_resolved[t * p.out_resolved_row_stride + k] = valid ? entry.host_slot : -1;
      p.out_miss_mask[t * p.out_miss_mask_row_stride + k] = miss;
    }
    int valid_row = 0;
    block_exclusive_sum_small<2>(valid_here, ws.totals(row & 1), &valid_row);
    if (threadIdx.x == 0) p.out_valid_counts[t] = valid_row;
    valid_total += valid_row;
  }
  if (p.stats == nullptr) return;
  int resident_total = 0;
  block_exclusive_sum(resident_here, ws.totals(r.q & 1), &resident_total);
  if (threadIdx.x == 0) {
    const int64_t lookups = static_cast<int64_t>(r.q) * K;
    add_stat(p, HS_STAT_LOOKUPS, lookups);
    add_stat(p, HS_STAT_HITS, ws.uniform(kMembers) - ws.uniform(kMisses));
    add_stat(p, HS_STAT_MISSES, ws.uniform(kAssignedMisses));
    add_stat(p, HS_STAT_RESIDENT, resident_total);
    add_stat(p, HS_STAT_INVALID, lookups - valid_total);
  }
}

}  // namespace lean
}  // namespace cuda
}  // namespace hisparse
