// The index group on the CPU backend through its C ABI: option checks that
// name the option, the owned tensors (shapes, dtypes, initial values),
// reset, invalidate_sorted_slots against an independent loop, the counter
// mirror, and resolution through the group against hs_resolve_residency.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "expect_status.hpp"
#include "hisparse/hisparse.h"

namespace {

// A host tensor descriptor that owns its shape.
struct HostTensor {
  HostTensor(void* data, hs_dtype_t dtype, std::vector<int64_t> dims) : shape(std::move(dims)) {
    tensor = hs_tensor_t{data, dtype, HS_DEVICE_CPU, 0, static_cast<int32_t>(shape.size()), shape.data(), nullptr};
  }
  HostTensor(const HostTensor&) = delete;
  std::vector<int64_t> shape;
  hs_tensor_t tensor{};
  const hs_tensor_t* get() const { return &tensor; }
};

// RAII over hs_index_group_t for the tests.
class Group {
 public:
  explicit Group(const hs_index_group_options_t& options) {
    const hs_status_t status = hs_index_group_create(&options, &handle_);
    EXPECT_EQ(status, HS_SUCCESS) << hs_last_error();
  }
  ~Group() { EXPECT_EQ(hs_index_group_destroy(handle_), HS_SUCCESS); }
  Group(const Group&) = delete;
  hs_index_group_t get() const { return handle_; }

  hs_tensor_t tensor(hs_index_group_tensor_t which) const {
    hs_tensor_t out{};
    EXPECT_EQ(hs_index_group_get_tensor(handle_, which, &out), HS_SUCCESS) << hs_last_error();
    return out;
  }
  template <typename T>
  std::vector<T> values(hs_index_group_tensor_t which) const {
    const hs_tensor_t t = tensor(which);
    int64_t n = 1;
    for (int d = 0; d < t.ndim; ++d) n *= t.shape[d];
    const T* data = static_cast<const T*>(t.data);
    return std::vector<T>(data, data + n);
  }
  template <typename T>
  T* data(hs_index_group_tensor_t which) const {
    return static_cast<T*>(tensor(which).data);
  }

