// C ABI of prefill staging (hisparse/staging.h): each entry point is one
// api_guard that reads the caller's struct, converts it, and calls the core
// (core/staging_plan.hpp), which validates every argument.
#include <cstddef>

#include "abi/api_guard.hpp"
#include "abi/handles.hpp"
#include "core/backend.hpp"
#include "core/staging_plan.hpp"

namespace hisparse {
namespace {

StagingPlanSizes to_sizes(const hs_staging_plan_options_t& o) {
  StagingPlanSizes sizes;
  sizes.device = device_from(o.device_type, o.device_index);
  sizes.num_rows = o.num_rows;
  sizes.num_cols = o.num_cols;
  sizes.block_size = o.block_size;
  sizes.capacity = o.staging_block_capacity;
  return sizes;
}

// The handle is the core plan behind an opaque pointer, as for the other handles (abi/handles.hpp).
hs_staging_plan_t to_handle(StagingPlan* plan) { return reinterpret_cast<hs_staging_plan_t>(plan); }
StagingPlan& require_plan(hs_staging_plan_t plan) {
  require_handle(plan, HandleKind::kStagingPlan, "plan", "hs_staging_plan_t");
  return *reinterpret_cast<StagingPlan*>(plan);
}

}  // namespace
}  // namespace hisparse

using namespace hisparse;

extern "C" {

HS_API hs_status_t hs_staging_plan_storage_bytes(const hs_staging_plan_options_t* options, uint64_t* bytes) {
  return api_guard([&] {
    require_pointer(bytes, "bytes");
    const StagingPlanSizes sizes = to_sizes(read_struct<HS_STAGING_PLAN_OPTIONS_VERSION>(options, "options"));
    *bytes = staging_plan_layout(sizes, backend_for(sizes.device, "device_index")).total;
  });
}

HS_API hs_status_t hs_staging_plan_create(const hs_staging_plan_options_t* options, hs_staging_plan_t* plan) {
  return api_guard([&] {
    require_pointer(plan, "plan");
    *plan = nullptr;
    const hs_staging_plan_options_t o = read_struct<HS_STAGING_PLAN_OPTIONS_VERSION>(options, "options");
    const StagingPlanSizes sizes = to_sizes(o);
    *plan = to_handle(new StagingPlan(sizes, backend_for(sizes.device, "device_index"), o.storage));
    list_handle(*plan, HandleKind::kStagingPlan);
  });
}

HS_API hs_status_t hs_staging_plan_destroy(hs_staging_plan_t plan) {
  return api_guard([&] {
    if (take_handle(plan, HandleKind::kStagingPlan, "plan", "hs_staging_plan_t"))
      delete reinterpret_cast<StagingPlan*>(plan);
  });
}

HS_API hs_status_t hs_staging_plan_get_tensor(hs_staging_plan_t plan, hs_staging_plan_tensor_t which,
                                              hs_tensor_t* out) {
  return api_guard([&] {
    const StagingPlan& p = require_plan(plan);
    hs_tensor_t* destination = require_pointer(out, "out");
    *destination = p.tensor(which);
  });
}

HS_API hs_status_t hs_staging_plan_get_info(hs_staging_plan_t plan, hs_staging_plan_info_t* info) {
  return api_guard([&] {
    const StagingPlan& p = require_plan(plan);
    require_struct_size(info, "info");
    const StagingPlanSizes& s = p.sizes();
    hs_staging_plan_info_t value{};
    value.device_type = s.device.is_cuda() ? HS_DEVICE_CUDA : HS_DEVICE_CPU;
    value.device_index = s.device.is_cuda() ? s.device.index : 0;
    value.built = p.built() ? 1 : 0;
    value.has_gpu_sources = p.has_gpu_sources() ? 1 : 0;
    value.owns_storage = p.owns_storage() ? 1 : 0;
    value.num_rows = s.num_rows;
    value.num_cols = s.num_cols;
    value.block_size = s.block_size;
    value.staging_block_capacity = s.capacity;
    value.num_blocks = p.num_blocks();
    value.num_staged_rows = p.num_staged_rows();
    value.storage_bytes = p.storage_bytes();
    value.gpu_source_table = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p.gpu_source_table()));
    value.gpu_source_block_size = p.gpu_source_block_size();
    write_struct<HS_STAGING_PLAN_INFO_VERSION>(info, value);
  });
}

HS_API hs_status_t hs_staging_plan_build(hs_staging_plan_t plan, const hs_tensor_t* block_table,
                                         const hs_tensor_t* seq_lens, hs_stream_t stream) {
  return api_guard([&] { require_plan(plan).build(block_table, seq_lens, stream); });
}

HS_API hs_status_t hs_staging_plan_ensure_gpu_sources(hs_staging_plan_t plan, const hs_tensor_t* resident_state_rows,
                                                      const hs_tensor_t* state_indices, int64_t resident_block_size,
                                                      hs_stream_t stream) {
  return api_guard(
      [&] { require_plan(plan).ensure_gpu_sources(resident_state_rows, state_indices, resident_block_size, stream); });
}

HS_API hs_status_t hs_gather_prefill_cache(hs_staging_plan_t plan, const hs_tensor_t* host_cache,
                                           const hs_tensor_t* resident_cache, const hs_tensor_t* staged,
                                           hs_stream_t stream) {
  return api_guard([&] { require_plan(plan).gather_prefill_cache(host_cache, resident_cache, staged, stream); });
}

HS_API hs_status_t hs_gather_resident_rows(const hs_tensor_t* source, const hs_tensor_t* destination,
                                           const hs_tensor_t* row_ids, hs_stream_t stream) {
  return api_guard([&] { gather_resident_rows(source, destination, row_ids, stream); });
}

HS_API hs_status_t hs_staging_remap_workspace_bytes(int32_t device_type, int32_t device_index, int64_t num_entries,
                                                    int64_t block_size, uint64_t* bytes) {
  return api_guard([&] {
    require_pointer(bytes, "bytes");
    *bytes = staging_remap_workspace_bytes(device_from(device_type, device_index), num_entries, block_size);
  });
}

HS_API hs_status_t hs_staging_remap(const hs_staging_remap_args_t* args, hs_stream_t stream) {
  return api_guard([&] {
    const hs_staging_remap_args_t a = read_struct<HS_STAGING_REMAP_ARGS_VERSION>(args, "args");
    staging_remap(a.block_table, a.block_size, a.out_block_table, a.out_row_ids, a.workspace, stream);
  });
}

}  // extern "C"
