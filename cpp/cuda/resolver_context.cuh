// What every phase of the CUDA residency resolver reads (resolve_residency.cu,
// resolver_gather.cuh): the launch's constants, the block's shared-memory
// workspace, the request the block resolves, and the classification of an
// entry (step 1 of docs/residency.md).
#pragma once

#include <climits>
#include <cstdint>

#include "core/resolve_residency_params.hpp"
#include "core/resolver_shared_memory.hpp"
#include "cuda/fast_divisor.cuh"
#include "cuda/resolver_helper_layout.cuh"
#include "cuda/union_table.cuh"

namespace hisparse {
namespace cuda {

static_assert(kResolverWarps == 32, "block scans give one warp total to each lane of a warp");

constexpr int64_t kInt32Max = INT32_MAX;

// Per-launch constants derived on the host (a kernel parameter: its layout
// decides which parameter lines the kernel touches).
struct ResolverConstants {
  FastDivisor top_k;           // K
  FastDivisor block_size;      // source table blocks (1 without a table)
  FastDivisor hot_block_size;  // hot and resident blocks
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
  // That stride is even and the four outputs 8-byte aligned: a thread's two
  // consecutive entries (2t, 2t + 1) are one 8-byte store per output.
  bool entry_output_pairs;
  // A request of one token row may take the single-row phases
  // (resolver_single_row.cuh): k <= 2 x kResolverThreads, H <= 4 x
  // kResolverThreads, a union table for k keys (max_union_rows >= k), and an
  // instantiation that has them (SharedPlacement, one block per SM, a gather
  // policy with kSingleRow).
  bool single_row_phases;
  // Tail reads (resolver_tail_reads.cuh): the swap entries at the end of a
  // helped request's list that its helper copies (0 in other launches). In
  // the bytes after the flags, so that the other launches' parameters keep
  // their offsets.
  int16_t tail_rows_per_helper;
  // The fused gather's miss stage (rows = 0: none).
  ResolverMissStage miss_stage;
  // Staged rows arrive by one bulk (TMA) copy each, counted in by an
  // mbarrier (sm_90), instead of 16-byte cp.async copies (sm_80).
  bool bulk_stage;
  // The fused gather's stage reads p.gather's fields from here (host rows
  // clamped to int32), a few parameter lines instead of the scattered fields
  // of p.gather.
  int32_t stage_host_rows;
  uint32_t stage_row_bytes;
  const uint8_t* stage_host;
  int64_t stage_host_pitch;
  // Phase G's destination: p.gather's hot cache fields, next to the stage's.
  uint8_t* stage_hot;
  int64_t stage_hot_block_stride;
  int64_t stage_hot_span_rows;
  // ResolverSharedLayout::held_rows: where a residency hint's upkeep finds
  // the rows the slots held (kNoHeldRows: nowhere, it asks the table).
  uint32_t held_rows;
  // The automatic schedule (AutoGather): a request with at most this many
  // assigned misses copies them itself; the rows of the others are left to
  // the tail gather launched after the resolve (resolver_tail_gather.cu).
  int32_t auto_local_rows;
  // Early-read helpers (resolver_early_reads.cuh), set by the launcher of
  // their launches: helper h helps batch row h % B as partition h / B
  // (early_batch divides by B); the requests b < early_more_parts have one
  // partition more than the others' early_parts (at most kMaxParts either
  // way), and their helpers' shared memory is laid out as early_layouts[1],
  // the others' as early_layouts[0].
  FastDivisor early_batch;
  int32_t early_parts;
  int32_t early_more_parts;
  HelperLayout early_layouts[2];
};

// ---- Encodings of the shared words between phases.

// slot_info after phase C1: usable bit, member rank + 1 (0: holds no member).
constexpr uint32_t kSlotUsable = 0x8000u;
constexpr uint32_t kSlotRankMask = 0x7FFFu;
// member_held of a member after phase C1 (and the fused gather's stages).
constexpr uint8_t kMemberHeld = 1;    // a usable slot holds it (a hit)
constexpr uint8_t kMemberStaged = 2;  // it misses and its host row is in the miss stage
// After phase D a served member has member_slots = its physical hot row and
// member_keys = its attention index; member_first = its first entry for an
// assigned miss, kServedHit for a hit, kNotServed otherwise.
constexpr int32_t kServedHit = -1;
constexpr int32_t kNotServed = INT32_MIN;
// The single-row phases (resolver_single_row.cuh) keep members by first
// entry: member_slots holds a hit's last hit position, or this mark for an
// assigned miss, and member_keys its physical hot row.
constexpr int32_t kSingleRowAssigned = INT32_MIN;
// An evictable-position word: usable slots before it (high 16 bits), its
// slot or kNoSlot when the slot cannot take a miss (low 16 bits).
constexpr int32_t kSlotMask = 0xFFFF;
constexpr int32_t kNoSlot = 0xFFFF;
// Entry codes below these are union table slots (capacity < 2^16 for H <= 32767).
constexpr uint16_t kCodeResident = 0xFFFE;
constexpr uint16_t kCodeInvalid = 0xFFFF;
static_assert(kResolverMaxHashCapacity == kCodeResident, "hash slots must stay below the entry code markers");

// The block's arrays: its dynamic shared memory carved by
// ResolverSharedLayout (its comments give each array's lives), or, for a
// split layout, shared memory and the state row's workspace slice. Several
// arrays serve more than one phase; the accessors below name those other
// lives.
struct ResolverWorkspace {
  unsigned char* base;  // dynamic shared memory (scratch and the miss stage always live there)
  UnionTableView table;  // hash_keys, hash_values
  int32_t* member_slots;
  uint16_t* slot_info;
  int32_t* scratch;
  int32_t* member_keys;
  int32_t* member_first;
  int16_t* lru_copy;
  int32_t* evictable;
  uint16_t* entry_codes;
  uint8_t* member_held;
  int32_t* held;  // phases A-C1: the request's device_global_indices row, as held_copy() reads it

