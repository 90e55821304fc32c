// hisparse._C.IndexGroup: owns an hs_index_group_t and hands out its tensors
// as zero-copy DLPack arrays. The handle lives in a state shared by the
// Python object and every view's owner, so a view keeps the group's memory
// alive for as long as it lives, and one that outlives the interpreter's
// teardown leaves no nanobind instance behind.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings.hpp"

namespace hisparse_py {
namespace {

constexpr Access kRead = Access::kRead;
constexpr Access kWrite = Access::kWrite;
using View = nb::ndarray<nb::array_api>;

struct GroupState {
  hs_index_group_t handle = nullptr;
  ~GroupState() { hs_index_group_destroy(handle); }
};

class IndexGroup {
 public:
  IndexGroup(const PyInt& device_type, const PyInt& device_index, const PyInt& max_num_reqs,
             const PyInt& device_buffer_size, const PyInt& max_swap_rows, const PyInt& top_k,
             const PyInt& max_union_rows, const PyInt& num_speculative_tokens)
      : state_(std::make_shared<GroupState>()) {
    hs_index_group_options_t options;
    hs_index_group_options_init(&options);
    options.device_type = int32_arg(device_type, "device_type");
    options.device_index = int32_arg(device_index, "device_index");
    options.max_num_reqs = int32_arg(max_num_reqs, "max_num_reqs");
    options.device_buffer_size = int32_arg(device_buffer_size, "device_buffer_size");
    options.max_swap_rows = int32_arg(max_swap_rows, "max_swap_rows");
    options.top_k = int32_arg(top_k, "top_k");
    options.max_union_rows = int32_arg(max_union_rows, "max_union_rows");
    options.num_speculative_tokens = int32_arg(num_speculative_tokens, "num_speculative_tokens");
    hs_status_t status;
    {
      nb::gil_scoped_release release;  // allocation and a device sync
      status = hs_index_group_create(&options, &state_->handle);
    }
    check(status);
  }

  nb::dict info() const {
    hs_index_group_info_t info{};
    info.struct_size = sizeof(info);
    check(hs_index_group_get_info(handle(), &info));
    nb::dict out;
    out["device_type"] = info.device_type;
    out["device_index"] = info.device_index;
    out["max_num_reqs"] = info.max_num_reqs;
    out["device_buffer_size"] = info.device_buffer_size;
    out["max_swap_rows"] = info.max_swap_rows;
    out["top_k"] = info.top_k;
    out["max_union_rows"] = info.max_union_rows;
    out["device_bytes"] = info.device_bytes;
    return out;
  }

  // A DLPack array over tensor `which`, owned by the group's state.
  View tensor(const PyInt& which_arg) const {
    const int32_t which = int32_arg(which_arg, "which");
    if (which < 0 || which >= HS_INDEX_GROUP_NUM_TENSORS) {
      throw nb::value_error(("which: expected 0 <= which < " + std::to_string(HS_INDEX_GROUP_NUM_TENSORS) + ", got " +
                             std::to_string(which))
                                .c_str());
    }
    hs_tensor_t t{};
    check(hs_index_group_get_tensor(handle(), static_cast<hs_index_group_tensor_t>(which), &t));
    return owned_view(t, state_owner(state_));
  }

  void reset(const PyInt& stream) { check(hs_index_group_reset(handle(), stream_arg(stream))); }

  void invalidate_sorted_slots(const PyArray& sorted_slots, const PyArray& state_indices, const PyInt& stream) {
    const TensorArg slots(sorted_slots, "sorted_slots", kRead), states(state_indices, "state_indices", kRead);
    check(hs_index_group_invalidate_sorted_slots(handle(), slots.get(), states.get(), stream_arg(stream)));
  }

  void copy_stats_async(const PyInt& stream) { check(hs_index_group_copy_stats_async(handle(), stream_arg(stream))); }

  std::vector<int64_t> read_stats() const {
    std::vector<int64_t> values(HS_NUM_STATS);
    check(hs_index_group_read_stats(handle(), values.data(), HS_NUM_STATS));
    return values;
  }

