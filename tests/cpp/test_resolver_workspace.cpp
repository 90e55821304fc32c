// The CUDA resolver's split layouts (resolver_shared_memory.hpp) and its
// workspace argument: which arrays leave shared memory for which device
// limit, hs_resolver_workspace_bytes, and hs_resolve_residency with a
// missing, short or wrong workspace (a clear error, nothing touched) and with
// a good one (the CPU backend's bits) at a shape that needs one everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/resolver_shared_memory.hpp"
#include "expect_status.hpp"
#include "hisparse/hisparse.hpp"

#ifdef HISPARSE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace {

using hisparse::ResolverArray;

// Opt-in shared memory per block: H100/H200, A100, sm_86/sm_89.
constexpr uint64_t kHopper = 232448;
constexpr uint64_t kAmpere = 166912;
constexpr uint64_t kAda = 101376;

struct Placed {
  ResolverArray array;
  bool in_workspace;
  uint64_t begin;
  uint64_t end;
};

// Every array of a split layout with its region and byte range (the union
// table's keys and values as one range).
std::vector<Placed> placements(const hisparse::ResolverSplitLayout& split, int32_t H, int32_t U) {
  std::vector<Placed> out;
  for (int a = 0; a < hisparse::kResolverArrayCount; ++a) {
    const auto array = static_cast<ResolverArray>(a);
    const bool moved = (split.in_workspace & hisparse::resolver_array_bit(array)) != 0;
    hisparse::ResolverSharedLayout offsets = split.offsets;
    const uint64_t begin = *hisparse::resolver_array_offset(offsets, array);
    uint64_t bytes = hisparse::resolver_array_bytes(array, split.offsets.hash_capacity, static_cast<uint64_t>(H),
                                                    static_cast<uint64_t>(U));
    if (moved && array == hisparse::kResolverLruCopy) bytes = 0;  // read in place
    out.push_back({array, moved, begin, begin + bytes});
  }
  return out;
}

TEST(ResolverSplitLayout, AllSharedWhenTheLayoutFits) {
  for (auto [H, U] : {std::pair{4096, 2048}, std::pair{5120, 4096}, std::pair{32767, 32767}}) {
    const auto all = hisparse::resolver_shared_layout(H, U);
    const auto split = hisparse::resolver_split_layout(H, U, all.total_bytes);
    EXPECT_EQ(split.in_workspace, 0u) << H << ", " << U;
    EXPECT_EQ(split.workspace_row_bytes, 0u);
    EXPECT_EQ(split.offsets.total_bytes, all.total_bytes);
    EXPECT_EQ(split.offsets.hash_values, all.hash_values);
    EXPECT_EQ(split.offsets.entry_codes, all.entry_codes);
    EXPECT_EQ(split.offsets.scratch, all.scratch);
    EXPECT_EQ(hisparse::resolver_workspace_bytes(256, H, U, all.total_bytes), 0u);
    // One byte less and something moves.
    EXPECT_NE(hisparse::resolver_split_layout(H, U, all.total_bytes - 1).in_workspace, 0u);
  }
  // The default shape (113,840 B) stays all-shared on sm_80 and sm_90, not in 99 KiB.
  EXPECT_EQ(hisparse::resolver_shared_layout(4096, 2048).total_bytes, 113840u);
  for (uint64_t limit : {kHopper, kAmpere}) {
    EXPECT_EQ(hisparse::resolver_split_layout(4096, 2048, limit).in_workspace, 0u) << limit;
  }
  EXPECT_NE(hisparse::resolver_split_layout(4096, 2048, kAda).in_workspace, 0u);
}

TEST(ResolverSplitLayout, VllmMtp3OnHopper) {
  // H = 10,240 with a union of 8,192 (k = 2048, 4 token rows): 328,880 B all-shared.
  EXPECT_EQ(hisparse::resolver_shared_layout(10240, 8192).total_bytes, 328880u);
  const auto split = hisparse::resolver_split_layout(10240, 8192, kHopper);
  using hisparse::resolver_array_bit;
  EXPECT_EQ(split.in_workspace,
            resolver_array_bit(hisparse::kResolverLruCopy) | resolver_array_bit(hisparse::kResolverEntryCodes) |
                resolver_array_bit(hisparse::kResolverEvictable) | resolver_array_bit(hisparse::kResolverMemberFirst));
  EXPECT_EQ(split.workspace_row_bytes, 2u * 8192 + 4u * 10240 + 4u * 8192);
  EXPECT_LE(split.offsets.total_bytes, kHopper);
  EXPECT_EQ(hisparse::resolver_workspace_bytes(256, 10240, 8192, kHopper), 256u * split.workspace_row_bytes);
}

