#include "core/shared_host_pool.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace hisparse {
namespace {

uint64_t page_size() { return static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }

// Shares start on 2 MiB boundaries so that no huge page is split between ranks.
constexpr uint64_t kShareAlignment = 2ull << 20;
// Pages are populated in pieces of this size, with a heartbeat after each.
constexpr uint64_t kPopulatePiece = 64ull << 20;

// Ids this process has used, with the rank it took: an id makes one pool and
// a process takes one rank of it.
std::mutex& used_ids_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::map<uint64_t, int>& used_ids() {
  static std::map<uint64_t, int> ids;
  return ids;
}

struct LivePool {
  const SharedHostPool* pool;
  const char* begin;
  const char* end;
  SharedPoolRole role;
};
std::mutex& live_pools_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::vector<LivePool>& live_pools() {
  static std::vector<LivePool> pools;
  return pools;
}

// Whether /dev/shm backs its pages with transparent huge pages: its tmpfs
// "huge=" mount option decides (never unless set); madvise only counts under
// huge=advise.
bool shm_huge_pages(bool advised) {
  FILE* mounts = std::fopen("/proc/mounts", "r");
  if (mounts == nullptr) return false;
  char line[1024];
  bool huge = false;
  while (std::fgets(line, sizeof(line), mounts) != nullptr) {
    char device[256], mount_point[256], type[64], options[512];
    if (std::sscanf(line, "%255s %255s %63s %511s", device, mount_point, type, options) != 4) continue;
    if (std::strcmp(mount_point, "/dev/shm") != 0) continue;
    const char* setting = std::strstr(options, "huge=");
    huge = setting != nullptr &&
           (std::strncmp(setting + 5, "always", 6) == 0 || std::strncmp(setting + 5, "within_size", 11) == 0 ||
            (advised && std::strncmp(setting + 5, "advise", 6) == 0));
  }
  std::fclose(mounts);
  return huge;
}

void validate(const SharedHostPoolOptions& o) {
  if (o.nranks < 1 || o.nranks > HS_SHARED_POOL_MAX_RANKS) {
    invalid_argument("nranks: expected 1 <= nranks <= ", HS_SHARED_POOL_MAX_RANKS, ", got ", o.nranks);
  }
  if (o.rank < 0 || o.rank >= o.nranks) {
    invalid_argument("rank: expected 0 <= rank < nranks (", o.nranks, "), got ", o.rank);
  }
  if (o.writer_rank < 0 || o.writer_rank >= o.nranks) {
    invalid_argument("writer_rank: expected 0 <= writer_rank < nranks (", o.nranks, "), got ", o.writer_rank);
  }
  if (o.size_bytes == 0) invalid_argument("size_bytes: expected a positive pool size, got 0");
  if (o.populate_threads < 0) {
    invalid_argument("populate_threads: expected 0 (the cores divided among the ranks) or a positive count, got ",
                     o.populate_threads);
  }
  if (o.max_segment_bytes == 0 || o.max_segment_bytes % page_size() != 0) {
    invalid_argument("max_segment_bytes: expected a positive multiple of the page size (", page_size(), "), got ",
                     o.max_segment_bytes);
  }
  if (!(o.timeout_seconds > 0) || !std::isfinite(o.timeout_seconds)) {
    invalid_argument("timeout_seconds: expected a positive number of seconds, got ", o.timeout_seconds);
  }
}

// Faults [begin, end) in for writing; false when the kernel does not know
// MADV_POPULATE_WRITE (then the caller touches the pages).
bool populate_with_madvise(char* begin, uint64_t bytes) {
  if (madvise(begin, bytes, MADV_POPULATE_WRITE) == 0) return true;
  const int error = errno;
  if (error == EINVAL) return false;
  // The kernel reports what would otherwise be a SIGBUS (tmpfs full) as EFAULT.
  fail(error == ENOMEM || error == EFAULT ? HS_ERROR_OUT_OF_MEMORY : HS_ERROR_SYSTEM,
       "populating the shared host pool failed (madvise: ", std::strerror(error),
       "): /dev/shm is full or the host ran out of memory");
}

}  // namespace

std::shared_ptr<SharedRegion> SharedHostPool::attach(const SharedHostPoolOptions& o) {
  validate(o);
  {
    std::lock_guard<std::mutex> lock(used_ids_mutex());
    const auto used = used_ids().find(o.id.generation);
    if (used != used_ids().end()) {
      invalid_argument("id: this process already took rank ", used->second,
                       " of the shared pool of this id; an id makes one pool and a process takes one rank of it "
                       "(make a new id with hs_shared_pool_id_create)");
    }
    used_ids().emplace(o.id.generation, o.rank);
  }
  SharedRegionOptions region;
  region.id = o.id;
  region.rank = o.rank;
  region.nranks = o.nranks;
  region.writer_rank = o.writer_rank;
  region.size_bytes = o.size_bytes;
  region.data_bytes = (o.size_bytes + page_size() - 1) / page_size() * page_size();
  region.timeout_seconds = o.timeout_seconds;
  region.check_memory = o.check_memory;
  region.on_stage = o.on_stage;
  return std::make_shared<SharedRegion>(region);
}

