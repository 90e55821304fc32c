// The tail gather of the resolver's automatic schedule (resolver_tail_gather.hpp).
//
// Which rows it copies is a function of the resolve's outputs alone: a
// request's misses fill its token rows in order, K per row, so with
// local_rows < K a request has at most local_rows assigned misses exactly
// when its first token row holds at most local_rows swap entries and its
// other rows none. The tail gather therefore copies token row t's entries
// unless t is its request's first row (t == 0 or req_id_per_token[t - 1]
// differs; an active request's rows are contiguous) with at most local_rows
// of them. Rows of inactive requests and orphan rows have no entries.
//
// Work is spread so that one request's rows reach many SMs (the cost of
// scattered host rows is address translation per SM, see DESIGN.md): a unit
// is kTailUnitRows entries of one token row, and unit u of a row goes to
// block u % gridDim.x, so consecutive units land on different blocks.
#include <algorithm>

#include "cuda/cuda_check.hpp"
#include "cuda/hopper_sync.cuh"
#include "cuda/programmatic_launch.hpp"
#include "cuda/resolver_gather.cuh"
#include "cuda/resolver_tail_gather.hpp"

namespace hisparse {
namespace cuda {
namespace {

constexpr int kTailThreads = 256;
constexpr int kTailWarps = kTailThreads / 32;
constexpr int kTailUnitRows = 16;  // entries per warp and unit (lanes 0..15 own one each)
constexpr unsigned kMaxGridRows = 65535;

__global__ void __launch_bounds__(kTailThreads)
    resolver_tail_gather_kernel(const GatherCompactParams g, const int32_t* req_id_per_token, int32_t local_rows,
                                int32_t units_per_row) {
  // Everything read below was written by the resolve launch ahead.
  wait_for_prior_grid();
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  for (int32_t t = blockIdx.y; t < g.num_token_rows; t += gridDim.y) {
    const int32_t count = min(max(g.swap_counts[t], 0), g.top_k);
    if (count == 0) continue;
    const bool first_row = t == 0 || req_id_per_token[t - 1] != req_id_per_token[t];
    if (first_row && count <= local_rows) continue;  // the resolve copied these itself
    for (int32_t unit = blockIdx.x + warp * gridDim.x; unit < units_per_row; unit += kTailWarps * gridDim.x) {
      const int32_t k = unit * kTailUnitRows + lane;
      if (unit * kTailUnitRows >= count) break;  // warp-uniform
      int32_t host_slot = -1, row = -1;
      if (lane < kTailUnitRows && k < count) {
        host_slot = g.swap_host_rows[static_cast<int64_t>(t) * g.swap_host_row_stride + k];
        row = g.swap_device_rows[static_cast<int64_t>(t) * g.swap_device_row_stride + k];
      }
      // gather_compact skips an entry with a negative side.
      warp_copy_assigned_rows(g, host_slot >= 0 && row >= 0, host_slot, row, lane);
    }
  }
}

}  // namespace

void launch_resolver_tail_gather(const ResolveResidencyParams& params, int32_t local_rows, bool programmatic,
                                 cudaStream_t stream) {
  const GatherCompactParams& g = params.gather;
  if (g.num_token_rows <= 0) return;
  const int32_t units_per_row = (g.top_k + kTailUnitRows - 1) / kTailUnitRows;
  const dim3 grid(static_cast<unsigned>((units_per_row + kTailWarps - 1) / kTailWarps),
                  std::min(static_cast<unsigned>(g.num_token_rows), kMaxGridRows));
  const ProgrammaticLaunch launch_config(grid, dim3(kTailThreads), 0, stream, programmatic);
  cuda_check(cudaLaunchKernelEx(launch_config.config(), resolver_tail_gather_kernel, g, params.req_id_per_token,
                                local_rows, units_per_row),
             "resolver tail gather launch");
}

}  // namespace cuda
}  // namespace hisparse
