// Version, build facts, devices, host memory, layout sizing, configuration.
#include <nanobind/stl/string.h>

#include <string>

#include "bindings.hpp"

namespace hisparse_py {

hs_config_t make_config(const PyInt& top_k, const PyInt& device_buffer_size, const PyInt& max_union_rows,
                        const PyInt& num_speculative_tokens, const PyInt& row_bytes, const PyInt& block_size,
                        const PyInt& hot_block_size, const PyBool& eager_host_mirror) {
  hs_config_t config;
  hs_config_init(&config);
  config.top_k = int32_arg(top_k, "top_k");
  config.device_buffer_size = int32_arg(device_buffer_size, "device_buffer_size");
  config.max_union_rows = int32_arg(max_union_rows, "max_union_rows");
  config.num_speculative_tokens = int32_arg(num_speculative_tokens, "num_speculative_tokens");
  config.row_bytes = int32_arg(row_bytes, "row_bytes");
  config.block_size = int32_arg(block_size, "block_size");
  config.hot_block_size = int32_arg(hot_block_size, "hot_block_size");
  config.eager_host_mirror = bool_arg(eager_host_mirror, "eager_host_mirror") ? 1 : 0;
  return config;
}

namespace {

nb::dict build_info() {
  hs_build_info_t info{};
  info.struct_size = sizeof(info);
  check(hs_get_build_info(&info));
  nb::dict out;
  out["version"] = std::string(hs_version_string());
  out["cuda_compiled"] = info.cuda_compiled != 0;
  out["cuda_runtime_version"] = info.cuda_runtime_version;
  out["cuda_architectures"] = std::string(info.cuda_architectures);
  out["build_type"] = std::string(info.build_type);
  out["compiler"] = std::string(info.compiler);
  return out;
}

nb::dict device_properties(const PyInt& device) {
  hs_device_properties_t props{};
  props.struct_size = sizeof(props);
  check(hs_cuda_device_properties(int32_arg(device, "device"), &props));
  nb::dict out;
  out["name"] = std::string(props.name);
  out["compute_capability"] = nb::make_tuple(props.major, props.minor);
  out["multiprocessor_count"] = props.multiprocessor_count;
  out["unified_addressing"] = props.unified_addressing != 0;
  out["can_map_host_memory"] = props.can_map_host_memory != 0;
  out["total_global_memory"] = props.total_global_memory;
  out["l2_cache_bytes"] = props.l2_cache_bytes;
  out["max_shared_memory_per_block"] = props.max_shared_memory_per_block;
  return out;
}

nb::tuple plan_host_layout(const PyInt& page_size_bytes, const PyInt& block_size, const PyInt& max_model_len,
                           const PyInt& host_budget_bytes) {
  hs_host_layout_t layout{};
  layout.struct_size = sizeof(layout);
  check(hs_plan_host_layout(uint64_arg(page_size_bytes, "page_size_bytes"), int_arg(block_size, "block_size"),
                            int_arg(max_model_len, "max_model_len"), uint64_arg(host_budget_bytes, "host_budget_bytes"),
                            &layout));
  return nb::make_tuple(layout.host_num_blocks, layout.host_block_stride, layout.min_host_blocks);
}

nb::dict default_config() {
  hs_config_t config;
  hs_config_init(&config);
  nb::dict out;
  out["top_k"] = config.top_k;
  out["device_buffer_size"] = config.device_buffer_size;
  out["max_union_rows"] = config.max_union_rows;
  out["num_speculative_tokens"] = config.num_speculative_tokens;
  out["row_bytes"] = config.row_bytes;
  out["block_size"] = config.block_size;
  out["hot_block_size"] = config.hot_block_size;
  out["eager_host_mirror"] = config.eager_host_mirror != 0;
  return out;
}

void validate_config(const PyInt& top_k, const PyInt& device_buffer_size, const PyInt& max_union_rows,
                     const PyInt& num_speculative_tokens, const PyInt& row_bytes, const PyInt& block_size,
                     const PyInt& hot_block_size, const PyBool& eager_host_mirror, const PyInt& device) {
  const hs_config_t config = make_config(top_k, device_buffer_size, max_union_rows, num_speculative_tokens, row_bytes,
                                         block_size, hot_block_size, eager_host_mirror);
  check(hs_config_validate(&config, int32_arg(device, "device")));
}

// dtype name -> (hs_dtype_t code, bytes per element), from the library.
nb::dict dtypes() {
  nb::dict out;
  for (int code = 0; code < HS_NUM_DTYPES; ++code) {
    const auto dtype = static_cast<hs_dtype_t>(code);
    out[hs_dtype_name(dtype)] = nb::make_tuple(code, hs_dtype_size(dtype));
  }
  return out;
}

// Names of the counters of a stats tensor, in hs_stat_t order.
nb::tuple stat_names() {
  const char* names[HS_NUM_STATS] = {};
  names[HS_STAT_LOOKUPS] = "lookups";
  names[HS_STAT_HITS] = "hits";
  names[HS_STAT_MISSES] = "misses";
  names[HS_STAT_RESIDENT] = "resident";
  names[HS_STAT_INVALID] = "invalid";
  nb::list out;
  for (const char* name : names) out.append(name);
  return nb::tuple(out);
}

}  // namespace

void register_core(nb::module_& m) {
  m.def("version", [] { return std::string(hs_version_string()); }, "Runtime version string of libhisparse.");
  m.def("version_code", [] {
    int code = 0;
    check(hs_get_version(&code));
    return code;
  });
  m.def("build_info", &build_info, "How libhisparse was built (never touches a GPU).");
  m.def(
      "cuda_device_count",
      [] {
        int count = 0;
        check(hs_cuda_device_count(&count));
        return count;
      },
      "CUDA devices visible (0 without the backend or a driver). Initialises CUDA.");
  m.def(
      "cuda_unavailable_reason", [] { return std::string(hs_cuda_unavailable_reason()); },
      "Why the CUDA backend cannot be used ('' when it can). Initialises CUDA.");
  m.def("cuda_device_properties", &device_properties, nb::arg("device"));
  m.def(
      "available_host_memory",
      [] {
        uint64_t bytes = 0;
        check(hs_available_host_memory(&bytes));
        return bytes;
      },
      "Bytes of RAM available to a new allocation.");
  m.def(
      "check_host_memory",
      [](const PyInt& pool_bytes) { check(hs_check_host_memory(uint64_arg(pool_bytes, "pool_bytes"))); },
      nb::arg("pool_bytes"), "Raise ValueError when a pool of pool_bytes would not fit in RAM.");
  m.def("plan_host_layout", &plan_host_layout, nb::arg("page_size_bytes"), nb::arg("block_size"),
        nb::arg("max_model_len"), nb::arg("host_budget_bytes"),
        "(host_num_blocks, host_block_stride, min_host_blocks) for a host budget.");
  m.def("default_config", &default_config, "hs_config_init's values (max_union_rows 0 = its default).");
  m.def("validate_config", &validate_config, nb::arg("top_k"), nb::arg("device_buffer_size"), nb::arg("max_union_rows"),
        nb::arg("num_speculative_tokens"), nb::arg("row_bytes"), nb::arg("block_size"), nb::arg("hot_block_size"),
        nb::arg("eager_host_mirror"), nb::arg("device"));
  m.def(
      "default_max_union_rows",
      [](const PyInt& top_k, const PyInt& num_speculative_tokens) {
        int32_t rows = 0;
        check(hs_default_max_union_rows(int32_arg(top_k, "top_k"),
                                        int32_arg(num_speculative_tokens, "num_speculative_tokens"), &rows));
        return rows;
      },
      nb::arg("top_k"), nb::arg("num_speculative_tokens"),
      "The default max_union_rows: top_k x (1 + num_speculative_tokens).");
  m.def(
      "default_max_swap_rows",
      [](const PyInt& max_num_reqs, const PyInt& num_speculative_tokens) {
        int32_t rows = 0;
        check(hs_default_max_swap_rows(int32_arg(max_num_reqs, "max_num_reqs"),
                                       int32_arg(num_speculative_tokens, "num_speculative_tokens"), &rows));
        return rows;
      },
      nb::arg("max_num_reqs"), nb::arg("num_speculative_tokens"),
      "The default max_swap_rows: max_num_reqs x (1 + num_speculative_tokens).");
  m.def(
      "resolver_shared_memory_bytes",
      [](const PyInt& device_buffer_size, const PyInt& max_union_rows) {
        uint64_t bytes = 0;
        check(hs_resolver_shared_memory_bytes(int32_arg(device_buffer_size, "device_buffer_size"),
                                              int32_arg(max_union_rows, "max_union_rows"), &bytes));
        return bytes;
      },
      nb::arg("device_buffer_size"), nb::arg("max_union_rows"));
  m.def(
      "resolver_workspace_bytes",
      [](const PyInt& num_state_rows, const PyInt& device_buffer_size, const PyInt& max_union_rows,
         const PyInt& device) {
        uint64_t bytes = 0;
        check(hs_resolver_workspace_bytes(
            int_arg(num_state_rows, "num_state_rows"), int32_arg(device_buffer_size, "device_buffer_size"),
            int32_arg(max_union_rows, "max_union_rows"), int32_arg(device, "device"), &bytes));
        return bytes;
      },
      nb::arg("num_state_rows"), nb::arg("device_buffer_size"), nb::arg("max_union_rows"), nb::arg("device"),
      "Bytes of workspace the CUDA resolver needs on `device` (0: none).");
  m.attr("NUM_STATS") = static_cast<int>(HS_NUM_STATS);
  m.attr("STAT_NAMES") = stat_names();
  m.attr("DTYPES") = dtypes();
  m.attr("DEVICE_CPU") = static_cast<int>(HS_DEVICE_CPU);
  m.attr("DEVICE_CUDA") = static_cast<int>(HS_DEVICE_CUDA);
}

}  // namespace hisparse_py
