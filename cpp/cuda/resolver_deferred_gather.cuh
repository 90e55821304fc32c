// The fused gather of a block that resolves two requests in turn
// (docs/residency.md, "Fused gather"): past the SM count, up to twice it,
// block i resolves batch rows 2i and 2i + 1 one after the other, copying
// nothing in between, and then copies both swap lists. Each resolve has the
// SM's whole register file and takes the single-row phases where its request
// allows them; two blocks sharing an SM (32 registers per thread each) took
// longer for the same two requests, and a request that copied its rows
// before the next one resolved would hold that resolve back by a host round
// trip: here one round trip at the end serves both lists.
#pragma once

#include <cstdint>

#include "core/resolve_residency_params.hpp"
#include "cuda/resolver_context.cuh"
#include "cuda/resolver_gather.cuh"
#include "cuda/resolver_handoff_record.cuh"

namespace hisparse {
namespace cuda {

class DeferredGather : public NoGather {
 public:
  static constexpr int kRequestsPerBlock = 2;

  __device__ __forceinline__ DeferredGather(const ResolverConstants& c, const ResolverWorkspace& ws)
      : NoGather(c, ws) {}

  // Phase D: the request's swap list (block-uniform), copied after the last
  // request of the block.
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
  // phase E (NoGather's copy_assigned and copy_kept_head).
  __device__ __forceinline__ bool copies_assigned(const ResolverWorkspace& /*ws*/) const { return true; }
  __device__ __forceinline__ bool copies_own_list() const { return false; }

  // After the block's last request: every entry of both lists, with the
  // bytes gather_compact would write for them. Every thread calls this.
  __device__ __forceinline__ void copy_lists(const ResolveResidencyParams& p, const ResolverConstants& c) const {
    if (lists_ == 0) return;  // block-uniform
    __syncthreads();          // every entry of the lists is written
    const auto every_row = [](int32_t) { return true; };
    handoff::copy_entries_by_warp(p, c, first_row_[0], 0, count_[0], every_row);
    if (lists_ > 1) handoff::copy_entries_by_warp(p, c, first_row_[1], 0, count_[1], every_row);
  }

 private:
  int32_t first_row_[2] = {0, 0};  // the lists' first token rows
  int32_t count_[2] = {0, 0};      // their entries
  int lists_ = 0;
};

}  // namespace cuda
}  // namespace hisparse
