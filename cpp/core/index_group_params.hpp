// Raw arguments of the index-group kernels, after validation. The CPU
// reference (index_group_reference.cpp) and the CUDA kernels
// (cuda/index_group_kernels.cu) read exactly this.
#pragma once

#include <cstdint>

namespace hisparse {

// A residency hint rebuilt from an index group's state: every bit clear, then
// the bit of each host row below host_rows that an entry of
// device_global_indices holds (docs/residency.md, "Residency hint").
struct ResidencyHintParams {
  const int32_t* device_global_indices = nullptr;  // [entries]
  int64_t entries = 0;                             // S * H
  uint32_t* hint = nullptr;                        // [ceil(host_rows / 32)]
  int64_t host_rows = 0;
  int device = 0;  // CUDA device index (ignored by the CPU backend)
};

// device_global_indices = -1, every lru_slots row = lru_init, counters = 0.
struct ResetHotStateParams {
  int32_t* device_global_indices = nullptr;  // [S, H] contiguous
  int16_t* lru_slots = nullptr;              // [S, H] contiguous
  const int16_t* lru_init = nullptr;         // [H]
  int64_t num_state_rows = 0;                // S
  int32_t hot_size = 0;                      // H
  int64_t* counters = nullptr;               // [num_counters] or null
  int32_t num_counters = 0;
  int device = 0;  // CUDA device index (ignored by the CPU backend)
};

// For each listed state row, hot slots holding a listed host slot become -1.
// The list may come in any order: ascending (non-decreasing) is the fast
// path (a binary search per hot slot), any other order is scanned, so the
// result never depends on the order.
struct InvalidateSortedSlotsParams {
  int32_t* device_global_indices = nullptr;  // [S, H] contiguous
  int64_t num_state_rows = 0;                // S
  int32_t hot_size = 0;                      // H
  const int32_t* sorted_slots = nullptr;     // [num_slots], any order
  int64_t num_slots = 0;
  const int32_t* state_indices = nullptr;    // [num_state_indices]; outside [0, S) = skipped
  int64_t num_state_indices = 0;
  int device = 0;
};

// Whether `value` occurs in slots[0 .. n) (n > 0): a binary search when the
// list is non-decreasing (`ascending`), a scan otherwise. Shared by the CPU
// reference and the kernel.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline bool slot_listed(const int32_t* slots, int64_t n, int32_t value, bool ascending) {
  if (!ascending) {
    for (int64_t i = 0; i < n; ++i) {
      if (slots[i] == value) return true;
    }
    return false;
  }
  int64_t start = 0;
  int64_t end = n;
  while (start < end) {
    const int64_t mid = start + ((end - start) >> 1);
    if (slots[mid] < value) {
      start = mid + 1;
    } else {
      end = mid;
    }
  }
  return start < n && slots[start] == value;
}

}  // namespace hisparse
