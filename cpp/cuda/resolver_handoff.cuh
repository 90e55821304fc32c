// The handoff of the automatic schedule (docs/residency.md, "Fused gather"):
// with a handoff array, a request with more misses than its stage holds
// publishes its swap list as soon as phase D has written it, and every block
// of the launch copies published rows once it has nothing else to do. The
// blocks past the batch (one per SM the batch leaves idle) wait for the
// lists from the start; a request's own block joins after its phase G. One
// launch, and copies start while other requests still resolve.
//
// One record of kResolverHandoffWords int32 per state row. A state row is
// unique among a launch's active requests, and two launches must never
// resolve one state row at once (its LRU row would race too), so records of
// concurrent launches never meet.
//   state   kIdle between launches, kResolving from the owner's phase A to
//           its phase D, then kPublished until the owner has claimed the
//           last of its rows (or kIdle at once: a request that copies its
//           own few rows publishes nothing);
//   cursor  swap entries claimed so far, reset by the owner when it opens;
//   first   the request's first token row;
//   count   its assigned misses (swap entries), in token-row order.
// Freedom from deadlock: a block waits only on a record in kResolving,
// whose owner set that state while running and waits on no other block; a
// record in kIdle is skipped, and its owner copies whatever is left of its
// rows itself, since it claims its own record first.
#pragma once

#include <cstdint>

#include <cuda/atomic>

#include "core/resolve_residency_params.hpp"
#include "cuda/resolver_context.cuh"
#include "cuda/resolver_gather.cuh"
#include "cuda/row_copy.cuh"

namespace hisparse {
namespace cuda {

namespace handoff {

constexpr int kState = 0;
constexpr int kCursor = 1;
constexpr int kFirstRow = 2;
constexpr int kCount = 3;
static_assert(HS_RESOLVER_HANDOFF_WORDS == 4, "the record's words are the four above");

constexpr int32_t kIdle = 0;
constexpr int32_t kResolving = 1;
constexpr int32_t kPublished = 2;

// A record's state past this long in kResolving is treated as kIdle. The
// owner leaves kResolving within its resolve (microseconds), so only a
// record that no resolve wrote (memory that was not zero when allocated)
// stays there, and a launch must not hang on it.
constexpr uint64_t kResolvingTimeoutNs = 20'000'000;

using Word = ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_device>;

__device__ __forceinline__ uint64_t global_time_ns() {
  uint64_t now;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(now));
  return now;
}

// The warp copies the rows of every swap entry of published record it can
// claim, `group` entries per claim (one pass of loads per lane), with the
// bytes gather_compact would write for those entries.
__device__ __forceinline__ void copy_claimed_rows(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                  int32_t* record, int32_t first_row, int32_t count, int group,
                                                  int lane) {
  const GatherCompactParams& g = p.gather;
  for (;;) {
    int32_t claimed = 0;
    if (lane == 0) claimed = Word(record[kCursor]).fetch_add(group, ::cuda::memory_order_relaxed);
    claimed = __shfl_sync(kFullMask, claimed, 0);
    if (claimed >= count) return;
    const int32_t e = claimed + lane;
    const bool has_row = lane < group && e < count;
    int32_t host_row = -1, hot_row = -1;
    if (has_row) {
      const int32_t r = c.top_k.quotient(e);
      const int64_t t = first_row + r;
      const int32_t column = c.top_k.remainder(e, r);
      // Written by another block: read at L2, past this SM's L1.
      host_row = __ldcg(g.swap_host_rows + t * g.swap_host_row_stride + column);
      hot_row = __ldcg(g.swap_device_rows + t * g.swap_device_row_stride + column);
    }
    warp_copy_assigned_rows(g, has_row, host_row, hot_row, lane);
  }
}

// The warp visits every batch row's record once, from batch row `first` on,
// 32 at a time: a lane per record reads its state and, once published, how
// much of it is left, so one round trip covers 32 records and a record
// already fully claimed costs no atomic. It copies what it can claim of the
// records with rows left, in visiting order, and waits for those still in
// kResolving, copying any that publish meanwhile. `own`: the record of the
// block's own request, at `first`; warp 0 returns it to kIdle once it has
// found it fully claimed.
__device__ __forceinline__ void help_published(const ResolveResidencyParams& p, const ResolverConstants& c,
                                               int32_t first, int32_t* own) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int32_t B = p.num_batch_rows;
  for (int32_t base = 0; base < B; base += kWarpSize) {
    int32_t* record = nullptr;
    if (base + lane < B) {
      const int32_t i = first + base + lane;
      const int32_t s = p.request_state_indices[i < B ? i : i - B];
      if (s >= 0 && s < p.num_state_rows) record = p.handoff + static_cast<int64_t>(s) * HS_RESOLVER_HANDOFF_WORDS;
    }
    // Acquire: a kPublished record's first, count and swap list are visible after it.
    int32_t state = record != nullptr ? Word(record[kState]).load(::cuda::memory_order_acquire) : kIdle;
    uint64_t waiting_since = 0;
    for (;;) {
      bool left = false;
      if (state == kPublished) {
        left = Word(record[kCursor]).load(::cuda::memory_order_relaxed) < record[kCount];
        state = kIdle;  // visited
        // The owner's own record is idle again once nothing of it is left.
        if (!left && record == own && warp == 0) Word(own[kState]).store(kIdle, ::cuda::memory_order_relaxed);
      }
      for (unsigned ready = __ballot_sync(kFullMask, left); ready != 0; ready &= ready - 1u) {
        const int from = __ffs(ready) - 1;
        int32_t* const ready_record =
            reinterpret_cast<int32_t*>(__shfl_sync(kFullMask, reinterpret_cast<uintptr_t>(record), from));
        const int32_t first_row = __shfl_sync(kFullMask, lane == from ? record[kFirstRow] : 0, from);
        const int32_t count = __shfl_sync(kFullMask, lane == from ? record[kCount] : 0, from);
        copy_claimed_rows(p, c, ready_record, first_row, count, c.handoff_claim_rows, lane);
        if (ready_record == own && warp == 0 && lane == 0) {
          Word(own[kState]).store(kIdle, ::cuda::memory_order_relaxed);
        }
      }
      if (__ballot_sync(kFullMask, state == kResolving) == 0) break;
      const uint64_t now = global_time_ns();
      if (waiting_since == 0) waiting_since = now;
      if (now - waiting_since >= kResolvingTimeoutNs) break;
      __nanosleep(128);
      if (state == kResolving) state = Word(record[kState]).load(::cuda::memory_order_acquire);
    }
  }
}

}  // namespace handoff

