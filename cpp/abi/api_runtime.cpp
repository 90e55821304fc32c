// C ABI of the runtime and the slot invalidator: option checks and
// defaults, then the Runtime / SlotInvalidator cores. Each entry point is one
// api_guard, so errors become a status and hs_last_error() text, and a
// runtime stays valid (and keeps its earlier binding) after a failed call.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include "core/backend.hpp"
#include "core/error.hpp"
#include "core/runtime.hpp"
#include "core/slot_invalidator.hpp"

struct hs_runtime {
  std::unique_ptr<hisparse::Runtime> runtime;
};

struct hs_slot_invalidator {
  hs_slot_invalidator(const hisparse::Device& device, hisparse::Backend& backend) : invalidator(device, backend) {}
  hisparse::SlotInvalidator invalidator;
};

namespace hisparse {
namespace {

// (device_type, device_index) -> Device; -1 = the current CUDA device, or
// `fallback` when one is given (a follower inherits its leader's device).
Device to_device(int32_t device_type, int32_t device_index, const Device* fallback) {
  Device device;
  if (device_type == HS_DEVICE_CUDA) {
    device.kind = Device::kCuda;
    if (device_index < -1) {
      invalid_argument("device_index: expected -1 (current device) or a device index >= 0, got ", device_index);
    }
    if (device_index >= 0) {
      device.index = device_index;
    } else if (fallback != nullptr && fallback->is_cuda()) {
      device.index = fallback->index;
    } else {
      Backend* cuda = cuda_backend();
      if (cuda == nullptr) {
        fail(HS_ERROR_UNSUPPORTED, "device_type: HS_DEVICE_CUDA, but hisparse was built without the CUDA backend");
      }
      cuda->check_available();
      device.index = cuda->current_device();
    }
  } else if (device_type != HS_DEVICE_CPU) {
    invalid_argument("device_type: expected HS_DEVICE_CPU (", static_cast<int>(HS_DEVICE_CPU), ") or HS_DEVICE_CUDA (",
                     static_cast<int>(HS_DEVICE_CUDA), "), got ", device_type);
  }
  return device;
}

Runtime& require_runtime(hs_runtime_t runtime, const char* name = "runtime") {
  return *require_pointer(runtime, name)->runtime;
}

// The caller's args with every field past its struct_size read as absent
// (zero): a version-1 caller's struct simply ends before fused_gather, a
// version-2 caller's before group_gather.
constexpr size_t kSwapInArgsAlign = alignof(hs_runtime_swap_in_args_t);
constexpr size_t kSwapInArgsV2Size =
    (offsetof(hs_runtime_swap_in_args_t, fused_gather) + sizeof(int32_t) + kSwapInArgsAlign - 1) / kSwapInArgsAlign *
    kSwapInArgsAlign;
static_assert(offsetof(hs_runtime_swap_in_args_t, group_gather) >= kSwapInArgsV2Size,
              "group_gather must lie past a version-2 struct's padded end, or struct_size cannot tell the "
              "versions apart");

hs_runtime_swap_in_args_t read_swap_in_args(const hs_runtime_swap_in_args_t* args) {
  const hs_runtime_swap_in_args_t& caller =
      require_struct(args, "args", offsetof(hs_runtime_swap_in_args_t, num_tokens) + sizeof(int64_t));
  hs_runtime_swap_in_args_t a;
  std::memset(&a, 0, sizeof(a));
  std::memcpy(&a, &caller, std::min(caller.struct_size, sizeof(a)));
  return a;
}

SlotInvalidator& require_invalidator(hs_slot_invalidator_t invalidator) {
  return require_pointer(invalidator, "invalidator")->invalidator;
}

}  // namespace
}  // namespace hisparse

using namespace hisparse;

