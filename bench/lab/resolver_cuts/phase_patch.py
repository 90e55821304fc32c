"""Experiment only (not committed): early exits in the resolver, chosen at
launch by HS_RESOLVER_STOP (0 = full kernel), to time each phase's share."""
import re, sys
path = sys.argv[1]
s = open(path).read()
assert s.count("  ResolverMissStage miss_stage;\n") == 1
s = s.replace("  ResolverMissStage miss_stage;\n", "  ResolverMissStage miss_stage;\n  int32_t stop_after;\n", 1)
points = [
    ("  __syncthreads();  // B1\n", 1),
    ("  __syncthreads();  // B2: ranks, member keys, slot counts and the dgi row copy final\n", 2),
    ("  __syncthreads();  // B3\n", 3),
    ("  // ---- Phase D: members.", 4),
    ("  __syncthreads();  // B6: member slots final, new LRU complete\n", 5),
    ("  // ---- Phase F: state out, then per-entry outputs.\n", 6),
]
# Inside the union loop: 21 after the first top-k loads, 22 after classify +
# insert, 23 after B2a, 24 after the rank scan.
union_points = [
    ("    for (int32_t base = 0; base < entries && union_size < max_union; base += kResolverUnionChunk) {\n", 21,
     "  if (c.stop_after == 21) { if (next_position[0] == -12345 && p.stats) p.stats[7] = next_position[1]; wait_async_copies<0>(); return; }\n", True),
    ("      __syncthreads();  // B2a: every insertion and marker of the chunk is in place\n", 22,
     "      if (c.stop_after == 22) { wait_async_copies<0>(); return; }\n", True),
    ("      bool first_entry[kPerThread];\n", 23,
     "      if (c.stop_after == 23) { wait_async_copies<0>(); return; }\n", True),
    ("      // B2b (inside block_exclusive_sum); the next chunk's writes of the scan\n", 24,
     "      if (c.stop_after == 24) { if (rank == -12345 && p.stats) p.stats[7] = new_keys; wait_async_copies<0>(); return; }\n", True),
]
for anchor, n, code, before in union_points:
    assert s.count(anchor) == 1, anchor
    s = s.replace(anchor, code + anchor)
for anchor, n in points:
    assert s.count(anchor) == 1, anchor
    exit_code = f"  if (c.stop_after == {n}) {{ wait_async_copies<0>(); return; }}\n"
    if anchor.startswith("  // ----"):
        s = s.replace(anchor, exit_code + anchor)
    else:
        s = s.replace(anchor, anchor + exit_code)
s = s.replace("  constants.entry_output_stride = shared_stride ? stride : -1;\n",
              "  constants.entry_output_stride = shared_stride ? stride : -1;\n"
              "  { const char* e = std::getenv(\"HS_RESOLVER_STOP\"); constants.stop_after = e ? std::atoi(e) : 0; }\n", 1)
s = s.replace("#include <algorithm>\n", "#include <algorithm>\n#include <cstdlib>\n", 1)
open(path, "w").write(s)
print("patched", path)
