// gather_plan on the CPU (the seed's hisparse_gather_plan): staged rows
// filled from the source where the plan marks a miss.
#include <cstring>

#include "cpu/data_movement_reference.hpp"

namespace hisparse {

void gather_plan_reference(const GatherPlanParams& p) {
  for (int64_t j = 0; j < p.count; ++j) {
    if (p.miss_mask[j] == 0) continue;
    const int64_t row = p.row_ids[j];
    const int64_t dst = p.dst_rows[j];
    if (row < 0 || row >= p.src_rows || dst < 0 || dst >= p.staged_rows) continue;
    std::memmove(p.staged + dst * p.row_bytes, p.src + row * p.src_pitch, static_cast<size_t>(p.row_bytes));
  }
}

}  // namespace hisparse
