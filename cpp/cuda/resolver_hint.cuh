// The residency hint's upkeep in the CUDA resolver (docs/residency.md,
// "Residency hint"), with a hint only: a slot that takes a miss drops the
// bit of the row it held and sets the new row's. How a launch keeps it is
// part of its instantiation, so that launches without a hint carry none of
// its code (it cost the resolve registers and time even where it never
// ran), and launches with one test nothing per slot:
// - kInPhaseD: the layout keeps the device_global_indices row that phase A
//   copied (c.held_rows); the assignment reads the replaced row from shared
//   memory and changes the bits at once, as fire-and-forget reductions.
// - kAfterOutputs: split layouts and shapes with no room for the copy; the
//   assignment leaves the slots' entries alone and they are written after
//   the outputs, reading the rows they replace from the table: a round trip
//   to L2 at the end of the block.
// Both phase sets keep it the same way (resolve_residency.cu's general
// phases, resolver_single_row.cuh's).
#pragma once

#include <cstdint>

#include "core/resolve_residency_params.hpp"

namespace hisparse {
namespace cuda {

enum class HintUpkeep { kNone, kInPhaseD, kAfterOutputs };

// The slot that held `replaced` (any value) now holds host row `host_row`.
__device__ __forceinline__ void move_hint_bit(const ResolveResidencyParams& p, int32_t replaced, int32_t host_row) {
  uint32_t* const hint = p.residency_hint;
  if (replaced >= 0 && replaced < p.host_rows) atomicAnd(hint + (replaced >> 5), ~(1u << (replaced & 31)));
  atomicOr(hint + (host_row >> 5), 1u << (host_row & 31));
}

}  // namespace cuda
}  // namespace hisparse
