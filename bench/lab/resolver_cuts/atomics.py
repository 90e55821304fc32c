"""Resolver time with shared atomics replaced by plain accesses (HS_RESOLVER_AB bits; experiment build)."""
import json, os, sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # bench/
import bench_resolver as br
args = br.parse_args(["--steps", "24", "--replays", "9"])
max_batch = 100
pool, host_cache, hot_cache = br.make_caches(args, max_batch, "cuda")
out = []
for batch in (1, 100):
    s = br.Scenario(args, batch, 0.001, host_cache, hot_cache)
    s.resolve(0); s.resolve(1); torch.cuda.synchronize()
    snap = (s.dgi.clone(), s.lru.clone())
    def restore():
        s.dgi.copy_(snap[0]); s.lru.copy_(snap[1])
    stream = torch.cuda.Stream()
    for ab in (0, 1, 2, 4, 8, 15, 0):
        os.environ["HS_RESOLVER_AB"] = str(ab)
        g = torch.cuda.CUDAGraph(); restore(); torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=stream):
            for step in range(2, 2 + args.steps):
                s.resolve(step)
        us = br.time_graph(g, restore, args.replays) / args.steps * 1e3
        out.append(dict(batch=batch, ab=ab, us=us)); print(f"B={batch} ab={ab}: {us:.2f} us", flush=True)
        del g
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "atomics.json"), "w"), indent=1)
