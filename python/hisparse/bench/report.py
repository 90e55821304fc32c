"""Terminal tables and the JSON file of ``hisparse bench`` and ``hisparse plan``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

__all__ = ["format_bench", "format_plan", "write_json", "fmt_bytes", "fmt_time_us"]


def fmt_bytes(value: Optional[float]) -> str:
    if value is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} B"


def fmt_time_us(value: Optional[float]) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1e6:
        return f"{value / 1e6:.2f} s"
    if abs(value) >= 1e3:
        return f"{value / 1e3:.2f} ms"
    return f"{value:.1f} us"


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return str(value)
    return format(value, spec)


def _table(headers: Sequence[str], rows: List[Sequence[str]]) -> List[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    def join(cells: Sequence[str]) -> str:
        # The first column names the row: left-aligned; figures right-aligned.
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [join(headers), "  ".join("-" * w for w in widths)] + [join(r) for r in rows]


def _curve_rows(curve: List[Dict[str, Any]], recommended: Optional[int] = None) -> List[str]:
    rows = []
    for p in curve:
        mark = " <" if recommended is not None and p["hot_size"] == recommended else ""
        rows.append([
            f"{p['hot_size']}{mark}", _fmt(p["hit_rate"], ".4f"), _fmt(p["misses_per_request_step"], ".1f"),
            _fmt(p["misses_per_request_step_p95"], ".0f"), fmt_bytes(p["bytes_per_step_per_layer"]),
            fmt_bytes(p["hot_buffer_bytes_per_request"]),
        ])
    return _table(["H", "hit rate", "misses/req/step", "p95", "bytes/layer/step", "GPU bytes/req"], rows)


def format_bench(r: Dict[str, Any]) -> str:
    c, env, s, per = r["config"], r["environment"], r["accounting"]["steady"], r["per_layer"]
    stats = r["trace"]["stats"]
    lines = []
    device = env["gpu"] or env["backend"]
    lines.append(f"hisparse bench: preset {c['preset']} on {device} (hisparse {env['hisparse']}, torch {env['torch']})")
    lines.append(f"  {c['description']}")
    lines.append(
        f"  model: {c['layers']} layers in {c['index_groups']} index groups, {c['row_bytes']}-byte rows, "
        f"k={c['top_k']}, H={c['hot_size']}; {c['batch']} requests x {c['rows_per_request']} token rows, "
        f"context {c['context']}; {c['steps']} steps ({c['warmup_steps']} warm-up)"
    )
    meta = r["trace"]["meta"]
    sat = stats["saturation_step"]
    lines.append(
        f"  trace: {meta.get('generator', meta.get('source', 'file'))}; adjacent-step overlap "
        f"{_fmt(stats['adjacent_overlap_mean'], '.2f')}, working set {stats['working_set'][-1]:.0f} positions/request"
        f"{'' if sat is None else f', stops growing at step {sat}'}"
    )
    lines.append("")
    memcpy = r["memcpy"]
    rows = [
        ["hit rate", _fmt(s["hit_rate"], ".4f"), ""],
        ["rows moved", f"{s['misses_per_step']:.0f} / step", f"{per['rows_per_layer_step']:.0f}"],
        ["bytes moved", fmt_bytes(s["bytes_per_step"]) + " / step", fmt_bytes(per["bytes_per_layer_step"])],
        ["link ceiling (memcpy)", f"{memcpy['gbps']:.1f} GB/s",
         "ideal " + fmt_time_us(per["ideal_transfer_us_per_layer"])],
        ["resolve", "", fmt_time_us(per["resolve_us_per_group"]) + " / index group"],
        ["gather", f"{_fmt(per['gather_gbps'], '.2f')} GB/s = {_fmt(per['gather_ratio_to_memcpy'], '.2f')} x memcpy",
         fmt_time_us(per["gather_us_per_layer"])],
        ["data plane", fmt_time_us(per["data_plane_us_per_step"]) + " / step", ""],
    ]
    if c["stand_in_compute_cycles"] is not None:
        warmed = " (next layer's host pages warmed beside it)" if c.get("warm_host_pages") == "on" else ""
        rows.append(["stand-in attention" + warmed, "", fmt_time_us(per["compute_us_per_layer"])])
    rows.append(["exposed, no prefetch", "", fmt_time_us(per["exposed_us_per_layer_no_prefetch"])])
    rows.append(["exposed, prefetch", "", fmt_time_us(per["exposed_us_per_layer_prefetch"])])
    if "exposed_us_per_layer_prefetch_fused" in per:
        rows.append(["exposed, prefetch + fused leaders", "", fmt_time_us(per["exposed_us_per_layer_prefetch_fused"])])
    if "exposed_us_per_follower_prefetch" in per:
        rows.append(["  follower, prefetch", "", fmt_time_us(per["exposed_us_per_follower_prefetch"])])
        rows.append(["  follower, no prefetch", "", fmt_time_us(per["exposed_us_per_follower_no_prefetch"])])
    b = r["baseline"]
    if b is not None:
        rows.append(["plain PyTorch step", fmt_time_us(b["step_us"]) + " / step",
                     f"speedup {_fmt(b['speedup_step'], '.1f')}x (resolve {_fmt(b['speedup_resolve'], '.1f')}x)"])
        agree = r["agreement"]
        # A result without fused-step comparisons (e.g. preset_dsv32-bf16_h200.json) lacks the count.
        fused = agree.get("fused_steps_compared", 0) * c["index_groups"]
        compared = f"{agree['resolutions_compared']} resolutions" + (f" ({fused} fused)" if fused else "")
        rows.append(["PyTorch agrees", "yes" if agree["all_agree"] else "NO", f"{compared}, state, counters"])
    rows.append(["hot rows hold host rows", "yes" if r["data_check"] else "NO", ""])
    fused_check = r.get("data_check_fused")
    if fused_check is not None:
        rows.append(["  after fused steps", "yes" if fused_check["matches"] else "NO",
                     f"{fused_check['rows_loaded']} rows loaded"])
    lines += _table(["", "per step", "per layer"], rows)
    lines.append("")
    lines.append("gather bandwidth vs rows per step (one layer)")
    sweep_rows = [
        [str(p["rows"]), fmt_bytes(p["bytes"]), fmt_time_us(p["hisparse_us"]), _fmt(p["hisparse_gbps"], ".2f"),
         _fmt(p["ratio_to_memcpy"], ".2f"), _fmt(p["torch_gbps"], ".2f"), _fmt(p["speedup_vs_torch"], ".1f")]
        for p in r["gather_sweep"]
    ]
    lines += _table(["rows", "bytes", "gather", "GB/s", "x memcpy", "torch GB/s", "speedup"], sweep_rows)
    lines.append("")
    lines.append("hit rate vs hot-buffer size (H), steady state")
    lines += _curve_rows(r["hit_rate_curve"])
    check = r["curve_matches_measured"]
    if check is not None:
        matches = "yes" if check["matches"] else "NO"
        lines.append(f"  curve at H={check['hot_size']} matches the measured counters: {matches}")
    for note in r["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def format_plan(r: Dict[str, Any]) -> str:
    c, rec, host = r["config"], r["recommendation"], r["host"]
    lines = [
        f"hisparse plan: {r['trace']['meta'].get('generator', r['trace']['meta'].get('source', 'file'))} trace, "
        f"{c['batch']} requests x {c['rows_per_request']} token rows, k={c['top_k']}, context {c['context']}, "
        f"{c['steps']} steps ({c['warmup_steps']} warm-up), on {r['environment']['device']}",
        "",
        "hit rate vs hot-buffer size (H), steady state",
    ]
    lines += _curve_rows(r["hit_rate_curve"], rec["hot_size"])
    lines.append("")
    if rec["hot_size"] is None:
        lines.append(f"recommendation: none ({rec['criterion']})")
    else:
        lines.append(f"recommendation: H = {rec['hot_size']} ({rec['criterion']})")
    lines += [f"  - {reason}" for reason in rec["why"]]
    lines.append("")
    lines.append(
        f"host pool: {host['layers']} layers x {host['row_bytes']}-byte rows, block {host['block_size']}, "
        f"max model len {host['max_model_len']}"
    )
    lines.append(f"  per request : {fmt_bytes(host['bytes_per_request'])} ({host['blocks_per_request']} blocks of "
                 f"{fmt_bytes(host['page_size_bytes'])})")
    lines.append(f"  per node    : {fmt_bytes(host['bytes_per_node'])} for {host['max_requests_per_node']} requests "
                 f"(plan_host_layout: {host['layout']['host_num_blocks']} blocks, stride "
                 f"{host['layout']['host_block_stride']} B)")
    lines.append(f"  this machine: {fmt_bytes(host['available_host_memory_bytes_here'])} available, "
                 f"{'fits' if host['fits_this_machine'] else 'does NOT fit'}")
    if "residency_hint_bytes" in host:
        kept = host.get("residency_hint_kept_by_default")
        where = {True: f"kept by default on {host.get('residency_hint_device')}",
                 False: f"not kept by default on {host.get('residency_hint_device')}",
                 None: "where kept; the GPU's SM count decides the default"}[kept]
        lines.append(f"  residency hint ({where}): {fmt_bytes(host['residency_hint_bytes'])} of GPU memory "
                     f"({fmt_bytes(host['residency_hint_bytes_per_index_group'])} per index group)")
    if "budget" in host:
        budget = host["budget"]
        if "error" in budget:
            lines.append(f"  budget {fmt_bytes(budget['bytes'])}: {budget['error']}")
        else:
            lines.append(f"  budget {fmt_bytes(budget['bytes'])}: {budget['layout']['host_num_blocks']} blocks, "
                         f"room for {budget['max_requests']} requests at max model len")
    return "\n".join(lines)


def write_json(results: Dict[str, Any], path: str) -> None:
    target = Path(path)
    if target.parent and not target.parent.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "w") as handle:
        json.dump(results, handle, indent=2, default=_default)
        handle.write("\n")


def _default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "_asdict"):
        return value._asdict()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
