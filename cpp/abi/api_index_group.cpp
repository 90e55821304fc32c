// C ABI of the index group: each entry point converts its arguments to core
// types and calls the IndexGroup core.
#include <algorithm>

#include "abi/api_guard.hpp"
#include "abi/handles.hpp"
#include "core/backend.hpp"
#include "core/index_group.hpp"

using namespace hisparse;

extern "C" {

HS_API hs_status_t hs_index_group_create(const hs_index_group_options_t* options, hs_index_group_t* group) {
  return api_guard([&] {
    require_pointer(group, "group");
    *group = nullptr;
    const hs_index_group_options_t o = read_struct<HS_INDEX_GROUP_OPTIONS_VERSION>(options, "options");
    IndexGroupOptions core;
    core.device = device_from(o.device_type, o.device_index);
    core.max_num_reqs = o.max_num_reqs;
    core.device_buffer_size = o.device_buffer_size;
    core.max_swap_rows = o.max_swap_rows;
    core.top_k = o.top_k;
    core.max_union_rows = o.max_union_rows;
    core.num_speculative_tokens = o.num_speculative_tokens;
    // Options first, then the backend: a bad option is named even where the
    // device's backend is missing.
    const IndexGroupOptions resolved = resolve_index_group_options(core);
    *group = to_handle(new IndexGroup(resolved, backend_for(resolved.device, "device_index")));
    list_handle(*group, HandleKind::kIndexGroup);
  });
}

HS_API hs_status_t hs_index_group_destroy(hs_index_group_t group) {
  return api_guard([&] {
    if (take_handle(group, HandleKind::kIndexGroup, "group", "hs_index_group_t")) {
      delete reinterpret_cast<IndexGroup*>(group);
    }
  });
}

HS_API hs_status_t hs_index_group_get_info(hs_index_group_t group, hs_index_group_info_t* info) {
  return api_guard([&] {
    const IndexGroup& g = from_handle(group, "group");
    require_struct_size(info, "info");
    const IndexGroupOptions& o = g.options();
    hs_index_group_info_t value{};
    value.device_type = o.device.is_cuda() ? HS_DEVICE_CUDA : HS_DEVICE_CPU;
    value.device_index = o.device.is_cuda() ? o.device.index : 0;
    value.max_num_reqs = o.max_num_reqs;
    value.device_buffer_size = o.device_buffer_size;
    value.max_swap_rows = o.max_swap_rows;
    value.top_k = o.top_k;
    value.max_union_rows = o.max_union_rows;
    value.device_bytes = g.device_bytes();
    write_struct<HS_INDEX_GROUP_INFO_VERSION>(info, value);
  });
}

HS_API hs_status_t hs_index_group_get_tensor(hs_index_group_t group, hs_index_group_tensor_t which, hs_tensor_t* out) {
  return api_guard([&] {
    const IndexGroup& g = from_handle(group, "group");
    *require_pointer(out, "out") = g.tensor(which);
  });
}

HS_API hs_status_t hs_index_group_reset(hs_index_group_t group, hs_stream_t stream) {
  return api_guard([&] { from_handle(group, "group").reset(stream); });
}

HS_API hs_status_t hs_index_group_invalidate_sorted_slots(hs_index_group_t group, const hs_tensor_t* sorted_slots,
                                                          const hs_tensor_t* state_indices, hs_stream_t stream) {
  return api_guard([&] { from_handle(group, "group").invalidate_sorted_slots(sorted_slots, state_indices, stream); });
}

HS_API hs_status_t hs_index_group_copy_stats_async(hs_index_group_t group, hs_stream_t stream) {
  return api_guard([&] { from_handle(group, "group").copy_stats_async(stream); });
}

HS_API hs_status_t hs_index_group_read_stats(hs_index_group_t group, int64_t* values, int32_t count) {
  return api_guard([&] {
    const IndexGroup& g = from_handle(group, "group");
    require_pointer(values, "values");
    if (count < 0 || count > HS_NUM_STATS) {
      invalid_argument("count: expected 0 <= count <= HS_NUM_STATS (", static_cast<int>(HS_NUM_STATS), "), got ",
                       count);
    }
    const auto stats = g.read_stats();
    std::copy_n(stats.begin(), count, values);
  });
}

HS_API hs_status_t hs_index_group_resolve(hs_index_group_t group, const hs_index_group_resolve_args_t* args,
                                          hs_stream_t stream) {
  return api_guard([&] {
    IndexGroup& g = from_handle(group, "group");
    g.resolve(g.resolve_params(read_struct<HS_INDEX_GROUP_RESOLVE_ARGS_VERSION>(args, "args")), stream);
  });
}

}  // extern "C"
