"""gather_compact bandwidth against contiguous pinned memcpy, in one run.

Every schedule of the CUDA gather (hisparse.ops.GATHER_VARIANTS, plus the
row_persistent and sorted ones capped to fewer thread blocks) copies the same swap
list from a registered HostPool into a paged hot cache; contiguous pinned
memcpy host-to-device of the same number of bytes, from the same pool, is
timed beside it. Reported: GB/s of useful row bytes and the ratio to memcpy.

Swap lists (R token rows of K = top_k columns, one request per token row):
  local    request i owns a contiguous share of the pool; its misses are
           distinct rows drawn uniformly from a random block-aligned window of
           --context tokens inside its own share, in random order (the
           resolver emits misses in top-k order, not address order)
  random   distinct rows uniform over the whole pool, random order
  sorted   the random rows, sorted by address within each token row
  group    the token-major host layout: the pool holds slots of G =
           --group-size rows side by side (host[slot, layer, W], pitch
           G x row bytes) and the swap lists are drawn like "local" over the
           slots. Timed on the same lists, in their own table: one
           gather_compact_group of all G pieces against G gather_compact
           calls (default variant) on the per-layer views host[:, i, :]; the
           same for the G - 1 followers host[:, 1:G, :] (what the Runtime
           moves in one call at a decode step, after the leader); and one
           gather_compact of a layer-major host (rows of row bytes back to
           back, the "local" pattern's single-layer gather) as reference.
           Bytes = used entries x pieces x row bytes. Only the
           --miss-fractions cases, not --counts.
Each case draws --lists independent swap lists and the timed launches cycle
through them, so no launch finds the previous one's translations cached.
Destinations: distinct random hot rows inside each request's own hot region
of --hot-size rows (what LRU eviction hands out), in a block-strided hot
cache (--hot-block-size rows per block, --hot-block-stride rows apart; the
group pattern fills G such caches, one per piece).
Sizes: --requests x --miss-fractions of top_k (the realistic decode step) and
--counts total rows (spread over count / top_k token rows, full counts).

Timing (hisparse.bench.measure.Timer): warm-up first, then CUDA events around
the replay of a CUDA graph holding enough back-to-back launches to move
>= --graph-bytes (at most --graph-reps launches); time per launch = replay
time / launches, median of --iters replays. Graphs keep host launch overhead
out of the figures (an eager launch of a 100 us copy would be timed with the
Python call's latency in it). Every output is checked byte for byte against
the host rows; the run exits with status 1 if any differ.

    python bench/bench_gather.py --out bench/results/gather_schedules_h200.json

(about 3-4 minutes on an H200; --row-bytes 656,1152 --counts "" runs the
realistic cases alone, group included, in about a minute.) --device cpu
runs the CPU reference kernels on a small pool (e.g. --pool-gib 0.25
--counts "" --row-bytes 656 --top-k 256 --context 2048 --hot-size 512
--requests 8 --iters 1): a check of the lists and the byte comparisons
only, its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

import hisparse
from hisparse import ops
from hisparse.bench import measure, provenance

LIST_PATTERNS = ("local", "random", "sorted")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pool-gib", type=float, default=16.0, help="registered host pool size")
    parser.add_argument("--row-bytes", default="656,1152,128,4096")
    parser.add_argument("--patterns", default="local,random,sorted,group")
    parser.add_argument("--group-size", type=int, default=4,
                        help="rows per host slot of the group pattern (layers of an index group), 2..16")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=2048)
    parser.add_argument("--miss-fractions", default="0.05,0.1,0.2")
    parser.add_argument("--counts", default="8192,65536,262144", help="total rows of the large-list cases")
    parser.add_argument("--context", type=int, default=16384, help="tokens of a request's local window")
    parser.add_argument("--block-size", type=int, default=64, help="host block size (window alignment)")
    parser.add_argument("--hot-size", type=int, default=4096, help="hot rows per request")
    parser.add_argument("--hot-block-size", type=int, default=64)
    parser.add_argument("--hot-block-stride", type=int, default=128, help="rows between hot blocks (>= block size)")
    parser.add_argument("--variants", default="all", help="comma list of variant[@max_blocks], or 'all'")
    parser.add_argument("--capped-blocks", default="33,66", help="max_blocks for the capped row_persistent/sorted runs")
    parser.add_argument("--iters", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--graph-bytes", type=float, default=32e6, help="bytes moved per timed graph replay")
    parser.add_argument("--graph-reps", type=int, default=20, help="most launches per graph")
    parser.add_argument("--lists", type=int, default=4, help="independent swap lists per case, used in turn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the CPU reference kernels on an unregistered pool (a smoke test)")
    parser.add_argument("--no-verify", action="store_true")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    args.pattern_list = [p for p in args.patterns.split(",") if p]
    for pattern in args.pattern_list:
        if pattern not in LIST_PATTERNS + ("group",):
            parser.error(f"--patterns: unknown pattern {pattern!r}; choose from {list(LIST_PATTERNS) + ['group']}")
    if "group" in args.pattern_list and not 2 <= args.group_size <= 16:
        parser.error(f"--group-size: expected 2..16 rows per slot, got {args.group_size}")
    return args


def variant_list(args):
    if args.variants != "all":
        out = []
        for item in args.variants.split(","):
            name, _, blocks = item.partition("@")
            out.append((name, int(blocks) if blocks else None))
        return out
    base = [(name, None) for name in ops.GATHER_VARIANTS if name != "auto"]
    capped = [int(b) for b in args.capped_blocks.split(",") if b]
    for name in ("row_persistent", "sorted"):
        base += [(name, blocks) for blocks in capped]
    return base


def label(name, blocks):
    return name if blocks is None else f"{name}@{blocks}"


class LaunchTimer:
    """Milliseconds per launch: measure.Timer around a batch of back-to-back launches."""

    def __init__(self, args, device):
        self.args = args
        self.device = device
        self.timer = measure.Timer(device)

    def median_ms(self, fn, nbytes, cycle=1):
        """Median milliseconds of one call of fn(i); launch j of a batch calls fn(j % cycle).

        CUDA: a graph of enough launches to move --graph-bytes (at most
        --graph-reps, at least one per list). CPU: one launch per list."""
        args = self.args
        for i in range(max(args.warmup, cycle)):
            fn(i % cycle)
        reps = cycle
        if self.device.type == "cuda":
            reps = max(cycle, min(args.graph_reps, math.ceil(args.graph_bytes / max(nbytes, 1))))

        def batch():
            for i in range(reps):
                fn(i % cycle)

        return self.timer.time(batch, repeats=args.iters)["median_s"] * 1e3 / reps


class Memcpy:
    """Contiguous pinned host-to-device copy of the pool's first bytes: the ceiling."""

    def __init__(self, raw, device, timer):
        self.raw, self.device, self.timer = raw, device, timer
        self.dst = None

    def __call__(self, nbytes):
        """(milliseconds, GB/s) of one copy of nbytes."""
        if self.dst is None or self.dst.numel() < nbytes:
            self.dst = None
            self.dst = torch.empty(max(nbytes, 1 << 20), dtype=torch.uint8, device=self.device)
        src, dst = self.raw[:nbytes], self.dst[:nbytes]
        ms = self.timer.median_ms(lambda i: dst.copy_(src, non_blocking=True), nbytes)
        return ms, nbytes / (ms * 1e-3) / 1e9


