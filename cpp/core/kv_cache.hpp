// The model-level KV cache (hisparse/kv_cache.h): one object that builds the
// host cache, the device slab and tables, and one runtime per layer with its
// index group from a layer -> group map, and runs a forward's steps with its
// own tables: admit/release (per-request reset), begin_forward (lengths and
// the newest pages resident), write, swap_in, read, and counters per group
// and in total.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/backend.hpp"
#include "core/device_memory.hpp"
#include "core/host_pool.hpp"
#include "core/ipc_event.hpp"
#include "core/runtime.hpp"
#include "core/tensor.hpp"
#include "hisparse/kv_cache.h"

namespace hisparse {

struct KvCacheOptions {
  hs_config_t config{};
  int32_t num_layers = 0;
  std::vector<int32_t> layer_groups;  // empty = every layer its own group
  int32_t max_requests = 0;
  int32_t resident_pages = 0;
  int64_t max_seq_len = 0;
  int64_t resident_page_size = 0;  // 0 = hot_block_size
  Device device;
  hs_dtype_t kv_dtype = HS_DTYPE_UINT8;
  int32_t max_swap_rows = 0;
  HostPool* host_pool = nullptr;  // borrowed; null = a private pool of the cache's own
  IpcEvent* host_event = nullptr;  // borrowed, optional
};

// Every size of a cache, derived from (and validating) its options.
struct KvCacheLayout {
  int32_t num_layers = 0;
  int32_t num_groups = 0;
  std::vector<int32_t> group_of;   // [L]
  std::vector<int32_t> leader_of;  // [G]: the first layer of each group
  int32_t max_requests = 0;        // S
  int32_t row_width = 0;           // W
  int64_t row_bytes = 0;
  int64_t block_size = 0;          // host block
  int64_t hot_block_size = 0;
  int32_t hot_blocks = 0;          // per state row: ceil(H / hot_block_size)
  int32_t host_blocks = 0;         // per state row: ceil(max_seq_len / block_size)
  int32_t resident_pages = 0;      // n
  int32_t blocks_per_page = 1;     // m
  int64_t max_seq_len = 0;
  int32_t resident_table_width = 0;  // ceil(max_seq_len / hot_block_size)
  int64_t host_rows = 0;
  int64_t num_blocks = 0;          // slab blocks per layer
  uint64_t host_bytes = 0;
  uint64_t layer_bytes = 0;        // one layer's part of the slab
};
KvCacheLayout kv_cache_layout(const KvCacheOptions& options);

class KvCache {
 public:
  explicit KvCache(const KvCacheOptions& options);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheLayout& layout() const { return layout_; }
  const Device& device() const { return options_.device; }
  uint64_t device_bytes() const { return device_bytes_; }
  int32_t active_requests() const;
  bool is_writer() const { return runtimes_.front()->is_writer(); }
  Runtime& runtime(int32_t layer) const;
  int32_t group_of(int32_t layer) const;
  const hs_tensor_t& tensor(hs_kv_cache_tensor_t which) const;

  int32_t admit(int32_t row, hs_stream_t stream);
  void release(int32_t row, hs_stream_t stream);
  void begin_forward(const hs_tensor_t* seq_lens, hs_stream_t stream);
  void write(int32_t layer, const hs_tensor_t* rows, const hs_tensor_t* req_id_per_token, const hs_tensor_t* positions,
             hs_stream_t stream);
  SwapInResult swap_in(int32_t layer, const hs_kv_cache_swap_in_args_t& args, hs_stream_t stream);
  void read(int32_t layer, const hs_tensor_t* indices, const hs_tensor_t* out, hs_stream_t stream);

  void reset_stats(hs_stream_t stream);
  void copy_stats_async(hs_stream_t stream);
  // One group's counters (group >= 0) or their sum (group = -1).
  RuntimeStats stats(int32_t group) const;

 private:
  void describe(hs_kv_cache_tensor_t which, void* data, hs_dtype_t dtype, int32_t device_type,
                std::initializer_list<int64_t> shape);
  void initialise_tables();
  void bind_runtimes();
  int32_t checked_layer(int32_t layer) const;
  void checked_row(int32_t row) const;
  // The layer's paged view of the slab [num_blocks, hot_block_size, W].
  hs_tensor_t layer_view(int32_t layer, std::array<int64_t, 3>* shape) const;
  void reset_row(int32_t row, hs_stream_t stream);
  // A new request's ring slots hold no page (-1): none of its pages is
  // resident before it claims a slot.
  void clear_ring_pages(int32_t row, hs_stream_t stream);
  // Throws naming `range` when it shares a byte with memory the cache owns
  // (slab and tables, host cache, its groups' state) while `written`.
  void check_apart_from_own_memory(const ByteRange& range, bool written) const;

  KvCacheOptions options_;
  KvCacheLayout layout_;
  Backend& backend_;
  // A borrowed pool's claim (HostPool::claim_for_host_cache), given back when
  // the cache is destroyed or its construction fails after taking it.
  struct PoolClaim {
    HostPool* pool = nullptr;
    PoolClaim() = default;
    PoolClaim(const PoolClaim&) = delete;
    PoolClaim& operator=(const PoolClaim&) = delete;
    ~PoolClaim() {
      if (pool != nullptr) pool->release_host_cache_claim();
    }
  };

  std::unique_ptr<HostPool> owned_pool_;
  HostPool* pool_ = nullptr;
  PoolClaim pool_claim_;
  uint64_t device_bytes_ = 0;
  std::array<uint64_t, HS_KV_CACHE_NUM_TENSORS> offsets_{};
  std::unique_ptr<DeviceBuffer> memory_;  // the slab and the tables
  std::array<hs_tensor_t, HS_KV_CACHE_NUM_TENSORS> tensors_{};
  std::array<std::array<int64_t, 4>, HS_KV_CACHE_NUM_TENSORS> shapes_{};
  std::vector<std::unique_ptr<Runtime>> runtimes_;
  std::vector<bool> active_;
};

}  // namespace hisparse
