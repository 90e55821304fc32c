// hs_gather_compact_group through the C ABI: a by-hand case (copies, zero
// fill, clamped counts, skipped entries, padding rows) on the CPU backend,
// the same bytes as one hs_gather_compact call per piece (P = 1 and P = 4,
// separate hot caches and slices of one slab), arguments that fail naming
// themselves and leave the hot caches untouched, and on a CUDA device the
// bytes of the CPU backend. The shape sweep lives in
// tests/python/test_gather_group.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "expect_status.hpp"
#include "hisparse/hisparse.hpp"

#ifdef HISPARSE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace {

// A 16-byte aligned byte buffer.
struct Bytes {
  explicit Bytes(size_t size, uint8_t fill = 0) : size(size), storage(size + 16, fill) {
    base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(storage.data()) + 15) / 16 * 16);
  }
  std::vector<uint8_t> bytes() const { return std::vector<uint8_t>(base, base + size); }
  size_t size;
  std::vector<uint8_t> storage;
  uint8_t* base = nullptr;
};

// A token-major host cache [slots, layers, row_bytes]; the group reads
// layers first_layer .. first_layer + pieces - 1 of every slot.
struct HostCache {
  HostCache(int64_t slots, int64_t layers, int64_t row_bytes, uint32_t seed)
      : slots(slots), layers(layers), row_bytes(row_bytes), memory(static_cast<size_t>(slots * layers * row_bytes)) {
    std::mt19937 gen(seed);
    for (size_t i = 0; i < memory.size; ++i) memory.base[i] = static_cast<uint8_t>(gen());
  }
  // host_cache of the group: [slots, pieces, row_bytes] at a pitch of `layers` rows.
  hs::Tensor group(int64_t first_layer, int64_t pieces) const {
    return hs::Tensor(memory.base + first_layer * row_bytes, HS_DTYPE_UINT8, {slots, pieces, row_bytes})
        .strides({layers * row_bytes, row_bytes, 1});
  }
  // host_cache of hs_gather_compact for one layer: [slots, row_bytes] at the same pitch.
  hs::Tensor layer(int64_t index) const {
    return hs::Tensor(memory.base + index * row_bytes, HS_DTYPE_UINT8, {slots, row_bytes})
        .strides({layers * row_bytes, 1});
  }
  int64_t slots, layers, row_bytes;
  Bytes memory;
};

// P hot caches [blocks, hbs, row_bytes] at a block stride of `stride` rows:
// separate buffers (with guard rows around each) or back-to-back layers of
// one slab. The bytes of every buffer, guards included, are what tests compare.
struct HotCaches {
  static constexpr int64_t kGuardRows = 2;

  HotCaches(int64_t pieces, int64_t blocks, int64_t hbs, int64_t stride, int64_t row_bytes, bool slab, uint32_t seed)
      : pieces(pieces), blocks(blocks), hbs(hbs), stride(stride), row_bytes(row_bytes) {
    const int64_t layer_rows = blocks * stride;
    std::mt19937 gen(seed);
    if (slab) {
      buffers.emplace_back(static_cast<size_t>((2 * kGuardRows + pieces * layer_rows) * row_bytes));
      for (int64_t i = 0; i < pieces; ++i) placements.push_back({0, kGuardRows + i * layer_rows});
    } else {
      for (int64_t i = 0; i < pieces; ++i) {
        buffers.emplace_back(static_cast<size_t>((2 * kGuardRows + layer_rows) * row_bytes));
        placements.push_back({static_cast<size_t>(i), kGuardRows});
      }
    }
    for (Bytes& b : buffers) {
      for (size_t j = 0; j < b.size; ++j) b.base[j] = static_cast<uint8_t>(gen());
    }
  }

