// The public handles and device arguments of the C ABI as core types. A
// handle is the core object itself behind an opaque pointer type: the C
// struct is never defined, so the only way to reach the object is through
// these conversions. Every handle a create call returns is listed until its
// destroy, and a handle is only followed once it is found in that list: a
// NULL, destroyed or made-up handle fails naming the argument instead of
// being dereferenced.
#pragma once

#include <cstdint>

#include "abi/api_guard.hpp"
#include "core/index_group.hpp"
#include "core/runtime.hpp"
#include "core/slot_invalidator.hpp"
#include "core/tensor.hpp"
#include "hisparse/hisparse.h"

namespace hisparse {

enum class HandleKind {
  kHostPool,
  kIndexGroup,         // made by hs_index_group_create: the caller destroys it
  kRuntimeIndexGroup,  // a runtime group's, from hs_runtime_get_index_group: lives with its runtimes
  kRuntime,
  kKvCacheRuntime,     // a KV cache's, from hs_kv_cache_get_runtime: lives with its cache
  kKvCache,
  kSlotInvalidator,
  kStagingPlan,
  kIpcEvent,
};

// Lists `handle` as a live handle of `kind` (again: no change).
void list_handle(const void* handle, HandleKind kind);
// Drops `handle` from the list (its object is about to be freed).
void unlist_handle(const void* handle);
// Throws HS_ERROR_INVALID_ARGUMENT naming `name` unless `handle` is a live
// handle of `kind` (or of `also`, when given); `type` is its C type's name.
void require_handle(const void* handle, HandleKind kind, const char* name, const char* type,
                    const HandleKind* also = nullptr);
// For a destroy call: false for NULL (nothing to do), true for a live
// handle of `kind`, which is unlisted; throws for anything else.
bool take_handle(const void* handle, HandleKind kind, const char* name, const char* type);

inline hs_index_group_t to_handle(IndexGroup* group) { return reinterpret_cast<hs_index_group_t>(group); }
inline IndexGroup& from_handle(hs_index_group_t group, const char* name) {
  const HandleKind borrowed = HandleKind::kRuntimeIndexGroup;
  require_handle(group, HandleKind::kIndexGroup, name, "hs_index_group_t", &borrowed);
  return *reinterpret_cast<IndexGroup*>(group);
}

inline hs_runtime_t to_handle(Runtime* runtime) { return reinterpret_cast<hs_runtime_t>(runtime); }
inline Runtime& from_handle(hs_runtime_t runtime, const char* name) {
  const HandleKind borrowed = HandleKind::kKvCacheRuntime;
  require_handle(runtime, HandleKind::kRuntime, name, "hs_runtime_t", &borrowed);
  return *reinterpret_cast<Runtime*>(runtime);
}

// The runtime behind a live hs_runtime_t that its caller binds: a KV cache's
// runtime (hs_kv_cache_get_runtime) is bound by its cache, so binding or
// unbinding it is refused naming `name`.
Runtime& bindable_runtime(hs_runtime_t runtime, const char* name);

inline hs_slot_invalidator_t to_handle(SlotInvalidator* invalidator) {
  return reinterpret_cast<hs_slot_invalidator_t>(invalidator);
}
inline SlotInvalidator& from_handle(hs_slot_invalidator_t invalidator, const char* name) {
  require_handle(invalidator, HandleKind::kSlotInvalidator, name, "hs_slot_invalidator_t");
  return *reinterpret_cast<SlotInvalidator*>(invalidator);
}

// (device_type, device_index) -> Device: HS_DEVICE_CPU, or HS_DEVICE_CUDA
// with an index, -1 = `fallback` when given (a follower inherits its
// leader's device), else the calling thread's current CUDA device.
Device device_from(int32_t device_type, int32_t device_index, const Device* fallback = nullptr);

}  // namespace hisparse
