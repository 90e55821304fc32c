// The fused gather of the CUDA residency resolver (docs/residency.md, "Fused
// gather"), as the kernel's compile-time policy: resolve_residency_kernel
// <Gather> calls the hooks below at fixed points of its phases, and each
// policy type decides what they do.
//
//   NoGather               every hook is empty: the resolve alone.
//   FusedGather            the swap list's host rows are copied to their hot
//                          rows: the misses of a request whose misses all fit
//                          the miss stage are staged after C1 and written out
//                          in phase G; otherwise every assigned miss is
//                          copied directly in phase E.
//   AutoGather<Fused>      the automatic schedule: Fused's copies for a
//                          request with few assigned misses, none for the
//                          others, whose rows the tail gather launched after
//                          the resolve copies (resolver_tail_gather.cu).
//   HandoffGather<Fused>   the automatic schedule with a handoff array
//                          (resolver_handoff.cuh): the others' rows are
//                          copied by every block of the same launch.
//   DeferredGather         past the SM count: a block resolves two requests
//                          in turn and then copies both swap lists
//                          (resolver_deferred_gather.cuh).
//
// Which rows are copied never depends on the stages; only when their bytes
// move does. A policy object lives in registers for the whole kernel.
#pragma once

#include <cstdint>

#include "core/resolve_residency_params.hpp"
#include "core/resolver_shared_memory.hpp"
#include "cuda/async_copy.cuh"
#include "cuda/block_scan.cuh"
#include "cuda/hopper_sync.cuh"
#include "cuda/resolver_context.cuh"
#include "cuda/row_copy.cuh"

namespace hisparse {
namespace cuda {

// The hook points, each a no-op here; the fused policies hide the ones they
// use. Arguments are what the phase has at that point.
struct NoGather {
  // Whether a request of one token row may take the single-row phases
  // (resolver_single_row.cuh), which call the *_single_row hooks instead of
  // the ones of phases C1 to G.
  static constexpr bool kSingleRow = true;
  // Batch rows one block resolves in turn (DeferredGather: 2).
  static constexpr int kRequestsPerBlock = 1;

  __device__ __forceinline__ NoGather(const ResolverConstants& /*c*/, const ResolverWorkspace& /*ws*/) {}

  // Phase A, before the grid dependency wait (shared memory only).
  __device__ __forceinline__ void prepare(const ResolverConstants& /*c*/) const {}

  // Phase C1, before B3: the members this thread found held.
  __device__ __forceinline__ void after_slot_match(const ResolverWorkspace& /*ws*/, int /*held_here*/) {}

  // After B3 (C1's results final), before phase C2.
  __device__ __forceinline__ void after_slot_scan(const ResolveResidencyParams& /*p*/, const ResolverConstants& /*c*/,
                                                  const ResolverWorkspace& /*ws*/, int32_t /*members*/,
                                                  const MemberRun& /*run*/) {}

  // Phase D: per assigned miss (rank r), then once before B6; after it, the
  // request's assigned misses (block-uniform).
  __device__ __forceinline__ void note_assigned_miss(const ResolverWorkspace& /*ws*/, int32_t /*r*/) {}
  __device__ __forceinline__ void after_assignment(const ResolverWorkspace& /*ws*/) {}
  __device__ __forceinline__ void note_assigned_total(const ResolverConstants& /*c*/,
                                                      const ResolveResidencyParams& /*p*/,
                                                      const ResolverRequest& /*request*/, int32_t /*assigned_total*/) {}

  // After B6: whether phase E copies rows (the next launch may start only
  // after them), and phase E itself, called only when it does.
  __device__ __forceinline__ bool copies_assigned(const ResolverWorkspace& /*ws*/) const { return false; }
  __device__ __forceinline__ void copy_assigned(const ResolveResidencyParams& /*p*/, const ResolverConstants& /*c*/,
                                                const ResolverWorkspace& /*ws*/, const ResolverRequest& /*request*/,
                                                int32_t /*classified*/, int32_t /*coded*/, const MemberRun& /*run*/) {}

  // Phase G, the block's last step of its own request.
  __device__ __forceinline__ void finish(const ResolverConstants& /*c*/, const ResolverWorkspace& /*ws*/) {}

