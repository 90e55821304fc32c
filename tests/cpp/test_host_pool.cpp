// The host pool: exact-size page-aligned zero-filled memory, parallel
// population, segmented registration through the backend (recorded by a test
// backend, so no GPU is needed), rollback on failure, deterministic and
// idempotent release, and the C ABI's errors and RAM refusal.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/error.hpp"
#include "core/host_pool.hpp"
#include "hisparse/hisparse.h"
#include "hisparse/hisparse.hpp"
#include "recording_backend.hpp"

namespace {

using hisparse::Backend;
using hisparse::HostPool;
using hisparse::HostPoolOptions;

using hisparse_test::is_mapped;
using hisparse_test::is_resident;
using hisparse_test::page_size;
using hisparse_test::RecordingBackend;

HostPoolOptions recorded_options(RecordingBackend& backend, uint64_t pages, uint64_t segment_pages) {
  HostPoolOptions options;
  options.size_bytes = pages * page_size();
  options.max_segment_bytes = segment_pages * page_size();
  options.registrar = &backend;
  options.device = 5;
  options.populate_threads = 2;
  return options;
}

// ------------------------------------------------------------------ internals

TEST(HostPoolCore, RegistersInSegmentsWithExactRanges) {
  RecordingBackend backend;
  const uint64_t page = page_size();
  HostPool pool(recorded_options(backend, 10, 3));
  char* base = static_cast<char*>(pool.data());

  const auto registers = backend.of_kind(RecordingBackend::Call::kRegister);
  ASSERT_EQ(registers.size(), 4u);
  const uint64_t expected_offsets[4] = {0, 3 * page, 6 * page, 9 * page};
  const uint64_t expected_bytes[4] = {3 * page, 3 * page, 3 * page, page};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(registers[i].pointer, base + expected_offsets[i]) << "segment " << i;
    EXPECT_EQ(registers[i].bytes, expected_bytes[i]) << "segment " << i;
    EXPECT_EQ(registers[i].device, 5);
    EXPECT_TRUE(registers[i].populated) << "segment " << i << " registered before its pages were populated";
  }
  ASSERT_EQ(pool.segments().size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(pool.segments()[i].data, base + expected_offsets[i]);
    EXPECT_EQ(pool.segments()[i].bytes, expected_bytes[i]);
  }
  EXPECT_TRUE(pool.registered());
  EXPECT_EQ(pool.device(), 5);
  EXPECT_EQ(pool.size_bytes(), 10 * page);
  EXPECT_EQ(pool.mapped_bytes(), 10 * page);

  backend.calls.clear();
  pool.release();
  const auto unregisters = backend.of_kind(RecordingBackend::Call::kUnregister);
  ASSERT_EQ(unregisters.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(unregisters[i].pointer, base + expected_offsets[3 - i]) << "unregistration must run in reverse";
    EXPECT_EQ(unregisters[i].device, 5);
    EXPECT_TRUE(unregisters[i].mapped) << "unmapped before unregistration";
  }
  EXPECT_EQ(backend.calls.size(), 4u) << "release registered something";
  EXPECT_TRUE(pool.released());
  EXPECT_FALSE(pool.registered());
  EXPECT_EQ(pool.device(), -1);
  EXPECT_TRUE(pool.segments().empty());
  EXPECT_FALSE(is_mapped(base, 10 * page)) << "release must unmap";

  pool.release();  // idempotent: no second unregistration
  EXPECT_EQ(backend.calls.size(), 4u);
}

TEST(HostPoolCore, SegmentsCoverTheRoundedUpSize) {
  RecordingBackend backend;
  const uint64_t page = page_size();
  HostPoolOptions options = recorded_options(backend, 10, 4);
  options.size_bytes = 10 * page - 100;
  HostPool pool(options);
  EXPECT_EQ(pool.size_bytes(), 10 * page - 100);
  EXPECT_EQ(pool.mapped_bytes(), 10 * page);
  ASSERT_EQ(pool.segments().size(), 3u);
  EXPECT_EQ(pool.segments()[2].bytes, 2 * page);
  uint64_t total = 0;
  for (const auto& segment : pool.segments()) total += segment.bytes;
  EXPECT_EQ(total, pool.mapped_bytes());
}

