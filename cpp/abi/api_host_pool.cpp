// C ABI of the host pool and of the host-memory check.
#include "abi/api_guard.hpp"
#include "abi/handles.hpp"
#include "abi/host_pool_handle.hpp"
#include "core/backend.hpp"
#include "core/host_memory.hpp"
#include "core/host_pool.hpp"

using namespace hisparse;

extern "C" {

HS_API hs_status_t hs_available_host_memory(uint64_t* bytes) {
  return api_guard([&] { *require_pointer(bytes, "bytes") = available_host_memory(); });
}

HS_API hs_status_t hs_check_host_memory(uint64_t pool_bytes) {
  return api_guard([&] { check_host_memory(pool_bytes, "pool_bytes"); });
}

HS_API hs_status_t hs_host_pool_create(const hs_host_pool_options_t* options, hs_host_pool_t* pool) {
  return api_guard([&] {
    require_pointer(pool, "pool");
    *pool = nullptr;
    const hs_host_pool_options_t o = read_struct<HS_HOST_POOL_OPTIONS_VERSION>(options, "options");
    if (o.registration < HS_REGISTER_AUTO || o.registration > HS_REGISTER_NEVER) {
      invalid_argument("registration: expected HS_REGISTER_AUTO, _ALWAYS or _NEVER, got ", o.registration);
    }
    if (o.size_bytes == 0) invalid_argument("size_bytes: expected a positive pool size, got 0");
    const bool huge_pages = require_flag(o.huge_pages, "huge_pages");
    if (require_flag(o.check_memory, "check_memory")) check_host_memory(o.size_bytes);
    HostPoolOptions options_cpp;
    options_cpp.size_bytes = o.size_bytes;
    options_cpp.populate_threads = o.populate_threads;
    options_cpp.huge_pages = huge_pages;
    if (o.max_segment_bytes != 0) options_cpp.max_segment_bytes = o.max_segment_bytes;
    options_cpp.registrar = choose_registrar(o.registration, o.device_index, &options_cpp.device);
    *pool = list_pool(new hs_host_pool(options_cpp));
  });
}

HS_API hs_status_t hs_host_pool_release(hs_host_pool_t pool) {
  return api_guard([&] { require_pool(pool).pool.release(); });
}

HS_API hs_status_t hs_host_pool_retire(hs_host_pool_t pool) {
  return api_guard([&] { require_pool(pool).pool.retire(); });
}

HS_API hs_status_t hs_host_pool_destroy(hs_host_pool_t pool) {
  return api_guard([&] {
    if (!take_handle(pool, HandleKind::kHostPool, "pool", "hs_host_pool_t")) return;
    try {
      pool->pool.release();
    } catch (...) {
      delete pool;  // the destructor leaves unreleasable pages to process exit
      throw;
    }
    delete pool;
  });
}

HS_API hs_status_t hs_host_pool_data(hs_host_pool_t pool, void** data) {
  return api_guard([&] {
    require_pointer(data, "data");
    *data = require_pool(pool).pool.data();
  });
}

HS_API hs_status_t hs_host_pool_get_info(hs_host_pool_t pool, hs_host_pool_info_t* info) {
  return api_guard([&] {
    const HostPool& p = require_pool(pool).pool;
    require_struct_size(info, "info");
    hs_host_pool_info_t value{};
    value.released = p.released();
    value.registered = p.registered();
    value.device_index = p.device();
    value.num_segments = static_cast<int32_t>(p.segments().size());
    value.populate_threads = p.populate_threads();
    value.huge_pages = p.huge_pages();
    value.size_bytes = p.size_bytes();
    value.mapped_bytes = p.mapped_bytes();
    value.populate_seconds = p.populate_seconds();
    value.register_seconds = p.register_seconds();
    write_struct<HS_HOST_POOL_INFO_VERSION>(info, value);
  });
}

HS_API hs_status_t hs_host_pool_segment(hs_host_pool_t pool, int32_t index, void** data, uint64_t* bytes) {
  return api_guard([&] {
    const HostPool& p = require_pool(pool).pool;
    require_pointer(data, "data");
    require_pointer(bytes, "bytes");
    const auto& segments = p.segments();
    if (index < 0 || static_cast<size_t>(index) >= segments.size()) {
      invalid_argument("index: expected 0 <= index < ", segments.size(), " (registered segments), got ", index);
    }
    *data = segments[index].data;
    *bytes = segments[index].bytes;
  });
}

}  // extern "C"
