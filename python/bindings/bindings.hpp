// Shared helpers of the nanobind layer: C status -> Python exception, views
// of memory the library owns, and the registration functions of each binding
// file (arguments.hpp converts what Python passes in).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <memory>

#include "arguments.hpp"
#include "hisparse/hisparse.h"

namespace hisparse_py {

namespace nb = nanobind;

// Raises the Python exception matching `status` with hs_last_error():
// ValueError for bad values, TypeError for bad dtypes, MemoryError for failed
// allocations, RuntimeError for the rest.
void check(hs_status_t status);

// A zero-copy DLPack array over a contiguous tensor the library owns (an
// index group's), kept alive by `owner` (a capsule holding the C++ state
// that owns the memory, never a nanobind instance: a view that outlives the
// interpreter's teardown then leaks a few bytes instead of an instance that
// nanobind would report as a reference leak). The array-API object (__dlpack__,
// __dlpack_device__) lets torch.from_dlpack and numpy.from_dlpack both take
// it, and neither is needed to build it. Page-locked host memory is ordinary
// CPU memory to an array library.
nb::ndarray<nb::array_api> owned_view(const hs_tensor_t& tensor, nb::handle owner);

// An hs_config_t of the given fields (hisparse.Config's), the rest as
// hs_config_init leaves them.
hs_config_t make_config(const PyInt& top_k, const PyInt& device_buffer_size, const PyInt& max_union_rows,
                        const PyInt& num_speculative_tokens, const PyInt& row_bytes, const PyInt& block_size,
                        const PyInt& hot_block_size, const PyBool& eager_host_mirror);

// A capsule that holds a copy of `state` (a shared_ptr): the owner of views.
template <typename State>
nb::capsule state_owner(const std::shared_ptr<State>& state) {
  return nb::capsule(new std::shared_ptr<State>(state),
                     [](void* p) noexcept { delete static_cast<std::shared_ptr<State>*>(p); });
}

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
hs_host_pool_t create_shared_host_pool(const PyBytes& id, const PyInt& rank, const PyInt& nranks,
                                       const SharedPoolArgs& args);
// The sharing facts of any pool, as HostPool.info() reports them.
void add_shared_pool_info(nb::dict& out, hs_host_pool_t pool);

// Borrows of library objects by other objects (a KV cache of its host pool,
// a runtime of its host event), for as long as the returned owner lives:
// `value` is the hisparse._C.HostPool / hisparse._C.IpcEvent argument `name`
// (None: no borrow, a null owner and *handle NULL; anything else a TypeError
// naming it). A pool's borrow counts as one of its views, so the pool stays
// mapped and refuses a plain release while it lives; an event's keeps the
// event alive. The owners hold C++ state only, never a nanobind instance.
std::shared_ptr<void> borrow_host_pool(nb::handle value, const char* name, hs_host_pool_t* handle);
std::shared_ptr<void> borrow_ipc_event(nb::handle value, const char* name, hs_ipc_event_t* handle);

}  // namespace hisparse_py
