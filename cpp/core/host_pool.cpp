#include "core/host_pool.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "core/backend.hpp"
#include "core/error.hpp"

namespace hisparse {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

uint64_t page_size() { return static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }

}  // namespace

HostPool::HostPool(const HostPoolOptions& options)
    : size_bytes_(options.size_bytes), registrar_(options.registrar), device_(options.device) {
  if (options.size_bytes == 0) invalid_argument("size_bytes: expected a positive pool size, got 0");
  if (options.populate_threads < 0) {
    invalid_argument("populate_threads: expected 0 (one per core) or a positive count, got ", options.populate_threads);
  }
  if (options.max_segment_bytes == 0 || options.max_segment_bytes % page_size() != 0) {
    invalid_argument("max_segment_bytes: expected a positive multiple of the page size (", page_size(), "), got ",
                     options.max_segment_bytes);
  }
  const uint64_t page = page_size();
  mapped_bytes_ = (size_bytes_ + page - 1) / page * page;
  void* base = mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    const int error = errno;
    fail(error == ENOMEM ? HS_ERROR_OUT_OF_MEMORY : HS_ERROR_SYSTEM, "mmap of a ", mapped_bytes_,
         "-byte host pool failed: ", std::strerror(error));
  }
  base_ = base;
  // Huge pages cut first-touch time about threefold on large pools; the
  // advice is best effort (THP may be disabled).
  huge_pages_ = options.huge_pages && madvise(base_, mapped_bytes_, MADV_HUGEPAGE) == 0;

  unsigned threads = options.populate_threads > 0 ? static_cast<unsigned>(options.populate_threads)
                                                  : std::max(1u, std::thread::hardware_concurrency());
  // No more threads than 64 MiB chunks: small pools populate on one thread.
  threads = static_cast<unsigned>(std::min<uint64_t>(threads, std::max<uint64_t>(1, mapped_bytes_ >> 26)));
  populate_threads_ = static_cast<int>(threads);
  try {
    populate();
    if (registrar_ != nullptr) register_segments(options.max_segment_bytes);
    list_region();
  } catch (...) {
    try {
      unregister_segments();
    } catch (...) {
    }
    unmap();
    throw;
  }
}

HostPool::HostPool(void* data, uint64_t size_bytes, uint64_t mapped_bytes, std::shared_ptr<void> mapping,
                   Backend* registrar, int device)
    : base_(data),
      size_bytes_(size_bytes),
      mapped_bytes_(mapped_bytes),
      registrar_(registrar),
      device_(device),
      mapping_(std::move(mapping)) {}

void HostPool::set_population(int threads, bool huge_pages, double seconds) {
  populate_threads_ = threads;
  huge_pages_ = huge_pages;
  populate_seconds_ = seconds;
}

HostPool::~HostPool() {
  try {
    release();
  } catch (...) {
    // Unregistration failed (for example the CUDA context is gone at
    // teardown): leave the pages to the kernel at process exit rather than
    // unmapping memory the driver still holds. A mapping made elsewhere is
    // kept the same way: its owner is never dropped.
    if (mapping_ != nullptr) new std::shared_ptr<void>(std::move(mapping_));
  }
}

void HostPool::list_region() {
  host_region_ = std::make_shared<HostRegion>(base_, mapped_bytes_);
  remember_host_region(host_region_);
}

void* HostPool::data() const {
  if (released()) fail(HS_ERROR_INVALID_STATE, "the host pool was released; it has no memory any more");
  return base_;
}

void HostPool::populate() {
  // Fault every page in now, from several threads, so the first decode step
  // does not pay for it and registration pins resident pages.
  const auto start = std::chrono::steady_clock::now();
  const uint64_t page = page_size();
  const uint64_t pages = mapped_bytes_ / page;
  const unsigned threads = static_cast<unsigned>(populate_threads_);
  auto touch = [&](uint64_t first, uint64_t last) {
    volatile char* bytes = static_cast<volatile char*>(base_);
    for (uint64_t p = first; p < last; ++p) bytes[p * page] = 0;
  };
  if (threads == 1) {
    touch(0, pages);
  } else {
    std::vector<std::thread> workers;
    workers.reserve(threads);
    for (unsigned i = 0; i < threads; ++i) {
      workers.emplace_back(touch, pages * i / threads, pages * (i + 1) / threads);
    }
    for (std::thread& worker : workers) worker.join();
  }
  populate_seconds_ = seconds_since(start);
}

void HostPool::register_segments(uint64_t max_segment_bytes, const std::function<void()>& after_segment) {
  // A single cudaHostRegister above 64 GiB fails, so register in segments
  // and record each exact range for the release.
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t offset = 0; offset < mapped_bytes_; offset += max_segment_bytes) {
    Segment segment{static_cast<char*>(base_) + offset, std::min(max_segment_bytes, mapped_bytes_ - offset)};
    registrar_->register_host_memory(segment.data, segment.bytes, device_);
    segments_.push_back(segment);
    if (after_segment) after_segment();
  }
  registered_ = true;
  register_seconds_ = seconds_since(start);
}

void HostPool::unregister_segments() {
  while (!segments_.empty()) {
    registrar_->unregister_host_memory(segments_.back().data, device_);
    segments_.pop_back();
  }
}

void HostPool::unmap() {
  if (base_ == nullptr) return;
  if (host_region_ != nullptr) forget_host_region(*host_region_);
  if (mapping_ != nullptr) {
    mapping_.reset();
  } else {
    munmap(base_, mapped_bytes_);
  }
  base_ = nullptr;
}

void HostPool::retire() {
  if (host_region_ != nullptr) mark_host_region_released(*host_region_);
}

void HostPool::release() {
  if (unmapped()) return;
  unregister_segments();  // may throw: nothing is released then, a later call retries
  registered_ = false;
  retire();
  unmap();
}

}  // namespace hisparse
