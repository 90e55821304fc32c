// CUDA runtime errors become hisparse Errors (HS_ERROR_CUDA) that say which
// call failed, so a status never loses the runtime's own explanation.
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.hpp"

namespace hisparse {

inline void cuda_check(cudaError_t result, const char* what) {
  if (result != cudaSuccess) {
    const hs_status_t status = result == cudaErrorMemoryAllocation ? HS_ERROR_OUT_OF_MEMORY : HS_ERROR_CUDA;
    fail(status, what, " failed: ", cudaGetErrorName(result), ": ", cudaGetErrorString(result));
  }
}

// Switches the calling thread to `device` for its lifetime, restoring the
// previous device afterwards (device work must not change the caller's state).
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device) {
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (device >= 0 && device != previous_) {
      cuda_check(cudaSetDevice(device), "cudaSetDevice");
      switched_ = true;
    }
  }
  ~CudaDeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace hisparse
