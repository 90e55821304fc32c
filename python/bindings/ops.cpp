// Functional kernels: tensors in, status checked, nothing allocated. The
// Python layer (hisparse.ops) supplies torch's current stream.
#include "bindings.hpp"

namespace hisparse_py {
namespace {

constexpr Access kRead = Access::kRead;
constexpr Access kWrite = Access::kWrite;

void copy_bytes(const PyArray& dst, const PyArray& src, const PyInt& stream) {
  const TensorArg d(dst, "dst", kWrite), s(src, "src", kRead);
  check(hs_copy_bytes(d.get(), s.get(), stream_arg(stream)));
}

void resolve_residency(const PyArray& topk_indices, const PyArray& req_id_per_token,
                       const PyArray& request_state_indices, const PyArray& device_global_indices,
                       const PyArray& lru_slots, const PyArray& hot_block_table, const PyInt& hot_block_size,
                       const PyInt& attention_block_stride, const PyInt& host_rows, const PyInt& max_union_rows,
                       const PyArray& out_attention, const PyArray& out_hot_rows, const PyArray& out_resolved,
                       const PyArray& out_miss_mask, const PyArray& out_valid_counts, const PyArray& out_swap_host_rows,
                       const PyArray& out_swap_device_rows, const PyArray& out_swap_counts,
                       const PyOptionalArray& source_block_table, const PyInt& block_size,
                       const PyOptionalArray& resident_block_table, const PyInt& resident_block_size,
                       const PyOptionalArray& num_valid_rows, const PyOptionalArray& stats,
                       const PyOptionalArray& gather_host_cache, const PyOptionalArray& gather_hot_cache,
                       const PyInt& gather_hot_block_stride, const PyOptionalArray& workspace,
                       const PyInt& gather_schedule, const PyOptionalArray& handoff,
                       const PyOptionalArray& residency_hint, const PyInt& stream) {
  const TensorArg topk(topk_indices, "topk_indices", kRead), req(req_id_per_token, "req_id_per_token", kRead),
      rsi(request_state_indices, "request_state_indices", kRead),
      dgi(device_global_indices, "device_global_indices", kWrite), lru(lru_slots, "lru_slots", kWrite),
      hot(hot_block_table, "hot_block_table", kRead), attn(out_attention, "out_attention", kWrite),
      rows(out_hot_rows, "out_hot_rows", kWrite), resolved(out_resolved, "out_resolved", kWrite),
      miss(out_miss_mask, "out_miss_mask", kWrite), valid(out_valid_counts, "out_valid_counts", kWrite),
      swap_host(out_swap_host_rows, "out_swap_host_rows", kWrite),
      swap_dev(out_swap_device_rows, "out_swap_device_rows", kWrite),
      swap_counts(out_swap_counts, "out_swap_counts", kWrite);
  const OptionalTensorArg source(source_block_table, "source_block_table", kRead),
      resident(resident_block_table, "resident_block_table", kRead), nvr(num_valid_rows, "num_valid_rows", kRead),
      counters(stats, "stats", kWrite), gather_host(gather_host_cache, "gather_host_cache", kRead),
      gather_hot(gather_hot_cache, "gather_hot_cache", kWrite), scratch(workspace, "workspace", kWrite),
      records(handoff, "handoff", kWrite), hint(residency_hint, "residency_hint", kWrite);
  hs_resolve_residency_args_t args;
  hs_resolve_residency_args_init(&args);
  args.topk_indices = topk.get();
  args.req_id_per_token = req.get();
  args.request_state_indices = rsi.get();
  args.device_global_indices = dgi.get();
  args.lru_slots = lru.get();
  args.hot_block_table = hot.get();
  args.hot_block_size = int_arg(hot_block_size, "hot_block_size");
  args.attention_block_stride = int_arg(attention_block_stride, "attention_block_stride");
  args.host_rows = int_arg(host_rows, "host_rows");
  args.max_union_rows = int_arg(max_union_rows, "max_union_rows");
  args.out_attention = attn.get();
  args.out_hot_rows = rows.get();
  args.out_resolved = resolved.get();
  args.out_miss_mask = miss.get();
  args.out_valid_counts = valid.get();
  args.out_swap_host_rows = swap_host.get();
  args.out_swap_device_rows = swap_dev.get();
  args.out_swap_counts = swap_counts.get();
  args.source_block_table = source.get();
  args.block_size = int_arg(block_size, "block_size");
  args.resident_block_table = resident.get();
  args.resident_block_size = int_arg(resident_block_size, "resident_block_size");
  args.num_valid_rows = nvr.get();
  args.stats = counters.get();
  args.gather_host_cache = gather_host.get();
  args.gather_hot_cache = gather_hot.get();
  args.gather_hot_block_stride = int_arg(gather_hot_block_stride, "gather_hot_block_stride");
  args.workspace = scratch.get();
  args.gather_schedule = int32_arg(gather_schedule, "gather_schedule");
  args.handoff = records.get();
  args.residency_hint = hint.get();
  check(hs_resolve_residency(&args, stream_arg(stream)));
}

}  // namespace

void register_ops(nb::module_& m) {
  m.def("copy_bytes", &copy_bytes, nb::arg("dst"), nb::arg("src"), nb::arg("stream") = 0);
  m.def("resolve_residency", &resolve_residency, nb::arg("topk_indices"), nb::arg("req_id_per_token"),
        nb::arg("request_state_indices"), nb::arg("device_global_indices"), nb::arg("lru_slots"),
        nb::arg("hot_block_table"), nb::arg("hot_block_size"), nb::arg("attention_block_stride"), nb::arg("host_rows"),
        nb::arg("max_union_rows"), nb::arg("out_attention"), nb::arg("out_hot_rows"), nb::arg("out_resolved"),
        nb::arg("out_miss_mask"), nb::arg("out_valid_counts"), nb::arg("out_swap_host_rows"),
        nb::arg("out_swap_device_rows"), nb::arg("out_swap_counts"), nb::arg("source_block_table") = nb::none(),
        nb::arg("block_size") = 0, nb::arg("resident_block_table") = nb::none(), nb::arg("resident_block_size") = 0,
        nb::arg("num_valid_rows") = nb::none(), nb::arg("stats") = nb::none(),
        nb::arg("gather_host_cache") = nb::none(), nb::arg("gather_hot_cache") = nb::none(),
        nb::arg("gather_hot_block_stride") = 0, nb::arg("workspace") = nb::none(), nb::arg("gather_schedule") = 0,
        nb::arg("handoff") = nb::none(), nb::arg("residency_hint") = nb::none(), nb::arg("stream") = 0);
  m.attr("RESOLVE_GATHER_AUTO") = static_cast<int>(HS_RESOLVE_GATHER_AUTO);
  m.attr("RESOLVE_GATHER_FUSED") = static_cast<int>(HS_RESOLVE_GATHER_FUSED);
  m.attr("RESOLVER_HANDOFF_WORDS") = static_cast<int>(HS_RESOLVER_HANDOFF_WORDS);
}

}  // namespace hisparse_py