// For every shape and limit: the moved arrays are the shortest prefix of the
// spill order that fits, the shared part fits, no two arrays of one region
// overlap, everything is 16-byte aligned, and the fill runs cover exactly
// the arrays that start as all-ones and as zero in each region.
TEST(ResolverSplitLayout, EveryShapeFitsWithTheFewestArraysMoved) {
  const uint64_t scratch_end_words = 4ull * hisparse::kScratchZeroedWords;
  for (uint64_t limit : {kHopper, kAmpere, kAda, uint64_t{48} * 1024}) {
    for (int32_t H : {1, 64, 2048, 4096, 6144, 8192, 10240, 13000, 16384, 32767}) {
      for (int32_t U : {1, 2048, 4096, 6144, 8192, 16384, 32767}) {
        if (U > H) continue;
        SCOPED_TRACE("limit " + std::to_string(limit) + " H " + std::to_string(H) + " U " + std::to_string(U));
        const auto split = hisparse::resolver_split_layout(H, U, limit);
        ASSERT_LE(split.offsets.total_bytes, limit);
        EXPECT_LT(split.offsets.hash_capacity, hisparse::kResolverMaxHashCapacity);
        int moved = 0;
        while (moved < hisparse::kResolverArrayCount &&
               (split.in_workspace & hisparse::resolver_array_bit(hisparse::kResolverSpillOrder[moved]))) {
          ++moved;
        }
        uint32_t prefix = 0;
        for (int i = 0; i < moved; ++i) prefix |= hisparse::resolver_array_bit(hisparse::kResolverSpillOrder[i]);
        EXPECT_EQ(split.in_workspace, prefix) << "not a prefix of the spill order";
        if (moved > 0) {
          // One array fewer would not have fit.
          uint64_t shared = hisparse::resolver_shared_layout(H, U).total_bytes;
          for (int i = 0; i < moved - 1; ++i) {
            shared -=
                hisparse::resolver_array_bytes(hisparse::kResolverSpillOrder[i], split.offsets.hash_capacity, H, U);
          }
          EXPECT_GT(shared, limit);
        }
        const auto placed = placements(split, H, U);
        uint64_t workspace_end = 0;
        for (const Placed& a : placed) {
          EXPECT_EQ(a.begin % 16, 0u) << a.array;
          if (a.in_workspace) workspace_end = std::max(workspace_end, a.end);
          if (!a.in_workspace) EXPECT_LE(a.end, split.offsets.total_bytes) << a.array;
          for (const Placed& b : placed) {
            if (&a == &b || a.in_workspace != b.in_workspace || a.begin == a.end || b.begin == b.end) continue;
            EXPECT_TRUE(a.end <= b.begin || b.end <= a.begin) << a.array << " overlaps " << b.array;
          }
          // Scratch (shared) never overlaps a shared array.
          if (!a.in_workspace && a.begin != a.end) {
            const uint64_t scratch_end = split.offsets.scratch + 4ull * hisparse::kResolverScratchWords;
            EXPECT_TRUE(a.end <= split.offsets.scratch || scratch_end <= a.begin) << a.array << " overlaps scratch";
          }
        }
        EXPECT_EQ(split.workspace_row_bytes, workspace_end);
        EXPECT_EQ(split.workspace_row_bytes % 16, 0u);
        // Fill runs: [0, ones) all-ones, [zero, zero + n) zero, per region.
        for (bool workspace : {false, true}) {
          const uint64_t ones_end = 16ull * (workspace ? split.workspace_ones_vectors : split.shared_ones_vectors);
          const uint64_t zero_begin = workspace ? split.workspace_zero : split.shared_zero;
          const uint64_t zero_end =
              zero_begin + 16ull * (workspace ? split.workspace_zero_vectors : split.shared_zero_vectors);
          EXPECT_EQ(ones_end, zero_begin);
          for (const Placed& a : placed) {
            if (a.in_workspace != workspace || a.begin == a.end) continue;
            const bool ones = a.array == hisparse::kResolverTable || a.array == hisparse::kResolverMemberSlots;
            const bool zero = a.array == hisparse::kResolverSlotInfo || a.array == hisparse::kResolverMemberHeld;
            EXPECT_EQ(ones, a.end <= ones_end) << a.array;
            EXPECT_EQ(zero, a.begin >= zero_begin && a.end <= zero_end) << a.array;
          }
          if (!workspace) EXPECT_EQ(zero_end, split.offsets.scratch + scratch_end_words);
        }
      }
    }
  }
}

