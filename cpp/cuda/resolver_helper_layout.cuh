// Where an early- or tail-read helper block's arrays lie in its shared
// memory (resolver_early_reads.cuh, HelperMemory): a few words, an
// open-addressing table of its partition's host rows, the predicted rows'
// host rows, per buffered row its destination where the helper notes them,
// and the row buffer. A function of the launch alone, so the launcher
// computes it once for the launch's early-read helpers
// (ResolverConstants::early_layouts): sized in every block, the same
// integer arithmetic would stand between a helper's start and its first
// load, and the prediction's start sets when the launch's reads end
// (docs/performance.md, "Early reads from the state row").
#pragma once

#include <cstdint>

namespace hisparse {
namespace cuda {

struct HelperLayout {
  static constexpr uint32_t kWords = 16;  // the helper's shared words, at the start

  uint32_t capacity = 0;  // table slots, a power of two (0: too little memory, predict nothing)
  int32_t shift = 0;      // 32 - log2(capacity)
  int32_t buffered = 0;   // rows the buffer holds
  uint32_t predicted_at = 0;    // byte offsets from the start of the helper's shared memory
  uint32_t destination_at = 0;  // 0: the helper does not note destinations
  uint32_t rows_at = 0;

  // The table takes up to half of `bytes` (twice the partition's share of
  // the top-k row and of the `held` rows of the state row, rounded up to a
  // power of two), the row buffer the rest; `notes`: the helper notes its
  // rows' destinations.
  __host__ __device__ static HelperLayout make(uint32_t bytes, int32_t top_k, int32_t held, int32_t parts,
                                               uint32_t row_bytes, bool notes) {
    const uint32_t wanted =
        2u * ((static_cast<uint32_t>(top_k) + static_cast<uint32_t>(held)) / static_cast<uint32_t>(parts) + 32u);
    uint32_t c = 64;
    int32_t log2_c = 6;
    while (c < wanted && c < 32768u) {
      c <<= 1;
      ++log2_c;
    }
    while (c > 64 && kWords * 4 + 6 * c > bytes / 2) {
      c >>= 1;
      --log2_c;
    }
    // Too little shared memory for the smallest table: predict nothing.
    if (kWords * 4 + 6 * c > bytes) c = 0;
    HelperLayout l;
    l.capacity = c;
    l.shift = c > 0 ? 32 - log2_c : 0;
    l.predicted_at = (kWords * 4 + 6 * c + 15) / 16 * 16;
    // Per buffered row: the row, its host row and, where the helper notes
    // destinations, the destination; plus the arrays' alignment.
    const uint32_t per_row = row_bytes + (notes ? 12 : 4);
    const uint32_t slack = notes ? 32 : 16;
    const uint32_t left = bytes > l.predicted_at + slack ? bytes - l.predicted_at - slack : 0;
    const uint32_t fit = row_bytes > 0 && c > 0 ? left / per_row : 0;
    const uint32_t most = static_cast<uint32_t>(top_k) < 32767u ? static_cast<uint32_t>(top_k) : 32767u;
    l.buffered = static_cast<int32_t>(fit < most ? fit : most);
    const uint32_t after_predicted = (l.predicted_at + 4 * static_cast<uint32_t>(l.buffered) + 15) / 16 * 16;
    l.destination_at = notes ? after_predicted : 0;
    l.rows_at = notes ? (after_predicted + 8 * static_cast<uint32_t>(l.buffered) + 15) / 16 * 16 : after_predicted;
    return l;
  }
};

}  // namespace cuda
}  // namespace hisparse
