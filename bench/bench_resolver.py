"""Residency resolution on the GPU: the kernel alone, the kernel plus a gather
of the missed rows, and a plain PyTorch implementation of the same semantics,
timed side by side in one run.

Decode-like trace: per request, step i selects a window of k positions of a
random permutation of its context, sliding by m = miss_rate * k each step, so
every step has exactly m fresh positions (misses, local to the request's own
host blocks) and k - m positions the hot buffer already holds (hits).

Six timings per point (--paths picks some of them): the resolver alone; the resolver then the plain
warp-per-row gather; the resolver then the default gather; the resolver
with the fused gather (it copies its own swap list's rows, one launch:
gather_schedule="fused"); and the fused gather's automatic schedule
(gather_schedule="auto", the library's default: requests with a few misses
copy them in the resolve launch), twice: with a handoff array, as the
Runtime runs it ("resolve_auto_gather": the others' rows are copied by
every block of the same launch once their swap lists are complete), and
without one ("resolve_auto_tail_gather": by a gather kernel launched right
after the resolve). From the SM count to twice it, both run one block per SM
that resolves two requests in turn and then copies both swap lists.

Speculative shapes (--sections speculative, reported under
"speculative_points" beside the grid's "points"): q = 2 or 4 token rows per
request (MTP with 1 or 3 draft tokens) on hot buffers of 6,144 to 16,384
slots, max_union_rows = min(H, q x k) (vLLM's MTP-3 case: H = 10,240, union
8,192). Row r of a request selects the window of k positions r x k further
along the same sliding order, so a request's union is q x k positions
(capped at H) and each step still brings m new ones. Shapes whose resolver
arrays do not fit a block's shared memory run with their workspace.

Uneven misses (--sections uneven, reported under "uneven_points"): the
grid's trace with about the same total misses per step, spread unevenly over
the requests, as a real batch spreads them (in the dsv32-fp8 preset's trace,
generated on the CPU, one request of 32 misses 2 positions in a step and
another 155, around a mean of 69). Request b slides by m x w_b positions per
step, its weights w_b evenly spaced over [1 - S, 1 + S] (S =
--uneven-spread) and dealt to the batch rows in a fixed shuffled order. Each
point runs twice in a row, with S = 0 (even, the grid's trace) and with S,
and reports both ("miss_spread" says which), so what the spread costs is
measured in one run.

--early-start-bound adds, per point on CUDA, what a schedule that knew
every miss at launch could reach with the library's gathers: each step's own
swap list (taken from an untimed run of the same steps) copied by
gather_compact (warp_per_row and the default) alone
("gather_alone_*_us"), and beside the resolve, forked onto a second stream
at the step's start and joined at its end ("resolve_beside_gather_*_us";
the gather's blocks take the SMs the resolve leaves idle, then the rest).
No schedule of those copies that learns its misses from the resolve can
beat the faster "beside" time.

Each request reads its own --context positions (default 16,384, the
presets' context) of a pool sized for the largest batch: 2.56 GiB at 256
requests, the pool the SGLang peer ran on. The pool's size changes the
large batches' times (256 requests at 5% misses take about 1.17x as long
with 32,768 positions per request; docs/performance.md, "Physical
bounds"). The speculative shapes read a pool of --spec-context positions
per request (default 32,768: their windows of up to 4 x k positions slide
further).

Every point also reports the line bound: a row read alone costs whole
128-byte lines (six for 656 bytes: 768 B), so a step cannot take less than
missed rows x line bytes / memcpy bandwidth; *_over_line_bound are the
paths' times over it.

Timing (hisparse.bench.measure.Timer): N consecutive steps are captured in
one CUDA graph (each step reads its own top-k buffer); the state is restored
from a snapshot before every replay, outside the timed window; per-step time
= replay time / N, median of several replays. The PyTorch baseline runs
eagerly (it needs one host sync). The link's ceiling is contiguous pinned
memcpy host-to-device measured in the same run. Every resolve gets a
residency hint kept with the state where a runtime of the point's shape
keeps one by default (--residency-hint auto: the library's default path,
hisparse.Runtime.default_residency_hint); --residency-hint on or off gives
one to every point or to none.

    python bench/bench_resolver.py --out bench/results/resolver_grid_h200.json

--peer FILE (bench/peers/*.json: a peer kernel's recorded figures on the
same grid and shape, with the design's target rule) adds per point the
peer's time, peer / auto, the target and whether the default path meets it
(peer_us, peer_over_auto, target_us, meets_target), and a count under
"peer". The figures come from the peer's own run: compare on a machine with
the memcpy rate the file records.

--device cpu runs the CPU reference kernels eagerly (no graph capture; the
state is still restored outside the timed window) and the PyTorch baseline
on the CPU, with an unregistered pool and host-to-host memcpy as the
ceiling: a check of the trace and of the baseline's agreement, its figures
mean nothing. For example: --device cpu --batches 1,4 --miss-rates 0.05
--top-k 64 --hot-size 128 --context 2048 --steps 2 --replays 1
--baseline-steps 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import hisparse
from hisparse.baseline import resolve_residency_torch
from hisparse.bench import measure, provenance

# Each timing: (the resolve's fused-gather schedule or None, the separate gather's variant or None).
PATHS = {
    "resolve": (None, None),
    "resolve+gather_warp_per_row": (None, "warp_per_row"),
    "resolve+gather_default": (None, "auto"),
    "resolve_fused_gather": ("fused", None),
    "resolve_auto_gather": ("auto", None),
    "resolve_auto_tail_gather": ("auto-tail", None),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,16,64,100,256")
    parser.add_argument("--miss-rates", default="0.001,0.05,0.2")
    parser.add_argument("--top-k", type=int, default=2048)
    parser.add_argument("--hot-size", type=int, default=4096)
    parser.add_argument("--row-bytes", type=int, default=656)
    parser.add_argument("--context", type=int, default=16384,
                        help="positions per request of the grid (default: 16,384, the presets' context; at 256 "
                             "requests a 2.56 GiB pool, the SGLang peer run's)")
    parser.add_argument("--spec-context", type=int, default=32768,
                        help="positions per request of the speculative shapes (their windows of up to 4 x k "
                             "positions need more)")
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=24, help="steps per captured graph")
    parser.add_argument("--replays", type=int, default=7)
    parser.add_argument("--baseline-steps", type=int, default=5)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the CPU reference kernels, timed eagerly (a smoke test)")
    parser.add_argument("--sections", default="grid",
                        help="comma-separated: grid (batches x miss rates at --hot-size, one token row per "
                             "request), speculative (the --spec-* shapes), uneven (the --uneven-* points, "
                             "misses spread evenly and unevenly over the requests)")
    parser.add_argument("--spec-batches", default="1,16,64,256")
    parser.add_argument("--spec-miss-rates", default="0.001,0.05,0.2")
    parser.add_argument("--spec-token-rows", default="2,4", help="token rows per request")
    parser.add_argument("--spec-hot-sizes", default="6144,10240,16384")
    parser.add_argument("--uneven-batches", default="16,32,64")
    parser.add_argument("--uneven-miss-rates", default="0.025,0.05", help="mean misses per request over k")
    parser.add_argument("--uneven-spread", type=float, default=0.9,
                        help="S in [0, 1): request weights evenly spaced over [1 - S, 1 + S]")
    parser.add_argument("--early-start-bound", action="store_true",
                        help="CUDA: also time each step's own swap list copied alone and beside the resolve")
    parser.add_argument("--residency-hint", choices=("auto", "on", "off"), default="auto",
                        help="pass the resolves a residency hint kept with the state: auto (default) where a "
                        "runtime of the point's shape keeps one by default (hisparse.Runtime.default_residency_hint), "
                        "on or off everywhere")
    parser.add_argument("--paths", default=",".join(PATHS),
                        help="comma-separated timings to take (default: all): " + ", ".join(PATHS)
                        + "; figures derived from a path left out are left out too")
    parser.add_argument("--peer", default=None,
                        help="a peer's recorded grid (bench/peers/*.json): per point, its time and the target")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    return parser.parse_args(argv)


def row_lines(row_bytes):
    """The most 128-byte lines one row of the host cache touches (its rows
    start at multiples of row_bytes from a line-aligned pool): six for 656."""
    return max(-(-((g * row_bytes) % 128 + row_bytes) // 128) for g in range(128))


def keeps_residency_hint(args, batch, token_rows, hot, max_union_rows):
    """Whether a point's resolves keep a residency hint: --residency-hint, with auto as a runtime of the point's
    shape decides (requests of token_rows rows: token_rows - 1 speculative tokens)."""
    if args.residency_hint != "auto":
        return args.residency_hint == "on"
    config = hisparse.Config(top_k=args.top_k, device_buffer_size=hot, max_union_rows=max_union_rows,
                             num_speculative_tokens=token_rows - 1, row_bytes=args.row_bytes,
                             block_size=args.block_size, hot_block_size=args.block_size)
    return hisparse.Runtime.default_residency_hint(config, max_num_reqs=batch, device=args.device)


def misses_per_request(args, miss_rate):
    """The fresh positions each step brings a request: miss_rate x k, at least one."""
    return max(1, round(miss_rate * args.top_k))


def request_misses(args, batch, miss_rate, spread=0.0):
    """The fresh positions each step brings each of `batch` requests: the
    mean misses_per_request, weighted by w_b evenly spaced over
    [1 - spread, 1 + spread] and dealt to the batch rows in a fixed shuffled
    order (spread 0: the same for all), each at least one."""
    m = misses_per_request(args, miss_rate)
    if spread == 0 or batch == 1:
        return [m] * batch
    weights = torch.linspace(1 - spread, 1 + spread, batch, dtype=torch.float64)
    weights = weights[torch.randperm(batch, generator=torch.Generator().manual_seed(0))]
    return [max(1, round(m * float(w))) for w in weights]


def require_context(flag, context, args, points):
    """A section's positions per request (`flag`: --context or
    --spec-context): a positive multiple of --block-size (whole host blocks
    per request) with room for every point's windows over its steps (the
    two warm-up steps included)."""
    if context <= 0 or context % args.block_size:
        raise SystemExit(f"{flag}: expected a positive multiple of --block-size ({args.block_size}), got {context}")
    for token_rows, _, batch, miss_rate, *spread in points:
        most = max(request_misses(args, batch, miss_rate, *spread))
        needed = token_rows * args.top_k + (args.steps + 2) * most
        if needed > context:
            raise SystemExit(f"{flag} {context} too small: {args.steps + 2} steps of {token_rows} token rows at "
                             f"miss rate {miss_rate} take {needed} positions")


class Scenario:
    """Static tensors for one (batch, miss rate) point, with `token_rows`
    rows per request on hot buffers of `hot` slots and the misses spread
    over the requests by `spread` (request_misses)."""

    def __init__(self, args, batch, miss_rate, host_cache, hot_cache, token_rows=1, hot=None, spread=0.0):
        device = torch.device(args.device)
        k, bs = args.top_k, args.block_size
        hot = args.hot_size if hot is None else hot
        self.args, self.batch, self.token_rows, self.hot = args, batch, token_rows, hot
        self.max_union_rows = min(hot, token_rows * k)
        self.request_misses = request_misses(args, batch, miss_rate, spread)
        self.misses_per_step = sum(self.request_misses)
        blocks_per_request = args.context // bs
        self.host_rows = host_cache.shape[0]
        # Request b owns host blocks 1 + b * blocks_per_request + i (block 0 is null).
        base = 1 + torch.arange(batch, device=device, dtype=torch.int32)[:, None] * blocks_per_request
        blocks = torch.arange(blocks_per_request, device=device, dtype=torch.int32)
        self.source_block_table = (base + blocks).contiguous()
        hot_blocks = hot // bs
        self.hot_block_table = (
            torch.arange(batch, device=device, dtype=torch.int32)[:, None] * hot_blocks
            + torch.arange(hot_blocks, device=device, dtype=torch.int32)
        ).contiguous()
        rows = batch * token_rows
        self.req_id = torch.arange(batch, device=device, dtype=torch.int32).repeat_interleave(token_rows)
        self.state_rows = torch.arange(batch, device=device, dtype=torch.int32)
        self.dgi = torch.full((batch, hot), -1, dtype=torch.int32, device=device)
        self.lru = torch.arange(hot, dtype=torch.int16, device=device).repeat(batch, 1).contiguous()
        total_steps = args.steps + 2
        # main() checks each section's context under its own flag first; the
        # other tools that build a Scenario (resolver_timeline.py,
        # profile_resolver_point.py) take --context.
        require_context("--context", args.context, args, [(token_rows, hot, batch, miss_rate, spread)])
        order = torch.argsort(torch.rand(batch, args.context, device=device), dim=1).to(torch.int32)
        m = torch.tensor(self.request_misses, device=device, dtype=torch.int64)[:, None]
        window = torch.arange(k, device=device, dtype=torch.int64)[None, :]
        self.topk = torch.stack(
            [
                torch.stack([torch.gather(order, 1, i * m + r * k + window) for r in range(token_rows)], dim=1)
                .reshape(rows, k)
                for i in range(total_steps)
            ]
        ).contiguous()  # [steps, batch * token_rows, k]
        outputs = ("attention", "hot_rows", "resolved", "miss_mask", "swap_host", "swap_device")
        self.out = {name: torch.empty((rows, k), dtype=torch.int32, device=device) for name in outputs}
        self.valid_counts = torch.empty(rows, dtype=torch.int32, device=device)
        self.swap_counts = torch.empty(rows, dtype=torch.int32, device=device)
        self.host_cache, self.hot_cache = host_cache, hot_cache
        # Shapes whose resolver arrays do not fit a block's shared memory.
        self.workspace = None
        if device.type == "cuda":
            size = hisparse.ops.resolver_workspace_bytes(batch, hot, self.max_union_rows, device)
            if size:
                self.workspace = torch.empty(size, dtype=torch.uint8, device=device)
        # The automatic schedule's records, kept with the state (zero between launches).
        self.handoff = torch.zeros((batch, hisparse.ops.RESOLVER_HANDOFF_WORDS), dtype=torch.int32, device=device)
        # The residency hint, kept with the state like the runtime's: every resolve keeps it from the cold start on.
        self.hint = None
        if keeps_residency_hint(args, batch, token_rows, hot, self.max_union_rows):
            self.hint = torch.zeros((self.host_rows + 31) // 32, dtype=torch.int32, device=device)

    def resolve(self, step, fn=hisparse.ops.resolve_residency, schedule=None, stats=None):
        a = self.args
        # The fused gather (schedule "fused", "auto" with the handoff array,
        # or "auto-tail" without it): the resolver copies its own swap list's rows.
        gather = {}
        if schedule is not None:
            gather = dict(gather_host_cache=self.host_cache, gather_hot_cache=self.hot_cache,
                          gather_schedule="auto" if schedule == "auto-tail" else schedule)
            if schedule == "auto":
                gather["handoff"] = self.handoff
        if self.workspace is not None and fn is hisparse.ops.resolve_residency:
            gather["workspace"] = self.workspace
        if self.hint is not None and fn is hisparse.ops.resolve_residency:
            gather["residency_hint"] = self.hint
        if stats is not None:
            gather["stats"] = stats
        fn(
            self.topk[step], self.req_id, self.state_rows, self.dgi, self.lru, self.hot_block_table,
            hot_block_size=a.block_size, attention_block_stride=a.block_size, host_rows=self.host_rows,
            max_union_rows=self.max_union_rows, out_attention=self.out["attention"], out_hot_rows=self.out["hot_rows"],
            out_resolved=self.out["resolved"], out_miss_mask=self.out["miss_mask"],
            out_valid_counts=self.valid_counts, out_swap_host_rows=self.out["swap_host"],
            out_swap_device_rows=self.out["swap_device"], out_swap_counts=self.swap_counts,
            source_block_table=self.source_block_table, block_size=a.block_size, **gather,
        )

    def gather(self, variant):
        hisparse.ops.gather_compact(
            self.host_cache, self.hot_cache, self.out["swap_host"], self.out["swap_device"], self.swap_counts,
            hot_block_size=self.args.block_size, variant=variant,
        )


def make_caches(args, max_batch, device, max_hot=None):
    """The host pool (registered on CUDA) with every request's host blocks as
    Scenario numbers them (block 0 is the null block), a uint8 view of its
    rows, and a hot cache for max_batch requests of max_hot slots (default
    --hot-size). Keep the pool alive while the view is in use."""
    device = torch.device(device)
    host_rows = (1 + max_batch * (args.context // args.block_size)) * args.block_size
    pool = hisparse.HostPool(host_rows * args.row_bytes, register="always" if device.type == "cuda" else "never")
    host_cache = pool.view("uint8", (host_rows, args.row_bytes))
    host_cache.fill_(0x5A)  # populated, non-zero rows; the bytes themselves are checked by the tests
    max_hot = args.hot_size if max_hot is None else max_hot
    hot_cache = torch.empty((max_batch * max_hot, args.row_bytes), dtype=torch.uint8, device=device)
    return pool, host_cache, hot_cache


def link_ceiling(device):
    """Contiguous pinned memcpy from a pool of its own, so that the ceiling
    does not depend on how large the sections' pools are (256 MiB on CUDA; a
    CPU run's figures mean nothing, so it copies 16 MiB)."""
    nbytes = (256 if device.type == "cuda" else 16) << 20
    pool = hisparse.HostPool(nbytes, register="always" if device.type == "cuda" else "never")
    return measure.memcpy_bandwidth(pool.view("uint8"), device, nbytes=nbytes)


