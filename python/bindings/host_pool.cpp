// hisparse._C.HostPool: owns an hs_host_pool_t and hands out zero-copy NumPy
// views whose owners count themselves, so that no view ever shows unmapped
// memory: release() refuses while views live, and release(force=True)
// releases the pool for hisparse at once (hs_host_pool_retire: new views and
// every hisparse call given its memory are refused) but unmaps it only when
// the last view is gone.
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.hpp"

namespace hisparse_py {
namespace {

// The pool itself, shared by the Python object and every view's owner: the
// memory stays mapped while either is alive. Views hold this, not the Python
// object, so a tensor that outlives the interpreter's teardown (torch keeps
// some until the very end) leaks a few C++ bytes instead of a nanobind
// instance, which nanobind would report as a reference leak at exit.
struct PoolState {
  hs_host_pool_t handle = nullptr;
  int live_views = 0;             // changed with the GIL held
  bool unmap_with_last_view = false;  // retired by a forced release while views lived
  ~PoolState() { hs_host_pool_destroy(handle); }
  // The last view of a force-released pool is gone: unregister and unmap now.
  void view_dropped() noexcept {
    if (--live_views == 0 && unmap_with_last_view) hs_host_pool_release(handle);
  }
};

class HostPool {
 public:
  HostPool(const PyInt& size_bytes, const PyInt& populate_threads, const PyInt& registration, const PyInt& device,
           const PyBool& huge_pages, const PyBool& check_memory, const PyInt& max_segment_bytes)
      : state_(std::make_shared<PoolState>()) {
    hs_host_pool_options_t options;
    hs_host_pool_options_init(&options);
    options.size_bytes = uint64_arg(size_bytes, "size_bytes");
    options.populate_threads = int32_arg(populate_threads, "populate_threads");
    options.registration = int32_arg(registration, "registration");
    options.device_index = int32_arg(device, "device");
    options.huge_pages = bool_arg(huge_pages, "huge_pages") ? 1 : 0;
    options.check_memory = bool_arg(check_memory, "check_memory") ? 1 : 0;
    options.max_segment_bytes = uint64_arg(max_segment_bytes, "max_segment_bytes");
    hs_status_t status;
    {
      nb::gil_scoped_release release;  // populating a large pool takes seconds
      status = hs_host_pool_create(&options, &state_->handle);
    }
    check(status);
  }

  // This rank's view of a shared pool: the same object as a private pool.
  static HostPool shared(const PyBytes& id, const PyInt& rank, const PyInt& nranks, const SharedPoolArgs& args) {
    return HostPool(create_shared_host_pool(id, rank, nranks, args));
  }

  void release(const PyBool& force_arg) {
    const bool force = bool_arg(force_arg, "force");
    if (state_->unmap_with_last_view) return;  // released already; the last view unmaps it
    if (state_->live_views > 0) {
      if (!force) {
        throw std::runtime_error("HostPool.release(): " + std::to_string(state_->live_views) +
                                 " tensor view(s) of the pool (or KV caches holding their host cache in it) are "
                                 "still alive; delete them before releasing "
                                 "(or pass force=True: the pool is then released at once and unmapped when the last "
                                 "view is gone)");
      }
      check(hs_host_pool_retire(state_->handle));
      state_->unmap_with_last_view = true;
      return;
    }
    hs_status_t status;
    {
      nb::gil_scoped_release release;
      status = hs_host_pool_release(state_->handle);
    }
    check(status);
  }

  uintptr_t data_ptr() const {
    void* data = nullptr;
    check(hs_host_pool_data(state_->handle, &data));
    return reinterpret_cast<uintptr_t>(data);
  }

  nb::dict info() const {
    hs_host_pool_info_t info{};
    info.struct_size = sizeof(info);
    check(hs_host_pool_get_info(state_->handle, &info));
    nb::dict out;
    out["size_bytes"] = info.size_bytes;
    out["mapped_bytes"] = info.mapped_bytes;
    out["released"] = info.released != 0;
    out["registered"] = info.registered != 0;
    out["device"] = info.device_index;
    out["num_segments"] = info.num_segments;
    out["populate_threads"] = info.populate_threads;
    out["huge_pages"] = info.huge_pages != 0;
    out["populate_seconds"] = info.populate_seconds;
    out["register_seconds"] = info.register_seconds;
    add_shared_pool_info(out, state_->handle);
    return out;
  }

  std::vector<std::tuple<uintptr_t, uint64_t>> segments() const {
    hs_host_pool_info_t info{};
    info.struct_size = sizeof(info);
    check(hs_host_pool_get_info(state_->handle, &info));
    std::vector<std::tuple<uintptr_t, uint64_t>> out;
    for (int32_t i = 0; i < info.num_segments; ++i) {
      void* data = nullptr;
      uint64_t bytes = 0;
      check(hs_host_pool_segment(state_->handle, i, &data, &bytes));
      out.emplace_back(reinterpret_cast<uintptr_t>(data), bytes);
    }
    return out;
  }

