// What the standalone CUDA programs of bench/ share: a check that ends
// main() with status 1 and the failed call on stderr, and the GPU's global
// timer (nanoseconds, one clock for every SM, so stamps of different blocks
// compare), read at once or once a loaded value is in.
#pragma once

#include <cstdio>

#include <cuda_runtime.h>

#define CK(x)                                                 \
  do {                                                        \
    cudaError_t e = (x);                                      \
    if (e != cudaSuccess) {                                   \
      fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); \
      return 1;                                               \
    }                                                         \
  } while (0)

__device__ __forceinline__ unsigned long long now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The time once `value` is in: the timer read waits for the value's load.
__device__ __forceinline__ unsigned long long now_after(unsigned value) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : "r"(value));
  return t;
}
