#include "core/shared_region.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "core/host_memory.hpp"
#include "core/random.hpp"

namespace hisparse {

// ------------------------------------------------------------------ layout of the object's header

struct alignas(64) RankSlot {
  pthread_mutex_t alive;           // robust, process-shared; held by the rank's setup thread
  std::atomic<uint32_t> step;      // last SharedPoolStep the rank finished; 0 = not attached
  std::atomic<int32_t> pid;        // for messages
  std::atomic<uint64_t> progress;  // heartbeats within a step
};

struct RegionHeader {
  std::atomic<uint64_t> magic;  // kHeaderMagic once rank 0 has initialised everything below
  uint64_t generation;          // the id's
  uint32_t layout_version;
  int32_t nranks;
  int32_t writer_rank;
  int32_t reserved;
  uint64_t size_bytes;
  uint64_t data_offset;
  uint64_t data_bytes;
  // Failure: the first failing rank claims `failure_claim` (rank + 1), writes
  // status and text, then publishes `failed` (rank + 1). Zero means none, so
  // a header that is still all zeros can already carry a failure.
  std::atomic<int32_t> failure_claim;
  std::atomic<int32_t> failed;
  int32_t failure_status;
  char failure[1024];
  // Ranks (bit r) that read the failure before they attached: the failing
  // ranks keep the name until every rank attached or read it.
  std::atomic<uint64_t> failure_seen;
  RankSlot slots[HS_SHARED_POOL_MAX_RANKS];
};

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<int32_t>::is_always_lock_free,
              "the header's atomics must be lock-free to work across processes");

namespace {

constexpr uint64_t kHeaderMagic = 0x3176'6e6f'6967'6572ull;  // "region v1", little-endian-ish
constexpr uint32_t kLayoutVersion = 1;
constexpr uint64_t kIdMagic = 0x6469'6c6f'6f70'7368ull;  // "hspoolid"
constexpr uint32_t kIdVersion = 1;
constexpr char kNamePrefix[] = "/hisparse-pool-";

struct EncodedId {
  uint64_t magic;
  uint32_t version;
  int32_t creator_pid;
  uint64_t generation;
  char name[64];
};
static_assert(sizeof(EncodedId) <= HS_SHARED_POOL_ID_BYTES, "the id must fit hs_shared_pool_id_t");

uint64_t page_size() { return static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }

// The creator's pid in the name tells whose a leftover object was (when
// every rank was killed before the name could be removed).
std::string name_of(int32_t creator_pid, uint64_t generation) {
  char name[64];
  std::snprintf(name, sizeof(name), "%s%d-%016" PRIx64, kNamePrefix, creator_pid, generation);
  return name;
}

const char* step_verb(SharedPoolStep step) {
  switch (step) {
    case SharedPoolStep::kAttached: return "attach";
    case SharedPoolStep::kPopulated: return "populate its share";
    case SharedPoolStep::kRegistered: return "register the region";
  }
  return "?";
}

const char* finished_step(uint32_t step) {
  switch (step) {
    case 0: return "none";
    case 1: return "attach";
    case 2: return "populate";
    case 3: return "register";
  }
  return "?";
}

// Polls fast at first (a barrier of ranks that arrive together clears in
// microseconds), then settles at a millisecond.
class Backoff {
 public:
  void sleep() {
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
    delay_us_ = std::min(delay_us_ * 2, 1000);
  }

 private:
  int delay_us_ = 20;
};

void check_shm_space(uint64_t bytes) {
  struct statvfs fs{};
  if (statvfs("/dev/shm", &fs) != 0) return;  // no /dev/shm to measure: shm_open will tell
  const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  if (bytes > free_bytes) {
    char message[512];
    std::snprintf(message, sizeof(message),
                  "hisparse shared host pool needs ~%.2f GiB (size_bytes=%llu) of /dev/shm but only %.2f GiB is "
                  "free there. Enlarge /dev/shm (docker: --shm-size) or lower the pool's size_bytes.",
                  static_cast<double>(bytes) / (1ull << 30), static_cast<unsigned long long>(bytes),
                  static_cast<double>(free_bytes) / (1ull << 30));
    invalid_argument(message);
  }
}

}  // namespace

// ------------------------------------------------------------------ id

SharedPoolId SharedPoolId::create() {
  SharedPoolId id;
  do {
    id.generation = random_u64();
  } while (id.generation == 0);
  id.creator_pid = static_cast<int32_t>(getpid());
  id.name = name_of(id.creator_pid, id.generation);
  return id;
}

