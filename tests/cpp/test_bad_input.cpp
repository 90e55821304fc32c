// The C ABI against bad input: NULL, destroyed and made-up handles, NULL and
// garbage structs (struct_size, struct_version), tensor descriptors no real
// tensor has (extents past 64 bits, addresses that wrap), strides and sizes
// that overflow, aliased outputs, raw addresses the CPU copy cannot touch,
// and released host pools. Every refusal is a status with a message naming
// the argument, and a valid call right after it gives the right answer.
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

TEST(BadInputLifetime, ReleasedPoolsAreRefusedWhereverTheirMemoryGoes) {
  hs_host_pool_options_t po;
  hs_host_pool_options_init(&po);
  po.size_bytes = 1 << 16;
  po.registration = HS_REGISTER_NEVER;
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

}  // namespace
