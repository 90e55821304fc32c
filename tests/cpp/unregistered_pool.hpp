// The options of a host pool a test makes without registering it with a
// device, so that it behaves the same on machines with and without a GPU.
#pragma once

#include <cstdint>

#include "hisparse/hisparse.h"

inline hs_host_pool_options_t unregistered_pool_options(uint64_t size_bytes) {
  hs_host_pool_options_t options;
  hs_host_pool_options_init(&options);
  options.size_bytes = size_bytes;
  options.registration = HS_REGISTER_NEVER;
  return options;
}
