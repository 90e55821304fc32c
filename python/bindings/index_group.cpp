// hisparse._C.IndexGroup: owns an hs_index_group_t and hands out its tensors
// as zero-copy DLPack arrays whose owner is the group object itself, so a
// tensor view keeps the group (and its memory) alive for as long as it lives.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"

namespace hisparse_py {
namespace {

using Array = nb::ndarray<>;
using OptionalArray = std::optional<nb::ndarray<>>;
using View = nb::ndarray<nb::array_api>;

class IndexGroup {
 public:
  IndexGroup(int device_type, int device_index, int32_t max_num_reqs, int32_t device_buffer_size, int32_t max_swap_rows,
             int32_t top_k, int32_t max_union_rows, int32_t num_speculative_tokens) {
    hs_index_group_options_t options;
    hs_index_group_options_init(&options);
    options.device_type = device_type;
    options.device_index = device_index;
    options.max_num_reqs = max_num_reqs;
    options.device_buffer_size = device_buffer_size;
    options.max_swap_rows = max_swap_rows;
    options.top_k = top_k;
    options.max_union_rows = max_union_rows;
    options.num_speculative_tokens = num_speculative_tokens;
    hs_status_t status;
    {
      nb::gil_scoped_release release;  // allocation and a device sync
      status = hs_index_group_create(&options, &handle_);
    }
    check(status);
  }
  ~IndexGroup() { hs_index_group_destroy(handle_); }
  IndexGroup(const IndexGroup&) = delete;
  IndexGroup& operator=(const IndexGroup&) = delete;

  nb::dict info() const {
    hs_index_group_info_t info{};
    info.struct_size = sizeof(info);
    check(hs_index_group_get_info(handle_, &info));
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

  // A DLPack array over tensor `which`, owned by `self` (this group).
  View tensor(nb::handle self, int which) const {
    if (which < 0 || which >= HS_INDEX_GROUP_NUM_TENSORS) {
      throw nb::value_error(("which: expected 0 <= which < " + std::to_string(HS_INDEX_GROUP_NUM_TENSORS) + ", got " +
                             std::to_string(which))
                                .c_str());
    }
    hs_tensor_t t{};
    check(hs_index_group_get_tensor(handle_, static_cast<hs_index_group_tensor_t>(which), &t));
    return owned_view(t, self);
  }

  void reset(uintptr_t stream) { check(hs_index_group_reset(handle_, as_stream(stream))); }

  void invalidate_sorted_slots(const Array& sorted_slots, const Array& state_indices, uintptr_t stream) {
    const TensorDesc slots(sorted_slots, "sorted_slots"), states(state_indices, "state_indices");
    check(hs_index_group_invalidate_sorted_slots(handle_, slots.get(), states.get(), as_stream(stream)));
  }

  void copy_stats_async(uintptr_t stream) { check(hs_index_group_copy_stats_async(handle_, as_stream(stream))); }

  std::vector<int64_t> read_stats() const {
    std::vector<int64_t> values(HS_NUM_STATS);
    check(hs_index_group_read_stats(handle_, values.data(), HS_NUM_STATS));
    return values;
  }

  void resolve(const Array& topk_indices, const Array& req_id_per_token, const Array& request_state_indices,
               const Array& hot_block_table, int64_t hot_block_size, int64_t attention_block_stride, int64_t host_rows,
               int64_t row_offset, const OptionalArray& source_block_table, int64_t block_size,
               const OptionalArray& resident_block_table, int64_t resident_block_size,
               const OptionalArray& num_valid_rows, const OptionalArray& out_attention,
               const OptionalArray& out_valid_counts, uintptr_t stream) {
    const TensorDesc topk(topk_indices, "topk_indices"), req(req_id_per_token, "req_id_per_token"),
        rsi(request_state_indices, "request_state_indices"), hot(hot_block_table, "hot_block_table");
    const OptionalTensorDesc source(source_block_table, "source_block_table"),
        resident(resident_block_table, "resident_block_table"), nvr(num_valid_rows, "num_valid_rows"),
        attention(out_attention, "out_attention"), valid(out_valid_counts, "out_valid_counts");
    hs_index_group_resolve_args_t args;
    hs_index_group_resolve_args_init(&args);
    args.topk_indices = topk.get();
    args.req_id_per_token = req.get();
    args.request_state_indices = rsi.get();
    args.hot_block_table = hot.get();
    args.hot_block_size = hot_block_size;
    args.attention_block_stride = attention_block_stride;
    args.host_rows = host_rows;
    args.row_offset = row_offset;
    args.source_block_table = source.get();
    args.block_size = block_size;
    args.resident_block_table = resident.get();
    args.resident_block_size = resident_block_size;
    args.num_valid_rows = nvr.get();
    args.out_attention = attention.get();
    args.out_valid_counts = valid.get();
    check(hs_index_group_resolve(handle_, &args, as_stream(stream)));
  }

 private:
  hs_index_group_t handle_ = nullptr;
};

}  // namespace

void register_index_group(nb::module_& m) {
  nb::class_<IndexGroup>(m, "IndexGroup", nb::is_weak_referenceable(),
                         "Index-group state (hot region, shared top-k outputs, counters). Use hisparse.IndexGroup.")
      .def(nb::init<int, int, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t>(), nb::arg("device_type"),
           nb::arg("device_index"), nb::arg("max_num_reqs"), nb::arg("device_buffer_size"), nb::arg("max_swap_rows"),
           nb::arg("top_k"), nb::arg("max_union_rows"), nb::arg("num_speculative_tokens"))
      .def("info", &IndexGroup::info)
      .def(
          "tensor", [](nb::handle self, int which) { return nb::cast<IndexGroup&>(self).tensor(self, which); },
          nb::arg("which"), "Zero-copy DLPack array of tensor `which`; it keeps the group alive.")
      .def("reset", &IndexGroup::reset, nb::arg("stream") = 0)
      .def("invalidate_sorted_slots", &IndexGroup::invalidate_sorted_slots, nb::arg("sorted_slots").noconvert(),
           nb::arg("state_indices").noconvert(), nb::arg("stream") = 0)
      .def("copy_stats_async", &IndexGroup::copy_stats_async, nb::arg("stream") = 0)
      .def("read_stats", &IndexGroup::read_stats)
      .def("resolve", &IndexGroup::resolve, nb::arg("topk_indices").noconvert(),
           nb::arg("req_id_per_token").noconvert(), nb::arg("request_state_indices").noconvert(),
           nb::arg("hot_block_table").noconvert(), nb::arg("hot_block_size"), nb::arg("attention_block_stride"),
           nb::arg("host_rows"), nb::arg("row_offset"), nb::arg("source_block_table").noconvert().none() = nb::none(),
           nb::arg("block_size") = 0, nb::arg("resident_block_table").noconvert().none() = nb::none(),
           nb::arg("resident_block_size") = 0, nb::arg("num_valid_rows").noconvert().none() = nb::none(),
           nb::arg("out_attention").noconvert().none() = nb::none(),
           nb::arg("out_valid_counts").noconvert().none() = nb::none(), nb::arg("stream") = 0);

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
