// read_rows: the rows attention indices name, copied warp by warp with many
// loads in flight (row_copy.cuh); an index that names no row zero-fills its
// output row. Capturable.
#include <cstdint>

#include "cuda/cuda_kernels.hpp"
#include "cuda/kernel_launch.hpp"
#include "cuda/row_copy.cuh"

namespace hisparse {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 8;

__global__ void __launch_bounds__(kThreads) read_rows_kernel(ReadRowsParams p, int rows_per_group) {
  const int64_t count = static_cast<int64_t>(p.num_rows) * p.width;
  copy_row_groups<kThreads, kUnroll>(count, rows_per_group, p.row_bytes,
                                     [&](int64_t i, const uint8_t*& src, uint8_t*& dst) {
                                       const int64_t t = i / p.width;
                                       const int64_t index = p.indices[t * p.index_row_stride + i % p.width];
                                       dst = p.out + i * p.row_bytes;
                                       if (index >= 0 && index < p.span_rows) src = p.cache + index * p.row_bytes;
                                     });
}

}  // namespace

void launch_read_rows(const ReadRowsParams& params, cudaStream_t stream) {
  const int64_t count = static_cast<int64_t>(params.num_rows) * params.width;
  if (count <= 0) return;
  const RowCopyGrid grid = row_copy_grid<kThreads, kUnroll>("read_rows", count, params.row_bytes);
  launch_kernel("read_rows kernel launch", read_rows_kernel, grid.blocks, kThreads, 0, stream, params,
                grid.rows_per_group);
}

}  // namespace cuda
}  // namespace hisparse
