#include "core/paged_view.hpp"

#include <limits>

#include "core/checked_math.hpp"
#include "core/error.hpp"

namespace hisparse {
namespace {

constexpr int64_t kRowAlignment = 16;

}  // namespace

PagedView paged_view(const TensorArg& raw, hs_dtype_t dtype, int64_t row_width, int64_t byte_offset,
                     int64_t block_stride, int64_t num_blocks, int64_t block_size) {
  raw.contiguous();
  const int64_t itemsize = static_cast<int64_t>(dtype_size(dtype));
  if (itemsize == 0) {
    fail(HS_ERROR_INVALID_DTYPE, "dtype: expected an hs_dtype_t in [0, ", static_cast<int>(HS_NUM_DTYPES), "), got ",
         static_cast<int>(dtype));
  }
  if (row_width < 1) invalid_argument("row_width: expected a positive number of elements, got ", row_width);
  if (block_size < 1) invalid_argument("block_size: expected a positive number of rows per block, got ", block_size);
  if (num_blocks < 1) invalid_argument("num_blocks: expected at least one block, got ", num_blocks);
  if (byte_offset < 0 || byte_offset % kRowAlignment != 0) {
    invalid_argument("byte_offset: expected a non-negative multiple of 16 bytes, got ", byte_offset);
  }
  const int64_t row_bytes = checked_mul(row_width, itemsize, "row_width x the dtype's size");
  const int64_t block_bytes = checked_mul(block_size, row_bytes, "block_size x row_width");
  if (block_stride < block_bytes || block_stride % row_bytes != 0) {
    invalid_argument("block_stride: expected a multiple of row_bytes (", row_bytes,
                     ") of at least block_size x row_bytes = ", block_bytes, " bytes, got ", block_stride);
  }
  const int64_t attention_block_stride = block_stride / row_bytes;
  if (attention_block_stride > std::numeric_limits<int32_t>::max()) {
    invalid_argument("block_stride: the attention block stride block_stride / row_bytes = ", attention_block_stride,
                     " rows exceeds INT32_MAX");
  }
  const int64_t slab_bytes = static_cast<int64_t>(raw.nbytes());
  const int64_t needed =
      checked_add(checked_add(byte_offset, checked_mul(num_blocks - 1, block_stride, "num_blocks x block_stride"),
                              "byte_offset + num_blocks x block_stride"),
                  block_bytes, "raw_tensor");
  if (needed > slab_bytes) {
    invalid_argument("raw_tensor: the slab is too small: the view needs byte_offset + (num_blocks - 1) x "
                     "block_stride + block_size x row_bytes = ",
                     byte_offset, " + ", num_blocks - 1, " x ", block_stride, " + ", block_bytes, " = ", needed,
                     " bytes, the slab has ", slab_bytes, " bytes (shape ", raw.shape_string(), " of ",
                     dtype_name(raw.dtype()), ")");
  }
  PagedView view;
  view.data = raw.data<char>() + byte_offset;
  if (reinterpret_cast<uintptr_t>(view.data) % kRowAlignment != 0) {
    invalid_argument("byte_offset: the slab's data pointer plus byte_offset must be 16-byte aligned");
  }
  view.shape = {num_blocks, block_size, row_width};
  view.strides = {block_stride / itemsize, row_width, 1};
  view.attention_block_stride = attention_block_stride;
  view.bytes = needed - byte_offset;
  return view;
}

}  // namespace hisparse