SharedPoolId SharedPoolId::decode(const hs_shared_pool_id_t& bytes) {
  EncodedId encoded;
  std::memcpy(&encoded, bytes.internal, sizeof(encoded));
  if (encoded.magic != kIdMagic) {
    invalid_argument("id: these ", HS_SHARED_POOL_ID_BYTES,
                     " bytes are not a shared pool id (make one with hs_shared_pool_id_create and send its bytes "
                     "unchanged)");
  }
  if (encoded.version != kIdVersion) {
    invalid_argument("id: a version ", encoded.version, " shared pool id, this library reads version ", kIdVersion);
  }
  encoded.name[sizeof(encoded.name) - 1] = '\0';
  if (encoded.generation == 0 || name_of(encoded.creator_pid, encoded.generation) != encoded.name) {
    invalid_argument("id: the shared pool id is corrupt (its name does not match its generation)");
  }
  SharedPoolId id;
  id.generation = encoded.generation;
  id.creator_pid = encoded.creator_pid;
  id.name = encoded.name;
  return id;
}

hs_shared_pool_id_t SharedPoolId::encode() const {
  EncodedId encoded{};
  encoded.magic = kIdMagic;
  encoded.version = kIdVersion;
  encoded.creator_pid = creator_pid;
  encoded.generation = generation;
  std::snprintf(encoded.name, sizeof(encoded.name), "%s", name.c_str());
  hs_shared_pool_id_t bytes{};
  std::memcpy(bytes.internal, &encoded, sizeof(encoded));
  return bytes;
}

// ------------------------------------------------------------------ setup

SharedRegion::SharedRegion(const SharedRegionOptions& options)
    : options_(options), start_(std::chrono::steady_clock::now()) {
  const uint64_t page = page_size();
  header_bytes_ = (sizeof(RegionHeader) + page - 1) / page * page;
  try {
    if (options_.rank == 0) {
      create_object();
    } else {
      open_object();
      claim_slot();
    }
    reached(SharedPoolStep::kAttached);
    // Every rank maps the object now: from here on it lives only as long as
    // a mapping does, whatever happens to the processes.
    unlink_name();
  } catch (const Error& error) {
    mark_failed(error.status(), error.what());
    close_all();
    throw;
  } catch (const std::exception& error) {
    mark_failed(HS_ERROR_INTERNAL, str("hisparse internal error: ", error.what()));
    close_all();
    throw;
  }
}

SharedRegion::~SharedRegion() {
  if (!finished_) mark_failed(HS_ERROR_SYSTEM, str("rank ", options_.rank, " left before the setup finished"));
  close_all();
}

double SharedRegion::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void SharedRegion::map(uint64_t bytes) {
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (base == MAP_FAILED) {
    const int error = errno;
    fail(error == ENOMEM ? HS_ERROR_OUT_OF_MEMORY : HS_ERROR_SYSTEM, "mmap of ", bytes, " bytes of ", options_.id.name,
         " failed: ", std::strerror(error));
  }
  base_ = base;
  mapped_length_ = bytes;
  header_ = static_cast<RegionHeader*>(base_);
}

void SharedRegion::create_object() {
  const std::string& name = options_.id.name;
  fd_ = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd_ < 0) {
    const int error = errno;
    if (error == EEXIST) {
      refused_ = true;
      invalid_argument("rank: rank 0 of this shared pool is taken: its object ", name,
                       " exists already (another process created a pool from this id as rank 0)");
    }
    fail(HS_ERROR_SYSTEM, "shm_open(", name, ") failed: ", std::strerror(error));
  }
  struct stat st{};
  if (fstat(fd_, &st) != 0) fail(HS_ERROR_SYSTEM, "fstat of ", name, " failed: ", std::strerror(errno));
  have_object_ = true;
  dev_ = st.st_dev;
  ino_ = st.st_ino;

  const uint64_t total = header_bytes_ + options_.data_bytes;
  if (ftruncate(fd_, static_cast<off_t>(total)) != 0) {
    fail(HS_ERROR_SYSTEM, "sizing ", name, " to ", total, " bytes failed: ", std::strerror(errno));
  }
  map(total);
  stage(SharedPoolStage::kObjectCreated);

  RegionHeader* header = new (base_) RegionHeader();
  header->generation = options_.id.generation;
  header->layout_version = kLayoutVersion;
  header->nranks = options_.nranks;
  header->writer_rank = options_.writer_rank;
  header->size_bytes = options_.size_bytes;
  header->data_offset = header_bytes_;
  header->data_bytes = options_.data_bytes;
  pthread_mutexattr_t attributes;
  pthread_mutexattr_init(&attributes);
  pthread_mutexattr_setpshared(&attributes, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attributes, PTHREAD_MUTEX_ROBUST);
  for (int r = 0; r < options_.nranks; ++r) {
    const int result = pthread_mutex_init(&header->slots[r].alive, &attributes);
    if (result != 0) {
      pthread_mutexattr_destroy(&attributes);
      fail(HS_ERROR_SYSTEM, "initialising the liveness lock of rank ", r, " failed: ", std::strerror(result));
    }
  }
  pthread_mutexattr_destroy(&attributes);
  close(fd_);
  fd_ = -1;
  // Claimed before publishing, so that a rank that sees the header can
  // already tell whether rank 0 is alive.
  claim_slot();
  // The creator checks that the host can hold the pool (the seed's
  // creator_memory_check) before publishing: no rank may go on to populate
  // a pool that is refused. The ranks waiting for the header read the
  // refusal from it.
  if (options_.check_memory) {
    check_host_memory(options_.size_bytes);
    check_shm_space(total);
  }
  header->magic.store(kHeaderMagic, std::memory_order_release);
}

