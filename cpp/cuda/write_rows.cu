// write_rows: one block per written token (grid-stride). The block copies
// the row to its host slot and its resident copy in 16-byte chunks, then
// scans the state row's hot slots; a thread that finds a copy of the slot
// rewrites that hot row itself (a rare event: a slot is held at most a few
// times). Host stores are posted writes into registered memory, so the
// whole write is stream-ordered and capturable.
#include <algorithm>
#include <cstdint>

#include "cuda/cuda_kernels.hpp"
#include "cuda/kernel_launch.hpp"
#include "cuda/row_copy.cuh"

namespace hisparse {
namespace cuda {
namespace {

constexpr int kThreads = 128;
constexpr int64_t kMaxBlocks = 65535;

__device__ void block_copy_row(uint8_t* dst, const uint8_t* src, int64_t row_bytes) {
  for (int64_t c = threadIdx.x; c < row_bytes / kChunkBytes; c += blockDim.x) {
    store_chunk(dst + c * kChunkBytes, load_chunk(src + c * kChunkBytes));
  }
}

__device__ void thread_copy_row(uint8_t* dst, const uint8_t* src, int64_t row_bytes) {
  for (int64_t c = 0; c < row_bytes / kChunkBytes; ++c) {
    store_chunk(dst + c * kChunkBytes, load_chunk(src + c * kChunkBytes));
  }
}

__device__ int64_t token_position(const WriteRowsParams& p, int32_t t) {
  return p.positions_int64 ? static_cast<const int64_t*>(p.positions)[t] : static_cast<const int32_t*>(p.positions)[t];
}

__device__ void write_hot_copies(const WriteRowsParams& p, int32_t b, int32_t s, int64_t slot, const uint8_t* row) {
  const int32_t* held = p.device_global_indices + static_cast<int64_t>(s) * p.hot_size;
  for (int32_t j = threadIdx.x; j < p.hot_size; j += blockDim.x) {
    if (held[j] != slot) continue;
    const int64_t hot = write_hot_offset(p, b, j);
    if (hot >= 0) thread_copy_row(p.hot + hot * p.row_bytes, row, p.row_bytes);
  }
}

__global__ void __launch_bounds__(kThreads) write_rows_kernel(WriteRowsParams p) {
  for (int32_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    int32_t b = -1;
    const int32_t s = write_state_row(p, t, &b);
    if (s < 0) continue;
    const int64_t position = token_position(p, t);
    const uint8_t* row = p.src + t * p.src_pitch;
    const int64_t slot = write_host_slot(p, b, position);
    if (slot >= 0 && p.host != nullptr) block_copy_row(p.host + slot * p.host_pitch, row, p.row_bytes);
    const int64_t resident = write_resident_offset(p, b, position);
    if (resident >= 0) block_copy_row(p.resident + resident * p.row_bytes, row, p.row_bytes);
    if (slot >= 0 && p.device_global_indices != nullptr) write_hot_copies(p, b, s, slot, row);
  }
}

}  // namespace

void launch_write_rows(const WriteRowsParams& params, cudaStream_t stream) {
  if (params.num_tokens <= 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(params.num_tokens, kMaxBlocks));
  launch_kernel("write_rows kernel launch", write_rows_kernel, blocks, kThreads, 0, stream, params);
}

}  // namespace cuda
}  // namespace hisparse
