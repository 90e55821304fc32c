#include "core/tensor.hpp"

#include <limits>
#include <utility>

#include "core/host_regions.hpp"

namespace hisparse {

const char* dtype_name(hs_dtype_t dtype) {
  switch (dtype) {
    case HS_DTYPE_UINT8: return "uint8";
    case HS_DTYPE_INT8: return "int8";
    case HS_DTYPE_INT16: return "int16";
    case HS_DTYPE_INT32: return "int32";
    case HS_DTYPE_INT64: return "int64";
    case HS_DTYPE_FLOAT16: return "float16";
    case HS_DTYPE_BFLOAT16: return "bfloat16";
    case HS_DTYPE_FLOAT32: return "float32";
    case HS_DTYPE_FLOAT64: return "float64";
    case HS_DTYPE_FLOAT8_E4M3: return "float8_e4m3fn";
    case HS_DTYPE_FLOAT8_E5M2: return "float8_e5m2";
    case HS_DTYPE_BOOL: return "bool";
    default: return "unknown";
  }
}

size_t dtype_size(hs_dtype_t dtype) {
  switch (dtype) {
    case HS_DTYPE_UINT8:
    case HS_DTYPE_INT8:
    case HS_DTYPE_FLOAT8_E4M3:
    case HS_DTYPE_FLOAT8_E5M2:
    case HS_DTYPE_BOOL: return 1;
    case HS_DTYPE_INT16:
    case HS_DTYPE_FLOAT16:
    case HS_DTYPE_BFLOAT16: return 2;
    case HS_DTYPE_INT32:
    case HS_DTYPE_FLOAT32: return 4;
    case HS_DTYPE_INT64:
    case HS_DTYPE_FLOAT64: return 8;
    default: return 0;
  }
}

bool ByteRange::overlaps(const ByteRange& other) const {
  if (empty() || other.empty() || begin >= other.end || other.begin >= end) return false;
  if (pitch == 0 || pitch != other.pitch) return true;
  // Rows of both repeat every `pitch` bytes: they meet where the offset of
  // one row start in the other's period falls inside a row of either.
  const uint64_t shift =
      other.begin >= begin ? (other.begin - begin) % pitch : (pitch - (begin - other.begin) % pitch) % pitch;
  return shift < row || pitch - shift < other.row;
}

std::string Device::describe() const { return kind == kCpu ? std::string("cpu") : str("cuda:", index); }

TensorArg::TensorArg(const hs_tensor_t* tensor, const char* name, bool optional) : tensor_(tensor), name_(name) {
  if (tensor == nullptr) {
    if (!optional) invalid_argument(name, ": expected a tensor, got NULL");
    return;
  }
  if (tensor->ndim < 0 || tensor->ndim > HS_MAX_DIMS) {
    invalid_argument(name, ": expected 0 to ", HS_MAX_DIMS, " dimensions, got ", tensor->ndim);
  }
  if (tensor->ndim > 0 && tensor->shape == nullptr) {
    invalid_argument(name, ": shape is NULL for a ", tensor->ndim, "-dimensional tensor");
  }
  for (int d = 0; d < tensor->ndim; ++d) {
    if (tensor->shape[d] < 0) invalid_argument(name, ": negative size ", tensor->shape[d], " in dimension ", d);
  }
  if (dtype_size(tensor->dtype) == 0) {
    fail(HS_ERROR_INVALID_DTYPE, name, ": unknown dtype code ", static_cast<int>(tensor->dtype));
  }
  if (tensor->device_type != HS_DEVICE_CPU && tensor->device_type != HS_DEVICE_CUDA &&
      tensor->device_type != HS_DEVICE_CUDA_HOST) {
    invalid_argument(name, ": unsupported device type ", tensor->device_type,
                     " (expected cpu, cuda or pinned host memory)");
  }
  // Element count and byte extent, bounded so that no offset computed from
  // the shape and strides later can overflow (overflow-checked products:
  // this runs for every tensor of every call).
  const int64_t itemsize = static_cast<int64_t>(dtype_size(tensor->dtype));
  numel_ = 1;
  for (int d = 0; d < tensor->ndim; ++d) {
    if (tensor->shape[d] == 0) numel_ = 0;
  }
  int64_t bytes = 0;
  for (int d = 0; numel_ > 0 && d < tensor->ndim; ++d) {
    if (__builtin_mul_overflow(numel_, tensor->shape[d], &numel_) || __builtin_mul_overflow(numel_, itemsize, &bytes) ||
        bytes > kMaxTensorBytes) {
      invalid_argument(name, ": shape ", shape_string(), " of ", dtype_name(tensor->dtype), " holds more than ",
                       kMaxTensorBytes, " bytes, more than any memory");
    }
  }
  if (numel_ == 0) return;
  int64_t low = 0;
  int64_t high = 0;  // element offsets of the lowest and the highest element
  for (int d = 0; d < tensor->ndim; ++d) {
    const int64_t size = tensor->shape[d];
    const int64_t step = stride(d);
    if (size == 1 || step == 0) continue;
    // Each dimension's reach within +-2^56 and the span so far within 2^56:
    // no sum below overflows.
    int64_t reach = 0;
    const bool bounded =
        !__builtin_mul_overflow(size - 1, step, &reach) && reach >= -kMaxTensorBytes && reach <= kMaxTensorBytes;
    if (bounded) (step < 0 ? low : high) += reach;
    if (!bounded || high - low > kMaxTensorBytes) {
      invalid_argument(name, ": stride ", step, " in dimension ", d, " over ", size - 1,
                       " steps exceeds any memory extent (shape ", shape_string(), ")");
    }
  }
  int64_t span = 0;
  if (__builtin_mul_overflow(high - low + 1, itemsize, &span) || span > kMaxTensorBytes) {
    invalid_argument(name, ": the strides of shape ", shape_string(), " exceed any memory extent (more than ",
                     kMaxTensorBytes, " bytes)");
  }
  first_byte_ = low * itemsize;
  end_byte_ = (high + 1) * itemsize;
  if (tensor->data == nullptr) invalid_argument(name, ": data pointer is NULL");
  const uintptr_t base = reinterpret_cast<uintptr_t>(tensor->data);
  if (base < static_cast<uintptr_t>(-first_byte_) ||
      base > std::numeric_limits<uintptr_t>::max() - static_cast<uintptr_t>(end_byte_)) {
    invalid_argument(name, ": data pointer and strides address memory outside the address space");
  }
  check_not_in_released_host_pool(base + static_cast<uintptr_t>(first_byte_), base + static_cast<uintptr_t>(end_byte_),
                                  name);
}

ByteRange TensorArg::bytes() const {
  ByteRange range;
  range.name = name_;
  if (tensor_ == nullptr || numel_ == 0) return range;
  const uintptr_t base = reinterpret_cast<uintptr_t>(tensor_->data);
  range.begin = base + static_cast<uintptr_t>(first_byte_);
  range.end = base + static_cast<uintptr_t>(end_byte_);
  // The dimensions of more than one element, outermost (largest stride)
  // first, merged where one continues the next: a contiguous run, or rows
  // of `row` bytes at one pitch, is described exactly; anything else by
  // its whole span.
  struct Dim {
    int64_t size, stride;
  };
  Dim dims[HS_MAX_DIMS];
  int n = 0;
  for (int d = 0; d < tensor_->ndim; ++d) {
    if (size(d) == 1) continue;
    if (stride(d) <= 0) return range;
    dims[n++] = Dim{size(d), stride(d)};
  }
  for (int i = 1; i < n; ++i) {  // at most HS_MAX_DIMS: an insertion sort
    for (int j = i; j > 0 && dims[j - 1].stride < dims[j].stride; --j) std::swap(dims[j - 1], dims[j]);
  }
  Dim groups[HS_MAX_DIMS];  // innermost first
  int merged = 0;
  for (int i = n - 1; i >= 0; --i) {
    if (merged > 0 && dims[i].stride == groups[merged - 1].stride * groups[merged - 1].size) {
      groups[merged - 1].size *= dims[i].size;
    } else {
      groups[merged++] = dims[i];
    }
  }
  const int64_t itemsize = static_cast<int64_t>(dtype_size(dtype()));
  if (merged == 2 && groups[0].stride == 1) {
    range.pitch = static_cast<uint64_t>(groups[1].stride * itemsize);
    range.row = static_cast<uint64_t>(groups[0].size * itemsize);
  } else if (merged == 1 && groups[0].stride != 1) {
    range.pitch = static_cast<uint64_t>(groups[0].stride * itemsize);
    range.row = static_cast<uint64_t>(itemsize);
  }
  if (range.row > range.pitch) range.pitch = range.row = 0;
  return range;
}

int64_t TensorArg::size(int dim) const { return tensor_->shape[dim]; }

int64_t TensorArg::stride(int dim) const {
  if (tensor_->strides != nullptr) return tensor_->strides[dim];
  int64_t stride = 1;
  for (int d = tensor_->ndim - 1; d > dim; --d) stride *= tensor_->shape[d];
  return stride;
}

Device TensorArg::device() const {
  Device device;
  if (tensor_->device_type == HS_DEVICE_CUDA) {
    device.kind = Device::kCuda;
    device.index = tensor_->device_index;
  }
  return device;
}

const int32_t* TensorArg::table_data() const {
  alignas(128) static const int32_t kNoEntries[32] = {};
  return tensor_->data != nullptr ? static_cast<const int32_t*>(tensor_->data) : kNoEntries;
}

bool TensorArg::is_contiguous() const {
  if (numel_ == 0) return true;  // no element to place (NumPy gives empty arrays zero strides)
  int64_t expected = 1;
  for (int d = tensor_->ndim - 1; d >= 0; --d) {
    if (tensor_->shape[d] != 1 && stride(d) != expected) return false;
    expected *= tensor_->shape[d];
  }
  return true;
}

std::string TensorArg::shape_string() const {
  std::string text = "[";
  for (int d = 0; d < tensor_->ndim; ++d) {
    if (d > 0) text += ", ";
    text += std::to_string(tensor_->shape[d]);
  }
  return text + "]";
}

const TensorArg& TensorArg::dtype_is(hs_dtype_t expected) const {
  if (tensor_->dtype != expected) {
    fail(HS_ERROR_INVALID_DTYPE, name_, ": expected dtype ", dtype_name(expected), ", got ",
         dtype_name(tensor_->dtype));
  }
  return *this;
}

const TensorArg& TensorArg::ndim_is(int expected) const {
  if (tensor_->ndim != expected) {
    invalid_argument(name_, ": expected ", expected, " dimension", expected == 1 ? "" : "s", ", got ", tensor_->ndim,
                     " (shape ", shape_string(), ")");
  }
  return *this;
}

const TensorArg& TensorArg::size_is(int dim, int64_t expected, const char* why) const {
  if (size(dim) != expected) {
    invalid_argument(name_, ": expected size ", expected, " in dimension ", dim,
                     why ? str(" (", why, ")") : std::string(), ", got shape ", shape_string());
  }
  return *this;
}

const TensorArg& TensorArg::size_at_least(int dim, int64_t minimum, const char* why) const {
  if (size(dim) < minimum) {
    invalid_argument(name_, ": expected at least ", minimum, " in dimension ", dim,
                     why ? str(" (", why, ")") : std::string(), ", got shape ", shape_string());
  }
  return *this;
}

const TensorArg& TensorArg::contiguous() const {
  if (!is_contiguous()) invalid_argument(name_, ": expected a contiguous tensor (shape ", shape_string(), ")");
  return *this;
}

const TensorArg& TensorArg::unit_stride(int dim) const {
  // An empty tensor has no memory layout to check (NumPy gives it zero strides).
  if (numel() > 0 && size(dim) > 1 && stride(dim) != 1) {
    invalid_argument(name_, ": expected stride 1 in dimension ", dim, ", got ", stride(dim));
  }
  return *this;
}

const TensorArg& TensorArg::row_major_2d() const {
  ndim_is(2);
  unit_stride(1);
  if (numel() == 0) return *this;
  if (size(0) > 1 && stride(0) < size(1)) {
    invalid_argument(name_, ": expected a row stride of at least ", size(1), " elements, got ", stride(0));
  }
  if (size(0) > 1 && stride(0) <= 0) invalid_argument(name_, ": expected a positive row stride, got ", stride(0));
  return *this;
}

const TensorArg& TensorArg::on(const Device& expected, const char* reference) const {
  if (device() != expected) {
    invalid_argument(name_, ": expected a tensor on ", expected.describe(), " (the device of ", reference,
                     "), got one on ", device().describe());
  }
  return *this;
}

const TensorArg& TensorArg::aligned(size_t bytes) const {
  if (reinterpret_cast<uintptr_t>(tensor_->data) % bytes != 0) {
    invalid_argument(name_, ": expected a data pointer aligned to ", bytes, " bytes");
  }
  return *this;
}

}  // namespace hisparse
