#include "core/resolve_residency_args.hpp"

#include <limits>

#include "core/aliasing.hpp"
#include "core/backend.hpp"
#include "core/config.hpp"
#include "core/data_movement.hpp"
#include "core/error.hpp"

namespace hisparse {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

int64_t checked_int32(int64_t value, const char* name) {
  if (value > kInt32Max) invalid_argument(name, ": expected at most ", kInt32Max, ", got ", value);
  return value;
}

}  // namespace

Device resolve_topk_params(const TensorArg& topk, ResolveResidencyParams* params) {
  ResolveResidencyParams& p = *params;
  topk.dtype_is(HS_DTYPE_INT32).row_major_2d();
  const Device device = topk.device();
  p.device = device.index;
  p.topk_indices = topk.data<int32_t>();
  p.topk_row_stride = topk.stride(0);
  p.num_tokens = static_cast<int32_t>(checked_int32(topk.size(0), "topk_indices rows"));
  p.top_k = static_cast<int32_t>(checked_int32(topk.size(1), "topk_indices columns"));
  if (p.top_k < 1) invalid_argument("topk_indices: expected at least one column, got shape ", topk.shape_string());
  return device;
}

void resolve_batch_params(const TensorArg& req_ids, const TensorArg& state_indices, const Device& device,
                          ResolveResidencyParams* params) {
  ResolveResidencyParams& p = *params;
  req_ids.dtype_is(HS_DTYPE_INT32).ndim_is(1).unit_stride(0).on(device, "topk_indices");
  req_ids.size_at_least(0, p.num_tokens, "one batch row per token row of topk_indices");
  p.req_id_per_token = req_ids.data<int32_t>();
  state_indices.dtype_is(HS_DTYPE_INT32).ndim_is(1).unit_stride(0).on(device, "topk_indices");
  p.request_state_indices = state_indices.data<int32_t>();
  p.num_batch_rows = static_cast<int32_t>(checked_int32(state_indices.size(0), "request_state_indices length"));
}

void resolve_state_params(const TensorArg& dgi, const TensorArg& lru, const Device& device,
                          ResolveResidencyParams* params) {
  ResolveResidencyParams& p = *params;
  dgi.dtype_is(HS_DTYPE_INT32).ndim_is(2).contiguous().on(device, "topk_indices");
  p.num_state_rows = static_cast<int32_t>(checked_int32(dgi.size(0), "device_global_indices rows"));
  p.hot_size = static_cast<int32_t>(dgi.size(1));
  if (dgi.size(1) < 1 || dgi.size(1) > kMaxDeviceBufferSize) {
    invalid_argument("device_global_indices: expected 1 to ", kMaxDeviceBufferSize,
                     " hot slots per state row (device_buffer_size), got shape ", dgi.shape_string());
  }
  p.device_global_indices = dgi.data<int32_t>();
  lru.dtype_is(HS_DTYPE_INT16).ndim_is(2).contiguous().on(device, "topk_indices");
  lru.size_is(0, p.num_state_rows, "the state rows of device_global_indices");
  lru.size_is(1, p.hot_size, "the hot slots of device_global_indices");
  p.lru_slots = lru.data<int16_t>();
}

void resolve_scalar_params(int64_t hot_block_size, int64_t attention_block_stride, int64_t host_rows,
                           int64_t max_union_rows, ResolveResidencyParams* params) {
  ResolveResidencyParams& p = *params;
  if (hot_block_size < 1) invalid_argument("hot_block_size: expected a positive number of rows, got ", hot_block_size);
  p.hot_block_size = static_cast<int32_t>(checked_int32(hot_block_size, "hot_block_size"));
  if (attention_block_stride < hot_block_size) {
    invalid_argument("attention_block_stride: expected at least hot_block_size (", hot_block_size, "), got ",
                     attention_block_stride);
  }
  // Attention indices are int32; a stride past INT32_MAX addresses nothing
  // and keeps every block * stride product inside int64.
  p.attention_block_stride = checked_int32(attention_block_stride, "attention_block_stride");
  if (host_rows < 0) invalid_argument("host_rows: expected a non-negative row count, got ", host_rows);
  p.host_rows = checked_int32(host_rows, "host_rows");
  if (max_union_rows < 1 || max_union_rows > p.hot_size) {
    invalid_argument("max_union_rows: expected 1 <= max_union_rows <= device_buffer_size (", p.hot_size, "), got ",
                     max_union_rows);
  }
  p.max_union_rows = static_cast<int32_t>(max_union_rows);
}

