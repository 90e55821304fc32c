// hisparse._C.Runtime and hisparse._C.SlotInvalidator: owners of an
// hs_runtime_t / hs_slot_invalidator_t. Bound tensors are borrowed by the C
// core; hisparse.Runtime keeps the Python objects alive while they are bound.
// The group's shared tensors come out as zero-copy DLPack arrays owned by the
// runtime object (the group's memory lives while any of its runtimes does).
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

// (data pointer, shape, element strides) of a 3-D view descriptor.
using ViewGeometry =
    std::tuple<uintptr_t, std::tuple<int64_t, int64_t, int64_t>, std::tuple<int64_t, int64_t, int64_t>>;

ViewGeometry geometry(const void* data, const int64_t* shape, const int64_t* strides) {
  return {reinterpret_cast<uintptr_t>(data), {shape[0], shape[1], shape[2]}, {strides[0], strides[1], strides[2]}};
}

ViewGeometry paged_cache_view(const Array& raw_tensor, int32_t dtype, int64_t row_width, int64_t byte_offset,
                              int64_t block_stride, int64_t num_blocks, int64_t block_size) {
  const TensorDesc raw(raw_tensor, "raw_tensor");
  hs_paged_view_t view{};
  view.struct_size = sizeof(view);
  check(hs_paged_cache_view(raw.get(), dtype, row_width, byte_offset, block_stride, num_blocks, block_size, &view));
  return geometry(view.data, view.shape, view.strides);
}

class Runtime {
 public:
  Runtime(int32_t top_k, int32_t device_buffer_size, int32_t max_union_rows, int32_t num_speculative_tokens,
          int32_t row_bytes, int32_t block_size, int32_t hot_block_size, bool eager_host_mirror, int device_type,
          int device_index, int32_t max_num_reqs, int32_t max_swap_rows, int32_t kv_dtype, const Runtime* leader,
          uintptr_t copy_stream, uintptr_t topk_ready_event) {
    const hs_config_t config = make_config(top_k, device_buffer_size, max_union_rows, num_speculative_tokens, row_bytes,
                                           block_size, hot_block_size, eager_host_mirror);
    hs_runtime_options_t options;
    hs_runtime_options_init(&options);
    options.config = &config;
    options.device_type = device_type;
    options.device_index = device_index;
    options.max_num_reqs = max_num_reqs;
    options.max_swap_rows = max_swap_rows;
    options.kv_dtype = kv_dtype;
    options.leader = leader != nullptr ? leader->handle_ : nullptr;
    options.copy_stream = as_stream(copy_stream);
    options.topk_ready_event = reinterpret_cast<void*>(topk_ready_event);
    hs_status_t status;
    {
      nb::gil_scoped_release release;  // allocation and a device sync for a leader
      status = hs_runtime_create(&options, &handle_);
    }
    check(status);
  }
  ~Runtime() { hs_runtime_destroy(handle_); }
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  hs_runtime_t handle() const { return handle_; }

  nb::dict info() const {
    hs_runtime_info_t i{};
    i.struct_size = sizeof(i);
    check(hs_runtime_get_info(handle_, &i));
    nb::dict out;
    out["is_leader"] = i.is_leader != 0;
    out["group_size"] = i.group_size;
    out["device_type"] = i.device_type;
    out["device_index"] = i.device_index;
    out["max_num_reqs"] = i.max_num_reqs;
    out["max_swap_rows"] = i.max_swap_rows;
    out["top_k"] = i.top_k;
    out["device_buffer_size"] = i.device_buffer_size;
    out["max_union_rows"] = i.max_union_rows;
    out["num_speculative_tokens"] = i.num_speculative_tokens;
    out["row_bytes"] = i.row_bytes;
    out["kv_dtype"] = i.kv_dtype;
    out["row_width"] = i.row_width;
    out["block_size"] = i.block_size;
    out["hot_block_size"] = i.hot_block_size;
    out["eager_host_mirror"] = i.eager_host_mirror != 0;
    out["source_bound"] = i.source_bound != 0;
    out["hot_bound"] = i.hot_bound != 0;
    out["staged"] = i.staged != 0;
    out["host_rows"] = i.host_rows;
    out["hot_num_blocks"] = i.hot_num_blocks;
    out["attention_block_stride"] = i.attention_block_stride;
    out["next_row"] = i.next_row;
    out["group_row_bytes"] = i.group_row_bytes;
    out["followers_staged_together"] = i.followers_staged_together != 0;
    out["is_writer"] = i.is_writer != 0;
    out["host_role"] = i.host_role;
    return out;
  }

