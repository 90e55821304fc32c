// What the runtimes of one index group share on the host: the index group
// itself (held through its C ABI handle), the group's copy stream and the
// events that order it against the callers' compute streams, the member
// list, and the rows the leader resolved in the current forward. The leader
// creates it; every member holds a shared reference, so the device memory,
// stream and events live until the last runtime of the group is gone.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/backend.hpp"
#include "hisparse/hisparse.h"
#include "core/tensor.hpp"

namespace hisparse {

class Runtime;

// Rethrows the status and message of a failed hs_* call made inside the core.
void check_status(hs_status_t status);

struct GroupOptions {
  Device device;
  int32_t max_num_reqs = 0;
  int32_t device_buffer_size = 0;
  int32_t max_swap_rows = 0;
  int32_t top_k = 0;
  int32_t max_union_rows = 0;
  hs_stream_t copy_stream = nullptr;  // borrowed; null = create and own one
  Event topk_ready = nullptr;         // borrowed; null = none
};

// A view of rows [first, first + count) of one of the group's shared tensors.
// Holds its own shape, so the descriptor stays valid while the view lives.
class SharedRows {
 public:
  SharedRows(const hs_tensor_t& whole, int64_t first, int64_t count);
  SharedRows(const SharedRows&) = delete;
  SharedRows& operator=(const SharedRows&) = delete;
  const hs_tensor_t* get() const { return &tensor_; }

 private:
  std::array<int64_t, 2> shape_{};
  hs_tensor_t tensor_{};
};

class RuntimeGroup {
 public:
  RuntimeGroup(const GroupOptions& options, Backend& backend);
  ~RuntimeGroup();
  RuntimeGroup(const RuntimeGroup&) = delete;
  RuntimeGroup& operator=(const RuntimeGroup&) = delete;

  const GroupOptions& options() const { return options_; }
  const Device& device() const { return options_.device; }
  Backend& backend() const { return backend_; }
  hs_index_group_t index_group() const { return index_group_; }
  const hs_tensor_t& tensor(hs_index_group_tensor_t which) const { return tensors_[which]; }
  hs_stream_t copy_stream() const { return copy_stream_; }

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

  // Token rows [0, resolved_rows) of the shared state hold the leader's
  // resolution for the current forward.
  int64_t resolved_rows() const { return resolved_rows_; }
  void set_resolved_rows(int64_t rows) { resolved_rows_ = rows; }

 private:
  GroupOptions options_;
  Backend& backend_;
  hs_index_group_t index_group_ = nullptr;
  std::array<hs_tensor_t, HS_INDEX_GROUP_NUM_TENSORS> tensors_{};
  hs_stream_t copy_stream_ = nullptr;
  bool owns_copy_stream_ = false;
  Event fork_event_ = nullptr;  // recorded on a caller's stream, waited by the copy stream
  Event join_event_ = nullptr;  // recorded on the copy stream, waited by a caller's stream
  Runtime* leader_ = nullptr;
  std::vector<Runtime*> followers_;
  int64_t resolved_rows_ = 0;
};

}  // namespace hisparse
