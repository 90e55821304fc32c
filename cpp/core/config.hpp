// A hisparse configuration: its defaults (defined here and nowhere else),
// its up-front validation, and what the CUDA residency resolver needs of a
// device (the seed's _check_residency_shared_memory: here every shape runs,
// and a shape whose arrays do not fit one block's shared memory takes a
// global workspace).
#pragma once

#include <cstdint>

#include "hisparse/hisparse.h"

namespace hisparse {

class Backend;

constexpr int32_t kMaxDeviceBufferSize = 32767;  // slots are int16 in lru_slots

// The distinct rows one request can select in a step, the default of every
// max_union_rows: top_k x (1 + num_speculative_tokens). Throws naming
// num_speculative_tokens when that passes INT32_MAX.
int32_t default_max_union_rows(int32_t top_k, int32_t num_speculative_tokens);
// The token rows of one forward's shared top-k state, the default of every
// max_swap_rows: max_num_reqs x (1 + num_speculative_tokens). Throws naming
// num_speculative_tokens when that passes INT32_MAX.
int32_t default_max_swap_rows(int32_t max_num_reqs, int32_t num_speculative_tokens);

// `config` with its defaults filled in (max_union_rows = 0 replaced by its
// default), validated: throws HS_ERROR_INVALID_ARGUMENT naming the first
// field out of range.
hs_config_t resolve_config(const hs_config_t& config);

// Throws HS_ERROR_INVALID_ARGUMENT naming the argument unless (H,
// max_union_rows) is a resolver shape: 1 <= H <= kMaxDeviceBufferSize and
// 1 <= max_union_rows <= H.
void check_resolver_shape(int32_t device_buffer_size, int32_t max_union_rows);
// The opt-in shared memory per block of device `device` of `backend` (the
// backend's error for a device that does not exist).
uint64_t resolver_shared_memory_limit(const Backend& backend, int device);
// Bytes of the global workspace the CUDA resolver needs on `device` for
// num_state_rows state rows of (H, max_union_rows): 0 when every array of a
// request fits one block's shared memory (resolver_shared_memory.hpp).
uint64_t resolver_workspace_bytes_on_device(const Backend& backend, int device, int64_t num_state_rows,
                                            int32_t device_buffer_size, int32_t max_union_rows);
// Whether an index group of `config` (resolved) and max_num_reqs requests
// on CUDA device `device` keeps a residency hint under
// HS_RESIDENCY_HINT_AUTO: where every resolve launch of the group reads
// predicted misses early from it (runtime.h, hs_residency_hint_choice_t).
bool residency_hint_pays(const Backend& backend, int device, const hs_config_t& config, int32_t max_num_reqs);

}  // namespace hisparse
