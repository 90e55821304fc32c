#include "cpu/index_group_reference.hpp"

#include <algorithm>
#include <cstring>

namespace hisparse {

void reset_hot_state_reference(const ResetHotStateParams& p) {
  const int64_t hot = p.hot_size;
  std::fill_n(p.device_global_indices, p.num_state_rows * hot, -1);
  for (int64_t s = 0; s < p.num_state_rows; ++s) {
    std::memcpy(p.lru_slots + s * hot, p.lru_init, static_cast<size_t>(hot) * sizeof(int16_t));
  }
  if (p.counters != nullptr) std::fill_n(p.counters, p.num_counters, int64_t{0});
}

void invalidate_sorted_slots_reference(const InvalidateSortedSlotsParams& p) {
  if (p.num_slots == 0) return;
  const bool ascending = std::is_sorted(p.sorted_slots, p.sorted_slots + p.num_slots);
  const int64_t hot = p.hot_size;
  for (int64_t i = 0; i < p.num_state_indices; ++i) {
    const int64_t s = p.state_indices[i];
    if (s < 0 || s >= p.num_state_rows) continue;
    int32_t* row = p.device_global_indices + s * hot;
    for (int64_t j = 0; j < hot; ++j) {
      if (slot_listed(p.sorted_slots, p.num_slots, row[j], ascending)) row[j] = -1;
    }
  }
}

void build_residency_hint_reference(const ResidencyHintParams& p) {
  const int64_t words = (p.host_rows + 31) / 32;
  std::fill(p.hint, p.hint + words, 0u);
  for (int64_t i = 0; i < p.entries; ++i) {
    const int32_t row = p.device_global_indices[i];
    if (row >= 0 && row < p.host_rows) p.hint[row >> 5] |= 1u << (row & 31);
  }
}

}  // namespace hisparse
