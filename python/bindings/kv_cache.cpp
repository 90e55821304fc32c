// hisparse._C.KvCache (owner of an hs_kv_cache_t) and the KV cache kernels
// (hs_write_rows, hs_read_rows, hs_update_residency) and host registration.
// The cache's tensors and its groups' shared tensors come out as zero-copy
// DLPack arrays (byte views for the row tensors, whose dtype Python
// restores). The handle lives in a state shared by the Python object and
// every view's owner, so a view keeps the cache's memory alive (a borrowed
// host pool and event included), and one that outlives the interpreter's
// teardown leaves no nanobind instance behind.
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.hpp"

namespace hisparse_py {
namespace {

constexpr Access kRead = Access::kRead;
constexpr Access kWrite = Access::kWrite;
using View = nb::ndarray<nb::array_api>;

// The cache, and the host pool and event it borrows (released after it).
struct CacheState {
  std::shared_ptr<void> host_pool, host_event;
  hs_kv_cache_t handle = nullptr;
  ~CacheState() { hs_kv_cache_destroy(handle); }
};

// The layer -> group map: a sequence of ints (a list, tuple, range or 1-D
// array; empty: one group per layer). Strings, mappings and sets are no
// ordered list of ints.
std::vector<int32_t> layer_groups_arg(nb::handle value, int32_t num_layers) {
  std::vector<int32_t> groups;
  if (value.is_none()) return groups;
  PyObject* object = value.ptr();
  if (PyUnicode_Check(object) || PyBytes_Check(object) || PyByteArray_Check(object) || !PySequence_Check(object)) {
    throw nb::type_error(
        ("layer_groups: expected a sequence of ints, got " + std::string(nb::type_name(value.type()).c_str())).c_str());
  }
  size_t i = 0;
  for (nb::handle item : value) {
    const std::string name = "layer_groups[" + std::to_string(i++) + "]";
    groups.push_back(int32_arg(PyInt{item}, name.c_str()));
  }
  // A count of layers the library refuses is named as such there.
  if (num_layers >= 1 && !groups.empty() && static_cast<int64_t>(groups.size()) != num_layers) {
    throw nb::value_error(("layer_groups: expected one group per layer (" + std::to_string(num_layers) + "), got " +
                           std::to_string(groups.size()))
                              .c_str());
  }
  return groups;
}

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
  KvCache(const PyInt& top_k, const PyInt& device_buffer_size, const PyInt& max_union_rows,
          const PyInt& num_speculative_tokens, const PyInt& row_bytes, const PyInt& block_size,
          const PyInt& hot_block_size, const PyInt& num_layers, nb::handle layer_groups, const PyInt& max_requests,
          const PyInt& max_seq_len, const PyInt& resident_pages, const PyInt& resident_page_size,
          const PyInt& device_type, const PyInt& device_index, const PyInt& kv_dtype, const PyInt& max_swap_rows,
          nb::handle host_pool, nb::handle host_event)
      : state_(std::make_shared<CacheState>()) {
    const hs_config_t config = make_config(top_k, device_buffer_size, max_union_rows, num_speculative_tokens, row_bytes,
                                           block_size, hot_block_size, PyBool{nb::handle(Py_False)});
    const int32_t layers = int32_arg(num_layers, "num_layers");
    const std::vector<int32_t> groups = layer_groups_arg(layer_groups, layers);
    hs_kv_cache_options_t o =
        options(config, layers, groups, int32_arg(max_requests, "max_requests"), int_arg(max_seq_len, "max_seq_len"),
                int32_arg(resident_pages, "resident_pages"), int_arg(resident_page_size, "resident_page_size"),
                int32_arg(device_type, "device_type"), int32_arg(device_index, "device_index"),
                int32_arg(kv_dtype, "kv_dtype"), int32_arg(max_swap_rows, "max_swap_rows"));
    state_->host_pool = borrow_host_pool(host_pool, "host_pool", &o.host_pool);
    state_->host_event = borrow_ipc_event(host_event, "host_event", &o.host_event);
    hs_status_t status;
    {
      nb::gil_scoped_release release;  // allocates, populates and registers a private pool
      status = hs_kv_cache_create(&o, &state_->handle);
    }
    check(status);
  }

