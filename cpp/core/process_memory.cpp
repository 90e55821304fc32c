#include "core/process_memory.hpp"

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "core/error.hpp"

namespace hisparse {

ProcessMemoryMap::ProcessMemoryMap() {
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) {
    fail(HS_ERROR_SYSTEM, "cannot read /proc/self/maps to check host addresses: ", std::strerror(errno));
  }
  char line[512];
  while (std::fgets(line, sizeof(line), maps) != nullptr) {
    uintmax_t begin = 0;
    uintmax_t end = 0;
    char perms[5] = {};
    if (std::sscanf(line, "%jx-%jx %4s", &begin, &end, perms) != 3) continue;
    areas_.push_back(
        Area{static_cast<uintptr_t>(begin), static_cast<uintptr_t>(end), perms[0] == 'r', perms[1] == 'w'});
    // A line longer than the buffer continues on the next read: skip its rest.
    while (std::strchr(line, '\n') == nullptr && std::fgets(line, sizeof(line), maps) != nullptr) {
    }
  }
  std::fclose(maps);
}

bool ProcessMemoryMap::covers(uintptr_t begin, uint64_t bytes, bool writable) const {
  if (bytes == 0) return true;
  if (begin > UINTPTR_MAX - bytes) return false;
  const uintptr_t end = begin + bytes;
  uintptr_t next = begin;  // first byte not yet covered
  for (const Area& area : areas_) {
    if (area.end <= next) continue;
    if (area.begin > next || !area.readable || (writable && !area.writable)) return false;
    next = area.end;
    if (next >= end) return true;
  }
  return false;
}

}  // namespace hisparse
