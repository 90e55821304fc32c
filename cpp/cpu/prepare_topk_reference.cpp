// prepare_topk on the CPU: a top-k of width k' <= K padded to K columns, with
// the positions at or past the request's length dropped (-1).
#include "cpu/kv_reference.hpp"

namespace hisparse {

void prepare_topk_reference(const PrepareTopkParams& p) {
  for (int32_t t = 0; t < p.num_tokens; ++t) {
    const bool limited = p.seq_lens != nullptr;
    int32_t length = 0;
    if (limited) {
      const int32_t b = p.req_id_per_token[t];
      length = (b >= 0 && b < p.num_batch_rows) ? p.seq_lens[b] : 0;
    }
    for (int32_t k = 0; k < p.top_k; ++k) {
      int32_t position = k < p.width ? p.topk[t * p.topk_row_stride + k] : -1;
      if (position < 0 || (limited && position >= length)) position = -1;
      p.out[t * p.out_row_stride + k] = position;
    }
  }
}

}  // namespace hisparse
