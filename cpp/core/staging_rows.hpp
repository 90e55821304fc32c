// Host-side checks of the tensors the staging calls move rows between:
// each turns a borrowed descriptor into byte addresses and pitches, or
// throws naming the tensor, what was expected and what was given.
#pragma once

#include <cstdint>

#include "core/backend.hpp"
#include "core/tensor.hpp"

namespace hisparse {

// Rows of the last dimension at one uniform pitch: row i at base + i * pitch.
struct UniformRows {
  uint8_t* base = nullptr;
  int64_t count = 0;
  int64_t pitch = 0;      // bytes, a multiple of 16
  int64_t row_bytes = 0;  // a positive multiple of 16
  int64_t extent = 0;     // bytes from base to the end of the last row
};

// `t` (>= 2 dimensions) as rows: unit stride in the last dimension, the
// leading dimensions flatten to one pitch, 16-byte rows, pitch and base.
UniformRows uniform_rows(const TensorArg& t);

// A paged cache [blocks, block_size, W]: flat row r at
// base + (r / block_size) * block_pitch + (r % block_size) * row_pitch.
struct PagedRows {
  uint8_t* base = nullptr;
  int64_t blocks = 0;
  int64_t block_size = 0;
  int64_t block_pitch = 0;  // bytes
  int64_t row_pitch = 0;    // bytes
  int64_t row_bytes = 0;
  int64_t extent = 0;
};

// `t` as a 3-D paged cache with non-negative strides that are multiples of
// 16 bytes, 16-byte rows and a 16-byte aligned base.
PagedRows paged_rows(const TensorArg& t);

// Refuses a 2-D index table whose row stride reaches past any real extent.
void index_table_extent(const TensorArg& t);

// An int32 or int64 tensor of indices; returns whether it is int64.
bool index_dtype(const TensorArg& t);

// A uint8 1-D contiguous buffer on `device` of at least `bytes`, 16-byte
// aligned, reachable by the device's kernels; returns its base.
void* scratch_buffer(const TensorArg& t, uint64_t bytes, const Device& device, const char* reference, Backend& backend);

// Fails unless `a * b` (both >= 0) is at most `limit`; returns the product.
int64_t checked_product(int64_t a, int64_t b, int64_t limit, const char* what);

}  // namespace hisparse
