"""A full decode step of an L-layer model through hisparse.Runtime, with the
copy-stream prefetch of index-group followers on and off, against the same
step without any swap (compute only), timed side by side in one run.

Presets (--presets):
  dsv32  DeepSeek-V3.2-like: every layer has its own indexer (index groups of 1)
  glm5   GLM-5-like shared index: index groups of 4 layers (one leader, three followers)

Each layer: the runtime's swap_in (the group leader resolves the step's top-k
once and gathers its rows, in a second launch or, in the "prefetch_fused"
mode, inside the resolve launch; followers gather theirs, prefetched by the
leader or staged on their own), then a stand-in attention kernel of fixed duration
(--compute-us, torch.cuda._sleep) on the compute stream.

Trace: per request, step i selects the window [i*m, i*m + k) of a random
permutation of its context (m = --fresh x k), so each step has m new
positions (misses, local to the request's own host blocks) and k - m hits.
Every layer has its own host cache (one registered HostPool) and its own hot
view (one slab per index group, layers interleaved block by block).

Timing: --steps consecutive decode steps are captured in one CUDA graph per
mode; the hot-region state is restored from a snapshot before every replay,
outside the timed window; step time = median replay time / steps. Exposed
swap time per layer = (step - compute only) / layers. For grouped presets a
"leaders only" graph (followers move nothing) splits the exposure between
leaders and followers. The link's ceiling (contiguous pinned memcpy H2D) is
measured in the same run.

    python bench/bench_decode_step.py --out bench/results/decode_step_h200.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import torch

import hisparse

PRESETS = {
    "dsv32": {"group_size": 1, "row_bytes": 656},
    "glm5": {"group_size": 4, "row_bytes": 656},
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="dsv32,glm5")
    parser.add_argument("--layers", type=int, default=61)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=2048)
    parser.add_argument("--hot-size", type=int, default=4096)
    parser.add_argument("--block-size", type=int, default=64, help="host and hot block size")
    parser.add_argument("--context", type=int, default=4096, help="positions per request")
    parser.add_argument("--fresh", type=float, default=0.05, help="fraction of each step's top-k that is new")
    parser.add_argument("--compute-us", type=float, default=150.0, help="stand-in attention per layer")
    parser.add_argument("--steps", type=int, default=6, help="decode steps per captured graph")
    parser.add_argument("--replays", type=int, default=5)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    return parser.parse_args(argv)


def time_graph(graph, restore, replays):
    """Median milliseconds of one replay; `restore` runs before each, untimed."""
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(replays + 1):
        restore()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[1:])


def memcpy_bandwidth(host, nbytes):
    """Contiguous pinned host-to-device copy, GB/s (median of 10)."""
    src = host[:nbytes]
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(11):
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return nbytes / (statistics.median(times[1:]) * 1e-3) / 1e9


def sleep_cycles_per_us():
    """Calibrate torch.cuda._sleep (it spins for a number of clock cycles)."""
    cycles = 2_000_000
    torch.cuda._sleep(cycles)  # warm-up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return cycles / (statistics.median(times) * 1e3)


class Model:
    """L runtimes in index groups of `group_size`, bound to per-layer host caches and per-group slabs."""

    def __init__(self, args, preset, host_caches):
        device = torch.device("cuda")
        self.args = args
        self.group_size = preset["group_size"]
        row_bytes = preset["row_bytes"]
        bs, batch, k = args.block_size, args.batch, args.top_k
        self.config = hisparse.Config(top_k=k, device_buffer_size=args.hot_size, max_union_rows=k,
                                      row_bytes=row_bytes, block_size=bs, hot_block_size=bs)
        hot_blocks = -(-args.hot_size // bs)
        num_blocks = 1 + batch * hot_blocks
        self.hot_table = (1 + torch.arange(batch * hot_blocks, dtype=torch.int32, device=device)).view(batch, hot_blocks)
        blocks_per_request = args.context // bs
        base = 1 + torch.arange(batch, dtype=torch.int32, device=device)[:, None] * blocks_per_request
        self.source_table = (base + torch.arange(blocks_per_request, dtype=torch.int32, device=device)).contiguous()
        self.req_id = torch.arange(batch, dtype=torch.int32, device=device)
        self.state_rows = torch.arange(batch, dtype=torch.int32, device=device)

        self.runtimes, self.slabs, self.leaders = [], [], []
        block_bytes = bs * row_bytes
        for first in range(0, args.layers, self.group_size):
            size = min(self.group_size, args.layers - first)
            slab = torch.empty(num_blocks * size * block_bytes, dtype=torch.uint8, device=device)
            self.slabs.append(slab)
            leader = None
            for i in range(size):
                runtime = hisparse.Runtime(self.config, max_num_reqs=batch, device=device, leader=leader)
                runtime.request_state_indices = self.state_rows
                runtime.bind_source_cache(host_caches[first + i])
                runtime.bind_hot_cache(slab, byte_offset=i * block_bytes, block_stride=size * block_bytes,
                                       num_blocks=num_blocks, block_size=bs, block_table=self.hot_table)
                if leader is None:
                    leader = runtime
                    self.leaders.append(runtime)
                self.runtimes.append(runtime)

        self.misses_per_request = max(1, round(args.fresh * k))
        total_steps = 2 + args.steps
        if k + total_steps * self.misses_per_request > args.context:
            raise SystemExit(f"--context {args.context} too small for {total_steps} steps at --fresh {args.fresh}")
        order = torch.argsort(torch.rand(batch, args.context, device=device), dim=1).to(torch.int32)
        m = self.misses_per_request
        self.topk = torch.stack([order[:, i * m: i * m + k] for i in range(total_steps)]).contiguous()
        self.snapshot = None

    def step(self, index, mode, cycles):
        """One decode step. mode: prefetch | prefetch_fused (leaders copy their
        own rows in the resolve launch) | no_prefetch | leaders_only | compute."""
        for runtime in self.runtimes:
            runtime.begin_forward()
        for runtime in self.runtimes:
            if mode != "compute":
                if runtime.is_group_leader:
                    runtime.swap_in(self.topk[index], self.req_id, block_table=self.source_table,
                                    block_size=self.args.block_size, prefetch=mode.startswith("prefetch"),
                                    fused_gather=mode == "prefetch_fused")
                elif mode != "leaders_only":
                    runtime.swap_in(num_tokens=self.args.batch)
            torch.cuda._sleep(cycles)

    def take_snapshot(self):
        torch.cuda.synchronize()
        self.snapshot = [(r.device_global_indices.clone(), r.lru_slots.clone()) for r in self.leaders]

    def restore(self):
        for runtime, (dgi, lru) in zip(self.leaders, self.snapshot):
            runtime.device_global_indices.copy_(dgi)
            runtime.lru_slots.copy_(lru)

    def counters(self):
        torch.cuda.synchronize()
        stats = [leader.stats() for leader in self.leaders]
        return {
            "misses": sum(s["misses"] for s in stats),
            "hits": sum(s["hits"] for s in stats),
            "bytes_moved": sum(s["bytes_moved"] for s in stats),
        }


def run_preset(args, name, preset, host_caches, cycles, memcpy_gbps):
    model = Model(args, preset, host_caches)
    for index in range(2):  # cold start, then the first steady step
        model.step(index, "no_prefetch", cycles)
    model.take_snapshot()

    results = {"preset": name, **preset, "layers": args.layers, "index_groups": len(model.leaders),
               "misses_per_request_step": model.misses_per_request}
    modes = ["compute", "no_prefetch", "prefetch", "prefetch_fused"] + (
        ["leaders_only"] if model.group_size > 1 else [])
    stream = torch.cuda.Stream()
    for mode in modes:
        model.restore()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for index in range(2, 2 + args.steps):
                model.step(index, mode, cycles)
        before = model.counters()
        results[f"step_ms_{mode}"] = time_graph(graph, model.restore, args.replays) / args.steps
        after = model.counters()
        if mode == "prefetch":
            replays = args.replays + 1
            steps = replays * args.steps
            misses = after["misses"] - before["misses"]
            hits = after["hits"] - before["hits"]
            results["misses_per_step"] = misses / steps
            results["hit_rate"] = hits / max(hits + misses, 1)
            results["bytes_moved_per_step"] = (after["bytes_moved"] - before["bytes_moved"]) / steps
        del graph

    layers = args.layers
    compute = results["step_ms_compute"]
    for mode in ("no_prefetch", "prefetch", "prefetch_fused"):
        results[f"exposed_swap_us_per_layer_{mode}"] = (results[f"step_ms_{mode}"] - compute) * 1e3 / layers
    if "step_ms_leaders_only" in results:
        followers = layers - len(model.leaders)
        results["exposed_swap_us_per_leader"] = (results["step_ms_leaders_only"] - compute) * 1e3 / len(model.leaders)
        results["exposed_swap_us_per_follower_prefetch"] = (
            (results["step_ms_prefetch"] - results["step_ms_leaders_only"]) * 1e3 / followers)
        results["exposed_swap_us_per_follower_no_prefetch"] = (
            (results["step_ms_no_prefetch"] - results["step_ms_leaders_only"]) * 1e3 / followers)
    bytes_per_layer = results["bytes_moved_per_step"] / layers
    results["ideal_transfer_us_per_layer"] = bytes_per_layer / (memcpy_gbps * 1e9) * 1e6
    del model
    torch.cuda.empty_cache()
    return results


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_decode_step needs a CUDA device")
    names = args.presets.split(",")
    for name in names:
        if name not in PRESETS:
            raise SystemExit(f"--presets: unknown preset {name!r}; choose from {sorted(PRESETS)}")
    row_bytes = max(PRESETS[name]["row_bytes"] for name in names)
    host_rows = (1 + args.batch * (args.context // args.block_size)) * args.block_size
    layer_bytes = host_rows * row_bytes
    setup = time.perf_counter()
    pool = hisparse.HostPool(args.layers * layer_bytes, register="always")
    setup = time.perf_counter() - setup
    flat = pool.view("uint8")
    memcpy_gbps = memcpy_bandwidth(flat, min(256 << 20, flat.numel()))
    cycles = int(args.compute_us * sleep_cycles_per_us())

    presets = []
    for name in names:
        rb = PRESETS[name]["row_bytes"]
        caches = [flat[i * layer_bytes: i * layer_bytes + host_rows * rb].view(host_rows, rb)
                  for i in range(args.layers)]
        r = run_preset(args, name, PRESETS[name], caches, cycles, memcpy_gbps)
        presets.append(r)
        line = (f"{name:6} groups={r['index_groups']:<3} step: compute {r['step_ms_compute']:.3f} ms, "
                f"no prefetch {r['step_ms_no_prefetch']:.3f} ms, prefetch {r['step_ms_prefetch']:.3f} ms | "
                f"exposed/layer: {r['exposed_swap_us_per_layer_no_prefetch']:.1f} us -> "
                f"{r['exposed_swap_us_per_layer_prefetch']:.1f} us, fused leaders "
                f"{r['exposed_swap_us_per_layer_prefetch_fused']:.1f} us")
        if "exposed_swap_us_per_follower_prefetch" in r:
            line += (f" (leader {r['exposed_swap_us_per_leader']:.1f} us, follower "
                     f"{r['exposed_swap_us_per_follower_prefetch']:.1f} us prefetched / "
                     f"{r['exposed_swap_us_per_follower_no_prefetch']:.1f} us not)")
        line += f" | hit rate {r['hit_rate']:.4f}, {r['bytes_moved_per_step'] / 2**20:.1f} MiB/step"
        print(line, flush=True)
        del caches

    result = {
        "benchmark": "decode_step",
        "command": " ".join([sys.executable.split("/")[-1]] + sys.argv),
        "config": vars(args),
        "environment": {
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "hisparse": hisparse.__version__,
            "python": platform.python_version(),
            "host_pool_bytes": args.layers * layer_bytes,
            "host_pool_setup_seconds": setup,
            "sleep_cycles_per_compute": cycles,
        },
        "memcpy_h2d_gbps": memcpy_gbps,
        "presets": presets,
    }
    del flat
    torch.cuda.synchronize()
    pool.release(force=True)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)
    return result


if __name__ == "__main__":
    main()
