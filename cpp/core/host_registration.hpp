// Registration of caller-owned host memory with a device (the seed
// backend's pin_tensor / unpin_tensor; the contract is in
// hisparse/host_registration.h): a process-wide registry of the ranges
// registered here, each with the exact segments it registered, so that
// unregistering undoes exactly one registration.
#pragma once

#include <cstdint>

#include "core/tensor.hpp"

namespace hisparse {

void register_host_memory(void* data, uint64_t bytes, const Device& device);
void unregister_host_memory(void* data);
bool host_memory_registered(const void* data, uint64_t bytes);

}  // namespace hisparse
