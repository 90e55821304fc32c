// The handoff of the automatic schedule (docs/residency.md, "Fused gather"):
// with a handoff array, a request with more misses than its stage holds
// publishes its swap list as soon as phase D has written it, and the
// launch's helper blocks (one per SM the batch leaves idle, while the
// batch's blocks are fewer than half the SMs) copy the published rows: they
// wait for the lists from the start. A request's own block keeps the head
// of its list, its share of the launch's blocks, copies it in phase E, and
// claims what the helpers left of its list after its phase G; without
// helper blocks it keeps the whole list. One launch, and copies start while
// other requests still resolve.
//
// The records are described in resolver_handoff_record.cuh; launches of
// one-row requests with a helper block per request or more read early
// (resolver_early_reads.cuh), so the kept heads serve requests of several
// token rows; launches of one-row requests from half the SMs on have
// helpers for the first requests' list tails (resolver_tail_reads.cuh).
#pragma once

#include <cstdint>

#include "core/resolve_residency_params.hpp"
#include "cuda/resolver_context.cuh"
#include "cuda/resolver_early_reads.cuh"
#include "cuda/resolver_gather.cuh"
#include "cuda/resolver_handoff_record.cuh"
#include "cuda/resolver_tail_reads.cuh"
#include "cuda/row_copy.cuh"

