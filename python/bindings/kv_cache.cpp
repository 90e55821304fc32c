// hisparse._C.KvCache (owner of an hs_kv_cache_t) and the KV cache kernels
// (hs_write_rows, hs_read_rows, hs_update_residency) and host registration.
// The cache's tensors and its groups' shared tensors come out as zero-copy
// DLPack arrays owned by the cache object (byte views for the row tensors,
// whose dtype Python restores).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.hpp"

namespace hisparse_py {
namespace {

using Array = nb::ndarray<>;
using OptionalArray = std::optional<nb::ndarray<>>;
using View = nb::ndarray<nb::array_api>;

}  // namespace

nb::dict runtime_stats_dict(const hs_runtime_stats_t& s) {
  nb::dict out;
  out["lookups"] = s.lookups;
  out["hits"] = s.hits;
  out["misses"] = s.misses;
  out["resident"] = s.resident;
  out["invalid"] = s.invalid;
  out["hit_rate"] = s.hit_rate;
  out["bytes_moved"] = s.bytes_moved;
  out["group_row_bytes"] = s.group_row_bytes;
  out["num_layers"] = s.num_layers;
  return out;
}

namespace {

class KvCache {
 public:
  KvCache(int32_t top_k, int32_t device_buffer_size, int32_t max_union_rows, int32_t num_speculative_tokens,
          int32_t row_bytes, int32_t block_size, int32_t hot_block_size, int32_t num_layers,
          const std::vector<int32_t>& layer_groups, int32_t max_requests, int64_t max_seq_len, int32_t resident_pages,
          int64_t resident_page_size, int device_type, int device_index, int32_t kv_dtype, int32_t max_swap_rows,
          uintptr_t host_pool, uintptr_t host_event) {
    const hs_config_t config = make_config(top_k, device_buffer_size, max_union_rows, num_speculative_tokens, row_bytes,
                                           block_size, hot_block_size, false);
    hs_kv_cache_options_t o =
        options(config, num_layers, layer_groups, max_requests, max_seq_len, resident_pages, resident_page_size,
                device_type, device_index, kv_dtype, max_swap_rows, host_pool, host_event);
    hs_status_t status;
    {
      nb::gil_scoped_release release;  // allocates, populates and registers a private pool
      status = hs_kv_cache_create(&o, &handle_);
    }
    check(status);
  }
  ~KvCache() { hs_kv_cache_destroy(handle_); }
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  static uint64_t host_bytes(int32_t top_k, int32_t device_buffer_size, int32_t max_union_rows,
                             int32_t num_speculative_tokens, int32_t row_bytes, int32_t block_size,
                             int32_t hot_block_size, int32_t num_layers, const std::vector<int32_t>& layer_groups,
                             int32_t max_requests, int64_t max_seq_len, int32_t resident_pages,
                             int64_t resident_page_size, int device_type, int device_index, int32_t kv_dtype) {
    const hs_config_t config = make_config(top_k, device_buffer_size, max_union_rows, num_speculative_tokens, row_bytes,
                                           block_size, hot_block_size, false);
    const hs_kv_cache_options_t o = options(config, num_layers, layer_groups, max_requests, max_seq_len, resident_pages,
                                            resident_page_size, device_type, device_index, kv_dtype, 0, 0, 0);
    uint64_t bytes = 0;
    check(hs_kv_cache_host_bytes(&o, &bytes));
    return bytes;
  }

  nb::dict info() const {
    hs_kv_cache_info_t i{};
    i.struct_size = sizeof(i);
    check(hs_kv_cache_get_info(handle_, &i));
    nb::dict out;
    out["num_layers"] = i.num_layers;
    out["num_groups"] = i.num_groups;
    out["max_requests"] = i.max_requests;
    out["resident_pages"] = i.resident_pages;
    out["max_seq_len"] = i.max_seq_len;
    out["resident_page_size"] = i.resident_page_size;
    out["host_rows"] = i.host_rows;
    out["num_blocks"] = i.num_blocks;
    out["blocks_per_request"] = i.blocks_per_request;
    out["active_requests"] = i.active_requests;
    out["is_writer"] = i.is_writer != 0;
    out["host_bytes"] = i.host_bytes;
    out["device_bytes"] = i.device_bytes;
    return out;
  }

