// Up-front validation of a hisparse configuration, and the check of the
// residency resolver's shared memory against a device (the seed's
// _check_residency_shared_memory), shared by the config and the launch.
#pragma once

#include <cstdint>

#include "hisparse/hisparse.h"

namespace hisparse {

constexpr int32_t kMaxDeviceBufferSize = 32767;  // slots are int16 in lru_slots

void validate_config(const hs_config_t& config);
// Throws HS_ERROR_INVALID_ARGUMENT when the resolver for (H, max_union_rows)
// needs more shared memory per block than CUDA device `device` allows.
void check_resolver_shared_memory(int32_t device_buffer_size, int32_t max_union_rows, int device);

}  // namespace hisparse
