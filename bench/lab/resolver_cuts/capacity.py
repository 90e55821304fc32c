"""Resolver time at B = 100, 0.1% misses, with the union table sized for
HS_RESOLVER_UNION_MULT times max_union_rows (a lower load factor) and, with
HS_RESOLVER_AB = 8, plain stores instead of the insert CAS (experiment build
with atomics_patch.py and capacity_patch.py applied)."""
import json, os, sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # bench/
import bench_resolver as br
args = br.parse_args(["--steps", "24", "--replays", "7"])
pool, host_cache, hot_cache = br.make_caches(args, 100, "cuda")
out = []
for batch in (100,):
    s = br.Scenario(args, batch, 0.001, host_cache, hot_cache)
    s.resolve(0); s.resolve(1); torch.cuda.synchronize()
    snap = (s.dgi.clone(), s.lru.clone())
    def restore():
        s.dgi.copy_(snap[0]); s.lru.copy_(snap[1])
    stream = torch.cuda.Stream()
    for mult, ab in ((1, 0), (3, 0), (3, 8), (1, 8), (1, 0)):
        os.environ["HS_RESOLVER_UNION_MULT"] = str(mult); os.environ["HS_RESOLVER_AB"] = str(ab)
        g = torch.cuda.CUDAGraph(); restore(); torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=stream):
            for step in range(2, 2 + args.steps):
                s.resolve(step)
        us = br.time_graph(g, restore, args.replays) / args.steps * 1e3
        out.append(dict(batch=batch, mult=mult, ab=ab, us=us)); print(f"B={batch} mult={mult} ab={ab}: {us:.2f} us", flush=True)
        del g
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "capacity.json"), "w"), indent=1)
