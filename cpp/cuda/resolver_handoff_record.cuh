// The handoff array's records (resolver_handoff.cuh, docs/residency.md,
// "Fused gather"): one record of HS_RESOLVER_HANDOFF_WORDS int32 per state
// row. A state row is unique among a launch's active requests, and two
// launches must never resolve one state row at once (its LRU row would race
// too), so records of concurrent launches never meet.
//   state   kIdle between launches, kResolving from the owner's phase A to
//           its phase D, then kPublished until the owner has claimed the
//           last of its rows (or kIdle at once: a request that copies its
//           own rows publishes nothing, and one whose misses fit its stage
//           closes the record after C1 already); with early reads, always
//           published after phase D and closed by whichever block finishes
//           the record's last partition; with tail reads, a helped request
//           publishes after phase D and whichever block copies the tail
//           closes it;
//   cursor  swap entries claimed so far, reset by the owner when it opens
//           and set past the entries it keeps when it publishes; with early
//           reads, the partitions claimed (low 16 bits) and finished (high
//           16 bits) instead, reset when the owner opens (with tail reads,
//           one partition: the list's tail);
//   first   the request's first token row;
//   count   its assigned misses (swap entries), in token-row order
//           (first and count are written only when the record is
//           published).
// Freedom from deadlock: a block waits on a record in kResolving, whose
// owner set that state while running and waits on no other block, and a
// helper block also on an idle record it has not seen open, for at most
// kOpenGraceNs from its start; every other idle record is skipped, and its
// owner copies whatever is left of its rows itself, since it claims its own
// record first. Only resolves may write the array: a record that was not
// idle when the launch began (memory not zeroed at allocation) is taken at
// its word as far as it names entries of the launch's swap lists, and can
// make the launch copy rows it must not.
#pragma once

#include <chrono>
#include <cstdint>

#include <cuda/atomic>

#include "core/resolve_residency_params.hpp"
#include "cuda/resolver_context.cuh"
#include "cuda/resolver_gather.cuh"

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

// How long a helper block, which starts looking as the owners start their
// phase A, takes an idle record for one whose owner has not opened it yet.
// Past it an idle record is skipped: its owner, if it opens later, copies
// its rows itself.
constexpr uint64_t kOpenGraceNs = 8'000;

using Word = ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_device>;

__device__ __forceinline__ uint64_t global_time_ns() {
#if defined(__CUDA_ARCH__)
  uint64_t now;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(now));
  return now;
#else
  // Host compilation of the device code (a CPU emulation of the kernel).
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
#endif
}

// Swap entry `e` of the request whose first token row is `first_row`: its
// host row and physical hot row. The entries were written by other threads
// (of this block, ordered by a barrier, or of another block, by the
// record's release), so they are read at L2, past this SM's L1.
__device__ __forceinline__ void load_swap_entry(const GatherCompactParams& g, const ResolverConstants& c,
                                                int32_t first_row, int32_t e, int32_t& host_row, int32_t& hot_row) {
  const int32_t r = c.top_k.quotient(e);
  const int64_t t = first_row + r;
  const int32_t column = c.top_k.remainder(e, r);
  host_row = __ldcg(g.swap_host_rows + t * g.swap_host_row_stride + column);
  hot_row = __ldcg(g.swap_device_rows + t * g.swap_device_row_stride + column);
}

// The block copies the swap entries [begin, count) of the list that starts
// at token row `first_row` that `wanted(host_row, hot_row)` accepts. Entry
// begin + j goes to warp j % 32, so that a few rows per warp keep every warp
// reading at once.
template <class Wanted>
__device__ __forceinline__ void copy_entries_by_warp(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                     int32_t first_row, int32_t begin, int32_t count, Wanted wanted) {
  const GatherCompactParams& g = p.gather;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  constexpr int32_t kEntriesPerPass = kResolverWarps * kWarpSize;
  for (int32_t base = begin; base < count; base += kEntriesPerPass) {
    const int32_t j = base + warp + kResolverWarps * lane;
    int32_t host_row = -1, hot_row = -1;
    if (j < count) load_swap_entry(g, c, first_row, j, host_row, hot_row);
    warp_copy_assigned_rows(g, j < count && wanted(host_row, hot_row), host_row, hot_row, lane);
  }
}

}  // namespace handoff
}  // namespace cuda
}  // namespace hisparse
