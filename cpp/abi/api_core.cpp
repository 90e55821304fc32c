// C ABI: version, build facts, devices, dtypes, and the byte-copy kernel.
#include <cstring>

#include "abi/api_guard.hpp"
#include "core/aliasing.hpp"
#include "core/backend.hpp"
#include "core/tensor.hpp"

#ifdef HISPARSE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace hisparse {
namespace {

void copy_text(char* dst, size_t capacity, const std::string& text) {
  const size_t n = std::min(capacity - 1, text.size());
  std::memcpy(dst, text.data(), n);
  dst[n] = '\0';
}

std::string compiler_description() {
#if defined(__clang__)
  return str("clang ", __clang_major__, ".", __clang_minor__, ".", __clang_patchlevel__);
#elif defined(__GNUC__)
  return str("gcc ", __GNUC__, ".", __GNUC_MINOR__, ".", __GNUC_PATCHLEVEL__);
#else
  return "unknown";
#endif
}

thread_local std::string unavailable_reason_buffer;

}  // namespace
}  // namespace hisparse

using namespace hisparse;

extern "C" {

HS_API hs_status_t hs_get_version(int* version) {
  return api_guard([&] { *require_pointer(version, "version") = HISPARSE_VERSION; });
}

HS_API const char* hs_version_string(void) { return HISPARSE_VERSION_STRING; }

HS_API hs_status_t hs_get_build_info(hs_build_info_t* info) {
  return api_guard([&] {
    require_struct_size(info, "info");
    hs_build_info_t value{};
#ifdef HISPARSE_WITH_CUDA
    value.cuda_compiled = 1;
    value.cuda_runtime_version = CUDART_VERSION;
#endif
    copy_text(value.cuda_architectures, sizeof(value.cuda_architectures), HISPARSE_CUDA_ARCHS);
    copy_text(value.build_type, sizeof(value.build_type), HISPARSE_BUILD_TYPE);
    copy_text(value.compiler, sizeof(value.compiler), compiler_description());
    write_struct<HS_BUILD_INFO_VERSION>(info, value);
  });
}

HS_API hs_status_t hs_cuda_device_count(int* count) {
  return api_guard([&] {
    require_pointer(count, "count");
    Backend* cuda = cuda_backend();
    *count = cuda == nullptr ? 0 : cuda->device_count();
  });
}

HS_API hs_status_t hs_cuda_device_properties(int device, hs_device_properties_t* props) {
  return api_guard([&] {
    require_struct_size(props, "props");
    if (device < 0) invalid_argument("device: expected a CUDA device index >= 0, got ", device);
    Backend& cuda = backend_for(Device{Device::kCuda, device}, "device");
    const DeviceProperties p = cuda.device_properties(device);
    hs_device_properties_t value{};
    copy_text(value.name, sizeof(value.name), p.name);
    value.major = p.major;
    value.minor = p.minor;
    value.multiprocessor_count = p.multiprocessor_count;
    value.unified_addressing = p.unified_addressing;
    value.can_map_host_memory = p.can_map_host_memory;
    value.total_global_memory = p.total_global_memory;
    value.l2_cache_bytes = p.l2_cache_bytes;
    value.max_shared_memory_per_block = p.max_shared_memory_per_block;
    write_struct<HS_DEVICE_PROPERTIES_VERSION>(props, value);
  });
}

HS_API size_t hs_dtype_size(hs_dtype_t dtype) { return dtype_size(dtype); }

HS_API const char* hs_dtype_name(hs_dtype_t dtype) { return dtype_name(dtype); }

HS_API const char* hs_cuda_unavailable_reason(void) {
  Backend* cuda = cuda_backend();
  unavailable_reason_buffer =
      cuda == nullptr ? std::string("hisparse was built without the CUDA backend") : cuda->unavailable_reason();
  return unavailable_reason_buffer.c_str();
}

HS_API hs_status_t hs_copy_bytes(const hs_tensor_t* dst, const hs_tensor_t* src, hs_stream_t stream) {
  return api_guard([&] {
    const TensorArg destination(dst, "dst");
    const TensorArg source(src, "src");
    destination.contiguous();
    source.contiguous();
    if (destination.nbytes() != source.nbytes()) {
      invalid_argument("dst: expected ", source.nbytes(), " bytes (the size of src), got ", destination.nbytes());
    }
    // The destination's device runs the copy; a CUDA copy reads host memory
    // zero-copy, so the source may live on the host (registered) or on the
    // same device.
    const Device device = destination.device();
    if (source.device().is_cuda()) source.on(device, "dst");
    AliasCheck().writes(destination).reads(source).check();
    Backend& backend = backend_for(device, "dst");
    backend.check_accessible(source.data<void>(), source.nbytes(), device.index, "src");
    backend.check_accessible(destination.data<void>(), destination.nbytes(), device.index, "dst");
    backend.copy_bytes(destination.data<void>(), source.data<void>(), destination.nbytes(), device.index, stream);
  });
}

}  // extern "C"
