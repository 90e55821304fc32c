// gather_compact's CUDA kernel source (cpp/cuda/gather_compact.cu: the
// warp_per_row, row_persistent and sorted schedules, the group gather and
// the resolver's tail gather), run by the CPU emulation of the CUDA
// execution model through its launchers, against gather_compact_reference:
// every byte of every hot cache, over random swap lists with the cases the
// contract names (counts past K or negative, skipped entries, destinations
// outside the hot cache, host rows past the host cache that zero-fill), and
// token rows past one prefix window. A check of the kernels' logic without a
// GPU; the GPU suite is what says the CUDA build is right.
// clang-format off
#include "emulated/cuda_emulation.hpp"  // first: before any CUDA header
// clang-format on

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/data_movement_params.hpp"
#include "cpu/data_movement_reference.hpp"
#include "cuda/cuda_kernels.hpp"
#include "emulated/emulated_checks.hpp"
#include "hisparse/data_movement.h"

namespace {

using hisparse::emulated::expect_same;
using hisparse::emulated::uniform;

// One gather's inputs; `hot` holds `pieces` hot caches back to back.
struct Gather {
  int32_t rows = 0;  // R
  int32_t top_k = 0;  // K
  int32_t pieces = 1;
  int64_t row_bytes = 0;
  int64_t host_rows = 0;
  int64_t host_pitch = 0;
  int64_t hot_block_size = 1;
  int64_t hot_block_stride = 1;
  int64_t hot_span_rows = 0;
  int64_t list_stride = 0;  // elements between token rows of the swap lists
  std::vector<uint8_t> host;
  std::vector<int32_t> swap_host, swap_device, counts, req_id_per_token;
};

// A random gather: R token rows of up to K entries, each used entry a host
// row (some negative, some past the host cache) and a distinct physical hot
// row (some negative, some outside the hot cache). R may pass a window;
// K is at most max_top_k, and at least 64 with long_rows (long enough for
// the sorted schedule to split a token row over blocks; a quarter of the
// other lists are too).
Gather make_gather(std::mt19937& rng, int32_t rows, int32_t pieces, int32_t max_top_k = 160, bool long_rows = false) {
  Gather g;
  g.rows = rows;
  g.top_k = long_rows || uniform(rng, 0, 3) == 0 ? uniform(rng, std::min(64, max_top_k), max_top_k)
                                                 : uniform(rng, 1, std::min(24, max_top_k));
  g.pieces = pieces;
  g.row_bytes = 16 * uniform(rng, 1, 48);
  g.host_rows = uniform(rng, 1, 300);
  g.host_pitch = pieces * g.row_bytes + 16 * uniform(rng, 0, 2);
  g.hot_block_size = uniform(rng, 1, 16);
  g.hot_block_stride = g.hot_block_size + uniform(rng, 0, 3);
  // Room for most used entries to land (a few past it, below).
  const int64_t hot_blocks = (rows * g.top_k) / g.hot_block_size + uniform(rng, 1, 4);
  // The cache's extent: whole blocks, or a last block cut short.
  g.hot_span_rows = hot_blocks * g.hot_block_stride - uniform(rng, 0, static_cast<int>(g.hot_block_stride) - 1);
  g.list_stride = g.top_k + uniform(rng, 0, 2);
  g.host.resize(static_cast<size_t>(g.host_rows * g.host_pitch));
  for (uint8_t& byte : g.host) byte = static_cast<uint8_t>(uniform(rng, 1, 255));
  g.swap_host.assign(static_cast<size_t>(rows * g.list_stride), -7);
  g.swap_device.assign(g.swap_host.size(), -7);
  g.counts.resize(rows);
  g.req_id_per_token.resize(rows);
  // Physical rows reachable through the cache, handed out without repeats
  // (two used entries never share a destination), then rows past it.
  std::vector<int32_t> destinations(static_cast<size_t>(hot_blocks * g.hot_block_size + 8));
  std::iota(destinations.begin(), destinations.end(), 0);
  std::shuffle(destinations.begin(), destinations.end(), rng);
  size_t next = 0;
  int32_t request = 0;
  for (int32_t t = 0; t < rows; ++t) {
    const int roll = uniform(rng, 0, 9);
    g.counts[t] =
        roll == 0 ? -uniform(rng, 1, 3) : (roll == 1 ? g.top_k + uniform(rng, 0, 5) : uniform(rng, 0, g.top_k));
    if (t > 0 && uniform(rng, 0, 2) != 0) ++request;  // a request of one token row or several
    g.req_id_per_token[t] = request;
    for (int32_t k = 0; k < g.top_k; ++k) {
      int32_t& h = g.swap_host[t * g.list_stride + k];
      int32_t& d = g.swap_device[t * g.list_stride + k];
      const int kind = uniform(rng, 0, 19);
      h = kind == 0 ? -1
                    : (kind == 1 ? static_cast<int32_t>(g.host_rows) + uniform(rng, 0, 4)
                                 : uniform(rng, 0, static_cast<int>(g.host_rows) - 1));
      d = kind == 2 || next == destinations.size() ? -1 : destinations[next++];
    }
  }
  return g;
}

// The params of `g` over `hot` (the hot caches' bytes), as the C ABI builds them.
hisparse::GatherCompactParams params_of(Gather& g, std::vector<uint8_t>& hot, int32_t variant, int32_t max_blocks) {
  hisparse::GatherCompactParams p;
  p.host = g.host.data();
  p.host_rows = g.host_rows;
  p.host_pitch = g.host_pitch;
  p.hot = hot.data();
  p.hot_span_rows = g.hot_span_rows;
  p.hot_block_size = g.hot_block_size;
  p.hot_block_stride = g.hot_block_stride;
  p.row_bytes = g.row_bytes;
  p.swap_host_rows = g.swap_host.data();
  p.swap_device_rows = g.swap_device.data();
  p.swap_host_row_stride = g.list_stride;
  p.swap_device_row_stride = g.list_stride;
  p.swap_counts = g.counts.data();
  p.num_token_rows = g.rows;
  p.top_k = g.top_k;
  p.variant = variant;
  p.max_blocks = max_blocks;
  p.pieces = g.pieces;
  for (int32_t piece = 0; piece < g.pieces; ++piece) {
    p.piece_hot[piece] = hot.data() + piece * g.hot_span_rows * g.row_bytes;
  }
  return p;
}

std::vector<uint8_t> fresh_hot(const Gather& g) {
  return std::vector<uint8_t>(static_cast<size_t>(g.pieces * g.hot_span_rows * g.row_bytes), 0xEE);
}

std::string describe(const Gather& g, int32_t variant, int32_t max_blocks) {
  return "R=" + std::to_string(g.rows) + " K=" + std::to_string(g.top_k) + " pieces=" + std::to_string(g.pieces) +
         " row_bytes=" + std::to_string(g.row_bytes) + " host_rows=" + std::to_string(g.host_rows) +
         " hot_block_size=" + std::to_string(g.hot_block_size) + " stride=" + std::to_string(g.hot_block_stride) +
         " span=" + std::to_string(g.hot_span_rows) + " variant=" + std::to_string(variant) +
         " max_blocks=" + std::to_string(max_blocks);
}

// `scenarios` random gathers of `rows` token rows (0: 1 to 40) through
// launch_gather_compact with `variant`, each against the reference.
void check_schedule(int32_t variant, int32_t pieces, unsigned seed, int scenarios, int32_t rows = 0,
                    int32_t max_top_k = 160, bool long_rows = false) {
  std::mt19937 rng(seed);
  for (int n = 0; n < scenarios; ++n) {
    Gather g = make_gather(rng, rows > 0 ? rows : uniform(rng, 1, 40), pieces, max_top_k, long_rows);
    const int32_t max_blocks = uniform(rng, 0, 3) == 0 ? uniform(rng, 1, 3) : 0;
    std::vector<uint8_t> reference = fresh_hot(g), kernel = fresh_hot(g);
    hisparse::gather_compact_reference(params_of(g, reference, variant, max_blocks));
    hisparse::cuda::launch_gather_compact(params_of(g, kernel, variant, max_blocks), nullptr);
    expect_same(reference, kernel, "scenario " + std::to_string(n) + ": " + describe(g, variant, max_blocks));
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(GatherCompactEmulated, WarpPerRowMatchesTheReference) { check_schedule(HS_GATHER_WARP_PER_ROW, 1, 11, 24); }

TEST(GatherCompactEmulated, RowPersistentMatchesTheReference) { check_schedule(HS_GATHER_ROW_PERSISTENT, 1, 12, 24); }

TEST(GatherCompactEmulated, SortedMatchesTheReference) { check_schedule(HS_GATHER_SORTED, 1, 13, 24); }

// Fewer token rows than the sorted schedule's blocks, with rows long enough
// to be split into shares sorted by different blocks.
TEST(GatherCompactEmulated, SortedSplitsLongRowsOverBlocks) {
  std::mt19937 rng(20);
  for (int n = 0; n < 8; ++n) check_schedule(HS_GATHER_SORTED, 1, 100 + n, 1, uniform(rng, 1, 3), 160, true);
}

TEST(GatherCompactEmulated, GroupOfPiecesMatchesTheReference) {
  check_schedule(HS_GATHER_ROW_PERSISTENT, 2, 14, 8);
  check_schedule(HS_GATHER_ROW_PERSISTENT, 4, 15, 8);
}

// Token rows past one prefix window (row_persistent's and the group's 4,096,
// sorted's 1,024): the unit numbering continues across windows.
TEST(GatherCompactEmulated, TokenRowsPastOneWindowMatchTheReference) {
  check_schedule(HS_GATHER_ROW_PERSISTENT, 1, 16, 2, 4100, 3);
  check_schedule(HS_GATHER_ROW_PERSISTENT, 3, 17, 1, 4100, 3);
  check_schedule(HS_GATHER_SORTED, 1, 18, 2, 1030, 3);
}

// The resolver's tail gather: row_persistent over every token row but a
// request's first one with at most local_rows entries (its contract in
// cpp/cuda/resolver_tail_gather.cu), checked by running the reference on
// the rows it keeps.
TEST(GatherCompactEmulated, ResolverTailGatherCopiesAllButTheLocalRequestsRows) {
  std::mt19937 rng(19);
  for (int n = 0; n < 24; ++n) {
    Gather g = make_gather(rng, uniform(rng, 1, 40), 1);
    const int32_t local_rows = uniform(rng, 0, std::max(0, g.top_k - 1));
    std::vector<uint8_t> reference = fresh_hot(g), kernel = fresh_hot(g);
    const hisparse::GatherCompactParams on_cpu = params_of(g, reference, HS_GATHER_ROW_PERSISTENT, 0);
    for (int32_t t = 0; t < g.rows; ++t) {
      const bool first_row = t == 0 || g.req_id_per_token[t - 1] != g.req_id_per_token[t];
      if (first_row && on_cpu.swap_counts[t] <= local_rows) continue;
      hisparse::GatherCompactParams row = on_cpu;
      row.swap_host_rows += t * g.list_stride;
      row.swap_device_rows += t * g.list_stride;
      row.swap_counts += t;
      row.num_token_rows = 1;
      hisparse::gather_compact_reference(row);
    }
    hisparse::cuda::launch_gather_compact_tail(params_of(g, kernel, HS_GATHER_ROW_PERSISTENT, 0),
                                               g.req_id_per_token.data(), local_rows, nullptr);
    expect_same(reference, kernel,
                "scenario " + std::to_string(n) + ": local_rows=" + std::to_string(local_rows) + " " +
                    describe(g, HS_GATHER_ROW_PERSISTENT, 0));
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace
