// The single-row phases of the CUDA residency resolver: a request of one
// token row (a decode step without speculative rows) whose k entries and H
// LRU positions fit one pass of the block (two entries and four positions
// per thread) resolves in one pass over its entries and one over its LRU
// positions, with compile-time work per thread, instead of the general
// phases B to G (resolve_residency.cu), bit-identical to them.
//
// What makes it shorter than the general phases, for that shape alone:
// - The union needs no ranks. With one chunk of entries, a key's first
//   occurrence is the smallest entry index offered to its table slot
//   (atomicMin), and rank order is first-entry order, so misses are numbered
//   by a scan over entries; members are addressed by their first entry.
// - Hits are found by walking the LRU positions directly (position -> slot
//   -> held host row -> member), without the per-slot pass of phase C1.
// - Two scans (positions; misses and members) instead of three, and five
//   block barriers after phase A instead of eight.
//
// Shared memory is the general layout's (ResolverSharedLayout), with other
// lives for some arrays:
//   hash_values   first entry of each key (all-ones until offered)
//   member_slots  by first entry: a hit's last hit position (atomicMax from
//                 -1), or kSingleRowAssigned for an assigned miss
//   member_keys   by first entry: the member's physical hot row, -1 when
//                 dropped (written for every member in phase D)
//   member_held   by first entry: kMemberStaged (the fused gather's stage)
//   slot_info     slot occurrence counts, then the new LRU order
//   member_first  by entry: a resident entry's physical row
//   evictable     the dgi row copy until the position scan, then E
// The entry codes are unused.
#pragma once

#include <cstdint>

#include "core/resolve_residency_params.hpp"
#include "cuda/async_copy.cuh"
#include "cuda/block_scan.cuh"
#include "cuda/hopper_sync.cuh"
#include "cuda/resolver_context.cuh"
#include "cuda/resolver_gather.cuh"
#include "cuda/resolver_hint.cuh"

