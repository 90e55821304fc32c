// Errors inside the core are C++ exceptions carrying an hs_status_t; the C ABI
// boundary (api_guard) turns them into a status and the thread's last error.
#pragma once

#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "hisparse/hisparse.h"

namespace hisparse {

class Error : public std::runtime_error {
 public:
  Error(hs_status_t status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
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

// Records `message` as this thread's last error.
void set_last_error(const std::string& message);
void clear_last_error();

// Runs `body` and converts any exception into a status plus last-error text.
// Every extern "C" entry point is one call to this.
template <typename Body>
hs_status_t api_guard(Body&& body) noexcept {
  try {
    clear_last_error();
    body();
    return HS_SUCCESS;
  } catch (const Error& error) {
    set_last_error(error.what());
    return error.status();
  } catch (const std::bad_alloc&) {
    set_last_error("hisparse: out of host memory");
    return HS_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& error) {
    set_last_error(str("hisparse internal error: ", error.what()));
    return HS_ERROR_INTERNAL;
  } catch (...) {
    set_last_error("hisparse internal error: unknown exception");
    return HS_ERROR_INTERNAL;
  }
}

// Null-pointer check for C ABI arguments.
template <typename T>
T* require_pointer(T* pointer, const char* name) {
  if (pointer == nullptr) invalid_argument(name, ": expected a non-NULL pointer");
  return pointer;
}

// Checks that a versioned struct is at least as large as the fields we read.
template <typename Struct>
const Struct& require_struct(const Struct* value, const char* name, size_t min_size) {
  require_pointer(value, name);
  if (value->struct_size < min_size) {
    invalid_argument(name, ": struct_size ", value->struct_size, " is smaller than the ",
                     min_size, " bytes this version reads; initialise it with the *_init call");
  }
  return *value;
}

// Writes `value` into a caller's versioned output struct without going past
// the caller's struct_size (an older caller has a smaller struct).
template <typename Struct>
void write_struct(Struct* out, Struct value, uint32_t version) {
  const size_t size = out->struct_size < sizeof(Struct) ? out->struct_size : sizeof(Struct);
  value.struct_size = out->struct_size;
  value.struct_version = version;
  std::memcpy(static_cast<void*>(out), &value, size);
}

}  // namespace hisparse