  static uint64_t host_bytes(const PyInt& top_k, const PyInt& device_buffer_size, const PyInt& max_union_rows,
                             const PyInt& num_speculative_tokens, const PyInt& row_bytes, const PyInt& block_size,
                             const PyInt& hot_block_size, const PyInt& num_layers, nb::handle layer_groups,
                             const PyInt& max_requests, const PyInt& max_seq_len, const PyInt& resident_pages,
                             const PyInt& resident_page_size, const PyInt& device_type, const PyInt& device_index,
                             const PyInt& kv_dtype) {
    const hs_config_t config = make_config(top_k, device_buffer_size, max_union_rows, num_speculative_tokens, row_bytes,
                                           block_size, hot_block_size, PyBool{nb::handle(Py_False)});
    const int32_t layers = int32_arg(num_layers, "num_layers");
    const std::vector<int32_t> groups = layer_groups_arg(layer_groups, layers);
    const hs_kv_cache_options_t o =
        options(config, layers, groups, int32_arg(max_requests, "max_requests"), int_arg(max_seq_len, "max_seq_len"),
                int32_arg(resident_pages, "resident_pages"), int_arg(resident_page_size, "resident_page_size"),
                int32_arg(device_type, "device_type"), int32_arg(device_index, "device_index"),
                int32_arg(kv_dtype, "kv_dtype"), 0);
    uint64_t bytes = 0;
    check(hs_kv_cache_host_bytes(&o, &bytes));
    return bytes;
  }

