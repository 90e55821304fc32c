#include "core/host_registration.hpp"

#include <algorithm>
#include <iterator>
#include <map>
#include <mutex>
#include <vector>

#include "core/backend.hpp"
#include "core/error.hpp"
#include "core/host_regions.hpp"
#include "core/process_memory.hpp"

namespace hisparse {
namespace {

// cudaHostRegister refuses single ranges above 64 GiB.
constexpr uint64_t kMaxSegmentBytes = 64ull << 30;

struct Registration {
  uint64_t bytes = 0;
  Device device;
  std::vector<char*> segments;  // registered with the backend (none on the CPU)
};

struct Registry {
  std::mutex mutex;
  std::map<uintptr_t, Registration> ranges;  // by start address
};

Registry& registry() {
  static Registry instance;
  return instance;
}

void unregister_segments(Backend& backend, const Registration& r, size_t count) {
  for (size_t i = count; i > 0; --i) backend.unregister_host_memory(r.segments[i - 1], r.device.index);
}

}  // namespace

void register_host_memory(void* data, uint64_t bytes, const Device& device) {
  if (data == nullptr) invalid_argument("data: expected a non-NULL pointer");
  if (bytes == 0) invalid_argument("bytes: expected a positive size, got 0");
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  if (begin + bytes < begin) invalid_argument("bytes: the range at ", data, " of ", bytes, " bytes wraps around");
  Backend& backend = backend_for(device, "device");
  if (device.is_cuda() && backend.is_device_memory(data)) {
    invalid_argument("data: expected host memory, got memory of a CUDA device");
  }
  // Refused on every backend, so that what registers here registers on a
  // GPU too: memory the process has not mapped, and a released host pool's.
  if (!ProcessMemoryMap().covers(begin, bytes, false)) {
    invalid_argument("data, bytes: [", data, ", +", bytes, ") is not host memory mapped readable in this process");
  }
  check_not_in_released_host_pool(begin, begin + bytes, "data");
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  // The first range starting after `begin`, and the one before it.
  const auto next = reg.ranges.upper_bound(begin);
  if (next != reg.ranges.end() && next->first < begin + bytes) {
    invalid_argument("data: the range overlaps the ", next->second.bytes, "-byte range at ",
                     reinterpret_cast<void*>(next->first), " registered already");
  }
  if (next != reg.ranges.begin()) {
    const auto previous = std::prev(next);
    if (previous->first + previous->second.bytes > begin) {
      invalid_argument("data: the range overlaps the ", previous->second.bytes, "-byte range at ",
                       reinterpret_cast<void*>(previous->first), " registered already");
    }
  }
  Registration r;
  r.bytes = bytes;
  r.device = device;
  if (device.is_cuda()) {
    char* first = static_cast<char*>(data);
    try {
      for (uint64_t offset = 0; offset < bytes; offset += kMaxSegmentBytes) {
        const uint64_t size = std::min(kMaxSegmentBytes, bytes - offset);
        backend.register_host_memory(first + offset, size, device.index);
        r.segments.push_back(first + offset);
      }
    } catch (...) {
      try {
        unregister_segments(backend, r, r.segments.size());
      } catch (...) {
        // The registration error is the one to report.
      }
      throw;
    }
  }
  reg.ranges.emplace(begin, std::move(r));
}

void unregister_host_memory(void* data) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  const auto found = reg.ranges.find(reinterpret_cast<uintptr_t>(data));
  if (found == reg.ranges.end()) {
    invalid_argument("data: ", data, " is not the start of a range hs_host_register registered");
  }
  const Registration& r = found->second;
  if (!r.segments.empty()) unregister_segments(backend_for(r.device, "device"), r, r.segments.size());
  reg.ranges.erase(found);
}

bool host_memory_registered(const void* data, uint64_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  if (begin + bytes < begin) invalid_argument("bytes: the range at ", data, " of ", bytes, " bytes wraps around");
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  const auto next = reg.ranges.upper_bound(begin);
  if (next == reg.ranges.begin()) return false;
  const auto range = std::prev(next);
  return begin + bytes <= range->first + range->second.bytes;
}

}  // namespace hisparse