extern "C" {

HS_API hs_status_t hs_runtime_create(const hs_runtime_options_t* options, hs_runtime_t* runtime) {
  return api_guard([&] {
    require_pointer(runtime, "runtime");
    *runtime = nullptr;
    const hs_runtime_options_t& o =
        require_struct(options, "options", offsetof(hs_runtime_options_t, topk_ready_event) + sizeof(void*));
    const hs_config_t& config =
        require_struct(o.config, "options->config", offsetof(hs_config_t, eager_host_mirror) + sizeof(int32_t));
    const Runtime* leader = o.leader != nullptr ? &require_runtime(o.leader, "options->leader") : nullptr;

    RuntimeOptions resolved;
    resolved.config = config;
    resolved.config.struct_size = sizeof(hs_config_t);
    if (leader != nullptr && o.device_type != (leader->options().device.is_cuda() ? HS_DEVICE_CUDA : HS_DEVICE_CPU)) {
      invalid_argument("device_type: a follower must live on its group leader's device (",
                       leader->options().device.describe(), "), got device_type ", o.device_type);
    }
    resolved.device = to_device(o.device_type, o.device_index, leader != nullptr ? &leader->options().device : nullptr);
    const bool inherit_reqs = leader != nullptr && o.max_num_reqs == 0;
    resolved.max_num_reqs = inherit_reqs ? leader->options().max_num_reqs : o.max_num_reqs;
    if (o.max_swap_rows < 0) {
      invalid_argument("max_swap_rows: expected 0 (default) or a positive number of token rows, got ", o.max_swap_rows);
    }
    resolved.max_swap_rows = o.max_swap_rows != 0 ? o.max_swap_rows
                             : leader != nullptr  ? leader->options().max_swap_rows
                                                  : resolved.max_num_reqs;
    if (o.kv_dtype < 0 || o.kv_dtype >= HS_NUM_DTYPES) {
      fail(HS_ERROR_INVALID_DTYPE, "kv_dtype: expected an hs_dtype_t in [0, ", static_cast<int>(HS_NUM_DTYPES),
           "), got ", o.kv_dtype);
    }
    resolved.kv_dtype = static_cast<hs_dtype_t>(o.kv_dtype);
    resolved.copy_stream = o.copy_stream;
    resolved.topk_ready = o.topk_ready_event;

    auto handle = std::make_unique<hs_runtime>();
    handle->runtime = leader != nullptr ? std::make_unique<Runtime>(resolved, *o.leader->runtime)
                                        : std::make_unique<Runtime>(resolved);
    *runtime = handle.release();
  });
}

HS_API hs_status_t hs_runtime_destroy(hs_runtime_t runtime) {
  return api_guard([&] { delete runtime; });
}

HS_API hs_status_t hs_runtime_get_index_group(hs_runtime_t runtime, hs_index_group_t* group) {
  return api_guard([&] {
    const Runtime& r = require_runtime(runtime);
    *require_pointer(group, "group") = r.group().index_group();
  });
}

HS_API hs_status_t hs_runtime_get_info(hs_runtime_t runtime, hs_runtime_info_t* info) {
  return api_guard([&] {
    const Runtime& r = require_runtime(runtime);
    require_struct(info, "info", offsetof(hs_runtime_info_t, group_row_bytes) + sizeof(uint64_t));
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
    v.row_bytes = o.config.row_bytes;
    v.kv_dtype = o.kv_dtype;
    v.row_width = r.row_width();
    v.block_size = o.config.block_size;
    v.hot_block_size = o.config.hot_block_size;
    v.eager_host_mirror = o.config.eager_host_mirror;
    v.source_bound = r.source_bound() ? 1 : 0;
    v.hot_bound = r.hot_bound() ? 1 : 0;
    v.staged = r.staged() ? 1 : 0;
    v.host_rows = r.host_rows();
    v.hot_num_blocks = r.hot_num_blocks();
    v.attention_block_stride = r.attention_block_stride();
    v.next_row = r.next_row();
    v.group_row_bytes = r.group().row_bytes();
    v.followers_staged_together = r.followers_staged_together() ? 1 : 0;
    write_struct(info, v, HS_RUNTIME_INFO_VERSION);
  });
}

HS_API hs_status_t hs_runtime_bind_source_cache(hs_runtime_t runtime, const hs_tensor_t* host_cache,
                                                const hs_tensor_t* registered_host_pool) {
  return api_guard([&] { require_runtime(runtime).bind_source_cache(host_cache, registered_host_pool); });
}

HS_API hs_status_t hs_runtime_bind_hot_cache(hs_runtime_t runtime, const hs_hot_cache_binding_t* binding) {
  return api_guard([&] {
    Runtime& r = require_runtime(runtime);
    const hs_hot_cache_binding_t& b =
        require_struct(binding, "binding", offsetof(hs_hot_cache_binding_t, block_table) + sizeof(void*));
    HotCacheBinding hot;
    hot.raw_tensor = b.raw_tensor;
    hot.byte_offset = b.byte_offset;
    hot.block_stride = b.block_stride;
    hot.num_blocks = b.num_blocks;
    hot.block_size = b.block_size;
    hot.block_table = b.block_table;
    r.bind_hot_cache(hot);
  });
}

HS_API hs_status_t hs_runtime_unbind(hs_runtime_t runtime) {
  return api_guard([&] { require_runtime(runtime).unbind(); });
}

HS_API hs_status_t hs_runtime_get_host_cache(hs_runtime_t runtime, hs_tensor_t* out) {
  return api_guard([&] {
    const Runtime& r = require_runtime(runtime);
    *require_pointer(out, "out") = r.host_cache();
  });
}

HS_API hs_status_t hs_runtime_get_hot_cache(hs_runtime_t runtime, hs_tensor_t* out) {
  return api_guard([&] {
    const Runtime& r = require_runtime(runtime);
    *require_pointer(out, "out") = r.hot_cache();
  });
}

HS_API hs_status_t hs_runtime_begin_forward(hs_runtime_t runtime) {
  return api_guard([&] { require_runtime(runtime).begin_forward(); });
}

HS_API hs_status_t hs_runtime_swap_in(hs_runtime_t runtime, const hs_runtime_swap_in_args_t* args,
                                      hs_runtime_swap_in_result_t* result, hs_stream_t stream) {
  return api_guard([&] {
    Runtime& r = require_runtime(runtime);
    const hs_runtime_swap_in_args_t a = read_swap_in_args(args);
    if (result != nullptr) {
      require_struct(result, "result", offsetof(hs_runtime_swap_in_result_t, prefetched) + sizeof(int32_t));
    }
    const SwapInResult s = r.swap_in(a, stream);
    if (result != nullptr) {
      hs_runtime_swap_in_result_t v{};
      v.first_row = s.first_row;
      v.num_rows = s.num_rows;
      v.prefetched = s.prefetched ? 1 : 0;
      write_struct(result, v, HS_RUNTIME_SWAP_IN_RESULT_VERSION);
    }
  });
}

HS_API hs_status_t hs_runtime_reset_hot_state(hs_runtime_t runtime, hs_stream_t stream) {
  return api_guard([&] { require_runtime(runtime).reset_hot_state(stream); });
}

HS_API hs_status_t hs_runtime_invalidate_sorted_slots(hs_runtime_t runtime, const hs_tensor_t* sorted_slots,
                                                      const hs_tensor_t* state_indices, hs_stream_t stream) {
  return api_guard([&] { require_runtime(runtime).invalidate_sorted_slots(sorted_slots, state_indices, stream); });
}

HS_API hs_status_t hs_runtime_mirror_rows(hs_runtime_t runtime, const hs_tensor_t* src_rows,
                                          const hs_tensor_t* slot_mapping, hs_stream_t stream) {
  return api_guard([&] { require_runtime(runtime).mirror_rows(src_rows, slot_mapping, stream); });
}

HS_API hs_status_t hs_runtime_copy_stats_async(hs_runtime_t runtime, hs_stream_t stream) {
  return api_guard([&] { require_runtime(runtime).copy_stats_async(stream); });
}

HS_API hs_status_t hs_runtime_get_stats(hs_runtime_t runtime, hs_runtime_stats_t* stats) {
  return api_guard([&] {
    const Runtime& r = require_runtime(runtime);
    require_struct(stats, "stats", offsetof(hs_runtime_stats_t, bytes_moved) + sizeof(uint64_t));
    const RuntimeStats s = r.stats();
    hs_runtime_stats_t v{};
    v.num_layers = s.num_layers;
    v.lookups = s.counters[HS_STAT_LOOKUPS];
    v.hits = s.counters[HS_STAT_HITS];
    v.misses = s.counters[HS_STAT_MISSES];
    v.resident = s.counters[HS_STAT_RESIDENT];
    v.invalid = s.counters[HS_STAT_INVALID];
    v.hit_rate = s.hit_rate;
    v.group_row_bytes = s.group_row_bytes;
    v.bytes_moved = s.bytes_moved;
    write_struct(stats, v, HS_RUNTIME_STATS_VERSION);
  });
}

HS_API hs_status_t hs_slot_invalidator_create(int32_t device_type, int32_t device_index,
                                              hs_slot_invalidator_t* invalidator) {
  return api_guard([&] {
    require_pointer(invalidator, "invalidator");
    *invalidator = nullptr;
    const Device device = to_device(device_type, device_index, nullptr);
    *invalidator = new hs_slot_invalidator(device, backend_for(device));
  });
}

HS_API hs_status_t hs_slot_invalidator_destroy(hs_slot_invalidator_t invalidator) {
  return api_guard([&] { delete invalidator; });
}

HS_API hs_status_t hs_slot_invalidator_run(hs_slot_invalidator_t invalidator, const hs_runtime_t* runtimes,
                                           int32_t num_runtimes, const hs_tensor_t* request_state_indices,
                                           const hs_tensor_t* req_id_per_token, const hs_tensor_t* written_slots,
                                           hs_stream_t stream) {
  return api_guard([&] {
    SlotInvalidator& inv = require_invalidator(invalidator);
    if (num_runtimes < 0 || num_runtimes > HS_MAX_INVALIDATION_TABLES) {
      invalid_argument("num_runtimes: expected 0 to ", HS_MAX_INVALIDATION_TABLES, ", got ", num_runtimes);
    }
    if (num_runtimes > 0) require_pointer(runtimes, "runtimes");
    std::vector<const hs_tensor_t*> tables;
    tables.reserve(static_cast<size_t>(num_runtimes));
    for (int32_t i = 0; i < num_runtimes; ++i) {
      if (runtimes[i] == nullptr) invalid_argument("runtimes[", i, "]: expected a runtime, got NULL");
      tables.push_back(&runtimes[i]->runtime->group().tensor(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES));
    }
    inv.run(tables, request_state_indices, req_id_per_token, written_slots, stream);
  });
}

}  // extern "C"
