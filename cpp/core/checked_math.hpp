// Byte-range arithmetic on caller-given sizes: an overflow is a bad
// argument, named, never a wrapped-around range.
#pragma once

#include <cstdint>

#include "core/error.hpp"

namespace hisparse {

inline int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) invalid_argument(what, ": the byte range overflows 64 bits");
  return out;
}

inline int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) invalid_argument(what, ": the byte range overflows 64 bits");
  return out;
}

}  // namespace hisparse
