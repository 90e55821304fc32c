// C ABI of the KV cache and its kernels: each entry point reads its
// arguments, converts handles to core objects and calls the KvCache core or
// has the core check a kernel's arguments and runs the backend of the
// executing device.
#include <vector>

#include "abi/api_guard.hpp"
#include "abi/handles.hpp"
#include "abi/host_pool_handle.hpp"
#include "abi/runtime_stats.hpp"
#include "core/backend.hpp"
#include "core/ipc_event.hpp"
#include "core/kv_cache.hpp"
#include "core/kv_ops.hpp"

using namespace hisparse;

namespace {

hs_kv_cache_t to_handle(KvCache* cache) { return reinterpret_cast<hs_kv_cache_t>(cache); }
KvCache& require_cache(hs_kv_cache_t cache) {
  require_handle(cache, HandleKind::kKvCache, "cache", "hs_kv_cache_t");
  return *reinterpret_cast<KvCache*>(cache);
}

KvCacheOptions core_options(const hs_kv_cache_options_t* options) {
  const hs_kv_cache_options_t o = read_struct<HS_KV_CACHE_OPTIONS_VERSION>(options, "options");
  KvCacheOptions core;
  core.config = read_struct<HS_CONFIG_VERSION>(o.config, "options->config");
  core.num_layers = o.num_layers;
  if (o.layer_groups != nullptr && o.num_layers > 0)
    core.layer_groups.assign(o.layer_groups, o.layer_groups + o.num_layers);
  core.max_requests = o.max_requests;
  core.resident_pages = o.resident_pages;
  core.max_seq_len = o.max_seq_len;
  core.resident_page_size = o.resident_page_size;
  core.device = device_from(o.device_type, o.device_index);
  if (o.kv_dtype < 0 || o.kv_dtype >= HS_NUM_DTYPES) {
    fail(HS_ERROR_INVALID_DTYPE, "kv_dtype: expected an hs_dtype_t in [0, ", static_cast<int>(HS_NUM_DTYPES), "), got ",
         o.kv_dtype);
  }
  core.kv_dtype = static_cast<hs_dtype_t>(o.kv_dtype);
  core.max_swap_rows = o.max_swap_rows;
  core.host_pool = o.host_pool != nullptr ? &require_pool(o.host_pool, "options->host_pool").pool : nullptr;
  if (o.host_event != nullptr) {
    require_handle(o.host_event, HandleKind::kIpcEvent, "options->host_event", "hs_ipc_event_t");
  }
  core.host_event = reinterpret_cast<IpcEvent*>(o.host_event);
  return core;
}

}  // namespace

