// Header-only C++ layer over the hisparse C ABI: RAII handles and
// exceptions. Everything here is inline and calls only hs_* functions, so a
// C++ program built against one libhisparse keeps working with a newer one.
#ifndef HISPARSE_HISPARSE_HPP_
#define HISPARSE_HISPARSE_HPP_

#include <array>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

#include "hisparse/hisparse.h"

namespace hs {

// A failed hisparse call: the status and the library's message.
class Error : public std::runtime_error {
 public:
  Error(hs_status_t status, const std::string& message) : std::runtime_error(message), status_(status) {}
  hs_status_t status() const noexcept { return status_; }

 private:
  hs_status_t status_;
};

inline void check(hs_status_t status) {
  if (status != HS_SUCCESS) {
    const std::string message = hs_last_error();
    throw Error(status, message.empty() ? std::string(hs_status_string(status)) : message);
  }
}

inline int version() {
  int code = 0;
  check(hs_get_version(&code));
  return code;
}

// A borrowed tensor descriptor that owns its shape and strides, so it can be
// built inline: hs::Tensor(ptr, HS_DTYPE_INT32, {rows, cols}, HS_DEVICE_CUDA, 0).
class Tensor {
 public:
  Tensor(void* data, hs_dtype_t dtype, std::initializer_list<int64_t> shape,
         hs_device_type_t device_type = HS_DEVICE_CPU, int device_index = 0) {
    if (shape.size() > HS_MAX_DIMS) throw Error(HS_ERROR_INVALID_ARGUMENT, "hs::Tensor: too many dimensions");
    int d = 0;
    for (int64_t size : shape) shape_[d++] = size;
    tensor_ = hs_tensor_t{data, dtype, device_type, device_index, d, shape_.data(), nullptr};
  }
  // Sets element strides (same count as the shape).
  Tensor& strides(std::initializer_list<int64_t> strides) {
    int d = 0;
    for (int64_t stride : strides) {
      if (d < HS_MAX_DIMS) strides_[d++] = stride;
    }
    tensor_.strides = strides_.data();
    return *this;
  }
  Tensor(const Tensor& other) : shape_(other.shape_), strides_(other.strides_), tensor_(other.tensor_) { rebind(other); }
  Tensor& operator=(const Tensor& other) {
    shape_ = other.shape_;
    strides_ = other.strides_;
    tensor_ = other.tensor_;
    rebind(other);
    return *this;
  }

  const hs_tensor_t* get() const { return &tensor_; }
  operator const hs_tensor_t*() const { return &tensor_; }

 private:
  void rebind(const Tensor& other) {
    tensor_.shape = shape_.data();
    tensor_.strides = other.tensor_.strides == nullptr ? nullptr : strides_.data();
  }
  std::array<int64_t, HS_MAX_DIMS> shape_{};
  std::array<int64_t, HS_MAX_DIMS> strides_{};
  hs_tensor_t tensor_{};
};

// Pinned, populated, GPU-registered host memory; released when destroyed.
class HostPool {
 public:
  explicit HostPool(uint64_t size_bytes) {
    hs_host_pool_options_t options;
    hs_host_pool_options_init(&options);
    options.size_bytes = size_bytes;
    check(hs_host_pool_create(&options, &handle_));
  }
  explicit HostPool(const hs_host_pool_options_t& options) { check(hs_host_pool_create(&options, &handle_)); }
  ~HostPool() { hs_host_pool_destroy(handle_); }
  HostPool(HostPool&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  HostPool& operator=(HostPool&& other) noexcept {
    if (this != &other) {
      hs_host_pool_destroy(handle_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  void release() { check(hs_host_pool_release(handle_)); }
  void* data() const {
    void* pointer = nullptr;
    check(hs_host_pool_data(handle_, &pointer));
    return pointer;
  }
  hs_host_pool_info_t info() const {
    hs_host_pool_info_t info{};
    info.struct_size = sizeof(info);
    check(hs_host_pool_get_info(handle_, &info));
    return info;
  }
  hs_host_pool_t get() const { return handle_; }

 private:
  hs_host_pool_t handle_ = nullptr;
};

inline hs_host_layout_t plan_host_layout(uint64_t page_size_bytes, int64_t block_size, int64_t max_model_len,
                                         uint64_t host_budget_bytes) {
  hs_host_layout_t layout{};
  layout.struct_size = sizeof(layout);
  check(hs_plan_host_layout(page_size_bytes, block_size, max_model_len, host_budget_bytes, &layout));
  return layout;
}

inline hs_config_t default_config() {
  hs_config_t config;
  hs_config_init(&config);
  return config;
}

// Validates `config`; with device >= 0 also against that CUDA device.
inline void validate(const hs_config_t& config, int device = -1) { check(hs_config_validate(&config, device)); }

inline void resolve_residency(const hs_resolve_residency_args_t& args, hs_stream_t stream = nullptr) {
  check(hs_resolve_residency(&args, stream));
}

}  // namespace hs

#endif  // HISPARSE_HISPARSE_HPP_
