// Raw arguments of one residency-resolution launch, after validation. Both
// the CPU reference and the CUDA kernel read exactly this; the semantics are
// in docs/residency.md.
#pragma once

#include <cstdint>

#include "core/data_movement_params.hpp"
#include "hisparse/hisparse.h"

namespace hisparse {

struct ResolveResidencyParams {
  // Inputs.
  const int32_t* topk_indices = nullptr;  // [T, K], row stride topk_row_stride
  int64_t topk_row_stride = 0;
  int32_t num_tokens = 0;                 // T
  int32_t top_k = 0;                      // K
  const int32_t* req_id_per_token = nullptr;       // [T]
  const int32_t* request_state_indices = nullptr;  // [B]
  int32_t num_batch_rows = 0;                      // B
  const int32_t* num_valid_rows = nullptr;         // [1] or null (= T)

  // State, updated in place.
  int32_t* device_global_indices = nullptr;  // [S, H] contiguous
  int16_t* lru_slots = nullptr;              // [S, H] contiguous
  int32_t num_state_rows = 0;                // S
  int32_t hot_size = 0;                      // H

  // Address translation.
  const int32_t* hot_block_table = nullptr;  // [B, hot_table_width]
  int64_t hot_table_row_stride = 0;
  int32_t hot_table_width = 0;
  int32_t hot_block_size = 0;
  int64_t attention_block_stride = 0;
  int64_t host_rows = 0;
  int32_t max_union_rows = 0;

  const int32_t* source_block_table = nullptr;  // [B, source_table_width] or null
  int64_t source_table_row_stride = 0;
  int32_t source_table_width = 0;
  int32_t block_size = 0;

  const int32_t* resident_block_table = nullptr;  // [B, resident_table_width] or null
  int64_t resident_table_row_stride = 0;
  int32_t resident_table_width = 0;
  int32_t resident_block_size = 0;

  // Outputs ([T, K] with their own row strides, [T] contiguous).
  int32_t* out_attention = nullptr;
  int64_t out_attention_row_stride = 0;
  int32_t* out_hot_rows = nullptr;
  int64_t out_hot_rows_row_stride = 0;
  int32_t* out_resolved = nullptr;
  int64_t out_resolved_row_stride = 0;
  int32_t* out_miss_mask = nullptr;
  int64_t out_miss_mask_row_stride = 0;
  int32_t* out_swap_host_rows = nullptr;
  int64_t out_swap_host_rows_row_stride = 0;
  int32_t* out_swap_device_rows = nullptr;
  int64_t out_swap_device_rows_row_stride = 0;
  int32_t* out_valid_counts = nullptr;
  int32_t* out_swap_counts = nullptr;

  int64_t* stats = nullptr;  // [5] or null, accumulated

  int device = 0;  // CUDA device index (ignored by the CPU backend)

  // Fused gather: when true, the rows of the emitted swap list are also
  // copied host -> hot cache, byte-identical to gather_compact(gather) run
  // after the resolve. `gather` is filled completely by the host glue: its
  // swap_* fields point at the out_swap_* outputs above, num_token_rows = T,
  // top_k = K, hot_block_size = this hot_block_size, variant unused.
  bool fused_gather = false;
  GatherCompactParams gather;
  // How the fused gather's rows move on CUDA (HS_RESOLVE_GATHER_*): AUTO
  // leaves the rows of requests with many misses to a gather kernel spread
  // over the GPU, launched right after the resolve; FUSED copies every row
  // in the resolve launch. The bytes are the same; the CPU backend ignores it.
  int32_t gather_schedule = 0;

  // CUDA: the resolver's global workspace for shapes whose arrays do not fit
  // one block's shared memory (resolver_workspace_bytes of the state rows;
  // 16-byte aligned), null when none is needed. Ignored by the CPU backend.
  uint8_t* workspace = nullptr;

  // CUDA: the automatic schedule's handoff records, HS_RESOLVER_HANDOFF_WORDS
  // per state row (cuda/resolver_handoff.cuh), zero between launches; null
  // = the tail gather. Ignored by the CPU backend and the other schedules.
  int32_t* handoff = nullptr;
  // Optional residency hint (hs_resolve_residency_args_t), bits over host rows.
  uint32_t* residency_hint = nullptr;
};

}  // namespace hisparse
