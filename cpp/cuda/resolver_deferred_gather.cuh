// The fused gather of a block that resolves two requests in turn
// (docs/residency.md, "Fused gather"): past the SM count, up to twice it,
// block i resolves batch rows 2i and 2i + 1 one after the other and copies
// their rows after the second resolve. Each resolve has the SM's whole
// register file and takes the single-row phases where its request allows
// them; two blocks sharing an SM (32 registers per thread each) took longer
// for the same two requests, and a request that copied its rows before the
// next one resolved would hold that resolve back by a host round trip.
//
// A request whose misses fit its turn's half of the miss stage stages them
// as FusedGather does (bulk copies into shared memory started after C1 or
// the single-row walk), into a half the next turn leaves alone, so the
// first request's rows land while the second resolves and the second's
// while it finishes. Both turns' bulk copies count on the one stage
// mbarrier, initialised once, whose single arrival comes after the last
// resolve. At the end the block writes the staged rows to their hot rows
// and copies every other swap entry of both lists from host memory.
#pragma once

#include <cstdint>

#include "core/resolve_residency_params.hpp"
#include "core/resolver_shared_memory.hpp"
#include "cuda/async_copy.cuh"
#include "cuda/hopper_sync.cuh"
#include "cuda/resolver_context.cuh"
#include "cuda/resolver_gather.cuh"
#include "cuda/resolver_handoff_record.cuh"

namespace hisparse {
namespace cuda {

class DeferredGather : public FusedGather {
 public:
  static constexpr int kRequestsPerBlock = 2;

  // c.miss_stage.rows is one turn's half of the stage (the launcher's).
  __device__ __forceinline__ DeferredGather(const ResolverConstants& c, const ResolverWorkspace& ws)
      : FusedGather(c, ws) {}

  // Phase A of every turn: the stage's mbarrier is initialised once, for
  // both turns' copies.
  __device__ __forceinline__ void prepare(const ResolverConstants& c) const {
    if (!barrier_ready_) FusedGather::prepare(c);
    barrier_ready_ = true;
  }

  // After phase A found the request active: the second request stages into
  // the stage's second half.
  __device__ __forceinline__ void open_request(const ResolveResidencyParams& /*p*/, const ResolverConstants& c,
                                               const ResolverRequest& /*request*/) {
    if (lists_ == 1) {
      stage_members_ += c.miss_stage.rows;
      stage_base_ += static_cast<uint32_t>(c.miss_stage.rows) * c.stage_row_bytes;
    }
  }

  // Phase D: the request's swap list (block-uniform).
  __device__ __forceinline__ void note_assigned_total(const ResolverConstants& /*c*/,
                                                      const ResolveResidencyParams& /*p*/,
                                                      const ResolverRequest& request, int32_t assigned_total) {
    if (lists_ == 0) {
      first_row_[0] = request.t0;
      count_[0] = assigned_total;
    } else {
      first_row_[1] = request.t0;
      count_[1] = assigned_total;
    }
    ++lists_;
  }

  // Its rows are copied, later: the next programmatic launch may start only
  // at the block's exit, as after any block's copies. Nothing is copied in
  // phase E.
  __device__ __forceinline__ bool copies_assigned(const ResolverWorkspace& /*ws*/) const { return true; }
  __device__ __forceinline__ void copy_assigned(const ResolveResidencyParams& /*p*/, const ResolverConstants& /*c*/,
                                                const ResolverWorkspace& /*ws*/, const ResolverRequest& /*request*/,
                                                int32_t /*classified*/, int32_t /*coded*/, const MemberRun& /*run*/) {}
  __device__ __forceinline__ bool copies_own_list() const { return false; }