bool SharedRegion::failed() const { return header_->failed.load(std::memory_order_acquire) != 0; }

void SharedRegion::open_object() {
  const std::string& name = options_.id.name;
  const double timeout = options_.timeout_seconds;
  // Each wait below is for progress of rank 0, so each has its own clock.
  auto waiting_since = std::chrono::steady_clock::now();
  const auto waited = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - waiting_since).count();
  };
  Backoff backoff;
  for (;;) {
    fd_ = shm_open(name.c_str(), O_RDWR, 0);
    if (fd_ >= 0) break;
    if (errno != ENOENT) fail(HS_ERROR_SYSTEM, "shm_open(", name, ") failed: ", std::strerror(errno));
    if (waited() > timeout) {
      fail(HS_ERROR_SYSTEM, "shared host pool: rank 0 did not create the pool's object ", name, " within ", timeout,
           " s (timeout_seconds): it did not start, it died first, or the pool of this id formed already and "
           "removed its name (an id makes one pool)");
    }
    backoff.sleep();
  }
  struct stat st{};
  waiting_since = std::chrono::steady_clock::now();
  for (;;) {
    if (fstat(fd_, &st) != 0) fail(HS_ERROR_SYSTEM, "fstat of ", name, " failed: ", std::strerror(errno));
    if (static_cast<uint64_t>(st.st_size) >= header_bytes_) break;
    have_object_ = true;  // so that giving up removes the name
    dev_ = st.st_dev;
    ino_ = st.st_ino;
    if (waited() > timeout) {
      fail(HS_ERROR_SYSTEM, "shared host pool: rank 0 created ", name, " but did not size it within ", timeout,
           " s (timeout_seconds); it died or stalled");
    }
    backoff.sleep();
  }
  have_object_ = true;
  dev_ = st.st_dev;
  ino_ = st.st_ino;

  // The header alone first: its sizes decide how much to map.
  map(header_bytes_);
  waiting_since = std::chrono::steady_clock::now();
  while (header_->magic.load(std::memory_order_acquire) != kHeaderMagic) {
    throw_if_failed();
    if (waited() > timeout) {
      fail(HS_ERROR_SYSTEM, "shared host pool: rank 0 created ", name, " but did not initialise it within ", timeout,
           " s (timeout_seconds); it died or stalled");
    }
    backoff.sleep();
  }
  validate_header();
  munmap(base_, mapped_length_);
  base_ = nullptr;
  header_ = nullptr;
  map(header_bytes_ + options_.data_bytes);
  close(fd_);
  fd_ = -1;
}

void SharedRegion::validate_header() {
  const RegionHeader& h = *header_;
  if (h.generation != options_.id.generation || h.layout_version != kLayoutVersion || h.data_offset != header_bytes_) {
    refused_ = true;  // not our pool: leave it alone
    invalid_argument("id: the object ", options_.id.name, " is not the pool of this id (generation ", h.generation,
                     ", layout ", h.layout_version, ")");
  }
  throw_if_failed();
  if (h.nranks != options_.nranks) {
    invalid_argument("nranks: rank ", options_.rank, " was given ", options_.nranks,
                     " ranks, but rank 0 created the pool for ", h.nranks);
  }
  if (h.size_bytes != options_.size_bytes) {
    invalid_argument("size_bytes: rank ", options_.rank, " was given ", options_.size_bytes,
                     " bytes, but rank 0 created the pool with ", h.size_bytes);
  }
  if (h.writer_rank != options_.writer_rank) {
    invalid_argument("writer_rank: rank ", options_.rank, " was given writer rank ", options_.writer_rank,
                     ", but rank 0 created the pool with ", h.writer_rank);
  }
}

