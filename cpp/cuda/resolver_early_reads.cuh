// Early reads of the handoff (docs/residency.md, "Fused gather"): in a
// handoff launch with a helper block per request or more and one token
// row per request, every request gets a group of helper blocks (up to
// kMaxParts), and each helper of the group owns one partition of the
// request's host rows (a hash of the row picks it). A helper does not wait
// for the request's swap list to learn its misses: from the launch's start
// it reads the request's top-k row, predicts the misses of its partition
// (the top-k's host rows that the request's state row does not hold, or,
// where the launch has a residency hint, whose hint bit is clear) and reads
// their host rows into its shared memory while the owner still resolves;
// one coordinator warp meanwhile claims the partition and waits for the
// swap list. Where no request of the launch has more than kNoteMaxParts
// partitions, the coordinator then notes, while rows are still arriving,
// the hot row of each swap entry of its partition whose row it buffered. A
// helper whose partition predicts nothing leaves at once. Once its rows are
// in, the helper copies every swap entry of its partition: the noted rows
// in one flat pass of every warp, then the entries it did not note in one
// pass of the block (from its buffer where it predicted the row, from host
// memory where it did not). Only the handoff's early-read instantiations
// have this path (HandoffGather<Fused, true>, and HandoffGather<Fused,
// true, true> where the helpers note).
//
// The prediction is only a head start: which rows are copied, and where,
// always comes from the published swap list, so a wrong prediction (a state
// entry the owner replaces meanwhile, an unusable slot, a stale hint bit, a
// host row held by two state rows, a corrupt state, a table too small for
// the partition) costs a wasted or a late read, never a wrong byte. Every
// partition is copied exactly once: a helper claims its partition in the
// record once the owner has opened it, and the owner, after its phase G,
// claims every partition no helper claimed and copies those itself, so a
// helper that never runs (or gives up waiting for the record to open) only
// costs time. A helper that claimed waits for the publication however long
// it takes: the owner is running (it opened the record) and waits for no
// one. A request whose misses fit its stage copies them itself and closes
// its record after phase C1 (as without early reads), and its helpers copy
// nothing. A published record closes when the last of its partitions is
// finished, by whichever block finished it.
#pragma once

#include <cstdint>

#include "core/resolve_residency_params.hpp"
#include "cuda/block_scan.cuh"
#include "cuda/resolver_context.cuh"
#include "cuda/resolver_gather.cuh"
#include "cuda/resolver_handoff_record.cuh"
#include "cuda/row_copy.cuh"