  std::tuple<int32_t, int32_t> layer_group(int32_t layer) const {
    int32_t group = -1, leader = -1;
    check(hs_kv_cache_layer_group(handle_, layer, &group, &leader));
    return {group, leader};
  }

  // Tensor `which` of the cache; row tensors (host cache, slab) as bytes.
  View tensor(nb::handle self, int which) const {
    if (which < 0 || which >= HS_KV_CACHE_NUM_TENSORS) {
      throw nb::value_error(
          ("which: expected 0 <= which < " + std::to_string(HS_KV_CACHE_NUM_TENSORS) + ", got " + std::to_string(which))
              .c_str());
    }
    hs_tensor_t t{};
    check(hs_kv_cache_get_tensor(handle_, static_cast<hs_kv_cache_tensor_t>(which), &t));
    if (t.dtype == HS_DTYPE_INT32) return owned_view(t, self);
    int64_t bytes = static_cast<int64_t>(hs_dtype_size(t.dtype));
    for (int d = 0; d < t.ndim; ++d) bytes *= t.shape[d];
    hs_tensor_t raw = t;
    raw.dtype = HS_DTYPE_UINT8;
    raw.ndim = 1;
    raw.shape = &bytes;
    return owned_view(raw, self);
  }

  // Shared tensor `which` of the group of `layer`.
  View group_tensor(nb::handle self, int32_t layer, int which) const {
    if (which < 0 || which >= HS_INDEX_GROUP_NUM_TENSORS) {
      throw nb::value_error(("which: expected 0 <= which < " + std::to_string(HS_INDEX_GROUP_NUM_TENSORS) + ", got " +
                             std::to_string(which))
                                .c_str());
    }
    hs_runtime_t runtime = nullptr;
    check(hs_kv_cache_get_runtime(handle_, layer, &runtime));
    hs_index_group_t group = nullptr;
    check(hs_runtime_get_index_group(runtime, &group));
    hs_tensor_t t{};
    check(hs_index_group_get_tensor(group, static_cast<hs_index_group_tensor_t>(which), &t));
    return owned_view(t, self);
  }

  int32_t admit(int32_t row, uintptr_t stream) {
    int32_t admitted = -1;
    check(hs_kv_cache_admit(handle_, row, &admitted, as_stream(stream)));
    return admitted;
  }
  void release(int32_t row, uintptr_t stream) { check(hs_kv_cache_release(handle_, row, as_stream(stream))); }

  void begin_forward(const Array& seq_lens, uintptr_t stream) {
    const TensorDesc lengths(seq_lens, "seq_lens");
    check(hs_kv_cache_begin_forward(handle_, lengths.get(), as_stream(stream)));
  }

  void write(int32_t layer, const Array& rows, const Array& req_id_per_token, const Array& positions,
             uintptr_t stream) {
    const TensorDesc r(rows, "rows"), req(req_id_per_token, "req_id_per_token"), pos(positions, "positions");
    check(hs_kv_cache_write(handle_, layer, r.get(), req.get(), pos.get(), as_stream(stream)));
  }

  std::tuple<int64_t, int64_t, bool> swap_in(int32_t layer, const OptionalArray& topk_indices,
                                             const OptionalArray& req_id_per_token, const OptionalArray& num_valid_rows,
                                             int64_t num_tokens, int32_t prefetch, int32_t fused_gather,
                                             uintptr_t stream) {
    const OptionalTensorDesc topk(topk_indices, "topk_indices"), req(req_id_per_token, "req_id_per_token"),
        nvr(num_valid_rows, "num_valid_rows");
    hs_kv_cache_swap_in_args_t a;
    hs_kv_cache_swap_in_args_init(&a);
    a.topk_indices = topk.get();
    a.req_id_per_token = req.get();
    a.num_valid_rows = nvr.get();
    a.num_tokens = num_tokens;
    a.prefetch = prefetch;
    a.fused_gather = fused_gather;
    hs_runtime_swap_in_result_t r{};
    r.struct_size = sizeof(r);
    check(hs_kv_cache_swap_in(handle_, layer, &a, &r, as_stream(stream)));
    return {r.first_row, r.num_rows, r.prefetched != 0};
  }

