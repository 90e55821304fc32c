// Data-movement kernels (hisparse/data_movement.h): tensors in, status
// checked, nothing allocated. hisparse.ops supplies torch's current stream.
#include <nanobind/stl/string.h>

#include <string>

#include "bindings.hpp"

namespace hisparse_py {
namespace {

constexpr Access kRead = Access::kRead;
constexpr Access kWrite = Access::kWrite;

void gather_compact(const PyArray& host_cache, const PyArray& hot_cache, const PyArray& swap_host_rows,
                    const PyArray& swap_device_rows, const PyArray& swap_counts, const PyInt& hot_block_size,
                    const PyInt& hot_block_stride, const PyInt& variant, const PyInt& max_blocks, const PyInt& stream) {
  const TensorArg host(host_cache, "host_cache", kRead), hot(hot_cache, "hot_cache", kWrite),
      swap_host(swap_host_rows, "swap_host_rows", kRead), swap_device(swap_device_rows, "swap_device_rows", kRead),
      counts(swap_counts, "swap_counts", kRead);
  hs_gather_compact_args_t args;
  hs_gather_compact_args_init(&args);
  args.host_cache = host.get();
  args.hot_cache = hot.get();
  args.swap_host_rows = swap_host.get();
  args.swap_device_rows = swap_device.get();
  args.swap_counts = counts.get();
  args.hot_block_size = int_arg(hot_block_size, "hot_block_size");
  args.hot_block_stride = int_arg(hot_block_stride, "hot_block_stride");
  args.variant = int32_arg(variant, "variant");
  args.max_blocks = int32_arg(max_blocks, "max_blocks");
  check(hs_gather_compact(&args, stream_arg(stream)));
}

void gather_compact_group(const PyArray& host_cache, const PyArrayList& hot_caches, const PyArray& swap_host_rows,
                          const PyArray& swap_device_rows, const PyArray& swap_counts, const PyInt& hot_block_size,
                          const PyInt& hot_block_stride, const PyInt& max_blocks, const PyInt& stream) {
  const TensorListArg hot(hot_caches, "hot_caches", kWrite);
  const TensorArg host(host_cache, "host_cache", kRead), swap_host(swap_host_rows, "swap_host_rows", kRead),
      swap_device(swap_device_rows, "swap_device_rows", kRead), counts(swap_counts, "swap_counts", kRead);
  hs_gather_compact_group_args_t args;
  hs_gather_compact_group_args_init(&args);
  args.num_hot_caches = hot.size();
  args.host_cache = host.get();
  args.hot_caches = hot.data();
  args.swap_host_rows = swap_host.get();
  args.swap_device_rows = swap_device.get();
  args.swap_counts = counts.get();
  args.hot_block_size = int_arg(hot_block_size, "hot_block_size");
  args.hot_block_stride = int_arg(hot_block_stride, "hot_block_stride");
  args.max_blocks = int32_arg(max_blocks, "max_blocks");
  check(hs_gather_compact_group(&args, stream_arg(stream)));
}

void gather_plan(const PyArray& src_rows, const PyArray& staged, const PyArray& row_ids, const PyArray& dst_rows,
                 const PyArray& miss_mask, const PyInt& stream) {
  const TensorArg src(src_rows, "src_rows", kRead), dst(staged, "staged", kWrite), ids(row_ids, "row_ids", kRead),
      rows(dst_rows, "dst_rows", kRead), mask(miss_mask, "miss_mask", kRead);
  check(hs_gather_plan(src.get(), dst.get(), ids.get(), rows.get(), mask.get(), stream_arg(stream)));
}

void invalidate_written_slots(const PyArrayList& tables, const PyArray& request_state_indices,
                              const PyArray& req_id_per_token, const PyArray& written_slots,
                              const PyOptionalArray& table_pointers, const PyInt& stream) {
  const TensorListArg table_descs(tables, "tables", kWrite);
  const TensorArg rsi(request_state_indices, "request_state_indices", kRead),
      req(req_id_per_token, "req_id_per_token", kRead), written(written_slots, "written_slots", kRead);
  const OptionalTensorArg table_ptrs(table_pointers, "table_pointers", kRead);
  hs_invalidate_written_slots_args_t args;
  hs_invalidate_written_slots_args_init(&args);
  args.tables = table_descs.data();
  args.num_tables = table_descs.size();
  args.table_pointers = table_ptrs.get();
  args.request_state_indices = rsi.get();
  args.req_id_per_token = req.get();
  args.written_slots = written.get();
  check(hs_invalidate_written_slots(&args, stream_arg(stream)));
}

void mirror_rows(const PyArray& src_rows, const PyArray& host_cache, const PyArray& slot_mapping, const PyInt& stream) {
  const TensorArg src(src_rows, "src_rows", kRead), host(host_cache, "host_cache", kWrite),
      slots(slot_mapping, "slot_mapping", kRead);
  check(hs_mirror_rows(src.get(), host.get(), slots.get(), stream_arg(stream)));
}

void swap_blocks_batch(const PyArray& src, const PyArray& dst, const PyArray& sizes, const PyInt& stream) {
  const TensorArg s(src, "src", kRead), d(dst, "dst", kRead), n(sizes, "sizes", kRead);
  check(hs_swap_blocks_batch(s.get(), d.get(), n.get(), stream_arg(stream)));
}

void warm_host_pages(const PyArray& host_cache, const PyArray& block_table, const PyOptionalArray& seq_lens,
                     const PyInt& block_size, const PyInt& page_bytes, const PyOptionalArray& out,
                     const PyInt& stream) {
  const TensorArg host(host_cache, "host_cache", kRead), table(block_table, "block_table", kRead);
  const OptionalTensorArg lengths(seq_lens, "seq_lens", kRead), totals(out, "out", kWrite);
  check(hs_warm_host_pages(host.get(), table.get(), lengths.get(), int_arg(block_size, "block_size"),
                           int_arg(page_bytes, "page_bytes"), totals.get(), stream_arg(stream)));
}

}  // namespace

void register_data_movement(nb::module_& m) {
  m.attr("GATHER_AUTO") = static_cast<int>(HS_GATHER_AUTO);
  m.attr("GATHER_WARP_PER_ROW") = static_cast<int>(HS_GATHER_WARP_PER_ROW);
  m.attr("GATHER_SORTED") = static_cast<int>(HS_GATHER_SORTED);
  m.attr("GATHER_ROW_PERSISTENT") = static_cast<int>(HS_GATHER_ROW_PERSISTENT);
  m.attr("NUM_GATHER_VARIANTS") = static_cast<int>(HS_NUM_GATHER_VARIANTS);
  m.def(
      "gather_variant_name",
      [](const PyInt& variant) { return std::string(hs_gather_variant_name(int32_arg(variant, "variant"))); },
      nb::arg("variant"));
  m.def("gather_default_variant", [] { return hs_gather_default_variant(); });
  m.def("gather_compact", &gather_compact, nb::arg("host_cache"), nb::arg("hot_cache"), nb::arg("swap_host_rows"),
        nb::arg("swap_device_rows"), nb::arg("swap_counts"), nb::arg("hot_block_size"), nb::arg("hot_block_stride") = 0,
        nb::arg("variant") = 0, nb::arg("max_blocks") = 0, nb::arg("stream") = 0);
  m.attr("MAX_GATHER_GROUP_PIECES") = static_cast<int>(HS_MAX_GATHER_GROUP_PIECES);
  m.def("gather_compact_group", &gather_compact_group, nb::arg("host_cache"), nb::arg("hot_caches"),
        nb::arg("swap_host_rows"), nb::arg("swap_device_rows"), nb::arg("swap_counts"), nb::arg("hot_block_size"),
        nb::arg("hot_block_stride") = 0, nb::arg("max_blocks") = 0, nb::arg("stream") = 0);
  m.def("gather_plan", &gather_plan, nb::arg("src_rows"), nb::arg("staged"), nb::arg("row_ids"), nb::arg("dst_rows"),
        nb::arg("miss_mask"), nb::arg("stream") = 0);
  m.def("invalidate_written_slots", &invalidate_written_slots, nb::arg("tables"), nb::arg("request_state_indices"),
        nb::arg("req_id_per_token"), nb::arg("written_slots"), nb::arg("table_pointers") = nb::none(),
        nb::arg("stream") = 0);
  m.def("mirror_rows", &mirror_rows, nb::arg("src_rows"), nb::arg("host_cache"), nb::arg("slot_mapping"),
        nb::arg("stream") = 0);
  m.def("swap_blocks_batch", &swap_blocks_batch, nb::arg("src"), nb::arg("dst"), nb::arg("sizes"),
        nb::arg("stream") = 0);
  m.def("warm_host_pages", &warm_host_pages, nb::arg("host_cache"), nb::arg("block_table"),
        nb::arg("seq_lens") = nb::none(), nb::arg("block_size"), nb::arg("page_bytes"), nb::arg("out") = nb::none(),
        nb::arg("stream") = 0);
}

}  // namespace hisparse_py
