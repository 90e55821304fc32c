// build_residency_hint: an index group's residency hint from its state
// (docs/residency.md, "Residency hint"): cleared, then one atomic OR per
// held host row, the state's entries over a grid-stride loop. Capturable.
#include <algorithm>
#include <cstdint>

#include "cuda/cuda_check.hpp"
#include "cuda/cuda_kernels.hpp"
#include "cuda/kernel_launch.hpp"

namespace hisparse {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1024;

__global__ void build_residency_hint_kernel(ResidencyHintParams p) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < p.entries; i += stride) {
    const int32_t row = p.device_global_indices[i];
    if (row >= 0 && row < p.host_rows) atomicOr(p.hint + (row >> 5), 1u << (row & 31));
  }
}

}  // namespace

void launch_build_residency_hint(const ResidencyHintParams& params, cudaStream_t stream) {
  const int64_t words = (params.host_rows + 31) / 32;
  if (words <= 0) return;
  cuda_check(cudaMemsetAsync(params.hint, 0, static_cast<size_t>(words) * sizeof(uint32_t), stream),
             "build_residency_hint clear");
  if (params.entries <= 0) return;
  const int64_t blocks = std::min(kMaxBlocks, (params.entries + kThreads - 1) / kThreads);
  launch_kernel("build_residency_hint kernel launch", build_residency_hint_kernel, static_cast<unsigned>(blocks),
                kThreads, 0, stream, params);
}

}  // namespace cuda
}  // namespace hisparse
