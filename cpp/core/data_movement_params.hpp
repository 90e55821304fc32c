// Raw, already-validated arguments of the data-movement kernels, shared by
// the host glue (api_data_movement.cpp), the CPU reference and the CUDA
// launchers. Offsets and pitches are in bytes; every row pointer and pitch
// is 16-byte aligned, and row_bytes is a multiple of 16.
#pragma once

#include <cstdint>

#include "hisparse/data_movement.h"

namespace hisparse {

constexpr int kMaxGatherPieces = HS_MAX_GATHER_GROUP_PIECES;

struct GatherCompactParams {
  int device = 0;
  const uint8_t* host = nullptr;  // host row h at host + h * host_pitch
  int64_t host_rows = 0;
  int64_t host_pitch = 0;
  uint8_t* hot = nullptr;         // hot row r at hot + offset_rows(r) * row_bytes
  int64_t hot_span_rows = 0;      // offset_rows(r) < hot_span_rows, else skipped
  int64_t hot_block_size = 1;
  int64_t hot_block_stride = 1;
  int64_t row_bytes = 0;
  const int32_t* swap_host_rows = nullptr;
  const int32_t* swap_device_rows = nullptr;
  int64_t swap_host_row_stride = 0;    // elements
  int64_t swap_device_row_stride = 0;  // elements
  const int32_t* swap_counts = nullptr;
  int32_t num_token_rows = 0;  // R
  int32_t top_k = 0;           // K
  int32_t variant = 0;         // hs_gather_variant_t, resolved (never AUTO)
  int32_t max_blocks = 0;
  // A group gather (hs_gather_compact_group) when pieces > 1: host row h
  // holds `pieces` rows of row_bytes back to back, and piece i lands in the
  // hot cache at piece_hot[i] (piece_hot[0] == hot); every piece's hot cache
  // has the layout of `hot`. `variant` is then unused.
  int32_t pieces = 1;
  uint8_t* piece_hot[kMaxGatherPieces] = {};
};

// What hot_row_offset answers for a row it cannot place: past every hot
// cache, so the callers' `offset >= hot_span_rows` skips it.
constexpr int64_t kNoHotRow = INT64_MAX;

// Row offset (in rows from the hot cache's base) of physical hot row `row`:
// the attention addressing of docs/residency.md. kNoHotRow for a negative
// row or an offset past int64 (the host keeps block sizes and strides at
// most INT32_MAX, so an int32 row never gets there; the check makes the
// helper safe for any input).
#if defined(__CUDACC__)
__host__ __device__
#endif
inline int64_t hot_row_offset(int64_t row, int64_t block_size, int64_t block_stride) {
  if (row < 0 || block_size < 1 || block_stride < 0) return kNoHotRow;
  const int64_t block = row / block_size;
  const int64_t within = row - block * block_size;
  // Two factors below 2^31 cannot overflow; only larger ones pay a division.
  if (((block | block_stride) >> 31) != 0 && block_stride != 0 && block > (kNoHotRow - within) / block_stride) {
    return kNoHotRow;
  }
  return block * block_stride + within;
}

struct GatherPlanParams {
  int device = 0;
  const uint8_t* src = nullptr;
  int64_t src_rows = 0;
  int64_t src_pitch = 0;
  uint8_t* staged = nullptr;  // contiguous rows of row_bytes
  int64_t staged_rows = 0;
  int64_t row_bytes = 0;
  const int32_t* row_ids = nullptr;
  const int32_t* dst_rows = nullptr;
  const int32_t* miss_mask = nullptr;
  int64_t count = 0;
};

// Pointers are passed by value when table_pointers is null; larger sets are
// split into launches of this many tables.
constexpr int kInlineInvalidationTables = 64;

struct InvalidateSlotsParams {
  int device = 0;
  int32_t* const* tables = nullptr;         // host array of num_tables table pointers
  const int64_t* table_pointers = nullptr;  // device array of the same, or null
  int32_t num_tables = 0;
  int32_t num_state_rows = 0;  // S
  int32_t hot_size = 0;        // H
  const int32_t* request_state_indices = nullptr;
  int32_t num_batch_rows = 0;  // B
  const int32_t* req_id_per_token = nullptr;
  const int32_t* written_slots = nullptr;
  int32_t num_tokens = 0;
};

struct MirrorRowsParams {
  int device = 0;
  const uint8_t* src = nullptr;
  int64_t src_pitch = 0;
  int64_t count = 0;  // N rows of src
  uint8_t* host = nullptr;
  int64_t host_rows = 0;
  int64_t host_pitch = 0;
  int64_t row_bytes = 0;
  const void* slot_mapping = nullptr;
  bool slot_mapping_int64 = false;
};

struct SwapBlocksParams {
  int device = 0;
  const int64_t* src = nullptr;
  const int64_t* dst = nullptr;
  const int64_t* sizes = nullptr;
  int64_t count = 0;
};

// hs_warm_host_pages: block h of `host` spans [h * block_bytes,
// min((h + 1) * block_bytes, extent)) from `host`.
struct WarmHostPagesParams {
  int device = 0;
  const uint8_t* host = nullptr;
  int64_t extent = 0;       // bytes from host to the end of its last row
  int64_t host_blocks = 0;  // blocks that start before the end of the last row
  int64_t block_bytes = 0;  // block_size x the row pitch (the extent where one block holds every row)
  const int32_t* block_table = nullptr;
  int64_t block_table_row_stride = 0;
  int32_t num_requests = 0;  // B
  int32_t table_width = 0;   // M
  const int32_t* seq_lens = nullptr;  // null: every entry of a row is used
  int64_t block_size = 0;
  int64_t page_bytes = 0;  // a power of two
  int64_t* out = nullptr;  // [words read, their XOR], or null
};

// The bytes entry i of request b of a page warm-up reads a word of: from
// `first` (an offset from params.host), then at every page boundary before
// `end`; nothing when first >= end. Shared by the CPU reference and the
// CUDA kernel, so both read the same words.
struct WarmedRange {
  int64_t first = 0;
  int64_t end = 0;
};

#if defined(__CUDACC__)
__host__ __device__
#endif
inline int64_t next_page_offset(const WarmHostPagesParams& p, int64_t offset) {
  const auto address = reinterpret_cast<uintptr_t>(p.host) + static_cast<uintptr_t>(offset);
  return offset + p.page_bytes - static_cast<int64_t>(address & static_cast<uintptr_t>(p.page_bytes - 1));
}

#if defined(__CUDACC__)
__host__ __device__
#endif
inline WarmedRange warmed_range(const WarmHostPagesParams& p, int32_t b, int32_t i) {
  WarmedRange range;
  int64_t used = p.table_width;
  if (p.seq_lens != nullptr) {
    const int64_t length = p.seq_lens[b];
    used = length <= 0 ? 0 : (length + p.block_size - 1) / p.block_size;
  }
  if (i >= used) return range;
  const int32_t* row = p.block_table + static_cast<int64_t>(b) * p.block_table_row_stride;
  const int64_t block = row[i];
  if (block < 0 || block >= p.host_blocks) return range;
  const int64_t start = block * p.block_bytes;
  range.end = p.extent - start < p.block_bytes ? p.extent : start + p.block_bytes;
  const bool on_boundary = ((reinterpret_cast<uintptr_t>(p.host) + static_cast<uintptr_t>(start)) &
                            static_cast<uintptr_t>(p.page_bytes - 1)) == 0;
  // The block just below, used by this request right before: it read the
  // page this block starts in (or its own start, in that page).
  const bool follows_block_below = i > 0 && row[i - 1] == block - 1;
  range.first = on_boundary || !follows_block_below ? start : next_page_offset(p, start);
  return range;
}

}  // namespace hisparse