extern "C" {

HS_API hs_status_t hs_write_rows(const hs_write_rows_args_t* args, hs_stream_t stream) {
  return api_guard([&] {
    Device device;
    const WriteRowsParams p = write_rows_params(read_struct<HS_WRITE_ROWS_ARGS_VERSION>(args, "args"), &device);
    if (p.num_tokens == 0) return;
    backend_for(device, "rows").write_rows(p, stream);
  });
}

HS_API hs_status_t hs_read_rows(const hs_tensor_t* cache, const hs_tensor_t* indices, const hs_tensor_t* out,
                                hs_stream_t stream) {
  return api_guard([&] {
    Device device;
    const ReadRowsParams p = read_rows_params(cache, indices, out, &device);
    if (p.num_rows == 0 || p.width == 0) return;
    backend_for(device, "cache").read_rows(p, stream);
  });
}

HS_API hs_status_t hs_update_residency(const hs_update_residency_args_t* args, hs_stream_t stream) {
  return api_guard([&] {
    Device device;
    const ResidencyParams p = residency_params(read_struct<HS_UPDATE_RESIDENCY_ARGS_VERSION>(args, "args"), &device);
    // Ring slots are claimed from the lengths even for a table of no columns.
    if (p.num_batch_rows == 0 || (p.table_width == 0 && p.ring_pages == nullptr)) return;
    backend_for(device, "resident_block_table").update_residency(p, stream);
  });
}

HS_API hs_status_t hs_kv_cache_host_bytes(const hs_kv_cache_options_t* options, uint64_t* bytes) {
  return api_guard([&] {
    require_pointer(bytes, "bytes");
    *bytes = kv_cache_layout(core_options(options)).host_bytes;
  });
}

HS_API hs_status_t hs_kv_cache_create(const hs_kv_cache_options_t* options, hs_kv_cache_t* cache) {
  return api_guard([&] {
    require_pointer(cache, "cache");
    *cache = nullptr;
    *cache = to_handle(new KvCache(core_options(options)));
    list_handle(*cache, HandleKind::kKvCache);
  });
}

HS_API hs_status_t hs_kv_cache_destroy(hs_kv_cache_t cache) {
  return api_guard([&] {
    if (!take_handle(cache, HandleKind::kKvCache, "cache", "hs_kv_cache_t")) return;
    auto* c = reinterpret_cast<KvCache*>(cache);
    // Its runtimes and their groups' handles die with it.
    for (int32_t layer = 0; layer < c->layout().num_layers; ++layer) {
      Runtime& r = c->runtime(layer);
      unlist_handle(&r);
      unlist_handle(&r.group().index_group());
    }
    delete c;
  });
}

HS_API hs_status_t hs_kv_cache_get_info(hs_kv_cache_t cache, hs_kv_cache_info_t* info) {
  return api_guard([&] {
    const KvCache& c = require_cache(cache);
    require_struct_size(info, "info");
    const KvCacheLayout& l = c.layout();
    hs_kv_cache_info_t v{};
    v.num_layers = l.num_layers;
    v.num_groups = l.num_groups;
    v.max_requests = l.max_requests;
    v.resident_pages = l.resident_pages;
    v.max_seq_len = l.max_seq_len;
    v.resident_page_size = l.blocks_per_page * l.hot_block_size;
    v.host_rows = l.host_rows;
    v.num_blocks = l.num_blocks;
    v.blocks_per_request = l.host_blocks;
    v.active_requests = c.active_requests();
    v.is_writer = c.is_writer() ? 1 : 0;
    v.host_bytes = l.host_bytes;
    v.device_bytes = c.device_bytes();
    write_struct<HS_KV_CACHE_INFO_VERSION>(info, v);
  });
}

HS_API hs_status_t hs_kv_cache_layer_group(hs_kv_cache_t cache, int32_t layer, int32_t* group, int32_t* leader) {
  return api_guard([&] {
    const KvCache& c = require_cache(cache);
    const int32_t g = c.group_of(layer);
    if (group != nullptr) *group = g;
    if (leader != nullptr) *leader = c.layout().leader_of[g];
  });
}

HS_API hs_status_t hs_kv_cache_get_runtime(hs_kv_cache_t cache, int32_t layer, hs_runtime_t* runtime) {
  return api_guard([&] {
    *require_pointer(runtime, "runtime") = to_handle(&require_cache(cache).runtime(layer));
    list_handle(*runtime, HandleKind::kKvCacheRuntime);
  });
}

HS_API hs_status_t hs_kv_cache_get_tensor(hs_kv_cache_t cache, hs_kv_cache_tensor_t which, hs_tensor_t* out) {
  return api_guard([&] { *require_pointer(out, "out") = require_cache(cache).tensor(which); });
}

HS_API hs_status_t hs_kv_cache_admit(hs_kv_cache_t cache, int32_t row, int32_t* admitted, hs_stream_t stream) {
  return api_guard([&] {
    KvCache& c = require_cache(cache);
    const int32_t r = c.admit(row, stream);
    if (admitted != nullptr) *admitted = r;
  });
}

HS_API hs_status_t hs_kv_cache_release(hs_kv_cache_t cache, int32_t row, hs_stream_t stream) {
  return api_guard([&] { require_cache(cache).release(row, stream); });
}

HS_API hs_status_t hs_kv_cache_begin_forward(hs_kv_cache_t cache, const hs_tensor_t* seq_lens, hs_stream_t stream) {
  return api_guard([&] { require_cache(cache).begin_forward(seq_lens, stream); });
}

HS_API hs_status_t hs_kv_cache_write(hs_kv_cache_t cache, int32_t layer, const hs_tensor_t* rows,
                                     const hs_tensor_t* req_id_per_token, const hs_tensor_t* positions,
                                     hs_stream_t stream) {
  return api_guard([&] { require_cache(cache).write(layer, rows, req_id_per_token, positions, stream); });
}

HS_API hs_status_t hs_kv_cache_swap_in(hs_kv_cache_t cache, int32_t layer, const hs_kv_cache_swap_in_args_t* args,
                                       hs_runtime_swap_in_result_t* result, hs_stream_t stream) {
  return api_guard([&] {
    KvCache& c = require_cache(cache);
    const hs_kv_cache_swap_in_args_t a = read_struct<HS_KV_CACHE_SWAP_IN_ARGS_VERSION>(args, "args");
    if (result != nullptr) require_struct_size(result, "result");
    const SwapInResult s = c.swap_in(layer, a, stream);
    if (result != nullptr) {
      hs_runtime_swap_in_result_t v{};
      v.first_row = s.first_row;
      v.num_rows = s.num_rows;
      v.prefetched = s.prefetched ? 1 : 0;
      write_struct<HS_RUNTIME_SWAP_IN_RESULT_VERSION>(result, v);
    }
  });
}

HS_API hs_status_t hs_kv_cache_read(hs_kv_cache_t cache, int32_t layer, const hs_tensor_t* indices,
                                    const hs_tensor_t* out, hs_stream_t stream) {
  return api_guard([&] { require_cache(cache).read(layer, indices, out, stream); });
}

HS_API hs_status_t hs_kv_cache_reset_stats(hs_kv_cache_t cache, hs_stream_t stream) {
  return api_guard([&] { require_cache(cache).reset_stats(stream); });
}

HS_API hs_status_t hs_kv_cache_copy_stats_async(hs_kv_cache_t cache, hs_stream_t stream) {
  return api_guard([&] { require_cache(cache).copy_stats_async(stream); });
}

HS_API hs_status_t hs_kv_cache_get_stats(hs_kv_cache_t cache, int32_t group, hs_runtime_stats_t* stats) {
  return api_guard([&] {
    const KvCache& c = require_cache(cache);
    require_struct_size(stats, "stats");
    write_runtime_stats(c.stats(group), stats);
  });
}

}  // extern "C"