 private:
  hs_index_group_t handle_ = nullptr;
};

hs_index_group_options_t small_options(int32_t S = 3, int32_t H = 8, int32_t R = 4, int32_t K = 3) {
  hs_index_group_options_t o;
  hs_index_group_options_init(&o);
  o.max_num_reqs = S;
  o.device_buffer_size = H;
  o.max_swap_rows = R;
  o.top_k = K;
  o.max_union_rows = K;
  return o;
}

TEST(IndexGroupOptions, InitFillsDefaults) {
  hs_index_group_options_t o;
  hs_index_group_options_init(&o);
  EXPECT_EQ(o.struct_size, sizeof(o));
  EXPECT_EQ(o.struct_version, static_cast<uint32_t>(HS_INDEX_GROUP_OPTIONS_VERSION));
  EXPECT_EQ(o.device_type, HS_DEVICE_CPU);
  EXPECT_EQ(o.device_buffer_size, 4096);
  EXPECT_EQ(o.top_k, 2048);
  EXPECT_EQ(o.max_num_reqs, 0);
}

TEST(IndexGroupOptions, EachBadOptionIsNamed) {
  struct Case {
    const char* option;
    void (*mutate)(hs_index_group_options_t&);
  };
  const Case cases[] = {
      {"max_num_reqs", [](hs_index_group_options_t& o) { o.max_num_reqs = 0; }},
      {"max_num_reqs", [](hs_index_group_options_t& o) { o.max_num_reqs = -2; }},
      {"device_buffer_size", [](hs_index_group_options_t& o) { o.device_buffer_size = 0; }},
      {"device_buffer_size", [](hs_index_group_options_t& o) { o.device_buffer_size = 32768; }},
      {"max_swap_rows", [](hs_index_group_options_t& o) { o.max_swap_rows = -1; }},
      {"top_k", [](hs_index_group_options_t& o) { o.top_k = 0; }},
      {"max_union_rows", [](hs_index_group_options_t& o) { o.max_union_rows = 9; }},
      {"max_union_rows", [](hs_index_group_options_t& o) { o.max_union_rows = -1; }},
      {"device_type", [](hs_index_group_options_t& o) { o.device_type = 7; }},
  };
  for (const Case& c : cases) {
    hs_index_group_options_t o = small_options();
    c.mutate(o);
    hs_index_group_t group = reinterpret_cast<hs_index_group_t>(0x1);
    expect_error(hs_index_group_create(&o, &group), HS_ERROR_INVALID_ARGUMENT, {c.option});
    EXPECT_EQ(group, nullptr) << c.option;
  }
}

TEST(IndexGroupOptions, StructAndPointerChecks) {
  hs_index_group_options_t o = small_options();
  hs_index_group_t group = nullptr;
  expect_error(hs_index_group_create(nullptr, &group), HS_ERROR_INVALID_ARGUMENT, {"options", "NULL"});
  expect_error(hs_index_group_create(&o, nullptr), HS_ERROR_INVALID_ARGUMENT, {"group", "NULL"});
  o.struct_size = 8;
  expect_error(hs_index_group_create(&o, &group), HS_ERROR_INVALID_ARGUMENT, {"options", "struct_size"});
  EXPECT_EQ(hs_index_group_destroy(nullptr), HS_SUCCESS);
}

TEST(IndexGroupOptions, CudaWithoutUsableDeviceIsUnsupported) {
  int count = 0;
  ASSERT_EQ(hs_cuda_device_count(&count), HS_SUCCESS);
  if (count > 0) GTEST_SKIP() << "a CUDA device is present";
  hs_index_group_options_t o = small_options();
  o.device_type = HS_DEVICE_CUDA;
  o.device_index = 0;
  hs_index_group_t group = nullptr;
  expect_error(hs_index_group_create(&o, &group), HS_ERROR_UNSUPPORTED, {});
  EXPECT_EQ(group, nullptr);
}

TEST(IndexGroupOptions, ZeroMeansDefaultForSwapRowsAndUnion) {
  hs_index_group_options_t o = small_options(5, 8, 0, 3);
  o.max_union_rows = 0;
  Group group(o);
  hs_index_group_info_t info{};
  info.struct_size = sizeof(info);
  ASSERT_EQ(hs_index_group_get_info(group.get(), &info), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(info.struct_version, static_cast<uint32_t>(HS_INDEX_GROUP_INFO_VERSION));
  EXPECT_EQ(info.device_type, HS_DEVICE_CPU);
  EXPECT_EQ(info.max_num_reqs, 5);
  EXPECT_EQ(info.device_buffer_size, 8);
  EXPECT_EQ(info.max_swap_rows, 5);
  EXPECT_EQ(info.top_k, 3);
  EXPECT_EQ(info.max_union_rows, 3);
  EXPECT_GE(info.device_bytes, uint64_t{5 * 8 * 6 + 8 * 2 + 5 * 3 * 4 * 6 + 5 * 4 * 2 + 40});
}

TEST(IndexGroupTensors, ShapesDtypesAndInitialValues) {
  const int32_t S = 3, H = 8, R = 4, K = 3;
  Group group(small_options(S, H, R, K));
  struct Expect {
    hs_index_group_tensor_t which;
    hs_dtype_t dtype;
    std::vector<int64_t> shape;
  };
  const Expect expected[] = {
      {HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES, HS_DTYPE_INT32, {S, H}},
      {HS_INDEX_GROUP_LRU_SLOTS, HS_DTYPE_INT16, {S, H}},
      {HS_INDEX_GROUP_LRU_INIT, HS_DTYPE_INT16, {H}},
      {HS_INDEX_GROUP_ATTENTION_INDICES, HS_DTYPE_INT32, {R, K}},
      {HS_INDEX_GROUP_HOT_ROWS, HS_DTYPE_INT32, {R, K}},
      {HS_INDEX_GROUP_RESOLVED_SLOTS, HS_DTYPE_INT32, {R, K}},
      {HS_INDEX_GROUP_MISS_MASK, HS_DTYPE_INT32, {R, K}},
      {HS_INDEX_GROUP_VALID_COUNTS, HS_DTYPE_INT32, {R}},
      {HS_INDEX_GROUP_SWAP_HOST_ROWS, HS_DTYPE_INT32, {R, K}},
      {HS_INDEX_GROUP_SWAP_DEVICE_ROWS, HS_DTYPE_INT32, {R, K}},
      {HS_INDEX_GROUP_SWAP_COUNTS, HS_DTYPE_INT32, {R}},
      {HS_INDEX_GROUP_STATS, HS_DTYPE_INT64, {HS_NUM_STATS}},
      {HS_INDEX_GROUP_STATS_HOST, HS_DTYPE_INT64, {HS_NUM_STATS}},
  };
  ASSERT_EQ(std::size(expected), static_cast<size_t>(HS_INDEX_GROUP_NUM_TENSORS));
  std::vector<const void*> pointers;
  for (const Expect& e : expected) {
    const hs_tensor_t t = group.tensor(e.which);
    EXPECT_EQ(t.dtype, e.dtype) << e.which;
    EXPECT_EQ(t.device_type, HS_DEVICE_CPU) << e.which;
    EXPECT_EQ(t.device_index, 0) << e.which;
    ASSERT_EQ(t.ndim, static_cast<int32_t>(e.shape.size())) << e.which;
    for (int d = 0; d < t.ndim; ++d) EXPECT_EQ(t.shape[d], e.shape[d]) << e.which << " dim " << d;
    EXPECT_EQ(t.strides, nullptr) << e.which;
    ASSERT_NE(t.data, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 16, 0u) << e.which;
    pointers.push_back(t.data);
  }
  std::sort(pointers.begin(), pointers.end());
  EXPECT_EQ(std::adjacent_find(pointers.begin(), pointers.end()), pointers.end()) << "tensors share memory";

  EXPECT_EQ(group.values<int32_t>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES), std::vector<int32_t>(S * H, -1));
  std::vector<int16_t> lru_row(H);
  std::iota(lru_row.begin(), lru_row.end(), int16_t{0});
  EXPECT_EQ(group.values<int16_t>(HS_INDEX_GROUP_LRU_INIT), lru_row);
  const std::vector<int16_t> lru = group.values<int16_t>(HS_INDEX_GROUP_LRU_SLOTS);
  for (int s = 0; s < S; ++s) {
    EXPECT_EQ(std::vector<int16_t>(lru.begin() + s * H, lru.begin() + (s + 1) * H), lru_row) << "row " << s;
  }
  for (auto which : {HS_INDEX_GROUP_ATTENTION_INDICES, HS_INDEX_GROUP_HOT_ROWS, HS_INDEX_GROUP_RESOLVED_SLOTS,
                     HS_INDEX_GROUP_SWAP_HOST_ROWS, HS_INDEX_GROUP_SWAP_DEVICE_ROWS}) {
    EXPECT_EQ(group.values<int32_t>(which), std::vector<int32_t>(R * K, -1)) << which;
  }
  EXPECT_EQ(group.values<int32_t>(HS_INDEX_GROUP_MISS_MASK), std::vector<int32_t>(R * K, 0));
  EXPECT_EQ(group.values<int32_t>(HS_INDEX_GROUP_VALID_COUNTS), std::vector<int32_t>(R, 0));
  EXPECT_EQ(group.values<int32_t>(HS_INDEX_GROUP_SWAP_COUNTS), std::vector<int32_t>(R, 0));
  EXPECT_EQ(group.values<int64_t>(HS_INDEX_GROUP_STATS), std::vector<int64_t>(HS_NUM_STATS, 0));
  EXPECT_EQ(group.values<int64_t>(HS_INDEX_GROUP_STATS_HOST), std::vector<int64_t>(HS_NUM_STATS, 0));
}

TEST(IndexGroupTensors, BadArgumentsAreNamed) {
  Group group(small_options());
  hs_tensor_t out{};
  expect_error(hs_index_group_get_tensor(group.get(), HS_INDEX_GROUP_NUM_TENSORS, &out), HS_ERROR_INVALID_ARGUMENT,
               {"which"});
  expect_error(hs_index_group_get_tensor(group.get(), static_cast<hs_index_group_tensor_t>(-1), &out),
               HS_ERROR_INVALID_ARGUMENT, {"which"});
  expect_error(hs_index_group_get_tensor(group.get(), HS_INDEX_GROUP_LRU_SLOTS, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"out"});
  expect_error(hs_index_group_get_tensor(nullptr, HS_INDEX_GROUP_LRU_SLOTS, &out), HS_ERROR_INVALID_ARGUMENT,
               {"group"});
  expect_error(hs_index_group_reset(nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT, {"group"});
}

TEST(IndexGroupReset, RestoresStateAndZeroesCounters) {
  const int32_t S = 4, H = 6, R = 2, K = 2;
  Group group(small_options(S, H, R, K));
  int32_t* dgi = group.data<int32_t>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES);
  int16_t* lru = group.data<int16_t>(HS_INDEX_GROUP_LRU_SLOTS);
  int64_t* stats = group.data<int64_t>(HS_INDEX_GROUP_STATS);
  int32_t* attention = group.data<int32_t>(HS_INDEX_GROUP_ATTENTION_INDICES);
  for (int i = 0; i < S * H; ++i) {
    dgi[i] = 100 + i;
    lru[i] = static_cast<int16_t>((H - 1) - i % H);
  }
  for (int i = 0; i < HS_NUM_STATS; ++i) stats[i] = 7 + i;
  attention[0] = 42;

  ASSERT_EQ(hs_index_group_reset(group.get(), nullptr), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(group.values<int32_t>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES), std::vector<int32_t>(S * H, -1));
  const std::vector<int16_t> init = group.values<int16_t>(HS_INDEX_GROUP_LRU_INIT);
  const std::vector<int16_t> lru_after = group.values<int16_t>(HS_INDEX_GROUP_LRU_SLOTS);
  for (int s = 0; s < S; ++s) {
    EXPECT_EQ(std::vector<int16_t>(lru_after.begin() + s * H, lru_after.begin() + (s + 1) * H), init);
  }
  EXPECT_EQ(group.values<int64_t>(HS_INDEX_GROUP_STATS), std::vector<int64_t>(HS_NUM_STATS, 0));
  EXPECT_EQ(attention[0], 42) << "reset leaves the shared outputs alone";
}

// The seed's semantics written independently: every listed state row's
// hot slots whose value is in the (sorted) slot list become -1.
std::vector<int32_t> invalidate_model(std::vector<int32_t> dgi, int64_t S, int64_t H,
                                      const std::vector<int32_t>& sorted_slots,
                                      const std::vector<int32_t>& state_indices) {
  for (int32_t s : state_indices) {
    if (s < 0 || s >= S) continue;
    for (int64_t j = 0; j < H; ++j) {
      int32_t& value = dgi[s * H + j];
      if (std::binary_search(sorted_slots.begin(), sorted_slots.end(), value)) value = -1;
    }
  }
  return dgi;
}

TEST(IndexGroupInvalidate, MatchesIndependentModel) {
  const int32_t S = 6, H = 16;
  Group group(small_options(S, H, 2, 4));
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> slot(-1, 40);
  for (int trial = 0; trial < 50; ++trial) {
    int32_t* dgi = group.data<int32_t>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES);
    for (int i = 0; i < S * H; ++i) dgi[i] = slot(rng);
    const std::vector<int32_t> before(dgi, dgi + S * H);

    std::vector<int32_t> sorted_slots(std::uniform_int_distribution<int>(1, 12)(rng));
    for (int32_t& v : sorted_slots) v = slot(rng);
    std::sort(sorted_slots.begin(), sorted_slots.end());  // duplicates kept
    // Unsorted state rows with duplicates, padding (-1) and a row past S.
    std::vector<int32_t> state_indices = {4, 1, 4, -1, S, 0};
    state_indices.resize(std::uniform_int_distribution<int>(1, 6)(rng));

    const HostTensor slots_t(sorted_slots.data(), HS_DTYPE_INT32, {static_cast<int64_t>(sorted_slots.size())});
    const HostTensor states_t(state_indices.data(), HS_DTYPE_INT32, {static_cast<int64_t>(state_indices.size())});
    ASSERT_EQ(hs_index_group_invalidate_sorted_slots(group.get(), slots_t.get(), states_t.get(), nullptr), HS_SUCCESS)
        << hs_last_error();
    EXPECT_EQ(group.values<int32_t>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES),
              invalidate_model(before, S, H, sorted_slots, state_indices))
        << "trial " << trial;
  }
}