def fill_pool(host_i64):
    """A distinct pattern in every 8 bytes, so copies of wrong rows show."""
    chunk = 1 << 27
    for start in range(0, host_i64.numel(), chunk):
        piece = host_i64[start : start + chunk]
        torch.arange(start, start + piece.numel(), dtype=torch.int64, out=piece)
        piece.mul_(0x9E3779B97F4A7C15 & 0x7FFFFFFFFFFFFFFF)


def distinct_sample(low, high, count, generator):
    """`count` distinct ints from [low, high), random order."""
    span = high - low
    if count > span:
        raise ValueError(f"cannot draw {count} distinct rows from {span}")
    if span <= 4 * count or span <= 1 << 22:
        return torch.randperm(span, generator=generator)[:count] + low
    picks = torch.randint(low, high, (count * 2,), generator=generator)
    picks = torch.unique(picks)
    while picks.numel() < count:
        more = torch.randint(low, high, (count,), generator=generator)
        picks = torch.unique(torch.cat([picks, more]))
    return picks[torch.randperm(picks.numel(), generator=generator)[:count]]


def build_lists(args, pattern, host_rows, rows_per_token, num_tokens, generator):
    """Swap host rows [R, K], device rows [R, K], counts [R] (CPU tensors)."""
    k = args.top_k
    swap_host = torch.full((num_tokens, k), -1, dtype=torch.int32)
    swap_dev = torch.full((num_tokens, k), -1, dtype=torch.int32)
    counts = torch.full((num_tokens,), rows_per_token, dtype=torch.int32)
    share = host_rows // num_tokens
    hot_region = max(args.hot_size, rows_per_token)
    for t in range(num_tokens):
        if pattern == "local":
            window = min(max(args.context, rows_per_token), share)
            window -= window % args.block_size if window > args.block_size else 0
            blocks = max(1, (share - window) // args.block_size)
            start = t * share + int(torch.randint(0, blocks, (1,), generator=generator)) * args.block_size
            start = min(start, (t + 1) * share - window)
            rows = distinct_sample(start, start + window, rows_per_token, generator)
        else:
            rows = distinct_sample(0, host_rows, rows_per_token, generator)
            if pattern == "sorted":
                rows = torch.sort(rows).values
        swap_host[t, :rows_per_token] = rows.to(torch.int32)
        dst = torch.randperm(hot_region, generator=generator)[:rows_per_token] + t * hot_region
        swap_dev[t, :rows_per_token] = dst.to(torch.int32)
    return swap_host, swap_dev, counts, num_tokens * hot_region


def hot_view(args, hot_rows_needed, row_bytes, device):
    """A block-strided hot cache (2-D slab) able to hold hot_rows_needed rows."""
    hbs, stride = args.hot_block_size, args.hot_block_stride
    blocks = math.ceil(hot_rows_needed / hbs)
    slab = torch.zeros(((blocks - 1) * stride + hbs, row_bytes), dtype=torch.uint8, device=device)
    return slab


def hot_offsets(args, rows):
    return (rows // args.hot_block_size) * args.hot_block_stride + rows % args.hot_block_size


def case_list(args):
    """(kind, token rows, rows per token row, miss fraction) of every size case."""
    cases = []
    for fraction in [float(f) for f in args.miss_fractions.split(",") if f]:
        cases.append(("step", args.requests, max(1, round(fraction * args.top_k)), fraction))
    for count in [int(c) for c in args.counts.split(",") if c]:
        tokens = math.ceil(count / args.top_k)
        cases.append(("rows", tokens, min(count, args.top_k), None))
    return cases


def case_name(kind, tokens, per_token, fraction):
    return f"{tokens}x{fraction:.0%}" if kind == "step" else f"{tokens * per_token // 1024}K rows"


class Case:
    """One case's swap lists, on the host (for the expected bytes) and on the device."""

    def __init__(self, args, pattern, host_rows, tokens, per_token, generator, device):
        lists = [build_lists(args, pattern, host_rows, per_token, tokens, generator)
                 for _ in range(max(1, args.lists))]
        self.args, self.per_token = args, per_token
        self.swap_host = lists[0][0]
        self.hot_rows_needed = lists[0][3]
        self.on_device = [tuple(x.to(device) for x in lst[:3]) for lst in lists]
        self.used = tokens * per_token
        # Hot-cache row offsets of the first list's entries, in list order.
        self.used_dst = hot_offsets(args, self.on_device[0][1][:, :per_token].reshape(-1).long())

    def host_index(self):
        """Host rows of the first list's used entries, in list order (CPU int64)."""
        return self.swap_host[:, : self.per_token].reshape(-1).long()

    def gather(self, host, hot, i, variant="auto", max_blocks=None):
        lh, ld, lc = self.on_device[i]
        ops.gather_compact(host, hot, lh, ld, lc, hot_block_size=self.args.hot_block_size,
                           hot_block_stride=self.args.hot_block_stride, variant=variant, max_blocks=max_blocks)

    def gather_group(self, host, hots, i):
        lh, ld, lc = self.on_device[i]
        ops.gather_compact_group(host, hots, lh, ld, lc, hot_block_size=self.args.hot_block_size,
                                 hot_block_stride=self.args.hot_block_stride)


def run_list_case(args, ctx, pattern, row_bytes, host, kind, tokens, per_token, fraction):
    """Every gather variant on one case's lists, against memcpy of the same bytes."""
    device, variants = ctx["device"], ctx["variants"]
    case = Case(args, pattern, host.shape[0], tokens, per_token, ctx["generator"], device)
    nbytes = case.used * row_bytes
    hot = hot_view(args, case.hot_rows_needed, row_bytes, device)
    memcpy_ms, memcpy_gbs = ctx["memcpy"](nbytes)
    entry = {
        "pattern": pattern, "row_bytes": row_bytes, "case": case_name(kind, tokens, per_token, fraction),
        "token_rows": tokens, "rows": case.used, "bytes": nbytes, "lists": len(case.on_device),
        "memcpy_ms": memcpy_ms, "memcpy_gbs": memcpy_gbs, "miss_fraction": fraction, "variants": {},
    }
    reference = None
    cells = []
    for name, blocks in variants:
        hot.zero_()

        def launch(i, name=name, blocks=blocks):
            case.gather(host, hot, i, variant=name, max_blocks=blocks)

        launch(0)
        measure.synchronize(device)
        identical = None
        if not args.no_verify:
            got = hot[case.used_dst]
            if reference is None:
                identical = bool(torch.equal(got, host[case.host_index()].to(device)))
                reference = got.clone()
            else:
                identical = bool(torch.equal(got, reference))
        ms = ctx["timer"].median_ms(launch, nbytes, cycle=len(case.on_device))
        gbs = nbytes / (ms * 1e-3) / 1e9
        entry["variants"][label(name, blocks)] = {
            "variant": name, "max_blocks": blocks, "ms": ms, "gbs": gbs,
            "ratio_to_memcpy": gbs / memcpy_gbs, "identical": identical,
        }
        cells.append(cell(gbs, gbs / memcpy_gbs, identical))
    print(f"{pattern:8} {row_bytes:5} {entry['case']:>10} {nbytes / 1e6:7.1f} {memcpy_gbs:7.1f} | "
          + " ".join(f"{c:>13}" for c in cells), flush=True)
    return entry


def cell(gbs, ratio, identical):
    mark = "" if identical in (None, True) else "!"
    return f"{gbs:6.1f} {ratio:4.2f}{mark:1}"


def timed(ctx, launch, nbytes, cycle, memcpy_gbs, identical):
    ms = ctx["timer"].median_ms(launch, nbytes, cycle=cycle)
    gbs = nbytes / (ms * 1e-3) / 1e9
    return {"ms": ms, "gbs": gbs, "ratio_to_memcpy": gbs / memcpy_gbs, "identical": identical}


def run_group_case(args, ctx, row_bytes, token_major, layer_major, tokens, per_token, fraction):
    """Token-major host slots of G rows: one group gather against per-layer gathers,
    for all G pieces and for the G - 1 followers, plus a layer-major single-layer gather."""
    device, group = ctx["device"], args.group_size
    case = Case(args, "local", token_major.shape[0], tokens, per_token, ctx["generator"], device)
    cycle = len(case.on_device)
    hots = [hot_view(args, case.hot_rows_needed, row_bytes, device) for _ in range(group)]
    host_index = case.host_index()
    # Expected bytes of every piece, [used, G, W] on the device (one host gather).
    expected = None if args.no_verify else token_major[host_index].to(device)

    def check(hot_list, first):
        if expected is None:
            return None
        measure.synchronize(device)
        return all(torch.equal(hot[case.used_dst], expected[:, first + i]) for i, hot in enumerate(hot_list))

    entry = {
        "pattern": "group", "row_bytes": row_bytes, "group_size": group,
        "case": case_name("step", tokens, per_token, fraction), "token_rows": tokens, "rows": case.used,
        "lists": cycle, "miss_fraction": fraction, "slot_pitch_bytes": group * row_bytes, "pieces": {},
    }
    cells = []
    for first in (0, 1):
        pieces = group - first
        host = token_major[:, first:, :]
        views = [token_major[:, first + i, :] for i in range(pieces)]
        targets = hots[:pieces]
        nbytes = case.used * pieces * row_bytes
        memcpy_ms, memcpy_gbs = ctx["memcpy"](nbytes)
        result = {"host": f"host[:, {first}:{group}, :]", "bytes": nbytes, "memcpy_ms": memcpy_ms,
                  "memcpy_gbs": memcpy_gbs}

        def group_launch(i, host=host, targets=targets):
            case.gather_group(host, targets, i)

        def layer_launch(i, views=views, targets=targets):
            for view, hot in zip(views, targets):
                case.gather(view, hot, i)

        for key, launch in (("group", group_launch), ("per_layer", layer_launch)):
            for hot in targets:
                hot.zero_()
            launch(0)
            identical = check(targets, first)  # before the timed launches overwrite the rows
            result[key] = timed(ctx, launch, nbytes, cycle, memcpy_gbs, identical)
            cells.append(cell(result[key]["gbs"], result[key]["ratio_to_memcpy"], result[key]["identical"]))
        entry["pieces"][str(pieces)] = result

    # Reference: the same lists on a layer-major host cache, one layer.
    nbytes = case.used * row_bytes
    memcpy_ms, memcpy_gbs = ctx["memcpy"](nbytes)
    hot = hots[0]
    hot.zero_()
    case.gather(layer_major, hot, 0)
    identical = None
    if not args.no_verify:
        measure.synchronize(device)
        identical = bool(torch.equal(hot[case.used_dst], layer_major[host_index].to(device)))
    single = timed(ctx, lambda i: case.gather(layer_major, hot, i), nbytes, cycle, memcpy_gbs, identical)
    entry["single_layer"] = {"host": "layer-major [slots, W]", "bytes": nbytes, "memcpy_ms": memcpy_ms,
                             "memcpy_gbs": memcpy_gbs, **single}
    cells.append(cell(single["gbs"], single["ratio_to_memcpy"], identical))
    full = entry["pieces"][str(group)]
    print(f"{'group':8} {row_bytes:5} {entry['case']:>10} {full['bytes'] / 1e6:7.1f} {full['memcpy_gbs']:7.1f} | "
          + " ".join(f"{c:>13}" for c in cells), flush=True)
    return entry


def group_header(group):
    names = [f"{group} group", f"{group} layers", f"{group - 1} group", f"{group - 1} layers", "1 layer"]
    return f"{'pattern':8} {'row':>5} {'case':>10} {'MB':>7} {'memcpy':>7} | " + " ".join(f"{n:>13}" for n in names)


def list_summary(results):
    summary = {}
    default = ops.GATHER_VARIANTS[hisparse._C.gather_default_variant()]
    for e in results:
        if e["pattern"] != "local" or e["row_bytes"] not in (656, 1152) or e["miss_fraction"] is None:
            continue
        best = max(e["variants"].items(), key=lambda kv: kv[1]["gbs"])
        summary[f"{e['row_bytes']}B {e['case']}"] = {
            "best": best[0], "best_ratio": best[1]["ratio_to_memcpy"],
            "default_ratio": e["variants"].get(default, {}).get("ratio_to_memcpy"),
            "warp_per_row_ratio": e["variants"].get("warp_per_row", {}).get("ratio_to_memcpy"),
        }
    if summary:
        print("realistic (local, 656/1152 B), ratio to memcpy:")
        for k, v in summary.items():
            default_ratio = "-" if v["default_ratio"] is None else f"{v['default_ratio']:.2f}"
            baseline = "-" if v["warp_per_row_ratio"] is None else f"{v['warp_per_row_ratio']:.2f}"
            print(f"  {k:>16}: default {default_ratio}, warp_per_row {baseline},"
                  f" best {v['best']} {v['best_ratio']:.2f}")
    return summary


def group_summary(results, group):
    summary = {}
    for e in results:
        if e["pattern"] != "group" or e["row_bytes"] not in (656, 1152):
            continue
        row = {}
        for pieces, r in e["pieces"].items():
            row[f"group_{pieces}"] = r["group"]["ratio_to_memcpy"]
            row[f"per_layer_{pieces}"] = r["per_layer"]["ratio_to_memcpy"]
        row["single_layer"] = e["single_layer"]["ratio_to_memcpy"]
        summary[f"{e['row_bytes']}B {e['case']}"] = row
    if summary:
        print(f"realistic (group, 656/1152 B), ratio to memcpy (G = {group}: one group gather / G per-layer "
              f"gathers; followers G - 1 likewise; one layer-major layer):")
        for k, v in summary.items():
            print(f"  {k:>16}: {group} pieces {v[f'group_{group}']:.2f} / {v[f'per_layer_{group}']:.2f}, "
                  f"followers {group - 1} {v[f'group_{group - 1}']:.2f} / {v[f'per_layer_{group - 1}']:.2f}, "
                  f"1 layer {v['single_layer']:.2f}")
    return summary


def mismatches(results):
    """Names of the outputs whose bytes differed from the host rows."""
    bad = []
    for e in results:
        where = f"{e['pattern']} {e['row_bytes']}B {e['case']}"
        if e["pattern"] == "group":
            for pieces, r in e["pieces"].items():
                bad += [f"{where} {key} {pieces}" for key in ("group", "per_layer") if r[key]["identical"] is False]
            if e["single_layer"]["identical"] is False:
                bad.append(f"{where} single_layer")
        else:
            bad += [f"{where} {name}" for name, v in e["variants"].items() if v["identical"] is False]
    return bad


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit("bench_gather needs a CUDA device (or --device cpu for a smoke test)")
        torch.cuda.init()
    generator = torch.Generator().manual_seed(args.seed)
    variants = variant_list(args)
    pool_bytes = int(args.pool_gib * (1 << 30)) // 4096 * 4096
    setup_start = time.perf_counter()
    pool = hisparse.HostPool(pool_bytes, register="always" if device.type == "cuda" else "never")
    raw = pool.view("uint8")
    if not args.no_verify:
        fill_pool(raw.view(torch.int64))
    setup_seconds = time.perf_counter() - setup_start
    where = f"GPU {torch.cuda.get_device_name()}" if device.type == "cuda" else "CPU reference kernels"
    print(f"pool: {pool_bytes / 2**30:.1f} GiB {'registered' if pool.registered else 'unregistered'} and filled "
          f"in {setup_seconds:.1f} s; {where}", flush=True)
    timer = LaunchTimer(args, device)
    ctx = {"device": device, "variants": variants, "generator": generator, "timer": timer,
           "memcpy": Memcpy(raw, device, timer)}
    row_sizes = [int(r) for r in args.row_bytes.split(",") if r]
    cases = case_list(args)
    list_patterns = [p for p in args.pattern_list if p != "group"]
    results = []

    if list_patterns:
        header = f"{'pattern':8} {'row':>5} {'case':>10} {'MB':>7} {'memcpy':>7} | " + " ".join(
            f"{label(n, b):>13}" for n, b in variants
        )
        print(header)
        print("-" * len(header))
        for row_bytes in row_sizes:
            host_rows = pool_bytes // row_bytes
            host = raw[: host_rows * row_bytes].view(host_rows, row_bytes)
            for pattern in list_patterns:
                for kind, tokens, per_token, fraction in cases:
                    results.append(run_list_case(args, ctx, pattern, row_bytes, host, kind, tokens, per_token,
                                                 fraction))
        print("cells: GB/s and ratio to contiguous pinned memcpy of the same bytes; '!' = bytes differ")

    if "group" in args.pattern_list:
        group = args.group_size
        header = group_header(group)
        print(header)
        print("-" * len(header))
        for row_bytes in row_sizes:
            slots = pool_bytes // (group * row_bytes)
            token_major = raw[: slots * group * row_bytes].view(slots, group, row_bytes)
            layer_major = raw[: slots * row_bytes].view(slots, row_bytes)
            for kind, tokens, per_token, fraction in cases:
                if kind == "step":
                    results.append(run_group_case(args, ctx, row_bytes, token_major, layer_major, tokens,
                                                  per_token, fraction))
        print(f"cells: GB/s and ratio to memcpy of the same bytes; 'N group' = one gather_compact_group of N "
              f"pieces (host[:, {group}-N:{group}, :]), 'N layers' = N gather_compact calls on host[:, i, :], "
              f"'1 layer' = one gather_compact on a layer-major host; MB and memcpy of the {group}-piece case; "
              f"'!' = bytes differ")

    summary = list_summary(results)
    summary_group = group_summary(results, args.group_size)
    bad = mismatches(results)
    if bad:
        print(f"bytes differ from the host rows in {len(bad)} outputs: " + "; ".join(bad))
    if args.out:
        env = measure.environment(device)
        env["default_variant"] = ops.GATHER_VARIANTS[hisparse._C.gather_default_variant()]
        config = {k: v for k, v in vars(args).items() if k != "pattern_list"}
        with open(args.out, "w") as handle:
            json.dump({
                "benchmark": "gather_compact vs contiguous pinned memcpy",
                **provenance.provenance(__file__),
                "config": config,
                "variants": [label(n, b) for n, b in variants],
                "environment": env,
                "pool": {"bytes": pool_bytes, "info": pool.info(), "setup_seconds": setup_seconds},
                "results": results,
                "realistic_summary": summary,
                "realistic_group_summary": summary_group,
                "mismatches": bad,
            }, handle, indent=1)
        print(f"wrote {args.out}")
    del raw, ctx
    pool.release(force=True)
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
