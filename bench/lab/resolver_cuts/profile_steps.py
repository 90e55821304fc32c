"""Eager resolver steps for Nsight Compute (no CUDA graph, so every launch is
its own profile result): bench_resolver's trace at one (batch, miss rate)
point, a cold start (launches 0 and 1), three steps of the resolver alone
(launches 2-4), the state restored, then the same three steps with the fused
gather (launches 5-7).

    ncu --kernel-name regex:resolve_residency --launch-skip 3 --launch-count 4 \\
        --section SourceCounters --section InstructionStats --section WarpStateStats \\
        -o prof python3 bench/lab/resolver_cuts/profile_steps.py 100 0.001
    ncu -i prof.ncu-rep --page source --csv --print-source sass > prof_sass.csv

profiles launches 3-6: result 1 is the resolver alone at step 3, result 3 the
fused step 3. instructions.py attributes the counts to source lines."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import bench_resolver  # noqa: E402

batch = int(sys.argv[1]) if len(sys.argv) > 1 else 100
miss_rate = float(sys.argv[2]) if len(sys.argv) > 2 else 0.001
args = bench_resolver.parse_args([])
pool, host_cache, hot_cache = bench_resolver.make_caches(args, batch, "cuda")
scenario = bench_resolver.Scenario(args, batch, miss_rate, host_cache, hot_cache)
scenario.resolve(0)
scenario.resolve(1)
torch.cuda.synchronize()
snapshot = (scenario.dgi.clone(), scenario.lru.clone())
for step in (2, 3, 4):
    scenario.resolve(step)
torch.cuda.synchronize()
scenario.dgi.copy_(snapshot[0])
scenario.lru.copy_(snapshot[1])
for step in (2, 3, 4):
    scenario.resolve(step, fused=True)
torch.cuda.synchronize()
print("swap rows of the last step:", int(scenario.swap_counts.sum()))
