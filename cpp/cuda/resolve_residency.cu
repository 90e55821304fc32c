// CUDA residency resolution (docs/residency.md): one block per batch row,
// everything per request in shared memory (layout: resolver_shared_memory.hpp)
// or, for shapes that do not fit, partly in a global workspace
// (resolver_placement.cuh), bit-identical to resolve_residency_reference.cpp.
//
// resolve_residency_kernel calls one device function per phase; each phase
// ends at a block barrier (B1 .. B8), and docs/residency.md ("The CUDA
// kernel's phases") maps the phases to the contract's steps. Every shared
// array is written in one phase and read in a later one; the only
// same-phase sharing is through atomics. The fused gather is the kernel's
// compile-time policy (resolver_gather.cuh), called at fixed points, and
// where the arrays live another (resolver_placement.cuh).
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <mutex>
#include <type_traits>

#include "core/error.hpp"
#include "core/resolver_shared_memory.hpp"
#include "cuda/async_copy.cuh"
#include "cuda/block_scan.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/cuda_kernels.hpp"
#include "cuda/hopper_sync.cuh"
#include "cuda/programmatic_launch.hpp"
#include "cuda/resolver_context.cuh"
#include "cuda/resolver_deferred_gather.cuh"
#include "cuda/resolver_gather.cuh"
#include "cuda/resolver_handoff.cuh"
#include "cuda/resolver_hint.cuh"
#include "cuda/resolver_placement.cuh"
#include "cuda/resolver_single_row.cuh"
#include "cuda/resolver_tail_gather.hpp"
#include "cuda/union_table.cuh"