  // A uint8 NumPy array over [offset, offset + nbytes) that keeps the pool
  // mapped and counted as viewed until the array is gone.
  nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>> view_bytes(const PyInt& offset_arg, const PyInt& nbytes_arg) {
    const uint64_t offset = uint64_arg(offset_arg, "offset");
    const uint64_t nbytes = uint64_arg(nbytes_arg, "nbytes");
    hs_host_pool_info_t info{};
    info.struct_size = sizeof(info);
    check(hs_host_pool_get_info(state_->handle, &info));
    if (offset > info.size_bytes || nbytes > info.size_bytes - offset) {
      throw nb::value_error(("offset/nbytes: the view [" + std::to_string(offset) + ", " +
                             std::to_string(offset + nbytes) + ") exceeds the pool's " +
                             std::to_string(info.size_bytes) + " bytes")
                                .c_str());
    }
    auto* base = reinterpret_cast<uint8_t*>(data_ptr());
    auto* owner_state = new std::shared_ptr<PoolState>(state_);
    ++state_->live_views;
    nb::capsule owner(owner_state, [](void* p) noexcept {
      auto* state = static_cast<std::shared_ptr<PoolState>*>(p);
      (*state)->view_dropped();
      delete state;
    });
    const size_t shape[1] = {static_cast<size_t>(nbytes)};
    return nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(base + offset, 1, shape, owner);
  }

  int live_views() const { return state_->live_views; }
  // The hs_host_pool_t, for C calls that borrow the pool (the KV cache).
  uintptr_t handle() const { return reinterpret_cast<uintptr_t>(state_->handle); }
  const std::shared_ptr<PoolState>& state() const { return state_; }

 private:
  explicit HostPool(hs_host_pool_t handle) : state_(std::make_shared<PoolState>()) { state_->handle = handle; }

  std::shared_ptr<PoolState> state_;
};

}  // namespace

std::shared_ptr<void> borrow_host_pool(nb::handle value, const char* name, hs_host_pool_t* handle) {
  *handle = nullptr;
  const HostPool* pool = object_arg<HostPool>(value, name, "a hisparse._C.HostPool", true);
  if (pool == nullptr) return nullptr;
  std::shared_ptr<PoolState> state = pool->state();
  *handle = state->handle;
  ++state->live_views;
  return std::shared_ptr<void>(state.get(), [state](void*) mutable noexcept { state->view_dropped(); });
}

void register_host_pool(nb::module_& m) {
  nb::class_<HostPool>(m, "HostPool")
      .def(nb::init<const PyInt&, const PyInt&, const PyInt&, const PyInt&, const PyBool&, const PyBool&,
                    const PyInt&>(),
           nb::arg("size_bytes"), nb::arg("populate_threads") = 0, nb::arg("registration") = 0, nb::arg("device") = -1,
           nb::arg("huge_pages") = true, nb::arg("check_memory") = true, nb::arg("max_segment_bytes") = 0)
      .def("release", &HostPool::release, nb::arg("force") = false)
      .def_prop_ro("data_ptr", &HostPool::data_ptr)
      .def("info", &HostPool::info)
      .def("segments", &HostPool::segments)
      .def("view_bytes", &HostPool::view_bytes, nb::arg("offset"), nb::arg("nbytes"))
      .def_prop_ro("live_views", &HostPool::live_views)
      .def_prop_ro("handle", &HostPool::handle)
      .def_static(
          "shared",
          [](const PyBytes& id, const PyInt& rank, const PyInt& nranks, const PyInt& size_bytes,
             const PyInt& writer_rank, const PyInt& populate_threads, const PyInt& registration, const PyInt& device,
             const PyBool& huge_pages, const PyBool& check_memory, const PyInt& max_segment_bytes,
             const PyFloat& timeout_seconds) {
            SharedPoolArgs args;
            args.size_bytes = uint64_arg(size_bytes, "size_bytes");
            args.writer_rank = int32_arg(writer_rank, "writer_rank");
            args.populate_threads = int32_arg(populate_threads, "populate_threads");
            args.registration = int32_arg(registration, "registration");
            args.device = int32_arg(device, "device");
            args.huge_pages = bool_arg(huge_pages, "huge_pages");
            args.check_memory = bool_arg(check_memory, "check_memory");
            args.max_segment_bytes = uint64_arg(max_segment_bytes, "max_segment_bytes");
            args.timeout_seconds = float_arg(timeout_seconds, "timeout_seconds");
            return HostPool::shared(id, rank, nranks, args);
          },
          nb::arg("id"), nb::arg("rank"), nb::arg("nranks"), nb::arg("size_bytes"), nb::arg("writer_rank") = 0,
          nb::arg("populate_threads") = 0, nb::arg("registration") = 0, nb::arg("device") = -1,
          nb::arg("huge_pages") = true, nb::arg("check_memory") = true, nb::arg("max_segment_bytes") = 0,
          nb::arg("timeout_seconds") = HS_SHARED_POOL_DEFAULT_TIMEOUT_SECONDS);
  m.attr("REGISTER_AUTO") = static_cast<int>(HS_REGISTER_AUTO);
  m.attr("REGISTER_ALWAYS") = static_cast<int>(HS_REGISTER_ALWAYS);
  m.attr("REGISTER_NEVER") = static_cast<int>(HS_REGISTER_NEVER);
}

}  // namespace hisparse_py
