// The named shared-memory region behind a shared host pool, and the setup
// protocol its ranks follow (hisparse/shared_host_pool.h states the contract).
//
// The object holds a header of whole pages (the ranks' bookkeeping), then the
// pool's pages. Per rank the header has a robust, process-shared mutex that
// the rank's setup thread holds from attach to the end of setup: when the
// rank dies, the kernel marks the mutex owner-dead, so the other ranks see the
// death at their next poll instead of at a timeout. A rank that never
// attaches has no mutex to watch; the others give up on it after
// timeout_seconds without progress.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "hisparse/hisparse.h"
#include "hisparse/shared_host_pool.h"

namespace hisparse {

// The decoded hs_shared_pool_id_t.
struct SharedPoolId {
  uint64_t generation = 0;  // random and never 0
  int32_t creator_pid = 0;  // the process that made the id
  std::string name;         // POSIX shared-memory name, "/hisparse-pool-<creator pid>-<generation, hex>"

  static SharedPoolId create();
  // Throws HS_ERROR_INVALID_ARGUMENT naming `id` for bytes that are not an id.
  static SharedPoolId decode(const hs_shared_pool_id_t& id);
  hs_shared_pool_id_t encode() const;
};

// Moments of the setup at which SharedRegionOptions::on_stage is called, so
// that a test can stop or kill a rank exactly there.
enum class SharedPoolStage {
  kObjectCreated,  // rank 0: the object exists and is sized; its header is not initialised yet
  kAttached,       // this rank holds its slot; other ranks may not have attached yet
  kPopulating,     // part of this rank's share is populated (called from a populating thread)
  kPopulated,      // this rank published that its share is populated; the others may not be
  kRegistering,    // part of the region is registered with this rank's device
  kRegistered,     // this rank published that it registered the whole region
  kReady,          // every rank is ready; the create call is about to return
};

// The steps every rank finishes before any rank goes on.
enum class SharedPoolStep : uint32_t { kAttached = 1, kPopulated = 2, kRegistered = 3 };

struct SharedRegionOptions {
  SharedPoolId id;
  int rank = 0;
  int nranks = 1;
  int writer_rank = 0;
  uint64_t size_bytes = 0;  // the pool's exact size
  uint64_t data_bytes = 0;  // size_bytes rounded up to whole pages
  double timeout_seconds = HS_SHARED_POOL_DEFAULT_TIMEOUT_SECONDS;
  bool check_memory = true;  // rank 0 refuses pools that RAM or /dev/shm cannot hold
  std::function<void(SharedPoolStage)> on_stage;
};

struct RegionHeader;

class SharedRegion {
 public:
  // Rank 0 creates the object, the others wait for it and attach. Returns
  // once every rank has attached, the name unlinked. On failure it marks the
  // pool failed for the other ranks (except when it refuses a rank that is
  // taken or an object of another pool), unmaps and throws.
  explicit SharedRegion(const SharedRegionOptions& options);
  // Marks the pool failed if setup did not finish, lets go of this rank's
  // slot, unmaps.
  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  void* data() const { return static_cast<char*>(base_) + header_bytes_; }
  uint64_t data_bytes() const { return options_.data_bytes; }
  const SharedRegionOptions& options() const { return options_; }

  // This rank finished `step`: publishes it, calls the matching stage, and
  // returns once every rank has. Throws (as the constructor) when a rank
  // failed, died or stalled meanwhile.
  void reached(SharedPoolStep step);
  // Progress within a step (a populated chunk, a registered segment) that
  // restarts the other ranks' stall timers. Safe from any thread.
  void heartbeat();
  // Marks the pool failed for every rank (the first failure's status and
  // message are kept) and unlinks the name if it is still there, once every
  // rank attached or read the failure (at most timeout_seconds into setup).
  void mark_failed(hs_status_t status, const std::string& message) noexcept;
  // Whether some rank marked the pool failed (long steps stop early).
  bool failed() const;
  // Setup succeeded on every rank: lets go of this rank's slot.
  void finish();
  void stage(SharedPoolStage stage) const {
    if (options_.on_stage) options_.on_stage(stage);
  }
  // Time spent waiting for the other ranks.
  double wait_seconds() const { return wait_seconds_; }
  // Time since this rank began the setup.
  double elapsed() const;

 private:
  void create_object();
  void open_object();
  void map(uint64_t bytes);
  void validate_header();
  void claim_slot();
  void wait_for(SharedPoolStep step);
  void throw_if_failed();
  void wait_for_late_ranks() noexcept;
  bool peer_died(int rank, std::string* why);
  void unlink_name() noexcept;
  void close_all() noexcept;

  SharedRegionOptions options_;
  std::chrono::steady_clock::time_point start_;
  uint64_t header_bytes_ = 0;
  int fd_ = -1;
  void* base_ = nullptr;
  uint64_t mapped_length_ = 0;
  RegionHeader* header_ = nullptr;
  bool have_object_ = false;  // dev_/ino_ identify the object this rank opened
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  bool unlinked_ = false;
  bool holding_slot_ = false;
  bool finished_ = false;
  bool refused_ = false;  // this rank was refused; the pool itself is fine
  double wait_seconds_ = 0;
};

}  // namespace hisparse
