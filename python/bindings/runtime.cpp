// hisparse._C.Runtime and hisparse._C.SlotInvalidator: owners of an
// hs_runtime_t / hs_slot_invalidator_t. The C core borrows bound tensors; the
// runtime's state keeps the Python objects it was bound to alive until they
// are unbound, so no binding outlives its memory. The group's shared tensors
// come out as zero-copy DLPack arrays owned by that state (the group's memory
// lives while any of its runtimes does, and a view keeps its runtime, bound
// as it was, alive), never by the nanobind instance.
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

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

// (data pointer, shape, element strides) of a 3-D view descriptor.
using ViewGeometry =
    std::tuple<uintptr_t, std::tuple<int64_t, int64_t, int64_t>, std::tuple<int64_t, int64_t, int64_t>>;

ViewGeometry geometry(const void* data, const int64_t* shape, const int64_t* strides) {
  return {reinterpret_cast<uintptr_t>(data), {shape[0], shape[1], shape[2]}, {strides[0], strides[1], strides[2]}};
}

ViewGeometry paged_cache_view(const PyArray& raw_tensor, const PyInt& dtype, const PyInt& row_width,
                              const PyInt& byte_offset, const PyInt& block_stride, const PyInt& num_blocks,
                              const PyInt& block_size) {
  const TensorArg raw(raw_tensor, "raw_tensor", kRead);
  hs_paged_view_t view{};
  view.struct_size = sizeof(view);
  check(hs_paged_cache_view(raw.get(), int32_arg(dtype, "dtype"), int_arg(row_width, "row_width"),
                            int_arg(byte_offset, "byte_offset"), int_arg(block_stride, "block_stride"),
                            int_arg(num_blocks, "num_blocks"), int_arg(block_size, "block_size"), &view));
  return geometry(view.data, view.shape, view.strides);
}

// The runtime handle and the Python objects its bindings borrow, and its
// host event (released after the runtime).
struct RuntimeState {
  std::shared_ptr<void> host_event;
  hs_runtime_t handle = nullptr;
  nb::object host_cache, registered_host_pool, raw_tensor, block_table;
  ~RuntimeState() { hs_runtime_destroy(handle); }
};

class Runtime {
 public:
  Runtime(const PyInt& top_k, const PyInt& device_buffer_size, const PyInt& max_union_rows,
          const PyInt& num_speculative_tokens, const PyInt& row_bytes, const PyInt& block_size,
          const PyInt& hot_block_size, const PyBool& eager_host_mirror, const PyInt& device_type,
          const PyInt& device_index, const PyInt& max_num_reqs, const PyInt& max_swap_rows, const PyInt& kv_dtype,
          nb::handle leader_arg, const PyInt& copy_stream, const PyInt& topk_ready_event, const PyInt& residency_hint)
      : state_(std::make_shared<RuntimeState>()) {
    const hs_config_t config = make_config(top_k, device_buffer_size, max_union_rows, num_speculative_tokens, row_bytes,
                                           block_size, hot_block_size, eager_host_mirror);
    const Runtime* leader = object_arg<Runtime>(leader_arg, "leader", "a hisparse._C.Runtime", true);
    hs_runtime_options_t options;
    hs_runtime_options_init(&options);
    options.config = &config;
    options.device_type = int32_arg(device_type, "device_type");
    options.device_index = int32_arg(device_index, "device_index");
    options.max_num_reqs = int32_arg(max_num_reqs, "max_num_reqs");
    options.max_swap_rows = int32_arg(max_swap_rows, "max_swap_rows");
    options.kv_dtype = int32_arg(kv_dtype, "kv_dtype");
    options.leader = leader != nullptr ? leader->handle() : nullptr;
    options.copy_stream = stream_arg(copy_stream, "copy_stream");
    options.topk_ready_event = reinterpret_cast<void*>(stream_arg(topk_ready_event, "topk_ready_event"));
    options.residency_hint = int32_arg(residency_hint, "residency_hint");
    hs_status_t status;
    {
      nb::gil_scoped_release release;  // allocation and a device sync for a leader
      status = hs_runtime_create(&options, &state_->handle);
    }
    check(status);
  }

  hs_runtime_t handle() const { return state_->handle; }

  nb::dict info() const {
    hs_runtime_info_t i{};
    i.struct_size = sizeof(i);
    check(hs_runtime_get_info(handle(), &i));
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
    out["residency_hint"] = i.residency_hint != 0;
    return out;
  }