  // Phase G of the turn: the staged rows stay in shared memory; each stage
  // member's slot takes the hot row its row goes to (-1: none), read while
  // the turn's arrays still hold it.
  __device__ __forceinline__ void finish(const ResolverConstants& c, const ResolverWorkspace& ws) {
    note_destinations(c, ws, [&](int32_t r) { return ws.member_first[r] < 0 ? -1 : ws.member_slots[r]; });
  }
  __device__ __forceinline__ void finish_single_row(const ResolverConstants& c, const ResolverWorkspace& ws) {
    note_destinations(c, ws,
                      [&](int32_t e) { return ws.member_slots[e] == kSingleRowAssigned ? ws.member_keys[e] : -1; });
  }

  // After the block's last request: the staged rows to their hot rows, then
  // every swap entry of both lists that no staged row serves, with the
  // bytes gather_compact would write for it. Every thread calls this.
  __device__ __forceinline__ void copy_lists(const ResolveResidencyParams& p, const ResolverConstants& c,
                                             const ResolverWorkspace& ws) const {
    if (lists_ == 0) return;  // block-uniform
    __syncthreads();          // every list entry and staged row's destination is written
    const int32_t turn_rows = c.miss_stage.rows;
    const int32_t* const destinations = reinterpret_cast<const int32_t*>(ws.base + c.miss_stage.stage_members);
    write_staged_rows_of_turns(c, ws, destinations);
    for (int list = 0; list < lists_; ++list) {
      const int32_t* const staged_rows = destinations + list * turn_rows;
      const int32_t staged = list == 0 ? staged_[0] : staged_[1];
      const auto not_staged = [=](int32_t /*host_row*/, int32_t hot_row) {
        for (int32_t i = 0; i < staged; ++i) {
          if (staged_rows[i] == hot_row) return false;
        }
        return true;
      };
      handoff::copy_entries_by_warp(p, c, list == 0 ? first_row_[0] : first_row_[1], 0,
                                    list == 0 ? count_[0] : count_[1], not_staged);
    }
  }

 private:
  template <class RowOf>
  __device__ __forceinline__ void note_destinations(const ResolverConstants& c, const ResolverWorkspace& ws,
                                                    const RowOf& row_of) {
    const int32_t staged = c.miss_stage.rows > 0 ? min(ws.scratch[kScratchStagedRows], c.miss_stage.rows) : 0;
    if (lists_ == 1) {
      staged_[0] = staged;
    } else {
      staged_[1] = staged;
    }
    if (static_cast<int32_t>(threadIdx.x) < staged) {
      const int32_t r = stage_members_[threadIdx.x];
      stage_members_[threadIdx.x] = r < 0 ? -1 : row_of(r);
    }
  }

  // The staged rows of both turns, a row per warp, once they have landed
  // (bulk copies: the mbarrier's one arrival, here; warp 0 always waits, so
  // the block outlives every copy into its shared memory).
  __device__ __forceinline__ void write_staged_rows_of_turns(const ResolverConstants& c, const ResolverWorkspace& ws,
                                                             const int32_t* destinations) const {
    const int32_t total = staged_[0] + staged_[1];
    if (c.miss_stage.rows <= 0 || total == 0) return;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (c.bulk_stage) {
      if (threadIdx.x == 0) mbarrier_arrive(stage_barrier_);
      if (warp >= total && warp != 0) return;
      mbarrier_wait_first_phase(stage_barrier_);
    } else {
      wait_async_copies<0>();
      __syncthreads();
    }
    for (int32_t index = warp; index < total; index += kResolverWarps) {
      const int32_t slot = index < staged_[0] ? index : c.miss_stage.rows + (index - staged_[0]);
      write_stage_row(c, ws, slot, destinations[slot], lane);
    }
  }

  int32_t first_row_[2] = {0, 0};  // the lists' first token rows
  int32_t count_[2] = {0, 0};      // their entries
  int32_t staged_[2] = {0, 0};     // each turn's staged rows
  int lists_ = 0;
  // Set by the first turn's prepare, which phase A calls through a const
  // reference (the other policies' prepare changes nothing).
  mutable bool barrier_ready_ = false;
};

}  // namespace cuda
}  // namespace hisparse
