// Prefill staging through the C ABI on the CPU backend (hisparse/staging.h):
// plans built by hand, block ids out of the int32 row range, GPU sources
// with their cache and drop rules, both gathers, the remap on its own, the
// RAII layer, and errors that name the argument and leave the plan as it was.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#ifdef HISPARSE_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "expect_status.hpp"
#include "hisparse/hisparse.h"
#include "hisparse/hisparse.hpp"
#include "unregistered_pool.hpp"

namespace {

std::vector<int32_t> read(const hs_tensor_t& t) {
  int64_t n = 1;
  for (int d = 0; d < t.ndim; ++d) n *= t.shape[d];
  const int32_t* data = static_cast<const int32_t*>(t.data);
  return std::vector<int32_t>(data, data + n);
}

std::vector<int32_t> plan_tensor(const hs::StagingPlan& plan, hs_staging_plan_tensor_t which) {
  return read(plan.tensor(which));
}

std::vector<int32_t> iota(int32_t n) {
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) out[i] = i;
  return out;
}

// The by-hand batch of docs/staging.md: request 0 reads blocks 5, 3;
// request 1 reads 3, 9 and the null block (-1); 7 and 4 are never read.
struct HandBatch {
  std::vector<int32_t> table = {5, 3, 0, 7, 3, 9, -1, 4};
  std::vector<int32_t> lens = {3, 5};
  hs::Tensor table_t{table.data(), HS_DTYPE_INT32, {2, 4}};
  hs::Tensor lens_t{lens.data(), HS_DTYPE_INT32, {2}};
};