  View group_tensor(nb::handle self, int which) const {
    if (which < 0 || which >= HS_INDEX_GROUP_NUM_TENSORS) {
      throw nb::value_error(("which: expected 0 <= which < " + std::to_string(HS_INDEX_GROUP_NUM_TENSORS) + ", got " +
                             std::to_string(which))
                                .c_str());
    }
    hs_index_group_t group = nullptr;
    check(hs_runtime_get_index_group(handle_, &group));
    hs_tensor_t t{};
    check(hs_index_group_get_tensor(group, static_cast<hs_index_group_tensor_t>(which), &t));
    return owned_view(t, self);
  }

  // Where the bound hot view lies in the slab the runtime was bound to.
  ViewGeometry hot_cache() const {
    hs_tensor_t t{};
    check(hs_runtime_get_hot_cache(handle_, &t));
    return geometry(t.data, t.shape, t.strides);
  }

  void bind_source_cache(const Array& host_cache, const OptionalArray& registered_host_pool) {
    const TensorDesc cache(host_cache, "host_cache");
    const OptionalTensorDesc pool(registered_host_pool, "registered_host_pool");
    check(hs_runtime_bind_source_cache(handle_, cache.get(), pool.get()));
  }

  void bind_hot_cache(const Array& raw_tensor, int64_t byte_offset, int64_t block_stride, int64_t num_blocks,
                      int64_t block_size, const Array& block_table) {
    const TensorDesc raw(raw_tensor, "raw_tensor"), table(block_table, "block_table");
    hs_hot_cache_binding_t b;
    hs_hot_cache_binding_init(&b);
    b.raw_tensor = raw.get();
    b.byte_offset = byte_offset;
    b.block_stride = block_stride;
    b.num_blocks = num_blocks;
    b.block_size = block_size;
    b.block_table = table.get();
    check(hs_runtime_bind_hot_cache(handle_, &b));
  }

  void unbind() { check(hs_runtime_unbind(handle_)); }
  void begin_forward() { check(hs_runtime_begin_forward(handle_)); }

  std::tuple<int64_t, int64_t, bool> swap_in(const OptionalArray& topk_indices, const OptionalArray& req_id_per_token,
                                             const OptionalArray& request_state_indices,
                                             const OptionalArray& source_block_table, int64_t block_size,
                                             const OptionalArray& resident_block_table, int64_t resident_block_size,
                                             const OptionalArray& num_valid_rows, const OptionalArray& out_attention,
                                             const OptionalArray& out_valid_counts, bool prefetch,
                                             bool ignore_topk_ready, int64_t num_tokens, int32_t fused_gather,
                                             int32_t group_gather, uintptr_t stream, const OptionalArray& seq_lens) {
    const OptionalTensorDesc topk(topk_indices, "topk_indices"), req(req_id_per_token, "req_id_per_token"),
        rsi(request_state_indices, "request_state_indices"), source(source_block_table, "source_block_table"),
        resident(resident_block_table, "resident_block_table"), nvr(num_valid_rows, "num_valid_rows"),
        attention(out_attention, "out_attention"), valid(out_valid_counts, "out_valid_counts"),
        lengths(seq_lens, "seq_lens");
    hs_runtime_swap_in_args_t a;
    hs_runtime_swap_in_args_init(&a);
    a.topk_indices = topk.get();
    a.req_id_per_token = req.get();
    a.request_state_indices = rsi.get();
    a.source_block_table = source.get();
    a.block_size = block_size;
    a.resident_block_table = resident.get();
    a.resident_block_size = resident_block_size;
    a.num_valid_rows = nvr.get();
    a.out_attention = attention.get();
    a.out_valid_counts = valid.get();
    a.prefetch = prefetch ? 1 : 0;
    a.ignore_topk_ready = ignore_topk_ready ? 1 : 0;
    a.num_tokens = num_tokens;
    a.fused_gather = fused_gather;  // the core refuses anything but 0 or 1, naming them
    a.group_gather = group_gather;
    a.seq_lens = lengths.get();
    hs_runtime_swap_in_result_t r{};
    r.struct_size = sizeof(r);
    check(hs_runtime_swap_in(handle_, &a, &r, as_stream(stream)));
    return {r.first_row, r.num_rows, r.prefetched != 0};
  }

  void reset_hot_state(uintptr_t stream) { check(hs_runtime_reset_hot_state(handle_, as_stream(stream))); }

  void invalidate_sorted_slots(const Array& sorted_slots, const Array& state_indices, uintptr_t stream) {
    const TensorDesc slots(sorted_slots, "sorted_slots"), states(state_indices, "state_indices");
    check(hs_runtime_invalidate_sorted_slots(handle_, slots.get(), states.get(), as_stream(stream)));
  }

