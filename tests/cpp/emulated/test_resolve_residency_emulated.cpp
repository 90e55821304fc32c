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
#include "emulated/resolver_scenarios.hpp"

namespace {

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

// The first index where two arrays differ, or -1.
template <class T>
int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

#define EXPECT_SAME(name, reference, kernel)                                                                       \
  do {                                                                                                             \
    const int64_t at = first_difference(reference, kernel);                                                        \
    EXPECT_EQ(at, -1) << name << " differs first at " << at << " (reference "                                      \
                      << (at >= 0 && static_cast<size_t>(at) < (reference).size() ? +(reference)[at] : 0)          \
                      << ", kernel " << (at >= 0 && static_cast<size_t>(at) < (kernel).size() ? +(kernel)[at] : 0) \
                      << "), " << where;                                                                           \
  } while (0)

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
      EXPECT_SAME("out_attention", reference.attention, kernel.attention);
      EXPECT_SAME("out_hot_rows", reference.hot_rows, kernel.hot_rows);
      EXPECT_SAME("out_resolved", reference.resolved, kernel.resolved);
      EXPECT_SAME("out_miss_mask", reference.miss, kernel.miss);
      EXPECT_SAME("out_swap_host_rows", reference.swap_host, kernel.swap_host);
      EXPECT_SAME("out_swap_device_rows", reference.swap_device, kernel.swap_device);
      EXPECT_SAME("out_valid_counts", reference.valid_counts, kernel.valid_counts);
      EXPECT_SAME("out_swap_counts", reference.swap_counts, kernel.swap_counts);
      EXPECT_SAME("device_global_indices", reference.dgi, kernel.dgi);
      EXPECT_SAME("lru_slots", reference.lru, kernel.lru);
      EXPECT_SAME("stats", reference.stats, kernel.stats);
      EXPECT_SAME("hot cache", reference.hot_cache, kernel.hot_cache);
      EXPECT_SAME("residency hint", reference.hint, kernel.hint);
      EXPECT_SAME("handoff states (idle after a launch)", std::vector<int32_t>(s.S, 0),
                  hisparse::emulated::handoff_states(kernel));
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(ResolveResidencyEmulated, AnyBatchAndScheduleMatchesTheReference) { check_against_reference(Kind::kAny, 1, 24); }

TEST(ResolveResidencyEmulated, PairedLaunchPastTheSmCountMatchesTheReference) {
  check_against_reference(Kind::kPaired, 2, 8);
}

TEST(ResolveResidencyEmulated, HandoffWithoutHelperBlocksMatchesTheReference) {
  check_against_reference(Kind::kHandoff, 3, 12);
}

TEST(ResolveResidencyEmulated, HandoffWithEarlyReadHelpersMatchesTheReference) {
  check_against_reference(Kind::kEarlyReads, 4, 12);
}

}  // namespace
