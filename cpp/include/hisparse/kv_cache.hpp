// Header-only C++ layer over hisparse/kv_cache.h and
// hisparse/host_registration.h: the KV cache as an RAII object, its kernels
// and host registration, throwing hs::Error. Included by hisparse.hpp.
#ifndef HISPARSE_KV_CACHE_HPP_
#define HISPARSE_KV_CACHE_HPP_

#include <cstdint>
#include <utility>

#include "hisparse/hisparse.h"

namespace hs {

inline void write_rows(const hs_write_rows_args_t& args, hs_stream_t stream = nullptr) {
  check(hs_write_rows(&args, stream));
}
inline void read_rows(const hs_tensor_t* cache, const hs_tensor_t* indices, const hs_tensor_t* out,
                      hs_stream_t stream = nullptr) {
  check(hs_read_rows(cache, indices, out, stream));
}
inline void update_residency(const hs_update_residency_args_t& args, hs_stream_t stream = nullptr) {
  check(hs_update_residency(&args, stream));
}

// Caller-owned host memory registered with a device for its lifetime.
class HostRegistration {
 public:
  HostRegistration(void* data, uint64_t bytes, hs_device_type_t device_type = HS_DEVICE_CUDA, int device_index = -1)
      : data_(data) {
    check(hs_host_register(data, bytes, device_type, device_index));
  }
  ~HostRegistration() {
    if (data_ != nullptr) hs_host_unregister(data_);
  }
  HostRegistration(HostRegistration&& other) noexcept : data_(std::exchange(other.data_, nullptr)) {}
  HostRegistration& operator=(HostRegistration&& other) noexcept {
    if (this != &other) {
      if (data_ != nullptr) hs_host_unregister(data_);
      data_ = std::exchange(other.data_, nullptr);
    }
    return *this;
  }
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  // Unregisters now (throws on failure, and the registration stays).
  void release() {
    if (data_ != nullptr) check(hs_host_unregister(data_));
    data_ = nullptr;
  }

 private:
  void* data_ = nullptr;
};

// A model-level KV cache (hisparse/kv_cache.h) that this object owns.
class KvCache {
 public:
  explicit KvCache(const hs_kv_cache_options_t& options) { check(hs_kv_cache_create(&options, &handle_)); }
  static uint64_t host_bytes(const hs_kv_cache_options_t& options) {
    uint64_t bytes = 0;
    check(hs_kv_cache_host_bytes(&options, &bytes));
    return bytes;
  }
  ~KvCache() { hs_kv_cache_destroy(handle_); }
  KvCache(KvCache&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  KvCache& operator=(KvCache&& other) noexcept {
    if (this != &other) {
      hs_kv_cache_destroy(handle_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  hs_kv_cache_t get() const { return handle_; }
  hs_kv_cache_info_t info() const {
    hs_kv_cache_info_t info{};
    info.struct_size = sizeof(info);
    check(hs_kv_cache_get_info(handle_, &info));
    return info;
  }
  // Borrowed: valid while the cache lives.
  hs_runtime_t runtime(int32_t layer) const {
    hs_runtime_t runtime = nullptr;
    check(hs_kv_cache_get_runtime(handle_, layer, &runtime));
    return runtime;
  }
  int32_t group_of(int32_t layer) const {
    int32_t group = -1;
    check(hs_kv_cache_layer_group(handle_, layer, &group, nullptr));
    return group;
  }
  hs_tensor_t tensor(hs_kv_cache_tensor_t which) const {
    hs_tensor_t out{};
    check(hs_kv_cache_get_tensor(handle_, which, &out));
    return out;
  }
  int32_t admit(int32_t row = -1, hs_stream_t stream = nullptr) {
    int32_t admitted = -1;
    check(hs_kv_cache_admit(handle_, row, &admitted, stream));
    return admitted;
  }
  void release(int32_t row, hs_stream_t stream = nullptr) { check(hs_kv_cache_release(handle_, row, stream)); }
  void begin_forward(const hs_tensor_t* seq_lens, hs_stream_t stream = nullptr) {
    check(hs_kv_cache_begin_forward(handle_, seq_lens, stream));
  }
  void write(int32_t layer, const hs_tensor_t* rows, const hs_tensor_t* req_id_per_token, const hs_tensor_t* positions,
             hs_stream_t stream = nullptr) {
    check(hs_kv_cache_write(handle_, layer, rows, req_id_per_token, positions, stream));
  }
  hs_runtime_swap_in_result_t swap_in(int32_t layer, const hs_kv_cache_swap_in_args_t& args,
                                      hs_stream_t stream = nullptr) {
    hs_runtime_swap_in_result_t result{};
    result.struct_size = sizeof(result);
    check(hs_kv_cache_swap_in(handle_, layer, &args, &result, stream));
    return result;
  }
  void read(int32_t layer, const hs_tensor_t* indices, const hs_tensor_t* out, hs_stream_t stream = nullptr) {
    check(hs_kv_cache_read(handle_, layer, indices, out, stream));
  }
  void reset_stats(hs_stream_t stream = nullptr) { check(hs_kv_cache_reset_stats(handle_, stream)); }
  void copy_stats_async(hs_stream_t stream = nullptr) { check(hs_kv_cache_copy_stats_async(handle_, stream)); }
  // One group's counters, or the sum over all groups (group = -1).
  hs_runtime_stats_t stats(int32_t group = -1) const {
    hs_runtime_stats_t stats{};
    stats.struct_size = sizeof(stats);
    check(hs_kv_cache_get_stats(handle_, group, &stats));
    return stats;
  }

 private:
  hs_kv_cache_t handle_ = nullptr;
};

}  // namespace hs

#endif  // HISPARSE_KV_CACHE_HPP_