def run_section(args, points, device, memcpy_gbps, peer=None):
    """Points (token rows, hot slots or None for --hot-size, batch, miss
    rate[, spread]) on a pool of args.context positions per request: their results,
    the pool's setup seconds and its info. With `peer`, each point is
    compared with it."""
    setup = time.perf_counter()
    max_batch = max(batch for _, _, batch, *_ in points)
    max_hot = max(args.hot_size if hot is None else hot for _, hot, *_ in points)
    pool, host_cache, hot_cache = make_caches(args, max_batch, device, max_hot)
    setup = time.perf_counter() - setup
    rows = []
    for token_rows, hot, batch, miss_rate, *spread in points:
        rows.append(run_point(args, batch, miss_rate, host_cache, hot_cache, memcpy_gbps, token_rows, hot, *spread))
        if peer is not None:
            compare_with_peer(rows[-1], peer)
        report(rows[-1])
    return rows, setup, pool.info()


def run_point(args, batch, miss_rate, host_cache, hot_cache, memcpy_gbps, token_rows=1, hot=None, spread=None):
    device = torch.device(args.device)
    s = Scenario(args, batch, miss_rate, host_cache, hot_cache, token_rows, hot, spread or 0.0)
    s.resolve(0)  # cold start: fill the hot buffers
    s.resolve(1)
    measure.synchronize(device)
    snapshot = (s.dgi.clone(), s.lru.clone(), None if s.hint is None else s.hint.clone())

    def restore():
        s.dgi.copy_(snapshot[0])
        s.lru.copy_(snapshot[1])
        if s.hint is not None:
            s.hint.copy_(snapshot[2])

    results = {"batch": batch, "miss_rate": miss_rate, "misses_per_step": s.misses_per_step,
               "residency_hint": s.hint is not None}
    if spread is not None:
        results.update(miss_spread=spread, request_misses=s.request_misses)
    if token_rows != 1 or hot is not None:
        results.update(token_rows=token_rows, hot_size=s.hot, max_union_rows=s.max_union_rows,
                       workspace_bytes=0 if s.workspace is None else s.workspace.numel())
    # CUDA: the steps are captured once and the graph replayed; CPU: run eagerly.
    timer = measure.Timer(device)
    for name in args.paths.split(","):
        schedule, variant = PATHS[name]

        def steps(schedule=schedule, variant=variant):
            for step in range(2, 2 + args.steps):
                s.resolve(step, schedule=schedule)
                if variant is not None:
                    s.gather(variant)

        timing = timer.time(steps, repeats=args.replays, restore=restore)
        results[f"{name}_us"] = timing["median_s"] * 1e6 / args.steps

    if args.early_start_bound and device.type == "cuda":
        results.update(early_start_bound(s, timer, restore))

    # Exactly the designed misses? (checks the trace, and that the kernel saw hits)
    restore()
    s.resolve(2)
    results["swap_rows_observed"] = int(s.swap_counts.sum())

    # The PyTorch baseline on the same steps, from the same state, and its agreement.
    reference = {name: tensor.clone() for name, tensor in s.out.items()}
    restore()
    times = []
    for step in range(2, 2 + args.baseline_steps):
        start = time.perf_counter()
        s.resolve(step, fn=resolve_residency_torch)
        measure.synchronize(device)
        times.append((time.perf_counter() - start) * 1e6)
        if step == 2:
            results["baseline_agrees"] = all(
                torch.equal(reference[n], s.out[n]) for n in ("attention", "hot_rows", "resolved", "miss_mask")
            )
    # --baseline-steps 0 skips the baseline (large speculative shapes take it long).
    results["baseline_torch_us"] = statistics.median(times) if times else float("nan")
    results.setdefault("baseline_agrees", None)
    if "resolve_us" in results:
        results["speedup_vs_torch"] = results["baseline_torch_us"] / results["resolve_us"]
    missed_bytes = results["misses_per_step"] * args.row_bytes
    results["missed_bytes"] = missed_bytes
    results["ideal_transfer_us"] = missed_bytes / (memcpy_gbps * 1e9) * 1e6
    ideal = max(results["ideal_transfer_us"], 1e-9)
    timed = {name: results.get(f"{path}_us") for name, path in (
        ("gather_default", "resolve+gather_default"), ("fused", "resolve_fused_gather"),
        ("auto", "resolve_auto_gather"), ("auto_tail", "resolve_auto_tail_gather"))}
    if timed["gather_default"] is not None:
        results["gather_default_over_ideal"] = timed["gather_default"] / ideal
        if "resolve_us" in results:
            results["gather_default_gbps"] = missed_bytes / (
                max(timed["gather_default"] - results["resolve_us"], 1e-9) * 1e-6) / 1e9
    if timed["fused"] is not None:
        results["fused_over_ideal"] = timed["fused"] / ideal
    # The line bound, from the rows the step really missed.
    line_bytes = 128 * row_lines(args.row_bytes)
    results["line_bytes_per_row"] = line_bytes
    results["ideal_line_bound_us"] = results["swap_rows_observed"] * line_bytes / (memcpy_gbps * 1e9) * 1e6
    if timed["gather_default"] is not None and timed["fused"] is not None:
        timed["best"] = min(timed["gather_default"], timed["fused"])
    bounds = [(name[:-3], results[name]) for name in results if name.startswith(("gather_alone", "resolve_beside"))]
    for name, us in bounds + list(timed.items()):
        if us is not None:
            results[f"{name}_over_line_bound"] = us / max(results["ideal_line_bound_us"], 1e-9)
    return results