  View group_tensor(const PyInt& which_arg) const {
    const int32_t which = int32_arg(which_arg, "which");
    if (which < 0 || which >= HS_INDEX_GROUP_NUM_TENSORS) {
      throw nb::value_error(("which: expected 0 <= which < " + std::to_string(HS_INDEX_GROUP_NUM_TENSORS) + ", got " +
                             std::to_string(which))
                                .c_str());
    }
    hs_index_group_t group = nullptr;
    check(hs_runtime_get_index_group(handle(), &group));
    hs_tensor_t t{};
    check(hs_index_group_get_tensor(group, static_cast<hs_index_group_tensor_t>(which), &t));
    return owned_view(t, state_owner(state_));
  }

  // Where the bound hot view lies in the slab the runtime was bound to.
  ViewGeometry hot_cache() const {
    hs_tensor_t t{};
    check(hs_runtime_get_hot_cache(handle(), &t));
    return geometry(t.data, t.shape, t.strides);
  }

  void bind_source_cache(const PyArray& host_cache, const PyOptionalArray& registered_host_pool) {
    // Written by mirror_rows, read by the gathers.
    const TensorArg cache(host_cache, "host_cache", kWrite);
    const OptionalTensorArg pool(registered_host_pool, "registered_host_pool", kRead);
    check(hs_runtime_bind_source_cache(handle(), cache.get(), pool.get()));
    state_->host_cache = nb::borrow(host_cache.value);
    state_->registered_host_pool = nb::borrow(registered_host_pool.value);
  }

  void bind_hot_cache(const PyArray& raw_tensor, const PyInt& byte_offset, const PyInt& block_stride,
                      const PyInt& num_blocks, const PyInt& block_size, const PyArray& block_table) {
    const TensorArg raw(raw_tensor, "raw_tensor", kWrite), table(block_table, "block_table", kRead);
    hs_hot_cache_binding_t b;
    hs_hot_cache_binding_init(&b);
    b.raw_tensor = raw.get();
    b.byte_offset = int_arg(byte_offset, "byte_offset");
    b.block_stride = int_arg(block_stride, "block_stride");
    b.num_blocks = int_arg(num_blocks, "num_blocks");
    b.block_size = int_arg(block_size, "block_size");
    b.block_table = table.get();
    check(hs_runtime_bind_hot_cache(handle(), &b));
    state_->raw_tensor = nb::borrow(raw_tensor.value);
    state_->block_table = nb::borrow(block_table.value);
  }

  void unbind() {
    check(hs_runtime_unbind(handle()));
    state_->host_cache = state_->registered_host_pool = state_->raw_tensor = state_->block_table = nb::object();
  }
  void begin_forward() { check(hs_runtime_begin_forward(handle())); }

  std::tuple<int64_t, int64_t, bool> swap_in(
      const PyOptionalArray& topk_indices, const PyOptionalArray& req_id_per_token,
      const PyOptionalArray& request_state_indices, const PyOptionalArray& source_block_table, const PyInt& block_size,
      const PyOptionalArray& resident_block_table, const PyInt& resident_block_size,
      const PyOptionalArray& num_valid_rows, const PyOptionalArray& out_attention,
      const PyOptionalArray& out_valid_counts, const PyBool& prefetch, const PyBool& ignore_topk_ready,
      const PyInt& num_tokens, const PyInt& fused_gather, const PyInt& group_gather, const PyInt& stream,
      const PyOptionalArray& seq_lens) {
    const OptionalTensorArg topk(topk_indices, "topk_indices", kRead), req(req_id_per_token, "req_id_per_token", kRead),
        rsi(request_state_indices, "request_state_indices", kRead),
        source(source_block_table, "source_block_table", kRead),
        resident(resident_block_table, "resident_block_table", kRead), nvr(num_valid_rows, "num_valid_rows", kRead),
        attention(out_attention, "out_attention", kWrite), valid(out_valid_counts, "out_valid_counts", kWrite),
        lengths(seq_lens, "seq_lens", kRead);
    hs_runtime_swap_in_args_t a;
    hs_runtime_swap_in_args_init(&a);
    a.topk_indices = topk.get();
    a.req_id_per_token = req.get();
    a.request_state_indices = rsi.get();
    a.source_block_table = source.get();
    a.block_size = int_arg(block_size, "block_size");
    a.resident_block_table = resident.get();
    a.resident_block_size = int_arg(resident_block_size, "resident_block_size");
    a.num_valid_rows = nvr.get();
    a.out_attention = attention.get();
    a.out_valid_counts = valid.get();
    a.prefetch = bool_arg(prefetch, "prefetch") ? 1 : 0;
    a.ignore_topk_ready = bool_arg(ignore_topk_ready, "ignore_topk_ready") ? 1 : 0;
    a.num_tokens = int_arg(num_tokens, "num_tokens");
    a.fused_gather = int32_arg(fused_gather, "fused_gather");  // the core refuses anything but 0 or 1, naming them
    a.group_gather = int32_arg(group_gather, "group_gather");
    a.seq_lens = lengths.get();
    hs_runtime_swap_in_result_t r{};
    r.struct_size = sizeof(r);
    check(hs_runtime_swap_in(handle(), &a, &r, stream_arg(stream)));
    return {r.first_row, r.num_rows, r.prefetched != 0};
  }

