// Tail reads of the handoff (docs/residency.md, "Fused gather"): in a
// handoff launch whose one-row requests fill at least half the SMs but not
// all of them, the SMs left idle run one helper block each for the first
// requests (helper h helps batch row h). Each helped request's swap list is
// split at a point both sides compute from the list's length alone: its
// owner copies the head, entries [0, n - c.tail_rows_per_helper), in phase
// E as every request past half the SMs copies its list; its helper copies
// the tail, the last tail_rows_per_helper entries. The helper does not wait
// for the list to learn them: from the launch's start it predicts the
// request's misses (as early_reads does: top-k host rows the state row does
// not hold, or whose residency-hint bit is clear), numbers them in top-k
// entry order, which is the swap list's order where the prediction holds
// (misses are listed by their first entry), and reads the last ones into
// its shared memory while the owner resolves; then it waits for the list
// and copies the tail, from its buffer where it predicted the row and from
// host memory where it did not.
//
// Why: past half the SMs every request's own host reads start only after
// its phase D, so the link idles through the first microseconds of the
// step; the helpers fill them. Why the tail: the owner's head and the
// helper's tail run at once, so neither block copies a whole list after
// the other one's work (docs/performance.md, "Open gaps").
//
// As with early reads, the prediction is only a head start: which rows are
// copied, and where, comes from the published swap list. The helper claims
// the tail once the owner has opened its record; an owner whose tail no
// helper claimed claims it after its phase G and copies it itself, so a
// helper that never runs only costs time. Whoever copies the tail closes
// the record.
#pragma once

#include <cstdint>

#include "core/resolve_residency_params.hpp"
#include "cuda/block_scan.cuh"
#include "cuda/resolver_context.cuh"
#include "cuda/resolver_early_reads.cuh"
#include "cuda/resolver_handoff_record.cuh"

namespace hisparse {
namespace cuda {
namespace tail_reads {

// Rows the helpers of one launch read early, together; each helper's share
// is ResolverConstants::tail_rows_per_helper. About the link's first ten
// microseconds of a step, the span before the owners' own copies start:
// twice as many gained nothing at 100 requests and 5% misses for helpers
// that did not split the list, and reads without a cap held the owners'
// phases back.
constexpr int32_t kLaunchRows = 768;

// A helper's shared memory starts with the prediction scan's words;
// early_reads' HelperMemory follows.
constexpr uint32_t kScanBytes = 4 * kResolverWarps;

// The one part of a helped record (early_reads' partition bits, with one
// partition: the tail).
constexpr uint32_t kTailPart = 1u;

// Where the tail starts in a list of `count` entries.
__device__ __forceinline__ int32_t tail_begin(const ResolverConstants& c, int32_t count) {
  return max(count - static_cast<int32_t>(c.tail_rows_per_helper), 0);
}

// The helper's prediction, in top-k entry order (thread t holds entries 2t
// and 2t + 1, so a block scan numbers them in order): a top-k host row is
// a predicted miss when its entry is the one that put it in the table and
// it is not held (its hint bit is clear where the launch has a hint; else
// no slot of the state row holds it). The last `cap` predicted misses are
// buffered (values = their buffer index; kUnbuffered for the earlier ones;
// kHeld for held rows). The launcher runs tail reads only for k <= 2 x
// kResolverThreads. Ends at a block barrier, with the buffered rows counted
// in words[kPredicted] (none where at most c.auto_local_rows misses are
// predicted: such a request stages and copies its misses itself). `scan`:
// 32 words of shared memory.
__device__ __forceinline__ void predict_tail(const ResolveResidencyParams& p, const ResolverConstants& c,
                                             const early_reads::HelperMemory& m, int32_t* scan, int32_t b, int32_t s,
                                             int32_t cap) {
  using early_reads::HelperMemory;
  constexpr int kHeldLoads = early_reads::kHeldLoads;
  const int tid = threadIdx.x;
  const int32_t K = p.top_k;
  const bool row_of_b = b < p.num_tokens && p.req_id_per_token[b] == b;
  const early_reads::PredictionInputs in = early_reads::prediction_inputs(p, b, s);
  // Every load of the prediction's first round is issued before anything waits.
  int32_t position[2];
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const int32_t e = 2 * tid + x;
    position[x] = row_of_b && e < K ? in.topk[e] : -1;
  }
  int32_t held[kHeldLoads];
#pragma unroll
  for (int x = 0; x < kHeldLoads; ++x) {
    const int32_t j = tid + x * kResolverThreads;
    held[x] = j < in.held_slots ? __ldcg(in.held_row + j) : -1;
  }
  for (uint32_t i = tid; i < m.capacity; i += kResolverThreads) m.keys[i] = -1;
  __syncthreads();  // the table is empty
  int32_t slot[2];
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    slot[x] = -1;
    int32_t key = position[x] >= 0 ? early_reads::partition_key(p, c, in.source, in.resident, position[x], 0, 1) : -1;
    if (key >= 0 && in.hint != nullptr && ((__ldcg(in.hint + (key >> 5)) >> (key & 31)) & 1u))
      key = -1;  // probably held
    bool inserted = false;
    if (key >= 0) {
      const int32_t at = m.insert(key, inserted);
      if (at >= 0 && inserted) {
        slot[x] = at;
        m.values[at] = HelperMemory::kNotPredicted;
      }
    }
  }
  __syncthreads();  // every predicted candidate is in the table
  if (in.held_row != nullptr) {
    const auto mark = [&](int32_t key) {
      if (key < 0) return;
      const int32_t at = m.find_slot(key);
      if (at >= 0) m.values[at] = HelperMemory::kHeld;
    };
#pragma unroll
    for (int x = 0; x < kHeldLoads; ++x) mark(held[x]);
    for (int32_t j = tid + kHeldLoads * kResolverThreads; j < in.held_slots; j += kResolverThreads)
      mark(__ldcg(in.held_row + j));
    __syncthreads();  // every held row is marked
  }
  bool predicted[2];
#pragma unroll
  for (int x = 0; x < 2; ++x) predicted[x] = slot[x] >= 0 && m.values[slot[x]] != HelperMemory::kHeld;
  int32_t total;
  int32_t index = block_exclusive_sum_small<2>(predicted[0] + predicted[1], scan, &total);
  const int32_t first_buffered = max(total - cap, 0);
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    if (!predicted[x]) continue;
    const int32_t buffer_index = index - first_buffered;
    m.values[slot[x]] = buffer_index >= 0 ? static_cast<int16_t>(buffer_index) : HelperMemory::kUnbuffered;
    if (buffer_index >= 0) m.predicted[buffer_index] = m.keys[slot[x]];
    ++index;
  }
  // A request whose misses fit its stage copies them itself: no reads for it.
  if (tid == 0) m.words[HelperMemory::kPredicted] = total > c.auto_local_rows ? min(total, cap) : 0;
  __syncthreads();  // the prediction is complete
}

