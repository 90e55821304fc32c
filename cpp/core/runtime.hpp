// The per-layer runtime (the seed's HiSparseRuntime): binds one layer's
// host (source) cache and its hot-cache view in a shared GPU slab, and runs
// swap_in every decode step. The group leader resolves residency once for
// the whole index group; followers reuse the leader's swap list and move
// only their own bytes, on the group's copy stream, prefetched by the leader
// when the batch allows it (in one launch for all of them when the caller
// asks with group_gather and their host rows of a slot lie side by side: a
// token-major host layout). The orchestration (which stream waits for what,
// which rows a call takes, which misuse is refused) lives here. The bound
// caches are checked once, at bind, and their gather parameters kept; a
// step checks only the tensors its caller passes and launches the kernels
// through the backend.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "core/backend.hpp"
#include "core/data_movement_params.hpp"
#include "core/host_regions.hpp"
#include "core/ipc_event.hpp"
#include "core/kv_params.hpp"
#include "core/resolve_residency_params.hpp"
#include "core/runtime_group.hpp"
#include "core/tensor.hpp"
#include "hisparse/hisparse.h"

namespace hisparse {

struct RuntimeOptions {
  hs_config_t config{};
  Device device;
  int32_t max_num_reqs = 0;   // 0 on a follower = the leader's
  int32_t max_swap_rows = 0;  // 0 = the leader's on a follower, else default_max_swap_rows
  hs_dtype_t kv_dtype = HS_DTYPE_UINT8;
  hs_stream_t copy_stream = nullptr;  // leader only, borrowed
  Event topk_ready = nullptr;         // leader only, borrowed
  // The group keeps a residency hint: ON, OFF, or AUTO where it pays
  // (residency_hint_pays); a leader's choice, followers give AUTO or OFF.
  hs_residency_hint_choice_t residency_hint = HS_RESIDENCY_HINT_AUTO;
};

struct SwapInResult {
  int64_t first_row = 0;
  int64_t num_rows = 0;
  bool prefetched = false;
};

struct RuntimeStats {
  int32_t num_layers = 0;
  std::array<int64_t, HS_NUM_STATS> counters{};
  double hit_rate = 0.0;
  uint64_t group_row_bytes = 0;
  uint64_t bytes_moved = 0;
};

// A descriptor copied out of a caller's hs_tensor_t, owning its shape and
// strides (the caller's arrays need not outlive the call that gave them).
class StoredTensor {
 public:
  StoredTensor() = default;
  explicit StoredTensor(const hs_tensor_t& tensor) { assign(tensor); }
  StoredTensor(const StoredTensor& other) { assign(other.tensor_); }
  StoredTensor& operator=(const StoredTensor& other) {
    if (this != &other) assign(other.tensor_);
    return *this;
  }
  void assign(const hs_tensor_t& tensor);
  const hs_tensor_t* get() const { return &tensor_; }
  const hs_tensor_t& raw() const { return tensor_; }

 private:
  std::array<int64_t, HS_MAX_DIMS> shape_{};
  std::array<int64_t, HS_MAX_DIMS> strides_{};
  hs_tensor_t tensor_{};
};

class Runtime {
 public:
  // A leader: resolves and validates the options and creates the group
  // (blocking).
  explicit Runtime(const RuntimeOptions& options);
  // A follower joining `leader`'s group; the group-wide sizes must agree.
  Runtime(const RuntimeOptions& options, Runtime& leader);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  bool is_leader() const { return group_->leader() == this; }
  RuntimeGroup& group() const { return *group_; }
  const RuntimeOptions& options() const { return options_; }
  int32_t row_bytes() const { return options_.config.row_bytes; }
  int32_t row_width() const { return row_width_; }

  bool source_bound() const { return source_bound_; }
  bool hot_bound() const { return hot_bound_; }
  bool staged() const { return staged_.active; }
  int64_t host_rows() const { return source_bound_ ? source_.rows : 0; }
  int64_t hot_num_blocks() const { return hot_bound_ ? hot_.num_blocks : 0; }
  int64_t attention_block_stride() const { return hot_bound_ ? hot_.attention_block_stride : 0; }
  int64_t next_row() const { return next_row_; }
  const hs_tensor_t& host_cache() const;
  const hs_tensor_t& hot_cache() const;
  // True on a leader whose followers' layout allows group_gather (one
  // group gather for all of them): at least two followers, all bound, whose
  // host rows of one slot form one contiguous span and whose hot views share
  // one layout. Read from the current bindings; false on a follower.
  bool followers_staged_together() const;

  void bind_source_cache(const hs_tensor_t* host_cache, const hs_tensor_t* registered_host_pool);
  void bind_hot_cache(const hs_hot_cache_binding_t& binding);
  void unbind();

  void begin_forward();
  SwapInResult swap_in(const hs_runtime_swap_in_args_t& args, hs_stream_t stream);
  void reset_hot_state(hs_stream_t stream);
  void rebuild_residency_hint(hs_stream_t stream);
  void invalidate_sorted_slots(const hs_tensor_t* sorted_slots, const hs_tensor_t* state_indices, hs_stream_t stream);
  void mirror_rows(const hs_tensor_t* src_rows, const hs_tensor_t* slot_mapping, hs_stream_t stream);
  void copy_stats_async(hs_stream_t stream);
  RuntimeStats stats() const;
  // Counters back to 0, hot state untouched (ordered like reset_hot_state).
  void reset_stats(hs_stream_t stream);
  // One state row's hot state back to its initial value (ordered like reset_hot_state).
  void reset_request(int32_t state_row, hs_stream_t stream);
  // The write op (hs_runtime_write): host store, resident copy, hot copies.
  void write(const hs_runtime_write_args_t& args, hs_stream_t stream);

