// mirror_rows: device rows written into their host slots by a kernel that
// stores straight into registered host memory (posted PCIe writes), so the
// copy is stream-ordered and capturable, unlike a loop of cudaMemcpyAsync.
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

__global__ void __launch_bounds__(kThreads) mirror_rows_kernel(MirrorRowsParams p, int rows_per_group) {
  copy_row_groups<kThreads, kUnroll>(
      p.count, rows_per_group, p.row_bytes, [&](int64_t i, const uint8_t*& src, uint8_t*& dst) {
        const int64_t slot = p.slot_mapping_int64 ? static_cast<const int64_t*>(p.slot_mapping)[i]
                                                  : static_cast<const int32_t*>(p.slot_mapping)[i];
        if (slot >= 0 && slot < p.host_rows) {
          src = p.src + i * p.src_pitch;
          dst = p.host + slot * p.host_pitch;
        }
      });
}

}  // namespace

void launch_mirror_rows(const MirrorRowsParams& params, cudaStream_t stream) {
  if (params.count <= 0) return;
  const RowCopyGrid grid = row_copy_grid<kThreads, kUnroll>("mirror_rows", params.count, params.row_bytes);
  launch_kernel("mirror_rows kernel launch", mirror_rows_kernel, grid.blocks, kThreads, 0, stream, params,
                grid.rows_per_group);
}

}  // namespace cuda
}  // namespace hisparse