// The automatic schedule with a handoff array (launched with a block per
// idle SM past the batch, and no tail gather): AutoGather's choice per
// request, but a request with many misses publishes them to every block
// of the launch instead of leaving them to a second kernel.
template <class Fused>
class HandoffGather : public AutoGather<Fused> {
 public:
  __device__ __forceinline__ HandoffGather(const ResolverConstants& c, const ResolverWorkspace& ws)
      : AutoGather<Fused>(c, ws) {}

  // Phase A found the request active: its record opens (kResolving).
  __device__ __forceinline__ void open_request(const ResolveResidencyParams& p, const ResolverRequest& request) {
    record_ = p.handoff + static_cast<int64_t>(request.s) * HS_RESOLVER_HANDOFF_WORDS;
    if (threadIdx.x == 0) {
      handoff::Word(record_[handoff::kCursor]).store(0, ::cuda::memory_order_relaxed);
      handoff::Word(record_[handoff::kState]).store(handoff::kResolving, ::cuda::memory_order_relaxed);
    }
  }

  // After B6 (the swap list is written): a request that copies its own rows
  // closes its record; one with more publishes them.
  __device__ __forceinline__ void note_assigned_total(const ResolverConstants& c, const ResolveResidencyParams& p,
                                                      const ResolverRequest& request, int32_t assigned_total) {
    AutoGather<Fused>::note_assigned_total(c, p, request, assigned_total);
    if (threadIdx.x != 0) return;
    if (this->local()) {
      handoff::Word(record_[handoff::kState]).store(handoff::kIdle, ::cuda::memory_order_relaxed);
      return;
    }
    record_[handoff::kFirstRow] = request.t0;
    record_[handoff::kCount] = assigned_total;
    // The other threads' swap entries are ordered before this by B6; the
    // fence makes them visible device-wide with the state.
    __threadfence();
    handoff::Word(record_[handoff::kState]).store(handoff::kPublished, ::cuda::memory_order_release);
  }

  // After phase G: the block's own record first, then everyone else's.
  __device__ __forceinline__ void help_as_owner(const ResolveResidencyParams& p, const ResolverConstants& c) const {
    handoff::help_published(p, c, static_cast<int32_t>(blockIdx.x), record_);
  }

  // A block with no request of its own (past the batch, or inactive): each
  // warp starts at another request, so a request's rows spread over SMs.
  __device__ __forceinline__ void help_as_idle(const ResolveResidencyParams& p, const ResolverConstants& c) const {
    const int32_t B = p.num_batch_rows;
    if (B <= 0) return;
    const int64_t worker = static_cast<int64_t>(blockIdx.x) * kResolverWarps + (threadIdx.x >> 5);
    handoff::help_published(p, c, static_cast<int32_t>(worker % B), nullptr);
  }

 private:
  int32_t* record_ = nullptr;
};

}  // namespace cuda
}  // namespace hisparse
