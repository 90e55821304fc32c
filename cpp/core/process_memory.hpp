// The calling process's memory map (/proc/self/maps), for the one host loop
// that is handed raw addresses as data (swap_blocks_batch on the CPU): an
// address range that is not mapped with the access the copy needs is
// refused before it is touched, instead of faulting.
#pragma once

#include <cstdint>
#include <vector>

namespace hisparse {

class ProcessMemoryMap {
 public:
  // Reads the map now; throws HS_ERROR_SYSTEM when it cannot be read.
  ProcessMemoryMap();
  // Whether every byte of [begin, begin + bytes) is mapped readable, and
  // writable too when `writable`.
  bool covers(uintptr_t begin, uint64_t bytes, bool writable) const;

 private:
  struct Area {
    uintptr_t begin;
    uintptr_t end;
    bool readable;
    bool writable;
  };
  std::vector<Area> areas_;  // in address order, as the kernel lists them
};

}  // namespace hisparse
