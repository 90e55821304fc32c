// The fused gather of hs_resolve_residency through the C ABI on the CPU
// backend: the same bytes as a resolve followed by hs_gather_compact, and bad
// arguments (the args struct's size and version among them) that fail naming
// them and leave everything untouched.
// The shape sweep lives in tests/python/test_fused_gather.py.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "expect_status.hpp"
#include "hisparse/hisparse.hpp"

namespace {

constexpr int32_t kUntouched = -77;
constexpr uint8_t kHotFill = 0xAA;

// Two batch rows: batch row 0 (state row 1) with two speculative token rows,
// batch row 1 a padding row. H = 8 hot slots in blocks of 2, hot block
// stride 3, 16-byte rows. The resolver accepts host slots < 24, the host
// cache holds only 20 rows: slots 20..23 zero-fill their hot rows.
struct Case {
  static constexpr int64_t T = 3, K = 4, B = 2, S = 2, H = 8, kHotBlocks = 4, kRowBytes = 16;
  static constexpr int64_t kHotBlockSize = 2, kHotBlockStride = 3, kHostRows = 20, kResolverHostRows = 24;
  static constexpr int64_t kHotRows = 12;  // covers block 3 at rows 9..10

  std::vector<int32_t> topk, req_id_per_token{0, 0, 1}, request_state_indices{1, -1};
  std::vector<int32_t> device_global_indices = std::vector<int32_t>(S * H, -1);
  std::vector<int16_t> lru_slots;
  std::vector<int32_t> hot_block_table{3, 0, 2, 1, 1, 2, 3, 0};
  std::vector<int32_t> attention, hot_rows, resolved, miss_mask, swap_host_rows, swap_device_rows;
  std::vector<int32_t> valid_counts, swap_counts;
  std::vector<int64_t> stats = std::vector<int64_t>(5, 0);
  std::vector<uint8_t> host = std::vector<uint8_t>(kHostRows * kRowBytes);
  std::vector<uint8_t> hot = std::vector<uint8_t>(kHotRows * kRowBytes, kHotFill);

  Case() {
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t j = 0; j < H; ++j) lru_slots.push_back(static_cast<int16_t>(j));
    }
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 7 + 3);
    set_topk({5, 21, 5, -1, 7, 2, 22, 9, 1, 2, 3, 4});
  }

  void set_topk(std::vector<int32_t> values) {
    topk = std::move(values);
    for (auto* out : {&attention, &hot_rows, &resolved, &miss_mask, &swap_host_rows, &swap_device_rows}) {
      out->assign(T * K, kUntouched);
    }
    valid_counts.assign(T, kUntouched);
    swap_counts.assign(T, kUntouched);
  }

  // The bytes of physical hot row `d`, and what a gather puts there for host
  // slot `h` (zeros past the host cache).
  std::vector<uint8_t> hot_row(int64_t d) const {
    const int64_t offset = (d / kHotBlockSize) * kHotBlockStride + d % kHotBlockSize;
    return std::vector<uint8_t>(hot.begin() + offset * kRowBytes, hot.begin() + (offset + 1) * kRowBytes);
  }
  std::vector<uint8_t> host_row(int64_t h) const {
    if (h >= kHostRows) return std::vector<uint8_t>(kRowBytes, 0);
    return std::vector<uint8_t>(host.begin() + h * kRowBytes, host.begin() + (h + 1) * kRowBytes);
  }

  bool operator==(const Case& o) const {
    return topk == o.topk && device_global_indices == o.device_global_indices && lru_slots == o.lru_slots &&
           attention == o.attention && hot_rows == o.hot_rows && resolved == o.resolved && miss_mask == o.miss_mask &&
           swap_host_rows == o.swap_host_rows && swap_device_rows == o.swap_device_rows &&
           valid_counts == o.valid_counts && swap_counts == o.swap_counts && stats == o.stats && host == o.host &&
           hot == o.hot;
  }
};

