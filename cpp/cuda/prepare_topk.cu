// prepare_topk: a narrow or length-limited top-k padded into the K columns
// the resolver reads. One block per token row (grid-stride), threads over
// the columns; capturable.
#include <algorithm>
#include <cstdint>

#include "cuda/cuda_kernels.hpp"
#include "cuda/kernel_launch.hpp"

namespace hisparse {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

__device__ int32_t request_length(const PrepareTopkParams& p, int32_t t) {
  const int32_t b = p.req_id_per_token[t];
  return (b >= 0 && b < p.num_batch_rows) ? p.seq_lens[b] : 0;
}

__global__ void prepare_topk_kernel(PrepareTopkParams p) {
  for (int32_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    const bool limited = p.seq_lens != nullptr;
    const int32_t length = limited ? request_length(p, t) : 0;
    for (int32_t k = threadIdx.x; k < p.top_k; k += blockDim.x) {
      int32_t position = k < p.width ? p.topk[t * p.topk_row_stride + k] : -1;
      if (position < 0 || (limited && position >= length)) position = -1;
      p.out[t * p.out_row_stride + k] = position;
    }
  }
}

}  // namespace

void launch_prepare_topk(const PrepareTopkParams& params, cudaStream_t stream) {
  if (params.num_tokens <= 0 || params.top_k <= 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(params.num_tokens, kMaxBlocks));
  launch_kernel("prepare_topk kernel launch", prepare_topk_kernel, blocks, kThreads, 0, stream, params);
}

}  // namespace cuda
}  // namespace hisparse
