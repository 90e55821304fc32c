// update_residency: with ring pages, one launch claims the ring slots of
// every page in every window (atomicMax, so the later page keeps a slot
// whatever the order of batch rows), then one block per batch row
// (grid-stride), threads over the row's table entries, writes the table:
// the newest pages of the request map to its state row's resident blocks,
// everything else to 0. Capturable.
#include <algorithm>
#include <cstdint>

#include "cuda/cuda_kernels.hpp"
#include "cuda/kernel_launch.hpp"

namespace hisparse {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

__device__ void claim_ring_slots(const ResidencyParams& p, int32_t b) {
  const PageWindow window = resident_page_window(p, b);
  const int32_t s = p.request_state_indices[b];
  for (int64_t page = window.first + threadIdx.x; page <= window.last; page += blockDim.x) {
    atomicMax(ring_page_of(p, s, page), static_cast<int32_t>(page));
  }
}

__device__ void write_table_row(const ResidencyParams& p, int32_t b) {
  const PageWindow window = resident_page_window(p, b);
  int32_t* row = p.table + b * p.table_row_stride;
  for (int32_t q = threadIdx.x; q < p.table_width; q += blockDim.x) row[q] = resident_table_entry(p, b, window, q);
}

__global__ void claim_ring_slots_kernel(ResidencyParams p) {
  for (int32_t b = blockIdx.x; b < p.num_batch_rows; b += gridDim.x) claim_ring_slots(p, b);
}

__global__ void update_residency_kernel(ResidencyParams p) {
  for (int32_t b = blockIdx.x; b < p.num_batch_rows; b += gridDim.x) write_table_row(p, b);
}

}  // namespace

void launch_update_residency(const ResidencyParams& params, cudaStream_t stream) {
  if (params.num_batch_rows <= 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(params.num_batch_rows, kMaxBlocks));
  if (params.ring_pages != nullptr && params.num_pages > 0) {
    launch_kernel("update_residency ring-slot claim launch", claim_ring_slots_kernel, blocks, kThreads, 0, stream,
                  params);
  }
  if (params.table_width <= 0) return;
  launch_kernel("update_residency kernel launch", update_residency_kernel, blocks, kThreads, 0, stream, params);
}

}  // namespace cuda
}  // namespace hisparse
