// Header-only C++ layer over hisparse/staging.h: an RAII staging plan and
// the staging calls, throwing hs::Error. Inline, over hs_* functions only.
#ifndef HISPARSE_STAGING_HPP_
#define HISPARSE_STAGING_HPP_

#include <cstdint>
#include <utility>

#include "hisparse/hisparse.hpp"
#include "hisparse/staging.h"

namespace hs {

// A prefill staging plan that this object owns. Build it once per batch,
// optionally resolve GPU sources once per resident group, then gather once
// per layer.
class StagingPlan {
 public:
  explicit StagingPlan(const hs_staging_plan_options_t& options) { check(hs_staging_plan_create(&options, &handle_)); }
  // A plan that allocates its own memory on (device_type, device_index).
  StagingPlan(hs_device_type_t device_type, int device_index, int64_t num_rows, int64_t num_cols, int64_t block_size,
              int64_t staging_block_capacity)
      : StagingPlan(options(device_type, device_index, num_rows, num_cols, block_size, staging_block_capacity)) {}
  ~StagingPlan() { hs_staging_plan_destroy(handle_); }
  StagingPlan(StagingPlan&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  StagingPlan& operator=(StagingPlan&& other) noexcept {
    if (this != &other) {
      hs_staging_plan_destroy(handle_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  StagingPlan(const StagingPlan&) = delete;
  StagingPlan& operator=(const StagingPlan&) = delete;

  static hs_staging_plan_options_t options(hs_device_type_t device_type, int device_index, int64_t num_rows,
                                           int64_t num_cols, int64_t block_size, int64_t staging_block_capacity) {
    hs_staging_plan_options_t o;
    hs_staging_plan_options_init(&o);
    o.device_type = device_type;
    o.device_index = device_index;
    o.num_rows = num_rows;
    o.num_cols = num_cols;
    o.block_size = block_size;
    o.staging_block_capacity = staging_block_capacity;
    return o;
  }
  // Bytes of caller storage a plan of `options` needs.
  static uint64_t storage_bytes(const hs_staging_plan_options_t& options) {
    uint64_t bytes = 0;
    check(hs_staging_plan_storage_bytes(&options, &bytes));
    return bytes;
  }

  hs_staging_plan_t get() const { return handle_; }
  hs_staging_plan_info_t info() const {
    hs_staging_plan_info_t info{};
    info.struct_size = sizeof(info);
    check(hs_staging_plan_get_info(handle_, &info));
    return info;
  }
  // Borrowed descriptor, valid while the plan lives.
  hs_tensor_t tensor(hs_staging_plan_tensor_t which) const {
    hs_tensor_t out{};
    check(hs_staging_plan_get_tensor(handle_, which, &out));
    return out;
  }

  void build(const hs_tensor_t* block_table, const hs_tensor_t* seq_lens, hs_stream_t stream = nullptr) {
    check(hs_staging_plan_build(handle_, block_table, seq_lens, stream));
  }
  void ensure_gpu_sources(const hs_tensor_t* resident_state_rows, const hs_tensor_t* state_indices,
                          int64_t resident_block_size, hs_stream_t stream = nullptr) {
    check(hs_staging_plan_ensure_gpu_sources(handle_, resident_state_rows, state_indices, resident_block_size, stream));
  }
  // One layer's staged rows into `staged` (resident_cache may be null
  // when the plan has no GPU sources).
  void gather_prefill_cache(const hs_tensor_t* host_cache, const hs_tensor_t* resident_cache, const hs_tensor_t* staged,
                            hs_stream_t stream = nullptr) const {
    check(hs_gather_prefill_cache(handle_, host_cache, resident_cache, staged, stream));
  }

 private:
  hs_staging_plan_t handle_ = nullptr;
};

inline void gather_resident_rows(const hs_tensor_t* source, const hs_tensor_t* destination, const hs_tensor_t* row_ids,
                                 hs_stream_t stream = nullptr) {
  check(hs_gather_resident_rows(source, destination, row_ids, stream));
}

inline uint64_t staging_remap_workspace_bytes(hs_device_type_t device_type, int device_index, int64_t num_entries,
                                              int64_t block_size) {
  uint64_t bytes = 0;
  check(hs_staging_remap_workspace_bytes(device_type, device_index, num_entries, block_size, &bytes));
  return bytes;
}

inline void staging_remap(const hs_tensor_t* block_table, int64_t block_size, const hs_tensor_t* out_block_table,
                          const hs_tensor_t* out_row_ids, const hs_tensor_t* workspace, hs_stream_t stream = nullptr) {
  hs_staging_remap_args_t args;
  hs_staging_remap_args_init(&args);
  args.block_table = block_table;
  args.block_size = block_size;
  args.out_block_table = out_block_table;
  args.out_row_ids = out_row_ids;
  args.workspace = workspace;
  check(hs_staging_remap(&args, stream));
}

}  // namespace hs

#endif  // HISPARSE_STAGING_HPP_