TEST(HostPoolCore, OneSegmentWhenThePoolFits) {
  RecordingBackend backend;
  HostPool pool(recorded_options(backend, 10, 10));
  ASSERT_EQ(pool.segments().size(), 1u);
  EXPECT_EQ(pool.segments()[0].data, pool.data());
  EXPECT_EQ(pool.segments()[0].bytes, 10 * page_size());
}

TEST(HostPoolCore, RegistrationFailureRollsBack) {
  RecordingBackend backend;
  backend.fail_register_call = 2;  // the third segment fails
  const uint64_t page = page_size();
  try {
    HostPool pool(recorded_options(backend, 10, 3));
    FAIL() << "expected the injected failure";
  } catch (const hisparse::Error& error) {
    EXPECT_EQ(error.status(), HS_ERROR_CUDA);
    EXPECT_NE(std::string(error.what()).find("injected register failure"), std::string::npos);
  }
  const auto registers = backend.of_kind(RecordingBackend::Call::kRegister);
  const auto unregisters = backend.of_kind(RecordingBackend::Call::kUnregister);
  ASSERT_EQ(registers.size(), 2u);
  ASSERT_EQ(unregisters.size(), 2u) << "what was registered must be unregistered";
  char* base = static_cast<char*>(registers[0].pointer);
  EXPECT_EQ(registers[1].pointer, base + 3 * page);
  EXPECT_EQ(unregisters[0].pointer, base + 3 * page);
  EXPECT_EQ(unregisters[1].pointer, base);
  EXPECT_TRUE(unregisters[0].mapped && unregisters[1].mapped);
  EXPECT_FALSE(is_mapped(base, 10 * page)) << "a failed construction leaked its mapping";
}

TEST(HostPoolCore, UnregistrationFailureKeepsThePoolRetryable) {
  RecordingBackend backend;
  backend.fail_unregister_call = 1;  // the second unregistration (segment 2 of 0..3) fails once
  const uint64_t page = page_size();
  HostPool pool(recorded_options(backend, 10, 3));
  char* base = static_cast<char*>(pool.data());
  base[5 * page] = 42;

  EXPECT_THROW(pool.release(), hisparse::Error);
  EXPECT_FALSE(pool.released());
  EXPECT_TRUE(pool.registered());
  ASSERT_EQ(pool.segments().size(), 3u) << "segment 3 was unregistered, segments 0..2 remain";
  EXPECT_EQ(pool.segments().back().data, base + 6 * page);
  EXPECT_EQ(pool.data(), base);
  EXPECT_EQ(base[5 * page], 42) << "the memory must stay mapped and intact";

  pool.release();  // the retry unregisters the rest, then unmaps
  EXPECT_TRUE(pool.released());
  const auto unregisters = backend.of_kind(RecordingBackend::Call::kUnregister);
  ASSERT_EQ(unregisters.size(), 4u);
  EXPECT_EQ(unregisters[0].pointer, base + 9 * page);
  EXPECT_EQ(unregisters[1].pointer, base + 6 * page);
  EXPECT_EQ(unregisters[2].pointer, base + 3 * page);
  EXPECT_EQ(unregisters[3].pointer, base);
  EXPECT_FALSE(is_mapped(base, 10 * page));
}

TEST(HostPoolCore, DestructorSwallowsUnregistrationFailure) {
  RecordingBackend backend;
  backend.fail_unregister_call = 0;
  auto* pool = new HostPool(recorded_options(backend, 4, 4));
  EXPECT_NO_THROW(delete pool);
}

TEST(HostPoolCore, NoRegistrarMeansNoSegments) {
  HostPoolOptions options;
  options.size_bytes = 3 * page_size();
  HostPool pool(options);
  EXPECT_FALSE(pool.registered());
  EXPECT_EQ(pool.device(), -1);
  EXPECT_TRUE(pool.segments().empty());
  EXPECT_DOUBLE_EQ(pool.register_seconds(), 0.0);
}

