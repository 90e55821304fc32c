// invalidate_written_slots on the CPU (the seed's HiSparseSlotInvalidator):
// every hot copy of a rewritten host slot in the writer's state row, in
// every table, becomes -1.
#include "cpu/data_movement_reference.hpp"

namespace hisparse {

void invalidate_written_slots_reference(const InvalidateSlotsParams& p) {
  for (int32_t t = 0; t < p.num_tokens; ++t) {
    const int32_t b = p.req_id_per_token[t];
    if (b < 0 || b >= p.num_batch_rows) continue;
    const int32_t s = p.request_state_indices[b];
    if (s < 0 || s >= p.num_state_rows) continue;
    const int32_t w = p.written_slots[t];
    if (w < 0) continue;
    for (int32_t i = 0; i < p.num_tables; ++i) {
      int32_t* row = p.tables[i] + static_cast<int64_t>(s) * p.hot_size;
      for (int32_t j = 0; j < p.hot_size; ++j) {
        if (row[j] == w) row[j] = -1;
      }
    }
  }
}

}  // namespace hisparse
