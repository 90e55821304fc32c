// Host layout sizing and configuration validation: every rule, its boundary,
// and a message that names the argument or field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/resolver_shared_memory.hpp"
#include "hisparse/hisparse.h"
#include "hisparse/hisparse.hpp"

namespace {

void expect_invalid(hs_status_t status, std::initializer_list<const char*> fragments) {
  EXPECT_EQ(status, HS_ERROR_INVALID_ARGUMENT) << hs_status_string(status);
  const std::string message = hs_last_error();
  for (const char* fragment : fragments) {
    EXPECT_NE(message.find(fragment), std::string::npos) << "'" << fragment << "' missing in: " << message;
  }
}

hs_host_layout_t fresh_layout() {
  hs_host_layout_t layout{};
  layout.struct_size = sizeof(layout);
  return layout;
}

// ------------------------------------------------------------------ layout

TEST(Layout, ExactBoundaryOfMinimumBlocks) {
  // 640 tokens in blocks of 64 = 10 blocks, plus the null block and a
  // copy-on-write tail = 12.
  const uint64_t page = 64 * 656;
  hs_host_layout_t layout = fresh_layout();
  ASSERT_EQ(hs_plan_host_layout(page, 64, 640, 12 * page, &layout), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(layout.host_num_blocks, 12);
  EXPECT_EQ(layout.host_block_stride, static_cast<int64_t>(page));
  EXPECT_EQ(layout.min_host_blocks, 12);
  EXPECT_EQ(layout.struct_version, static_cast<uint32_t>(HS_HOST_LAYOUT_VERSION));

  layout = fresh_layout();
  expect_invalid(hs_plan_host_layout(page, 64, 640, 12 * page - 1, &layout),
                 {"11 blocks", "max_model_len=640", "needs 12", "host_budget_bytes", "--host-budget-gib"});
  EXPECT_EQ(layout.host_num_blocks, 0) << "a failed plan must not write its output";
}

TEST(Layout, PartialBlocksRoundUp) {
  const uint64_t page = 4096;
  hs_host_layout_t layout = fresh_layout();
  ASSERT_EQ(hs_plan_host_layout(page, 64, 641, 13 * page, &layout), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(layout.min_host_blocks, 13);
  expect_invalid(hs_plan_host_layout(page, 64, 641, 12 * page, &layout), {"needs 13"});
  // A remainder smaller than a block buys nothing.
  ASSERT_EQ(hs_plan_host_layout(page, 64, 64, 100 * page + page - 16, &layout), HS_SUCCESS);
  EXPECT_EQ(layout.host_num_blocks, 100);
  EXPECT_EQ(layout.min_host_blocks, 3);
}

TEST(Layout, BudgetSmallerThanOneBlock) {
  hs_host_layout_t layout = fresh_layout();
  expect_invalid(hs_plan_host_layout(4096, 64, 64, 4095, &layout),
                 {"no allocatable host blocks", "host_budget_bytes=4095", "increase host_budget_bytes"});
  expect_invalid(hs_plan_host_layout(4096, 64, 64, 0, &layout), {"no allocatable host blocks"});
}

TEST(Layout, PageSizeMustBeAPositiveMultipleOf16) {
  hs_host_layout_t layout = fresh_layout();
  expect_invalid(hs_plan_host_layout(4100, 64, 64, 1 << 30, &layout), {"page_size_bytes", "16", "4100"});
  expect_invalid(hs_plan_host_layout(8, 64, 64, 1 << 30, &layout), {"page_size_bytes"});
  expect_invalid(hs_plan_host_layout(0, 64, 64, 1 << 30, &layout), {"page_size_bytes"});
  EXPECT_EQ(hs_plan_host_layout(16, 1, 1, 48, &layout), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(layout.host_num_blocks, 3);
}

TEST(Layout, ZeroOrNegativeArgumentsAreNamed) {
  hs_host_layout_t layout = fresh_layout();
  expect_invalid(hs_plan_host_layout(4096, 0, 64, 1 << 30, &layout), {"block_size", "0"});
  expect_invalid(hs_plan_host_layout(4096, -3, 64, 1 << 30, &layout), {"block_size", "-3"});
  expect_invalid(hs_plan_host_layout(4096, 64, 0, 1 << 30, &layout), {"max_model_len", "0"});
  expect_invalid(hs_plan_host_layout(4096, 64, -7, 1 << 30, &layout), {"max_model_len", "-7"});
  layout.struct_size = 4;
  expect_invalid(hs_plan_host_layout(4096, 64, 64, 1 << 30, &layout), {"layout", "struct_size"});
}

TEST(Layout, LargeBudgetsDoNotOverflow) {
  hs_host_layout_t layout = fresh_layout();
  const uint64_t page = 61 * 64 * 656;  // 61 layers of DeepSeek-V3.2 FP8 rows per block
  const uint64_t budget = 1500ull << 30;
  ASSERT_EQ(hs_plan_host_layout(page, 64, 131072, budget, &layout), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(layout.host_num_blocks, static_cast<int64_t>(budget / page));
  EXPECT_EQ(layout.min_host_blocks, 131072 / 64 + 2);
}

TEST(Layout, CppLayerReturnsThePlan) {
  const hs_host_layout_t layout = hs::plan_host_layout(1024, 16, 160, 100 * 1024);
  EXPECT_EQ(layout.host_num_blocks, 100);
  EXPECT_EQ(layout.host_block_stride, 1024);
  EXPECT_EQ(layout.min_host_blocks, 12);
  EXPECT_THROW(hs::plan_host_layout(1024, 16, 160, 11 * 1024), hs::Error);
}

// ------------------------------------------------------------------ config

hs_config_t default_config() {
  hs_config_t config;
  hs_config_init(&config);
  return config;
}

TEST(Config, DefaultsAreValid) {
  const hs_config_t config = default_config();
  EXPECT_EQ(config.top_k, 2048);
  EXPECT_EQ(config.device_buffer_size, 4096);
  EXPECT_EQ(config.row_bytes, 656);
  EXPECT_EQ(hs_config_validate(&config, -1), HS_SUCCESS) << hs_last_error();
}

TEST(Config, TopK) {
  hs_config_t config = default_config();
  config.top_k = 0;
  expect_invalid(hs_config_validate(&config, -1), {"top_k", "0"});
  config.top_k = -5;
  expect_invalid(hs_config_validate(&config, -1), {"top_k", "-5"});
}

TEST(Config, DeviceBufferSizeFitsInt16Slots) {
  hs_config_t config = default_config();
  config.top_k = 16;
  config.max_union_rows = 16;
  config.device_buffer_size = 32768;
  expect_invalid(hs_config_validate(&config, -1), {"device_buffer_size", "32767", "32768"});
  config.device_buffer_size = 0;
  expect_invalid(hs_config_validate(&config, -1), {"device_buffer_size"});
  config.device_buffer_size = 32767;
  EXPECT_EQ(hs_config_validate(&config, -1), HS_SUCCESS) << hs_last_error();
}

TEST(Config, UnionRowsBetweenTopKAndBufferSize) {
  hs_config_t config = default_config();
  config.max_union_rows = config.top_k - 1;
  expect_invalid(hs_config_validate(&config, -1), {"max_union_rows", "top_k", "2047"});
  config.max_union_rows = config.device_buffer_size + 1;
  expect_invalid(hs_config_validate(&config, -1), {"max_union_rows", "device_buffer_size", "4097"});
  config.max_union_rows = config.device_buffer_size;
  EXPECT_EQ(hs_config_validate(&config, -1), HS_SUCCESS) << hs_last_error();
  config.max_union_rows = config.top_k;
  EXPECT_EQ(hs_config_validate(&config, -1), HS_SUCCESS) << hs_last_error();
  config.top_k = config.device_buffer_size + 1;
  config.max_union_rows = config.top_k;
  expect_invalid(hs_config_validate(&config, -1), {"max_union_rows"});
}

// One rule per default, wherever it applies: 0 = top_k x (1 + draft tokens)
// union rows, max_num_reqs x (1 + draft tokens) swap rows.
TEST(Config, DefaultsFollowOneRule) {
  int32_t rows = 0;
  ASSERT_EQ(hs_default_max_union_rows(2048, 0, &rows), HS_SUCCESS);
  EXPECT_EQ(rows, 2048);
  ASSERT_EQ(hs_default_max_union_rows(2048, 3, &rows), HS_SUCCESS);
  EXPECT_EQ(rows, 8192);
  ASSERT_EQ(hs_default_max_swap_rows(64, 1, &rows), HS_SUCCESS);
  EXPECT_EQ(rows, 128);
  expect_invalid(hs_default_max_union_rows(2048, -1, &rows), {"num_speculative_tokens"});
  expect_invalid(hs_default_max_union_rows(1 << 30, 3, &rows), {"num_speculative_tokens", "INT32_MAX"});
  expect_invalid(hs_default_max_union_rows(0, 0, &rows), {"top_k"});
  expect_invalid(hs_default_max_swap_rows(0, 0, &rows), {"max_num_reqs"});
  expect_invalid(hs_default_max_swap_rows(1, 0, nullptr), {"max_swap_rows"});

  hs_config_t config = default_config();
  EXPECT_EQ(config.max_union_rows, 0) << "hs_config_init leaves the default to the rule";
  EXPECT_EQ(hs_config_validate(&config, -1), HS_SUCCESS) << hs_last_error();
  config.num_speculative_tokens = 1;  // 4096 rows: H itself
  EXPECT_EQ(hs_config_validate(&config, -1), HS_SUCCESS) << hs_last_error();
  config.num_speculative_tokens = 2;  // 6144 > H = 4096
  expect_invalid(hs_config_validate(&config, -1), {"max_union_rows", "6144", "default"});
  config.num_speculative_tokens = -1;
  expect_invalid(hs_config_validate(&config, -1), {"num_speculative_tokens"});

  hs_index_group_options_t o;
  hs_index_group_options_init(&o);
  o.max_num_reqs = 3;
  o.top_k = 8;
  o.device_buffer_size = 32;
  o.num_speculative_tokens = 1;
  hs::IndexGroup group(o);
  EXPECT_EQ(group.info().max_union_rows, 16);
  EXPECT_EQ(group.info().max_swap_rows, 6);
}

TEST(Config, RowsAre16ByteAligned) {
  hs_config_t config = default_config();
  for (int32_t bad : {0, -16, 8, 650, 1000}) {
    config.row_bytes = bad;
    expect_invalid(hs_config_validate(&config, -1), {"row_bytes", "16-byte"});
  }
  for (int32_t good : {16, 656, 1152}) {
    config.row_bytes = good;
    EXPECT_EQ(hs_config_validate(&config, -1), HS_SUCCESS) << good << ": " << hs_last_error();
  }
}

TEST(Config, BlockSizesAndMirrorFlag) {
  hs_config_t config = default_config();
  config.block_size = 0;
  expect_invalid(hs_config_validate(&config, -1), {"block_size"});
  config = default_config();
  config.hot_block_size = -1;
  expect_invalid(hs_config_validate(&config, -1), {"hot_block_size"});
  config = default_config();
  config.eager_host_mirror = 2;
  expect_invalid(hs_config_validate(&config, -1), {"eager_host_mirror"});
  config.eager_host_mirror = 1;
  EXPECT_EQ(hs_config_validate(&config, -1), HS_SUCCESS);
}

TEST(Config, VersionedStructIsChecked) {
  hs_config_t config = default_config();
  config.struct_size = sizeof(size_t);
  expect_invalid(hs_config_validate(&config, -1), {"config", "struct_size"});
}

TEST(Config, DeviceCheckOfTheResolverSharedMemory) {
  int devices = 0;
  ASSERT_EQ(hs_cuda_device_count(&devices), HS_SUCCESS);
  hs_config_t config = default_config();
  if (devices == 0) {
    EXPECT_EQ(hs_config_validate(&config, 0), HS_ERROR_UNSUPPORTED);
    EXPECT_STRNE(hs_last_error(), "");
    return;
  }
  EXPECT_EQ(hs_config_validate(&config, 0), HS_SUCCESS) << hs_last_error();
  // Every valid shape runs: one that does not fit shared memory takes a workspace.
  config.top_k = 32767;
  config.device_buffer_size = 32767;
  config.max_union_rows = 32767;
  EXPECT_EQ(hs_config_validate(&config, 0), HS_SUCCESS) << hs_last_error();
}

TEST(ResolverSharedMemory, MatchesTheKernelLayout) {
  uint64_t bytes = 0;
  ASSERT_EQ(hs_resolver_shared_memory_bytes(4096, 2048, &bytes), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(bytes, hisparse::resolver_shared_layout(4096, 2048).total_bytes);
  EXPECT_EQ(bytes % 16, 0u);
  // The production configuration must fit an H100/H200 block (227 KiB).
  EXPECT_LE(bytes, 227u * 1024u);
}

TEST(ResolverSharedMemory, LaunchTakesTheRoomiestTableThatKeepsTheWholeStage) {
  constexpr uint64_t kH200 = 227u * 1024u;
  const auto minimum = hisparse::resolver_shared_layout(4096, 2048);
  // Plenty of room: the largest slack, and the whole stage after the layout.
  const auto roomy = hisparse::resolver_launch_layout(4096, 2048, 656, 8, kH200);
  EXPECT_EQ(roomy.layout.hash_capacity, hisparse::resolver_hash_capacity(2048, hisparse::kResolverMaxSlackHalves));
  EXPECT_GT(roomy.layout.hash_capacity, minimum.hash_capacity);
  EXPECT_EQ(roomy.stage.rows, 8);
  EXPECT_EQ(roomy.stage.stage_members, roomy.layout.total_bytes);
  EXPECT_LE(roomy.stage.total_bytes, kH200);
  // Without a stage, the launch size is the layout's.
  const auto plain = hisparse::resolver_launch_layout(4096, 2048, 0, 0, kH200);
  EXPECT_EQ(plain.layout.hash_capacity, roomy.layout.hash_capacity);
  EXPECT_EQ(plain.stage.rows, 0);
  EXPECT_EQ(plain.stage.total_bytes, plain.layout.total_bytes);
  // A limit that holds a roomier table alone but not with the stage: the
  // table gives way to the stage.
  const auto widest = hisparse::resolver_shared_layout(4096, 2048, hisparse::kResolverMaxSlackHalves);
  const auto squeezed = hisparse::resolver_launch_layout(4096, 2048, 656, 8, widest.total_bytes + 16);
  EXPECT_LT(squeezed.layout.hash_capacity, widest.hash_capacity);
  EXPECT_EQ(squeezed.stage.rows, 8);
  EXPECT_LE(squeezed.stage.total_bytes, widest.total_bytes + 16);
  // Only the minimum fits: it is taken, with what stage still fits.
  const auto tight = hisparse::resolver_launch_layout(4096, 2048, 656, 8, minimum.total_bytes + 16 + 2 * 656);
  EXPECT_EQ(tight.layout.hash_capacity, minimum.hash_capacity);
  EXPECT_EQ(tight.stage.rows, 2);
  // Production shapes stay within the H200 with the minimum (H = 5k, union 5k)
  // and never hand out hash slots that collide with the entry code markers.
  for (int32_t h : {2048, 4096, 5120, 8192, 32767}) {
    const auto chosen = hisparse::resolver_launch_layout(h, std::min(h, 5120), 656, 8, kH200);
    EXPECT_LT(chosen.layout.hash_capacity, hisparse::kResolverMaxHashCapacity) << h;
    if (hisparse::resolver_shared_layout(h, std::min(h, 5120)).total_bytes <= kH200) {
      EXPECT_LE(chosen.stage.total_bytes, kH200) << h;
    }
  }
}

TEST(ResolverSharedMemory, KeptHeldRowsFollowTheOtherArrays) {
  constexpr uint64_t kH200 = 227u * 1024u;
  const auto plain = hisparse::resolver_shared_layout(4096, 2048);
  EXPECT_EQ(plain.held_rows, hisparse::ResolverSharedLayout::kNoHeldRows);
  // The kept copy of the state row comes last, 4 * H bytes, and moves no
  // other array.
  const auto kept = hisparse::resolver_shared_layout(4096, 2048, hisparse::kResolverMinSlackHalves, true);
  EXPECT_EQ(kept.held_rows, plain.total_bytes);
  EXPECT_EQ(kept.total_bytes, plain.total_bytes + 4u * 4096u);
  EXPECT_EQ(kept.entry_codes, plain.entry_codes);
  EXPECT_EQ(kept.evictable, plain.evictable);
  // The grid's shape keeps it beside the whole stage on an H200; the launch
  // puts the stage after it.
  const auto launch =
      hisparse::resolver_launch_layout(4096, 2048, 656, 8, kH200, hisparse::kResolverMaxSlackHalves, true);
  EXPECT_NE(launch.layout.held_rows, hisparse::ResolverSharedLayout::kNoHeldRows);
  EXPECT_EQ(launch.stage.rows, 8);
  EXPECT_EQ(launch.stage.stage_members, launch.layout.total_bytes);
  EXPECT_LE(launch.stage.total_bytes, kH200);
}

TEST(ResolverSharedMemory, MonotonicInBufferSizeAndUnionRows) {
  uint64_t previous_h = 0;
  for (int32_t h = 1; h <= 32767; h = h < 64 ? h + 1 : h * 3 / 2) {
    uint64_t previous_u = 0;
    uint64_t first = 0;
    for (int32_t u = 1; u <= h; u = u < 64 ? u + 1 : u * 3 / 2) {
      uint64_t bytes = 0;
      ASSERT_EQ(hs_resolver_shared_memory_bytes(h, u, &bytes), HS_SUCCESS) << h << ", " << u;
      EXPECT_GE(bytes, previous_u) << "not monotonic in max_union_rows at H=" << h << ", union=" << u;
      previous_u = bytes;
      if (u == 1) first = bytes;
    }
    EXPECT_GE(first, previous_h) << "not monotonic in device_buffer_size at H=" << h;
    previous_h = first;
  }
  uint64_t small = 0, large = 0;
  ASSERT_EQ(hs_resolver_shared_memory_bytes(1024, 1024, &small), HS_SUCCESS);
  ASSERT_EQ(hs_resolver_shared_memory_bytes(8192, 1024, &large), HS_SUCCESS);
  EXPECT_GT(large, small);
  ASSERT_EQ(hs_resolver_shared_memory_bytes(8192, 8192, &small), HS_SUCCESS);
  EXPECT_GT(small, large);
}

TEST(ResolverSharedMemory, ArgumentsAreChecked) {
  uint64_t bytes = 0;
  expect_invalid(hs_resolver_shared_memory_bytes(0, 1, &bytes), {"device_buffer_size"});
  expect_invalid(hs_resolver_shared_memory_bytes(32768, 1, &bytes), {"device_buffer_size"});
  expect_invalid(hs_resolver_shared_memory_bytes(64, 0, &bytes), {"max_union_rows"});
  expect_invalid(hs_resolver_shared_memory_bytes(64, 65, &bytes), {"max_union_rows", "64"});
}

}  // namespace
