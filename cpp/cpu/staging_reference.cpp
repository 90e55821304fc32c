#include "cpu/staging_reference.hpp"

#include <algorithm>
#include <cstring>

namespace hisparse {

size_t staging_remap_reference_workspace_bytes(int64_t count) {
  return static_cast<size_t>(count + 1) * sizeof(int32_t);
}

// Sort {0} and the entries' block ids, keep the distinct ones: the rank of
// an id among them is its new id, and they are the staged blocks in order.
void staging_remap_reference(const StagingRemapParams& p) {
  const int64_t max_block = max_staged_block_id(p.block_size);
  int32_t* distinct = static_cast<int32_t*>(p.workspace);
  distinct[0] = 0;
  for (int64_t i = 0; i < p.count; ++i) {
    distinct[i + 1] = staged_block_id(load_index(p.block_ids, p.block_ids_int64, i), max_block);
  }
  std::sort(distinct, distinct + p.count + 1);
  int32_t* end = std::unique(distinct, distinct + p.count + 1);
  const int64_t num_distinct = end - distinct;
  for (int64_t i = 0; i < p.count; ++i) {
    const int32_t id = staged_block_id(load_index(p.block_ids, p.block_ids_int64, i), max_block);
    p.out_table[i] = static_cast<int32_t>(std::lower_bound(distinct, end, id) - distinct);
  }
  for (int64_t k = 0; k <= p.count; ++k) {
    for (int64_t o = 0; o < p.block_size; ++o) {
      p.out_row_ids[k * p.block_size + o] =
          k < num_distinct ? static_cast<int32_t>(distinct[k] * p.block_size + o) : -1;
    }
  }
}

void build_staging_plan_reference(const StagingBuildParams& p) {
  const int64_t max_block = max_staged_block_id(p.block_size);
  // 1-2. Deal the capacity's slots out request after request; a slot past
  // column C holds nothing but is used up all the same.
  int64_t slot = 0;
  for (int64_t b = 0; b < p.num_rows && slot < p.capacity; ++b) {
    const int64_t used = blocks_used(load_index(p.seq_lens, p.seq_lens_int64, b), p.block_size, p.capacity);
    for (int64_t c = 0; c < used && slot < p.capacity; ++c, ++slot) {
      if (c < p.num_cols) {
        const int64_t value = load_index(p.block_table, p.block_table_int64, b * p.block_table_row_stride + c);
        p.slot_block_ids[slot] = staged_block_id(value, max_block);
        p.slot_entries[slot] = static_cast<int32_t>(b * p.num_cols + c);
      } else {
        p.slot_block_ids[slot] = 0;
        p.slot_entries[slot] = -1;
      }
    }
  }
  for (; slot < p.capacity; ++slot) {
    p.slot_block_ids[slot] = 0;
    p.slot_entries[slot] = -1;
  }
  // 3. Renumber the slots' block ids; row_ids are the staged blocks' rows.
  staging_remap_reference(p.remap);
  // 4. The new id at every staged entry, 0 elsewhere.
  std::fill_n(p.out_block_table, p.num_rows * p.num_cols, 0);
  for (int64_t k = 0; k < p.capacity; ++k) {
    if (p.slot_entries[k] >= 0) p.out_block_table[p.slot_entries[k]] = p.slot_compact_ids[k];
  }
  const int64_t staged_rows = (p.capacity + 1) * p.block_size;
  for (int64_t j = 0; j < staged_rows; ++j) {
    p.dst_rows[j] = static_cast<int32_t>(j);
    p.miss_mask[j] = p.row_ids[j] >= 0 ? 1 : 0;
  }
}

void staging_gpu_sources_reference(const StagingGpuSourcesParams& p) {
  const int64_t pages_per_block = p.block_size / p.resident_block_size;
  const int64_t max_page = max_staged_block_id(p.resident_block_size);
  const int64_t entries = p.num_rows * p.num_cols;
  // The first entry (row-major) of the plan's table that holds block k.
  std::fill_n(p.first_entries, p.num_blocks, static_cast<int32_t>(entries));
  for (int64_t e = entries - 1; e >= 0; --e) {
    const int32_t k = p.block_table[e];
    if (k >= 0 && k < p.num_blocks) p.first_entries[k] = static_cast<int32_t>(e);
  }
  for (int64_t k = 0; k < p.num_blocks; ++k) {
    const int32_t* rows = p.row_ids + k * p.block_size;
    const bool real_host_block = rows[0] >= p.block_size;  // host block > 0: never the null block
    int64_t state = -1;
    int64_t col = 0;
    if (p.num_states > 0 && p.first_entries[k] < entries) {
      state = load_index(p.state_indices, p.state_indices_int64, p.first_entries[k] / p.num_cols);
      col = p.first_entries[k] % p.num_cols;
    }
    for (int64_t o = 0; o < p.block_size; ++o) {
      int64_t page = 0;
      const int64_t page_col = col * pages_per_block + o / p.resident_block_size;
      if (state >= 0 && state < p.num_states && page_col < p.resident_cols) {
        page = load_index(p.resident_state_rows, p.resident_int64, state * p.resident_row_stride + page_col);
      }
      const bool valid = rows[o] >= 0;
      const bool resident = valid && real_host_block && page > 0 && page <= max_page;
      p.gpu_row_ids[k * p.block_size + o] =
          resident ? static_cast<int32_t>(page * p.resident_block_size + o % p.resident_block_size) : -1;
      p.miss_mask[k * p.block_size + o] = valid && !resident ? 1 : 0;
    }
  }
}

void gather_resident_rows_reference(const GatherResidentRowsParams& p) {
  for (int64_t j = 0; j < p.count; ++j) {
    const int64_t row = load_index(p.row_ids, p.row_ids_int64, j);
    if (p.skip_negative && row < 0) continue;
    std::memmove(p.destination + j * p.destination_pitch, p.source + resident_row_offset(p, row),
                 static_cast<size_t>(p.row_bytes));
  }
}

}  // namespace hisparse