namespace hisparse {
namespace cuda {

namespace handoff {

// Where a block keeps one round of claims (the request-reduce words of the
// scratch, free after phase A): per lane r of the scanning warp, the first
// token row of its record, the first swap entry it claimed and the rows
// claimed by lanes before it; then the round's total and whether any of the
// 32 records is still resolving.
struct ClaimRound {
  int32_t* words;
  __device__ __forceinline__ int32_t* first_row() const { return words; }
  __device__ __forceinline__ int32_t* start() const { return words + kWarpSize; }
  __device__ __forceinline__ int32_t* before() const { return words + 2 * kWarpSize; }
  __device__ __forceinline__ int32_t& total() const { return words[3 * kWarpSize]; }
  __device__ __forceinline__ int32_t& resolving() const { return words[3 * kWarpSize + 1]; }
};
static_assert(3 * kWarpSize + 2 <= 4 * kResolverWarps, "a claim round fits the request-reduce words");

// Most swap entries one lane claims from its record per round.
constexpr int32_t kMaxClaimRows = 8;

// The block's warps copy the rows of the round's claims, one row per warp
// at a time so that a round's few rows keep as many warps reading as they
// can, with the bytes gather_compact would write for those swap entries.
__device__ __forceinline__ void copy_claimed_rows(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                  const ClaimRound& round, int32_t total) {
  const GatherCompactParams& g = p.gather;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  for (int32_t j = warp; j < total; j += kResolverWarps) {
    const bool has_row = lane == 0;
    int32_t host_row = -1, hot_row = -1;
    if (has_row) {
      // The last lane whose claims start at or before j (lanes that claimed
      // nothing share the next lane's start and lose to it).
      int lo = 0, hi = kWarpSize - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (round.before()[mid] <= j) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      load_swap_entry(g, c, round.first_row()[lo], round.start()[lo] + (j - round.before()[lo]), host_row, hot_row);
    }
    warp_copy_assigned_rows(g, has_row, host_row, hot_row, lane);
  }
}

// Phase E of a request that published its swap list: the block copies the
// `kept` entries at its head, which the other blocks never claim.
__device__ __forceinline__ void copy_kept_rows(const ResolveResidencyParams& p, const ResolverConstants& c,
                                               const ResolverRequest& request, int32_t kept) {
  copy_entries_by_warp(p, c, request.t0, 0, kept, [](int32_t, int32_t) { return true; });
}

// The block visits `visits` batch rows' records from batch row `first` on,
// 32 at a time. Warp 0 reads the 32 states with a lane per record (one
// round trip) and, in rounds, claims from each published record with rows
// left a share of them (its rows over the grid's blocks, so that a record's
// rows spread over every SM, whose host reads are slow one at a time); the
// whole block then copies the round's rows. A round with nothing to copy
// while records are still resolving waits for them. Every thread of the
// block calls this. `own`: the record of the block's own request, at
// `first`; it is idle again once fully claimed. `open_grace_ns`: how long an
// idle record may still be waiting for its owner to open it (0: idle means
// closed, for a block that starts looking only after its own resolve).
__device__ __forceinline__ void help_published(const ResolveResidencyParams& p, const ResolverConstants& c,
                                               const ResolverWorkspace& ws, int32_t first, int32_t visits, int32_t* own,
                                               uint64_t open_grace_ns) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int32_t B = p.num_batch_rows;
  const ClaimRound round{ws.scratch + kScratchRequestReduce};
  // One grace for the whole visit: records of later batches that are idle
  // by then were closed, or are opened too late to wait for.
  const uint64_t open_deadline = open_grace_ns > 0 && warp == 0 ? global_time_ns() + open_grace_ns : 0;
  for (int32_t batch = 0; batch < visits; batch += kWarpSize) {
    // The last round's words are read by every warp before they change.
    __syncthreads();
    int32_t* record = nullptr;
    int32_t state = kIdle, first_row = 0, count = 0;
    bool left = false;
    // An idle record never seen open may belong to an owner that has not
    // opened it yet (it does at the end of its phase A): within the grace,
    // it is waited for like a resolving one.
    bool unopened = false;
    uint64_t waiting_since = 0;
    if (warp == 0 && batch + lane < visits) {
      const int32_t i = first + batch + lane;
      const int32_t s = p.request_state_indices[i < B ? i : i - B];
      if (s >= 0 && s < p.num_state_rows) record = p.handoff + static_cast<int64_t>(s) * HS_RESOLVER_HANDOFF_WORDS;
      // Acquire: a kPublished record's first row, count and swap list are visible after it.
      if (record != nullptr) state = Word(record[kState]).load(::cuda::memory_order_acquire);
      unopened = record != nullptr && state == kIdle && open_grace_ns > 0 && global_time_ns() < open_deadline;
    }
    for (;;) {
      if (warp == 0) {
        if (state == kPublished) {
          first_row = record[kFirstRow];
          count = record[kCount];
          // Words no resolve wrote (memory not zeroed) must not send reads past the swap lists.
          left = first_row >= 0 && first_row < p.num_tokens && count > 0 &&
                 count <= static_cast<int64_t>(p.num_tokens - first_row) * p.top_k;
          state = kIdle;  // visited
        }
        int32_t start = 0, claimed = 0;
        if (left) {
          const int32_t share = min(
              max((count + static_cast<int32_t>(gridDim.x) - 1) / static_cast<int32_t>(gridDim.x), 1), kMaxClaimRows);
          start = Word(record[kCursor]).fetch_add(share, ::cuda::memory_order_relaxed);
          claimed = min(max(count - start, 0), share);
          left = start + share < count;
        }
        int32_t inclusive = claimed;
#pragma unroll
        for (int d = 1; d < kWarpSize; d <<= 1) {
          const int32_t up = __shfl_up_sync(kFullMask, inclusive, d);
          if (lane >= d) inclusive += up;
        }
        round.first_row()[lane] = first_row;
        round.start()[lane] = start;
        round.before()[lane] = inclusive - claimed;
        bool waiting = __ballot_sync(kFullMask, state == kResolving || unopened) != 0;
        if (waiting && inclusive == 0 && lane == kWarpSize - 1) {
          // Nothing to copy yet: wait a little, up to the timeout, before the next round.
          const uint64_t now = global_time_ns();
          if (waiting_since == 0) waiting_since = now;
          waiting = now - waiting_since < kResolvingTimeoutNs;
        }
        waiting = __shfl_sync(kFullMask, waiting, kWarpSize - 1);
        if (lane == kWarpSize - 1) {
          round.total() = inclusive;
          round.resolving() = waiting;
        }
        if (!waiting) {
          state = state == kResolving ? kIdle : state;
          unopened = false;
        }
      }
      __syncthreads();
      const int32_t total = round.total();
      if (total == 0 && !round.resolving()) break;
      if (total > 0) {
        copy_claimed_rows(p, c, round, total);
      } else if (warp == 0) {
        __nanosleep(256);
        if (state == kResolving || unopened) {
          state = Word(record[kState]).load(::cuda::memory_order_acquire);
          if (state != kIdle || global_time_ns() >= open_deadline) unopened = false;
        }
      }
      __syncthreads();
    }
    // Every record of the batch is fully claimed: the owner's is idle again.
    if (warp == 0 && own != nullptr && record == own) Word(own[kState]).store(kIdle, ::cuda::memory_order_relaxed);
  }
}

}  // namespace handoff

// The automatic schedule with a handoff array (launched with a block per
// idle SM past the batch, and no tail gather): AutoGather's choice per
// request, but a request with many misses publishes them to every block
// of the launch instead of leaving them to a second kernel. kEarlyReads:
// the blocks past the batch are early-read helpers (resolver_early_reads.cuh);
// kNoteDestinations: they note their rows' destinations while they read.
// kTailReads: they read the first requests' list tails
// (resolver_tail_reads.cuh), and every other request keeps its whole list.
template <class Fused, bool kEarlyReads = false, bool kNoteDestinations = false, bool kTailReads = false>
class HandoffGather : public AutoGather<Fused> {
  static_assert(!(kEarlyReads && kTailReads), "a launch's helpers read early or read tails");

