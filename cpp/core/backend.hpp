// The backend interface (the seed's HiSparseBackend): everything the core
// needs from a device. The CPU backend is a complete reference that runs
// where there is no GPU; the CUDA backend is compiled when nvcc is present.
// Host-memory registration goes through here so the host pool's logic is
// testable with a recording backend and no GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/data_movement_params.hpp"
#include "core/index_group_params.hpp"
#include "core/kv_params.hpp"
#include "core/resolve_residency_params.hpp"
#include "core/staging_params.hpp"
#include "core/tensor.hpp"
#include "hisparse/hisparse.h"

namespace hisparse {

struct DeviceProperties {
  std::string name;
  int major = 0;
  int minor = 0;
  int multiprocessor_count = 0;
  bool unified_addressing = false;
  bool can_map_host_memory = false;
  uint64_t total_global_memory = 0;
  uint64_t l2_cache_bytes = 0;
  uint64_t max_shared_memory_per_block = 0;  // opt-in maximum
};

using Event = void*;

// A backend's own interprocess event handle (a cudaIpcEventHandle_t).
struct IpcEventPayload {
  unsigned char bytes[64];
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const char* name() const = 0;
  // Usable on this machine now (driver and at least one device for CUDA).
  virtual bool available() const = 0;
  virtual std::string unavailable_reason() const = 0;
  // Throws HS_ERROR_UNSUPPORTED with unavailable_reason() when not available.
  void check_available() const;

  virtual int device_count() const = 0;
  virtual int current_device() const = 0;
  virtual DeviceProperties device_properties(int device) const = 0;

  // Memory owned by the backend (device memory for CUDA, host for CPU).
  virtual void* allocate(size_t bytes, int device) = 0;
  virtual void deallocate(void* pointer, int device) noexcept = 0;
  // Stream-ordered copy between any two addresses the backend can reach.
  virtual void copy_async(void* dst, const void* src, size_t bytes, hs_stream_t stream) = 0;
  virtual void fill_async(void* dst, int byte_value, size_t bytes, hs_stream_t stream) = 0;

  // Throws HS_ERROR_INVALID_ARGUMENT naming `name` unless kernels of
  // `device` can read and write [pointer, pointer + bytes): a device
  // allocation or registered/pinned host memory. A kernel touching anything
  // else would kill the CUDA context, so every host pointer is checked first.
  virtual void check_accessible(const void* pointer, size_t bytes, int device, const char* name) const = 0;

  // Page-locking of host memory for zero-copy device reads.
  virtual bool can_register_host_memory() const = 0;
  virtual void register_host_memory(void* pointer, size_t bytes, int device) = 0;
  virtual void unregister_host_memory(void* pointer, int device) = 0;

  // Streams and events; the CPU backend runs everything synchronously, so
  // its streams and events are null handles and waits are no-ops.
  virtual hs_stream_t create_stream(int device) = 0;
  virtual void destroy_stream(hs_stream_t stream, int device) noexcept = 0;
  virtual Event create_event(int device) = 0;
  virtual void destroy_event(Event event, int device) noexcept = 0;
  virtual void record_event(Event event, hs_stream_t stream) = 0;
  virtual void stream_wait_event(hs_stream_t stream, Event event) = 0;
  virtual void synchronize_stream(hs_stream_t stream) = 0;

  // Kernels: raw pointers and sizes, already validated by the host glue.
  virtual void copy_bytes(void* dst, const void* src, size_t bytes, int device, hs_stream_t stream) = 0;
  virtual void resolve_residency(const ResolveResidencyParams& params, hs_stream_t stream) = 0;