namespace hisparse {
namespace cuda {
namespace early_reads {

// Partitions per request, at most: the record's cursor word holds a claim
// bit and a finish bit for each.
constexpr int32_t kMaxParts = 16;
constexpr int kPartsWord = handoff::kCursor;

// The launcher runs the instantiation whose helpers note their rows'
// destinations while they read (kNote, note_destinations) only where every
// request has at most this many partitions. With more, each partition's few
// rows are in about when the swap list arrives, and a round of noting
// started then outlasts them, so noting (even its bookkeeping alone) makes
// those steps slower (docs/performance.md, "Early reads from the state
// row").
constexpr int32_t kNoteMaxParts = 8;

// The partitions of batch row b's host rows: its helper blocks (helper h,
// block B + 1 + h, helps batch row h % B, as partition h / B), at most
// kMaxParts. The launcher computes the shares (ResolverConstants::early_parts,
// early_more_parts; with_early_read_helpers in resolve_residency.cu).
__device__ __forceinline__ int32_t parts_of(const ResolverConstants& c, int32_t b) {
  return min(c.early_parts + (b < c.early_more_parts ? 1 : 0), kMaxParts);
}

// The partition of a host row: a multiplicative hash scaled to [0, parts).
__device__ __forceinline__ int32_t part_of(int32_t host_row, int32_t parts) {
  return static_cast<int32_t>(__umulhi(static_cast<uint32_t>(host_row) * 0x9E3779B1u, static_cast<uint32_t>(parts)));
}

// A finished partition's bit; the block that finishes the record's last
// one closes the record (thread 0 only). `mine`: the partitions finished
// now; `all`: every partition of the record.
__device__ __forceinline__ void finish_parts(int32_t* record, uint32_t mine, uint32_t all) {
  const uint32_t before =
      static_cast<uint32_t>(handoff::Word(record[kPartsWord])
                                .fetch_or(static_cast<int32_t>(mine << kMaxParts), ::cuda::memory_order_relaxed));
  if ((((before >> kMaxParts) | mine) & all) == all) {
    handoff::Word(record[handoff::kState]).store(handoff::kIdle, ::cuda::memory_order_relaxed);
  }
}

// A helper block's shared memory, laid out by HelperLayout: a few words,
// an open-addressing table of the partition's host rows (a predicted miss's
// index in the row buffer or kUnbuffered; kHeld for a row the state row
// holds), the predicted rows' host rows and the row buffer.
struct HelperMemory {
  static constexpr int kPredicted = 0;  // predicted misses so far
  static constexpr int kClaimed = 1;    // whether this helper claimed its partition
  static constexpr int kFirstRow = 2;   // the published record's first row and count
  static constexpr int kCount = 3;
  static constexpr int kLate = 4;         // entries in the noted range whose rows copy_buffered_rows does not copy
  static constexpr int kNoted = 5;        // the coordinator noted the entries before this one
  static constexpr int kReadersDone = 6;  // reading warps with rows whose rows are in
  static constexpr uint32_t kWords = HelperLayout::kWords;
  static constexpr int16_t kNotPredicted = -1;
  static constexpr int16_t kUnbuffered = -2;
  static constexpr int16_t kHeld = -3;  // a host row the state row holds: predicted to hit

  int32_t* words;
  int32_t* keys;    // -1: empty
  int16_t* values;
  int32_t* predicted;
  uint8_t** destination;  // per buffered row: its hot row's bytes once noted (null: not noted; none without noting)
  uint8_t* rows;
  uint32_t capacity;  // a power of two
  int shift;          // 32 - log2(capacity)
  int32_t buffered;   // rows the buffer holds

  // The arrays of `layout` in `smem`.
  __device__ __forceinline__ HelperMemory(unsigned char* smem, const HelperLayout& layout)
      : words(reinterpret_cast<int32_t*>(smem)),
        keys(words + kWords),
        values(reinterpret_cast<int16_t*>(keys + layout.capacity)),
        predicted(reinterpret_cast<int32_t*>(smem + layout.predicted_at)),
        destination(layout.destination_at != 0 ? reinterpret_cast<uint8_t**>(smem + layout.destination_at) : nullptr),
        rows(smem + layout.rows_at),
        capacity(layout.capacity),
        shift(layout.shift),
        buffered(layout.buffered) {}

  // The layout HelperLayout::make gives for these arguments, sized here.
  __device__ __forceinline__ HelperMemory(unsigned char* smem, uint32_t bytes, int32_t top_k, int32_t held,
                                          int32_t parts, uint32_t row_bytes, bool notes)
      : HelperMemory(smem, HelperLayout::make(bytes, top_k, held, parts, row_bytes, notes)) {}

  __device__ __forceinline__ uint32_t home(int32_t key) const {
    return (static_cast<uint32_t>(key) * 0x85EBCA77u) >> shift;
  }

  // The key's table slot, inserting it when absent (`inserted`); -1 when the
  // table is full.
  __device__ __forceinline__ int32_t insert(int32_t key, bool& inserted) const {
    uint32_t slot = home(key);
    for (uint32_t probe = 0; probe < capacity; ++probe, slot = (slot + 1) & (capacity - 1)) {
      const int32_t old = atomicCAS(keys + slot, -1, key);
      if (old == -1 || old == key) {
        inserted = old == -1;
        return static_cast<int32_t>(slot);
      }
    }
    inserted = false;
    return -1;
  }

