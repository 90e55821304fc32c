// C ABI of the index group: option checks and defaults, then the IndexGroup
// core. Each entry point is one api_guard, so errors become a status and
// hs_last_error() text and the group stays valid after a failed call.
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "core/backend.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/index_group.hpp"

struct hs_index_group {
  hs_index_group(const hisparse::IndexGroupOptions& options, hisparse::Backend& backend) : group(options, backend) {}
  hisparse::IndexGroup group;
};

namespace hisparse {
namespace {

IndexGroupOptions to_options(const hs_index_group_options_t& o) {
  IndexGroupOptions options;
  if (o.device_type == HS_DEVICE_CUDA) {
    options.device.kind = Device::kCuda;
    if (o.device_index < -1) {
      invalid_argument("device_index: expected -1 (current device) or a device index >= 0, got ", o.device_index);
    }
    if (o.device_index == -1) {
      Backend* cuda = cuda_backend();
      if (cuda == nullptr) {
        fail(HS_ERROR_UNSUPPORTED, "device_type: HS_DEVICE_CUDA, but hisparse was built without the CUDA backend");
      }
      cuda->check_available();
      options.device.index = cuda->current_device();
    } else {
      options.device.index = o.device_index;
    }
  } else if (o.device_type != HS_DEVICE_CPU) {
    invalid_argument("device_type: expected HS_DEVICE_CPU (", static_cast<int>(HS_DEVICE_CPU), ") or HS_DEVICE_CUDA (",
                     static_cast<int>(HS_DEVICE_CUDA), "), got ", o.device_type);
  }
  options.max_num_reqs = o.max_num_reqs;
  options.device_buffer_size = o.device_buffer_size;
  options.max_swap_rows = o.max_swap_rows == 0 ? o.max_num_reqs : o.max_swap_rows;
  options.top_k = o.top_k;
  options.max_union_rows = o.max_union_rows == 0 ? std::min(o.top_k, o.device_buffer_size) : o.max_union_rows;
  return options;
}

IndexGroup& require_group(hs_index_group_t group) { return require_pointer(group, "group")->group; }

// The caller's args with every field past its struct_size read as absent
// (zero): a version-1 caller's struct simply ends before the fused gather.
hs_index_group_resolve_args_t read_resolve_args(const hs_index_group_resolve_args_t* args) {
  const hs_index_group_resolve_args_t& caller = require_struct(
      args, "args", offsetof(hs_index_group_resolve_args_t, out_valid_counts) + sizeof(args->out_valid_counts));
  hs_index_group_resolve_args_t a;
  std::memset(&a, 0, sizeof(a));
  std::memcpy(&a, &caller, std::min(caller.struct_size, sizeof(a)));
  return a;
}

}  // namespace
}  // namespace hisparse

using namespace hisparse;

extern "C" {

HS_API hs_status_t hs_index_group_create(const hs_index_group_options_t* options, hs_index_group_t* group) {
  return api_guard([&] {
    require_pointer(group, "group");
    *group = nullptr;
    const hs_index_group_options_t& o =
        require_struct(options, "options", offsetof(hs_index_group_options_t, max_union_rows) + sizeof(int32_t));
    const IndexGroupOptions resolved = to_options(o);
    validate_index_group_options(resolved);
    Backend& backend = backend_for(resolved.device);
    *group = new hs_index_group(resolved, backend);
  });
}

HS_API hs_status_t hs_index_group_destroy(hs_index_group_t group) {
  return api_guard([&] { delete group; });
}

HS_API hs_status_t hs_index_group_get_info(hs_index_group_t group, hs_index_group_info_t* info) {
  return api_guard([&] {
    const IndexGroup& g = require_group(group);
    require_struct(info, "info", offsetof(hs_index_group_info_t, device_bytes) + sizeof(uint64_t));
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
    write_struct(info, value, HS_INDEX_GROUP_INFO_VERSION);
  });
}

HS_API hs_status_t hs_index_group_get_tensor(hs_index_group_t group, hs_index_group_tensor_t which, hs_tensor_t* out) {
  return api_guard([&] {
    const IndexGroup& g = require_group(group);
    *require_pointer(out, "out") = g.tensor(which);
  });
}

HS_API hs_status_t hs_index_group_reset(hs_index_group_t group, hs_stream_t stream) {
  return api_guard([&] { require_group(group).reset(stream); });
}

HS_API hs_status_t hs_index_group_invalidate_sorted_slots(hs_index_group_t group, const hs_tensor_t* sorted_slots,
                                                          const hs_tensor_t* state_indices, hs_stream_t stream) {
  return api_guard([&] { require_group(group).invalidate_sorted_slots(sorted_slots, state_indices, stream); });
}

HS_API hs_status_t hs_index_group_copy_stats_async(hs_index_group_t group, hs_stream_t stream) {
  return api_guard([&] { require_group(group).copy_stats_async(stream); });
}

HS_API hs_status_t hs_index_group_read_stats(hs_index_group_t group, int64_t* values, int32_t count) {
  return api_guard([&] {
    const IndexGroup& g = require_group(group);
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
    IndexGroup& g = require_group(group);
    g.resolve(read_resolve_args(args), stream);
  });
}

}  // extern "C"