  void reset_hot_state(const PyInt& stream) { check(hs_runtime_reset_hot_state(handle(), stream_arg(stream))); }
  void rebuild_residency_hint(const PyInt& stream) {
    check(hs_runtime_rebuild_residency_hint(handle(), stream_arg(stream)));
  }

  void invalidate_sorted_slots(const PyArray& sorted_slots, const PyArray& state_indices, const PyInt& stream) {
    const TensorArg slots(sorted_slots, "sorted_slots", kRead), states(state_indices, "state_indices", kRead);
    check(hs_runtime_invalidate_sorted_slots(handle(), slots.get(), states.get(), stream_arg(stream)));
  }

  void mirror_rows(const PyArray& src_rows, const PyArray& slot_mapping, const PyInt& stream) {
    const TensorArg src(src_rows, "src_rows", kRead), slots(slot_mapping, "slot_mapping", kRead);
    check(hs_runtime_mirror_rows(handle(), src.get(), slots.get(), stream_arg(stream)));
  }

  void copy_stats_async(const PyInt& stream) { check(hs_runtime_copy_stats_async(handle(), stream_arg(stream))); }
  void reset_stats(const PyInt& stream) { check(hs_runtime_reset_stats(handle(), stream_arg(stream))); }
  void reset_request(const PyInt& state_row, const PyInt& stream) {
    check(hs_runtime_reset_request(handle(), int32_arg(state_row, "state_row"), stream_arg(stream)));
  }

  void write(const PyArray& rows, const PyArray& req_id_per_token, const PyArray& positions,
             const PyArray& request_state_indices, const PyOptionalArray& source_block_table, const PyInt& block_size,
             const PyOptionalArray& resident_cache, const PyOptionalArray& resident_block_table,
             const PyInt& skip_host_store, const PyInt& stream) {
    const TensorArg r(rows, "rows", kRead), req(req_id_per_token, "req_id_per_token", kRead),
        pos(positions, "positions", kRead), rsi(request_state_indices, "request_state_indices", kRead);
    const OptionalTensorArg source(source_block_table, "source_block_table", kRead),
        resident(resident_cache, "resident_cache", kWrite), rtable(resident_block_table, "resident_block_table", kRead);
    hs_runtime_write_args_t a;
    hs_runtime_write_args_init(&a);
    a.rows = r.get();
    a.req_id_per_token = req.get();
    a.positions = pos.get();
    a.request_state_indices = rsi.get();
    a.source_block_table = source.get();
    a.block_size = int_arg(block_size, "block_size");
    a.resident_cache = resident.get();
    a.resident_block_table = rtable.get();
    a.skip_host_store = int32_arg(skip_host_store, "skip_host_store");
    check(hs_runtime_write(handle(), &a, stream_arg(stream)));
  }

  void set_host_sharing(const PyInt& role, nb::handle event) {
    hs_runtime_host_sharing_t sharing;
    hs_runtime_host_sharing_init(&sharing);
    sharing.role = int32_arg(role, "role");
    std::shared_ptr<void> borrowed = borrow_ipc_event(event, "event", &sharing.event);
    check(hs_runtime_set_host_sharing(handle(), &sharing));
    state_->host_event = std::move(borrowed);  // the one the runtime now holds
  }

  nb::dict stats() const {
    hs_runtime_stats_t s{};
    s.struct_size = sizeof(s);
    check(hs_runtime_get_stats(handle(), &s));
    return runtime_stats_dict(s);
  }

 private:
  std::shared_ptr<RuntimeState> state_;
};

