"""The ``hisparse bench`` and ``hisparse plan`` subcommands: arguments and drivers.

Importing this module needs neither torch nor CUDA; the drivers import them.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import tempfile
from typing import Any, Dict, List, Optional

from .presets import DEFAULT_PRESET, OVERRIDABLE, PRESETS

__all__ = ["add_bench_parser", "add_plan_parser", "run_bench_command", "run_plan_command", "pick_device"]

BENCH_HELP = "trace-driven benchmark of the data plane (hit rate, bytes, resolve/gather time, memcpy, PyTorch baseline)"
PLAN_HELP = "capacity planner: hit rate vs hot-buffer size, host pool per request and per node"


def _int_list(text: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from error
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return values


def _float_list(text: str) -> List[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from error
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
    return values


def _presets_epilog() -> str:
    lines = ["presets:"]
    for name, values in PRESETS.items():
        default = " (default)" if name == DEFAULT_PRESET else ""
        lines.append(f"  {name}{default}: {values['description']}")
    return "\n".join(lines)


def _add_workload(parser: argparse.ArgumentParser) -> None:
    """Flags shared by bench and plan: preset, device, sizes, trace."""
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help=f"model geometry and workload (default: {DEFAULT_PRESET})")
    parser.add_argument("--device", default="auto", help="auto (CUDA when available, else CPU), cpu, cuda or cuda:N")
    sizes = parser.add_argument_group("sizes (override the preset)")
    sizes.add_argument("--batch", type=int, help="concurrent requests")
    sizes.add_argument("--context", type=int, help="positions (tokens) per request in the host pool")
    sizes.add_argument("--hot-size", type=int, help="hot-buffer rows per request (H)")
    sizes.add_argument("--layers", type=int, help="attention layers")
    sizes.add_argument("--group-size", type=int, help="layers per index group (sharing one indexer)")
    sizes.add_argument("--spec-tokens", type=int, help="speculative tokens per request (token rows = 1 + this)")
    sizes.add_argument("--steps", type=int, help="decode steps")
    sizes.add_argument("--warmup-steps", type=int, help="steps that fill the cold buffers, excluded from steady state")
    sizes.add_argument("-k", "--top-k", type=int, help="positions the indexer selects per token row")
    sizes.add_argument("--row-bytes", type=int, help="bytes of one token's KV row per layer (multiple of 16)")
    sizes.add_argument("--block-size", type=int, help="host block size (tokens)")
    sizes.add_argument("--hot-block-size", type=int, help="hot-cache block size (rows)")
    sizes.add_argument("--hot-sizes", type=_int_list,
                       help="hot-buffer sizes of the hit-rate sweep, e.g. 2048,4096,8192")
    trace = parser.add_argument_group("trace")
    trace.add_argument("--trace", metavar="FILE", help="replay a saved trace (.npz or .pt; see hisparse.bench.trace)")
    trace.add_argument("--save-trace", metavar="FILE", help="save the trace used (.npz or .pt)")
    trace.add_argument("--trace-mode", choices=("locality", "scores"),
                       help="locality: reuse/fresh mix with a drifting important region (default); "
                       "scores: top-k of drifting queries against fixed random keys")
    trace.add_argument("--trace-groups", type=int, help="independent indexer streams (index group i reads i %% N)")
    trace.add_argument("--reuse", type=float, help="locality: fraction of each top-k reused from recent steps")
    trace.add_argument("--window", type=int, help="locality: recency window in steps")
    trace.add_argument("--region", type=float, help="locality: important-region size in multiples of k")
    trace.add_argument("--clusters", type=int, help="locality: windows the important region is made of")
    trace.add_argument("--drift", type=float, help="locality: positions the region windows move per step")
    trace.add_argument("--query-drift", type=float, help="scores: per-step mean reversion of the query walk")
    trace.add_argument("--query-spread", type=float, help="scores: stationary spread of the query around its anchor")
    trace.add_argument("--seed", type=int, help="trace seed")
    out = parser.add_argument_group("output")
    out.add_argument("--out", metavar="FILE", help="write every figure, the configuration and the environment as JSON")
    out.add_argument("--plots", metavar="DIR", help="write PNG plots here (needs matplotlib)")
    progress = out.add_mutually_exclusive_group()
    progress.add_argument("--progress", dest="progress", action="store_true", default=None,
                          help="show the progress bar even when stderr is not a terminal")
    progress.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    out.add_argument("--quiet", action="store_true", help="no table on stdout")


def add_bench_parser(commands: Any) -> argparse.ArgumentParser:
    parser = commands.add_parser("bench", help=BENCH_HELP, description=BENCH_HELP, epilog=_presets_epilog(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_workload(parser)
    measure = parser.add_argument_group("measurement")
    measure.add_argument("--compute-us", type=float, help="CUDA: stand-in attention per layer (microseconds)")
    measure.add_argument("--replays", type=int, help="timed repetitions per measurement (median reported)")
    measure.add_argument("--baseline-steps", type=int, help="steps of the plain PyTorch baseline (0: skip it)")
    measure.add_argument("--gather-fractions", type=_float_list,
                         help="rows per request of the bandwidth sweep, as fractions of k, e.g. 0.01,0.1,1")
    measure.add_argument("--residency-hint", nargs="?", const="on", choices=("auto", "on", "off"),
                         help="whether the runtimes keep a residency hint: auto (default: the library's choice, "
                         "hisparse.Runtime(residency_hint=None)), on (also the bare flag) or off")
    measure.add_argument("--warm-host-pages", choices=("on", "off"),
                         help="whether a step reads one word of every 64 KiB page of the next layer's host blocks "
                         "while a layer computes (ops.warm_host_pages on a second stream; default on)")
    return parser


def add_plan_parser(commands: Any) -> argparse.ArgumentParser:
    parser = commands.add_parser("plan", help=PLAN_HELP, description=PLAN_HELP, epilog=_presets_epilog(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_workload(parser)
    target = parser.add_argument_group("target (one of)").add_mutually_exclusive_group()
    target.add_argument("--target-misses-per-step", type=float,
                        help="most steady-state misses per request per step (mean); default 5%% of k")
    target.add_argument("--target-hit-rate", type=float, help="least steady-state hit rate")
    host = parser.add_argument_group("host memory")
    host.add_argument("--max-model-len", type=int, help="longest request in tokens (default: the trace's context)")
    host.add_argument("--max-requests", type=int, help="concurrent requests per node (default: the batch)")
    host.add_argument("--host-budget-gib", type=float, help="also check a host pool budget (GiB)")
    host.add_argument("--memcpy-gbps", type=float, help="link bandwidth for transfer-time estimates (GB/s)")
    return parser


# ---------------------------------------------------------------------------- shared driver pieces


def require_torch() -> None:
    from .._tensors import torch_or_none  # noqa: PLC0415

    if torch_or_none() is None:
        raise ValueError(
            "needs PyTorch: pip install torch --index-url https://download.pytorch.org/whl/cpu on a machine "
            "without a GPU, pip install torch on one with a GPU"
        )


def _require_positive(name: str, value: Optional[float]) -> None:
    if value is not None and not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name}: expected a positive number, got {value}")


def _require_writable_directory(name: str, directory: str) -> None:
    """Create ``directory`` and prove a file can be written in it, before any measurement runs."""
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as error:
        raise ValueError(f"{name}: cannot write into {directory!r}: {error.strerror or error}") from None


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before the run, outputs that could only fail after it (a long run lost to a typo)."""
    for name, path in (("--out", args.out), ("--save-trace", args.save_trace)):
        if path and os.path.isdir(path):
            raise ValueError(f"{name}: expected a file to write, got the directory {path!r}")
    if args.out:
        _require_writable_directory("--out", os.path.dirname(os.path.abspath(args.out)))
    if args.save_trace:
        _require_writable_directory("--save-trace", os.path.dirname(os.path.abspath(args.save_trace)))
    if args.plots:
        from .plots import MATPLOTLIB_HINT, matplotlib_available  # noqa: PLC0415

        if not matplotlib_available():
            raise ValueError(f"--plots: {MATPLOTLIB_HINT}")
        _require_writable_directory("--plots", args.plots)


