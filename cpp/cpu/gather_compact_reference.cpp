// gather_compact (and its group form) on the CPU: the swap list walked in
// (token row, column) order, a group entry piece by piece. Every CUDA
// schedule must produce these bytes.
#include <algorithm>
#include <cstring>

#include "cpu/data_movement_reference.hpp"

namespace hisparse {

void gather_compact_reference(const GatherCompactParams& p) {
  for (int32_t t = 0; t < p.num_token_rows; ++t) {
    const int32_t count = std::clamp(p.swap_counts[t], 0, p.top_k);
    const int32_t* host_row = p.swap_host_rows + t * p.swap_host_row_stride;
    const int32_t* device_row = p.swap_device_rows + t * p.swap_device_row_stride;
    for (int32_t k = 0; k < count; ++k) {
      const int64_t h = host_row[k];
      const int64_t d = device_row[k];
      if (h < 0 || d < 0) continue;
      const int64_t offset = hot_row_offset(d, p.hot_block_size, p.hot_block_stride);
      if (offset >= p.hot_span_rows) continue;
      for (int32_t piece = 0; piece < p.pieces; ++piece) {
        uint8_t* const hot = p.pieces > 1 ? p.piece_hot[piece] : p.hot;
        uint8_t* dst = hot + offset * p.row_bytes;
        if (h >= p.host_rows) {
          std::memset(dst, 0, static_cast<size_t>(p.row_bytes));
        } else {
          std::memmove(dst, p.host + h * p.host_pitch + piece * p.row_bytes, static_cast<size_t>(p.row_bytes));
        }
      }
    }
  }
}

}  // namespace hisparse
