"""Experiment only (session 7, dropped): the held filter is built right
after the first chunk's top-k loads are issued (before the chunk loop)
instead of before B2a. The dgi row has landed by then (~5,000 cycles after
the wait), but the fused step was no faster (bench/results/
resolver_held_filter_h200.json, run 7). Applies to the kernel of ee0100b:

    python3 bench/lab/resolver_cuts/held_filter_after_topk.py cpp/cuda/resolve_residency.cu
"""
import sys
p = sys.argv[1]
s = open(p).read()
def rep(old, new):
    global s
    assert s.count(old) == 1, old
    s = s.replace(old, new)
build_start = s.index("      if (early_stage && base == 0) {\n        // The words of the dgi row")
build_end = s.index("        });\n      }\n", build_start) + len("        });\n      }\n")
block = s[build_start:build_end]
s = s[:build_start] + s[build_end:]
block = block.replace("early_stage && base == 0", "early_stage")
block = "\n".join(l[2:] if l.startswith("  ") else l for l in block.splitlines()) + "\n"
anchor = "    for (int x = 0; x < kPerThread; ++x) next_position[x] = local + x < entries ? entry_position(local + x) : -1;\n"
rep(anchor, anchor + block)
open(p, "w").write(s)
print("variant E", p)