def pick_device(name: Optional[str]) -> Any:
    """torch.device for --device: auto prefers a usable CUDA device."""
    require_torch()
    import torch  # noqa: PLC0415

    import hisparse  # noqa: PLC0415

    build = hisparse._C.build_info()
    compiled = build["cuda_compiled"]
    usable = compiled and torch.cuda.is_available() and hisparse._C.cuda_device_count() > 0
    name = name or "auto"
    if name == "auto":
        return torch.device("cuda") if usable else torch.device("cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit()):
        if not usable:
            reason = hisparse._C.cuda_unavailable_reason() if compiled else "hisparse was built without CUDA"
            if compiled and not torch.cuda.is_available():
                reason = f"torch sees no CUDA device ({reason})"
            raise ValueError(f"--device {name}: no usable CUDA device: {reason}")
        device = torch.device(name)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"--device {name}: there are {torch.cuda.device_count()} CUDA devices")
        if device.index is not None:
            torch.cuda.set_device(device)
        return device
    raise ValueError(f"--device: expected auto, cpu, cuda or cuda:N, got {name!r}")


def _overrides(args: argparse.Namespace) -> Dict[str, Any]:
    return {name: getattr(args, name) for name in OVERRIDABLE if hasattr(args, name)}


def _settings_and_trace(args: argparse.Namespace, device: Any) -> Any:
    from .presets import default_hot_sizes, make_settings, validate  # noqa: PLC0415
    from .trace import check_trace_matches, generate_trace, load_trace, save_trace  # noqa: PLC0415

    overrides = _overrides(args)
    settings = make_settings(args.preset, overrides)
    if args.trace:
        trace = load_trace(args.trace, device)
        check_trace_matches(trace, {name: overrides.get(name) for name in ("batch", "spec_tokens", "context", "top_k")})
        if args.steps is not None:
            trace = trace.truncated(args.steps)
        settings.batch, settings.context, settings.top_k = trace.batch, trace.context, trace.top_k
        settings.spec_tokens, settings.steps, settings.trace_groups = trace.spec_tokens, trace.steps, trace.groups
        settings.trace_mode = "file"
        if args.warmup_steps is None and settings.warmup_steps >= trace.steps:
            settings.warmup_steps = trace.steps // 4
        if args.hot_size is None and settings.hot_size < trace.top_k:
            settings.hot_size = 2 * trace.top_k
        if args.hot_sizes is None:
            settings.hot_sizes = default_hot_sizes(settings.top_k, settings.hot_size, settings.hot_block_size)
        validate(settings, trace_replay=True)
    else:
        _check_trace_fits(settings, device)
        trace = generate_trace(settings, device)
    if args.save_trace:
        save_trace(trace, args.save_trace)
    return settings, trace