  // Who writes the host cache (hs_runtime_set_host_sharing): the role as
  // set, and whether this runtime writes (AUTO: learned from the pool at
  // bind_source_cache).
  void set_host_sharing(int32_t role, IpcEvent* event);
  int32_t host_role() const { return host_role_; }
  bool is_writer() const;

 private:
  // The bound host cache: rows at one pitch, host slot g = row g.
  struct SourceBinding {
    StoredTensor cache;
    int64_t rows = 0;
    int64_t pitch = 0;  // elements between host slots (the row width when rows <= 1)
    ByteRange bytes;    // what it occupies (mirror_rows writes it, gathers read it)
    // The host pool it lies in (null: memory of no pool): once the pool is
    // released, nothing reads or writes the cache.
    std::shared_ptr<const HostRegion> pool;
  };
  // The bound hot view ([num_blocks, block_size, row_width] of kv_dtype)
  // and the hot block table it is addressed through.
  struct HotBinding {
    StoredTensor view;
    StoredTensor block_table;
    ByteRange view_bytes;   // written by the gathers
    ByteRange table_bytes;  // read by the resolver
    int64_t num_blocks = 0;
    int64_t block_size = 0;
    int64_t attention_block_stride = 0;
  };
  struct Staged {
    bool active = false;
    int64_t first_row = 0;
    int64_t num_rows = 0;
  };

  void init_common();
  // Throws unless a hot layout of (block_size, attention_block_stride) for
  // this runtime agrees with the bound layouts of the group it must match
  // (the leader's attention indices assume one).
  void check_hot_layout_in_group(int64_t block_size, int64_t attention_block_stride) const;
  // The gather of the two caches (gather_cache_params), checked when the
  // second of them is bound.
  GatherCompactParams gather_template(const SourceBinding& source, const HotBinding& hot) const;
  void require_bound(const char* operation) const;
  // Throws HS_ERROR_INVALID_STATE when the host pool of the bound source
  // cache was released since the binding.
  void require_live_source() const;
  // Throws unless a binding with these ranges shares no written byte with
  // the group's state, with its own other parts or with another binding of
  // any runtime of the group (an empty range: that part is not bound yet).
  void check_binding_apart(const ByteRange& source, const ByteRange& view, const ByteRange& table) const;
  // Throws unless the tensors a swap_in call passes (read, or written: the
  // caller's outputs) share no written byte with each other, the group's
  // state and the bound caches the call's kernels touch (the followers'
  // too when it stages them).
  void check_call_apart(const ByteRange* reads, size_t num_reads, const ByteRange* writes, size_t num_writes,
                        bool stages_followers) const;
  int64_t token_rows(const hs_runtime_swap_in_args_t& args) const;
  // The leader's resolution of the step into shared rows [first_row, ...),
  // checked: the caller's tensors here, the bound caches at bind. With
  // args.fused_gather the launch also copies this layer's missed rows.
  // A narrow top-k or per-request lengths set *prepare (and *padded): the
  // resolve then reads the group's padded copy, which `prepare` writes.
  ResolveResidencyParams resolve_params(const hs_runtime_swap_in_args_t& args, int64_t first_row,
                                        PrepareTopkParams* prepare, bool* padded) const;
  // The copy stream waits for the host writer's event (a reader with one).
  void copy_waits_for_host_writes() const;
  // The writer records its host event on `stream` after a host write.
  void record_host_write(hs_stream_t stream) const;
  // This layer's gather of the swap list of shared rows [first_row,
  // first_row + num_rows): the bound gather with the group's swap list.
  GatherCompactParams gather_params(int64_t first_row, int64_t num_rows) const;
  // Gathers this layer's missed rows of [first_row, first_row + num_rows) on
  // the copy stream and records the layer's ready event after them.
  void stage(int64_t first_row, int64_t num_rows);
  // Records the layer's ready event on the copy stream after everything
  // enqueued there so far and marks rows [first_row, first_row + num_rows)
  // staged: the end of stage(), and all a fused-gather leader has left to do
  // after its resolve.
  void mark_staged(int64_t first_row, int64_t num_rows);

  // Where the followers' host rows of one slot lie back to back: follower f
  // is piece (f's host base - base) / row_bytes of a [host_rows, pieces, W]
  // view at `base` with slot stride `pitch` elements.
  struct FollowerSpan {
    const char* base = nullptr;
    int64_t pitch = 0;
    int32_t pieces = 0;
  };
  // The span when the followers tile (see followers_staged_together()).
  // Otherwise false, and `why` (when given) says which condition failed;
  // nothing is allocated unless it fails with `why`.
  bool followers_span(FollowerSpan* span, std::string* why) const;
  // Stages every follower's missed rows of [first_row, first_row + num_rows)
  // from the span with group gathers (one launch per
  // HS_MAX_GATHER_GROUP_PIECES pieces) and marks each follower staged.
  void stage_followers_together(const FollowerSpan& span, int64_t first_row, int64_t num_rows);

  RuntimeOptions options_;
  std::shared_ptr<RuntimeGroup> group_;
  Backend* backend_ = nullptr;
  Event ready_event_ = nullptr;
  int32_t row_width_ = 0;

  bool source_bound_ = false;
  SourceBinding source_;
  bool hot_bound_ = false;
  HotBinding hot_;
  // With both caches bound: this layer's gather without its swap list.
  GatherCompactParams gather_;

  int64_t next_row_ = 0;
  Staged staged_;

  int32_t host_role_ = HS_HOST_ROLE_AUTO;
  bool pool_reader_ = false;  // the bound host cache lies in a shared pool this process reads
  IpcEvent* host_event_ = nullptr;
};

}  // namespace hisparse