TEST(IndexGroupInvalidate, ExactSmallCase) {
  const int32_t S = 3, H = 4;
  Group group(small_options(S, H, 1, 2));
  int32_t* dgi = group.data<int32_t>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES);
  const std::vector<int32_t> start = {5, 9, -1, 7,  //
                                      9, 5, 3,  2,   //
                                      7, 9, 9,  1};
  std::copy(start.begin(), start.end(), dgi);
  std::vector<int32_t> sorted_slots = {2, 5, 9, 9};
  std::vector<int32_t> state_indices = {2, 0};
  const HostTensor slots_t(sorted_slots.data(), HS_DTYPE_INT32, {4});
  const HostTensor states_t(state_indices.data(), HS_DTYPE_INT32, {2});
  ASSERT_EQ(hs_index_group_invalidate_sorted_slots(group.get(), slots_t.get(), states_t.get(), nullptr), HS_SUCCESS);
  const std::vector<int32_t> expected = {-1, -1, -1, 7,  //
                                         9,  5,  3,  2,     // row 1 not listed
                                         7,  -1, -1, 1};
  EXPECT_EQ(group.values<int32_t>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES), expected);
}

TEST(IndexGroupInvalidate, EmptyInputsAreNoOps) {
  Group group(small_options(2, 4, 1, 2));
  int32_t* dgi = group.data<int32_t>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES);
  std::iota(dgi, dgi + 8, 0);
  int32_t one_slot = 3;
  int32_t one_state = 0;
  const HostTensor no_slots(nullptr, HS_DTYPE_INT32, {0});
  const HostTensor no_states(nullptr, HS_DTYPE_INT32, {0});
  const HostTensor slots_t(&one_slot, HS_DTYPE_INT32, {1});
  const HostTensor states_t(&one_state, HS_DTYPE_INT32, {1});
  ASSERT_EQ(hs_index_group_invalidate_sorted_slots(group.get(), no_slots.get(), states_t.get(), nullptr), HS_SUCCESS)
      << hs_last_error();
  ASSERT_EQ(hs_index_group_invalidate_sorted_slots(group.get(), slots_t.get(), no_states.get(), nullptr), HS_SUCCESS)
      << hs_last_error();
  std::vector<int32_t> expected(8);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(group.values<int32_t>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES), expected);
}