TEST(HostPoolCore, PopulateThreadsAreClampedToTheWork) {
  HostPoolOptions options;
  options.size_bytes = 192ull << 20;  // three 64 MiB chunks
  options.populate_threads = 8;
  HostPool big(options);
  EXPECT_EQ(big.populate_threads(), 3);
  EXPECT_TRUE(is_resident(big.data(), big.mapped_bytes()));
  EXPECT_GE(big.populate_seconds(), 0.0);

  options.populate_threads = 2;
  HostPool two(options);
  EXPECT_EQ(two.populate_threads(), 2);

  options.size_bytes = 4 * page_size();
  options.populate_threads = 8;
  HostPool small(options);
  EXPECT_EQ(small.populate_threads(), 1);
}

TEST(HostPoolCore, RejectsBadOptions) {
  HostPoolOptions options;
  options.size_bytes = 0;
  EXPECT_THROW(HostPool{options}, hisparse::Error);
  options.size_bytes = page_size();
  options.populate_threads = -1;
  EXPECT_THROW(HostPool{options}, hisparse::Error);
  options.populate_threads = 0;
  options.max_segment_bytes = page_size() + 1;
  try {
    HostPool pool(options);
    FAIL() << "expected an error for max_segment_bytes";
  } catch (const hisparse::Error& error) {
    EXPECT_NE(std::string(error.what()).find("max_segment_bytes"), std::string::npos) << error.what();
  }
}

// ------------------------------------------------------------------ C ABI

hs_host_pool_options_t unregistered_options(uint64_t size_bytes) {
  hs_host_pool_options_t options;
  hs_host_pool_options_init(&options);
  options.size_bytes = size_bytes;
  options.registration = HS_REGISTER_NEVER;
  return options;
}

hs_host_pool_info_t pool_info(hs_host_pool_t pool) {
  hs_host_pool_info_t info{};
  info.struct_size = sizeof(info);
  EXPECT_EQ(hs_host_pool_get_info(pool, &info), HS_SUCCESS) << hs_last_error();
  return info;
}

TEST(HostPoolApi, ExactSizePageAlignedZeroFilled) {
  const uint64_t size = 3 * page_size() + 1000;
  hs_host_pool_options_t options = unregistered_options(size);
  hs_host_pool_t pool = nullptr;
  ASSERT_EQ(hs_host_pool_create(&options, &pool), HS_SUCCESS) << hs_last_error();
  void* data = nullptr;
  ASSERT_EQ(hs_host_pool_data(pool, &data), HS_SUCCESS);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(data) % page_size(), 0u);
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (uint64_t i = 0; i < size; ++i) {
    if (bytes[i] != 0) {
      ADD_FAILURE() << "byte " << i << " is not zero";
      break;
    }
  }
  const hs_host_pool_info_t info = pool_info(pool);
  EXPECT_EQ(info.struct_version, static_cast<uint32_t>(HS_HOST_POOL_INFO_VERSION));
  EXPECT_EQ(info.size_bytes, size);
  EXPECT_EQ(info.mapped_bytes, 4 * page_size());
  EXPECT_EQ(info.released, 0);
  EXPECT_EQ(info.registered, 0);
  EXPECT_EQ(info.device_index, -1);
  EXPECT_EQ(info.num_segments, 0);
  EXPECT_EQ(info.populate_threads, 1);
  EXPECT_EQ(hs_host_pool_destroy(pool), HS_SUCCESS);
}

TEST(HostPoolApi, PopulateThreadsReported) {
  hs_host_pool_options_t options = unregistered_options(128ull << 20);
  options.populate_threads = 2;
  hs::HostPool pool(options);
  EXPECT_EQ(pool.info().populate_threads, 2);
  EXPECT_GE(pool.info().populate_seconds, 0.0);
}

