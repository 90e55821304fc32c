// Data-movement kernels (hisparse/data_movement.h): tensors in, status
// checked, nothing allocated. hisparse.ops supplies torch's current stream.
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

void gather_compact(const Array& host_cache, const Array& hot_cache, const Array& swap_host_rows,
                    const Array& swap_device_rows, const Array& swap_counts, int64_t hot_block_size,
                    int64_t hot_block_stride, int32_t variant, int32_t max_blocks, uintptr_t stream) {
  const TensorDesc host(host_cache, "host_cache"), hot(hot_cache, "hot_cache"),
      swap_host(swap_host_rows, "swap_host_rows"), swap_device(swap_device_rows, "swap_device_rows"),
      counts(swap_counts, "swap_counts");
  hs_gather_compact_args_t args;
  hs_gather_compact_args_init(&args);
  args.host_cache = host.get();
  args.hot_cache = hot.get();
  args.swap_host_rows = swap_host.get();
  args.swap_device_rows = swap_device.get();
  args.swap_counts = counts.get();
  args.hot_block_size = hot_block_size;
  args.hot_block_stride = hot_block_stride;
  args.variant = variant;
  args.max_blocks = max_blocks;
  check(hs_gather_compact(&args, as_stream(stream)));
}

void gather_compact_group(const Array& host_cache, const std::vector<Array>& hot_caches, const Array& swap_host_rows,
                          const Array& swap_device_rows, const Array& swap_counts, int64_t hot_block_size,
                          int64_t hot_block_stride, int32_t max_blocks, uintptr_t stream) {
  const TensorDescList hot(hot_caches, "hot_caches");
  const TensorDesc host(host_cache, "host_cache"), swap_host(swap_host_rows, "swap_host_rows"),
      swap_device(swap_device_rows, "swap_device_rows"), counts(swap_counts, "swap_counts");
  hs_gather_compact_group_args_t args;
  hs_gather_compact_group_args_init(&args);
  args.num_hot_caches = hot.size();
  args.host_cache = host.get();
  args.hot_caches = hot.data();
  args.swap_host_rows = swap_host.get();
  args.swap_device_rows = swap_device.get();
  args.swap_counts = counts.get();
  args.hot_block_size = hot_block_size;
  args.hot_block_stride = hot_block_stride;
  args.max_blocks = max_blocks;
  check(hs_gather_compact_group(&args, as_stream(stream)));
}

void gather_plan(const Array& src_rows, const Array& staged, const Array& row_ids, const Array& dst_rows,
                 const Array& miss_mask, uintptr_t stream) {
  const TensorDesc src(src_rows, "src_rows"), dst(staged, "staged"), ids(row_ids, "row_ids"),
      rows(dst_rows, "dst_rows"), mask(miss_mask, "miss_mask");
  check(hs_gather_plan(src.get(), dst.get(), ids.get(), rows.get(), mask.get(), as_stream(stream)));
}

void invalidate_written_slots(const std::vector<Array>& tables, const Array& request_state_indices,
                              const Array& req_id_per_token, const Array& written_slots,
                              const OptionalArray& table_pointers, uintptr_t stream) {
  const TensorDescList table_descs(tables, "tables");
  const TensorDesc rsi(request_state_indices, "request_state_indices"), req(req_id_per_token, "req_id_per_token"),
      written(written_slots, "written_slots");
  const OptionalTensorDesc table_ptrs(table_pointers, "table_pointers");
  hs_invalidate_written_slots_args_t args;
  hs_invalidate_written_slots_args_init(&args);
  args.tables = table_descs.data();
  args.num_tables = table_descs.size();
  args.table_pointers = table_ptrs.get();
  args.request_state_indices = rsi.get();
  args.req_id_per_token = req.get();
  args.written_slots = written.get();
  check(hs_invalidate_written_slots(&args, as_stream(stream)));
}

void mirror_rows(const Array& src_rows, const Array& host_cache, const Array& slot_mapping, uintptr_t stream) {
  const TensorDesc src(src_rows, "src_rows"), host(host_cache, "host_cache"), slots(slot_mapping, "slot_mapping");
  check(hs_mirror_rows(src.get(), host.get(), slots.get(), as_stream(stream)));
}

void swap_blocks_batch(const Array& src, const Array& dst, const Array& sizes, uintptr_t stream) {
  const TensorDesc s(src, "src"), d(dst, "dst"), n(sizes, "sizes");
  check(hs_swap_blocks_batch(s.get(), d.get(), n.get(), as_stream(stream)));
}

}  // namespace

void register_data_movement(nb::module_& m) {
  m.attr("GATHER_AUTO") = static_cast<int>(HS_GATHER_AUTO);
  m.attr("GATHER_WARP_PER_ROW") = static_cast<int>(HS_GATHER_WARP_PER_ROW);
  m.attr("GATHER_SORTED") = static_cast<int>(HS_GATHER_SORTED);
  m.attr("GATHER_ROW_PERSISTENT") = static_cast<int>(HS_GATHER_ROW_PERSISTENT);
  m.attr("NUM_GATHER_VARIANTS") = static_cast<int>(HS_NUM_GATHER_VARIANTS);
  m.def("gather_variant_name", [](int32_t variant) { return std::string(hs_gather_variant_name(variant)); });
  m.def("gather_default_variant", [] { return hs_gather_default_variant(); });
  m.def("gather_compact", &gather_compact, nb::arg("host_cache").noconvert(), nb::arg("hot_cache").noconvert(),
        nb::arg("swap_host_rows").noconvert(), nb::arg("swap_device_rows").noconvert(),
        nb::arg("swap_counts").noconvert(), nb::arg("hot_block_size"), nb::arg("hot_block_stride") = 0,
        nb::arg("variant") = 0, nb::arg("max_blocks") = 0, nb::arg("stream") = 0);
  m.attr("MAX_GATHER_GROUP_PIECES") = static_cast<int>(HS_MAX_GATHER_GROUP_PIECES);
  m.def("gather_compact_group", &gather_compact_group, nb::arg("host_cache").noconvert(), nb::arg("hot_caches"),
        nb::arg("swap_host_rows").noconvert(), nb::arg("swap_device_rows").noconvert(),
        nb::arg("swap_counts").noconvert(), nb::arg("hot_block_size"), nb::arg("hot_block_stride") = 0,
        nb::arg("max_blocks") = 0, nb::arg("stream") = 0);
  m.def("gather_plan", &gather_plan, nb::arg("src_rows").noconvert(), nb::arg("staged").noconvert(),
        nb::arg("row_ids").noconvert(), nb::arg("dst_rows").noconvert(), nb::arg("miss_mask").noconvert(),
        nb::arg("stream") = 0);
  m.def("invalidate_written_slots", &invalidate_written_slots, nb::arg("tables"),
        nb::arg("request_state_indices").noconvert(), nb::arg("req_id_per_token").noconvert(),
        nb::arg("written_slots").noconvert(), nb::arg("table_pointers").noconvert().none() = nb::none(),
        nb::arg("stream") = 0);
  m.def("mirror_rows", &mirror_rows, nb::arg("src_rows").noconvert(), nb::arg("host_cache").noconvert(),
        nb::arg("slot_mapping").noconvert(), nb::arg("stream") = 0);
  m.def("swap_blocks_batch", &swap_blocks_batch, nb::arg("src").noconvert(), nb::arg("dst").noconvert(),
        nb::arg("sizes").noconvert(), nb::arg("stream") = 0);
}

}  // namespace hisparse_py