TEST(StagingPlan, BuildsTheRenumberedPlanByHand) {
  HandBatch batch;
  hs::StagingPlan plan(HS_DEVICE_CPU, -1, 2, 4, 2, 6);
  EXPECT_EQ(plan.info().built, 0);
  plan.build(batch.table_t, batch.lens_t);
  const hs_staging_plan_info_t info = plan.info();
  EXPECT_EQ(info.built, 1);
  EXPECT_EQ(info.has_gpu_sources, 0);
  EXPECT_EQ(info.owns_storage, 1);
  EXPECT_EQ(info.num_blocks, 7);
  EXPECT_EQ(info.num_staged_rows, 14);
  EXPECT_EQ(plan_tensor(plan, HS_STAGING_PLAN_BLOCK_TABLE), (std::vector<int32_t>{2, 1, 0, 0, 1, 3, 0, 0}));
  EXPECT_EQ(plan_tensor(plan, HS_STAGING_PLAN_ROW_IDS),
            (std::vector<int32_t>{0, 1, 6, 7, 10, 11, 18, 19, -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(plan_tensor(plan, HS_STAGING_PLAN_DST_ROWS), iota(14));
  EXPECT_EQ(plan_tensor(plan, HS_STAGING_PLAN_MISS_MASK),
            (std::vector<int32_t>{1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0}));
  const hs_tensor_t table = plan.tensor(HS_STAGING_PLAN_BLOCK_TABLE);
  EXPECT_EQ(table.dtype, HS_DTYPE_INT32);
  EXPECT_EQ(table.ndim, 2);
  EXPECT_EQ(table.shape[0], 2);
  EXPECT_EQ(table.shape[1], 4);

  // Capacity 3: request 1's second and third block do not fit.
  hs::StagingPlan small(HS_DEVICE_CPU, -1, 2, 4, 2, 3);
  small.build(batch.table_t, batch.lens_t);
  EXPECT_EQ(plan_tensor(small, HS_STAGING_PLAN_BLOCK_TABLE), (std::vector<int32_t>{2, 1, 0, 0, 1, 0, 0, 0}));
  EXPECT_EQ(plan_tensor(small, HS_STAGING_PLAN_ROW_IDS), (std::vector<int32_t>{0, 1, 6, 7, 10, 11, -1, -1}));
}

TEST(StagingPlan, BlockIdsOutsideTheInt32RowRangeAreTheNullBlockNotWrapped) {
  // block_size 4: ids up to (2^31 - 1 - 3) / 4 = 2^29 - 1 have int32 rows.
  const int64_t last = (int64_t{1} << 29) - 1;
  std::vector<int64_t> table = {last, last + 1, (int64_t{1} << 32) + 5, 5, -7, (int64_t{1} << 40)};
  std::vector<int64_t> lens = {24};
  hs::Tensor table_t(table.data(), HS_DTYPE_INT64, {1, 6});
  hs::Tensor lens_t(lens.data(), HS_DTYPE_INT64, {1});
  hs::StagingPlan plan(HS_DEVICE_CPU, -1, 1, 6, 4, 6);
  plan.build(table_t, lens_t);
  // Distinct staged ids: 0, 5, last. 2^32 + 5 is not 5 (no truncation) and
  // last + 1 does not wrap to a negative row.
  EXPECT_EQ(plan_tensor(plan, HS_STAGING_PLAN_BLOCK_TABLE), (std::vector<int32_t>{2, 0, 0, 1, 0, 0}));
  const std::vector<int32_t> rows = plan_tensor(plan, HS_STAGING_PLAN_ROW_IDS);
  ASSERT_EQ(rows.size(), 28u);
  EXPECT_EQ(std::vector<int32_t>(rows.begin(), rows.begin() + 12),
            (std::vector<int32_t>{0, 1, 2, 3, 20, 21, 22, 23, 2147483644, 2147483645, 2147483646, 2147483647}));
  for (size_t j = 12; j < rows.size(); ++j) EXPECT_EQ(rows[j], -1) << j;

  // The same ids in int32: last + 1 = 2^29 would wrap (2^29 * 4 = 2^31).
  std::vector<int32_t> table32 = {static_cast<int32_t>(last + 1), 7};
  std::vector<int32_t> lens32 = {8};
  hs::Tensor table32_t(table32.data(), HS_DTYPE_INT32, {1, 2});
  hs::Tensor lens32_t(lens32.data(), HS_DTYPE_INT32, {1});
  hs::StagingPlan plan32(HS_DEVICE_CPU, -1, 1, 2, 4, 2);
  plan32.build(table32_t, lens32_t);
  EXPECT_EQ(plan_tensor(plan32, HS_STAGING_PLAN_BLOCK_TABLE), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(plan_tensor(plan32, HS_STAGING_PLAN_ROW_IDS),
            (std::vector<int32_t>{0, 1, 2, 3, 28, 29, 30, 31, -1, -1, -1, -1}));
}

TEST(StagingPlan, HugeAndNegativeLengthsPackExactly) {
  // A length near 2^63 must not overflow the packing: it fills the capacity.
  std::vector<int32_t> table = {4, 5, 6, 7, 8, 9};
  std::vector<int64_t> lens = {-5, INT64_MAX};
  hs::Tensor table_t(table.data(), HS_DTYPE_INT32, {2, 3});
  hs::Tensor lens_t(lens.data(), HS_DTYPE_INT64, {2});
  hs::StagingPlan plan(HS_DEVICE_CPU, -1, 2, 3, 1, 5);
  plan.build(table_t, lens_t);
  // Request 0 reads nothing; request 1 fills columns 0-2, then two slots past C.
  EXPECT_EQ(plan_tensor(plan, HS_STAGING_PLAN_BLOCK_TABLE), (std::vector<int32_t>{0, 0, 0, 1, 2, 3}));
  EXPECT_EQ(plan_tensor(plan, HS_STAGING_PLAN_ROW_IDS), (std::vector<int32_t>{0, 7, 8, 9, -1, -1}));
}

// docs/staging.md's by-hand GPU sources: staged blocks 0 (null), 3, 5, 9.
struct SourcesCase {
  std::vector<int32_t> table = {5, 3, 3, 9};
  std::vector<int32_t> lens = {8, 8};
  std::vector<int32_t> resident = {0, 6, 0, 8, 4, 0, 2, 0, 1, 1, 1, 1};
  std::vector<int32_t> states = {0, 1};
  hs::Tensor table_t{table.data(), HS_DTYPE_INT32, {2, 2}};
  hs::Tensor lens_t{lens.data(), HS_DTYPE_INT32, {2}};
  hs::Tensor resident_t{resident.data(), HS_DTYPE_INT32, {3, 4}};
  hs::Tensor states_t{states.data(), HS_DTYPE_INT32, {2}};
  hs::StagingPlan plan{HS_DEVICE_CPU, -1, 2, 2, 4, 4};
  SourcesCase() { plan.build(table_t, lens_t); }
};

const std::vector<int32_t> kHostOnlyMiss = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0};

TEST(StagingPlan, GpuSourcesByHandAndTheirCache) {
  SourcesCase c;
  c.plan.ensure_gpu_sources(c.resident_t, c.states_t, 2);
  hs_staging_plan_info_t info = c.plan.info();
  EXPECT_EQ(info.has_gpu_sources, 1);
  EXPECT_EQ(info.gpu_source_table, reinterpret_cast<uintptr_t>(c.resident.data()));
  EXPECT_EQ(info.gpu_source_block_size, 2);
  // Host 3 is first referenced by (0, 1): request 0's pages (0, 8) serve it.
  EXPECT_EQ(plan_tensor(c.plan, HS_STAGING_PLAN_GPU_ROW_IDS),
            (std::vector<int32_t>{-1, -1, -1, -1, -1, -1, 16, 17, -1, -1, 12, 13, 4, 5, -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(plan_tensor(c.plan, HS_STAGING_PLAN_MISS_MASK),
            (std::vector<int32_t>{1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0}));

  // Same table and page size: cached, even after the table changed in place.
  const std::vector<int32_t> first = plan_tensor(c.plan, HS_STAGING_PLAN_GPU_ROW_IDS);
  std::fill(c.resident.begin(), c.resident.end(), 0);
  c.plan.ensure_gpu_sources(c.resident_t, c.states_t, 2);
  EXPECT_EQ(plan_tensor(c.plan, HS_STAGING_PLAN_GPU_ROW_IDS), first);
  // Another page size recomputes (now all zero pages: nothing resident).
  c.plan.ensure_gpu_sources(c.resident_t, c.states_t, 4);
  EXPECT_EQ(c.plan.info().gpu_source_block_size, 4);
  EXPECT_EQ(plan_tensor(c.plan, HS_STAGING_PLAN_GPU_ROW_IDS), std::vector<int32_t>(20, -1));
  EXPECT_EQ(plan_tensor(c.plan, HS_STAGING_PLAN_MISS_MASK), kHostOnlyMiss);

  // An unusable call after a usable one drops the sources.
  std::fill(c.resident.begin(), c.resident.end(), 3);
  c.plan.ensure_gpu_sources(c.resident_t, c.states_t, 2);
  EXPECT_EQ(c.plan.info().has_gpu_sources, 1);
  EXPECT_NE(plan_tensor(c.plan, HS_STAGING_PLAN_MISS_MASK), kHostOnlyMiss);
  c.plan.ensure_gpu_sources(c.resident_t, c.states_t, 3);  // 4 is not a multiple of 3
  info = c.plan.info();
  EXPECT_EQ(info.has_gpu_sources, 0);
  EXPECT_EQ(info.gpu_source_table, 0u);
  EXPECT_EQ(info.gpu_source_block_size, 0);
  EXPECT_EQ(plan_tensor(c.plan, HS_STAGING_PLAN_MISS_MASK), kHostOnlyMiss);
  // Too few state indices, a page size <= 0: still nothing.
  hs::Tensor one_state(c.states.data(), HS_DTYPE_INT32, {1});
  c.plan.ensure_gpu_sources(c.resident_t, one_state, 2);
  c.plan.ensure_gpu_sources(c.resident_t, c.states_t, 0);
  EXPECT_EQ(c.plan.info().has_gpu_sources, 0);
  // A rebuild drops sources too.
  c.plan.ensure_gpu_sources(c.resident_t, c.states_t, 2);
  c.plan.build(c.table_t, c.lens_t);
  EXPECT_EQ(c.plan.info().has_gpu_sources, 0);
  EXPECT_EQ(plan_tensor(c.plan, HS_STAGING_PLAN_MISS_MASK), kHostOnlyMiss);
}

TEST(StagingPlan, PaddingStatesAndOutOfRangePagesServeNothing) {
  SourcesCase c;
  // Request 0 is padding (-1), request 1 has state 7 of 3: no resident pages.
  c.states = {-1, 7};
  c.plan.ensure_gpu_sources(c.resident_t, c.states_t, 2);
  EXPECT_EQ(c.plan.info().has_gpu_sources, 1);
  EXPECT_EQ(plan_tensor(c.plan, HS_STAGING_PLAN_GPU_ROW_IDS), std::vector<int32_t>(20, -1));
  // A page whose rows do not fit int32 is not resident (int64 table).
  std::vector<int64_t> pages = {int64_t{1} << 31, 6, 0, 8};
  hs::Tensor pages_t(pages.data(), HS_DTYPE_INT64, {1, 4});
  std::vector<int64_t> states = {0, 0};
  hs::Tensor states_t(states.data(), HS_DTYPE_INT64, {2});
  c.plan.ensure_gpu_sources(pages_t, states_t, 2);
  const std::vector<int32_t> gpu = plan_tensor(c.plan, HS_STAGING_PLAN_GPU_ROW_IDS);
  EXPECT_EQ(std::vector<int32_t>(gpu.begin() + 4, gpu.begin() + 16),
            (std::vector<int32_t>{-1, -1, 16, 17, -1, -1, 12, 13, -1, -1, 16, 17}));
}

// 16-byte aligned rows of `row_bytes`; row r of block b holds the byte
// fill + r (flat row index), so every copied row says where it came from.
struct Bytes {
  Bytes(int64_t rows, int64_t row_bytes, int fill) : rows(rows), row_bytes(row_bytes) {
    storage.resize(static_cast<size_t>(rows * row_bytes + 16));
    base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(storage.data()) + 15) / 16 * 16);
    for (int64_t r = 0; r < rows; ++r) {
      std::memset(base + r * row_bytes, static_cast<int>((fill + r) & 0xff), static_cast<size_t>(row_bytes));
    }
  }
  uint8_t row(int64_t r) const { return base[r * row_bytes]; }
  int64_t rows;
  int64_t row_bytes;
  std::vector<uint8_t> storage;
  uint8_t* base = nullptr;
};

TEST(GatherPrefillCache, ResidentRowsThenHostRows) {
  SourcesCase c;
  c.plan.ensure_gpu_sources(c.resident_t, c.states_t, 2);
  Bytes host(10 * 4, 32, 1);        // 10 host blocks of 4 rows
  Bytes resident(9 * 2, 32, 100);   // 9 resident blocks of 2 rows
  Bytes staged(5 * 4 + 3, 32, 200); // 5 staged blocks and 3 extra rows
  hs::Tensor host_t(host.base, HS_DTYPE_UINT8, {10, 4, 32});
  hs::Tensor resident_t(resident.base, HS_DTYPE_UINT8, {9, 2, 32});
  hs::Tensor staged_t(staged.base, HS_DTYPE_UINT8, {23, 32});
  c.plan.gather_prefill_cache(host_t, resident_t, staged_t);
  const std::vector<int32_t> rows = plan_tensor(c.plan, HS_STAGING_PLAN_ROW_IDS);
  const std::vector<int32_t> gpu = plan_tensor(c.plan, HS_STAGING_PLAN_GPU_ROW_IDS);
  for (int64_t j = 0; j < 23; ++j) {
    uint8_t expected = staged.row(j);
    if (j < 20 && gpu[j] >= 0) {
      expected = resident.row(gpu[j]);
    } else if (j < 20 && rows[j] >= 0) {
      expected = host.row(rows[j]);
    }
    if (j >= 16) expected = static_cast<uint8_t>(200 + j);  // unused rows and rows past N keep their bytes
    EXPECT_EQ(staged.row(j), expected) << "staged row " << j;
  }
  EXPECT_EQ(staged.row(6), resident.row(16));
  EXPECT_EQ(staged.row(4), host.row(12));

  // Without its resident cache the gather refuses to run.
  expect_error(hs_gather_prefill_cache(c.plan.get(), host_t, nullptr, staged_t, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"resident_cache", "ensure_gpu_sources", "NULL"});
  hs::Tensor wrong_pages(resident.base, HS_DTYPE_UINT8, {6, 3, 32});
  expect_error(hs_gather_prefill_cache(c.plan.get(), host_t, wrong_pages, staged_t, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"resident_cache", "[num_blocks, 2, row width]", "[6, 3, 32]"});
}

TEST(GatherPrefillCache, ErrorsNameTheArgument) {
  HandBatch batch;
  hs::StagingPlan plan(HS_DEVICE_CPU, -1, 2, 4, 2, 6);
  Bytes host(40, 32, 1);
  Bytes staged(14, 32, 0);
  hs::Tensor host_t(host.base, HS_DTYPE_UINT8, {20, 2, 32});
  hs::Tensor staged_t(staged.base, HS_DTYPE_UINT8, {14, 32});
  expect_error(hs_gather_prefill_cache(plan.get(), host_t, nullptr, staged_t, nullptr), HS_ERROR_INVALID_STATE,
               {"plan", "hs_staging_plan_build"});
  plan.build(batch.table_t, batch.lens_t);
  hs::Tensor paged_4(host.base, HS_DTYPE_UINT8, {10, 4, 32});
  expect_error(hs_gather_prefill_cache(plan.get(), paged_4, nullptr, staged_t, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"host_cache", "HiSparse staging block size 2 does not match the KV cache block size 4."});
  hs::Tensor rows_24(host.base, HS_DTYPE_UINT8, {40, 24});
  expect_error(hs_gather_prefill_cache(plan.get(), rows_24, nullptr, staged_t, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"host_cache", "src_rows", "multiple of 16"});
  hs::Tensor short_staged(staged.base, HS_DTYPE_UINT8, {13, 32});
  expect_error(hs_gather_prefill_cache(plan.get(), host_t, nullptr, short_staged, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"staged", "14 rows", "[13, 32]"});
  hs::Tensor int_staged(staged.base, HS_DTYPE_INT32, {14, 8});
  expect_error(hs_gather_prefill_cache(plan.get(), host_t, nullptr, int_staged, nullptr), HS_ERROR_INVALID_DTYPE,
               {"staged", "uint8", "int32"});
  expect_error(hs_gather_prefill_cache(nullptr, host_t, nullptr, staged_t, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"plan", "NULL"});
  // Still usable afterwards.
  ASSERT_EQ(hs_gather_prefill_cache(plan.get(), host_t, nullptr, staged_t, nullptr), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(staged.row(2), host.row(6));
}

TEST(GatherResidentRows, StridedSourceOutOfRangeRowsAndInt64Ids) {
  // Blocks of 4 rows, 8 rows apart: a paged view of every other half-slab.
  Bytes slab(6 * 8, 16, 1);
  hs::Tensor source = hs::Tensor(slab.base + 4 * 16, HS_DTYPE_UINT8, {6, 4, 16}).strides({8 * 16, 16, 1});
  std::vector<int64_t> ids = {5, -1, 0, 23, 24, 100, 7, 7};
  hs::Tensor ids_t(ids.data(), HS_DTYPE_INT64, {8});
  Bytes out(8, 16, 250);
  hs::Tensor out_t(out.base, HS_DTYPE_UINT8, {8, 16});
  hs::gather_resident_rows(source, out_t, ids_t);
  auto flat = [&](int64_t r) { return slab.row((r / 4) * 8 + 4 + r % 4); };
  for (int64_t j = 0; j < 8; ++j) {
    const int64_t r = ids[j] >= 0 && ids[j] < 24 ? ids[j] : 0;
    EXPECT_EQ(out.row(j), flat(r)) << j;
  }
  // Another dtype of the same row size is reinterpreted.
  Bytes halves(8, 16, 0);
  hs::Tensor halves_t(halves.base, HS_DTYPE_FLOAT16, {8, 8});
  hs::gather_resident_rows(source, halves_t, ids_t);
  EXPECT_EQ(std::memcmp(halves.base, out.base, 8 * 16), 0);

  hs::Tensor flat_source(slab.base, HS_DTYPE_UINT8, {48, 16});
  expect_error(hs_gather_resident_rows(flat_source, out_t, ids_t, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"source", "paged cache", "[48, 16]"});
  hs::Tensor far_source = hs::Tensor(slab.base, HS_DTYPE_UINT8, {6, 4, 16}).strides({int64_t{1} << 58, 16, 1});
  expect_error(hs_gather_resident_rows(far_source, out_t, ids_t, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"source", "stride", "exceeds any memory extent"});
  hs::Tensor empty_source(slab.base, HS_DTYPE_UINT8, {0, 4, 16});
  expect_error(hs_gather_resident_rows(empty_source, out_t, ids_t, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"source", "at least one row"});
  hs::Tensor wide(out.base, HS_DTYPE_UINT8, {4, 32});
  expect_error(hs_gather_resident_rows(source, wide, ids_t, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"destination", "16 bytes", "32 bytes"});
  hs::Tensor short_ids(ids.data(), HS_DTYPE_INT64, {3});
  expect_error(hs_gather_resident_rows(source, out_t, short_ids, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"row_ids", "one id per destination row", "[3]"});
  hs::Tensor float_ids(ids.data(), HS_DTYPE_FLOAT32, {8});
  expect_error(hs_gather_resident_rows(source, out_t, float_ids, nullptr), HS_ERROR_INVALID_DTYPE,
               {"row_ids", "int32 or int64", "float32"});
}

TEST(StagingRemap, RenumbersByHandIntoCallerTensors) {
  std::vector<int32_t> table = {7, 3, 7, 0, -5, 12};
  std::vector<int32_t> new_table(6, -9);
  std::vector<int32_t> rows(14, -9);
  const uint64_t bytes = hs::staging_remap_workspace_bytes(HS_DEVICE_CPU, -1, 6, 2);
  std::vector<uint64_t> workspace((bytes + 7) / 8 + 1);
  hs::Tensor table_t(table.data(), HS_DTYPE_INT32, {2, 3});
  hs::Tensor new_t(new_table.data(), HS_DTYPE_INT32, {2, 3});
  hs::Tensor rows_t(rows.data(), HS_DTYPE_INT32, {1, 14});
  hs::Tensor work_t(workspace.data(), HS_DTYPE_UINT8, {static_cast<int64_t>(bytes)});
  hs::staging_remap(table_t, 2, new_t, rows_t, work_t);
  EXPECT_EQ(new_table, (std::vector<int32_t>{2, 1, 2, 0, 0, 3}));
  EXPECT_EQ(rows, (std::vector<int32_t>{0, 1, 6, 7, 14, 15, 24, 25, -1, -1, -1, -1, -1, -1}));

  hs_staging_remap_args_t args;
  hs_staging_remap_args_init(&args);
  args.block_table = table_t;
  args.block_size = 2;
  args.out_block_table = new_t;
  args.out_row_ids = rows_t;
  args.workspace = work_t;
  args.block_size = -4;
  expect_error(hs_staging_remap(&args, nullptr), HS_ERROR_INVALID_ARGUMENT, {"block_size", "-4"});
  args.block_size = 3;
  expect_error(hs_staging_remap(&args, nullptr), HS_ERROR_INVALID_ARGUMENT, {"out_row_ids", "21 elements", "[1, 14]"});
  args.block_size = 2;
  hs::Tensor small_work(workspace.data(), HS_DTYPE_UINT8, {4});
  args.workspace = small_work;
  expect_error(hs_staging_remap(&args, nullptr), HS_ERROR_INVALID_ARGUMENT, {"workspace", "at least"});
  args.workspace = work_t;
  hs::Tensor short_table(new_table.data(), HS_DTYPE_INT32, {5});
  args.out_block_table = short_table;
  expect_error(hs_staging_remap(&args, nullptr), HS_ERROR_INVALID_ARGUMENT, {"out_block_table", "6 elements"});
  args.struct_size = 8;
  expect_error(hs_staging_remap(&args, nullptr), HS_ERROR_INVALID_ARGUMENT, {"args", "struct_size"});
  uint64_t ignored = 0;
  expect_error(hs_staging_remap_workspace_bytes(HS_DEVICE_CPU, -1, int64_t{1} << 30, 4, &ignored),
               HS_ERROR_INVALID_ARGUMENT, {"num_entries", "int32 row ids"});
  expect_error(hs_staging_remap_workspace_bytes(7, -1, 4, 4, &ignored), HS_ERROR_INVALID_ARGUMENT,
               {"device_type", "7"});
}

TEST(StagingPlanOptions, ErrorsNameTheOption) {
  hs_staging_plan_options_t o = hs::StagingPlan::options(HS_DEVICE_CPU, -1, 2, 4, 2, 6);
  hs_staging_plan_t plan = reinterpret_cast<hs_staging_plan_t>(0x1);
  uint64_t bytes = 0;
  auto refused = [&](std::initializer_list<const char*> fragments) {
    expect_error(hs_staging_plan_create(&o, &plan), HS_ERROR_INVALID_ARGUMENT, fragments);
    EXPECT_EQ(plan, nullptr);
    expect_error(hs_staging_plan_storage_bytes(&o, &bytes), HS_ERROR_INVALID_ARGUMENT, fragments);
    o = hs::StagingPlan::options(HS_DEVICE_CPU, -1, 2, 4, 2, 6);
  };
  o.num_rows = -1;
  refused({"num_rows", "-1"});
  o.num_cols = int64_t{1} << 31;
  refused({"num_cols", "2147483648"});
  o.num_rows = 1 << 16;
  o.num_cols = 1 << 16;
  refused({"num_rows x num_cols", "65536 x 65536"});
  o.block_size = 0;
  refused({"block_size", "got 0"});
  o.staging_block_capacity = -1;
  refused({"staging_block_capacity", "-1"});
  o.block_size = 64;
  o.staging_block_capacity = 1 << 25;  // (2^25 + 1) x 64 rows > 2^31 - 1
  refused({"staging_block_capacity", "int32 row ids", "(33554432 + 1) x 64"});
  o.device_type = 9;
  refused({"device_type", "9"});
  o.struct_size = 4;
  refused({"options", "struct_size"});
  expect_error(hs_staging_plan_create(nullptr, &plan), HS_ERROR_INVALID_ARGUMENT, {"options", "NULL"});
  expect_error(hs_staging_plan_create(&o, nullptr), HS_ERROR_INVALID_ARGUMENT, {"plan", "NULL"});
  EXPECT_EQ(hs_staging_plan_destroy(nullptr), HS_SUCCESS);
}

TEST(StagingPlan, BorrowsCallerStorage) {
  hs_staging_plan_options_t o = hs::StagingPlan::options(HS_DEVICE_CPU, -1, 2, 4, 2, 6);
  const uint64_t bytes = hs::StagingPlan::storage_bytes(o);
  std::vector<uint64_t> memory(bytes / 8 + 2);
  uint8_t* base = reinterpret_cast<uint8_t*>(memory.data());
  hs::Tensor small(base, HS_DTYPE_UINT8, {static_cast<int64_t>(bytes) - 1});
  o.storage = small;
  hs_staging_plan_t handle = nullptr;
  expect_error(hs_staging_plan_create(&o, &handle), HS_ERROR_INVALID_ARGUMENT,
               {"storage", "at least", std::to_string(bytes).c_str()});
  hs::Tensor misaligned(base + 4, HS_DTYPE_UINT8, {static_cast<int64_t>(bytes)});
  o.storage = misaligned;
  expect_error(hs_staging_plan_create(&o, &handle), HS_ERROR_INVALID_ARGUMENT, {"storage", "aligned"});
  hs::Tensor words(base, HS_DTYPE_INT32, {static_cast<int64_t>(bytes / 4)});
  o.storage = words;
  expect_error(hs_staging_plan_create(&o, &handle), HS_ERROR_INVALID_DTYPE, {"storage", "uint8"});
  hs::Tensor exact(base, HS_DTYPE_UINT8, {static_cast<int64_t>(bytes)});
  o.storage = exact;
  hs::StagingPlan plan(o);
  EXPECT_EQ(plan.info().owns_storage, 0);
  EXPECT_EQ(plan.info().storage_bytes, bytes);
  for (int which = 0; which < HS_STAGING_PLAN_NUM_TENSORS; ++which) {
    const hs_tensor_t t = plan.tensor(static_cast<hs_staging_plan_tensor_t>(which));
    const uint8_t* data = static_cast<const uint8_t*>(t.data);
    EXPECT_GE(data, base);
    EXPECT_LE(data + 4 * t.shape[0] * t.shape[1], base + bytes) << which;
  }
  HandBatch batch;
  plan.build(batch.table_t, batch.lens_t);
  EXPECT_EQ(plan_tensor(plan, HS_STAGING_PLAN_BLOCK_TABLE), (std::vector<int32_t>{2, 1, 0, 0, 1, 3, 0, 0}));
}

// A plan whose borrowed storage lies in a host pool is refused once the pool
// is retired or released, by every call that would touch the storage.
TEST(StagingPlan, RefusesStorageInAReleasedPool) {
  for (const bool release : {false, true}) {
    hs_staging_plan_options_t o = hs::StagingPlan::options(HS_DEVICE_CPU, -1, 2, 4, 2, 6);
    const uint64_t bytes = hs::StagingPlan::storage_bytes(o);
    const hs_host_pool_options_t po = unregistered_pool_options(bytes);
    hs_host_pool_t pool = nullptr;
    ASSERT_EQ(hs_host_pool_create(&po, &pool), HS_SUCCESS) << hs_last_error();
    void* data = nullptr;
    ASSERT_EQ(hs_host_pool_data(pool, &data), HS_SUCCESS);
    hs::Tensor storage(data, HS_DTYPE_UINT8, {static_cast<int64_t>(bytes)});
    o.storage = storage;
    hs::StagingPlan plan(o);
    HandBatch batch;
    plan.build(batch.table_t, batch.lens_t);
    ASSERT_EQ(release ? hs_host_pool_release(pool) : hs_host_pool_retire(pool), HS_SUCCESS);
    expect_error(hs_staging_plan_build(plan.get(), batch.table_t, batch.lens_t, nullptr), HS_ERROR_INVALID_STATE,
                 {"storage", "released"});
    std::vector<int32_t> resident = {0, 0, 0, 0}, states = {0, 0};
    hs::Tensor resident_t(resident.data(), HS_DTYPE_INT32, {2, 2}), states_t(states.data(), HS_DTYPE_INT32, {2});
    expect_error(hs_staging_plan_ensure_gpu_sources(plan.get(), resident_t, states_t, 2, nullptr),
                 HS_ERROR_INVALID_STATE, {"storage", "released"});
    std::vector<uint8_t> host(32 * 16), staged(7 * 2 * 16);
    hs::Tensor host_t(host.data(), HS_DTYPE_UINT8, {32, 16}), staged_t(staged.data(), HS_DTYPE_UINT8, {7, 2, 16});
    expect_error(hs_gather_prefill_cache(plan.get(), host_t, nullptr, staged_t, nullptr), HS_ERROR_INVALID_STATE,
                 {"storage", "released"});
    EXPECT_EQ(hs_host_pool_destroy(pool), HS_SUCCESS);
  }
}

TEST(StagingPlan, RejectedCallsLeaveThePlanAsItWas) {
  SourcesCase c;
  c.plan.ensure_gpu_sources(c.resident_t, c.states_t, 2);
  std::vector<std::vector<int32_t>> before;
  for (int which = 0; which < HS_STAGING_PLAN_NUM_TENSORS; ++which) {
    before.push_back(plan_tensor(c.plan, static_cast<hs_staging_plan_tensor_t>(which)));
  }
  const hs_staging_plan_info_t info = c.plan.info();
  hs_staging_plan_t p = c.plan.get();

  std::vector<float> floats(4);
  hs::Tensor float_table(floats.data(), HS_DTYPE_FLOAT32, {2, 2});
  expect_error(hs_staging_plan_build(p, float_table, c.lens_t, nullptr), HS_ERROR_INVALID_DTYPE,
               {"block_table", "int32 or int64", "float32"});
  hs::Tensor wide_table(c.table.data(), HS_DTYPE_INT32, {1, 4});
  expect_error(hs_staging_plan_build(p, wide_table, c.lens_t, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"block_table", "num_rows", "[1, 4]"});
  hs::Tensor short_lens(c.lens.data(), HS_DTYPE_INT32, {1});
  expect_error(hs_staging_plan_build(p, c.table_t, short_lens, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"seq_lens", "one length per block_table row", "[1]"});
  hs::Tensor lens_2d(c.lens.data(), HS_DTYPE_INT32, {2, 1});
  expect_error(hs_staging_plan_build(p, c.table_t, lens_2d, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"seq_lens", "1 dimension"});
  hs::Tensor cuda_lens(c.lens.data(), HS_DTYPE_INT32, {2}, HS_DEVICE_CUDA, 0);
  expect_error(hs_staging_plan_build(p, c.table_t, cuda_lens, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"seq_lens", "expected a tensor on cpu", "cuda:0"});
  hs::Tensor far_rows = hs::Tensor(c.table.data(), HS_DTYPE_INT32, {2, 2}).strides({int64_t{1} << 61, 1});
  expect_error(hs_staging_plan_build(p, far_rows, c.lens_t, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"block_table", "stride", "exceeds any memory extent"});
  hs::Tensor far_pages = hs::Tensor(c.resident.data(), HS_DTYPE_INT32, {3, 4}).strides({int64_t{1} << 60, 1});
  expect_error(hs_staging_plan_ensure_gpu_sources(p, far_pages, c.states_t, 2, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"resident_state_rows", "exceeds any memory extent"});
  hs::Tensor resident_1d(c.resident.data(), HS_DTYPE_INT32, {12});
  expect_error(hs_staging_plan_ensure_gpu_sources(p, resident_1d, c.states_t, 2, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"resident_state_rows", "2 dimensions"});
  hs::Tensor float_states(floats.data(), HS_DTYPE_FLOAT32, {2});
  expect_error(hs_staging_plan_ensure_gpu_sources(p, c.resident_t, float_states, 4, nullptr), HS_ERROR_INVALID_DTYPE,
               {"state_indices", "float32"});
  expect_error(hs_staging_plan_get_tensor(p, static_cast<hs_staging_plan_tensor_t>(5), nullptr),
               HS_ERROR_INVALID_ARGUMENT, {"out", "NULL"});
  hs_tensor_t out{};
  expect_error(hs_staging_plan_get_tensor(p, static_cast<hs_staging_plan_tensor_t>(5), &out), HS_ERROR_INVALID_ARGUMENT,
               {"which", "5"});

  for (int which = 0; which < HS_STAGING_PLAN_NUM_TENSORS; ++which) {
    EXPECT_EQ(plan_tensor(c.plan, static_cast<hs_staging_plan_tensor_t>(which)), before[which]) << which;
  }
  const hs_staging_plan_info_t after = c.plan.info();
  EXPECT_EQ(after.has_gpu_sources, info.has_gpu_sources);
  EXPECT_EQ(after.gpu_source_table, info.gpu_source_table);
  EXPECT_EQ(after.gpu_source_block_size, info.gpu_source_block_size);

  hs::StagingPlan unbuilt(HS_DEVICE_CPU, -1, 2, 2, 4, 4);
  expect_error(hs_staging_plan_ensure_gpu_sources(unbuilt.get(), c.resident_t, c.states_t, 2, nullptr),
               HS_ERROR_INVALID_STATE, {"plan", "hs_staging_plan_build"});
  try {
    unbuilt.ensure_gpu_sources(c.resident_t, c.states_t, 2);
    ADD_FAILURE() << "expected hs::Error";
  } catch (const hs::Error& error) {
    EXPECT_EQ(error.status(), HS_ERROR_INVALID_STATE);
  }
}

TEST(StagingPlan, EmptyShapesGiveOnlyTheNullBlock) {
  std::vector<int32_t> none;
  hs::Tensor table_t(none.data(), HS_DTYPE_INT32, {0, 4});
  hs::Tensor lens_t(none.data(), HS_DTYPE_INT32, {0});
  hs::StagingPlan plan(HS_DEVICE_CPU, -1, 0, 4, 4, 2);
  plan.build(table_t, lens_t);
  EXPECT_EQ(plan_tensor(plan, HS_STAGING_PLAN_ROW_IDS),
            (std::vector<int32_t>{0, 1, 2, 3, -1, -1, -1, -1, -1, -1, -1, -1}));
  std::vector<int32_t> resident = {1, 1, 1, 1};
  std::vector<int32_t> states = {0, 0};
  hs::Tensor resident_t(resident.data(), HS_DTYPE_INT32, {1, 4});
  hs::Tensor states_t(states.data(), HS_DTYPE_INT32, {2});
  plan.ensure_gpu_sources(resident_t, states_t, 2);
  EXPECT_EQ(plan.info().has_gpu_sources, 0);  // no batch rows: nothing to resolve
}

#ifdef HISPARSE_WITH_CUDA
// Device memory holding a copy of `bytes`, freed on scope exit.
std::shared_ptr<uint8_t> on_device(const void* bytes, size_t size) {
  void* data = nullptr;
  EXPECT_EQ(cudaMalloc(&data, size == 0 ? 16 : size), cudaSuccess);
  if (size > 0) EXPECT_EQ(cudaMemcpy(data, bytes, size, cudaMemcpyHostToDevice), cudaSuccess);
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(data), [](uint8_t* p) { cudaFree(p); });
}

std::vector<int32_t> download(const hs_tensor_t& t) {
  int64_t n = 1;
  for (int d = 0; d < t.ndim; ++d) n *= t.shape[d];
  std::vector<int32_t> out(static_cast<size_t>(n));
  EXPECT_EQ(cudaMemcpy(out.data(), t.data, out.size() * sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}
#endif

// On a CUDA device: plans (owned and borrowed storage), GPU sources, the
// prefill gather from a registered HostPool and a device resident cache,
// and the remap, all equal to the CPU backend's.
TEST(StagingCuda, MatchesTheCpuBackend) {
  int count = 0;
  ASSERT_EQ(hs_cuda_device_count(&count), HS_SUCCESS) << hs_last_error();
  if (count == 0) GTEST_SKIP() << "no CUDA device";
#ifndef HISPARSE_WITH_CUDA
  GTEST_SKIP() << "built without the CUDA backend";
#else
  const int64_t rows = 1100, cols = 12, block_size = 16, capacity = 9000, row_bytes = 64, host_blocks = 3000;
  std::mt19937 rng(7);
  std::vector<int64_t> table(static_cast<size_t>(rows * cols));
  for (auto& v : table) v = static_cast<int64_t>(rng() % (host_blocks + 20)) - 5;  // negatives and ids past the host
  std::vector<int32_t> lens(static_cast<size_t>(rows));
  for (auto& v : lens) v = static_cast<int32_t>(rng() % (cols * block_size + 40));
  std::vector<int32_t> pages(static_cast<size_t>((rows + 2) * 2 * cols));
  for (auto& v : pages) v = rng() % 3 == 0 ? static_cast<int32_t>(rng() % 500) : 0;
  std::vector<int32_t> states(static_cast<size_t>(rows));
  for (size_t b = 0; b < states.size(); ++b) states[b] = b % 9 == 0 ? -1 : static_cast<int32_t>(b + 1);

  hs::Tensor table_t(table.data(), HS_DTYPE_INT64, {rows, cols});
  hs::Tensor lens_t(lens.data(), HS_DTYPE_INT32, {rows});
  hs::Tensor pages_t(pages.data(), HS_DTYPE_INT32, {rows + 2, 2 * cols});
  hs::Tensor states_t(states.data(), HS_DTYPE_INT32, {rows});
  hs::StagingPlan cpu(HS_DEVICE_CPU, -1, rows, cols, block_size, capacity);
  cpu.build(table_t, lens_t);
  cpu.ensure_gpu_sources(pages_t, states_t, block_size / 2);

  auto table_d = on_device(table.data(), table.size() * 8);
  auto lens_d = on_device(lens.data(), lens.size() * 4);
  auto pages_d = on_device(pages.data(), pages.size() * 4);
  auto states_d = on_device(states.data(), states.size() * 4);
  hs::Tensor gtable(table_d.get(), HS_DTYPE_INT64, {rows, cols}, HS_DEVICE_CUDA, 0);
  hs::Tensor glens(lens_d.get(), HS_DTYPE_INT32, {rows}, HS_DEVICE_CUDA, 0);
  hs::Tensor gpages(pages_d.get(), HS_DTYPE_INT32, {rows + 2, 2 * cols}, HS_DEVICE_CUDA, 0);
  hs::Tensor gstates(states_d.get(), HS_DTYPE_INT32, {rows}, HS_DEVICE_CUDA, 0);

  hs_staging_plan_options_t o = hs::StagingPlan::options(HS_DEVICE_CUDA, 0, rows, cols, block_size, capacity);
  const uint64_t bytes = hs::StagingPlan::storage_bytes(o);
  std::vector<uint8_t> zeros(bytes, 0);
  auto storage = on_device(zeros.data(), bytes);
  hs::Tensor storage_t(storage.get(), HS_DTYPE_UINT8, {static_cast<int64_t>(bytes)}, HS_DEVICE_CUDA, 0);
  o.storage = storage_t;
  hs::StagingPlan borrowed(o);
  hs::StagingPlan owned(HS_DEVICE_CUDA, 0, rows, cols, block_size, capacity);
  for (hs::StagingPlan* gpu : {&borrowed, &owned}) {
    gpu->build(gtable, glens);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(download(gpu->tensor(HS_STAGING_PLAN_BLOCK_TABLE)), plan_tensor(cpu, HS_STAGING_PLAN_BLOCK_TABLE));
    EXPECT_EQ(download(gpu->tensor(HS_STAGING_PLAN_ROW_IDS)), plan_tensor(cpu, HS_STAGING_PLAN_ROW_IDS));
    EXPECT_EQ(download(gpu->tensor(HS_STAGING_PLAN_DST_ROWS)), plan_tensor(cpu, HS_STAGING_PLAN_DST_ROWS));
    gpu->ensure_gpu_sources(gpages, gstates, block_size / 2);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(download(gpu->tensor(HS_STAGING_PLAN_GPU_ROW_IDS)), plan_tensor(cpu, HS_STAGING_PLAN_GPU_ROW_IDS));
    EXPECT_EQ(download(gpu->tensor(HS_STAGING_PLAN_MISS_MASK)), plan_tensor(cpu, HS_STAGING_PLAN_MISS_MASK));
  }

  // One layer's gather: registered host rows, device resident rows.
  Bytes host(host_blocks * block_size, row_bytes, 3);
  Bytes resident(500 * block_size / 2, row_bytes, 90);
  const int64_t staged_rows = (capacity + 1) * block_size;
  Bytes staged(staged_rows, row_bytes, 0);
  hs::Tensor host_t(host.base, HS_DTYPE_UINT8, {host.rows, row_bytes});
  hs::Tensor resident_t(resident.base, HS_DTYPE_UINT8, {500, block_size / 2, row_bytes});
  hs::Tensor staged_t(staged.base, HS_DTYPE_UINT8, {staged_rows, row_bytes});
  cpu.gather_prefill_cache(host_t, resident_t, staged_t);

  hs_host_pool_options_t pool_options;
  hs_host_pool_options_init(&pool_options);
  pool_options.size_bytes = static_cast<uint64_t>(host.rows * row_bytes);
  pool_options.registration = HS_REGISTER_ALWAYS;
  pool_options.device_index = 0;
  pool_options.populate_threads = 1;
  pool_options.check_memory = 0;
  hs::HostPool pool(pool_options);
  std::memcpy(pool.data(), host.base, host.rows * row_bytes);
  hs::Tensor pinned_t(pool.data(), HS_DTYPE_UINT8, {host.rows, row_bytes});
  auto resident_d = on_device(resident.base, resident.rows * row_bytes);
  hs::Tensor gresident(resident_d.get(), HS_DTYPE_UINT8, {500, block_size / 2, row_bytes}, HS_DEVICE_CUDA, 0);
  void* staged_raw = nullptr;
  ASSERT_EQ(cudaMalloc(&staged_raw, staged_rows * row_bytes), cudaSuccess);
  std::shared_ptr<void> staged_owner(staged_raw, [](void* p) { cudaFree(p); });
  hs::Tensor gstaged(staged_raw, HS_DTYPE_UINT8, {staged_rows, row_bytes}, HS_DEVICE_CUDA, 0);
  owned.gather_prefill_cache(pinned_t, gresident, gstaged);
  std::vector<uint8_t> got(static_cast<size_t>(staged_rows * row_bytes));
  ASSERT_EQ(cudaMemcpy(got.data(), staged_raw, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  const std::vector<int32_t> row_ids = plan_tensor(cpu, HS_STAGING_PLAN_ROW_IDS);
  const std::vector<int32_t> gpu_rows = plan_tensor(cpu, HS_STAGING_PLAN_GPU_ROW_IDS);
  int64_t compared = 0;
  for (int64_t j = 0; j < staged_rows; ++j) {
    if (gpu_rows[j] < 0 && (row_ids[j] < 0 || row_ids[j] >= host.rows)) continue;  // unspecified rows
    ++compared;
    ASSERT_EQ(std::memcmp(got.data() + j * row_bytes, staged.base + j * row_bytes, row_bytes), 0) << "row " << j;
  }
  EXPECT_GT(compared, 1000);
  // Plain (unregistered) host memory cannot be read by the kernel.
  expect_error(hs_gather_prefill_cache(owned.get(), host_t, gresident, gstaged, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"host_cache"});
#endif
}

}  // namespace
