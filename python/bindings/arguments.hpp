// The arguments of every binding of hisparse._C. nanobind's own conversion
// refuses a wrong value with a dump of the signature that names no argument,
// so each binding takes its arguments as they come (the casters below
// accept any object, None included, and only name the Python type for the
// generated stub) and converts them here, where every error names the
// argument, what was expected and what was given:
//   int_arg / int32_arg / uint64_arg   a Python int (bool and float refused)
//   bool_arg, float_arg, stream_arg, bytes_arg
//   TensorArg / OptionalTensorArg / TensorListArg
//                                      an array (torch tensor, NumPy array or
//                                      DLPack capsule) as an hs_tensor_t that
//                                      is valid while the argument lives;
//                                      read-only arrays only where the call
//                                      only reads them.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "hisparse/hisparse.h"

namespace hisparse_py {

namespace nb = nanobind;

// An argument as Python gave it; `Kind` only names its type in the stub.
template <typename Kind>
struct PyArg {
  nb::handle value;
};
struct IntKind {};
struct BoolKind {};
struct FloatKind {};
struct BytesKind {};
struct ArrayKind {};
struct OptionalArrayKind {};
struct ArrayListKind {};
using PyInt = PyArg<IntKind>;
using PyBool = PyArg<BoolKind>;
using PyFloat = PyArg<FloatKind>;
using PyBytes = PyArg<BytesKind>;
using PyArray = PyArg<ArrayKind>;
using PyOptionalArray = PyArg<OptionalArrayKind>;
using PyArrayList = PyArg<ArrayListKind>;

int64_t int_arg(const PyInt& value, const char* name);
int32_t int32_arg(const PyInt& value, const char* name);
uint64_t uint64_arg(const PyInt& value, const char* name);
bool bool_arg(const PyBool& value, const char* name);
double float_arg(const PyFloat& value, const char* name);
// A stream handle: None or 0 (the default stream), or an int handle.
hs_stream_t stream_arg(const PyInt& value, const char* name = "stream");
// Exactly `size` bytes (bytes or bytearray).
std::string bytes_arg(const PyBytes& value, const char* name, size_t size);

// Whether a call writes an array argument (outputs, updated state) or only
// reads it.
enum class Access { kRead, kWrite };

// A descriptor of a DLPack array, valid while the array is alive.
class TensorDesc {
 public:
  TensorDesc(const nb::ndarray<nb::ro>& array, const char* name);
  const hs_tensor_t* get() const { return &tensor_; }

 private:
  std::array<int64_t, HS_MAX_DIMS> shape_{};
  std::array<int64_t, HS_MAX_DIMS> strides_{};
  hs_tensor_t tensor_{};
};

// The array of `value` (named in errors), imported once.
nb::ndarray<nb::ro> array_arg(nb::handle value, const char* name, Access access);

class TensorArg {
 public:
  TensorArg(const PyArray& value, const char* name, Access access) : TensorArg(value.value, name, access) {}
  TensorArg(nb::handle value, const char* name, Access access)
      : array_(array_arg(value, name, access)), desc_(array_, name) {}
  const hs_tensor_t* get() const { return desc_.get(); }

 private:
  nb::ndarray<nb::ro> array_;
  TensorDesc desc_;
};

// Absent (nullptr) for None.
class OptionalTensorArg {
 public:
  OptionalTensorArg(const PyOptionalArray& value, const char* name, Access access) {
    if (!value.value.is_none()) tensor_.emplace(value.value, name, access);
  }
  const hs_tensor_t* get() const { return tensor_ ? tensor_->get() : nullptr; }

 private:
  std::optional<TensorArg> tensor_;
};

// A sequence of arrays, element i named `<name>[i]`, with the pointer array
// the C ABI takes.
class TensorListArg {
 public:
  TensorListArg(const PyArrayList& value, const char* name, Access access);
  const hs_tensor_t* const* data() const { return pointers_.data(); }
  int32_t size() const { return static_cast<int32_t>(pointers_.size()); }

 private:
  std::vector<std::string> names_;
  std::vector<TensorArg> tensors_;
  std::vector<const hs_tensor_t*> pointers_;
};

// The object behind a binding's class argument (a hisparse._C.Runtime, ...)
// or a TypeError naming the argument; null for None when `optional`.
template <typename T>
T* object_arg(nb::handle value, const char* name, const char* expected, bool optional = false) {
  if (optional && value.is_none()) return nullptr;
  T* object = nullptr;
  if (!value.is_none() && nb::try_cast<T*>(value, object, false) && object != nullptr) return object;
  throw nb::type_error((std::string(name) + ": expected " + expected + (optional ? " or None" : "") + ", got " +
                        nb::type_name(value.type()).c_str())
                           .c_str());
}

}  // namespace hisparse_py

namespace nanobind::detail {

template <typename Kind>
constexpr auto py_arg_name() {
  if constexpr (std::is_same_v<Kind, hisparse_py::IntKind>) return const_name("int");
  if constexpr (std::is_same_v<Kind, hisparse_py::BoolKind>) return const_name("bool");
  if constexpr (std::is_same_v<Kind, hisparse_py::FloatKind>) return const_name("float");
  if constexpr (std::is_same_v<Kind, hisparse_py::BytesKind>) return const_name("bytes");
  if constexpr (std::is_same_v<Kind, hisparse_py::ArrayKind>) return const_name("object");
  if constexpr (std::is_same_v<Kind, hisparse_py::OptionalArrayKind>) return const_name("object | None");
  if constexpr (std::is_same_v<Kind, hisparse_py::ArrayListKind>) return const_name("Sequence[object]");
}

template <typename Kind>
struct type_caster<hisparse_py::PyArg<Kind>> {
  NB_TYPE_CASTER(hisparse_py::PyArg<Kind>, py_arg_name<Kind>())
  bool from_python(handle src, uint32_t, cleanup_list*) noexcept {
    value.value = src;
    return true;
  }
  static handle from_cpp(const hisparse_py::PyArg<Kind>& arg, rv_policy, cleanup_list*) noexcept {
    return arg.value.inc_ref();
  }
};

// None reaches the binding, which names the argument when it refuses it.
template <typename Kind>
struct has_arg_defaults<hisparse_py::PyArg<Kind>> : std::true_type {};

}  // namespace nanobind::detail
