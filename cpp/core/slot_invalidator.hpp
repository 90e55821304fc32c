// The seed's HiSparseSlotInvalidator: drops the hot copies of rewritten host
// slots in many index groups with one launch of invalidate_written_slots.
// The kernel finds the groups' tables through a device array of their data
// pointers; that array is built once per set of tables (keyed by the
// pointers themselves, so a recycled address still maps to the right array)
// and kept until the invalidator is destroyed.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "core/backend.hpp"
#include "core/index_group.hpp"
#include "core/tensor.hpp"
#include "hisparse/hisparse.h"

namespace hisparse {

class SlotInvalidator {
 public:
  SlotInvalidator(const Device& device, Backend& backend) : device_(device), backend_(backend) {}
  ~SlotInvalidator();
  SlotInvalidator(const SlotInvalidator&) = delete;
  SlotInvalidator& operator=(const SlotInvalidator&) = delete;

  const Device& device() const { return device_; }
  size_t cached_sets() const { return cache_.size(); }

  // Invalidates in every group's device_global_indices; the groups must
  // share one [S, H] layout and the invalidator's device (`groups[i]` is
  // named runtimes[i] in errors). Blocking only the first time a set of
  // groups is seen.
  void run(const std::vector<const IndexGroup*>& groups, const hs_tensor_t* request_state_indices,
           const hs_tensor_t* req_id_per_token, const hs_tensor_t* written_slots, hs_stream_t stream);

 private:
  const int64_t* pointers_for(const std::vector<int32_t*>& tables);

  Device device_;
  Backend& backend_;
  std::map<std::vector<uintptr_t>, void*> cache_;
};

}  // namespace hisparse
