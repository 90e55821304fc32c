// The counters of a runtime's group (or a sum of groups) as the C ABI's
// hs_runtime_stats_t, written into the caller's struct.
#pragma once

#include "abi/api_guard.hpp"
#include "core/runtime.hpp"
#include "hisparse/runtime.h"

namespace hisparse {

inline void write_runtime_stats(const RuntimeStats& s, hs_runtime_stats_t* stats) {
  hs_runtime_stats_t v{};
  v.num_layers = s.num_layers;
  v.lookups = s.counters[HS_STAT_LOOKUPS];
  v.hits = s.counters[HS_STAT_HITS];
  v.misses = s.counters[HS_STAT_MISSES];
  v.resident = s.counters[HS_STAT_RESIDENT];
  v.invalid = s.counters[HS_STAT_INVALID];
  v.hit_rate = s.hit_rate;
  v.group_row_bytes = s.group_row_bytes;
  v.bytes_moved = s.bytes_moved;
  write_struct<HS_RUNTIME_STATS_VERSION>(stats, v);
}

}  // namespace hisparse