  // Descriptors of the P caches whose memory starts at bases[i].
  void describe(const std::vector<uint8_t*>& bases, hs_device_type_t device_type) {
    tensors.clear();
    tensors.reserve(static_cast<size_t>(pieces));
    for (int64_t i = 0; i < pieces; ++i) {
      tensors.push_back(hs::Tensor(bases[static_cast<size_t>(i)], HS_DTYPE_UINT8, {blocks, hbs, row_bytes}, device_type)
                            .strides({stride * row_bytes, row_bytes, 1}));
    }
    pointers.clear();
    for (const hs::Tensor& t : tensors) pointers.push_back(t.get());
  }
  std::vector<uint8_t*> host_bases() const {
    std::vector<uint8_t*> bases;
    for (const auto& [buffer, row] : placements) bases.push_back(buffers[buffer].base + row * row_bytes);
    return bases;
  }
  std::vector<std::vector<uint8_t>> contents() const {
    std::vector<std::vector<uint8_t>> out;
    for (const Bytes& b : buffers) out.push_back(b.bytes());
    return out;
  }

  int64_t pieces, blocks, hbs, stride, row_bytes;
  std::vector<Bytes> buffers;
  std::vector<std::pair<size_t, int64_t>> placements;  // (buffer, first row) of each cache
  std::vector<hs::Tensor> tensors;
  std::vector<const hs_tensor_t*> pointers;
};

// Swap lists [R, K] with distinct destinations (some past the hot cache),
// zero-fill slots, negative slots and destinations, counts past K, negative
// and zero, and a trailing count past R that must not be read.
struct SwapLists {
  SwapLists(int64_t rows, int64_t k, int64_t slots, int64_t physical_rows, uint32_t seed) : rows(rows), k(k) {
    std::mt19937 gen(seed);
    std::vector<int32_t> dest(static_cast<size_t>(physical_rows + 24));
    std::iota(dest.begin(), dest.end(), 0);
    std::shuffle(dest.begin(), dest.end(), gen);
    const size_t n = static_cast<size_t>(rows * k);
    dest.resize(n, -1);
    swap_dev = dest;
    swap_host.resize(n);
    for (size_t i = 0; i < n; ++i) swap_host[i] = static_cast<int32_t>(gen() % static_cast<uint32_t>(slots));
    for (size_t i = 0; i < n; i += 7) swap_host[i] = static_cast<int32_t>(slots + i % 3);  // zero fill
    for (size_t i = 3; i < n; i += 11) swap_host[i] = -1;
    for (size_t i = 5; i < n; i += 13) swap_dev[i] = -2;
    counts.resize(static_cast<size_t>(rows + 1));
    for (int64_t t = 0; t < rows; ++t) counts[t] = static_cast<int32_t>(gen() % static_cast<uint32_t>(k + 4)) - 2;
    counts[0] = static_cast<int32_t>(k + 3);
    if (rows > 1) counts[1] = -5;
    if (rows > 2) counts[2] = 0;
    counts[rows] = static_cast<int32_t>(k);
  }
  int64_t rows, k;
  std::vector<int32_t> swap_host, swap_dev, counts;
};

hs_gather_compact_group_args_t group_args(const hs_tensor_t* host, const HotCaches& hot, const hs_tensor_t* sh,
                                          const hs_tensor_t* sd, const hs_tensor_t* sc) {
  hs_gather_compact_group_args_t args;
  hs_gather_compact_group_args_init(&args);
  args.num_hot_caches = static_cast<int32_t>(hot.pointers.size());
  args.host_cache = host;
  args.hot_caches = hot.pointers.data();
  args.swap_host_rows = sh;
  args.swap_device_rows = sd;
  args.swap_counts = sc;
  args.hot_block_size = hot.hbs;
  args.hot_block_stride = hot.stride;
  return args;
}

