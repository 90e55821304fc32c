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
  Tensor(const Tensor& other) : shape_(other.shape_), strides_(other.strides_), tensor_(other.tensor_) {
    rebind(other);
  }
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
  // Takes ownership of a pool made by another call (hs_shared_host_pool_create).
  explicit HostPool(hs_host_pool_t adopted) noexcept : handle_(adopted) {}
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

// ------------------------------------------------------------------ index group and runtime

// An index group (hisparse/index_group.h) that this object owns.
class IndexGroup {
 public:
  explicit IndexGroup(const hs_index_group_options_t& options) { check(hs_index_group_create(&options, &handle_)); }
  ~IndexGroup() { hs_index_group_destroy(handle_); }
  IndexGroup(IndexGroup&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  IndexGroup& operator=(IndexGroup&& other) noexcept {
    if (this != &other) {
      hs_index_group_destroy(handle_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  IndexGroup(const IndexGroup&) = delete;
  IndexGroup& operator=(const IndexGroup&) = delete;

  hs_index_group_t get() const { return handle_; }
  hs_index_group_info_t info() const {
    hs_index_group_info_t info{};
    info.struct_size = sizeof(info);
    check(hs_index_group_get_info(handle_, &info));
    return info;
  }
  // Borrowed descriptor, valid while the group lives.
  hs_tensor_t tensor(hs_index_group_tensor_t which) const {
    hs_tensor_t out{};
    check(hs_index_group_get_tensor(handle_, which, &out));
    return out;
  }
  void reset(hs_stream_t stream = nullptr) { check(hs_index_group_reset(handle_, stream)); }
  void invalidate_sorted_slots(const hs_tensor_t* sorted_slots, const hs_tensor_t* state_indices,
                               hs_stream_t stream = nullptr) {
    check(hs_index_group_invalidate_sorted_slots(handle_, sorted_slots, state_indices, stream));
  }
  void resolve(const hs_index_group_resolve_args_t& args, hs_stream_t stream = nullptr) {
    check(hs_index_group_resolve(handle_, &args, stream));
  }
  void copy_stats_async(hs_stream_t stream = nullptr) { check(hs_index_group_copy_stats_async(handle_, stream)); }
  std::array<int64_t, HS_NUM_STATS> read_stats() const {
    std::array<int64_t, HS_NUM_STATS> values{};
    check(hs_index_group_read_stats(handle_, values.data(), HS_NUM_STATS));
    return values;
  }

 private:
  hs_index_group_t handle_ = nullptr;
};

// A per-layer runtime (hisparse/runtime.h) that this object owns. Create the
// group leader from options, then followers with Runtime::follower.
class Runtime {
 public:
  explicit Runtime(const hs_runtime_options_t& options) { check(hs_runtime_create(&options, &handle_)); }
  // A follower of `leader`'s index group; options.leader is set here.
  static Runtime follower(const Runtime& leader, hs_runtime_options_t options) {
    options.leader = leader.get();
    return Runtime(options);
  }
  // Whether a leader created with HS_RESIDENCY_HINT_AUTO (the default) keeps
  // a residency hint for these options (hs_runtime_default_residency_hint).
  static bool default_residency_hint(const hs_runtime_options_t& options) {
    int32_t keeps = 0;
    check(hs_runtime_default_residency_hint(options.config, options.max_num_reqs, options.device_type,
                                            options.device_index, &keeps));
    return keeps != 0;
  }
  ~Runtime() { hs_runtime_destroy(handle_); }
  Runtime(Runtime&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Runtime& operator=(Runtime&& other) noexcept {
    if (this != &other) {
      hs_runtime_destroy(handle_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  hs_runtime_t get() const { return handle_; }
  // Borrowed: valid while any runtime of the group lives; never destroy it.
  hs_index_group_t index_group() const {
    hs_index_group_t group = nullptr;
    check(hs_runtime_get_index_group(handle_, &group));
    return group;
  }
  // A shared tensor of the group (attention indices, valid counts, ...).
  hs_tensor_t group_tensor(hs_index_group_tensor_t which) const {
    hs_tensor_t out{};
    check(hs_index_group_get_tensor(index_group(), which, &out));
    return out;
  }
  hs_runtime_info_t info() const {
    hs_runtime_info_t info{};
    info.struct_size = sizeof(info);
    check(hs_runtime_get_info(handle_, &info));
    return info;
  }

  void bind_source_cache(const hs_tensor_t* host_cache, const hs_tensor_t* registered_host_pool = nullptr) {
    check(hs_runtime_bind_source_cache(handle_, host_cache, registered_host_pool));
  }
  void bind_hot_cache(const hs_tensor_t* raw_tensor, int64_t byte_offset, int64_t block_stride, int64_t num_blocks,
                      int64_t block_size, const hs_tensor_t* block_table) {
    hs_hot_cache_binding_t binding;
    hs_hot_cache_binding_init(&binding);
    binding.raw_tensor = raw_tensor;
    binding.byte_offset = byte_offset;
    binding.block_stride = block_stride;
    binding.num_blocks = num_blocks;
    binding.block_size = block_size;
    binding.block_table = block_table;
    check(hs_runtime_bind_hot_cache(handle_, &binding));
  }
  void unbind() { check(hs_runtime_unbind(handle_)); }
  hs_tensor_t host_cache() const {
    hs_tensor_t out{};
    check(hs_runtime_get_host_cache(handle_, &out));
    return out;
  }
  hs_tensor_t hot_cache() const {
    hs_tensor_t out{};
    check(hs_runtime_get_hot_cache(handle_, &out));
    return out;
  }

  void begin_forward() { check(hs_runtime_begin_forward(handle_)); }
  hs_runtime_swap_in_result_t swap_in(const hs_runtime_swap_in_args_t& args, hs_stream_t stream = nullptr) {
    hs_runtime_swap_in_result_t result{};
    result.struct_size = sizeof(result);
    check(hs_runtime_swap_in(handle_, &args, &result, stream));
    return result;
  }
  void reset_hot_state(hs_stream_t stream = nullptr) { check(hs_runtime_reset_hot_state(handle_, stream)); }
  void rebuild_residency_hint(hs_stream_t stream = nullptr) {
    check(hs_runtime_rebuild_residency_hint(handle_, stream));
  }
  void invalidate_sorted_slots(const hs_tensor_t* sorted_slots, const hs_tensor_t* state_indices,
                               hs_stream_t stream = nullptr) {
    check(hs_runtime_invalidate_sorted_slots(handle_, sorted_slots, state_indices, stream));
  }
  void mirror_rows(const hs_tensor_t* src_rows, const hs_tensor_t* slot_mapping, hs_stream_t stream = nullptr) {
    check(hs_runtime_mirror_rows(handle_, src_rows, slot_mapping, stream));
  }
  void copy_stats_async(hs_stream_t stream = nullptr) { check(hs_runtime_copy_stats_async(handle_, stream)); }
  void reset_stats(hs_stream_t stream = nullptr) { check(hs_runtime_reset_stats(handle_, stream)); }
  void reset_request(int32_t state_row, hs_stream_t stream = nullptr) {
    check(hs_runtime_reset_request(handle_, state_row, stream));
  }
  void write(const hs_runtime_write_args_t& args, hs_stream_t stream = nullptr) {
    check(hs_runtime_write(handle_, &args, stream));
  }
  void set_host_sharing(hs_host_role_t role, hs_ipc_event_t event = nullptr) {
    hs_runtime_host_sharing_t sharing;
    hs_runtime_host_sharing_init(&sharing);
    sharing.role = role;
    sharing.event = event;
    check(hs_runtime_set_host_sharing(handle_, &sharing));
  }
  // The counters as the last completed copy_stats_async left them.
  hs_runtime_stats_t stats() const {
    hs_runtime_stats_t stats{};
    stats.struct_size = sizeof(stats);
    check(hs_runtime_get_stats(handle_, &stats));
    return stats;
  }

 private:
  hs_runtime_t handle_ = nullptr;
};

// The paged view of a slab that Runtime::bind_hot_cache would bind
// (hs_paged_cache_view), e.g. for a layer's resident cache.
inline hs_paged_view_t paged_cache_view(const hs_tensor_t* raw_tensor, hs_dtype_t dtype, int64_t row_width,
                                        int64_t byte_offset, int64_t block_stride, int64_t num_blocks,
                                        int64_t block_size) {
  hs_paged_view_t view{};
  view.struct_size = sizeof(view);
  check(hs_paged_cache_view(raw_tensor, dtype, row_width, byte_offset, block_stride, num_blocks, block_size, &view));
  return view;
}

// Drops hot copies of rewritten host slots in many index groups at once.
class SlotInvalidator {
 public:
  explicit SlotInvalidator(hs_device_type_t device_type = HS_DEVICE_CPU, int device_index = -1) {
    check(hs_slot_invalidator_create(device_type, device_index, &handle_));
  }
  ~SlotInvalidator() { hs_slot_invalidator_destroy(handle_); }
  SlotInvalidator(SlotInvalidator&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  SlotInvalidator& operator=(SlotInvalidator&& other) noexcept {
    if (this != &other) {
      hs_slot_invalidator_destroy(handle_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  SlotInvalidator(const SlotInvalidator&) = delete;
  SlotInvalidator& operator=(const SlotInvalidator&) = delete;

  hs_slot_invalidator_t get() const { return handle_; }
  void operator()(const hs_runtime_t* runtimes, int32_t num_runtimes, const hs_tensor_t* request_state_indices,
                  const hs_tensor_t* req_id_per_token, const hs_tensor_t* written_slots, hs_stream_t stream = nullptr) {
    check(hs_slot_invalidator_run(handle_, runtimes, num_runtimes, request_state_indices, req_id_per_token,
                                  written_slots, stream));
  }

 private:
  hs_slot_invalidator_t handle_ = nullptr;
};

}  // namespace hs

#include "hisparse/kv_cache.hpp"  // the model-level KV cache (RAII), its kernels and host registration
#include "hisparse/shared_host_pool.hpp"
#include "hisparse/staging.hpp"  // the prefill staging plan (RAII) and staging calls

#endif  // HISPARSE_HISPARSE_HPP_