// Descriptors of one Case; tests replace one to make it wrong.
struct Call {
  explicit Call(Case& c)
      : topk(c.topk.data(), HS_DTYPE_INT32, {Case::T, Case::K}),
        req_id_per_token(c.req_id_per_token.data(), HS_DTYPE_INT32, {Case::T}),
        request_state_indices(c.request_state_indices.data(), HS_DTYPE_INT32, {Case::B}),
        device_global_indices(c.device_global_indices.data(), HS_DTYPE_INT32, {Case::S, Case::H}),
        lru_slots(c.lru_slots.data(), HS_DTYPE_INT16, {Case::S, Case::H}),
        hot_block_table(c.hot_block_table.data(), HS_DTYPE_INT32, {Case::B, Case::kHotBlocks}),
        out_attention(c.attention.data(), HS_DTYPE_INT32, {Case::T, Case::K}),
        out_hot_rows(c.hot_rows.data(), HS_DTYPE_INT32, {Case::T, Case::K}),
        out_resolved(c.resolved.data(), HS_DTYPE_INT32, {Case::T, Case::K}),
        out_miss_mask(c.miss_mask.data(), HS_DTYPE_INT32, {Case::T, Case::K}),
        out_valid_counts(c.valid_counts.data(), HS_DTYPE_INT32, {Case::T}),
        out_swap_host_rows(c.swap_host_rows.data(), HS_DTYPE_INT32, {Case::T, Case::K}),
        out_swap_device_rows(c.swap_device_rows.data(), HS_DTYPE_INT32, {Case::T, Case::K}),
        out_swap_counts(c.swap_counts.data(), HS_DTYPE_INT32, {Case::T}),
        stats(c.stats.data(), HS_DTYPE_INT64, {5}),
        host(c.host.data(), HS_DTYPE_UINT8, {Case::kHostRows, Case::kRowBytes}),
        hot(c.hot.data(), HS_DTYPE_UINT8, {Case::kHotRows, Case::kRowBytes}) {
    hs_resolve_residency_args_init(&args);
  }

  hs::Tensor topk, req_id_per_token, request_state_indices, device_global_indices, lru_slots, hot_block_table,
      out_attention, out_hot_rows, out_resolved, out_miss_mask, out_valid_counts, out_swap_host_rows,
      out_swap_device_rows, out_swap_counts, stats, host, hot;
  hs_resolve_residency_args_t args;

  // The resolver's args; with `fused` also the gather fields.
  hs_resolve_residency_args_t& bind(bool fused) {
    args.topk_indices = topk;
    args.req_id_per_token = req_id_per_token;
    args.request_state_indices = request_state_indices;
    args.device_global_indices = device_global_indices;
    args.lru_slots = lru_slots;
    args.hot_block_table = hot_block_table;
    args.hot_block_size = Case::kHotBlockSize;
    args.attention_block_stride = Case::kHotBlockStride;
    args.host_rows = Case::kResolverHostRows;
    args.max_union_rows = Case::H;
    args.out_attention = out_attention;
    args.out_hot_rows = out_hot_rows;
    args.out_resolved = out_resolved;
    args.out_miss_mask = out_miss_mask;
    args.out_valid_counts = out_valid_counts;
    args.out_swap_host_rows = out_swap_host_rows;
    args.out_swap_device_rows = out_swap_device_rows;
    args.out_swap_counts = out_swap_counts;
    args.stats = stats;
    args.gather_host_cache = fused ? host.get() : nullptr;
    args.gather_hot_cache = fused ? hot.get() : nullptr;
    args.gather_hot_block_stride = fused ? Case::kHotBlockStride : 0;
    return args;
  }

  // The unfused sequence: resolve, then gather_compact on its swap list.
  void resolve_then_gather() {
    ASSERT_EQ(hs_resolve_residency(&bind(false), nullptr), HS_SUCCESS) << hs_last_error();
    hs_gather_compact_args_t g;
    hs_gather_compact_args_init(&g);
    g.host_cache = host;
    g.hot_cache = hot;
    g.swap_host_rows = out_swap_host_rows;
    g.swap_device_rows = out_swap_device_rows;
    g.swap_counts = out_swap_counts;
    g.hot_block_size = Case::kHotBlockSize;
    g.hot_block_stride = Case::kHotBlockStride;
    ASSERT_EQ(hs_gather_compact(&g, nullptr), HS_SUCCESS) << hs_last_error();
  }
};

