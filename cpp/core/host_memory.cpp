#include "core/host_memory.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "core/error.hpp"

namespace hisparse {

uint64_t available_host_memory() {
  // MemAvailable counts reclaimable page cache, which is what a new
  // allocation can really get; free pages alone understate it.
  if (FILE* meminfo = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (std::fgets(line, sizeof(line), meminfo) != nullptr) {
      if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
        found = true;
        break;
      }
    }
    std::fclose(meminfo);
    if (found) return static_cast<uint64_t>(kib) * 1024;
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages < 0 || page_size < 0) fail(HS_ERROR_SYSTEM, "cannot determine the available host memory");
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

void check_host_memory(uint64_t pool_bytes, const char* name) {
  const uint64_t available = available_host_memory();
  if (static_cast<double>(pool_bytes) > static_cast<double>(available) * 0.95) {
    char message[512];
    std::snprintf(message, sizeof(message),
                  "%s: hisparse pinned host pool needs ~%.0f GiB (%s=%llu) but only %.0f GiB of RAM is "
                  "available. Lower the pool's size_bytes (the host budget: host_budget_bytes, hisparse plan "
                  "--host-budget-gib) or leave headroom for co-tenants.",
                  name, static_cast<double>(pool_bytes) / (1ull << 30), name,
                  static_cast<unsigned long long>(pool_bytes), static_cast<double>(available) / (1ull << 30));
    invalid_argument(message);
  }
}

}  // namespace hisparse
