"""Experiment only: where each step of bench_resolver's trace spends its
time inside the resolver, per block, from a build patched with
timeline_patch.py (the stamps and their layout are described there).

Per (batch, miss rate, fused or not): the steps are captured in one CUDA
graph and replayed by bench_resolver's timer (24 steps), with the stamps
off and on (graph_us: replay time / steps), and the stamps of the last replay are
summarised per step n >= 1 and then as the median over steps:
cycles_from_waited (clock64 from each block's own wait, median over
blocks), us (globaltimer, median and max over blocks, relative to the
step's earliest wait; 256 ns resolution on an H200), prev_exit (the last
block exit of step n - 1 on that scale) and period_us (median difference
of consecutive steps' last exits).

    PYTHONPATH=<site of the patched build> python bench/lab/resolver_cuts/timeline.py \
        --batches 1,64,100 --miss-rates 0.001 --out timeline.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import bench_resolver  # noqa: E402
from hisparse.bench import measure  # noqa: E402

POINTS = ["entry", "waited", "B1", "union", "B3", "staged", "B6", "F_end", "landed", "exit", "early_staged",
          "orphan", "filter_wait", "filter_waited", "before_B2a", "after_B2a"]
SLOTS, MAX_LAUNCHES, MAX_BLOCKS = 16, 256, 512


def summarise(timeline, launches, blocks):
    records = timeline[16:16 + MAX_LAUNCHES * MAX_BLOCKS * SLOTS * 2].view(MAX_LAUNCHES, MAX_BLOCKS, SLOTS, 2)
    records = records[:launches, :blocks].cpu()
    stamps, cycles = records[..., 0].double(), records[..., 1].double()
    per_step = []
    for n in range(1, launches):
        base = stamps[n][:, 1].min()
        row = {"us": {}, "cycles_from_waited": {}}
        for i, name in enumerate(POINTS):
            seen = stamps[n][:, i] > 0
            if seen.any():
                rel = (stamps[n][seen, i] - base) / 1e3
                row["us"][name] = [float(rel.median()), float(rel.max())]
            if i >= 2 and seen.any():
                row["cycles_from_waited"][name] = float((cycles[n][seen, i] - cycles[n][seen, 1]).median())
        row["prev_exit"] = float((stamps[n - 1][:, 9].max() - base) / 1e3)
        per_step.append(row)
    summary = {"us": {}, "cycles_from_waited": {}}
    for key in ("us", "cycles_from_waited"):
        for name in per_step[0][key]:
            values = [r[key][name] for r in per_step if name in r[key]]
            if key == "us":
                summary[key][name] = [statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)]
            else:
                summary[key][name] = statistics.median(values)
    summary["prev_exit"] = statistics.median(r["prev_exit"] for r in per_step)
    exits = [float(stamps[n][:, 9].max()) for n in range(launches)]
    summary["period_us"] = statistics.median((exits[n] - exits[n - 1]) / 1e3 for n in range(2, launches))
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,64,100")
    parser.add_argument("--miss-rates", default="0.001")
    parser.add_argument("--replays", type=int, default=7)
    parser.add_argument("--out", default="timeline.json")
    options = parser.parse_args(argv)
    args = bench_resolver.parse_args([])
    device = torch.device("cuda")
    batches = [int(b) for b in options.batches.split(",")]
    pool, host_cache, hot_cache = bench_resolver.make_caches(args, max(batches), device)
    timeline = torch.zeros(16 + MAX_LAUNCHES * MAX_BLOCKS * SLOTS * 2, dtype=torch.int64, device=device)
    timer = measure.Timer(device)
    results = []
    for batch in batches:
        for miss_rate in (float(m) for m in options.miss_rates.split(",")):
            for fused in (False, True):
                os.environ.pop("HS_RESOLVER_TIMELINE", None)
                s = bench_resolver.Scenario(args, batch, miss_rate, host_cache, hot_cache)
                s.resolve(0)
                s.resolve(1)
                torch.cuda.synchronize()
                snapshot = (s.dgi.clone(), s.lru.clone())

                def reset():
                    s.dgi.copy_(snapshot[0])
                    s.lru.copy_(snapshot[1])
                    timeline.zero_()  # the block counter too: launches count from 0 in each replay

                def steps():
                    for step in range(2, 2 + args.steps):
                        s.resolve(step, fused=fused)

                row = {"batch": batch, "miss_rate": miss_rate, "fused": fused}
                for stamped in (False, True):
                    if stamped:
                        # Read by the launcher at capture time: the graph keeps the address.
                        os.environ["HS_RESOLVER_TIMELINE"] = str(timeline.data_ptr())
                    # Captured and replayed as bench_resolver does; the last replay's stamps stay in the buffer.
                    timing = timer.time(steps, repeats=options.replays, restore=reset)
                    row["graph_us_instrumented" if stamped else "graph_us"] = timing["median_s"] * 1e6 / args.steps
                os.environ.pop("HS_RESOLVER_TIMELINE", None)
                row["timeline"] = summarise(timeline, args.steps, batch + 1)
                results.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "timeline"}), row["timeline"]["cycles_from_waited"],
                      flush=True)
    with open(options.out, "w") as handle:
        json.dump({"benchmark": "resolver_timeline", "command": " ".join(sys.argv), "points": results}, handle, indent=1)


if __name__ == "__main__":
    main()
