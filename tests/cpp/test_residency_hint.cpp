// The residency hint rebuilt from an index group's state
// (build_residency_hint): the CPU reference against a hand-made case, and
// the CUDA kernel against the reference, bit for bit, on a random state;
// a request reset on CUDA leaves the hint of the state that remains.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "core/backend.hpp"
#include "core/index_group_params.hpp"
#include "core/kv_params.hpp"

namespace {

using hisparse::Backend;
using hisparse::ResidencyHintParams;

std::vector<uint32_t> reference_hint(const std::vector<int32_t>& state, int64_t host_rows) {
  std::vector<uint32_t> hint((host_rows + 31) / 32, 0xFFFFFFFFu);  // stale bits, all cleared by the build
  ResidencyHintParams p;
  p.device_global_indices = state.data();
  p.entries = static_cast<int64_t>(state.size());
  p.hint = hint.data();
  p.host_rows = host_rows;
  hisparse::cpu_backend().build_residency_hint(p, nullptr);
  return hint;
}

TEST(ResidencyHint, ReferenceSetsTheHeldRowsInRangeOnly) {
  // -1 (empty), rows past host_rows and negative corrupt values set nothing.
  const std::vector<int32_t> state = {-1, 0, 31, 32, 69, 70, 1000, -7, 33, 0};
  const std::vector<uint32_t> hint = reference_hint(state, 70);
  ASSERT_EQ(hint.size(), 3u);
  EXPECT_EQ(hint[0], (1u << 0) | (1u << 31));
  EXPECT_EQ(hint[1], (1u << 0) | (1u << 1));
  EXPECT_EQ(hint[2], 1u << (69 - 64));
}

TEST(ResidencyHint, CudaMatchesTheReference) {
  Backend* cuda = hisparse::cuda_backend();
  if (cuda == nullptr || !cuda->available() || cuda->device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t host_rows = 100'003;
  std::mt19937 random(7);
  std::uniform_int_distribution<int32_t> row(-3, static_cast<int32_t>(host_rows) + 50);
  std::vector<int32_t> state(64 * 4096);
  for (int32_t& entry : state) entry = row(random);
  const std::vector<uint32_t> want = reference_hint(state, host_rows);

  const int device = 0;
  const size_t state_bytes = state.size() * sizeof(int32_t);
  const size_t hint_bytes = want.size() * sizeof(uint32_t);
  void* device_state = cuda->allocate(state_bytes, device);
  void* device_hint = cuda->allocate(hint_bytes, device);
  hs_stream_t stream = cuda->create_stream(device);
  cuda->copy_async(device_state, state.data(), state_bytes, stream);
  cuda->fill_async(device_hint, 0xFF, hint_bytes, stream);
  ResidencyHintParams p;
  p.device_global_indices = static_cast<const int32_t*>(device_state);
  p.entries = static_cast<int64_t>(state.size());
  p.hint = static_cast<uint32_t*>(device_hint);
  p.host_rows = host_rows;
  p.device = device;
  cuda->build_residency_hint(p, stream);
  std::vector<uint32_t> got(want.size());
  cuda->copy_async(got.data(), device_hint, hint_bytes, stream);
  cuda->synchronize_stream(stream);
  cuda->destroy_stream(stream, device);
  cuda->deallocate(device_hint, device);
  cuda->deallocate(device_state, device);
  EXPECT_EQ(got, want);
}

TEST(ResidencyHint, CudaRequestResetClearsTheRowsItHeld) {
  Backend* cuda = hisparse::cuda_backend();
  if (cuda == nullptr || !cuda->available() || cuda->device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int32_t S = 4, H = 300, reset_row = 2;
  const int64_t host_rows = 5'000;
  // Every held row belongs to one state row (distinct host rows), with some
  // empty slots and some rows past host_rows, which set no bit.
  std::mt19937 random(11);
  std::vector<int32_t> rows(host_rows + 100);
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), random);
  std::vector<int32_t> state(rows.begin(), rows.begin() + S * H);
  for (size_t i = 0; i < state.size(); i += 7) state[i] = -1;
  const std::vector<uint32_t> before = reference_hint(state, host_rows);
  std::vector<int32_t> after = state;
  std::fill(after.begin() + reset_row * H, after.begin() + (reset_row + 1) * H, -1);
  const std::vector<uint32_t> want = reference_hint(after, host_rows);
  ASSERT_NE(before, want);

  const int device = 0;
  const size_t state_bytes = state.size() * sizeof(int32_t);
  const size_t lru_bytes = state.size() * sizeof(int16_t);
  const size_t hint_bytes = before.size() * sizeof(uint32_t);
  void* device_state = cuda->allocate(state_bytes, device);
  void* device_lru = cuda->allocate(lru_bytes, device);
  void* device_hint = cuda->allocate(hint_bytes, device);
  hs_stream_t stream = cuda->create_stream(device);
  cuda->copy_async(device_state, state.data(), state_bytes, stream);
  cuda->fill_async(device_lru, 0, lru_bytes, stream);
  cuda->copy_async(device_hint, before.data(), hint_bytes, stream);
  hisparse::ResetRequestParams p;
  p.device = device;
  p.device_global_indices = static_cast<int32_t*>(device_state);
  p.lru_slots = static_cast<int16_t*>(device_lru);
  p.num_state_rows = S;
  p.hot_size = H;
  p.state_row = reset_row;
  p.residency_hint = static_cast<uint32_t*>(device_hint);
  p.host_rows = host_rows;
  cuda->reset_request(p, stream);
  std::vector<uint32_t> got(before.size());
  std::vector<int32_t> got_state(state.size());
  cuda->copy_async(got.data(), device_hint, hint_bytes, stream);
  cuda->copy_async(got_state.data(), device_state, state_bytes, stream);
  cuda->synchronize_stream(stream);
  cuda->destroy_stream(stream, device);
  cuda->deallocate(device_hint, device);
  cuda->deallocate(device_lru, device);
  cuda->deallocate(device_state, device);
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_state, after);
}

}  // namespace
