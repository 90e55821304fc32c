// The two gathers of prefill staging: resident rows device to device, and
// one layer's staged cache for a plan (resident rows, then the host rows of
// the miss mask through the backend's gather_plan).
#include "core/aliasing.hpp"
#include "core/staging_plan.hpp"
#include "core/staging_rows.hpp"

namespace hisparse {
namespace {

void same_row_bytes(const TensorArg& t, int64_t row_bytes, const TensorArg& reference, int64_t reference_row_bytes) {
  if (row_bytes != reference_row_bytes) {
    invalid_argument(t.name(), ": expected rows of ", reference_row_bytes, " bytes (the rows of ", reference.name(),
                     ", shape ", reference.shape_string(), " of ", dtype_name(reference.dtype()), "), got ", row_bytes,
                     " bytes (shape ", t.shape_string(), " of ", dtype_name(t.dtype()), ")");
  }
}

GatherResidentRowsParams resident_params(const PagedRows& source, int device) {
  GatherResidentRowsParams p;
  p.device = device;
  p.source = source.base;
  p.source_blocks = source.blocks;
  p.source_block_size = source.block_size;
  p.source_block_pitch = source.block_pitch;
  p.source_row_pitch = source.row_pitch;
  p.row_bytes = source.row_bytes;
  return p;
}

// A paged resident cache on `device` with at least one row.
PagedRows resident_cache_rows(const TensorArg& t, const Device& device, const char* reference, Backend& backend) {
  const PagedRows rows = paged_rows(t);
  if (rows.blocks * rows.block_size == 0) {
    invalid_argument(t.name(), ": expected at least one row, got shape ", t.shape_string());
  }
  t.on(device, reference);
  backend.check_accessible(rows.base, static_cast<size_t>(rows.extent), device.index, t.name());
  return rows;
}

}  // namespace

void gather_resident_rows(const hs_tensor_t* source_t, const hs_tensor_t* destination_t, const hs_tensor_t* row_ids_t,
                          hs_stream_t stream) {
  const TensorArg destination(destination_t, "destination");
  const Device device = destination.device();
  Backend& backend = backend_for(device, "destination");
  const TensorArg source(source_t, "source");
  const PagedRows rows = resident_cache_rows(source, device, "destination", backend);
  if (destination.ndim() != 2) {
    invalid_argument("destination: expected rows [N, row width], got shape ", destination.shape_string());
  }
  const UniformRows out = uniform_rows(destination);
  same_row_bytes(destination, out.row_bytes, source, rows.row_bytes);
  const TensorArg ids(row_ids_t, "row_ids");
  const bool ids_int64 = index_dtype(ids);
  ids.ndim_is(1).unit_stride(0).on(device, "destination");
  ids.size_is(0, out.count, "one id per destination row");
  AliasCheck().writes(destination).reads(source).reads(ids).check();
  backend.check_accessible(out.base, static_cast<size_t>(out.extent), device.index, "destination");

  GatherResidentRowsParams p = resident_params(rows, device.index);
  p.destination = out.base;
  p.destination_pitch = out.pitch;
  p.row_ids = ids.data<void>();
  p.row_ids_int64 = ids_int64;
  p.count = out.count;
  if (p.count > 0) backend.gather_resident_rows(p, stream);
}

void StagingPlan::gather_prefill_cache(const hs_tensor_t* host_cache_t, const hs_tensor_t* resident_cache_t,
                                       const hs_tensor_t* staged_t, hs_stream_t stream) {
  const Device& device = sizes_.device;
  // hs_gather_plan's checks of its source, named after both roles.
  const TensorArg host(host_cache_t, "host_cache (the gather's src_rows)");
  if (host.ndim() >= 3 && host.size(1) != sizes_.block_size) {
    invalid_argument("host_cache: HiSparse staging block size ", sizes_.block_size,
                     " does not match the KV cache block size ", host.size(1), ".");
  }
  const UniformRows source = uniform_rows(host);
  if (host.device().is_cuda() || !device.is_cuda()) host.on(device, "the plan");

  const TensorArg staged(staged_t, "staged");
  staged.on(device, "the plan");
  if (staged.dtype() != host.dtype()) {
    fail(HS_ERROR_INVALID_DTYPE, "staged: expected dtype ", dtype_name(host.dtype()),
         " (the dtype of host_cache), got ", dtype_name(staged.dtype()));
  }
  const UniformRows destination = uniform_rows(staged);
  same_row_bytes(staged, destination.row_bytes, host, source.row_bytes);
  if (destination.count > 1 && destination.pitch != destination.row_bytes) {
    invalid_argument("staged: expected contiguous rows (pitch ", destination.row_bytes, " bytes), got a pitch of ",
                     destination.pitch, " bytes (shape ", staged.shape_string(), ")");
  }
  const int64_t rows = num_staged_rows();
  if (destination.count < rows) {
    invalid_argument("staged: expected at least the plan's ", rows, " rows (", num_blocks(), " blocks x ",
                     sizes_.block_size, "), got shape ", staged.shape_string());
  }

  const TensorArg resident(resident_cache_t, "resident_cache", true);
  PagedRows resident_rows;
  if (resident.present()) {
    resident_rows = paged_rows(resident);
    if (has_gpu_sources_ && resident_rows.block_size != gpu_source_block_size_) {
      invalid_argument("resident_cache: expected a paged cache [num_blocks, ", gpu_source_block_size_,
                       ", row width] (the resident block size given to ensure_gpu_sources), got shape ",
                       resident.shape_string());
    }
    resident_cache_rows(resident, device, "the plan", backend_);
    same_row_bytes(resident, resident_rows.row_bytes, staged, destination.row_bytes);
  } else if (has_gpu_sources_) {
    invalid_argument("resident_cache: the plan serves rows from a resident cache (ensure_gpu_sources found resident "
                     "pages); expected that cache, got NULL");
  }
  require_built("hs_gather_prefill_cache");
  AliasCheck().writes(staged).reads(host).reads(resident).reads(live_storage()).check();
  backend_.check_accessible(source.base, static_cast<size_t>(source.extent), device.index, "host_cache");
  backend_.check_accessible(destination.base, static_cast<size_t>(rows * destination.row_bytes), device.index,
                            "staged");

  if (has_gpu_sources_) {
    GatherResidentRowsParams r = resident_params(resident_rows, device.index);
    r.destination = destination.base;
    r.destination_pitch = destination.row_bytes;
    r.row_ids = region<int32_t>(layout_.gpu_row_ids);
    r.count = rows;
    r.skip_negative = true;  // rows without a resident copy are the host gather's or unused
    backend_.gather_resident_rows(r, stream);
  }
  GatherPlanParams g;
  g.device = device.index;
  g.src = source.base;
  g.src_rows = source.count;
  g.src_pitch = source.pitch;
  g.staged = destination.base;
  g.staged_rows = rows;
  g.row_bytes = source.row_bytes;
  g.row_ids = region<int32_t>(layout_.row_ids);
  g.dst_rows = region<int32_t>(layout_.dst_rows);
  g.miss_mask = region<int32_t>(layout_.miss_mask);
  g.count = rows;
  backend_.gather_plan(g, stream);
}

}  // namespace hisparse
