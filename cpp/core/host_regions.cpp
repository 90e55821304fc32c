#include "core/host_regions.hpp"

#include <algorithm>
#include <mutex>
#include <vector>

#include "core/error.hpp"

namespace hisparse {
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<std::shared_ptr<HostRegion>> regions;  // mapped pools
  // Listed regions whose pool is released: while 0, no tensor can lie in one.
  std::atomic<int> released_listed{0};
};

Registry& registry() {
  static Registry* instance = new Registry;  // never destroyed: pools may outlive static teardown
  return *instance;
}

}  // namespace

void remember_host_region(const std::shared_ptr<HostRegion>& region) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  region->listed_ = true;
  r.regions.push_back(region);
}

void mark_host_region_released(HostRegion& region) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (region.released_.exchange(true, std::memory_order_acq_rel)) return;
  if (region.listed_) r.released_listed.fetch_add(1, std::memory_order_release);
}

void forget_host_region(HostRegion& region) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const bool was_released = region.released_.exchange(true, std::memory_order_acq_rel);
  if (!region.listed_) return;
  region.listed_ = false;
  if (was_released) r.released_listed.fetch_sub(1, std::memory_order_release);
  r.regions.erase(std::remove_if(r.regions.begin(), r.regions.end(),
                                 [&](const std::shared_ptr<HostRegion>& listed) { return listed.get() == &region; }),
                  r.regions.end());
}

std::shared_ptr<const HostRegion> host_region_holding(const void* pointer, uint64_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(pointer);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const std::shared_ptr<HostRegion>& region : r.regions) {
    if (begin >= region->begin() && begin <= region->end() && bytes <= region->end() - begin) return region;
  }
  return nullptr;
}

void check_not_in_released_host_pool(uintptr_t begin, uintptr_t end, const char* name) {
  Registry& r = registry();
  if (r.released_listed.load(std::memory_order_acquire) == 0 || begin >= end) return;
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const std::shared_ptr<HostRegion>& region : r.regions) {
    if (region->released() && begin < region->end() && region->begin() < end) {
      fail(HS_ERROR_INVALID_STATE, name,
           ": the tensor lies in a host pool that was released (its memory stays mapped only while views of it "
           "live, and hisparse no longer reads or writes it); pass memory of a live pool");
    }
  }
}

}  // namespace hisparse
