// Data movement through the C ABI on the CPU backend, by hand: gather_compact
// into a block-strided hot cache (copies, zero fill, clamped counts, skips),
// gather_plan, invalidate_written_slots over several tables, mirror_rows,
// swap_blocks_batch, and errors that name the argument.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "expect_status.hpp"
#include "hisparse/hisparse.h"
#include "hisparse/hisparse.hpp"

namespace {

// 16-byte aligned host rows of `row_bytes`, row r filled with the byte r + 1.
struct Rows {
  Rows(int64_t rows, int64_t row_bytes, int fill_offset = 1) : rows(rows), row_bytes(row_bytes) {
    storage.resize(static_cast<size_t>(rows * row_bytes + 16));
    base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(storage.data()) + 15) / 16 * 16);
    for (int64_t r = 0; r < rows; ++r) std::memset(base + r * row_bytes, static_cast<int>(r + fill_offset), row_bytes);
  }
  hs::Tensor tensor() { return hs::Tensor(base, HS_DTYPE_UINT8, {rows, row_bytes}); }
  uint8_t at(int64_t row, int64_t byte = 0) const { return base[row * row_bytes + byte]; }
  bool row_is(int64_t row, uint8_t value) const {
    for (int64_t b = 0; b < row_bytes; ++b) {
      if (base[row * row_bytes + b] != value) return false;
    }
    return true;
  }
  int64_t rows;
  int64_t row_bytes;
  std::vector<uint8_t> storage;
  uint8_t* base = nullptr;
};

TEST(GatherCompact, StridedHotBlocksZeroFillClampAndSkips) {
  Rows host(10, 32);                  // row r holds byte r + 1
  Rows hot(3 * 5 + 2, 32, 100);       // 4 blocks of 2 rows, 5 rows apart (+ tail), row r holds r + 100
  std::vector<int32_t> swap_host = {3, 10, -1, 5, 4,   //
                                    1, 2,  3,  4, 9,     //
                                    7, 8,  0,  6, 2};
  std::vector<int32_t> swap_dev = {0, 3, 1,  20, 6,     //
                                   7, 2, -1, 4,  5,     //
                                   1, 1, 1,  1,  1};
  std::vector<int32_t> counts = {4, 9, -3};            // 4 used, clamped to 5, clamped to 0
  hs::Tensor sh(swap_host.data(), HS_DTYPE_INT32, {3, 5});
  hs::Tensor sd(swap_dev.data(), HS_DTYPE_INT32, {3, 5});
  hs::Tensor sc(counts.data(), HS_DTYPE_INT32, {3});
  hs::Tensor host_t = host.tensor();
  hs::Tensor hot_t = hot.tensor();
  hs_gather_compact_args_t args;
  hs_gather_compact_args_init(&args);
  args.host_cache = host_t;
  args.hot_cache = hot_t;
  args.swap_host_rows = sh;
  args.swap_device_rows = sd;
  args.swap_counts = sc;
  args.hot_block_size = 2;
  args.hot_block_stride = 5;
  ASSERT_EQ(hs_gather_compact(&args, nullptr), HS_SUCCESS) << hs_last_error();

  auto offset = [](int64_t r) { return (r / 2) * 5 + r % 2; };
  std::vector<int> expected(static_cast<size_t>(hot.rows));
  for (int64_t r = 0; r < hot.rows; ++r) expected[r] = static_cast<int>(r + 100);
  expected[offset(0)] = host.at(3);  // (3 -> 0)
  expected[offset(3)] = 0;           // host slot 10 of 10 rows: zero fill
  // (-1 -> 1) skipped; (5 -> 20): offset 50 is outside the 17-row cache; (4 -> 6) past count 4
  expected[offset(7)] = host.at(1);
  expected[offset(2)] = host.at(2);
  // (3 -> -1) skipped
  expected[offset(4)] = host.at(4);
  expected[offset(5)] = host.at(9);
  // row 2: count -3 -> 0, nothing
  for (int64_t r = 0; r < hot.rows; ++r) {
    EXPECT_TRUE(hot.row_is(r, static_cast<uint8_t>(expected[r]))) << "hot row offset " << r;
  }
}

