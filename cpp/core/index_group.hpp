// The index group (the seed's HiSparseIndexGroup + _SharedTopKState): the
// GPU state shared by the layers that reuse one indexer output. It owns the
// hot-region state of every request state row, the shared top-k outputs the
// leader writes once per step for its followers, and the residency counters
// with a page-locked host mirror. Everything lives in one backend allocation
// so the group is one object to create, hand out and free.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "core/backend.hpp"
#include "core/resolve_residency_params.hpp"
#include "core/tensor.hpp"
#include "hisparse/hisparse.h"

namespace hisparse {

struct IndexGroupOptions {
  Device device;                       // kCpu or kCuda with a concrete index
  int32_t max_num_reqs = 0;            // S
  int32_t device_buffer_size = 0;      // H
  int32_t max_swap_rows = 0;           // R; 0 = default_max_swap_rows
  int32_t top_k = 0;                   // K
  int32_t max_union_rows = 0;          // 0 = default_max_union_rows
  int32_t num_speculative_tokens = 0;  // read by the defaults only
};

// `options` with its defaults filled in, validated: throws
// HS_ERROR_INVALID_ARGUMENT naming the first option out of range.
IndexGroupOptions resolve_index_group_options(const IndexGroupOptions& options);

class IndexGroup {
 public:
  static constexpr int kNumTensors = HS_INDEX_GROUP_NUM_TENSORS;

  // Resolves and validates the options (and, on CUDA, that the resolver's
  // shared memory fits the device), allocates through `backend` (which must
  // serve options.device) and initialises on a private stream it waits for:
  // synchronous.
  IndexGroup(const IndexGroupOptions& options, Backend& backend);
  ~IndexGroup();
  IndexGroup(const IndexGroup&) = delete;
  IndexGroup& operator=(const IndexGroup&) = delete;

  const IndexGroupOptions& options() const { return options_; }
  Backend& backend() const { return backend_; }
  uint64_t device_bytes() const { return device_bytes_; }

  // The group's device memory (every tensor but the host mirror of the
  // counters), named for the errors of arguments that overlap it.
  ByteRange memory() const;

  // Descriptor of one owned tensor; shape storage lives in the group.
  const hs_tensor_t& tensor(hs_index_group_tensor_t which) const;
  template <typename T>
  T* data(hs_index_group_tensor_t which) const {
    return static_cast<T*>(tensor(which).data);
  }

  // Stream-ordered and capturable: see hisparse/index_group.h.
  void reset(hs_stream_t stream);
  void invalidate_sorted_slots(const hs_tensor_t* sorted_slots, const hs_tensor_t* state_indices, hs_stream_t stream);
  void copy_stats_async(hs_stream_t stream);

  // A resolution through the group, in three parts: the caller's top-k
  // (on the group's device, K wide), the group's own part (its state,
  // max_union_rows, counters and the shared outputs of rows [row_offset,
  // row_offset + T), refused naming row_offset unless they fit), and the
  // launch, which checks nothing.
  Device resolve_topk(const TensorArg& topk_indices, ResolveResidencyParams* params) const;
  void fill_resolve_params(int64_t row_offset, ResolveResidencyParams* params) const;
  void resolve(const ResolveResidencyParams& params, hs_stream_t stream);
  // hs_index_group_resolve's arguments, checked into a launch.
  ResolveResidencyParams resolve_params(const hs_index_group_resolve_args_t& args) const;

  // The host mirror as the last completed copy_stats_async left it.
  std::array<int64_t, HS_NUM_STATS> read_stats() const;

 private:
  // Frees the device slab and the host mirror with the backend that made them.
  class Memory {
   public:
    Memory(Backend& backend, int device, uint64_t device_bytes);
    ~Memory();
    Memory(const Memory&) = delete;
    Memory& operator=(const Memory&) = delete;
    char* device_base() const { return device_base_; }
    int64_t* host_stats() const { return host_stats_; }
    bool host_registered() const { return host_registered_; }

   private:
    Backend& backend_;
    int device_;
    char* device_base_ = nullptr;
    int64_t* host_stats_ = nullptr;
    bool host_registered_ = false;
  };

  void describe(hs_index_group_tensor_t which, void* data, hs_dtype_t dtype, int32_t device_type, int64_t rows,
                int64_t columns);
  void initialise();
  ResetHotStateParams reset_params() const;

  IndexGroupOptions options_;
  Backend& backend_;
  uint64_t device_bytes_ = 0;
  std::array<uint64_t, kNumTensors> offsets_{};
  std::unique_ptr<Memory> memory_;
  std::array<hs_tensor_t, kNumTensors> tensors_{};
  std::array<std::array<int64_t, 2>, kNumTensors> shapes_{};
  // The CUDA resolver's workspace for every state row (uint8, in the slab),
  // for shapes whose arrays do not fit one block's shared memory; empty
  // (data null) when none is needed or on the CPU.
  uint8_t* workspace_ = nullptr;
  // The automatic schedule's handoff records (CUDA), zeroed once here.
  int32_t* handoff_ = nullptr;
  uint64_t handoff_bytes_ = 0;
};

}  // namespace hisparse
