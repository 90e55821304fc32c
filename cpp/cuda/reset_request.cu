// reset_request: one state row of an index group back to its initial hot
// state, clearing the residency hint's bits of the rows it held (when the
// group keeps a hint). One block strides over the row's hot slots;
// capturable.
#include <cstdint>

#include "cuda/cuda_kernels.hpp"
#include "cuda/kernel_launch.hpp"

namespace hisparse {
namespace cuda {
namespace {

constexpr int kThreads = 256;

__global__ void reset_request_kernel(ResetRequestParams p) {
  const int64_t base = static_cast<int64_t>(p.state_row) * p.hot_size;
  for (int32_t j = threadIdx.x; j < p.hot_size; j += blockDim.x) {
    if (p.residency_hint != nullptr) {
      const int32_t held = p.device_global_indices[base + j];
      if (held >= 0 && held < p.host_rows) atomicAnd(p.residency_hint + (held >> 5), ~(1u << (held & 31)));
    }
    p.device_global_indices[base + j] = -1;
    p.lru_slots[base + j] = static_cast<int16_t>(j);
  }
}

}  // namespace

void launch_reset_request(const ResetRequestParams& params, cudaStream_t stream) {
  if (params.hot_size <= 0) return;
  launch_kernel("reset_request kernel launch", reset_request_kernel, 1, kThreads, 0, stream, params);
}

}  // namespace cuda
}  // namespace hisparse
