"""gather_compact bandwidth against contiguous pinned memcpy, in one run.

Every schedule of the CUDA gather (hisparse.ops.GATHER_VARIANTS, plus the
persistent and sorted ones capped to fewer thread blocks) copies the same swap
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
Each case draws --lists independent swap lists and the timed launches cycle
through them, so no launch finds the previous one's translations cached.
Destinations: distinct random hot rows inside each request's own hot region
of --hot-size rows (what LRU eviction hands out), in a block-strided hot
cache (--hot-block-size rows per block, --hot-block-stride rows apart).
Sizes: --requests x --miss-fractions of top_k (the realistic decode step) and
--counts total rows (spread over count / top_k token rows, full counts).

Timing: warm-up first, then CUDA events around the replay of a CUDA graph
holding enough back-to-back launches to move >= --graph-bytes (at most
--graph-reps launches); time per launch = replay time / launches, median of
--iters replays. Graphs keep host launch overhead out of the figures (an eager
launch of a 100 us copy would be timed with the Python call's latency in it).
Every variant's output is checked byte for byte against the host rows.

    python bench/bench_gather.py --out bench/results/gather_h200.json

(about 3 minutes on an H200; --row-bytes 656,1152 --counts "" runs the
realistic cases alone in well under a minute.)
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time

import torch

import hisparse
from hisparse import ops


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pool-gib", type=float, default=16.0, help="registered host pool size")
    parser.add_argument("--row-bytes", default="656,1152,128,4096")
    parser.add_argument("--patterns", default="local,random,sorted")
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
    parser.add_argument("--capped-blocks", default="33,66", help="max_blocks for the capped persistent/sorted runs")
    parser.add_argument("--iters", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--graph-bytes", type=float, default=32e6, help="bytes moved per timed graph replay")
    parser.add_argument("--graph-reps", type=int, default=20, help="most launches per graph")
    parser.add_argument("--lists", type=int, default=4, help="independent swap lists per case, used in turn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-verify", action="store_true")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    return parser.parse_args(argv)


def variant_list(args):
    if args.variants != "all":
        out = []
        for item in args.variants.split(","):
            name, _, blocks = item.partition("@")
            out.append((name, int(blocks) if blocks else None))
        return out
    base = [(name, None) for name in ops.GATHER_VARIANTS if name != "auto"]
    capped = [int(b) for b in args.capped_blocks.split(",") if b]
    for name in ("persistent", "sorted"):
        base += [(name, blocks) for blocks in capped]
    return base


def label(name, blocks):
    return name if blocks is None else f"{name}@{blocks}"


class Timer:
    def __init__(self, args):
        self.args = args
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def median_ms(self, fn, nbytes, cycle=1):
        """Median milliseconds of one call of fn(i), from graph replays.

        Launch j of a replay calls fn(j % cycle)."""
        args = self.args
        for i in range(max(args.warmup, cycle)):
            fn(i % cycle)
        torch.cuda.synchronize()
        reps = max(cycle, min(args.graph_reps, math.ceil(args.graph_bytes / max(nbytes, 1))))
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                for i in range(reps):
                    fn(i % cycle)
            run = graph.replay
            run()
        except RuntimeError as error:  # timed eagerly instead
            print(f"graph capture failed ({error}); timing eagerly", file=sys.stderr)
            run, reps = (lambda: fn(0)), 1
        torch.cuda.synchronize()
        times = []
        for _ in range(args.iters):
            self.start.record()
            run()
            self.end.record()
            self.end.synchronize()
            times.append(self.start.elapsed_time(self.end) / reps)
        return statistics.median(times)


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


def environment():
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "gpu": props.name,
        "multiprocessors": props.multi_processor_count,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "hisparse": hisparse.__version__,
        "hisparse_build": hisparse._C.build_info(),
        "default_variant": ops.GATHER_VARIANTS[hisparse._C.gather_default_variant()],
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_gather needs a CUDA device")
    device = torch.device("cuda")
    torch.cuda.init()
    generator = torch.Generator().manual_seed(args.seed)
    variants = variant_list(args)
    pool_bytes = int(args.pool_gib * (1 << 30)) // 4096 * 4096
    setup_start = time.perf_counter()
    pool = hisparse.HostPool(pool_bytes, register="always")
    raw = pool.view("uint8")
    if not args.no_verify:
        fill_pool(raw.view(torch.int64))
    setup_seconds = time.perf_counter() - setup_start
    print(f"pool: {pool_bytes / 2**30:.1f} GiB registered and filled in {setup_seconds:.1f} s; "
          f"GPU {torch.cuda.get_device_name()}", flush=True)
    timer = Timer(args)
    results = []

    cases = []
    for fraction in [float(f) for f in args.miss_fractions.split(",") if f]:
        cases.append(("step", args.requests, max(1, round(fraction * args.top_k)), fraction))
    for count in [int(c) for c in args.counts.split(",") if c]:
        tokens = math.ceil(count / args.top_k)
        cases.append(("rows", tokens, min(count, args.top_k), None))

    header = f"{'pattern':8} {'row':>5} {'case':>10} {'MB':>7} {'memcpy':>7} | " + " ".join(
        f"{label(n, b):>13}" for n, b in variants
    )
    print(header)
    print("-" * len(header))
    for row_bytes in [int(r) for r in args.row_bytes.split(",") if r]:
        host_rows = pool_bytes // row_bytes
        host = raw[: host_rows * row_bytes].view(host_rows, row_bytes)
        memcpy_dst = None
        for pattern in [p for p in args.patterns.split(",") if p]:
            for kind, tokens, per_token, fraction in cases:
                lists = [build_lists(args, pattern, host_rows, per_token, tokens, generator)
                         for _ in range(max(1, args.lists))]
                swap_host, swap_dev, counts, hot_rows_needed = lists[0]
                rows = tokens * per_token
                nbytes = rows * row_bytes
                hot = hot_view(args, hot_rows_needed, row_bytes, device)
                on_device = [tuple(x.to(device) for x in lst[:3]) for lst in lists]
                d_host, d_dev, d_counts = on_device[0]
                if memcpy_dst is None or memcpy_dst.numel() < nbytes:
                    memcpy_dst = torch.empty(max(nbytes, 1 << 20), dtype=torch.uint8, device=device)
                src = raw[:nbytes]
                dst = memcpy_dst[:nbytes]
                memcpy_ms = timer.median_ms(lambda i: dst.copy_(src, non_blocking=True), nbytes)
                memcpy_gbs = nbytes / (memcpy_ms * 1e-3) / 1e9
                case = f"{args.requests}x{fraction:.0%}" if kind == "step" else f"{rows // 1024}K rows"
                entry = {
                    "pattern": pattern, "row_bytes": row_bytes, "case": case, "token_rows": tokens,
                    "rows": rows, "bytes": nbytes, "lists": len(on_device), "memcpy_ms": memcpy_ms, "memcpy_gbs": memcpy_gbs,
                    "miss_fraction": fraction, "variants": {},
                }
                reference = None
                used_dst = hot_offsets(args, d_dev[:, :per_token].reshape(-1).long())
                cells = []
                for name, blocks in variants:
                    hot.zero_()

                    def launch(i, name=name, blocks=blocks):
                        lh, ld, lc = on_device[i]
                        ops.gather_compact(host, hot, lh, ld, lc, hot_block_size=args.hot_block_size,
                                           hot_block_stride=args.hot_block_stride, variant=name, max_blocks=blocks)

                    launch(0)
                    torch.cuda.synchronize()
                    identical = None
                    if not args.no_verify:
                        got = hot[used_dst]
                        if reference is None:
                            expected = host[swap_host[:, :per_token].reshape(-1).long()].to(device)
                            identical = bool(torch.equal(got, expected))
                            reference = got.clone()
                        else:
                            identical = bool(torch.equal(got, reference))
                    ms = timer.median_ms(launch, nbytes, cycle=len(on_device))
                    gbs = nbytes / (ms * 1e-3) / 1e9
                    entry["variants"][label(name, blocks)] = {
                        "variant": name, "max_blocks": blocks, "ms": ms, "gbs": gbs,
                        "ratio_to_memcpy": gbs / memcpy_gbs, "identical": identical,
                    }
                    mark = "" if identical in (None, True) else "!"
                    cells.append(f"{gbs:6.1f} {gbs / memcpy_gbs:4.2f}{mark:1}")
                results.append(entry)
                print(f"{pattern:8} {row_bytes:5} {case:>10} {nbytes / 1e6:7.1f} {memcpy_gbs:7.1f} | "
                      + " ".join(f"{c:>13}" for c in cells), flush=True)
                del hot, d_host, d_dev, d_counts, on_device
        del host
    print("cells: GB/s and ratio to contiguous pinned memcpy of the same bytes; '!' = bytes differ")

    realistic = [
        e for e in results
        if e["pattern"] == "local" and e["row_bytes"] in (656, 1152) and e["miss_fraction"] is not None
    ]
    summary = {}
    for e in realistic:
        best = max(e["variants"].items(), key=lambda kv: kv[1]["gbs"])
        summary[f"{e['row_bytes']}B {e['case']}"] = {
            "best": best[0], "best_ratio": best[1]["ratio_to_memcpy"],
            "default_ratio": e["variants"].get(ops.GATHER_VARIANTS[hisparse._C.gather_default_variant()], {}).get(
                "ratio_to_memcpy"),
            "warp_per_row_ratio": e["variants"].get("warp_per_row", {}).get("ratio_to_memcpy"),
        }
    if summary:
        print("realistic (local, 656/1152 B), ratio to memcpy:")
        for k, v in summary.items():
            default = "-" if v["default_ratio"] is None else f"{v['default_ratio']:.2f}"
            baseline = "-" if v["warp_per_row_ratio"] is None else f"{v['warp_per_row_ratio']:.2f}"
            print(f"  {k:>16}: default {default}, warp_per_row {baseline}, best {v['best']} {v['best_ratio']:.2f}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({
                "benchmark": "gather_compact vs contiguous pinned memcpy",
                "command": " ".join([sys.executable] + sys.argv),
                "config": vars(args),
                "variants": [label(n, b) for n, b in variants],
                "environment": environment(),
                "pool": {"bytes": pool_bytes, "info": pool.info(), "setup_seconds": setup_seconds},
                "results": results,
                "realistic_summary": summary,
            }, handle, indent=1)
        print(f"wrote {args.out}")
    del raw
    pool.release(force=True)


if __name__ == "__main__":
    main()
