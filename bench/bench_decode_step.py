"""A full decode step of an L-layer model through hisparse.Runtime in several
staging modes, against the same step without any swap (compute only), timed
side by side in one run, over a sweep of copy/compute regimes.

Presets (--presets):
  dsv32  DeepSeek-V3.2-like: every layer has its own indexer (index groups of 1)
  glm5   GLM-5-like shared index: index groups of 4 layers (one leader, three followers)

Each layer: the runtime's swap_in (the group leader resolves the step's top-k
once and gathers its rows; followers gather theirs, prefetched by the leader
or staged on their own), then a stand-in attention kernel of fixed duration
(--compute-us, torch.cuda._sleep) on the compute stream. Modes, all byte-checked:
  no_prefetch             every layer stages its own rows when it is reached
  prefetch                the leader stages every follower on the group's copy
                          stream, one gather per follower
  prefetch_fused          as prefetch; the leader copies its own rows inside
                          the resolve launch (fused_gather=True)
  prefetch_grouped        as prefetch, with group_gather=True: one gather for
                          all followers of a group whose followers tile one
                          token-major span (each follower then waits for all
                          followers' bytes, but the rows of a token are read
                          as one piece)
  prefetch_fused_grouped  fused_gather and group_gather
The grouped modes run only where some group's followers tile (token-major,
groups of 4); elsewhere they are skipped, with the reason in the JSON
(skipped_modes). Groups whose followers do not tile (the last group of 61
layers in groups of 4 has none) take group_gather=False in those modes.

Trace: per request, step i selects the window [i*m, i*m + k) of a random
permutation (--seed) of its context (m = fresh x k), so each step has m new
positions (misses, local to the request's own host blocks) and k - m hits.

Regimes: --fresh and --compute-us take comma lists; every preset runs at
every (fresh, compute) pair. Each case reports its ideal transfer time per
layer (the bytes it moves at contiguous memcpy speed) and calls itself
copy-bound when that exceeds the measured compute-only step per layer. At
150 us of compute on an H200, fresh 0.05 is compute-bound (about 77 us of
ideal transfer per layer) and 0.2 copy-bound (about 310 us). --context defaults to the smallest
multiple of --block-size, at least 4096, that holds every fresh value's
trace, so all cases share one host pool and one trace geometry.

Host layout (--host-layout), both in one registered HostPool:
  layer-major  (default) every layer has its own [slots, W] region
  token-major  each index group's layers are the slices host[:, l, :] of one
               [slots, group size, W] region: a token's rows of the group's
               layers lie side by side, so its followers tile and may be
               staged with one gather (group_gather=True); worth it only when
               the step is copy-bound
  both         every preset in both layouts, one after the other, compared in
               the table (index groups of 1 are the same in both: run once,
               as layer-major)
Every layer has its own hot view (one slab per index group, layers
interleaved block by block).

Timing (hisparse.bench.measure.Timer): --steps consecutive decode steps are
captured in one CUDA graph per mode; the residency state (device_global_indices,
lru_slots) is restored from a snapshot before every replay, outside the timed
window (the hot bytes are not: the time does not depend on them); step time
= median replay time / steps. Exposed swap time per layer = (step - compute
only) / layers. For grouped presets two "leaders only" graphs (followers
move nothing; leaders gather apart, or fused) split each mode's exposure
into leader = (leaders only - compute) / groups and follower = (step -
leaders only) / followers. With groups of 1 every layer is a leader. The
link's ceiling (contiguous pinned memcpy H2D) is measured in the same run.
Counters (misses, hit rate, bytes moved) come from one eager pass of the
prefetch mode from the snapshot.

Bytes check (unless --no-verify): the pool is filled with a distinct pattern;
before timing, each swapping mode runs its steps once eagerly from the full
snapshot (hot bytes included, so a mode that moved nothing would fail), and
every valid entry of the last step, in every layer, must hold its host row
(the slot the resolver reports for it, read from that layer's host cache).
The run exits with status 1 otherwise.

The end of the run prints one table (preset, fresh, compute, layout, mode:
step ms, exposed us per layer, per leader, per follower; * = the fastest
mode and layout of its regime) and one line per regime comparing the best
grouped mode with the best ungrouped one. The JSON (--out) holds the
command, the config, the environment, every case in full, the table and the
regime summary.

    python bench/bench_decode_step.py --host-layout both --fresh 0.05,0.2 --presets glm5 \\
        --out bench/results/decode_step_host_layouts_h200.json

(about 1-1.5 minutes on an H200: four cases of 6-8 timed modes, each mode
about 8 x --steps decode steps of 9-35 ms, plus the pool fill and the bytes
checks; the JSON records total_seconds.) --device cpu runs the CPU reference kernels without the stand-in
attention: a check of the bindings and the bytes only, its figures mean
nothing; e.g. --layers 9 --batch 4 --top-k 64 --hot-size 128 --block-size 16
--context 512 --steps 2 --replays 1 --host-layout both --fresh 0.05,0.2.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time

import torch

import hisparse
from hisparse.bench import measure, provenance

PRESETS = {
    "dsv32": {"group_size": 1, "row_bytes": 656},
    "glm5": {"group_size": 4, "row_bytes": 656},
}
LAYOUTS = ("layer-major", "token-major")
# mode -> (leader's prefetch, fused_gather, group_gather, followers swap in)
MODES = {
    "compute": None,
    "no_prefetch": (False, False, False, True),
    "prefetch": (True, False, False, True),
    "prefetch_fused": (True, True, False, True),
    "prefetch_grouped": (True, False, True, True),
    "prefetch_fused_grouped": (True, True, True, True),
    "leaders_only": (False, False, False, False),
    "leaders_only_fused": (False, True, False, False),
}
SWAP_MODES = ("no_prefetch", "prefetch", "prefetch_fused", "prefetch_grouped", "prefetch_fused_grouped")
GROUPED_MODES = ("prefetch_grouped", "prefetch_fused_grouped")
MIN_CONTEXT = 4096


def followers_tile(leader) -> bool:
    """Whether ``leader``'s followers tile one token-major span, i.e. whether
    its swap_in accepts group_gather=True. The one place that reads the
    Runtime property, so that a rename is a one-line change here."""
    return bool(leader.followers_staged_together)


def float_list(text):
    values = [float(v) for v in text.split(",") if v.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected a comma list of numbers, got {text!r}")
    return values


def misses_per_request(fresh, top_k):
    return max(1, round(fresh * top_k))


def context_needed(args, fresh):
    return args.top_k + (2 + args.steps) * misses_per_request(fresh, args.top_k)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="dsv32,glm5")
    parser.add_argument("--host-layout", choices=LAYOUTS + ("both",), default="layer-major")
    parser.add_argument("--layers", type=int, default=61)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=2048)
    parser.add_argument("--hot-size", type=int, default=4096)
    parser.add_argument("--block-size", type=int, default=64, help="host and hot block size")
    parser.add_argument("--context", type=int, default=None,
                        help="positions per request (default: the smallest multiple of --block-size, at least "
                             f"{MIN_CONTEXT}, that holds the trace of every --fresh value)")
    parser.add_argument("--fresh", type=float_list, default=[0.05],
                        help="comma list: fractions of each step's top-k that are new (e.g. 0.05,0.2)")
    parser.add_argument("--compute-us", type=float_list, default=[150.0],
                        help="comma list: stand-in attention per layer, microseconds")
    parser.add_argument("--steps", type=int, default=6, help="decode steps per captured graph")
    parser.add_argument("--replays", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="seed of the trace (the same in every layout)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the CPU reference kernels, no stand-in attention (a smoke test)")
    parser.add_argument("--no-verify", action="store_true", help="skip the pool fill and the bytes check")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    args.preset_names = [name for name in args.presets.split(",") if name]
    for name in args.preset_names:
        if name not in PRESETS:
            parser.error(f"--presets: unknown preset {name!r}; choose from {sorted(PRESETS)}")
    for fresh in args.fresh:
        if not 0 < fresh <= 1:
            parser.error(f"--fresh: expected fractions in (0, 1], got {fresh}")
    for compute in args.compute_us:
        if compute < 0:
            parser.error(f"--compute-us: expected values >= 0, got {compute}")
    needed = max(context_needed(args, fresh) for fresh in args.fresh)
    if args.context is None:
        bs = args.block_size
        args.context = -(-max(needed, MIN_CONTEXT) // bs) * bs
    elif args.context < needed:
        parser.error(f"--context {args.context} too small: {2 + args.steps} steps at --fresh {max(args.fresh)} "
                     f"need {needed} positions per request")
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

    def __init__(self, args, preset, backings, pieces, fresh):
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
        hot_ids = 1 + torch.arange(batch * hot_blocks, dtype=torch.int32, device=device)
        self.hot_table = hot_ids.view(batch, hot_blocks)
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
        # Leaders that take group_gather=True in the grouped modes (it raises elsewhere).
        self.tiled = {id(leader) for leader in self.leaders if followers_tile(leader)}

        self.misses_per_request = m = misses_per_request(fresh, k)
        total_steps = 2 + args.steps
        if k + total_steps * m > args.context:
            raise SystemExit(f"--context {args.context} too small for {total_steps} steps at --fresh {fresh}")
        generator = torch.Generator(device=device).manual_seed(args.seed)
        order = torch.argsort(torch.rand(batch, args.context, device=device, generator=generator), dim=1)
        order = order.to(torch.int32)
        self.topk = torch.stack([order[:, i * m: i * m + k] for i in range(total_steps)]).contiguous()
        self.snapshot = None
        self.slab_snapshot = None

    def step(self, index, mode, cycles):
        """One decode step in ``mode`` (a key of MODES)."""
        flags = MODES[mode]
        for runtime in self.runtimes:
            runtime.begin_forward()
        for runtime in self.runtimes:
            if flags is not None:
                prefetch, fused, grouped, followers = flags
                if runtime.is_group_leader:
                    # group_gather only when asked for: a build without the
                    # keyword still runs the ungrouped modes.
                    extra = {"group_gather": True} if grouped and id(runtime) in self.tiled else {}
                    runtime.swap_in(self.topk[index], self.req_id, block_table=self.source_table,
                                    block_size=self.args.block_size, prefetch=prefetch, fused_gather=fused, **extra)
                elif followers:
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
            for _runtime, layer, position in members:
                backing, piece = self.pieces[layer]
                if backing not in on_device:
                    on_device[backing] = self.backings[backing].to(self.device)
                hot_rows = slab_rows[position * self.args.block_size + addresses]
                if not torch.equal(hot_rows, on_device[backing][:, piece, :][slots]):
                    bad_layers.append(layer)
                entries += int(slots.numel())
        return entries, bad_layers


def skipped_modes(model, layout):
    """{mode: why it is not run} for the grouped modes this case cannot run."""
    if model.group_size == 1:
        reason = "index groups of 1 have no followers to group"
    elif not model.tiled:
        reason = (f"no group's followers tile in the {layout} layout "
                  "(group_gather=True would raise ValueError)")
    else:
        return {}
    return {mode: reason for mode in GROUPED_MODES}


def verify(model, modes, cycles):
    """Each swapping mode's steps once, eagerly, from the full snapshot; the last step's bytes checked."""
    checks = {}
    for mode in modes:
        model.restore()
        model.restore_hot_bytes()
        model.steps(mode, cycles)
        entries, bad_layers = model.check_last_step()
        checks[mode] = {"entries": entries, "layers": len(model.runtimes), "bad_layers": bad_layers,
                        "identical": not bad_layers}
    model.slab_snapshot = None
    return checks


def run_case(args, name, preset, layout, fresh, compute_us, flat, layer_bytes, host_rows, cycles, memcpy_gbps):
    backings, pieces = host_caches(flat, layout, args.layers, preset["group_size"], host_rows, preset["row_bytes"],
                                   layer_bytes)
    model = Model(args, preset, backings, pieces, fresh)
    for index in range(2):  # cold start, then the first steady step
        model.step(index, "no_prefetch", cycles)
    model.take_snapshot(hot_bytes=not args.no_verify)

    layers, groups = args.layers, len(model.leaders)
    followers = layers - groups
    skipped = skipped_modes(model, layout)
    swap_modes = [mode for mode in SWAP_MODES if mode not in skipped]
    results = {"preset": name, **preset, "host_layout": layout, "fresh": fresh, "compute_us": compute_us,
               "sleep_cycles": cycles, "layers": layers, "index_groups": groups, "followers": followers,
               "groups_with_tiling_followers": len(model.tiled),
               "misses_per_request_step": model.misses_per_request, "skipped_modes": skipped}
    if not args.no_verify:
        results["bytes_check"] = verify(model, swap_modes, cycles)

    model.restore()
    before = model.counters()
    model.steps("prefetch", cycles)
    after = model.counters()
    misses, hits = after["misses"] - before["misses"], after["hits"] - before["hits"]
    results["misses_per_step"] = misses / args.steps
    results["hit_rate"] = hits / max(hits + misses, 1)
    results["bytes_moved_per_step"] = (after["bytes_moved"] - before["bytes_moved"]) / args.steps
    results["ideal_transfer_us_per_layer"] = results["bytes_moved_per_step"] / layers / (memcpy_gbps * 1e9) * 1e6

    splits = ["leaders_only", "leaders_only_fused"] if followers else []
    timer = measure.Timer(model.device)
    step_ms = {}
    timings = {}
    for mode in ["compute", *swap_modes, *splits]:
        timing = timer.time(functools.partial(model.steps, mode, cycles), repeats=args.replays, restore=model.restore)
        step_ms[mode] = timing["median_s"] * 1e3 / args.steps
        timings[mode] = {"step_ms": step_ms[mode], "step_ms_min": timing["min_s"] * 1e3 / args.steps,
                         "step_ms_max": timing["max_s"] * 1e3 / args.steps,
                         "replay_ms": [s * 1e3 for s in timing["samples_s"]], "clock": timing["clock"]}

    compute = step_ms["compute"]
    # Against the measured compute, not --compute-us: the CPU smoke test has no stand-in attention.
    results["compute_us_per_layer_measured"] = compute * 1e3 / layers
    copy_bound = results["ideal_transfer_us_per_layer"] > results["compute_us_per_layer_measured"]
    results["regime"] = "copy-bound" if copy_bound else "compute-bound"
    for mode in swap_modes:
        entry = timings[mode]
        entry["exposed_us_per_layer"] = (step_ms[mode] - compute) * 1e3 / layers
        if followers:
            split = "leaders_only_fused" if MODES[mode][1] else "leaders_only"
            entry["split_by"] = split
            entry["leader_exposed_us"] = (step_ms[split] - compute) * 1e3 / groups
            entry["follower_exposed_us"] = (step_ms[mode] - step_ms[split]) * 1e3 / followers
        else:
            entry["leader_exposed_us"] = entry["exposed_us_per_layer"]
            entry["follower_exposed_us"] = None
    results["modes"] = timings
    del model
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return results


def layouts_for(args, preset):
    """The layouts to run for a preset: groups of 1 are the same in both."""
    wanted = list(LAYOUTS) if args.host_layout == "both" else [args.host_layout]
    return wanted[:1] if preset["group_size"] == 1 else wanted


def case_line(r):
    line = (f"{r['preset']} fresh {r['fresh']:g} compute {r['compute_us']:g} us {r['host_layout']}: "
            f"compute {r['modes']['compute']['step_ms']:.3f} ms/step, ideal transfer "
            f"{r['ideal_transfer_us_per_layer']:.1f} us/layer ({r['regime']}), hit rate {r['hit_rate']:.4f}, "
            f"{r['bytes_moved_per_step'] / 2**20:.1f} MiB/step, followers tile in "
            f"{r['groups_with_tiling_followers']}/{r['index_groups']} groups")
    if "bytes_check" in r:
        bad = [mode for mode, c in r["bytes_check"].items() if not c["identical"]]
        line += " | bytes ok" if not bad else f" | BYTES DIFFER in {', '.join(bad)}"
    if r["skipped_modes"]:
        line += f" | skipped {', '.join(r['skipped_modes'])}"
    return line


def table_rows(cases):
    """One row per case and timed mode (compute included), in run order."""
    rows = []
    for r in cases:
        for mode in ("compute", *SWAP_MODES):
            if mode not in r["modes"]:
                continue
            m = r["modes"][mode]
            rows.append({"preset": r["preset"], "fresh": r["fresh"], "compute_us": r["compute_us"],
                         "host_layout": r["host_layout"], "regime": r["regime"], "mode": mode,
                         "step_ms": m["step_ms"], "exposed_us_per_layer": m.get("exposed_us_per_layer"),
                         "leader_exposed_us": m.get("leader_exposed_us"),
                         "follower_exposed_us": m.get("follower_exposed_us")})
    return rows


def regime_summary(rows):
    """Per (preset, fresh, compute): the fastest layout and mode, grouped and ungrouped."""
    regimes = {}
    for row in rows:
        if row["mode"] == "compute":
            continue
        key = (row["preset"], row["fresh"], row["compute_us"])
        entry = regimes.setdefault(key, {"preset": key[0], "fresh": key[1], "compute_us": key[2],
                                         "regime": row["regime"], "best": None, "best_ungrouped": None,
                                         "best_grouped": None})
        pick = {"host_layout": row["host_layout"], "mode": row["mode"], "step_ms": row["step_ms"]}
        kinds = ("best", "best_grouped" if row["mode"] in GROUPED_MODES else "best_ungrouped")
        for kind in kinds:
            if entry[kind] is None or row["step_ms"] < entry[kind]["step_ms"]:
                entry[kind] = pick
    for entry in regimes.values():
        grouped, ungrouped = entry["best_grouped"], entry["best_ungrouped"]
        entry["grouped_gain_percent"] = (
            (ungrouped["step_ms"] - grouped["step_ms"]) / ungrouped["step_ms"] * 100 if grouped and ungrouped
            else None)
    return list(regimes.values())


def print_table(rows, regimes):
    def us(value):
        return f"{value:9.1f}" if value is not None else f"{'-':>9}"

    best = {(e["preset"], e["fresh"], e["compute_us"]): e["best"] for e in regimes}
    print(f"\n{'preset':6} {'fresh':>5} {'comp us':>7} {'layout':11} {'mode':22} {'step ms':>8}  "
          f"{'exp/layer':>9} {'leader':>9} {'follower':>9}")
    for row in rows:
        pick = best.get((row["preset"], row["fresh"], row["compute_us"]))
        star = "*" if pick and (pick["host_layout"], pick["mode"]) == (row["host_layout"], row["mode"]) else " "
        print(f"{row['preset']:6} {row['fresh']:5g} {row['compute_us']:7g} {row['host_layout']:11} "
              f"{row['mode']:22} {row['step_ms']:8.3f}{star} {us(row['exposed_us_per_layer'])} "
              f"{us(row['leader_exposed_us'])} {us(row['follower_exposed_us'])}")
    for e in regimes:
        line = (f"{e['preset']} fresh {e['fresh']:g} compute {e['compute_us']:g} us ({e['regime']}): best "
                f"{e['best']['host_layout']} {e['best']['mode']} {e['best']['step_ms']:.3f} ms")
        if e["grouped_gain_percent"] is not None:
            g, u = e["best_grouped"], e["best_ungrouped"]
            line += (f"; grouped {g['mode']} {g['step_ms']:.3f} ms vs ungrouped {u['host_layout']} {u['mode']} "
                     f"{u['step_ms']:.3f} ms: grouping {'gains' if e['grouped_gain_percent'] > 0 else 'loses'} "
                     f"{abs(e['grouped_gain_percent']):.1f}%")
        print(line)
    sys.stdout.flush()


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_decode_step needs a CUDA device (or --device cpu for a smoke test)")
    started = time.perf_counter()
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
    cycles_per_us = measure.sleep_cycles_per_us(device) if device.type == "cuda" else 0.0

    cases = []
    for name in args.preset_names:
        preset = PRESETS[name]
        for fresh in args.fresh:
            for compute_us in args.compute_us:
                cycles = int(compute_us * cycles_per_us)
                for layout in layouts_for(args, preset):
                    r = run_case(args, name, preset, layout, fresh, compute_us, flat, layer_bytes, host_rows,
                                 cycles, memcpy["gbps"])
                    cases.append(r)
                    print(case_line(r), flush=True)
    rows = table_rows(cases)
    regimes = regime_summary(rows)
    print_table(rows, regimes)
    failed = [f"{r['preset']} fresh {r['fresh']:g} compute {r['compute_us']:g} {r['host_layout']} {mode}"
              for r in cases for mode, c in r.get("bytes_check", {}).items() if not c["identical"]]

    env = measure.environment(device)
    env.update({"host_pool_bytes": args.layers * layer_bytes, "host_pool_setup_seconds": setup,
                "host_pool_fill_seconds": fill, "sleep_cycles_per_us": cycles_per_us,
                "total_seconds": time.perf_counter() - started})
    result = {
        "benchmark": "decode_step",
        **provenance.provenance(__file__),
        "config": {k: v for k, v in vars(args).items() if k != "preset_names"},
        "environment": env,
        "memcpy_h2d_gbps": memcpy["gbps"],
        "memcpy": memcpy,
        "cases": cases,
        "table": rows,
        "regimes": regimes,
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
