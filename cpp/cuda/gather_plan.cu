// gather_plan: prefill staging rows filled from the host cache where the
// plan marks a miss. Warps take groups of plan entries and issue all of a
// group's loads before its stores (row_copy.cuh), on a grid that strides.
#include <algorithm>
#include <cstdint>

#include "cuda/cuda_kernels.hpp"
#include "cuda/kernel_launch.hpp"
#include "cuda/row_copy.cuh"

namespace hisparse {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 8;

__global__ void __launch_bounds__(kThreads) gather_plan_kernel(GatherPlanParams p, int rows_per_group) {
  copy_row_groups<kThreads, kUnroll>(
      p.count, rows_per_group, p.row_bytes, [&](int64_t j, const uint8_t*& src, uint8_t*& dst) {
        const int64_t row = p.row_ids[j];
        const int64_t target = p.dst_rows[j];
        // Skipped entries keep their bytes (neither pointer set).
        if (p.miss_mask[j] != 0 && row >= 0 && row < p.src_rows && target >= 0 && target < p.staged_rows) {
          src = p.src + row * p.src_pitch;
          dst = p.staged + target * p.row_bytes;
        }
      });
}

}  // namespace

void launch_gather_plan(const GatherPlanParams& params, cudaStream_t stream) {
  if (params.count <= 0) return;
  const RowCopyGrid grid = row_copy_grid<kThreads, kUnroll>("gather_plan", params.count, params.row_bytes);
  launch_kernel("gather_plan kernel launch", gather_plan_kernel, grid.blocks, kThreads, 0, stream, params,
                grid.rows_per_group);
}

}  // namespace cuda
}  // namespace hisparse
