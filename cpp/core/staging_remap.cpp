// The block renumbering of prefill staging on its own (hs_staging_remap).
#include "core/aliasing.hpp"
#include "core/staging_plan.hpp"
#include "core/staging_rows.hpp"

namespace hisparse {
namespace {

// Rows the remap writes, (num_entries + 1) * block_size, checked to fit
// int32; `entries` names where the entry count came from.
int64_t remap_rows(int64_t num_entries, int64_t block_size, const char* entries) {
  if (block_size < 1 || block_size > kStagingInt32Max) {
    invalid_argument("block_size: expected 1 to ", kStagingInt32Max, " tokens per block, got ", block_size);
  }
  if (num_entries < 0 || num_entries >= kStagingInt32Max / block_size) {
    invalid_argument(entries, ": expected (entries + 1) x block_size <= ", kStagingInt32Max,
                     " rows (int32 row ids) with entries >= 0, got (", num_entries, " + 1) x ", block_size);
  }
  return (num_entries + 1) * block_size;
}

}  // namespace

uint64_t staging_remap_workspace_bytes(const Device& device, int64_t num_entries, int64_t block_size) {
  remap_rows(num_entries, block_size, "num_entries");
  return backend_for(device, "device_index").staging_remap_workspace_bytes(num_entries, device.index);
}

void staging_remap(const hs_tensor_t* block_table_t, int64_t block_size, const hs_tensor_t* out_block_table_t,
                   const hs_tensor_t* out_row_ids_t, const hs_tensor_t* workspace_t, hs_stream_t stream) {
  const TensorArg table(block_table_t, "block_table");
  const bool table_int64 = index_dtype(table);
  table.contiguous();
  const Device device = table.device();
  Backend& backend = backend_for(device, "block_table");
  const int64_t rows = remap_rows(table.numel(), block_size, "block_table");

  const TensorArg out_table(out_block_table_t, "out_block_table");
  out_table.dtype_is(HS_DTYPE_INT32).contiguous().on(device, "block_table");
  if (out_table.numel() != table.numel()) {
    invalid_argument("out_block_table: expected ", table.numel(), " elements (one per block_table entry), got shape ",
                     out_table.shape_string());
  }
  const TensorArg out_rows(out_row_ids_t, "out_row_ids");
  out_rows.dtype_is(HS_DTYPE_INT32).contiguous().on(device, "block_table");
  if (out_rows.numel() != rows) {
    invalid_argument("out_row_ids: expected (numel(block_table) + 1) x block_size = ", rows, " elements, got shape ",
                     out_rows.shape_string());
  }
  const uint64_t workspace_bytes = backend.staging_remap_workspace_bytes(table.numel(), device.index);
  const TensorArg workspace(workspace_t, "workspace");
  void* scratch = scratch_buffer(workspace, workspace_bytes, device, "block_table", backend);
  AliasCheck().writes(out_table).writes(out_rows).writes(workspace).reads(table).check();

  StagingRemapParams p;
  p.device = device.index;
  p.block_ids = table.data<void>();
  p.block_ids_int64 = table_int64;
  p.count = table.numel();
  p.block_size = block_size;
  p.out_table = out_table.data<int32_t>();
  p.out_row_ids = out_rows.data<int32_t>();
  p.workspace = scratch;
  p.workspace_bytes = static_cast<size_t>(workspace_bytes);
  backend.staging_remap(p, stream);
}

}  // namespace hisparse
