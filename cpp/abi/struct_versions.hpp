// How the C ABI reads a struct of an older header. Structs grow only by
// appending fields, each time with a bump of the struct's HS_*_VERSION
// (hisparse.h, conventions), so every earlier version is a prefix of the
// current one. A caller's input struct of version v is read up to that
// version's size, and the fields it lacks take their *_init defaults; an
// output struct is written up to the caller's struct_size, as the newest
// version that fits (at least the struct's first version).
//
// Appending a field to a struct: bump its version and add the size of the
// version before (offsetof the new field) to its StructHistory below; the
// struct then fails to compile here until the history is complete.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "hisparse/data_movement.h"
#include "hisparse/hisparse.h"
#include "hisparse/index_group.h"
#include "hisparse/kv_cache.h"
#include "hisparse/runtime.h"
#include "hisparse/shared_host_pool.h"
#include "hisparse/staging.h"

namespace hisparse {

// The sizes of a struct's versions before its current one (version v at
// kEarlierSizes[v - 1]).
template <typename Struct>
struct StructHistory {
  static constexpr std::array<size_t, 0> kEarlierSizes{};
};

// Version 2 appended ring_pages.
template <>
struct StructHistory<hs_update_residency_args_t> {
  static constexpr std::array<size_t, 1> kEarlierSizes{offsetof(hs_update_residency_args_t, ring_pages)};
};

// Version 2 appended residency_hint.
template <>
struct StructHistory<hs_runtime_info_t> {
  static constexpr std::array<size_t, 1> kEarlierSizes{offsetof(hs_runtime_info_t, residency_hint)};
};

// The size of version `version` (1 .. kVersion) of a struct whose current
// version is kVersion.
template <uint32_t kVersion, typename Struct>
size_t struct_version_bytes(uint32_t version) {
  constexpr auto sizes = StructHistory<Struct>::kEarlierSizes;
  static_assert(sizes.size() + 1 == kVersion,
                "a struct's version differs from its history: record the size of every earlier version in "
                "StructHistory (struct_versions.hpp)");
  if constexpr (kVersion > 1) {
    if (version < kVersion) return sizes[version - 1];
  }
  return sizeof(Struct);
}

// The smallest struct_size the library takes: the struct's first version's.
template <typename Struct>
size_t first_struct_version_bytes() {
  constexpr auto sizes = StructHistory<Struct>::kEarlierSizes;
  if constexpr (sizes.empty()) {
    return sizeof(Struct);
  } else {
    return sizes[0];
  }
}

// The defaults of an input struct's fields: its *_init helper. Every struct
// the library reads declares them here.
template <typename Struct>
struct StructDefaults;

#define HISPARSE_STRUCT_DEFAULTS(Struct, init)       \
  template <>                                        \
  struct StructDefaults<Struct> {                    \
    static void fill(Struct* value) { init(value); } \
  };

HISPARSE_STRUCT_DEFAULTS(hs_config_t, hs_config_init)
HISPARSE_STRUCT_DEFAULTS(hs_host_pool_options_t, hs_host_pool_options_init)
HISPARSE_STRUCT_DEFAULTS(hs_resolve_residency_args_t, hs_resolve_residency_args_init)
HISPARSE_STRUCT_DEFAULTS(hs_gather_compact_args_t, hs_gather_compact_args_init)
HISPARSE_STRUCT_DEFAULTS(hs_gather_compact_group_args_t, hs_gather_compact_group_args_init)
HISPARSE_STRUCT_DEFAULTS(hs_invalidate_written_slots_args_t, hs_invalidate_written_slots_args_init)
HISPARSE_STRUCT_DEFAULTS(hs_index_group_options_t, hs_index_group_options_init)
HISPARSE_STRUCT_DEFAULTS(hs_index_group_resolve_args_t, hs_index_group_resolve_args_init)
HISPARSE_STRUCT_DEFAULTS(hs_write_rows_args_t, hs_write_rows_args_init)
HISPARSE_STRUCT_DEFAULTS(hs_update_residency_args_t, hs_update_residency_args_init)
HISPARSE_STRUCT_DEFAULTS(hs_kv_cache_options_t, hs_kv_cache_options_init)
HISPARSE_STRUCT_DEFAULTS(hs_kv_cache_swap_in_args_t, hs_kv_cache_swap_in_args_init)
HISPARSE_STRUCT_DEFAULTS(hs_runtime_options_t, hs_runtime_options_init)
HISPARSE_STRUCT_DEFAULTS(hs_hot_cache_binding_t, hs_hot_cache_binding_init)
HISPARSE_STRUCT_DEFAULTS(hs_runtime_swap_in_args_t, hs_runtime_swap_in_args_init)
HISPARSE_STRUCT_DEFAULTS(hs_runtime_write_args_t, hs_runtime_write_args_init)
HISPARSE_STRUCT_DEFAULTS(hs_runtime_host_sharing_t, hs_runtime_host_sharing_init)
HISPARSE_STRUCT_DEFAULTS(hs_shared_host_pool_options_t, hs_shared_host_pool_options_init)
HISPARSE_STRUCT_DEFAULTS(hs_staging_plan_options_t, hs_staging_plan_options_init)
HISPARSE_STRUCT_DEFAULTS(hs_staging_remap_args_t, hs_staging_remap_args_init)

#undef HISPARSE_STRUCT_DEFAULTS

}  // namespace hisparse
