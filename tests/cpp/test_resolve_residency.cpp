// hs_resolve_residency through the C ABI on the CPU backend: hand-computed
// cases from docs/residency.md, and the status and message of bad arguments.
// The exhaustive semantic checks live in tests/python/test_resolve_residency.py.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hisparse/hisparse.hpp"

namespace {

// What outputs hold before a call; a value still there was left untouched.
constexpr int32_t kUntouched = -77;

using Rows = std::vector<std::vector<int32_t>>;

// One call's host buffers (row-major, contiguous) and scalars.
struct Problem {
  int64_t T, K, B, S, H;
  std::vector<int32_t> topk, req_id_per_token, request_state_indices, device_global_indices, hot_block_table;
  std::vector<int16_t> lru_slots;
  int64_t hot_blocks;  // columns of hot_block_table
  int64_t hot_block_size = 1, attention_block_stride = 1, host_rows = 1 << 20, max_union_rows;
  std::vector<int32_t> source_block_table;  // empty: absent
  int64_t source_width = 0, block_size = 0;
  std::vector<int32_t> attention, hot_rows, resolved, miss_mask, swap_host_rows, swap_device_rows;
  std::vector<int32_t> valid_counts, swap_counts;
  std::vector<int64_t> stats = std::vector<int64_t>(5, 0);

  // One request (batch row 0, state row 0) over all rows of `rows`, cold state, identity hot table.
  static Problem single_request(const Rows& rows, int64_t H) {
    Problem p;
    p.T = static_cast<int64_t>(rows.size());
    p.K = static_cast<int64_t>(rows[0].size());
    p.B = 1;
    p.S = 1;
    p.H = H;
    for (const auto& row : rows) p.topk.insert(p.topk.end(), row.begin(), row.end());
    p.req_id_per_token.assign(p.T, 0);
    p.request_state_indices = {0};
    p.device_global_indices.assign(H, -1);
    for (int64_t j = 0; j < H; ++j) p.lru_slots.push_back(static_cast<int16_t>(j));
    p.hot_blocks = H;
    for (int64_t j = 0; j < H; ++j) p.hot_block_table.push_back(static_cast<int32_t>(j));
    p.max_union_rows = H;
    p.reset_outputs();
    return p;
  }

  void reset_outputs() {
    for (auto* out : {&attention, &hot_rows, &resolved, &miss_mask, &swap_host_rows, &swap_device_rows}) {
      out->assign(T * K, kUntouched);
    }
    valid_counts.assign(T, kUntouched);
    swap_counts.assign(T, kUntouched);
  }

  void set_topk(const Rows& rows) {
    topk.clear();
    for (const auto& row : rows) topk.insert(topk.end(), row.begin(), row.end());
    reset_outputs();
  }

  // Row t of a [T, K] output.
  std::vector<int32_t> row(const std::vector<int32_t>& out, int64_t t) const {
    return std::vector<int32_t>(out.begin() + t * K, out.begin() + (t + 1) * K);
  }
};

// Descriptors of every tensor argument; tests replace one to make it wrong.
struct Descriptors {
  explicit Descriptors(Problem& p)
      : topk(p.topk.data(), HS_DTYPE_INT32, {p.T, p.K}),
        req_id_per_token(p.req_id_per_token.data(), HS_DTYPE_INT32, {p.T}),
        request_state_indices(p.request_state_indices.data(), HS_DTYPE_INT32, {p.B}),
        device_global_indices(p.device_global_indices.data(), HS_DTYPE_INT32, {p.S, p.H}),
        lru_slots(p.lru_slots.data(), HS_DTYPE_INT16, {p.S, p.H}),
        hot_block_table(p.hot_block_table.data(), HS_DTYPE_INT32, {p.B, p.hot_blocks}),
        out_attention(p.attention.data(), HS_DTYPE_INT32, {p.T, p.K}),
        out_hot_rows(p.hot_rows.data(), HS_DTYPE_INT32, {p.T, p.K}),
        out_resolved(p.resolved.data(), HS_DTYPE_INT32, {p.T, p.K}),
        out_miss_mask(p.miss_mask.data(), HS_DTYPE_INT32, {p.T, p.K}),
        out_valid_counts(p.valid_counts.data(), HS_DTYPE_INT32, {p.T}),
        out_swap_host_rows(p.swap_host_rows.data(), HS_DTYPE_INT32, {p.T, p.K}),
        out_swap_device_rows(p.swap_device_rows.data(), HS_DTYPE_INT32, {p.T, p.K}),
        out_swap_counts(p.swap_counts.data(), HS_DTYPE_INT32, {p.T}),
        source_block_table(p.source_block_table.data(), HS_DTYPE_INT32, {p.B, p.source_width}),
        stats(p.stats.data(), HS_DTYPE_INT64, {static_cast<int64_t>(p.stats.size())}),
        has_source(!p.source_block_table.empty()) {
    args.hot_block_size = p.hot_block_size;
    args.attention_block_stride = p.attention_block_stride;
    args.host_rows = p.host_rows;
    args.max_union_rows = p.max_union_rows;
    args.block_size = p.block_size;
  }