 public:
  // The single-row phases with early-read helpers only. Without helpers
  // (from half the SM count on) a step that misses little ends when the
  // owners' staged rows arrive, and the general phases issue them after C1,
  // before the single-row phases know their misses (after their walk): at
  // 100 requests and 0.1% misses the single-row phases took 1.02x the time.
  static constexpr bool kSingleRow = kEarlyReads;

  __device__ __forceinline__ HandoffGather(const ResolverConstants& c, const ResolverWorkspace& ws)
      : AutoGather<Fused>(c, ws) {}

  // Phase A found the request active: its record opens (kResolving).
  __device__ __forceinline__ void open_request(const ResolveResidencyParams& p, const ResolverConstants& c,
                                               const ResolverRequest& request) {
    record_ = p.handoff + static_cast<int64_t>(request.s) * HS_RESOLVER_HANDOFF_WORDS;
    if (threadIdx.x == 0) {
      handoff::Word(record_[handoff::kCursor]).store(0, ::cuda::memory_order_relaxed);
      // With early reads, and for a request with a tail-read helper, a
      // helper that sees the record open claims a partition: after the
      // reset (a release; the others need no order).
      handoff::Word state(record_[handoff::kState]);
      if (kEarlyReads || (kTailReads && tail_helped(p))) {
        state.store(handoff::kResolving, ::cuda::memory_order_release);
      } else {
        state.store(handoff::kResolving, ::cuda::memory_order_relaxed);
      }
    }
  }

  // After B3: a request whose misses all fit its miss stage copies its rows
  // itself whatever phase D assigns (it assigns at most the misses), so it
  // closes its record now, a phase before D, and helper blocks waiting on
  // it leave (and let the next programmatic launch start) sooner. Should
  // phase D still assign more (a corrupt table holding a member twice
  // counts it held twice), the record is published after all: a helper
  // that left early misses it, and the owner copies what is left (with
  // early reads it stays closed and the owner copies its whole list).
  __device__ __forceinline__ void after_slot_scan(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                  const ResolverWorkspace& ws, int32_t members, const MemberRun& run) {
    AutoGather<Fused>::after_slot_scan(p, c, ws, members, run);
    close_early_if_local(c, members - ws.scratch[kScratchHeldMembers]);
  }

  // The single-row phases' counterpart, once the misses are known exactly
  // (after their second scan): the same stage and the same early close.
  __device__ __forceinline__ void stage_single_row_misses(const ResolverConstants& c, const ResolverWorkspace& ws,
                                                          uint32_t miss_bits, const int32_t (&g)[2], int32_t misses) {
    AutoGather<Fused>::stage_single_row_misses(c, ws, miss_bits, g, misses);
    close_early_if_local(c, misses);
  }

