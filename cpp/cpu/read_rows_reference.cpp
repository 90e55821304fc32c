// read_rows on the CPU: the rows attention indices name, zeros for an index
// that names none.
#include <cstring>

#include "cpu/kv_reference.hpp"

namespace hisparse {

void read_rows_reference(const ReadRowsParams& p) {
  const size_t bytes = static_cast<size_t>(p.row_bytes);
  for (int32_t t = 0; t < p.num_rows; ++t) {
    for (int32_t k = 0; k < p.width; ++k) {
      const int64_t index = p.indices[t * p.index_row_stride + k];
      uint8_t* out = p.out + (static_cast<int64_t>(t) * p.width + k) * p.row_bytes;
      if (index >= 0 && index < p.span_rows) {
        std::memcpy(out, p.cache + index * p.row_bytes, bytes);
      } else {
        std::memset(out, 0, bytes);
      }
    }
  }
}

}  // namespace hisparse
