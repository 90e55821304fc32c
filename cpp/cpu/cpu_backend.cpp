// The CPU backend: host memory, synchronous "streams", and the reference
// kernels. It is what runs in CI and on laptops, so it is complete.
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/backend.hpp"
#include "cpu/data_movement_reference.hpp"
#include "cpu/index_group_reference.hpp"
#include "cpu/kv_reference.hpp"
#include "cpu/resolve_residency_reference.hpp"
#include "cpu/staging_reference.hpp"

namespace hisparse {
namespace {

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  bool available() const override { return true; }
  std::string unavailable_reason() const override { return ""; }

  int device_count() const override { return 1; }
  int current_device() const override { return 0; }
  DeviceProperties device_properties(int) const override {
    DeviceProperties props;
    props.name = "host CPU";
    props.unified_addressing = true;
    props.can_map_host_memory = true;
    return props;
  }

  void* allocate(size_t bytes, int) override {
    // 64-byte alignment keeps 16-byte row loads aligned, as on the GPU.
    void* pointer = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (pointer == nullptr && bytes > 0) throw std::bad_alloc();
    return pointer;
  }
  void deallocate(void* pointer, int) noexcept override { std::free(pointer); }
  void copy_async(void* dst, const void* src, size_t bytes, hs_stream_t) override {
    if (bytes > 0) std::memmove(dst, src, bytes);
  }
  void fill_async(void* dst, int byte_value, size_t bytes, hs_stream_t) override {
    if (bytes > 0) std::memset(dst, byte_value, bytes);
  }

  void check_accessible(const void*, size_t, int, const char*) const override {}

  bool can_register_host_memory() const override { return false; }
  void register_host_memory(void*, size_t, int) override {
    fail(HS_ERROR_UNSUPPORTED, "the cpu backend cannot register host memory with a GPU");
  }
  void unregister_host_memory(void*, int) override {
    fail(HS_ERROR_UNSUPPORTED, "the cpu backend cannot unregister host memory");
  }

  hs_stream_t create_stream(int) override { return nullptr; }
  void destroy_stream(hs_stream_t, int) noexcept override {}
  Event create_event(int) override { return nullptr; }
  void destroy_event(Event, int) noexcept override {}
  void record_event(Event, hs_stream_t) override {}
  void stream_wait_event(hs_stream_t, Event) override {}
  void synchronize_stream(hs_stream_t) override {}

  // Every CPU call completes before it returns, so an event's record comes
  // after the work it would capture: waits and synchronisation are exact
  // no-ops, and the event needs no state beyond its handle's identity (which
  // the core keeps).
  bool supports_shared_host_pool() const override { return true; }
  Event create_ipc_event(int) override { return nullptr; }
  IpcEventPayload export_ipc_event(Event, int) override { return IpcEventPayload{}; }
  Event import_ipc_event(const IpcEventPayload&, int) override { return nullptr; }
  void record_ipc_event(Event, int, hs_stream_t) override {}
  void wait_ipc_event(Event, int, hs_stream_t) override {}
  void synchronize_ipc_event(Event, int) override {}

  void copy_bytes(void* dst, const void* src, size_t bytes, int, hs_stream_t) override {
    if (bytes > 0) std::memmove(dst, src, bytes);
  }
  void resolve_residency(const ResolveResidencyParams& params, hs_stream_t) override {
    resolve_residency_reference(params);
    // The fused gather's contract is gather_compact run right after the
    // resolve; on a synchronous backend that is literally what it is.
    if (params.fused_gather) gather_compact_reference(params.gather);
  }

  void reset_hot_state(const ResetHotStateParams& params, hs_stream_t) override { reset_hot_state_reference(params); }
  void build_residency_hint(const ResidencyHintParams& params, hs_stream_t) override {
    build_residency_hint_reference(params);
  }
  void invalidate_sorted_slots(const InvalidateSortedSlotsParams& params, hs_stream_t) override {
    invalidate_sorted_slots_reference(params);
  }

  void gather_compact(const GatherCompactParams& params, hs_stream_t) override { gather_compact_reference(params); }
  void gather_plan(const GatherPlanParams& params, hs_stream_t) override { gather_plan_reference(params); }
  void invalidate_written_slots(const InvalidateSlotsParams& params, hs_stream_t) override {
    invalidate_written_slots_reference(params);
  }
  void mirror_rows(const MirrorRowsParams& params, hs_stream_t) override { mirror_rows_reference(params); }
  void swap_blocks_batch(const SwapBlocksParams& params, hs_stream_t) override { swap_blocks_batch_reference(params); }
  void warm_host_pages(const WarmHostPagesParams& params, hs_stream_t) override { warm_host_pages_reference(params); }

  void reset_request(const ResetRequestParams& params, hs_stream_t) override { reset_request_reference(params); }
  void prepare_topk(const PrepareTopkParams& params, hs_stream_t) override { prepare_topk_reference(params); }
  void write_rows(const WriteRowsParams& params, hs_stream_t) override { write_rows_reference(params); }
  void read_rows(const ReadRowsParams& params, hs_stream_t) override { read_rows_reference(params); }
  void update_residency(const ResidencyParams& params, hs_stream_t) override { update_residency_reference(params); }

  size_t staging_remap_workspace_bytes(int64_t count, int) const override {
    return staging_remap_reference_workspace_bytes(count);
  }
  void staging_remap(const StagingRemapParams& params, hs_stream_t) override { staging_remap_reference(params); }
  void build_staging_plan(const StagingBuildParams& params, hs_stream_t) override {
    build_staging_plan_reference(params);
  }
  void staging_gpu_sources(const StagingGpuSourcesParams& params, hs_stream_t) override {
    staging_gpu_sources_reference(params);
  }
  void gather_resident_rows(const GatherResidentRowsParams& params, hs_stream_t) override {
    gather_resident_rows_reference(params);
  }
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace hisparse
