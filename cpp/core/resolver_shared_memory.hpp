// Dynamic shared-memory layout of the CUDA residency resolver, computed on
// the host for the configuration check and the launch, and by the kernel to
// carve its buffer. One definition so the check can never disagree with the
// kernel.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define HS_HOST_DEVICE __host__ __device__
#else
#define HS_HOST_DEVICE
#endif

namespace hisparse {

// Threads per resolver block.
constexpr int32_t kResolverThreads = 1024;
constexpr int32_t kResolverWarps = kResolverThreads / 32;
// Entries inserted into the union table per round (two per thread), which
// bounds how far the table can overshoot max_union_rows before overflow is
// detected.
constexpr int32_t kResolverUnionChunk = 2 * kResolverThreads;

// Scratch words (int32), each group owned by one phase of the kernel so that
// no buffer is rewritten while another warp may still read it. The counters
// that must start at zero come first (kScratchZeroedWords, a multiple of 4 so
// the zero fill stays 16-byte granular and never touches the rest).
constexpr int32_t kScratchRowCounts = 0;                                           // 2 x 32 (double buffer)
constexpr int32_t kScratchTotals = kScratchRowCounts + 2 * 32;                     // valid, resident
constexpr int32_t kScratchStagedRows = kScratchTotals + 2;                         // fused gather: rows staged
constexpr int32_t kScratchHeldMembers = kScratchStagedRows + 1;                    // fused gather: hits seen in C1
constexpr int32_t kScratchUnstagedMisses = kScratchHeldMembers + 1;              // fused gather: phase E's rows
constexpr int32_t kScratchZeroedWords = (kScratchUnstagedMisses + 1 + 3) / 4 * 4;
constexpr int32_t kScratchRequestReduce = kScratchZeroedWords;  // 4 x kResolverWarps
constexpr int32_t kScratchUnionScan = kScratchRequestReduce + 4 * kResolverWarps;  // kResolverWarps
constexpr int32_t kScratchPositionScan = kScratchUnionScan + kResolverWarps;  // kResolverWarps
constexpr int32_t kScratchMemberScan = kScratchPositionScan + kResolverWarps;  // kResolverWarps
// fused gather: the mbarrier (8 bytes, 8-aligned) that counts the staged rows' bulk copies in
constexpr int32_t kScratchStageBarrier = kScratchMemberScan + kResolverWarps;
static_assert(kScratchStageBarrier % 2 == 0, "the stage barrier is a 64-bit word");
constexpr int32_t kResolverScratchWords = kScratchStageBarrier + 2;

// Layout in three groups: words that start as all-ones (empty hash keys,
// unranked hash values, members without a slot), words that start as zero
// (slot occurrence counts, scratch counters), and words written before they
// are read (no initialisation).
struct ResolverSharedLayout {
  int32_t hash_capacity = 0;  // slots of the union hash table
  // all-ones
  uint32_t hash_keys = 0;  // int32 [hash_capacity]: host slot, -1 = empty
  uint32_t hash_values = 0;  // uint32 [hash_capacity]: union rank (pending marker while ranking)
  uint32_t member_slots = 0;  // int32 [max_union_rows]: last hit position, then hot slot (+ assigned flag)
  // zero
  uint32_t slot_info = 0;  // uint16 [H] (2-aligned words): occurrence count, then usable bit + rank,
                           // then the new LRU order (int16)
  uint32_t member_held = 0;  // uint8 [max_union_rows]: 1 when a usable slot holds member r (a hit),
                             // 2 when r misses and its host row is in the miss stage (fused gather)
  uint32_t scratch = 0;  // int32 [kResolverScratchWords]
  // uninitialised
  uint32_t member_keys = 0;  // int32 [max_union_rows]: host slot of each union member
  uint32_t member_first = 0;  // int32 [max_union_rows]: first entry index of each member
  uint32_t lru_copy = 0;  // int16 [H]: lru_slots row as read
  uint32_t evictable = 0;  // int32 [H]: per evictable position (in LRU order), usable slots before it
                           // (high 16 bits) and its slot or 0xFFFF when unusable (low 16 bits)
  uint32_t entry_codes = 0;  // uint16 [max_union_rows]: per entry (first ones of the request), its hash
                             // slot, or resident / invalid, so the output pass need not classify again
  // int32 [H]: the request's device_global_indices row as phase A read it,
  // kept through phase D for a residency hint's upkeep; kNoHeldRows: the
  // copy lives in the evictable words until phase C2 overwrites it.
  uint32_t held_rows = kNoHeldRows;
  uint32_t total_bytes = 0;

