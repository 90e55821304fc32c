// update_residency on the CPU: per batch row, the pages of its request's
// newest num_pages pages are resident in the state row's own blocks (page g
// in ring slot g % num_pages); every other table entry is 0 (not resident).
#include <algorithm>

#include "cpu/kv_reference.hpp"

namespace hisparse {

void update_residency_reference(const ResidencyParams& p) {
  const int64_t page_size = p.table_block_size * p.blocks_per_page;
  for (int32_t b = 0; b < p.num_batch_rows; ++b) {
    int32_t* row = p.table + b * p.table_row_stride;
    const int32_t s = p.request_state_indices[b];
    const int64_t length = p.seq_lens[b];
    if (s < 0 || s >= p.num_state_rows || length <= 0 || p.num_pages == 0) {
      std::fill_n(row, p.table_width, 0);
      continue;
    }
    const int64_t last = (length - 1) / page_size;
    const int64_t first = std::max<int64_t>(0, last - p.num_pages + 1);
    const int32_t* blocks = p.resident_blocks + s * p.resident_blocks_row_stride;
    for (int32_t q = 0; q < p.table_width; ++q) {
      const int64_t page = q / p.blocks_per_page;
      row[q] = (page >= first && page <= last)
                   ? blocks[(page % p.num_pages) * p.blocks_per_page + q % p.blocks_per_page]
                   : 0;
    }
  }
}

}  // namespace hisparse