  // Index-group kernels (index_group.hpp). Not pure, so test doubles of the
  // backend that never run them need not implement them; the CPU and CUDA
  // backends override both.
  virtual void reset_hot_state(const ResetHotStateParams& /*params*/, hs_stream_t /*stream*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend does not implement reset_hot_state");
  }
  virtual void invalidate_sorted_slots(const InvalidateSortedSlotsParams& /*params*/, hs_stream_t /*stream*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend does not implement invalidate_sorted_slots");
  }

  // Data-movement kernels (data_movement_params.hpp). Not pure, for the same
  // reason; the CPU and CUDA backends override all of them.
  virtual void gather_compact(const GatherCompactParams& /*params*/, hs_stream_t /*stream*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend does not implement gather_compact");
  }
  virtual void gather_plan(const GatherPlanParams& /*params*/, hs_stream_t /*stream*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend does not implement gather_plan");
  }
  virtual void invalidate_written_slots(const InvalidateSlotsParams& /*params*/, hs_stream_t /*stream*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend does not implement invalidate_written_slots");
  }
  virtual void mirror_rows(const MirrorRowsParams& /*params*/, hs_stream_t /*stream*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend does not implement mirror_rows");
  }
  virtual void swap_blocks_batch(const SwapBlocksParams& /*params*/, hs_stream_t /*stream*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend does not implement swap_blocks_batch");
  }
  virtual void warm_host_pages(const WarmHostPagesParams& /*params*/, hs_stream_t /*stream*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend does not implement warm_host_pages");
  }
  // Prefill-staging kernels (staging_params.hpp). Not pure, for the same
  // reason; the CPU and CUDA backends override all of them.
  // Scratch bytes staging_remap needs over `count` entries on `device`.
  virtual size_t staging_remap_workspace_bytes(int64_t /*count*/, int /*device*/) const {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend does not implement staging_remap");
  }
  virtual void staging_remap(const StagingRemapParams& /*params*/, hs_stream_t /*stream*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend does not implement staging_remap");
  }
  virtual void build_staging_plan(const StagingBuildParams& /*params*/, hs_stream_t /*stream*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend does not implement build_staging_plan");
  }
  virtual void staging_gpu_sources(const StagingGpuSourcesParams& /*params*/, hs_stream_t /*stream*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend does not implement staging_gpu_sources");
  }
  virtual void gather_resident_rows(const GatherResidentRowsParams& /*params*/, hs_stream_t /*stream*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend does not implement gather_resident_rows");
  }

  // KV-cache kernels (kv_params.hpp). Not pure, for the same reason; the
  // CPU and CUDA backends override all of them.
  virtual void reset_request(const ResetRequestParams& /*params*/, hs_stream_t /*stream*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend does not implement reset_request");
  }
  virtual void prepare_topk(const PrepareTopkParams& /*params*/, hs_stream_t /*stream*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend does not implement prepare_topk");
  }
  virtual void write_rows(const WriteRowsParams& /*params*/, hs_stream_t /*stream*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend does not implement write_rows");
  }
  virtual void read_rows(const ReadRowsParams& /*params*/, hs_stream_t /*stream*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend does not implement read_rows");
  }
  virtual void build_residency_hint(const ResidencyHintParams& /*params*/, hs_stream_t /*stream*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend does not implement build_residency_hint");
  }
  virtual void update_residency(const ResidencyParams& /*params*/, hs_stream_t /*stream*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend does not implement update_residency");
  }

  // Shared host pools and interprocess events (the seed's
  // supports_shared_host_pool, create_ipc_event, export_event and
  // import_event; hisparse/shared_host_pool.h states the contract). Not pure,
  // so test doubles need not implement them; the CPU and CUDA backends
  // override all of them. Interprocess events are freed with destroy_event.
  virtual bool supports_shared_host_pool() const { return false; }
  virtual Event create_ipc_event(int /*device*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend has no interprocess events");
  }
  virtual IpcEventPayload export_ipc_event(Event /*event*/, int /*device*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend cannot export interprocess events");
  }
  virtual Event import_ipc_event(const IpcEventPayload& /*payload*/, int /*device*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend cannot import interprocess events");
  }
  // Stream-ordered and capturable, unlike record_event / stream_wait_event:
  // under capture they become event nodes that other processes observe.
  virtual void record_ipc_event(Event /*event*/, int /*device*/, hs_stream_t /*stream*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend cannot record interprocess events");
  }
  virtual void wait_ipc_event(Event /*event*/, int /*device*/, hs_stream_t /*stream*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend cannot wait on interprocess events");
  }
  virtual void synchronize_ipc_event(Event /*event*/, int /*device*/) {
    fail(HS_ERROR_UNSUPPORTED, "the ", name(), " backend cannot synchronize interprocess events");
  }

  // True when `pointer` is device memory of this backend's devices, which a
  // host loop must never dereference (raw addresses given to the CPU backend).
  virtual bool is_device_memory(const void* /*pointer*/) const { return false; }
};

// The CPU backend (always present).
Backend& cpu_backend();
// The CUDA backend, or nullptr when it was not compiled in.
Backend* cuda_backend();
// The backend that runs kernels on `device`; throws HS_ERROR_UNSUPPORTED when
// CUDA tensors arrive without a usable CUDA backend, and
// HS_ERROR_INVALID_ARGUMENT for a device that does not exist; errors name
// `name`, the argument that put the call on that device.
Backend& backend_for(const Device& device, const char* name);

}  // namespace hisparse