namespace hisparse {
namespace cuda {
namespace {

constexpr int kThreads = kResolverThreads;
constexpr int kWarps = kResolverWarps;

constexpr int64_t kMaxEntries = int64_t{1} << 30;

__device__ __forceinline__ void write_inactive_entry(const ResolveResidencyParams& p, int64_t t, int32_t k) {
  p.out_attention[t * p.out_attention_row_stride + k] = -1;
  p.out_hot_rows[t * p.out_hot_rows_row_stride + k] = -1;
  p.out_resolved[t * p.out_resolved_row_stride + k] = -1;
  p.out_miss_mask[t * p.out_miss_mask_row_stride + k] = 0;
}

// Token rows past num_valid_rows or naming no batch row, spread over the
// launch's `blocks` batch rows (row t goes to batch row b = t % blocks) so no
// single block writes them all. `first_owner` is req_id_per_token[b], loaded
// at phase A's start so that the usual single row per request costs no load
// latency here.
__device__ void write_orphan_rows(const ResolveResidencyParams& p, int32_t valid_rows, int32_t first_owner, int32_t b,
                                  int32_t blocks) {
  for (int32_t t = b; t < p.num_tokens; t += blocks) {
    const int32_t request = t == b ? first_owner : p.req_id_per_token[t];
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

// ---- Phase A: the request's token rows ("Token rows of a request"), ends at B1.
// Fills the shared memory that starts initialised, starts copying the state
// row into it, finds the batch row's token rows and classifies them: orphan
// rows (spread over all blocks), padding and rejected requests are written
// out here, and only an active request returns true with `request` set.
// Under a programmatic launch this block may start before the kernel ahead
// of it in the stream (the indexer, or the last step's resolver) has
// finished: only shared memory is touched until wait_for_prior_grid().
template <class Gather, class Placement>
__device__ __forceinline__ bool find_request(const ResolveResidencyParams& p, const ResolverConstants& c,
                                             const Placement& placement, const ResolverWorkspace& ws,
                                             const Gather& gather, ResolverRequest& request, int32_t b,
                                             int32_t blocks) {
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int32_t B = p.num_batch_rows;
  const int32_t T = p.num_tokens;
  const int32_t K = p.top_k;
  const int32_t H = p.hot_size;

  if (b < B) {
    placement.fill(c, ws);
    gather.prepare(c);
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
    write_orphan_rows(p, valid_rows, orphan_owner, b, blocks);
    return false;
  }
  const bool state_in_range = s >= 0 && s < p.num_state_rows;
  const int32_t* const hot_table = p.hot_block_table + b * p.hot_table_row_stride;
  const int32_t* const source =
      p.source_block_table != nullptr ? p.source_block_table + b * p.source_table_row_stride : nullptr;
  const int32_t* const resident =
      p.resident_block_table != nullptr ? p.resident_block_table + b * p.resident_table_row_stride : nullptr;
  if (state_in_range) {
    placement.start_state_copies(p, ws, s, H);
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
      int32_t* reduce = ws.scratch + kScratchRequestReduce;
      reduce[warp] = first;
      reduce[kWarps + warp] = last;
      reduce[2 * kWarps + warp] = count;
      reduce[3 * kWarps + warp] = duplicate;
    }
  }
  wait_async_copies<1>();  // the lru row (the dgi row may still be in flight)
  __syncthreads();  // B1
  write_orphan_rows(p, valid_rows, orphan_owner, b, blocks);
  const int32_t* reduce = ws.scratch + kScratchRequestReduce;
  const int32_t t0 = warp_min(reduce[lane]);
  const int32_t last_row = warp_max(reduce[kWarps + lane]);
  const int32_t q = warp_sum(reduce[2 * kWarps + lane]);
  const bool duplicate_state = warp_max(reduce[3 * kWarps + lane]) != 0;

  if (q == 0 || s < 0 || !state_in_range || duplicate_state || last_row - t0 + 1 != q) {
    // Shared memory must not be released under an async copy still landing.
    wait_async_copies<0>();
    if (q == 0) return false;
    write_request_inactive(p, c, b, t0, last_row);
    if (s >= 0 && tid == 0 && p.stats != nullptr) {
      add_stat(p, HS_STAT_LOOKUPS, static_cast<int64_t>(q) * K);
      add_stat(p, HS_STAT_INVALID, static_cast<int64_t>(q) * K);
    }
    return false;
  }

  request.s = s;
  request.t0 = t0;
  request.q = q;
  request.entries = q * K;  // <= 2^30 (checked by the launcher)
  request.single_row = q == 1;
  request.hot_table = hot_table;
  request.source = source;
  request.resident = resident;
  request.topk = p.topk_indices + t0 * p.topk_row_stride;
  request.dgi_row = p.device_global_indices + static_cast<int64_t>(s) * H;
  request.lru_row = p.lru_slots + static_cast<int64_t>(s) * H;
  return true;
}

// ---- Phase B, first part: how often each slot occurs in the LRU row (for
// step 3's "occurs exactly once"), in 16-bit halves of the slot_info words.
// Read by phase C1, after B2. SharedPlacement's copied LRU row is 16-byte
// aligned; a split layout's may be the row itself, of any alignment, read an
// entry at a time.
template <class Placement>
__device__ __forceinline__ void count_slot_occurrences(const ResolveResidencyParams& p, const ResolverWorkspace& ws) {
  const int tid = threadIdx.x;
  const int32_t H = p.hot_size;
  uint32_t* const counts = ws.slot_counts();
  const auto count_slot = [&](int32_t j) {
    if (j >= 0 && j < H) atomicAdd(counts + (j >> 1), 1u << ((j & 1) * 16));
  };
  if (!Placement::kLruCopied) {
    // Four loads in flight before their atomics: the row may be in global memory.
    for (int32_t base = tid; base < H; base += 4 * kThreads) {
      int32_t slot[4];
#pragma unroll
      for (int x = 0; x < 4; ++x) slot[x] = base + x * kThreads < H ? ws.lru_copy[base + x * kThreads] : -1;
#pragma unroll
      for (int x = 0; x < 4; ++x) count_slot(slot[x]);
    }
    return;
  }
  const int32_t quads = H / 4;
  for (int32_t v = tid; v < quads; v += kThreads) {
    const uint2 four = reinterpret_cast<const uint2*>(ws.lru_copy)[v];
    count_slot(static_cast<int16_t>(four.x & 0xFFFFu));
    count_slot(static_cast<int16_t>(four.x >> 16));
    count_slot(static_cast<int16_t>(four.y & 0xFFFFu));
    count_slot(static_cast<int16_t>(four.y >> 16));
  }
  if (tid < H - 4 * quads) count_slot(ws.lru_copy[4 * quads + tid]);
}

struct UnionSummary {
  int32_t members;     // |U| = min(candidate union size, max_union_rows)
  int32_t classified;  // entries [0, classified) went through the union loop
  int32_t coded;       // entries [0, coded) keep their code in entry_codes
};

// ---- Phase B, second part: steps 1 and 2, ends at B2. The union,
// kResolverUnionChunk entries per chunk in entry order, two consecutive
// entries per thread so that thread order is entry order: each entry is
// classified (step 1), a hot candidate's host slot inserted into the union
// table, and its code (table slot, resident or invalid) kept for phase F.
// Within a chunk each key's first entry is the smallest chunk index that
// holds it (the table's pending markers, settled at B2a); first entries are
// ranked by a block scan (B2b inside it). Once max_union_rows members exist
// nothing is inserted any more: later keys are unknown to the table and
// their entries overflow. A whole top-k row of k <= 2048 is one chunk: one
// classification round trip and two barriers. After B2 the ranks, member
// keys and first entries, the slot counts and the dgi row copy are final.
__device__ __forceinline__ UnionSummary build_union(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                    const ResolverWorkspace& ws, const ResolverRequest& request) {
  constexpr int32_t kPerThread = kResolverUnionChunk / kThreads;
  static_assert(kPerThread == 2, "the union loop holds two entries per thread");
  const int32_t entries = request.entries;
  const int32_t max_union = p.max_union_rows;
  int32_t union_size = 0;
  int32_t classified = 0;
  const int32_t coded = min(entries, max_union);
  {
    const int32_t local = kPerThread * static_cast<int32_t>(threadIdx.x);  // the thread's first entry in a chunk
    int32_t next_position[kPerThread];
#pragma unroll
    for (int x = 0; x < kPerThread; ++x) {
      next_position[x] = local + x < entries ? request.position(p, c, local + x) : -1;
    }
    for (int32_t base = 0; base < entries && union_size < max_union; base += kResolverUnionChunk) {
      int32_t position[kPerThread];
#pragma unroll
      for (int x = 0; x < kPerThread; ++x) {
        const int32_t e = base + local + x;
        position[x] = next_position[x];
        if (e < entries - kResolverUnionChunk) next_position[x] = request.position(p, c, e + kResolverUnionChunk);
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
          const Entry entry = classify(p, c, request.source, request.resident, position[x]);
          if (entry.kind == kResident) code[x] = kCodeResident;
          if (entry.kind == kHot) key[x] = entry.host_slot;
        }
      }
      ws.table.insert(key, h);
      // Lanes leave the probe loop after different rounds; without this the
      // warp runs the rest of the chunk once per group of them.
      __syncwarp();
#pragma unroll
      for (int x = 0; x < kPerThread; ++x) {
        if (key[x] >= 0) {
          ws.table.offer_first(h[x], local + x);
          code[x] = static_cast<uint16_t>(h[x]);
        }
      }
      // The thread's two codes as one 32-bit store (its first entry is even).
      const int32_t e = base + local;
      if (e + 1 < coded) {
        reinterpret_cast<uint32_t*>(ws.entry_codes)[e / 2] = code[0] | (static_cast<uint32_t>(code[1]) << 16);
      } else if (e < coded) {
        ws.entry_codes[e] = code[0];
      }
      __syncthreads();  // B2a: every insertion and marker of the chunk is in place
      bool first_entry[kPerThread];
      int firsts = 0;
#pragma unroll
      for (int x = 0; x < kPerThread; ++x) {
        first_entry[x] = key[x] >= 0 && ws.table.is_first_in_chunk(h[x], local + x);
        firsts += first_entry[x];
      }
      int32_t new_keys;
      int32_t rank = union_size + block_exclusive_sum_small<2>(firsts, ws.scratch + kScratchUnionScan, &new_keys);
      // B2b (inside the scan); the next chunk's writes of the scan buffer
      // come after its own B2a.
#pragma unroll
      for (int x = 0; x < kPerThread; ++x) {
        if (!first_entry[x]) continue;
        ws.table.set_rank(h[x], static_cast<uint32_t>(rank));
        if (rank < max_union) {
          ws.member_keys[rank] = key[x];
          ws.member_first[rank] = base + local + x;
        }
        ++rank;
      }
      union_size += new_keys;
      classified = min(entries, base + kResolverUnionChunk);
    }
  }
  const int32_t members = min(union_size, max_union);
  wait_async_copies<0>();
  __syncthreads();  // B2
  return {members, classified, coded};
}

// ---- Phase C1: step 3 and the membership test of step 4, ends at B3. Per
// slot j: usable (occurs once in the LRU row, a hot block, an attention index
// within int32), and the rank of the member it holds; slot_info[j] becomes
// kSlotUsable | (rank + 1). A usable slot's member is held (member_held).
// With a residency hint and a layout that keeps them (c.held_rows), the
// slots' rows are also kept for phase D's upkeep of the hint, since phase C2
// overwrites the words that hold them (kKeepRows).
template <bool kKeepRows, class Gather>
__device__ __forceinline__ void match_slots(const ResolveResidencyParams& p, const ResolverConstants& c,
                                            const ResolverWorkspace& ws, const ResolverRequest& request,
                                            Gather& gather) {
  const int tid = threadIdx.x;
  const int32_t H = p.hot_size;
  const int32_t max_union = p.max_union_rows;
  const int32_t* const held_copy = ws.held_copy();
  int held_here = 0;  // members this thread found held (the fused gather's miss estimate)
  for (int32_t base = 0; base < H; base += 4 * kThreads) {
    int32_t held[4];
    int32_t block[4];
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      // Past H, slot H - 1 is read and its values ignored below: loads
      // without a predicate let every slot share one table address.
      const int32_t j = min(base + x * kThreads + tid, H - 1);
      held[x] = held_copy[j];
      block[x] = __ldg(request.hot_table + c.hot_block_size.quotient(j));
    }
    if constexpr (kKeepRows) {
      int32_t* const kept = reinterpret_cast<int32_t*>(ws.base + c.held_rows);
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int32_t j = base + x * kThreads + tid;
        if (j < H) kept[j] = held[x];
      }
    }
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int32_t j = base + x * kThreads + tid;
      if (j < H) {
        uint32_t info = 0;
        const int32_t hot_block = c.hot_block_size.quotient(j);
        if (ws.slot_info[j] == 1 && block[x] >= 0 &&
            (block[x] <= c.safe_hot_block ||
             static_cast<int64_t>(block[x]) * p.attention_block_stride + c.hot_block_size.remainder(j, hot_block) <=
                 kInt32Max)) {
          info = kSlotUsable;
          if (held[x] >= 0) {
            const uint32_t rank = ws.table.find(held[x]);
            if (rank < static_cast<uint32_t>(max_union)) {
              info |= rank + 1;
              ws.member_held[rank] = kMemberHeld;
              ++held_here;
            }
          }
        }
        ws.slot_info[j] = static_cast<uint16_t>(info);
      }
    }
  }
  gather.after_slot_match(ws, held_here);
  __syncthreads();  // B3
}

