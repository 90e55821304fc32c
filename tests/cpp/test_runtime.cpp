// The runtime on the CPU backend through its C ABI (and the RAII layer of
// hisparse.hpp): a leader and a follower sharing one slab, binding checks
// that name the argument, swap_in with and without prefetch against the
// host rows, the misuse statuses, step-row capacity, stats, mirror, the
// slot invalidator, the leader's fused gather (with the earlier layouts of
// the swap_in and index-group resolve args), and the opt-in group gather of
// followers from a token-major host layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "expect_status.hpp"
#include "hisparse/hisparse.hpp"

namespace {

constexpr int32_t kTopK = 4;
constexpr int32_t kHot = 16;        // H
constexpr int32_t kRowBytes = 32;
constexpr int32_t kBlock = 4;       // hot and source block size
constexpr int32_t kReqs = 2;        // S
constexpr int32_t kSwapRows = 4;    // R
constexpr int64_t kHostRows = 64;
constexpr int64_t kBlocksPerReq = kHot / kBlock;
constexpr int64_t kSlabBlocks = kReqs * kBlocksPerReq + 1;  // block 0 unused
constexpr int64_t kLayers = 2;
// Two layers interleaved block by block in one slab.
constexpr int64_t kBlockBytes = kBlock * kRowBytes;
constexpr int64_t kBlockStride = kLayers * kBlockBytes;

hs_config_t small_config() {
  hs_config_t c;
  hs_config_init(&c);
  c.top_k = kTopK;
  c.device_buffer_size = kHot;
  c.max_union_rows = 8;
  c.row_bytes = kRowBytes;
  c.block_size = kBlock;
  c.hot_block_size = kBlock;
  return c;
}

struct Fixture {
  hs_config_t config = small_config();
  std::vector<std::vector<uint8_t>> host;  // per layer [kHostRows, kRowBytes]
  std::vector<uint8_t> slab;
  std::vector<int32_t> block_table;
  std::vector<int64_t> host_shape{kHostRows, kRowBytes};
  std::vector<int64_t> slab_shape;
  std::vector<int64_t> table_shape{kReqs, kBlocksPerReq};
  std::vector<hs_tensor_t> host_tensors;
  hs_tensor_t slab_tensor{};
  hs_tensor_t table_tensor{};

  Fixture() {
    std::mt19937 gen(7);
    host.resize(kLayers);
    for (auto& layer : host) {
      layer.resize(kHostRows * kRowBytes);
      for (auto& byte : layer) byte = static_cast<uint8_t>(gen());
    }
    slab.assign(static_cast<size_t>(kSlabBlocks * kBlockStride), 0);
    slab_shape = {static_cast<int64_t>(slab.size())};
    block_table.resize(kReqs * kBlocksPerReq);
    std::iota(block_table.begin(), block_table.end(), 1);
    for (auto& layer : host) {
      host_tensors.push_back(
          hs_tensor_t{layer.data(), HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 2, host_shape.data(), nullptr});
    }
    slab_tensor = hs_tensor_t{slab.data(), HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 1, slab_shape.data(), nullptr};
    table_tensor = hs_tensor_t{block_table.data(), HS_DTYPE_INT32, HS_DEVICE_CPU, 0, 2, table_shape.data(), nullptr};
  }

  hs_runtime_options_t options() const {
    hs_runtime_options_t o;
    hs_runtime_options_init(&o);
    o.config = &config;
    o.max_num_reqs = kReqs;
    o.max_swap_rows = kSwapRows;
    return o;
  }

  void bind(hs::Runtime& runtime, int layer) {
    runtime.bind_source_cache(&host_tensors[layer]);
    runtime.bind_hot_cache(&slab_tensor, layer * kBlockBytes, kBlockStride, kSlabBlocks, kBlock, &table_tensor);
  }

  // Bytes of layer `layer`'s hot row at attention index `index`.
  const uint8_t* hot_row(int layer, int32_t index) const {
    const int64_t stride_rows = kBlockStride / kRowBytes;
    const int64_t block = index / stride_rows;
    const int64_t offset = index % stride_rows;
    return slab.data() + layer * kBlockBytes + block * kBlockStride + offset * kRowBytes;
  }
};

// One decode step: every request selects kTopK host slots.
struct Step {
  std::vector<int32_t> topk;
  std::vector<int32_t> req_ids{0, 1};
  std::vector<int32_t> state_rows{0, 1};
  std::vector<int64_t> topk_shape{kReqs, kTopK};
  std::vector<int64_t> vector_shape{kReqs};
  hs_tensor_t topk_tensor{}, req_tensor{}, state_tensor{};

