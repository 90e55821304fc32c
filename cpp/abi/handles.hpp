// The public handles and device arguments of the C ABI as core types. A
// handle is the core object itself behind an opaque pointer type: the C
// struct is never defined, so the only way to reach the object is through
// these conversions, which also refuse NULL handles naming the argument.
#pragma once

#include <cstdint>

#include "abi/api_guard.hpp"
#include "core/index_group.hpp"
#include "core/runtime.hpp"
#include "core/slot_invalidator.hpp"
#include "core/tensor.hpp"
#include "hisparse/hisparse.h"

namespace hisparse {

inline hs_index_group_t to_handle(IndexGroup* group) { return reinterpret_cast<hs_index_group_t>(group); }
inline IndexGroup& from_handle(hs_index_group_t group, const char* name) {
  return *reinterpret_cast<IndexGroup*>(require_pointer(group, name));
}

inline hs_runtime_t to_handle(Runtime* runtime) { return reinterpret_cast<hs_runtime_t>(runtime); }
inline Runtime& from_handle(hs_runtime_t runtime, const char* name) {
  return *reinterpret_cast<Runtime*>(require_pointer(runtime, name));
}

inline hs_slot_invalidator_t to_handle(SlotInvalidator* invalidator) {
  return reinterpret_cast<hs_slot_invalidator_t>(invalidator);
}
inline SlotInvalidator& from_handle(hs_slot_invalidator_t invalidator, const char* name) {
  return *reinterpret_cast<SlotInvalidator*>(require_pointer(invalidator, name));
}

// (device_type, device_index) -> Device: HS_DEVICE_CPU, or HS_DEVICE_CUDA
// with an index, -1 = `fallback` when given (a follower inherits its
// leader's device), else the calling thread's current CUDA device.
Device device_from(int32_t device_type, int32_t device_index, const Device* fallback = nullptr);

}  // namespace hisparse
