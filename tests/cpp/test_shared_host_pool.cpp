// The shared host pool and interprocess events, with real processes: every
// rank is a forked child. One host copy for all ranks (the bytes rank 0
// writes are read by the others, and the pages are resident once), refusal
// of a second pool, a taken rank and mismatched arguments, a rank killed with
// SIGKILL at every stage of the setup (the others fail with a message naming
// it, long before the timeout when it had attached, and /dev/shm keeps
// nothing), failures that reach every rank, and the C ABI of events.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/shared_host_pool.hpp"
#include "hisparse/hisparse.h"
#include "hisparse/hisparse.hpp"
#include "recording_backend.hpp"

namespace {

using hisparse::SharedHostPool;
using hisparse::SharedHostPoolOptions;
using hisparse::SharedPoolId;
using hisparse::SharedPoolStage;
using hisparse_test::is_mapped;
using hisparse_test::page_size;
using hisparse_test::RecordingBackend;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

bool object_exists(const hs_shared_pool_id_t& id) {
  return access(("/dev/shm" + SharedPoolId::decode(id).name).c_str(), F_OK) == 0;
}

// What a rank's process reports back: the create call's status, message and
// duration, and free text from the checks it ran on success.
struct Outcome {
  hs_status_t status = HS_ERROR_INTERNAL;
  double seconds = 0;
  std::string facts;
  std::string message;
  bool reported = false;  // false: the process died or was killed before reporting

