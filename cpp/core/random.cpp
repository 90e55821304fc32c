#include "core/random.hpp"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "core/error.hpp"

namespace hisparse {

uint64_t random_u64() {
  uint64_t value = 0;
  auto* bytes = reinterpret_cast<unsigned char*>(&value);
  size_t filled = 0;
  while (filled < sizeof(value)) {
    const ssize_t got = getrandom(bytes + filled, sizeof(value) - filled, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      fail(HS_ERROR_SYSTEM, "getrandom failed: ", std::strerror(errno));
    }
    filled += static_cast<size_t>(got);
  }
  return value;
}

}  // namespace hisparse