def early_start_bound(s, timer, restore):
    """The timings of --early-start-bound for scenario `s` (see the module
    docstring): every step's swap list from an untimed run of the steps,
    then each gather variant alone and beside the resolve."""
    a = s.args
    restore()
    lists = []
    for step in range(2, 2 + a.steps):
        s.resolve(step)
        lists.append((s.out["swap_host"].clone(), s.out["swap_device"].clone(), s.swap_counts.clone()))
    side = torch.cuda.Stream(s.hot_cache.device)

    def copy(swap_lists, variant):
        hisparse.ops.gather_compact(s.host_cache, s.hot_cache, *swap_lists, hot_block_size=a.block_size,
                                    variant=variant)

    results = {}
    for variant, name in (("warp_per_row", "warp_per_row"), ("auto", "default")):

        def alone(variant=variant):
            for swap_lists in lists:
                copy(swap_lists, variant)

        def beside(variant=variant):
            step_stream = torch.cuda.current_stream()
            for step, swap_lists in zip(range(2, 2 + a.steps), lists):
                side.wait_stream(step_stream)
                with torch.cuda.stream(side):
                    copy(swap_lists, variant)
                s.resolve(step)
                step_stream.wait_stream(side)

        for label, work in (("gather_alone", alone), ("resolve_beside_gather", beside)):
            timing = timer.time(work, repeats=a.replays, restore=restore)
            results[f"{label}_{name}_us"] = timing["median_s"] * 1e6 / a.steps
    return results