// A contiguous run of LRU positions per thread (<= 32) and what phase C2
// found there.
struct LruWalk {
  int32_t begin;
  int32_t end;
  uint32_t hit_bits;         // bit i - begin: position i is a hit position
  int32_t evictable_before;  // evictable positions before begin
  int32_t evictable_total;   // |E|
};

// ---- Phase C2: step 4, ends at B4 (inside the scan). A hit position offers
// itself to its member (atomicMax: the largest, most recently used, position
// wins); the rest are evictable, compacted in order into E (the evictable
// words) with one scan that also counts the unusable ones (high half) for
// the renumbering of misses.
__device__ __forceinline__ LruWalk walk_lru(const ResolveResidencyParams& p, const ResolverWorkspace& ws) {
  const int tid = threadIdx.x;
  const int32_t H = p.hot_size;
  LruWalk walk;
  const int32_t per_thread = (H + kThreads - 1) / kThreads;
  walk.begin = min(tid * per_thread, H);
  walk.end = min(walk.begin + per_thread, H);
  const int32_t begin = walk.begin;
  const int32_t end = walk.end;
  uint32_t hit_bits = 0, unusable_bits = 0;
  int32_t evictable_here = 0, unusable_here = 0;
  for (int32_t i = begin; i < end; ++i) {
    const int32_t j = ws.lru_copy[i];
    const uint32_t info = j >= 0 && j < H ? ws.slot_info[j] : 0u;
    const uint32_t bit = 1u << (i - begin);
    if (info & kSlotRankMask) {
      hit_bits |= bit;
      atomicMax(ws.member_slots + (info & kSlotRankMask) - 1, i);
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
      block_exclusive_sum(evictable_here | (unusable_here << 16), ws.scratch + kScratchPositionScan, &packed_total);
  // B4 (inside the scan): member_slots hold the last hit positions.
  walk.hit_bits = hit_bits;
  walk.evictable_total = packed_total & 0xFFFF;
  walk.evictable_before = packed_before & 0xFFFF;
  {
    int32_t x = walk.evictable_before;
    int32_t usable_before = walk.evictable_before - (packed_before >> 16);
    for (int32_t i = begin; i < end; ++i) {
      const uint32_t bit = 1u << (i - begin);
      if (hit_bits & bit) continue;
      const bool usable = !(unusable_bits & bit);
      ws.evictable[x++] = (usable_before << 16) | (usable ? static_cast<int32_t>(ws.lru_copy[i]) : kNoSlot);
      usable_before += usable;
    }
  }
  return walk;
}

// Phase D: slot j of the request takes host row `key`.
template <HintUpkeep kUpkeep>
__device__ __forceinline__ void take_slot(const ResolveResidencyParams& p, const ResolverConstants& c,
                                          const ResolverWorkspace& ws, const ResolverRequest& request, int32_t j,
                                          int32_t key) {
  if constexpr (kUpkeep == HintUpkeep::kAfterOutputs) return;
  request.dgi_row[j] = key;
  if constexpr (kUpkeep == HintUpkeep::kInPhaseD) {
    move_hint_bit(p, reinterpret_cast<const int32_t*>(ws.base + c.held_rows)[j], key);
  }
}

// After phase F, under kAfterOutputs: every slot E[m] that took a miss
// (m < taken) gets its entry, the host row of its swap entry.
__device__ __forceinline__ void keep_hint_for_slot(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                   const ResolverWorkspace& ws, const ResolverRequest& request,
                                                   int32_t m) {
  const int32_t word = ws.evictable[m];
  if ((word & kSlotMask) == kNoSlot) return;
  const int32_t order = word >> 16;
  const int32_t row = c.top_k.quotient(order);
  const int64_t t = request.t0 + row;
  const int32_t slot = word & kSlotMask;
  const int32_t host_row = p.out_swap_host_rows[t * p.out_swap_host_rows_row_stride + c.top_k.remainder(order, row)];
  const int32_t replaced = request.dgi_row[slot];
  request.dgi_row[slot] = host_row;
  move_hint_bit(p, replaced, host_row);
}

__device__ __forceinline__ void keep_hint_after_outputs(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                        const ResolverWorkspace& ws, const ResolverRequest& request,
                                                        int32_t taken) {
  for (int32_t m = threadIdx.x + kThreads; m < taken; m += kThreads) keep_hint_for_slot(p, c, ws, request, m);
  if (static_cast<int32_t>(threadIdx.x) < taken) keep_hint_for_slot(p, c, ws, request, threadIdx.x);
}

struct Assignment {
  int32_t miss_total;      // |M|: members that no hit position serves
  int32_t assigned_total;  // misses that took a slot
};

// ---- Phase D: steps 5 and 6 and the swap list of step 7, ends at B6 (B5
// inside the member scan). Misses are numbered in rank order by a scan;
// miss m takes E[m], or is dropped when E[m] does not exist or is unusable.
// A served member's member_slots and member_keys become its physical hot
// row and attention index (member_first: see kServedHit). An assigned miss
// writes device_global_indices and its swap entry; the swap counts and the
// new LRU order E[n:], E[:n], P (into the free slot_info words) follow.
template <HintUpkeep kUpkeep, class Gather>
__device__ __forceinline__ Assignment assign_misses(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                    const ResolverWorkspace& ws, const ResolverRequest& request,
                                                    const MemberRun& run, const LruWalk& walk, Gather& gather) {
  const int tid = threadIdx.x;
  const int32_t K = p.top_k;
  uint32_t miss_bits = 0;
  int32_t misses_here = 0;
  for (int32_t r = run.begin; r < run.end; ++r) {
    if (ws.member_slots[r] < 0) {
      miss_bits |= 1u << (r - run.begin);
      ++misses_here;
    }
  }
  Assignment a;
  // Runs of up to three members (a union of at most 3072) take the ballot scan.
  int32_t m = run.length <= 3
                  ? block_exclusive_sum_small<2>(misses_here, ws.scratch + kScratchMemberScan, &a.miss_total)
                  : block_exclusive_sum(misses_here, ws.scratch + kScratchMemberScan, &a.miss_total);
  // B5 (inside the scan): E is complete.
  const int32_t taken = min(a.miss_total, walk.evictable_total);  // n
  a.assigned_total = 0;
  if (taken > 0) {
    const int32_t word = ws.evictable[taken - 1];
    a.assigned_total = (word >> 16) + ((word & kSlotMask) != kNoSlot);
  }
  for (int32_t r = run.begin; r < run.end; ++r) {
    int32_t j = -1;      // the member's slot once served
    int32_t order = -1;  // m' (index among assigned misses) for an assigned miss
    if (!(miss_bits & (1u << (r - run.begin)))) {
      j = ws.lru_copy[ws.member_slots[r]];  // the last hit position's slot
      ws.member_first[r] = kServedHit;
    } else {
      const int32_t word = m < taken ? ws.evictable[m] : kNoSlot;
      if ((word & kSlotMask) != kNoSlot) {
        j = word & kSlotMask;
        order = word >> 16;
      } else {
        ws.member_first[r] = kNotServed;  // dropped, or no evictable position left
      }
      ++m;
    }
    if (j < 0) continue;
    // Physical row and attention index of the slot (usable: both fit int32).
    const int32_t hot_block = c.hot_block_size.quotient(j);
    const int32_t block = __ldg(request.hot_table + hot_block);
    const int32_t offset = c.hot_block_size.remainder(j, hot_block);
    const int32_t row = static_cast<int32_t>(static_cast<int64_t>(block) * p.hot_block_size + offset);
    const int32_t key = ws.member_keys[r];
    ws.member_slots[r] = row;
    ws.member_keys[r] = static_cast<int32_t>(static_cast<int64_t>(block) * p.attention_block_stride + offset);
    if (order >= 0) {
      gather.note_assigned_miss(ws, r);
      take_slot<kUpkeep>(p, c, ws, request, j, key);
      const int32_t swap_row = c.top_k.quotient(order);
      const int64_t t = request.t0 + swap_row;
      const int32_t column = c.top_k.remainder(order, swap_row);
      p.out_swap_host_rows[t * p.out_swap_host_rows_row_stride + column] = key;
      p.out_swap_device_rows[t * p.out_swap_device_rows_row_stride + column] = row;
    }
  }
  gather.after_assignment(ws);
  for (int32_t r = tid; r < request.q; r += kThreads) {
    const int64_t remaining = static_cast<int64_t>(a.assigned_total) - static_cast<int64_t>(r) * K;
    p.out_swap_counts[request.t0 + r] = static_cast<int32_t>(min(max(remaining, int64_t{0}), static_cast<int64_t>(K)));
  }
  {
    // New LRU order E[n:], E[:n], P.
    int16_t* const next_lru = ws.next_lru();
    int32_t x = walk.evictable_before;
    for (int32_t i = walk.begin; i < walk.end; ++i) {
      int32_t destination;
      if (walk.hit_bits & (1u << (i - walk.begin))) {
        destination = walk.evictable_total + (i - x);
      } else {
        destination = x >= taken ? x - taken : walk.evictable_total - taken + x;
        ++x;
      }
      next_lru[destination] = ws.lru_copy[i];
    }
  }
  __syncthreads();  // B6: member slots final, new LRU complete
  return a;
}

// ---- Phase F: the new LRU row out (step 6), then per entry the outputs of
// step 7 and the valid counts per token row, ends at B7 (one barrier per
// group of 32 token rows). Entries the union loop saw keep their code; the
// rest (past the codes, or after the union filled up) are classified again.
// Leaves the block's valid and resident totals in scratch.
__device__ __forceinline__ void write_outputs(const ResolveResidencyParams& p, const ResolverConstants& c,
                                              const ResolverWorkspace& ws, const ResolverRequest& request,
                                              const UnionSummary& u) {
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int32_t K = p.top_k;
  const int32_t q = request.q;
  const int32_t t0 = request.t0;
  const bool single_row = request.single_row;
  const int32_t max_union = p.max_union_rows;
  copy_int16_row<kThreads>(request.lru_row, ws.next_lru(), p.hot_size);

  int32_t* const row_counts = ws.scratch + kScratchRowCounts;
  int32_t* const totals = ws.scratch + kScratchTotals;
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
        const uint16_t code = e < u.classified && e < u.coded ? ws.entry_codes[e] : kCodeResident;
        Entry entry{kInvalid, -1, -1, -1};
        uint32_t rank = kNoRank;
        if (code < kCodeResident) {
          entry.kind = kHot;
          entry.host_slot = ws.table.key_at(code);
          rank = ws.table.value_at(code);
        } else if (code == kCodeResident) {
          entry = classify(p, c, request.source, request.resident, request.topk[r * p.topk_row_stride + k]);
          if (entry.kind == kHot) rank = ws.table.find(entry.host_slot);
        }
        int32_t row = -1, address = -1;
        int32_t miss = 0;
        if (entry.kind == kResident) {
          row = static_cast<int32_t>(entry.row);
          address = static_cast<int32_t>(entry.address);
          valid = true;
          ++resident_here;
        } else if (entry.kind == kHot && rank < static_cast<uint32_t>(max_union)) {
          const int32_t first = ws.member_first[rank];
          if (first != kNotServed) {
            row = ws.member_slots[rank];
            address = ws.member_keys[rank];
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
        const unsigned run =
            (later_heads != 0 ? (later_heads & (0u - later_heads)) - 1u : kFullMask) & ~((1u << lane) - 1u);
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
}

// Step 8: the request's counters, from the totals phase F left (final
// since its last barrier).
__device__ __forceinline__ void count_request(const ResolveResidencyParams& p, const ResolverWorkspace& ws,
                                              const ResolverRequest& request, const UnionSummary& u,
                                              const Assignment& a) {
  if (threadIdx.x == 0 && p.stats != nullptr) {
    const int32_t* const totals = ws.scratch + kScratchTotals;
    const int64_t lookups = static_cast<int64_t>(request.entries);
    add_stat(p, HS_STAT_LOOKUPS, lookups);
    add_stat(p, HS_STAT_HITS, u.members - a.miss_total);
    add_stat(p, HS_STAT_MISSES, a.assigned_total);
    add_stat(p, HS_STAT_RESIDENT, totals[1]);
    add_stat(p, HS_STAT_INVALID, lookups - totals[0]);
  }
}

// The phases of each request of the block, in order; the fused gather's
// hooks are Gather's (resolver_gather.cuh). docs/residency.md maps each
// phase to the contract's steps. A block resolves Gather::kRequestsPerBlock
// batch rows in turn (b = blockIdx.x alone, except DeferredGather's two),
// with the whole register file of its SM. kUpkeep: how the residency hint
// is kept, if any.
template <class Gather, class Placement, HintUpkeep kUpkeep>
__global__ void __launch_bounds__(kThreads, 1)
    resolve_residency_kernel(const ResolveResidencyParams p, const ResolverConstants c,
                             const typename Placement::Layout layout) {
  extern __shared__ __align__(16) unsigned char smem[];
  const Placement placement(layout);
  ResolverWorkspace ws = placement.carve(smem);
  Gather gather(c, ws);
  constexpr int kTurns = Gather::kRequestsPerBlock;
  // The batch rows the launch's blocks take (its own blocks, in turns).
  const int32_t blocks = kTurns == 1 ? static_cast<int32_t>(gridDim.x) : p.num_batch_rows + 1;
  for (int turn = 0; turn < kTurns; ++turn) {
    const int32_t b = static_cast<int32_t>(blockIdx.x) * kTurns + turn;
    if (b >= blocks) break;
    if (turn > 0) __syncthreads();  // the last request is done with shared memory
    ResolverRequest request;
    if (!find_request(p, c, placement, ws, gather, request, b, blocks)) {   // A  | B1
      gather.help_as_idle(p, c, ws);                                         // H
      continue;
    }
    gather.open_request(p, c, request);                                      // A
    placement.bind(p, request, ws);                                          // A  | B1b (workspace)
    if constexpr (Gather::kSingleRow && std::is_same<Placement, SharedPlacement>::value) {
      if (c.single_row_phases && request.single_row) {
        single_row::resolve<kUpkeep>(p, c, ws, request, gather);              // B-G | B2 .. B6
        continue;
      }
    }
    count_slot_occurrences<Placement>(p, ws);                                // B
    const UnionSummary u = build_union(p, c, ws, request);                   // B  | B2a, B2b per chunk; B2
    match_slots<kUpkeep == HintUpkeep::kInPhaseD>(p, c, ws, request, gather);  // C1 | B3
    const MemberRun run = member_run(u.members);
    gather.after_slot_scan(p, c, ws, u.members, run);                        // the stage after C1
    const LruWalk walk = walk_lru(p, ws);                                    // C2 | B4
    const Assignment a = assign_misses<kUpkeep>(p, c, ws, request, run, walk, gather);  // D  | B5, B6
    gather.note_assigned_total(c, p, request, a.assigned_total);
    // A block left with no host reads of its own lets the next programmatic
    // launch start now, so its launch and shared-memory fill overlap phases
    // F and G here; one that copies rows in phase E lets it start only at
    // its exit. The next kernel still sees all of this one's writes: it
    // waits for the whole grid in its wait_for_prior_grid().
    const bool copies = gather.copies_assigned(ws);
    if (!copies) allow_dependent_launch();
    if (copies) gather.copy_assigned(p, c, ws, request, u.classified, u.coded, run);  // E
    write_outputs(p, c, ws, request, u);                                     // F  | B7 per 32 token rows
    count_request(p, ws, request, u, a);                                     // F
    if constexpr (kUpkeep == HintUpkeep::kAfterOutputs) {
      keep_hint_after_outputs(p, c, ws, request, min(a.miss_total, walk.evictable_total));  // F
    }
    gather.finish(c, ws);                                                    // G  | B8
    gather.help_as_owner(p, c, ws);                                          // H
  }
  gather.copy_lists(p, c, ws);
}

// cudaFuncSetAttribute is a driver round trip: do it once per device, size
// and instantiation, with a lock-free check on the launch path.
constexpr int kCachedDevices = 64;
std::mutex g_configure_mutex;

template <class Gather, class Placement, HintUpkeep kUpkeep>
void ensure_dynamic_shared_memory(int device, uint32_t bytes) {
  static std::atomic<uint32_t> configured[kCachedDevices];
  constexpr uint32_t kDefaultLimit = 48 * 1024;
  if (bytes <= kDefaultLimit) return;
  const bool cached = device >= 0 && device < kCachedDevices;
  if (cached && configured[device].load(std::memory_order_acquire) >= bytes) return;
  std::lock_guard<std::mutex> lock(g_configure_mutex);
  if (cached && configured[device].load(std::memory_order_relaxed) >= bytes) return;
  cuda_check(cudaFuncSetAttribute(resolve_residency_kernel<Gather, Placement, kUpkeep>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
             "cudaFuncSetAttribute(resolve_residency, MaxDynamicSharedMemorySize)");
  if (cached) configured[device].store(bytes, std::memory_order_release);
}

// Rows the fused gather stages, at most: every miss of a decode step at low
// miss rates (0.1% of k = 2048 is 2 per request), where the host round trip
// is the whole cost of the copy. Few on purpose: asynchronous copies from
// host memory keep fewer bytes in flight than phase E's direct loads, and
// many of them hold the block's own later phases back until they land
// (docs/performance.md, "Physical bounds": host round trips), so the rest
// of a large swap list goes through phase E.
constexpr int32_t kMissStageRows = 8;

// What the launcher needs to know of a device, read once per device (each
// field is a driver round trip).
struct ResolverDevice {
  bool hopper = false;             // sm_90 or later: bulk-copy stage, programmatic launch
  int multiprocessors = 0;
  uint64_t block_shared_limit = 0;  // opt-in dynamic shared memory of one block
  uint64_t sm_shared_bytes = 0;     // shared memory of one SM, for all its blocks
  uint64_t block_reserved_bytes = 0;  // shared memory the system reserves per block
};

ResolverDevice query_resolver_device(int device) {
  const auto attribute = [device](cudaDeviceAttr which, const char* name) {
    int value = 0;
    cuda_check(cudaDeviceGetAttribute(&value, which, device), name);
    return value;
  };
  ResolverDevice d;
  d.hopper = attribute(cudaDevAttrComputeCapabilityMajor, "cudaDeviceGetAttribute(ComputeCapabilityMajor)") >= 9;
  d.multiprocessors = attribute(cudaDevAttrMultiProcessorCount, "cudaDeviceGetAttribute(MultiProcessorCount)");
  d.block_shared_limit = static_cast<uint64_t>(
      attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)"));
  d.sm_shared_bytes = static_cast<uint64_t>(attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor,
                                                      "cudaDeviceGetAttribute(MaxSharedMemoryPerMultiprocessor)"));
  d.block_reserved_bytes = static_cast<uint64_t>(
      attribute(cudaDevAttrReservedSharedMemoryPerBlock, "cudaDeviceGetAttribute(ReservedSharedMemoryPerBlock)"));
  return d;
}

const ResolverDevice& resolver_device(int device) {
  static ResolverDevice known[kCachedDevices];
  static std::atomic<bool> ready[kCachedDevices];
  if (device < 0 || device >= kCachedDevices) {
    thread_local ResolverDevice uncached;
    uncached = query_resolver_device(device);
    return uncached;
  }
  if (!ready[device].load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(g_configure_mutex);
    if (!ready[device].load(std::memory_order_relaxed)) {
      known[device] = query_resolver_device(device);
      ready[device].store(true, std::memory_order_release);
    }
  }
  return known[device];
}

// The kernel's per-launch constants for `params` with shared memory carved
// as `chosen`; `hopper`: an sm_90 or later device (bulk-copy stage).
ResolverConstants make_resolver_constants(const ResolveResidencyParams& params, const ResolverLaunchLayout& chosen,
                                          bool hopper) {
  const ResolverSharedLayout& layout = chosen.layout;
  ResolverConstants constants;
  constants.miss_stage = chosen.stage;
  constants.top_k = FastDivisor::make(params.top_k);
  constants.block_size = FastDivisor::make(params.source_block_table != nullptr ? params.block_size : 1);
  constants.hot_block_size = FastDivisor::make(params.hot_block_size);
  constants.safe_hot_block = static_cast<int32_t>(
      std::min<int64_t>(INT32_MAX, (INT32_MAX - (params.hot_block_size - 1)) / params.attention_block_stride));
  constants.hot_table_entries = (params.hot_size + params.hot_block_size - 1) / params.hot_block_size;
  constants.bulk_stage = hopper;
  constants.stage_host = params.fused_gather ? params.gather.host : nullptr;
  constants.stage_host_pitch = params.fused_gather ? params.gather.host_pitch : 0;
  constants.stage_host_rows =
      params.fused_gather ? static_cast<int32_t>(std::min<int64_t>(params.gather.host_rows, INT32_MAX)) : 0;
  constants.stage_row_bytes = params.fused_gather ? static_cast<uint32_t>(params.gather.row_bytes) : 0;
  constants.stage_hot = params.fused_gather ? params.gather.hot : nullptr;
  constants.stage_hot_block_stride = params.fused_gather ? params.gather.hot_block_stride : 0;
  constants.stage_hot_span_rows = params.fused_gather ? params.gather.hot_span_rows : 0;
  // The automatic schedule: a request whose misses its stage holds copies them
  // itself (fewer than K, which the tail gather's row test relies on).
  constants.auto_local_rows = std::max(0, std::min(chosen.stage.rows, params.top_k - 1));
  constants.held_rows = layout.held_rows;
  constants.ones_vectors = static_cast<int32_t>((layout.slot_info - layout.hash_keys) / 16);
  constants.zero_vectors = static_cast<int32_t>((layout.scratch + 4 * kScratchZeroedWords - layout.slot_info) / 16);
  constants.rows_per_request = params.num_batch_rows > 0 && params.num_tokens % params.num_batch_rows == 0
                                   ? params.num_tokens / params.num_batch_rows
                                   : 0;
  const int64_t stride = params.out_attention_row_stride;
  const bool shared_stride = params.out_hot_rows_row_stride == stride && params.out_resolved_row_stride == stride &&
                             params.out_miss_mask_row_stride == stride;
  constants.entry_output_stride = shared_stride ? stride : -1;
  const auto aligned8 = [](const int32_t* output) { return reinterpret_cast<uintptr_t>(output) % 8 == 0; };
  constants.entry_output_pairs = shared_stride && stride % 2 == 0 && aligned8(params.out_attention) &&
                                 aligned8(params.out_hot_rows) && aligned8(params.out_resolved) &&
                                 aligned8(params.out_miss_mask);
  constants.single_row_phases = single_row::shape_fits(params.top_k, params.hot_size, params.max_union_rows);
  constants.tail_rows_per_helper = 0;
  constants.early_batch = FastDivisor::make(1);
  constants.early_parts = 0;
  constants.early_more_parts = 0;
  return constants;
}

// The blocks a launch runs for its batch: one per batch row plus one; every
// block also writes its share of the orphan token rows, so B == 0 still
// launches the one that writes them.
int64_t own_blocks(const ResolveResidencyParams& params) { return static_cast<int64_t>(params.num_batch_rows) + 1; }

// `helper_blocks`: blocks past the batch that only copy published rows
// (HandoffGather).
template <class Gather, class Placement, HintUpkeep kUpkeep>
void launch_kernel(const ResolveResidencyParams& params, const ResolverConstants& constants,
                   const typename Placement::Layout& layout, int device, bool hopper, cudaStream_t stream,
                   unsigned helper_blocks) {
  const uint32_t shared_bytes = constants.miss_stage.total_bytes;
  ensure_dynamic_shared_memory<Gather, Placement, kUpkeep>(device, shared_bytes);
  constexpr int64_t kTurns = Gather::kRequestsPerBlock;
  const unsigned blocks = static_cast<unsigned>((own_blocks(params) + kTurns - 1) / kTurns) + helper_blocks;

  // Programmatic serialization lets this launch and the kernel ahead of it
  // overlap up to the kernel's wait_for_prior_grid() (launch latency and the
  // shared-memory fill); Hopper and later.
  const ProgrammaticLaunch launch_config(dim3(blocks), dim3(kThreads), shared_bytes, stream, hopper);
  cuda_check(cudaLaunchKernelEx(launch_config.config(), resolve_residency_kernel<Gather, Placement, kUpkeep>, params,
                                constants, layout),
             "resolve_residency kernel launch");
}

// The instantiation for the launch's residency hint (HintUpkeep): none, kept
// in phase D where the layout holds a copy of the state row (only shared
// placements have one), or after phase F.
template <class Gather, class Placement>
void launch(const ResolveResidencyParams& params, const ResolverConstants& constants,
            const typename Placement::Layout& layout, int device, bool hopper, cudaStream_t stream,
            unsigned helper_blocks = 0) {
  constexpr bool kMayKeepRows = std::is_same<Placement, SharedPlacement>::value;
  if (params.residency_hint == nullptr) {
    launch_kernel<Gather, Placement, HintUpkeep::kNone>(params, constants, layout, device, hopper, stream,
                                                        helper_blocks);
    return;
  }
  if constexpr (kMayKeepRows) {
    if (constants.held_rows != ResolverSharedLayout::kNoHeldRows) {
      launch_kernel<Gather, Placement, HintUpkeep::kInPhaseD>(params, constants, layout, device, hopper, stream,
                                                              helper_blocks);
      return;
    }
  }
  launch_kernel<Gather, Placement, HintUpkeep::kAfterOutputs>(params, constants, layout, device, hopper, stream,
                                                              helper_blocks);
}

// cpp/core/config.cpp's residency_hint_pays restates when a launch gets
// early-read helpers (here and in reads_early) to decide the runtime's
// default residency hint: change the two together. (Tail reads, from half
// the SMs on, predict from the hint where the launch has one and from the
// state rows otherwise: they are no reason to keep a hint, which costs its
// upkeep.)
//
// Whether a launch from half the SMs on reads tails (resolver_tail_reads.cuh):
// requests of one token row each (a prediction reads the request's one
// top-k row), k of at most two entries per thread (one scan numbers them),
// and an SM left idle by the batch's blocks. Elsewhere past half every
// request keeps its whole list (HandoffGather::note_assigned_total): the
// requests' own copies keep the link busy, and helpers would only wait for
// records that never publish.
bool reads_tails(const ResolveResidencyParams& params, const ResolverDevice& d) {
  const int64_t batch = params.num_batch_rows;
  return batch > 0 && 2 * batch >= d.multiprocessors && own_blocks(params) < d.multiprocessors &&
         params.num_tokens == batch && params.top_k <= kResolverUnionChunk;
}

// The automatic schedule with a handoff array: one helper block per SM that
// the batch's blocks leave idle, while those blocks are fewer than half the
// SMs (or, from half on, where the launch reads tails: idle_blocks).
unsigned idle_blocks(const ResolveResidencyParams& params, const ResolverDevice& d) {
  return static_cast<unsigned>(std::max<int64_t>(d.multiprocessors - own_blocks(params), 0));
}
unsigned handoff_helper_blocks(const ResolveResidencyParams& params, const ResolverDevice& d) {
  const int64_t batch = params.num_batch_rows;
  if (batch <= 0 || 2 * batch >= d.multiprocessors) return 0;
  return idle_blocks(params, d);
}

// Each tail-read helper's share of tail_reads::kLaunchRows (at most one top-k row).
int16_t tail_rows_per_helper(const ResolveResidencyParams& params, unsigned helpers) {
  return static_cast<int16_t>(
      std::max<int64_t>(std::min<int64_t>(tail_reads::kLaunchRows / std::max(helpers, 1u), params.top_k), 1));
}

// Whether the handoff's helper blocks read early (resolver_early_reads.cuh):
// for requests of one token row each, with a helper per request or more
// (every batch below half the SMs; with fewer than two helpers per request
// early reads still took 0.94-0.98x the time of the kept heads at 5-20%
// misses: bench/results/resolver_early_reads_one_helper_ab_h200.json), and
// arrays in shared memory (a batch of single rows has a union of at most
// top_k rows). The helpers predict from the residency hint where the launch
// has one, and otherwise from the requests' state rows. The early-read path
// is its own instantiation, so that launches without it keep the registers
// of the handoff without it.
bool reads_early(const ResolveResidencyParams& params, unsigned helpers) {
  const int64_t batch = params.num_batch_rows;
  return params.num_tokens == batch && batch > 0 && helpers >= batch;
}

// Whether the early-read helpers also note their rows' destinations while
// they read: where no request has more than early_reads::kNoteMaxParts
// partitions (helpers <= kNoteMaxParts * B; from 15 requests on 132 SMs).
bool notes_destinations(const ResolveResidencyParams& params, unsigned helpers) {
  return static_cast<int64_t>(helpers) <= static_cast<int64_t>(early_reads::kNoteMaxParts) * params.num_batch_rows;
}

// `constants` with the shares and shared-memory layouts of `helpers`
// early-read helper blocks (ResolverConstants' early_* fields); `notes`:
// they note their rows' destinations.
ResolverConstants with_early_read_helpers(const ResolverConstants& constants, const ResolveResidencyParams& params,
                                          unsigned helpers, bool notes) {
  ResolverConstants early = constants;
  const int32_t batch = params.num_batch_rows;
  const int32_t held = params.residency_hint != nullptr ? 0 : params.hot_size;
  early.early_batch = FastDivisor::make(batch);
  early.early_parts = static_cast<int32_t>(helpers / static_cast<unsigned>(batch));
  early.early_more_parts = static_cast<int32_t>(helpers % static_cast<unsigned>(batch));
  for (int more = 0; more < 2; ++more) {
    const int32_t parts = std::max(1, std::min(early.early_parts + more, early_reads::kMaxParts));
    early.early_layouts[more] = HelperLayout::make(constants.miss_stage.total_bytes, params.top_k, held, parts,
                                                   constants.stage_row_bytes, notes);
  }
  return early;
}

template <class Placement>
void launch_handoff(const ResolveResidencyParams& params, const ResolverConstants& constants,
                    const typename Placement::Layout& layout, int device, const ResolverDevice& d,
                    cudaStream_t stream) {
  const unsigned helpers = handoff_helper_blocks(params, d);
  if constexpr (std::is_same<Placement, SharedPlacement>::value) {
    if (reads_tails(params, d)) {
      const unsigned tail_helpers = idle_blocks(params, d);
      ResolverConstants tails = constants;
      tails.tail_rows_per_helper = tail_rows_per_helper(params, tail_helpers);
      launch<HandoffGather<FusedGather, false, false, true>, Placement>(params, tails, layout, device, d.hopper, stream,
                                                                        tail_helpers);
      return;
    }
    if (reads_early(params, helpers)) {
      const bool notes = notes_destinations(params, helpers);
      const ResolverConstants early = with_early_read_helpers(constants, params, helpers, notes);
      if (notes) {
        launch<HandoffGather<FusedGather, true, true>, Placement>(params, early, layout, device, d.hopper, stream,
                                                                  helpers);
      } else {
        launch<HandoffGather<FusedGather, true>, Placement>(params, early, layout, device, d.hopper, stream, helpers);
      }
      return;
    }
  }
  launch<HandoffGather<FusedGather>, Placement>(params, constants, layout, device, d.hopper, stream, helpers);
}

// The instantiation of the launch's fused gather for arrays placed by
// Placement; the automatic schedule adds the tail gather after it without a
// handoff array, and also past the SM count, where the blocks run in waves
// and a handoff has no helper blocks: there the requests' blocks copying
// one another's lists as they finish took 1.07-1.44x the tail gather's time
// at 256 requests of 2-4 token rows
// (bench/results/resolver_auto_past_sm_count_h200.json).
template <class Placement>
void launch_placed(const ResolveResidencyParams& params, const ResolverConstants& constants,
                   const typename Placement::Layout& layout, int device, const ResolverDevice& d, cudaStream_t stream) {
  const bool hopper = d.hopper;
  if (!params.fused_gather) {
    launch<NoGather, Placement>(params, constants, layout, device, hopper, stream);
  } else if (params.gather_schedule == HS_RESOLVE_GATHER_FUSED) {
    launch<FusedGather, Placement>(params, constants, layout, device, hopper, stream);
  } else if (params.handoff != nullptr && own_blocks(params) <= d.multiprocessors) {
    launch_handoff<Placement>(params, constants, layout, device, d, stream);
  } else {
    launch<AutoGather<FusedGather>, Placement>(params, constants, layout, device, hopper, stream);
    launch_resolver_tail_gather(params, constants.auto_local_rows, stream);
  }
}

// A fused gather over more requests than the device has SMs, up to twice
// as many: one block per SM resolves two requests in turn and then copies
// both swap lists (DeferredGather), under either schedule. One block per
// request would run in two waves, the second wave's resolves after the
// first wave's copies; two blocks on one SM, at 32 registers per thread,
// took longer for the same two requests, and copying each request's rows
// before the next resolve costs a host round trip per request
// (docs/performance.md, "Two requests per block"). That was measured where
// two blocks fit one SM's shared memory (k = 2048 up to H = 4096 on an
// H200), and the launch takes turns there; larger shapes (speculative
// unions) and batches past twice the SM count run one block per request, in
// waves, with the tail gather.
bool resolves_in_turns(const ResolveResidencyParams& params, const ResolverDevice& d) {
  const int64_t blocks = own_blocks(params);
  if (!params.fused_gather || blocks <= d.multiprocessors || blocks > 2 * int64_t{d.multiprocessors}) return false;
  const uint64_t half = d.sm_shared_bytes / 2;
  const uint64_t half_limit =
      std::min(d.block_shared_limit, half > d.block_reserved_bytes ? half - d.block_reserved_bytes : 0);
  return resolver_shared_layout(params.hot_size, params.max_union_rows).total_bytes <= half_limit;
}

}  // namespace

void launch_resolve_residency(const ResolveResidencyParams& params, cudaStream_t stream) {
  if (params.num_tokens <= 0) return;
  // Entry indices (and loop counters that step past them) are int32 inside
  // the kernel: 2^30 entries is a 4 GiB top-k tensor.
  if (static_cast<int64_t>(params.num_tokens) * params.top_k > kMaxEntries) {
    invalid_argument("topk_indices: the CUDA resolver handles at most ", kMaxEntries, " entries (rows x top_k), got ",
                     params.num_tokens, " x ", params.top_k);
  }
  int device = params.device;
  if (device < 0) cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  const ResolverDevice& d = resolver_device(device);
  const uint64_t limit = d.block_shared_limit;
  const bool hopper = d.hopper;
  const int64_t stage_row_bytes = params.fused_gather ? params.gather.row_bytes : 0;
  const int32_t stage_rows = params.fused_gather ? kMissStageRows : 0;
  const ResolverSplitLayout split = resolver_split_layout(params.hot_size, params.max_union_rows, limit);
  if (split.in_workspace == 0) {
    // DeferredGather stages into two halves of the stage, one per turn.
    const bool turns = resolves_in_turns(params, d);
    const int32_t stage_rows_here = turns ? 2 * stage_rows : stage_rows;
    ResolverLaunchLayout chosen = resolver_launch_layout(params.hot_size, params.max_union_rows, stage_row_bytes,
                                                         stage_rows_here, limit, kResolverMaxSlackHalves);
    if (params.residency_hint != nullptr) {
      // The hint's upkeep reads the replaced rows from a kept copy of the
      // state row where that fits beside the same miss stage and the same
      // union table: a fuller table costs every probe more than the kept
      // copy saves.
      const ResolverLaunchLayout keeping =
          resolver_launch_layout(params.hot_size, params.max_union_rows, stage_row_bytes, stage_rows_here, limit,
                                 kResolverMaxSlackHalves, true);
      if (keeping.stage.total_bytes <= limit && keeping.stage.rows == chosen.stage.rows &&
          keeping.layout.hash_capacity == chosen.layout.hash_capacity) {
        chosen = keeping;
      }
    }
    ResolverConstants constants = make_resolver_constants(params, chosen, hopper);
    if (turns) {
      constants.miss_stage.rows = chosen.stage.rows / 2;  // a turn's half
      launch<DeferredGather, SharedPlacement>(params, constants, chosen.layout, device, hopper, stream);
    } else {
      launch_placed<SharedPlacement>(params, constants, chosen.layout, device, d, stream);
    }
    return;
  }
  // The checked glue passes a workspace whenever the shape needs one.
  if (split.workspace_row_bytes > 0 && params.num_state_rows > 0 && params.workspace == nullptr) {
    invalid_argument("workspace: expected ",
                     resolver_workspace_bytes(params.num_state_rows, params.hot_size, params.max_union_rows, limit),
                     " B for device_buffer_size=", params.hot_size, " and max_union_rows=", params.max_union_rows,
                     ", got none");
  }
  ResolverLaunchLayout chosen;
  chosen.layout = split.offsets;
  chosen.stage = resolver_miss_stage(split.offsets, stage_row_bytes, stage_rows, limit);
  ResolverConstants constants = make_resolver_constants(params, chosen, hopper);
  // SplitPlacement fills from the split layout's runs; these describe the shared part alone.
  constants.ones_vectors = split.shared_ones_vectors;
  constants.zero_vectors = split.shared_zero_vectors;
  launch_placed<SplitPlacement>(params, constants, split, device, d, stream);
}

}  // namespace cuda
}  // namespace hisparse
