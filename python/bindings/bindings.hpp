// Shared helpers of the nanobind layer: C status -> Python exception, DLPack
// array -> hs_tensor_t, and the registration functions of each binding file.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "hisparse/hisparse.h"

namespace hisparse_py {

namespace nb = nanobind;

// Raises the Python exception matching `status` with hs_last_error():
// ValueError for bad values, TypeError for bad dtypes, MemoryError for failed
// allocations, RuntimeError for the rest.
void check(hs_status_t status);

// A descriptor of a DLPack array, valid while the array is alive.
class TensorDesc {
 public:
  explicit TensorDesc(const nb::ndarray<>& array, const char* name);
  const hs_tensor_t* get() const { return &tensor_; }

 private:
  std::array<int64_t, HS_MAX_DIMS> shape_{};
  std::array<int64_t, HS_MAX_DIMS> strides_{};
  hs_tensor_t tensor_{};
};

// Descriptor of an optional array (nullptr when absent).
class OptionalTensorDesc {
 public:
  OptionalTensorDesc(const std::optional<nb::ndarray<>>& array, const char* name) {
    if (array) desc_.emplace(*array, name);
  }
  const hs_tensor_t* get() const { return desc_ ? desc_->get() : nullptr; }

 private:
  std::optional<TensorDesc> desc_;
};

// Descriptors of a list of arrays, element i named `<name>[i]` in errors,
// with the pointer array the C ABI takes.
class TensorDescList {
 public:
  TensorDescList(const std::vector<nb::ndarray<>>& arrays, const char* name);
  const hs_tensor_t* const* data() const { return pointers_.data(); }
  int32_t size() const { return static_cast<int32_t>(std::min<size_t>(pointers_.size(), INT32_MAX)); }

 private:
  std::vector<TensorDesc> descs_;
  std::vector<const hs_tensor_t*> pointers_;
};

inline hs_stream_t as_stream(uintptr_t stream) { return reinterpret_cast<hs_stream_t>(stream); }

// A zero-copy DLPack array over a contiguous tensor the library owns (an
// index group's), kept alive by `owner`. The array-API object (__dlpack__,
// __dlpack_device__) lets torch.from_dlpack and numpy.from_dlpack both take
// it, and neither is needed to build it. Page-locked host memory is ordinary
// CPU memory to an array library.
nb::ndarray<nb::array_api> owned_view(const hs_tensor_t& tensor, nb::handle owner);

// An hs_config_t of the given fields (hisparse.Config's), the rest as
// hs_config_init leaves them.
hs_config_t make_config(int32_t top_k, int32_t device_buffer_size, int32_t max_union_rows,
                        int32_t num_speculative_tokens, int32_t row_bytes, int32_t block_size, int32_t hot_block_size,
                        bool eager_host_mirror);

// A runtime's (or a KV cache's) counters as hisparse's stats dict.
nb::dict runtime_stats_dict(const hs_runtime_stats_t& stats);

void register_core(nb::module_& m);
void register_host_pool(nb::module_& m);
void register_ops(nb::module_& m);
void register_index_group(nb::module_& m);
void register_data_movement(nb::module_& m);
void register_runtime(nb::module_& m);
void register_staging(nb::module_& m);
void register_shared_host_pool(nb::module_& m);
void register_ipc_event(nb::module_& m);
void register_kv_cache(nb::module_& m);

// The options of a shared host pool that HostPool.shared takes.
struct SharedPoolArgs {
  uint64_t size_bytes = 0;
  int writer_rank = 0;
  int populate_threads = 0;
  int registration = HS_REGISTER_AUTO;
  int device = -1;
  bool huge_pages = true;
  bool check_memory = true;
  uint64_t max_segment_bytes = 0;
  double timeout_seconds = HS_SHARED_POOL_DEFAULT_TIMEOUT_SECONDS;
};
// This rank's handle of the shared pool of `id` (the GIL is released while
// it waits for the other ranks).
hs_host_pool_t create_shared_host_pool(const nb::bytes& id, int rank, int nranks, const SharedPoolArgs& args);
// The sharing facts of any pool, as HostPool.info() reports them.
void add_shared_pool_info(nb::dict& out, hs_host_pool_t pool);

}  // namespace hisparse_py
