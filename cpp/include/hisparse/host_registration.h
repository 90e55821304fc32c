/*
 * Registration of caller-owned host memory (the seed backend's pin_tensor and
 * unpin_tensor): memory the caller allocated (a torch tensor, a mapping of
 * its own) becomes readable by the kernels of a CUDA device zero-copy, as a
 * hisparse.HostPool's pages are. hs_host_register registers [data, data +
 * bytes) with device (device_type, device_index; -1 = the current device) in
 * segments of at most 64 GiB (a single larger cudaHostRegister fails), and
 * records the range; hs_host_unregister(data) unregisters exactly the
 * segments that call registered, in reverse. On the CPU backend
 * (HS_DEVICE_CPU) there is nothing to register: the range is recorded only,
 * so that the same calls work on both backends.
 *
 * Errors: HS_ERROR_INVALID_ARGUMENT for a NULL, empty or wrapping range,
 * one the process has not mapped readable, one that overlaps a range
 * registered here, and unregistering a pointer no call registered (naming
 * the argument); HS_ERROR_INVALID_STATE for memory of a released host pool
 * (both on every backend); HS_ERROR_CUDA with CUDA's message when the
 * driver refuses (a failed registration leaves nothing registered).
 * Host-only and blocking (registration pins pages); thread-safe. The caller
 * keeps the memory alive until it unregisters it, and unregisters before
 * freeing it.
 *
 * Include this header directly or through hisparse/hisparse.h.
 */
#ifndef HISPARSE_HOST_REGISTRATION_H_
#define HISPARSE_HOST_REGISTRATION_H_

#include "hisparse/hisparse.h"

#ifdef __cplusplus
extern "C" {
#endif

HS_API hs_status_t hs_host_register(void* data, uint64_t bytes, int32_t device_type, int32_t device_index);
HS_API hs_status_t hs_host_unregister(void* data);
/* Whether [data, data + bytes) lies inside one range registered here (*registered 1 or 0);
 * HS_ERROR_INVALID_ARGUMENT for a range that wraps around. */
HS_API hs_status_t hs_host_is_registered(const void* data, uint64_t bytes, int32_t* registered);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HISPARSE_HOST_REGISTRATION_H_ */