namespace hisparse {
namespace cuda {
namespace single_row {

constexpr int kEntries = 2;    // entries 2t and 2t + 1 of thread t
constexpr int kPositions = 4;  // LRU positions 4t .. 4t + 3 of thread t
static_assert(kEntries * kResolverThreads == kResolverUnionChunk, "the single-row union is one chunk");

// Whether a launch may take the single-row phases for its one-row requests
// (the host's half of ResolverConstants::single_row_phases).
inline bool shape_fits(int32_t top_k, int32_t hot_size, int32_t max_union_rows) {
  return top_k <= kEntries * kResolverThreads && hot_size <= kPositions * kResolverThreads && max_union_rows >= top_k;
}

// The thread's entries 2t and 2t + 1, after step 1: g is the host slot of a
// resident or hot entry (-1: invalid); code is a hot candidate's union table
// slot until B2 and its key's first entry after it (kNoRank: not a hot
// candidate). A resident entry keeps its physical row in member_first.
struct RowEntries {
  int32_t g[kEntries];
  uint32_t code[kEntries];
};

__device__ __forceinline__ int32_t entry_index(int x) { return kEntries * static_cast<int32_t>(threadIdx.x) + x; }

// Physical row and attention index of a usable slot j (both fit int32).
struct SlotRow {
  int32_t row;
  int32_t address;
};

__device__ __forceinline__ SlotRow slot_row(const ResolveResidencyParams& p, const ResolverConstants& c,
                                            const ResolverRequest& request, int32_t j) {
  const int32_t hot_block = c.hot_block_size.quotient(j);
  const int32_t block = __ldg(request.hot_table + hot_block);
  const int32_t offset = c.hot_block_size.remainder(j, hot_block);
  return {static_cast<int32_t>(static_cast<int64_t>(block) * p.hot_block_size + offset),
          static_cast<int32_t>(static_cast<int64_t>(block) * p.attention_block_stride + offset)};
}

// Step 3 for slot j (0 <= j < H): occurs once in the LRU row (the counts of
// B2), a hot block, an attention index within int32.
__device__ __forceinline__ bool usable_slot(const ResolveResidencyParams& p, const ResolverConstants& c,
                                            const ResolverWorkspace& ws, const ResolverRequest& request, int32_t j) {
  if (ws.slot_info[j] != 1) return false;
  const int32_t hot_block = c.hot_block_size.quotient(j);
  const int32_t block = __ldg(request.hot_table + hot_block);
  return block >= 0 && (block <= c.safe_hot_block || static_cast<int64_t>(block) * p.attention_block_stride +
                                                             c.hot_block_size.remainder(j, hot_block) <=
                                                         kInt32Max);
}

// The thread's LRU positions as read (-1 past H); the shared copy is 16-byte
// aligned and padded to 16 bytes, so one 8-byte read covers the four.
__device__ __forceinline__ void load_positions(const ResolverWorkspace& ws, int32_t H, int32_t (&lru)[kPositions]) {
  const int32_t begin = kPositions * static_cast<int32_t>(threadIdx.x);
  uint2 four = make_uint2(0xFFFFFFFFu, 0xFFFFFFFFu);
  if (begin < H) four = reinterpret_cast<const uint2*>(ws.lru_copy)[threadIdx.x];
  lru[0] = static_cast<int16_t>(four.x & 0xFFFFu);
  lru[1] = static_cast<int16_t>(four.x >> 16);
  lru[2] = static_cast<int16_t>(four.y & 0xFFFFu);
  lru[3] = static_cast<int16_t>(four.y >> 16);
#pragma unroll
  for (int x = 0; x < kPositions; ++x) {
    if (begin + x >= H) lru[x] = -1;
  }
}

// ---- Union, ends at B2: slot occurrences, and each hot candidate's key
// inserted with its entry offered as the key's first occurrence.
__device__ __forceinline__ void build_row_union(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                const ResolverWorkspace& ws, const ResolverRequest& request,
                                                RowEntries& entries) {
  const int32_t H = p.hot_size;
  {
    int32_t lru[kPositions];
    load_positions(ws, H, lru);
    uint32_t* const counts = ws.slot_counts();
#pragma unroll
    for (int x = 0; x < kPositions; ++x) {
      const int32_t j = lru[x];
      if (j >= 0 && j < H) atomicAdd(counts + (j >> 1), 1u << ((j & 1) * 16));
    }
  }
  int32_t key[kEntries];
#pragma unroll
  for (int x = 0; x < kEntries; ++x) {
    const int32_t e = entry_index(x);
    const int32_t position = e < p.top_k ? request.topk[e] : -1;
    const Entry classified = classify(p, c, request.source, request.resident, position);
    if (classified.kind == kResident) ws.member_first[e] = static_cast<int32_t>(classified.row);
    entries.g[x] = classified.host_slot;
    key[x] = classified.kind == kHot ? classified.host_slot : -1;
  }
  ws.table.insert(key, entries.code);
  // Lanes leave the probe loop after different rounds.
  __syncwarp();
#pragma unroll
  for (int x = 0; x < kEntries; ++x) {
    if (key[x] >= 0) {
      atomicMin(ws.table.values + entries.code[x], static_cast<uint32_t>(entry_index(x)));
    } else {
      entries.code[x] = kNoRank;
    }
  }
  wait_async_copies<0>();  // the dgi row
  __syncthreads();         // B2
}

// What the position walk found for the thread's positions and entries.
struct RowWalk {
  uint32_t hit_bits;         // bit x: position 4t + x is a hit position
  uint32_t miss_bits;        // bit x: entry 2t + x is the first of a member no hit position serves
  int32_t evictable_before;  // evictable positions before 4t
  int32_t evictable_total;   // |E|
  int32_t miss_before;       // misses of entries before 2t (rank order)
  int32_t miss_total;        // |M|
  int32_t members;           // |U|
};

// ---- Hits and misses (steps 3 to 5's inputs), ends at B4 (inside the
// second scan). Each position of a usable slot whose held row is a member
// offers itself to the member (atomicMax: the last hit position serves);
// the rest are evictable, compacted into E with their usable counts. After
// the first scan (B3) the hit positions are final, so each member's first
// entry knows whether it misses, and the second scan numbers the misses in
// rank (first-entry) order and counts the members.
template <HintUpkeep kUpkeep>
__device__ __forceinline__ RowWalk walk_positions(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                  const ResolverWorkspace& ws, const ResolverRequest& request,
                                                  RowEntries& entries) {
  const int32_t H = p.hot_size;
  const int32_t begin = kPositions * static_cast<int32_t>(threadIdx.x);
  const int32_t* const held = ws.held_copy();
  if constexpr (kUpkeep == HintUpkeep::kInPhaseD) {
    // The slots' rows, kept past the position scan (E overwrites the copy)
    // for the hint's upkeep in the assignment.
    if (begin < H) {
      reinterpret_cast<int4*>(ws.base + c.held_rows)[threadIdx.x] = reinterpret_cast<const int4*>(held)[threadIdx.x];
    }
  }
#pragma unroll
  for (int x = 0; x < kEntries; ++x) {
    if (entries.code[x] != kNoRank) entries.code[x] = ws.table.value_at(entries.code[x]);
  }
  int32_t lru[kPositions];
  load_positions(ws, H, lru);
  RowWalk walk;
  uint32_t hit_bits = 0, unusable_bits = 0;
  int evictable_here = 0, unusable_here = 0;
#pragma unroll
  for (int x = 0; x < kPositions; ++x) {
    if (begin + x >= H) continue;
    const int32_t j = lru[x];
    const bool usable = j >= 0 && j < H && usable_slot(p, c, ws, request, j);
    uint32_t member = kNoRank;
    if (usable && held[j] >= 0) member = ws.table.find(held[j]);
    if (member != kNoRank) {
      hit_bits |= 1u << x;
      atomicMax(ws.member_slots + member, begin + x);
    } else {
      ++evictable_here;
      if (!usable) {
        unusable_bits |= 1u << x;
        ++unusable_here;
      }
    }
  }
  int32_t packed_total;
  const int32_t packed_before =
      block_exclusive_sum(evictable_here | (unusable_here << 16), ws.scratch + kScratchPositionScan, &packed_total);
  // B3 (inside the scan): the dgi copy is read, the hit positions are final.
  walk.hit_bits = hit_bits;
  walk.evictable_total = packed_total & 0xFFFF;
  walk.evictable_before = packed_before & 0xFFFF;
  {
    int32_t out = walk.evictable_before;
    int32_t usable_before = walk.evictable_before - (packed_before >> 16);
#pragma unroll
    for (int x = 0; x < kPositions; ++x) {
      if (begin + x >= H || ((hit_bits >> x) & 1u)) continue;
      const bool usable = !((unusable_bits >> x) & 1u);
      ws.evictable[out++] = (usable_before << 16) | (usable ? lru[x] : kNoSlot);
      usable_before += usable;
    }
  }
  int misses_here = 0, firsts_here = 0;
  walk.miss_bits = 0;
#pragma unroll
  for (int x = 0; x < kEntries; ++x) {
    const int32_t e = entry_index(x);
    const bool first = entries.code[x] == static_cast<uint32_t>(e);
    const bool miss = first && ws.member_slots[e] < 0;
    walk.miss_bits |= static_cast<uint32_t>(miss) << x;
    misses_here += miss;
    firsts_here += first;
  }
  int32_t counts_total;
  const int32_t counts_before =
      block_exclusive_sum(misses_here | (firsts_here << 16), ws.scratch + kScratchMemberScan, &counts_total);
  // B4 (inside the scan): E is complete.
  walk.miss_before = counts_before & 0xFFFF;
  walk.miss_total = counts_total & 0xFFFF;
  walk.members = counts_total >> 16;
  return walk;
}

// ---- Assignment (steps 5 to 7), ends at B5: each member's first entry
// gets its row (a hit: its last hit position's slot; miss m: E[m] when that
// exists and is usable), an assigned miss writes device_global_indices and
// its swap entry, and the new LRU order E[n:], E[:n], P goes into the freed
// slot_info words. Returns the assigned misses.
template <HintUpkeep kUpkeep, class Gather>
__device__ __forceinline__ int32_t assign_row_members(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                      const ResolverWorkspace& ws, const ResolverRequest& request,
                                                      const RowEntries& entries, const RowWalk& walk, Gather& gather) {
  const int32_t H = p.hot_size;
  const int32_t taken = min(walk.miss_total, walk.evictable_total);  // n
  int32_t assigned_total = 0;
  if (taken > 0) {
    const int32_t word = ws.evictable[taken - 1];
    assigned_total = (word >> 16) + ((word & kSlotMask) != kNoSlot);
  }
  int32_t m = walk.miss_before;
#pragma unroll
  for (int x = 0; x < kEntries; ++x) {
    const int32_t e = entry_index(x);
    if (entries.code[x] != static_cast<uint32_t>(e)) continue;
    int32_t j = -1;
    int32_t order = -1;  // index among assigned misses
    if (!((walk.miss_bits >> x) & 1u)) {
      j = ws.lru_copy[ws.member_slots[e]];
    } else {
      const int32_t word = m < taken ? ws.evictable[m] : kNoSlot;
      if ((word & kSlotMask) != kNoSlot) {
        j = word & kSlotMask;
        order = word >> 16;
      }
      ++m;
    }
    if (j < 0) {
      ws.member_keys[e] = -1;  // dropped
      continue;
    }
    const SlotRow r = slot_row(p, c, request, j);
    ws.member_keys[e] = r.row;
    if (order >= 0) {
      ws.member_slots[e] = kSingleRowAssigned;
      gather.note_assigned_miss(ws, e);
      if constexpr (kUpkeep == HintUpkeep::kInPhaseD) {
        move_hint_bit(p, reinterpret_cast<const int32_t*>(ws.base + c.held_rows)[j], entries.g[x]);
      }
      if constexpr (kUpkeep != HintUpkeep::kAfterOutputs) request.dgi_row[j] = entries.g[x];
      const int64_t t = request.t0;
      p.out_swap_host_rows[t * p.out_swap_host_rows_row_stride + order] = entries.g[x];
      p.out_swap_device_rows[t * p.out_swap_device_rows_row_stride + order] = r.row;
    }
  }
  gather.after_assignment(ws);
  {
    int32_t lru[kPositions];
    load_positions(ws, H, lru);
    int16_t* const next_lru = ws.next_lru();
    const int32_t begin = kPositions * static_cast<int32_t>(threadIdx.x);
    int32_t x_evictable = walk.evictable_before;
#pragma unroll
    for (int x = 0; x < kPositions; ++x) {
      const int32_t i = begin + x;
      if (i >= H) continue;
      int32_t destination;
      if ((walk.hit_bits >> x) & 1u) {
        destination = walk.evictable_total + (i - x_evictable);
      } else {
        destination = x_evictable >= taken ? x_evictable - taken : walk.evictable_total - taken + x_evictable;
        ++x_evictable;
      }
      next_lru[destination] = static_cast<int16_t>(lru[x]);
    }
  }
  if (threadIdx.x == 0) p.out_swap_counts[request.t0] = min(assigned_total, p.top_k);
  __syncthreads();  // B5: rows of every member, the new LRU order
  return assigned_total;
}

// Whether entry x of the thread is the first of an assigned miss (after B5).
__device__ __forceinline__ bool assigned_first(const ResolverWorkspace& ws, const RowEntries& entries, int x) {
  const int32_t e = entry_index(x);
  return entries.code[x] == static_cast<uint32_t>(e) && ws.member_slots[e] == kSingleRowAssigned;
}

// Phase E of the single-row phases: each warp copies the rows of its
// entries' assigned misses that were not staged.
__device__ __forceinline__ void copy_row_assigned(const ResolveResidencyParams& p, const ResolverWorkspace& ws,
                                                  const RowEntries& entries) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int x = 0; x < kEntries; ++x) {
    const int32_t e = entry_index(x);
    const bool copies = assigned_first(ws, entries, x) && ws.member_held[e] != kMemberStaged;
    warp_copy_assigned_rows(p.gather, copies, entries.g[x], copies ? ws.member_keys[e] : -1, lane);
  }
}

// ---- Outputs (step 7) and counters (step 8), ends at B6: the new LRU row,
// the four outputs of each entry, the row's valid count.
__device__ __forceinline__ void write_row_outputs(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                  const ResolverWorkspace& ws, const ResolverRequest& request,
                                                  const RowEntries& entries, const RowWalk& walk,
                                                  int32_t assigned_total) {
  const int lane = threadIdx.x & 31;
  copy_int16_row<kResolverThreads>(request.lru_row, ws.next_lru(), p.hot_size);
  const int64_t t = request.t0;
  int valid_here = 0, resident_here = 0;
  int32_t row[kEntries], address[kEntries], resolved[kEntries], miss[kEntries];
#pragma unroll
  for (int x = 0; x < kEntries; ++x) {
    const int32_t e = entry_index(x);
    row[x] = -1;
    miss[x] = 0;
    if (entries.code[x] != kNoRank) {
      row[x] = ws.member_keys[entries.code[x]];
      miss[x] = assigned_first(ws, entries, x);
    } else if (entries.g[x] >= 0) {
      row[x] = ws.member_first[e];  // resident
      ++resident_here;
    }
    address[x] = -1;
    if (row[x] >= 0) {
      // Resident and hot rows both lie in blocks of hot_block_size.
      const int32_t block = c.hot_block_size.quotient(row[x]);
      address[x] = static_cast<int32_t>(static_cast<int64_t>(block) * p.attention_block_stride +
                                        c.hot_block_size.remainder(row[x], block));
    }
    valid_here += e < p.top_k && row[x] >= 0;
    resolved[x] = row[x] >= 0 ? entries.g[x] : -1;
  }
  const int32_t first = entry_index(0);
  if (c.entry_output_pairs && first + 1 < p.top_k) {
    const int64_t offset = t * c.entry_output_stride + first;
    *reinterpret_cast<int2*>(p.out_hot_rows + offset) = make_int2(row[0], row[1]);
    *reinterpret_cast<int2*>(p.out_attention + offset) = make_int2(address[0], address[1]);
    *reinterpret_cast<int2*>(p.out_resolved + offset) = make_int2(resolved[0], resolved[1]);
    *reinterpret_cast<int2*>(p.out_miss_mask + offset) = make_int2(miss[0], miss[1]);
  } else {
#pragma unroll
    for (int x = 0; x < kEntries; ++x) {
      const int32_t e = entry_index(x);
      if (e >= p.top_k) continue;
      p.out_hot_rows[t * p.out_hot_rows_row_stride + e] = row[x];
      p.out_attention[t * p.out_attention_row_stride + e] = address[x];
      p.out_resolved[t * p.out_resolved_row_stride + e] = resolved[x];
      p.out_miss_mask[t * p.out_miss_mask_row_stride + e] = miss[x];
    }
  }
  int32_t* const totals = ws.scratch + kScratchTotals;
  const int valid_sum = warp_sum(valid_here);
  const int resident_sum = warp_sum(resident_here);
  if (lane == 0) {
    if (valid_sum != 0) atomicAdd(totals, valid_sum);
    if (resident_sum != 0) atomicAdd(totals + 1, resident_sum);
  }
  __syncthreads();  // B6
  if (threadIdx.x == 0) {
    p.out_valid_counts[t] = totals[0];
    if (p.stats != nullptr) {
      const int64_t lookups = p.top_k;
      add_stat(p, HS_STAT_LOOKUPS, lookups);
      add_stat(p, HS_STAT_HITS, walk.members - walk.miss_total);
      add_stat(p, HS_STAT_MISSES, assigned_total);
      add_stat(p, HS_STAT_RESIDENT, totals[1]);
      add_stat(p, HS_STAT_INVALID, lookups - totals[0]);
    }
  }
}

// The hint's upkeep after the outputs (HintUpkeep::kAfterOutputs): each
// assigned miss of the thread's entries takes its slot (E[m] for miss m)
// in device_global_indices now, reading the row the slot held.
__device__ __forceinline__ void keep_row_hint_after_outputs(const ResolveResidencyParams& p,
                                                            const ResolverWorkspace& ws, const ResolverRequest& request,
                                                            const RowEntries& entries, const RowWalk& walk) {
  int32_t m = walk.miss_before;
#pragma unroll
  for (int x = 0; x < kEntries; ++x) {
    if (!((walk.miss_bits >> x) & 1u)) continue;
    if (assigned_first(ws, entries, x)) {
      const int32_t j = ws.evictable[m] & kSlotMask;
      const int32_t replaced = request.dgi_row[j];
      request.dgi_row[j] = entries.g[x];
      move_hint_bit(p, replaced, entries.g[x]);
    }
    ++m;
  }
}

// The request of block blockIdx.x, of one token row, after phase A (the
// LRU row copied and visible since B1, the dgi row in flight).
template <HintUpkeep kUpkeep, class Gather>
__device__ __forceinline__ void resolve(const ResolveResidencyParams& p, const ResolverConstants& c,
                                        const ResolverWorkspace& ws, const ResolverRequest& request, Gather& gather) {
  RowEntries entries;
  build_row_union(p, c, ws, request, entries);                              // B2
  const RowWalk walk = walk_positions<kUpkeep>(p, c, ws, request, entries);  // B3, B4
  gather.stage_single_row_misses(c, ws, walk.miss_bits, entries.g, walk.miss_total);
  const int32_t assigned_total = assign_row_members<kUpkeep>(p, c, ws, request, entries, walk, gather);  // B5
  gather.note_assigned_total(c, p, request, assigned_total);
  // As the general phases: a block with no host reads of its own lets the
  // next programmatic launch start now.
  const bool copies = gather.copies_assigned(ws);
  if (!copies) allow_dependent_launch();
  if (copies) {                                                             // E
    if (gather.copies_own_list()) {
      copy_row_assigned(p, ws, entries);
    } else {
      gather.copy_kept_head(p, c, request);
    }
  }
  write_row_outputs(p, c, ws, request, entries, walk, assigned_total);      // B6
  if constexpr (kUpkeep == HintUpkeep::kAfterOutputs) keep_row_hint_after_outputs(p, ws, request, entries, walk);
  gather.finish_single_row(c, ws);                                          // G
  gather.help_as_owner(p, c, ws);                                           // H
}

}  // namespace single_row
}  // namespace cuda
}  // namespace hisparse