  // The single-row phases: once the misses are known (before assignment),
  // and their phase G.
  __device__ __forceinline__ void stage_single_row_misses(const ResolverConstants& /*c*/,
                                                          const ResolverWorkspace& /*ws*/, uint32_t /*miss_bits*/,
                                                          const int32_t (& /*g*/)[2], int32_t /*misses*/) {}
  __device__ __forceinline__ void finish_single_row(const ResolverConstants& /*c*/, const ResolverWorkspace& /*ws*/) {}
  // The single-row phases' phase E: the request's own rows (true), or a
  // head of its list that the handoff kept (copy_kept_head).
  __device__ __forceinline__ bool copies_own_list() const { return true; }
  __device__ __forceinline__ void copy_kept_head(const ResolveResidencyParams& /*p*/, const ResolverConstants& /*c*/,
                                                 const ResolverRequest& /*request*/) const {}

  // The handoff (resolver_handoff.cuh): after phase A found the request
  // active; after phase G; and in a block with no active request.
  __device__ __forceinline__ void open_request(const ResolveResidencyParams& /*p*/, const ResolverConstants& /*c*/,
                                               const ResolverRequest& /*request*/) {}
  __device__ __forceinline__ void help_as_owner(const ResolveResidencyParams& /*p*/, const ResolverConstants& /*c*/,
                                                const ResolverWorkspace& /*ws*/) const {}
  __device__ __forceinline__ void help_as_idle(const ResolveResidencyParams& /*p*/, const ResolverConstants& /*c*/,
                                               const ResolverWorkspace& /*ws*/) const {}

  // After the block's last request (DeferredGather copies its lists here).
  __device__ __forceinline__ void copy_lists(const ResolveResidencyParams& /*p*/, const ResolverConstants& /*c*/,
                                             const ResolverWorkspace& /*ws*/) const {}
};

// Loads in flight per lane when a warp copies assigned rows: the resolve
// block holds 64 registers per thread, and one step's few misses fit one pass.
// Fewer make the host reads of 256 requests up to 13% slower
// (docs/performance.md, "Physical bounds": lines in flight per warp).
constexpr int kAssignedRowUnroll = 4;

// The warp copies the row of every lane with a destination `dst` (from
// `src`, or zero-filled where src is null), by line, all lanes' rows in one
// call.
__device__ __forceinline__ void warp_copy_lane_rows(const uint8_t* src, uint8_t* dst, int chunks, int lane) {
  const unsigned rows = __ballot_sync(kFullMask, dst != nullptr);
  if (rows == 0) return;
  // Lane e takes the row of the e-th lane with one, as warp_copy_rows_by_line wants.
  const int n = __popc(rows);
  const int from = lane < n ? static_cast<int>(__fns(rows, 0, lane + 1)) : 0;
  const uint8_t* my_src =
      reinterpret_cast<const uint8_t*>(__shfl_sync(kFullMask, reinterpret_cast<uintptr_t>(src), from));
  uint8_t* my_dst = reinterpret_cast<uint8_t*>(__shfl_sync(kFullMask, reinterpret_cast<uintptr_t>(dst), from));
  warp_copy_rows_by_line<kAssignedRowUnroll>(n, my_src, my_dst, chunks, lane);
}

// Where a swap entry's physical hot row `row` lies in the gather's hot
// cache, or null when it lies outside (the entry is skipped).
__device__ __forceinline__ uint8_t* assigned_row_destination(const GatherCompactParams& g_params, int32_t row) {
  const int64_t offset = hot_row_offset(row, g_params.hot_block_size, g_params.hot_block_stride);
  return offset < g_params.hot_span_rows ? g_params.hot + offset * g_params.row_bytes : nullptr;
}

// The warp copies the rows of the lanes with `has_row` set (host slot `g`,
// physical hot row `row`), exactly as gather_compact would copy those swap
// entries: a destination outside the hot cache is skipped, a source past the
// host rows zero-fills.
__device__ __forceinline__ void warp_copy_assigned_rows(const GatherCompactParams& g_params, bool has_row, int32_t g,
                                                        int32_t row, int lane) {
  const uint8_t* src = nullptr;
  uint8_t* dst = has_row ? assigned_row_destination(g_params, row) : nullptr;
  if (dst != nullptr && g < g_params.host_rows) src = g_params.host + static_cast<int64_t>(g) * g_params.host_pitch;
  warp_copy_lane_rows(src, dst, static_cast<int>(g_params.row_bytes / kChunkBytes), lane);
}

// The miss stage (ResolverMissStage, appended to the workspace): rows of
// row_bytes in shared memory, stage_members[i] = the member whose host row
// lands in row i (-1: none). A request stages all of its misses or none
// (the stage is small: a few misses are worth a head start, many are better
// moved by phase E's direct loads, which keep more bytes in flight). On
// sm_90 each staged row is one bulk copy counted in by the stage's mbarrier,
// so only the warps that write staged rows out wait for them; before, 16-byte
// async copies and a block barrier.
class FusedGather : public NoGather {
 public:
  __device__ __forceinline__ FusedGather(const ResolverConstants& c, const ResolverWorkspace& ws)
      : NoGather(c, ws),
        stage_barrier_(static_cast<uint32_t>(__cvta_generic_to_shared(ws.scratch + kScratchStageBarrier))),
        stage_members_(reinterpret_cast<int32_t*>(ws.base + c.miss_stage.stage_members)),
        stage_base_(static_cast<uint32_t>(__cvta_generic_to_shared(ws.base + c.miss_stage.stage))) {}

