"""Per-phase latency of the resolver: the same graph-timed steps as
bench/bench_resolver.py, with the kernel cut after each phase
(HS_RESOLVER_STOP, an experiment build only)."""
import json, os, sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # bench/
import bench_resolver as br
import hisparse

args = br.parse_args(["--steps", "24", "--replays", "9"])
max_batch = 100
blocks_per_request = args.context // args.block_size
host_rows = (1 + max_batch * blocks_per_request) * args.block_size
pool = hisparse.HostPool(host_rows * args.row_bytes, register="always")
host_cache = pool.view("uint8", (host_rows, args.row_bytes))
host_cache.fill_(0x5A)
hot_cache = torch.empty((max_batch * args.hot_size, args.row_bytes), dtype=torch.uint8, device="cuda")
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
