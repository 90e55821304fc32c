// update_residency: one block per batch row (grid-stride), threads over the
// row's table entries; the newest pages of the request map to its state
// row's resident blocks, everything else to 0. Capturable.
#include <algorithm>
#include <cstdint>

#include "cuda/cuda_check.hpp"
#include "cuda/cuda_kernels.hpp"

namespace hisparse {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

__global__ void update_residency_kernel(ResidencyParams p) {
  const int64_t page_size = p.table_block_size * p.blocks_per_page;
  for (int32_t b = blockIdx.x; b < p.num_batch_rows; b += gridDim.x) {
    int32_t* row = p.table + b * p.table_row_stride;
    const int32_t s = p.request_state_indices[b];
    const int64_t length = p.seq_lens[b];
    const bool none = s < 0 || s >= p.num_state_rows || length <= 0 || p.num_pages == 0;
    const int64_t last = none ? -1 : (length - 1) / page_size;
    const int64_t first = last - p.num_pages + 1 < 0 ? 0 : last - p.num_pages + 1;
    const int32_t* blocks = none ? nullptr : p.resident_blocks + s * p.resident_blocks_row_stride;
    for (int32_t q = threadIdx.x; q < p.table_width; q += blockDim.x) {
      const int64_t page = q / p.blocks_per_page;
      row[q] = (!none && page >= first && page <= last)
                   ? blocks[(page % p.num_pages) * p.blocks_per_page + q % p.blocks_per_page]
                   : 0;
    }
  }
}

}  // namespace

void launch_update_residency(const ResidencyParams& params, cudaStream_t stream) {
  if (params.num_batch_rows <= 0 || params.table_width <= 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(params.num_batch_rows, kMaxBlocks));
  update_residency_kernel<<<blocks, kThreads, 0, stream>>>(params);
  cuda_check(cudaGetLastError(), "update_residency kernel launch");
}

}  // namespace cuda
}  // namespace hisparse
