// reset_request on the CPU: one state row of an index group back to its
// initial hot state (nothing held, LRU order 0 .. H-1).
#include "cpu/kv_reference.hpp"

namespace hisparse {

void reset_request_reference(const ResetRequestParams& p) {
  const int64_t base = static_cast<int64_t>(p.state_row) * p.hot_size;
  for (int32_t j = 0; j < p.hot_size; ++j) {
    p.device_global_indices[base + j] = -1;
    p.lru_slots[base + j] = static_cast<int16_t>(j);
  }
}

}  // namespace hisparse