  void read(int32_t layer, const Array& indices, const Array& out, uintptr_t stream) {
    const TensorDesc idx(indices, "indices"), o(out, "out");
    check(hs_kv_cache_read(handle_, layer, idx.get(), o.get(), as_stream(stream)));
  }

  void reset_stats(uintptr_t stream) { check(hs_kv_cache_reset_stats(handle_, as_stream(stream))); }
  void copy_stats_async(uintptr_t stream) { check(hs_kv_cache_copy_stats_async(handle_, as_stream(stream))); }
  nb::dict stats(int32_t group) const {
    hs_runtime_stats_t s{};
    s.struct_size = sizeof(s);
    check(hs_kv_cache_get_stats(handle_, group, &s));
    return runtime_stats_dict(s);
  }

 private:
  static hs_kv_cache_options_t options(const hs_config_t& config, int32_t num_layers,
                                       const std::vector<int32_t>& layer_groups, int32_t max_requests,
                                       int64_t max_seq_len, int32_t resident_pages, int64_t resident_page_size,
                                       int device_type, int device_index, int32_t kv_dtype, int32_t max_swap_rows,
                                       uintptr_t host_pool, uintptr_t host_event) {
    if (!layer_groups.empty() && static_cast<int64_t>(layer_groups.size()) != num_layers) {
      throw nb::value_error(("layer_groups: expected one group per layer (" + std::to_string(num_layers) + "), got " +
                             std::to_string(layer_groups.size()))
                                .c_str());
    }
    hs_kv_cache_options_t o;
    hs_kv_cache_options_init(&o);
    o.config = &config;
    o.num_layers = num_layers;
    o.layer_groups = layer_groups.empty() ? nullptr : layer_groups.data();
    o.max_requests = max_requests;
    o.max_seq_len = max_seq_len;
    o.resident_pages = resident_pages;
    o.resident_page_size = resident_page_size;
    o.device_type = device_type;
    o.device_index = device_index;
    o.kv_dtype = kv_dtype;
    o.max_swap_rows = max_swap_rows;
    o.host_pool = reinterpret_cast<hs_host_pool_t>(host_pool);
    o.host_event = reinterpret_cast<hs_ipc_event_t>(host_event);
    return o;
  }