  void mirror_rows(const Array& src_rows, const Array& slot_mapping, uintptr_t stream) {
    const TensorDesc src(src_rows, "src_rows"), slots(slot_mapping, "slot_mapping");
    check(hs_runtime_mirror_rows(handle_, src.get(), slots.get(), as_stream(stream)));
  }

  void copy_stats_async(uintptr_t stream) { check(hs_runtime_copy_stats_async(handle_, as_stream(stream))); }
  void reset_stats(uintptr_t stream) { check(hs_runtime_reset_stats(handle_, as_stream(stream))); }
  void reset_request(int32_t state_row, uintptr_t stream) {
    check(hs_runtime_reset_request(handle_, state_row, as_stream(stream)));
  }

  void write(const Array& rows, const Array& req_id_per_token, const Array& positions,
             const Array& request_state_indices, const OptionalArray& source_block_table, int64_t block_size,
             const OptionalArray& resident_cache, const OptionalArray& resident_block_table, int32_t skip_host_store,
             uintptr_t stream) {
    const TensorDesc r(rows, "rows"), req(req_id_per_token, "req_id_per_token"), pos(positions, "positions"),
        rsi(request_state_indices, "request_state_indices");
    const OptionalTensorDesc source(source_block_table, "source_block_table"),
        resident(resident_cache, "resident_cache"), rtable(resident_block_table, "resident_block_table");
    hs_runtime_write_args_t a;
    hs_runtime_write_args_init(&a);
    a.rows = r.get();
    a.req_id_per_token = req.get();
    a.positions = pos.get();
    a.request_state_indices = rsi.get();
    a.source_block_table = source.get();
    a.block_size = block_size;
    a.resident_cache = resident.get();
    a.resident_block_table = rtable.get();
    a.skip_host_store = skip_host_store;
    check(hs_runtime_write(handle_, &a, as_stream(stream)));
  }

  void set_host_sharing(int32_t role, uintptr_t event) {
    hs_runtime_host_sharing_t sharing;
    hs_runtime_host_sharing_init(&sharing);
    sharing.role = role;
    sharing.event = reinterpret_cast<hs_ipc_event_t>(event);
    check(hs_runtime_set_host_sharing(handle_, &sharing));
  }

  nb::dict stats() const {
    hs_runtime_stats_t s{};
    s.struct_size = sizeof(s);
    check(hs_runtime_get_stats(handle_, &s));
    return runtime_stats_dict(s);
  }

 private:
  hs_runtime_t handle_ = nullptr;
};

class SlotInvalidator {
 public:
  SlotInvalidator(int device_type, int device_index) {
    check(hs_slot_invalidator_create(device_type, device_index, &handle_));
  }
  ~SlotInvalidator() { hs_slot_invalidator_destroy(handle_); }
  SlotInvalidator(const SlotInvalidator&) = delete;
  SlotInvalidator& operator=(const SlotInvalidator&) = delete;

  void run(const std::vector<const Runtime*>& runtimes, const Array& request_state_indices,
           const Array& req_id_per_token, const Array& written_slots, uintptr_t stream) {
    std::vector<hs_runtime_t> handles;
    handles.reserve(runtimes.size());
    for (const Runtime* runtime : runtimes) {
      if (runtime == nullptr) throw nb::type_error("runtimes: expected hisparse runtimes, got None");
      handles.push_back(runtime->handle());
    }
    const TensorDesc rsi(request_state_indices, "request_state_indices"), req(req_id_per_token, "req_id_per_token"),
        written(written_slots, "written_slots");
    check(hs_slot_invalidator_run(handle_, handles.data(), static_cast<int32_t>(handles.size()), rsi.get(), req.get(),
                                  written.get(), as_stream(stream)));
  }

 private:
  hs_slot_invalidator_t handle_ = nullptr;
};

}  // namespace

