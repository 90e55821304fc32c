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

Host layout (--host-layout), both in one registered HostPool:
  token-major  (default, the layout we recommend) each index group's layers
               are the slices host[:, l, :] of one [slots, group size, W]
               region: a token's rows of the group's layers lie side by side,
               so a prefetching leader stages all its followers with one
               gather_compact_group (Runtime.followers_staged_together,
               reported per preset as groups_staged_together)
  layer-major  every layer has its own [slots, W] region
  both         every preset in both layouts, one after the other, compared at
               the end (index groups of 1 are the same in both: run once)
Every layer has its own hot view (one slab per index group, layers
interleaved block by block).

Timing (hisparse.bench.measure.Timer): --steps consecutive decode steps are
captured in one CUDA graph per mode; the residency state (device_global_indices,
lru_slots) is restored from a snapshot before every replay, outside the timed
window (the hot bytes are not: the time does not depend on them); step time
= median replay time / steps. Exposed swap time per layer = (step - compute
only) / layers. For grouped presets a "leaders only" graph (followers move
nothing) splits the exposure between leaders and followers. The link's
ceiling (contiguous pinned memcpy H2D) is measured in the same run. Counters
(misses, hit rate, bytes moved) come from one eager pass of the prefetch mode
from the snapshot.

Bytes check (unless --no-verify): the pool is filled with a distinct pattern;
before timing, each swapping mode runs its steps once eagerly from the full
snapshot (hot bytes included, so a mode that moved nothing would fail), and
every valid entry of the last step, in every layer, must hold its host row
(the slot the resolver reports for it, read from that layer's host cache).
The run exits with status 1 otherwise.

    python bench/bench_decode_step.py --host-layout both --out bench/results/decode_step_h200.json

(about 1-2 minutes on an H200.) --device cpu runs the CPU reference kernels
without the stand-in attention: a check of the bindings and the bytes only,
its figures mean nothing; e.g. --layers 9 --batch 4 --top-k 64 --hot-size 128
--block-size 16 --context 512 --steps 2 --replays 1 --host-layout both.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import hisparse
from hisparse.bench import measure

PRESETS = {
    "dsv32": {"group_size": 1, "row_bytes": 656},
    "glm5": {"group_size": 4, "row_bytes": 656},
}
LAYOUTS = ("token-major", "layer-major")
SWAP_MODES = ("no_prefetch", "prefetch", "prefetch_fused")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="dsv32,glm5")
    parser.add_argument("--host-layout", choices=LAYOUTS + ("both",), default="token-major")
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
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the CPU reference kernels, no stand-in attention (a smoke test)")
    parser.add_argument("--no-verify", action="store_true", help="skip the pool fill and the bytes check")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    args.preset_names = [name for name in args.presets.split(",") if name]
    for name in args.preset_names:
        if name not in PRESETS:
            parser.error(f"--presets: unknown preset {name!r}; choose from {sorted(PRESETS)}")
    return args