  void resolve(const PyArray& topk_indices, const PyArray& req_id_per_token, const PyArray& request_state_indices,
               const PyArray& hot_block_table, const PyInt& hot_block_size, const PyInt& attention_block_stride,
               const PyInt& host_rows, const PyInt& row_offset, const PyOptionalArray& source_block_table,
               const PyInt& block_size, const PyOptionalArray& resident_block_table, const PyInt& resident_block_size,
               const PyOptionalArray& num_valid_rows, const PyOptionalArray& out_attention,
               const PyOptionalArray& out_valid_counts, const PyInt& stream, const PyOptionalArray& gather_host_cache,
               const PyOptionalArray& gather_hot_cache, const PyInt& gather_hot_block_stride) {
    const TensorArg topk(topk_indices, "topk_indices", kRead), req(req_id_per_token, "req_id_per_token", kRead),
        rsi(request_state_indices, "request_state_indices", kRead), hot(hot_block_table, "hot_block_table", kRead);
    const OptionalTensorArg source(source_block_table, "source_block_table", kRead),
        resident(resident_block_table, "resident_block_table", kRead), nvr(num_valid_rows, "num_valid_rows", kRead),
        attention(out_attention, "out_attention", kWrite), valid(out_valid_counts, "out_valid_counts", kWrite),
        gather_host(gather_host_cache, "gather_host_cache", kRead),
        gather_hot(gather_hot_cache, "gather_hot_cache", kWrite);
    hs_index_group_resolve_args_t args;
    hs_index_group_resolve_args_init(&args);
    args.topk_indices = topk.get();
    args.req_id_per_token = req.get();
    args.request_state_indices = rsi.get();
    args.hot_block_table = hot.get();
    args.hot_block_size = int_arg(hot_block_size, "hot_block_size");
    args.attention_block_stride = int_arg(attention_block_stride, "attention_block_stride");
    args.host_rows = int_arg(host_rows, "host_rows");
    args.row_offset = int_arg(row_offset, "row_offset");
    args.source_block_table = source.get();
    args.block_size = int_arg(block_size, "block_size");
    args.resident_block_table = resident.get();
    args.resident_block_size = int_arg(resident_block_size, "resident_block_size");
    args.num_valid_rows = nvr.get();
    args.out_attention = attention.get();
    args.out_valid_counts = valid.get();
    args.gather_host_cache = gather_host.get();
    args.gather_hot_cache = gather_hot.get();
    args.gather_hot_block_stride = int_arg(gather_hot_block_stride, "gather_hot_block_stride");
    check(hs_index_group_resolve(handle(), &args, stream_arg(stream)));
  }

 private:
  hs_index_group_t handle() const { return state_->handle; }

  std::shared_ptr<GroupState> state_;
};

}  // namespace

void register_index_group(nb::module_& m) {
  nb::class_<IndexGroup>(m, "IndexGroup", nb::is_weak_referenceable(),
                         "Index-group state (hot region, shared top-k outputs, counters). Use hisparse.IndexGroup.")
      .def(nb::init<const PyInt&, const PyInt&, const PyInt&, const PyInt&, const PyInt&, const PyInt&, const PyInt&,
                    const PyInt&>(),
           nb::arg("device_type"), nb::arg("device_index"), nb::arg("max_num_reqs"), nb::arg("device_buffer_size"),
           nb::arg("max_swap_rows"), nb::arg("top_k"), nb::arg("max_union_rows"), nb::arg("num_speculative_tokens"))
      .def("info", &IndexGroup::info)
      .def("tensor", &IndexGroup::tensor, nb::arg("which"),
           "Zero-copy DLPack array of tensor `which`; it keeps the group's memory alive.")
      .def("reset", &IndexGroup::reset, nb::arg("stream") = 0)
      .def("invalidate_sorted_slots", &IndexGroup::invalidate_sorted_slots, nb::arg("sorted_slots"),
           nb::arg("state_indices"), nb::arg("stream") = 0)
      .def("copy_stats_async", &IndexGroup::copy_stats_async, nb::arg("stream") = 0)
      .def("read_stats", &IndexGroup::read_stats)
      .def("resolve", &IndexGroup::resolve, nb::arg("topk_indices"), nb::arg("req_id_per_token"),
           nb::arg("request_state_indices"), nb::arg("hot_block_table"), nb::arg("hot_block_size"),
           nb::arg("attention_block_stride"), nb::arg("host_rows"), nb::arg("row_offset"),
           nb::arg("source_block_table") = nb::none(), nb::arg("block_size") = 0,
           nb::arg("resident_block_table") = nb::none(), nb::arg("resident_block_size") = 0,
           nb::arg("num_valid_rows") = nb::none(), nb::arg("out_attention") = nb::none(),
           nb::arg("out_valid_counts") = nb::none(), nb::arg("stream") = 0, nb::arg("gather_host_cache") = nb::none(),
           nb::arg("gather_hot_cache") = nb::none(), nb::arg("gather_hot_block_stride") = 0);

  nb::dict tensors;
  tensors["device_global_indices"] = static_cast<int>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES);
  tensors["lru_slots"] = static_cast<int>(HS_INDEX_GROUP_LRU_SLOTS);
  tensors["lru_init"] = static_cast<int>(HS_INDEX_GROUP_LRU_INIT);
  tensors["attention_indices"] = static_cast<int>(HS_INDEX_GROUP_ATTENTION_INDICES);
  tensors["hot_rows"] = static_cast<int>(HS_INDEX_GROUP_HOT_ROWS);
  tensors["resolved_slots"] = static_cast<int>(HS_INDEX_GROUP_RESOLVED_SLOTS);
  tensors["miss_mask"] = static_cast<int>(HS_INDEX_GROUP_MISS_MASK);
  tensors["valid_counts"] = static_cast<int>(HS_INDEX_GROUP_VALID_COUNTS);
  tensors["swap_host_rows"] = static_cast<int>(HS_INDEX_GROUP_SWAP_HOST_ROWS);
  tensors["swap_device_rows"] = static_cast<int>(HS_INDEX_GROUP_SWAP_DEVICE_ROWS);
  tensors["swap_counts"] = static_cast<int>(HS_INDEX_GROUP_SWAP_COUNTS);
  tensors["counters"] = static_cast<int>(HS_INDEX_GROUP_STATS);
  tensors["counters_host"] = static_cast<int>(HS_INDEX_GROUP_STATS_HOST);
  m.attr("INDEX_GROUP_TENSORS") = tensors;
}

}  // namespace hisparse_py
