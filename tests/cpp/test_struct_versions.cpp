// The C ABI's struct versioning (abi/struct_versions.hpp): a caller built
// against an older header passes structs of an older version, which the
// library reads up to that version's size (the later fields take their
// *_init defaults) and writes as the newest version the caller's
// struct_size holds. A struct of this test stands for one that has grown:
// version 2 appended `added` to version 1 (hs_update_residency_args_t, the
// public struct that grew, has its own test in test_kv_cache.cpp).
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "abi/api_guard.hpp"

namespace {

struct grown_args_t {
  size_t struct_size;
  uint32_t struct_version;
  int32_t kept;   // since version 1
  int64_t added;  // since version 2
};

// What a caller compiled against version 1 of the header has.
struct grown_args_v1_t {
  size_t struct_size;
  uint32_t struct_version;
  int32_t kept;
};

constexpr uint32_t kGrownVersion = 2;
constexpr int64_t kAddedDefault = 42;

void grown_args_init(grown_args_t* args) {
  args->struct_size = sizeof(*args);
  args->struct_version = kGrownVersion;
  args->kept = 7;
  args->added = kAddedDefault;
}

// The error read_struct / write_struct raise, or "" when they raise none.
template <typename Call>
std::string error_of(Call&& call) {
  try {
    call();
  } catch (const hisparse::Error& error) {
    EXPECT_EQ(error.status(), HS_ERROR_INVALID_ARGUMENT);
    return error.what();
  }
  return "";
}

void expect_mentions(const std::string& message, std::initializer_list<const char*> fragments) {
  EXPECT_FALSE(message.empty()) << "no error";
  for (const char* fragment : fragments) {
    EXPECT_NE(message.find(fragment), std::string::npos) << "'" << fragment << "' missing in: " << message;
  }
}

}  // namespace

namespace hisparse {
template <>
struct StructHistory<grown_args_t> {
  static constexpr std::array<size_t, 1> kEarlierSizes{sizeof(grown_args_v1_t)};
};
template <>
struct StructDefaults<grown_args_t> {
  static void fill(grown_args_t* value) { grown_args_init(value); }
};
}  // namespace hisparse

static_assert(sizeof(grown_args_v1_t) == offsetof(grown_args_t, added), "version 1 is a prefix of version 2");

TEST(StructVersions, AnOlderVersionIsReadUpToItsSizeAndItsLaterFieldsTakeTheirDefaults) {
  const grown_args_v1_t old{sizeof(grown_args_v1_t), 1, 5};
  const grown_args_t got = hisparse::read_struct<kGrownVersion>(reinterpret_cast<const grown_args_t*>(&old), "args");
  EXPECT_EQ(got.kept, 5);
  EXPECT_EQ(got.added, kAddedDefault);
}

TEST(StructVersions, TheCurrentVersionIsReadWhole) {
  grown_args_t args;
  grown_args_init(&args);
  args.kept = 3;
  args.added = -9;
  const grown_args_t got = hisparse::read_struct<kGrownVersion>(&args, "args");
  EXPECT_EQ(got.kept, 3);
  EXPECT_EQ(got.added, -9);
}

TEST(StructVersions, AStructSmallerThanItsVersionIsRefusedNamingBoth) {
  // Version 2 claimed with version 1's size: the appended field is not there.
  const grown_args_v1_t short_v2{sizeof(grown_args_v1_t), 2, 5};
  expect_mentions(
      error_of([&] { hisparse::read_struct<kGrownVersion>(reinterpret_cast<const grown_args_t*>(&short_v2), "args"); }),
      {"args", "struct_size 16", "24 bytes of version 2"});
  // Smaller than the first version: nothing is read, not even the version.
  const grown_args_v1_t tiny{8, 1, 5};
  expect_mentions(
      error_of([&] { hisparse::read_struct<kGrownVersion>(reinterpret_cast<const grown_args_t*>(&tiny), "args"); }),
      {"args", "struct_size 8", "16 bytes"});
}

TEST(StructVersions, AVersionNewerThanTheLibrarysIsRefused) {
  grown_args_t args;
  grown_args_init(&args);
  args.struct_version = 3;
  expect_mentions(error_of([&] { hisparse::read_struct<kGrownVersion>(&args, "args"); }),
                  {"args", "struct_version 3", "1 to 2"});
  args.struct_version = 0;
  expect_mentions(error_of([&] { hisparse::read_struct<kGrownVersion>(&args, "args"); }), {"struct_version 0"});
}

TEST(StructVersions, AnOutputStructIsWrittenAsTheNewestVersionItsSizeHolds) {
  grown_args_t value;
  grown_args_init(&value);
  value.kept = 11;
  value.added = 12;

  // An older caller's struct, with guard bytes behind it that must stay.
  unsigned char buffer[sizeof(grown_args_t)];
  std::memset(buffer, 0xA5, sizeof(buffer));
  grown_args_v1_t old{sizeof(grown_args_v1_t), 0, 0};
  std::memcpy(buffer, &old, sizeof(old));
  auto* out = reinterpret_cast<grown_args_t*>(buffer);
  hisparse::require_struct_size(out, "info");
  hisparse::write_struct<kGrownVersion>(out, value);
  std::memcpy(&old, buffer, sizeof(old));
  EXPECT_EQ(old.struct_size, sizeof(grown_args_v1_t));
  EXPECT_EQ(old.struct_version, 1u);
  EXPECT_EQ(old.kept, 11);
  for (size_t i = sizeof(grown_args_v1_t); i < sizeof(buffer); ++i) EXPECT_EQ(buffer[i], 0xA5) << "byte " << i;

  // A current caller's struct gets every field.
  grown_args_t current{};
  current.struct_size = sizeof(current);
  hisparse::write_struct<kGrownVersion>(&current, value);
  EXPECT_EQ(current.struct_version, kGrownVersion);
  EXPECT_EQ(current.kept, 11);
  EXPECT_EQ(current.added, 12);

  // Smaller than the first version: refused before anything is written.
  grown_args_t tiny{};
  tiny.struct_size = 8;
  expect_mentions(error_of([&] { hisparse::require_struct_size(&tiny, "info"); }), {"info", "struct_size 8"});
}

TEST(StructVersions, EveryPublicStructIsReadAtItsOwnSize) {
  // No public struct has grown: a struct initialised by its *_init call is
  // read whole, and one byte less is refused.
  hs_config_t config;
  hs_config_init(&config);
  config.row_bytes = 640;
  EXPECT_EQ(hisparse::read_struct<HS_CONFIG_VERSION>(&config, "config").row_bytes, 640);
  config.struct_size = sizeof(config) - 1;
  expect_mentions(error_of([&] { hisparse::read_struct<HS_CONFIG_VERSION>(&config, "config"); }),
                  {"config", "struct_size"});
}
