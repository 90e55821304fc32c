// A tiny C++ consumer of an installed libhisparse: version, layout sizing, a
// host pool, and one residency resolution on the CPU backend, checked.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <hisparse/hisparse.hpp>
#include <vector>

namespace {

int failures = 0;

template <typename T>
void expect_equal(const char* what, const std::vector<T>& got, const std::vector<T>& want) {
  if (got == want) return;
  std::printf("MISMATCH in %s:", what);
  for (T value : got) std::printf(" %lld", static_cast<long long>(value));
  std::printf("\n");
  ++failures;
}

}  // namespace

int main() {
  try {
    std::printf("hisparse %s (version code %d)\n", hs_version_string(), hs::version());

    // Size a host pool: blocks of 64 tokens, 61 layers of 656-byte rows.
    const uint64_t page_size_bytes = 64ull * 656 * 61;
    const hs_host_layout_t layout = hs::plan_host_layout(page_size_bytes, 64, 4096, 1ull << 30);
    std::printf("layout: %lld host blocks of %lld bytes (at least %lld needed)\n",
                static_cast<long long>(layout.host_num_blocks), static_cast<long long>(layout.host_block_stride),
                static_cast<long long>(layout.min_host_blocks));

    // A small pool: populated, registered with the GPU when one is present.
    hs::HostPool pool(4 << 20);  // populated; registered with the GPU when there is one
    const hs_host_pool_info_t info = pool.info();
    std::memset(pool.data(), 0x7f, 4096);
    std::printf("host pool: %llu bytes, %s, populated in %.3f ms\n", static_cast<unsigned long long>(info.size_bytes),
                info.registered ? "registered" : "not registered", info.populate_seconds * 1e3);
    pool.release();

    // One request (state row 0) with H = 8 hot slots in two hot blocks of 4;
    // physical hot block 1 holds slots 0..3. Top-k = {5, 9, 5, -1}.
    const int64_t T = 1, K = 4, B = 1, S = 1, H = 8;
    std::vector<int32_t> topk = {5, 9, 5, -1};
    std::vector<int32_t> req_id_per_token = {0};
    std::vector<int32_t> request_state_indices = {0};
    std::vector<int32_t> device_global_indices(S * H, -1);
    std::vector<int16_t> lru_slots = {0, 1, 2, 3, 4, 5, 6, 7};
    std::vector<int32_t> hot_block_table = {1, 0};
    std::vector<int32_t> attention(T * K), hot_rows(T * K), resolved(T * K), miss_mask(T * K);
    std::vector<int32_t> swap_host(T * K, -7), swap_device(T * K, -7), valid_counts(T), swap_counts(T);
    std::vector<int64_t> stats(HS_NUM_STATS, 0);

    const hs::Tensor t_topk(topk.data(), HS_DTYPE_INT32, {T, K});
    const hs::Tensor t_req(req_id_per_token.data(), HS_DTYPE_INT32, {T});
    const hs::Tensor t_state(request_state_indices.data(), HS_DTYPE_INT32, {B});
    const hs::Tensor t_dgi(device_global_indices.data(), HS_DTYPE_INT32, {S, H});
    const hs::Tensor t_lru(lru_slots.data(), HS_DTYPE_INT16, {S, H});
    const hs::Tensor t_hot(hot_block_table.data(), HS_DTYPE_INT32, {B, 2});
    const hs::Tensor t_attention(attention.data(), HS_DTYPE_INT32, {T, K});
    const hs::Tensor t_hot_rows(hot_rows.data(), HS_DTYPE_INT32, {T, K});
    const hs::Tensor t_resolved(resolved.data(), HS_DTYPE_INT32, {T, K});
    const hs::Tensor t_miss(miss_mask.data(), HS_DTYPE_INT32, {T, K});
    const hs::Tensor t_valid(valid_counts.data(), HS_DTYPE_INT32, {T});
    const hs::Tensor t_swap_host(swap_host.data(), HS_DTYPE_INT32, {T, K});
    const hs::Tensor t_swap_device(swap_device.data(), HS_DTYPE_INT32, {T, K});
    const hs::Tensor t_swap_counts(swap_counts.data(), HS_DTYPE_INT32, {T});
    const hs::Tensor t_stats(stats.data(), HS_DTYPE_INT64, {HS_NUM_STATS});

    hs_resolve_residency_args_t args;
    hs_resolve_residency_args_init(&args);
    args.topk_indices = t_topk;
    args.req_id_per_token = t_req;
    args.request_state_indices = t_state;
    args.device_global_indices = t_dgi;
    args.lru_slots = t_lru;
    args.hot_block_table = t_hot;
    args.hot_block_size = 4;
    args.attention_block_stride = 8;
    args.host_rows = 100;
    args.max_union_rows = 4;
    args.out_attention = t_attention;
    args.out_hot_rows = t_hot_rows;
    args.out_resolved = t_resolved;
    args.out_miss_mask = t_miss;
    args.out_valid_counts = t_valid;
    args.out_swap_host_rows = t_swap_host;
    args.out_swap_device_rows = t_swap_device;
    args.out_swap_counts = t_swap_counts;
    args.stats = t_stats;
    hs::resolve_residency(args);  // CPU tensors: the CPU backend, no stream

    // Cold start: host slots 5 and 9 miss and take slots 0 and 1, which live
    // at physical rows 4 and 5 (hot block 1); attention reads row r at
    // (r / 4) * 8 + r % 4.
    expect_equal("out_hot_rows", hot_rows, {4, 5, 4, -1});
    expect_equal("out_attention", attention, {8, 9, 8, -1});
    expect_equal("out_resolved", resolved, {5, 9, 5, -1});
    expect_equal("out_miss_mask", miss_mask, {1, 1, 0, 0});
    expect_equal("out_valid_counts", valid_counts, {3});
    expect_equal("out_swap_counts", swap_counts, {2});
    expect_equal("out_swap_host_rows", swap_host, {5, 9, -7, -7});
    expect_equal("out_swap_device_rows", swap_device, {4, 5, -7, -7});
    expect_equal("device_global_indices", device_global_indices, {5, 9, -1, -1, -1, -1, -1, -1});
    expect_equal("lru_slots", lru_slots, {2, 3, 4, 5, 6, 7, 0, 1});
    expect_equal("stats", stats, {4, 0, 2, 0, 1});

    // Bad input is an exception naming the argument, not a crash.
    args.max_union_rows = 0;
    try {
      hs::resolve_residency(args);
      std::printf("MISMATCH: max_union_rows=0 was accepted\n");
      ++failures;
    } catch (const hs::Error& error) {
      std::printf("rejected as expected: %s\n", error.what());
    }
  } catch (const hs::Error& error) {
    std::printf("hisparse error (%s): %s\n", hs_status_string(error.status()), error.what());
    return 1;
  }
  std::printf(failures == 0 ? "consumer example OK\n" : "consumer example FAILED\n");
  return failures == 0 ? 0 : 1;
}
