// The rows a residency resolution writes as inactive (docs/residency.md,
// "Token rows of a request"): orphan token rows (past num_valid_rows or
// naming no batch row), padding and rejected requests. Every CUDA resolver
// kernel writes them the same way.
#pragma once

#include <cstdint>

#include "core/resolve_residency_params.hpp"
#include "cuda/fast_divisor.cuh"

namespace hisparse {
namespace cuda {

__device__ __forceinline__ void write_inactive_entry(const ResolveResidencyParams& p, int64_t t, int32_t k) {
  p.out_attention[t * p.out_attention_row_stride + k] = -1;
  p.out_hot_rows[t * p.out_hot_rows_row_stride + k] = -1;
  p.out_resolved[t * p.out_resolved_row_stride + k] = -1;
  p.out_miss_mask[t * p.out_miss_mask_row_stride + k] = 0;
}

// Token rows past num_valid_rows or naming no batch row, spread over the
// launch's `blocks` batch rows (row t goes to batch row b = t % blocks) so no
// single block writes them all. `first_owner` is req_id_per_token[b], loaded
// at the block's start so that the usual single row per request costs no
// load latency here. kThreads: the block's threads.
template <int kThreads>
__device__ void write_orphan_rows(const ResolveResidencyParams& p, int32_t valid_rows, int32_t first_owner, int32_t b,
                                  int32_t blocks) {
  for (int32_t t = b; t < p.num_tokens; t += blocks) {
    const int32_t request = t == b ? first_owner : p.req_id_per_token[t];
    if (t < valid_rows && request >= 0 && request < p.num_batch_rows) continue;
    for (int32_t k = threadIdx.x; k < p.top_k; k += kThreads) write_inactive_entry(p, t, k);
    if (threadIdx.x == 0) {
      p.out_valid_counts[t] = 0;
      p.out_swap_counts[t] = 0;
    }
  }
}

// Padding and rejected requests: their rows (any t in [first, last] naming
// b). `top_k` divides entry indices by K.
template <int kThreads>
__device__ void write_request_inactive(const ResolveResidencyParams& p, const FastDivisor& top_k, int32_t b,
                                       int32_t first, int32_t last) {
  const int32_t span = last - first + 1;
  const int32_t entries = span * p.top_k;  // <= T * K <= 2^30 (checked by the launcher)
  for (int32_t e = threadIdx.x; e < entries; e += kThreads) {
    const int32_t r = top_k.quotient(e);
    if (p.req_id_per_token[first + r] == b) write_inactive_entry(p, first + r, top_k.remainder(e, r));
  }
  for (int32_t r = threadIdx.x; r < span; r += kThreads) {
    if (p.req_id_per_token[first + r] == b) {
      p.out_valid_counts[first + r] = 0;
      p.out_swap_counts[first + r] = 0;
    }
  }
}

}  // namespace cuda
}  // namespace hisparse