// Runs the group on the CPU backend, then P hs_gather_compact calls on a
// fresh copy of the hot caches; expects equal bytes and some change.
void expect_group_equals_single_calls(int64_t pieces, bool slab, uint32_t seed) {
  const int64_t slots = 90, layers = pieces + 2, first_layer = 1, row_bytes = 48;
  const int64_t blocks = 12, hbs = 4, stride = 6, rows = 4, k = 16;
  HostCache host(slots, layers, row_bytes, seed);
  SwapLists swap(rows, k, slots, blocks * hbs, seed + 1);
  hs::Tensor sh(swap.swap_host.data(), HS_DTYPE_INT32, {rows, k});
  hs::Tensor sd(swap.swap_dev.data(), HS_DTYPE_INT32, {rows, k});
  hs::Tensor sc(swap.counts.data(), HS_DTYPE_INT32, {rows + 1});

  HotCaches group(pieces, blocks, hbs, stride, row_bytes, slab, seed + 2);
  group.describe(group.host_bases(), HS_DEVICE_CPU);
  const auto before = group.contents();
  const hs::Tensor host_cache = host.group(first_layer, pieces);
  hs_gather_compact_group_args_t args = group_args(host_cache, group, sh, sd, sc);
  ASSERT_EQ(hs_gather_compact_group(&args, nullptr), HS_SUCCESS) << hs_last_error();

  HotCaches single(pieces, blocks, hbs, stride, row_bytes, slab, seed + 2);
  single.describe(single.host_bases(), HS_DEVICE_CPU);
  ASSERT_EQ(single.contents(), before);
  for (int64_t i = 0; i < pieces; ++i) {
    const hs::Tensor layer = host.layer(first_layer + i);
    hs_gather_compact_args_t one;
    hs_gather_compact_args_init(&one);
    one.host_cache = layer;
    one.hot_cache = single.pointers[static_cast<size_t>(i)];
    one.swap_host_rows = sh;
    one.swap_device_rows = sd;
    one.swap_counts = sc;
    one.hot_block_size = hbs;
    one.hot_block_stride = stride;
    ASSERT_EQ(hs_gather_compact(&one, nullptr), HS_SUCCESS) << hs_last_error();
  }
  const auto got = group.contents();
  EXPECT_NE(got, before);
  ASSERT_EQ(got.size(), single.buffers.size());
  for (size_t b = 0; b < got.size(); ++b) EXPECT_EQ(got[b], single.buffers[b].bytes()) << "buffer " << b;
}

