// Dynamic shared-memory layout of the CUDA residency resolver, computed on
// the host for the configuration check and the launch, and by the kernel to
// carve its buffer. One definition so the check can never disagree with the
// kernel.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define HS_HOST_DEVICE __host__ __device__
#else
#define HS_HOST_DEVICE
#endif

namespace hisparse {

// Threads per resolver block; also the number of entries inserted into the
// union table per step, which bounds how far the table can overshoot
// max_union_rows before overflow is detected.
constexpr int32_t kResolverThreads = 1024;
constexpr int32_t kResolverWarps = kResolverThreads / 32;

struct ResolverSharedLayout {
  int32_t hash_capacity = 0;  // slots of the union hash table
  uint32_t hash_keys = 0;     // int32 [hash_capacity]
  uint32_t hash_values = 0;   // uint32 [hash_capacity]
  uint32_t member_keys = 0;   // int32 [max_union_rows]: host slot of each union member
  uint32_t member_slots = 0;  // int32 [max_union_rows]: hit position, then hot slot
  uint32_t slot_counts = 0;   // uint32 [ceil(H / 2)]: 16-bit occurrence count per slot
  uint32_t lru_copy = 0;      // int16 [H]: lru_slots row as read
  uint32_t evictable = 0;     // int16 [H]: evictable LRU positions in order
  uint32_t scratch = 0;       // int32 [kResolverScratchWords]: scans and counters
  uint32_t total_bytes = 0;
};

constexpr int32_t kResolverScratchWords = 4 * kResolverWarps + 32;

HS_HOST_DEVICE inline uint32_t resolver_align16(uint64_t bytes) {
  return static_cast<uint32_t>((bytes + 15) / 16 * 16);
}

// The union table holds at most max_union_rows + kResolverThreads keys; 1.5x
// that keeps linear probing short.
HS_HOST_DEVICE inline int32_t resolver_hash_capacity(int32_t max_union_rows) {
  const int64_t keys = static_cast<int64_t>(max_union_rows) + kResolverThreads;
  return static_cast<int32_t>((keys * 3 / 2 + 31) / 32 * 32);
}

HS_HOST_DEVICE inline ResolverSharedLayout resolver_shared_layout(int32_t hot_size,
                                                                  int32_t max_union_rows) {
  ResolverSharedLayout layout;
  layout.hash_capacity = resolver_hash_capacity(max_union_rows);
  uint64_t offset = 0;
  layout.hash_keys = static_cast<uint32_t>(offset);
  offset += resolver_align16(4ull * layout.hash_capacity);
  layout.hash_values = static_cast<uint32_t>(offset);
  offset += resolver_align16(4ull * layout.hash_capacity);
  layout.member_keys = static_cast<uint32_t>(offset);
  offset += resolver_align16(4ull * max_union_rows);
  layout.member_slots = static_cast<uint32_t>(offset);
  offset += resolver_align16(4ull * max_union_rows);
  layout.slot_counts = static_cast<uint32_t>(offset);
  offset += resolver_align16(4ull * ((static_cast<uint64_t>(hot_size) + 1) / 2));
  layout.lru_copy = static_cast<uint32_t>(offset);
  offset += resolver_align16(2ull * hot_size);
  layout.evictable = static_cast<uint32_t>(offset);
  offset += resolver_align16(2ull * hot_size);
  layout.scratch = static_cast<uint32_t>(offset);
  offset += resolver_align16(4ull * kResolverScratchWords);
  layout.total_bytes = static_cast<uint32_t>(offset);
  return layout;
}

}  // namespace hisparse