TEST(ResolverWorkspaceBytes, ArgumentsAreChecked) {
  uint64_t bytes = 0;
  expect_error(hs_resolver_workspace_bytes(4, 4096, 2048, 0, nullptr), HS_ERROR_INVALID_ARGUMENT, {"bytes"});
  expect_error(hs_resolver_workspace_bytes(-1, 4096, 2048, 0, &bytes), HS_ERROR_INVALID_ARGUMENT,
               {"num_state_rows", "-1"});
  expect_error(hs_resolver_workspace_bytes(4, 32768, 2048, 0, &bytes), HS_ERROR_INVALID_ARGUMENT,
               {"device_buffer_size", "32768"});
  expect_error(hs_resolver_workspace_bytes(4, 64, 65, 0, &bytes), HS_ERROR_INVALID_ARGUMENT, {"max_union_rows", "65"});
  expect_error(hs_resolver_workspace_bytes(4, 4096, 2048, -1, &bytes), HS_ERROR_INVALID_ARGUMENT, {"device", "-1"});
}

TEST(ResolverWorkspaceBytes, FollowsTheDeviceLimit) {
  int devices = 0;
  ASSERT_EQ(hs_cuda_device_count(&devices), HS_SUCCESS);
  uint64_t bytes = 1;
  if (devices == 0) {
    EXPECT_NE(hs_resolver_workspace_bytes(4, 4096, 2048, 0, &bytes), HS_SUCCESS);
    return;
  }
  hs_device_properties_t props{};
  props.struct_size = sizeof(props);
  ASSERT_EQ(hs_cuda_device_properties(0, &props), HS_SUCCESS) << hs_last_error();
  ASSERT_EQ(hs_resolver_workspace_bytes(300, 4096, 2048, 0, &bytes), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(bytes, 0u);
  for (auto [H, U] : {std::pair{10240, 8192}, std::pair{16384, 8192}, std::pair{32767, 32767}}) {
    ASSERT_EQ(hs_resolver_workspace_bytes(300, H, U, 0, &bytes), HS_SUCCESS) << hs_last_error();
    EXPECT_EQ(bytes, hisparse::resolver_workspace_bytes(300, H, U, props.max_shared_memory_per_block)) << H;
  }
  EXPECT_GT(bytes, 0u);  // nothing holds H = U = 32767 in one block
  // Every valid configuration is accepted on the device.
  hs_config_t config;
  hs_config_init(&config);
  config.top_k = 2048;
  config.device_buffer_size = 32767;
  config.max_union_rows = 32767;
  EXPECT_EQ(hs_config_validate(&config, 0), HS_SUCCESS) << hs_last_error();
}

#ifdef HISPARSE_WITH_CUDA
// Device memory holding a copy of a host vector.
template <typename T>
struct DeviceVector {
  explicit DeviceVector(const std::vector<T>& host) : size(host.size()) {
    EXPECT_EQ(cudaMalloc(&data, std::max<size_t>(1, size) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data, host.data(), size * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceVector() { cudaFree(data); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  std::vector<T> download() const {
    std::vector<T> out(size);
    EXPECT_EQ(cudaMemcpy(out.data(), data, size * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
  T* data = nullptr;
  size_t size;
};

// Two speculative requests (4 token rows of k = 2048 each, a union of up to
// 8,192) on hot buffers of 32,767 slots: no device keeps that in one block.
struct LargeProblem {
  static constexpr int64_t K = 2048, Q = 4, B = 2, S = 3, H = 32767, U = 8192, kHotBlock = 64;
  static constexpr int64_t T = B * Q, kHotBlocks = (H + kHotBlock - 1) / kHotBlock;
  std::vector<int32_t> topk, req, state, dgi, hot_table;
  std::vector<int16_t> lru;
  std::vector<int64_t> stats = std::vector<int64_t>(5, 0);
  std::vector<std::vector<int32_t>> outputs;  // 6 x [T, K], then 2 x [T]

  LargeProblem() {
    std::mt19937 rng(5);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) topk.push_back(static_cast<int32_t>(rng() % 40000) - 100);  // some < 0
      req.push_back(static_cast<int32_t>(t / Q));
    }
    state = {2, 0};
    dgi.assign(S * H, -1);
    for (int64_t s = 0; s < S; ++s) {
      std::vector<int16_t> order(H);
      for (int64_t j = 0; j < H; ++j) order[j] = static_cast<int16_t>(j);
      std::shuffle(order.begin(), order.end(), rng);
      lru.insert(lru.end(), order.begin(), order.end());
      for (int64_t j = 0; j < H; j += 3) dgi[s * H + j] = static_cast<int32_t>(rng() % 40000);  // warm, partly hits
    }
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < kHotBlocks; ++i) hot_table.push_back(static_cast<int32_t>(b * kHotBlocks + i));
    }
    for (int i = 0; i < 6; ++i) outputs.emplace_back(T * K, -77);
    for (int i = 0; i < 2; ++i) outputs.emplace_back(T, -77);
  }
};

// The tensors of one call of LargeProblem on one device, and its args.
struct LargeCall {
  LargeCall(const std::vector<void*>& pointers, hs_device_type_t device_type)
      : topk(pointers[0], HS_DTYPE_INT32, {LargeProblem::T, LargeProblem::K}, device_type, 0),
        req(pointers[1], HS_DTYPE_INT32, {LargeProblem::T}, device_type, 0),
        state(pointers[2], HS_DTYPE_INT32, {LargeProblem::B}, device_type, 0),
        dgi(pointers[3], HS_DTYPE_INT32, {LargeProblem::S, LargeProblem::H}, device_type, 0),
        lru(pointers[4], HS_DTYPE_INT16, {LargeProblem::S, LargeProblem::H}, device_type, 0),
        hot_table(pointers[5], HS_DTYPE_INT32, {LargeProblem::B, LargeProblem::kHotBlocks}, device_type, 0),
        stats(pointers[6], HS_DTYPE_INT64, {5}, device_type, 0) {
    for (int i = 0; i < 6; ++i) {
      out.push_back(hs::Tensor(pointers[7 + i], HS_DTYPE_INT32, {LargeProblem::T, LargeProblem::K}, device_type, 0));
    }
    for (int i = 0; i < 2; ++i) {
      out.push_back(hs::Tensor(pointers[13 + i], HS_DTYPE_INT32, {LargeProblem::T}, device_type, 0));
    }
    hs_resolve_residency_args_init(&args);
    args.topk_indices = topk;
    args.req_id_per_token = req;
    args.request_state_indices = state;
    args.device_global_indices = dgi;
    args.lru_slots = lru;
    args.hot_block_table = hot_table;
    args.hot_block_size = LargeProblem::kHotBlock;
    args.attention_block_stride = LargeProblem::kHotBlock;
    args.host_rows = 39000;
    args.max_union_rows = LargeProblem::U;
    args.out_attention = out[0];
    args.out_hot_rows = out[1];
    args.out_resolved = out[2];
    args.out_miss_mask = out[3];
    args.out_swap_host_rows = out[4];
    args.out_swap_device_rows = out[5];
    args.out_valid_counts = out[6];
    args.out_swap_counts = out[7];
    args.stats = stats;
  }
  hs::Tensor topk, req, state, dgi, lru, hot_table, stats;
  std::vector<hs::Tensor> out;
  hs_resolve_residency_args_t args;
};
#endif

// A shape that needs a workspace on every device: a missing, short, wrong or
// misaligned one fails naming `workspace` and touches nothing; a good one
// gives the CPU backend's outputs and state.
TEST(ResolverWorkspaceCuda, RequiredCheckedAndBitExact) {
  int devices = 0;
  ASSERT_EQ(hs_cuda_device_count(&devices), HS_SUCCESS);
  if (devices == 0) GTEST_SKIP() << "no CUDA device";
#ifndef HISPARSE_WITH_CUDA
  GTEST_SKIP() << "built without the CUDA backend";
#else
  LargeProblem cpu;
  LargeProblem start = cpu;
  {
    std::vector<void*> pointers = {cpu.topk.data(), cpu.req.data(),       cpu.state.data(), cpu.dgi.data(),
                                   cpu.lru.data(),  cpu.hot_table.data(), cpu.stats.data()};
    for (auto& o : cpu.outputs) pointers.push_back(o.data());
    LargeCall call(pointers, HS_DEVICE_CPU);
    ASSERT_EQ(hs_resolve_residency(&call.args, nullptr), HS_SUCCESS) << hs_last_error();
  }
  DeviceVector<int32_t> topk(start.topk), req(start.req), state(start.state), dgi(start.dgi), hot(start.hot_table);
  DeviceVector<int16_t> lru(start.lru);
  DeviceVector<int64_t> stats(start.stats);
  std::vector<std::unique_ptr<DeviceVector<int32_t>>> outputs;
  std::vector<void*> pointers = {topk.data, req.data, state.data, dgi.data, lru.data, hot.data, stats.data};
  for (const auto& o : start.outputs) {
    outputs.push_back(std::make_unique<DeviceVector<int32_t>>(o));
    pointers.push_back(outputs.back()->data);
  }
  LargeCall call(pointers, HS_DEVICE_CUDA);
  uint64_t required = 0;
  ASSERT_EQ(hs_resolver_workspace_bytes(LargeProblem::S, LargeProblem::H, LargeProblem::U, 0, &required), HS_SUCCESS);
  ASSERT_GT(required, 0u);
  const std::string required_text = std::to_string(required);
  DeviceVector<uint8_t> workspace(std::vector<uint8_t>(required + 16, 0xAB));

  const auto untouched = [&] {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(dgi.download(), start.dgi);
    EXPECT_EQ(lru.download(), start.lru);
    EXPECT_EQ(stats.download(), start.stats);
    for (size_t i = 0; i < outputs.size(); ++i) EXPECT_EQ(outputs[i]->download(), start.outputs[i]) << i;
  };
  struct Bad {
    const char* what;
    hs::Tensor tensor;
    bool present;
    std::vector<const char*> fragments;
  };
  const int64_t ws_rows = static_cast<int64_t>(required);
  const Bad bad[] = {
      {"missing",
       hs::Tensor(workspace.data, HS_DTYPE_UINT8, {ws_rows}, HS_DEVICE_CUDA, 0),
       false,
       {"workspace", "NULL", required_text.c_str(), "hs_resolver_workspace_bytes"}},
      {"short",
       hs::Tensor(workspace.data, HS_DTYPE_UINT8, {ws_rows - 16}, HS_DEVICE_CUDA, 0),
       true,
       {"workspace", "at least", required_text.c_str()}},
      {"dtype",
       hs::Tensor(workspace.data, HS_DTYPE_INT32, {ws_rows / 4}, HS_DEVICE_CUDA, 0),
       true,
       {"workspace", "uint8"}},
      {"on the host", hs::Tensor(start.dgi.data(), HS_DTYPE_UINT8, {ws_rows}), true, {"workspace"}},
      {"misaligned",
       hs::Tensor(workspace.data + 8, HS_DTYPE_UINT8, {ws_rows}, HS_DEVICE_CUDA, 0),
       true,
       {"workspace", "aligned to 16"}},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    call.args.workspace = b.present ? b.tensor.get() : nullptr;
    const hs_status_t status = hs_resolve_residency(&call.args, nullptr);
    EXPECT_NE(status, HS_SUCCESS);
    expect_error_with(status, status, b.fragments);
    untouched();
  }
  const hs::Tensor good(workspace.data, HS_DTYPE_UINT8, {ws_rows}, HS_DEVICE_CUDA, 0);
  call.args.workspace = good;
  ASSERT_EQ(hs_resolve_residency(&call.args, nullptr), HS_SUCCESS) << hs_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(dgi.download(), cpu.dgi);
  EXPECT_EQ(lru.download(), cpu.lru);
  EXPECT_EQ(stats.download(), cpu.stats);
  EXPECT_GT(cpu.stats[2], 0);  // misses
  EXPECT_GT(cpu.stats[1], 0);  // hits
  for (size_t i = 0; i < outputs.size(); ++i) EXPECT_EQ(outputs[i]->download(), cpu.outputs[i]) << "output " << i;
#endif
}

}  // namespace
