// Where the CUDA residency resolver keeps a request's arrays, as the
// kernel's compile-time policy (resolve_residency_kernel<Gather, Placement>):
//
//   SharedPlacement  every array in the block's shared memory
//                    (ResolverSharedLayout): the shapes that fit the device.
//   SplitPlacement   the arrays that do not fit in the state row's slice of a
//                    global workspace preallocated at configuration time
//                    (ResolverSplitLayout; with their arrays moved, the
//                    lru_slots and device_global_indices rows are read in
//                    place instead of copied).
//
// The phases address every array through ResolverWorkspace, so they are the
// same code for both; only the initialisation of phase A, the state-row
// copies and the binding of the slice differ. With SharedPlacement the
// compiler sees shared-memory pointers only, so the launch that fits runs
// exactly the instructions it would without a split layout to choose from.
#pragma once

#include <cstdint>

#include "core/resolve_residency_params.hpp"
#include "core/resolver_shared_memory.hpp"
#include "cuda/async_copy.cuh"
#include "cuda/resolver_context.cuh"

namespace hisparse {
namespace cuda {

// Fills `count` 16-byte words from `begin`. The short loops of phase A (a few
// iterations per thread) stay rolled: unrolled, every warp runs their
// trip-count and remainder code, and the kernel's time follows its
// instructions per warp.
__device__ __forceinline__ void fill_words(unsigned char* begin, int32_t count, uint32_t word) {
  uint4* vectors = reinterpret_cast<uint4*>(begin);
#pragma unroll 1
  for (int32_t v = threadIdx.x; v < count; v += kResolverThreads) vectors[v] = make_uint4(word, word, word, word);
}

struct SharedPlacement {
  using Layout = ResolverSharedLayout;
  // lru_copy is a 16-byte aligned copy in shared memory.
  static constexpr bool kLruCopied = true;

  const Layout& layout;

  __device__ __forceinline__ explicit SharedPlacement(const Layout& l) : layout(l) {}

  __device__ __forceinline__ ResolverWorkspace carve(unsigned char* smem) const {
    return ResolverWorkspace(smem, layout);
  }

  // Phase A, before the grid dependency wait: the words that start as
  // all-ones and as zero (ResolverSharedLayout's groups).
  __device__ __forceinline__ void fill(const ResolverConstants& c, const ResolverWorkspace& ws) const {
    fill_words(reinterpret_cast<unsigned char*>(ws.table.keys), c.ones_vectors, 0xFFFFFFFFu);
    fill_words(reinterpret_cast<unsigned char*>(ws.slot_info), c.zero_vectors, 0u);
  }

  // Phase A: two commit groups, the lru row (needed at B1), then the dgi row
  // (needed in phase C1) into the evictable words, which are free until
  // phase C2.
  __device__ __forceinline__ void start_state_copies(const ResolveResidencyParams& p, const ResolverWorkspace& ws,
                                                     int32_t s, int32_t H) const {
    start_int16_row_copy<kResolverThreads>(ws.lru_copy, p.lru_slots + static_cast<int64_t>(s) * H, H);
    start_int32_row_copy<kResolverThreads>(ws.held_copy(), p.device_global_indices + static_cast<int64_t>(s) * H, H);
  }

  // After phase A: nothing lives outside shared memory.
  __device__ __forceinline__ void bind(const ResolveResidencyParams& /*p*/, const ResolverRequest& /*request*/,
                                       ResolverWorkspace& /*ws*/) const {}
};

struct SplitPlacement {
  using Layout = ResolverSplitLayout;
  // lru_copy may be the lru_slots row itself, of any alignment.
  static constexpr bool kLruCopied = false;

  const Layout& layout;

  __device__ __forceinline__ explicit SplitPlacement(const Layout& l) : layout(l) {}

  // Until bind, only the shared arrays are addressed.
  __device__ __forceinline__ ResolverWorkspace carve(unsigned char* smem) const {
    return ResolverWorkspace(smem, layout, nullptr, nullptr, nullptr);
  }

  __device__ __forceinline__ void fill(const ResolverConstants& /*c*/, const ResolverWorkspace& ws) const {
    fill_words(ws.base, layout.shared_ones_vectors, 0xFFFFFFFFu);
    fill_words(ws.base + layout.shared_zero, layout.shared_zero_vectors, 0u);
  }

  // SharedPlacement's two commit groups, each empty when its row is read in
  // place, so that phase A's wait for the first still means the lru row.
  __device__ __forceinline__ void start_state_copies(const ResolveResidencyParams& p, const ResolverWorkspace& ws,
                                                     int32_t s, int32_t H) const {
    if (layout.in_workspace & resolver_array_bit(kResolverLruCopy)) {
      commit_async_copies();
    } else {
      start_int16_row_copy<kResolverThreads>(ws.lru_copy, p.lru_slots + static_cast<int64_t>(s) * H, H);
    }
    if (layout.in_workspace & resolver_array_bit(kResolverEvictable)) {
      commit_async_copies();
    } else {
      start_int32_row_copy<kResolverThreads>(ws.held_copy(), p.device_global_indices + static_cast<int64_t>(s) * H, H);
    }
  }

  // After phase A (the request is active): the state row's slice and rows,
  // and its initialised words. The slice is the state row's alone in this
  // launch (a state row has one owner) and the last launch's blocks are done
  // with it (phase A waited for the prior grid); B1b publishes the fill.
  __device__ __forceinline__ void bind(const ResolveResidencyParams& p, const ResolverRequest& request,
                                       ResolverWorkspace& ws) const {
    unsigned char* const slice = p.workspace + static_cast<int64_t>(request.s) * layout.workspace_row_bytes;
    ws = ResolverWorkspace(ws.base, layout, slice, request.lru_row, request.dgi_row);
    if (layout.workspace_ones_vectors + layout.workspace_zero_vectors > 0) {
      fill_words(slice, layout.workspace_ones_vectors, 0xFFFFFFFFu);
      fill_words(slice + layout.workspace_zero, layout.workspace_zero_vectors, 0u);
      __syncthreads();  // B1b
    }
  }
};

}  // namespace cuda
}  // namespace hisparse
