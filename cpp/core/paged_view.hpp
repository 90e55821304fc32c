// A paged view into a byte slab (the seed's PagedCacheView.bind): block b
// of [num_blocks, block_size, row_width] elements starts byte_offset +
// b * block_stride bytes into a contiguous slab. A runtime's hot cache is
// such a view; hs_paged_cache_view hands the same view of any slab to
// callers (Python's resident caches among them).
#pragma once

#include <array>
#include <cstdint>

#include "core/tensor.hpp"
#include "hisparse/hisparse.h"

namespace hisparse {

struct PagedView {
  char* data = nullptr;               // the first row of block 0
  std::array<int64_t, 3> shape{};     // [num_blocks, block_size, row_width]
  std::array<int64_t, 3> strides{};   // elements of the view's dtype
  int64_t attention_block_stride = 0; // rows between blocks: block_stride / row bytes
  int64_t bytes = 0;                  // from data to the end of the last row
};

// Checks every number against `raw`'s extent (raw contiguous, byte_offset a
// non-negative multiple of 16 that leaves the view 16-byte aligned,
// block_stride a multiple of the row bytes of at least block_size rows,
// block_stride / row bytes within INT32_MAX, the view inside the slab);
// errors name the argument.
PagedView paged_view(const TensorArg& raw, hs_dtype_t dtype, int64_t row_width, int64_t byte_offset,
                     int64_t block_stride, int64_t num_blocks, int64_t block_size);

}  // namespace hisparse