  __device__ __forceinline__ void prepare(const ResolverConstants& c) const {
    if (threadIdx.x == 0 && c.miss_stage.rows > 0 && c.bulk_stage) mbarrier_init_one_arrival(stage_barrier_);
  }

  __device__ __forceinline__ void after_slot_match(const ResolverWorkspace& ws, int held_here) {
    const int held_sum = warp_sum(held_here);
    if ((threadIdx.x & 31) == 0 && held_sum != 0) atomicAdd(ws.scratch + kScratchHeldMembers, held_sum);
  }

  // A member that no usable slot holds misses this step (phase D may still
  // find no slot for it). When all of the request's misses fit the miss
  // stage, the warps start reading their host rows into it right away, so
  // the round trip to host memory (a page walk and a PCIe read) overlaps
  // phases C2, D and F instead of following them. (members - held members
  // seen in C1 is the miss count, or less when a corrupt table holds a
  // member twice; either way only the choice, never the bytes, depends on it.)
  __device__ __forceinline__ void after_slot_scan(const ResolveResidencyParams& /*p*/, const ResolverConstants& c,
                                                  const ResolverWorkspace& ws, int32_t members, const MemberRun& run) {
    const int32_t misses_seen = members - ws.scratch[kScratchHeldMembers];
    if (!stages(c, misses_seen)) return;
    for (int32_t i = 0; i < run.length; ++i) {
      const int32_t r = run.begin + i;
      // A source past the host rows zero-fills: phase E does that directly.
      const bool wanted = r < run.end && ws.member_held[r] == 0 && ws.member_keys[r] < c.stage_host_rows;
      stage_member(c, ws, r, wanted ? ws.member_keys[r] : -1);
    }
    if (!c.bulk_stage) commit_async_copies();
  }

  // The single-row phases (resolver_single_row.cuh): the same stage, once
  // the request's misses are known exactly (bit x of miss_bits: entry
  // 2t + x is a miss's first entry, of host row g[x]), keyed by first entry.
  __device__ __forceinline__ void stage_single_row_misses(const ResolverConstants& c, const ResolverWorkspace& ws,
                                                          uint32_t miss_bits, const int32_t (&g)[2], int32_t misses) {
    if (!stages(c, misses)) return;
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      const bool wanted = ((miss_bits >> x) & 1u) && g[x] < c.stage_host_rows;
      stage_member(c, ws, 2 * static_cast<int32_t>(threadIdx.x) + x, wanted ? g[x] : -1);
    }
    if (!c.bulk_stage) commit_async_copies();
  }

  // Phase D counts the assigned misses phase E must copy (those not staged).
  __device__ __forceinline__ void note_assigned_miss(const ResolverWorkspace& ws, int32_t r) {
    unstaged_here_ += ws.member_held[r] != kMemberStaged;
  }
  __device__ __forceinline__ void after_assignment(const ResolverWorkspace& ws) {
    const int unstaged_sum = warp_sum(unstaged_here_);
    if ((threadIdx.x & 31) == 0 && unstaged_sum != 0) atomicAdd(ws.scratch + kScratchUnstagedMisses, unstaged_sum);
  }

  // Final since B6. A block left with no host reads of its own lets the
  // next programmatic launch start at once; one with phase-E copies only at
  // its exit, so that its copies do not share the SM with the next kernel.
  __device__ __forceinline__ bool copies_assigned(const ResolverWorkspace& ws) const {
    return ws.scratch[kScratchUnstagedMisses] > 0;
  }