  static constexpr uint32_t kNoHeldRows = 0xFFFFFFFFu;
};

// The fused gather's early staging area, appended to the layout at launch
// when it fits: the host rows of up to `rows` misses are read into shared
// memory as soon as the misses are known, so the host round trip overlaps
// the rest of the kernel. stage_members: int32 [rows]; stage: rows x row_bytes.
struct ResolverMissStage {
  int32_t rows = 0;
  uint32_t stage_members = 0;
  uint32_t stage = 0;
  uint32_t total_bytes = 0;  // of the whole buffer, layout included
};

HS_HOST_DEVICE inline uint32_t resolver_align16(uint64_t bytes) {
  return static_cast<uint32_t>((bytes + 15) / 16 * 16);
}

// The union table holds at most max_union_rows + kResolverUnionChunk keys,
// and has room for `slack_halves` / 2 times that many (a multiple of 32):
// 3 (1.5x) is the minimum, which keeps linear probing short and is what a
// configuration must fit; the launch takes up to kResolverMaxSlackHalves when
// the device's shared memory allows, since a lower load factor shortens the
// longest probe of a warp (the warp waits for its slowest lane).
constexpr int32_t kResolverMinSlackHalves = 3;
constexpr int32_t kResolverMaxSlackHalves = 8;

HS_HOST_DEVICE inline int32_t resolver_hash_capacity(int32_t max_union_rows,
                                                     int32_t slack_halves = kResolverMinSlackHalves) {
  const int64_t keys = static_cast<int64_t>(max_union_rows) + kResolverUnionChunk;
  return static_cast<int32_t>((keys * slack_halves / 2 + 31) / 32 * 32);
}

HS_HOST_DEVICE inline ResolverSharedLayout resolver_shared_layout(int32_t hot_size, int32_t max_union_rows,
                                                                  int32_t slack_halves = kResolverMinSlackHalves,
                                                                  bool keep_held_rows = false) {
  ResolverSharedLayout layout;
  layout.hash_capacity = resolver_hash_capacity(max_union_rows, slack_halves);
  const uint64_t hot = hot_size > 0 ? static_cast<uint64_t>(hot_size) : 0;
  const uint64_t members = max_union_rows > 0 ? static_cast<uint64_t>(max_union_rows) : 0;
  uint64_t offset = 0;
  layout.hash_keys = static_cast<uint32_t>(offset);
  offset += resolver_align16(4ull * layout.hash_capacity);
  layout.hash_values = static_cast<uint32_t>(offset);
  offset += resolver_align16(4ull * layout.hash_capacity);
  layout.member_slots = static_cast<uint32_t>(offset);
  offset += resolver_align16(4ull * members);
  layout.slot_info = static_cast<uint32_t>(offset);
  offset += resolver_align16(2ull * hot);
  layout.member_held = static_cast<uint32_t>(offset);
  offset += resolver_align16(members);
  layout.scratch = static_cast<uint32_t>(offset);
  offset += resolver_align16(4ull * kResolverScratchWords);
  layout.member_keys = static_cast<uint32_t>(offset);
  offset += resolver_align16(4ull * members);
  layout.member_first = static_cast<uint32_t>(offset);
  offset += resolver_align16(4ull * members);
  layout.lru_copy = static_cast<uint32_t>(offset);
  offset += resolver_align16(2ull * hot);
  layout.evictable = static_cast<uint32_t>(offset);
  offset += resolver_align16(4ull * hot);
  layout.entry_codes = static_cast<uint32_t>(offset);
  offset += resolver_align16(2ull * members);
  if (keep_held_rows) {
    layout.held_rows = static_cast<uint32_t>(offset);
    offset += resolver_align16(4ull * hot);
  }
  layout.total_bytes = static_cast<uint32_t>(offset);
  return layout;
}

// The largest miss stage of at most `wanted_rows` rows of row_bytes that
// keeps the buffer within limit_bytes (rows = 0 when none fits).
HS_HOST_DEVICE inline ResolverMissStage resolver_miss_stage(const ResolverSharedLayout& layout, int64_t row_bytes,
                                                            int32_t wanted_rows, uint64_t limit_bytes) {
  ResolverMissStage stage;
  stage.total_bytes = layout.total_bytes;
  if (row_bytes <= 0) return stage;
  for (int32_t rows = wanted_rows; rows > 0; rows /= 2) {
    const uint64_t members = resolver_align16(4ull * static_cast<uint64_t>(rows));
    const uint64_t bytes = resolver_align16(static_cast<uint64_t>(row_bytes) * static_cast<uint64_t>(rows));
    if (layout.total_bytes + members + bytes <= limit_bytes) {
      stage.rows = rows;
      stage.stage_members = layout.total_bytes;
      stage.stage = static_cast<uint32_t>(layout.total_bytes + members);
      stage.total_bytes = static_cast<uint32_t>(layout.total_bytes + members + bytes);
      return stage;
    }
  }
  return stage;
}

// What a launch uses: the roomiest union table that fits limit_bytes
// together with the whole miss stage of wanted_stage_rows rows (0: no
// stage), with hash slots below the entry codes' markers (0xFFFE). The
// stage wins over a roomier table because it hides a host round trip; when
// even the minimum table leaves no room for the whole stage, the stage
// shrinks (resolver_miss_stage). The minimum table always fits a
// configuration the host accepted.
struct ResolverLaunchLayout {
  ResolverSharedLayout layout;
  ResolverMissStage stage;  // stage.total_bytes: dynamic shared memory of the launch
};

constexpr int32_t kResolverMaxHashCapacity = 0xFFFE;

HS_HOST_DEVICE inline ResolverLaunchLayout resolver_launch_layout(int32_t hot_size, int32_t max_union_rows,
                                                                  int64_t row_bytes, int32_t wanted_stage_rows,
                                                                  uint64_t limit_bytes,
                                                                  int32_t max_slack_halves = kResolverMaxSlackHalves,
                                                                  bool keep_held_rows = false) {
  ResolverLaunchLayout chosen;
  chosen.layout = resolver_shared_layout(hot_size, max_union_rows, kResolverMinSlackHalves, keep_held_rows);
  for (int32_t slack = max_slack_halves; slack > kResolverMinSlackHalves; --slack) {
    const ResolverSharedLayout roomier = resolver_shared_layout(hot_size, max_union_rows, slack, keep_held_rows);
    if (roomier.hash_capacity >= kResolverMaxHashCapacity || roomier.total_bytes > limit_bytes) continue;
    if (wanted_stage_rows > 0 &&
        resolver_miss_stage(roomier, row_bytes, wanted_stage_rows, limit_bytes).rows != wanted_stage_rows) {
      continue;
    }
    chosen.layout = roomier;
    break;
  }
  if (wanted_stage_rows > 0) {
    chosen.stage = resolver_miss_stage(chosen.layout, row_bytes, wanted_stage_rows, limit_bytes);
  } else {
    chosen.stage.total_bytes = chosen.layout.total_bytes;
  }
  return chosen;
}

// ---- Shapes whose arrays do not all fit one block's shared memory.
//
// The arrays of ResolverSharedLayout, as units of placement (the union
// table's keys and values move together). When the all-shared layout
// exceeds the device's shared memory per block, the launcher moves arrays,
// in kResolverSpillOrder, into the state row's slice of a global workspace
// preallocated at configuration time, until the rest fits. Two arrays are
// copies of the state row, so they move for free: the lru_slots row is then
// read in place (lru_copy) and so is the device_global_indices row (the
// copy that phases A-C1 keep in the evictable words).
enum ResolverArray : int32_t {
  kResolverTable = 0,  // hash_keys, hash_values
  kResolverMemberSlots,
  kResolverSlotInfo,
  kResolverMemberHeld,
  kResolverMemberKeys,
  kResolverMemberFirst,
  kResolverLruCopy,
  kResolverEvictable,
  kResolverEntryCodes,
  kResolverArrayCount
};

// First to move: the copy of the LRU row (no workspace bytes), then arrays
// read and written at known positions (no initialisation, no atomics), then
// the zero-initialised ones, and last the arrays hit by shared atomics, the
// union table last of all.
constexpr ResolverArray kResolverSpillOrder[kResolverArrayCount] = {
    kResolverLruCopy,    kResolverEntryCodes, kResolverEvictable,   kResolverMemberFirst, kResolverMemberKeys,
    kResolverMemberHeld, kResolverSlotInfo,   kResolverMemberSlots, kResolverTable};

HS_HOST_DEVICE constexpr uint32_t resolver_array_bit(ResolverArray array) { return 1u << array; }

// A layout split between shared memory and the workspace. `offsets` gives
// each array's byte offset from the start of dynamic shared memory, or from
// the start of the state row's workspace slice when its bit is set in
// in_workspace (lru_copy and, for the dgi copy, evictable then also name the
// state row itself; see ResolverArray); offsets.total_bytes is the shared
// part. Both parts keep the all-shared order of initialisation groups, so
// each is filled with one run of all-ones and one run of zero 16-byte words.
struct ResolverSplitLayout {
  ResolverSharedLayout offsets;
  uint32_t in_workspace = 0;  // resolver_array_bit of every array in the workspace
  uint32_t workspace_row_bytes = 0;  // bytes of one state row's slice (a multiple of 16)
  int32_t shared_ones_vectors = 0;  // all-ones words from shared offset 0
  uint32_t shared_zero = 0;  // first zero word in shared memory (the scratch counters end the run)
  int32_t shared_zero_vectors = 0;
  int32_t workspace_ones_vectors = 0;  // all-ones words from slice offset 0
  uint32_t workspace_zero = 0;
  int32_t workspace_zero_vectors = 0;
};

// Host side (the launcher and the configuration check): byte size of one
// array (16-byte granular), as resolver_shared_layout lays it out; kResolverLruCopy in the workspace takes none (read
// in place).
inline uint64_t resolver_array_bytes(ResolverArray array, int32_t hash_capacity, uint64_t hot, uint64_t members) {
  switch (array) {
    case kResolverTable: return 2ull * resolver_align16(4ull * static_cast<uint64_t>(hash_capacity));
    case kResolverMemberSlots: return resolver_align16(4ull * members);
    case kResolverSlotInfo: return resolver_align16(2ull * hot);
    case kResolverMemberHeld: return resolver_align16(members);
    case kResolverMemberKeys: return resolver_align16(4ull * members);
    case kResolverMemberFirst: return resolver_align16(4ull * members);
    case kResolverLruCopy: return resolver_align16(2ull * hot);
    case kResolverEvictable: return resolver_align16(4ull * hot);
    case kResolverEntryCodes: return resolver_align16(2ull * members);
    default: return 0;
  }
}

inline uint32_t* resolver_array_offset(ResolverSharedLayout& layout, ResolverArray array) {
  switch (array) {
    case kResolverTable: return &layout.hash_keys;
    case kResolverMemberSlots: return &layout.member_slots;
    case kResolverSlotInfo: return &layout.slot_info;
    case kResolverMemberHeld: return &layout.member_held;
    case kResolverMemberKeys: return &layout.member_keys;
    case kResolverMemberFirst: return &layout.member_first;
    case kResolverLruCopy: return &layout.lru_copy;
    case kResolverEvictable: return &layout.evictable;
    default: return &layout.entry_codes;
  }
}

// The layout of `hot_size` slots and `max_union_rows` members that keeps the
// most arrays in limit_bytes of shared memory (the union table at the
// minimum slack): in_workspace == 0 when the all-shared layout fits, which
// the launcher then runs as resolver_launch_layout says. Everything but the
// scratch words can move, so a layout always results.
inline ResolverSplitLayout resolver_split_layout(int32_t hot_size, int32_t max_union_rows, uint64_t limit_bytes) {
  const ResolverSharedLayout all_shared = resolver_shared_layout(hot_size, max_union_rows);
  const uint64_t hot = hot_size > 0 ? static_cast<uint64_t>(hot_size) : 0;
  const uint64_t members = max_union_rows > 0 ? static_cast<uint64_t>(max_union_rows) : 0;
  const uint64_t scratch_bytes = resolver_align16(4ull * kResolverScratchWords);
  uint32_t moved = 0;
  uint64_t shared_bytes = all_shared.total_bytes;
  for (int32_t i = 0; i < kResolverArrayCount && shared_bytes > limit_bytes; ++i) {
    moved |= resolver_array_bit(kResolverSpillOrder[i]);
    shared_bytes -= resolver_array_bytes(kResolverSpillOrder[i], all_shared.hash_capacity, hot, members);
  }
  ResolverSplitLayout split;
  split.offsets.hash_capacity = all_shared.hash_capacity;
  split.in_workspace = moved;
  // Initialisation groups in the all-shared order: all-ones, zero, then
  // written before read; the scratch words (zero counters first) sit between
  // the zero group and the rest in shared memory.
  constexpr ResolverArray kOnes[] = {kResolverTable, kResolverMemberSlots};
  constexpr ResolverArray kZero[] = {kResolverSlotInfo, kResolverMemberHeld};
  constexpr ResolverArray kRest[] = {kResolverMemberKeys, kResolverMemberFirst, kResolverLruCopy, kResolverEvictable,
                                     kResolverEntryCodes};
  uint64_t shared = 0, slice = 0;
  const auto place = [&](ResolverArray array) {
    const uint64_t bytes = resolver_array_bytes(array, all_shared.hash_capacity, hot, members);
    uint64_t& cursor = (moved & resolver_array_bit(array)) ? slice : shared;
    *resolver_array_offset(split.offsets, array) = static_cast<uint32_t>(cursor);
    if (array == kResolverTable) split.offsets.hash_values = static_cast<uint32_t>(cursor + bytes / 2);
    if (!(array == kResolverLruCopy && (moved & resolver_array_bit(array)))) cursor += bytes;
  };
  for (ResolverArray array : kOnes) place(array);
  split.shared_ones_vectors = static_cast<int32_t>(shared / 16);
  split.workspace_ones_vectors = static_cast<int32_t>(slice / 16);
  split.shared_zero = static_cast<uint32_t>(shared);
  split.workspace_zero = static_cast<uint32_t>(slice);
  for (ResolverArray array : kZero) place(array);
  split.offsets.scratch = static_cast<uint32_t>(shared);
  split.shared_zero_vectors = static_cast<int32_t>((shared + 4ull * kScratchZeroedWords - split.shared_zero) / 16);
  split.workspace_zero_vectors = static_cast<int32_t>((slice - split.workspace_zero) / 16);
  shared += scratch_bytes;
  for (ResolverArray array : kRest) place(array);
  split.offsets.total_bytes = static_cast<uint32_t>(shared);
  split.workspace_row_bytes = static_cast<uint32_t>(slice);
  return split;
}

// Bytes of global workspace the CUDA resolver needs for num_state_rows state
// rows (one slice per state row, which one block uses at a time): 0 when the
// all-shared layout fits limit_bytes.
inline uint64_t resolver_workspace_bytes(int64_t num_state_rows, int32_t hot_size, int32_t max_union_rows,
                                         uint64_t limit_bytes) {
  const uint64_t rows = num_state_rows > 0 ? static_cast<uint64_t>(num_state_rows) : 0;
  return rows * resolver_split_layout(hot_size, max_union_rows, limit_bytes).workspace_row_bytes;
}

}  // namespace hisparse