  hs::Tensor topk, req_id_per_token, request_state_indices, device_global_indices, lru_slots, hot_block_table,
      out_attention, out_hot_rows, out_resolved, out_miss_mask, out_valid_counts, out_swap_host_rows,
      out_swap_device_rows, out_swap_counts, source_block_table, stats;
  bool has_source;
  hs_resolve_residency_args_t args = make_args();

  static hs_resolve_residency_args_t make_args() {
    hs_resolve_residency_args_t a;
    hs_resolve_residency_args_init(&a);
    return a;
  }

  // The args struct pointing at the current descriptors.
  const hs_resolve_residency_args_t& bind() {
    args.topk_indices = topk;
    args.req_id_per_token = req_id_per_token;
    args.request_state_indices = request_state_indices;
    args.device_global_indices = device_global_indices;
    args.lru_slots = lru_slots;
    args.hot_block_table = hot_block_table;
    args.out_attention = out_attention;
    args.out_hot_rows = out_hot_rows;
    args.out_resolved = out_resolved;
    args.out_miss_mask = out_miss_mask;
    args.out_valid_counts = out_valid_counts;
    args.out_swap_host_rows = out_swap_host_rows;
    args.out_swap_device_rows = out_swap_device_rows;
    args.out_swap_counts = out_swap_counts;
    args.source_block_table = has_source ? source_block_table.get() : nullptr;
    args.stats = stats;
    return args;
  }

