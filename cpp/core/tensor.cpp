#include "core/tensor.hpp"

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
  if (tensor->data == nullptr && numel() > 0) invalid_argument(name, ": data pointer is NULL");
}

int64_t TensorArg::size(int dim) const { return tensor_->shape[dim]; }

int64_t TensorArg::stride(int dim) const {
  if (tensor_->strides != nullptr) return tensor_->strides[dim];
  int64_t stride = 1;
  for (int d = tensor_->ndim - 1; d > dim; --d) stride *= tensor_->shape[d];
  return stride;
}

int64_t TensorArg::numel() const {
  int64_t n = 1;
  for (int d = 0; d < tensor_->ndim; ++d) n *= tensor_->shape[d];
  return n;
}

Device TensorArg::device() const {
  Device device;
  if (tensor_->device_type == HS_DEVICE_CUDA) {
    device.kind = Device::kCuda;
    device.index = tensor_->device_index;
  }
  return device;
}

bool TensorArg::is_contiguous() const {
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
