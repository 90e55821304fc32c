// warm_host_pages on the CPU: the words a warm-up reads, in entry order,
// counted and XORed (the CUDA kernel's output, bit for bit).
#include <cstring>

#include "cpu/data_movement_reference.hpp"

namespace hisparse {

void warm_host_pages_reference(const WarmHostPagesParams& p) {
  int64_t words = 0;
  uint32_t folded = 0;
  for (int32_t b = 0; b < p.num_requests; ++b) {
    for (int32_t i = 0; i < p.table_width; ++i) {
      const WarmedRange range = warmed_range(p, b, i);
      for (int64_t offset = range.first; offset < range.end; offset = next_page_offset(p, offset)) {
        uint32_t word;
        std::memcpy(&word, p.host + offset, sizeof(word));
        folded ^= word;
        ++words;
      }
    }
  }
  if (p.out != nullptr) {
    p.out[0] = words;
    p.out[1] = static_cast<int64_t>(folded);
  }
}

}  // namespace hisparse
