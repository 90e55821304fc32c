// Validation of the KV cache kernels' arguments (hisparse/kv_cache.h) into
// the raw params the backends read (core/kv_params.hpp). Each function
// checks one part on the host (shapes, dtypes, devices, strides, alignment,
// reachability; device data is never read) and fills its fields; the
// standalone C calls check every part, a runtime or the KV cache checks the
// parts its caller gives and fills the rest from memory checked at bind.
#pragma once

#include <cstdint>

#include "core/kv_params.hpp"
#include "core/tensor.hpp"
#include "hisparse/kv_cache.h"

namespace hisparse {

// A cache of rows addressed by row offset (the attention addressing): a
// paged view [blocks, block_size, W] whose rows are contiguous within a
// block, or (when `allow_flat`) rows [N, W] at unit pitch.
struct PagedRows {
  uint8_t* base = nullptr;
  int64_t row_bytes = 0;
  int64_t block_size = 1;
  int64_t block_stride = 1;  // rows
  int64_t span_rows = 0;     // row offsets below this lie inside the tensor
};
PagedRows paged_rows(const TensorArg& cache, const Device& device, const char* reference, bool allow_flat);

// The tokens of a write: rows [T, W] (`row_bytes` each; dtype `dtype` unless
// HS_NUM_DTYPES), req_id_per_token int32 [>= T], positions int32 or int64
// [>= T], request_state_indices int32 [B], all on `device`.
void write_rows_tokens(const TensorArg& rows, const TensorArg& req_id_per_token, const TensorArg& positions,
                       const TensorArg& request_state_indices, hs_dtype_t dtype, int64_t row_bytes,
                       const Device& device, WriteRowsParams* params);
// The position -> host slot mapping: an optional source table int32 [>= B, Ws]
// with a positive block_size; host_rows bounds the slots (0 = no limit).
void write_rows_source(const TensorArg& source_block_table, int64_t block_size, int64_t host_rows, const Device& device,
                       WriteRowsParams* params);
// The resident copy: a paged view of the rows' dtype and width with its block
// table int32 [>= B, Wr] (both or neither).
void write_rows_resident(const TensorArg& resident_cache, const TensorArg& resident_block_table, hs_dtype_t dtype,
                         const Device& device, WriteRowsParams* params);

// Whether the write's resident and hot copies are one paged view (one base
// address, block size and block stride): resident pages may be blocks of the
// cache that holds the hot blocks, as in the KV cache's slab, and rows of one
// view written through two tables alias nothing. Then the wider of the two
// ranges stands for both in the alias check; otherwise the two, like every
// destination, share no byte with each other or with any input.
bool destinations_in_one_view(const WriteRowsParams& params);
const ByteRange& wider(const ByteRange& a, const ByteRange& b);

// rows (a PagedRows cache), indices int32 [T, k] with unit column stride and
// out [T, k, W] contiguous, of the cache's dtype and width, on its device.
void read_rows_args(const PagedRows& cache, hs_dtype_t dtype, const TensorArg& indices, const TensorArg& out,
                    const Device& device, ReadRowsParams* params);

// Every argument of hs_write_rows / hs_read_rows / hs_update_residency;
// *device is the executing device.
WriteRowsParams write_rows_params(const hs_write_rows_args_t& args, Device* device);
ReadRowsParams read_rows_params(const hs_tensor_t* cache, const hs_tensor_t* indices, const hs_tensor_t* out,
                                Device* device);
ResidencyParams residency_params(const hs_update_residency_args_t& args, Device* device);

}  // namespace hisparse
