// The public boundary: every extern "C" entry point is one api_guard, which
// turns an exception of the core into a status and the thread's last error
// (the only place that happens), and reads and writes the caller's
// size-prefixed structs through read_struct / write_struct.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>

#include "abi/struct_versions.hpp"
#include "core/error.hpp"
#include "hisparse/hisparse.h"

namespace hisparse {

// Records `message` as this thread's last error (hs_last_error()).
void set_last_error(const std::string& message);
void clear_last_error();

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

template <typename T>
T* require_pointer(T* pointer, const char* name) {
  if (pointer == nullptr) invalid_argument(name, ": expected a non-NULL pointer");
  return pointer;
}

// Checks that the caller's struct `name` holds at least the first version
// of this library's `Struct` (struct_versions.hpp), from its struct_size.
template <typename Struct>
const Struct& require_struct_size(const Struct* value, const char* name) {
  require_pointer(value, name);
  const size_t first = first_struct_version_bytes<Struct>();
  if (value->struct_size < first) {
    invalid_argument(name, ": struct_size ", value->struct_size, " is smaller than the ", first,
                     " bytes of this struct; initialise it with its *_init call (or set struct_size = sizeof)");
  }
  return *value;
}

// A copy of the caller's input struct `name`, after checking its size and
// version: the struct opens with struct_size and struct_version (kVersion is
// the version this library reads). The fields of the caller's version are
// read (a caller's struct may be larger; what this library does not know is
// not read), and the fields of later versions take their *_init defaults.
template <uint32_t kVersion, typename Struct>
Struct read_struct(const Struct* caller, const char* name) {
  const Struct& given = require_struct_size(caller, name);
  const uint32_t version = given.struct_version;
  if (version < 1 || version > kVersion) {
    invalid_argument(name, ": struct_version ", version, " is not one this library reads (1 to ", kVersion,
                     "); initialise the struct with its *_init call");
  }
  const size_t bytes = struct_version_bytes<kVersion, Struct>(version);
  if (given.struct_size < bytes) {
    invalid_argument(name, ": struct_size ", given.struct_size, " is smaller than the ", bytes, " bytes of version ",
                     version, " of this struct; initialise it with its *_init call (or set struct_size = sizeof)");
  }
  Struct value;
  StructDefaults<Struct>::fill(&value);
  std::memcpy(static_cast<void*>(&value), &given, bytes);
  return value;
}

// Writes `value` into the caller's output struct (checked with
// require_struct_size first) as the newest version, up to kVersion, that
// its struct_size holds, keeping the caller's struct_size and setting
// struct_version to that version. Bytes past it are left alone.
template <uint32_t kVersion, typename Struct>
void write_struct(Struct* out, Struct value) {
  uint32_t version = kVersion;
  while (version > 1 && struct_version_bytes<kVersion, Struct>(version) > out->struct_size) --version;
  value.struct_size = out->struct_size;
  value.struct_version = version;
  std::memcpy(static_cast<void*>(out), &value, struct_version_bytes<kVersion, Struct>(version));
}

}  // namespace hisparse
