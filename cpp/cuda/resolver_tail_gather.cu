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
// It copies them as gather_compact's default schedule (row_persistent) does:
// one warp per used entry on a persistent grid, so a request left to the
// tail moves its rows as fast as the split path would. It is an ordinary
// launch, not a programmatic one: a persistent grid that starts while the
// resolve still holds most SMs lands on the few SMs left free, and its host
// reads then go through those SMs alone: slower than the separate path
// wherever many requests miss many rows.
#include "cuda/cuda_kernels.hpp"
#include "cuda/resolver_tail_gather.hpp"

namespace hisparse {
namespace cuda {

void launch_resolver_tail_gather(const ResolveResidencyParams& params, int32_t local_rows, cudaStream_t stream) {
  launch_gather_compact_tail(params.gather, params.req_id_per_token, local_rows, stream);
}

}  // namespace cuda
}  // namespace hisparse