TEST(HostPoolApi, AllocatePopulateReleaseAndUseAfterRelease) {
  hs_host_pool_options_t options = unregistered_options(1 << 20);
  hs_host_pool_t pool = nullptr;
  ASSERT_EQ(hs_host_pool_create(&options, &pool), HS_SUCCESS) << hs_last_error();
  void* data = nullptr;
  ASSERT_EQ(hs_host_pool_data(pool, &data), HS_SUCCESS);
  auto* words = static_cast<uint32_t*>(data);
  for (uint32_t i = 0; i < (1u << 18); ++i) words[i] = i * 2654435761u;
  for (uint32_t i = 0; i < (1u << 18); i += 4099) ASSERT_EQ(words[i], i * 2654435761u);

  ASSERT_EQ(hs_host_pool_release(pool), HS_SUCCESS) << hs_last_error();
  EXPECT_FALSE(is_mapped(data, 1 << 20));
  EXPECT_EQ(hs_host_pool_release(pool), HS_SUCCESS) << "a second release must succeed and do nothing";
  EXPECT_STREQ(hs_last_error(), "");

  void* after = reinterpret_cast<void*>(0x1);
  const hs_status_t status = hs_host_pool_data(pool, &after);
  EXPECT_EQ(status, HS_ERROR_INVALID_STATE);
  EXPECT_NE(std::string(hs_last_error()).find("released"), std::string::npos) << hs_last_error();

  const hs_host_pool_info_t info = pool_info(pool);  // figures survive the release
  EXPECT_EQ(info.released, 1);
  EXPECT_EQ(info.size_bytes, 1u << 20);

  EXPECT_EQ(hs_host_pool_destroy(pool), HS_SUCCESS);
  EXPECT_EQ(hs_host_pool_destroy(nullptr), HS_SUCCESS);
}

TEST(HostPoolApi, CppRaiiReleasesAndThrowsAfterRelease) {
  void* data = nullptr;
  {
    hs_host_pool_options_t options = unregistered_options(64 * 1024);
    hs::HostPool pool(options);
    data = pool.data();
    EXPECT_TRUE(is_mapped(data, 64 * 1024));
    hs::HostPool moved = std::move(pool);
    EXPECT_EQ(moved.data(), data);
    moved.release();
    try {
      moved.data();
      FAIL() << "expected hs::Error";
    } catch (const hs::Error& error) {
      EXPECT_EQ(error.status(), HS_ERROR_INVALID_STATE);
    }
  }
  EXPECT_FALSE(is_mapped(data, 64 * 1024));
  {
    hs_host_pool_options_t options = unregistered_options(64 * 1024);
    hs::HostPool pool(options);
    data = pool.data();
  }
  EXPECT_FALSE(is_mapped(data, 64 * 1024)) << "the destructor must release";
}