def load_peer(path, args):
    """The peer file's figures by (batch, miss rate), refused when its shape
    (k, H, row bytes and positions per request, which set the host memory a
    step's rows are spread over) is not the grid's: a target for other inputs
    would be meaningless."""
    with open(path) as handle:
        peer = json.load(handle)
    grid = {"top_k": args.top_k, "hot_size": args.hot_size, "row_bytes": args.row_bytes, "context": args.context}
    if peer["shape"] != grid:
        raise SystemExit(f"--peer {path}: its figures are for {peer['shape']}, the grid is {grid}")
    peer["by_point"] = {(p["batch"], p["miss_rate"]): p["us"] for p in peer["points"]}
    peer["limits"] = {(p["batch"], p["miss_rate"]): p["us"] for p in peer["target"].get("limits_us", [])}
    return peer


def compare_with_peer(results, peer):
    """Adds the peer's time at the point and the design's target for the
    default path (gather_schedule "auto"): at most peer / faster_by, or
    line_bound_factor x the line bound where that is larger (no path can beat
    the link), and at most the point's own limit. Points the peer did not
    run are left as they are."""
    key = (results["batch"], results["miss_rate"])
    if key not in peer["by_point"] or "resolve_auto_gather_us" not in results:
        return
    peer_us = peer["by_point"][key]
    rule = peer["target"]
    target = max(peer_us / rule["faster_by"], rule["line_bound_factor"] * results["ideal_line_bound_us"])
    if key in peer["limits"]:
        target = min(target, peer["limits"][key])
    auto = results["resolve_auto_gather_us"]
    results.update(peer_us=peer_us, peer_over_auto=peer_us / auto, target_us=target, meets_target=auto <= target)


