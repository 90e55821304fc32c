// swap_blocks_batch on the CPU: each (src, dst, size) triple is a memmove.
#include <cstring>

#include "cpu/data_movement_reference.hpp"

namespace hisparse {

void swap_blocks_batch_reference(const SwapBlocksParams& p) {
  for (int64_t i = 0; i < p.count; ++i) {
    if (p.sizes[i] <= 0 || p.src[i] == 0 || p.dst[i] == 0) continue;
    std::memmove(reinterpret_cast<void*>(static_cast<uintptr_t>(p.dst[i])),
                 reinterpret_cast<const void*>(static_cast<uintptr_t>(p.src[i])), static_cast<size_t>(p.sizes[i]));
  }
}

}  // namespace hisparse