const int32_t* resolve_block_table(const TensorArg& table, int64_t rows, const Device& device, int64_t* row_stride,
                                   int32_t* width) {
  table.dtype_is(HS_DTYPE_INT32).row_major_2d().on(device, "topk_indices");
  table.size_at_least(0, rows, "one row per batch row of request_state_indices");
  *width = static_cast<int32_t>(checked_int32(table.size(1), table.name()));
  *row_stride = *width > 0 ? table.stride(0) : 0;  // every row of an empty table is table_data()
  return table.table_data();
}

void resolve_hot_table_params(const TensorArg& table, const Device& device, ResolveResidencyParams* params) {
  ResolveResidencyParams& p = *params;
  p.hot_block_table = resolve_block_table(table, p.num_batch_rows, device, &p.hot_table_row_stride, &p.hot_table_width);
  const int64_t hot_blocks = (p.hot_size + p.hot_block_size - 1) / p.hot_block_size;
  table.size_at_least(1, hot_blocks, "ceil(device_buffer_size / hot_block_size) blocks per batch row");
}

void resolve_optional_params(const TensorArg& source_table, int64_t block_size, const TensorArg& resident_table,
                             int64_t resident_block_size, const TensorArg& valid_rows, const Device& device,
                             ResolveResidencyParams* params) {
  ResolveResidencyParams& p = *params;
  if (source_table.present()) {
    if (block_size < 1) {
      invalid_argument("block_size: expected a positive number of tokens with a source_block_table, got ", block_size);
    }
    p.block_size = static_cast<int32_t>(checked_int32(block_size, "block_size"));
    p.source_block_table =
        resolve_block_table(source_table, p.num_batch_rows, device, &p.source_table_row_stride, &p.source_table_width);
  }
  if (resident_table.present()) {
    if (resident_block_size != p.hot_block_size) {
      invalid_argument("resident_block_size: expected hot_block_size (", p.hot_block_size,
                       ", resident rows use the hot cache's attention addressing), got ", resident_block_size);
    }
    p.resident_block_size = p.hot_block_size;
    p.resident_block_table = resolve_block_table(resident_table, p.num_batch_rows, device, &p.resident_table_row_stride,
                                                 &p.resident_table_width);
  }
  if (valid_rows.present()) {
    valid_rows.dtype_is(HS_DTYPE_INT32).on(device, "topk_indices");
    if (valid_rows.numel() != 1) {
      invalid_argument("num_valid_rows: expected a tensor with one element, got shape ", valid_rows.shape_string());
    }
    p.num_valid_rows = valid_rows.data<int32_t>();
  }
}

int32_t* resolve_output_matrix(const TensorArg& out, const Device& device, const ResolveResidencyParams& p,
                               int64_t* row_stride) {
  out.dtype_is(HS_DTYPE_INT32).row_major_2d().on(device, "topk_indices");
  out.size_at_least(0, p.num_tokens, "one row per token row of topk_indices");
  out.size_is(1, p.top_k, "the top-k width of topk_indices");
  *row_stride = out.stride(0);
  return out.data<int32_t>();
}

int32_t* resolve_output_vector(const TensorArg& out, const Device& device, const ResolveResidencyParams& p) {
  out.dtype_is(HS_DTYPE_INT32).ndim_is(1).unit_stride(0).on(device, "topk_indices");
  out.size_at_least(0, p.num_tokens, "one entry per token row of topk_indices");
  return out.data<int32_t>();
}

void resolve_stats_params(const TensorArg& stats, const Device& device, ResolveResidencyParams* params) {
  if (!stats.present()) return;
  stats.dtype_is(HS_DTYPE_INT64).ndim_is(1).unit_stride(0).on(device, "topk_indices");
  stats.size_at_least(0, HS_NUM_STATS, "lookups, hits, misses, resident, invalid");
  params->stats = stats.data<int64_t>();
}

void resolve_fused_gather_params(const TensorArg& host, const TensorArg& hot, int64_t gather_hot_block_stride,
                                 const Device& device, ResolveResidencyParams* params) {
  if (!host.present() && !hot.present()) {
    if (gather_hot_block_stride != 0) {
      invalid_argument("gather_hot_block_stride: expected 0 without a fused gather (gather_host_cache and "
                       "gather_hot_cache are NULL), got ",
                       gather_hot_block_stride);
    }
    return;
  }
  if (!hot.present()) {
    invalid_argument("gather_hot_cache: expected a tensor, got NULL (a fused gather needs gather_host_cache and "
                     "gather_hot_cache together)");
  }
  if (!host.present()) {
    invalid_argument("gather_host_cache: expected a tensor, got NULL (a fused gather needs gather_host_cache and "
                     "gather_hot_cache together)");
  }
  hot.on(device, "topk_indices");
  GatherCompactParams gather;
  gather_cache_params(host, hot, params->hot_block_size, gather_hot_block_stride, "gather_hot_block_stride", &gather);
  resolve_fused_gather_params(gather, params);
}

