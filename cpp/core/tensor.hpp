// Validation of borrowed hs_tensor_t descriptors. Every public entry point
// checks its tensors through TensorArg so that a bad argument fails with a
// message naming it, what was expected and what was given. Constructing one
// already refuses what no real tensor can be (a shape or strides whose byte
// extent overflows, a NULL data pointer with elements) and memory of a
// released host pool, so every byte offset computed from a TensorArg's
// shape and strides fits in 64 bits.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "hisparse/hisparse.h"

namespace hisparse {

const char* dtype_name(hs_dtype_t dtype);
size_t dtype_size(hs_dtype_t dtype);

// Where memory can be read by a kernel: host memory (plain or page-locked)
// runs the CPU backend, device memory the CUDA backend.
struct Device {
  enum Kind { kCpu, kCuda } kind = kCpu;
  int index = 0;

  bool operator==(const Device& other) const { return kind == other.kind && (kind == kCpu || index == other.index); }
  bool operator!=(const Device& other) const { return !(*this == other); }
  bool is_cuda() const { return kind == kCuda; }
  std::string describe() const;
};

// The bytes a tensor's elements occupy, within [begin, end) (empty without
// elements): all of them, or, when pitch > 0, the rows [begin + i * pitch,
// begin + i * pitch + row) that lie in it (a tensor of rows at one pitch:
// the layers of a token-major cache interleave without sharing a byte).
struct ByteRange {
  const char* name = "";
  uintptr_t begin = 0;
  uintptr_t end = 0;
  uint64_t pitch = 0;
  uint64_t row = 0;
  bool empty() const { return begin >= end; }
  // Whether the two share a byte; exact for rows of one pitch, else true
  // whenever the spans meet.
  bool overlaps(const ByteRange& other) const;
};

// Most bytes one tensor may span (64 PiB): far past any memory, far from
// overflowing the byte offsets computed from it.
constexpr int64_t kMaxTensorBytes = int64_t{1} << 56;

class TensorArg {
 public:
  // `tensor` may be NULL only for optional arguments (present() is false).
  TensorArg(const hs_tensor_t* tensor, const char* name, bool optional = false);

  bool present() const { return tensor_ != nullptr; }
  const char* name() const { return name_; }
  const hs_tensor_t& raw() const { return *tensor_; }
  hs_dtype_t dtype() const { return tensor_->dtype; }
  int ndim() const { return tensor_->ndim; }
  int64_t size(int dim) const;
  int64_t stride(int dim) const;  // in elements, derived when strides == NULL
  int64_t numel() const { return numel_; }
  uint64_t nbytes() const { return static_cast<uint64_t>(numel()) * dtype_size(dtype()); }
  // The bytes the elements occupy (whatever the order of the strides).
  ByteRange bytes() const;
  Device device() const;
  bool is_contiguous() const;
  std::string shape_string() const;

  template <typename T>
  T* data() const {
    return static_cast<T*>(tensor_->data);
  }
  // The data of a present table whose kernels tell "no table" by a null
  // pointer: a table of no elements (torch gives those a null pointer) is
  // still a table, whose every lookup misses, so it gets an address that no
  // lookup reads instead of null (128-byte aligned, so that a prefetch of
  // its zero-length rows touches no line; give such a table row stride 0).
  const int32_t* table_data() const;

  // Checks; each throws an Error naming the argument and returns *this.
  const TensorArg& dtype_is(hs_dtype_t expected) const;
  const TensorArg& ndim_is(int expected) const;
  const TensorArg& size_is(int dim, int64_t expected, const char* why = nullptr) const;
  const TensorArg& size_at_least(int dim, int64_t minimum, const char* why = nullptr) const;
  const TensorArg& contiguous() const;
  const TensorArg& unit_stride(int dim) const;     // stride(dim) == 1
  const TensorArg& row_major_2d() const;            // unit column stride, row stride >= columns
  const TensorArg& on(const Device& expected, const char* reference) const;
  const TensorArg& aligned(size_t bytes) const;

 private:
  const hs_tensor_t* tensor_;
  const char* name_;
  int64_t numel_ = 0;
  int64_t first_byte_ = 0;  // offsets from the data pointer of the lowest and past the highest element byte
  int64_t end_byte_ = 0;
};

}  // namespace hisparse