// Helper h of the launch: batch row h. Every thread of the block calls
// this, with the block's dynamic shared memory (`bytes` of it).
__device__ __forceinline__ void help_as_helper(const ResolveResidencyParams& p, const ResolverConstants& c,
                                               unsigned char* smem, uint32_t bytes, int32_t h) {
  using early_reads::HelperMemory;
  const int32_t b = h;
  if (b >= p.num_batch_rows) return;
  const int32_t s = p.request_state_indices[b];
  if (s < 0 || s >= p.num_state_rows) return;
  const uint64_t start = handoff::global_time_ns();
  int32_t* const record = p.handoff + static_cast<int64_t>(s) * HS_RESOLVER_HANDOFF_WORDS;
  // A table for the top-k row alone: held rows are only looked up.
  int32_t* const scan = reinterpret_cast<int32_t*>(smem);
  const HelperMemory m(smem + kScanBytes, bytes - kScanBytes, p.top_k, 0, 1, c.stage_row_bytes, false);
  if (m.capacity == 0) return;
  predict_tail(p, c, m, scan, b, s, min(static_cast<int32_t>(c.tail_rows_per_helper), m.buffered));
  // Nothing predicted: the owner copies its tail too.
  if (m.words[HelperMemory::kPredicted] == 0) return;
  if ((threadIdx.x >> 5) == early_reads::kCoordinatorWarp) {
    early_reads::claim_and_wait(p, m, record, b, s, 0, start);
  } else {
    early_reads::read_predicted_rows<false>(c, m);
  }
  __syncthreads();  // the buffer's rows, the claim and the published list
  const int32_t count = m.words[HelperMemory::kCount];
  // Not claimed (the owner copies the tail), or closed (the owner copied its own rows).
  if (!m.words[HelperMemory::kClaimed] || count < 0) return;
  early_reads::copy_partition_entries<false>(p, c, m, m.words[HelperMemory::kFirstRow], tail_begin(c, count), count, 1,
                                             kTailPart);
  if (threadIdx.x == 0) early_reads::finish_parts(record, kTailPart, kTailPart);
}

// The owner's block after its phase G, for a published record: it claims
// the tail unless its helper did, copies it if so, and closes the record
// then. Every thread calls this; `scratch`: a free shared word.
__device__ __forceinline__ void finish_as_owner(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                int32_t* record, int32_t* scratch) {
  if (threadIdx.x == 0) {
    const uint32_t before =
        static_cast<uint32_t>(handoff::Word(record[early_reads::kPartsWord])
                                  .fetch_or(static_cast<int32_t>(kTailPart), ::cuda::memory_order_relaxed));
    scratch[0] = static_cast<int32_t>(kTailPart & ~before);
  }
  __syncthreads();
  if (scratch[0] == 0) return;
  // The owner wrote these words itself.
  const int32_t first_row = record[handoff::kFirstRow];
  const int32_t count = record[handoff::kCount];
  handoff::copy_entries_by_warp(p, c, first_row, tail_begin(c, count), count, [](int32_t, int32_t) { return true; });
  if (threadIdx.x == 0) early_reads::finish_parts(record, kTailPart, kTailPart);
}

}  // namespace tail_reads
}  // namespace cuda
}  // namespace hisparse