  explicit Step(std::vector<int32_t> positions) : topk(std::move(positions)) {
    topk_tensor = hs_tensor_t{topk.data(), HS_DTYPE_INT32, HS_DEVICE_CPU, 0, 2, topk_shape.data(), nullptr};
    req_tensor = hs_tensor_t{req_ids.data(), HS_DTYPE_INT32, HS_DEVICE_CPU, 0, 1, vector_shape.data(), nullptr};
    state_tensor = hs_tensor_t{state_rows.data(), HS_DTYPE_INT32, HS_DEVICE_CPU, 0, 1, vector_shape.data(), nullptr};
  }
  hs_runtime_swap_in_args_t args(bool prefetch) const {
    hs_runtime_swap_in_args_t a;
    hs_runtime_swap_in_args_init(&a);
    a.topk_indices = &topk_tensor;
    a.req_id_per_token = &req_tensor;
    a.request_state_indices = &state_tensor;
    a.prefetch = prefetch ? 1 : 0;
    return a;
  }
  // A follower's arguments: the step's token rows, no top-k (it reuses its leader's).
  hs_runtime_swap_in_args_t follower_args() const {
    hs_runtime_swap_in_args_t a;
    hs_runtime_swap_in_args_init(&a);
    a.num_tokens = kReqs;
    return a;
  }
};

// Every attention-visible entry of rows [first, first + count) shows, in
// layer `layer`'s hot cache, the host row it stands for.
void expect_rows_match(const Fixture& f, const hs::Runtime& runtime, int layer, int64_t first, int64_t count) {
  const hs_tensor_t attention = runtime.group_tensor(HS_INDEX_GROUP_ATTENTION_INDICES);
  const hs_tensor_t resolved = runtime.group_tensor(HS_INDEX_GROUP_RESOLVED_SLOTS);
  const auto* att = static_cast<const int32_t*>(attention.data);
  const auto* slots = static_cast<const int32_t*>(resolved.data);
  int checked = 0;
  for (int64_t t = first; t < first + count; ++t) {
    for (int k = 0; k < kTopK; ++k) {
      const int32_t index = att[t * kTopK + k];
      if (index < 0) continue;
      const int32_t slot = slots[t * kTopK + k];
      ASSERT_GE(slot, 0);
      EXPECT_EQ(0, std::memcmp(f.hot_row(layer, index), f.host[layer].data() + slot * kRowBytes, kRowBytes))
          << "layer " << layer << " row " << t << " entry " << k;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(Runtime, LeaderAndFollowerShareOneGroup) {
  Fixture f;
  hs::Runtime leader(f.options());
  hs::Runtime follower = hs::Runtime::follower(leader, f.options());
  EXPECT_EQ(leader.index_group(), follower.index_group());
  const hs_runtime_info_t info = follower.info();
  EXPECT_EQ(info.is_leader, 0);
  EXPECT_EQ(leader.info().is_leader, 1);
  EXPECT_EQ(info.group_size, 2);
  EXPECT_EQ(info.group_row_bytes, 2u * kRowBytes);
  EXPECT_EQ(info.max_swap_rows, kSwapRows);
  EXPECT_EQ(info.row_width, kRowBytes);
  EXPECT_EQ(info.source_bound, 0);

  // A follower of a follower, or one with different group sizes, is refused.
  hs_runtime_options_t o = f.options();
  o.leader = follower.get();
  hs_runtime_t bad = nullptr;
  expect_error(hs_runtime_create(&o, &bad), HS_ERROR_INVALID_ARGUMENT, {"leader", "follower"});
  EXPECT_EQ(bad, nullptr);
  hs_config_t other = f.config;
  other.device_buffer_size = 32;
  o = f.options();
  o.config = &other;
  o.leader = leader.get();
  expect_error(hs_runtime_create(&o, &bad), HS_ERROR_INVALID_ARGUMENT, {"device_buffer_size", "16", "32"});
  o = f.options();
  o.kv_dtype = HS_DTYPE_FLOAT64;
  other = f.config;
  other.row_bytes = 48;
  other.hot_block_size = kBlock;
  o.config = &other;
  hs_runtime_t ok = nullptr;
  ASSERT_EQ(hs_runtime_create(&o, &ok), HS_SUCCESS) << hs_last_error();  // 48 B = 6 float64
  EXPECT_EQ(hs::Runtime::follower(leader, f.options()).info().group_size, 3);
  hs_runtime_destroy(ok);
  o.kv_dtype = 99;
  expect_error(hs_runtime_create(&o, &bad), HS_ERROR_INVALID_DTYPE, {"kv_dtype"});

  // The residency hint is a leader's choice among OFF, ON and AUTO; a
  // follower may only leave it to the leader.
  o = f.options();
  o.residency_hint = 3;
  expect_error(hs_runtime_create(&o, &bad), HS_ERROR_INVALID_ARGUMENT,
               {"residency_hint", "HS_RESIDENCY_HINT_OFF (0)", "HS_RESIDENCY_HINT_AUTO (2)", "got 3"});
  o.leader = leader.get();
  o.residency_hint = HS_RESIDENCY_HINT_ON;
  expect_error(hs_runtime_create(&o, &bad), HS_ERROR_INVALID_ARGUMENT, {"residency_hint", "leader"});
  EXPECT_EQ(bad, nullptr);
  for (const int32_t choice : {HS_RESIDENCY_HINT_OFF, HS_RESIDENCY_HINT_AUTO}) {
    o.residency_hint = choice;
    ASSERT_EQ(hs_runtime_create(&o, &ok), HS_SUCCESS) << hs_last_error();
    hs_runtime_destroy(ok);
  }
  o = f.options();
  o.residency_hint = HS_RESIDENCY_HINT_ON;
  ASSERT_EQ(hs_runtime_create(&o, &ok), HS_SUCCESS) << hs_last_error();
  hs_runtime_destroy(ok);
}

// AUTO (the default) keeps a hint only where a CUDA resolve reads one: never
// on the CPU; ON and OFF are kept as given, and followers report their
// leader's.
TEST(Runtime, ResidencyHintChoice) {
  Fixture f;
  hs_runtime_options_t o = f.options();
  EXPECT_EQ(o.residency_hint, HS_RESIDENCY_HINT_AUTO);
  EXPECT_FALSE(hs::Runtime::default_residency_hint(o));
  for (const int32_t choice : {HS_RESIDENCY_HINT_OFF, HS_RESIDENCY_HINT_ON, HS_RESIDENCY_HINT_AUTO}) {
    o.residency_hint = choice;
    hs::Runtime leader(o);
    hs_runtime_options_t joining = f.options();
    hs::Runtime follower = hs::Runtime::follower(leader, joining);
    const int32_t kept = choice == HS_RESIDENCY_HINT_ON ? 1 : 0;
    EXPECT_EQ(leader.info().residency_hint, kept) << "choice " << choice;
    EXPECT_EQ(follower.info().residency_hint, kept) << "choice " << choice;
  }

  int32_t keeps = -1;
  expect_error(hs_runtime_default_residency_hint(&f.config, 4, HS_DEVICE_CPU, 0, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"keeps"});
  expect_error(hs_runtime_default_residency_hint(&f.config, 0, HS_DEVICE_CPU, 0, &keeps), HS_ERROR_INVALID_ARGUMENT,
               {"max_num_reqs", "got 0"});
  expect_error(hs_runtime_default_residency_hint(nullptr, 4, HS_DEVICE_CPU, 0, &keeps), HS_ERROR_INVALID_ARGUMENT,
               {"config"});
  expect_error(hs_runtime_default_residency_hint(&f.config, 4, 7, 0, &keeps), HS_ERROR_INVALID_ARGUMENT,
               {"device_type", "got 7"});
  hs_config_t wrong = f.config;
  wrong.top_k = 0;
  expect_error(hs_runtime_default_residency_hint(&wrong, 4, HS_DEVICE_CPU, 0, &keeps), HS_ERROR_INVALID_ARGUMENT,
               {"top_k"});
  EXPECT_EQ(keeps, -1) << "a refused call writes nothing";
  ASSERT_EQ(hs_runtime_default_residency_hint(&f.config, 4, HS_DEVICE_CPU, 0, &keeps), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(keeps, 0);
}

// hs_paged_cache_view computes the view bind_hot_cache binds: the same data
// pointer, shape and strides as hs_runtime_get_hot_cache, and the same errors.
TEST(Runtime, PagedCacheViewIsTheBoundHotView) {
  Fixture f;
  hs::Runtime leader(f.options());
  f.bind(leader, 1);
  const hs_tensor_t hot = leader.hot_cache();
  hs_paged_view_t view{};
  view.struct_size = sizeof(view);
  ASSERT_EQ(hs_paged_cache_view(&f.slab_tensor, HS_DTYPE_UINT8, kRowBytes, kBlockBytes, kBlockStride, kSlabBlocks,
                                kBlock, &view),
            HS_SUCCESS)
      << hs_last_error();
  EXPECT_EQ(view.struct_version, static_cast<uint32_t>(HS_PAGED_VIEW_VERSION));
  EXPECT_EQ(view.data, hot.data);
  EXPECT_EQ(view.data, f.slab.data() + kBlockBytes);
  ASSERT_EQ(hot.ndim, 3);
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(view.shape[d], hot.shape[d]) << d;
    EXPECT_EQ(view.strides[d], hot.strides[d]) << d;
  }
  EXPECT_EQ(view.strides[0], kBlockStride);
  // As int16 elements: the row is half as wide, the strides count elements.
  ASSERT_EQ(
      hs_paged_cache_view(&f.slab_tensor, HS_DTYPE_INT16, kRowBytes / 2, 0, kBlockStride, kSlabBlocks, kBlock, &view),
      HS_SUCCESS)
      << hs_last_error();
  EXPECT_EQ(view.shape[2], kRowBytes / 2);
  EXPECT_EQ(view.strides[0], kBlockStride / 2);

  auto refused = [&](int64_t offset, int64_t stride, int64_t blocks, int64_t rows, int32_t dtype,
                     std::initializer_list<const char*> fragments) {
    expect_error(hs_paged_cache_view(&f.slab_tensor, dtype, kRowBytes, offset, stride, blocks, rows, &view),
                 dtype == HS_DTYPE_UINT8 ? HS_ERROR_INVALID_ARGUMENT : HS_ERROR_INVALID_DTYPE, fragments);
  };
  refused(0, kBlockStride, kSlabBlocks + 1, kBlock, HS_DTYPE_UINT8, {"raw_tensor", "too small"});
  refused(8, kBlockStride, kSlabBlocks, kBlock, HS_DTYPE_UINT8, {"byte_offset", "16"});
  refused(0, kBlockStride + 16, kSlabBlocks, kBlock, HS_DTYPE_UINT8, {"block_stride", "multiple"});
  refused(0, kBlockStride, 0, kBlock, HS_DTYPE_UINT8, {"num_blocks"});
  refused(0, kBlockStride, kSlabBlocks, 0, HS_DTYPE_UINT8, {"block_size"});
  refused(0, kBlockStride, kSlabBlocks, kBlock, 99, {"dtype"});
  expect_error(hs_paged_cache_view(&f.slab_tensor, HS_DTYPE_UINT8, 0, 0, kBlockStride, kSlabBlocks, kBlock, &view),
               HS_ERROR_INVALID_ARGUMENT, {"row_width"});
  expect_error(hs_paged_cache_view(nullptr, HS_DTYPE_UINT8, kRowBytes, 0, kBlockStride, kSlabBlocks, kBlock, &view),
               HS_ERROR_INVALID_ARGUMENT, {"raw_tensor"});
  view.struct_size = 8;
  expect_error(
      hs_paged_cache_view(&f.slab_tensor, HS_DTYPE_UINT8, kRowBytes, 0, kBlockStride, kSlabBlocks, kBlock, &view),
      HS_ERROR_INVALID_ARGUMENT, {"view", "struct_size"});
}

// max_swap_rows 0 is the library's default: max_num_reqs x (1 + the config's
// num_speculative_tokens) on a leader, the leader's on a follower.
TEST(Runtime, SwapRowsDefaultFollowsTheSpeculativeTokens) {
  Fixture f;
  f.config.num_speculative_tokens = 2;
  f.config.max_union_rows = 0;  // top_k x 3 = 12 <= H = 16
  hs_runtime_options_t o = f.options();
  o.max_swap_rows = 0;
  hs::Runtime leader(o);
  int32_t expected = 0;
  ASSERT_EQ(hs_default_max_swap_rows(kReqs, 2, &expected), HS_SUCCESS);
  EXPECT_EQ(expected, kReqs * 3);
  EXPECT_EQ(leader.info().max_swap_rows, expected);
  EXPECT_EQ(leader.info().max_union_rows, kTopK * 3);
  EXPECT_EQ(leader.info().num_speculative_tokens, 2);
  hs_config_t plain = f.config;
  plain.num_speculative_tokens = 0;
  plain.max_union_rows = kTopK * 3;
  hs_runtime_options_t fo = f.options();
  fo.config = &plain;
  fo.max_swap_rows = 0;
  EXPECT_EQ(hs::Runtime::follower(leader, fo).info().max_swap_rows, expected) << "a follower takes its leader's";
}

TEST(Runtime, BindingChecksNameTheArgument) {
  Fixture f;
  hs::Runtime leader(f.options());
  hs_runtime_t r = leader.get();

  std::vector<int64_t> wide{kHostRows / 2, kRowBytes * 2};
  hs_tensor_t wrong_width{f.host[0].data(), HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 2, wide.data(), nullptr};
  expect_error(hs_runtime_bind_source_cache(r, &wrong_width, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"host_cache", "mismatched layout", "32"});
  std::vector<int64_t> as_int32{kHostRows, kRowBytes / 4};
  hs_tensor_t wrong_dtype{f.host[0].data(), HS_DTYPE_INT32, HS_DEVICE_CPU, 0, 2, as_int32.data(), nullptr};
  expect_error(hs_runtime_bind_source_cache(r, &wrong_dtype, nullptr), HS_ERROR_INVALID_DTYPE,
               {"host_cache", "uint8", "int32"});
  hs_tensor_t on_gpu = f.host_tensors[0];
  on_gpu.device_type = HS_DEVICE_CUDA;
  expect_error(hs_runtime_bind_source_cache(r, &on_gpu, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"host_cache", "host-resident", "cuda:0"});
  // The pool must contain the cache.
  std::vector<int64_t> half{kHostRows / 2, kRowBytes};
  hs_tensor_t small_pool{f.host[0].data(), HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 2, half.data(), nullptr};
  expect_error(hs_runtime_bind_source_cache(r, &f.host_tensors[0], &small_pool), HS_ERROR_INVALID_ARGUMENT,
               {"registered_host_pool"});
  EXPECT_EQ(leader.info().source_bound, 0) << "a refused binding binds nothing";
  ASSERT_EQ(hs_runtime_bind_source_cache(r, &f.host_tensors[0], &f.host_tensors[0]), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(leader.info().host_rows, kHostRows);

  hs_hot_cache_binding_t b;
  hs_hot_cache_binding_init(&b);
  b.raw_tensor = &f.slab_tensor;
  b.block_stride = kBlockStride;
  b.num_blocks = kSlabBlocks + 1;
  b.block_size = kBlock;
  b.block_table = &f.table_tensor;
  expect_error(hs_runtime_bind_hot_cache(r, &b), HS_ERROR_INVALID_ARGUMENT, {"raw_tensor", "too small"});
  b.num_blocks = kSlabBlocks;
  b.byte_offset = kBlockBytes + 16;
  expect_error(hs_runtime_bind_hot_cache(r, &b), HS_ERROR_INVALID_ARGUMENT, {"raw_tensor", "too small"});
  b.byte_offset = 8;
  expect_error(hs_runtime_bind_hot_cache(r, &b), HS_ERROR_INVALID_ARGUMENT, {"byte_offset"});
  b.byte_offset = 0;
  b.block_stride = kBlockStride + 16;
  expect_error(hs_runtime_bind_hot_cache(r, &b), HS_ERROR_INVALID_ARGUMENT, {"block_stride", "multiple"});
  b.block_stride = kBlockStride;
  b.block_size = 2 * kBlock;
  expect_error(hs_runtime_bind_hot_cache(r, &b), HS_ERROR_INVALID_ARGUMENT, {"block_size", "hot_block_size"});
  b.block_size = kBlock;
  std::vector<int64_t> narrow{kReqs, kBlocksPerReq - 1};
  hs_tensor_t narrow_table{f.block_table.data(), HS_DTYPE_INT32, HS_DEVICE_CPU, 0, 2, narrow.data(), nullptr};
  b.block_table = &narrow_table;
  expect_error(hs_runtime_bind_hot_cache(r, &b), HS_ERROR_INVALID_ARGUMENT, {"block_table"});
  b.block_table = &f.table_tensor;
  EXPECT_EQ(leader.info().hot_bound, 0);
  ASSERT_EQ(hs_runtime_bind_hot_cache(r, &b), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(leader.info().attention_block_stride, kBlockStride / kRowBytes);

  // A follower's attention block stride must be its leader's.
  hs::Runtime follower = hs::Runtime::follower(leader, f.options());
  follower.bind_source_cache(&f.host_tensors[1]);
  b.block_stride = kBlockBytes;
  expect_error(hs_runtime_bind_hot_cache(follower.get(), &b), HS_ERROR_INVALID_ARGUMENT,
               {"block_stride", "attention_block_stride", "leader"});
  // ... and its hot block size (a follower configured with other blocks).
  hs_config_t other = f.config;
  other.hot_block_size = 2 * kBlock;
  hs_runtime_options_t o = f.options();
  o.config = &other;
  hs::Runtime odd = hs::Runtime::follower(leader, o);
  odd.bind_source_cache(&f.host_tensors[1]);
  b.block_size = 2 * kBlock;
  b.block_stride = kBlockStride * 2;
  b.num_blocks = kSlabBlocks / 2;
  expect_error(hs_runtime_bind_hot_cache(odd.get(), &b), HS_ERROR_INVALID_ARGUMENT, {"block_size", "leader", "4", "8"});

  // Unbind restores the unbound state.
  leader.unbind();
  EXPECT_EQ(leader.info().source_bound, 0);
  EXPECT_EQ(leader.info().hot_bound, 0);
  hs_tensor_t out{};
  expect_error(hs_runtime_get_hot_cache(r, &out), HS_ERROR_INVALID_STATE, {"hot_cache"});
}

TEST(Runtime, SwapInMovesTheRowsOfEveryLayer) {
  for (const bool prefetch : {false, true}) {
    Fixture f;
    hs::Runtime leader(f.options());
    hs::Runtime follower = hs::Runtime::follower(leader, f.options());
    f.bind(leader, 0);
    f.bind(follower, 1);
    for (int step = 0; step < 3; ++step) {
      Step s({1 + step, 5, 9, 13, 2, 6 + step, 10, 63});
      leader.begin_forward();
      follower.begin_forward();
      const hs_runtime_swap_in_result_t lr = leader.swap_in(s.args(prefetch));
      EXPECT_EQ(lr.first_row, 0);
      EXPECT_EQ(lr.num_rows, kReqs);
      EXPECT_EQ(lr.prefetched, 0);
      EXPECT_EQ(follower.info().staged, prefetch ? 1 : 0);
      hs_runtime_swap_in_args_t fa;
      hs_runtime_swap_in_args_init(&fa);
      fa.num_tokens = kReqs;  // a follower needs no tensors
      const hs_runtime_swap_in_result_t fr = follower.swap_in(fa);
      EXPECT_EQ(fr.prefetched, prefetch ? 1 : 0);
      EXPECT_EQ(follower.info().staged, 0);
      expect_rows_match(f, leader, 0, 0, kReqs);
      expect_rows_match(f, follower, 1, 0, kReqs);
    }
    leader.copy_stats_async();
    const hs_runtime_stats_t stats = leader.stats();
    EXPECT_EQ(stats.num_layers, 2);
    EXPECT_EQ(stats.group_row_bytes, 2u * kRowBytes);
    EXPECT_EQ(stats.lookups, 3 * kReqs * kTopK);
    EXPECT_EQ(stats.hits + stats.misses, 3 * kReqs * kTopK);
    EXPECT_EQ(stats.misses, 8 + 2 + 2);  // cold start, then one new slot per request and step
    EXPECT_EQ(stats.bytes_moved, static_cast<uint64_t>(stats.misses) * 2 * kRowBytes);
    EXPECT_DOUBLE_EQ(stats.hit_rate, static_cast<double>(stats.hits) / (stats.hits + stats.misses));
  }
}

TEST(Runtime, MisuseIsRefusedWithAStatus) {
  Fixture f;
  hs::Runtime leader(f.options());
  hs::Runtime follower = hs::Runtime::follower(leader, f.options());
  Step s({1, 2, 3, 4, 5, 6, 7, 8});
  hs_runtime_swap_in_args_t a = s.args(false);
  const hs_runtime_swap_in_args_t fa = s.follower_args();

  expect_error(hs_runtime_swap_in(leader.get(), &a, nullptr, nullptr), HS_ERROR_INVALID_STATE,
               {"not prefetched", "not bound"});
  f.bind(leader, 0);
  f.bind(follower, 1);

  // A follower refuses a top-k: it reuses its leader's resolution.
  leader.begin_forward();
  follower.begin_forward();
  expect_error(hs_runtime_swap_in(follower.get(), &a, nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"topk_indices", "follower", "num_tokens"});

  // A follower before its leader in a forward.
  expect_error(hs_runtime_swap_in(follower.get(), &fa, nullptr, nullptr), HS_ERROR_INVALID_STATE,
               {"not prefetched", "leader first"});
  EXPECT_EQ(follower.info().next_row, 0) << "a failed call takes no rows";

  // Step rows: two steps of 2 rows fit R = 4, a third does not.
  leader.swap_in(a);
  follower.swap_in(fa);
  leader.swap_in(a);
  expect_error(hs_runtime_swap_in(leader.get(), &a, nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"speculative decode capacity", "stop=6", "capacity=4"});
  EXPECT_EQ(leader.info().next_row, 4);
  // The follower's second step is resolved; a new forward starts over.
  follower.swap_in(fa);
  leader.begin_forward();
  follower.begin_forward();
  EXPECT_EQ(leader.swap_in(a).first_row, 0);

  // A leader without top-k; a follower asking for other rows than staged.
  hs_runtime_swap_in_args_t empty;
  hs_runtime_swap_in_args_init(&empty);
  expect_error(hs_runtime_swap_in(leader.get(), &empty, nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT, {"topk_indices"});
  expect_error(hs_runtime_swap_in(follower.get(), &empty, nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT, {"num_tokens"});
  leader.begin_forward();
  follower.begin_forward();
  leader.swap_in(s.args(true));
  empty.num_tokens = 1;
  expect_error(hs_runtime_swap_in(follower.get(), &empty, nullptr, nullptr), HS_ERROR_INVALID_STATE,
               {"not prefetched for these rows"});
  empty.num_tokens = kReqs;
  EXPECT_EQ(follower.swap_in(empty).prefetched, 1);

  // A prefetch batch with an unbound follower is refused before any work.
  follower.unbind();
  leader.begin_forward();
  EXPECT_EQ(hs_runtime_swap_in(leader.get(), &a, nullptr, nullptr), HS_SUCCESS) << hs_last_error();
  leader.begin_forward();
  a.prefetch = 1;
  expect_error(hs_runtime_swap_in(leader.get(), &a, nullptr, nullptr), HS_ERROR_INVALID_STATE,
               {"follower 0", "not bound"});
}

TEST(Runtime, FollowerOutlivesItsLeader) {
  Fixture f;
  auto leader = std::make_unique<hs::Runtime>(f.options());
  hs::Runtime follower = hs::Runtime::follower(*leader, f.options());
  f.bind(follower, 1);
  hs_index_group_t group = follower.index_group();
  leader.reset();
  EXPECT_EQ(follower.info().group_size, 1);
  EXPECT_EQ(follower.index_group(), group) << "the group lives while a member does";
  follower.reset_hot_state();
  Step s({1, 2, 3, 4, 5, 6, 7, 8});
  const hs_runtime_swap_in_args_t a = s.follower_args();
  expect_error(hs_runtime_swap_in(follower.get(), &a, nullptr, nullptr), HS_ERROR_INVALID_STATE,
               {"leader was destroyed"});
}

TEST(Runtime, ResetMakesHitsMissesAndMirrorWritesTheHostCache) {
  Fixture f;
  hs::Runtime leader(f.options());
  f.bind(leader, 0);
  Step s({1, 2, 3, 4, 5, 6, 7, 8});
  leader.begin_forward();
  leader.swap_in(s.args(false));
  leader.begin_forward();
  leader.swap_in(s.args(false));
  leader.copy_stats_async();
  EXPECT_EQ(leader.stats().hits, 8);
  leader.reset_hot_state();
  leader.copy_stats_async();
  EXPECT_EQ(leader.stats().lookups, 0) << "the reset zeroes the counters";
  leader.begin_forward();
  leader.swap_in(s.args(false));
  leader.copy_stats_async();
  EXPECT_EQ(leader.stats().misses, 8);
  EXPECT_EQ(leader.stats().hits, 0);

  // Mirror two device rows into host slots 3 and 40.
  std::vector<uint8_t> rows(2 * kRowBytes, 0xAB);
  std::vector<int64_t> rows_shape{2, kRowBytes};
  hs_tensor_t src{rows.data(), HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 2, rows_shape.data(), nullptr};
  std::vector<int32_t> slots{3, 40};
  std::vector<int64_t> slots_shape{2};
  hs_tensor_t mapping{slots.data(), HS_DTYPE_INT32, HS_DEVICE_CPU, 0, 1, slots_shape.data(), nullptr};
  leader.mirror_rows(&src, &mapping);
  EXPECT_EQ(f.host[0][3 * kRowBytes], 0xAB);
  EXPECT_EQ(f.host[0][40 * kRowBytes + kRowBytes - 1], 0xAB);
  leader.unbind();
  expect_error(hs_runtime_mirror_rows(leader.get(), &src, &mapping, nullptr), HS_ERROR_INVALID_STATE,
               {"bind_source_cache"});
}

TEST(Runtime, SlotInvalidatorClearsEveryGroup) {
  Fixture f;
  hs::Runtime a(f.options());
  hs::Runtime b(f.options());  // a second, independent group
  f.bind(a, 0);
  f.bind(b, 1);
  Step s({1, 2, 3, 4, 5, 6, 7, 8});
  for (hs::Runtime* r : {&a, &b}) {
    r->begin_forward();
    r->swap_in(s.args(false));
  }
  hs::SlotInvalidator invalidate;
  std::vector<int32_t> req_ids{0, 1};
  std::vector<int32_t> written{3, 7};
  std::vector<int64_t> two{2};
  hs_tensor_t req_tensor{req_ids.data(), HS_DTYPE_INT32, HS_DEVICE_CPU, 0, 1, two.data(), nullptr};
  hs_tensor_t written_tensor{written.data(), HS_DTYPE_INT32, HS_DEVICE_CPU, 0, 1, two.data(), nullptr};
  const hs_runtime_t runtimes[2] = {a.get(), b.get()};
  invalidate(runtimes, 2, &s.state_tensor, &req_tensor, &written_tensor);
  invalidate(runtimes, 2, &s.state_tensor, &req_tensor, &written_tensor);  // cached array
  for (const hs::Runtime* r : {&a, &b}) {
    const hs_tensor_t table = r->group_tensor(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES);
    const auto* dgi = static_cast<const int32_t*>(table.data);
    int held = 0;
    for (int j = 0; j < kHot; ++j) {
      EXPECT_NE(dgi[0 * kHot + j], 3);
      EXPECT_NE(dgi[1 * kHot + j], 7);
      held += dgi[j] >= 0 ? 1 : 0;
      held += dgi[kHot + j] >= 0 ? 1 : 0;
    }
    EXPECT_EQ(held, 6) << "only the written slots of the writing requests are dropped";
  }
  EXPECT_EQ(
      hs_slot_invalidator_run(invalidate.get(), runtimes, 0, &s.state_tensor, &req_tensor, &written_tensor, nullptr),
      HS_SUCCESS);
  const hs_runtime_t with_null[1] = {nullptr};
  expect_error(
      hs_slot_invalidator_run(invalidate.get(), with_null, 1, &s.state_tensor, &req_tensor, &written_tensor, nullptr),
      HS_ERROR_INVALID_ARGUMENT, {"runtimes[0]"});
}

// The bytes of a group tensor (contiguous, owned by the group).
std::vector<uint8_t> group_bytes(const hs::Runtime& runtime, hs_index_group_tensor_t which) {
  const hs_tensor_t t = runtime.group_tensor(which);
  size_t bytes = t.dtype == HS_DTYPE_INT16 ? 2 : t.dtype == HS_DTYPE_INT64 ? 8 : 4;
  for (int d = 0; d < t.ndim; ++d) bytes *= static_cast<size_t>(t.shape[d]);
  const auto* data = static_cast<const uint8_t*>(t.data);
  return std::vector<uint8_t>(data, data + bytes);
}

TEST(Runtime, FusedGatherOnTheLeaderMovesTheSameBytes) {
  for (const bool prefetch : {false, true}) {
    Fixture fused_f, plain_f;
    hs::Runtime fused(fused_f.options()), plain(plain_f.options());
    hs::Runtime fused_follower = hs::Runtime::follower(fused, fused_f.options());
    hs::Runtime plain_follower = hs::Runtime::follower(plain, plain_f.options());
    fused_f.bind(fused, 0);
    fused_f.bind(fused_follower, 1);
    plain_f.bind(plain, 0);
    plain_f.bind(plain_follower, 1);
    for (int step = 0; step < 4; ++step) {
      Step s({1 + step, 5, 9, 13, 2, 6 + 2 * step, 10, 63 - step});
      for (hs::Runtime* leader : {&fused, &plain}) {
        const bool fuse = leader == &fused;
        hs::Runtime& follower = fuse ? fused_follower : plain_follower;
        leader->begin_forward();
        follower.begin_forward();
        hs_runtime_swap_in_args_t a = s.args(prefetch);
        a.fused_gather = fuse ? 1 : 0;
        const hs_runtime_swap_in_result_t lr = leader->swap_in(a);
        EXPECT_EQ(lr.prefetched, 0);
        EXPECT_EQ(leader->info().staged, 0);
        EXPECT_EQ(follower.info().staged, prefetch ? 1 : 0);
        hs_runtime_swap_in_args_t fa;
        hs_runtime_swap_in_args_init(&fa);
        fa.num_tokens = kReqs;
        fa.fused_gather = fuse ? 1 : 0;  // ignored by a follower
        EXPECT_EQ(follower.swap_in(fa).prefetched, prefetch ? 1 : 0);
      }
      expect_rows_match(fused_f, fused, 0, 0, kReqs);
      expect_rows_match(fused_f, fused_follower, 1, 0, kReqs);
      EXPECT_EQ(fused_f.slab, plain_f.slab) << "step " << step;
      for (int which = HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES; which <= HS_INDEX_GROUP_STATS; ++which) {
        const auto t = static_cast<hs_index_group_tensor_t>(which);
        EXPECT_EQ(group_bytes(fused, t), group_bytes(plain, t)) << "step " << step << " tensor " << which;
      }
    }
    fused.copy_stats_async();
    plain.copy_stats_async();
    EXPECT_EQ(fused.stats().misses, plain.stats().misses);
    EXPECT_EQ(fused.stats().hits, plain.stats().hits);
    EXPECT_GT(fused.stats().misses, 0);
  }
}

TEST(Runtime, SwapInFlagsAreZeroOrOneAndTheArgsStructIsChecked) {
  Fixture f;
  hs::Runtime leader(f.options());
  f.bind(leader, 0);
  Step s({1, 2, 3, 4, 5, 6, 7, 8});

  // A bad flag is refused, naming it, and takes no rows.
  hs_runtime_swap_in_args_t a = s.args(false);
  leader.begin_forward();
  for (const int32_t value : {2, -1}) {
    a.fused_gather = value;
    expect_error(hs_runtime_swap_in(leader.get(), &a, nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT,
                 {"fused_gather", "0 or 1", std::to_string(value).c_str()});
    a.fused_gather = 0;
    a.group_gather = value;
    expect_error(hs_runtime_swap_in(leader.get(), &a, nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT,
                 {"group_gather", "0 or 1", std::to_string(value).c_str()});
    a.group_gather = 0;
  }
  // group_gather stages the followers of a prefetch batch: without one it
  // asks for something that cannot happen.
  a.group_gather = 1;
  expect_error(hs_runtime_swap_in(leader.get(), &a, nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"group_gather", "prefetch = 1", "prefetch = 0"});
  a.group_gather = 0;
  a.struct_size = offsetof(hs_runtime_swap_in_args_t, num_tokens);
  expect_error(hs_runtime_swap_in(leader.get(), &a, nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"args", "struct_size"});
  a.struct_size = sizeof(a);
  a.struct_version = HS_RUNTIME_SWAP_IN_ARGS_VERSION + 1;
  expect_error(hs_runtime_swap_in(leader.get(), &a, nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"args", "struct_version"});
  EXPECT_EQ(leader.info().next_row, 0);
  EXPECT_EQ(leader.info().staged, 0);

  a.struct_version = HS_RUNTIME_SWAP_IN_ARGS_VERSION;
  hs_runtime_swap_in_result_t r;
  std::memset(&r, 0, sizeof(r));
  r.struct_size = sizeof(r);
  ASSERT_EQ(hs_runtime_swap_in(leader.get(), &a, &r, nullptr), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(r.num_rows, kReqs);
  expect_rows_match(f, leader, 0, 0, kReqs);
}

// `n` layers (a leader and n - 1 followers) whose host rows are either one
// token-major buffer [kHostRows, n, kRowBytes] (layer l bound to [:, l]) or
// n layer-major buffers with the same bytes, hot views interleaved in one
// slab. `order[l]` is the piece of the token-major buffer that runtime l binds.
struct LayerGroup {
  int n;
  int64_t stride;  // bytes between hot blocks
  hs_config_t config = small_config();
  std::vector<uint8_t> token_major;            // [kHostRows, n, kRowBytes]
  std::vector<std::vector<uint8_t>> layers;   // per runtime, [kHostRows, kRowBytes]
  std::vector<uint8_t> slab;
  std::vector<int32_t> block_table;
  std::vector<int64_t> row_shape{kHostRows, kRowBytes};
  std::vector<int64_t> token_major_strides;
  std::vector<int64_t> slab_shape;
  std::vector<int64_t> table_shape{kReqs, kBlocksPerReq};
  std::vector<hs_tensor_t> token_major_views, layer_views;
  hs_tensor_t slab_tensor{}, table_tensor{};
  std::vector<hs::Runtime> runtimes;

  explicit LayerGroup(std::vector<int> order) : n(static_cast<int>(order.size())), stride(n * kBlockBytes) {
    std::mt19937 gen(11);
    token_major.resize(kHostRows * n * kRowBytes);
    for (auto& byte : token_major) byte = static_cast<uint8_t>(gen());
    token_major_strides = {n * kRowBytes, 1};
    layers.resize(n);
    for (int l = 0; l < n; ++l) {
      layers[l].resize(kHostRows * kRowBytes);
      for (int64_t h = 0; h < kHostRows; ++h) {
        std::memcpy(layers[l].data() + h * kRowBytes, token_major.data() + (h * n + order[l]) * kRowBytes, kRowBytes);
      }
      token_major_views.push_back(hs_tensor_t{token_major.data() + order[l] * kRowBytes, HS_DTYPE_UINT8, HS_DEVICE_CPU,
                                              0, 2, row_shape.data(), token_major_strides.data()});
      layer_views.push_back(
          hs_tensor_t{layers[l].data(), HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 2, row_shape.data(), nullptr});
    }
    slab.assign(static_cast<size_t>(kSlabBlocks * stride), 0);
    slab_shape = {static_cast<int64_t>(slab.size())};
    block_table.resize(kReqs * kBlocksPerReq);
    std::iota(block_table.begin(), block_table.end(), 1);
    slab_tensor = hs_tensor_t{slab.data(), HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 1, slab_shape.data(), nullptr};
    table_tensor = hs_tensor_t{block_table.data(), HS_DTYPE_INT32, HS_DEVICE_CPU, 0, 2, table_shape.data(), nullptr};
    hs_runtime_options_t o;
    hs_runtime_options_init(&o);
    o.config = &config;
    o.max_num_reqs = kReqs;
    o.max_swap_rows = kSwapRows;
    runtimes.emplace_back(o);
    for (int l = 1; l < n; ++l) runtimes.push_back(hs::Runtime::follower(runtimes[0], o));
  }

  void bind(bool token_major_layout) {
    for (int l = 0; l < n; ++l) {
      runtimes[l].bind_source_cache(token_major_layout ? &token_major_views[l] : &layer_views[l]);
      runtimes[l].bind_hot_cache(&slab_tensor, l * kBlockBytes, stride, kSlabBlocks, kBlock, &table_tensor);
    }
  }

  std::vector<int> staged_together() const {
    std::vector<int> out;
    for (const hs::Runtime& r : runtimes) out.push_back(r.info().followers_staged_together);
    return out;
  }

  // One forward of every layer: the leader prefetches (all followers in one
  // group gather with `group_gather`), then the followers.
  void step(const Step& s, bool fused_gather, bool group_gather) {
    for (hs::Runtime& r : runtimes) r.begin_forward();
    hs_runtime_swap_in_args_t a = s.args(true);
    a.fused_gather = fused_gather ? 1 : 0;
    a.group_gather = group_gather ? 1 : 0;
    runtimes[0].swap_in(a);
    for (int l = 1; l < n; ++l) EXPECT_EQ(runtimes[l].info().staged, 1) << "layer " << l;
    hs_runtime_swap_in_args_t fa;
    hs_runtime_swap_in_args_init(&fa);
    fa.num_tokens = kReqs;
    fa.group_gather = 1;  // ignored by a follower, whatever the layout
    for (int l = 1; l < n; ++l) EXPECT_EQ(runtimes[l].swap_in(fa).prefetched, 1) << "layer " << l;
  }

  // A prefetching leader asked for group_gather is refused with an error
  // naming it and `fragments`, before anything is enqueued: no rows taken,
  // nothing staged, the slab and every group tensor unchanged.
  void expect_group_gather_refused(const Step& s, std::initializer_list<const char*> fragments) {
    for (hs::Runtime& r : runtimes) r.begin_forward();
    const std::vector<uint8_t> slab_before = slab;
    std::vector<std::vector<uint8_t>> tensors_before;
    for (int which = HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES; which <= HS_INDEX_GROUP_STATS; ++which) {
      tensors_before.push_back(group_bytes(runtimes[0], static_cast<hs_index_group_tensor_t>(which)));
    }
    hs_runtime_swap_in_args_t a = s.args(true);
    a.group_gather = 1;
    expect_error(hs_runtime_swap_in(runtimes[0].get(), &a, nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT,
                 {"group_gather", "do not tile"});
    const std::string message = hs_last_error();
    for (const char* fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos) << "'" << fragment << "' missing in: " << message;
    }
    for (const hs::Runtime& r : runtimes) {
      EXPECT_EQ(r.info().next_row, 0);
      EXPECT_EQ(r.info().staged, 0);
    }
    EXPECT_EQ(slab, slab_before);
    for (int which = HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES; which <= HS_INDEX_GROUP_STATS; ++which) {
      EXPECT_EQ(group_bytes(runtimes[0], static_cast<hs_index_group_tensor_t>(which)),
                tensors_before[static_cast<size_t>(which - HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES)])
          << "tensor " << which;
    }
  }

  // Every attention-visible entry shows, in every layer, its host row.
  void expect_rows_match() const {
    const hs_tensor_t attention = runtimes[0].group_tensor(HS_INDEX_GROUP_ATTENTION_INDICES);
    const hs_tensor_t resolved = runtimes[0].group_tensor(HS_INDEX_GROUP_RESOLVED_SLOTS);
    const auto* att = static_cast<const int32_t*>(attention.data);
    const auto* slots = static_cast<const int32_t*>(resolved.data);
    const int64_t stride_rows = stride / kRowBytes;
    int checked = 0;
    for (int64_t e = 0; e < kReqs * kTopK; ++e) {
      if (att[e] < 0) continue;
      const uint8_t* hot = slab.data() + (att[e] / stride_rows) * stride + (att[e] % stride_rows) * kRowBytes;
      for (int l = 0; l < n; ++l) {
        EXPECT_EQ(0, std::memcmp(hot + l * kBlockBytes, layers[l].data() + slots[e] * kRowBytes, kRowBytes))
            << "layer " << l << " entry " << e;
      }
      ++checked;
    }
    EXPECT_GT(checked, 0);
  }
};

// Three groups see the same steps: token-major followers staged with one
// group gather, the same layout staged follower by follower (the default,
// even though the followers tile), and layer-major buffers. Every byte, index
// and state entry agrees.
TEST(Runtime, GroupGatherOfTokenMajorFollowersMovesTheSameBytes) {
  // Runtime l binds piece order[l]: the followers tile in address order 3, 1, 2.
  for (const std::vector<int>& order : {std::vector<int>{0, 1, 2, 3}, std::vector<int>{3, 1, 2, 0}}) {
    LayerGroup grouped(order), per_follower(order), layer_major(order);
    grouped.bind(true);
    per_follower.bind(true);
    layer_major.bind(false);
    EXPECT_EQ(grouped.staged_together(), (std::vector<int>{1, 0, 0, 0}));
    EXPECT_EQ(per_follower.staged_together(), (std::vector<int>{1, 0, 0, 0}));
    EXPECT_EQ(layer_major.staged_together(), (std::vector<int>{0, 0, 0, 0}));
    for (int step = 0; step < 5; ++step) {
      Step s({1 + step, 5, 9, 13 + step, 2, 6 + 2 * step, 10, 63 - step});
      grouped.step(s, step % 2 == 1, true);
      per_follower.step(s, step % 2 == 0, false);
      layer_major.step(s, step % 3 == 0, false);
      grouped.expect_rows_match();
      per_follower.expect_rows_match();
      layer_major.expect_rows_match();
      EXPECT_EQ(grouped.slab, per_follower.slab) << "step " << step;
      EXPECT_EQ(grouped.slab, layer_major.slab) << "step " << step;
      for (int which = HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES; which <= HS_INDEX_GROUP_STATS; ++which) {
        const auto t = static_cast<hs_index_group_tensor_t>(which);
        EXPECT_EQ(group_bytes(grouped.runtimes[0], t), group_bytes(per_follower.runtimes[0], t)) << "tensor " << which;
        EXPECT_EQ(group_bytes(grouped.runtimes[0], t), group_bytes(layer_major.runtimes[0], t)) << "tensor " << which;
      }
    }
  }
}

// More followers than one group gather takes (HS_MAX_GATHER_GROUP_PIECES):
// runs of adjacent pieces, one launch each, still the per-layer bytes.
TEST(Runtime, GroupGatherOfManyFollowersRunsInPieces) {
  for (const int followers : {HS_MAX_GATHER_GROUP_PIECES + 1, 2 * HS_MAX_GATHER_GROUP_PIECES + 3}) {
    std::vector<int> order(static_cast<size_t>(followers + 1));
    std::iota(order.begin(), order.end(), 0);
    std::reverse(order.begin() + 1, order.end());  // followers created in descending address order
    LayerGroup grouped(order), layer_major(order);
    grouped.bind(true);
    layer_major.bind(false);
    EXPECT_EQ(grouped.runtimes[0].info().followers_staged_together, 1);
    for (int step = 0; step < 3; ++step) {
      Step s({1 + step, 5, 9, 13 + step, 2, 6 + 2 * step, 10, 63 - step});
      grouped.step(s, step == 1, true);
      layer_major.step(s, step == 1, false);
      grouped.expect_rows_match();
      EXPECT_EQ(grouped.slab, layer_major.slab) << followers << " followers, step " << step;
    }
  }
}

// group_gather on followers that do not tile fails naming the condition, and
// changes nothing; the same step without it stages them one by one.
TEST(Runtime, GroupGatherIsRefusedUnlessTheFollowersTile) {
  const Step s({1, 5, 9, 13, 2, 6, 10, 63});

  // The leader in the middle: the followers' pieces 0, 2, 3 have a gap.
  LayerGroup middle({1, 0, 2, 3});
  middle.bind(true);
  EXPECT_EQ(middle.runtimes[0].info().followers_staged_together, 0);
  middle.expect_group_gather_refused(s, {"not adjacent"});
  middle.step(s, false, false);
  middle.expect_rows_match();

  // Two followers on the same piece.
  LayerGroup twice({0, 1, 3, 3});
  twice.bind(true);
  EXPECT_EQ(twice.runtimes[0].info().followers_staged_together, 0);
  twice.expect_group_gather_refused(s, {"followers 1 and 2", "same host rows"});
  twice.step(s, true, false);
  twice.expect_rows_match();

  // One follower alone never takes the group gather.
  LayerGroup pair({0, 1});
  pair.bind(true);
  EXPECT_EQ(pair.runtimes[0].info().group_size, 2);
  EXPECT_EQ(pair.runtimes[0].info().followers_staged_together, 0);
  pair.expect_group_gather_refused(s, {"1 follower", "at least two"});
  pair.step(s, false, false);
  pair.expect_rows_match();

  LayerGroup f({0, 1, 2, 3});
  f.bind(true);
  ASSERT_EQ(f.runtimes[0].info().followers_staged_together, 1);
  f.step(s, false, true);
  f.expect_rows_match();

  // Follower 3 reads the same bytes from a buffer of its own, whose slots
  // are one row apart. (Rebinding a host cache keeps the hot copies: the
  // reset drops them.)
  f.runtimes[3].bind_source_cache(&f.layer_views[3]);
  f.runtimes[0].reset_hot_state();
  EXPECT_EQ(f.runtimes[0].info().followers_staged_together, 0);
  f.expect_group_gather_refused(s, {"follower 2's host slots are 32 bytes apart, follower 0's 128"});
  f.step(s, false, false);
  f.expect_rows_match();

  // Adjacent bases, but follower 3 at piece 3 steps over every other slot:
  // half the rows at twice the pitch (refused for the row count first).
  std::vector<int64_t> half_shape{kHostRows / 2, kRowBytes}, double_pitch{2 * 4 * kRowBytes, 1};
  hs_tensor_t sparse{f.token_major.data() + 3 * kRowBytes,
                     HS_DTYPE_UINT8,
                     HS_DEVICE_CPU,
                     0,
                     2,
                     half_shape.data(),
                     double_pitch.data()};
  f.runtimes[3].bind_source_cache(&sparse);
  for (int64_t h = 0; h < kHostRows / 2; ++h) {
    std::memcpy(f.layers[3].data() + h * kRowBytes, f.token_major.data() + (2 * h * 4 + 3) * kRowBytes, kRowBytes);
  }
  f.runtimes[0].reset_hot_state();
  EXPECT_EQ(f.runtimes[0].info().followers_staged_together, 0);
  const Step low({1, 5, 9, 13, 2, 6, 10, 31});
  f.expect_group_gather_refused(low, {"follower 2's host cache has 32 rows, follower 0's 64"});
  f.step(low, false, false);
  f.expect_rows_match();

  // Tiling again after rebinding: group_gather is accepted again.
  f.runtimes[3].bind_source_cache(&f.token_major_views[3]);
  for (int64_t h = 0; h < kHostRows; ++h) {
    std::memcpy(f.layers[3].data() + h * kRowBytes, f.token_major.data() + (h * 4 + 3) * kRowBytes, kRowBytes);
  }
  f.runtimes[0].reset_hot_state();
  EXPECT_EQ(f.runtimes[0].info().followers_staged_together, 1);
  f.step(Step({3, 7, 11, 15, 4, 8, 12, 60}), true, true);
  f.expect_rows_match();

  // A follower's hot view of another extent (same block size and stride).
  f.runtimes[2].bind_hot_cache(&f.slab_tensor, 2 * kBlockBytes, f.stride, kSlabBlocks - 1, kBlock, &f.table_tensor);
  EXPECT_EQ(f.runtimes[0].info().followers_staged_together, 0);
  f.expect_group_gather_refused(s, {"follower 1's hot view"});
  f.runtimes[2].bind_hot_cache(&f.slab_tensor, 2 * kBlockBytes, f.stride, kSlabBlocks, kBlock, &f.table_tensor);
  EXPECT_EQ(f.runtimes[0].info().followers_staged_together, 1);

  // A follower checks the value (like fused_gather) before taking rows.
  for (hs::Runtime& r : f.runtimes) r.begin_forward();
  hs_runtime_swap_in_args_t a = s.args(true);
  a.group_gather = 1;
  f.runtimes[0].swap_in(a);
  hs_runtime_swap_in_args_t fa;
  hs_runtime_swap_in_args_init(&fa);
  fa.num_tokens = kReqs;
  fa.group_gather = 2;
  expect_error(hs_runtime_swap_in(f.runtimes[1].get(), &fa, nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"group_gather", "0 or 1", "2"});
  EXPECT_EQ(f.runtimes[1].info().next_row, 0);
  EXPECT_EQ(f.runtimes[1].info().staged, 1);
  fa.group_gather = 0;
  for (int l = 1; l < 4; ++l) EXPECT_EQ(f.runtimes[l].swap_in(fa).prefetched, 1);
  f.expect_rows_match();

  // An unbound follower ends the tiling (and a prefetch: the state error
  // comes first, before group_gather's layout check).
  f.runtimes[2].unbind();
  EXPECT_EQ(f.runtimes[0].info().followers_staged_together, 0);
  for (hs::Runtime& r : f.runtimes) r.begin_forward();
  a = s.args(true);
  a.group_gather = 1;
  expect_error(hs_runtime_swap_in(f.runtimes[0].get(), &a, nullptr, nullptr), HS_ERROR_INVALID_STATE,
               {"follower 1", "not bound"});
}

// hs_index_group_resolve's fused gather equals a resolve followed by gather_compact.
TEST(IndexGroupResolve, FusedGatherEqualsResolveThenGather) {
  hs_index_group_options_t options;
  hs_index_group_options_init(&options);
  options.max_num_reqs = kReqs;
  options.device_buffer_size = kHot;
  options.top_k = kTopK;
  options.max_swap_rows = kSwapRows;
  Fixture fused_f, plain_f, untouched_f;
  hs::IndexGroup fused(options), plain(options);
  const int64_t stride_rows = kBlockStride / kRowBytes;
  std::vector<int64_t> view_shape{kSlabBlocks, kBlock, kRowBytes};
  std::vector<int64_t> view_strides{kBlockStride, kRowBytes, 1};
  auto hot_view = [&](Fixture& f) {
    return hs_tensor_t{f.slab.data(), HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 3, view_shape.data(), view_strides.data()};
  };
  const hs_tensor_t fused_hot = hot_view(fused_f), plain_hot = hot_view(plain_f);
  auto args = [&](const Step& s, Fixture& f) {
    hs_index_group_resolve_args_t a;
    hs_index_group_resolve_args_init(&a);
    a.topk_indices = &s.topk_tensor;
    a.req_id_per_token = &s.req_tensor;
    a.request_state_indices = &s.state_tensor;
    a.hot_block_table = &f.table_tensor;
    a.hot_block_size = kBlock;
    a.attention_block_stride = stride_rows;
    a.host_rows = kHostRows;
    return a;
  };
  std::vector<int64_t> swap_shape{kReqs, kTopK}, count_shape{kReqs};
  for (int step = 0; step < 3; ++step) {
    Step s({1 + step, 5, 9, 13, 2, 6 + step, 10, 63});
    hs_index_group_resolve_args_t a = args(s, fused_f);
    a.gather_host_cache = &fused_f.host_tensors[0];
    a.gather_hot_cache = &fused_hot;
    a.gather_hot_block_stride = stride_rows;
    fused.resolve(a);

    plain.resolve(args(s, plain_f));
    hs_tensor_t swap_host = plain.tensor(HS_INDEX_GROUP_SWAP_HOST_ROWS);
    hs_tensor_t device_rows = plain.tensor(HS_INDEX_GROUP_SWAP_DEVICE_ROWS);
    hs_tensor_t counts = plain.tensor(HS_INDEX_GROUP_SWAP_COUNTS);
    swap_host.shape = swap_shape.data();
    device_rows.shape = swap_shape.data();
    counts.shape = count_shape.data();
    hs_gather_compact_args_t g;
    hs_gather_compact_args_init(&g);
    g.host_cache = &plain_f.host_tensors[0];
    g.hot_cache = &plain_hot;
    g.swap_host_rows = &swap_host;
    g.swap_device_rows = &device_rows;
    g.swap_counts = &counts;
    g.hot_block_size = kBlock;
    g.hot_block_stride = stride_rows;
    ASSERT_EQ(hs_gather_compact(&g, nullptr), HS_SUCCESS) << hs_last_error();
    EXPECT_EQ(fused_f.slab, plain_f.slab) << "step " << step;
    EXPECT_NE(fused_f.slab, untouched_f.slab) << "step " << step << ": the fused gather moved rows";
  }

  // The resolver's own checks apply, naming the field.
  Step s({1, 2, 3, 4, 5, 6, 7, 8});
  hs_index_group_resolve_args_t a = args(s, fused_f);
  a.gather_hot_block_stride = 4;
  expect_error(hs_index_group_resolve(fused.get(), &a, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"gather_hot_block_stride"});
  a.gather_hot_block_stride = 0;
  a.gather_host_cache = &fused_f.host_tensors[0];
  expect_error(hs_index_group_resolve(fused.get(), &a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"gather_hot_cache"});
  a.struct_size = offsetof(hs_index_group_resolve_args_t, out_valid_counts);
  expect_error(hs_index_group_resolve(fused.get(), &a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"args", "struct_size"});
}

}  // namespace

namespace {

TEST(RuntimeRaii, IndexGroupWrapperOwnsAGroup) {
  hs_index_group_options_t options;
  hs_index_group_options_init(&options);
  options.max_num_reqs = 2;
  options.device_buffer_size = 8;
  options.top_k = 4;
  hs::IndexGroup group(options);
  EXPECT_EQ(group.info().max_union_rows, 4);
  const hs_tensor_t dgi = group.tensor(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES);
  static_cast<int32_t*>(dgi.data)[3] = 11;
  group.reset();
  EXPECT_EQ(static_cast<int32_t*>(dgi.data)[3], -1);
  group.copy_stats_async();
  EXPECT_EQ(group.read_stats()[HS_STAT_LOOKUPS], 0);
  hs::IndexGroup moved = std::move(group);
  EXPECT_EQ(group.get(), nullptr);
  EXPECT_NE(moved.get(), nullptr);
  options.top_k = 0;
  try {
    hs::IndexGroup bad(options);
    ADD_FAILURE() << "a group with top_k 0 was created";
  } catch (const hs::Error& error) {
    EXPECT_EQ(error.status(), HS_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(error.what()).find("top_k"), std::string::npos);
  }
}

}  // namespace