void register_runtime(nb::module_& m) {
  nb::class_<Runtime>(m, "Runtime", "A per-layer hisparse runtime (hs_runtime_t). Use hisparse.Runtime.")
      .def(nb::init<int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, bool, int, int, int32_t, int32_t,
                    int32_t, const Runtime*, uintptr_t, uintptr_t>(),
           nb::arg("top_k"), nb::arg("device_buffer_size"), nb::arg("max_union_rows"),
           nb::arg("num_speculative_tokens"), nb::arg("row_bytes"), nb::arg("block_size"), nb::arg("hot_block_size"),
           nb::arg("eager_host_mirror"), nb::arg("device_type"), nb::arg("device_index"), nb::arg("max_num_reqs"),
           nb::arg("max_swap_rows"), nb::arg("kv_dtype"), nb::arg("leader").none(), nb::arg("copy_stream") = 0,
           nb::arg("topk_ready_event") = 0)
      .def("info", &Runtime::info)
      .def(
          "group_tensor", [](nb::handle self, int which) { return nb::cast<Runtime&>(self).group_tensor(self, which); },
          nb::arg("which"), "Zero-copy DLPack array of the group's tensor `which`; it keeps the runtime alive.")
      .def("bind_source_cache", &Runtime::bind_source_cache, nb::arg("host_cache").noconvert(),
           nb::arg("registered_host_pool").noconvert().none() = nb::none())
      .def("bind_hot_cache", &Runtime::bind_hot_cache, nb::arg("raw_tensor").noconvert(), nb::arg("byte_offset"),
           nb::arg("block_stride"), nb::arg("num_blocks"), nb::arg("block_size"), nb::arg("block_table").noconvert())
      .def("hot_cache", &Runtime::hot_cache,
           "(data pointer, shape, element strides) of the bound hot view (hs_runtime_get_hot_cache).")
      .def("unbind", &Runtime::unbind)
      .def("begin_forward", &Runtime::begin_forward)
      .def("swap_in", &Runtime::swap_in, nb::arg("topk_indices").noconvert().none(),
           nb::arg("req_id_per_token").noconvert().none(), nb::arg("request_state_indices").noconvert().none(),
           nb::arg("source_block_table").noconvert().none(), nb::arg("block_size"),
           nb::arg("resident_block_table").noconvert().none(), nb::arg("resident_block_size"),
           nb::arg("num_valid_rows").noconvert().none(), nb::arg("out_attention").noconvert().none(),
           nb::arg("out_valid_counts").noconvert().none(), nb::arg("prefetch"), nb::arg("ignore_topk_ready"),
           nb::arg("num_tokens"), nb::arg("fused_gather"), nb::arg("group_gather"), nb::arg("stream"),
           nb::arg("seq_lens").noconvert().none() = nb::none())
      .def("reset_hot_state", &Runtime::reset_hot_state, nb::arg("stream") = 0)
      .def("invalidate_sorted_slots", &Runtime::invalidate_sorted_slots, nb::arg("sorted_slots").noconvert(),
           nb::arg("state_indices").noconvert(), nb::arg("stream") = 0)
      .def("mirror_rows", &Runtime::mirror_rows, nb::arg("src_rows").noconvert(), nb::arg("slot_mapping").noconvert(),
           nb::arg("stream") = 0)
      .def("copy_stats_async", &Runtime::copy_stats_async, nb::arg("stream") = 0)
      .def("stats", &Runtime::stats)
      .def("reset_stats", &Runtime::reset_stats, nb::arg("stream") = 0)
      .def("reset_request", &Runtime::reset_request, nb::arg("state_row"), nb::arg("stream") = 0)
      .def("write", &Runtime::write, nb::arg("rows").noconvert(), nb::arg("req_id_per_token").noconvert(),
           nb::arg("positions").noconvert(), nb::arg("request_state_indices").noconvert(),
           nb::arg("source_block_table").noconvert().none(), nb::arg("block_size"),
           nb::arg("resident_cache").noconvert().none(), nb::arg("resident_block_table").noconvert().none(),
           nb::arg("skip_host_store"), nb::arg("stream"))
      .def("set_host_sharing", &Runtime::set_host_sharing, nb::arg("role"), nb::arg("event") = 0);

  nb::class_<SlotInvalidator>(m, "SlotInvalidator",
                              "Invalidates rewritten host slots in many index groups (hs_slot_invalidator_t).")
      .def(nb::init<int, int>(), nb::arg("device_type"), nb::arg("device_index"))
      .def("run", &SlotInvalidator::run, nb::arg("runtimes"), nb::arg("request_state_indices").noconvert(),
           nb::arg("req_id_per_token").noconvert(), nb::arg("written_slots").noconvert(), nb::arg("stream") = 0);

  m.def("paged_cache_view", &paged_cache_view, nb::arg("raw_tensor").noconvert(), nb::arg("dtype"),
        nb::arg("row_width"), nb::arg("byte_offset"), nb::arg("block_stride"), nb::arg("num_blocks"),
        nb::arg("block_size"), "(data pointer, shape, element strides) of a paged view (hs_paged_cache_view).");
}

}  // namespace hisparse_py
