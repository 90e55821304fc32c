// The shared host pool (the seed's allocate_hisparse_host_pools, "one host
// mmap shared by local TP ranks"): a HostPool over a SharedRegion. Every rank
// populates its share of the pages, registers the whole region with its own
// device, and releases its own registration and mapping; the contract is in
// hisparse/shared_host_pool.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "core/host_pool.hpp"
#include "core/shared_region.hpp"

namespace hisparse {

struct SharedHostPoolOptions {
  SharedPoolId id;
  int rank = 0;
  int nranks = 1;
  int writer_rank = 0;
  uint64_t size_bytes = 0;
  int populate_threads = 0;  // 0 = the online cores divided among the ranks
  bool huge_pages = true;
  uint64_t max_segment_bytes = 64ull << 30;
  Backend* registrar = nullptr;  // registers the whole region; nullptr = not registered
  int device = 0;
  double timeout_seconds = HS_SHARED_POOL_DEFAULT_TIMEOUT_SECONDS;
  bool check_memory = true;
  std::function<void(SharedPoolStage)> on_stage;  // tests stop or kill a rank at a stage
};

// Which rank of a shared pool this process is. One rank writes rows; the
// runtime refuses writes (mirrors, host-side row writes) from the others.
struct SharedPoolRole {
  int rank = 0;
  int nranks = 1;
  int writer_rank = 0;
  bool is_writer() const { return rank == writer_rank; }
};

class SharedHostPool final : public HostPool {
 public:
  // Collective with the other ranks of options.id; see hs_shared_host_pool_create.
  explicit SharedHostPool(const SharedHostPoolOptions& options);
  ~SharedHostPool() override;
  void release() override;

  const SharedPoolRole& role() const { return role_; }
  uint64_t share_offset() const { return share_offset_; }
  uint64_t share_bytes() const { return share_bytes_; }
  double wait_seconds() const { return wait_seconds_; }
  double ready_seconds() const { return ready_seconds_; }

 private:
  SharedHostPool(const SharedHostPoolOptions& options, std::shared_ptr<SharedRegion> region);
  static std::shared_ptr<SharedRegion> attach(const SharedHostPoolOptions& options);
  void populate_share(const SharedHostPoolOptions& options);
  void forget() noexcept;

  SharedRegion* region_;  // owned by HostPool as the mapping: valid until release
  SharedPoolRole role_;
  uint64_t share_offset_ = 0;
  uint64_t share_bytes_ = 0;
  double wait_seconds_ = 0;
  double ready_seconds_ = 0;
};

// The role of this process in the live shared pool whose memory holds
// [pointer, pointer + bytes), or nullopt when no shared pool of this process
// holds all of it (private memory: any write is allowed).
std::optional<SharedPoolRole> shared_host_pool_role(const void* pointer, uint64_t bytes);

}  // namespace hisparse