TEST(IndexGroupInvalidate, BadArgumentsAreNamedAndStateKept) {
  Group group(small_options(2, 4, 1, 2));
  int32_t* dgi = group.data<int32_t>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES);
  std::fill(dgi, dgi + 8, 3);
  int64_t slots64[2] = {3, 4};
  int32_t slots32[4] = {3, 4, 5, 6};
  int32_t states[2] = {0, 1};
  const HostTensor wide(slots64, HS_DTYPE_INT64, {2});
  const HostTensor matrix(slots32, HS_DTYPE_INT32, {2, 2});
  const HostTensor good_slots(slots32, HS_DTYPE_INT32, {4});
  const HostTensor good_states(states, HS_DTYPE_INT32, {2});
  HostTensor cuda_states(states, HS_DTYPE_INT32, {2});
  cuda_states.tensor.device_type = HS_DEVICE_CUDA;
  HostTensor strided(slots32, HS_DTYPE_INT32, {2});
  const int64_t stride2[1] = {2};
  strided.tensor.strides = stride2;

  expect_error(hs_index_group_invalidate_sorted_slots(group.get(), wide.get(), good_states.get(), nullptr),
               HS_ERROR_INVALID_DTYPE, {"sorted_slots", "int32", "int64"});
  expect_error(hs_index_group_invalidate_sorted_slots(group.get(), matrix.get(), good_states.get(), nullptr),
               HS_ERROR_INVALID_ARGUMENT, {"sorted_slots", "1 dimension"});
  expect_error(hs_index_group_invalidate_sorted_slots(group.get(), strided.get(), good_states.get(), nullptr),
               HS_ERROR_INVALID_ARGUMENT, {"sorted_slots", "stride"});
  expect_error(hs_index_group_invalidate_sorted_slots(group.get(), good_slots.get(), cuda_states.get(), nullptr),
               HS_ERROR_INVALID_ARGUMENT, {"state_indices", "cpu", "cuda:0"});
  expect_error(hs_index_group_invalidate_sorted_slots(group.get(), good_slots.get(), nullptr, nullptr),
               HS_ERROR_INVALID_ARGUMENT, {"state_indices", "NULL"});
  EXPECT_EQ(group.values<int32_t>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES), std::vector<int32_t>(8, 3));
}

