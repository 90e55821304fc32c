// What the runtimes of one index group share on the host: the index group
// itself, the group's copy stream and the events that order it against the
// callers' compute streams, the member list, and the rows the leader
// resolved in the current forward. The leader creates it; every member holds
// a shared reference, so the device memory, stream and events live until
// the last runtime of the group is gone.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/backend.hpp"
#include "core/device_memory.hpp"
#include "core/index_group.hpp"
#include "core/tensor.hpp"
#include "hisparse/hisparse.h"

namespace hisparse {

class Runtime;

struct GroupOptions {
  IndexGroupOptions index_group;      // resolved sizes (no defaults left)
  hs_stream_t copy_stream = nullptr;  // borrowed; null = create and own one
  Event topk_ready = nullptr;         // borrowed; null = none
  bool residency_hint = false;        // the group keeps a residency hint (the leader's choice, decided)
};

class RuntimeGroup {
 public:
  RuntimeGroup(const GroupOptions& options, Backend& backend);
  ~RuntimeGroup();
  RuntimeGroup(const RuntimeGroup&) = delete;
  RuntimeGroup& operator=(const RuntimeGroup&) = delete;

  const Device& device() const { return index_group_.options().device; }
  Backend& backend() const { return backend_; }
  IndexGroup& index_group() { return index_group_; }
  const IndexGroup& index_group() const { return index_group_; }
  hs_stream_t copy_stream() const { return streams_.copy; }
  // int32 [max_swap_rows, top_k] on the group's device: a narrow or
  // length-limited top-k padded to the group's width before a resolve.
  int32_t* padded_topk() const { return padded_topk_.data<int32_t>(); }

  // Cross-stream ordering through the group's events: enqueued, never
  // blocking the host, capturable (each wait follows its record).
  void copy_waits_for(hs_stream_t stream);
  void stream_waits_for_copy(hs_stream_t stream);
  // The copy stream waits for the top-k producer: the top-k-ready event when
  // the leader has one (and the caller does not opt out), else `compute`.
  void copy_waits_for_topk(hs_stream_t compute, bool ignore_topk_ready);

  Runtime* leader() const { return leader_; }
  const std::vector<Runtime*>& followers() const { return followers_; }
  void set_leader(Runtime* leader) { leader_ = leader; }
  void add_follower(Runtime* follower) { followers_.push_back(follower); }
  void remove(Runtime* member);
  int32_t size() const { return static_cast<int32_t>(followers_.size()) + (leader_ != nullptr ? 1 : 0); }
  // Row bytes summed over the live members: the bytes one miss moves.
  uint64_t row_bytes() const;

  // The group's residency hint (docs/residency.md, "Residency hint"): a bit
  // per host row of the leader's source cache, read and kept by the CUDA
  // resolves; null on the CPU and until the leader binds a source cache.
  uint32_t* residency_hint() const { return hint_ != nullptr ? hint_->data<uint32_t>() : nullptr; }
  bool keeps_residency_hint() const { return keeps_hint_; }
  int64_t residency_hint_rows() const { return hint_rows_; }
  // Sizes the hint for `host_rows` (reallocated when that changes) and
  // rebuilds it from the state on the copy stream: after the leader binds
  // a source cache, and after the state is reset.
  void rebuild_residency_hint(int64_t host_rows);

  // Token rows [0, resolved_rows) of the shared state hold the leader's
  // resolution for the current forward.
  int64_t resolved_rows() const { return resolved_rows_; }
  void set_resolved_rows(int64_t rows) { resolved_rows_ = rows; }

 private:
  // The copy stream and the two events, freed on every path.
  class Streams {
   public:
    Streams(Backend& backend, int device, hs_stream_t borrowed_copy_stream);
    ~Streams();
    Streams(const Streams&) = delete;
    Streams& operator=(const Streams&) = delete;

    Backend& backend;
    int device;
    hs_stream_t copy = nullptr;
    bool owns_copy = false;
    Event fork = nullptr;  // recorded on a caller's stream, waited by the copy stream
    Event join = nullptr;  // recorded on the copy stream, waited by a caller's stream
  };

  Backend& backend_;
  IndexGroup index_group_;
  Streams streams_;
  DeviceBuffer padded_topk_;
  Event topk_ready_ = nullptr;
  Runtime* leader_ = nullptr;
  std::vector<Runtime*> followers_;
  int64_t resolved_rows_ = 0;
  bool keeps_hint_ = false;
  std::unique_ptr<DeviceBuffer> hint_;
  int64_t hint_rows_ = 0;
};

}  // namespace hisparse
