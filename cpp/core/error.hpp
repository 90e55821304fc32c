// Errors inside the core are C++ exceptions carrying an hs_status_t; the C ABI
// boundary (abi/api_guard.hpp) turns them into a status and the thread's last
// error, once, when they leave the library.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "hisparse/hisparse.h"

namespace hisparse {

class Error : public std::runtime_error {
 public:
  Error(hs_status_t status, const std::string& message) : std::runtime_error(message), status_(status) {}
  hs_status_t status() const noexcept { return status_; }

 private:
  hs_status_t status_;
};

// Concatenates anything streamable: str("expected ", 4, ", got ", n).
template <typename... Parts>
std::string str(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

template <typename... Parts>
[[noreturn]] void fail(hs_status_t status, Parts&&... parts) {
  throw Error(status, str(std::forward<Parts>(parts)...));
}

template <typename... Parts>
[[noreturn]] void invalid_argument(Parts&&... parts) {
  fail(HS_ERROR_INVALID_ARGUMENT, std::forward<Parts>(parts)...);
}

// A C ABI flag field (int32, 0 or 1) as a bool, or an error naming it.
inline bool require_flag(int32_t value, const char* name) {
  if (value != 0 && value != 1) invalid_argument(name, ": expected 0 or 1, got ", value);
  return value != 0;
}

}  // namespace hisparse
