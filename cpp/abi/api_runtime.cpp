// C ABI of the runtime and the slot invalidator: each entry point converts
// its arguments to core types and calls the Runtime / SlotInvalidator core.
// A runtime stays valid (and keeps its earlier binding) after a failed call.
#include <memory>
#include <vector>

#include "abi/api_guard.hpp"
#include "abi/handles.hpp"
#include "abi/runtime_stats.hpp"
#include "core/backend.hpp"
#include "core/config.hpp"
#include "core/paged_view.hpp"
#include "core/runtime.hpp"
#include "core/slot_invalidator.hpp"

using namespace hisparse;

namespace {

hs_residency_hint_choice_t residency_hint_choice(int32_t value) {
  if (value != HS_RESIDENCY_HINT_OFF && value != HS_RESIDENCY_HINT_ON && value != HS_RESIDENCY_HINT_AUTO) {
    invalid_argument("residency_hint: expected HS_RESIDENCY_HINT_OFF (0), HS_RESIDENCY_HINT_ON (1) or "
                     "HS_RESIDENCY_HINT_AUTO (2), got ",
                     value);
  }
  return static_cast<hs_residency_hint_choice_t>(value);
}

}  // namespace

extern "C" {

HS_API hs_status_t hs_runtime_default_residency_hint(const hs_config_t* config, int32_t max_num_reqs,
                                                     int32_t device_type, int32_t device_index, int32_t* keeps) {
  return api_guard([&] {
    require_pointer(keeps, "keeps");
    const hs_config_t resolved = resolve_config(read_struct<HS_CONFIG_VERSION>(config, "config"));
    if (max_num_reqs < 1) invalid_argument("max_num_reqs: expected at least one request state row, got ", max_num_reqs);
    const Device device = device_from(device_type, device_index);
    *keeps = device.is_cuda() &&
                     residency_hint_pays(backend_for(device, "device_index"), device.index, resolved, max_num_reqs)
                 ? 1
                 : 0;
  });
}

HS_API hs_status_t hs_runtime_create(const hs_runtime_options_t* options, hs_runtime_t* runtime) {
  return api_guard([&] {
    require_pointer(runtime, "runtime");
    *runtime = nullptr;
    const hs_runtime_options_t o = read_struct<HS_RUNTIME_OPTIONS_VERSION>(options, "options");
    Runtime* leader = o.leader != nullptr ? &from_handle(o.leader, "options->leader") : nullptr;

    RuntimeOptions core;
    core.config = read_struct<HS_CONFIG_VERSION>(o.config, "options->config");
    if (leader != nullptr && o.device_type != (leader->options().device.is_cuda() ? HS_DEVICE_CUDA : HS_DEVICE_CPU)) {
      invalid_argument("device_type: a follower must live on its group leader's device (",
                       leader->options().device.describe(), "), got device_type ", o.device_type);
    }
    core.device = device_from(o.device_type, o.device_index, leader != nullptr ? &leader->options().device : nullptr);
    core.max_num_reqs = o.max_num_reqs;
    core.max_swap_rows = o.max_swap_rows;
    if (o.kv_dtype < 0 || o.kv_dtype >= HS_NUM_DTYPES) {
      fail(HS_ERROR_INVALID_DTYPE, "kv_dtype: expected an hs_dtype_t in [0, ", static_cast<int>(HS_NUM_DTYPES),
           "), got ", o.kv_dtype);
    }
    core.kv_dtype = static_cast<hs_dtype_t>(o.kv_dtype);
    core.residency_hint = residency_hint_choice(o.residency_hint);
    core.copy_stream = o.copy_stream;
    core.topk_ready = o.topk_ready_event;
    *runtime = to_handle(leader != nullptr ? new Runtime(core, *leader) : new Runtime(core));
    list_handle(*runtime, HandleKind::kRuntime);
  });
}

HS_API hs_status_t hs_runtime_destroy(hs_runtime_t runtime) {
  return api_guard([&] {
    if (!take_handle(runtime, HandleKind::kRuntime, "runtime", "hs_runtime_t")) return;
    auto* r = reinterpret_cast<Runtime*>(runtime);
    // The group (and the index group handle it hands out) dies with its last runtime.
    const bool last = r->group().size() == 1;
    const IndexGroup* group = &r->group().index_group();
    delete r;
    if (last) unlist_handle(group);
  });
}

HS_API hs_status_t hs_runtime_get_index_group(hs_runtime_t runtime, hs_index_group_t* group) {
  return api_guard([&] {
    Runtime& r = from_handle(runtime, "runtime");
    *require_pointer(group, "group") = to_handle(&r.group().index_group());
    list_handle(*group, HandleKind::kRuntimeIndexGroup);
  });
}

HS_API hs_status_t hs_runtime_get_info(hs_runtime_t runtime, hs_runtime_info_t* info) {
  return api_guard([&] {
    const Runtime& r = from_handle(runtime, "runtime");
    require_struct_size(info, "info");
    const RuntimeOptions& o = r.options();
    hs_runtime_info_t v{};
    v.is_leader = r.is_leader() ? 1 : 0;
    v.group_size = r.group().size();
    v.device_type = o.device.is_cuda() ? HS_DEVICE_CUDA : HS_DEVICE_CPU;
    v.device_index = o.device.is_cuda() ? o.device.index : 0;
    v.max_num_reqs = o.max_num_reqs;
    v.max_swap_rows = o.max_swap_rows;
    v.top_k = o.config.top_k;
    v.device_buffer_size = o.config.device_buffer_size;
    v.max_union_rows = o.config.max_union_rows;
    v.num_speculative_tokens = o.config.num_speculative_tokens;
    v.row_bytes = o.config.row_bytes;
    v.kv_dtype = o.kv_dtype;
    v.row_width = r.row_width();
    v.block_size = o.config.block_size;
    v.hot_block_size = o.config.hot_block_size;
    v.eager_host_mirror = o.config.eager_host_mirror;
    v.source_bound = r.source_bound() ? 1 : 0;
    v.hot_bound = r.hot_bound() ? 1 : 0;
    v.staged = r.staged() ? 1 : 0;
    v.followers_staged_together = r.followers_staged_together() ? 1 : 0;
    v.host_rows = r.host_rows();
    v.hot_num_blocks = r.hot_num_blocks();
    v.attention_block_stride = r.attention_block_stride();
    v.next_row = r.next_row();
    v.group_row_bytes = r.group().row_bytes();
    v.is_writer = r.is_writer() ? 1 : 0;
    v.host_role = r.host_role();
    v.residency_hint = r.group().keeps_residency_hint() ? 1 : 0;
    write_struct<HS_RUNTIME_INFO_VERSION>(info, v);
  });
}

HS_API hs_status_t hs_runtime_bind_source_cache(hs_runtime_t runtime, const hs_tensor_t* host_cache,
                                                const hs_tensor_t* registered_host_pool) {
  return api_guard([&] { bindable_runtime(runtime, "runtime").bind_source_cache(host_cache, registered_host_pool); });
}

HS_API hs_status_t hs_runtime_bind_hot_cache(hs_runtime_t runtime, const hs_hot_cache_binding_t* binding) {
  return api_guard([&] {
    Runtime& r = bindable_runtime(runtime, "runtime");
    r.bind_hot_cache(read_struct<HS_HOT_CACHE_BINDING_VERSION>(binding, "binding"));
  });
}

HS_API hs_status_t hs_paged_cache_view(const hs_tensor_t* raw_tensor, int32_t dtype, int64_t row_width,
                                       int64_t byte_offset, int64_t block_stride, int64_t num_blocks,
                                       int64_t block_size, hs_paged_view_t* view) {
  return api_guard([&] {
    require_struct_size(view, "view");
    const PagedView v = paged_view(TensorArg(raw_tensor, "raw_tensor"), static_cast<hs_dtype_t>(dtype), row_width,
                                   byte_offset, block_stride, num_blocks, block_size);
    hs_paged_view_t value{};
    value.data = v.data;
    for (int d = 0; d < 3; ++d) {
      value.shape[d] = v.shape[d];
      value.strides[d] = v.strides[d];
    }
    write_struct<HS_PAGED_VIEW_VERSION>(view, value);
  });
}

HS_API hs_status_t hs_runtime_unbind(hs_runtime_t runtime) {
  return api_guard([&] { bindable_runtime(runtime, "runtime").unbind(); });
}

HS_API hs_status_t hs_runtime_get_host_cache(hs_runtime_t runtime, hs_tensor_t* out) {
  return api_guard([&] {
    const Runtime& r = from_handle(runtime, "runtime");
    *require_pointer(out, "out") = r.host_cache();
  });
}

HS_API hs_status_t hs_runtime_get_hot_cache(hs_runtime_t runtime, hs_tensor_t* out) {
  return api_guard([&] {
    const Runtime& r = from_handle(runtime, "runtime");
    *require_pointer(out, "out") = r.hot_cache();
  });
}

HS_API hs_status_t hs_runtime_begin_forward(hs_runtime_t runtime) {
  return api_guard([&] { from_handle(runtime, "runtime").begin_forward(); });
}

HS_API hs_status_t hs_runtime_swap_in(hs_runtime_t runtime, const hs_runtime_swap_in_args_t* args,
                                      hs_runtime_swap_in_result_t* result, hs_stream_t stream) {
  return api_guard([&] {
    Runtime& r = from_handle(runtime, "runtime");
    const hs_runtime_swap_in_args_t a = read_struct<HS_RUNTIME_SWAP_IN_ARGS_VERSION>(args, "args");
    if (result != nullptr) require_struct_size(result, "result");
    const SwapInResult s = r.swap_in(a, stream);
    if (result != nullptr) {
      hs_runtime_swap_in_result_t v{};
      v.first_row = s.first_row;
      v.num_rows = s.num_rows;
      v.prefetched = s.prefetched ? 1 : 0;
      write_struct<HS_RUNTIME_SWAP_IN_RESULT_VERSION>(result, v);
    }
  });
}

HS_API hs_status_t hs_runtime_reset_hot_state(hs_runtime_t runtime, hs_stream_t stream) {
  return api_guard([&] { from_handle(runtime, "runtime").reset_hot_state(stream); });
}

HS_API hs_status_t hs_runtime_rebuild_residency_hint(hs_runtime_t runtime, hs_stream_t stream) {
  return api_guard([&] { from_handle(runtime, "runtime").rebuild_residency_hint(stream); });
}

HS_API hs_status_t hs_runtime_invalidate_sorted_slots(hs_runtime_t runtime, const hs_tensor_t* sorted_slots,
                                                      const hs_tensor_t* state_indices, hs_stream_t stream) {
  return api_guard(
      [&] { from_handle(runtime, "runtime").invalidate_sorted_slots(sorted_slots, state_indices, stream); });
}

HS_API hs_status_t hs_runtime_mirror_rows(hs_runtime_t runtime, const hs_tensor_t* src_rows,
                                          const hs_tensor_t* slot_mapping, hs_stream_t stream) {
  return api_guard([&] { from_handle(runtime, "runtime").mirror_rows(src_rows, slot_mapping, stream); });
}

HS_API hs_status_t hs_runtime_copy_stats_async(hs_runtime_t runtime, hs_stream_t stream) {
  return api_guard([&] { from_handle(runtime, "runtime").copy_stats_async(stream); });
}

HS_API hs_status_t hs_runtime_get_stats(hs_runtime_t runtime, hs_runtime_stats_t* stats) {
  return api_guard([&] {
    const Runtime& r = from_handle(runtime, "runtime");
    require_struct_size(stats, "stats");
    write_runtime_stats(r.stats(), stats);
  });
}

HS_API hs_status_t hs_slot_invalidator_create(int32_t device_type, int32_t device_index,
                                              hs_slot_invalidator_t* invalidator) {
  return api_guard([&] {
    require_pointer(invalidator, "invalidator");
    *invalidator = nullptr;
    const Device device = device_from(device_type, device_index);
    *invalidator = to_handle(new SlotInvalidator(device, backend_for(device, "device_index")));
    list_handle(*invalidator, HandleKind::kSlotInvalidator);
  });
}

HS_API hs_status_t hs_slot_invalidator_destroy(hs_slot_invalidator_t invalidator) {
  return api_guard([&] {
    if (take_handle(invalidator, HandleKind::kSlotInvalidator, "invalidator", "hs_slot_invalidator_t")) {
      delete reinterpret_cast<SlotInvalidator*>(invalidator);
    }
  });
}

HS_API hs_status_t hs_slot_invalidator_run(hs_slot_invalidator_t invalidator, const hs_runtime_t* runtimes,
                                           int32_t num_runtimes, const hs_tensor_t* request_state_indices,
                                           const hs_tensor_t* req_id_per_token, const hs_tensor_t* written_slots,
                                           hs_stream_t stream) {
  return api_guard([&] {
    SlotInvalidator& inv = from_handle(invalidator, "invalidator");
    if (num_runtimes < 0 || num_runtimes > HS_MAX_INVALIDATION_TABLES) {
      invalid_argument("num_runtimes: expected 0 to ", HS_MAX_INVALIDATION_TABLES, ", got ", num_runtimes);
    }
    if (num_runtimes > 0) require_pointer(runtimes, "runtimes");
    std::vector<const IndexGroup*> groups;
    groups.reserve(static_cast<size_t>(num_runtimes));
    for (int32_t i = 0; i < num_runtimes; ++i) {
      groups.push_back(&from_handle(runtimes[i], str("runtimes[", i, "]").c_str()).group().index_group());
    }
    inv.run(groups, request_state_indices, req_id_per_token, written_slots, stream);
  });
}

}  // extern "C"