void resolve_fused_gather_params(const GatherCompactParams& gather, ResolveResidencyParams* params) {
  ResolveResidencyParams& p = *params;
  GatherCompactParams& g = p.gather;
  g = gather;
  g.swap_host_rows = p.out_swap_host_rows;
  g.swap_device_rows = p.out_swap_device_rows;
  g.swap_host_row_stride = p.out_swap_host_rows_row_stride;
  g.swap_device_row_stride = p.out_swap_device_rows_row_stride;
  g.swap_counts = p.out_swap_counts;
  g.num_token_rows = p.num_tokens;
  g.top_k = p.top_k;
  // Not read by the fused copy; set to what hs_gather_compact would run.
  g.variant = gather_default_variant();
  g.max_blocks = 0;
  p.fused_gather = true;
}

void resolve_gather_schedule(int32_t schedule, ResolveResidencyParams* params) {
  if (!params->fused_gather) {
    if (schedule != HS_RESOLVE_GATHER_AUTO) {
      invalid_argument("gather_schedule: expected 0 without a fused gather (gather_host_cache and gather_hot_cache "
                       "are NULL), got ",
                       schedule);
    }
    return;
  }
  if (schedule != HS_RESOLVE_GATHER_AUTO && schedule != HS_RESOLVE_GATHER_FUSED) {
    invalid_argument("gather_schedule: expected HS_RESOLVE_GATHER_AUTO (", static_cast<int>(HS_RESOLVE_GATHER_AUTO),
                     ") or HS_RESOLVE_GATHER_FUSED (", static_cast<int>(HS_RESOLVE_GATHER_FUSED), "), got ", schedule);
  }
  params->gather_schedule = schedule;
}

void resolve_workspace_params(const TensorArg& workspace, const Device& device, ResolveResidencyParams* params) {
  ResolveResidencyParams& p = *params;
  // A workspace given is checked on every backend, so a call that runs here
  // runs on CUDA; only there is its size read.
  if (workspace.present()) workspace.dtype_is(HS_DTYPE_UINT8).ndim_is(1).contiguous().on(device, "topk_indices");
  if (workspace.present() && workspace.numel() > 0) workspace.aligned(16);
  if (!device.is_cuda()) return;
  const uint64_t required = resolver_workspace_bytes_on_device(backend_for(device, "topk_indices"), device.index,
                                                               p.num_state_rows, p.hot_size, p.max_union_rows);
  if (required == 0) return;
  if (!workspace.present()) {
    invalid_argument("workspace: device_buffer_size=", p.hot_size, " with max_union_rows=", p.max_union_rows,
                     " does not fit the device's shared memory per block, so the CUDA resolver needs a workspace of ",
                     required, " B for ", p.num_state_rows,
                     " state rows (hs_resolver_workspace_bytes; an index group allocates its own), got NULL");
  }
  if (static_cast<uint64_t>(workspace.numel()) < required) {
    invalid_argument("workspace: expected at least ", required, " B (hs_resolver_workspace_bytes for ",
                     p.num_state_rows, " state rows, device_buffer_size=", p.hot_size,
                     ", max_union_rows=", p.max_union_rows, "), got ", workspace.numel(), " B");
  }
  p.workspace = workspace.data<uint8_t>();
}

void resolve_handoff_params(const TensorArg& handoff, const Device& device, ResolveResidencyParams* params) {
  if (!handoff.present()) return;
  handoff.dtype_is(HS_DTYPE_INT32)
      .ndim_is(2)
      .size_is(0, params->num_state_rows, "the rows of device_global_indices")
      .size_is(1, HS_RESOLVER_HANDOFF_WORDS, "HS_RESOLVER_HANDOFF_WORDS")
      .contiguous()
      .on(device, "topk_indices");
  if (device.is_cuda()) params->handoff = handoff.data<int32_t>();
}

