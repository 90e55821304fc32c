"""How a model preset's data plane per layer changes with the layer count, and why.

    python3 bench/bench_layer_scaling.py [--preset dsv32-fp8] [--layers 16,32,61]
        [--host-regions N] [--copy-stream per-group|shared|caller] [--steps-per-graph 4]
        [--residency-hint auto|on|off] [--warm-host-pages on|off] [--row-bytes N] [--replays 7] [--profile]
        [--out FILE]

For each layer count it builds the preset's data plane (`hisparse bench`'s
DataPlane: one host pool, one Runtime per layer, index groups as the preset
sets them), runs every step of the preset's trace from cold buffers to warm
them, and then times, from the warm state and in CUDA graphs of
``--steps-per-graph`` steady steps (restored before every replay), per layer:
the resolve alone, both swap modes through the runtimes (``swap``: resolve
then gather; ``swap_fused``: the leader's rows copied in the resolve launch),
the stand-in attention alone (``compute``, the preset's ``compute_us``) and
the decode step with each swap mode (``step``, ``step_fused``); the exposed
data plane is the step less the compute, as `hisparse bench` reports it.

What it separates (each a flag, so that two runs differ in one thing):
``--host-regions N`` gives every layer a cache in one of N host regions
(layer l reads region l mod N), so the layer count and the host footprint
the step reads vary apart; ``--copy-stream`` gives each leader its own copy
stream (the runtime's default), one shared by every leader, or the stream
the graph is captured on (no cross-stream edges at all);
``--steps-per-graph`` sets the graph's size; ``--warm-host-pages off``
drops the read-ahead of the next layer's host pages beside each layer's
compute (on by default, as in `hisparse bench`); ``--row-bytes`` changes
the preset's row size alone, so that a run can tell whether a layer's time
follows the bytes it moves or the 128-byte lines they span (640-byte rows
are five whole lines, the preset's 656-byte rows six). ``--profile`` adds one
profiled replay of each swap mode: every kernel's duration and the gaps
between consecutive kernels, by kernel pair.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

import torch

from hisparse.bench.measure import Timer, environment, sleep_cycles_per_us
from hisparse.bench.plane import DataPlane
from hisparse.bench.presets import PRESETS, make_settings
from hisparse.bench.provenance import provenance
from hisparse.bench.report import write_json
from hisparse.bench.trace import generate_trace

MODES = ("resolve", "swap", "swap_fused", "compute", "step", "step_fused")
PROFILED = ("swap", "swap_fused")


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="dsv32-fp8", choices=sorted(PRESETS))
    parser.add_argument("--layers", default="16,32,61", help="comma list of layer counts")
    parser.add_argument("--host-regions", type=int, default=None,
                        help="host layer caches in the pool (layer l reads cache l mod N; default: one per layer)")
    parser.add_argument("--copy-stream", choices=("per-group", "shared", "caller"), default="per-group")
    parser.add_argument("--steps-per-graph", type=int, default=4)
    parser.add_argument("--residency-hint", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--warm-host-pages", choices=("on", "off"), default="on")
    parser.add_argument("--row-bytes", type=int, default=None, help="bytes per row (default: the preset's)")
    parser.add_argument("--replays", type=int, default=7)
    parser.add_argument("--profile", action="store_true", help="profile one replay of each swap mode")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    try:
        args.layers = [int(x) for x in args.layers.split(",") if x]
    except ValueError:
        parser.error(f"--layers: expected a comma list of integers, got {args.layers!r}")
    if not args.layers or min(args.layers) < 1:
        parser.error(f"--layers: expected positive layer counts, got {args.layers}")
    for name in ("host_regions", "steps_per_graph", "replays"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')}: expected at least 1, got {value}")
    if args.row_bytes is not None:
        try:  # the presets' own rule for a row size
            make_settings(args.preset, {"row_bytes": args.row_bytes})
        except ValueError as error:
            parser.error(str(error))
    return args


def kernel_name(event_name: str) -> str:
    """The kernel's own name: no namespaces, template arguments or parameter list."""
    name = event_name.replace("void ", "").replace("(anonymous namespace)::", "")
    return name.split("(")[0].split("<")[0].split("::")[-1]


def summary(values: List[float]) -> Dict[str, Any]:
    return {"count": len(values), "median_us": statistics.median(values), "sum_us": sum(values)}