  hs_status_t call() { return hs_resolve_residency(&bind(), nullptr); }
};

hs_status_t resolve(Problem& p) {
  Descriptors d(p);
  return d.call();
}

using Int = std::vector<int32_t>;
using Int16 = std::vector<int16_t>;
using Int64 = std::vector<int64_t>;

TEST(ResolveResidency, ColdStartFillsSlotsInLruOrder) {
  Problem p = Problem::single_request({{7, 3, 9, 1}}, 8);
  ASSERT_EQ(resolve(p), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(p.hot_rows, (Int{0, 1, 2, 3}));
  EXPECT_EQ(p.attention, (Int{0, 1, 2, 3}));
  EXPECT_EQ(p.resolved, (Int{7, 3, 9, 1}));
  EXPECT_EQ(p.miss_mask, (Int{1, 1, 1, 1}));
  EXPECT_EQ(p.valid_counts, (Int{4}));
  EXPECT_EQ(p.swap_counts, (Int{4}));
  EXPECT_EQ(p.swap_host_rows, (Int{7, 3, 9, 1}));
  EXPECT_EQ(p.swap_device_rows, (Int{0, 1, 2, 3}));
  EXPECT_EQ(p.device_global_indices, (Int{7, 3, 9, 1, -1, -1, -1, -1}));
  EXPECT_EQ(p.lru_slots, (Int16{4, 5, 6, 7, 0, 1, 2, 3}));
  EXPECT_EQ(p.stats, (Int64{4, 0, 4, 0, 0}));
}

TEST(ResolveResidency, SameTopKAgainIsAFixedPoint) {
  Problem p = Problem::single_request({{7, 3, 9, 1}}, 8);
  ASSERT_EQ(resolve(p), HS_SUCCESS) << hs_last_error();
  const Int dgi = p.device_global_indices;
  const Int16 lru = p.lru_slots;
  p.reset_outputs();
  ASSERT_EQ(resolve(p), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(p.device_global_indices, dgi);
  EXPECT_EQ(p.lru_slots, lru);
  EXPECT_EQ(p.hot_rows, (Int{0, 1, 2, 3}));
  EXPECT_EQ(p.miss_mask, (Int{0, 0, 0, 0}));
  EXPECT_EQ(p.swap_counts, (Int{0}));
  EXPECT_EQ(p.swap_host_rows, Int(4, kUntouched));
  EXPECT_EQ(p.stats, (Int64{8, 4, 4, 0, 0}));
}

TEST(ResolveResidency, PartialOverlapEvictsOldestFirst) {
  Problem p = Problem::single_request({{10, 11, 12}}, 6);
  ASSERT_EQ(resolve(p), HS_SUCCESS) << hs_last_error();
  p.set_topk({{20, 21, 22}});
  ASSERT_EQ(resolve(p), HS_SUCCESS) << hs_last_error();
  ASSERT_EQ(p.lru_slots, (Int16{0, 1, 2, 3, 4, 5}));
  ASSERT_EQ(p.device_global_indices, (Int{10, 11, 12, 20, 21, 22}));

  // 11 (slot 1) and 22 (slot 5) hit; 30 evicts the oldest other slot, 0.
  p.set_topk({{22, 30, 11}});
  ASSERT_EQ(resolve(p), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(p.hot_rows, (Int{5, 0, 1}));
  EXPECT_EQ(p.miss_mask, (Int{0, 1, 0}));
  EXPECT_EQ(p.swap_host_rows, (Int{30, kUntouched, kUntouched}));
  EXPECT_EQ(p.swap_device_rows, (Int{0, kUntouched, kUntouched}));
  EXPECT_EQ(p.swap_counts, (Int{1}));
  EXPECT_EQ(p.device_global_indices, (Int{30, 11, 12, 20, 21, 22}));
  EXPECT_EQ(p.lru_slots, (Int16{2, 3, 4, 0, 1, 5}));

  // 12 (slot 2, the oldest) hits; 40 and 41 evict slots 3 and 4.
  p.set_topk({{40, 41, 12}});
  ASSERT_EQ(resolve(p), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(p.hot_rows, (Int{3, 4, 2}));
  EXPECT_EQ(p.device_global_indices, (Int{30, 11, 12, 40, 41, 22}));
  EXPECT_EQ(p.lru_slots, (Int16{0, 1, 5, 3, 4, 2}));
  EXPECT_EQ(p.stats, (Int64{12, 3, 9, 0, 0}));
}

TEST(ResolveResidency, PaddingRowWritesMinusOneAndLeavesState) {
  Problem p = Problem::single_request({{7, 9}, {30, 8}}, 4);
  p.B = 2;
  p.S = 2;
  p.req_id_per_token = {1, 0};
  p.request_state_indices = {-1, 0};  // batch row 0 (token row 1) is padding
  p.device_global_indices = {7, 8, -1, -1, 30, 31, 32, 33};
  p.lru_slots = {2, 3, 0, 1, 3, 1, 2, 0};
  p.hot_blocks = 4;
  p.hot_block_table = {0, 1, 2, 3, 0, 1, 2, 3};
  ASSERT_EQ(resolve(p), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(p.row(p.attention, 1), (Int{-1, -1}));
  EXPECT_EQ(p.row(p.hot_rows, 1), (Int{-1, -1}));
  EXPECT_EQ(p.row(p.resolved, 1), (Int{-1, -1}));
  EXPECT_EQ(p.row(p.miss_mask, 1), (Int{0, 0}));
  EXPECT_EQ(p.row(p.swap_host_rows, 1), (Int{kUntouched, kUntouched}));
  EXPECT_EQ(p.valid_counts, (Int{2, 0}));
  EXPECT_EQ(p.swap_counts, (Int{1, 0}));
  EXPECT_EQ(p.row(p.hot_rows, 0), (Int{0, 2}));
  EXPECT_EQ(p.device_global_indices, (Int{7, 8, 9, -1, 30, 31, 32, 33}));
  EXPECT_EQ(p.lru_slots, (Int16{3, 1, 2, 0, 3, 1, 2, 0}));
  EXPECT_EQ(p.stats, (Int64{2, 1, 1, 0, 0}));
}

TEST(ResolveResidency, InvalidEntriesAreCounted) {
  // block_size 4; blocks: 0 null, 1 -> 3, 2 -> -2, 3 -> 5.
  Problem p = Problem::single_request({{-1, 2, 5, 9, 13, 14, 17}}, 8);
  p.source_block_table = {0, 3, -2, 5};
  p.source_width = 4;
  p.block_size = 4;
  p.host_rows = 22;
  ASSERT_EQ(resolve(p), HS_SUCCESS) << hs_last_error();
  // 5 -> host row 13, 13 -> 21; 14 -> 22 >= host_rows; 17 is past the table.
  EXPECT_EQ(p.resolved, (Int{-1, -1, 13, -1, 21, -1, -1}));
  EXPECT_EQ(p.hot_rows, (Int{-1, -1, 0, -1, 1, -1, -1}));
  EXPECT_EQ(p.miss_mask, (Int{0, 0, 1, 0, 1, 0, 0}));
  EXPECT_EQ(p.valid_counts, (Int{2}));
  EXPECT_EQ(p.stats, (Int64{7, 0, 2, 0, 5}));
}

TEST(ResolveResidency, CountersAccumulateAndSpareEntriesStayPut) {
  Problem p = Problem::single_request({{1, 2, -1}}, 4);
  p.stats = {100, 200, 300, 400, 500, 42};
  ASSERT_EQ(resolve(p), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(p.stats, (Int64{103, 200, 302, 400, 501, 42}));
  p.set_topk({{2, 3, 3}});
  ASSERT_EQ(resolve(p), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(p.stats, (Int64{106, 201, 303, 400, 501, 42}));
}

// ------------------------------------------------------------------ bad arguments

class ResolveResidencyErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    p = Problem::single_request({{1, 2, 3}, {4, 5, 6}}, 8);
    p.source_block_table = {1, 2};
    p.source_width = 2;
    p.block_size = 4;
    dgi_before = p.device_global_indices;
    lru_before = p.lru_slots;
  }

  // Expects `status` and a message naming `name`, and untouched state.
  void expect_rejected(hs_status_t status, hs_status_t expected, const std::string& name) {
    EXPECT_EQ(status, expected) << hs_status_string(status);
    const std::string message = hs_last_error();
    EXPECT_NE(message.find(name), std::string::npos) << "message: " << message;
    EXPECT_EQ(p.device_global_indices, dgi_before);
    EXPECT_EQ(p.lru_slots, lru_before);
    EXPECT_EQ(p.stats, (Int64{0, 0, 0, 0, 0}));
    EXPECT_EQ(p.attention, Int(p.T * p.K, kUntouched));
  }

  Problem p;
  Int dgi_before;
  Int16 lru_before;
};

// The members of Descriptors that are tensor arguments, with their names.
struct TensorMember {
  hs::Tensor Descriptors::* member;
  const char* name;
  hs_dtype_t wrong_dtype;
};

const std::vector<TensorMember>& tensor_members() {
  static const std::vector<TensorMember> members = {
      {&Descriptors::topk, "topk_indices", HS_DTYPE_INT64},
      {&Descriptors::req_id_per_token, "req_id_per_token", HS_DTYPE_INT64},
      {&Descriptors::request_state_indices, "request_state_indices", HS_DTYPE_INT16},
      {&Descriptors::device_global_indices, "device_global_indices", HS_DTYPE_FLOAT32},
      {&Descriptors::lru_slots, "lru_slots", HS_DTYPE_INT32},
      {&Descriptors::hot_block_table, "hot_block_table", HS_DTYPE_INT64},
      {&Descriptors::out_attention, "out_attention", HS_DTYPE_INT64},
      {&Descriptors::out_hot_rows, "out_hot_rows", HS_DTYPE_UINT8},
      {&Descriptors::out_resolved, "out_resolved", HS_DTYPE_INT64},
      {&Descriptors::out_miss_mask, "out_miss_mask", HS_DTYPE_BOOL},
      {&Descriptors::out_valid_counts, "out_valid_counts", HS_DTYPE_INT64},
      {&Descriptors::out_swap_host_rows, "out_swap_host_rows", HS_DTYPE_INT64},
      {&Descriptors::out_swap_device_rows, "out_swap_device_rows", HS_DTYPE_INT64},
      {&Descriptors::out_swap_counts, "out_swap_counts", HS_DTYPE_INT64},
      {&Descriptors::source_block_table, "source_block_table", HS_DTYPE_INT64},
      {&Descriptors::stats, "stats", HS_DTYPE_INT32},
  };
  return members;
}

TEST_F(ResolveResidencyErrors, ValidCallSucceeds) {
  ASSERT_EQ(resolve(p), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(p.valid_counts, (Int{3, 3}));
}

TEST_F(ResolveResidencyErrors, NullArgsStruct) {
  expect_rejected(hs_resolve_residency(nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT, "args");
}

TEST_F(ResolveResidencyErrors, StructSizeTooSmall) {
  Descriptors d(p);
  hs_resolve_residency_args_t args = d.bind();
  args.struct_size = offsetof(hs_resolve_residency_args_t, stats);
  expect_rejected(hs_resolve_residency(&args, nullptr), HS_ERROR_INVALID_ARGUMENT, "struct_size");
  args.struct_size = 0;
  expect_rejected(hs_resolve_residency(&args, nullptr), HS_ERROR_INVALID_ARGUMENT, "struct_size");
}

TEST_F(ResolveResidencyErrors, NullRequiredTensor) {
  const std::vector<std::pair<const hs_tensor_t * hs_resolve_residency_args_t::*, const char*>> required = {
      {&hs_resolve_residency_args_t::topk_indices, "topk_indices"},
      {&hs_resolve_residency_args_t::req_id_per_token, "req_id_per_token"},
      {&hs_resolve_residency_args_t::request_state_indices, "request_state_indices"},
      {&hs_resolve_residency_args_t::device_global_indices, "device_global_indices"},
      {&hs_resolve_residency_args_t::lru_slots, "lru_slots"},
      {&hs_resolve_residency_args_t::hot_block_table, "hot_block_table"},
      {&hs_resolve_residency_args_t::out_attention, "out_attention"},
      {&hs_resolve_residency_args_t::out_hot_rows, "out_hot_rows"},
      {&hs_resolve_residency_args_t::out_resolved, "out_resolved"},
      {&hs_resolve_residency_args_t::out_miss_mask, "out_miss_mask"},
      {&hs_resolve_residency_args_t::out_valid_counts, "out_valid_counts"},
      {&hs_resolve_residency_args_t::out_swap_host_rows, "out_swap_host_rows"},
      {&hs_resolve_residency_args_t::out_swap_device_rows, "out_swap_device_rows"},
      {&hs_resolve_residency_args_t::out_swap_counts, "out_swap_counts"},
  };
  for (const auto& [field, name] : required) {
    SCOPED_TRACE(name);
    Descriptors d(p);
    hs_resolve_residency_args_t args = d.bind();
    args.*field = nullptr;
    expect_rejected(hs_resolve_residency(&args, nullptr), HS_ERROR_INVALID_ARGUMENT, name);
  }
}

TEST_F(ResolveResidencyErrors, NullDataPointer) {
  Descriptors d(p);
  d.lru_slots = hs::Tensor(nullptr, HS_DTYPE_INT16, {p.S, p.H});
  expect_rejected(d.call(), HS_ERROR_INVALID_ARGUMENT, "lru_slots");
}

TEST_F(ResolveResidencyErrors, WrongDtype) {
  for (const TensorMember& m : tensor_members()) {
    SCOPED_TRACE(m.name);
    Descriptors d(p);
    hs::Tensor& tensor = d.*m.member;
    const hs_tensor_t raw = *tensor.get();
    if (raw.ndim == 1) {
      tensor = hs::Tensor(raw.data, m.wrong_dtype, {raw.shape[0]});
    } else {
      tensor = hs::Tensor(raw.data, m.wrong_dtype, {raw.shape[0], raw.shape[1]});
    }
    expect_rejected(d.call(), HS_ERROR_INVALID_DTYPE, m.name);
  }
}

TEST_F(ResolveResidencyErrors, UnknownDtypeCode) {
  Descriptors d(p);
  d.topk = hs::Tensor(p.topk.data(), static_cast<hs_dtype_t>(99), {p.T, p.K});
  expect_rejected(d.call(), HS_ERROR_INVALID_DTYPE, "topk_indices");
}

TEST_F(ResolveResidencyErrors, WrongRank) {
  for (const TensorMember& m : tensor_members()) {
    SCOPED_TRACE(m.name);
    Descriptors d(p);
    hs::Tensor& tensor = d.*m.member;
    const hs_tensor_t raw = *tensor.get();
    if (raw.ndim == 1) {
      tensor = hs::Tensor(raw.data, raw.dtype, {1, raw.shape[0]});
    } else {
      tensor = hs::Tensor(raw.data, raw.dtype, {raw.shape[0] * raw.shape[1]});
    }
    expect_rejected(d.call(), HS_ERROR_INVALID_ARGUMENT, m.name);
  }
}

TEST_F(ResolveResidencyErrors, WrongSizes) {
  struct Case {
    hs::Tensor Descriptors::* member;
    const char* name;
    std::vector<int64_t> shape;
  };
  // T = 2, K = 3, B = 1, S = 1, H = 8, hot blocks of 1 row.
  const std::vector<Case> cases = {
      {&Descriptors::topk, "topk_indices", {2, 0}},
      {&Descriptors::req_id_per_token, "req_id_per_token", {1}},
      {&Descriptors::device_global_indices, "device_global_indices", {1, 0}},
      {&Descriptors::lru_slots, "lru_slots", {1, 7}},
      {&Descriptors::lru_slots, "lru_slots", {2, 4}},
      {&Descriptors::hot_block_table, "hot_block_table", {1, 7}},
      {&Descriptors::hot_block_table, "hot_block_table", {0, 8}},
      {&Descriptors::out_attention, "out_attention", {1, 3}},
      {&Descriptors::out_hot_rows, "out_hot_rows", {2, 2}},
      {&Descriptors::out_resolved, "out_resolved", {2, 4}},
      {&Descriptors::out_miss_mask, "out_miss_mask", {1, 3}},
      {&Descriptors::out_valid_counts, "out_valid_counts", {1}},
      {&Descriptors::out_swap_host_rows, "out_swap_host_rows", {2, 1}},
      {&Descriptors::out_swap_device_rows, "out_swap_device_rows", {1, 3}},
      {&Descriptors::out_swap_counts, "out_swap_counts", {0}},
      {&Descriptors::source_block_table, "source_block_table", {0, 2}},
      {&Descriptors::stats, "stats", {4}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Descriptors d(p);
    hs::Tensor& tensor = d.*c.member;
    const hs_tensor_t raw = *tensor.get();
    tensor = c.shape.size() == 1 ? hs::Tensor(raw.data, raw.dtype, {c.shape[0]})
                                 : hs::Tensor(raw.data, raw.dtype, {c.shape[0], c.shape[1]});
    expect_rejected(d.call(), HS_ERROR_INVALID_ARGUMENT, c.name);
  }
}

TEST_F(ResolveResidencyErrors, WrongStrides) {
  for (const TensorMember& m : tensor_members()) {
    // One element (B = 1): any stride reads the same element, so it is accepted.
    if (m.member == &Descriptors::request_state_indices) continue;
    SCOPED_TRACE(m.name);
    Descriptors d(p);
    hs::Tensor& tensor = d.*m.member;
    const hs_tensor_t raw = *tensor.get();
    if (raw.ndim == 1) {
      tensor = hs::Tensor(raw.data, raw.dtype, {raw.shape[0]}).strides({2});
    } else {
      tensor = hs::Tensor(raw.data, raw.dtype, {raw.shape[0], raw.shape[1]}).strides({raw.shape[1], 2});
    }
    expect_rejected(d.call(), HS_ERROR_INVALID_ARGUMENT, m.name);
  }
}

TEST_F(ResolveResidencyErrors, TensorOnAnotherDevice) {
  for (const TensorMember& m : tensor_members()) {
    if (m.member == &Descriptors::topk) continue;  // topk_indices picks the device
    SCOPED_TRACE(m.name);
    Descriptors d(p);
    hs::Tensor& tensor = d.*m.member;
    const hs_tensor_t raw = *tensor.get();
    // Only the descriptor claims CUDA memory: validation fails before any access.
    tensor = raw.ndim == 1 ? hs::Tensor(raw.data, raw.dtype, {raw.shape[0]}, HS_DEVICE_CUDA, 0)
                           : hs::Tensor(raw.data, raw.dtype, {raw.shape[0], raw.shape[1]}, HS_DEVICE_CUDA, 0);
    expect_rejected(d.call(), HS_ERROR_INVALID_ARGUMENT, m.name);
  }
}

TEST_F(ResolveResidencyErrors, BadScalars) {
  struct Case {
    int64_t hs_resolve_residency_args_t::* field;
    int64_t value;
    const char* name;
  };
  const std::vector<Case> cases = {
      {&hs_resolve_residency_args_t::hot_block_size, 0, "hot_block_size"},
      {&hs_resolve_residency_args_t::hot_block_size, -1, "hot_block_size"},
      {&hs_resolve_residency_args_t::attention_block_stride, 0, "attention_block_stride"},
      {&hs_resolve_residency_args_t::host_rows, -1, "host_rows"},
      {&hs_resolve_residency_args_t::host_rows, int64_t{1} << 31, "host_rows"},
      {&hs_resolve_residency_args_t::max_union_rows, 0, "max_union_rows"},
      {&hs_resolve_residency_args_t::max_union_rows, 9, "max_union_rows"},
      {&hs_resolve_residency_args_t::block_size, 0, "block_size"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Descriptors d(p);
    hs_resolve_residency_args_t args = d.bind();
    args.*c.field = c.value;
    expect_rejected(hs_resolve_residency(&args, nullptr), HS_ERROR_INVALID_ARGUMENT, c.name);
  }
}

TEST_F(ResolveResidencyErrors, ResidentBlockSizeMustMatchHotBlockSize) {
  Int resident = {0, 0};
  Descriptors d(p);
  const hs::Tensor resident_table(resident.data(), HS_DTYPE_INT32, {1, 2});
  hs_resolve_residency_args_t args = d.bind();
  args.resident_block_table = resident_table;
  args.resident_block_size = 4;  // hot_block_size is 1
  expect_rejected(hs_resolve_residency(&args, nullptr), HS_ERROR_INVALID_ARGUMENT, "resident_block_size");
  args.resident_block_size = 1;
  ASSERT_EQ(hs_resolve_residency(&args, nullptr), HS_SUCCESS) << hs_last_error();
}

TEST_F(ResolveResidencyErrors, CppWrapperThrowsWithStatus) {
  Descriptors d(p);
  hs_resolve_residency_args_t args = d.bind();
  args.max_union_rows = 0;
  try {
    hs::resolve_residency(args);
    FAIL() << "expected hs::Error";
  } catch (const hs::Error& error) {
    EXPECT_EQ(error.status(), HS_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(error.what()).find("max_union_rows"), std::string::npos) << error.what();
  }
  EXPECT_EQ(p.device_global_indices, dgi_before);
}

}  // namespace