void SharedRegion::claim_slot() {
  RankSlot& slot = header_->slots[options_.rank];
  const int result = pthread_mutex_trylock(&slot.alive);
  if (result == EBUSY) {
    refused_ = true;
    invalid_argument("rank: rank ", options_.rank, " of this shared pool is taken by another process (pid ",
                     slot.pid.load(), ")");
  }
  if (result == EOWNERDEAD || result == ENOTRECOVERABLE) {
    if (result == EOWNERDEAD) pthread_mutex_unlock(&slot.alive);
    fail(HS_ERROR_SYSTEM, "shared host pool: the process that held rank ", options_.rank, " (pid ", slot.pid.load(),
         ") died; the pool failed");
  }
  if (result != 0) {
    fail(HS_ERROR_SYSTEM, "locking the slot of rank ", options_.rank, " failed: ", std::strerror(result));
  }
  holding_slot_ = true;
  if (slot.step.load(std::memory_order_acquire) != 0) {
    pthread_mutex_unlock(&slot.alive);
    holding_slot_ = false;
    refused_ = true;
    invalid_argument("rank: rank ", options_.rank, " of this shared pool was taken by pid ", slot.pid.load(),
                     ", which finished its setup (an id makes one pool)");
  }
  slot.pid.store(static_cast<int32_t>(getpid()), std::memory_order_relaxed);
  slot.step.store(static_cast<uint32_t>(SharedPoolStep::kAttached), std::memory_order_release);
}

void SharedRegion::throw_if_failed() {
  const int32_t failed = header_->failed.load(std::memory_order_acquire);
  if (failed == 0 || failed == options_.rank + 1) return;
  header_->failure_seen.fetch_or(1ull << options_.rank, std::memory_order_acq_rel);
  // A rank's own failure gets its rank in front; a message about another
  // rank (a death, a stall) is complete already and gets who saw it.
  const std::string text = header_->failure;
  static const std::string kPrefix = "shared host pool: ";
  throw Error(static_cast<hs_status_t>(header_->failure_status),
              text.rfind(kPrefix, 0) == 0 ? str(text, " (seen by rank ", failed - 1, ")")
                                          : str(kPrefix, "rank ", failed - 1, " failed: ", text));
}

bool SharedRegion::peer_died(int rank, std::string* why) {
  RankSlot& slot = header_->slots[rank];
  const int result = pthread_mutex_trylock(&slot.alive);
  if (result == EBUSY) return false;  // alive and setting up
  if (result == 0) {
    // It let go of its slot: it finished (and so did this step), or it
    // failed and published why, which the next poll reads.
    pthread_mutex_unlock(&slot.alive);
    return false;
  }
  if (result != EOWNERDEAD && result != ENOTRECOVERABLE) return false;
  *why = str("shared host pool: rank ", rank, " (pid ", slot.pid.load(),
             ") died during setup (its last finished step: ", finished_step(slot.step.load()), ")");
  // The failure is published before the lock is let go: the ranks that find
  // the lock held by this one meanwhile read the failure instead.
  mark_failed(HS_ERROR_SYSTEM, *why);
  if (result == EOWNERDEAD) pthread_mutex_unlock(&slot.alive);  // not made consistent: it stays unrecoverable
  return true;
}