  // After B6 (the swap list is written): a request that copies its own rows
  // closes its record; one with more keeps the head of its list for its
  // phase E and publishes the rest. The head is the request's share of the
  // blocks that copy (B of the grid's: the owners and the helper blocks),
  // so a batch that leaves most SMs idle hands most rows to the helpers.
  // The owner reads those entries back from L2 right after B6, where a
  // helper's first copy waits on four dependent round trips (the record's
  // state, its words, the claim, the entries). A share below one claim of a
  // helper (kMaxClaimRows) stays with the helpers. A launch without helper
  // blocks (the launcher gives none once the batch's blocks are at least
  // half the SMs) has every request keep its whole list: their own copies
  // then keep the link busy, and handing part of each list to the helpers
  // made the step longer (100 requests at 5% misses on 132 SMs: keeping all
  // 102 rows took 0.944x the time of keeping 78,
  // bench/results/resolver_owners_keep_lists_ab_h200.json).
  __device__ __forceinline__ void note_assigned_total(const ResolverConstants& c, const ResolveResidencyParams& p,
                                                      const ResolverRequest& request, int32_t assigned_total) {
    AutoGather<Fused>::note_assigned_total(c, p, request, assigned_total);
    // With early reads the helpers copy every row of a request that does not
    // copy its own (none in phase E), and the cursor holds their claims.
    // A record closed after C1 stays closed: with early reads, helpers that
    // claimed a partition have left, so the owner keeps its whole list.
    const bool early = kEarlyReads && !closed_early_;
    if (!this->local() && !early) {
      if constexpr (kTailReads) {
        // A helped request keeps the head, the others their whole lists (as
        // does one closed after C1, whose helper has left).
        kept_ = tail_helped(p) && !closed_early_ ? tail_reads::tail_begin(c, assigned_total) : -assigned_total;
      } else {
        // 32-bit: assigned_total <= max_union_rows <= H <= 32767, and B < gridDim.x <= the SM count.
        const uint32_t blocks = gridDim.x;
        const uint32_t batch = static_cast<uint32_t>(p.num_batch_rows);
        const int32_t share =
            static_cast<int32_t>((static_cast<uint32_t>(assigned_total) * batch + blocks - 1) / blocks);
        const bool helpers = blocks > batch + 1u && !kEarlyReads;
        kept_ = share >= assigned_total || !helpers ? -assigned_total : share >= handoff::kMaxClaimRows ? share : 0;
      }
    }
    if (threadIdx.x != 0) return;
    if (!published()) {
      handoff::Word(record_[handoff::kState]).store(handoff::kIdle, ::cuda::memory_order_relaxed);
      return;
    }
    record_[handoff::kFirstRow] = request.t0;
    record_[handoff::kCount] = assigned_total;
    // With tail reads the cursor holds the tail's claim.
    if (!early && !kTailReads) handoff::Word(record_[handoff::kCursor]).store(kept_, ::cuda::memory_order_relaxed);
    // The other threads' swap entries are ordered before this by B6; the
    // fence makes them visible device-wide with the state.
    __threadfence();
    handoff::Word(record_[handoff::kState]).store(handoff::kPublished, ::cuda::memory_order_release);
  }

  // Phase E: the local request's rows as Fused copies them, or the kept head
  // of a published list.
  __device__ __forceinline__ bool copies_assigned(const ResolverWorkspace& ws) const {
    return this->local() ? Fused::copies_assigned(ws) : kept_ != 0;
  }
  __device__ __forceinline__ void copy_assigned(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                const ResolverWorkspace& ws, const ResolverRequest& request,
                                                int32_t classified, int32_t coded, const MemberRun& run) {
    if (this->local()) {
      Fused::copy_assigned(p, c, ws, request, classified, coded, run);
    } else {
      copy_kept_head(p, c, request);
    }
  }
  // The single-row phases' phase E: their own copy of the local request's
  // rows, or this kept head.
  __device__ __forceinline__ bool copies_own_list() const { return this->local(); }
  __device__ __forceinline__ void copy_kept_head(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                 const ResolverRequest& request) const {
    handoff::copy_kept_rows(p, c, request, kept_ >= 0 ? kept_ : -kept_);
  }

