// update_residency on the CPU: per batch row, the pages of its request's
// newest num_pages pages are resident in the state row's own blocks (page g
// in ring slot g % num_pages); every other table entry is 0 (not resident).
// With ring pages, every page of every window claims its slot before any
// table entry is written, so the table depends on the call's claims alone,
// not on the order of its batch rows.
#include <algorithm>

#include "cpu/kv_reference.hpp"

namespace hisparse {

void update_residency_reference(const ResidencyParams& p) {
  if (p.ring_pages != nullptr) {
    for (int32_t b = 0; b < p.num_batch_rows; ++b) {
      const PageWindow window = resident_page_window(p, b);
      const int32_t s = p.request_state_indices[b];
      for (int64_t page = window.first; page <= window.last; ++page) {
        int32_t* holder = ring_page_of(p, s, page);
        *holder = std::max(*holder, static_cast<int32_t>(page));
      }
    }
  }
  for (int32_t b = 0; b < p.num_batch_rows; ++b) {
    const PageWindow window = resident_page_window(p, b);
    int32_t* row = p.table + b * p.table_row_stride;
    for (int32_t q = 0; q < p.table_width; ++q) row[q] = resident_table_entry(p, b, window, q);
  }
}

}  // namespace hisparse
