// Host layout sizing (the seed's create_hisparse_layout): how many host
// blocks a budget buys, and whether one request at max_model_len fits.
#pragma once

#include <cstdint>

namespace hisparse {

struct HostLayout {
  int64_t host_num_blocks = 0;    // including the null block 0
  int64_t host_block_stride = 0;  // bytes
  int64_t min_host_blocks = 0;    // ceil(max_model_len / block_size) + 2
};

// Throws HS_ERROR_INVALID_ARGUMENT (naming the argument) for a budget that
// holds no block or too few blocks for one request at max_model_len plus the
// null block and a copy-on-write tail.
HostLayout plan_host_layout(uint64_t page_size_bytes, int64_t block_size, int64_t max_model_len,
                            uint64_t host_budget_bytes);

}  // namespace hisparse
