#include "core/staging_rows.hpp"

#include <cstdlib>

namespace hisparse {
namespace {

constexpr int64_t kAlignment = 16;
// Byte extents of tensors must stay far from int64 overflow, whatever
// strides a caller writes into a descriptor.
constexpr int64_t kMaxExtent = int64_t{1} << 56;

int64_t itemsize(const TensorArg& t) { return static_cast<int64_t>(dtype_size(t.dtype())); }

// `count` steps of the stride of dimension `dim`, in bytes; refused when
// they cannot be a real extent (so no offset computed from them overflows).
int64_t span(const TensorArg& t, int64_t count, int dim) {
  const int64_t stride = t.stride(dim);
  const bool bounded = stride >= -kMaxExtent && stride <= kMaxExtent;
  if (!bounded || (count > 0 && std::abs(stride) > kMaxExtent / count / itemsize(t))) {
    invalid_argument(t.name(), ": stride ", stride, " in dimension ", dim, " over ", count,
                     " steps exceeds any memory extent (shape ", t.shape_string(), ")");
  }
  return count * stride * itemsize(t);
}

int64_t last_dim_row_bytes(const TensorArg& t) {
  const int last = t.ndim() - 1;
  const int64_t bytes = t.size(last) * itemsize(t);
  if (bytes == 0 || bytes % kAlignment != 0) {
    invalid_argument(t.name(), ": expected rows of a positive multiple of 16 bytes, got ", t.size(last), " x ",
                     dtype_name(t.dtype()), " = ", bytes, " bytes (shape ", t.shape_string(), ")");
  }
  if (t.size(last) > 1 && t.stride(last) != 1) {
    invalid_argument(t.name(), ": expected a unit stride in the last (row) dimension, got ", t.stride(last));
  }
  return bytes;
}

}  // namespace

UniformRows uniform_rows(const TensorArg& t) {
  if (t.ndim() < 2) {
    invalid_argument(t.name(), ": expected rows [..., row width] with at least 2 dimensions, got shape ",
                     t.shape_string());
  }
  UniformRows rows;
  rows.row_bytes = last_dim_row_bytes(t);
  const int64_t width = t.size(t.ndim() - 1);
  rows.count = 1;
  for (int d = 0; d < t.ndim() - 1; ++d) rows.count *= t.size(d);
  // The innermost leading dimension of more than one row sets the pitch;
  // every outer one must continue it.
  int pitch_dim = -1;
  for (int d = t.ndim() - 2; d >= 0 && pitch_dim < 0; --d) {
    if (t.size(d) > 1) pitch_dim = d;
  }
  int64_t pitch = width;
  if (pitch_dim >= 0) {
    span(t, rows.count - 1, pitch_dim);  // bounds every product below
    pitch = t.stride(pitch_dim);
    if (pitch < width) {
      invalid_argument(t.name(), ": expected a row stride of at least the row width ", width, " elements, got ", pitch,
                       " (shape ", t.shape_string(), ")");
    }
    int64_t next = pitch * t.size(pitch_dim);
    for (int d = pitch_dim - 1; d >= 0; --d) {
      if (t.size(d) == 1) continue;
      if (t.stride(d) != next) {
        invalid_argument(t.name(), ": expected rows at one uniform pitch (stride ", next, " in dimension ", d,
                         "), got stride ", t.stride(d), " (shape ", t.shape_string(), ")");
      }
      next *= t.size(d);
    }
  }
  rows.pitch = pitch * itemsize(t);
  if (rows.pitch % kAlignment != 0) {
    invalid_argument(t.name(), ": expected a row pitch that is a multiple of 16 bytes, got ", rows.pitch, " bytes");
  }
  rows.base = t.data<uint8_t>();
  if (rows.count > 0) {
    t.aligned(kAlignment);
    rows.extent = (rows.count - 1) * rows.pitch + rows.row_bytes;
  }
  return rows;
}

PagedRows paged_rows(const TensorArg& t) {
  if (t.ndim() != 3) {
    invalid_argument(t.name(), ": expected a paged cache [num_blocks, block_size, row width], got shape ",
                     t.shape_string());
  }
  PagedRows rows;
  rows.row_bytes = last_dim_row_bytes(t);
  rows.blocks = t.size(0);
  rows.block_size = t.size(1);
  int64_t pitches[2] = {0, 0};
  int64_t reach = rows.row_bytes;  // bytes from the base to the end of the last row
  for (int d = 0; d < 2; ++d) {
    if (t.size(d) <= 1) continue;
    if (t.stride(d) < 0) {
      invalid_argument(t.name(), ": expected non-negative strides, got ", t.stride(d), " in dimension ", d);
    }
    reach += span(t, t.size(d) - 1, d);
    pitches[d] = t.stride(d) * itemsize(t);
    if (pitches[d] % kAlignment != 0) {
      invalid_argument(t.name(), ": expected strides of multiples of 16 bytes, got ", pitches[d],
                       " bytes in dimension ", d, " (shape ", t.shape_string(), ")");
    }
  }
  rows.block_pitch = pitches[0];
  rows.row_pitch = pitches[1];
  rows.base = t.data<uint8_t>();
  if (rows.blocks > 0 && rows.block_size > 0) {
    t.aligned(kAlignment);
    rows.extent = reach;
  }
  return rows;
}

void index_table_extent(const TensorArg& t) {
  if (t.numel() > 0) span(t, t.size(0) - 1, 0);
}

bool index_dtype(const TensorArg& t) {
  if (t.dtype() != HS_DTYPE_INT32 && t.dtype() != HS_DTYPE_INT64) {
    fail(HS_ERROR_INVALID_DTYPE, t.name(), ": expected dtype int32 or int64, got ", dtype_name(t.dtype()));
  }
  return t.dtype() == HS_DTYPE_INT64;
}

void* scratch_buffer(const TensorArg& t, uint64_t bytes, const Device& device, const char* reference,
                     Backend& backend) {
  t.dtype_is(HS_DTYPE_UINT8).ndim_is(1).contiguous().on(device, reference);
  if (t.nbytes() < bytes) {
    invalid_argument(t.name(), ": expected at least ", bytes, " bytes, got ", t.nbytes(), " (shape ", t.shape_string(),
                     ")");
  }
  t.aligned(kAlignment);
  backend.check_accessible(t.data<void>(), static_cast<size_t>(bytes), device.index, t.name());
  return t.data<void>();
}

int64_t checked_product(int64_t a, int64_t b, int64_t limit, const char* what) {
  if (a != 0 && b > limit / a) {
    invalid_argument(what, ": expected at most ", limit, ", got ", a, " x ", b);
  }
  return a * b;
}

}  // namespace hisparse
