// CPU references of the KV cache's kernels (core/kv_params.hpp): plain loops
// in the order docs/kv_cache.md states the rules. The CUDA kernels match
// them byte for byte.
#pragma once

#include "core/kv_params.hpp"

namespace hisparse {

void reset_request_reference(const ResetRequestParams& params);
void prepare_topk_reference(const PrepareTopkParams& params);
void write_rows_reference(const WriteRowsParams& params);
void read_rows_reference(const ReadRowsParams& params);
void update_residency_reference(const ResidencyParams& params);

}  // namespace hisparse
