// Random numbers from the kernel, for names and identities that must not
// collide across processes (shared pool ids, interprocess event handles).
#pragma once

#include <cstdint>

namespace hisparse {

// 64 bits from getrandom; throws HS_ERROR_SYSTEM if the kernel refuses.
uint64_t random_u64();

}  // namespace hisparse
