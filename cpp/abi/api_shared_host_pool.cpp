// C ABI of the shared host pool: the id, the collective create (the result is
// an ordinary hs_host_pool_t) and the sharing facts of any pool.
#include <memory>

#include "abi/api_guard.hpp"
#include "abi/host_pool_handle.hpp"
#include "core/backend.hpp"
#include "core/shared_host_pool.hpp"
#include "hisparse/shared_host_pool.h"

using namespace hisparse;

extern "C" {

HS_API hs_status_t hs_supports_shared_host_pool(int32_t device_type, int32_t* supported) {
  return api_guard([&] {
    require_pointer(supported, "supported");
    if (device_type != HS_DEVICE_CPU && device_type != HS_DEVICE_CUDA) {
      invalid_argument("device_type: expected HS_DEVICE_CPU (", HS_DEVICE_CPU, ") or HS_DEVICE_CUDA (", HS_DEVICE_CUDA,
                       "), got ", device_type);
    }
    const Backend* backend = device_type == HS_DEVICE_CPU ? &cpu_backend() : cuda_backend();
    *supported = backend != nullptr && backend->supports_shared_host_pool() ? 1 : 0;
  });
}

HS_API hs_status_t hs_shared_pool_id_create(hs_shared_pool_id_t* id) {
  return api_guard([&] { *require_pointer(id, "id") = SharedPoolId::create().encode(); });
}

HS_API hs_status_t hs_shared_host_pool_create(const hs_shared_pool_id_t* id, int32_t rank, int32_t nranks,
                                              const hs_shared_host_pool_options_t* options, hs_host_pool_t* pool) {
  return api_guard([&] {
    require_pointer(pool, "pool");
    *pool = nullptr;
    const hs_shared_host_pool_options_t o = read_struct<HS_SHARED_HOST_POOL_OPTIONS_VERSION>(options, "options");
    SharedHostPoolOptions options_cpp;
    options_cpp.id = SharedPoolId::decode(*require_pointer(id, "id"));
    options_cpp.rank = rank;
    options_cpp.nranks = nranks;
    options_cpp.writer_rank = o.writer_rank;
    options_cpp.size_bytes = o.size_bytes;
    options_cpp.populate_threads = o.populate_threads;
    options_cpp.huge_pages = require_flag(o.huge_pages, "huge_pages");
    if (o.max_segment_bytes != 0) options_cpp.max_segment_bytes = o.max_segment_bytes;
    if (o.timeout_seconds != 0) options_cpp.timeout_seconds = o.timeout_seconds;
    options_cpp.check_memory = require_flag(o.check_memory, "check_memory");
    options_cpp.registrar = choose_registrar(o.registration, o.device_index, &options_cpp.device);
    *pool = list_pool(new hs_host_pool(std::make_unique<SharedHostPool>(options_cpp)));
  });
}

HS_API hs_status_t hs_shared_host_pool_get_info(hs_host_pool_t pool, hs_shared_host_pool_info_t* info) {
  return api_guard([&] {
    const HostPool& p = require_pool(pool).pool;
    require_struct_size(info, "info");
    hs_shared_host_pool_info_t value{};
    value.populate_seconds = p.populate_seconds();
    value.register_seconds = p.register_seconds();
    if (const auto* shared = dynamic_cast<const SharedHostPool*>(&p)) {
      value.shared = 1;
      value.rank = shared->role().rank;
      value.nranks = shared->role().nranks;
      value.writer_rank = shared->role().writer_rank;
      value.share_offset = shared->share_offset();
      value.share_bytes = shared->share_bytes();
      value.wait_seconds = shared->wait_seconds();
      value.ready_seconds = shared->ready_seconds();
    } else {
      value.nranks = 1;
      value.share_bytes = p.mapped_bytes();
      value.ready_seconds = p.populate_seconds() + p.register_seconds();
    }
    value.is_writer = value.rank == value.writer_rank;
    write_struct<HS_SHARED_HOST_POOL_INFO_VERSION>(info, value);
  });
}

}  // extern "C"
