// mirror_rows: device rows written into their host slots by a kernel that
// stores straight into registered host memory (posted PCIe writes), so the
// copy is stream-ordered and capturable, unlike a loop of cudaMemcpyAsync.
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

__global__ void __launch_bounds__(kThreads) mirror_rows_kernel(MirrorRowsParams p, int rows_per_group) {
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
      const int64_t i = first + lane;
      const int64_t slot = p.slot_mapping_int64 ? static_cast<const int64_t*>(p.slot_mapping)[i]
                                                : static_cast<const int32_t*>(p.slot_mapping)[i];
      if (slot >= 0 && slot < p.host_rows) {
        src = p.src + i * p.src_pitch;
        dst = p.host + slot * p.host_pitch;
      }
    }
    warp_copy_rows<kUnroll>(n, src, dst, chunks, lane);
  }
}

}  // namespace

void launch_mirror_rows(const MirrorRowsParams& params, cudaStream_t stream) {
  if (params.count <= 0) return;
  const int64_t chunks = params.row_bytes / kChunkBytes;
  if (chunks * kWarpSize > INT32_MAX) {
    invalid_argument("mirror_rows: rows of ", params.row_bytes, " bytes exceed the CUDA kernel's chunk index range");
  }
  const int rows_per_group = rows_per_warp_group(static_cast<int>(chunks), kUnroll);
  const int64_t groups = (params.count + rows_per_group - 1) / rows_per_group;
  const int64_t needed = (groups + kThreads / kWarpSize - 1) / (kThreads / kWarpSize);
  const int64_t resident = static_cast<int64_t>(multiprocessor_count()) * (2048 / kThreads);
  mirror_rows_kernel<<<static_cast<unsigned>(std::min(needed, resident)), kThreads, 0, stream>>>(params,
                                                                                                 rows_per_group);
  cuda_check(cudaGetLastError(), "mirror_rows kernel launch");
}

}  // namespace cuda
}  // namespace hisparse
