// Hopper (sm_90) synchronisation used by the kernels: bulk (TMA) copies
// into shared memory counted in by an mbarrier, and programmatic dependent
// launch. Every helper compiles to nothing before sm_90; callers reach them
// only when the launcher found an sm_90 device.
#pragma once

#include <cstdint>

namespace hisparse {
namespace cuda {

// An mbarrier (8 bytes of shared memory, 8-aligned, at shared address
// `barrier`) that completes its first phase after one arrival and every
// byte announced by bulk_copy_to_shared. One thread initialises it; a block
// barrier must follow before other threads use it.
__device__ __forceinline__ void mbarrier_init_one_arrival(uint32_t barrier) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(barrier) : "memory");
  // Makes the initialised barrier visible to the bulk-copy (async) proxy.
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// Announces `bytes` more to arrive on the barrier, then starts one bulk copy
// of them from global (device or registered host) memory to shared address
// `dst`. `bytes`, `dst` and `src` must be multiples of 16.
__device__ __forceinline__ void bulk_copy_to_shared(uint32_t barrier, uint32_t dst, const void* src, uint32_t bytes) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(barrier)
               : "memory");
#endif
}

// The barrier's one expected arrival: after every bulk_copy_to_shared it counts.
__device__ __forceinline__ void mbarrier_arrive(uint32_t barrier) {
#if __CUDA_ARCH__ >= 900
  asm volatile("{\n .reg .b64 state;\n mbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(barrier) : "memory");
#endif
}

// Waits until the first phase is complete: the arrival and every announced
// byte are in, and the copied bytes are visible to the calling thread.
__device__ __forceinline__ void mbarrier_wait_first_phase(uint32_t barrier) {
#if __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  while (!done) {
    asm volatile("{\n .reg .pred complete;\n mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], 0;\n"
                 " selp.u32 %0, 1, 0, complete;\n}\n"
                 : "=r"(done)
                 : "r"(barrier)
                 : "memory");
  }
#endif
}

// Programmatic dependent launch: the next kernel of the stream, when it was
// launched with programmatic stream serialization, may start its blocks once
// every block of this grid has called this (or exited)...
__device__ __forceinline__ void allow_dependent_launch() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// ... and a kernel so launched waits here until the kernel before it has
// finished and its writes are visible. Both are no-ops without such a launch.
__device__ __forceinline__ void wait_for_prior_grid() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

}  // namespace cuda
}  // namespace hisparse