  std::string encode() const {
    std::ostringstream out;
    out << static_cast<int>(status) << '\n' << seconds << '\n' << facts << '\n' << message;
    return out.str();
  }
  static Outcome decode(const std::string& text) {
    Outcome outcome;
    if (text.empty()) return outcome;
    std::istringstream in(text);
    int status = 0;
    in >> status >> outcome.seconds;
    in.ignore(1);
    std::getline(in, outcome.facts);
    std::getline(in, outcome.message, '\0');
    outcome.status = static_cast<hs_status_t>(status);
    outcome.reported = true;
    return outcome;
  }
};

// A forked child running one rank. It writes a byte to the stage pipe at the
// stages it announces, and its outcome to the report pipe before it exits.
class RankProcess {
 public:
  explicit RankProcess(const std::function<Outcome(int stage_fd)>& body) {
    int report[2], stage[2];
    if (pipe(report) != 0 || pipe(stage) != 0) std::abort();
    pid_ = fork();
    if (pid_ == 0) {
      close(report[0]);
      close(stage[0]);
      std::string text;
      try {
        text = body(stage[1]).encode();
      } catch (...) {
        text = Outcome{HS_ERROR_INTERNAL, 0, "", "the rank's body threw", true}.encode();
      }
      for (size_t done = 0; done < text.size();) {
        const ssize_t wrote = write(report[1], text.data() + done, text.size() - done);
        if (wrote <= 0) break;
        done += static_cast<size_t>(wrote);
      }
      _exit(0);
    }
    close(report[1]);
    close(stage[1]);
    report_fd_ = report[0];
    stage_fd_ = stage[0];
  }
  ~RankProcess() {
    if (!reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(report_fd_);
    close(stage_fd_);
  }
  RankProcess(const RankProcess&) = delete;
  RankProcess& operator=(const RankProcess&) = delete;

  pid_t pid() const { return pid_; }

  // The next announced stage, or nullopt after `seconds`.
  std::optional<SharedPoolStage> next_stage(double seconds) {
    pollfd fd{stage_fd_, POLLIN, 0};
    if (poll(&fd, 1, static_cast<int>(seconds * 1000)) <= 0) return std::nullopt;
    char stage = 0;
    if (read(stage_fd_, &stage, 1) != 1) return std::nullopt;
    return static_cast<SharedPoolStage>(stage);
  }

  void kill9() { kill(pid_, SIGKILL); }

  // The outcome once the process exits; kills it after `seconds`.
  Outcome finish(double seconds) {
    const auto start = Clock::now();
    std::string text;
    char buffer[4096];
    for (;;) {
      const double left = seconds - seconds_since(start);
      pollfd fd{report_fd_, POLLIN, 0};
      if (left <= 0 || poll(&fd, 1, static_cast<int>(left * 1000) + 1) <= 0) break;
      const ssize_t got = read(report_fd_, buffer, sizeof(buffer));
      if (got <= 0) break;
      text.append(buffer, static_cast<size_t>(got));
    }
    if (seconds_since(start) >= seconds) kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    reaped_ = true;
    killed_ = WIFSIGNALED(status);
    return Outcome::decode(text);
  }
  bool killed() const { return killed_; }

 private:
  pid_t pid_ = -1;
  int report_fd_ = -1;
  int stage_fd_ = -1;
  bool reaped_ = false;
  bool killed_ = false;
};

void announce(int stage_fd, SharedPoolStage stage) {
  const char byte = static_cast<char>(stage);
  if (write(stage_fd, &byte, 1) != 1) std::abort();
}

// How a rank takes part, for ranks run through the core (so that tests can
// stop them at a stage).
struct RankPlan {
  int rank = 0;
  int nranks = 2;
  uint64_t size_bytes = 4 << 20;
  int writer_rank = 0;
  double timeout_seconds = 60;
  std::optional<SharedPoolStage> announce_at;  // announce this stage and go on
  std::optional<SharedPoolStage> stop_at;      // announce this stage and stop there for good
  bool register_pages = false;                 // with a recording backend
  uint64_t max_segment_bytes = 64ull << 30;
  int fail_register_call = -1;
  std::function<std::string(SharedHostPool&)> on_success;
};

Outcome run_rank(const hs_shared_pool_id_t& id, const RankPlan& plan, int stage_fd) {
  RecordingBackend backend;
  backend.fail_register_call = plan.fail_register_call;
  SharedHostPoolOptions options;
  options.id = SharedPoolId::decode(id);
  options.rank = plan.rank;
  options.nranks = plan.nranks;
  options.writer_rank = plan.writer_rank;
  options.size_bytes = plan.size_bytes;
  options.timeout_seconds = plan.timeout_seconds;
  options.populate_threads = 2;
  options.max_segment_bytes = plan.max_segment_bytes;
  options.registrar = plan.register_pages ? &backend : nullptr;
  options.on_stage = [&](SharedPoolStage stage) {
    if (plan.announce_at == stage) announce(stage_fd, stage);
    if (plan.stop_at == stage) {
      announce(stage_fd, stage);
      for (;;) pause();
    }
  };
  const auto start = Clock::now();
  Outcome outcome;
  outcome.reported = true;
  try {
    SharedHostPool pool(options);
    outcome.seconds = seconds_since(start);
    outcome.status = HS_SUCCESS;
    if (plan.on_success) outcome.facts = plan.on_success(pool);
  } catch (const hisparse::Error& error) {
    outcome.seconds = seconds_since(start);
    outcome.status = error.status();
    outcome.message = error.what();
  }
  if (plan.register_pages) {
    outcome.facts += " registers=" + std::to_string(backend.of_kind(RecordingBackend::Call::kRegister).size()) +
                     " unregisters=" + std::to_string(backend.of_kind(RecordingBackend::Call::kUnregister).size());
  }
  return outcome;
}

std::string status_name(const Outcome& outcome) { return hs_status_string(outcome.status); }

// A rank through the C ABI; `use` runs on the pool when create succeeded and
// returns the facts to report.
Outcome create_through_c_abi(const hs_shared_pool_id_t& id, int rank, int nranks,
                             const hs_shared_host_pool_options_t& options,
                             const std::function<std::string(hs_host_pool_t)>& use = nullptr) {
  hs_host_pool_t pool = nullptr;
  const auto start = Clock::now();
  Outcome outcome;
  outcome.reported = true;
  outcome.status = hs_shared_host_pool_create(&id, rank, nranks, &options, &pool);
  outcome.seconds = seconds_since(start);
  outcome.message = hs_last_error();
  if (outcome.status == HS_SUCCESS && use) outcome.facts = use(pool);
  hs_host_pool_destroy(pool);
  return outcome;
}

hs_shared_host_pool_options_t unregistered(uint64_t size_bytes) {
  hs_shared_host_pool_options_t options = hs::shared_host_pool_options(size_bytes);
  options.registration = HS_REGISTER_NEVER;
  return options;
}

// ------------------------------------------------------------------ id and one-rank pools

TEST(SharedPoolId, CreateEncodeDecodeAndRejectGarbage) {
  hs_shared_pool_id_t first{}, second{};
  ASSERT_EQ(hs_shared_pool_id_create(&first), HS_SUCCESS) << hs_last_error();
  ASSERT_EQ(hs_shared_pool_id_create(&second), HS_SUCCESS);
  EXPECT_NE(std::memcmp(&first, &second, sizeof(first)), 0) << "two ids must differ";
  const SharedPoolId decoded = SharedPoolId::decode(first);
  EXPECT_NE(decoded.generation, 0u);
  EXPECT_EQ(decoded.name.rfind("/hisparse-pool-" + std::to_string(getpid()) + "-", 0), 0u) << decoded.name;
  const hs_shared_pool_id_t again = decoded.encode();
  EXPECT_EQ(std::memcmp(&again, &first, sizeof(first)), 0);
  EXPECT_FALSE(object_exists(first)) << "creating an id must not create the object";
  EXPECT_EQ(hs_shared_pool_id_create(nullptr), HS_ERROR_INVALID_ARGUMENT);

  hs_shared_host_pool_options_t options = hs::shared_host_pool_options(1 << 20);
  hs_host_pool_t pool = reinterpret_cast<hs_host_pool_t>(0x1);
  hs_shared_pool_id_t garbage{};
  EXPECT_EQ(hs_shared_host_pool_create(&garbage, 0, 1, &options, &pool), HS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("id: these 128 bytes are not a shared pool id"), std::string::npos)
      << hs_last_error();
  EXPECT_EQ(pool, nullptr);
  hs_shared_pool_id_t corrupt = first;
  corrupt.internal[30] ^= 1;  // a byte of the name
  EXPECT_EQ(hs_shared_host_pool_create(&corrupt, 0, 1, &options, &pool), HS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("corrupt"), std::string::npos) << hs_last_error();
}

TEST(SharedHostPoolApi, OneRankPoolIsAnOrdinaryHostPool) {
  const hs_shared_pool_id_t id = hs::create_shared_pool_id();
  hs_shared_host_pool_options_t options = hs::shared_host_pool_options(3 * page_size() + 100);
  options.registration = HS_REGISTER_NEVER;
  void* data = nullptr;
  {
    hs::SharedHostPool pool(id, 0, 1, options);
    EXPECT_FALSE(object_exists(id)) << "the name must be unlinked once every rank attached";
    data = pool.data();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(data) % page_size(), 0u);
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (uint64_t i = 0; i < options.size_bytes; ++i) ASSERT_EQ(bytes[i], 0) << "byte " << i;
    std::memset(data, 0x5a, options.size_bytes);

    const hs_host_pool_info_t info = pool.info();
    EXPECT_EQ(info.size_bytes, options.size_bytes);
    EXPECT_EQ(info.mapped_bytes, 4 * page_size());
    EXPECT_EQ(info.registered, 0);
    EXPECT_EQ(info.num_segments, 0);
    EXPECT_EQ(info.populate_threads, 1);
    const hs_shared_host_pool_info_t shared = pool.shared_info();
    EXPECT_EQ(shared.struct_version, static_cast<uint32_t>(HS_SHARED_HOST_POOL_INFO_VERSION));
    EXPECT_EQ(shared.shared, 1);
    EXPECT_EQ(shared.rank, 0);
    EXPECT_EQ(shared.nranks, 1);
    EXPECT_EQ(shared.writer_rank, 0);
    EXPECT_EQ(shared.is_writer, 1);
    EXPECT_EQ(shared.share_offset, 0u);
    EXPECT_EQ(shared.share_bytes, info.mapped_bytes);
    EXPECT_GE(shared.ready_seconds, shared.populate_seconds);

    const auto role = hisparse::shared_host_pool_role(data, options.size_bytes);
    ASSERT_TRUE(role.has_value());
    EXPECT_TRUE(role->is_writer());
    EXPECT_FALSE(hisparse::shared_host_pool_role(data, 5 * page_size()).has_value()) << "past the pool";

    hs_host_pool_t second = nullptr;
    EXPECT_EQ(hs_shared_host_pool_create(&id, 0, 1, &options, &second), HS_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(hs_last_error()).find("id: this process already took rank 0"), std::string::npos)
        << hs_last_error();
    EXPECT_EQ(second, nullptr);

    pool.release();
    EXPECT_FALSE(is_mapped(data, options.size_bytes)) << "release must unmap";
    EXPECT_FALSE(hisparse::shared_host_pool_role(data, 1).has_value()) << "a released pool has no role";
    EXPECT_EQ(pool.info().released, 1);
    EXPECT_EQ(pool.shared_info().shared, 1) << "the facts survive the release";
    pool.release();  // idempotent
  }
  EXPECT_FALSE(object_exists(id));
}

TEST(SharedHostPoolApi, PrivatePoolsAnswerAsRankZeroOfOne) {
  hs_host_pool_options_t options;
  hs_host_pool_options_init(&options);
  options.size_bytes = 1 << 20;
  options.registration = HS_REGISTER_NEVER;
  hs::HostPool pool(options);
  hs_shared_host_pool_info_t info{};
  info.struct_size = sizeof(info);
  ASSERT_EQ(hs_shared_host_pool_get_info(pool.get(), &info), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(info.shared, 0);
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.nranks, 1);
  EXPECT_EQ(info.is_writer, 1);
  EXPECT_EQ(info.share_bytes, 1u << 20);
  EXPECT_FALSE(hisparse::shared_host_pool_role(pool.data(), 16).has_value());
  info.struct_size = 8;
  EXPECT_EQ(hs_shared_host_pool_get_info(pool.get(), &info), HS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("info"), std::string::npos);
  EXPECT_EQ(hs_shared_host_pool_get_info(nullptr, &info), HS_ERROR_INVALID_ARGUMENT);
}

TEST(SharedHostPoolApi, BadArgumentsNameTheFieldAndKeepTheIdUsable) {
  const hs_shared_pool_id_t id = hs::create_shared_pool_id();
  hs_host_pool_t pool = nullptr;
  struct Case {
    int rank, nranks;
    std::function<void(hs_shared_host_pool_options_t&)> change;
    const char* field;
  };
  const std::vector<Case> cases = {
      {-1, 2, nullptr, "rank: expected 0 <= rank < nranks (2), got -1"},
      {2, 2, nullptr, "rank: expected 0 <= rank < nranks (2), got 2"},
      {0, 0, nullptr, "nranks: expected 1 <= nranks <= 64, got 0"},
      {0, 65, nullptr, "nranks: expected 1 <= nranks <= 64, got 65"},
      {0, 2, [](auto& o) { o.writer_rank = 2; }, "writer_rank"},
      {0, 2, [](auto& o) { o.size_bytes = 0; }, "size_bytes"},
      {0, 2, [](auto& o) { o.timeout_seconds = -1; }, "timeout_seconds"},
      {0, 2, [](auto& o) { o.populate_threads = -1; }, "populate_threads"},
      {0, 2, [](auto& o) { o.max_segment_bytes = 12345; }, "max_segment_bytes"},
      {0, 2, [](auto& o) { o.registration = 9; }, "registration"},
      {0, 2, [](auto& o) { o.struct_size = 16; }, "options: struct_size 16"},
  };
  for (const Case& c : cases) {
    hs_shared_host_pool_options_t options = hs::shared_host_pool_options(1 << 20);
    if (c.change) c.change(options);
    EXPECT_EQ(hs_shared_host_pool_create(&id, c.rank, c.nranks, &options, &pool), HS_ERROR_INVALID_ARGUMENT) << c.field;
    EXPECT_NE(std::string(hs_last_error()).find(c.field), std::string::npos) << hs_last_error();
    EXPECT_EQ(pool, nullptr);
  }
  hs_shared_host_pool_options_t options = hs::shared_host_pool_options(1 << 20);
  EXPECT_EQ(hs_shared_host_pool_create(nullptr, 0, 1, &options, &pool), HS_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(hs_shared_host_pool_create(&id, 0, 1, &options, nullptr), HS_ERROR_INVALID_ARGUMENT);
  EXPECT_FALSE(object_exists(id)) << "refused arguments must not create the object";
  options.registration = HS_REGISTER_NEVER;
  hs::SharedHostPool usable(id, 0, 1, options);  // refusals did not use the id up
  EXPECT_EQ(usable.shared_info().nranks, 1);
}

TEST(SharedHostPoolCore, UnregistrationFailureKeepsTheRegionMapped) {
  RecordingBackend backend;
  backend.fail_unregister_call = 0;
  SharedHostPoolOptions options;
  options.id = SharedPoolId::create();
  options.size_bytes = 4ull << 20;
  options.max_segment_bytes = 2ull << 20;
  options.registrar = &backend;
  {
    SharedHostPool pool(options);
    char* data = static_cast<char*>(pool.data());
    data[100] = 9;
    EXPECT_THROW(pool.release(), hisparse::Error);
    EXPECT_FALSE(pool.released());
    EXPECT_TRUE(is_mapped(data, options.size_bytes)) << "memory the driver still holds must stay mapped";
    EXPECT_EQ(data[100], 9);
    pool.release();  // the retry unregisters the rest, then unmaps
    EXPECT_TRUE(pool.released());
    EXPECT_FALSE(is_mapped(data, options.size_bytes));
  }
  RecordingBackend failing;
  failing.fail_unregister_call = 0;
  options.registrar = &failing;
  options.id = SharedPoolId::create();
  char* data = nullptr;
  {
    auto pool = std::make_unique<SharedHostPool>(options);
    data = static_cast<char*>(pool->data());
    EXPECT_NO_THROW(pool.reset());
  }
  EXPECT_TRUE(is_mapped(data, options.size_bytes))
      << "a destructor that cannot unregister leaves the pages to process exit, not unmapped under the driver";
  EXPECT_FALSE(object_exists(options.id.encode()));
}

// ------------------------------------------------------------------ several processes

// Resident bytes of this process's mapping that holds `address`, from
// /proc/self/smaps (kB figures).
struct MappingUsage {
  uint64_t rss = 0, pss = 0, private_bytes = 0;
};
MappingUsage usage_of(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  MappingUsage usage;
  const auto at = reinterpret_cast<uintptr_t>(address);
  while (std::getline(smaps, line)) {
    unsigned long long start = 0, end = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx ", &start, &end) == 2 && line.find(':') > line.find(' ')) {
      if (inside) break;
      inside = start <= at && at < end;
      continue;
    }
    if (!inside) continue;
    unsigned long long kb = 0;
    char field[64];
    if (std::sscanf(line.c_str(), "%63[^:]: %llu kB", field, &kb) != 2) continue;
    const std::string name = field;
    if (name == "Rss") usage.rss = kb << 10;
    if (name == "Pss") usage.pss = kb << 10;
    if (name == "Private_Clean" || name == "Private_Dirty") usage.private_bytes += kb << 10;
  }
  return usage;
}

// A counter barrier inside the pool's last bytes (the test's own use of the
// shared memory): returns once `n` processes arrived at `counter`.
bool arrive(uint64_t* counter, uint64_t n) {
  __atomic_add_fetch(counter, 1, __ATOMIC_ACQ_REL);
  const auto start = Clock::now();
  while (__atomic_load_n(counter, __ATOMIC_ACQUIRE) < n) {
    if (seconds_since(start) > 60) return false;
    usleep(200);
  }
  return true;
}

// The byte rank 0 writes at offset i.
unsigned char pattern(uint64_t i) { return static_cast<unsigned char>((i * 2654435761u) >> 13); }

TEST(SharedHostPool, ThreeRanksShareOneHostCopy) {
  constexpr int kRanks = 3;
  constexpr uint64_t kSize = 12ull << 20;
  const hs_shared_pool_id_t id = hs::create_shared_pool_id();
  std::vector<std::unique_ptr<RankProcess>> ranks;
  for (int rank = 0; rank < kRanks; ++rank) {
    ranks.push_back(std::make_unique<RankProcess>([&, rank](int) {
      hs_shared_host_pool_options_t options = unregistered(kSize);
      options.populate_threads = 2;
      return create_through_c_abi(id, rank, kRanks, options, [&](hs_host_pool_t handle) {
        void* data = nullptr;
        hs_host_pool_data(handle, &data);
        auto* bytes = static_cast<unsigned char*>(data);
        // The last page holds the test's flags; the bytes before it the pattern.
        const uint64_t payload = kSize - page_size();
        auto* flags = reinterpret_cast<uint64_t*>(bytes + payload);
        if (rank == 0) {
          for (uint64_t i = 0; i < payload; ++i) bytes[i] = pattern(i);
          __atomic_store_n(&flags[0], 1, __ATOMIC_RELEASE);
        }
        const auto wait_start = Clock::now();
        while (__atomic_load_n(&flags[0], __ATOMIC_ACQUIRE) == 0 && seconds_since(wait_start) < 60) usleep(200);
        uint64_t wrong = 0;
        for (uint64_t i = 0; i < payload; ++i) wrong += bytes[i] != pattern(i);
        const bool together = arrive(&flags[1], kRanks);  // every rank maps and has touched every page
        const MappingUsage usage = usage_of(data);
        arrive(&flags[2], kRanks);  // nobody unmaps before everybody measured
        hs_shared_host_pool_info_t shared{};
        shared.struct_size = sizeof(shared);
        hs_shared_host_pool_get_info(handle, &shared);
        std::ostringstream facts;
        facts << "wrong=" << wrong << " together=" << together << " rss=" << usage.rss << " pss=" << usage.pss
              << " private=" << usage.private_bytes << " share=" << shared.share_offset << "+" << shared.share_bytes
              << " writer=" << shared.is_writer << " unlinked=" << !object_exists(id);
        return facts.str();
      });
    }));
  }
  uint64_t total_pss = 0, next_share = 0;
  for (int rank = 0; rank < kRanks; ++rank) {
    const Outcome outcome = ranks[rank]->finish(120);
    ASSERT_TRUE(outcome.reported) << "rank " << rank << " did not report";
    ASSERT_EQ(outcome.status, HS_SUCCESS) << "rank " << rank << ": " << outcome.message;
    unsigned long long wrong = 1, rss = 0, pss = 0, private_bytes = 0, offset = 0, bytes = 0;
    int together = 0, writer = -1, unlinked = 0;
    ASSERT_EQ(std::sscanf(outcome.facts.c_str(),
                          "wrong=%llu together=%d rss=%llu pss=%llu private=%llu share=%llu+%llu writer=%d unlinked=%d",
                          &wrong, &together, &rss, &pss, &private_bytes, &offset, &bytes, &writer, &unlinked),
              9)
        << outcome.facts;
    EXPECT_EQ(wrong, 0u) << "rank " << rank << " read bytes rank 0 did not write";
    EXPECT_EQ(together, 1);
    EXPECT_EQ(writer, rank == 0 ? 1 : 0);
    EXPECT_EQ(unlinked, 1) << "the name must be gone once the pool is ready";
    EXPECT_GE(rss, kSize) << "rank " << rank << " maps the whole pool";
    EXPECT_LE(private_bytes, 64u << 10) << "rank " << rank << " holds pool pages of its own: " << outcome.facts;
    EXPECT_EQ(offset, next_share) << "shares must tile the pool in rank order";
    next_share = offset + bytes;
    total_pss += pss;
  }
  EXPECT_EQ(next_share, kSize);
  // One copy: every page is resident once, shared by three mappings.
  EXPECT_GE(total_pss, kSize - (64u << 10));
  EXPECT_LE(total_pss, kSize + (64u << 10)) << "the pool is resident more than once";
  EXPECT_FALSE(object_exists(id));
}

TEST(SharedHostPool, TakenRanksAndASecondPoolAreRefused) {
  const hs_shared_pool_id_t id = hs::create_shared_pool_id();
  auto member = [&](int rank) {
    RankPlan plan;
    plan.rank = rank;
    plan.nranks = 3;
    plan.announce_at = SharedPoolStage::kAttached;
    plan.on_success = [&id, rank](SharedHostPool& pool) {
      std::memset(static_cast<char*>(pool.data()) + rank, rank + 1, 1);
      hs_shared_host_pool_options_t options = hs::shared_host_pool_options(4 << 20);
      hs_host_pool_t again = nullptr;
      const hs_status_t status = hs_shared_host_pool_create(&id, rank, 3, &options, &again);
      return std::string("again=") + hs_status_string(status) + " " + hs_last_error();
    };
    return std::make_unique<RankProcess>([&id, plan](int fd) { return run_rank(id, plan, fd); });
  };
  auto rank0 = member(0);
  auto rank1 = member(1);
  ASSERT_EQ(rank0->next_stage(60), SharedPoolStage::kAttached);
  ASSERT_EQ(rank1->next_stage(60), SharedPoolStage::kAttached);

  auto intruder = [&](int rank) {
    RankProcess process([&id, rank](int) { return create_through_c_abi(id, rank, 3, unregistered(4 << 20)); });
    return process.finish(60);
  };
  const Outcome second_one = intruder(1);
  EXPECT_EQ(second_one.status, HS_ERROR_INVALID_ARGUMENT) << status_name(second_one);
  EXPECT_NE(second_one.message.find("rank: rank 1 of this shared pool is taken by another process (pid " +
                                    std::to_string(rank1->pid()) + ")"),
            std::string::npos)
      << second_one.message;
  const Outcome second_zero = intruder(0);
  EXPECT_EQ(second_zero.status, HS_ERROR_INVALID_ARGUMENT) << status_name(second_zero);
  EXPECT_NE(second_zero.message.find("rank 0 of this shared pool is taken"), std::string::npos) << second_zero.message;

  // The refusals did not disturb the pool: the third rank completes it.
  auto rank2 = member(2);
  for (auto* process : {rank0.get(), rank1.get(), rank2.get()}) {
    const Outcome outcome = process->finish(120);
    ASSERT_EQ(outcome.status, HS_SUCCESS) << outcome.message;
    EXPECT_NE(outcome.facts.find("again=HS_ERROR_INVALID_ARGUMENT id: this process already took rank"),
              std::string::npos)
        << outcome.facts;
  }
  EXPECT_FALSE(object_exists(id));

  // Once the pool formed, its name is gone: a late process waits for an
  // object that never comes, and says so after its timeout.
  RankProcess late([&id](int) {
    hs_shared_host_pool_options_t options = unregistered(4 << 20);
    options.timeout_seconds = 0.5;
    return create_through_c_abi(id, 2, 3, options);
  });
  const Outcome outcome = late.finish(60);
  EXPECT_EQ(outcome.status, HS_ERROR_SYSTEM);
  EXPECT_NE(outcome.message.find("rank 0 did not create the pool's object"), std::string::npos) << outcome.message;
  EXPECT_NE(outcome.message.find("an id makes one pool"), std::string::npos) << outcome.message;
}

struct Mismatch {
  const char* field;
  std::function<void(RankPlan&)> change;
};

class SharedHostPoolMismatch : public ::testing::TestWithParam<Mismatch> {};

TEST_P(SharedHostPoolMismatch, FailsEveryRankAtOnce) {
  const hs_shared_pool_id_t id = hs::create_shared_pool_id();
  RankPlan good;
  good.rank = 0;
  RankPlan bad;
  bad.rank = 1;
  GetParam().change(bad);
  RankProcess rank0([&](int fd) { return run_rank(id, good, fd); });
  RankProcess rank1([&](int fd) { return run_rank(id, bad, fd); });
  const Outcome refused = rank1.finish(60);
  const Outcome failed = rank0.finish(60);
  const std::string field = GetParam().field;
  EXPECT_EQ(refused.status, HS_ERROR_INVALID_ARGUMENT) << refused.message;
  EXPECT_EQ(refused.message.rfind(field + ": rank 1 was given", 0), 0u) << refused.message;
  EXPECT_EQ(failed.status, HS_ERROR_INVALID_ARGUMENT) << failed.message;
  EXPECT_NE(failed.message.find("shared host pool: rank 1 failed: " + field + ":"), std::string::npos)
      << failed.message;
  EXPECT_LT(failed.seconds, 30) << "the mismatch must reach rank 0 without a timeout";
  EXPECT_FALSE(object_exists(id));
}

INSTANTIATE_TEST_SUITE_P(Fields, SharedHostPoolMismatch,
                         ::testing::Values(Mismatch{"nranks", [](RankPlan& p) { p.nranks = 3; }},
                                           Mismatch{"size_bytes", [](RankPlan& p) { p.size_bytes += 4096; }},
                                           Mismatch{"writer_rank", [](RankPlan& p) { p.writer_rank = 1; }}),
                         [](const auto& info) { return std::string(info.param.field); });

// A rank killed with SIGKILL at one stage of the setup.
struct Kill {
  const char* name;
  int nranks;
  int victim;
  std::optional<SharedPoolStage> stage;  // nullopt: the victim dies before it calls create
  bool registered;
  double timeout_seconds;      // of the survivors
  const char* survivors_read;  // in their error; nullptr: they succeed
};

class SharedHostPoolKill : public ::testing::TestWithParam<Kill> {};

TEST_P(SharedHostPoolKill, OthersFailNamingItAndNothingStays) {
  const Kill& kill = GetParam();
  const hs_shared_pool_id_t id = hs::create_shared_pool_id();
  std::vector<std::unique_ptr<RankProcess>> ranks;
  for (int rank = 0; rank < kill.nranks; ++rank) {
    RankPlan plan;
    plan.rank = rank;
    plan.nranks = kill.nranks;
    plan.size_bytes = 8ull << 20;
    plan.timeout_seconds = kill.timeout_seconds;
    plan.register_pages = kill.registered;
    plan.max_segment_bytes = 2ull << 20;
    plan.on_success = [](SharedHostPool& pool) {
      auto* bytes = static_cast<volatile unsigned char*>(pool.data());
      bytes[pool.size_bytes() - 1] = 7;  // the survivors' pool stays usable
      return std::string("usable=") + std::to_string(bytes[pool.size_bytes() - 1] == 7);
    };
    if (rank == kill.victim) plan.stop_at = kill.stage;
    const bool dies_first = rank == kill.victim && !kill.stage;
    ranks.push_back(std::make_unique<RankProcess>([&id, plan, dies_first](int fd) {
      if (dies_first) raise(SIGKILL);
      return run_rank(id, plan, fd);
    }));
  }
  RankProcess& victim = *ranks[kill.victim];
  if (kill.stage) {
    ASSERT_EQ(victim.next_stage(60), kill.stage) << "the victim did not reach the stage";
    victim.kill9();
  }
  const auto killed_at = Clock::now();
  const Outcome gone = victim.finish(60);
  EXPECT_TRUE(victim.killed());
  EXPECT_FALSE(gone.reported);
  for (int rank = 0; rank < kill.nranks; ++rank) {
    if (rank == kill.victim) continue;
    const Outcome outcome = ranks[rank]->finish(kill.timeout_seconds + 60);
    ASSERT_TRUE(outcome.reported) << "rank " << rank << " hung or crashed";
    if (kill.survivors_read == nullptr) {
      EXPECT_EQ(outcome.status, HS_SUCCESS) << outcome.message;
      EXPECT_NE(outcome.facts.find("usable=1"), std::string::npos) << outcome.facts;
    } else {
      EXPECT_EQ(outcome.status, HS_ERROR_SYSTEM) << "rank " << rank << ": " << outcome.message;
      const std::string expected = std::string(kill.survivors_read);
      EXPECT_NE(outcome.message.find(expected), std::string::npos) << "rank " << rank << ": " << outcome.message;
      if (kill.timeout_seconds > 10) {
        EXPECT_LT(seconds_since(killed_at), 10) << "a death after attach must be seen at once, not at the timeout";
      }
    }
    if (kill.registered) {
      unsigned long long registers = 0, unregisters = 0;
      const size_t at = outcome.facts.find("registers=");
      ASSERT_NE(at, std::string::npos) << outcome.facts;
      ASSERT_EQ(std::sscanf(outcome.facts.c_str() + at, "registers=%llu unregisters=%llu", &registers, &unregisters),
                2);
      EXPECT_EQ(registers, unregisters) << "rank " << rank << " left memory registered";
    }
  }
  EXPECT_FALSE(object_exists(id)) << "a killed rank left " << SharedPoolId::decode(id).name << " in /dev/shm";
}

INSTANTIATE_TEST_SUITE_P(
    Stages, SharedHostPoolKill,
    ::testing::Values(Kill{"Rank1BeforeAttach", 2, 1, std::nullopt, false, 2.0,
                           "without progress for rank(s) 1 to attach"},
                      Kill{"Rank0WithTheHeaderUninitialised", 2, 0, SharedPoolStage::kObjectCreated, false, 2.0,
                           "rank 0 created /hisparse-pool-"},
                      Kill{"Rank0AfterAttach", 3, 0, SharedPoolStage::kAttached, false, 60, "rank 0 (pid "},
                      Kill{"Rank1AfterAttach", 2, 1, SharedPoolStage::kAttached, false, 60, "rank 1 (pid "},
                      Kill{"Rank1WhilePopulating", 3, 1, SharedPoolStage::kPopulating, false, 60,
                           "died during setup (its last finished step: attach)"},
                      Kill{"Rank1AfterPopulating", 2, 1, SharedPoolStage::kPopulated, false, 60,
                           "died during setup (its last finished step: populate)"},
                      Kill{"Rank2WhileRegistering", 3, 2, SharedPoolStage::kRegistering, true, 60,
                           "died during setup (its last finished step: populate)"},
                      // Its part was done: the others complete the pool without it.
                      Kill{"Rank2AfterRegistering", 3, 2, SharedPoolStage::kRegistered, true, 60, nullptr},
                      Kill{"Rank1WhenReady", 2, 1, SharedPoolStage::kReady, true, 60, nullptr}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(SharedHostPool, RegistrationFailureFailsEveryRankAndRollsBack) {
  const hs_shared_pool_id_t id = hs::create_shared_pool_id();
  RankPlan plan;
  plan.size_bytes = 8ull << 20;
  plan.register_pages = true;
  plan.max_segment_bytes = 2ull << 20;
  RankPlan failing = plan;
  failing.rank = 1;
  failing.fail_register_call = 1;
  RankProcess rank0([&](int fd) { return run_rank(id, plan, fd); });
  RankProcess rank1([&](int fd) { return run_rank(id, failing, fd); });
  const Outcome first = rank0.finish(120);
  const Outcome second = rank1.finish(120);
  EXPECT_EQ(second.status, HS_ERROR_CUDA) << second.message;
  EXPECT_EQ(second.message, "injected register failure");
  EXPECT_NE(second.facts.find("registers=1 unregisters=1"), std::string::npos) << second.facts;
  EXPECT_EQ(first.status, HS_ERROR_CUDA) << "the failing rank's status reaches the others: " << first.message;
  EXPECT_EQ(first.message, "shared host pool: rank 1 failed: injected register failure");
  // Rank 0 registered all four segments, or saw the failure before it began.
  EXPECT_TRUE(first.facts.find("registers=4 unregisters=4") != std::string::npos ||
              first.facts.find("registers=0 unregisters=0") != std::string::npos)
      << first.facts;
  EXPECT_FALSE(object_exists(id));
}

TEST(SharedHostPool, RankZerosMemoryRefusalReachesEveryRank) {
  uint64_t available = 0;
  ASSERT_EQ(hs_available_host_memory(&available), HS_SUCCESS);
  const hs_shared_pool_id_t id = hs::create_shared_pool_id();
  const uint64_t too_big = (available + (64ull << 30)) / page_size() * page_size();
  auto rank = [&](int r) {
    return std::make_unique<RankProcess>(
        [&id, r, too_big](int) { return create_through_c_abi(id, r, 2, unregistered(too_big)); });
  };
  auto rank0 = rank(0);
  auto rank1 = rank(1);
  const Outcome refused = rank0->finish(60);
  const Outcome told = rank1->finish(60);
  EXPECT_EQ(refused.status, HS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(refused.message.find("GiB of RAM is available"), std::string::npos) << refused.message;
  EXPECT_EQ(told.status, HS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(told.message.find("shared host pool: rank 0 failed: size_bytes: hisparse pinned host pool needs ~"),
            std::string::npos)
      << told.message;
  EXPECT_FALSE(object_exists(id));
}

TEST(SharedHostPool, TheWriterRankIsKnownToEveryRank) {
  const hs_shared_pool_id_t id = hs::create_shared_pool_id();
  std::vector<std::unique_ptr<RankProcess>> ranks;
  for (int r = 0; r < 2; ++r) {
    RankPlan plan;
    plan.rank = r;
    plan.writer_rank = 1;
    plan.on_success = [](SharedHostPool& pool) {
      const auto role = hisparse::shared_host_pool_role(static_cast<char*>(pool.data()) + 100, 1000);
      return "role=" + std::to_string(role ? role->rank : -1) + "," + std::to_string(role ? role->writer_rank : -1) +
             "," + std::to_string(role ? role->is_writer() : -1);
    };
    ranks.push_back(std::make_unique<RankProcess>([&id, plan](int fd) { return run_rank(id, plan, fd); }));
  }
  EXPECT_EQ(ranks[0]->finish(60).facts, "role=0,1,0");
  EXPECT_EQ(ranks[1]->finish(60).facts, "role=1,1,1");
}

// ------------------------------------------------------------------ interprocess events

TEST(IpcEventCpu, ExportImportAcrossProcessesAndRefusals) {
  hs::IpcEvent event(HS_DEVICE_CPU, 0);
  const hs_ipc_event_info_t info = event.info();
  EXPECT_EQ(info.device_type, HS_DEVICE_CPU);
  EXPECT_EQ(info.imported, 0);
  EXPECT_EQ(info.exporter_pid, static_cast<int64_t>(getpid()));
  event.record();  // CPU work is done when record is called: record, wait
  event.wait();    // and synchronize are exact no-ops
  event.synchronize();
  const hs_ipc_event_handle_t handle = event.export_handle();

  hs_ipc_event_t opened = reinterpret_cast<hs_ipc_event_t>(0x1);
  EXPECT_EQ(hs_ipc_event_import(&handle, -1, &opened), HS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("handle: this event was exported by this process"), std::string::npos)
      << hs_last_error();
  EXPECT_EQ(opened, nullptr);
  hs_ipc_event_handle_t garbage{};
  EXPECT_EQ(hs_ipc_event_import(&garbage, -1, &opened), HS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("handle: these 128 bytes are not an interprocess event handle"),
            std::string::npos);
  EXPECT_EQ(hs_ipc_event_import(nullptr, -1, &opened), HS_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(hs_ipc_event_create(7, 0, &opened), HS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("device_type"), std::string::npos);
  EXPECT_EQ(hs_ipc_event_record(nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("event"), std::string::npos);
  EXPECT_EQ(hs_ipc_event_destroy(nullptr), HS_SUCCESS);

  const pid_t parent = getpid();
  RankProcess child([&](int) {
    Outcome outcome;
    outcome.reported = true;
    hs_ipc_event_t imported = nullptr;
    outcome.status = hs_ipc_event_import(&handle, -1, &imported);
    if (outcome.status != HS_SUCCESS) {
      outcome.message = hs_last_error();
      return outcome;
    }
    hs_ipc_event_info_t got{};
    got.struct_size = sizeof(got);
    hs_ipc_event_get_info(imported, &got);
    const hs_status_t waited = hs_ipc_event_wait(imported, nullptr);
    const hs_status_t recorded = hs_ipc_event_record(imported, nullptr);
    hs_ipc_event_handle_t again{};
    const hs_status_t exported = hs_ipc_event_export(imported, &again);
    outcome.facts = "imported=" + std::to_string(got.imported) + " exporter=" + std::to_string(got.exporter_pid) +
                    " type=" + std::to_string(got.device_type) + " wait=" + hs_status_string(waited) +
                    " record=" + hs_status_string(recorded) + " export=" + hs_status_string(exported);
    outcome.message = hs_last_error();
    hs_ipc_event_destroy(imported);
    return outcome;
  });
  const Outcome outcome = child.finish(60);
  ASSERT_EQ(outcome.status, HS_SUCCESS) << outcome.message;
  EXPECT_EQ(outcome.facts, "imported=1 exporter=" + std::to_string(parent) + " type=" + std::to_string(HS_DEVICE_CPU) +
                               " wait=HS_SUCCESS record=HS_SUCCESS export=HS_ERROR_INVALID_STATE");
  EXPECT_NE(outcome.message.find("an imported event cannot be exported again"), std::string::npos) << outcome.message;
}

TEST(IpcEventCpu, CudaEventsNeedTheCudaBackend) {
  int devices = 0;
  ASSERT_EQ(hs_cuda_device_count(&devices), HS_SUCCESS);
  if (devices > 0) GTEST_SKIP() << "a CUDA device is present";
  hs_ipc_event_t event = nullptr;
  EXPECT_EQ(hs_ipc_event_create(HS_DEVICE_CUDA, -1, &event), HS_ERROR_UNSUPPORTED);
  EXPECT_EQ(event, nullptr);
}

}  // namespace