  __device__ __forceinline__ ResolverWorkspace(unsigned char* smem, const ResolverSharedLayout& layout)
      : base(smem),
        table{reinterpret_cast<int32_t*>(smem + layout.hash_keys),
              reinterpret_cast<uint32_t*>(smem + layout.hash_values), layout.hash_capacity},
        member_slots(reinterpret_cast<int32_t*>(smem + layout.member_slots)),
        slot_info(reinterpret_cast<uint16_t*>(smem + layout.slot_info)),
        scratch(reinterpret_cast<int32_t*>(smem + layout.scratch)),
        member_keys(reinterpret_cast<int32_t*>(smem + layout.member_keys)),
        member_first(reinterpret_cast<int32_t*>(smem + layout.member_first)),
        lru_copy(reinterpret_cast<int16_t*>(smem + layout.lru_copy)),
        evictable(reinterpret_cast<int32_t*>(smem + layout.evictable)),
        entry_codes(reinterpret_cast<uint16_t*>(smem + layout.entry_codes)),
        member_held(smem + layout.member_held),
        held(evictable) {}

  // A split layout: an array whose bit is set in split.in_workspace lives in
  // `slice` (the state row's slice of the workspace); the LRU copy is then
  // the lru_slots row itself, and a moved evictable array leaves the dgi
  // copy to the device_global_indices row itself (both read before phases D
  // and F write them). Before the request is known, slice and the rows are
  // null and only the shared arrays may be used.
  __device__ __forceinline__ ResolverWorkspace(unsigned char* smem, const ResolverSplitLayout& split,
                                               unsigned char* slice, int16_t* lru_row, int32_t* dgi_row)
      : base(smem),
        table{reinterpret_cast<int32_t*>(at(smem, slice, split, kResolverTable, split.offsets.hash_keys)),
              reinterpret_cast<uint32_t*>(at(smem, slice, split, kResolverTable, split.offsets.hash_values)),
              split.offsets.hash_capacity},
        member_slots(
            reinterpret_cast<int32_t*>(at(smem, slice, split, kResolverMemberSlots, split.offsets.member_slots))),
        slot_info(reinterpret_cast<uint16_t*>(at(smem, slice, split, kResolverSlotInfo, split.offsets.slot_info))),
        scratch(reinterpret_cast<int32_t*>(smem + split.offsets.scratch)),
        member_keys(reinterpret_cast<int32_t*>(at(smem, slice, split, kResolverMemberKeys, split.offsets.member_keys))),
        member_first(
            reinterpret_cast<int32_t*>(at(smem, slice, split, kResolverMemberFirst, split.offsets.member_first))),
        lru_copy(split.in_workspace & resolver_array_bit(kResolverLruCopy)
                     ? lru_row
                     : reinterpret_cast<int16_t*>(smem + split.offsets.lru_copy)),
        evictable(reinterpret_cast<int32_t*>(at(smem, slice, split, kResolverEvictable, split.offsets.evictable))),
        entry_codes(
            reinterpret_cast<uint16_t*>(at(smem, slice, split, kResolverEntryCodes, split.offsets.entry_codes))),
        member_held(at(smem, slice, split, kResolverMemberHeld, split.offsets.member_held)),
        held(split.in_workspace & resolver_array_bit(kResolverEvictable) ? dgi_row : evictable) {}

