// invalidate_written_slots: one block per (written token, table) scans the
// writer's hot row and clears every slot holding the written host slot. All
// tables go in one launch: their pointers travel as kernel arguments (up to
// kInlineInvalidationTables per launch) or come from a device array.
#include <algorithm>
#include <cstdint>

#include "cuda/cuda_kernels.hpp"
#include "cuda/kernel_launch.hpp"

namespace hisparse {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxGridY = 65535;

struct InlineTables {
  int32_t* table[kInlineInvalidationTables];
};

__global__ void __launch_bounds__(kThreads)
    invalidate_written_slots_kernel(InlineTables inline_tables, const int64_t* table_pointers, int32_t num_tables,
                                    int32_t num_state_rows, int32_t hot_size, const int32_t* request_state_indices,
                                    int32_t num_batch_rows, const int32_t* req_id_per_token,
                                    const int32_t* written_slots) {
  const int t = blockIdx.x;
  const int32_t b = req_id_per_token[t];
  if (b < 0 || b >= num_batch_rows) return;
  const int32_t s = request_state_indices[b];
  if (s < 0 || s >= num_state_rows) return;
  const int32_t w = written_slots[t];
  if (w < 0) return;
  for (int i = blockIdx.y; i < num_tables; i += gridDim.y) {
    int32_t* table = table_pointers != nullptr ? reinterpret_cast<int32_t*>(static_cast<uintptr_t>(table_pointers[i]))
                                               : inline_tables.table[i];
    int32_t* row = table + static_cast<int64_t>(s) * hot_size;
    for (int j = threadIdx.x; j < hot_size; j += kThreads) {
      if (row[j] == w) row[j] = -1;
    }
  }
}

}  // namespace

void launch_invalidate_written_slots(const InvalidateSlotsParams& params, cudaStream_t stream) {
  if (params.num_tokens <= 0 || params.num_tables <= 0) return;
  if (params.table_pointers != nullptr) {
    const dim3 grid(params.num_tokens, std::min<unsigned>(params.num_tables, kMaxGridY));
    launch_kernel("invalidate_written_slots kernel launch", invalidate_written_slots_kernel, grid, kThreads, 0, stream,
                  InlineTables{}, params.table_pointers, params.num_tables, params.num_state_rows, params.hot_size,
                  params.request_state_indices, params.num_batch_rows, params.req_id_per_token, params.written_slots);
    return;
  }
  for (int32_t first = 0; first < params.num_tables; first += kInlineInvalidationTables) {
    const int32_t count = std::min(kInlineInvalidationTables, params.num_tables - first);
    InlineTables tables{};
    for (int32_t i = 0; i < count; ++i) tables.table[i] = params.tables[first + i];
    const dim3 grid(params.num_tokens, count);
    launch_kernel("invalidate_written_slots kernel launch", invalidate_written_slots_kernel, grid, kThreads, 0, stream,
                  tables, nullptr, count, params.num_state_rows, params.hot_size, params.request_state_indices,
                  params.num_batch_rows, params.req_id_per_token, params.written_slots);
  }
}

}  // namespace cuda
}  // namespace hisparse
