// The CUDA backend: device memory, streams and events, host-memory
// registration, device properties, and dispatch to the kernel launchers.
#include <cstring>
#include <mutex>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/backend.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/cuda_kernels.hpp"

namespace hisparse {
namespace {

cudaStream_t as_cuda(hs_stream_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

class CudaBackend final : public Backend {
 public:
  const char* name() const override { return "cuda"; }

  bool available() const override { return probe().device_count > 0; }
  std::string unavailable_reason() const override { return probe().reason; }

  int device_count() const override { return probe().device_count; }
  int current_device() const override {
    int device = 0;
    cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    return device;
  }

  DeviceProperties device_properties(int device) const override {
    check_available();
    if (device < 0 || device >= device_count()) {
      invalid_argument("device: expected 0 <= device < ", device_count(), ", got ", device);
    }
    // cudaGetDeviceProperties costs hundreds of microseconds; launches ask
    // for the shared-memory limit every time, so answer from a cache.
    std::lock_guard<std::mutex> lock(properties_mutex_);
    if (properties_.size() <= static_cast<size_t>(device)) properties_.resize(device + 1);
    if (!properties_[device].name.empty()) return properties_[device];
    cudaDeviceProp prop{};
    cuda_check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    DeviceProperties& props = properties_[device];
    props.name = prop.name;
    props.major = prop.major;
    props.minor = prop.minor;
    props.multiprocessor_count = prop.multiProcessorCount;
    props.unified_addressing = prop.unifiedAddressing != 0;
    props.can_map_host_memory = prop.canMapHostMemory != 0;
    props.total_global_memory = prop.totalGlobalMem;
    props.l2_cache_bytes = static_cast<uint64_t>(prop.l2CacheSize);
    props.max_shared_memory_per_block = prop.sharedMemPerBlockOptin;
    return props;
  }

  void* allocate(size_t bytes, int device) override {
    CudaDeviceGuard guard(device);
    void* pointer = nullptr;
    cuda_check(cudaMalloc(&pointer, bytes == 0 ? 16 : bytes), "cudaMalloc");
    return pointer;
  }
  void deallocate(void* pointer, int device) noexcept override {
    if (pointer == nullptr) return;
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device);
    cudaFree(pointer);
    cudaSetDevice(previous);
  }
  void copy_async(void* dst, const void* src, size_t bytes, hs_stream_t stream) override {
    if (bytes == 0) return;
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_cuda(stream)), "cudaMemcpyAsync");
  }
  void fill_async(void* dst, int byte_value, size_t bytes, hs_stream_t stream) override {
    if (bytes == 0) return;
    cuda_check(cudaMemsetAsync(dst, byte_value, bytes, as_cuda(stream)), "cudaMemsetAsync");
  }

  void check_accessible(const void* pointer, size_t bytes, int device, const char* name) const override {
    if (bytes == 0) return;
    const char* first = static_cast<const char*>(pointer);
    for (const char* address : {first, first + bytes - 1}) {
      cudaPointerAttributes attributes{};
      const cudaError_t result = cudaPointerGetAttributes(&attributes, address);
      if (result != cudaSuccess) {
        cudaGetLastError();
        cuda_check(result, "cudaPointerGetAttributes");
      }
      switch (attributes.type) {
        case cudaMemoryTypeDevice:
          if (attributes.device != device) {
            invalid_argument(name, ": expected memory of cuda:", device, ", got memory of cuda:", attributes.device);
          }
          break;
        case cudaMemoryTypeHost:
        case cudaMemoryTypeManaged: break;
        default:
          invalid_argument(name, ": host memory that is not pinned or registered with CUDA cannot be read by "
                                 "a kernel; allocate it pinned (hisparse.HostPool, torch pin_memory) or register it "
                                 "(hisparse.pin_tensor, hs_host_register)");
      }
    }
  }

  bool can_register_host_memory() const override { return available(); }
  void register_host_memory(void* pointer, size_t bytes, int device) override {
    check_available();
    CudaDeviceGuard guard(device);
    // Portable: readable from every device's context; mapped: kernels read
    // it zero-copy through the same address (unified addressing).
    cuda_check(cudaHostRegister(pointer, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped), "cudaHostRegister");
  }
  void unregister_host_memory(void* pointer, int device) override {
    CudaDeviceGuard guard(device);
    cuda_check(cudaHostUnregister(pointer), "cudaHostUnregister");
  }

