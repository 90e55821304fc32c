#include "core/staging_plan.hpp"

#include "core/aliasing.hpp"
#include "core/staging_rows.hpp"

namespace hisparse {
namespace {

constexpr uint64_t kRegionAlignment = 256;

uint64_t align_up(uint64_t bytes) { return (bytes + kRegionAlignment - 1) / kRegionAlignment * kRegionAlignment; }

// Next region of `bytes` at the end of the layout so far; returns its offset.
uint64_t take(uint64_t* end, uint64_t bytes) {
  const uint64_t offset = *end;
  *end = align_up(offset + bytes);
  return offset;
}

void check_count(int64_t value, const char* name, const char* what) {
  if (value < 0 || value > kStagingInt32Max) {
    invalid_argument(name, ": expected 0 to ", kStagingInt32Max, " ", what, ", got ", value);
  }
}

}  // namespace

StagingLayout staging_plan_layout(const StagingPlanSizes& s, Backend& backend) {
  check_count(s.num_rows, "num_rows", "block-table rows");
  check_count(s.num_cols, "num_cols", "block-table columns");
  if (s.block_size < 1 || s.block_size > kStagingInt32Max) {
    invalid_argument("block_size: expected 1 to ", kStagingInt32Max, " tokens per block, got ", s.block_size);
  }
  check_count(s.capacity, "staging_block_capacity", "blocks");
  checked_product(s.num_rows, s.num_cols, kStagingInt32Max, "num_rows x num_cols (block-table entries)");
  // Staged rows are numbered in int32 (row_ids, dst_rows): all N of them must fit.
  const int64_t num_blocks = s.capacity + 1;
  if (num_blocks > kStagingInt32Max / s.block_size) {
    invalid_argument("staging_block_capacity: expected (staging_block_capacity + 1) x block_size <= ", kStagingInt32Max,
                     " staged rows (int32 row ids), got (", s.capacity, " + 1) x ", s.block_size);
  }
  const uint64_t rows = static_cast<uint64_t>(num_blocks * s.block_size);
  const uint64_t int32_bytes = sizeof(int32_t);
  StagingLayout layout;
  uint64_t end = 0;
  layout.block_table = take(&end, static_cast<uint64_t>(s.num_rows * s.num_cols) * int32_bytes);
  layout.row_ids = take(&end, rows * int32_bytes);
  layout.dst_rows = take(&end, rows * int32_bytes);
  layout.miss_mask = take(&end, rows * int32_bytes);
  layout.gpu_row_ids = take(&end, rows * int32_bytes);
  layout.block_ends = take(&end, static_cast<uint64_t>(s.num_rows) * sizeof(int64_t));
  layout.slot_block_ids = take(&end, static_cast<uint64_t>(s.capacity) * int32_bytes);
  layout.slot_entries = take(&end, static_cast<uint64_t>(s.capacity) * int32_bytes);
  layout.slot_compact_ids = take(&end, static_cast<uint64_t>(s.capacity) * int32_bytes);
  layout.first_entries = take(&end, static_cast<uint64_t>(num_blocks) * int32_bytes);
  layout.remap_workspace_bytes = backend.staging_remap_workspace_bytes(s.capacity, s.device.index);
  layout.remap_workspace = take(&end, layout.remap_workspace_bytes);
  layout.total = end;
  return layout;
}

StagingPlan::StagingPlan(const StagingPlanSizes& sizes, Backend& backend, const hs_tensor_t* storage)
    : sizes_(sizes), backend_(backend), layout_(staging_plan_layout(sizes, backend)) {
  const TensorArg given(storage, "storage", true);
  if (given.present()) {
    base_ = static_cast<uint8_t*>(scratch_buffer(given, layout_.total, sizes_.device, "the plan", backend_));
    storage_pool_ = host_region_holding(base_, layout_.total);
  } else {
    owned_ = backend_.allocate(static_cast<size_t>(layout_.total), sizes_.device.index);
    base_ = static_cast<uint8_t*>(owned_);
  }
  const int64_t rows = num_staged_rows();
  describe(HS_STAGING_PLAN_BLOCK_TABLE, layout_.block_table, sizes_.num_rows, sizes_.num_cols);
  describe(HS_STAGING_PLAN_ROW_IDS, layout_.row_ids, 1, rows);
  describe(HS_STAGING_PLAN_DST_ROWS, layout_.dst_rows, 1, rows);
  describe(HS_STAGING_PLAN_MISS_MASK, layout_.miss_mask, 1, rows);
  describe(HS_STAGING_PLAN_GPU_ROW_IDS, layout_.gpu_row_ids, 1, rows);
}

StagingPlan::~StagingPlan() {
  if (owned_ != nullptr) backend_.deallocate(owned_, sizes_.device.index);
}

void StagingPlan::describe(hs_staging_plan_tensor_t which, uint64_t offset, int64_t rows, int64_t columns) {
  shapes_[which] = {rows, columns};
  hs_tensor_t& t = tensors_[which];
  t.data = base_ + offset;
  t.dtype = HS_DTYPE_INT32;
  t.device_type = sizes_.device.is_cuda() ? HS_DEVICE_CUDA : HS_DEVICE_CPU;
  t.device_index = sizes_.device.is_cuda() ? sizes_.device.index : 0;
  t.ndim = 2;
  t.shape = shapes_[which].data();
  t.strides = nullptr;
}

const hs_tensor_t& StagingPlan::tensor(hs_staging_plan_tensor_t which) const {
  if (which < 0 || which >= kNumTensors) {
    invalid_argument("which: expected 0 <= which < HS_STAGING_PLAN_NUM_TENSORS (", kNumTensors, "), got ",
                     static_cast<int>(which));
  }
  return tensors_[which];
}

ByteRange StagingPlan::storage() const {
  const auto begin = reinterpret_cast<uintptr_t>(base_);
  return ByteRange{"the plan's storage (its tensors and scratch)", begin, begin + layout_.total};
}

ByteRange StagingPlan::live_storage() const {
  if (storage_pool_ != nullptr && storage_pool_->released()) {
    fail(HS_ERROR_INVALID_STATE, "storage: the plan's storage lies in a host pool that was released; make a new "
                                 "plan with live storage");
  }
  return storage();
}

void StagingPlan::require_built(const char* call) const {
  if (!built_) fail(HS_ERROR_INVALID_STATE, "plan: ", call, " needs a built plan; call hs_staging_plan_build first");
}

void StagingPlan::build(const hs_tensor_t* block_table_t, const hs_tensor_t* seq_lens_t, hs_stream_t stream) {
  const Device& device = sizes_.device;
  const TensorArg table(block_table_t, "block_table");
  const bool table_int64 = index_dtype(table);
  table.row_major_2d().on(device, "the plan");
  index_table_extent(table);
  table.size_is(0, sizes_.num_rows, "the plan's num_rows");
  table.size_is(1, sizes_.num_cols, "the plan's num_cols");
  const TensorArg lens(seq_lens_t, "seq_lens");
  const bool lens_int64 = index_dtype(lens);
  lens.ndim_is(1).unit_stride(0).on(device, "block_table");
  lens.size_at_least(0, sizes_.num_rows, "one length per block_table row");
  AliasCheck().reads(table).reads(lens).writes(live_storage()).check();

  StagingBuildParams p;
  p.device = device.index;
  p.block_table = table.data<void>();
  p.block_table_int64 = table_int64;
  p.block_table_row_stride = sizes_.num_rows > 1 ? table.stride(0) : sizes_.num_cols;
  p.seq_lens = lens.data<void>();
  p.seq_lens_int64 = lens_int64;
  p.num_rows = sizes_.num_rows;
  p.num_cols = sizes_.num_cols;
  p.block_size = sizes_.block_size;
  p.capacity = sizes_.capacity;
  p.out_block_table = region<int32_t>(layout_.block_table);
  p.row_ids = region<int32_t>(layout_.row_ids);
  p.dst_rows = region<int32_t>(layout_.dst_rows);
  p.miss_mask = region<int32_t>(layout_.miss_mask);
  p.block_ends = region<int64_t>(layout_.block_ends);
  p.slot_block_ids = region<int32_t>(layout_.slot_block_ids);
  p.slot_entries = region<int32_t>(layout_.slot_entries);
  p.slot_compact_ids = region<int32_t>(layout_.slot_compact_ids);
  p.remap.device = device.index;
  p.remap.block_ids = p.slot_block_ids;
  p.remap.count = sizes_.capacity;
  p.remap.block_size = sizes_.block_size;
  p.remap.out_table = p.slot_compact_ids;
  p.remap.out_row_ids = p.row_ids;
  p.remap.workspace = region<void>(layout_.remap_workspace);
  p.remap.workspace_bytes = static_cast<size_t>(layout_.remap_workspace_bytes);
  backend_.build_staging_plan(p, stream);
  built_ = true;
  has_gpu_sources_ = false;
  gpu_source_table_ = nullptr;
  gpu_source_block_size_ = 0;
}

StagingGpuSourcesParams StagingPlan::gpu_sources_params() const {
  StagingGpuSourcesParams p;
  p.device = sizes_.device.index;
  p.block_table = region<int32_t>(layout_.block_table);
  p.num_rows = sizes_.num_rows;
  p.num_cols = sizes_.num_cols;
  p.row_ids = region<int32_t>(layout_.row_ids);
  p.miss_mask = region<int32_t>(layout_.miss_mask);
  p.gpu_row_ids = region<int32_t>(layout_.gpu_row_ids);
  p.num_blocks = num_blocks();
  p.block_size = sizes_.block_size;
  p.resident_block_size = sizes_.block_size;  // no resident table: one "page" per block, never read
  p.first_entries = region<int32_t>(layout_.first_entries);
  return p;
}

void StagingPlan::ensure_gpu_sources(const hs_tensor_t* resident_state_rows_t, const hs_tensor_t* state_indices_t,
                                     int64_t resident_block_size, hs_stream_t stream) {
  const Device& device = sizes_.device;
  const TensorArg resident(resident_state_rows_t, "resident_state_rows");
  const bool resident_int64 = index_dtype(resident);
  resident.row_major_2d().on(device, "the plan");
  index_table_extent(resident);
  const TensorArg states(state_indices_t, "state_indices");
  const bool states_int64 = index_dtype(states);
  states.ndim_is(1).unit_stride(0).on(device, "the plan");
  AliasCheck().reads(resident).reads(states).writes(live_storage()).check();
  require_built("ensure_gpu_sources");

  const void* table_address = resident.data<void>();
  if (has_gpu_sources_ && gpu_source_table_ == table_address && gpu_source_block_size_ == resident_block_size) return;
  const int64_t block_size = sizes_.block_size;
  if (resident_block_size <= 0 || block_size % resident_block_size != 0 || sizes_.num_rows == 0 ||
      states.size(0) < sizes_.num_rows) {
    // Nothing can come from this table. Sources computed for another table
    // address another resident cache: drop them, every row loads from the host.
    if (has_gpu_sources_) {
      backend_.staging_gpu_sources(gpu_sources_params(), stream);
      has_gpu_sources_ = false;
      gpu_source_table_ = nullptr;
      gpu_source_block_size_ = 0;
    }
    return;
  }
  StagingGpuSourcesParams p = gpu_sources_params();
  p.resident_state_rows = table_address;
  p.resident_int64 = resident_int64;
  p.num_states = resident.size(0);
  p.resident_cols = resident.size(1);
  p.resident_row_stride = resident.size(0) > 1 ? resident.stride(0) : resident.size(1);
  p.state_indices = states.data<void>();
  p.state_indices_int64 = states_int64;
  p.resident_block_size = resident_block_size;
  backend_.staging_gpu_sources(p, stream);
  has_gpu_sources_ = true;
  gpu_source_table_ = table_address;
  gpu_source_block_size_ = resident_block_size;
}

}  // namespace hisparse
