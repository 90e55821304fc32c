#include "arguments.hpp"

#include <nanobind/stl/string.h>

#include <cmath>
#include <limits>

namespace hisparse_py {
namespace {

std::string type_of(nb::handle value) { return nb::type_name(value.type()).c_str(); }

[[noreturn]] void type_error(const char* name, const std::string& expected, nb::handle given) {
  throw nb::type_error((std::string(name) + ": expected " + expected + ", got " + type_of(given)).c_str());
}

// The value of a Python int (never the repr of another object: an array's
// repr reads its memory).
std::string text_of(PyObject* integer) {
  try {
    return nb::cast<std::string>(nb::str(nb::handle(integer)));
  } catch (const std::exception&) {
    return "an int";
  }
}

// Why `value` is no array hisparse can read, in the words of hisparse._args
// (torch's meta, sparse and other tensors without readable data get a
// reason; anything else its type).
std::string array_problem(nb::handle value) {
  try {
    return nb::cast<std::string>(nb::module_::import_("hisparse._args").attr("tensor_problem")(value));
  } catch (const nb::python_error&) {
    return type_of(value);  // hisparse._args unavailable (interpreter teardown)
  }
}

// Whether an array that exports a buffer refuses to export it writable
// (a read-only NumPy array, bytes). torch tensors and DLPack capsules have
// no buffer and are writable.
bool read_only(nb::handle value) {
  PyObject* object = value.ptr();
  if (!PyObject_CheckBuffer(object)) return false;
  Py_buffer view;
  if (PyObject_GetBuffer(object, &view, PyBUF_STRIDES | PyBUF_WRITABLE) == 0) {
    PyBuffer_Release(&view);
    return false;
  }
  PyErr_Clear();
  if (PyObject_GetBuffer(object, &view, PyBUF_STRIDES) == 0) {
    PyBuffer_Release(&view);
    return true;
  }
  PyErr_Clear();
  return false;
}

// The Python int of an argument that must be one (a new reference): ints
// and what has __index__ (NumPy integers), never bool or float.
PyObject* integer_of(const PyInt& arg, const char* name) {
  PyObject* object = arg.value.ptr();
  if (PyBool_Check(object) || !PyIndex_Check(object)) type_error(name, "an int", arg.value);
  PyObject* index = PyNumber_Index(object);
  if (index == nullptr) {
    PyErr_Clear();
    type_error(name, "an int", arg.value);
  }
  return index;
}

}  // namespace

int64_t int_arg(const PyInt& arg, const char* name) {
  PyObject* index = integer_of(arg, name);
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(index, &overflow);
  const std::string text = overflow != 0 ? text_of(index) : std::string();
  Py_DECREF(index);
  if (overflow != 0) {
    throw nb::value_error(
        (std::string(name) + ": expected an int of at most 64 bits (-2**63 to 2**63 - 1), got " + text).c_str());
  }
  if (value == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    type_error(name, "an int", arg.value);
  }
  return static_cast<int64_t>(value);
}

int32_t int32_arg(const PyInt& arg, const char* name) {
  const int64_t value = int_arg(arg, name);
  if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max()) {
    throw nb::value_error(
        (std::string(name) + ": expected an int of 32 bits (-2**31 to 2**31 - 1), got " + std::to_string(value))
            .c_str());
  }
  return static_cast<int32_t>(value);
}

uint64_t uint64_arg(const PyInt& arg, const char* name) {
  PyObject* index = integer_of(arg, name);
  const bool negative = PyObject_RichCompareBool(index, nb::int_(0).ptr(), Py_LT) == 1;
  const unsigned long long value = negative ? 0 : PyLong_AsUnsignedLongLong(index);
  const bool out_of_range = negative || (value == static_cast<unsigned long long>(-1) && PyErr_Occurred());
  PyErr_Clear();
  const std::string text = out_of_range ? text_of(index) : std::string();
  Py_DECREF(index);
  if (out_of_range) {
    throw nb::value_error((std::string(name) + ": expected an int from 0 to 2**64 - 1, got " + text).c_str());
  }
  return static_cast<uint64_t>(value);
}

bool bool_arg(const PyBool& arg, const char* name) {
  PyObject* object = arg.value.ptr();
  if (PyBool_Check(object)) return object == Py_True;
  const std::string type = type_of(arg.value);
  if (type == "numpy.bool" || type == "numpy.bool_") return PyObject_IsTrue(object) == 1;
  type_error(name, "a bool", arg.value);
}

double float_arg(const PyFloat& arg, const char* name) {
  PyObject* object = arg.value.ptr();
  if (PyBool_Check(object) || !PyNumber_Check(object) || PyComplex_Check(object)) {
    type_error(name, "a number", arg.value);
  }
  const double value = PyFloat_AsDouble(object);
  if (value == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    type_error(name, "a number", arg.value);
  }
  if (std::isnan(value)) throw nb::value_error((std::string(name) + ": expected a number, got nan").c_str());
  return value;
}

hs_stream_t stream_arg(const PyInt& arg, const char* name) {
  if (arg.value.is_none()) return nullptr;
  return reinterpret_cast<hs_stream_t>(static_cast<uintptr_t>(uint64_arg(arg, name)));
}

std::string bytes_arg(const PyBytes& arg, const char* name, size_t size) {
  PyObject* object = arg.value.ptr();
  std::string bytes;
  if (PyBytes_Check(object)) {
    bytes.assign(PyBytes_AS_STRING(object), static_cast<size_t>(PyBytes_GET_SIZE(object)));
  } else if (PyByteArray_Check(object)) {
    bytes.assign(PyByteArray_AS_STRING(object), static_cast<size_t>(PyByteArray_GET_SIZE(object)));
  } else {
    type_error(name, "bytes", arg.value);
  }
  if (bytes.size() != size) {
    throw nb::value_error(
        (std::string(name) + ": expected " + std::to_string(size) + " bytes, got " + std::to_string(bytes.size()))
            .c_str());
  }
  return bytes;
}

nb::ndarray<nb::ro> array_arg(nb::handle value, const char* name, Access access) {
  nb::ndarray<nb::ro> array;
  if (value.is_none() || !nb::try_cast(value, array, false)) {
    throw nb::type_error((std::string(name) +
                          ": expected a tensor (torch.Tensor, NumPy array or DLPack capsule), got " +
                          array_problem(value))
                             .c_str());
  }
  if (access == Access::kWrite && read_only(value)) {
    throw nb::type_error(
        (std::string(name) + ": expected a writable array (the call writes it), got a read-only " + type_of(value))
            .c_str());
  }
  return array;
}

TensorListArg::TensorListArg(const PyArrayList& arg, const char* name, Access access) {
  PyObject* object = arg.value.ptr();
  const bool listish = PyList_Check(object) || PyTuple_Check(object);
  if (!listish) type_error(name, "a list or tuple of tensors", arg.value);
  const nb::sequence items = nb::borrow<nb::sequence>(arg.value);
  const size_t count = nb::len(items);
  names_.reserve(count);
  tensors_.reserve(count);
  pointers_.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    names_.push_back(std::string(name) + "[" + std::to_string(i) + "]");
    tensors_.emplace_back(items[i], names_.back().c_str(), access);
    pointers_.push_back(tensors_.back().get());
  }
}

}  // namespace hisparse_py
