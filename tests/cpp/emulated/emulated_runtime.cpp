// The CUDA runtime calls that the launchers of the emulated kernel sources
// make, answered for the emulated device (cuda_emulation.hpp, emu::g_device).
#include "emulated/cuda_emulation.hpp"  // first: before any CUDA header

extern "C" {
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = emu::g_device.major; break;
    case cudaDevAttrMultiProcessorCount: *value = emu::g_device.multiprocessors; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = emu::g_device.block_shared_optin; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = emu::g_device.sm_shared; break;
    case cudaDevAttrReservedSharedMemoryPerBlock: *value = emu::g_device.block_reserved; break;
    default: *value = 0;
  }
  return cudaSuccess;
}
// Emulated launches never fail, so there is no error to report.
cudaError_t cudaGetLastError() { return cudaSuccess; }
// Device memory is host memory, and the stream is the calling thread.
cudaError_t cudaMemsetAsync(void* memory, int value, size_t bytes, cudaStream_t) {
  std::memset(memory, value, bytes);
  return cudaSuccess;
}
const char* cudaGetErrorName(cudaError_t) { return "cudaErrorEmulated"; }
const char* cudaGetErrorString(cudaError_t) { return "emulated CUDA runtime"; }
}