TEST(GatherCompact, ErrorsNameTheArgument) {
  Rows host(4, 32);
  Rows hot(4, 32);
  std::vector<int64_t> wide(8, 0);
  std::vector<int32_t> counts = {1};
  hs::Tensor host_t = host.tensor();
  hs::Tensor hot_t = hot.tensor();
  hs::Tensor sh(wide.data(), HS_DTYPE_INT64, {1, 4});
  hs::Tensor sc(counts.data(), HS_DTYPE_INT32, {1});
  hs_gather_compact_args_t args;
  hs_gather_compact_args_init(&args);
  args.host_cache = host_t;
  args.hot_cache = hot_t;
  args.swap_host_rows = sh;
  args.swap_device_rows = sh;
  args.swap_counts = sc;
  args.hot_block_size = 4;
  expect_error(hs_gather_compact(&args, nullptr), HS_ERROR_INVALID_DTYPE, {"swap_host_rows", "int32", "int64"});

  hs::Tensor narrow(host.base, HS_DTYPE_UINT8, {8, 12});
  args.host_cache = narrow;
  expect_error(hs_gather_compact(&args, nullptr), HS_ERROR_INVALID_ARGUMENT, {"host_cache", "multiple of 16 bytes"});

  args.host_cache = host_t;
  args.hot_block_size = 0;
  expect_error(hs_gather_compact(&args, nullptr), HS_ERROR_INVALID_ARGUMENT, {"hot_block_size"});

  hs_gather_compact_args_t old_args = args;
  old_args.struct_size = offsetof(hs_gather_compact_args_t, variant);
  expect_error(hs_gather_compact(&old_args, nullptr), HS_ERROR_INVALID_ARGUMENT, {"struct_size"});
  expect_error(hs_gather_compact(nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT, {"args"});
}

TEST(GatherCompact, VariantNames) {
  EXPECT_STREQ(hs_gather_variant_name(HS_GATHER_WARP_PER_ROW), "warp_per_row");
  EXPECT_STREQ(hs_gather_variant_name(HS_GATHER_SORTED), "sorted");
  EXPECT_STREQ(hs_gather_variant_name(HS_GATHER_ROW_PERSISTENT), "row_persistent");
  EXPECT_STREQ(hs_gather_variant_name(HS_NUM_GATHER_VARIANTS), "unknown");
  const int32_t variant = hs_gather_default_variant();
  EXPECT_GT(variant, HS_GATHER_AUTO);
  EXPECT_LT(variant, HS_NUM_GATHER_VARIANTS);
}

TEST(GatherPlan, CopiesMissesOnly) {
  Rows src(6, 16);
  Rows staged(5, 16, 200);
  std::vector<int32_t> row_ids = {4, 0, -1, 6, 2, 1};
  std::vector<int32_t> dst_rows = {0, 1, 2, 3, 9, 4};
  std::vector<int32_t> miss_mask = {1, 0, 1, 1, 1, 5};
  hs::Tensor src_t = src.tensor();
  hs::Tensor staged_t = staged.tensor();
  hs::Tensor ids(row_ids.data(), HS_DTYPE_INT32, {1, 6});
  hs::Tensor dst(dst_rows.data(), HS_DTYPE_INT32, {1, 6});
  hs::Tensor mask(miss_mask.data(), HS_DTYPE_INT32, {1, 6});
  ASSERT_EQ(hs_gather_plan(src_t, staged_t, ids, dst, mask, nullptr), HS_SUCCESS) << hs_last_error();
  EXPECT_TRUE(staged.row_is(0, src.at(4)));
  EXPECT_TRUE(staged.row_is(1, 201));  // mask 0
  EXPECT_TRUE(staged.row_is(2, 202));  // row id -1
  EXPECT_TRUE(staged.row_is(3, 203));  // row id 6 of 6 source rows
  EXPECT_TRUE(staged.row_is(4, src.at(1)));
}

TEST(InvalidateWrittenSlots, ClearsEveryCopyInEveryTableAndNothingElse) {
  // Two tables [3 state rows, 4 slots].
  std::vector<int32_t> a = {5, 7, 5, 1,   //
                            5, 2, 3, 5,   //
                            9, 9, 9, 9};
  std::vector<int32_t> b = {7, 7, 0, 5,   //
                            1, 5, 5, 8,   //
                            5, 5, 5, 5};
  std::vector<int32_t> state_indices = {1, -1, 0};
  std::vector<int32_t> req_ids = {0, 1, 2, 3};
  std::vector<int32_t> written = {5, 9, 7, 5};
  hs::Tensor ta(a.data(), HS_DTYPE_INT32, {3, 4});
  hs::Tensor tb(b.data(), HS_DTYPE_INT32, {3, 4});
  const hs_tensor_t* tables[] = {ta, tb};
  hs::Tensor rsi(state_indices.data(), HS_DTYPE_INT32, {3});
  hs::Tensor req(req_ids.data(), HS_DTYPE_INT32, {4});
  hs::Tensor w(written.data(), HS_DTYPE_INT32, {4});
  hs_invalidate_written_slots_args_t args;
  hs_invalidate_written_slots_args_init(&args);
  args.tables = tables;
  args.num_tables = 2;
  args.request_state_indices = rsi;
  args.req_id_per_token = req;
  args.written_slots = w;
  ASSERT_EQ(hs_invalidate_written_slots(&args, nullptr), HS_SUCCESS) << hs_last_error();
  // Token 0: batch row 0 -> state 1, slot 5. Token 1: padding. Token 2: batch
  // row 2 -> state 0, slot 7. Token 3: batch row 3 does not exist.
  EXPECT_EQ(a, (std::vector<int32_t>{5, -1, 5, 1, -1, 2, 3, -1, 9, 9, 9, 9}));
  EXPECT_EQ(b, (std::vector<int32_t>{-1, -1, 0, 5, 1, -1, -1, 8, 5, 5, 5, 5}));

  std::vector<int32_t> other(12, 0);
  hs::Tensor tc(other.data(), HS_DTYPE_INT32, {4, 3});
  const hs_tensor_t* mismatched[] = {ta, tc};
  args.tables = mismatched;
  expect_error(hs_invalidate_written_slots(&args, nullptr), HS_ERROR_INVALID_ARGUMENT, {"tables[1]", "[3, 4]"});
}

TEST(MirrorAndSwap, RowsAndBlocksReachTheirTargets) {
  Rows device_rows(3, 32, 50);
  Rows host(5, 32, 0);
  std::vector<int64_t> slots = {4, -1, 1};
  hs::Tensor src_t = device_rows.tensor();
  hs::Tensor host_t = host.tensor();
  hs::Tensor slot_t(slots.data(), HS_DTYPE_INT64, {3});
  ASSERT_EQ(hs_mirror_rows(src_t, host_t, slot_t, nullptr), HS_SUCCESS) << hs_last_error();
  EXPECT_TRUE(host.row_is(4, 50));
  EXPECT_TRUE(host.row_is(1, 52));
  EXPECT_TRUE(host.row_is(0, 0));
  EXPECT_TRUE(host.row_is(2, 2));

  std::vector<uint8_t> from(40, 7), to(40, 0);
  std::vector<int64_t> src = {reinterpret_cast<int64_t>(from.data()), reinterpret_cast<int64_t>(from.data() + 20)};
  std::vector<int64_t> dst = {reinterpret_cast<int64_t>(to.data() + 1), 0};
  std::vector<int64_t> sizes = {11, 5};  // the second has a null destination: skipped
  hs::Tensor s(src.data(), HS_DTYPE_INT64, {2}), d(dst.data(), HS_DTYPE_INT64, {2}),
      n(sizes.data(), HS_DTYPE_INT64, {2});
  ASSERT_EQ(hs_swap_blocks_batch(s, d, n, nullptr), HS_SUCCESS) << hs_last_error();
  for (size_t i = 0; i < to.size(); ++i) EXPECT_EQ(to[i], (i >= 1 && i < 12) ? 7 : 0) << i;

  hs::Tensor short_sizes(sizes.data(), HS_DTYPE_INT64, {1});
  expect_error(hs_swap_blocks_batch(s, d, short_sizes, nullptr), HS_ERROR_INVALID_ARGUMENT, {"sizes"});
}

// Rows of 32 bytes, blocks of 2 rows (64 bytes), in a buffer aligned to 128.
TEST(WarmHostPages, ReadsEveryPageOfConsecutiveBlocksOnce) {
  alignas(128) uint32_t words[64];
  for (uint32_t i = 0; i < 64; ++i) words[i] = 1u << (i % 32) | i << 20;
  hs::Tensor host(words, HS_DTYPE_UINT8, {8, 32});
  std::vector<int32_t> table = {0, 1, 3};
  hs::Tensor table_t(table.data(), HS_DTYPE_INT32, {1, 3});
  std::vector<int64_t> out(2, -1);
  hs::Tensor out_t(out.data(), HS_DTYPE_INT64, {2});
  // 64-byte pages: every block starts one (bytes 0, 64, 192).
  ASSERT_EQ(hs_warm_host_pages(host, table_t, nullptr, 2, 64, out_t, nullptr), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(out[0], 3);
  EXPECT_EQ(out[1], static_cast<int64_t>(words[0] ^ words[16] ^ words[48]));
  // 128-byte pages: block 1 lies in block 0's page; block 3 follows no block
  // below it, so its first word is read though it starts mid-page.
  ASSERT_EQ(hs_warm_host_pages(host, table_t, nullptr, 2, 128, out_t, nullptr), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(out[0], 2);
  EXPECT_EQ(out[1], static_cast<int64_t>(words[0] ^ words[48]));
  // A length of 3 rows uses the first two entries.
  std::vector<int32_t> lengths = {3};
  hs::Tensor lengths_t(lengths.data(), HS_DTYPE_INT32, {1});
  ASSERT_EQ(hs_warm_host_pages(host, table_t, lengths_t, 2, 64, out_t, nullptr), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(out[0], 2);
  expect_error(hs_warm_host_pages(host, table_t, nullptr, 2, 48, out_t, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"page_bytes", "power of two", "48"});
  expect_error(hs_warm_host_pages(host, table_t, nullptr, 0, 64, out_t, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"block_size", "got 0"});
  hs::Tensor short_out(out.data(), HS_DTYPE_INT64, {1});
  expect_error(hs_warm_host_pages(host, table_t, nullptr, 2, 64, short_out, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"out"});
  EXPECT_EQ(out[0], 2);  // a refused call writes nothing
}

}  // namespace
