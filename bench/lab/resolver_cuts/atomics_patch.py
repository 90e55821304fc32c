"""Experiment only (not committed): replace the resolver's shared atomics by
plain accesses, chosen at launch by the bits of HS_RESOLVER_AB, to time what
the atomics cost (results are only right for the bench's clean inputs)."""
import sys
path = sys.argv[1]
s = open(path).read()
def rep(a, b):
    global s
    assert s.count(a) == 1, a
    s = s.replace(a, b)
rep("  ResolverMissStage miss_stage;\n", "  ResolverMissStage miss_stage;\n  int32_t ab;\n")
rep("      hash_insert(hash_keys, capacity, key, h);\n",
    "      if (c.ab & 8) { for (int x = 0; x < kPerThread; ++x) { h[x] = key[x] >= 0 ? hash_home(key[x], capacity) : 0; if (key[x] >= 0) hash_keys[h[x]] = key[x]; } } else hash_insert(hash_keys, capacity, key, h);\n")
rep("      if (j >= 0 && j < H) atomicAdd(counts + (j >> 1), 1u << ((j & 1) * 16));",
    "      if (j >= 0 && j < H) { if (c.ab & 1) reinterpret_cast<uint16_t*>(counts)[j] = 1; else atomicAdd(counts + (j >> 1), 1u << ((j & 1) * 16)); }")
rep("          atomicMin(hash_values + h[x], kPending | static_cast<uint32_t>(local + x));",
    "          if (c.ab & 4) hash_values[h[x]] = kPending | static_cast<uint32_t>(local + x); else atomicMin(hash_values + h[x], kPending | static_cast<uint32_t>(local + x));")
rep("      atomicMax(member_slots + (info & kSlotRankMask) - 1, i);",
    "      if (c.ab & 2) member_slots[(info & kSlotRankMask) - 1] = i; else atomicMax(member_slots + (info & kSlotRankMask) - 1, i);")
rep("  constants.entry_output_stride = shared_stride ? stride : -1;\n",
    "  constants.entry_output_stride = shared_stride ? stride : -1;\n  { const char* e = std::getenv(\"HS_RESOLVER_AB\"); constants.ab = e ? std::atoi(e) : 0; }\n")
rep("#include <algorithm>\n", "#include <algorithm>\n#include <cstdlib>\n")
open(path, "w").write(s)
print("patched", path)