  nb::dict info() const {
    hs_kv_cache_info_t i{};
    i.struct_size = sizeof(i);
    check(hs_kv_cache_get_info(handle(), &i));
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

  std::tuple<int32_t, int32_t> layer_group(const PyInt& layer) const {
    int32_t group = -1, leader = -1;
    check(hs_kv_cache_layer_group(handle(), int32_arg(layer, "layer"), &group, &leader));
    return {group, leader};
  }

  // Tensor `which` of the cache; row tensors (host cache, slab) as bytes.
  View tensor(const PyInt& which_arg) const {
    const int32_t which = int32_arg(which_arg, "which");
    if (which < 0 || which >= HS_KV_CACHE_NUM_TENSORS) {
      throw nb::value_error(
          ("which: expected 0 <= which < " + std::to_string(HS_KV_CACHE_NUM_TENSORS) + ", got " + std::to_string(which))
              .c_str());
    }
    hs_tensor_t t{};
    check(hs_kv_cache_get_tensor(handle(), static_cast<hs_kv_cache_tensor_t>(which), &t));
    if (t.dtype == HS_DTYPE_INT32) return owned_view(t, state_owner(state_));
    int64_t bytes = static_cast<int64_t>(hs_dtype_size(t.dtype));
    for (int d = 0; d < t.ndim; ++d) bytes *= t.shape[d];
    hs_tensor_t raw = t;
    raw.dtype = HS_DTYPE_UINT8;
    raw.ndim = 1;
    raw.shape = &bytes;
    return owned_view(raw, state_owner(state_));
  }

  // Shared tensor `which` of the group of `layer`.
  View group_tensor(const PyInt& layer_arg, const PyInt& which_arg) const {
    const int32_t layer = int32_arg(layer_arg, "layer");
    const int32_t which = int32_arg(which_arg, "which");
    if (which < 0 || which >= HS_INDEX_GROUP_NUM_TENSORS) {
      throw nb::value_error(("which: expected 0 <= which < " + std::to_string(HS_INDEX_GROUP_NUM_TENSORS) + ", got " +
                             std::to_string(which))
                                .c_str());
    }
    hs_runtime_t runtime = nullptr;
    check(hs_kv_cache_get_runtime(handle(), layer, &runtime));
    hs_index_group_t group = nullptr;
    check(hs_runtime_get_index_group(runtime, &group));
    hs_tensor_t t{};
    check(hs_index_group_get_tensor(group, static_cast<hs_index_group_tensor_t>(which), &t));
    return owned_view(t, state_owner(state_));
  }

  int32_t admit(const PyInt& row, const PyInt& stream) {
    int32_t admitted = -1;
    check(hs_kv_cache_admit(handle(), int32_arg(row, "row"), &admitted, stream_arg(stream)));
    return admitted;
  }
  void release(const PyInt& row, const PyInt& stream) {
    check(hs_kv_cache_release(handle(), int32_arg(row, "row"), stream_arg(stream)));
  }

  void begin_forward(const PyArray& seq_lens, const PyInt& stream) {
    const TensorArg lengths(seq_lens, "seq_lens", kRead);
    check(hs_kv_cache_begin_forward(handle(), lengths.get(), stream_arg(stream)));
  }

  void write(const PyInt& layer, const PyArray& rows, const PyArray& req_id_per_token, const PyArray& positions,
             const PyInt& stream) {
    const TensorArg r(rows, "rows", kRead), req(req_id_per_token, "req_id_per_token", kRead),
        pos(positions, "positions", kRead);
    check(hs_kv_cache_write(handle(), int32_arg(layer, "layer"), r.get(), req.get(), pos.get(), stream_arg(stream)));
  }

  std::tuple<int64_t, int64_t, bool> swap_in(const PyInt& layer, const PyOptionalArray& topk_indices,
                                             const PyOptionalArray& req_id_per_token,
                                             const PyOptionalArray& num_valid_rows, const PyInt& num_tokens,
                                             const PyInt& prefetch, const PyInt& fused_gather, const PyInt& stream) {
    const OptionalTensorArg topk(topk_indices, "topk_indices", kRead), req(req_id_per_token, "req_id_per_token", kRead),
        nvr(num_valid_rows, "num_valid_rows", kRead);
    hs_kv_cache_swap_in_args_t a;
    hs_kv_cache_swap_in_args_init(&a);
    a.topk_indices = topk.get();
    a.req_id_per_token = req.get();
    a.num_valid_rows = nvr.get();
    a.num_tokens = int_arg(num_tokens, "num_tokens");
    a.prefetch = int32_arg(prefetch, "prefetch");
    a.fused_gather = int32_arg(fused_gather, "fused_gather");
    hs_runtime_swap_in_result_t r{};
    r.struct_size = sizeof(r);
    check(hs_kv_cache_swap_in(handle(), int32_arg(layer, "layer"), &a, &r, stream_arg(stream)));
    return {r.first_row, r.num_rows, r.prefetched != 0};
  }

  void read(const PyInt& layer, const PyArray& indices, const PyArray& out, const PyInt& stream) {
    const TensorArg idx(indices, "indices", kRead), o(out, "out", kWrite);
    check(hs_kv_cache_read(handle(), int32_arg(layer, "layer"), idx.get(), o.get(), stream_arg(stream)));
  }

  void reset_stats(const PyInt& stream) { check(hs_kv_cache_reset_stats(handle(), stream_arg(stream))); }
  void copy_stats_async(const PyInt& stream) { check(hs_kv_cache_copy_stats_async(handle(), stream_arg(stream))); }
  nb::dict stats(const PyInt& group) const {
    hs_runtime_stats_t s{};
    s.struct_size = sizeof(s);
    check(hs_kv_cache_get_stats(handle(), int32_arg(group, "group"), &s));
    return runtime_stats_dict(s);
  }

 private:
  static hs_kv_cache_options_t options(const hs_config_t& config, int32_t num_layers,
                                       const std::vector<int32_t>& layer_groups, int32_t max_requests,
                                       int64_t max_seq_len, int32_t resident_pages, int64_t resident_page_size,
                                       int device_type, int device_index, int32_t kv_dtype, int32_t max_swap_rows) {
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
    return o;
  }

  hs_kv_cache_t handle() const { return state_->handle; }

  std::shared_ptr<CacheState> state_;
};

void write_rows(const PyArray& rows, const PyArray& req_id_per_token, const PyArray& positions,
                const PyArray& request_state_indices, const PyOptionalArray& host_cache,
                const PyOptionalArray& source_block_table, const PyInt& block_size, const PyInt& host_rows,
                const PyOptionalArray& resident_cache, const PyOptionalArray& resident_block_table,
                const PyOptionalArray& hot_cache, const PyOptionalArray& hot_block_table,
                const PyOptionalArray& device_global_indices, const PyInt& stream) {
  const TensorArg r(rows, "rows", kRead), req(req_id_per_token, "req_id_per_token", kRead),
      pos(positions, "positions", kRead), rsi(request_state_indices, "request_state_indices", kRead);
  const OptionalTensorArg host(host_cache, "host_cache", kWrite),
      source(source_block_table, "source_block_table", kRead), resident(resident_cache, "resident_cache", kWrite),
      rtable(resident_block_table, "resident_block_table", kRead), hot(hot_cache, "hot_cache", kWrite),
      htable(hot_block_table, "hot_block_table", kRead), dgi(device_global_indices, "device_global_indices", kRead);
  hs_write_rows_args_t a;
  hs_write_rows_args_init(&a);
  a.rows = r.get();
  a.req_id_per_token = req.get();
  a.positions = pos.get();
  a.request_state_indices = rsi.get();
  a.host_cache = host.get();
  a.source_block_table = source.get();
  a.block_size = int_arg(block_size, "block_size");
  a.host_rows = int_arg(host_rows, "host_rows");
  a.resident_cache = resident.get();
  a.resident_block_table = rtable.get();
  a.hot_cache = hot.get();
  a.hot_block_table = htable.get();
  a.device_global_indices = dgi.get();
  check(hs_write_rows(&a, stream_arg(stream)));
}

void read_rows(const PyArray& cache, const PyArray& indices, const PyArray& out, const PyInt& stream) {
  const TensorArg c(cache, "cache", kRead), i(indices, "indices", kRead), o(out, "out", kWrite);
  check(hs_read_rows(c.get(), i.get(), o.get(), stream_arg(stream)));
}

void update_residency(const PyArray& resident_block_table, const PyInt& table_block_size, const PyInt& blocks_per_page,
                      const PyInt& num_pages, const PyArray& request_state_indices, const PyArray& seq_lens,
                      const PyArray& resident_blocks, const PyOptionalArray& ring_pages, const PyInt& stream) {
  const TensorArg table(resident_block_table, "resident_block_table", kWrite),
      rsi(request_state_indices, "request_state_indices", kRead), lengths(seq_lens, "seq_lens", kRead),
      blocks(resident_blocks, "resident_blocks", kRead);
  const OptionalTensorArg ring(ring_pages, "ring_pages", kWrite);
  hs_update_residency_args_t a;
  hs_update_residency_args_init(&a);
  a.resident_block_table = table.get();
  a.table_block_size = int_arg(table_block_size, "table_block_size");
  a.blocks_per_page = int32_arg(blocks_per_page, "blocks_per_page");
  a.num_pages = int32_arg(num_pages, "num_pages");
  a.request_state_indices = rsi.get();
  a.seq_lens = lengths.get();
  a.resident_blocks = blocks.get();
  a.ring_pages = ring.get();
  check(hs_update_residency(&a, stream_arg(stream)));
}

void* address_arg(const PyInt& value, const char* name) {
  return reinterpret_cast<void*>(static_cast<uintptr_t>(uint64_arg(value, name)));
}

void host_register(const PyInt& data, const PyInt& bytes, const PyInt& device_type, const PyInt& device_index) {
  void* const address = address_arg(data, "data");
  const uint64_t size = uint64_arg(bytes, "bytes");
  const int32_t type = int32_arg(device_type, "device_type");
  const int32_t index = int32_arg(device_index, "device_index");
  hs_status_t status;
  {
    nb::gil_scoped_release release;  // pins pages
    status = hs_host_register(address, size, type, index);
  }
  check(status);
}

void host_unregister(const PyInt& data) {
  void* const address = address_arg(data, "data");
  hs_status_t status;
  {
    nb::gil_scoped_release release;
    status = hs_host_unregister(address);
  }
  check(status);
}

bool host_is_registered(const PyInt& data, const PyInt& bytes) {
  int32_t registered = 0;
  check(hs_host_is_registered(address_arg(data, "data"), uint64_arg(bytes, "bytes"), &registered));
  return registered != 0;
}

}  // namespace

void register_kv_cache(nb::module_& m) {
  nb::class_<KvCache>(m, "KvCache", "A model-level KV cache (hs_kv_cache_t). Use hisparse.KVCache.")
      .def(nb::init<const PyInt&, const PyInt&, const PyInt&, const PyInt&, const PyInt&, const PyInt&, const PyInt&,
                    const PyInt&, nb::handle, const PyInt&, const PyInt&, const PyInt&, const PyInt&, const PyInt&,
                    const PyInt&, const PyInt&, const PyInt&, nb::handle, nb::handle>(),
           nb::arg("top_k"), nb::arg("device_buffer_size"), nb::arg("max_union_rows"),
           nb::arg("num_speculative_tokens"), nb::arg("row_bytes"), nb::arg("block_size"), nb::arg("hot_block_size"),
           nb::arg("num_layers"), nb::arg("layer_groups"), nb::arg("max_requests"), nb::arg("max_seq_len"),
           nb::arg("resident_pages"), nb::arg("resident_page_size"), nb::arg("device_type"), nb::arg("device_index"),
           nb::arg("kv_dtype"), nb::arg("max_swap_rows"), nb::arg("host_pool") = nb::none(),
           nb::arg("host_event") = nb::none())
      .def_static("host_bytes", &KvCache::host_bytes, nb::arg("top_k"), nb::arg("device_buffer_size"),
                  nb::arg("max_union_rows"), nb::arg("num_speculative_tokens"), nb::arg("row_bytes"),
                  nb::arg("block_size"), nb::arg("hot_block_size"), nb::arg("num_layers"), nb::arg("layer_groups"),
                  nb::arg("max_requests"), nb::arg("max_seq_len"), nb::arg("resident_pages"),
                  nb::arg("resident_page_size"), nb::arg("device_type"), nb::arg("device_index"), nb::arg("kv_dtype"))
      .def("info", &KvCache::info)
      .def("layer_group", &KvCache::layer_group, nb::arg("layer"))
      .def("tensor", &KvCache::tensor, nb::arg("which"),
           "Zero-copy DLPack array of tensor `which` (row tensors as bytes); it keeps the cache's memory alive.")
      .def("group_tensor", &KvCache::group_tensor, nb::arg("layer"), nb::arg("which"),
           "Zero-copy DLPack array of the group tensor `which` of `layer`.")
      .def("admit", &KvCache::admit, nb::arg("row") = -1, nb::arg("stream") = 0)
      .def("release", &KvCache::release, nb::arg("row"), nb::arg("stream") = 0)
      .def("begin_forward", &KvCache::begin_forward, nb::arg("seq_lens"), nb::arg("stream") = 0)
      .def("write", &KvCache::write, nb::arg("layer"), nb::arg("rows"), nb::arg("req_id_per_token"),
           nb::arg("positions"), nb::arg("stream") = 0)
      .def("swap_in", &KvCache::swap_in, nb::arg("layer"), nb::arg("topk_indices"), nb::arg("req_id_per_token"),
           nb::arg("num_valid_rows"), nb::arg("num_tokens"), nb::arg("prefetch"), nb::arg("fused_gather"),
           nb::arg("stream"))
      .def("read", &KvCache::read, nb::arg("layer"), nb::arg("indices"), nb::arg("out"), nb::arg("stream") = 0)
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
    names["ring_pages"] = static_cast<int>(HS_KV_CACHE_RING_PAGES);
    return names;
  }();
  m.def("write_rows", &write_rows, nb::arg("rows"), nb::arg("req_id_per_token"), nb::arg("positions"),
        nb::arg("request_state_indices"), nb::arg("host_cache"), nb::arg("source_block_table"), nb::arg("block_size"),
        nb::arg("host_rows"), nb::arg("resident_cache"), nb::arg("resident_block_table"), nb::arg("hot_cache"),
        nb::arg("hot_block_table"), nb::arg("device_global_indices"), nb::arg("stream") = 0);
  m.def("read_rows", &read_rows, nb::arg("cache"), nb::arg("indices"), nb::arg("out"), nb::arg("stream") = 0);
  m.def("update_residency", &update_residency, nb::arg("resident_block_table"), nb::arg("table_block_size"),
        nb::arg("blocks_per_page"), nb::arg("num_pages"), nb::arg("request_state_indices"), nb::arg("seq_lens"),
        nb::arg("resident_blocks"), nb::arg("ring_pages"), nb::arg("stream") = 0);
  m.def("host_register", &host_register, nb::arg("data"), nb::arg("bytes"), nb::arg("device_type"),
        nb::arg("device_index") = -1);
  m.def("host_unregister", &host_unregister, nb::arg("data"));
  m.def("host_is_registered", &host_is_registered, nb::arg("data"), nb::arg("bytes"));
  m.attr("HOST_ROLE_AUTO") = static_cast<int>(HS_HOST_ROLE_AUTO);
  m.attr("HOST_ROLE_WRITER") = static_cast<int>(HS_HOST_ROLE_WRITER);
  m.attr("HOST_ROLE_READER") = static_cast<int>(HS_HOST_ROLE_READER);
}

}  // namespace hisparse_py