SharedHostPool::SharedHostPool(const SharedHostPoolOptions& options) : SharedHostPool(options, attach(options)) {}

SharedHostPool::SharedHostPool(const SharedHostPoolOptions& options, std::shared_ptr<SharedRegion> region)
    : HostPool(region->data(), options.size_bytes, region->data_bytes(), region, options.registrar, options.device),
      region_(region.get()),
      role_{options.rank, options.nranks, options.writer_rank} {
  try {
    populate_share(options);
    region_->reached(SharedPoolStep::kPopulated);
    // Every page exists now: registering pins pages that are all resident.
    if (options.registrar != nullptr) {
      bool first = true;
      register_segments(options.max_segment_bytes, [this, &first] {
        region_->heartbeat();
        if (std::exchange(first, false)) region_->stage(SharedPoolStage::kRegistering);
      });
    }
    region_->reached(SharedPoolStep::kRegistered);
    region_->stage(SharedPoolStage::kReady);
  } catch (const Error& error) {
    region_->mark_failed(error.status(), error.what());
    throw;
  } catch (const std::exception& error) {
    region_->mark_failed(HS_ERROR_INTERNAL, str("hisparse internal error: ", error.what()));
    throw;
  }
  region_->finish();
  wait_seconds_ = region_->wait_seconds();
  ready_seconds_ = region_->elapsed();
  list_region();
  std::lock_guard<std::mutex> lock(live_pools_mutex());
  const char* begin = static_cast<const char*>(region_->data());
  live_pools().push_back({this, begin, begin + region_->data_bytes(), role_});
}

SharedHostPool::~SharedHostPool() { forget(); }

void SharedHostPool::release() {
  HostPool::release();
  region_ = nullptr;
  forget();
}

void SharedHostPool::forget() noexcept {
  std::lock_guard<std::mutex> lock(live_pools_mutex());
  auto& pools = live_pools();
  pools.erase(std::remove_if(pools.begin(), pools.end(), [this](const LivePool& live) { return live.pool == this; }),
              pools.end());
}

void SharedHostPool::populate_share(const SharedHostPoolOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const uint64_t data_bytes = mapped_bytes();
  const auto boundary = [&](int r) -> uint64_t {
    if (r >= options.nranks) return data_bytes;
    return data_bytes * static_cast<uint64_t>(r) / static_cast<uint64_t>(options.nranks) / kShareAlignment *
           kShareAlignment;
  };
  share_offset_ = boundary(options.rank);
  share_bytes_ = boundary(options.rank + 1) - share_offset_;
  char* share = static_cast<char*>(region_->data()) + share_offset_;

  const bool advised = options.huge_pages && madvise(region_->data(), data_bytes, MADV_HUGEPAGE) == 0;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  unsigned threads = options.populate_threads > 0 ? static_cast<unsigned>(options.populate_threads)
                                                  : std::max(1u, cores / static_cast<unsigned>(options.nranks));
  threads = static_cast<unsigned>(std::min<uint64_t>(threads, std::max<uint64_t>(1, share_bytes_ >> 26)));

  const uint64_t page = page_size();
  const uint64_t pages = share_bytes_ / page;
  std::atomic<bool> stop{false};
  std::mutex error_mutex;
  std::optional<Error> first_error;
  std::once_flag populating;
  auto work = [&](uint64_t first_page, uint64_t last_page) {
    try {
      bool madvise_works = true;
      // A failure elsewhere ends the setup: stop instead of populating for nothing.
      for (uint64_t p = first_page; p < last_page && !stop.load(std::memory_order_relaxed) && !region_->failed();) {
        const uint64_t count = std::min(kPopulatePiece / page, last_page - p);
        char* piece = share + p * page;
        if (madvise_works) madvise_works = populate_with_madvise(piece, count * page);
        if (!madvise_works) {
          volatile char* bytes = piece;
          for (uint64_t i = 0; i < count; ++i) bytes[i * page] = 0;
        }
        p += count;
        region_->heartbeat();
        std::call_once(populating, [&] { region_->stage(SharedPoolStage::kPopulating); });
      }
    } catch (const Error& error) {
      stop = true;
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!first_error) first_error.emplace(error);
    }
  };
  if (threads == 1) {
    work(0, pages);
  } else {
    std::vector<std::thread> workers;
    workers.reserve(threads);
    for (unsigned i = 0; i < threads; ++i) workers.emplace_back(work, pages * i / threads, pages * (i + 1) / threads);
    for (std::thread& worker : workers) worker.join();
  }
  if (first_error) throw *first_error;
  set_population(static_cast<int>(threads), shm_huge_pages(advised),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

std::optional<SharedPoolRole> shared_host_pool_role(const void* pointer, uint64_t bytes) {
  const char* begin = static_cast<const char*>(pointer);
  std::lock_guard<std::mutex> lock(live_pools_mutex());
  for (const LivePool& live : live_pools()) {
    if (begin >= live.begin && begin <= live.end && bytes <= static_cast<uint64_t>(live.end - begin)) {
      return live.role;
    }
  }
  return std::nullopt;
}

}  // namespace hisparse
