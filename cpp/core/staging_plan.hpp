// The prefill staging plan (the seed's HiSparsePrefillStagingPlan) and the
// staging entry points that need no plan. The plan owns or borrows one
// storage region that holds its five tensors and the scratch its kernels
// use, laid out once at creation, so building, resolving GPU sources and
// gathering never allocate. Contracts: hisparse/staging.h.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "core/backend.hpp"
#include "core/host_regions.hpp"
#include "core/tensor.hpp"
#include "hisparse/staging.h"

namespace hisparse {

struct StagingPlanSizes {
  Device device;
  int64_t num_rows = 0;  // B
  int64_t num_cols = 0;  // C
  int64_t block_size = 0;
  int64_t capacity = 0;  // staging_block_capacity
};

// Where each region of a plan's storage starts (bytes from its base).
struct StagingLayout {
  uint64_t block_table = 0;
  uint64_t row_ids = 0;
  uint64_t dst_rows = 0;
  uint64_t miss_mask = 0;
  uint64_t gpu_row_ids = 0;
  uint64_t block_ends = 0;
  uint64_t slot_block_ids = 0;
  uint64_t slot_entries = 0;
  uint64_t slot_compact_ids = 0;
  uint64_t first_entries = 0;
  uint64_t remap_workspace = 0;
  uint64_t remap_workspace_bytes = 0;
  uint64_t total = 0;
};

// Validates the sizes (naming the option) and lays out the storage.
StagingLayout staging_plan_layout(const StagingPlanSizes& sizes, Backend& backend);

class StagingPlan {
 public:
  static constexpr int kNumTensors = HS_STAGING_PLAN_NUM_TENSORS;

  // Validates; borrows `storage` (uint8 1-D, see hisparse/staging.h) or,
  // when it is null, allocates through `backend`.
  StagingPlan(const StagingPlanSizes& sizes, Backend& backend, const hs_tensor_t* storage);
  ~StagingPlan();
  StagingPlan(const StagingPlan&) = delete;
  StagingPlan& operator=(const StagingPlan&) = delete;

  const StagingPlanSizes& sizes() const { return sizes_; }
  int64_t num_blocks() const { return sizes_.capacity + 1; }
  int64_t num_staged_rows() const { return num_blocks() * sizes_.block_size; }
  uint64_t storage_bytes() const { return layout_.total; }
  bool owns_storage() const { return owned_ != nullptr; }
  bool built() const { return built_; }
  bool has_gpu_sources() const { return has_gpu_sources_; }
  const void* gpu_source_table() const { return gpu_source_table_; }
  int64_t gpu_source_block_size() const { return gpu_source_block_size_; }
  const hs_tensor_t& tensor(hs_staging_plan_tensor_t which) const;
  // The plan's storage (its tensors and scratch), which its calls write.
  ByteRange storage() const;
  // storage() for a call that reads or writes it: refused (HS_ERROR_INVALID_STATE
  // naming `storage`) when borrowed storage lay in a host pool that has been
  // released (or retired) since the plan was made.
  ByteRange live_storage() const;

  // Stream-ordered, capturable, no allocation: see hisparse/staging.h.
  void build(const hs_tensor_t* block_table, const hs_tensor_t* seq_lens, hs_stream_t stream);
  void ensure_gpu_sources(const hs_tensor_t* resident_state_rows, const hs_tensor_t* state_indices,
                          int64_t resident_block_size, hs_stream_t stream);
  void gather_prefill_cache(const hs_tensor_t* host_cache, const hs_tensor_t* resident_cache, const hs_tensor_t* staged,
                            hs_stream_t stream);

 private:
  template <typename T>
  T* region(uint64_t offset) const {
    return reinterpret_cast<T*>(base_ + offset);
  }
  void describe(hs_staging_plan_tensor_t which, uint64_t offset, int64_t rows, int64_t columns);
  void require_built(const char* call) const;
  StagingGpuSourcesParams gpu_sources_params() const;

  StagingPlanSizes sizes_;
  Backend& backend_;
  StagingLayout layout_;
  void* owned_ = nullptr;
  uint8_t* base_ = nullptr;
  std::shared_ptr<const HostRegion> storage_pool_;  // the host pool holding borrowed storage, if any
  std::array<hs_tensor_t, kNumTensors> tensors_{};
  std::array<std::array<int64_t, 2>, kNumTensors> shapes_{};
  bool built_ = false;
  bool has_gpu_sources_ = false;
  const void* gpu_source_table_ = nullptr;
  int64_t gpu_source_block_size_ = 0;
};

// hs_gather_resident_rows.
void gather_resident_rows(const hs_tensor_t* source, const hs_tensor_t* destination, const hs_tensor_t* row_ids,
                          hs_stream_t stream);

// hs_staging_remap_workspace_bytes and hs_staging_remap.
uint64_t staging_remap_workspace_bytes(const Device& device, int64_t num_entries, int64_t block_size);
void staging_remap(const hs_tensor_t* block_table, int64_t block_size, const hs_tensor_t* out_block_table,
                   const hs_tensor_t* out_row_ids, const hs_tensor_t* workspace, hs_stream_t stream);

}  // namespace hisparse
