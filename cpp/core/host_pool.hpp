// The host pool (the seed's HiSparseHostPool + allocate_pinned_host_pool):
// one exact-size, page-aligned host region, populated in parallel, registered
// with the GPU in segments of at most 64 GiB, and released deterministically
// (unregister, then unmap) exactly once. Its memory is listed in the host
// regions (core/host_regions.hpp), so that nothing in the library touches it
// once the pool is released, even while views keep it mapped (retire).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/host_regions.hpp"
#include "hisparse/hisparse.h"

namespace hisparse {

class Backend;

struct HostPoolOptions {
  uint64_t size_bytes = 0;
  int populate_threads = 0;           // 0 = one per online core
  bool huge_pages = true;
  uint64_t max_segment_bytes = 64ull << 30;
  Backend* registrar = nullptr;       // registers the pages; nullptr = not registered
  int device = 0;                     // device the registrar registers with
};

class HostPool {
 public:
  struct Segment {
    void* data;
    uint64_t bytes;
  };

  // Maps, populates and registers; on failure nothing stays mapped or registered.
  explicit HostPool(const HostPoolOptions& options);
  virtual ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // Unregisters every segment, then unmaps. Idempotent. If unregistration
  // fails, the remaining segments and the mapping are kept (a later call
  // retries) and the error is thrown.
  virtual void release();
  // Releases the pool for the library without unmapping it: data() and
  // every kernel or runtime given its memory refuse from now on, while the
  // pages stay mapped and registered for views the caller still holds, until
  // release(). Idempotent.
  void retire();

  // True once retired or released.
  bool released() const { return host_region_ == nullptr || host_region_->released(); }
  // True once the memory is unmapped (release).
  bool unmapped() const { return base_ == nullptr; }
  void* data() const;  // throws HS_ERROR_INVALID_STATE once released
  uint64_t size_bytes() const { return size_bytes_; }
  uint64_t mapped_bytes() const { return mapped_bytes_; }
  bool registered() const { return registered_; }
  int device() const { return registered_ ? device_ : -1; }
  int populate_threads() const { return populate_threads_; }
  bool huge_pages() const { return huge_pages_; }
  double populate_seconds() const { return populate_seconds_; }
  double register_seconds() const { return register_seconds_; }
  const std::vector<Segment>& segments() const { return segments_; }

  // A KV cache keeps its host cache at offset 0 of the pool it borrows, so a
  // pool serves one cache at a time: the cache takes the pool's claim (false
  // while another cache holds it) and gives it back when it is destroyed.
  bool claim_for_host_cache() { return !host_cache_claimed_.exchange(true); }
  void release_host_cache_claim() { host_cache_claimed_.store(false); }

 protected:
  // A pool over `mapped_bytes` of memory at `data` that `mapping` keeps
  // mapped (the shared pool's region): the subclass populates and registers
  // it; release unregisters the segments, then drops `mapping`.
  HostPool(void* data, uint64_t size_bytes, uint64_t mapped_bytes, std::shared_ptr<void> mapping, Backend* registrar,
           int device);
  void set_population(int threads, bool huge_pages, double seconds);
  // `after_segment` runs after each registered segment (progress reports).
  void register_segments(uint64_t max_segment_bytes, const std::function<void()>& after_segment = {});
  // Lists the mapped memory in the host regions (the subclass calls it once
  // the memory is ready; the private pool's constructor does).
  void list_region();

 private:
  void populate();
  void unregister_segments();
  void unmap();

  void* base_ = nullptr;
  uint64_t size_bytes_ = 0;
  uint64_t mapped_bytes_ = 0;
  Backend* registrar_ = nullptr;
  int device_ = 0;
  bool registered_ = false;
  bool huge_pages_ = false;
  int populate_threads_ = 0;
  double populate_seconds_ = 0;
  double register_seconds_ = 0;
  std::vector<Segment> segments_;  // registered ranges, exact
  std::shared_ptr<void> mapping_;  // owner of memory mapped elsewhere; null for an own mapping
  std::shared_ptr<HostRegion> host_region_;  // the memory as the library sees it; null until listed
  std::atomic<bool> host_cache_claimed_{false};
};

}  // namespace hisparse
