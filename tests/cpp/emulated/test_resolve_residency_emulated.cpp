// The CUDA resolver's kernel source (cpp/cuda/resolve_residency.cu and the
// headers it includes, with the tail gather of gather_compact.cu), run by
// the CPU emulation of the CUDA execution model, against the CPU reference:
// every output, the state, the counters, the hot cache's bytes, the
// residency hint's bits (kept by its rule on the reference side) and the
// handoff records, bit for bit, over three consecutive steps (50%, 5% and
// 0.1% new positions) of random scenarios of each launch the resolver
// chooses between. A check of the kernel's logic without a GPU; the GPU
// suite is what says the CUDA build is right.
#include "emulated/cuda_emulation.hpp"  // first: before any CUDA header

// The kernel source's `extern __shared__` array, the emulated blocks' shared memory.
namespace hisparse {
namespace cuda {
namespace {
alignas(16) thread_local unsigned char smem[emu::kSharedBytes];
}  // namespace
}  // namespace cuda
}  // namespace hisparse

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "cpu/data_movement_reference.hpp"
#include "cpu/resolve_residency_reference.hpp"
#include "cuda/resolve_residency.cu"  // the kernel source itself
#include "emulated/emulated_checks.hpp"
#include "emulated/resolver_scenarios.hpp"