TEST(IndexGroupStats, CopyThenRead) {
  Group group(small_options());
  int64_t* stats = group.data<int64_t>(HS_INDEX_GROUP_STATS);
  for (int i = 0; i < HS_NUM_STATS; ++i) stats[i] = 10 * (i + 1);
  int64_t values[HS_NUM_STATS] = {};
  // Before the copy the mirror still holds the initial zeros.
  ASSERT_EQ(hs_index_group_read_stats(group.get(), values, HS_NUM_STATS), HS_SUCCESS);
  EXPECT_EQ(std::vector<int64_t>(values, values + HS_NUM_STATS), std::vector<int64_t>(HS_NUM_STATS, 0));
  ASSERT_EQ(hs_index_group_copy_stats_async(group.get(), nullptr), HS_SUCCESS) << hs_last_error();
  ASSERT_EQ(hs_index_group_read_stats(group.get(), values, HS_NUM_STATS), HS_SUCCESS);
  EXPECT_EQ(std::vector<int64_t>(values, values + HS_NUM_STATS), (std::vector<int64_t>{10, 20, 30, 40, 50}));
  int64_t two[2] = {-1, -1};
  ASSERT_EQ(hs_index_group_read_stats(group.get(), two, 2), HS_SUCCESS);
  EXPECT_EQ(two[0], 10);
  EXPECT_EQ(two[1], 20);
  expect_error(hs_index_group_read_stats(group.get(), values, HS_NUM_STATS + 1), HS_ERROR_INVALID_ARGUMENT, {"count"});
  expect_error(hs_index_group_read_stats(group.get(), nullptr, 1), HS_ERROR_INVALID_ARGUMENT, {"values"});
}

// One decode step's inputs for B requests, one token row each.
struct StepInputs {
  int32_t B, K, H, hot_block_size;
  std::vector<int32_t> topk, req_ids, state_rows, hot_table;
};

StepInputs make_step(int32_t B, int32_t K, int32_t H, uint32_t seed) {
  StepInputs in{B, K, H, 4, {}, {}, {}, {}};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> position(-1, 60);
  in.topk.resize(static_cast<size_t>(B) * K);
  for (int32_t& p : in.topk) p = position(rng);
  in.req_ids.resize(B);
  std::iota(in.req_ids.begin(), in.req_ids.end(), 0);
  in.state_rows.resize(B);
  for (int32_t b = 0; b < B; ++b) in.state_rows[b] = B - 1 - b;  // unsorted state rows
  const int32_t blocks = (H + in.hot_block_size - 1) / in.hot_block_size;
  in.hot_table.resize(static_cast<size_t>(B) * blocks);
  std::iota(in.hot_table.begin(), in.hot_table.end(), 1);
  return in;
}

TEST(IndexGroupResolve, EqualsResolveResidencyOnTheSameState) {
  const int32_t S = 4, H = 16, R = 6, K = 5, B = 3;
  const int64_t row_offset = 2;
  Group group(small_options(S, H, R, K));
  const int32_t blocks = (H + 3) / 4;

  // Plain buffers that mirror the group's state and outputs.
  std::vector<int32_t> dgi(S * H, -1);
  std::vector<int16_t> lru(S * H);
  for (int s = 0; s < S; ++s) std::iota(lru.begin() + s * H, lru.begin() + (s + 1) * H, int16_t{0});
  std::vector<int32_t> attention(B * K), hot_rows(B * K), resolved(B * K), miss(B * K), valid(B);
  std::vector<int32_t> swap_host(B * K, -1), swap_device(B * K, -1), swap_counts(B);
  std::vector<int64_t> stats(HS_NUM_STATS, 0);

  for (uint32_t step = 0; step < 4; ++step) {
    // Step 2 repeats step 1's positions: its hits exercise the state carried over.
    StepInputs in = make_step(B, K, H, step == 2 ? 1 : step);
    const HostTensor topk(in.topk.data(), HS_DTYPE_INT32, {B, K});
    const HostTensor req(in.req_ids.data(), HS_DTYPE_INT32, {B});
    const HostTensor rsi(in.state_rows.data(), HS_DTYPE_INT32, {B});
    const HostTensor hot(in.hot_table.data(), HS_DTYPE_INT32, {B, blocks});

    hs_index_group_resolve_args_t g;
    hs_index_group_resolve_args_init(&g);
    g.topk_indices = topk.get();
    g.req_id_per_token = req.get();
    g.request_state_indices = rsi.get();
    g.hot_block_table = hot.get();
    g.hot_block_size = 4;
    g.attention_block_stride = 0;  // = hot_block_size
    g.host_rows = 1000;
    g.row_offset = row_offset;
    ASSERT_EQ(hs_index_group_resolve(group.get(), &g, nullptr), HS_SUCCESS) << hs_last_error();

    const HostTensor dgi_t(dgi.data(), HS_DTYPE_INT32, {S, H});
    const HostTensor lru_t(lru.data(), HS_DTYPE_INT16, {S, H});
    const HostTensor att_t(attention.data(), HS_DTYPE_INT32, {B, K});
    const HostTensor rows_t(hot_rows.data(), HS_DTYPE_INT32, {B, K});
    const HostTensor res_t(resolved.data(), HS_DTYPE_INT32, {B, K});
    const HostTensor miss_t(miss.data(), HS_DTYPE_INT32, {B, K});
    const HostTensor valid_t(valid.data(), HS_DTYPE_INT32, {B});
    const HostTensor sh_t(swap_host.data(), HS_DTYPE_INT32, {B, K});
    const HostTensor sd_t(swap_device.data(), HS_DTYPE_INT32, {B, K});
    const HostTensor sc_t(swap_counts.data(), HS_DTYPE_INT32, {B});
    const HostTensor stats_t(stats.data(), HS_DTYPE_INT64, {HS_NUM_STATS});
    hs_resolve_residency_args_t r;
    hs_resolve_residency_args_init(&r);
    r.topk_indices = topk.get();
    r.req_id_per_token = req.get();
    r.request_state_indices = rsi.get();
    r.device_global_indices = dgi_t.get();
    r.lru_slots = lru_t.get();
    r.hot_block_table = hot.get();
    r.hot_block_size = 4;
    r.attention_block_stride = 4;
    r.host_rows = 1000;
    r.max_union_rows = K;
    r.out_attention = att_t.get();
    r.out_hot_rows = rows_t.get();
    r.out_resolved = res_t.get();
    r.out_miss_mask = miss_t.get();
    r.out_valid_counts = valid_t.get();
    r.out_swap_host_rows = sh_t.get();
    r.out_swap_device_rows = sd_t.get();
    r.out_swap_counts = sc_t.get();
    r.stats = stats_t.get();
    ASSERT_EQ(hs_resolve_residency(&r, nullptr), HS_SUCCESS) << hs_last_error();

    EXPECT_EQ(group.values<int32_t>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES), dgi) << "step " << step;
    EXPECT_EQ(group.values<int16_t>(HS_INDEX_GROUP_LRU_SLOTS), lru) << "step " << step;
    EXPECT_EQ(group.values<int64_t>(HS_INDEX_GROUP_STATS), stats) << "step " << step;
    auto rows = [&](hs_index_group_tensor_t which, int64_t width) {
      const std::vector<int32_t> all = group.values<int32_t>(which);
      return std::vector<int32_t>(all.begin() + row_offset * width, all.begin() + (row_offset + B) * width);
    };
    EXPECT_EQ(rows(HS_INDEX_GROUP_ATTENTION_INDICES, K), attention);
    EXPECT_EQ(rows(HS_INDEX_GROUP_HOT_ROWS, K), hot_rows);
    EXPECT_EQ(rows(HS_INDEX_GROUP_RESOLVED_SLOTS, K), resolved);
    EXPECT_EQ(rows(HS_INDEX_GROUP_MISS_MASK, K), miss);
    EXPECT_EQ(rows(HS_INDEX_GROUP_VALID_COUNTS, 1), valid);
    EXPECT_EQ(rows(HS_INDEX_GROUP_SWAP_COUNTS, 1), swap_counts);
    EXPECT_EQ(rows(HS_INDEX_GROUP_SWAP_HOST_ROWS, K), swap_host);
    EXPECT_EQ(rows(HS_INDEX_GROUP_SWAP_DEVICE_ROWS, K), swap_device);
  }
  // Rows outside [row_offset, row_offset + B) were never written.
  const std::vector<int32_t> attention_all = group.values<int32_t>(HS_INDEX_GROUP_ATTENTION_INDICES);
  EXPECT_EQ(std::vector<int32_t>(attention_all.begin(), attention_all.begin() + row_offset * K),
            std::vector<int32_t>(row_offset * K, -1));
  const std::vector<int64_t> final_stats = group.values<int64_t>(HS_INDEX_GROUP_STATS);
  EXPECT_GT(final_stats[HS_STAT_HITS], 0) << "the repeated step must hit";
  EXPECT_GT(final_stats[HS_STAT_MISSES], 0);
}

