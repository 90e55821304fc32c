// Functional kernels: tensors in, status checked, nothing allocated. The
// Python layer (hisparse.ops) supplies torch's current stream.
#include <nanobind/stl/optional.h>

#include <optional>

#include "bindings.hpp"

namespace hisparse_py {
namespace {

using Array = nb::ndarray<>;
using OptionalArray = std::optional<nb::ndarray<>>;

void copy_bytes(const Array& dst, const Array& src, uintptr_t stream) {
  const TensorDesc d(dst, "dst"), s(src, "src");
  check(hs_copy_bytes(d.get(), s.get(), as_stream(stream)));
}

void resolve_residency(const Array& topk_indices, const Array& req_id_per_token, const Array& request_state_indices,
                       const Array& device_global_indices, const Array& lru_slots, const Array& hot_block_table,
                       int64_t hot_block_size, int64_t attention_block_stride, int64_t host_rows,
                       int64_t max_union_rows, const Array& out_attention, const Array& out_hot_rows,
                       const Array& out_resolved, const Array& out_miss_mask, const Array& out_valid_counts,
                       const Array& out_swap_host_rows, const Array& out_swap_device_rows, const Array& out_swap_counts,
                       const OptionalArray& source_block_table, int64_t block_size,
                       const OptionalArray& resident_block_table, int64_t resident_block_size,
                       const OptionalArray& num_valid_rows, const OptionalArray& stats,
                       const OptionalArray& gather_host_cache, const OptionalArray& gather_hot_cache,
                       int64_t gather_hot_block_stride, const OptionalArray& workspace, int32_t gather_schedule,
                       uintptr_t stream) {
  const TensorDesc topk(topk_indices, "topk_indices"), req(req_id_per_token, "req_id_per_token"),
      rsi(request_state_indices, "request_state_indices"), dgi(device_global_indices, "device_global_indices"),
      lru(lru_slots, "lru_slots"), hot(hot_block_table, "hot_block_table"), attn(out_attention, "out_attention"),
      rows(out_hot_rows, "out_hot_rows"), resolved(out_resolved, "out_resolved"), miss(out_miss_mask, "out_miss_mask"),
      valid(out_valid_counts, "out_valid_counts"), swap_host(out_swap_host_rows, "out_swap_host_rows"),
      swap_dev(out_swap_device_rows, "out_swap_device_rows"), swap_counts(out_swap_counts, "out_swap_counts");
  const OptionalTensorDesc source(source_block_table, "source_block_table"),
      resident(resident_block_table, "resident_block_table"), nvr(num_valid_rows, "num_valid_rows"),
      counters(stats, "stats"), gather_host(gather_host_cache, "gather_host_cache"),
      gather_hot(gather_hot_cache, "gather_hot_cache"), scratch(workspace, "workspace");
  hs_resolve_residency_args_t args;
  hs_resolve_residency_args_init(&args);
  args.topk_indices = topk.get();
  args.req_id_per_token = req.get();
  args.request_state_indices = rsi.get();
  args.device_global_indices = dgi.get();
  args.lru_slots = lru.get();
  args.hot_block_table = hot.get();
  args.hot_block_size = hot_block_size;
  args.attention_block_stride = attention_block_stride;
  args.host_rows = host_rows;
  args.max_union_rows = max_union_rows;
  args.out_attention = attn.get();
  args.out_hot_rows = rows.get();
  args.out_resolved = resolved.get();
  args.out_miss_mask = miss.get();
  args.out_valid_counts = valid.get();
  args.out_swap_host_rows = swap_host.get();
  args.out_swap_device_rows = swap_dev.get();
  args.out_swap_counts = swap_counts.get();
  args.source_block_table = source.get();
  args.block_size = block_size;
  args.resident_block_table = resident.get();
  args.resident_block_size = resident_block_size;
  args.num_valid_rows = nvr.get();
  args.stats = counters.get();
  args.gather_host_cache = gather_host.get();
  args.gather_hot_cache = gather_hot.get();
  args.gather_hot_block_stride = gather_hot_block_stride;
  args.workspace = scratch.get();
  args.gather_schedule = gather_schedule;
  check(hs_resolve_residency(&args, as_stream(stream)));
}

}  // namespace

void register_ops(nb::module_& m) {
  m.def("copy_bytes", &copy_bytes, nb::arg("dst").noconvert(), nb::arg("src").noconvert(), nb::arg("stream") = 0);
  m.def("resolve_residency", &resolve_residency, nb::arg("topk_indices").noconvert(),
        nb::arg("req_id_per_token").noconvert(), nb::arg("request_state_indices").noconvert(),
        nb::arg("device_global_indices").noconvert(), nb::arg("lru_slots").noconvert(),
        nb::arg("hot_block_table").noconvert(), nb::arg("hot_block_size"), nb::arg("attention_block_stride"),
        nb::arg("host_rows"), nb::arg("max_union_rows"), nb::arg("out_attention").noconvert(),
        nb::arg("out_hot_rows").noconvert(), nb::arg("out_resolved").noconvert(), nb::arg("out_miss_mask").noconvert(),
        nb::arg("out_valid_counts").noconvert(), nb::arg("out_swap_host_rows").noconvert(),
        nb::arg("out_swap_device_rows").noconvert(), nb::arg("out_swap_counts").noconvert(),
        nb::arg("source_block_table").noconvert().none() = nb::none(), nb::arg("block_size") = 0,
        nb::arg("resident_block_table").noconvert().none() = nb::none(), nb::arg("resident_block_size") = 0,
        nb::arg("num_valid_rows").noconvert().none() = nb::none(), nb::arg("stats").noconvert().none() = nb::none(),
        nb::arg("gather_host_cache").noconvert().none() = nb::none(),
        nb::arg("gather_hot_cache").noconvert().none() = nb::none(), nb::arg("gather_hot_block_stride") = 0,
        nb::arg("workspace").noconvert().none() = nb::none(), nb::arg("gather_schedule") = 0, nb::arg("stream") = 0);
  m.attr("RESOLVE_GATHER_AUTO") = static_cast<int>(HS_RESOLVE_GATHER_AUTO);
  m.attr("RESOLVE_GATHER_FUSED") = static_cast<int>(HS_RESOLVE_GATHER_FUSED);
}

}  // namespace hisparse_py
