// mirror_rows on the CPU: device-side rows written back to their host slots.
#include <cstring>

#include "cpu/data_movement_reference.hpp"

namespace hisparse {

void mirror_rows_reference(const MirrorRowsParams& p) {
  for (int64_t i = 0; i < p.count; ++i) {
    const int64_t slot = p.slot_mapping_int64 ? static_cast<const int64_t*>(p.slot_mapping)[i]
                                              : static_cast<const int32_t*>(p.slot_mapping)[i];
    if (slot < 0 || slot >= p.host_rows) continue;
    std::memmove(p.host + slot * p.host_pitch, p.src + i * p.src_pitch, static_cast<size_t>(p.row_bytes));
  }
}

}  // namespace hisparse