TEST(FusedGather, MatchesResolveThenGatherOverSteps) {
  Case fused, separate;
  const std::vector<std::vector<int32_t>> steps = {
      {5, 21, 5, -1, 7, 2, 22, 9, 1, 2, 3, 4},      // cold: 6 misses over two token rows, two past the host cache
      {5, 21, 5, -1, 7, 2, 22, 9, 1, 2, 3, 4},      // fixed point: no misses, hot cache unchanged
      {11, 12, 13, 14, 15, 16, 5, 17, 0, 0, 0, 0},  // 7 misses: evictions in LRU order
  };
  for (size_t step = 0; step < steps.size(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    fused.set_topk(steps[step]);
    separate.set_topk(steps[step]);
    const std::vector<uint8_t> hot_before = fused.hot;
    const int64_t misses_before = fused.stats[HS_STAT_MISSES];
    Call f(fused);
    ASSERT_EQ(hs_resolve_residency(&f.bind(true), nullptr), HS_SUCCESS) << hs_last_error();
    Call(separate).resolve_then_gather();
    EXPECT_TRUE(fused == separate);

    // The swap list by hand: every listed row now holds its host row.
    int64_t moved = 0;
    for (int64_t t = 0; t < Case::T; ++t) {
      for (int32_t k = 0; k < fused.swap_counts[t]; ++k) {
        const int32_t h = fused.swap_host_rows[t * Case::K + k], d = fused.swap_device_rows[t * Case::K + k];
        EXPECT_EQ(fused.hot_row(d), fused.host_row(h)) << "swap entry (" << t << ", " << k << ")";
        ++moved;
      }
    }
    EXPECT_EQ(moved, fused.stats[HS_STAT_MISSES] - misses_before);
    EXPECT_EQ(moved, (std::vector<int64_t>{6, 0, 7})[step]);
    if (moved == 0) EXPECT_EQ(fused.hot, hot_before);
    EXPECT_EQ(fused.swap_counts[2], 0);  // the padding row moves nothing
  }
}

TEST(FusedGather, CpuZeroFillsSlotsPastTheHostCache) {
  Case c;
  Call call(c);
  ASSERT_EQ(hs_resolve_residency(&call.bind(true), nullptr), HS_SUCCESS) << hs_last_error();
  // Misses in rank order: 5, 21, 7, 2, 22, 9 -> row 0 gets 4, row 1 gets 2.
  EXPECT_EQ(c.swap_counts, (std::vector<int32_t>{4, 2, 0}));
  EXPECT_EQ(std::vector<int32_t>(c.swap_host_rows.begin(), c.swap_host_rows.begin() + 4),
            (std::vector<int32_t>{5, 21, 7, 2}));
  const int32_t d21 = c.swap_device_rows[1];
  EXPECT_EQ(c.hot_row(d21), std::vector<uint8_t>(Case::kRowBytes, 0));
  EXPECT_EQ(c.hot_row(c.swap_device_rows[0]), c.host_row(5));
  // Slots 6 and 7 (block 1 -> physical rows 2 and 3) took no miss, and the
  // row between blocks 0 and 1 (offset 2) belongs to no hot row: untouched.
  const std::vector<uint8_t> fill(Case::kRowBytes, kHotFill);
  EXPECT_EQ(c.hot_row(2), fill);
  EXPECT_EQ(c.hot_row(3), fill);
  EXPECT_EQ(std::vector<uint8_t>(c.hot.begin() + 2 * Case::kRowBytes, c.hot.begin() + 3 * Case::kRowBytes), fill);
}

TEST(FusedGather, ArgsStructOfAnotherSizeOrVersionIsRefused) {
  Case c;
  const Case before = c;
  Call call(c);
  hs_resolve_residency_args_t& args = call.bind(true);
  args.struct_size = offsetof(hs_resolve_residency_args_t, gather_host_cache);
  expect_error(hs_resolve_residency(&args, nullptr), HS_ERROR_INVALID_ARGUMENT, {"args", "struct_size"});
  args.struct_size = sizeof(args);
  for (const uint32_t version : {0u, HS_RESOLVE_RESIDENCY_ARGS_VERSION + 1u}) {
    args.struct_version = version;
    expect_error(hs_resolve_residency(&args, nullptr), HS_ERROR_INVALID_ARGUMENT, {"args", "struct_version"});
  }
  EXPECT_TRUE(c == before);
  EXPECT_EQ(c.hot, before.hot);
}

TEST(FusedGather, BadArgumentsNameThemAndChangeNothing) {
  Case c;
  const Case before = c;
  std::vector<int16_t> wide_hot(Case::kHotRows * Case::kRowBytes);
  std::vector<uint8_t> odd_host(Case::kHostRows * 24);
  struct Bad {
    const char* what;
    hs_status_t status;
    std::vector<const char*> fragments;
    void (*edit)(Call&, hs_resolve_residency_args_t&, void*, void*);
  };
  const std::vector<Bad> cases = {
      {"hot cache alone",
       HS_ERROR_INVALID_ARGUMENT,
       {"gather_host_cache", "NULL", "together"},
       [](Call&, hs_resolve_residency_args_t& a, void*, void*) { a.gather_host_cache = nullptr; }},
      {"host rows alone",
       HS_ERROR_INVALID_ARGUMENT,
       {"gather_hot_cache", "NULL", "together"},
       [](Call&, hs_resolve_residency_args_t& a, void*, void*) { a.gather_hot_cache = nullptr; }},
      {"stride without a gather",
       HS_ERROR_INVALID_ARGUMENT,
       {"gather_hot_block_stride", "expected 0"},
       [](Call&, hs_resolve_residency_args_t& a, void*, void*) {
         a.gather_host_cache = nullptr;
         a.gather_hot_cache = nullptr;  // gather_hot_block_stride stays 3
       }},
      {"schedule out of range",
       HS_ERROR_INVALID_ARGUMENT,
       {"gather_schedule", "HS_RESOLVE_GATHER_AUTO", "HS_RESOLVE_GATHER_FUSED", "got 7"},
       [](Call&, hs_resolve_residency_args_t& a, void*, void*) { a.gather_schedule = 7; }},
      {"schedule without a gather",
       HS_ERROR_INVALID_ARGUMENT,
       {"gather_schedule", "expected 0 without"},
       [](Call&, hs_resolve_residency_args_t& a, void*, void*) {
         a.gather_host_cache = nullptr;
         a.gather_hot_cache = nullptr;
         a.gather_hot_block_stride = 0;
         a.gather_schedule = HS_RESOLVE_GATHER_FUSED;
       }},
      {"stride below the block size",
       HS_ERROR_INVALID_ARGUMENT,
       {"gather_hot_block_stride", "at least"},
       [](Call&, hs_resolve_residency_args_t& a, void*, void*) { a.gather_hot_block_stride = 1; }},
      {"hot cache dtype",
       HS_ERROR_INVALID_DTYPE,
       {"gather_hot_cache", "dtype uint8", "gather_host_cache"},
       [](Call& call, hs_resolve_residency_args_t& a, void* wide, void*) {
         call.hot = hs::Tensor(wide, HS_DTYPE_INT16, {Case::kHotRows, Case::kRowBytes});
         a.gather_hot_cache = call.hot;
       }},
      {"host row width",
       HS_ERROR_INVALID_ARGUMENT,
       {"gather_host_cache", "multiple of 16 bytes"},
       [](Call& call, hs_resolve_residency_args_t& a, void*, void* odd) {
         call.host = hs::Tensor(odd, HS_DTYPE_UINT8, {Case::kHostRows, 24});
         a.gather_host_cache = call.host;
       }},
      {"hot cache on another device",
       HS_ERROR_INVALID_ARGUMENT,
       {"gather_hot_cache", "expected a tensor on cpu", "topk_indices"},
       [](Call& call, hs_resolve_residency_args_t& a, void*, void*) {
         call.hot =
             hs::Tensor(a.gather_hot_cache->data, HS_DTYPE_UINT8, {Case::kHotRows, Case::kRowBytes}, HS_DEVICE_CUDA, 0);
         a.gather_hot_cache = call.hot;
       }},
      {"3-D hot cache with another block stride",
       HS_ERROR_INVALID_ARGUMENT,
       {"gather_hot_cache", "gather_hot_block_stride x row width"},
       [](Call& call, hs_resolve_residency_args_t& a, void*, void*) {
         call.hot = hs::Tensor(a.gather_hot_cache->data, HS_DTYPE_UINT8, {4, Case::kHotBlockSize, Case::kRowBytes});
         a.gather_hot_cache = call.hot;
       }},
  };
  for (const Bad& bad : cases) {
    SCOPED_TRACE(bad.what);
    Call call(c);
    hs_resolve_residency_args_t& args = call.bind(true);
    bad.edit(call, args, wide_hot.data(), odd_host.data());
    expect_error(hs_resolve_residency(&args, nullptr), bad.status, bad.fragments);
    EXPECT_TRUE(c == before) << "state, outputs or hot cache changed by a failed call";
  }
}

}  // namespace