def _check_trace_fits(settings: Any, device: Any) -> None:
    """Refuse a trace to generate that would not fit half the memory free where it is made (its generation
    allocates it and temporaries of its size), naming the flags that size it."""
    trace_bytes = settings.steps * settings.trace_groups * settings.batch * settings.rows_per_request \
        * settings.top_k * 4
    if device.type == "cuda":
        import torch  # noqa: PLC0415

        free = torch.cuda.mem_get_info(device)[0]
    else:
        from .host_memory import meminfo  # noqa: PLC0415

        free = meminfo("MemAvailable")
    if free and trace_bytes > free // 2:
        raise ValueError(
            f"--steps, --trace-groups, --batch, --spec-tokens, --top-k: the trace of {settings.steps} steps x "
            f"{settings.trace_groups * settings.batch * settings.rows_per_request} token rows x {settings.top_k} "
            f"positions takes {trace_bytes / 2**30:.1f} GiB, more than half of the {free / 2**30:.1f} GiB free on "
            f"{device}")


def _finish(results: Dict[str, Any], text: str, args: argparse.Namespace) -> None:
    from .plots import MATPLOTLIB_HINT, write_plots  # noqa: PLC0415
    from .report import write_json  # noqa: PLC0415

    if not args.quiet:
        print(text)
    if args.out:
        write_json(results, args.out)
        if not args.quiet:
            print(f"wrote {args.out}")
    if args.plots:
        written = write_plots(results, args.plots)
        if written is None:  # matplotlib vanished since check_outputs
            raise ValueError(f"--plots: {MATPLOTLIB_HINT}")
        if not args.quiet:
            print(f"wrote {', '.join(written)}")
    if args.save_trace and not args.quiet:
        print(f"wrote {args.save_trace}")


