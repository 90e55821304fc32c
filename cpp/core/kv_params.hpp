// Raw, already-validated arguments of the kernels a model-level KV cache runs
// besides resolution and gathers: the per-request reset of the hot state,
// the write of new rows (host store, resident copy, hot copies), the
// residency update (newest pages resident), the read of the rows attention
// indices name, and the preparation of a narrow or length-limited top-k.
// The CPU references (cpu/kv_reference.hpp) and the CUDA launchers read
// exactly this; docs/kv_cache.md states the semantics. Offsets and pitches
// are in bytes unless a name says rows.
#pragma once

#include <cstdint>

namespace hisparse {

// Row `state_row` of one index group's hot state back to its initial value:
// device_global_indices = -1, lru_slots = 0 .. H-1.
struct ResetRequestParams {
  int device = 0;
  int32_t* device_global_indices = nullptr;  // [S, H] contiguous
  int16_t* lru_slots = nullptr;              // [S, H] contiguous
  int32_t num_state_rows = 0;                // S
  int32_t hot_size = 0;                      // H
  int32_t state_row = 0;                     // 0 <= state_row < S (checked on the host)
  // Optional (CUDA): the group's residency hint, whose bits of the rows the
  // state row held are cleared (docs/residency.md, "Residency hint").
  uint32_t* residency_hint = nullptr;  // [ceil(host_rows / 32)]
  int64_t host_rows = 0;
};

// out[t, k] = topk[t, k] for k < width when that position is >= 0 and below
// its request's length (when lengths are given), else -1; columns width ..
// top_k - 1 are -1.
struct PrepareTopkParams {
  int device = 0;
  const int32_t* topk = nullptr;  // [T, width], row stride topk_row_stride
  int64_t topk_row_stride = 0;
  int32_t width = 0;              // k' <= top_k
  int32_t* out = nullptr;         // [T, top_k], row stride out_row_stride
  int64_t out_row_stride = 0;
  int32_t top_k = 0;
  int32_t num_tokens = 0;                    // T
  const int32_t* req_id_per_token = nullptr;  // [T]; read only with seq_lens
  const int32_t* seq_lens = nullptr;          // [B] or null
  int32_t num_batch_rows = 0;                 // B
};

// The write of T new rows of one layer (docs/kv_cache.md, "write_rows").
struct WriteRowsParams {
  int device = 0;
  const uint8_t* src = nullptr;  // row t at src + t * src_pitch
  int64_t src_pitch = 0;
  int64_t row_bytes = 0;
  int32_t num_tokens = 0;  // T
  const int32_t* req_id_per_token = nullptr;
  const void* positions = nullptr;
  bool positions_int64 = false;
  const int32_t* request_state_indices = nullptr;  // [B]
  int32_t num_batch_rows = 0;                      // B

  // Positions -> host slots (null: a position is its host slot).
  const int32_t* source_block_table = nullptr;  // [B, source_width]
  int64_t source_row_stride = 0;
  int32_t source_width = 0;
  int64_t block_size = 1;
  int64_t host_rows = 0;  // host slots at or past this are invalid

  // Host store (null: skipped, e.g. a reader of a shared pool).
  uint8_t* host = nullptr;  // slot g at host + g * host_pitch
  int64_t host_pitch = 0;

  // Resident copy (null table: none). Position p of batch row b is resident
  // in block r = resident_block_table[b, p / resident_block_size] when r > 0,
  // at row offset r * resident_block_stride + p % resident_block_size.
  const int32_t* resident_block_table = nullptr;
  int64_t resident_row_stride = 0;
  int32_t resident_width = 0;
  int64_t resident_block_size = 1;
  uint8_t* resident = nullptr;
  int64_t resident_block_stride = 1;  // rows
  int64_t resident_span_rows = 0;     // row offsets at or past this are skipped