  // Phase E: each warp copies the rows of its own assigned misses that were
  // not staged (member_first still holds their first entry), so the host
  // reads overlap phase F of the other warps. Runs only when
  // copies_assigned.
  __device__ __forceinline__ void copy_assigned(const ResolveResidencyParams& p, const ResolverConstants& c,
                                                const ResolverWorkspace& ws, const ResolverRequest& request,
                                                int32_t classified, int32_t coded, const MemberRun& run) {
    const int lane = threadIdx.x & 31;
    for (int32_t i = 0; i < run.length; ++i) {
      const int32_t r = run.begin + i;
      const bool assigned = r < run.end && ws.member_first[r] >= 0 && ws.member_held[r] != kMemberStaged;
      int32_t g = -1, row = -1;
      if (assigned) {
        const int32_t e = ws.member_first[r];
        row = ws.member_slots[r];
        if (e < classified && e < coded) {
          g = ws.table.key_at(ws.entry_codes[e]);
        } else {
          g = classify(p, c, request.source, request.resident, request.position(p, c, e)).host_slot;
        }
      }
      warp_copy_assigned_rows(p.gather, assigned, g, row, lane);
    }
  }

  // Phase G (staged misses): the warps move the staged rows of the misses
  // that got a slot to their hot rows. With bulk copies the warps that move
  // rows wait on the stage's mbarrier; otherwise every thread waits for its
  // own async copies and a block barrier (B8) publishes all of them.
  __device__ __forceinline__ void finish(const ResolverConstants& c, const ResolverWorkspace& ws) {
    // A member that got no slot (member_first < 0) has no row to write.
    write_staged_rows(c, ws, [&](int32_t r) { return ws.member_first[r] < 0 ? -1 : ws.member_slots[r]; });
  }

  // The single-row phases' phase G: members are first entries, an assigned
  // one is marked in member_slots and has its row in member_keys.
  __device__ __forceinline__ void finish_single_row(const ResolverConstants& c, const ResolverWorkspace& ws) {
    write_staged_rows(c, ws,
                      [&](int32_t e) { return ws.member_slots[e] == kSingleRowAssigned ? ws.member_keys[e] : -1; });
  }

 protected:
  // Phase G: the staged rows of members with a physical row (row_of(member)
  // >= 0) to their hot rows.
  template <class RowOf>
  __device__ __forceinline__ void write_staged_rows(const ResolverConstants& c, const ResolverWorkspace& ws,
                                                    const RowOf& row_of) {
    const ResolverMissStage& stage = c.miss_stage;
    if (stage.rows <= 0) return;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int32_t staged = min(ws.scratch[kScratchStagedRows], stage.rows);  // final since B4
    if (staged > 0) {
      if (c.bulk_stage) {
        // Every bulk copy was announced before B4 (after C1);
        // warp 0 always waits, so the block outlives the copies into its
        // shared memory.
        if (threadIdx.x == 0) mbarrier_arrive(stage_barrier_);
        if (warp >= staged) return;
        mbarrier_wait_first_phase(stage_barrier_);
      } else {
        wait_async_copies<0>();
        __syncthreads();  // B8
      }
      for (int32_t index = warp; index < staged; index += kResolverWarps) {
        const int32_t r = stage_members_[index];
        if (r < 0) continue;
        write_stage_row(c, ws, index, row_of(r), lane);
      }
    }
  }

  // The warp writes stage row `index` to physical hot row `row` (-1: no slot
  // was left for it; a row outside the gather's hot cache is skipped).
  __device__ __forceinline__ static void write_stage_row(const ResolverConstants& c, const ResolverWorkspace& ws,
                                                         int32_t index, int32_t row, int lane) {
    if (row < 0) return;
    // hot_row_offset of the physical row (< 2^31), by the launch's
    // divisor: the gather's hot block size is the resolver's.
    const int32_t block = c.hot_block_size.quotient(row);
    const int64_t offset =
        static_cast<int64_t>(block) * c.stage_hot_block_stride + c.hot_block_size.remainder(row, block);
    if (offset >= c.stage_hot_span_rows) return;
    uint8_t* const dst = c.stage_hot + offset * c.stage_row_bytes;
    const uint8_t* const src = ws.base + c.miss_stage.stage + index * c.stage_row_bytes;
    const int32_t chunks = static_cast<int32_t>(c.stage_row_bytes / kChunkBytes);
    for (int32_t chunk = lane; chunk < chunks; chunk += kWarpSize) {
      store_chunk(dst + kChunkBytes * chunk, load_chunk(src + kChunkBytes * chunk));
    }
  }

  // Whether a request with `misses` misses stages them (all or none).
  __device__ __forceinline__ static bool stages(const ResolverConstants& c, int32_t misses) {
    return c.miss_stage.rows > 0 && misses <= c.miss_stage.rows && misses > 0;
  }

