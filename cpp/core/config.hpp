// A hisparse configuration: its defaults (defined here and nowhere else),
// its up-front validation, and the check of the residency resolver's shared
// memory against a device (the seed's _check_residency_shared_memory).
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

// Throws HS_ERROR_INVALID_ARGUMENT when the resolver for (H, max_union_rows)
// needs more shared memory per block than device `device` of `backend` allows.
void check_resolver_shared_memory(const Backend& backend, int device, int32_t device_buffer_size,
                                  int32_t max_union_rows);

}  // namespace hisparse