  static __device__ __forceinline__ unsigned char* at(unsigned char* smem, unsigned char* slice,
                                                      const ResolverSplitLayout& split, ResolverArray array,
                                                      uint32_t offset) {
    return ((split.in_workspace & resolver_array_bit(array)) ? slice : smem) + offset;
  }

  // Phases A-C1: the request's device_global_indices row, copied into the
  // evictable words (free until phase C2), or the row itself (split layout).
  __device__ __forceinline__ int32_t* held_copy() const { return held; }
  // Phase B: slot occurrence counts, 16-bit halves of the slot_info words.
  __device__ __forceinline__ uint32_t* slot_counts() const { return reinterpret_cast<uint32_t*>(slot_info); }
  // Phases D-F: the new LRU order in the slot_info words (free after C2).
  __device__ __forceinline__ int16_t* next_lru() const { return reinterpret_cast<int16_t*>(slot_info); }
};

// The batch row this block resolves, once phase A found it active: its
// state row, its token rows t0 .. t0 + q - 1, and its table rows.
struct ResolverRequest {
  int32_t s;
  int32_t t0;
  int32_t q;
  int32_t entries;  // q * K <= 2^30 (checked by the launcher)
  bool single_row;  // q == 1 (a decode step without speculative rows)
  const int32_t* hot_table;
  const int32_t* source;    // null without a source table
  const int32_t* resident;  // null without a resident table
  const int32_t* topk;      // row t0
  int32_t* dgi_row;
  int16_t* lru_row;

  // Entry e is topk[e / K][e % K]; a single row needs no division.
  __device__ __forceinline__ int32_t position(const ResolveResidencyParams& p, const ResolverConstants& c,
                                              int32_t e) const {
    if (single_row) return topk[e];
    const int32_t r = c.top_k.quotient(e);
    return topk[r * p.topk_row_stride + c.top_k.remainder(e, r)];
  }
};

// A contiguous run of member ranks per thread (<= 32 members each), for
// phases D-G and the fused gather's stage after C1.
struct MemberRun {
  int32_t length;  // ranks per thread
  int32_t begin;
  int32_t end;
};

__device__ __forceinline__ MemberRun member_run(int32_t members) {
  MemberRun run;
  run.length = (members + kResolverThreads - 1) / kResolverThreads;
  run.begin = min(static_cast<int32_t>(threadIdx.x) * run.length, members);
  run.end = min(run.begin + run.length, members);
  return run;
}

enum EntryKind : int32_t { kInvalid = 0, kResident = 1, kHot = 2 };

struct Entry {
  int32_t kind;
  int32_t host_slot;  // g (valid for kResident and kHot)
  int64_t row;        // physical row (kResident)
  int64_t address;    // attention index (kResident)
};

// Step 8: adds `value` to counter `index` of p.stats (non-null).
__device__ __forceinline__ void add_stat(const ResolveResidencyParams& p, int index, int64_t value) {
  if (value != 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(p.stats + index), static_cast<unsigned long long>(value));
  }
}

// Step 1: classify the entry at `position` of a request with table rows
// `source` and `resident` (null when absent). Rows are block * size + offset
// with 0 <= offset < size, so row / size and row % size are block and
// offset: the attention index needs no 64-bit division.
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

}  // namespace cuda
}  // namespace hisparse