class SlotInvalidator {
 public:
  SlotInvalidator(const PyInt& device_type, const PyInt& device_index) {
    check(hs_slot_invalidator_create(int32_arg(device_type, "device_type"), int32_arg(device_index, "device_index"),
                                     &handle_));
  }
  ~SlotInvalidator() { hs_slot_invalidator_destroy(handle_); }
  SlotInvalidator(const SlotInvalidator&) = delete;
  SlotInvalidator& operator=(const SlotInvalidator&) = delete;

  void run(nb::handle runtimes, const PyArray& request_state_indices, const PyArray& req_id_per_token,
           const PyArray& written_slots, const PyInt& stream) {
    if (!PyList_Check(runtimes.ptr()) && !PyTuple_Check(runtimes.ptr())) {
      throw nb::type_error((std::string("runtimes: expected a list of hisparse._C.Runtime, got ") +
                            nb::type_name(runtimes.type()).c_str())
                               .c_str());
    }
    std::vector<hs_runtime_t> handles;
    for (nb::handle item : runtimes) {
      const std::string name = "runtimes[" + std::to_string(handles.size()) + "]";
      handles.push_back(object_arg<Runtime>(item, name.c_str(), "a hisparse._C.Runtime")->handle());
    }
    if (handles.size() > static_cast<size_t>(INT32_MAX)) throw nb::value_error("runtimes: too many runtimes");
    const TensorArg rsi(request_state_indices, "request_state_indices", kRead),
        req(req_id_per_token, "req_id_per_token", kRead), written(written_slots, "written_slots", kRead);
    check(hs_slot_invalidator_run(handle_, handles.data(), static_cast<int32_t>(handles.size()), rsi.get(), req.get(),
                                  written.get(), stream_arg(stream)));
  }

 private:
  hs_slot_invalidator_t handle_ = nullptr;
};

}  // namespace

