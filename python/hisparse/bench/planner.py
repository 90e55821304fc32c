"""Capacity planning: hit rate against hot-buffer size, and host memory.

The hit-rate curve runs the real residency resolver (an
:class:`hisparse.IndexGroup`, CPU reference or CUDA kernel) over a trace once
per hot-buffer size ``H``. Resolution is exact and deterministic, so the
curve at the benchmark's own ``H`` is the hit rate the benchmark measures,
bit for bit. Only steady-state steps (after the warm-up steps that fill the
cold buffers) count.

The recommendation is the smallest swept ``H`` whose steady-state mean
misses per request per step stay within ``target_misses`` (or whose hit rate
reaches ``target_hit_rate``). Host memory per request and per node comes from
:func:`hisparse.plan_host_layout` (a host block holds ``block_size`` tokens of
every layer; block 0 is the null block; each request gets a copy-on-write
tail block).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

import hisparse
from hisparse.layout import available_host_memory

from .plane import runtime_config

__all__ = ["hit_rate_curve", "recommend", "host_plan", "STEADY_NOTE"]

STEADY_NOTE = "steady state: the steps after the warm-up steps"


def _percentile(values: List[float], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    index = min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))
    return float(ordered[index])


def hit_rate_curve(
    trace: Any, hot_sizes: List[int], *, hot_block_size: int, warmup_steps: int, row_bytes: int, layers: int,
    device: Any, memcpy_gbps: Optional[float] = None, progress: Any = None,
) -> List[Dict[str, Any]]:
    """One point per hot-buffer size: hit rate, misses and bytes per step."""
    import torch  # noqa: PLC0415

    k, q, batch, groups = trace.top_k, trace.rows_per_request, trace.batch, trace.groups
    requests, rows = groups * batch, groups * trace.token_rows
    if not 0 <= warmup_steps < trace.steps:
        raise ValueError(f"--warmup-steps: expected fewer than the trace's {trace.steps} steps, got {warmup_steps}")
    topk = trace.topk.to(device).reshape(trace.steps, rows, k)
    i32 = dict(dtype=torch.int32, device=device)
    req_id = torch.arange(requests, **i32).repeat_interleave(q).contiguous()
    state_rows = torch.arange(requests, **i32)
    points = []
    for size in sorted(set(hot_sizes)):
        if size < k:
            raise ValueError(f"--hot-sizes: a hot buffer must hold one step's top-k ({k} rows), got {size}")
        union = min(k * q, size)
        if torch.device(device).type == "cuda":
            # The CUDA resolver's shared-memory tables grow with H: refuse a size the device cannot take.
            hisparse.Config(top_k=k, device_buffer_size=size, max_union_rows=union, row_bytes=row_bytes,
                            hot_block_size=hot_block_size).check_device(torch.device(device))
        group = hisparse.IndexGroup(top_k=k, device_buffer_size=size, max_union_rows=union, max_num_reqs=requests,
                                    max_swap_rows=rows, device=device)
        hot_blocks = -(-size // hot_block_size)
        hot_table = torch.arange(requests * hot_blocks, **i32).view(requests, hot_blocks).contiguous()
        counters = torch.zeros((trace.steps + 1, 5), dtype=torch.int64, device=device)
        per_request = torch.zeros((trace.steps, requests), **i32)
        counters[0].copy_(group.counters)
        for step in range(trace.steps):
            result = group.resolve(topk[step], req_id, state_rows, hot_table, host_rows=trace.context,
                                   hot_block_size=hot_block_size)
            counters[step + 1].copy_(group.counters)
            per_request[step].copy_(result.swap_counts.view(requests, q).sum(1))
            if progress is not None:
                progress.advance()
        deltas = (counters[1:] - counters[:-1]).cpu()
        steady = deltas[warmup_steps:]
        steady_requests = per_request[warmup_steps:].cpu().flatten().tolist()
        steady_steps = trace.steps - warmup_steps
        hits, misses = int(steady[:, 1].sum()), int(steady[:, 2].sum())
        misses_per_step = misses / steady_steps / groups
        point = {
            "hot_size": size,
            "max_union_rows": union,
            "hit_rate": hits / (hits + misses) if hits + misses else 0.0,
            "hits": hits,
            "misses": misses,
            "invalid": int(steady[:, 4].sum()),
            "misses_per_step": misses_per_step,
            "misses_per_request_step": misses / (steady_steps * requests),
            "misses_per_request_step_p95": _percentile(steady_requests, 0.95),
            "misses_per_request_step_max": max(steady_requests) if steady_requests else 0,
            "bytes_per_step_per_layer": misses_per_step * row_bytes,
            "bytes_per_step_all_layers": misses_per_step * row_bytes * layers,
            "hot_buffer_bytes_per_request": size * row_bytes * layers,
            "hit_rate_per_step": [
                float(d[1]) / float(d[1] + d[2]) if int(d[1] + d[2]) else 0.0 for d in deltas
            ],
            "misses_per_step_series": [int(d[2]) / groups for d in deltas],
        }
        if memcpy_gbps:
            point["transfer_us_per_layer_at_memcpy"] = point["bytes_per_step_per_layer"] / (memcpy_gbps * 1e3)
        points.append(point)
        del group
    return points


def recommend(
    curve: List[Dict[str, Any]], *, top_k: int, target_misses: Optional[float] = None,
    target_hit_rate: Optional[float] = None,
) -> Dict[str, Any]:
    """The smallest hot-buffer size that meets the target, and why."""
    if target_misses is None and target_hit_rate is None:
        target_misses = round(0.05 * top_k, 1)
    if target_hit_rate is not None:
        if not 0.0 <= target_hit_rate <= 1.0:
            raise ValueError(f"--target-hit-rate: expected a fraction in [0, 1], got {target_hit_rate}")
        criterion = f"steady-state hit rate >= {target_hit_rate:.4f}"

        def meets(p: Dict[str, Any]) -> bool:
            return p["hit_rate"] >= target_hit_rate

        def figure(p: Dict[str, Any]) -> str:
            return f"hit rate {p['hit_rate']:.4f}"
    else:
        if target_misses < 0:
            raise ValueError(f"--target-misses-per-step: expected a count >= 0, got {target_misses}")
        criterion = f"steady-state mean misses per request per step <= {target_misses:g}"

        def meets(p: Dict[str, Any]) -> bool:
            return p["misses_per_request_step"] <= target_misses

        def figure(p: Dict[str, Any]) -> str:
            return f"{p['misses_per_request_step']:.1f} misses/request/step (hit rate {p['hit_rate']:.4f})"

    ordered = sorted(curve, key=lambda p: p["hot_size"])
    chosen = next((p for p in ordered if meets(p)), None)
    reasons = []
    if chosen is None:
        largest = ordered[-1]
        reasons.append(
            f"no swept size meets {criterion}; the largest, H={largest['hot_size']}, gives {figure(largest)}")
        reasons.append("sweep larger sizes (--hot-sizes) or relax the target")
    else:
        reasons.append(f"H={chosen['hot_size']} is the smallest swept size with {figure(chosen)}, meeting {criterion}")
        smaller = [p for p in ordered if p["hot_size"] < chosen["hot_size"]]
        if smaller:
            reasons.append(f"the next smaller, H={smaller[-1]['hot_size']}, gives {figure(smaller[-1])}")
        else:
            reasons.append("it is the smallest size swept; a smaller buffer might meet the target too")
        reasons.append(
            f"it costs {chosen['hot_buffer_bytes_per_request'] / 2**20:.1f} MiB of GPU memory per request over all "
            f"layers and moves {chosen['bytes_per_step_per_layer'] / 2**20:.2f} MiB per layer per step"
        )
    return {
        "criterion": criterion,
        "target_misses_per_request_step": target_misses if target_hit_rate is None else None,
        "target_hit_rate": target_hit_rate,
        "hot_size": None if chosen is None else chosen["hot_size"],
        "point": chosen,
        "why": reasons,
    }


def host_plan(
    *, max_model_len: int, max_requests: int, layers: int, row_bytes: int, block_size: int,
    host_budget_bytes: Optional[int] = None, index_groups: Optional[int] = None,
) -> Dict[str, Any]:
    """Host pool size per request and per node, checked by plan_host_layout, and
    the GPU memory of the residency hint where a runtime keeps one (a bit per
    host row of a layer, one hint per index group; ``index_groups`` defaults
    to ``layers``; whether the default keeps one is
    :func:`residency_hint_kept_by_default`'s question)."""
    for name, value in (("max_model_len", max_model_len), ("max_requests", max_requests)):
        if value < 1:
            raise ValueError(f"--{name.replace('_', '-')}: expected a positive value, got {value}")
    page = block_size * row_bytes * layers
    blocks_per_request = -(-max_model_len // block_size) + 1  # + its copy-on-write tail
    node_blocks = 1 + max_requests * blocks_per_request  # + the null block
    node_bytes = node_blocks * page
    layout = hisparse.plan_host_layout(page, block_size, max_model_len, node_bytes)
    available = available_host_memory()
    hint_bytes = -(-layout.host_num_blocks * block_size // 32) * 4
    groups = layers if index_groups is None else index_groups
    plan: Dict[str, Any] = {
        "max_model_len": max_model_len,
        "max_requests_per_node": max_requests,
        "layers": layers,
        "row_bytes": row_bytes,
        "block_size": block_size,
        "page_size_bytes": page,
        "blocks_per_request": blocks_per_request,
        "bytes_per_request": blocks_per_request * page,
        "bytes_per_node": node_bytes,
        "layout": layout._asdict(),
        "available_host_memory_bytes_here": available,
        "fits_this_machine": node_bytes <= available,
        "index_groups": groups,
        "residency_hint_bytes_per_index_group": hint_bytes,
        "residency_hint_bytes": hint_bytes * groups,
    }
    if host_budget_bytes is not None:
        try:
            budget = hisparse.plan_host_layout(page, block_size, max_model_len, host_budget_bytes)
        except ValueError as error:
            plan["budget"] = {"bytes": host_budget_bytes, "error": str(error)}
        else:
            plan["budget"] = {
                "bytes": host_budget_bytes,
                "layout": budget._asdict(),
                "max_requests": (budget.host_num_blocks - 1) // blocks_per_request,
            }
    return plan


def residency_hint_kept_by_default(settings: Any, hot_size: int, max_requests: int, device: Any) -> Optional[bool]:
    """Whether the runtimes of this plan (``hot_size`` slots, ``max_requests``
    requests) keep a residency hint by default on ``device``: the library's own
    answer (:meth:`hisparse.Runtime.default_residency_hint`) on a CUDA device,
    None elsewhere (the choice depends on the GPU's SM count, which a CPU run
    cannot know)."""
    if device.type != "cuda":
        return None
    config = runtime_config(settings, settings.top_k, settings.rows_per_request, hot_size)
    return hisparse.Runtime.default_residency_hint(config, max_num_reqs=max_requests, device=device)
