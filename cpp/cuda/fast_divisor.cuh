// Division by a launch constant as a multiply-high and a shift (the
// round-up method of Granlund and Montgomery with a 33-bit multiplier
// 2^32 + m): exact for every numerator in [0, 2^31). A 32-bit division has
// no hardware instruction and costs about twenty, which matters in a kernel
// bound by instruction issue.
//
// Built on the host (make), passed to the kernel by value, used on the device.
#pragma once

#include <cstdint>

namespace hisparse {
namespace cuda {

struct FastDivisor {
  uint32_t divisor = 1;
  uint32_t multiplier = 1;
  uint32_t shift = 0;

  // d > 0.
  static FastDivisor make(int32_t d) {
    FastDivisor f;
    f.divisor = static_cast<uint32_t>(d);
    uint32_t log2_ceil = 0;
    while ((uint64_t{1} << log2_ceil) < f.divisor) ++log2_ceil;
    f.shift = log2_ceil;
    const uint64_t excess = (uint64_t{1} << log2_ceil) - f.divisor;  // < divisor
    f.multiplier = static_cast<uint32_t>((excess << 32) / f.divisor + 1);
    return f;
  }
  // n / divisor for 0 <= n < 2^31.
  __device__ __forceinline__ int32_t quotient(int32_t n) const {
    const uint32_t u = static_cast<uint32_t>(n);
    return static_cast<int32_t>((__umulhi(u, multiplier) + u) >> shift);
  }
  // n % divisor, given q = quotient(n).
  __device__ __forceinline__ int32_t remainder(int32_t n, int32_t q) const {
    return n - q * static_cast<int32_t>(divisor);
  }
};

}  // namespace cuda
}  // namespace hisparse