  // After phase G: what is left of the block's own list, when it published
  // one. A request that copied all of its rows closed its record unpublished,
  // and in a launch without helper blocks every request keeps its whole
  // list, so only a published record is worth the round trip. With early
  // reads, the partitions no helper claimed (and the record's close); with
  // tail reads, the tail if its helper did not claim it.
  __device__ __forceinline__ void help_as_owner(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                const ResolverWorkspace& ws) const {
    if constexpr (kEarlyReads) {
      if (published()) early_reads::finish_as_owner(p, c, record_, ws.scratch + kScratchRequestReduce);
      return;
    }
    if constexpr (kTailReads) {
      if (published()) tail_reads::finish_as_owner(p, c, record_, ws.scratch + kScratchRequestReduce);
      return;
    }
    if (!published()) return;
    handoff::help_published(p, c, ws, static_cast<int32_t>(blockIdx.x), 1, record_, 0);
  }

  // A block with no request of its own (past the batch, or inactive): every
  // request's, from one that depends on the block so that the first
  // requests' records are not everyone's first.
  __device__ __forceinline__ void help_as_idle(const ResolveResidencyParams& p, const ResolverConstants& c,
                                               const ResolverWorkspace& ws) const {
    const int32_t B = p.num_batch_rows;
    if (B <= 0) return;
    if constexpr (kEarlyReads) {
      // Only the blocks past the batch help; an inactive request's block has nothing to claim.
      if (blockIdx.x > static_cast<unsigned>(B)) {
        early_reads::help_as_helper<kNoteDestinations>(p, c, ws.base, static_cast<int32_t>(blockIdx.x) - B - 1);
      }
      return;
    }
    if constexpr (kTailReads) {
      if (blockIdx.x > static_cast<unsigned>(B)) {
        tail_reads::help_as_helper(p, c, ws.base, c.miss_stage.total_bytes, static_cast<int32_t>(blockIdx.x) - B - 1);
      }
      return;
    }
    handoff::help_published(p, c, ws, static_cast<int32_t>(blockIdx.x % static_cast<unsigned>(B)), B, nullptr,
                            handoff::kOpenGraceNs);
  }

 private:
  // A request with at most auto_local_rows misses copies its own rows
  // whatever phase D assigns (it assigns at most the misses): its record
  // closes now, a phase before D, and helper blocks waiting on it leave
  // sooner. The single-row phases count the misses exactly; the general
  // phases' count (members less the held ones seen in C1) falls short when
  // a corrupt table holds a member twice, and should phase D then assign
  // more, the record is published after all.
  __device__ __forceinline__ void close_early_if_local(const ResolverConstants& c, int32_t misses) {
    closed_early_ = misses <= c.auto_local_rows;
    if (threadIdx.x == 0 && closed_early_) {
      handoff::Word(record_[handoff::kState]).store(handoff::kIdle, ::cuda::memory_order_relaxed);
    }
  }

  // With tail reads: whether the block's request has a helper (helper h helps batch row h).
  __device__ __forceinline__ static bool tail_helped(const ResolveResidencyParams& p) {
    return blockIdx.x + 1u + static_cast<uint32_t>(p.num_batch_rows) < gridDim.x;
  }

  // Whether rows past the kept head are left to the other blocks (block-uniform, after phase D).
  __device__ __forceinline__ bool published() const { return !this->local() && kept_ >= 0; }

  int32_t* record_ = nullptr;
  // After phase D, for a request that is not local: the swap entries at the
  // head of its published list that phase E copies (0: none), or minus all
  // of them when it keeps its whole list; 0 for a local request. One word
  // for both facts: a separate flag live through phases E-H made the
  // handoff kernel spill.
  int32_t kept_ = 0;
  // Whether the record closed after C1 (block-uniform; read once, after phase D).
  bool closed_early_ = false;
};

}  // namespace cuda
}  // namespace hisparse
