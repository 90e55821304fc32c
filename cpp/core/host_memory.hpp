// How much RAM the machine can give a new pool, and the refusal of pools that
// would not fit (the seed's check_hisparse_host_memory).
#pragma once

#include <cstdint>

namespace hisparse {

uint64_t available_host_memory();
// Throws HS_ERROR_INVALID_ARGUMENT when pool_bytes > 95% of available RAM;
// the message names the size as `name` (the caller's argument).
void check_host_memory(uint64_t pool_bytes, const char* name = "size_bytes");

}  // namespace hisparse