  // Hot copies (null device_global_indices: none): every hot slot j of the
  // token's state row holding its host slot gets the row (write-through), at
  // row offset hot_block_table[b, j / hot_block_size] * hot_block_stride +
  // j % hot_block_size of `hot`.
  const int32_t* device_global_indices = nullptr;  // [S, H] contiguous
  int32_t num_state_rows = 0;                      // S
  int32_t hot_size = 0;                            // H
  const int32_t* hot_block_table = nullptr;        // [B, hot_width]
  int64_t hot_row_stride = 0;
  int32_t hot_width = 0;
  int64_t hot_block_size = 1;
  uint8_t* hot = nullptr;
  int64_t hot_block_stride = 1;  // rows
  int64_t hot_span_rows = 0;
};

// out[t, k] = the row at row offset indices[t, k] of `cache` (attention
// addressing), or zeros when the index is negative or past span_rows.
struct ReadRowsParams {
  int device = 0;
  const uint8_t* cache = nullptr;
  int64_t span_rows = 0;
  int64_t row_bytes = 0;
  const int32_t* indices = nullptr;  // [T, width], row stride index_row_stride
  int64_t index_row_stride = 0;
  int32_t num_rows = 0;  // T
  int32_t width = 0;
  uint8_t* out = nullptr;  // [T, width] rows, contiguous
};

// The newest num_pages pages of every request resident: table[b, q] for the
// table block q (table_block_size positions) of batch row b. With
// ring_pages, a page is resident only while its ring slot holds it (every
// page of the call's windows claims its slot first, keeping the later page).
struct ResidencyParams {
  int device = 0;
  int32_t* table = nullptr;  // [B, table_width], row stride table_row_stride
  int64_t table_row_stride = 0;
  int32_t table_width = 0;
  int64_t table_block_size = 1;
  int32_t blocks_per_page = 1;  // m: a page is m table blocks
  int32_t num_pages = 0;        // n
  int32_t num_batch_rows = 0;   // B
  const int32_t* request_state_indices = nullptr;  // [B]
  const int32_t* seq_lens = nullptr;               // [B]
  const int32_t* resident_blocks = nullptr;        // [S, n * m], row stride resident_blocks_row_stride
  int64_t resident_blocks_row_stride = 0;
  int32_t num_state_rows = 0;     // S
  int32_t* ring_pages = nullptr;  // [S, >= n], row stride ring_pages_row_stride; null = every page of a window
  int64_t ring_pages_row_stride = 0;
};

// The pages [first, last] of batch row b's window; empty (first > last) for
// a row with an invalid state row, a length <= 0, or no pages kept.
struct PageWindow {
  int64_t first = 0;
  int64_t last = -1;
};

#if defined(__CUDACC__)
__host__ __device__
#endif
inline PageWindow resident_page_window(const ResidencyParams& p, int32_t b) {
  const int32_t s = p.request_state_indices[b];
  const int64_t length = p.seq_lens[b];
  if (s < 0 || s >= p.num_state_rows || length <= 0 || p.num_pages == 0) return PageWindow{};
  const int64_t last = (length - 1) / (p.table_block_size * p.blocks_per_page);
  const int64_t first = last - p.num_pages + 1;
  return PageWindow{first < 0 ? 0 : first, last};
}

// Where page `page` of state row s keeps its ring slot's page, or null
// without ring tracking.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline int32_t* ring_page_of(const ResidencyParams& p, int32_t s, int64_t page) {
  return p.ring_pages == nullptr ? nullptr : p.ring_pages + s * p.ring_pages_row_stride + page % p.num_pages;
}

// table[b, q] given the row's window, once every claim of the call is made.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline int32_t resident_table_entry(const ResidencyParams& p, int32_t b, const PageWindow& window, int32_t q) {
  const int64_t page = q / p.blocks_per_page;
  if (page < window.first || page > window.last) return 0;
  const int32_t s = p.request_state_indices[b];
  const int32_t* holder = ring_page_of(p, s, page);
  if (holder != nullptr && *holder != page) return 0;
  return p.resident_blocks[s * p.resident_blocks_row_stride + (page % p.num_pages) * p.blocks_per_page +
                           q % p.blocks_per_page];
}

// Shared by the references and the CUDA kernels: the host slot of a
// position, or -1 when the position has none (negative, past the source
// table, a null or negative block, or at or past host_rows).
#if defined(__CUDACC__)
__host__ __device__
#endif
inline int64_t write_host_slot(const WriteRowsParams& p, int32_t b, int64_t position) {
  if (position < 0) return -1;
  int64_t slot = position;
  if (p.source_block_table != nullptr) {
    const int64_t block = position / p.block_size;
    if (block >= p.source_width) return -1;
    const int32_t host_block = p.source_block_table[b * p.source_row_stride + block];
    if (host_block <= 0) return -1;
    slot = static_cast<int64_t>(host_block) * p.block_size + position % p.block_size;
  }
  return slot < p.host_rows ? slot : -1;
}

// The row offset of a position's resident copy, or -1 when it has none.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline int64_t write_resident_offset(const WriteRowsParams& p, int32_t b, int64_t position) {
  if (p.resident_block_table == nullptr || position < 0) return -1;
  const int64_t page = position / p.resident_block_size;
  if (page >= p.resident_width) return -1;
  const int32_t block = p.resident_block_table[b * p.resident_row_stride + page];
  if (block <= 0) return -1;
  const int64_t offset = static_cast<int64_t>(block) * p.resident_block_stride + position % p.resident_block_size;
  return offset < p.resident_span_rows ? offset : -1;
}

// The row offset of hot slot j of batch row b, or -1 when the slot is not
// usable (its hot block negative or past the table) or lies outside the view.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline int64_t write_hot_offset(const WriteRowsParams& p, int32_t b, int32_t j) {
  const int64_t logical_block = j / p.hot_block_size;
  if (logical_block >= p.hot_width) return -1;
  const int32_t block = p.hot_block_table[b * p.hot_row_stride + logical_block];
  if (block < 0) return -1;
  const int64_t offset = static_cast<int64_t>(block) * p.hot_block_stride + j % p.hot_block_size;
  return offset < p.hot_span_rows ? offset : -1;
}

// The state row a written token belongs to, or -1 when the token writes
// nothing (its batch row outside [0, B), a padding or out-of-range state row).
#if defined(__CUDACC__)
__host__ __device__
#endif
inline int32_t write_state_row(const WriteRowsParams& p, int32_t t, int32_t* batch_row) {
  const int32_t b = p.req_id_per_token[t];
  if (b < 0 || b >= p.num_batch_rows) return -1;
  const int32_t s = p.request_state_indices[b];
  if (s < 0 || (p.device_global_indices != nullptr && s >= p.num_state_rows)) return -1;
  *batch_row = b;
  return s;
}

}  // namespace hisparse