# ---------------------------------------------------------------------------- drivers


def run_bench_command(args: argparse.Namespace) -> int:
    from .progress import Progress  # noqa: PLC0415
    from .report import format_bench  # noqa: PLC0415
    from .runner import progress_units, run_bench  # noqa: PLC0415

    check_outputs(args)
    device = pick_device(args.device)
    settings, trace = _settings_and_trace(args, device)
    with Progress(progress_units(settings, trace.steps, device), enabled=args.progress) as progress:
        results = run_bench(settings, trace, device, progress=progress)
    _finish(results, format_bench(results), args)
    gc.collect()
    return 0


def run_plan_command(args: argparse.Namespace) -> int:
    from .measure import environment  # noqa: PLC0415
    from .planner import hit_rate_curve, host_plan, recommend, residency_hint_kept_by_default  # noqa: PLC0415
    from .progress import Progress  # noqa: PLC0415
    from .provenance import provenance  # noqa: PLC0415
    from .report import format_plan  # noqa: PLC0415
    from .trace import trace_stats  # noqa: PLC0415

    check_outputs(args)
    for name in ("host_budget_gib", "memcpy_gbps", "max_model_len", "max_requests"):
        _require_positive("--" + name.replace("_", "-"), getattr(args, name))
    device = pick_device(args.device)
    settings, trace = _settings_and_trace(args, device)
    env = environment(device)
    with Progress(len(settings.hot_sizes) * trace.steps, enabled=args.progress) as progress:
        progress.phase("hit-rate curve")
        curve = hit_rate_curve(trace, settings.hot_sizes, hot_block_size=settings.hot_block_size,
                               warmup_steps=settings.warmup_steps, row_bytes=settings.row_bytes,
                               layers=settings.layers, device=device, memcpy_gbps=args.memcpy_gbps,
                               progress=progress)
    recommendation = recommend(curve, top_k=trace.top_k, target_misses=args.target_misses_per_step,
                               target_hit_rate=args.target_hit_rate)
    budget = None if args.host_budget_gib is None else int(args.host_budget_gib * 2**30)
    host = host_plan(
        max_model_len=args.max_model_len or trace.context, max_requests=args.max_requests or trace.batch,
        layers=settings.layers, row_bytes=settings.row_bytes, block_size=settings.block_size,
        host_budget_bytes=budget, index_groups=settings.index_groups,
    )
    host["residency_hint_device"] = str(device)
    host["residency_hint_kept_by_default"] = residency_hint_kept_by_default(
        settings, recommendation["hot_size"] or settings.hot_size, host["max_requests_per_node"], device)
    config = settings.as_dict()
    config.update(rows_per_request=trace.rows_per_request, index_groups=settings.index_groups,
                  memcpy_gbps=args.memcpy_gbps)
    results = {
        "benchmark": "hisparse plan",
        "schema_version": 1,
        **provenance(),
        "config": config,
        "environment": env,
        "trace": dict(trace.describe(), stats=trace_stats(trace)),
        "hit_rate_curve": curve,
        "recommendation": recommendation,
        "host": host,
    }
    _finish(results, format_plan(results), args)
    gc.collect()
    return 0
