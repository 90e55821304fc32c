// C ABI of residency resolution: validate every argument on the host (shapes,
// dtypes, devices, strides, scalars), then hand raw pointers to the backend
// of the tensors' device. Device data is never inspected here.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>

#include "core/backend.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/gather_caches.hpp"
#include "core/tensor.hpp"

namespace hisparse {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

int64_t checked_int32(int64_t value, const char* name) {
  if (value > kInt32Max) invalid_argument(name, ": expected at most ", kInt32Max, ", got ", value);
  return value;
}

// A [>= rows, columns] int32 output with unit column stride.
int32_t* output_matrix(const TensorArg& out, int64_t rows, int64_t columns, const Device& device, int64_t* row_stride) {
  out.dtype_is(HS_DTYPE_INT32).row_major_2d().on(device, "topk_indices");
  out.size_at_least(0, rows, "one row per token row of topk_indices");
  out.size_is(1, columns, "the top-k width of topk_indices");
  *row_stride = out.stride(0);
  return out.data<int32_t>();
}

int32_t* output_vector(const TensorArg& out, int64_t rows, const Device& device) {
  out.dtype_is(HS_DTYPE_INT32).ndim_is(1).unit_stride(0).on(device, "topk_indices");
  out.size_at_least(0, rows, "one entry per token row of topk_indices");
  return out.data<int32_t>();
}

// An int32 block table with at least `rows` rows and unit column stride.
const int32_t* block_table(const TensorArg& table, int64_t rows, const Device& device, int64_t* row_stride,
                           int32_t* width) {
  table.dtype_is(HS_DTYPE_INT32).row_major_2d().on(device, "topk_indices");
  table.size_at_least(0, rows, "one row per batch row of request_state_indices");
  *row_stride = table.stride(0);
  *width = static_cast<int32_t>(checked_int32(table.size(1), table.name()));
  return table.data<int32_t>();
}

ResolveResidencyParams build_params(const hs_resolve_residency_args_t& a, Device* device_out) {
  ResolveResidencyParams p;
  const TensorArg topk(a.topk_indices, "topk_indices");
  topk.dtype_is(HS_DTYPE_INT32).row_major_2d();
  const Device device = topk.device();
  *device_out = device;
  p.device = device.index;
  p.topk_indices = topk.data<int32_t>();
  p.topk_row_stride = topk.stride(0);
  p.num_tokens = static_cast<int32_t>(checked_int32(topk.size(0), "topk_indices rows"));
  p.top_k = static_cast<int32_t>(checked_int32(topk.size(1), "topk_indices columns"));
  if (p.top_k < 1) invalid_argument("topk_indices: expected at least one column, got shape ", topk.shape_string());

  const TensorArg req_ids(a.req_id_per_token, "req_id_per_token");
  req_ids.dtype_is(HS_DTYPE_INT32).ndim_is(1).unit_stride(0).on(device, "topk_indices");
  req_ids.size_at_least(0, p.num_tokens, "one batch row per token row of topk_indices");
  p.req_id_per_token = req_ids.data<int32_t>();

  const TensorArg state_indices(a.request_state_indices, "request_state_indices");
  state_indices.dtype_is(HS_DTYPE_INT32).ndim_is(1).unit_stride(0).on(device, "topk_indices");
  p.request_state_indices = state_indices.data<int32_t>();
  p.num_batch_rows = static_cast<int32_t>(checked_int32(state_indices.size(0), "request_state_indices length"));

  const TensorArg dgi(a.device_global_indices, "device_global_indices");
  dgi.dtype_is(HS_DTYPE_INT32).ndim_is(2).contiguous().on(device, "topk_indices");
  p.num_state_rows = static_cast<int32_t>(checked_int32(dgi.size(0), "device_global_indices rows"));
  p.hot_size = static_cast<int32_t>(dgi.size(1));
  if (p.hot_size < 1 || p.hot_size > kMaxDeviceBufferSize) {
    invalid_argument("device_global_indices: expected 1 to ", kMaxDeviceBufferSize,
                     " hot slots per state row (device_buffer_size), got shape ", dgi.shape_string());
  }
  p.device_global_indices = dgi.data<int32_t>();

  const TensorArg lru(a.lru_slots, "lru_slots");
  lru.dtype_is(HS_DTYPE_INT16).ndim_is(2).contiguous().on(device, "topk_indices");
  lru.size_is(0, p.num_state_rows, "the state rows of device_global_indices");
  lru.size_is(1, p.hot_size, "the hot slots of device_global_indices");
  p.lru_slots = lru.data<int16_t>();

  if (a.hot_block_size < 1)
    invalid_argument("hot_block_size: expected a positive number of rows, got ", a.hot_block_size);
  p.hot_block_size = static_cast<int32_t>(checked_int32(a.hot_block_size, "hot_block_size"));
  if (a.attention_block_stride < a.hot_block_size) {
    invalid_argument("attention_block_stride: expected at least hot_block_size (", a.hot_block_size, "), got ",
                     a.attention_block_stride);
  }
  // Attention indices are int32; a stride past INT32_MAX addresses nothing
  // and keeps every block * stride product inside int64.
  p.attention_block_stride = checked_int32(a.attention_block_stride, "attention_block_stride");
  if (a.host_rows < 0) invalid_argument("host_rows: expected a non-negative row count, got ", a.host_rows);
  p.host_rows = checked_int32(a.host_rows, "host_rows");
  if (a.max_union_rows < 1 || a.max_union_rows > p.hot_size) {
    invalid_argument("max_union_rows: expected 1 <= max_union_rows <= device_buffer_size (", p.hot_size, "), got ",
                     a.max_union_rows);
  }
  p.max_union_rows = static_cast<int32_t>(a.max_union_rows);

  const TensorArg hot_table(a.hot_block_table, "hot_block_table");
  p.hot_block_table = block_table(hot_table, p.num_batch_rows, device, &p.hot_table_row_stride, &p.hot_table_width);
  const int64_t hot_blocks = (p.hot_size + p.hot_block_size - 1) / p.hot_block_size;
  hot_table.size_at_least(1, hot_blocks, "ceil(device_buffer_size / hot_block_size) blocks per batch row");

  p.out_attention = output_matrix(TensorArg(a.out_attention, "out_attention"), p.num_tokens, p.top_k, device,
                                  &p.out_attention_row_stride);
  p.out_hot_rows = output_matrix(TensorArg(a.out_hot_rows, "out_hot_rows"), p.num_tokens, p.top_k, device,
                                 &p.out_hot_rows_row_stride);
  p.out_resolved = output_matrix(TensorArg(a.out_resolved, "out_resolved"), p.num_tokens, p.top_k, device,
                                 &p.out_resolved_row_stride);
  p.out_miss_mask = output_matrix(TensorArg(a.out_miss_mask, "out_miss_mask"), p.num_tokens, p.top_k, device,
                                  &p.out_miss_mask_row_stride);
  p.out_swap_host_rows = output_matrix(TensorArg(a.out_swap_host_rows, "out_swap_host_rows"), p.num_tokens, p.top_k,
                                       device, &p.out_swap_host_rows_row_stride);
  p.out_swap_device_rows = output_matrix(TensorArg(a.out_swap_device_rows, "out_swap_device_rows"), p.num_tokens,
                                         p.top_k, device, &p.out_swap_device_rows_row_stride);
  p.out_valid_counts = output_vector(TensorArg(a.out_valid_counts, "out_valid_counts"), p.num_tokens, device);
  p.out_swap_counts = output_vector(TensorArg(a.out_swap_counts, "out_swap_counts"), p.num_tokens, device);

  const TensorArg source_table(a.source_block_table, "source_block_table", true);
  if (source_table.present()) {
    if (a.block_size < 1) {
      invalid_argument("block_size: expected a positive number of tokens with a source_block_table, got ",
                       a.block_size);
    }
    p.block_size = static_cast<int32_t>(checked_int32(a.block_size, "block_size"));
    p.source_block_table =
        block_table(source_table, p.num_batch_rows, device, &p.source_table_row_stride, &p.source_table_width);
  }

  const TensorArg resident_table(a.resident_block_table, "resident_block_table", true);
  if (resident_table.present()) {
    if (a.resident_block_size != a.hot_block_size) {
      invalid_argument("resident_block_size: expected hot_block_size (", a.hot_block_size,
                       ", resident rows use the hot cache's attention addressing), got ", a.resident_block_size);
    }
    p.resident_block_size = static_cast<int32_t>(a.resident_block_size);
    p.resident_block_table =
        block_table(resident_table, p.num_batch_rows, device, &p.resident_table_row_stride, &p.resident_table_width);
  }

  const TensorArg valid_rows(a.num_valid_rows, "num_valid_rows", true);
  if (valid_rows.present()) {
    valid_rows.dtype_is(HS_DTYPE_INT32).on(device, "topk_indices");
    if (valid_rows.numel() != 1) {
      invalid_argument("num_valid_rows: expected a tensor with one element, got shape ", valid_rows.shape_string());
    }
    p.num_valid_rows = valid_rows.data<int32_t>();
  }

  const TensorArg stats(a.stats, "stats", true);
  if (stats.present()) {
    stats.dtype_is(HS_DTYPE_INT64).ndim_is(1).unit_stride(0).on(device, "topk_indices");
    stats.size_at_least(0, HS_NUM_STATS, "lookups, hits, misses, resident, invalid");
    p.stats = stats.data<int64_t>();
  }
  return p;
}

// The fused gather: gather_compact's validation of the two caches, with the
// swap list being this call's own out_swap_* outputs (already validated as
// [>= T, K]; only their first T rows are read).
void add_fused_gather(const hs_resolve_residency_args_t& a, const Device& device, ResolveResidencyParams* p) {
  const TensorArg host(a.gather_host_rows, "gather_host_rows", true);
  const TensorArg hot(a.gather_hot_cache, "gather_hot_cache", true);
  if (!host.present() && !hot.present()) {
    if (a.gather_hot_block_stride != 0) {
      invalid_argument("gather_hot_block_stride: expected 0 without a fused gather (gather_host_rows and "
                       "gather_hot_cache are NULL), got ",
                       a.gather_hot_block_stride);
    }
    if (a.gather_schedule != HS_RESOLVE_GATHER_AUTO) {
      invalid_argument("gather_schedule: expected 0 without a fused gather (gather_host_rows and gather_hot_cache "
                       "are NULL), got ",
                       a.gather_schedule);
    }
    return;
  }
  if (a.gather_schedule != HS_RESOLVE_GATHER_AUTO && a.gather_schedule != HS_RESOLVE_GATHER_FUSED) {
    invalid_argument("gather_schedule: expected HS_RESOLVE_GATHER_AUTO (", static_cast<int>(HS_RESOLVE_GATHER_AUTO),
                     ") or HS_RESOLVE_GATHER_FUSED (", static_cast<int>(HS_RESOLVE_GATHER_FUSED), "), got ",
                     a.gather_schedule);
  }
  if (!hot.present()) {
    invalid_argument("gather_hot_cache: expected a tensor, got NULL (a fused gather needs gather_host_rows and "
                     "gather_hot_cache together)");
  }
  if (!host.present()) {
    invalid_argument("gather_host_rows: expected a tensor, got NULL (a fused gather needs gather_host_rows and "
                     "gather_hot_cache together)");
  }
  hot.on(device, "topk_indices");
  GatherCompactParams& g = p->gather;
  gather_cache_params(host, hot, p->hot_block_size, a.gather_hot_block_stride, "gather_hot_block_stride", &g);
  g.swap_host_rows = p->out_swap_host_rows;
  g.swap_device_rows = p->out_swap_device_rows;
  g.swap_host_row_stride = p->out_swap_host_rows_row_stride;
  g.swap_device_row_stride = p->out_swap_device_rows_row_stride;
  g.swap_counts = p->out_swap_counts;
  g.num_token_rows = p->num_tokens;
  g.top_k = p->top_k;
  // Not read by the fused copy; set to what hs_gather_compact would run.
  g.variant = hs_gather_default_variant();
  g.max_blocks = 0;
  p->fused_gather = true;
  p->gather_schedule = a.gather_schedule;
}

// The CUDA resolver's workspace, where the shape needs one: a contiguous,
// 16-byte aligned uint8 tensor on the device of at least
// resolver_workspace_bytes for the state rows. Without a need it is not read.
void add_workspace(const hs_resolve_residency_args_t& a, const Device& device, ResolveResidencyParams* p) {
  const uint64_t required =
      resolver_workspace_bytes_on_device(p->num_state_rows, p->hot_size, p->max_union_rows, device.index);
  if (required == 0) return;
  const TensorArg workspace(a.workspace, "workspace", true);
  if (!workspace.present()) {
    invalid_argument("workspace: device_buffer_size=", p->hot_size, " with max_union_rows=", p->max_union_rows,
                     " does not fit the device's shared memory per block, so the CUDA resolver needs a workspace of ",
                     required, " B for ", p->num_state_rows,
                     " state rows (hs_resolver_workspace_bytes; an index group allocates its own), got NULL");
  }
  workspace.dtype_is(HS_DTYPE_UINT8).contiguous().on(device, "topk_indices").aligned(16);
  if (static_cast<uint64_t>(workspace.numel()) < required) {
    invalid_argument("workspace: expected at least ", required, " B (hs_resolver_workspace_bytes for ",
                     p->num_state_rows, " state rows, device_buffer_size=", p->hot_size,
                     ", max_union_rows=", p->max_union_rows, "), got ", workspace.numel(), " B");
  }
  p->workspace = workspace.data<uint8_t>();
}

// The caller's args with every field past its struct_size read as absent
// (zero): an older caller's struct simply ends before them.
hs_resolve_residency_args_t read_args(const hs_resolve_residency_args_t* args) {
  const hs_resolve_residency_args_t& caller =
      require_struct(args, "args", offsetof(hs_resolve_residency_args_t, stats) + sizeof(args->stats));
  hs_resolve_residency_args_t a;
  std::memset(&a, 0, sizeof(a));
  std::memcpy(&a, &caller, std::min(caller.struct_size, sizeof(a)));
  return a;
}

}  // namespace
}  // namespace hisparse

using namespace hisparse;

extern "C" {

HS_API hs_status_t hs_resolve_residency(const hs_resolve_residency_args_t* args, hs_stream_t stream) {
  return api_guard([&] {
    const hs_resolve_residency_args_t a = read_args(args);
    Device device;
    ResolveResidencyParams params = build_params(a, &device);
    add_fused_gather(a, device, &params);
    Backend& backend = backend_for(device);
    if (device.is_cuda()) add_workspace(a, device, &params);
    backend.resolve_residency(params, stream);
  });
}

}  // extern "C"