void SharedRegion::wait_for(SharedPoolStep step) {
  const auto wait_start = std::chrono::steady_clock::now();
  auto last_progress = wait_start;
  uint64_t last_signature = ~0ull;
  const uint32_t target = static_cast<uint32_t>(step);
  Backoff backoff;
  std::vector<int> missing;
  for (;;) {
    throw_if_failed();
    missing.clear();
    uint64_t signature = 0;
    for (int r = 0; r < options_.nranks; ++r) {
      const RankSlot& slot = header_->slots[r];
      const uint32_t reached = slot.step.load(std::memory_order_acquire);
      signature = signature * 31 + reached * 1000003ull + slot.progress.load(std::memory_order_relaxed);
      if (reached < target) missing.push_back(r);
    }
    if (missing.empty()) break;
    // Every attached rank that still has setup to do: one that dies cannot
    // finish, so waiting on would only reach the timeout. One that finished
    // the last step did its part; its death fails nobody.
    for (int r = 0; r < options_.nranks; ++r) {
      const uint32_t reached = header_->slots[r].step.load(std::memory_order_acquire);
      if (r == options_.rank || reached == 0 || reached >= static_cast<uint32_t>(SharedPoolStep::kRegistered)) {
        continue;
      }
      std::string why;
      if (peer_died(r, &why)) throw Error(HS_ERROR_SYSTEM, why);
    }
    const auto now = std::chrono::steady_clock::now();
    if (signature != last_signature) {
      last_signature = signature;
      last_progress = now;
    } else if (std::chrono::duration<double>(now - last_progress).count() > options_.timeout_seconds) {
      std::string ranks;
      for (int r : missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      fail(HS_ERROR_SYSTEM, "shared host pool: rank ", options_.rank, " waited ", options_.timeout_seconds,
           " s (timeout_seconds) without progress for rank(s) ", ranks, " to ", step_verb(step),
           "; they did not start, stalled, or failed before attaching");
    }
    backoff.sleep();
  }
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
}

void SharedRegion::reached(SharedPoolStep step) {
  header_->slots[options_.rank].step.store(static_cast<uint32_t>(step), std::memory_order_release);
  switch (step) {
    case SharedPoolStep::kAttached: stage(SharedPoolStage::kAttached); break;
    case SharedPoolStep::kPopulated: stage(SharedPoolStage::kPopulated); break;
    case SharedPoolStep::kRegistered: stage(SharedPoolStage::kRegistered); break;
  }
  wait_for(step);
}

void SharedRegion::heartbeat() { header_->slots[options_.rank].progress.fetch_add(1, std::memory_order_relaxed); }

void SharedRegion::mark_failed(hs_status_t status, const std::string& message) noexcept {
  if (refused_ || finished_) return;
  if (header_ != nullptr) {
    int32_t none = 0;
    if (header_->failure_claim.compare_exchange_strong(none, options_.rank + 1)) {
      header_->failure_status = static_cast<int32_t>(status);
      std::snprintf(header_->failure, sizeof(header_->failure), "%s", message.c_str());
      header_->failed.store(options_.rank + 1, std::memory_order_release);
    }
    header_->failure_seen.fetch_or(1ull << options_.rank, std::memory_order_acq_rel);
    if (!unlinked_) wait_for_late_ranks();
  }
  unlink_name();
}

void SharedRegion::wait_for_late_ranks() noexcept {
  // A rank that has not attached can only learn of the failure from the
  // header, so the name stays until it attached or read the failure; but
  // not past timeout_seconds into the setup, by when it is given up on.
  // Rank 0's count once it published the header: a rank given another
  // count must not wait for ranks that do not exist.
  const bool published = header_->magic.load(std::memory_order_acquire) == kHeaderMagic;
  const int nranks = published ? std::min(header_->nranks, HS_SHARED_POOL_MAX_RANKS) : options_.nranks;
  Backoff backoff;
  while (elapsed() < options_.timeout_seconds) {
    const uint64_t seen = header_->failure_seen.load(std::memory_order_acquire);
    bool all = true;
    for (int r = 0; r < nranks && all; ++r) {
      all = r == options_.rank || header_->slots[r].step.load(std::memory_order_acquire) != 0 || (seen >> r & 1) != 0;
    }
    if (all) return;
    backoff.sleep();
  }
}

void SharedRegion::finish() {
  finished_ = true;
  if (holding_slot_) {
    pthread_mutex_unlock(&header_->slots[options_.rank].alive);
    holding_slot_ = false;
  }
}

void SharedRegion::unlink_name() noexcept {
  if (unlinked_ || !have_object_) return;
  unlinked_ = true;
  // Only the object this rank opened: the name may have been reused since.
  const int fd = shm_open(options_.id.name.c_str(), O_RDONLY, 0);
  if (fd < 0) return;
  struct stat st{};
  const bool ours = fstat(fd, &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_;
  close(fd);
  if (ours) shm_unlink(options_.id.name.c_str());
}

void SharedRegion::close_all() noexcept {
  if (holding_slot_) {
    // The lock must be let go before its memory is unmapped: the thread's
    // robust-lock list points into it.
    pthread_mutex_unlock(&header_->slots[options_.rank].alive);
    holding_slot_ = false;
  }
  if (base_ != nullptr) {
    munmap(base_, mapped_length_);
    base_ = nullptr;
    header_ = nullptr;
  }
  if (fd_ >= 0) {
    close(fd_);
    fd_ = -1;
  }
}

}  // namespace hisparse
