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

TEST(ResolveResidencyEmulated, HandoffWithTailReadHelpersMatchesTheReference) {
  check_against_reference(Kind::kTailReads, 5, 16);
}

}  // namespace