def fill_pool(flat):
    """A distinct pattern in every 8 bytes, so rows from a wrong slot or layer show."""
    words = flat[: flat.numel() // 8 * 8].view(torch.int64)
    chunk = 1 << 27
    for start in range(0, words.numel(), chunk):
        piece = words[start: start + chunk]
        torch.arange(start, start + piece.numel(), dtype=torch.int64, out=piece)


def host_caches(flat, layout, layers, group_size, host_rows, row_bytes, layer_bytes):
    """Per layer (backing, piece): its host cache is backing[:, piece, :].

    layer-major: one [host_rows, 1, W] region per layer, at layer x layer_bytes;
    token-major: one [host_rows, group, W] region per index group, at its first
    layer x layer_bytes (no larger than the share of the group's layers)."""

    def region(layer, rows_per_slot):
        start = layer * layer_bytes
        return flat[start: start + host_rows * rows_per_slot * row_bytes].view(host_rows, rows_per_slot, row_bytes)

    backings, pieces = [], []
    for first in range(0, layers, group_size):
        size = min(group_size, layers - first)
        if layout == "token-major":
            backings.append(region(first, size))
            pieces += [(len(backings) - 1, i) for i in range(size)]
        else:
            for layer in range(first, first + size):
                backings.append(region(layer, 1))
                pieces.append((len(backings) - 1, 0))
    return backings, pieces


class Model:
    """L runtimes in index groups of `group_size`, bound to per-layer host caches and per-group slabs."""

    def __init__(self, args, preset, backings, pieces):
        device = self.device = torch.device(args.device)
        self.args = args
        self.group_size = preset["group_size"]
        self.row_bytes = row_bytes = preset["row_bytes"]
        self.backings, self.pieces = backings, pieces
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

        # groups: (leader, slab, [(runtime, layer, position in the group)])
        self.runtimes, self.groups = [], []
        block_bytes = bs * row_bytes
        for first in range(0, args.layers, self.group_size):
            size = min(self.group_size, args.layers - first)
            slab = torch.empty(num_blocks * size * block_bytes, dtype=torch.uint8, device=device)
            leader, members = None, []
            for i in range(size):
                runtime = hisparse.Runtime(self.config, max_num_reqs=batch, device=device, leader=leader)
                runtime.request_state_indices = self.state_rows
                backing, piece = pieces[first + i]
                runtime.bind_source_cache(backings[backing][:, piece, :])
                runtime.bind_hot_cache(slab, byte_offset=i * block_bytes, block_stride=size * block_bytes,
                                       num_blocks=num_blocks, block_size=bs, block_table=self.hot_table)
                if leader is None:
                    leader = runtime
                members.append((runtime, first + i, i))
                self.runtimes.append(runtime)
            self.groups.append((leader, slab, members))
        self.leaders = [leader for leader, _, _ in self.groups]

        self.misses_per_request = max(1, round(args.fresh * k))
        total_steps = 2 + args.steps
        if k + total_steps * self.misses_per_request > args.context:
            raise SystemExit(f"--context {args.context} too small for {total_steps} steps at --fresh {args.fresh}")
        order = torch.argsort(torch.rand(batch, args.context, device=device), dim=1).to(torch.int32)
        m = self.misses_per_request
        self.topk = torch.stack([order[:, i * m: i * m + k] for i in range(total_steps)]).contiguous()
        self.snapshot = None
        self.slab_snapshot = None

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
            if cycles:
                torch.cuda._sleep(cycles)

    def steps(self, mode, cycles):
        """The timed steps, 2 .. 2 + --steps (0 and 1 warmed the hot buffers up)."""
        for index in range(2, 2 + self.args.steps):
            self.step(index, mode, cycles)

    def take_snapshot(self, *, hot_bytes=False):
        measure.synchronize(self.device)
        self.snapshot = [(r.device_global_indices.clone(), r.lru_slots.clone()) for r in self.leaders]
        self.slab_snapshot = [slab.clone() for _, slab, _ in self.groups] if hot_bytes else None

    def restore(self):
        for runtime, (dgi, lru) in zip(self.leaders, self.snapshot):
            runtime.device_global_indices.copy_(dgi)
            runtime.lru_slots.copy_(lru)

    def restore_hot_bytes(self):
        for (_, slab, _), saved in zip(self.groups, self.slab_snapshot):
            slab.copy_(saved)

    def counters(self):
        measure.synchronize(self.device)
        stats = [leader.stats() for leader in self.leaders]
        return {
            "misses": sum(s["misses"] for s in stats),
            "hits": sum(s["hits"] for s in stats),
            "bytes_moved": sum(s["bytes_moved"] for s in stats),
        }

    def check_last_step(self):
        """(entries checked, layers whose hot rows differ from their host rows) for the last step."""
        measure.synchronize(self.device)
        rows = self.args.batch
        entries, bad_layers = 0, []
        for leader, slab, members in self.groups:
            attention = leader.attention_indices[:rows]
            valid = attention >= 0
            addresses = attention[valid].long()
            slots = leader.resolved_slots[:rows][valid].long()
            slab_rows = slab.view(-1, self.row_bytes)
            on_device = {}  # the group's host regions, copied once
            for runtime, layer, position in members:
                backing, piece = self.pieces[layer]
                if backing not in on_device:
                    on_device[backing] = self.backings[backing].to(self.device)
                hot_rows = slab_rows[position * self.args.block_size + addresses]
                if not torch.equal(hot_rows, on_device[backing][:, piece, :][slots]):
                    bad_layers.append(layer)
                entries += int(slots.numel())
        return entries, bad_layers


def verify(model, cycles):
    """Each swapping mode's steps once, eagerly, from the full snapshot; the last step's bytes checked."""
    checks = {}
    for mode in SWAP_MODES:
        model.restore()
        model.restore_hot_bytes()
        model.steps(mode, cycles)
        entries, bad_layers = model.check_last_step()
        checks[mode] = {"entries": entries, "layers": len(model.runtimes), "bad_layers": bad_layers,
                        "identical": not bad_layers}
    model.slab_snapshot = None
    return checks


def run_preset(args, name, preset, layout, flat, layer_bytes, host_rows, cycles, memcpy_gbps):
    backings, pieces = host_caches(flat, layout, args.layers, preset["group_size"], host_rows, preset["row_bytes"],
                                   layer_bytes)
    model = Model(args, preset, backings, pieces)
    for index in range(2):  # cold start, then the first steady step
        model.step(index, "no_prefetch", cycles)
    model.take_snapshot(hot_bytes=not args.no_verify)

    results = {"preset": name, **preset, "host_layout": layout, "layers": args.layers,
               "index_groups": len(model.leaders), "misses_per_request_step": model.misses_per_request,
               "groups_staged_together": sum(bool(leader.followers_staged_together) for leader in model.leaders)}
    if not args.no_verify:
        results["bytes_check"] = verify(model, cycles)

    model.restore()
    before = model.counters()
    model.steps("prefetch", cycles)
    after = model.counters()
    misses, hits = after["misses"] - before["misses"], after["hits"] - before["hits"]
    results["misses_per_step"] = misses / args.steps
    results["hit_rate"] = hits / max(hits + misses, 1)
    results["bytes_moved_per_step"] = (after["bytes_moved"] - before["bytes_moved"]) / args.steps

    modes = ["compute", *SWAP_MODES] + (["leaders_only"] if model.group_size > 1 else [])
    timer = measure.Timer(model.device)
    for mode in modes:
        timing = timer.time(lambda mode=mode: model.steps(mode, cycles), repeats=args.replays, restore=model.restore)
        results[f"step_ms_{mode}"] = timing["median_s"] * 1e3 / args.steps

    layers = args.layers
    compute = results["step_ms_compute"]
    for mode in SWAP_MODES:
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
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return results


def layouts_for(args, preset):
    """The layouts to run for a preset: groups of 1 are the same in both."""
    wanted = list(LAYOUTS) if args.host_layout == "both" else [args.host_layout]
    return wanted[:1] if preset["group_size"] == 1 else wanted


def preset_line(r):
    line = (f"{r['preset']:6} {r['host_layout']:11} groups={r['index_groups']:<3} step: compute "
            f"{r['step_ms_compute']:.3f} ms, no prefetch {r['step_ms_no_prefetch']:.3f} ms, prefetch "
            f"{r['step_ms_prefetch']:.3f} ms | exposed/layer: {r['exposed_swap_us_per_layer_no_prefetch']:.1f} us -> "
            f"{r['exposed_swap_us_per_layer_prefetch']:.1f} us, fused leaders "
            f"{r['exposed_swap_us_per_layer_prefetch_fused']:.1f} us")
    if "exposed_swap_us_per_follower_prefetch" in r:
        line += (f" (leader {r['exposed_swap_us_per_leader']:.1f} us, follower "
                 f"{r['exposed_swap_us_per_follower_prefetch']:.1f} us prefetched / "
                 f"{r['exposed_swap_us_per_follower_no_prefetch']:.1f} us not; followers staged together in "
                 f"{r['groups_staged_together']}/{r['index_groups']} groups)")
    line += f" | hit rate {r['hit_rate']:.4f}, {r['bytes_moved_per_step'] / 2**20:.1f} MiB/step"
    if "bytes_check" in r:
        bad = [mode for mode, c in r["bytes_check"].items() if not c["identical"]]
        line += " | bytes ok" if not bad else f" | BYTES DIFFER in {', '.join(bad)}"
    return line


def layout_comparison(presets):
    """Per grouped preset run in both layouts: exposed microseconds, token-major vs layer-major."""
    keys = ("exposed_swap_us_per_layer_prefetch", "exposed_swap_us_per_layer_prefetch_fused",
            "exposed_swap_us_per_layer_no_prefetch", "exposed_swap_us_per_leader",
            "exposed_swap_us_per_follower_prefetch", "exposed_swap_us_per_follower_no_prefetch")
    by_name = {}
    for r in presets:
        by_name.setdefault(r["preset"], {})[r["host_layout"]] = r
    comparison = {}
    for name, runs in by_name.items():
        if len(runs) < 2:
            continue
        comparison[name] = {key: {layout: runs[layout].get(key) for layout in LAYOUTS} for key in keys}
        c = comparison[name]
        print(f"{name}: exposed us, token-major vs layer-major: per layer (prefetch) "
              f"{c[keys[0]]['token-major']:.1f} vs {c[keys[0]]['layer-major']:.1f}, leader "
              f"{c[keys[3]]['token-major']:.1f} vs {c[keys[3]]['layer-major']:.1f}, follower prefetched "
              f"{c[keys[4]]['token-major']:.1f} vs {c[keys[4]]['layer-major']:.1f}, not prefetched "
              f"{c[keys[5]]['token-major']:.1f} vs {c[keys[5]]['layer-major']:.1f}", flush=True)
    return comparison


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_decode_step needs a CUDA device (or --device cpu for a smoke test)")
    row_bytes = max(PRESETS[name]["row_bytes"] for name in args.preset_names)
    host_rows = (1 + args.batch * (args.context // args.block_size)) * args.block_size
    layer_bytes = host_rows * row_bytes
    setup = time.perf_counter()
    pool = hisparse.HostPool(args.layers * layer_bytes, register="always" if device.type == "cuda" else "never")
    flat = pool.view("uint8")
    setup = time.perf_counter() - setup
    fill = time.perf_counter()
    if not args.no_verify:
        fill_pool(flat)
    fill = time.perf_counter() - fill
    memcpy = measure.memcpy_bandwidth(flat, device, nbytes=min(256 << 20, flat.numel()))
    cycles = int(args.compute_us * measure.sleep_cycles_per_us(device)) if device.type == "cuda" else 0

    presets = []
    for name in args.preset_names:
        for layout in layouts_for(args, PRESETS[name]):
            r = run_preset(args, name, PRESETS[name], layout, flat, layer_bytes, host_rows, cycles, memcpy["gbps"])
            presets.append(r)
            print(preset_line(r), flush=True)
    comparison = layout_comparison(presets)
    failed = [f"{r['preset']} {r['host_layout']} {mode}" for r in presets
              for mode, c in r.get("bytes_check", {}).items() if not c["identical"]]

    env = measure.environment(device)
    env.update({"host_pool_bytes": args.layers * layer_bytes, "host_pool_setup_seconds": setup,
                "host_pool_fill_seconds": fill,
                "sleep_cycles_per_compute": cycles})
    result = {
        "benchmark": "decode_step",
        "command": " ".join([sys.executable.split("/")[-1]] + sys.argv),
        "config": {k: v for k, v in vars(args).items() if k != "preset_names"},
        "environment": env,
        "memcpy_h2d_gbps": memcpy["gbps"],
        "memcpy": memcpy,
        "presets": presets,
        "layout_comparison": comparison,
        "bytes_check_failures": failed,
    }
    del flat
    measure.synchronize(device)
    pool.release(force=True)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)
    if failed:
        print("hot rows differ from their host rows: " + "; ".join(failed), file=sys.stderr)
        sys.exit(1)
    return result


if __name__ == "__main__":
    main()
