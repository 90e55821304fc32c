// Raw, already-validated arguments of the staging kernels (docs/staging.md),
// shared by the core (staging_plan.cpp, staging_gather.cpp), the CPU
// reference and the CUDA launchers, plus the per-element rules both
// backends apply, so the two cannot disagree on what an id means.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define HS_STAGING_HOST_DEVICE __host__ __device__
#else
#define HS_STAGING_HOST_DEVICE
#endif

namespace hisparse {

constexpr int64_t kStagingInt32Max = 2147483647;

// Largest block id whose rows id * block_size .. id * block_size + block_size - 1
// fit in int32 (row ids are int32 everywhere).
HS_STAGING_HOST_DEVICE inline int64_t max_staged_block_id(int64_t block_size) {
  return (kStagingInt32Max - (block_size - 1)) / block_size;
}

// The block id an entry of a block table stands for: itself, or the null
// block 0 when negative or out of the int32 row range.
HS_STAGING_HOST_DEVICE inline int32_t staged_block_id(int64_t value, int64_t max_block) {
  return (value < 0 || value > max_block) ? 0 : static_cast<int32_t>(value);
}

// Blocks a request of `length` tokens reads, at most `cap` (the capacity):
// clamping keeps the prefix sums of a batch exact and overflow-free.
HS_STAGING_HOST_DEVICE inline int64_t blocks_used(int64_t length, int64_t block_size, int64_t cap) {
  if (length <= 0) return 0;
  const int64_t used = (length - 1) / block_size + 1;
  return used < cap ? used : cap;
}

// Reads element i of an int32 or int64 index array.
HS_STAGING_HOST_DEVICE inline int64_t load_index(const void* data, bool is_int64, int64_t i) {
  return is_int64 ? static_cast<const int64_t*>(data)[i] : static_cast<const int32_t*>(data)[i];
}

// The renumbering of `count` block ids (hs_staging_remap).
struct StagingRemapParams {
  int device = 0;
  const void* block_ids = nullptr;  // count entries, contiguous
  bool block_ids_int64 = false;
  int64_t count = 0;
  int64_t block_size = 1;
  int32_t* out_table = nullptr;    // count entries: the compact id of each
  int32_t* out_row_ids = nullptr;  // (count + 1) * block_size entries
  void* workspace = nullptr;       // staging_remap_workspace_bytes(count) bytes, 16-byte aligned
  size_t workspace_bytes = 0;
};

// Building a plan (hs_staging_plan_build). The remap runs over the
// capacity's slots with slot_block_ids as its input and slot_compact_ids as
// its out_table; remap.out_row_ids is the plan's row_ids.
struct StagingBuildParams {
  int device = 0;
  const void* block_table = nullptr;  // [B, C] at block_table_row_stride elements
  bool block_table_int64 = false;
  int64_t block_table_row_stride = 0;
  const void* seq_lens = nullptr;     // >= B entries, unit stride
  bool seq_lens_int64 = false;
  int64_t num_rows = 0;               // B
  int64_t num_cols = 0;               // C
  int64_t block_size = 1;
  int64_t capacity = 0;               // K slots
  // The plan's tensors.
  int32_t* out_block_table = nullptr;  // [B, C] contiguous
  int32_t* row_ids = nullptr;          // N = (K + 1) * block_size
  int32_t* dst_rows = nullptr;
  int32_t* miss_mask = nullptr;
  // Scratch of the plan.
  int64_t* block_ends = nullptr;       // B: u_0 + ... + u_b, clamped to K
  int32_t* slot_block_ids = nullptr;   // K: block id of slot k (0 when empty)
  int32_t* slot_entries = nullptr;     // K: flat block-table entry of slot k, -1 when empty
  int32_t* slot_compact_ids = nullptr; // K: new id of slot k
  StagingRemapParams remap;            // over the K slot ids
};

// ensure_gpu_sources once the host decided to compute (a compatible table).
// With num_states == 0 it writes the plan without sources: gpu_row_ids -1,
// miss_mask = row_ids >= 0.
struct StagingGpuSourcesParams {
  int device = 0;
  const int32_t* block_table = nullptr;  // the plan's [B, C]
  int64_t num_rows = 0;
  int64_t num_cols = 0;
  const int32_t* row_ids = nullptr;      // the plan's N entries
  int32_t* miss_mask = nullptr;
  int32_t* gpu_row_ids = nullptr;
  int64_t num_blocks = 0;                // N / block_size
  int64_t block_size = 1;
  const void* resident_state_rows = nullptr;  // [S, R] at resident_row_stride elements
  bool resident_int64 = false;
  int64_t num_states = 0;                // S
  int64_t resident_cols = 0;             // R
  int64_t resident_row_stride = 0;
  const void* state_indices = nullptr;   // >= B entries, unit stride
  bool state_indices_int64 = false;
  int64_t resident_block_size = 1;
  int32_t* first_entries = nullptr;      // scratch: num_blocks
};

// gather_resident_rows; the prefill gather sets skip_negative so rows
// without a resident copy are left to the host gather.
struct GatherResidentRowsParams {
  int device = 0;
  const uint8_t* source = nullptr;  // flat row r at (r / block_size) * block_pitch + (r % block_size) * row_pitch
  int64_t source_blocks = 0;
  int64_t source_block_size = 0;
  int64_t source_block_pitch = 0;   // bytes
  int64_t source_row_pitch = 0;     // bytes
  uint8_t* destination = nullptr;   // row j at j * destination_pitch
  int64_t destination_pitch = 0;
  int64_t row_bytes = 0;            // multiple of 16
  const void* row_ids = nullptr;    // count entries, unit stride
  bool row_ids_int64 = false;
  int64_t count = 0;
  bool skip_negative = false;
};

// Byte offset of flat row `row` of a resident cache: the row itself, or row
// 0 when outside the cache.
HS_STAGING_HOST_DEVICE inline int64_t resident_row_offset(const GatherResidentRowsParams& p, int64_t row) {
  const int64_t rows = p.source_blocks * p.source_block_size;
  if (row < 0 || row >= rows) row = 0;
  return (row / p.source_block_size) * p.source_block_pitch + (row % p.source_block_size) * p.source_row_pitch;
}

}  // namespace hisparse
