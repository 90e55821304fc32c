// The shared host pool from Python: ids as bytes, this rank's pool handle
// (wrapped by hisparse._C.HostPool.shared), the sharing facts of any pool, and
// the backends' support.
#include <nanobind/stl/string.h>

#include <cstring>
#include <string>

#include "bindings.hpp"

namespace hisparse_py {

hs_host_pool_t create_shared_host_pool(const PyBytes& id, const PyInt& rank_arg, const PyInt& nranks_arg,
                                       const SharedPoolArgs& args) {
  const std::string bytes = bytes_arg(id, "pool_id", HS_SHARED_POOL_ID_BYTES);
  const int32_t rank = int32_arg(rank_arg, "rank");
  const int32_t nranks = int32_arg(nranks_arg, "nranks");
  hs_shared_pool_id_t pool_id;
  std::memcpy(pool_id.internal, bytes.data(), HS_SHARED_POOL_ID_BYTES);
  hs_shared_host_pool_options_t options;
  hs_shared_host_pool_options_init(&options);
  options.size_bytes = args.size_bytes;
  options.writer_rank = args.writer_rank;
  options.populate_threads = args.populate_threads;
  options.registration = args.registration;
  options.device_index = args.device;
  options.huge_pages = args.huge_pages ? 1 : 0;
  options.check_memory = args.check_memory ? 1 : 0;
  options.max_segment_bytes = args.max_segment_bytes;
  options.timeout_seconds = args.timeout_seconds;
  hs_host_pool_t pool = nullptr;
  hs_status_t status;
  {
    nb::gil_scoped_release release;  // waits for the other ranks, populates, registers
    status = hs_shared_host_pool_create(&pool_id, rank, nranks, &options, &pool);
  }
  check(status);
  return pool;
}

void add_shared_pool_info(nb::dict& out, hs_host_pool_t pool) {
  hs_shared_host_pool_info_t info{};
  info.struct_size = sizeof(info);
  check(hs_shared_host_pool_get_info(pool, &info));
  out["shared"] = info.shared != 0;
  out["rank"] = info.rank;
  out["ranks"] = info.nranks;
  out["writer_rank"] = info.writer_rank;
  out["is_writer"] = info.is_writer != 0;
  out["share_offset"] = info.share_offset;
  out["share_bytes"] = info.share_bytes;
  out["wait_seconds"] = info.wait_seconds;
  out["ready_seconds"] = info.ready_seconds;
}

void register_shared_host_pool(nb::module_& m) {
  m.def("shared_pool_id", [] {
    hs_shared_pool_id_t id;
    check(hs_shared_pool_id_create(&id));
    return nb::bytes(id.internal, HS_SHARED_POOL_ID_BYTES);
  });
  m.def(
      "supports_shared_host_pool",
      [](const PyInt& device_type) {
        int32_t supported = 0;
        check(hs_supports_shared_host_pool(int32_arg(device_type, "device_type"), &supported));
        return supported != 0;
      },
      nb::arg("device_type"));
  m.attr("SHARED_POOL_ID_BYTES") = HS_SHARED_POOL_ID_BYTES;
  m.attr("SHARED_POOL_MAX_RANKS") = HS_SHARED_POOL_MAX_RANKS;
  m.attr("SHARED_POOL_DEFAULT_TIMEOUT_SECONDS") = HS_SHARED_POOL_DEFAULT_TIMEOUT_SECONDS;
}

}  // namespace hisparse_py