  // Warp-wide: every lane offers member `r` with host row `g` (-1: none);
  // the offered rows take the next stage rows in lane order and start
  // landing (rows past the stage are left to phase E).
  __device__ __forceinline__ void stage_member(const ResolverConstants& c, const ResolverWorkspace& ws, int32_t r,
                                               int32_t g) {
    const ResolverMissStage& stage = c.miss_stage;
    const int lane = threadIdx.x & 31;
    const unsigned wanted = __ballot_sync(kFullMask, g >= 0);
    if (wanted == 0) return;
    const uint32_t row_bytes = c.stage_row_bytes;
    const int32_t chunks = static_cast<int32_t>(row_bytes / kChunkBytes);
    int32_t first = 0;
    if (lane == 0) first = atomicAdd(ws.scratch + kScratchStagedRows, __popc(wanted));
    first = __shfl_sync(kFullMask, first, 0);
    const int32_t index = first + __popc(wanted & ((1u << lane) - 1u));
    const bool staged_here = g >= 0 && index < stage.rows;
    if (staged_here) {
      stage_members_[index] = r;
      ws.member_held[r] = kMemberStaged;
    }
    const uint8_t* const src = g >= 0 ? c.stage_host + static_cast<int64_t>(g) * c.stage_host_pitch : nullptr;
    const uint32_t dst = stage_base_ + static_cast<uint32_t>(index) * row_bytes;
    if (c.bulk_stage) {
      // One bulk copy per row, from the lane that owns it.
      if (staged_here) bulk_copy_to_shared(stage_barrier_, dst, src, row_bytes);
      return;
    }
    // Sixteen bytes per lane: the warp moves the rows one after another.
    // Indices grow with the lane, so the first one past the stage ends it.
    for (unsigned left = wanted; left != 0; left &= left - 1u) {
      const int from = __ffs(left) - 1;
      const int32_t row_index = __shfl_sync(kFullMask, index, from);
      if (row_index >= stage.rows) break;
      const uint8_t* const row_src =
          reinterpret_cast<const uint8_t*>(__shfl_sync(kFullMask, reinterpret_cast<uintptr_t>(src), from));
      const uint32_t row_dst = __shfl_sync(kFullMask, dst, from);
      // The generic address of row_dst (used only where cp.async is not).
      unsigned char* const row_generic = ws.base + (row_dst - static_cast<uint32_t>(__cvta_generic_to_shared(ws.base)));
      for (int32_t chunk = lane; chunk < chunks; chunk += kWarpSize) {
        start_chunk_copy_to_shared(row_dst + kChunkBytes * chunk, row_generic + kChunkBytes * chunk,
                                   row_src + kChunkBytes * chunk);
      }
    }
  }

  uint32_t stage_barrier_;   // shared address of the stage's mbarrier
  int32_t* stage_members_;   // int32 [stage rows]
  uint32_t stage_base_;      // shared address of stage row 0
  int unstaged_here_ = 0;     // this thread's assigned misses that phase E copies
};

// The automatic schedule (docs/residency.md, "Fused gather"): a request with
// at most c.auto_local_rows assigned misses (what its miss stage holds: a
// few rows, read from host memory while it resolves) copies them as Fused
// does; a request with more copies none, and the tail gather launched right
// after the resolve copies its rows with the whole GPU instead of this one
// SM. Which requests the tail gather takes follows from the swap counts the
// resolve writes (resolver_tail_gather.cu), so the two kernels agree
// without a flag. Staged rows of a request left to the tail are still
// written by phase G (the same bytes, before the tail gather's: it starts
// after this grid), so that no bulk copy into shared memory outlives the block.
template <class Fused>
class AutoGather : public Fused {
 public:
  __device__ __forceinline__ AutoGather(const ResolverConstants& c, const ResolverWorkspace& ws) : Fused(c, ws) {}

  __device__ __forceinline__ void note_assigned_total(const ResolverConstants& c, const ResolveResidencyParams& /*p*/,
                                                      const ResolverRequest& /*request*/, int32_t assigned_total) {
    local_ = assigned_total <= c.auto_local_rows;
  }

  // Whether the request copies its own rows (block-uniform, after phase D).
  __device__ __forceinline__ bool local() const { return local_; }

  // A request left to the tail gather copies nothing in phase E.
  __device__ __forceinline__ bool copies_assigned(const ResolverWorkspace& ws) const {
    return local_ && Fused::copies_assigned(ws);
  }

 private:
  bool local_ = true;
};

}  // namespace cuda
}  // namespace hisparse