  hs_kv_cache_t handle_ = nullptr;
};

void write_rows(const Array& rows, const Array& req_id_per_token, const Array& positions,
                const Array& request_state_indices, const OptionalArray& host_cache,
                const OptionalArray& source_block_table, int64_t block_size, int64_t host_rows,
                const OptionalArray& resident_cache, const OptionalArray& resident_block_table,
                const OptionalArray& hot_cache, const OptionalArray& hot_block_table,
                const OptionalArray& device_global_indices, uintptr_t stream) {
  const TensorDesc r(rows, "rows"), req(req_id_per_token, "req_id_per_token"), pos(positions, "positions"),
      rsi(request_state_indices, "request_state_indices");
  const OptionalTensorDesc host(host_cache, "host_cache"), source(source_block_table, "source_block_table"),
      resident(resident_cache, "resident_cache"), rtable(resident_block_table, "resident_block_table"),
      hot(hot_cache, "hot_cache"), htable(hot_block_table, "hot_block_table"),
      dgi(device_global_indices, "device_global_indices");
  hs_write_rows_args_t a;
  hs_write_rows_args_init(&a);
  a.rows = r.get();
  a.req_id_per_token = req.get();
  a.positions = pos.get();
  a.request_state_indices = rsi.get();
  a.host_cache = host.get();
  a.source_block_table = source.get();
  a.block_size = block_size;
  a.host_rows = host_rows;
  a.resident_cache = resident.get();
  a.resident_block_table = rtable.get();
  a.hot_cache = hot.get();
  a.hot_block_table = htable.get();
  a.device_global_indices = dgi.get();
  check(hs_write_rows(&a, as_stream(stream)));
}

void read_rows(const Array& cache, const Array& indices, const Array& out, uintptr_t stream) {
  const TensorDesc c(cache, "cache"), i(indices, "indices"), o(out, "out");
  check(hs_read_rows(c.get(), i.get(), o.get(), as_stream(stream)));
}

void update_residency(const Array& resident_block_table, int64_t table_block_size, int32_t blocks_per_page,
                      int32_t num_pages, const Array& request_state_indices, const Array& seq_lens,
                      const Array& resident_blocks, uintptr_t stream) {
  const TensorDesc table(resident_block_table, "resident_block_table"),
      rsi(request_state_indices, "request_state_indices"), lengths(seq_lens, "seq_lens"),
      blocks(resident_blocks, "resident_blocks");
  hs_update_residency_args_t a;
  hs_update_residency_args_init(&a);
  a.resident_block_table = table.get();
  a.table_block_size = table_block_size;
  a.blocks_per_page = blocks_per_page;
  a.num_pages = num_pages;
  a.request_state_indices = rsi.get();
  a.seq_lens = lengths.get();
  a.resident_blocks = blocks.get();
  check(hs_update_residency(&a, as_stream(stream)));
}

void host_register(uintptr_t data, uint64_t bytes, int device_type, int device_index) {
  hs_status_t status;
  {
    nb::gil_scoped_release release;  // pins pages
    status = hs_host_register(reinterpret_cast<void*>(data), bytes, device_type, device_index);
  }
  check(status);
}

void host_unregister(uintptr_t data) {
  hs_status_t status;
  {
    nb::gil_scoped_release release;
    status = hs_host_unregister(reinterpret_cast<void*>(data));
  }
  check(status);
}

bool host_is_registered(uintptr_t data, uint64_t bytes) {
  int32_t registered = 0;
  check(hs_host_is_registered(reinterpret_cast<const void*>(data), bytes, &registered));
  return registered != 0;
}

}  // namespace

void register_kv_cache(nb::module_& m) {
  nb::class_<KvCache>(m, "KvCache", "A model-level KV cache (hs_kv_cache_t). Use hisparse.KVCache.")
      .def(nb::init<int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, const std::vector<int32_t>&,
                    int32_t, int64_t, int32_t, int64_t, int, int, int32_t, int32_t, uintptr_t, uintptr_t>(),
           nb::arg("top_k"), nb::arg("device_buffer_size"), nb::arg("max_union_rows"),
           nb::arg("num_speculative_tokens"), nb::arg("row_bytes"), nb::arg("block_size"), nb::arg("hot_block_size"),
           nb::arg("num_layers"), nb::arg("layer_groups"), nb::arg("max_requests"), nb::arg("max_seq_len"),
           nb::arg("resident_pages"), nb::arg("resident_page_size"), nb::arg("device_type"), nb::arg("device_index"),
           nb::arg("kv_dtype"), nb::arg("max_swap_rows"), nb::arg("host_pool") = 0, nb::arg("host_event") = 0)
      .def_static("host_bytes", &KvCache::host_bytes, nb::arg("top_k"), nb::arg("device_buffer_size"),
                  nb::arg("max_union_rows"), nb::arg("num_speculative_tokens"), nb::arg("row_bytes"),
                  nb::arg("block_size"), nb::arg("hot_block_size"), nb::arg("num_layers"), nb::arg("layer_groups"),
                  nb::arg("max_requests"), nb::arg("max_seq_len"), nb::arg("resident_pages"),
                  nb::arg("resident_page_size"), nb::arg("device_type"), nb::arg("device_index"), nb::arg("kv_dtype"))
      .def("info", &KvCache::info)
      .def("layer_group", &KvCache::layer_group, nb::arg("layer"))
      .def(
          "tensor", [](nb::handle self, int which) { return nb::cast<KvCache&>(self).tensor(self, which); },
          nb::arg("which"),
          "Zero-copy DLPack array of tensor `which` (row tensors as bytes); it keeps the cache alive.")
      .def(
          "group_tensor",
          [](nb::handle self, int32_t layer, int which) {
            return nb::cast<KvCache&>(self).group_tensor(self, layer, which);
          },
          nb::arg("layer"), nb::arg("which"), "Zero-copy DLPack array of the group tensor `which` of `layer`.")
      .def("admit", &KvCache::admit, nb::arg("row") = -1, nb::arg("stream") = 0)
      .def("release", &KvCache::release, nb::arg("row"), nb::arg("stream") = 0)
      .def("begin_forward", &KvCache::begin_forward, nb::arg("seq_lens").noconvert(), nb::arg("stream") = 0)
      .def("write", &KvCache::write, nb::arg("layer"), nb::arg("rows").noconvert(),
           nb::arg("req_id_per_token").noconvert(), nb::arg("positions").noconvert(), nb::arg("stream") = 0)
      .def("swap_in", &KvCache::swap_in, nb::arg("layer"), nb::arg("topk_indices").noconvert().none(),
           nb::arg("req_id_per_token").noconvert().none(), nb::arg("num_valid_rows").noconvert().none(),
           nb::arg("num_tokens"), nb::arg("prefetch"), nb::arg("fused_gather"), nb::arg("stream"))
      .def("read", &KvCache::read, nb::arg("layer"), nb::arg("indices").noconvert(), nb::arg("out").noconvert(),
           nb::arg("stream") = 0)
      .def("reset_stats", &KvCache::reset_stats, nb::arg("stream") = 0)
      .def("copy_stats_async", &KvCache::copy_stats_async, nb::arg("stream") = 0)
      .def("stats", &KvCache::stats, nb::arg("group") = -1);
  m.attr("KV_CACHE_TENSORS") = [] {
    nb::dict names;
    names["host_cache"] = static_cast<int>(HS_KV_CACHE_HOST_CACHE);
    names["slab"] = static_cast<int>(HS_KV_CACHE_SLAB);
    names["request_state_indices"] = static_cast<int>(HS_KV_CACHE_REQUEST_STATE_INDICES);
    names["source_block_table"] = static_cast<int>(HS_KV_CACHE_SOURCE_BLOCK_TABLE);
    names["hot_block_table"] = static_cast<int>(HS_KV_CACHE_HOT_BLOCK_TABLE);
    names["resident_blocks"] = static_cast<int>(HS_KV_CACHE_RESIDENT_BLOCKS);
    names["resident_block_table"] = static_cast<int>(HS_KV_CACHE_RESIDENT_BLOCK_TABLE);
    names["seq_lens"] = static_cast<int>(HS_KV_CACHE_SEQ_LENS);
    return names;
  }();
  m.def("write_rows", &write_rows, nb::arg("rows").noconvert(), nb::arg("req_id_per_token").noconvert(),
        nb::arg("positions").noconvert(), nb::arg("request_state_indices").noconvert(),
        nb::arg("host_cache").noconvert().none(), nb::arg("source_block_table").noconvert().none(),
        nb::arg("block_size"), nb::arg("host_rows"), nb::arg("resident_cache").noconvert().none(),
        nb::arg("resident_block_table").noconvert().none(), nb::arg("hot_cache").noconvert().none(),
        nb::arg("hot_block_table").noconvert().none(), nb::arg("device_global_indices").noconvert().none(),
        nb::arg("stream") = 0);
  m.def("read_rows", &read_rows, nb::arg("cache").noconvert(), nb::arg("indices").noconvert(),
        nb::arg("out").noconvert(), nb::arg("stream") = 0);
  m.def("update_residency", &update_residency, nb::arg("resident_block_table").noconvert(), nb::arg("table_block_size"),
        nb::arg("blocks_per_page"), nb::arg("num_pages"), nb::arg("request_state_indices").noconvert(),
        nb::arg("seq_lens").noconvert(), nb::arg("resident_blocks").noconvert(), nb::arg("stream") = 0);
  m.def("host_register", &host_register, nb::arg("data"), nb::arg("bytes"), nb::arg("device_type"),
        nb::arg("device_index") = -1);
  m.def("host_unregister", &host_unregister, nb::arg("data"));
  m.def("host_is_registered", &host_is_registered, nb::arg("data"), nb::arg("bytes"));
  m.attr("HOST_ROLE_AUTO") = static_cast<int>(HS_HOST_ROLE_AUTO);
  m.attr("HOST_ROLE_WRITER") = static_cast<int>(HS_HOST_ROLE_WRITER);
  m.attr("HOST_ROLE_READER") = static_cast<int>(HS_HOST_ROLE_READER);
}

}  // namespace hisparse_py
