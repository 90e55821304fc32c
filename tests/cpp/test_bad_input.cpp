// The C ABI against bad input: NULL, destroyed and made-up handles, NULL and
// garbage structs (struct_size, struct_version), tensor descriptors no real
// tensor has (extents past 64 bits, addresses that wrap), strides and sizes
// that overflow, aliased outputs, raw addresses the CPU copy cannot touch,
// and released host pools; the same for the KV cache, its kernels (write,
// read, residency update), the runtime's write, host registration and the
// resolver's workspace. Every refusal is a status with a message naming the
// argument, and a valid call right after it gives the right answer.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "expect_status.hpp"
#include "hisparse/hisparse.h"
#include "hisparse/hisparse.hpp"
#include "unregistered_pool.hpp"

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// 16-byte aligned host rows of 32 bytes, row r filled with r + 1.
struct Rows {
  explicit Rows(int64_t rows) : rows(rows) {
    storage.resize(static_cast<size_t>(rows * 32 + 16));
    base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(storage.data()) + 15) / 16 * 16);
    for (int64_t r = 0; r < rows; ++r) std::memset(base + r * 32, static_cast<int>(r + 1), 32);
  }
  hs::Tensor tensor() const { return hs::Tensor(base, HS_DTYPE_UINT8, {rows, 32}); }
  int64_t rows;
  std::vector<uint8_t> storage;
  uint8_t* base = nullptr;
};

// One valid gather: host rows 1 and 2 into hot rows 0 and 5 of a [2, 4, 32] cache.
struct Gather {
  Rows host{8};
  Rows hot{8};
  std::vector<int32_t> swap_host{1, 2};
  std::vector<int32_t> swap_device{0, 5};
  std::vector<int32_t> counts{2};
  hs::Tensor host_t = host.tensor();
  hs::Tensor hot_t = hs::Tensor(hot.base, HS_DTYPE_UINT8, {2, 4, 32});
  hs::Tensor sh = hs::Tensor(swap_host.data(), HS_DTYPE_INT32, {1, 2});
  hs::Tensor sd = hs::Tensor(swap_device.data(), HS_DTYPE_INT32, {1, 2});
  hs::Tensor sc = hs::Tensor(counts.data(), HS_DTYPE_INT32, {1});
  hs_gather_compact_args_t args = make();

  hs_gather_compact_args_t make() {
    hs_gather_compact_args_t a;
    hs_gather_compact_args_init(&a);
    a.host_cache = host_t;
    a.hot_cache = hot_t;
    a.swap_host_rows = sh;
    a.swap_device_rows = sd;
    a.swap_counts = sc;
    a.hot_block_size = 4;
    return a;
  }
  // A valid call gives the right bytes.
  void expect_works() {
    std::memset(hot.base, 0, 8 * 32);
    hs_gather_compact_args_t a = make();
    ASSERT_EQ(hs_gather_compact(&a, nullptr), HS_SUCCESS) << hs_last_error();
    EXPECT_EQ(hot.base[0], 2);
    EXPECT_EQ(hot.base[5 * 32], 3);
    EXPECT_EQ(hot.base[1 * 32], 0);
  }
};

