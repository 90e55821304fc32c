// The resolver's union table: a fixed-capacity open-addressing hash map from
// host slot (int32 key >= 0) to union rank (uint32 value), in one block's
// shared memory, in the manner of cuCollections' static_map: sentinel keys,
// a trivially copyable device view over two arrays, no erase.
//
// Invariants the owner of the arrays keeps:
// - `keys` and `values` hold `capacity` words each, `keys` 16-byte aligned;
//   capacity is a multiple of kBucketSlots (the resolver's is a multiple of
//   32, and below 2^16 so that a slot fits an entry code).
// - Before the first insert every key is kEmptyKey and every value kNoRank
//   (all bits set: one fill of ones covers both arrays).
// - Fewer keys than slots are ever inserted, so a probe always ends; the
//   resolver keeps capacity >= 1.5x the keys it can insert, which keeps the
//   probe sequences short.
// - Lookups (find) run only while no thread inserts (a block barrier apart).
//
// Probing: linear from the key's home slot, wrapping at capacity. A key only
// lands past slots that were taken, and keys are never removed, so a lookup
// may stop at the first empty slot at or after the home slot. Lookups read
// aligned buckets of four keys with one 16-byte load.
//
// Ranking: a key's value is its rank in first-occurrence order. While a
// chunk of entries is inserted, each entry offers kPending | (its index in
// the chunk) to its key's value with atomicMin; after a barrier, the entry
// that still finds its own marker there is the key's first occurrence in
// the chunk (is_first_in_chunk), and it stores the key's rank (set_rank).
// Ranks are below kPending, so a later chunk's markers never displace a
// rank already set.
#pragma once

#include <cstdint>

namespace hisparse {
namespace cuda {

constexpr int32_t kEmptyKey = -1;
constexpr uint32_t kNoRank = 0xFFFFFFFFu;
constexpr uint32_t kPending = 0x80000000u;

struct UnionTableView {
  static constexpr int32_t kBucketSlots = 4;

  int32_t* keys;
  uint32_t* values;
  int32_t capacity;

  // Slot of each key[x] >= 0 (keys < 0 are skipped), inserting the key if
  // absent; two threads inserting one key probe the same slots, so they
  // meet at one. The N probes advance together, so their compare-and-swaps
  // are in flight at the same time instead of one key's probe chain waiting
  // on the other's.
  template <int N>
  __device__ __forceinline__ void insert(const int32_t (&key)[N], uint32_t (&slot)[N]) const {
    bool pending[N];
#pragma unroll
    for (int x = 0; x < N; ++x) {
      pending[x] = key[x] >= 0;
      slot[x] = pending[x] ? home(key[x]) : 0;
    }
    while (true) {
      int32_t previous[N];
      bool any = false;
#pragma unroll
      for (int x = 0; x < N; ++x) {
        if (pending[x]) previous[x] = atomicCAS(keys + slot[x], kEmptyKey, key[x]);
      }
#pragma unroll
      for (int x = 0; x < N; ++x) {
        if (!pending[x]) continue;
        if (previous[x] == kEmptyKey || previous[x] == key[x]) {
          pending[x] = false;
        } else if (++slot[x] == static_cast<uint32_t>(capacity)) {
          slot[x] = 0;
        }
        any |= pending[x];
      }
      if (!any) return;
    }
  }

  // The value of `key` (>= 0), kNoRank when absent. A key is held by one
  // slot only, so a match anywhere in a bucket is the key's slot, even
  // before the home slot.
  __device__ __forceinline__ uint32_t find(int32_t key) const {
    const uint32_t start = home(key);
    const uint32_t buckets = static_cast<uint32_t>(capacity) / kBucketSlots;
    uint32_t bucket = start / kBucketSlots;
    uint32_t probed = 0xFu << (start % kBucketSlots);  // slots of the first bucket at or after home
    while (true) {
      const int4 held = reinterpret_cast<const int4*>(keys)[bucket];
      const uint32_t found = bucket_match(held, key);
      if (found != 0) return values[bucket * kBucketSlots + __ffs(found) - 1];
      if ((bucket_match(held, kEmptyKey) & probed) != 0) return kNoRank;
      probed = 0xFu;
      if (++bucket == buckets) bucket = 0;
    }
  }

  __device__ __forceinline__ int32_t key_at(uint32_t slot) const { return keys[slot]; }
  __device__ __forceinline__ uint32_t value_at(uint32_t slot) const { return values[slot]; }

  // The ranking protocol (see the top of this file): offer, after a barrier
  // test, then publish the rank.
  __device__ __forceinline__ void offer_first(uint32_t slot, uint32_t chunk_index) const {
    atomicMin(values + slot, kPending | chunk_index);
  }
  __device__ __forceinline__ bool is_first_in_chunk(uint32_t slot, uint32_t chunk_index) const {
    return values[slot] == (kPending | chunk_index);
  }
  __device__ __forceinline__ void set_rank(uint32_t slot, uint32_t rank) const { atomicExch(values + slot, rank); }

 private:
  // Fibonacci hashing onto [0, capacity).
  __device__ __forceinline__ uint32_t home(int32_t key) const {
    return __umulhi(static_cast<uint32_t>(key) * 0x9E3779B1u, static_cast<uint32_t>(capacity));
  }
  // Mask (bit i for slot i) of the bucket's slots equal to `value`.
  static __device__ __forceinline__ uint32_t bucket_match(const int4& bucket, int32_t value) {
    return (bucket.x == value ? 1u : 0u) | (bucket.y == value ? 2u : 0u) | (bucket.z == value ? 4u : 0u) |
           (bucket.w == value ? 8u : 0u);
  }
};

}  // namespace cuda
}  // namespace hisparse