def report(r):
    shape = f"q={r['token_rows']} H={r['hot_size']:<5} " if "token_rows" in r else ""
    if "miss_spread" in r:
        shape += f"spread={r['miss_spread']:<4} "

    def us(name):
        return f"{r[name]:8.2f}us" if name in r else f"{'-':>8s}  "

    print(
        f"{shape}B={r['batch']:<4} miss={r['miss_rate']:<6} misses={r['swap_rows_observed']:<6} "
        f"resolve={us('resolve_us')}  +gather(plain)={us('resolve+gather_warp_per_row_us')}  "
        f"+gather(default)={us('resolve+gather_default_us')}  fused={us('resolve_fused_gather_us')}  "
        f"auto={us('resolve_auto_gather_us')}  auto(tail)={us('resolve_auto_tail_gather_us')}  "
        f"ideal={r['ideal_transfer_us']:7.2f}us  line={r['ideal_line_bound_us']:7.2f}us "
        + (f"(best x{r['best_over_line_bound']:.2f})  " if "best_over_line_bound" in r else "")
        + f"torch={r['baseline_torch_us']:9.1f}us  "
        + (f"x{r['speedup_vs_torch']:.0f}  " if "speedup_vs_torch" in r else "")
        + f"agree={r['baseline_agrees']}"
        + (f"  beside(plain)={r['resolve_beside_gather_warp_per_row_us']:.2f}us "
           f"beside(default)={r['resolve_beside_gather_default_us']:.2f}us "
           f"alone(plain)={r['gather_alone_warp_per_row_us']:.2f}us "
           f"alone(default)={r['gather_alone_default_us']:.2f}us" if "gather_alone_default_us" in r else "")
        + (f"  peer={r['peer_us']:.1f}us (x{r['peer_over_auto']:.2f} auto)  target={r['target_us']:.1f}us "
           f"{'met' if r['meets_target'] else 'not met'}" if "peer_us" in r else ""),
        flush=True,
    )


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_resolver needs a CUDA device (or --device cpu for a smoke test)")
    unknown = set(args.paths.split(",")) - set(PATHS)
    if unknown:
        raise SystemExit(f"--paths: expected some of {', '.join(PATHS)}, got {', '.join(sorted(unknown))}")
    sections = set(args.sections.split(","))
    if not sections <= {"grid", "speculative", "uneven"}:
        raise SystemExit(f"--sections: expected some of grid, speculative and uneven, got {args.sections}")
    if not 0 <= args.uneven_spread < 1:
        raise SystemExit(f"--uneven-spread: expected a value in [0, 1), got {args.uneven_spread}")
    batches = [int(b) for b in args.batches.split(",")] if "grid" in sections else []
    miss_rates = [float(m) for m in args.miss_rates.split(",")]
    spec = []
    if "speculative" in sections:
        spec = [(q, h, b, m) for q in (int(x) for x in args.spec_token_rows.split(","))
                for h in (int(x) for x in args.spec_hot_sizes.split(","))
                for b in (int(x) for x in args.spec_batches.split(","))
                for m in (float(x) for x in args.spec_miss_rates.split(","))]
    grid = [(1, None, b, m) for b in batches for m in miss_rates]
    uneven = []
    if "uneven" in sections:
        uneven = [(1, None, b, m, spread) for b in (int(x) for x in args.uneven_batches.split(","))
                  for m in (float(x) for x in args.uneven_miss_rates.split(","))
                  for spread in (0.0, args.uneven_spread)]
    if grid or uneven:
        require_context("--context", args.context, args, grid + uneven)
    if spec:
        require_context("--spec-context", args.spec_context, args, spec)
    peer = load_peer(args.peer, args) if args.peer else None
    memcpy = link_ceiling(device)
    # Each section reads a pool of its own context: how much host memory a
    # step's rows are spread over changes the large batches' times
    # (docs/performance.md, "Physical bounds": host footprint). The first
    # section's pool keeps the published key.
    env = {}
    rows, spec_rows, uneven_rows = [], [], []
    if grid:
        rows, env["host_pool_setup_seconds"], env["host_pool"] = run_section(args, grid, device, memcpy["gbps"], peer)
    if uneven:
        key = "uneven_" if grid else ""
        uneven_rows, env[f"{key}host_pool_setup_seconds"], env[f"{key}host_pool"] = run_section(
            args, uneven, device, memcpy["gbps"])
    if spec:
        spec_args = argparse.Namespace(**{**vars(args), "context": args.spec_context})
        key = "speculative_" if grid else ""
        spec_rows, env[f"{key}host_pool_setup_seconds"], env[f"{key}host_pool"] = run_section(
            spec_args, spec, device, memcpy["gbps"])
    memcpy_gbps = memcpy["gbps"]
    # How the ceiling was measured (host-to-host on the CPU) sits here, so the top-level keys stay those of
    # the published results.
    env = {**measure.environment(device), **env, "memcpy": memcpy}
    result = {
        "benchmark": "resolver",
        **provenance.provenance(__file__),
        "config": vars(args),
        "environment": env,
        "memcpy_h2d_gbps": memcpy_gbps,
        "points": rows,
    }
    if spec:
        result["speculative_points"] = spec_rows
    if uneven:
        result["uneven_points"] = uneven_rows
    if peer is not None:
        compared = [r for r in rows if "peer_us" in r]
        met = sum(r["meets_target"] for r in compared)
        result["peer"] = {"file": args.peer, "name": peer["name"], "source": peer["source"],
                          "memcpy_h2d_gbps": peer["memcpy_h2d_gbps"], "target_rule": peer["target"]["rule"],
                          "points_compared": len(compared), "points_met": met}
        print(f"target met at {met} of {len(compared)} points against {peer['name']}", flush=True)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)
    return result


if __name__ == "__main__":
    main()