TEST(GatherCompactGroup, ByHandZeroFillClampsSkipsAndPaddingRows) {
  // Slot s, layer l holds 16 bytes of value 16 * s + l + 1; pieces are layers 1..3.
  const int64_t slots = 6, layers = 4, row_bytes = 16, pieces = 3;
  Bytes host(static_cast<size_t>(slots * layers * row_bytes));
  for (int64_t s = 0; s < slots; ++s) {
    for (int64_t l = 0; l < layers; ++l) {
      std::memset(host.base + (s * layers + l) * row_bytes, static_cast<int>(16 * s + l + 1), row_bytes);
    }
  }
  hs::Tensor host_cache = hs::Tensor(host.base + row_bytes, HS_DTYPE_UINT8, {slots, pieces, row_bytes})
                              .strides({layers * row_bytes, row_bytes, 1});
  // Three separate 2-D caches of 10 rows: blocks of 2 rows, 3 rows apart, the
  // view ending inside block 3 (offset 10 lies past it). Each buffer holds 12
  // rows, so a write past the view would show.
  const int64_t view_rows = 10, hot_rows = 12;
  std::vector<Bytes> hot;
  for (int i = 0; i < pieces; ++i) hot.emplace_back(static_cast<size_t>(hot_rows * row_bytes), 0xA0 + i);
  std::vector<hs::Tensor> hot_t;
  for (auto& h : hot) hot_t.emplace_back(h.base, HS_DTYPE_UINT8, std::initializer_list<int64_t>{view_rows, row_bytes});
  const hs_tensor_t* hot_ptrs[] = {hot_t[0], hot_t[1], hot_t[2]};

  std::vector<int32_t> swap_host = {3, 6, -1, 5, 4,   //
                                    1, 2, 3,  4, 0,    //
                                    2, 2, 2,  2, 2,    //
                                    1, 1, 1,  1, 1};
  std::vector<int32_t> swap_dev = {0, 3, 1,  20, 6,    //
                                   7, 2, -1, 4,  5,    //
                                   1, 1, 1,  1,  1,     //
                                   6, 6, 6,  6,  6};
  std::vector<int32_t> counts = {4, 9, 0, -2, 5};  // 4 used; clamped to 5; padding; clamped to 0; past R
  hs::Tensor sh(swap_host.data(), HS_DTYPE_INT32, {4, 5});
  hs::Tensor sd(swap_dev.data(), HS_DTYPE_INT32, {4, 5});
  hs::Tensor sc(counts.data(), HS_DTYPE_INT32, {5});
  hs_gather_compact_group_args_t args;
  hs_gather_compact_group_args_init(&args);
  args.num_hot_caches = pieces;
  args.host_cache = host_cache;
  args.hot_caches = hot_ptrs;
  args.swap_host_rows = sh;
  args.swap_device_rows = sd;
  args.swap_counts = sc;
  args.hot_block_size = 2;
  args.hot_block_stride = 3;
  ASSERT_EQ(hs_gather_compact_group(&args, nullptr), HS_SUCCESS) << hs_last_error();

  auto offset = [](int64_t d) { return (d / 2) * 3 + d % 2; };
  for (int64_t i = 0; i < pieces; ++i) {
    auto value = [&](int64_t slot) { return static_cast<int>(16 * slot + (1 + i) + 1); };
    std::vector<int> want(static_cast<size_t>(hot_rows), 0xA0 + static_cast<int>(i));
    want[offset(0)] = value(3);
    want[offset(3)] = 0;  // slot 6 of 6: zero fill
    // (-1 -> 1) skipped; (5 -> 20): offset 30 is outside the view; (4 -> 6) past count 4
    // (1 -> 7): offset 10 is outside the 10-row view
    want[offset(2)] = value(2);
    // (3 -> -1) skipped
    want[offset(4)] = value(4);
    want[offset(5)] = value(0);
    // rows 2 (count 0) and 3 (count -2) write nothing: offsets 1 and 9 keep their fill,
    // and so do offsets 10 and 11 past the view
    for (int64_t r = 0; r < hot_rows; ++r) {
      for (int64_t b = 0; b < row_bytes; ++b) {
        ASSERT_EQ(hot[i].base[r * row_bytes + b], want[r]) << "hot_caches[" << i << "] row offset " << r;
      }
    }
  }
}

TEST(GatherCompactGroup, OnePieceEqualsGatherCompact) { expect_group_equals_single_calls(1, false, 11); }

TEST(GatherCompactGroup, FourPiecesEqualFourGatherCompactCalls) {
  expect_group_equals_single_calls(4, false, 21);
  expect_group_equals_single_calls(4, true, 31);
}

TEST(GatherCompactGroup, SixteenPiecesInOneSlab) {
  expect_group_equals_single_calls(HS_MAX_GATHER_GROUP_PIECES, true, 41);
}

