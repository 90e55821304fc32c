// gather_plan: prefill staging rows filled from the host cache where the
// plan marks a miss. Warps take groups of plan entries and issue all of a
// group's loads before its stores (row_copy.cuh), on a grid that strides.
#include <algorithm>
#include <cstdint>

#include "cuda_check.hpp"
#include "cuda_kernels.hpp"
#include "row_copy.cuh"

namespace hisparse {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 8;

__global__ void __launch_bounds__(kThreads) gather_plan_kernel(GatherPlanParams p, int rows_per_group) {
  const int lane = threadIdx.x % kWarpSize;
  const int chunks = static_cast<int>(p.row_bytes / kChunkBytes);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / kWarpSize);
  for (int64_t first = (blockIdx.x * static_cast<int64_t>(kThreads / kWarpSize) + threadIdx.x / kWarpSize) *
                       rows_per_group;
       first < p.count; first += warps * rows_per_group) {
    const int n = static_cast<int>(std::min<int64_t>(rows_per_group, p.count - first));
    const uint8_t* src = nullptr;
    uint8_t* dst = nullptr;
    if (lane < n) {
      const int64_t j = first + lane;
      const int64_t row = p.row_ids[j];
      const int64_t target = p.dst_rows[j];
      if (p.miss_mask[j] != 0 && row >= 0 && row < p.src_rows && target >= 0 && target < p.staged_rows) {
        src = p.src + row * p.src_pitch;
        dst = p.staged + target * p.row_bytes;
      }
    }
    // Skipped entries keep their bytes; with no source the row would be zeroed.
    if (src == nullptr) dst = nullptr;
    warp_copy_rows<kUnroll>(n, src, dst, chunks, lane);
  }
}

}  // namespace

void launch_gather_plan(const GatherPlanParams& params, cudaStream_t stream) {
  if (params.count <= 0) return;
  const int64_t chunks = params.row_bytes / kChunkBytes;
  if (chunks * kWarpSize > INT32_MAX) {
    invalid_argument("gather_plan: rows of ", params.row_bytes, " bytes exceed the CUDA kernel's chunk index range");
  }
  const int rows_per_group = rows_per_warp_group(static_cast<int>(chunks), kUnroll);
  const int64_t groups = (params.count + rows_per_group - 1) / rows_per_group;
  const int64_t needed = (groups + kThreads / kWarpSize - 1) / (kThreads / kWarpSize);
  const int64_t resident = static_cast<int64_t>(multiprocessor_count()) * (2048 / kThreads);
  gather_plan_kernel<<<static_cast<unsigned>(std::min(needed, resident)), kThreads, 0, stream>>>(params,
                                                                                                 rows_per_group);
  cuda_check(cudaGetLastError(), "gather_plan kernel launch");
}

}  // namespace cuda
}  // namespace hisparse