def kernel_timeline(replay: Callable[[], None]) -> Dict[str, Any]:
    """One profiled call of ``replay``: kernel durations and gaps between consecutive kernels (us)."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay()
        torch.cuda.synchronize()
    kernels = sorted(
        (e.time_range.start, e.time_range.end, kernel_name(e.name))
        for e in prof.events() if e.device_type.name == "CUDA")
    durations: Dict[str, List[float]] = {}
    gaps: Dict[str, List[float]] = {}
    for index, (start, end, name) in enumerate(kernels):
        durations.setdefault(name, []).append(end - start)
        if index:
            before = kernels[index - 1]
            gaps.setdefault(f"{before[2]} -> {name}", []).append(start - before[1])
    return {
        "span_us": kernels[-1][1] - kernels[0][0] if kernels else 0.0,
        "kernels": {name: summary(values) for name, values in durations.items()},
        "gaps": {pair: summary(values) for pair, values in gaps.items()},
    }


def measure(args: argparse.Namespace, layers: int, device: Any, capture_stream: Any) -> Dict[str, Any]:
    overrides = {"layers": layers, "residency_hint": args.residency_hint,
                 "warm_host_pages": args.warm_host_pages, "baseline_steps": 0}
    if args.row_bytes is not None:
        overrides["row_bytes"] = args.row_bytes
    settings = make_settings(args.preset, overrides)
    trace = generate_trace(settings, device)
    copy_stream = {"per-group": None, "shared": torch.cuda.Stream(device), "caller": capture_stream}[args.copy_stream]
    regions = None if args.host_regions is None else min(args.host_regions, layers)
    plane = DataPlane(settings, trace, device, host_regions=regions, copy_stream=copy_stream)
    try:
        plane.reset()
        for step in range(trace.steps):
            if step == settings.warmup_steps:
                plane.snapshot()
            plane.step(step)
        torch.cuda.synchronize(device)
        timed = list(range(settings.warmup_steps, min(trace.steps, settings.warmup_steps + args.steps_per_graph)))
        cycles = int(settings.compute_us * sleep_cycles_per_us(device))

        def compute() -> None:
            torch.cuda._sleep(cycles)

        work = {
            "resolve": lambda: [plane.resolve_only(s) for s in timed],
            "swap": lambda: [plane.step(s, prefetch=True) for s in timed],
            "swap_fused": lambda: [plane.step(s, prefetch=True, fused=True) for s in timed],
            "compute": lambda: [plane.step(s, swap=False, compute=compute) for s in timed],
            "step": lambda: [plane.step(s, prefetch=True, compute=compute) for s in timed],
            "step_fused": lambda: [plane.step(s, prefetch=True, fused=True, compute=compute) for s in timed],
        }
        timer = Timer(device, stream=capture_stream)  # where a "caller" copy stream points
        per_layer = {}
        for name in MODES:
            timing = timer.time(work[name], repeats=args.replays, restore=plane.restore)
            per_layer[name] = timing["median_s"] / len(timed) / layers * 1e6
        for name in ("step", "step_fused"):
            per_layer["exposed_" + name] = per_layer[name] - per_layer["compute"]
        result = {
            "layers": layers, "host_regions": plane.host_regions, "index_groups": plane.index_groups,
            "host_pool_bytes": plane.host_regions * plane.layer_bytes, "steps_per_graph": len(timed),
            "us_per_layer": per_layer,
        }
        if args.profile:
            result["profile"] = {}
            for name in PROFILED:
                plane.restore()
                work[name]()
                torch.cuda.synchronize(device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=capture_stream):
                    work[name]()
                plane.restore()
                graph.replay()
                plane.restore()
                torch.cuda.synchronize(device)
                timeline = kernel_timeline(graph.replay)
                timeline["span_us_per_layer"] = timeline["span_us"] / len(timed) / layers
                result["profile"][name] = timeline
                del graph
        return result
    finally:
        plane.close()


def main(argv: List[str]) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_layer_scaling.py: needs a CUDA device (the CPU backend has no copy stream or graph)",
              file=sys.stderr)
        return 2
    device = torch.device("cuda", torch.cuda.current_device())
    capture_stream = torch.cuda.Stream(device)
    results: Dict[str, Any] = {
        "benchmark": "bench_layer_scaling", **provenance(__file__), "environment": environment(device),
        "preset": args.preset, "copy_stream": args.copy_stream, "residency_hint": args.residency_hint,
        "warm_host_pages": args.warm_host_pages,
        "row_bytes": args.row_bytes if args.row_bytes is not None else PRESETS[args.preset]["row_bytes"],
        "points": [],
    }
    for layers in args.layers:
        start = time.time()
        point = measure(args, layers, device, capture_stream)
        point["seconds"] = time.time() - start
        results["points"].append(point)
        shown = {name: round(value, 2) for name, value in point["us_per_layer"].items()}
        print(f"layers {layers:3d} host regions {point['host_regions']:3d}: {shown}", flush=True)
        for name, timeline in point.get("profile", {}).items():
            kernels = {k: round(v["median_us"], 2) for k, v in timeline["kernels"].items()}
            gaps = {k: round(v["median_us"], 2) for k, v in timeline["gaps"].items()}
            print(f"    {name}: kernels {kernels} gaps {gaps}", flush=True)
    if args.out:
        write_json(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
