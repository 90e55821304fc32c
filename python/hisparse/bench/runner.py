"""``hisparse bench``: one run that measures everything side by side.

Phases, all on one device and one trace:

1. the link's ceiling: one contiguous memcpy (pinned host-to-device on CUDA,
   host-to-host on CPU);
2. accounting: every step from cold buffers, eagerly, recording each index
   group's counters and each request's swap rows per step on the device (one
   host sync at the end); then a byte-for-byte check that the hot rows of the
   first and last groups hold the host rows their attention indices stand for,
   and the same check after two steps from cold buffers with fused leader
   gathers and prefetch;
3. timing of the steady-state steps (after ``warmup_steps``) from a snapshot
   of the hot-region state, restored before every repetition: resolution
   alone, the gathers alone (every layer replaying the swap lists recorded
   in the accounting pass), the full data plane through the runtimes
   (resolve + gather: prefetch off, on, and on with fused leader gathers)
   and, on CUDA, the decode step with a stand-in attention kernel of
   ``compute_us`` per layer on the compute stream, alone and with the data
   plane (the same three ways);
4. the plain PyTorch baseline on the first ``baseline_steps`` steady steps,
   in lockstep with hisparse from the same state, with its outputs compared
   (hisparse runs every second of these steps with prefetch and fused leader
   gathers, which must change none of the compared outputs);
5. gather bandwidth against rows per step (swap lists of a fraction of k
   rows per request, from the trace), hisparse and plain torch;
6. the hit-rate curve over ``hot_sizes`` (see :mod:`hisparse.bench.planner`).

On CUDA, steps are captured into CUDA graphs and timed with events; on the
CPU backend every kernel runs synchronously on the calling thread and is
timed with ``perf_counter``: there is no copy engine and nothing overlaps, so
"exposed" time is the data-plane time itself.
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional

from hisparse import ops

from .baseline_step import BaselineStep
from .measure import Timer, environment, memcpy_bandwidth, sleep_cycles_per_us, synchronize
from .plane import DataPlane
from .planner import hit_rate_curve
from .provenance import provenance
from .trace import Trace, trace_stats

__all__ = ["run_bench", "progress_units"]

_MEMCPY_BYTES = {"cuda": 256 << 20, "cpu": 64 << 20}
_GATHER_GRAPH_BYTES = 32e6
# Device memory for the recorded swap lists the gather-only timing replays.
_RECORD_BYTES = 1 << 30
_STAT_NAMES = ("lookups", "hits", "misses", "resident", "invalid")


def progress_units(settings: Any, steps: int, device: Any) -> int:
    """Units of work :func:`run_bench` reports to its progress bar."""
    modes = 5  # resolve, gather, swap, swap_prefetch, swap_prefetch_fused
    if device.type == "cuda" and settings.compute_us > 0:
        modes += 5 if settings.group_size > 1 and settings.layers > settings.index_groups else 4
    baseline = min(settings.baseline_steps, steps - settings.warmup_steps)
    return steps + modes + baseline + len(settings.gather_fractions) + len(set(settings.hot_sizes)) * steps


def run_bench(settings: Any, trace: Trace, device: Any, *, progress: Any = None) -> Dict[str, Any]:
    """Run every phase; return the results as a JSON-ready dict."""
    import torch  # noqa: PLC0415

    def phase(label: str) -> None:
        if progress is not None:
            progress.phase(label)

    def advance(units: int = 1) -> None:
        if progress is not None:
            progress.advance(units)

    env = environment(device)
    phase("host pool, runtimes")
    groups = settings.group_layers()
    fill = sorted({0, groups[0] - 1, settings.layers - groups[-1], settings.layers - 1})
    plane = DataPlane(settings, trace, device, fill_layers=fill)
    try:
        results = _run(settings, trace, device, plane, env, phase, advance, torch)
    finally:
        plane.close()
    return results


def _run(settings: Any, trace: Trace, device: Any, plane: DataPlane, env: Dict[str, Any], phase: Any,
         advance: Any, torch: Any) -> Dict[str, Any]:
    steps, warm = trace.steps, settings.warmup_steps
    timed = list(range(warm, steps))
    layers, row_bytes = settings.layers, settings.row_bytes
    is_cuda = device.type == "cuda"
    notes: List[str] = []

    phase("memcpy ceiling")
    memcpy = memcpy_bandwidth(plane.pool.view("uint8"), device, nbytes=_MEMCPY_BYTES[device.type])

    # ---------------------------------------------------------------- accounting
    phase("accounting pass")
    plane.reset()
    counters = torch.zeros((steps + 1, plane.index_groups, 5), dtype=torch.int64, device=device)
    request_rows = torch.zeros((steps, plane.index_groups, plane.batch), dtype=torch.int32, device=device)
    counters[0].copy_(plane.counters())
    per_step_list_bytes = plane.index_groups * plane.token_rows * (2 * plane.top_k + 1) * 4
    recorded = max(1, min(len(timed), _RECORD_BYTES // per_step_list_bytes))
    plane.start_recording(recorded)
    for step in range(steps):
        if step == warm:
            plane.snapshot()
        plane.step(step)
        counters[step + 1].copy_(plane.counters())
        request_rows[step].copy_(plane.request_misses())
        if warm <= step < warm + recorded:
            plane.record(step - warm)
        advance()
    synchronize(device)
    checked_groups = sorted({0, plane.index_groups - 1})
    data_check = all(plane.data_matches(g) for g in checked_groups)
    deltas = (counters[1:] - counters[:-1]).cpu()  # [steps, groups, 5]
    accounting = _accounting(deltas, request_rows.cpu(), settings, warm)
    data_check_fused = _fused_data_check(plane, timed[:2], checked_groups)

    # ---------------------------------------------------------------- timing
    timer = Timer(device)
    repeats = settings.replays
    timings: Dict[str, Dict[str, Any]] = {}
    compute = None
    cycles = None
    if is_cuda and settings.compute_us > 0:
        cycles = int(settings.compute_us * sleep_cycles_per_us(device))
        compute = _stand_in_attention(torch, cycles)

    modes = {
        "resolve": lambda: [plane.resolve_only(s) for s in timed],
        "gather": lambda: [plane.gather_recorded(i) for i in range(plane.recorded_steps)],
        "swap": lambda: [plane.step(s) for s in timed],
        "swap_prefetch": lambda: [plane.step(s, prefetch=True) for s in timed],
        "swap_prefetch_fused": lambda: [plane.step(s, prefetch=True, fused=True) for s in timed],
    }
    if compute is not None:
        modes["compute"] = lambda: [plane.step(s, swap=False, compute=compute) for s in timed]
        modes["step_no_prefetch"] = lambda: [plane.step(s, compute=compute) for s in timed]
        modes["step_prefetch"] = lambda: [plane.step(s, prefetch=True, compute=compute) for s in timed]
        modes["step_prefetch_fused"] = lambda: [plane.step(s, prefetch=True, fused=True, compute=compute)
                                                for s in timed]
        if plane.index_groups < layers:
            modes["leaders_only"] = lambda: [plane.step(s, followers=False, compute=compute) for s in timed]
    for name, work in modes.items():
        phase(f"timing: {name}")
        timing = timer.time(work, repeats=repeats, restore=plane.restore)
        timing["per_step_s"] = timing["median_s"] / (plane.recorded_steps if name == "gather" else len(timed))
        timings[name] = timing
        advance()
    per_layer = _per_layer(timings, plane, settings, accounting, memcpy, compute is not None)
    if not is_cuda:
        notes.append(
            "cpu backend: kernels run synchronously on the calling thread (no copy engine, no overlap); "
            "exposed time = data-plane time, and prefetch only moves the followers' gathers into the leader's call"
        )
        if settings.compute_us > 0:
            notes.append("the stand-in attention (compute_us) runs only on CUDA")

    # ---------------------------------------------------------------- baseline
    baseline = None
    count = min(settings.baseline_steps, len(timed))
    if count:
        phase("plain PyTorch baseline")
        baseline = _baseline(plane, timed[:count], per_layer, advance, torch)

    # ---------------------------------------------------------------- gather sweep
    phase("gather bandwidth sweep")
    sweep = _gather_sweep(plane, settings, memcpy["gbps"], timer, advance, torch)

    # ---------------------------------------------------------------- hit-rate curve
    phase("hit-rate curve")

    class _Forward:
        def advance(self, units: int = 1) -> None:
            advance(units)

    curve = hit_rate_curve(trace, settings.hot_sizes, hot_block_size=settings.hot_block_size, warmup_steps=warm,
                           row_bytes=row_bytes, layers=layers, device=device, memcpy_gbps=memcpy["gbps"],
                           progress=_Forward())
    curve_check = _curve_matches(curve, accounting, settings, trace, plane.index_groups)

    config = settings.as_dict()
    config.update(
        index_groups=plane.index_groups, token_rows=plane.token_rows, rows_per_request=trace.rows_per_request,
        max_union_rows=plane.max_union_rows, host_rows_per_layer=plane.host_rows,
        host_pool_bytes=plane.pool.nbytes, hot_slab_bytes=sum(int(s.numel()) for s in plane.slabs),
        timed_steps=len(timed), stand_in_compute_cycles=cycles,
        residency_hint_kept=plane.leaders[0].residency_hint,
    )
    # Replayed traces fix these; the settings echo what actually ran.
    config.update(batch=trace.batch, context=trace.context, top_k=trace.top_k, spec_tokens=trace.spec_tokens,
                  steps=trace.steps)
    summary = _summary(accounting, per_layer, memcpy, baseline, settings)
    return {
        "benchmark": "hisparse bench",
        "schema_version": 1,
        **provenance(),
        "config": config,
        "environment": env,
        "trace": dict(trace.describe(), stats=trace_stats(trace)),
        "memcpy": memcpy,
        "accounting": accounting,
        "data_check": data_check,
        "data_check_fused": data_check_fused,
        "timing": timings,
        "per_layer": per_layer,
        "baseline": baseline,
        "agreement": None if baseline is None else baseline["agreement"],
        "gather_sweep": sweep,
        "hit_rate_curve": curve,
        "curve_matches_measured": curve_check,
        "summary": summary,
        "notes": notes,
    }


def _fused_data_check(plane: DataPlane, steps: List[int], groups: List[int]) -> Dict[str, Any]:
    """The byte check on ``groups`` after ``steps`` run from cold buffers with fused leader gathers.

    Cold, the first step misses every row and the next mixes hits with
    misses, so every row the check reads was loaded by a fused leader or by
    a follower prefetched from its swap list.
    """
    plane.reset()
    loaded = 0
    for step in steps:
        plane.step(step, prefetch=True, fused=True)
        loaded += int(plane.request_misses()[groups].sum())
    return {"steps": list(steps), "rows_loaded": loaded, "matches": all(plane.data_matches(g) for g in groups)}


def _stand_in_attention(torch: Any, cycles: int) -> Any:
    """A kernel that keeps the compute stream busy for a fixed time (torch.cuda._sleep spins)."""

    def compute() -> None:
        torch.cuda._sleep(cycles)

    return compute


def _accounting(deltas: Any, request_rows: Any, settings: Any, warm: int) -> Dict[str, Any]:
    """Hits, misses and bytes per step, from the per-group counter deltas."""
    groups = settings.group_layers()
    row_bytes = settings.row_bytes
    per_step = []
    for step in range(deltas.shape[0]):
        d = deltas[step]
        hits, misses = int(d[:, 1].sum()), int(d[:, 2].sum())
        per_step.append({
            "step": step,
            "hits": hits,
            "misses": misses,
            "hit_rate": hits / (hits + misses) if hits + misses else 0.0,
            # Every layer of a group loads the rows its leader missed.
            "bytes": sum(int(d[g, 2]) * row_bytes * size for g, size in enumerate(groups)),
            "invalid": int(d[:, 4].sum()),
        })
    steady = deltas[warm:]
    totals = {name: int(steady[:, :, i].sum()) for i, name in enumerate(_STAT_NAMES)}
    steady_steps = deltas.shape[0] - warm
    num_groups = len(groups)
    misses_per_group_step = totals["misses"] / (steady_steps * num_groups)
    rows = request_rows[warm:].flatten().tolist()
    looked = totals["hits"] + totals["misses"]
    return {
        "per_step": per_step,
        "steady_steps": steady_steps,
        "steady": {
            **totals,
            "hit_rate": totals["hits"] / looked if looked else 0.0,
            "misses_per_step": totals["misses"] / steady_steps,
            "misses_per_group_step": misses_per_group_step,
            "misses_per_request_step": statistics.fmean(rows) if rows else 0.0,
            "misses_per_request_step_max": max(rows) if rows else 0,
            "bytes_per_step": sum(p["bytes"] for p in per_step[warm:]) / steady_steps,
            "bytes_per_layer_step": misses_per_group_step * row_bytes,
            "rows_per_layer_step": misses_per_group_step,
        },
    }


def _per_layer(timings: Dict[str, Any], plane: DataPlane, settings: Any, accounting: Dict[str, Any],
               memcpy: Dict[str, Any], with_compute: bool) -> Dict[str, Any]:
    layers, groups = settings.layers, plane.index_groups
    steady = accounting["steady"]
    resolve_step = timings["resolve"]["per_step_s"]
    swap_step = timings["swap"]["per_step_s"]
    gather_step = timings["gather"]["per_step_s"]
    out: Dict[str, Any] = {
        "resolve_us_per_group": resolve_step / groups * 1e6,
        "resolve_us_per_layer": resolve_step / layers * 1e6,
        "gather_us_per_layer": gather_step / layers * 1e6,
        "data_plane_us_per_step": swap_step * 1e6,
        "data_plane_us_per_step_prefetch": timings["swap_prefetch"]["per_step_s"] * 1e6,
        "data_plane_us_per_step_prefetch_fused": timings["swap_prefetch_fused"]["per_step_s"] * 1e6,
        "bytes_per_layer_step": steady["bytes_per_layer_step"],
        "rows_per_layer_step": steady["rows_per_layer_step"],
    }
    recorded = plane.recorded_steps
    warm = settings.warmup_steps
    gather_bytes = sum(p["bytes"] for p in accounting["per_step"][warm:warm + recorded]) / recorded
    out["gather_bytes_per_step"] = gather_bytes
    out["gather_steps_timed"] = recorded
    gbps = gather_bytes / gather_step / 1e9 if gather_step > 0 else None
    out["gather_gbps"] = gbps
    out["gather_ratio_to_memcpy"] = gbps / memcpy["gbps"] if gbps else None
    out["ideal_transfer_us_per_layer"] = steady["bytes_per_layer_step"] / (memcpy["gbps"] * 1e3)
    if with_compute:
        compute = timings["compute"]["per_step_s"]
        out["compute_us_per_layer"] = compute / layers * 1e6
        out["exposed_us_per_layer_no_prefetch"] = (timings["step_no_prefetch"]["per_step_s"] - compute) / layers * 1e6
        out["exposed_us_per_layer_prefetch"] = (timings["step_prefetch"]["per_step_s"] - compute) / layers * 1e6
        out["exposed_us_per_layer_prefetch_fused"] = (
            (timings["step_prefetch_fused"]["per_step_s"] - compute) / layers * 1e6)
        if "leaders_only" in timings:
            leaders = timings["leaders_only"]["per_step_s"]
            followers = layers - groups
            out["exposed_us_per_leader"] = (leaders - compute) / groups * 1e6
            out["exposed_us_per_follower_prefetch"] = (
                (timings["step_prefetch"]["per_step_s"] - leaders) / followers * 1e6)
            out["exposed_us_per_follower_no_prefetch"] = (
                (timings["step_no_prefetch"]["per_step_s"] - leaders) / followers * 1e6)
        out["exposure_method"] = (
            "(step with data plane - compute-only step) / layers, stand-in attention on the compute stream")
    else:
        out["compute_us_per_layer"] = 0.0
        out["exposed_us_per_layer_no_prefetch"] = swap_step / layers * 1e6
        out["exposed_us_per_layer_prefetch"] = timings["swap_prefetch"]["per_step_s"] / layers * 1e6
        out["exposed_us_per_layer_prefetch_fused"] = timings["swap_prefetch_fused"]["per_step_s"] / layers * 1e6
        out["exposure_method"] = "cpu: no overlap exists, exposed = data-plane time / layers"
    return out


def _baseline(
    plane: DataPlane, steps: List[int], per_layer: Dict[str, Any], advance: Any, torch: Any
) -> Dict[str, Any]:
    """Plain PyTorch in lockstep with hisparse from the snapshot; timings and agreement."""
    plane.restore()
    baseline = BaselineStep(plane)
    baseline.load_state(plane.snapshot_state())
    before = plane.counters().clone()
    mismatches: Dict[str, int] = {}
    resolve_s, gather_s = [], []
    for i, step in enumerate(steps):
        # Fused leader gathers move the same bytes and must leave every compared output unchanged.
        fused = i % 2 == 1
        plane.step(step, prefetch=fused, fused=fused)
        synchronize(plane.device)
        result = baseline.timed_step(step, compare=True)
        resolve_s.append(result["resolve_s"])
        gather_s.append(result["gather_s"])
        for name, count in result["mismatches"].items():
            mismatches[name] = mismatches.get(name, 0) + count
        advance()
    ours = (plane.counters() - before).cpu()
    theirs = baseline.counters().cpu()
    counters_agree = bool(torch.equal(ours, theirs))
    state_agrees = baseline.state_matches()
    compared = len(steps) * plane.index_groups
    step_s = [r + g for r, g in zip(resolve_s, gather_s)]
    groups = plane.index_groups
    hisparse_resolve_group = per_layer["resolve_us_per_group"] * 1e-6
    hisparse_step = per_layer["data_plane_us_per_step"] * 1e-6
    baseline_step = statistics.median(step_s)
    baseline_resolve_group = statistics.median(resolve_s) / groups
    agreement = {
        "steps_compared": len(steps),
        "fused_steps_compared": len(steps) // 2,
        "resolutions_compared": compared,
        "mismatching_resolutions": mismatches,
        "attention_indices_agree": mismatches.get("attention", 0) == 0,
        "miss_counts_agree": mismatches.get("swap_counts", 0) == 0 and counters_agree,
        "counters_agree": counters_agree,
        "state_agrees": state_agrees,
        "all_agree": state_agrees and counters_agree and not any(mismatches.values()),
    }
    return {
        "implementation": "hisparse.baseline.resolve_residency_torch + boolean-mask compaction, "
        "host advanced indexing, copy to the device, index_copy_",
        "steps": steps,
        "step_us": baseline_step * 1e6,
        "resolve_us_per_group": baseline_resolve_group * 1e6,
        "gather_us_per_layer": statistics.median(gather_s) / plane.settings.layers * 1e6,
        "speedup_step": baseline_step / hisparse_step if hisparse_step > 0 else None,
        "speedup_resolve": baseline_resolve_group / hisparse_resolve_group if hisparse_resolve_group > 0 else None,
        "samples_step_s": step_s,
        "agreement": agreement,
    }


def _gather_sweep(plane: DataPlane, settings: Any, memcpy_gbps: float, timer: Timer, advance: Any,
                  torch: Any) -> List[Dict[str, Any]]:
    """gather_compact and a plain torch gather of m rows per request, m = fraction x k."""
    device = plane.device
    k, q, batch = plane.top_k, plane.trace.rows_per_request, plane.batch
    bs, hbs = plane.block_size, plane.hot_block_size
    i32 = dict(dtype=torch.int32, device=device)
    host = plane.host_caches[0]
    stride = plane.group_layers[0] * hbs
    hot_rows = plane.slabs[0].view(-1, plane.row_bytes)
    first_rows = torch.arange(batch, device=device) * q
    positions = plane.group_topk(plane.trace.steps - 1, 0)[first_rows].long()  # [batch, k]
    valid = positions >= 0
    safe = positions.clamp(min=0)
    host_block = plane.source_table.long().gather(1, safe // bs)
    slots = torch.where(valid, host_block * bs + safe % bs, -1)
    columns = torch.arange(k, device=device)
    hot_table = plane.hot_table.long()
    physical = hot_table.gather(1, (columns // hbs).expand(batch, k)) * hbs + columns % hbs
    points = []
    for fraction in settings.gather_fractions:
        m = max(1, min(k, int(round(fraction * k))))
        swap_host = torch.full((plane.token_rows, k), -1, **i32)
        swap_device = torch.full((plane.token_rows, k), -1, **i32)
        counts = torch.zeros(plane.token_rows, **i32)
        swap_host[first_rows, :m] = slots[:, :m].to(torch.int32)
        swap_device[first_rows, :m] = physical[:, :m].to(torch.int32)
        counts[first_rows] = m
        rows = int((slots[:, :m] >= 0).sum())
        nbytes = rows * plane.row_bytes
        inner = 1
        if device.type == "cuda":
            inner = max(1, min(20, int(_GATHER_GRAPH_BYTES // max(nbytes, 1))))

        def work() -> None:
            for _ in range(inner):
                ops.gather_compact(host, hot_rows, swap_host, swap_device, counts, hot_block_size=hbs,
                                   hot_block_stride=stride)

        hs = timer.time(work, repeats=settings.replays)["median_s"] / inner
        synchronize(device)
        used = swap_host[first_rows, :m].long()
        target = swap_device[first_rows, :m].long()
        keep = used >= 0
        where = target // hbs * stride + target % hbs
        verified = bool(torch.equal(hot_rows[where[keep]].cpu(), host[used[keep].cpu()]))

        # Plain torch: host advanced indexing, copy, index_copy_ (eager, synchronised).
        flat_used, flat_where = used[keep], where[keep]
        plain_timer = Timer(device, use_graphs=False)
        if device.type == "cuda":
            def plain() -> None:
                picked = host[flat_used.cpu()].to(device)
                hot_rows.index_copy_(0, flat_where, picked)
                torch.cuda.synchronize(device)
        else:
            def plain() -> None:
                hot_rows.index_copy_(0, flat_where, host[flat_used])
        plain_s = plain_timer.time(plain, repeats=settings.replays)["median_s"]
        points.append({
            "fraction_of_k": fraction,
            "rows_per_request": m,
            "rows": rows,
            "bytes": nbytes,
            "hisparse_us": hs * 1e6,
            "hisparse_gbps": nbytes / hs / 1e9 if hs > 0 else None,
            "ratio_to_memcpy": nbytes / hs / 1e9 / memcpy_gbps if hs > 0 else None,
            "torch_us": plain_s * 1e6,
            "torch_gbps": nbytes / plain_s / 1e9 if plain_s > 0 else None,
            "speedup_vs_torch": plain_s / hs if hs > 0 else None,
            "verified": verified,
            "launches_per_sample": inner,
        })
        advance()
    return points


def _curve_matches(curve: List[Dict[str, Any]], accounting: Dict[str, Any], settings: Any, trace: Trace,
                   index_groups: int) -> Optional[Dict[str, Any]]:
    """The curve's point at the benchmark's H against the measured counters (one index stream only)."""
    point = next((p for p in curve if p["hot_size"] == settings.hot_size), None)
    if point is None or trace.groups != 1:
        return None
    steady = accounting["steady"]
    expected_hits = point["hits"] * index_groups
    expected_misses = point["misses"] * index_groups
    return {
        "hot_size": settings.hot_size,
        "curve_hit_rate": point["hit_rate"],
        "measured_hit_rate": steady["hit_rate"],
        "matches": expected_hits == steady["hits"] and expected_misses == steady["misses"],
    }


def _summary(accounting: Dict[str, Any], per_layer: Dict[str, Any], memcpy: Dict[str, Any],
             baseline: Optional[Dict[str, Any]], settings: Any) -> Dict[str, Any]:
    steady = accounting["steady"]
    out = {
        "hit_rate": steady["hit_rate"],
        "misses_per_step": steady["misses_per_step"],
        "bytes_per_step": steady["bytes_per_step"],
        "memcpy_gbps": memcpy["gbps"],
        "resolve_us_per_group": per_layer["resolve_us_per_group"],
        "gather_us_per_layer": per_layer["gather_us_per_layer"],
        "gather_gbps": per_layer["gather_gbps"],
        "gather_ratio_to_memcpy": per_layer["gather_ratio_to_memcpy"],
        "exposed_us_per_layer_no_prefetch": per_layer["exposed_us_per_layer_no_prefetch"],
        "exposed_us_per_layer_prefetch": per_layer["exposed_us_per_layer_prefetch"],
        "exposed_us_per_layer_prefetch_fused": per_layer["exposed_us_per_layer_prefetch_fused"],
        "data_plane_us_per_step": per_layer["data_plane_us_per_step"],
    }
    if baseline is not None:
        out["baseline_step_us"] = baseline["step_us"]
        out["speedup_vs_torch"] = baseline["speedup_step"]
        out["resolve_speedup_vs_torch"] = baseline["speedup_resolve"]
        out["baseline_agrees"] = baseline["agreement"]["all_agree"]
    return out