void register_runtime(nb::module_& m) {
  m.attr("DEFAULT_FUSED_GATHER") = HS_DEFAULT_FUSED_GATHER;
  m.attr("RESIDENCY_HINT_OFF") = static_cast<int>(HS_RESIDENCY_HINT_OFF);
  m.attr("RESIDENCY_HINT_ON") = static_cast<int>(HS_RESIDENCY_HINT_ON);
  m.attr("RESIDENCY_HINT_AUTO") = static_cast<int>(HS_RESIDENCY_HINT_AUTO);
  m.def(
      "runtime_default_residency_hint",
      [](const PyInt& top_k, const PyInt& device_buffer_size, const PyInt& max_union_rows,
         const PyInt& num_speculative_tokens, const PyInt& row_bytes, const PyInt& block_size,
         const PyInt& hot_block_size, const PyBool& eager_host_mirror, const PyInt& max_num_reqs,
         const PyInt& device_type, const PyInt& device_index) {
        const hs_config_t config = make_config(top_k, device_buffer_size, max_union_rows, num_speculative_tokens,
                                               row_bytes, block_size, hot_block_size, eager_host_mirror);
        int32_t keeps = 0;
        check(hs_runtime_default_residency_hint(&config, int32_arg(max_num_reqs, "max_num_reqs"),
                                                int32_arg(device_type, "device_type"),
                                                int32_arg(device_index, "device_index"), &keeps));
        return keeps != 0;
      },
      nb::arg("top_k"), nb::arg("device_buffer_size"), nb::arg("max_union_rows"), nb::arg("num_speculative_tokens"),
      nb::arg("row_bytes"), nb::arg("block_size"), nb::arg("hot_block_size"), nb::arg("eager_host_mirror"),
      nb::arg("max_num_reqs"), nb::arg("device_type"), nb::arg("device_index"),
      "Whether a leader created with residency_hint=RESIDENCY_HINT_AUTO keeps a hint "
      "(hs_runtime_default_residency_hint).");
  nb::class_<Runtime>(m, "Runtime", "A per-layer hisparse runtime (hs_runtime_t). Use hisparse.Runtime.")
      .def(nb::init<const PyInt&, const PyInt&, const PyInt&, const PyInt&, const PyInt&, const PyInt&, const PyInt&,
                    const PyBool&, const PyInt&, const PyInt&, const PyInt&, const PyInt&, const PyInt&, nb::handle,
                    const PyInt&, const PyInt&, const PyInt&>(),
           nb::arg("top_k"), nb::arg("device_buffer_size"), nb::arg("max_union_rows"),
           nb::arg("num_speculative_tokens"), nb::arg("row_bytes"), nb::arg("block_size"), nb::arg("hot_block_size"),
           nb::arg("eager_host_mirror"), nb::arg("device_type"), nb::arg("device_index"), nb::arg("max_num_reqs"),
           nb::arg("max_swap_rows"), nb::arg("kv_dtype"), nb::arg("leader").none(), nb::arg("copy_stream") = 0,
           nb::arg("topk_ready_event") = 0, nb::arg("residency_hint") = static_cast<int>(HS_RESIDENCY_HINT_AUTO))
      .def("info", &Runtime::info)
      .def("group_tensor", &Runtime::group_tensor, nb::arg("which"),
           "Zero-copy DLPack array of the group's tensor `which`; it keeps the runtime alive.")
      .def("bind_source_cache", &Runtime::bind_source_cache, nb::arg("host_cache"),
           nb::arg("registered_host_pool") = nb::none())
      .def("bind_hot_cache", &Runtime::bind_hot_cache, nb::arg("raw_tensor"), nb::arg("byte_offset"),
           nb::arg("block_stride"), nb::arg("num_blocks"), nb::arg("block_size"), nb::arg("block_table"))
      .def("hot_cache", &Runtime::hot_cache,
           "(data pointer, shape, element strides) of the bound hot view (hs_runtime_get_hot_cache).")
      .def("unbind", &Runtime::unbind)
      .def("begin_forward", &Runtime::begin_forward)
      .def("swap_in", &Runtime::swap_in, nb::arg("topk_indices"), nb::arg("req_id_per_token"),
           nb::arg("request_state_indices"), nb::arg("source_block_table"), nb::arg("block_size"),
           nb::arg("resident_block_table"), nb::arg("resident_block_size"), nb::arg("num_valid_rows"),
           nb::arg("out_attention"), nb::arg("out_valid_counts"), nb::arg("prefetch"), nb::arg("ignore_topk_ready"),
           nb::arg("num_tokens"), nb::arg("fused_gather"), nb::arg("group_gather"), nb::arg("stream"),
           nb::arg("seq_lens") = nb::none())
      .def("reset_hot_state", &Runtime::reset_hot_state, nb::arg("stream") = 0)
      .def("rebuild_residency_hint", &Runtime::rebuild_residency_hint, nb::arg("stream") = 0)
      .def("invalidate_sorted_slots", &Runtime::invalidate_sorted_slots, nb::arg("sorted_slots"),
           nb::arg("state_indices"), nb::arg("stream") = 0)
      .def("mirror_rows", &Runtime::mirror_rows, nb::arg("src_rows"), nb::arg("slot_mapping"), nb::arg("stream") = 0)
      .def("copy_stats_async", &Runtime::copy_stats_async, nb::arg("stream") = 0)
      .def("stats", &Runtime::stats)
      .def("reset_stats", &Runtime::reset_stats, nb::arg("stream") = 0)
      .def("reset_request", &Runtime::reset_request, nb::arg("state_row"), nb::arg("stream") = 0)
      .def("write", &Runtime::write, nb::arg("rows").noconvert(), nb::arg("req_id_per_token").noconvert(),
           nb::arg("positions").noconvert(), nb::arg("request_state_indices").noconvert(),
           nb::arg("source_block_table").noconvert().none(), nb::arg("block_size"),
           nb::arg("resident_cache").noconvert().none(), nb::arg("resident_block_table").noconvert().none(),
           nb::arg("skip_host_store"), nb::arg("stream"))
      .def("set_host_sharing", &Runtime::set_host_sharing, nb::arg("role"), nb::arg("event") = nb::none());

  nb::class_<SlotInvalidator>(m, "SlotInvalidator",
                              "Invalidates rewritten host slots in many index groups (hs_slot_invalidator_t).")
      .def(nb::init<const PyInt&, const PyInt&>(), nb::arg("device_type"), nb::arg("device_index"))
      .def("run", &SlotInvalidator::run, nb::arg("runtimes").none(), nb::arg("request_state_indices"),
           nb::arg("req_id_per_token"), nb::arg("written_slots"), nb::arg("stream") = 0,
           nb::sig("def run(self, runtimes: Sequence[Runtime], request_state_indices: object, req_id_per_token: "
                   "object, written_slots: object, stream: int = 0) -> None"));

  m.def("paged_cache_view", &paged_cache_view, nb::arg("raw_tensor"), nb::arg("dtype"), nb::arg("row_width"),
        nb::arg("byte_offset"), nb::arg("block_stride"), nb::arg("num_blocks"), nb::arg("block_size"),
        "(data pointer, shape, element strides) of a paged view (hs_paged_cache_view).");
}

}  // namespace hisparse_py