  // The key's table slot, or -1 when the table does not hold it.
  __device__ __forceinline__ int32_t find_slot(int32_t key) const {
    uint32_t slot = home(key);
    for (uint32_t probe = 0; probe < capacity; ++probe, slot = (slot + 1) & (capacity - 1)) {
      const int32_t k = keys[slot];
      if (k == key) return static_cast<int32_t>(slot);
      if (k == -1) break;
    }
    return -1;
  }

  // The key's value, or kNotPredicted when the table does not hold it.
  __device__ __forceinline__ int16_t find(int32_t key) const {
    uint32_t slot = home(key);
    for (uint32_t probe = 0; probe < capacity; ++probe, slot = (slot + 1) & (capacity - 1)) {
      const int32_t k = keys[slot];
      if (k == key) return values[slot];
      if (k == -1) break;
    }
    return kNotPredicted;
  }
};

// What a helper's prediction reads for batch row b on state row s: the
// request's table rows and top-k row, and the residency hint where the
// launch has one, else the state row (`held_slots` of its entries; 0 with
// a hint).
struct PredictionInputs {
  const int32_t* source;
  const int32_t* resident;
  const int32_t* topk;
  const uint32_t* hint;
  const int32_t* held_row;
  int32_t held_slots;
};

__device__ __forceinline__ PredictionInputs prediction_inputs(const ResolveResidencyParams& p, int32_t b, int32_t s) {
  PredictionInputs in;
  in.source = p.source_block_table != nullptr ? p.source_block_table + b * p.source_table_row_stride : nullptr;
  in.resident = p.resident_block_table != nullptr ? p.resident_block_table + b * p.resident_table_row_stride : nullptr;
  in.topk = p.topk_indices + static_cast<int64_t>(b) * p.topk_row_stride;
  in.hint = p.residency_hint;
  in.held_row = in.hint == nullptr ? p.device_global_indices + static_cast<int64_t>(s) * p.hot_size : nullptr;
  in.held_slots = in.held_row != nullptr ? p.hot_size : 0;
  return in;
}

// Prediction loads issued per thread before the helper's table is clear:
// a top-k row of up to 2048 entries and a state row of up to 4096 slots
// take one round of loads.
constexpr int kTopkLoads = 2;
constexpr int kHeldLoads = 4;

// The host row of a top-k entry when it is a hot candidate of partition
// `part`, else -1.
__device__ __forceinline__ int32_t partition_key(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                 const int32_t* source, const int32_t* resident, int32_t position,
                                                 int32_t part, int32_t parts) {
  const Entry entry = classify(p, c, source, resident, position);
  return entry.kind == kHot && part_of(entry.host_slot, parts) == part ? entry.host_slot : -1;
}

// Marks a host row that the request's state row holds (kHeld), when it lies
// in partition `part`: the top-k's rows found there are predicted to hit.
__device__ __forceinline__ void mark_held(const HelperMemory& m, int32_t key, int32_t part, int32_t parts) {
  if (key < 0 || part_of(key, parts) != part) return;
  bool inserted;
  const int32_t slot = m.insert(key, inserted);
  if (slot >= 0 && inserted) m.values[slot] = HelperMemory::kHeld;
}

// A predicted miss, unless the table holds the key already (held, or an
// earlier entry's), its hint bit is set (`hint`, where the launch has one),
// or the table is full.
__device__ __forceinline__ void note_predicted(const HelperMemory& m, const uint32_t* hint, int32_t key) {
  if (key < 0) return;
  if (hint != nullptr && ((__ldcg(hint + (key >> 5)) >> (key & 31)) & 1u)) return;  // probably held
  bool inserted;
  const int32_t slot = m.insert(key, inserted);
  if (slot < 0 || !inserted) return;
  const int32_t index = atomicAdd(m.words + HelperMemory::kPredicted, 1);
  m.values[slot] = index < m.buffered ? static_cast<int16_t>(index) : HelperMemory::kUnbuffered;
  if (index < m.buffered) m.predicted[index] = key;
}

// The helper's prediction: every top-k host row of its partition that is
// not held is a predicted miss (the first entry of a row repeated in the
// top-k inserts it into the table). Held: its residency-hint bit is set,
// where the launch has a hint, and otherwise the request's state row holds
// it. The owner may be replacing some of the state row's entries in its
// phase D while the helper reads them: either value is a prediction, never
// an answer. Batch row b's token row is b in the usual batch; a batch that
// maps its rows otherwise predicts nothing. The first round of the top-k
// and state-row loads is issued before anything waits, so that their round
// trips overlap. Ends at a block barrier, with the predicted misses counted
// in words[kPredicted].
template <bool kNote>
__device__ __forceinline__ void predict_misses(const ResolveResidencyParams& p, const ResolverConstants& c,
                                               const HelperMemory& m, int32_t b, int32_t s, int32_t part,
                                               int32_t parts) {
  const int tid = threadIdx.x;
  if (tid == 0) {
    m.words[HelperMemory::kPredicted] = 0;
    if constexpr (kNote) {
      m.words[HelperMemory::kReadersDone] = 0;
      m.words[HelperMemory::kNoted] = 0;
      m.words[HelperMemory::kLate] = 0;
    }
  }
  if (m.capacity == 0) {
    __syncthreads();
    return;
  }
  const int32_t K = p.top_k;
  const bool row_in_range = b < p.num_tokens;
  const PredictionInputs in = prediction_inputs(p, b, s);
  int32_t position[kTopkLoads];
  int32_t held[kHeldLoads];
#pragma unroll
  for (int x = 0; x < kTopkLoads; ++x) {
    const int32_t e = tid + x * kResolverThreads;
    position[x] = row_in_range && e < K ? in.topk[e] : -1;
  }
#pragma unroll
  for (int x = 0; x < kHeldLoads; ++x) {
    const int32_t j = tid + x * kResolverThreads;
    held[x] = j < in.held_slots ? __ldcg(in.held_row + j) : -1;
  }
  const bool row_of_b = row_in_range && p.req_id_per_token[b] == b;
  for (uint32_t i = tid; i < m.capacity; i += kResolverThreads) m.keys[i] = -1;
  if constexpr (kNote) {
    for (int32_t i = tid; i < m.buffered; i += kResolverThreads) m.destination[i] = nullptr;
  }
  __syncthreads();  // the table is empty
  int32_t key[kTopkLoads];
#pragma unroll
  for (int x = 0; x < kTopkLoads; ++x) {
    key[x] = row_of_b && position[x] >= 0 ? partition_key(p, c, in.source, in.resident, position[x], part, parts) : -1;
  }
  if (in.held_row != nullptr) {
#pragma unroll
    for (int x = 0; x < kHeldLoads; ++x) mark_held(m, held[x], part, parts);
    for (int32_t j = tid + kHeldLoads * kResolverThreads; j < in.held_slots; j += kResolverThreads) {
      mark_held(m, __ldcg(in.held_row + j), part, parts);
    }
    __syncthreads();  // every held row is marked
  }
#pragma unroll
  for (int x = 0; x < kTopkLoads; ++x) note_predicted(m, in.hint, key[x]);
  for (int32_t e = tid + kTopkLoads * kResolverThreads; row_of_b && e < K; e += kResolverThreads) {
    note_predicted(m, in.hint, partition_key(p, c, in.source, in.resident, in.topk[e], part, parts));
  }
  __syncthreads();  // the prediction is complete
}

// Whether predicted row `index` (of host row `key`) is read into the
// buffer: rows past the gather's host rows are zero-filled by the copy.
__device__ __forceinline__ bool buffered_row(int32_t host_rows, int32_t index, int32_t key) {
  return index >= 0 && key < host_rows;
}

// The reading warps (all but the coordinator) read the predicted rows into
// the buffer (row i by reading warp i % kReadingWarps, so a few rows keep
// every one of them reading). The rows are complete at the block's next
// barrier.
constexpr int kCoordinatorWarp = kResolverWarps - 1;
constexpr int kReadingWarps = kResolverWarps - 1;

template <bool kNote>
__device__ __forceinline__ void read_predicted_rows(const ResolverConstants& c, const HelperMemory& m) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int32_t count = min(m.words[HelperMemory::kPredicted], m.buffered);
  const int chunks = static_cast<int>(c.stage_row_bytes / kChunkBytes);
  for (int32_t base = 0; base < count; base += kReadingWarps * kWarpSize) {
    const int32_t i = base + warp + kReadingWarps * lane;
    const uint8_t* src = nullptr;
    uint8_t* dst = nullptr;
    if (i < count) {
      const int32_t key = m.predicted[i];
      if (buffered_row(c.stage_host_rows, i, key)) {
        src = c.stage_host + static_cast<int64_t>(key) * c.stage_host_pitch;
        dst = m.rows + static_cast<int64_t>(i) * c.stage_row_bytes;
      }
    }
    warp_copy_lane_rows(src, dst, chunks, lane);
  }
  // Its loads have returned (the stores to the buffer used them), which
  // note_destinations waits for. Warp w has rows when w < count.
  if constexpr (kNote) {
    if (lane == 0 && warp < count) atomicAdd(&m.words[HelperMemory::kReadersDone], 1);
  }
}

// Whether swap entry (key, dst) is copied by copy_buffered_rows: its row is
// buffered and the entry won the row's destination.
__device__ __forceinline__ bool flat_copied(const ResolverConstants& c, const HelperMemory& m, int32_t key,
                                            const uint8_t* dst, int16_t index) {
  return buffered_row(c.stage_host_rows, index, key) && m.destination[index] == dst;
}

// The coordinator warp, once the list is published (`count` entries from
// token row `first_row`) and while the reading warps still read: the hot
// row of every swap entry of its partition (`mine`) whose row is buffered
// goes beside the row (the first entry of a row listed twice wins), and the
// others are counted in words[kLate]. It notes a round of entries at a
// time and stops, recording how far it came in words[kNoted], once every
// reading warp with rows has them in: from there one pass of the whole
// block over the rest (copy_partition_entries) is faster than rounds of one
// warp. Every lane calls this.
__device__ __forceinline__ void note_destinations(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                  const HelperMemory& m, int32_t first_row, int32_t count,
                                                  int32_t parts, uint32_t mine) {
  constexpr int kLoads = 8;  // entries per lane in flight: a list of k = 2048 entries in eight round trips
  const int lane = threadIdx.x & 31;
  const GatherCompactParams& g = p.gather;
  const int32_t readers = min(min(m.words[HelperMemory::kPredicted], m.buffered), kReadingWarps);
  int late = 0;
  int32_t base = 0;
  for (; base < count; base += kLoads * kWarpSize) {
    const int32_t readers_done =
        __shfl_sync(0xffffffffu, *static_cast<volatile int32_t*>(&m.words[HelperMemory::kReadersDone]), 0);
    if (readers_done >= readers) break;
    int32_t key[kLoads], hot_row[kLoads];
#pragma unroll
    for (int x = 0; x < kLoads; ++x) {
      const int32_t e = base + x * kWarpSize + lane;
      key[x] = -1;
      if (e < count) handoff::load_swap_entry(g, c, first_row, e, key[x], hot_row[x]);
    }
#pragma unroll
    for (int x = 0; x < kLoads; ++x) {
      if (key[x] < 0 || !((mine >> part_of(key[x], parts)) & 1u)) continue;
      uint8_t* const dst = assigned_row_destination(g, hot_row[x]);
      if (dst == nullptr) continue;
      const int16_t index = m.find(key[x]);
      const bool buffered = buffered_row(c.stage_host_rows, index, key[x]);
      if (!buffered || atomicCAS(reinterpret_cast<unsigned long long*>(m.destination + index), 0ull,
                                 reinterpret_cast<unsigned long long>(dst)) != 0ull) {
        ++late;
      }
    }
  }
  late = warp_sum(late);
  if (lane == 0) {
    m.words[HelperMemory::kLate] = late;
    m.words[HelperMemory::kNoted] = min(base, count);
  }
}

// Every thread copies buffered rows to the destinations note_destinations
// gave them: warp w the rows w, w + 32, ..., its lanes over a row's chunks.
__device__ __forceinline__ void copy_buffered_rows(const ResolverConstants& c, const HelperMemory& m) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int32_t count = min(m.words[HelperMemory::kPredicted], m.buffered);
  const int chunks = static_cast<int>(c.stage_row_bytes / kChunkBytes);
  for (int32_t i = warp; i < count; i += kResolverWarps) {
    uint8_t* const dst = m.destination[i];
    if (dst == nullptr) continue;
    const uint8_t* const src = m.rows + static_cast<int64_t>(i) * c.stage_row_bytes;
    for (int chunk = lane; chunk < chunks; chunk += kWarpSize) {
      store_chunk(dst + chunk * kChunkBytes, load_chunk(src + chunk * kChunkBytes));
    }
  }
}

// The helper copies the swap entries [from, count) of its partition
// (`mine`) of the published list (`count` entries from token row
// `first_row`) that copy_buffered_rows does not (with kNote; without, all of
// them), exactly as gather_compact would: from its buffer where it
// predicted the row, else from host memory.
template <bool kNote>
__device__ __forceinline__ void copy_partition_entries(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                       const HelperMemory& m, int32_t first_row, int32_t from,
                                                       int32_t count, int32_t parts, uint32_t mine) {
  const int lane = threadIdx.x & 31;
  const GatherCompactParams& g = p.gather;
  const int chunks = static_cast<int>(c.stage_row_bytes / kChunkBytes);
  for (int32_t base = from; base < count; base += kResolverThreads) {
    const int32_t e = base + static_cast<int32_t>(threadIdx.x);
    const uint8_t* src = nullptr;
    uint8_t* dst = nullptr;
    if (e < count) {
      int32_t key, hot_row;
      handoff::load_swap_entry(g, c, first_row, e, key, hot_row);
      if (key >= 0 && ((mine >> part_of(key, parts)) & 1u)) dst = assigned_row_destination(g, hot_row);
      if (dst != nullptr) {
        const int16_t index = m.find(key);
        if (kNote && flat_copied(c, m, key, dst, index)) {
          dst = nullptr;
        } else if (buffered_row(c.stage_host_rows, index, key)) {
          src = m.rows + static_cast<int64_t>(index) * c.stage_row_bytes;
        } else if (key < g.host_rows) {
          src = g.host + static_cast<int64_t>(key) * g.host_pitch;
        }
      }
    }
    warp_copy_lane_rows(src, dst, chunks, lane);
  }
}

// The owner's copy of the partitions in `mine` (no prediction), as the kept
// head of a handoff list is copied.
__device__ __forceinline__ void copy_unclaimed_partitions(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                          int32_t first_row, int32_t count, int32_t parts,
                                                          uint32_t mine) {
  handoff::copy_entries_by_warp(p, c, first_row, 0, count, [=](int32_t host_row, int32_t /*hot_row*/) {
    return host_row >= 0 && ((mine >> part_of(host_row, parts)) & 1u) != 0;
  });
}

// Whether batch row b's own block resolves it (phase A's test: token rows
// that are consecutive and before num_valid_rows, a state row in range that
// no earlier batch row names). A helper claims only for such a request, whose
// owner opens and publishes (or closes) its record whatever the record held
// before, so that waiting for the publication never hangs. Every lane of the
// calling warp calls this (early reads run for batches of at most half the
// SMs, so the scans are short).
__device__ __forceinline__ bool request_resolves(const ResolveResidencyParams& p, int32_t b, int32_t s) {
  const int lane = threadIdx.x & 31;
  const int32_t T = p.num_tokens;
  const int32_t valid_rows = p.num_valid_rows != nullptr ? min(max(*p.num_valid_rows, 0), T) : T;
  int duplicate = 0, rows = 0, first = INT32_MAX, last = -1;
  for (int32_t i = lane; i < b; i += kWarpSize) duplicate |= p.request_state_indices[i] == s;
  for (int32_t t = lane; t < valid_rows; t += kWarpSize) {
    if (p.req_id_per_token[t] == b) {
      ++rows;
      first = min(first, t);
      last = max(last, t);
    }
  }
  if (warp_max(duplicate) != 0) return false;
  rows = warp_sum(rows);
  return rows > 0 && warp_max(last) - warp_min(first) + 1 == rows;
}

// The coordinator warp's part of a helper (lane 0 does the record's round
// trips): whether the request resolves, the claim of the partition once the
// owner has opened the record (it resets the claims when it opens), unless
// the owner has claimed it already, and then the wait for the publication.
// Leaves kClaimed, kFirstRow and kCount (-1: nothing to copy) in the words.
__device__ __forceinline__ void claim_and_wait(const ResolveResidencyParams& p, const HelperMemory& m, int32_t* record,
                                               int32_t b, int32_t s, int32_t part, uint64_t start) {
  const bool resolves = request_resolves(p, b, s);
  if ((threadIdx.x & 31) != 0) return;
  m.words[HelperMemory::kClaimed] = 0;
  m.words[HelperMemory::kCount] = -1;
  if (!resolves) return;
  bool claimed = false;
  for (;;) {
    const int32_t state = handoff::Word(record[handoff::kState]).load(::cuda::memory_order_acquire);
    if (state == handoff::kResolving || state == handoff::kPublished) {
      const uint32_t bit = 1u << part;
      claimed =
          !(handoff::Word(record[kPartsWord]).fetch_or(static_cast<int32_t>(bit), ::cuda::memory_order_relaxed) & bit);
      break;
    }
    if (handoff::global_time_ns() - start >= handoff::kOpenGraceNs) break;
    __nanosleep(128);
  }
  m.words[HelperMemory::kClaimed] = claimed;
  if (!claimed) return;
  // The owner publishes after its phase D, or closes the record when it
  // copies its rows itself; the claim keeps a published record from closing
  // before this block finishes.
  int32_t state;
  while ((state = handoff::Word(record[handoff::kState]).load(::cuda::memory_order_acquire)) == handoff::kResolving) {
    __nanosleep(128);
  }
  int32_t first_row = -1, count = 0;
  if (state == handoff::kPublished) {
    first_row = record[handoff::kFirstRow];
    count = record[handoff::kCount];
  }
  // Words no resolve wrote (memory not zeroed) must not send reads past the swap lists.
  const bool valid = first_row >= 0 && first_row < p.num_tokens && count > 0 &&
                     count <= static_cast<int64_t>(p.num_tokens - first_row) * p.top_k;
  m.words[HelperMemory::kFirstRow] = first_row;
  m.words[HelperMemory::kCount] = valid ? count : -1;
}

// Helper h of the launch (see the file comment): batch row h % B, partition
// h / B; kNote: the coordinator notes destinations while the rows arrive.
// Every thread of the block calls this, with the block's dynamic shared
// memory, laid out as c.early_layouts says.
template <bool kNote>
__device__ __forceinline__ void help_as_helper(const ResolveResidencyParams& p, const ResolverConstants& c,
                                               unsigned char* smem, int32_t h) {
  const int32_t part = c.early_batch.quotient(h);
  const int32_t b = c.early_batch.remainder(h, part);
  const int32_t parts = parts_of(c, b);
  if (part >= parts) return;
  const int32_t s = p.request_state_indices[b];
  if (s < 0 || s >= p.num_state_rows) return;
  const uint64_t start = handoff::global_time_ns();
  int32_t* const record = p.handoff + static_cast<int64_t>(s) * HS_RESOLVER_HANDOFF_WORDS;
  const HelperMemory m(smem, c.early_layouts[b < c.early_more_parts ? 1 : 0]);
  predict_misses<kNote>(p, c, m, b, s, part, parts);
  // A partition with no predicted miss leaves its rows to the owner.
  if (m.words[HelperMemory::kPredicted] == 0) return;
  // The reads start at once; the coordinator warp meanwhile claims the
  // partition, waits for the swap list and (kNote) notes where its buffered
  // rows go, so that what is left once the rows are in is one flat copy. A
  // helper that does not claim (its request does not resolve, the owner was
  // first) read for nothing.
  if ((threadIdx.x >> 5) == kCoordinatorWarp) {
    claim_and_wait(p, m, record, b, s, part, start);
    if constexpr (kNote) {
      __syncwarp();
      const int32_t listed = m.words[HelperMemory::kCount];
      if (m.words[HelperMemory::kClaimed] && listed >= 0) {
        note_destinations(p, c, m, m.words[HelperMemory::kFirstRow], listed, parts, 1u << part);
      }
    }
  } else {
    read_predicted_rows<kNote>(c, m);
  }
  __syncthreads();  // the buffer's rows, the claim, the published list and the rows' destinations
  const int32_t count = m.words[HelperMemory::kCount];
  // Not claimed (the owner copies this partition), or closed (the owner copied its own rows).
  if (!m.words[HelperMemory::kClaimed] || count < 0) return;
  if constexpr (kNote) {
    if (m.words[HelperMemory::kNoted] > 0) copy_buffered_rows(c, m);
    // Every entry past the noted ones, and the noted ones too if one of them could not be copied flat.
    const int32_t from = m.words[HelperMemory::kLate] > 0 ? 0 : m.words[HelperMemory::kNoted];
    if (from < count) {
      copy_partition_entries<true>(p, c, m, m.words[HelperMemory::kFirstRow], from, count, parts, 1u << part);
    }
  } else {
    copy_partition_entries<false>(p, c, m, m.words[HelperMemory::kFirstRow], 0, count, parts, 1u << part);
  }
  if (threadIdx.x == 0) finish_parts(record, 1u << part, (1u << parts) - 1u);
}

// The owner's block after its phase G: it claims every partition no helper
// claimed, copies their swap entries and finishes them. Every thread calls
// this; `record` is the owner's (published) record and `scratch` two free
// shared words.
__device__ __forceinline__ void finish_as_owner(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                int32_t* record, int32_t* scratch) {
  const int32_t parts = parts_of(c, static_cast<int32_t>(blockIdx.x));
  const uint32_t all = (1u << parts) - 1u;
  if (threadIdx.x == 0) {
    const uint32_t before = static_cast<uint32_t>(
        handoff::Word(record[kPartsWord]).fetch_or(static_cast<int32_t>(all), ::cuda::memory_order_relaxed));
    scratch[0] = static_cast<int32_t>(all & ~before);
  }
  __syncthreads();
  const uint32_t mine = static_cast<uint32_t>(scratch[0]);
  if (mine != 0) {
    // The owner wrote these words itself.
    copy_unclaimed_partitions(p, c, record[handoff::kFirstRow], record[handoff::kCount], parts, mine);
  }
  if (threadIdx.x == 0) finish_parts(record, mine, all);
}

}  // namespace early_reads

}  // namespace cuda
}  // namespace hisparse