  hs_stream_t create_stream(int device) override {
    CudaDeviceGuard guard(device);
    cudaStream_t stream = nullptr;
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return reinterpret_cast<hs_stream_t>(stream);
  }
  void destroy_stream(hs_stream_t stream, int device) noexcept override {
    if (stream == nullptr) return;
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device);
    cudaStreamDestroy(as_cuda(stream));
    cudaSetDevice(previous);
  }
  Event create_event(int device) override {
    CudaDeviceGuard guard(device);
    cudaEvent_t event = nullptr;
    cuda_check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return event;
  }
  void destroy_event(Event event, int device) noexcept override {
    if (event == nullptr) return;
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device);
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
    cudaSetDevice(previous);
  }
  void record_event(Event event, hs_stream_t stream) override {
    cuda_check(cudaEventRecord(static_cast<cudaEvent_t>(event), as_cuda(stream)), "cudaEventRecord");
  }
  void stream_wait_event(hs_stream_t stream, Event event) override {
    cuda_check(cudaStreamWaitEvent(as_cuda(stream), static_cast<cudaEvent_t>(event), 0), "cudaStreamWaitEvent");
  }
  void synchronize_stream(hs_stream_t stream) override {
    cuda_check(cudaStreamSynchronize(as_cuda(stream)), "cudaStreamSynchronize");
  }

  bool supports_shared_host_pool() const override { return available(); }
  Event create_ipc_event(int device) override {
    CudaDeviceGuard guard(device);
    cudaEvent_t event = nullptr;
    cuda_check(cudaEventCreateWithFlags(&event, cudaEventInterprocess | cudaEventDisableTiming),
               "cudaEventCreateWithFlags(cudaEventInterprocess)");
    return event;
  }
  IpcEventPayload export_ipc_event(Event event, int device) override {
    static_assert(sizeof(cudaIpcEventHandle_t) == sizeof(IpcEventPayload::bytes), "cudaIpcEventHandle_t size");
    CudaDeviceGuard guard(device);
    cudaIpcEventHandle_t handle;
    cuda_check(cudaIpcGetEventHandle(&handle, static_cast<cudaEvent_t>(event)), "cudaIpcGetEventHandle");
    IpcEventPayload payload;
    std::memcpy(payload.bytes, &handle, sizeof(handle));
    return payload;
  }
  Event import_ipc_event(const IpcEventPayload& payload, int device) override {
    CudaDeviceGuard guard(device);
    cudaIpcEventHandle_t handle;
    std::memcpy(&handle, payload.bytes, sizeof(handle));
    cudaEvent_t event = nullptr;
    cuda_check(cudaIpcOpenEventHandle(&event, handle), "cudaIpcOpenEventHandle");
    return event;
  }
  // On a capturing stream a plain record or wait would only order streams
  // inside the graph; the external flags make them event nodes, so that
  // every replay signals (or waits for) the other process.
  void record_ipc_event(Event event, int device, hs_stream_t stream) override {
    CudaDeviceGuard guard(device);
    if (capturing(stream)) {
      cuda_check(cudaEventRecordWithFlags(static_cast<cudaEvent_t>(event), as_cuda(stream), cudaEventRecordExternal),
                 "cudaEventRecordWithFlags(cudaEventRecordExternal)");
    } else {
      cuda_check(cudaEventRecord(static_cast<cudaEvent_t>(event), as_cuda(stream)), "cudaEventRecord");
    }
  }
  void wait_ipc_event(Event event, int device, hs_stream_t stream) override {
    CudaDeviceGuard guard(device);
    const unsigned flags = capturing(stream) ? cudaEventWaitExternal : cudaEventWaitDefault;
    cuda_check(cudaStreamWaitEvent(as_cuda(stream), static_cast<cudaEvent_t>(event), flags), "cudaStreamWaitEvent");
  }
  void synchronize_ipc_event(Event event, int device) override {
    CudaDeviceGuard guard(device);
    cuda_check(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "cudaEventSynchronize");
  }

  void copy_bytes(void* dst, const void* src, size_t bytes, int device, hs_stream_t stream) override {
    CudaDeviceGuard guard(device);
    cuda::launch_copy_bytes(dst, src, bytes, as_cuda(stream));
  }
  void resolve_residency(const ResolveResidencyParams& params, hs_stream_t stream) override {
    CudaDeviceGuard guard(params.device);
    cuda::launch_resolve_residency(params, as_cuda(stream));
  }

  void reset_hot_state(const ResetHotStateParams& params, hs_stream_t stream) override {
    CudaDeviceGuard guard(params.device);
    cuda::launch_reset_hot_state(params, as_cuda(stream));
  }
  void invalidate_sorted_slots(const InvalidateSortedSlotsParams& params, hs_stream_t stream) override {
    CudaDeviceGuard guard(params.device);
    cuda::launch_invalidate_sorted_slots(params, as_cuda(stream));
  }

  void gather_compact(const GatherCompactParams& params, hs_stream_t stream) override {
    CudaDeviceGuard guard(params.device);
    cuda::launch_gather_compact(params, as_cuda(stream));
  }
  void gather_plan(const GatherPlanParams& params, hs_stream_t stream) override {
    CudaDeviceGuard guard(params.device);
    cuda::launch_gather_plan(params, as_cuda(stream));
  }
  void invalidate_written_slots(const InvalidateSlotsParams& params, hs_stream_t stream) override {
    CudaDeviceGuard guard(params.device);
    cuda::launch_invalidate_written_slots(params, as_cuda(stream));
  }
  void mirror_rows(const MirrorRowsParams& params, hs_stream_t stream) override {
    CudaDeviceGuard guard(params.device);
    cuda::launch_mirror_rows(params, as_cuda(stream));
  }
  void swap_blocks_batch(const SwapBlocksParams& params, hs_stream_t stream) override {
    CudaDeviceGuard guard(params.device);
    cuda::launch_swap_blocks_batch(params, as_cuda(stream));
  }
  void warm_host_pages(const WarmHostPagesParams& params, hs_stream_t stream) override {
    CudaDeviceGuard guard(params.device);
    cuda::launch_warm_host_pages(params, as_cuda(stream));
  }
  void reset_request(const ResetRequestParams& params, hs_stream_t stream) override {
    CudaDeviceGuard guard(params.device);
    cuda::launch_reset_request(params, as_cuda(stream));
  }
  void prepare_topk(const PrepareTopkParams& params, hs_stream_t stream) override {
    CudaDeviceGuard guard(params.device);
    cuda::launch_prepare_topk(params, as_cuda(stream));
  }
  void write_rows(const WriteRowsParams& params, hs_stream_t stream) override {
    CudaDeviceGuard guard(params.device);
    cuda::launch_write_rows(params, as_cuda(stream));
  }
  void read_rows(const ReadRowsParams& params, hs_stream_t stream) override {
    CudaDeviceGuard guard(params.device);
    cuda::launch_read_rows(params, as_cuda(stream));
  }
  void update_residency(const ResidencyParams& params, hs_stream_t stream) override {
    CudaDeviceGuard guard(params.device);
    cuda::launch_update_residency(params, as_cuda(stream));
  }
  void build_residency_hint(const ResidencyHintParams& params, hs_stream_t stream) override {
    CudaDeviceGuard guard(params.device);
    cuda::launch_build_residency_hint(params, as_cuda(stream));
  }
  size_t staging_remap_workspace_bytes(int64_t count, int device) const override {
    CudaDeviceGuard guard(device);
    return cuda::staging_remap_workspace_bytes(count);
  }
  void staging_remap(const StagingRemapParams& params, hs_stream_t stream) override {
    CudaDeviceGuard guard(params.device);
    cuda::launch_staging_remap(params, as_cuda(stream));
  }
  void build_staging_plan(const StagingBuildParams& params, hs_stream_t stream) override {
    CudaDeviceGuard guard(params.device);
    cuda::launch_build_staging_plan(params, as_cuda(stream));
  }
  void staging_gpu_sources(const StagingGpuSourcesParams& params, hs_stream_t stream) override {
    CudaDeviceGuard guard(params.device);
    cuda::launch_staging_gpu_sources(params, as_cuda(stream));
  }
  void gather_resident_rows(const GatherResidentRowsParams& params, hs_stream_t stream) override {
    CudaDeviceGuard guard(params.device);
    cuda::launch_gather_resident_rows(params, as_cuda(stream));
  }
  bool is_device_memory(const void* pointer) const override {
    if (!available()) return false;
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return attributes.type == cudaMemoryTypeDevice;
  }

 private:
  static bool capturing(hs_stream_t stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cuda_check(cudaStreamIsCapturing(as_cuda(stream), &status), "cudaStreamIsCapturing");
    return status == cudaStreamCaptureStatusActive;
  }
  struct Probe {
    int device_count = 0;
    std::string reason;
  };
  // Why cudaGetDeviceCount failed, in the user's terms: the runtime reports
  // a machine without any driver as an "insufficient" driver.
  static std::string no_device_reason(cudaError_t result) {
    int driver = 0;
    cudaDriverGetVersion(&driver);  // 0 when no driver is installed
    if (result == cudaErrorInsufficientDriver && driver == 0) {
      return "no CUDA driver is installed (libcuda was not found), so there is no usable CUDA device";
    }
    if (result == cudaErrorInsufficientDriver) {
      return str("the CUDA driver supports CUDA ", driver / 1000, ".", driver % 1000 / 10,
                 ", older than the CUDA runtime ", CUDART_VERSION / 1000, ".", CUDART_VERSION % 1000 / 10,
                 " hisparse was built with; update the driver");
    }
    if (result == cudaErrorNoDevice)
      return "no CUDA device is visible (the driver found none; see CUDA_VISIBLE_DEVICES)";
    return str("no usable CUDA device (cudaGetDeviceCount: ", cudaGetErrorName(result), ": ",
               cudaGetErrorString(result), ")");
  }
  // The first question about devices initialises the CUDA runtime; nothing
  // does so at load time, so importing hisparse never touches a GPU.
  const Probe& probe() const {
    std::call_once(probe_once_, [this] {
      int count = 0;
      const cudaError_t result = cudaGetDeviceCount(&count);
      if (result != cudaSuccess) {
        probe_.reason = no_device_reason(result);
        cudaGetLastError();
      } else if (count == 0) {
        probe_.reason = "no CUDA device is visible";
      } else {
        probe_.device_count = count;
      }
    });
    return probe_;
  }
  mutable std::mutex properties_mutex_;
  mutable std::vector<DeviceProperties> properties_;
  mutable std::once_flag probe_once_;
  mutable Probe probe_;
};

}  // namespace

Backend* cuda_backend() {
  static CudaBackend backend;
  return &backend;
}

}  // namespace hisparse