TEST(GatherCompactGroup, ErrorsNameTheArgumentAndTouchNothing) {
  HostCache host(8, 4, 32, 5);
  HotCaches hot(2, 2, 4, 4, 32, false, 6);
  hot.describe(hot.host_bases(), HS_DEVICE_CPU);
  const auto before = hot.contents();
  std::vector<int32_t> swap = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<int32_t> counts = {4, 4};
  hs::Tensor sh(swap.data(), HS_DTYPE_INT32, {2, 4});
  hs::Tensor sc(counts.data(), HS_DTYPE_INT32, {2});
  const hs::Tensor host_cache = host.group(1, 2);
  const hs_gather_compact_group_args_t good = group_args(host_cache, hot, sh, sh, sc);

  hs_gather_compact_group_args_t a = good;
  a.struct_size = offsetof(hs_gather_compact_group_args_t, max_blocks);
  expect_error(hs_gather_compact_group(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"args", "struct_size"});
  expect_error(hs_gather_compact_group(nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT, {"args"});

  for (int32_t count : {0, -1, HS_MAX_GATHER_GROUP_PIECES + 1}) {
    a = good;
    a.num_hot_caches = count;
    expect_error(hs_gather_compact_group(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"num_hot_caches"});
  }
  a = good;
  a.hot_caches = nullptr;
  expect_error(hs_gather_compact_group(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"hot_caches"});

  const hs_tensor_t* with_null[] = {hot.pointers[0], nullptr};
  a = good;
  a.hot_caches = with_null;
  expect_error(hs_gather_compact_group(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"hot_caches[1]"});

  // hot_caches[1] with one block fewer than hot_caches[0].
  hs::Tensor fewer_blocks = hs::Tensor(hot.host_bases()[1], HS_DTYPE_UINT8, {1, 4, 32}).strides({128, 32, 1});
  const hs_tensor_t* mismatched[] = {hot.pointers[0], fewer_blocks};
  a = good;
  a.hot_caches = mismatched;
  expect_error(hs_gather_compact_group(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"hot_caches[1]", "[2, 4, 32]"});

  // The dtype of host_cache (uint8) on every cache.
  hs::Tensor halves = hs::Tensor(hot.host_bases()[0], HS_DTYPE_FLOAT16, {2, 4, 16}).strides({64, 16, 1});
  hs::Tensor halves1 = hs::Tensor(hot.host_bases()[1], HS_DTYPE_FLOAT16, {2, 4, 16}).strides({64, 16, 1});
  const hs_tensor_t* both_halves[] = {halves, halves1};
  a = good;
  a.hot_caches = both_halves;
  expect_error(hs_gather_compact_group(&a, nullptr), HS_ERROR_INVALID_DTYPE, {"hot_caches[0]", "uint8", "float16"});

  // host_cache: [..., P, W] with P == num_hot_caches and the pieces back to back.
  const hs::Tensor flat_host = host.layer(1);
  a = good;
  a.host_cache = flat_host;
  expect_error(hs_gather_compact_group(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"host_cache"});
  const hs::Tensor three_pieces = host.group(1, 3);
  a = good;
  a.host_cache = three_pieces;
  expect_error(hs_gather_compact_group(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"host_cache"});
  const hs::Tensor gapped =
      hs::Tensor(host.memory.base, HS_DTYPE_UINT8, {8, 2, 32}).strides({4 * 32, 2 * 32, 1});  // layers 0 and 2
  a = good;
  a.host_cache = gapped;
  expect_error(hs_gather_compact_group(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"host_cache"});
  const hs::Tensor odd_pitch = hs::Tensor(host.memory.base, HS_DTYPE_UINT8, {4, 2, 32}).strides({72, 32, 1});
  a = good;
  a.host_cache = odd_pitch;
  expect_error(hs_gather_compact_group(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"host_cache", "16"});
  const hs::Tensor overlapping = hs::Tensor(host.memory.base, HS_DTYPE_UINT8, {8, 2, 32}).strides({32, 32, 1});
  a = good;
  a.host_cache = overlapping;
  expect_error(hs_gather_compact_group(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"host_cache"});

  a = good;
  a.hot_block_size = 0;
  expect_error(hs_gather_compact_group(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"hot_block_size"});
  a = good;
  a.max_blocks = -1;
  expect_error(hs_gather_compact_group(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"max_blocks"});
  hs::Tensor short_counts(counts.data(), HS_DTYPE_INT32, {1});
  a = good;
  a.swap_counts = short_counts;
  expect_error(hs_gather_compact_group(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"swap_counts"});

  EXPECT_EQ(hot.contents(), before);
  a = good;
  ASSERT_EQ(hs_gather_compact_group(&a, nullptr), HS_SUCCESS) << hs_last_error();
  EXPECT_NE(hot.contents(), before);
}

TEST(GatherCompactGroup, HotCachesWithDifferentStridesFail) {
  // Two 4-D caches of one shape [2, 2, 4, 32]: the second's outer stride is doubled.
  Bytes first(2 * 2 * 4 * 32), second(2 * 2 * 2 * 4 * 32);
  hs::Tensor a0 = hs::Tensor(first.base, HS_DTYPE_UINT8, {2, 2, 4, 32}).strides({256, 128, 32, 1});
  hs::Tensor a1 = hs::Tensor(second.base, HS_DTYPE_UINT8, {2, 2, 4, 32}).strides({512, 128, 32, 1});
  const hs_tensor_t* caches[] = {a0, a1};
  HostCache host(8, 2, 32, 9);
  const hs::Tensor host_cache = host.group(0, 2);
  std::vector<int32_t> swap = {0, 1, 2, 3};
  std::vector<int32_t> counts = {4};
  hs::Tensor sh(swap.data(), HS_DTYPE_INT32, {1, 4});
  hs::Tensor sc(counts.data(), HS_DTYPE_INT32, {1});
  hs_gather_compact_group_args_t args;
  hs_gather_compact_group_args_init(&args);
  args.num_hot_caches = 2;
  args.host_cache = host_cache;
  args.hot_caches = caches;
  args.swap_host_rows = sh;
  args.swap_device_rows = sh;
  args.swap_counts = sc;
  args.hot_block_size = 4;
  const std::vector<uint8_t> before = second.bytes();
  expect_error(hs_gather_compact_group(&args, nullptr), HS_ERROR_INVALID_ARGUMENT, {"hot_caches[1]"});
  EXPECT_EQ(second.bytes(), before);
}

#ifdef HISPARSE_WITH_CUDA
// RAII device memory.
struct DeviceBytes {
  explicit DeviceBytes(size_t size) : size(size) { EXPECT_EQ(cudaMalloc(&data, size), cudaSuccess); }
  ~DeviceBytes() { cudaFree(data); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  void upload(const void* src) { EXPECT_EQ(cudaMemcpy(data, src, size, cudaMemcpyHostToDevice), cudaSuccess); }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> out(size);
    EXPECT_EQ(cudaMemcpy(out.data(), data, size, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
  uint8_t* bytes() const { return static_cast<uint8_t*>(data); }
  size_t size;
  void* data = nullptr;
};
#endif

// On a CUDA device, host rows in a registered HostPool and hot caches in
// device memory (separate allocations and one slab): the bytes of the CPU
// backend, for the default grid and a single block.
TEST(GatherCompactGroupCuda, MatchesTheCpuBackend) {
  int count = 0;
  ASSERT_EQ(hs_cuda_device_count(&count), HS_SUCCESS) << hs_last_error();
  if (count == 0) GTEST_SKIP() << "no CUDA device";
#ifndef HISPARSE_WITH_CUDA
  GTEST_SKIP() << "built without the CUDA backend";
#else
  const int64_t slots = 700, layers = 6, first_layer = 1, pieces = 4, row_bytes = 656;
  const int64_t blocks = 16, hbs = 8, stride = 12, rows = 5, k = 40;
  HostCache cpu_host(slots, layers, row_bytes, 71);
  hs_host_pool_options_t options;
  hs_host_pool_options_init(&options);
  options.size_bytes = cpu_host.memory.size;
  options.registration = HS_REGISTER_ALWAYS;
  options.device_index = 0;
  options.populate_threads = 1;
  options.check_memory = 0;
  hs::HostPool pool(options);
  auto* pinned = static_cast<uint8_t*>(pool.data());
  std::memcpy(pinned, cpu_host.memory.base, cpu_host.memory.size);
  const hs::Tensor pinned_rows =
      hs::Tensor(pinned + first_layer * row_bytes, HS_DTYPE_UINT8, {slots, pieces, row_bytes})
          .strides({layers * row_bytes, row_bytes, 1});
  const hs::Tensor cpu_rows = cpu_host.group(first_layer, pieces);

  SwapLists swap(rows, k, slots, blocks * hbs, 72);
  hs::Tensor sh(swap.swap_host.data(), HS_DTYPE_INT32, {rows, k});
  hs::Tensor sd(swap.swap_dev.data(), HS_DTYPE_INT32, {rows, k});
  hs::Tensor sc(swap.counts.data(), HS_DTYPE_INT32, {rows + 1});
  const size_t list_bytes = swap.swap_host.size() * sizeof(int32_t);
  DeviceBytes dsh(list_bytes), dsd(list_bytes), dsc(swap.counts.size() * sizeof(int32_t));
  dsh.upload(swap.swap_host.data());
  dsd.upload(swap.swap_dev.data());
  dsc.upload(swap.counts.data());
  hs::Tensor gsh(dsh.data, HS_DTYPE_INT32, {rows, k}, HS_DEVICE_CUDA, 0);
  hs::Tensor gsd(dsd.data, HS_DTYPE_INT32, {rows, k}, HS_DEVICE_CUDA, 0);
  hs::Tensor gsc(dsc.data, HS_DTYPE_INT32, {rows + 1}, HS_DEVICE_CUDA, 0);

  for (bool slab : {false, true}) {
    for (int32_t max_blocks : {0, 1}) {
      SCOPED_TRACE(std::string(slab ? "slab" : "separate") + " max_blocks " + std::to_string(max_blocks));
      HotCaches cpu(pieces, blocks, hbs, stride, row_bytes, slab, 73);
      cpu.describe(cpu.host_bases(), HS_DEVICE_CPU);
      const auto before = cpu.contents();
      hs_gather_compact_group_args_t args = group_args(cpu_rows, cpu, sh, sd, sc);
      ASSERT_EQ(hs_gather_compact_group(&args, nullptr), HS_SUCCESS) << hs_last_error();
      const auto want = cpu.contents();
      ASSERT_NE(want, before);

      HotCaches gpu(pieces, blocks, hbs, stride, row_bytes, slab, 73);
      std::vector<std::unique_ptr<DeviceBytes>> device_buffers;
      for (const auto& b : before) {
        device_buffers.push_back(std::make_unique<DeviceBytes>(b.size()));
        device_buffers.back()->upload(b.data());
      }
      std::vector<uint8_t*> bases;
      for (const auto& [buffer, row] : gpu.placements)
        bases.push_back(device_buffers[buffer]->bytes() + row * row_bytes);
      gpu.describe(bases, HS_DEVICE_CUDA);
      args = group_args(pinned_rows, gpu, gsh, gsd, gsc);
      args.max_blocks = max_blocks;
      ASSERT_EQ(hs_gather_compact_group(&args, nullptr), HS_SUCCESS) << hs_last_error();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      for (size_t b = 0; b < want.size(); ++b) EXPECT_EQ(device_buffers[b]->download(), want[b]) << "buffer " << b;
    }
  }

  // A plain (unregistered) host tensor with device hot caches fails naming host_cache.
  HotCaches gpu(pieces, blocks, hbs, stride, row_bytes, true, 74);
  DeviceBytes slab(gpu.buffers[0].size);
  std::vector<uint8_t*> bases;
  for (const auto& [buffer, row] : gpu.placements) bases.push_back(slab.bytes() + row * row_bytes);
  gpu.describe(bases, HS_DEVICE_CUDA);
  hs_gather_compact_group_args_t args = group_args(cpu_rows, gpu, gsh, gsd, gsc);
  expect_error(hs_gather_compact_group(&args, nullptr), HS_ERROR_INVALID_ARGUMENT, {"host_cache"});
#endif
}

}  // namespace
