// Up-front validation of a hisparse configuration, and what the CUDA
// residency resolver needs of a device (the seed's
// _check_residency_shared_memory: here every shape runs, and a shape whose
// arrays do not fit one block's shared memory takes a global workspace),
// shared by the config, the index group and the launch.
#pragma once

#include <cstdint>

#include "hisparse/hisparse.h"

namespace hisparse {

constexpr int32_t kMaxDeviceBufferSize = 32767;  // slots are int16 in lru_slots

void validate_config(const hs_config_t& config);
// The opt-in shared memory per block of CUDA device `device`; throws
// HS_ERROR_UNSUPPORTED without the CUDA backend, and the backend's error for
// a device that does not exist.
uint64_t resolver_shared_memory_limit(int device);
// Bytes of the global workspace the CUDA resolver needs on `device` for
// num_state_rows state rows of (H, max_union_rows): 0 when every array of a
// request fits one block's shared memory (resolver_shared_memory.hpp).
uint64_t resolver_workspace_bytes_on_device(int64_t num_state_rows, int32_t device_buffer_size, int32_t max_union_rows,
                                            int device);

}  // namespace hisparse