TEST(BadInputHandles, NullHandlesAreNamed) {
  hs_index_group_info_t group_info{};
  group_info.struct_size = sizeof(group_info);
  expect_error(hs_index_group_get_info(nullptr, &group_info), HS_ERROR_INVALID_ARGUMENT, {"group", "NULL"});
  expect_error(hs_index_group_reset(nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT, {"group"});
  expect_error(hs_runtime_begin_forward(nullptr), HS_ERROR_INVALID_ARGUMENT, {"runtime"});
  expect_error(hs_runtime_unbind(nullptr), HS_ERROR_INVALID_ARGUMENT, {"runtime"});
  void* data = nullptr;
  expect_error(hs_host_pool_data(nullptr, &data), HS_ERROR_INVALID_ARGUMENT, {"pool"});
  expect_error(hs_host_pool_retire(nullptr), HS_ERROR_INVALID_ARGUMENT, {"pool"});
  expect_error(hs_staging_plan_build(nullptr, nullptr, nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT, {"plan"});
  expect_error(hs_ipc_event_record(nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT, {"event"});
  expect_error(hs_slot_invalidator_run(nullptr, nullptr, 0, nullptr, nullptr, nullptr, nullptr),
               HS_ERROR_INVALID_ARGUMENT, {"invalidator"});
  // Destroying NULL is a no-op, as free(NULL) is.
  EXPECT_EQ(hs_runtime_destroy(nullptr), HS_SUCCESS);
  EXPECT_EQ(hs_index_group_destroy(nullptr), HS_SUCCESS);
  EXPECT_EQ(hs_host_pool_destroy(nullptr), HS_SUCCESS);
  EXPECT_EQ(hs_staging_plan_destroy(nullptr), HS_SUCCESS);
  EXPECT_EQ(hs_ipc_event_destroy(nullptr), HS_SUCCESS);
  EXPECT_EQ(hs_slot_invalidator_destroy(nullptr), HS_SUCCESS);
}

TEST(BadInputHandles, MadeUpDestroyedAndMismatchedHandlesAreNeverFollowed) {
  // Addresses that hold no handle: a stack object, an unmapped page, one
  // byte past a live handle, and a handle of another kind.
  int32_t on_the_stack[16] = {};
  const uintptr_t unmapped = 0x1000;
  hs_index_group_options_t o;
  hs_index_group_options_init(&o);
  o.device_type = HS_DEVICE_CPU;
  o.max_num_reqs = 2;
  o.device_buffer_size = 8;
  o.top_k = 4;
  hs_index_group_t group = nullptr;
  ASSERT_EQ(hs_index_group_create(&o, &group), HS_SUCCESS) << hs_last_error();
  for (void* made_up : {static_cast<void*>(on_the_stack), reinterpret_cast<void*>(unmapped),
                        static_cast<void*>(reinterpret_cast<char*>(group) + 1)}) {
    expect_error(hs_index_group_reset(static_cast<hs_index_group_t>(made_up), nullptr), HS_ERROR_INVALID_ARGUMENT,
                 {"group", "not a live hs_index_group_t"});
    expect_error(hs_runtime_begin_forward(static_cast<hs_runtime_t>(made_up)), HS_ERROR_INVALID_ARGUMENT,
                 {"runtime", "not a live hs_runtime_t"});
    expect_error(hs_host_pool_retire(static_cast<hs_host_pool_t>(made_up)), HS_ERROR_INVALID_ARGUMENT,
                 {"pool", "not a live hs_host_pool_t"});
    expect_error(hs_index_group_destroy(static_cast<hs_index_group_t>(made_up)), HS_ERROR_INVALID_ARGUMENT,
                 {"group", "not a live"});
  }
  expect_error(hs_runtime_begin_forward(reinterpret_cast<hs_runtime_t>(group)), HS_ERROR_INVALID_ARGUMENT,
               {"runtime", "not a live hs_runtime_t"});
  // The group still works, and after destroy its handle is refused.
  ASSERT_EQ(hs_index_group_reset(group, nullptr), HS_SUCCESS) << hs_last_error();
  ASSERT_EQ(hs_index_group_destroy(group), HS_SUCCESS);
  expect_error(hs_index_group_reset(group, nullptr), HS_ERROR_INVALID_ARGUMENT, {"group", "not a live"});
  expect_error(hs_index_group_destroy(group), HS_ERROR_INVALID_ARGUMENT, {"group", "not a live"});
}

TEST(BadInputHandles, ARuntimesIndexGroupIsNotDestroyedOnItsOwn) {
  hs_config_t config;
  hs_config_init(&config);
  config.top_k = 4;
  config.device_buffer_size = 8;
  config.row_bytes = 32;
  hs_runtime_options_t o;
  hs_runtime_options_init(&o);
  o.config = &config;
  o.max_num_reqs = 2;
  hs_runtime_t runtime = nullptr;
  ASSERT_EQ(hs_runtime_create(&o, &runtime), HS_SUCCESS) << hs_last_error();
  hs_index_group_t group = nullptr;
  ASSERT_EQ(hs_runtime_get_index_group(runtime, &group), HS_SUCCESS);
  expect_error(hs_index_group_destroy(group), HS_ERROR_INVALID_ARGUMENT, {"group", "lives with its runtimes"});
  EXPECT_EQ(hs_index_group_reset(group, nullptr), HS_SUCCESS) << hs_last_error();
  ASSERT_EQ(hs_runtime_destroy(runtime), HS_SUCCESS);
  expect_error(hs_index_group_reset(group, nullptr), HS_ERROR_INVALID_ARGUMENT, {"group", "not a live"});
}

TEST(BadInputStructs, NullSmallAndUnknownVersionsAreNamed) {
  Gather g;
  expect_error(hs_gather_compact(nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT, {"args", "NULL"});
  hs_gather_compact_args_t small = g.args;
  small.struct_size = 8;
  expect_error(hs_gather_compact(&small, nullptr), HS_ERROR_INVALID_ARGUMENT, {"args", "struct_size 8"});
  for (uint32_t version : {0u, 2u, 0xFFFFFFFFu}) {
    hs_gather_compact_args_t future = g.args;
    future.struct_version = version;
    expect_error(hs_gather_compact(&future, nullptr), HS_ERROR_INVALID_ARGUMENT, {"args", "struct_version"});
  }
  hs_host_pool_options_t pool_options;
  hs_host_pool_options_init(&pool_options);
  pool_options.struct_size = 0;
  hs_host_pool_t pool = nullptr;
  expect_error(hs_host_pool_create(&pool_options, &pool), HS_ERROR_INVALID_ARGUMENT, {"options", "struct_size"});
  EXPECT_EQ(pool, nullptr);
  hs_build_info_t info{};  // output struct without struct_size
  expect_error(hs_get_build_info(&info), HS_ERROR_INVALID_ARGUMENT, {"info", "struct_size"});
  g.expect_works();
}

TEST(BadInputTensors, DescriptorsNoTensorHasAreRefusedBeforeAnyAccess) {
  Gather g;
  int64_t shape[3] = {2, 4, 32};
  int64_t huge_strides[3] = {int64_t{1} << 61, 32, 1};
  int64_t negative_shape[3] = {2, -4, 32};
  struct Bad {
    hs_tensor_t tensor;
    hs_status_t status;
    std::vector<const char*> fragments;
  };
  constexpr hs_status_t kArg = HS_ERROR_INVALID_ARGUMENT;
  const std::vector<Bad> bad = {
      {{g.hot.base, HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, -1, shape, nullptr}, kArg, {"hot_cache", "dimensions"}},
      {{g.hot.base, HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 9, shape, nullptr}, kArg, {"hot_cache", "dimensions"}},
      {{g.hot.base, HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 3, nullptr, nullptr}, kArg, {"hot_cache", "shape is NULL"}},
      {{g.hot.base, HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 3, negative_shape, nullptr},
       kArg,
       {"hot_cache", "negative size"}},
      {{g.hot.base, static_cast<hs_dtype_t>(77), HS_DEVICE_CPU, 0, 3, shape, nullptr},
       HS_ERROR_INVALID_DTYPE,
       {"hot_cache", "dtype code 77"}},
      {{g.hot.base, HS_DTYPE_UINT8, static_cast<hs_device_type_t>(9), 0, 3, shape, nullptr},
       kArg,
       {"hot_cache", "device type 9"}},
      {{nullptr, HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 3, shape, nullptr}, kArg, {"hot_cache", "NULL"}},
      {{g.hot.base, HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 3, shape, huge_strides}, kArg, {"hot_cache", "memory extent"}},
      {{reinterpret_cast<void*>(UINTPTR_MAX - 64), HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 3, shape, nullptr},
       kArg,
       {"hot_cache", "address space"}},
  };
  for (const Bad& b : bad) {
    hs_gather_compact_args_t a = g.make();
    a.hot_cache = &b.tensor;
    expect_error(hs_gather_compact(&a, nullptr), b.status, b.fragments);
  }
  // An element count past 64 bits.
  int64_t giant[2] = {int64_t{1} << 40, int64_t{1} << 40};
  hs_tensor_t too_many{g.host.base, HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 2, giant, nullptr};
  hs_gather_compact_args_t a = g.make();
  a.host_cache = &too_many;
  expect_error(hs_gather_compact(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"host_cache", "more than any memory"});
  g.expect_works();
}

TEST(BadInputSizes, HotStridesThatCannotAddressInt32RowsAreRefused) {
  Gather g;
  const hs::Tensor flat_hot(g.hot.base, HS_DTYPE_UINT8, {8, 32});
  for (int64_t stride :
       {int64_t{-1}, int64_t{2}, kInt32Max + 1, int64_t{1} << 62, (int64_t{1} << 62) + (int64_t{1} << 40),
        std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()}) {
    hs_gather_compact_args_t a = g.make();
    a.hot_cache = flat_hot;
    a.hot_block_stride = stride;
    expect_error(hs_gather_compact(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"hot_block_stride"});
  }
  for (int64_t size : {int64_t{0}, int64_t{-4}, kInt32Max + 1, std::numeric_limits<int64_t>::max()}) {
    hs_gather_compact_args_t a = g.make();
    a.hot_block_size = size;
    expect_error(hs_gather_compact(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"hot_block_size"});
  }
  // The largest stride is fine: rows past the cache are skipped, the rest land.
  std::vector<int32_t> far = {2, 3};
  std::vector<int32_t> far_rows = {static_cast<int32_t>(kInt32Max), 1};
  hs::Tensor sh(far.data(), HS_DTYPE_INT32, {1, 2});
  hs::Tensor sd(far_rows.data(), HS_DTYPE_INT32, {1, 2});
  hs_gather_compact_args_t a = g.make();
  a.hot_cache = flat_hot;
  a.swap_host_rows = sh;
  a.swap_device_rows = sd;
  a.hot_block_stride = kInt32Max;
  std::memset(g.hot.base, 0, 8 * 32);
  ASSERT_EQ(hs_gather_compact(&a, nullptr), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(g.hot.base[1 * 32], 4);  // host row 3 into hot row 1 (block 0)
  for (int64_t byte = 0; byte < 8 * 32; ++byte) {
    if (byte / 32 != 1) EXPECT_EQ(g.hot.base[byte], 0) << byte;
  }
  g.expect_works();
}

TEST(BadInputAliasing, OutputsOverInputsAreRefusedNamingBoth) {
  Gather g;
  // The hot cache over the swap list it reads.
  hs_gather_compact_args_t a = g.make();
  hs::Tensor over(reinterpret_cast<int32_t*>(g.hot.base), HS_DTYPE_INT32, {1, 2});
  a.swap_host_rows = over;
  expect_error(hs_gather_compact(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"hot_cache", "swap_host_rows"});
  // Copies over their own source.
  std::vector<uint8_t> bytes(64);
  hs::Tensor first(bytes.data(), HS_DTYPE_UINT8, {48});
  hs::Tensor second(bytes.data() + 16, HS_DTYPE_UINT8, {48});
  expect_error(hs_copy_bytes(first, second, nullptr), HS_ERROR_INVALID_ARGUMENT, {"dst", "src"});
  // The same table twice.
  std::vector<int32_t> table(16, 3), state{0}, req{0}, written{3};
  hs::Tensor table_t(table.data(), HS_DTYPE_INT32, {2, 8});
  hs::Tensor state_t(state.data(), HS_DTYPE_INT32, {1}), req_t(req.data(), HS_DTYPE_INT32, {1});
  hs::Tensor written_t(written.data(), HS_DTYPE_INT32, {1});
  const hs_tensor_t* twice[2] = {table_t, table_t};
  hs_invalidate_written_slots_args_t inv;
  hs_invalidate_written_slots_args_init(&inv);
  inv.tables = twice;
  inv.num_tables = 2;
  inv.request_state_indices = state_t;
  inv.req_id_per_token = req_t;
  inv.written_slots = written_t;
  expect_error(hs_invalidate_written_slots(&inv, nullptr), HS_ERROR_INVALID_ARGUMENT, {"tables[", "both"});
  inv.num_tables = 1;
  ASSERT_EQ(hs_invalidate_written_slots(&inv, nullptr), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(table[0], -1);
  EXPECT_EQ(table[8], 3);  // another state row
  g.expect_works();
}

TEST(BadInputAddresses, TheCpuCopyRefusesRangesItCannotTouch) {
  std::vector<uint8_t> source(64, 7), target(64, 0);
  const long page = sysconf(_SC_PAGESIZE);
  void* guard = mmap(nullptr, static_cast<size_t>(page), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(guard, MAP_FAILED);
  void* read_only = mmap(nullptr, static_cast<size_t>(page), PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(read_only, MAP_FAILED);
  auto address = [](const void* p) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p)); };
  struct Case {
    int64_t src, dst, size;
    std::vector<const char*> fragments;
  };
  const std::vector<Case> cases = {
      {0x1000, address(target.data()), 16, {"src", "entry 0", "not host memory"}},
      {address(source.data()), address(guard), 16, {"dst", "entry 0", "not host memory"}},
      {address(guard), address(target.data()), 16, {"src", "not host memory"}},
      {address(source.data()), address(read_only), 16, {"dst", "writable"}},
      {address(source.data()), address(source.data()) + 8, 16, {"overlaps"}},
      {address(source.data()), std::numeric_limits<int64_t>::max() - 4, 16, {"dst", "not host memory"}},
      {address(source.data()),
       address(target.data()),
       std::numeric_limits<int64_t>::max(),
       {"sizes", "entry 0", "past the end of a process's address space"}},
  };
  for (const Case& c : cases) {
    int64_t src[1] = {c.src}, dst[1] = {c.dst}, sizes[1] = {c.size};
    hs::Tensor s(src, HS_DTYPE_INT64, {1}), d(dst, HS_DTYPE_INT64, {1}), n(sizes, HS_DTYPE_INT64, {1});
    expect_error(hs_swap_blocks_batch(s, d, n, nullptr), HS_ERROR_INVALID_ARGUMENT, c.fragments);
  }
  // Two copies into overlapping destinations, and a copy over the address arrays.
  int64_t src[2] = {address(source.data()), address(source.data() + 32)};
  int64_t dst[2] = {address(target.data()), address(target.data() + 8)};
  int64_t sizes[2] = {16, 16};
  hs::Tensor s(src, HS_DTYPE_INT64, {2}), d(dst, HS_DTYPE_INT64, {2}), n(sizes, HS_DTYPE_INT64, {2});
  expect_error(hs_swap_blocks_batch(s, d, n, nullptr), HS_ERROR_INVALID_ARGUMENT, {"dst entry 1", "overlaps"});
  dst[1] = address(sizes);
  expect_error(hs_swap_blocks_batch(s, d, n, nullptr), HS_ERROR_INVALID_ARGUMENT, {"address arrays"});
  // Valid afterwards.
  dst[1] = address(target.data() + 32);
  ASSERT_EQ(hs_swap_blocks_batch(s, d, n, nullptr), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(target[0], 7);
  EXPECT_EQ(target[40], 7);
  EXPECT_EQ(target[20], 0);
  munmap(guard, static_cast<size_t>(page));
  munmap(read_only, static_cast<size_t>(page));
}

TEST(BadInputFlags, PoolAndSwapInFlagsAreZeroOrOne) {
  hs_host_pool_options_t po = unregistered_pool_options(1 << 16);
  hs_host_pool_t pool = nullptr;
  po.huge_pages = 7;
  expect_error(hs_host_pool_create(&po, &pool), HS_ERROR_INVALID_ARGUMENT, {"huge_pages", "expected 0 or 1", "got 7"});
  po.huge_pages = 1;
  po.check_memory = -1;
  expect_error(hs_host_pool_create(&po, &pool), HS_ERROR_INVALID_ARGUMENT, {"check_memory", "got -1"});
  po.check_memory = 1;
  po.device_index = -5;
  expect_error(hs_host_pool_create(&po, &pool), HS_ERROR_INVALID_ARGUMENT, {"device_index", "got -5"});
  EXPECT_EQ(pool, nullptr);
}

TEST(BadInputLifetime, ReleasedPoolsAreRefusedWhereverTheirMemoryGoes) {
  const hs_host_pool_options_t po = unregistered_pool_options(1 << 16);
  hs_host_pool_t pool = nullptr;
  ASSERT_EQ(hs_host_pool_create(&po, &pool), HS_SUCCESS) << hs_last_error();
  void* data = nullptr;
  ASSERT_EQ(hs_host_pool_data(pool, &data), HS_SUCCESS);
  auto* rows = static_cast<uint8_t*>(data);
  for (int r = 0; r < 64; ++r) std::memset(rows + r * 32, r + 1, 32);

  // A runtime bound in the pool.
  hs_config_t config;
  hs_config_init(&config);
  config.top_k = 4;
  config.device_buffer_size = 8;
  config.row_bytes = 32;
  config.block_size = 4;
  config.hot_block_size = 4;
  hs_runtime_options_t ro;
  hs_runtime_options_init(&ro);
  ro.config = &config;
  ro.max_num_reqs = 1;
  hs::Runtime runtime(ro);
  hs::Tensor host(rows, HS_DTYPE_UINT8, {64, 32});
  runtime.bind_source_cache(host);
  std::vector<uint8_t> slab(3 * 4 * 32);
  std::vector<int32_t> table{1, 2};
  hs::Tensor slab_t(slab.data(), HS_DTYPE_UINT8, {static_cast<int64_t>(slab.size())});
  hs::Tensor table_t(table.data(), HS_DTYPE_INT32, {1, 2});
  runtime.bind_hot_cache(slab_t, 0, 4 * 32, 3, 4, table_t);
  std::vector<int32_t> topk{1, 2, 3, 4}, req{0}, states{0};
  hs::Tensor topk_t(topk.data(), HS_DTYPE_INT32, {1, 4}), req_t(req.data(), HS_DTYPE_INT32, {1});
  hs::Tensor states_t(states.data(), HS_DTYPE_INT32, {1});
  hs_runtime_swap_in_args_t a;
  hs_runtime_swap_in_args_init(&a);
  a.topk_indices = topk_t;
  a.req_id_per_token = req_t;
  a.request_state_indices = states_t;
  runtime.begin_forward();
  runtime.swap_in(a);

  // Retired: mapped, but refused everywhere.
  ASSERT_EQ(hs_host_pool_retire(pool), HS_SUCCESS);
  EXPECT_EQ(rows[5 * 32], 6);
  expect_error(hs_host_pool_data(pool, &data), HS_ERROR_INVALID_STATE, {"released"});
  hs_runtime_t r = runtime.get();
  ASSERT_EQ(hs_runtime_begin_forward(r), HS_SUCCESS);
  expect_error(hs_runtime_swap_in(r, &a, nullptr, nullptr), HS_ERROR_INVALID_STATE, {"host_cache", "released"});
  Gather g;
  hs_gather_compact_args_t ga = g.make();
  ga.host_cache = host;
  expect_error(hs_gather_compact(&ga, nullptr), HS_ERROR_INVALID_STATE, {"host_cache", "released"});
  std::vector<uint8_t> out(32);
  hs::Tensor out_t(out.data(), HS_DTYPE_UINT8, {32});
  hs::Tensor inside(rows, HS_DTYPE_UINT8, {32});
  expect_error(hs_copy_bytes(out_t, inside, nullptr), HS_ERROR_INVALID_STATE, {"src", "released"});

  // Released (unmapped): the runtime still refuses instead of reading it.
  ASSERT_EQ(hs_host_pool_release(pool), HS_SUCCESS);
  expect_error(hs_runtime_swap_in(r, &a, nullptr, nullptr), HS_ERROR_INVALID_STATE, {"host_cache", "released"});
  ASSERT_EQ(hs_host_pool_destroy(pool), HS_SUCCESS);

  // Rebound to live memory, it runs again.
  Rows fresh(64);
  runtime.bind_source_cache(fresh.tensor());
  ASSERT_EQ(hs_runtime_begin_forward(r), HS_SUCCESS);
  ASSERT_EQ(hs_runtime_swap_in(r, &a, nullptr, nullptr), HS_SUCCESS) << hs_last_error();
  g.expect_works();

  // Flags of a swap-in are 0 or 1, block sizes 0 or positive.
  ASSERT_EQ(hs_runtime_begin_forward(r), HS_SUCCESS);
  a.ignore_topk_ready = 7;
  expect_error(hs_runtime_swap_in(r, &a, nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"ignore_topk_ready", "expected 0 or 1", "got 7"});
  a.ignore_topk_ready = 0;
  a.resident_block_size = -1;
  expect_error(hs_runtime_swap_in(r, &a, nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"resident_block_size", "got -1"});
}

TEST(BadInputState, UnsortedSlotListsInvalidateTheSameSlots) {
  hs_index_group_options_t o;
  hs_index_group_options_init(&o);
  o.device_type = HS_DEVICE_CPU;
  o.max_num_reqs = 1;
  o.device_buffer_size = 8;
  o.top_k = 4;
  hs::IndexGroup group(o);
  hs_tensor_t dgi{};
  ASSERT_EQ(hs_index_group_get_tensor(group.get(), HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES, &dgi), HS_SUCCESS);
  auto* held = static_cast<int32_t*>(dgi.data);
  const std::vector<int32_t> before = {4, 9, -1, 2, 7, 11, 3, 9};
  std::vector<int32_t> states{0};
  hs::Tensor states_t(states.data(), HS_DTYPE_INT32, {1});
  for (const std::vector<int32_t>& listed : std::vector<std::vector<int32_t>>{{9, 2, 11}, {11, 9, 2}, {2, 9, 11}}) {
    std::copy(before.begin(), before.end(), held);
    std::vector<int32_t> slots = listed;
    hs::Tensor slots_t(slots.data(), HS_DTYPE_INT32, {static_cast<int64_t>(slots.size())});
    ASSERT_EQ(hs_index_group_invalidate_sorted_slots(group.get(), slots_t, states_t, nullptr), HS_SUCCESS);
    const std::vector<int32_t> expected = {4, -1, -1, -1, 7, -1, 3, -1};
    EXPECT_EQ(std::vector<int32_t>(held, held + 8), expected) << listed[0] << listed[1] << listed[2];
  }
}

// ------------------------------------------------------------------ the KV cache

hs::Tensor i32(std::vector<int32_t>& values, std::initializer_list<int64_t> shape) {
  return hs::Tensor(values.data(), HS_DTYPE_INT32, shape);
}

// A KV cache of two layers in one group (layer 0 leads, layer 1 follows), two
// request rows of 16 positions, one resident page each, rows of 32 bytes;
// request row 0 admitted with positions 0 .. 5 written (position p of layer l
// holds 1 + 16 l + p in every byte).
struct Kv {
  hs_config_t config = make_config();
  std::vector<int32_t> groups{0, 0};
  hs_kv_cache_options_t options = make_options();
  hs::KvCache cache{options};

  static hs_config_t make_config() {
    hs_config_t c;
    hs_config_init(&c);
    c.top_k = 4;
    c.device_buffer_size = 8;
    c.max_union_rows = 4;
    c.row_bytes = 32;
    c.block_size = 4;
    c.hot_block_size = 4;
    return c;
  }
  hs_kv_cache_options_t make_options() {
    hs_kv_cache_options_t o;
    hs_kv_cache_options_init(&o);
    o.config = &config;
    o.num_layers = 2;
    o.layer_groups = groups.data();
    o.max_requests = 2;
    o.max_seq_len = 16;
    o.resident_pages = 1;
    return o;
  }
  static uint8_t value(int layer, int position) { return static_cast<uint8_t>(1 + 16 * layer + position); }

  Kv() {
    cache.admit(0);
    begin(6);
    for (int layer = 0; layer < 2; ++layer) write(layer, {0, 1, 2, 3, 4, 5});
  }
  void begin(int32_t length) {
    std::vector<int32_t> lengths{length, 0};
    cache.begin_forward(i32(lengths, {2}));
  }
  void write(int layer, std::vector<int32_t> positions) {
    const auto n = static_cast<int64_t>(positions.size());
    std::vector<uint8_t> rows(static_cast<size_t>(n) * 32);
    for (int64_t t = 0; t < n; ++t) std::memset(rows.data() + t * 32, value(layer, positions[t]), 32);
    std::vector<int32_t> req(positions.size(), 0);
    cache.write(layer, hs::Tensor(rows.data(), HS_DTYPE_UINT8, {n, 32}), i32(req, {n}), i32(positions, {n}));
  }
  // Both layers resolve positions 1, 3 and 5 of request 0 and read back the
  // rows written there.
  void expect_works() {
    begin(6);
    std::vector<int32_t> topk{1, 3, 5, -1}, req{0};
    hs::Tensor topk_t = i32(topk, {1, 4}), req_t = i32(req, {1});
    hs_kv_cache_swap_in_args_t a;
    hs_kv_cache_swap_in_args_init(&a);
    a.topk_indices = topk_t;
    a.req_id_per_token = req_t;
    const hs_runtime_swap_in_result_t r = cache.swap_in(0, a);
    hs_kv_cache_swap_in_args_t follower;
    hs_kv_cache_swap_in_args_init(&follower);
    follower.num_tokens = 1;
    cache.swap_in(1, follower);
    hs_index_group_t group = nullptr;
    ASSERT_EQ(hs_runtime_get_index_group(cache.runtime(0), &group), HS_SUCCESS);
    hs_tensor_t attention{};
    ASSERT_EQ(hs_index_group_get_tensor(group, HS_INDEX_GROUP_ATTENTION_INDICES, &attention), HS_SUCCESS);
    std::vector<int32_t> indices(static_cast<const int32_t*>(attention.data) + r.first_row * 4,
                                 static_cast<const int32_t*>(attention.data) + r.first_row * 4 + 4);
    for (int layer = 0; layer < 2; ++layer) {
      std::vector<uint8_t> out(4 * 32, 0xFF);
      cache.read(layer, i32(indices, {1, 4}), hs::Tensor(out.data(), HS_DTYPE_UINT8, {1, 4, 32}));
      for (int k = 0; k < 4; ++k) EXPECT_EQ(out[k * 32], k < 3 ? value(layer, topk[k]) : 0) << layer << " " << k;
    }
  }
};

TEST(BadInputKvCache, NullMadeUpAndDestroyedCachesAreNamed) {
  Kv kv;
  int32_t on_the_stack[16] = {};
  std::vector<int32_t> lengths{1, 0};
  hs::Tensor lengths_t = i32(lengths, {2});
  hs_kv_cache_swap_in_args_t a;
  hs_kv_cache_swap_in_args_init(&a);
  hs_kv_cache_info_t info{};
  info.struct_size = sizeof(info);
  hs_runtime_stats_t stats{};
  stats.struct_size = sizeof(stats);
  hs_runtime_t runtime = nullptr;
  hs_tensor_t tensor{};
  for (hs_kv_cache_t bad :
       {static_cast<hs_kv_cache_t>(nullptr), reinterpret_cast<hs_kv_cache_t>(on_the_stack),
        reinterpret_cast<hs_kv_cache_t>(0x1000), reinterpret_cast<hs_kv_cache_t>(kv.cache.runtime(0))}) {
    const char* what = bad == nullptr ? "NULL" : "not a live hs_kv_cache_t";
    constexpr hs_status_t kArg = HS_ERROR_INVALID_ARGUMENT;
    expect_error(hs_kv_cache_admit(bad, -1, nullptr, nullptr), kArg, {"cache", what});
    expect_error(hs_kv_cache_release(bad, 0, nullptr), kArg, {"cache", what});
    expect_error(hs_kv_cache_begin_forward(bad, lengths_t, nullptr), kArg, {"cache", what});
    expect_error(hs_kv_cache_write(bad, 0, nullptr, nullptr, nullptr, nullptr), kArg, {"cache", what});
    expect_error(hs_kv_cache_swap_in(bad, 0, &a, nullptr, nullptr), kArg, {"cache", what});
    expect_error(hs_kv_cache_read(bad, 0, nullptr, nullptr, nullptr), kArg, {"cache", what});
    expect_error(hs_kv_cache_reset_stats(bad, nullptr), kArg, {"cache", what});
    expect_error(hs_kv_cache_copy_stats_async(bad, nullptr), kArg, {"cache", what});
    expect_error(hs_kv_cache_get_stats(bad, -1, &stats), kArg, {"cache", what});
    expect_error(hs_kv_cache_get_info(bad, &info), kArg, {"cache", what});
    expect_error(hs_kv_cache_layer_group(bad, 0, nullptr, nullptr), kArg, {"cache", what});
    expect_error(hs_kv_cache_get_runtime(bad, 0, &runtime), kArg, {"cache", what});
    expect_error(hs_kv_cache_get_tensor(bad, HS_KV_CACHE_SLAB, &tensor), kArg, {"cache", what});
    if (bad != nullptr) expect_error(hs_kv_cache_destroy(bad), kArg, {"cache", what});
  }
  EXPECT_EQ(hs_kv_cache_destroy(nullptr), HS_SUCCESS);
  // A destroyed cache, and the runtimes that lived with it, are refused.
  hs_kv_cache_t raw = nullptr;
  ASSERT_EQ(hs_kv_cache_create(&kv.options, &raw), HS_SUCCESS) << hs_last_error();
  ASSERT_EQ(hs_kv_cache_get_runtime(raw, 1, &runtime), HS_SUCCESS);
  ASSERT_EQ(hs_kv_cache_destroy(raw), HS_SUCCESS);
  expect_error(hs_kv_cache_admit(raw, -1, nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT, {"cache", "not a live"});
  expect_error(hs_kv_cache_destroy(raw), HS_ERROR_INVALID_ARGUMENT, {"cache", "not a live"});
  expect_error(hs_runtime_begin_forward(runtime), HS_ERROR_INVALID_ARGUMENT, {"runtime", "not a live"});
  kv.expect_works();
}

TEST(BadInputKvCache, ItsRuntimesAreNeitherDestroyedNorReboundOnTheirOwn) {
  Kv kv;
  for (int32_t layer : {0, 1}) {
    hs_runtime_t runtime = kv.cache.runtime(layer);
    expect_error(hs_runtime_destroy(runtime), HS_ERROR_INVALID_ARGUMENT, {"runtime", "lives with its cache"});
    Rows host(64);
    expect_error(hs_runtime_bind_source_cache(runtime, host.tensor(), nullptr), HS_ERROR_INVALID_ARGUMENT,
                 {"runtime", "bound by its cache"});
    hs_hot_cache_binding_t binding;
    hs_hot_cache_binding_init(&binding);
    expect_error(hs_runtime_bind_hot_cache(runtime, &binding), HS_ERROR_INVALID_ARGUMENT,
                 {"runtime", "bound by its cache"});
    expect_error(hs_runtime_unbind(runtime), HS_ERROR_INVALID_ARGUMENT, {"runtime", "bound by its cache"});
  }
  kv.expect_works();
}

TEST(BadInputKvCache, NullSmallAndUnknownStructsAreNamed) {
  Kv kv;
  constexpr hs_status_t kArg = HS_ERROR_INVALID_ARGUMENT;
  int32_t marker = 0;
  hs_kv_cache_t made = reinterpret_cast<hs_kv_cache_t>(&marker);
  expect_error(hs_kv_cache_create(nullptr, &made), kArg, {"options", "NULL"});
  EXPECT_EQ(made, nullptr);
  hs_kv_cache_options_t small = kv.options;
  small.struct_size = 8;
  expect_error(hs_kv_cache_create(&small, &made), kArg, {"options", "struct_size 8"});
  hs_kv_cache_options_t future = kv.options;
  future.struct_version = 2;
  expect_error(hs_kv_cache_create(&future, &made), kArg, {"options", "struct_version"});
  hs_kv_cache_options_t no_config = kv.options;
  no_config.config = nullptr;
  expect_error(hs_kv_cache_create(&no_config, &made), kArg, {"options->config", "NULL"});
  expect_error(hs_kv_cache_create(&kv.options, nullptr), kArg, {"cache"});
  expect_error(hs_kv_cache_host_bytes(&kv.options, nullptr), kArg, {"bytes"});
  hs_kv_cache_info_t info{};  // output structs without struct_size
  expect_error(hs_kv_cache_get_info(kv.cache.get(), &info), kArg, {"info", "struct_size"});
  hs_runtime_stats_t stats{};
  expect_error(hs_kv_cache_get_stats(kv.cache.get(), -1, &stats), kArg, {"stats", "struct_size"});
  expect_error(hs_kv_cache_swap_in(kv.cache.get(), 0, nullptr, nullptr, nullptr), kArg, {"args", "NULL"});
  hs_kv_cache_swap_in_args_t args;
  hs_kv_cache_swap_in_args_init(&args);
  args.struct_version = 7;
  expect_error(hs_kv_cache_swap_in(kv.cache.get(), 0, &args, nullptr, nullptr), kArg, {"args", "struct_version"});
  hs_kv_cache_swap_in_args_init(&args);
  hs_runtime_swap_in_result_t result{};
  expect_error(hs_kv_cache_swap_in(kv.cache.get(), 0, &args, &result, nullptr), kArg, {"result", "struct_size"});
  expect_error(hs_write_rows(nullptr, nullptr), kArg, {"args", "NULL"});
  hs_write_rows_args_t write;
  hs_write_rows_args_init(&write);
  write.struct_version = 2;
  expect_error(hs_write_rows(&write, nullptr), kArg, {"args", "struct_version"});
  hs_update_residency_args_t residency;
  hs_update_residency_args_init(&residency);
  residency.struct_size = 4;
  expect_error(hs_update_residency(&residency, nullptr), kArg, {"args", "struct_size 4"});
  hs_runtime_t runtime = kv.cache.runtime(0);
  expect_error(hs_runtime_write(runtime, nullptr, nullptr), kArg, {"args", "NULL"});
  expect_error(hs_runtime_set_host_sharing(runtime, nullptr), kArg, {"sharing", "NULL"});
  hs_runtime_host_sharing_t sharing;
  hs_runtime_host_sharing_init(&sharing);
  sharing.struct_version = 3;
  expect_error(hs_runtime_set_host_sharing(runtime, &sharing), kArg, {"sharing", "struct_version"});
  kv.expect_works();
}

TEST(BadInputKvCache, SizesPastInt32AndInt64AreNamed) {
  Kv kv;
  using Change = void (*)(hs_kv_cache_options_t&);
  struct Case {
    Change change;
    hs_status_t status;
    const char* name;
  };
  constexpr hs_status_t kArg = HS_ERROR_INVALID_ARGUMENT;
  const std::vector<Case> cases = {
      {[](hs_kv_cache_options_t& o) { o.max_requests = std::numeric_limits<int32_t>::max(); }, kArg, "max_requests"},
      {[](hs_kv_cache_options_t& o) { o.max_requests = 0; }, kArg, "max_requests"},
      {[](hs_kv_cache_options_t& o) { o.max_seq_len = std::numeric_limits<int64_t>::max(); }, kArg, "max_seq_len"},
      {[](hs_kv_cache_options_t& o) { o.max_seq_len = -1; }, kArg, "max_seq_len"},
      {[](hs_kv_cache_options_t& o) { o.resident_pages = std::numeric_limits<int32_t>::max(); }, kArg,
       "resident_pages"},
      {[](hs_kv_cache_options_t& o) { o.resident_pages = -1; }, kArg, "resident_pages"},
      {[](hs_kv_cache_options_t& o) { o.resident_page_size = std::numeric_limits<int64_t>::max(); }, kArg,
       "resident_page_size"},
      {[](hs_kv_cache_options_t& o) { o.resident_page_size = int64_t{4} << 31; }, kArg, "resident_page_size"},
      {[](hs_kv_cache_options_t& o) { o.num_layers = 0; }, kArg, "num_layers"},
      {[](hs_kv_cache_options_t& o) { o.kv_dtype = 77; }, HS_ERROR_INVALID_DTYPE, "kv_dtype"},
      {[](hs_kv_cache_options_t& o) { o.device_type = 9; }, kArg, "device_type"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    hs_kv_cache_options_t o = kv.options;
    c.change(o);
    uint64_t bytes = 0;
    expect_error(hs_kv_cache_host_bytes(&o, &bytes), c.status, {c.name});
    hs_kv_cache_t made = nullptr;
    expect_error(hs_kv_cache_create(&o, &made), c.status, {c.name});
    EXPECT_EQ(made, nullptr);
  }
  std::vector<int32_t> skipping{0, 2};
  hs_kv_cache_options_t o = kv.options;
  o.layer_groups = skipping.data();
  hs_kv_cache_t made = nullptr;
  expect_error(hs_kv_cache_create(&o, &made), HS_ERROR_INVALID_ARGUMENT, {"layer_groups[1]", "got 2"});
  // A page of table_block_size x blocks_per_page positions past 64 bits.
  std::vector<int32_t> table(4), states{0}, lengths{5}, blocks(8, 1);
  hs::Tensor table_t = i32(table, {1, 4}), states_t = i32(states, {1}), lengths_t = i32(lengths, {1});
  hs::Tensor blocks_t = i32(blocks, {1, 8});
  hs_update_residency_args_t a;
  hs_update_residency_args_init(&a);
  a.resident_block_table = table_t;
  a.request_state_indices = states_t;
  a.seq_lens = lengths_t;
  a.resident_blocks = blocks_t;
  a.num_pages = 1;
  a.blocks_per_page = 4;
  a.table_block_size = std::numeric_limits<int64_t>::max() / 2;
  expect_error(hs_update_residency(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"table_block_size"});
  a.table_block_size = 2;  // pages of 8 positions: length 5 is in page 0, table entries 0 .. 3
  ASSERT_EQ(hs_update_residency(&a, nullptr), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(table, (std::vector<int32_t>{1, 1, 1, 1}));
  // More state rows than any device_global_indices tensor holds.
  uint64_t bytes = 0;
  expect_error(hs_resolver_workspace_bytes(int64_t{1} << 62, 4096, 2048, 0, &bytes), HS_ERROR_INVALID_ARGUMENT,
               {"num_state_rows", "at most"});
  kv.expect_works();
}

TEST(BadInputKvCache, OutputsOverInputsOrOverTheCachesOwnMemoryAreRefused) {
  Kv kv;
  constexpr hs_status_t kArg = HS_ERROR_INVALID_ARGUMENT;
  // read: out over the slab, over a table, over the indices.
  const hs_tensor_t slab = kv.cache.tensor(HS_KV_CACHE_SLAB);
  const hs_tensor_t source_table = kv.cache.tensor(HS_KV_CACHE_SOURCE_BLOCK_TABLE);
  std::vector<int32_t> wanted{4, 5, -1, 6};
  hs::Tensor indices = i32(wanted, {1, 4});
  hs::Tensor over_slab(static_cast<uint8_t*>(slab.data) + 4 * 32, HS_DTYPE_UINT8, {1, 4, 32});
  expect_error(hs_kv_cache_read(kv.cache.get(), 0, indices, over_slab, nullptr), kArg,
               {"out", "the cache's slab and tables"});
  hs::Tensor over_table(source_table.data, HS_DTYPE_UINT8, {1, 1, 32});
  hs::Tensor one_index = i32(wanted, {1, 1});
  expect_error(hs_kv_cache_read(kv.cache.get(), 0, one_index, over_table, nullptr), kArg,
               {"out", "the cache's slab and tables"});
  Rows buffer(4);
  std::memcpy(buffer.base, wanted.data(), 16);
  hs::Tensor indices_in_out(reinterpret_cast<int32_t*>(buffer.base), HS_DTYPE_INT32, {1, 4});
  expect_error(
      hs_kv_cache_read(kv.cache.get(), 0, indices_in_out, hs::Tensor(buffer.base, HS_DTYPE_UINT8, {1, 4, 32}), nullptr),
      kArg, {"out", "indices"});
  // write: rows over the host rows the write stores into (layer 0's rows of
  // the token-major host cache, at a pitch of two layers).
  const hs_tensor_t host = kv.cache.tensor(HS_KV_CACHE_HOST_CACHE);
  std::vector<int32_t> req{0, 0}, positions{6, 7};
  kv.begin(8);
  hs::Tensor over_host = hs::Tensor(host.data, HS_DTYPE_UINT8, {2, 32}).strides({64, 1});
  expect_error(hs_kv_cache_write(kv.cache.get(), 0, over_host, i32(req, {2}), i32(positions, {2}), nullptr), kArg,
               {"rows", "source cache bound"});
  // begin_forward: the cache's own lengths are accepted as they are; lengths
  // that overlap them otherwise are refused.
  hs_tensor_t own = kv.cache.tensor(HS_KV_CACHE_SEQ_LENS);
  ASSERT_EQ(hs_kv_cache_begin_forward(kv.cache.get(), &own, nullptr), HS_SUCCESS) << hs_last_error();
  hs_tensor_t shifted = own;
  shifted.data = static_cast<int32_t*>(own.data) + 1;
  expect_error(hs_kv_cache_begin_forward(kv.cache.get(), &shifted, nullptr), kArg,
               {"seq_lens", "the cache's seq_lens table"});
  kv.expect_works();
}

TEST(BadInputKvCache, ABorrowedPoolReleasedUnderTheCacheIsRefused) {
  Kv kv;
  const uint64_t bytes = hs::KvCache::host_bytes(kv.options);
  hs_host_pool_options_t po;
  hs_host_pool_options_init(&po);
  po.size_bytes = std::max<uint64_t>(bytes, 1 << 16);
  po.registration = HS_REGISTER_NEVER;
  // Released before the cache is made: refused.
  hs_host_pool_t early = nullptr;
  ASSERT_EQ(hs_host_pool_create(&po, &early), HS_SUCCESS) << hs_last_error();
  ASSERT_EQ(hs_host_pool_retire(early), HS_SUCCESS);
  hs_kv_cache_options_t o = kv.options;
  o.host_pool = early;
  hs_kv_cache_t made = nullptr;
  expect_error(hs_kv_cache_create(&o, &made), HS_ERROR_INVALID_ARGUMENT, {"host_pool", "released"});
  EXPECT_EQ(made, nullptr);
  // Released under it: writes and swaps are refused, the slab still reads.
  hs_host_pool_t pool = nullptr;
  ASSERT_EQ(hs_host_pool_create(&po, &pool), HS_SUCCESS) << hs_last_error();
  o.host_pool = pool;
  {
    hs::KvCache cache(o);
    cache.admit(0);
    std::vector<int32_t> lengths{1, 0}, req{0}, positions{0}, topk{0, -1, -1, -1};
    cache.begin_forward(i32(lengths, {2}));
    std::vector<uint8_t> row(32, 9);
    hs::Tensor row_t(row.data(), HS_DTYPE_UINT8, {1, 32});
    cache.write(0, row_t, i32(req, {1}), i32(positions, {1}));
    ASSERT_EQ(hs_host_pool_retire(pool), HS_SUCCESS);
    expect_error(hs_kv_cache_write(cache.get(), 0, row_t, i32(req, {1}), i32(positions, {1}), nullptr),
                 HS_ERROR_INVALID_STATE, {"host_cache", "released"});
    hs_kv_cache_swap_in_args_t a;
    hs_kv_cache_swap_in_args_init(&a);
    hs::Tensor topk_t = i32(topk, {1, 4}), req_t = i32(req, {1});
    a.topk_indices = topk_t;
    a.req_id_per_token = req_t;
    expect_error(hs_kv_cache_swap_in(cache.get(), 0, &a, nullptr, nullptr), HS_ERROR_INVALID_STATE,
                 {"host_cache", "released"});
    std::vector<int32_t> indices{20, -1};  // block 5: request 0's resident page (after 2 x 2 hot blocks)
    std::vector<uint8_t> out(2 * 32, 0xFF);
    ASSERT_EQ(hs_kv_cache_read(cache.get(), 0, i32(indices, {1, 2}), hs::Tensor(out.data(), HS_DTYPE_UINT8, {1, 2, 32}),
                               nullptr),
              HS_SUCCESS)
        << hs_last_error();
    EXPECT_EQ(out[0], 9) << "the resident copy of position 0";
    EXPECT_EQ(out[32], 0);
  }
  ASSERT_EQ(hs_host_pool_destroy(pool), HS_SUCCESS);
  ASSERT_EQ(hs_host_pool_destroy(early), HS_SUCCESS);
  kv.expect_works();
}

// ------------------------------------------------------------------ the kernels of the KV cache

TEST(BadInputKernels, WriteReadAndResidencyRefuseAliasedOutputs) {
  constexpr hs_status_t kArg = HS_ERROR_INVALID_ARGUMENT;
  // write_rows: two rows of state row 0 at positions 1 and 2 (host slots 1 and
  // 2: no source table), resident in block 1, position 1's slot held in hot
  // slot 0 (hot block 2) of a [3, 4, 32] paged cache.
  Rows host(8), paged(12), scratch(4);
  std::vector<uint8_t> rows(2 * 32, 0xAB);
  std::vector<int32_t> req{0, 0}, positions{1, 2}, states{0}, resident_table{1, 0, 0, 0}, hot_table{2, 0};
  auto* dgi = reinterpret_cast<int32_t*>(scratch.base);
  std::fill_n(dgi, 8, -1);
  dgi[0] = 1;
  hs::Tensor rows_t(rows.data(), HS_DTYPE_UINT8, {2, 32}), req_t = i32(req, {2}), positions_t = i32(positions, {2});
  hs::Tensor states_t = i32(states, {1}), resident_table_t = i32(resident_table, {1, 4});
  hs::Tensor hot_table_t = i32(hot_table, {1, 2}), dgi_t(dgi, HS_DTYPE_INT32, {1, 8});
  hs::Tensor paged_t(paged.base, HS_DTYPE_UINT8, {3, 4, 32});
  const hs::Tensor host_t = host.tensor();
  auto make = [&] {
    hs_write_rows_args_t a;
    hs_write_rows_args_init(&a);
    a.rows = rows_t;
    a.req_id_per_token = req_t;
    a.positions = positions_t;
    a.request_state_indices = states_t;
    a.host_cache = host_t;
    return a;
  };
  hs_write_rows_args_t a = make();
  hs::Tensor rows_over_host(host.base + 4 * 32, HS_DTYPE_UINT8, {2, 32});
  a.rows = rows_over_host;
  expect_error(hs_write_rows(&a, nullptr), kArg, {"host_cache", "rows"});
  // The resident and hot copies in one paged view: accepted, every copy lands.
  a = make();
  a.resident_cache = paged_t;
  a.resident_block_table = resident_table_t;
  a.hot_cache = paged_t;
  a.hot_block_table = hot_table_t;
  a.device_global_indices = dgi_t;
  ASSERT_EQ(hs_write_rows(&a, nullptr), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(host.base[1 * 32], 0xAB);
  EXPECT_EQ(host.base[2 * 32], 0xAB);
  EXPECT_EQ(host.base[3 * 32], 4) << "untouched";
  EXPECT_EQ(paged.base[5 * 32], 0xAB);  // resident block 1, rows 1 and 2
  EXPECT_EQ(paged.base[6 * 32], 0xAB);
  EXPECT_EQ(paged.base[8 * 32], 0xAB);  // hot block 2, slot 0
  EXPECT_EQ(paged.base[9 * 32], 10) << "untouched";
  // Two views of one cache a row apart, and hot copies over the state they read.
  hs::Tensor shifted(paged.base + 32, HS_DTYPE_UINT8, {2, 4, 32});
  a.hot_cache = shifted;
  expect_error(hs_write_rows(&a, nullptr), kArg, {"resident_cache", "hot_cache"});
  hs::Tensor over_dgi(scratch.base, HS_DTYPE_UINT8, {1, 4, 32});
  a.hot_cache = over_dgi;
  expect_error(hs_write_rows(&a, nullptr), kArg, {"hot_cache", "device_global_indices"});
  // read_rows: out over the cache.
  std::vector<int32_t> indices{0, 1};
  hs::Tensor over_cache(host.base, HS_DTYPE_UINT8, {1, 2, 32});
  expect_error(hs_read_rows(host_t, i32(indices, {1, 2}), over_cache, nullptr), kArg, {"out", "cache"});
  std::vector<uint8_t> out(2 * 32);
  ASSERT_EQ(hs_read_rows(host_t, i32(indices, {1, 2}), hs::Tensor(out.data(), HS_DTYPE_UINT8, {1, 2, 32}), nullptr),
            HS_SUCCESS)
      << hs_last_error();
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[32], 0xAB);
  // update_residency: the table over the blocks it reads.
  std::vector<int32_t> shared(8, 3), lengths{2};
  hs_update_residency_args_t r;
  hs_update_residency_args_init(&r);
  hs::Tensor table_t = i32(shared, {1, 4}), lengths_t = i32(lengths, {1});
  hs::Tensor blocks_t(shared.data() + 2, HS_DTYPE_INT32, {1, 2});
  r.resident_block_table = table_t;
  r.request_state_indices = states_t;
  r.seq_lens = lengths_t;
  r.resident_blocks = blocks_t;
  r.table_block_size = 4;
  r.num_pages = 2;
  expect_error(hs_update_residency(&r, nullptr), kArg, {"resident_block_table", "resident_blocks"});
  EXPECT_EQ(shared, std::vector<int32_t>(8, 3)) << "nothing written";
}

TEST(BadInputKernels, TheRuntimesWriteRefusesArgumentsOverItsBindings) {
  hs_config_t config;
  hs_config_init(&config);
  config.top_k = 4;
  config.device_buffer_size = 8;
  config.row_bytes = 32;
  config.block_size = 4;
  config.hot_block_size = 4;
  hs_runtime_options_t ro;
  hs_runtime_options_init(&ro);
  ro.config = &config;
  ro.max_num_reqs = 1;
  hs::Runtime runtime(ro);
  Rows host(64);
  runtime.bind_source_cache(host.tensor());
  Rows slab(12);
  std::vector<int32_t> table{1, 2};
  hs::Tensor slab_t(slab.base, HS_DTYPE_UINT8, {12 * 32});
  runtime.bind_hot_cache(slab_t, 0, 4 * 32, 3, 4, i32(table, {1, 2}));
  std::vector<uint8_t> rows(32, 0xCD);
  std::vector<int32_t> req{0}, positions{5}, states{0};
  hs::Tensor rows_t(rows.data(), HS_DTYPE_UINT8, {1, 32}), req_t = i32(req, {1}), positions_t = i32(positions, {1});
  hs::Tensor states_t = i32(states, {1});
  auto make = [&] {
    hs_runtime_write_args_t a;
    hs_runtime_write_args_init(&a);
    a.rows = rows_t;
    a.req_id_per_token = req_t;
    a.positions = positions_t;
    a.request_state_indices = states_t;
    return a;
  };
  constexpr hs_status_t kArg = HS_ERROR_INVALID_ARGUMENT;
  hs_runtime_write_args_t a = make();
  hs::Tensor over_host(host.base + 3 * 32, HS_DTYPE_UINT8, {1, 32});
  a.rows = over_host;
  expect_error(hs_runtime_write(runtime.get(), &a, nullptr), kArg, {"rows", "source cache bound"});
  a = make();
  hs::Tensor positions_in_slab(reinterpret_cast<int32_t*>(slab.base), HS_DTYPE_INT32, {1});
  a.positions = positions_in_slab;
  expect_error(hs_runtime_write(runtime.get(), &a, nullptr), kArg, {"positions", "hot view bound"});
  // A resident cache: the bound hot view itself is one paged view with it;
  // the same memory a row off is not.
  std::vector<int32_t> resident_table{0, 0};
  a = make();
  hs::Tensor view(slab.base, HS_DTYPE_UINT8, {3, 4, 32}), view_off(slab.base + 32, HS_DTYPE_UINT8, {2, 4, 32});
  hs::Tensor resident_table_t = i32(resident_table, {1, 2});
  a.resident_cache = view_off;
  a.resident_block_table = resident_table_t;
  expect_error(hs_runtime_write(runtime.get(), &a, nullptr), kArg, {"resident_cache", "hot view bound"});
  a.resident_cache = view;
  resident_table[1] = 2;  // position 5 resident in block 2, row 1
  ASSERT_EQ(hs_runtime_write(runtime.get(), &a, nullptr), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(host.base[5 * 32], 0xCD);
  EXPECT_EQ(slab.base[9 * 32], 0xCD);
  a.skip_host_store = 2;
  expect_error(hs_runtime_write(runtime.get(), &a, nullptr), kArg, {"skip_host_store", "got 2"});
  // The host role and the per-request reset.
  hs_runtime_host_sharing_t sharing;
  hs_runtime_host_sharing_init(&sharing);
  sharing.role = 3;
  expect_error(hs_runtime_set_host_sharing(runtime.get(), &sharing), kArg, {"role", "got 3"});
  sharing.role = HS_HOST_ROLE_READER;
  int32_t on_the_stack[8] = {};
  sharing.event = reinterpret_cast<hs_ipc_event_t>(on_the_stack);
  expect_error(hs_runtime_set_host_sharing(runtime.get(), &sharing), kArg, {"sharing->event", "not a live"});
  EXPECT_TRUE(runtime.info().is_writer) << "a refused role changes nothing";
  expect_error(hs_runtime_reset_request(runtime.get(), 1, nullptr), kArg, {"state_row", "got 1"});
  expect_error(hs_runtime_reset_request(runtime.get(), -1, nullptr), kArg, {"state_row", "got -1"});
  ASSERT_EQ(hs_runtime_reset_request(runtime.get(), 0, nullptr), HS_SUCCESS) << hs_last_error();
}

// ------------------------------------------------------------------ host registration

TEST(BadInputHostRegistration, RangesNoCallCouldRegisterAreRefused) {
  constexpr hs_status_t kArg = HS_ERROR_INVALID_ARGUMENT;
  Rows memory(64);
  const long page = sysconf(_SC_PAGESIZE);
  void* guard = mmap(nullptr, static_cast<size_t>(page), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(guard, MAP_FAILED);
  expect_error(hs_host_register(nullptr, 64, HS_DEVICE_CPU, 0), kArg, {"data", "NULL"});
  expect_error(hs_host_register(memory.base, 0, HS_DEVICE_CPU, 0), kArg, {"bytes", "got 0"});
  expect_error(hs_host_register(memory.base, UINT64_MAX, HS_DEVICE_CPU, 0), kArg, {"bytes", "wraps"});
  expect_error(hs_host_register(guard, static_cast<uint64_t>(page), HS_DEVICE_CPU, 0), kArg,
               {"data", "not host memory mapped"});
  expect_error(hs_host_register(memory.base, uint64_t{1} << 46, HS_DEVICE_CPU, 0), kArg,
               {"bytes", "not host memory mapped"});
  expect_error(hs_host_register(memory.base, 64, 9, 0), kArg, {"device_type"});
  int32_t registered = -1;
  expect_error(hs_host_is_registered(memory.base, UINT64_MAX, &registered), kArg, {"bytes", "wraps"});
  expect_error(hs_host_is_registered(memory.base, 64, nullptr), kArg, {"registered"});
  // A released pool's memory, still mapped for views.
  hs_host_pool_options_t po;
  hs_host_pool_options_init(&po);
  po.size_bytes = 1 << 16;
  po.registration = HS_REGISTER_NEVER;
  hs_host_pool_t pool = nullptr;
  ASSERT_EQ(hs_host_pool_create(&po, &pool), HS_SUCCESS) << hs_last_error();
  void* pool_data = nullptr;
  ASSERT_EQ(hs_host_pool_data(pool, &pool_data), HS_SUCCESS);
  ASSERT_EQ(hs_host_pool_retire(pool), HS_SUCCESS);
  expect_error(hs_host_register(pool_data, 4096, HS_DEVICE_CPU, 0), HS_ERROR_INVALID_STATE, {"data", "released"});
  ASSERT_EQ(hs_host_pool_destroy(pool), HS_SUCCESS);
  // Nothing was recorded: the valid calls work.
  ASSERT_EQ(hs_host_register(memory.base, 64 * 32, HS_DEVICE_CPU, 0), HS_SUCCESS) << hs_last_error();
  ASSERT_EQ(hs_host_is_registered(memory.base + 32, 32, &registered), HS_SUCCESS);
  EXPECT_EQ(registered, 1);
  expect_error(hs_host_register(memory.base + 64, 32, HS_DEVICE_CPU, 0), kArg, {"data", "overlaps"});
  expect_error(hs_host_unregister(memory.base + 8), kArg, {"data", "not the start"});
  ASSERT_EQ(hs_host_unregister(memory.base), HS_SUCCESS) << hs_last_error();
  ASSERT_EQ(hs_host_is_registered(memory.base + 32, 32, &registered), HS_SUCCESS);
  EXPECT_EQ(registered, 0);
  munmap(guard, static_cast<size_t>(page));
}

// ------------------------------------------------------------------ the resolver's workspace

TEST(BadInputResolve, AWorkspaceGivenIsCheckedOnEveryBackend) {
  std::vector<int32_t> topk{1, 2, 3, 4}, req{0}, states{0}, hot_table{0, 1}, out(6 * 4, -7), counts(2, -7);
  std::vector<int32_t> dgi(8, -1);
  std::vector<int16_t> lru{0, 1, 2, 3, 4, 5, 6, 7};
  hs::Tensor topk_t = i32(topk, {1, 4}), req_t = i32(req, {1}), states_t = i32(states, {1});
  hs::Tensor hot_table_t = i32(hot_table, {1, 2}), dgi_t = i32(dgi, {1, 8});
  hs::Tensor lru_t(lru.data(), HS_DTYPE_INT16, {1, 8});
  std::vector<hs::Tensor> outs;
  for (int i = 0; i < 6; ++i)
    outs.emplace_back(out.data() + 4 * i, HS_DTYPE_INT32, std::initializer_list<int64_t>{1, 4});
  hs::Tensor valid_t(counts.data(), HS_DTYPE_INT32, {1}), swap_counts_t(counts.data() + 1, HS_DTYPE_INT32, {1});
  auto make = [&] {
    hs_resolve_residency_args_t a;
    hs_resolve_residency_args_init(&a);
    a.topk_indices = topk_t;
    a.req_id_per_token = req_t;
    a.request_state_indices = states_t;
    a.device_global_indices = dgi_t;
    a.lru_slots = lru_t;
    a.hot_block_table = hot_table_t;
    a.hot_block_size = 4;
    a.attention_block_stride = 4;
    a.host_rows = 64;
    a.max_union_rows = 8;
    a.out_attention = outs[0];
    a.out_hot_rows = outs[1];
    a.out_resolved = outs[2];
    a.out_miss_mask = outs[3];
    a.out_swap_host_rows = outs[4];
    a.out_swap_device_rows = outs[5];
    a.out_valid_counts = valid_t;
    a.out_swap_counts = swap_counts_t;
    return a;
  };
  std::vector<float> floats(64);
  Rows scratch(4);
  hs::Tensor float_workspace(floats.data(), HS_DTYPE_FLOAT32, {64});
  hs::Tensor flat_workspace(scratch.base, HS_DTYPE_UINT8, {2, 64});
  hs::Tensor workspace_over_dgi(reinterpret_cast<uint8_t*>(dgi.data()), HS_DTYPE_UINT8, {32});
  hs::Tensor misaligned(scratch.base + 1, HS_DTYPE_UINT8, {64});
  const std::vector<std::pair<const hs_tensor_t*, std::vector<const char*>>> bad = {
      {float_workspace, {"workspace", "uint8"}},
      {flat_workspace, {"workspace", "1 dimension"}},
      {misaligned, {"workspace", "aligned"}},
      {workspace_over_dgi, {"workspace", "device_global_indices"}},
  };
  for (const auto& [workspace, fragments] : bad) {
    hs_resolve_residency_args_t a = make();
    a.workspace = workspace;
    const hs_status_t status = hs_resolve_residency(&a, nullptr);
    EXPECT_NE(status, HS_SUCCESS);
    expect_error_with(status, status, fragments);
    EXPECT_EQ(dgi, std::vector<int32_t>(8, -1)) << "nothing changed";
  }
  hs::Tensor workspace(scratch.base, HS_DTYPE_UINT8, {128});
  hs_resolve_residency_args_t a = make();
  a.workspace = workspace;
  ASSERT_EQ(hs_resolve_residency(&a, nullptr), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(counts[1], 4) << "four misses";
  for (int k = 0; k < 4; ++k) EXPECT_GE(out[k], 0) << k;
}

}  // namespace