ResolveResidencyParams resolve_residency_params(const hs_resolve_residency_args_t& a, Device* device_out) {
  ResolveResidencyParams p;
  const TensorArg topk(a.topk_indices, "topk_indices");
  const Device device = resolve_topk_params(topk, &p);
  *device_out = device;
  const TensorArg req_ids(a.req_id_per_token, "req_id_per_token");
  const TensorArg state_indices(a.request_state_indices, "request_state_indices");
  resolve_batch_params(req_ids, state_indices, device, &p);
  const TensorArg dgi(a.device_global_indices, "device_global_indices");
  const TensorArg lru(a.lru_slots, "lru_slots");
  resolve_state_params(dgi, lru, device, &p);
  resolve_scalar_params(a.hot_block_size, a.attention_block_stride, a.host_rows, a.max_union_rows, &p);
  const TensorArg hot_table(a.hot_block_table, "hot_block_table");
  resolve_hot_table_params(hot_table, device, &p);
  const TensorArg attention(a.out_attention, "out_attention");
  const TensorArg hot_rows(a.out_hot_rows, "out_hot_rows");
  const TensorArg resolved(a.out_resolved, "out_resolved");
  const TensorArg miss_mask(a.out_miss_mask, "out_miss_mask");
  const TensorArg swap_host(a.out_swap_host_rows, "out_swap_host_rows");
  const TensorArg swap_device(a.out_swap_device_rows, "out_swap_device_rows");
  const TensorArg valid_counts(a.out_valid_counts, "out_valid_counts");
  const TensorArg swap_counts(a.out_swap_counts, "out_swap_counts");
  p.out_attention = resolve_output_matrix(attention, device, p, &p.out_attention_row_stride);
  p.out_hot_rows = resolve_output_matrix(hot_rows, device, p, &p.out_hot_rows_row_stride);
  p.out_resolved = resolve_output_matrix(resolved, device, p, &p.out_resolved_row_stride);
  p.out_miss_mask = resolve_output_matrix(miss_mask, device, p, &p.out_miss_mask_row_stride);
  p.out_swap_host_rows = resolve_output_matrix(swap_host, device, p, &p.out_swap_host_rows_row_stride);
  p.out_swap_device_rows = resolve_output_matrix(swap_device, device, p, &p.out_swap_device_rows_row_stride);
  p.out_valid_counts = resolve_output_vector(valid_counts, device, p);
  p.out_swap_counts = resolve_output_vector(swap_counts, device, p);
  const TensorArg source_table(a.source_block_table, "source_block_table", true);
  const TensorArg resident_table(a.resident_block_table, "resident_block_table", true);
  const TensorArg valid_rows(a.num_valid_rows, "num_valid_rows", true);
  resolve_optional_params(source_table, a.block_size, resident_table, a.resident_block_size, valid_rows, device, &p);
  const TensorArg stats(a.stats, "stats", true);
  resolve_stats_params(stats, device, &p);
  const TensorArg gather_host(a.gather_host_cache, "gather_host_cache", true);
  const TensorArg gather_hot(a.gather_hot_cache, "gather_hot_cache", true);
  resolve_fused_gather_params(gather_host, gather_hot, a.gather_hot_block_stride, device, &p);
  resolve_gather_schedule(a.gather_schedule, &p);
  const TensorArg workspace(a.workspace, "workspace", true);
  resolve_workspace_params(workspace, device, &p);
  const TensorArg handoff(a.handoff, "handoff", true);
  resolve_handoff_params(handoff, device, &p);
  const TensorArg hint(a.residency_hint, "residency_hint", true);
  if (hint.present()) {
    hint.dtype_is(HS_DTYPE_INT32)
        .ndim_is(1)
        .size_is(0, (p.host_rows + 31) / 32, "ceil(host_rows / 32)")
        .contiguous()
        .on(device, "topk_indices");
    if (device.is_cuda()) p.residency_hint = reinterpret_cast<uint32_t*>(hint.data<int32_t>());
  }
  // The state and every output are written; the rest is read.
  AliasCheck()
      .writes(dgi)
      .writes(lru)
      .writes(attention)
      .writes(hot_rows)
      .writes(resolved)
      .writes(miss_mask)
      .writes(swap_host)
      .writes(swap_device)
      .writes(valid_counts)
      .writes(swap_counts)
      .writes(stats)
      .writes(gather_hot)
      .writes(workspace)
      .writes(handoff)
      .writes(hint)
      .reads(topk)
      .reads(req_ids)
      .reads(state_indices)
      .reads(hot_table)
      .reads(source_table)
      .reads(resident_table)
      .reads(valid_rows)
      .reads(gather_host)
      .check();
  return p;
}

}  // namespace hisparse
