#include <nanobind/stl/string.h>

#include <string>

#include "bindings.hpp"

namespace hisparse_py {

void check(hs_status_t status) {
  if (status == HS_SUCCESS) return;
  std::string message = hs_last_error();
  if (message.empty()) message = hs_status_string(status);
  switch (status) {
    case HS_ERROR_INVALID_ARGUMENT: throw nb::value_error(message.c_str());
    case HS_ERROR_INVALID_DTYPE: throw nb::type_error(message.c_str());
    case HS_ERROR_OUT_OF_MEMORY: PyErr_SetString(PyExc_MemoryError, message.c_str()); throw nb::python_error();
    default: throw std::runtime_error(message);
  }
}

namespace {

hs_dtype_t to_hs_dtype(const nb::dlpack::dtype& dtype, const char* name) {
  using code = nb::dlpack::dtype_code;
  if (dtype.lanes == 1) {
    switch (static_cast<code>(dtype.code)) {
      case code::Int:
        if (dtype.bits == 8) return HS_DTYPE_INT8;
        if (dtype.bits == 16) return HS_DTYPE_INT16;
        if (dtype.bits == 32) return HS_DTYPE_INT32;
        if (dtype.bits == 64) return HS_DTYPE_INT64;
        break;
      case code::UInt:
        if (dtype.bits == 8) return HS_DTYPE_UINT8;
        break;
      case code::Float:
        if (dtype.bits == 16) return HS_DTYPE_FLOAT16;
        if (dtype.bits == 32) return HS_DTYPE_FLOAT32;
        if (dtype.bits == 64) return HS_DTYPE_FLOAT64;
        break;
      case code::Bfloat:
        if (dtype.bits == 16) return HS_DTYPE_BFLOAT16;
        break;
      case code::Bool: return HS_DTYPE_BOOL;
      default: break;
    }
  }
  throw nb::type_error((std::string(name) + ": unsupported dtype (DLPack code " + std::to_string(dtype.code) + ", " +
                        std::to_string(dtype.bits) + " bits); view the tensor as uint8 or int8")
                           .c_str());
}

nb::dlpack::dtype to_dlpack(hs_dtype_t dtype) {
  switch (dtype) {
    case HS_DTYPE_UINT8: return nb::dtype<uint8_t>();
    case HS_DTYPE_INT8: return nb::dtype<int8_t>();
    case HS_DTYPE_INT16: return nb::dtype<int16_t>();
    case HS_DTYPE_INT32: return nb::dtype<int32_t>();
    case HS_DTYPE_INT64: return nb::dtype<int64_t>();
    case HS_DTYPE_FLOAT32: return nb::dtype<float>();
    case HS_DTYPE_FLOAT64: return nb::dtype<double>();
    case HS_DTYPE_BOOL: return nb::dtype<bool>();
    default: throw std::runtime_error(std::string("hisparse: no DLPack view of a ") + hs_dtype_name(dtype) + " tensor");
  }
}

}  // namespace

nb::ndarray<nb::array_api> owned_view(const hs_tensor_t& t, nb::handle owner) {
  size_t shape[HS_MAX_DIMS];
  for (int d = 0; d < t.ndim; ++d) shape[d] = static_cast<size_t>(t.shape[d]);
  const bool cuda = t.device_type == HS_DEVICE_CUDA;
  const int device_type = cuda ? nb::device::cuda::value : nb::device::cpu::value;
  return nb::ndarray<nb::array_api>(t.data, static_cast<size_t>(t.ndim), shape, owner, nullptr, to_dlpack(t.dtype),
                                    device_type, cuda ? t.device_index : 0);
}

TensorDesc::TensorDesc(const nb::ndarray<nb::ro>& array, const char* name) {
  const size_t ndim = array.ndim();
  if (ndim > HS_MAX_DIMS) {
    throw nb::value_error((std::string(name) + ": expected at most " + std::to_string(HS_MAX_DIMS) +
                           " dimensions, got " + std::to_string(ndim))
                              .c_str());
  }
  for (size_t d = 0; d < ndim; ++d) {
    shape_[d] = static_cast<int64_t>(array.shape(d));
    strides_[d] = static_cast<int64_t>(array.stride(d));
  }
  tensor_.data = const_cast<void*>(array.data());
  tensor_.dtype = to_hs_dtype(array.dtype(), name);
  tensor_.device_type = array.device_type();
  tensor_.device_index = array.device_id();
  tensor_.ndim = static_cast<int32_t>(ndim);
  tensor_.shape = shape_.data();
  tensor_.strides = strides_.data();
}

}  // namespace hisparse_py