TEST(HostPoolApi, RefusesPoolsAboveAvailableRam) {
  uint64_t available = 0;
  ASSERT_EQ(hs_available_host_memory(&available), HS_SUCCESS);
  ASSERT_GT(available, 0u);
  const uint64_t too_big = available + (64ull << 30);

  hs_host_pool_options_t options;
  hs_host_pool_options_init(&options);
  options.size_bytes = too_big;
  hs_host_pool_t pool = reinterpret_cast<hs_host_pool_t>(0x1);
  ASSERT_EQ(hs_host_pool_create(&options, &pool), HS_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(pool, nullptr);
  const std::string message = hs_last_error();
  char needs[64];
  std::snprintf(needs, sizeof(needs), "~%.0f GiB", static_cast<double>(too_big) / (1ull << 30));
  EXPECT_NE(message.find(needs), std::string::npos) << message;
  // Available RAM moves between two reads; the figure must be close to ours.
  const size_t only = message.find("only ");
  ASSERT_NE(only, std::string::npos) << message;
  double available_gib = -1;
  ASSERT_EQ(std::sscanf(message.c_str() + only, "only %lf GiB", &available_gib), 1) << message;
  EXPECT_NEAR(available_gib, static_cast<double>(available) / (1ull << 30), 1.5) << message;
  EXPECT_NE(message.find("size_bytes"), std::string::npos) << message;
  EXPECT_EQ(message.find("host_pool_gib"), std::string::npos) << message;  // not an option of hisparse

  EXPECT_EQ(hs_check_host_memory(too_big), HS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("GiB of RAM is available"), std::string::npos);
  EXPECT_EQ(hs_check_host_memory(1 << 20), HS_SUCCESS) << hs_last_error();
  // The 95% line, with room for the available figure to move between reads.
  EXPECT_EQ(hs_check_host_memory(static_cast<uint64_t>(available * 0.85)), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(hs_check_host_memory(static_cast<uint64_t>(available * 1.05)), HS_ERROR_INVALID_ARGUMENT);
}

TEST(HostPoolApi, BadOptionsNameTheField) {
  hs_host_pool_t pool = nullptr;
  hs_host_pool_options_t options = unregistered_options(0);
  EXPECT_EQ(hs_host_pool_create(&options, &pool), HS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("size_bytes"), std::string::npos) << hs_last_error();

  options = unregistered_options(4096);
  options.registration = 7;
  EXPECT_EQ(hs_host_pool_create(&options, &pool), HS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("registration"), std::string::npos) << hs_last_error();

  options = unregistered_options(4096);
  options.populate_threads = -2;
  EXPECT_EQ(hs_host_pool_create(&options, &pool), HS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("populate_threads"), std::string::npos) << hs_last_error();

  options = unregistered_options(4096);
  options.max_segment_bytes = 12345;
  EXPECT_EQ(hs_host_pool_create(&options, &pool), HS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("max_segment_bytes"), std::string::npos) << hs_last_error();

  options = unregistered_options(4096);
  options.struct_size = 8;
  EXPECT_EQ(hs_host_pool_create(&options, &pool), HS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("options"), std::string::npos) << hs_last_error();
  EXPECT_EQ(pool, nullptr);

  options = unregistered_options(4096);
  ASSERT_EQ(hs_host_pool_create(&options, &pool), HS_SUCCESS);
  hs_host_pool_info_t info{};
  info.struct_size = 4;
  EXPECT_EQ(hs_host_pool_get_info(pool, &info), HS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("info"), std::string::npos);
  void* data = nullptr;
  uint64_t bytes = 0;
  EXPECT_EQ(hs_host_pool_segment(pool, 0, &data, &bytes), HS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("index"), std::string::npos) << hs_last_error();
  EXPECT_EQ(hs_host_pool_segment(pool, 0, nullptr, &bytes), HS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("data"), std::string::npos);
  EXPECT_EQ(hs_host_pool_destroy(pool), HS_SUCCESS);
}

TEST(HostPoolApi, RegistrationFollowsThePolicy) {
  int devices = 0;
  ASSERT_EQ(hs_cuda_device_count(&devices), HS_SUCCESS);

  hs_host_pool_options_t options;
  hs_host_pool_options_init(&options);
  options.size_bytes = 1 << 20;
  options.registration = HS_REGISTER_AUTO;
  {
    hs::HostPool pool(options);
    const hs_host_pool_info_t info = pool.info();
    EXPECT_EQ(info.registered, devices > 0 ? 1 : 0);
    EXPECT_EQ(info.num_segments, devices > 0 ? 1 : 0);
  }

  options.registration = HS_REGISTER_ALWAYS;
  hs_host_pool_t pool = nullptr;
  const hs_status_t status = hs_host_pool_create(&options, &pool);
  if (devices == 0) {
    EXPECT_EQ(status, HS_ERROR_UNSUPPORTED);
    EXPECT_EQ(pool, nullptr);
    EXPECT_NE(std::string(hs_last_error()).find("registration"), std::string::npos) << hs_last_error();
  } else {
    ASSERT_EQ(status, HS_SUCCESS) << hs_last_error();
    const hs_host_pool_info_t info = pool_info(pool);
    EXPECT_EQ(info.registered, 1);
    EXPECT_GE(info.device_index, 0);
    void* data = nullptr;
    void* segment = nullptr;
    uint64_t bytes = 0;
    ASSERT_EQ(hs_host_pool_data(pool, &data), HS_SUCCESS);
    ASSERT_EQ(hs_host_pool_segment(pool, 0, &segment, &bytes), HS_SUCCESS);
    EXPECT_EQ(segment, data);
    EXPECT_EQ(bytes, info.mapped_bytes);
    EXPECT_EQ(hs_host_pool_release(pool), HS_SUCCESS) << hs_last_error();
    EXPECT_EQ(pool_info(pool).registered, 0);
    EXPECT_EQ(hs_host_pool_destroy(pool), HS_SUCCESS);
  }
}

}  // namespace
