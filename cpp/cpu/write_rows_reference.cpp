// write_rows on the CPU: each token's new row goes to its host slot (unless
// the host store is skipped), to its resident copy when its page is
// resident, and over every hot copy of its host slot in its state row, so
// that no copy made before the write can be served after it.
#include <cstring>

#include "cpu/kv_reference.hpp"

namespace hisparse {

void write_rows_reference(const WriteRowsParams& p) {
  const size_t bytes = static_cast<size_t>(p.row_bytes);
  for (int32_t t = 0; t < p.num_tokens; ++t) {
    int32_t b = -1;
    const int32_t s = write_state_row(p, t, &b);
    if (s < 0) continue;
    const int64_t position =
        p.positions_int64 ? static_cast<const int64_t*>(p.positions)[t] : static_cast<const int32_t*>(p.positions)[t];
    const uint8_t* row = p.src + t * p.src_pitch;
    const int64_t slot = write_host_slot(p, b, position);
    if (slot >= 0 && p.host != nullptr) std::memmove(p.host + slot * p.host_pitch, row, bytes);
    const int64_t resident = write_resident_offset(p, b, position);
    if (resident >= 0) std::memmove(p.resident + resident * p.row_bytes, row, bytes);
    if (slot < 0 || p.device_global_indices == nullptr) continue;
    const int32_t* held = p.device_global_indices + static_cast<int64_t>(s) * p.hot_size;
    for (int32_t j = 0; j < p.hot_size; ++j) {
      if (held[j] != slot) continue;
      const int64_t hot = write_hot_offset(p, b, j);
      if (hot >= 0) std::memmove(p.hot + hot * p.row_bytes, row, bytes);
    }
  }
}

}  // namespace hisparse
