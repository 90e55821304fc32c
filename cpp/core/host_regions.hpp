// The memory of every host pool of the process, as the rest of the library
// sees it. A pool is released for hisparse the moment it is released (or
// retired), even while its pages stay mapped for tensor views that still
// show them: from then on no kernel may be given that memory and no runtime
// bound in it may run. The registry answers the two questions that needs:
// which live pool holds a range (a runtime keeps the answer at bind), and
// whether a range lies in a pool that is released but still mapped (every
// tensor argument is checked, at the cost of one atomic load while no pool
// is in that state).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace hisparse {

class HostRegion;
void remember_host_region(const std::shared_ptr<HostRegion>& region);

// One pool's memory: [begin, end) and whether the pool was released.
class HostRegion {
 public:
  HostRegion(const void* base, uint64_t bytes)
      : begin_(reinterpret_cast<uintptr_t>(base)), end_(reinterpret_cast<uintptr_t>(base) + bytes) {}
  HostRegion(const HostRegion&) = delete;
  HostRegion& operator=(const HostRegion&) = delete;

  uintptr_t begin() const { return begin_; }
  uintptr_t end() const { return end_; }
  bool released() const { return released_.load(std::memory_order_acquire); }

 private:
  friend void remember_host_region(const std::shared_ptr<HostRegion>& region);
  friend void mark_host_region_released(HostRegion& region);
  friend void forget_host_region(HostRegion& region);

  uintptr_t begin_;
  uintptr_t end_;
  std::atomic<bool> released_{false};
  bool listed_ = false;  // in the registry (mapped); guarded by the registry's mutex
};

// Lists a pool's mapped memory.
void remember_host_region(const std::shared_ptr<HostRegion>& region);
// Marks the pool released; its memory stays listed (and refused) until forgotten.
void mark_host_region_released(HostRegion& region);
// Drops the region from the registry once its memory is unmapped (the
// addresses may be reused by any later allocation). Implies released.
void forget_host_region(HostRegion& region);

// The listed region that holds all of [pointer, pointer + bytes), or null.
std::shared_ptr<const HostRegion> host_region_holding(const void* pointer, uint64_t bytes);

// Throws HS_ERROR_INVALID_STATE naming `name` when [begin, end) overlaps the
// memory of a pool that is released but still mapped for views.
void check_not_in_released_host_pool(uintptr_t begin, uintptr_t end, const char* name);

}  // namespace hisparse
