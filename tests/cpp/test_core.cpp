// The C ABI's plumbing: status strings, the thread-local last error, version
// and build queries, dtype helpers, versioned-struct and NULL checks, the
// CPU byte copy, and the header-only C++ layer's error translation.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "expect_status.hpp"
#include "hisparse/hisparse.h"
#include "hisparse/hisparse.hpp"

namespace {

TEST(Status, EveryStatusHasItsName) {
  const std::vector<std::pair<hs_status_t, const char*>> names = {
      {HS_SUCCESS, "HS_SUCCESS"},
      {HS_ERROR_INVALID_ARGUMENT, "HS_ERROR_INVALID_ARGUMENT"},
      {HS_ERROR_INVALID_DTYPE, "HS_ERROR_INVALID_DTYPE"},
      {HS_ERROR_INVALID_STATE, "HS_ERROR_INVALID_STATE"},
      {HS_ERROR_OUT_OF_MEMORY, "HS_ERROR_OUT_OF_MEMORY"},
      {HS_ERROR_UNSUPPORTED, "HS_ERROR_UNSUPPORTED"},
      {HS_ERROR_CUDA, "HS_ERROR_CUDA"},
      {HS_ERROR_SYSTEM, "HS_ERROR_SYSTEM"},
      {HS_ERROR_INTERNAL, "HS_ERROR_INTERNAL"},
  };
  ASSERT_EQ(names.size(), static_cast<size_t>(HS_NUM_STATUS));
  for (const auto& [status, name] : names) EXPECT_STREQ(hs_status_string(status), name);
}

TEST(Status, UnknownStatusIsNamedNotNull) {
  EXPECT_STREQ(hs_status_string(HS_NUM_STATUS), "HS_UNKNOWN_STATUS");
  EXPECT_STREQ(hs_status_string(static_cast<hs_status_t>(-3)), "HS_UNKNOWN_STATUS");
}

TEST(LastError, SetOnFailureAndClearedOnSuccess) {
  int version = 0;
  ASSERT_EQ(hs_get_version(&version), HS_SUCCESS);
  EXPECT_STREQ(hs_last_error(), "");

  expect_error(hs_get_version(nullptr), HS_ERROR_INVALID_ARGUMENT, {"version", "NULL"});
  // A later failure replaces the message rather than appending to it.
  expect_error(hs_available_host_memory(nullptr), HS_ERROR_INVALID_ARGUMENT, {"bytes"});
  EXPECT_EQ(std::string(hs_last_error()).find("version"), std::string::npos);

  ASSERT_EQ(hs_get_version(&version), HS_SUCCESS);
  EXPECT_STREQ(hs_last_error(), "");
}

TEST(LastError, IsThreadLocal) {
  // This thread fails; another thread sees no error, fails differently, and
  // neither message leaks into the other thread.
  ASSERT_EQ(hs_get_version(nullptr), HS_ERROR_INVALID_ARGUMENT);
  const std::string mine = hs_last_error();
  ASSERT_NE(mine.find("version"), std::string::npos);

  std::string other_before, other_after;
  std::thread other([&] {
    other_before = hs_last_error();
    hs_host_layout_t layout{};
    layout.struct_size = sizeof(layout);
    hs_plan_host_layout(0, 64, 128, 1 << 20, &layout);
    other_after = hs_last_error();
  });
  other.join();

  EXPECT_EQ(other_before, "");
  EXPECT_NE(other_after.find("page_size_bytes"), std::string::npos) << other_after;
  EXPECT_EQ(std::string(hs_last_error()), mine);
}

TEST(Version, RuntimeMatchesMacros) {
  int version = -1;
  ASSERT_EQ(hs_get_version(&version), HS_SUCCESS);
  EXPECT_EQ(version, HISPARSE_VERSION);
  EXPECT_EQ(version, HISPARSE_VERSION_CODE(HISPARSE_VERSION_MAJOR, HISPARSE_VERSION_MINOR, HISPARSE_VERSION_PATCH));
  EXPECT_EQ(HISPARSE_VERSION_CODE(1, 2, 3), 10203);
  EXPECT_STREQ(hs_version_string(), HISPARSE_VERSION_STRING);
  const std::string expected = std::to_string(HISPARSE_VERSION_MAJOR) + "." + std::to_string(HISPARSE_VERSION_MINOR) +
                               "." + std::to_string(HISPARSE_VERSION_PATCH);
  EXPECT_EQ(std::string(hs_version_string()), expected);
  EXPECT_EQ(hs::version(), HISPARSE_VERSION);
}

TEST(BuildInfo, DescribesThisBuild) {
  hs_build_info_t info{};
  info.struct_size = sizeof(info);
  ASSERT_EQ(hs_get_build_info(&info), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(info.struct_size, sizeof(info));
  EXPECT_EQ(info.struct_version, static_cast<uint32_t>(HS_BUILD_INFO_VERSION));
  EXPECT_GT(std::strlen(info.build_type), 0u);
  EXPECT_GT(std::strlen(info.compiler), 0u);
#ifdef HISPARSE_WITH_CUDA
  EXPECT_EQ(info.cuda_compiled, 1);
  EXPECT_GT(info.cuda_runtime_version, 0);
  EXPECT_GT(std::strlen(info.cuda_architectures), 0u);
#else
  EXPECT_EQ(info.cuda_compiled, 0);
  EXPECT_EQ(info.cuda_runtime_version, 0);
  EXPECT_STREQ(info.cuda_architectures, "");
#endif
}

TEST(BuildInfo, RefusesAStructTooSmall) {
  hs_build_info_t info{};
  info.struct_size = sizeof(size_t) + sizeof(uint32_t);
  expect_error(hs_get_build_info(&info), HS_ERROR_INVALID_ARGUMENT, {"info", "struct_size"});
  expect_error(hs_get_build_info(nullptr), HS_ERROR_INVALID_ARGUMENT, {"info", "NULL"});
}

// Every input struct goes through one reader: too small a struct_size, or a
// struct_version other than 1 .. the header's, is refused naming the field.
TEST(VersionedStructs, InputsAreCheckedForSizeAndVersion) {
  hs_config_t config;
  hs_config_init(&config);
  hs_index_group_options_t options;
  hs_index_group_options_init(&options);
  options.max_num_reqs = 1;
  hs_gather_compact_args_t gather;
  hs_gather_compact_args_init(&gather);
  const auto config_call = [&] { return hs_config_validate(&config, -1); };
  hs_index_group_t group = nullptr;  // created once, by the valid call
  const auto group_call = [&] { return hs_index_group_create(&options, &group); };
  const auto gather_call = [&] { return hs_gather_compact(&gather, nullptr); };
  for (uint32_t version : {0u, 2u}) {
    config.struct_version = version;
    expect_error(config_call(), HS_ERROR_INVALID_ARGUMENT, {"config", "struct_version"});
    options.struct_version = version;
    expect_error(group_call(), HS_ERROR_INVALID_ARGUMENT, {"options", "struct_version"});
    gather.struct_version = version;
    expect_error(gather_call(), HS_ERROR_INVALID_ARGUMENT, {"args", "struct_version"});
  }
  config.struct_version = HS_CONFIG_VERSION;
  options.struct_version = HS_INDEX_GROUP_OPTIONS_VERSION;
  EXPECT_EQ(config_call(), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(group_call(), HS_SUCCESS) << hs_last_error();
  config.struct_size = sizeof(config) - 4;
  expect_error(config_call(), HS_ERROR_INVALID_ARGUMENT, {"config", "struct_size"});
  hs_index_group_destroy(group);
  options.struct_size = sizeof(options) - 4;
  expect_error(group_call(), HS_ERROR_INVALID_ARGUMENT, {"options", "struct_size"});
  EXPECT_EQ(group, nullptr);
}

TEST(BuildInfo, NeverWritesPastTheCallersStruct) {
  // A newer caller may hand in a bigger struct; the library fills what it
  // knows and leaves the caller's tail alone.
  struct Bigger {
    hs_build_info_t info;
    char tail[32];
  } bigger;
  std::memset(&bigger, 0x5a, sizeof(bigger));
  bigger.info.struct_size = sizeof(bigger);
  ASSERT_EQ(hs_get_build_info(&bigger.info), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(bigger.info.struct_size, sizeof(bigger));
  for (char c : bigger.tail) EXPECT_EQ(c, 0x5a);
}

TEST(Dtype, SizesAndNames) {
  struct Expected {
    hs_dtype_t dtype;
    size_t size;
    const char* name;
  };
  const std::vector<Expected> table = {
      {HS_DTYPE_UINT8, 1, "uint8"},
      {HS_DTYPE_INT8, 1, "int8"},
      {HS_DTYPE_INT16, 2, "int16"},
      {HS_DTYPE_INT32, 4, "int32"},
      {HS_DTYPE_INT64, 8, "int64"},
      {HS_DTYPE_FLOAT16, 2, "float16"},
      {HS_DTYPE_BFLOAT16, 2, "bfloat16"},
      {HS_DTYPE_FLOAT32, 4, "float32"},
      {HS_DTYPE_FLOAT64, 8, "float64"},
      {HS_DTYPE_FLOAT8_E4M3, 1, "float8_e4m3fn"},
      {HS_DTYPE_FLOAT8_E5M2, 1, "float8_e5m2"},
      {HS_DTYPE_BOOL, 1, "bool"},
  };
  ASSERT_EQ(table.size(), static_cast<size_t>(HS_NUM_DTYPES));
  for (const Expected& e : table) {
    EXPECT_EQ(hs_dtype_size(e.dtype), e.size) << e.name;
    EXPECT_STREQ(hs_dtype_name(e.dtype), e.name);
  }
  EXPECT_EQ(hs_dtype_size(HS_NUM_DTYPES), 0u);
  EXPECT_STREQ(hs_dtype_name(HS_NUM_DTYPES), "unknown");
  EXPECT_STREQ(hs_dtype_name(static_cast<hs_dtype_t>(-1)), "unknown");
}

TEST(NullPointers, EveryEntryPointNamesTheArgument) {
  expect_error(hs_get_version(nullptr), HS_ERROR_INVALID_ARGUMENT, {"version"});
  expect_error(hs_cuda_device_count(nullptr), HS_ERROR_INVALID_ARGUMENT, {"count"});
  expect_error(hs_cuda_device_properties(0, nullptr), HS_ERROR_INVALID_ARGUMENT, {"props"});
  expect_error(hs_available_host_memory(nullptr), HS_ERROR_INVALID_ARGUMENT, {"bytes"});

  hs_host_pool_options_t options;
  hs_host_pool_options_init(&options);
  options.size_bytes = 4096;
  hs_host_pool_t pool = reinterpret_cast<hs_host_pool_t>(0x1);
  expect_error(hs_host_pool_create(nullptr, &pool), HS_ERROR_INVALID_ARGUMENT, {"options"});
  EXPECT_EQ(pool, nullptr) << "a failed create must leave the handle NULL";
  expect_error(hs_host_pool_create(&options, nullptr), HS_ERROR_INVALID_ARGUMENT, {"pool"});
  expect_error(hs_host_pool_release(nullptr), HS_ERROR_INVALID_ARGUMENT, {"pool"});
  void* data = nullptr;
  expect_error(hs_host_pool_data(nullptr, &data), HS_ERROR_INVALID_ARGUMENT, {"pool"});
  hs_host_pool_info_t info{};
  info.struct_size = sizeof(info);
  expect_error(hs_host_pool_get_info(nullptr, &info), HS_ERROR_INVALID_ARGUMENT, {"pool"});
  uint64_t bytes = 0;
  expect_error(hs_host_pool_segment(nullptr, 0, &data, &bytes), HS_ERROR_INVALID_ARGUMENT, {"pool"});

  expect_error(hs_plan_host_layout(4096, 64, 128, 1 << 20, nullptr), HS_ERROR_INVALID_ARGUMENT, {"layout"});
  expect_error(hs_config_validate(nullptr, -1), HS_ERROR_INVALID_ARGUMENT, {"config"});
  expect_error(hs_resolver_shared_memory_bytes(4096, 2048, nullptr), HS_ERROR_INVALID_ARGUMENT, {"bytes"});

  uint8_t buffer[16] = {};
  const int64_t shape[1] = {16};
  const hs_tensor_t tensor{buffer, HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 1, shape, nullptr};
  expect_error(hs_copy_bytes(nullptr, &tensor, nullptr), HS_ERROR_INVALID_ARGUMENT, {"dst"});
  expect_error(hs_copy_bytes(&tensor, nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT, {"src"});
  expect_error(hs_resolve_residency(nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT, {"args"});
}

TEST(Devices, CountNeverFailsAndMatchesTheBackend) {
  int count = -1;
  ASSERT_EQ(hs_cuda_device_count(&count), HS_SUCCESS) << hs_last_error();
  EXPECT_GE(count, 0);
  const std::string reason = hs_cuda_unavailable_reason();
#ifdef HISPARSE_WITH_CUDA
  EXPECT_EQ(reason.empty(), count > 0) << reason;
#else
  EXPECT_EQ(count, 0);
  EXPECT_NE(reason.find("without the CUDA backend"), std::string::npos) << reason;
#endif
}

TEST(Devices, PropertiesOfAMissingDeviceFail) {
  int count = 0;
  ASSERT_EQ(hs_cuda_device_count(&count), HS_SUCCESS);
  hs_device_properties_t props{};
  props.struct_size = sizeof(props);
  const hs_status_t status = hs_cuda_device_properties(count, &props);
  EXPECT_NE(status, HS_SUCCESS);
  EXPECT_TRUE(status == HS_ERROR_UNSUPPORTED || status == HS_ERROR_INVALID_ARGUMENT) << hs_status_string(status);
  EXPECT_STRNE(hs_last_error(), "");
  if (count > 0) {
    ASSERT_EQ(hs_cuda_device_properties(0, &props), HS_SUCCESS) << hs_last_error();
    EXPECT_GT(std::strlen(props.name), 0u);
    EXPECT_GE(props.major, 7);
    EXPECT_GT(props.max_shared_memory_per_block, 48u * 1024u);
  }
}

TEST(CopyBytes, CopiesOnTheCpuBackend) {
  std::vector<uint8_t> src(256), dst(256, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  // Same bytes, different element types: the copy is by bytes.
  const int64_t dst_shape[2] = {8, 8};
  const int64_t src_shape[1] = {256};
  const hs_tensor_t d{dst.data(), HS_DTYPE_INT32, HS_DEVICE_CPU, 0, 2, dst_shape, nullptr};
  const hs_tensor_t s{src.data(), HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 1, src_shape, nullptr};
  ASSERT_EQ(hs_copy_bytes(&d, &s, nullptr), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(dst, src);
}

TEST(CopyBytes, RejectsMismatchedOrStridedTensors) {
  std::vector<uint8_t> a(64), b(64);
  const int64_t shape64[1] = {64};
  const int64_t shape32[1] = {32};
  const hs_tensor_t big{a.data(), HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 1, shape64, nullptr};
  const hs_tensor_t small{b.data(), HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 1, shape32, nullptr};
  expect_error(hs_copy_bytes(&small, &big, nullptr), HS_ERROR_INVALID_ARGUMENT, {"dst", "64", "32"});

  const int64_t strides2[1] = {2};
  const hs_tensor_t strided{a.data(), HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 1, shape32, strides2};
  expect_error(hs_copy_bytes(&small, &strided, nullptr), HS_ERROR_INVALID_ARGUMENT, {"src", "contiguous"});

  const hs_tensor_t bad_dtype{a.data(), static_cast<hs_dtype_t>(99), HS_DEVICE_CPU, 0, 1, shape64, nullptr};
  expect_error(hs_copy_bytes(&big, &bad_dtype, nullptr), HS_ERROR_INVALID_DTYPE, {"src", "dtype"});

  const int64_t negative[1] = {-4};
  const hs_tensor_t bad_shape{a.data(), HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 1, negative, nullptr};
  expect_error(hs_copy_bytes(&bad_shape, &big, nullptr), HS_ERROR_INVALID_ARGUMENT, {"dst", "-4"});

  const hs_tensor_t null_data{nullptr, HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 1, shape64, nullptr};
  expect_error(hs_copy_bytes(&big, &null_data, nullptr), HS_ERROR_INVALID_ARGUMENT, {"src", "NULL"});

  const hs_tensor_t bad_device{a.data(), HS_DTYPE_UINT8, 42, 0, 1, shape64, nullptr};
  expect_error(hs_copy_bytes(&bad_device, &big, nullptr), HS_ERROR_INVALID_ARGUMENT, {"dst", "device"});
}

TEST(CopyBytes, CudaTensorsWithoutADeviceFailCleanly) {
  int count = 0;
  ASSERT_EQ(hs_cuda_device_count(&count), HS_SUCCESS);
  if (count > 0) GTEST_SKIP() << "a CUDA device is present";
  std::vector<uint8_t> a(64), b(64);
  const int64_t shape[1] = {64};
  const hs_tensor_t host{a.data(), HS_DTYPE_UINT8, HS_DEVICE_CPU, 0, 1, shape, nullptr};
  const hs_tensor_t device{b.data(), HS_DTYPE_UINT8, HS_DEVICE_CUDA, 0, 1, shape, nullptr};
  expect_error(hs_copy_bytes(&device, &host, nullptr), HS_ERROR_UNSUPPORTED, {"cuda"});
}

TEST(CppLayer, ThrowsErrorsCarryingStatusAndMessage) {
  try {
    hs::plan_host_layout(4096, 0, 128, 1 << 20);
    FAIL() << "expected hs::Error";
  } catch (const hs::Error& error) {
    EXPECT_EQ(error.status(), HS_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(error.what()).find("block_size"), std::string::npos) << error.what();
  }
  hs_config_t config = hs::default_config();
  EXPECT_NO_THROW(hs::validate(config));
  config.row_bytes = 100;
  EXPECT_THROW(hs::validate(config), hs::Error);
}

TEST(CppLayer, TensorCopiesKeepTheirOwnShape) {
  int32_t data[6] = {};
  hs::Tensor original(data, HS_DTYPE_INT32, {2, 3});
  original.strides({3, 1});
  hs::Tensor copy = original;
  {
    hs::Tensor temporary(data, HS_DTYPE_INT32, {6});
    copy = original;  // assignment rebinds to copy's own arrays
    (void)temporary;
  }
  EXPECT_NE(copy.get()->shape, original.get()->shape);
  EXPECT_NE(copy.get()->strides, original.get()->strides);
  ASSERT_EQ(copy.get()->ndim, 2);
  EXPECT_EQ(copy.get()->shape[0], 2);
  EXPECT_EQ(copy.get()->shape[1], 3);
  EXPECT_EQ(copy.get()->strides[0], 3);
  EXPECT_THROW(hs::Tensor(data, HS_DTYPE_INT32, {1, 1, 1, 1, 1, 1, 1, 1, 1}), hs::Error);
}

}  // namespace
