"""Per-phase latency of the resolver: the same graph-timed steps as
bench/bench_resolver.py, with the kernel cut after each phase
(HS_RESOLVER_STOP, an experiment build only)."""
import json, os, sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # bench/
import bench_resolver as br

args = br.parse_args(["--steps", "24", "--replays", "9"])
max_batch = 100
pool, host_cache, hot_cache = br.make_caches(args, max_batch, "cuda")
out = []
for batch in (1, 100):
    for miss in (0.001,):
        s = br.Scenario(args, batch, miss, host_cache, hot_cache)
        s.resolve(0); s.resolve(1); torch.cuda.synchronize()
        snap = (s.dgi.clone(), s.lru.clone())
        def restore():
            s.dgi.copy_(snap[0]); s.lru.copy_(snap[1])
        stream = torch.cuda.Stream()
        for fused in (False, True):
            for stop in (1, 21, 22, 23, 24, 2, 3, 4, 5, 6, 0):
                if not fused and stop == 6:
                    continue
                os.environ["HS_RESOLVER_STOP"] = str(stop)
                g = torch.cuda.CUDAGraph(); restore(); torch.cuda.synchronize()
                with torch.cuda.graph(g, stream=stream):
                    for step in range(2, 2 + args.steps):
                        s.resolve(step, fused=fused)
                us = br.time_graph(g, restore, args.replays) / args.steps * 1e3
                out.append(dict(batch=batch, miss=miss, fused=fused, stop=stop, us=us))
                print(f"B={batch} miss={miss} fused={fused} stop={stop}: {us:.2f} us", flush=True)
                del g
os.environ.pop("HS_RESOLVER_STOP")
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "phases.json"), "w"), indent=1)