TEST(IndexGroupResolve, OutputOverridesAndBadArguments) {
  const int32_t S = 2, H = 8, R = 2, K = 3, B = 2;
  Group group(small_options(S, H, R, K));
  StepInputs in = make_step(B, K, H, 3);
  const HostTensor topk(in.topk.data(), HS_DTYPE_INT32, {B, K});
  const HostTensor req(in.req_ids.data(), HS_DTYPE_INT32, {B});
  const HostTensor rsi(in.state_rows.data(), HS_DTYPE_INT32, {B});
  const HostTensor hot(in.hot_table.data(), HS_DTYPE_INT32, {B, 2});
  std::vector<int32_t> own_attention(B * K, 99), own_valid(B, 99);
  const HostTensor own_att_t(own_attention.data(), HS_DTYPE_INT32, {B, K});
  const HostTensor own_valid_t(own_valid.data(), HS_DTYPE_INT32, {B});

  hs_index_group_resolve_args_t g;
  hs_index_group_resolve_args_init(&g);
  g.topk_indices = topk.get();
  g.req_id_per_token = req.get();
  g.request_state_indices = rsi.get();
  g.hot_block_table = hot.get();
  g.hot_block_size = 4;
  g.host_rows = 1000;

  auto expect_rejected = [&](hs_index_group_resolve_args_t args, hs_status_t status,
                             std::initializer_list<const char*> fragments) {
    const std::vector<int32_t> dgi_before = group.values<int32_t>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES);
    const std::vector<int16_t> lru_before = group.values<int16_t>(HS_INDEX_GROUP_LRU_SLOTS);
    expect_error(hs_index_group_resolve(group.get(), &args, nullptr), status, fragments);
    EXPECT_EQ(group.values<int32_t>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES), dgi_before);
    EXPECT_EQ(group.values<int16_t>(HS_INDEX_GROUP_LRU_SLOTS), lru_before);
  };
  hs_index_group_resolve_args_t bad = g;
  bad.row_offset = 1;  // rows [1, 3) do not fit R = 2
  expect_rejected(bad, HS_ERROR_INVALID_ARGUMENT, {"row_offset", "max_swap_rows"});
  bad = g;
  bad.row_offset = -1;
  expect_rejected(bad, HS_ERROR_INVALID_ARGUMENT, {"row_offset"});
  std::vector<int32_t> narrow(B * 2, 0);
  const HostTensor narrow_t(narrow.data(), HS_DTYPE_INT32, {B, 2});
  bad = g;
  bad.topk_indices = narrow_t.get();
  expect_rejected(bad, HS_ERROR_INVALID_ARGUMENT, {"topk_indices", "top_k"});
  bad = g;
  bad.hot_block_size = 0;
  expect_rejected(bad, HS_ERROR_INVALID_ARGUMENT, {"hot_block_size"});
  bad = g;
  bad.req_id_per_token = nullptr;
  expect_rejected(bad, HS_ERROR_INVALID_ARGUMENT, {"req_id_per_token"});
  bad = g;
  bad.struct_size = 16;
  expect_rejected(bad, HS_ERROR_INVALID_ARGUMENT, {"args", "struct_size"});

  hs_index_group_resolve_args_t with_outputs = g;
  with_outputs.out_attention = own_att_t.get();
  with_outputs.out_valid_counts = own_valid_t.get();
  ASSERT_EQ(hs_index_group_resolve(group.get(), &with_outputs, nullptr), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(group.values<int32_t>(HS_INDEX_GROUP_ATTENTION_INDICES), std::vector<int32_t>(R * K, -1))
      << "attention went to the caller's tensor";
  EXPECT_EQ(group.values<int32_t>(HS_INDEX_GROUP_VALID_COUNTS), std::vector<int32_t>(R, 0));
  EXPECT_NE(own_attention, std::vector<int32_t>(B * K, 99));
  EXPECT_NE(own_valid, std::vector<int32_t>(B, 99));
  const std::vector<int32_t> hot_rows = group.values<int32_t>(HS_INDEX_GROUP_HOT_ROWS);
  EXPECT_NE(hot_rows, std::vector<int32_t>(R * K, -1)) << "the other outputs still go to the group";
}

}  // namespace