namespace {

using hisparse::emulated::expect_same;
using hisparse::emulated::Kind;
using hisparse::emulated::Outputs;
using hisparse::emulated::Scenario;

std::string describe(const Scenario& s, int step) {
  return "step " + std::to_string(step) + ": B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
         " K=" + std::to_string(s.K) + " H=" + std::to_string(s.H) + " hot_block_size=" + std::to_string(s.hbs) +
         " max_union_rows=" + std::to_string(s.max_union) + " source=" + std::to_string(s.source) +
         " resident=" + std::to_string(s.resident) + " fused=" + std::to_string(s.fused) +
         " hint=" + std::to_string(s.hint);
}

// Runs `scenarios` scenarios of `kind` from `seed`, three steps each; the
// state of each step is the reference's after the last.
void check_against_reference(Kind kind, unsigned seed, int scenarios) {
  emu::g_shared = hisparse::cuda::smem;
  std::mt19937 rng(seed);
  for (int n = 0; n < scenarios; ++n) {
    Scenario s = hisparse::emulated::make_scenario_of_kind(rng, kind);
    Outputs reference, kernel;
    for (int step = 0; step < 3; ++step) {
      const double new_positions = step == 0 ? 0.5 : (step == 1 ? 0.05 : 0.001);
      if (step > 0) {
        s.dgi = reference.dgi;
        s.lru = reference.lru;
      }
      hisparse::emulated::make_topk(rng, s, new_positions);
      const hisparse::ResolveResidencyParams on_cpu = hisparse::emulated::bind(s, reference);
      const hisparse::ResolveResidencyParams on_emulated_gpu = hisparse::emulated::bind(s, kernel);
      const std::vector<int32_t> dgi_before = reference.dgi;
      hisparse::resolve_residency_reference(on_cpu);
      if (on_cpu.fused_gather) hisparse::gather_compact_reference(on_cpu.gather);
      hisparse::emulated::keep_hint(s, dgi_before, reference);
      hisparse::cuda::launch_resolve_residency(on_emulated_gpu, nullptr);
      const std::string where = "scenario " + std::to_string(n) + " " + describe(s, step);
      expect_same(reference.attention, kernel.attention, "out_attention, " + where);
      expect_same(reference.hot_rows, kernel.hot_rows, "out_hot_rows, " + where);
      expect_same(reference.resolved, kernel.resolved, "out_resolved, " + where);
      expect_same(reference.miss, kernel.miss, "out_miss_mask, " + where);
      expect_same(reference.swap_host, kernel.swap_host, "out_swap_host_rows, " + where);
      expect_same(reference.swap_device, kernel.swap_device, "out_swap_device_rows, " + where);
      expect_same(reference.valid_counts, kernel.valid_counts, "out_valid_counts, " + where);
      expect_same(reference.swap_counts, kernel.swap_counts, "out_swap_counts, " + where);
      expect_same(reference.dgi, kernel.dgi, "device_global_indices, " + where);
      expect_same(reference.lru, kernel.lru, "lru_slots, " + where);
      expect_same(reference.stats, kernel.stats, "stats, " + where);
      expect_same(reference.hot_cache, kernel.hot_cache, "hot cache, " + where);
      expect_same(reference.hint, kernel.hint, "residency hint, " + where);
      expect_same(std::vector<int32_t>(s.S, 0), hisparse::emulated::handoff_states(kernel),
                  "handoff states (idle after a launch), " + where);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// A helper's layout stays inside its shared memory, with 16-byte aligned
// arrays that do not overlap, a table of at least twice its share of keys
// where memory allows, and the launcher's shares give every helper block of
// an early-read launch one partition of its request.
TEST(ResolveResidencyEmulated, HelperLayoutsFitTheirSharedMemoryAndCoverTheHelpers) {
  namespace cuda = hisparse::cuda;
  for (const uint32_t bytes : {4096u, 49152u, 112640u, 232448u}) {
    for (const int32_t top_k : {64, 2048}) {
      for (const int32_t held : {0, 4096}) {
        for (int32_t parts = 1; parts <= cuda::early_reads::kMaxParts; ++parts) {
          for (const uint32_t row_bytes : {0u, 64u, 656u}) {
            for (const bool notes : {false, true}) {
              const cuda::HelperLayout l = cuda::HelperLayout::make(bytes, top_k, held, parts, row_bytes, notes);
              const std::string where = "bytes " + std::to_string(bytes) + " top_k " + std::to_string(top_k) +
                                        " held " + std::to_string(held) + " parts " + std::to_string(parts) +
                                        " row_bytes " + std::to_string(row_bytes) + " notes " + std::to_string(notes);
              if (l.capacity == 0) {
                EXPECT_EQ(l.buffered, 0) << where;
                continue;
              }
              EXPECT_EQ(l.capacity & (l.capacity - 1), 0u) << where;
              EXPECT_EQ(uint32_t{1} << (32 - l.shift), l.capacity) << where;
              // Twice the share's keys (plus slack), rounded up to a power of two, where half the memory holds it.
              const uint32_t wanted = 2 * (static_cast<uint32_t>((top_k + held) / parts) + 32);
              uint32_t full = 64;
              while (full < wanted && full < 32768u) full <<= 1;
              if (64 + 6 * full <= bytes / 2) {
                EXPECT_EQ(l.capacity, full) << where;
              } else {
                EXPECT_TRUE(l.capacity == 64 || 64 + 6 * l.capacity <= bytes / 2) << where;
              }
              EXPECT_LE(cuda::HelperLayout::kWords * 4 + 6 * l.capacity, l.predicted_at) << where;
              const uint32_t after_predicted = l.predicted_at + 4 * static_cast<uint32_t>(l.buffered);
              EXPECT_EQ(notes, l.destination_at != 0) << where;
              if (notes) {
                EXPECT_LE(after_predicted, l.destination_at) << where;
                EXPECT_LE(l.destination_at + 8 * static_cast<uint32_t>(l.buffered), l.rows_at) << where;
              } else {
                EXPECT_LE(after_predicted, l.rows_at) << where;
              }
              EXPECT_LE(l.rows_at + static_cast<uint64_t>(l.buffered) * row_bytes, bytes) << where;
              for (const uint32_t at : {l.predicted_at, l.destination_at, l.rows_at}) EXPECT_EQ(at % 16, 0u) << where;
              EXPECT_LE(l.buffered, top_k) << where;
              if (row_bytes == 0) EXPECT_EQ(l.buffered, 0) << where;
            }
          }
        }
      }
    }
  }
  // The launcher's shares: every helper of B requests helps one partition of one request.
  hisparse::ResolveResidencyParams p{};
  p.top_k = 2048;
  p.hot_size = 4096;
  for (const int32_t batch : {1, 7, 32, 65}) {
    for (const unsigned helpers : {static_cast<unsigned>(batch), 131u - static_cast<unsigned>(batch)}) {
      p.num_batch_rows = batch;
      cuda::ResolverConstants c{};
      c.miss_stage.total_bytes = 112640;
      c.stage_row_bytes = 656;
      c = cuda::with_early_read_helpers(c, p, helpers, true);
      int64_t covered = 0;
      for (int32_t b = 0; b < batch; ++b) {
        covered += std::min(c.early_parts + (b < c.early_more_parts ? 1 : 0), cuda::early_reads::kMaxParts);
      }
      const int64_t most = std::min<int64_t>(helpers, int64_t{batch} * cuda::early_reads::kMaxParts);
      EXPECT_EQ(covered, most) << batch << " requests, " << helpers << " helpers";
      for (unsigned h = 0; h < helpers; ++h) {
        const int32_t part = c.early_batch.quotient(static_cast<int32_t>(h));
        EXPECT_EQ(part, static_cast<int32_t>(h) / batch);
        EXPECT_EQ(c.early_batch.remainder(static_cast<int32_t>(h), part), static_cast<int32_t>(h) % batch);
      }
    }
  }
}

TEST(ResolveResidencyEmulated, AnyBatchAndScheduleMatchesTheReference) { check_against_reference(Kind::kAny, 1, 24); }

TEST(ResolveResidencyEmulated, TwoRequestsPerBlockPastTheSmCountMatchTheReference) {
  check_against_reference(Kind::kTurns, 2, 8);
}

TEST(ResolveResidencyEmulated, HandoffWithoutHelperBlocksMatchesTheReference) {
  check_against_reference(Kind::kHandoff, 3, 12);
}

TEST(ResolveResidencyEmulated, HandoffWithEarlyReadHelpersMatchesTheReference) {
  check_against_reference(Kind::kEarlyReads, 4, 12);
}

TEST(ResolveResidencyEmulated, HandoffWithTailReadHelpersMatchesTheReference) {
  check_against_reference(Kind::kTailReads, 5, 16);
}

// One request (state row 0) whose state row holds H = 4096 distinct host
// rows (the even ones) and whose top-k row selects K = 2048 distinct host
// rows in a shuffled order, `misses` of them odd (held by no slot).
Scenario tail_read_scenario(std::mt19937& rng, int32_t misses) {
  Scenario s;
  s.B = 1, s.T = 1, s.K = 2048, s.H = 4096, s.S = 1, s.hbs = 16, s.stride = 16;
  s.host_rows = 60000, s.max_union = s.K, s.fused = 3, s.row_bytes = 64;
  s.req = {0}, s.state_idx = {0}, s.num_valid = 1;
  s.dgi.resize(s.H);
  std::vector<int16_t> order(s.H);
  for (int32_t j = 0; j < s.H; ++j) {
    s.dgi[j] = 2 * j;
    order[j] = static_cast<int16_t>(j);
  }
  std::shuffle(order.begin(), order.end(), rng);
  s.lru = order;
  const int32_t width = s.H / s.hbs + 1;
  for (int32_t w = 0; w < width; ++w) s.hot_table.push_back(w + 1);
  std::vector<int32_t> held(s.H), fresh(20000);
  for (int32_t j = 0; j < s.H; ++j) held[j] = 2 * j;
  for (int32_t r = 0; r < 20000; ++r) fresh[r] = 2 * r + 1;
  std::shuffle(held.begin(), held.end(), rng);
  std::shuffle(fresh.begin(), fresh.end(), rng);
  s.topk.assign(held.begin(), held.begin() + (s.K - misses));
  s.topk.insert(s.topk.end(), fresh.begin(), fresh.begin() + misses);
  std::shuffle(s.topk.begin(), s.topk.end(), rng);
  s.host_cache.resize(static_cast<size_t>(s.host_rows) * s.row_bytes);
  for (size_t i = 0; i < s.host_cache.size(); i += 4) {
    const uint32_t v = static_cast<uint32_t>(i * 2654435761u);
    std::memcpy(&s.host_cache[i], &v, 4);
  }
  return s;
}

// A tail-read helper block run alone on the list its request published
// (the CPU reference's swap list of the step), predicting from the state
// row before the step: with more misses than the owner's stage holds it
// copies exactly the list's last tail_rows_per_helper entries (from its
// buffer, or from host memory where `wrong_prediction` made it predict
// otherwise), having buffered them in the list's order, and closes the
// record; with few it leaves the list to the owner. (In a whole launch the
// emulation runs the owners first, which claim their tails themselves.)
TEST(ResolveResidencyEmulated, TailReadHelperCopiesTheTailOfThePublishedList) {
  namespace cuda = hisparse::cuda;
  emu::g_shared = cuda::smem;
  constexpr int32_t kTail = 40;
  std::mt19937 rng(6);
  for (const int32_t misses : {5, 150, 600}) {
    for (const bool wrong_prediction : {false, true}) {
      const std::string where =
          std::to_string(misses) + " misses, wrong prediction " + std::to_string(wrong_prediction);
      Scenario s = tail_read_scenario(rng, misses);
      Outputs reference, helper;
      hisparse::resolve_residency_reference(hisparse::emulated::bind(s, reference));
      const hisparse::ResolveResidencyParams p = hisparse::emulated::bind(s, helper);
      helper.swap_host = reference.swap_host;
      helper.swap_device = reference.swap_device;
      helper.swap_counts = reference.swap_counts;
      const int32_t n = reference.swap_counts[0];
      ASSERT_EQ(n, misses) << where;
      if (wrong_prediction) {
        // Slots that seem to hold three of the misses, and three held rows that seem missing.
        for (int32_t i = 0; i < 3; ++i) helper.dgi[i] = reference.swap_host[n - 1 - 7 * i];
        for (int32_t i = 3; i < 6; ++i) helper.dgi[i] = -1;
      }
      helper.handoff = {cuda::handoff::kPublished, 0, 0, n};
      const hisparse::ResolverLaunchLayout chosen = hisparse::resolver_launch_layout(
          s.H, s.max_union, s.row_bytes, cuda::kMissStageRows, static_cast<uint64_t>(emu::g_device.block_shared_optin));
      cuda::ResolverConstants c = cuda::make_resolver_constants(p, chosen, false);
      c.tail_rows_per_helper = kTail;
      const uint32_t bytes = c.miss_stage.total_bytes;
      emu::run_grid(dim3(1), dim3(hisparse::kResolverThreads),
                    [&] { cuda::tail_reads::help_as_helper(p, c, cuda::smem, bytes, 0); });

      const bool copies = n > c.auto_local_rows;
      const int32_t first = copies ? std::max(n - kTail, 0) : n;
      for (int32_t e = 0; e < n; ++e) {
        const int64_t hot_row = reference.swap_device[e];
        const uint8_t* got = helper.hot_cache.data() + hot_row * s.row_bytes;
        const std::vector<uint8_t> want =
            e >= first ? std::vector<uint8_t>(s.host_cache.begin() + int64_t{reference.swap_host[e]} * s.row_bytes,
                                              s.host_cache.begin() + int64_t{reference.swap_host[e] + 1} * s.row_bytes)
                       : std::vector<uint8_t>(s.row_bytes, 0);
        ASSERT_EQ(want, std::vector<uint8_t>(got, got + s.row_bytes)) << "swap entry " << e << ", " << where;
      }
      const std::vector<int32_t> record = copies ? std::vector<int32_t>{cuda::handoff::kIdle, 1 | (1 << 16), 0, n}
                                                 : std::vector<int32_t>{cuda::handoff::kPublished, 0, 0, n};
      EXPECT_EQ(record, helper.handoff) << where;
      if (!copies || wrong_prediction) continue;
      // The buffer's rows are the list's last ones, in the list's order.
      const cuda::early_reads::HelperMemory m(cuda::smem + cuda::tail_reads::kScanBytes,
                                              bytes - cuda::tail_reads::kScanBytes, s.K, 0, 1, c.stage_row_bytes,
                                              false);
      ASSERT_EQ(m.words[cuda::early_reads::HelperMemory::kPredicted], std::min(kTail, n)) << where;
      for (int32_t i = 0; i < std::min(kTail, n); ++i) {
        EXPECT_EQ(m.predicted[i], reference.swap_host[n - std::min(kTail, n) + i])
            << "buffered row " << i << ", " << where;
      }
    }
  }
}

}  // namespace
