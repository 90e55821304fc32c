"""PNG plots of a bench or plan result, drawn with matplotlib when it is installed.

* ``hit_rate_vs_hot_size.png``: steady-state hit rate and misses per request
  per step against the hot-buffer size (the recommended size marked);
* ``bandwidth_vs_rows.png``: gather GB/s (hisparse and plain torch) against
  rows per step, with the memcpy ceiling;
* ``layer_time_breakdown.png``: per-layer time of resolve, gather and
  exposed swap (prefetch off / on / on with fused leader gathers; followers
  too when layers share an indexer), hisparse next to the PyTorch baseline.

A saved result can be drawn again without rerunning it (e.g. after a change
to this file, or from a ``hisparse plan --out`` JSON)::

    python -m hisparse.bench.plots RESULT.json DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

__all__ = ["write_plots", "MATPLOTLIB_HINT", "matplotlib_available"]

MATPLOTLIB_HINT = "needs matplotlib, which is not installed (pip install matplotlib, or pip install 'hisparse[bench]')"


def matplotlib_available() -> bool:
    import importlib.util  # noqa: PLC0415

    return importlib.util.find_spec("matplotlib") is not None


def _pyplot() -> Any:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def write_plots(results: Dict[str, Any], directory: str) -> Optional[List[str]]:
    """Write every plot the result has data for; None when matplotlib is missing."""
    if not matplotlib_available():
        return None
    plt = _pyplot()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    title = _title(results)
    if results.get("hit_rate_curve"):
        written.append(_hit_rate(plt, results, out / "hit_rate_vs_hot_size.png", title))
    if results.get("gather_sweep"):
        written.append(_bandwidth(plt, results, out / "bandwidth_vs_rows.png", title))
    if results.get("per_layer"):
        written.append(_breakdown(plt, results, out / "layer_time_breakdown.png", title))
    return [str(p) for p in written]


def _title(results: Dict[str, Any]) -> str:
    c, env = results["config"], results["environment"]
    device = env.get("gpu") or env.get("device")
    return f"{c['preset']}: k={c['top_k']}, {c['row_bytes']} B rows, batch {c['batch']} ({device})"


def _hit_rate(plt: Any, results: Dict[str, Any], path: Path, title: str) -> Path:
    curve = results["hit_rate_curve"]
    sizes = [p["hot_size"] for p in curve]
    fig, left = plt.subplots(figsize=(7, 4.2))
    left.plot(sizes, [p["hit_rate"] for p in curve], "o-", color="tab:blue", label="hit rate")
    left.set_xlabel("hot-buffer size H (rows per request)")
    left.set_ylabel("steady-state hit rate", color="tab:blue")
    left.set_ylim(0, 1.02)
    right = left.twinx()
    right.plot(sizes, [p["misses_per_request_step"] for p in curve], "s--", color="tab:red",
               label="misses / request / step")
    right.set_ylabel("misses per request per step", color="tab:red")
    target = (results.get("recommendation") or {}).get("target_misses_per_request_step")
    if target is not None:
        right.axhline(target, color="tab:red", linestyle=":", linewidth=1, label=f"target {target:g} misses")
    recommended = (results.get("recommendation") or {}).get("hot_size")
    marked = recommended if recommended is not None else results["config"].get("hot_size")
    if marked is not None:
        label = ("recommended" if recommended else "benchmarked") + f" H={marked}"
        left.axvline(marked, color="gray", linestyle=":", label=label)
    lines, labels = left.get_legend_handles_labels()
    more, more_labels = right.get_legend_handles_labels()
    left.legend(lines + more, labels + more_labels, loc="center right", fontsize=8)
    left.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _bandwidth(plt: Any, results: Dict[str, Any], path: Path, title: str) -> Path:
    sweep = results["gather_sweep"]
    rows = [p["rows"] for p in sweep]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ours = [p["hisparse_gbps"] for p in sweep]
    memcpy = results["memcpy"]["gbps"]
    ax.plot(rows, ours, "o-", label="hisparse gather_compact")
    ax.plot(rows, [p["torch_gbps"] for p in sweep], "s--", label="plain torch (index, copy, index_copy_)")
    ax.axhline(memcpy, color="gray", linestyle=":", label=f"contiguous memcpy ({memcpy:.1f} GB/s)")
    # The ratio to memcpy is the figure the sweep exists for: print it at each point.
    for x, y, point in zip(rows, ours, sweep):
        ax.annotate(f"{point['ratio_to_memcpy']:.2f}x", (x, y), textcoords="offset points", xytext=(0, -13),
                    ha="center", fontsize=7, color="tab:blue")
    ax.set_xscale("log")
    ax.set_ylim(0, memcpy * 1.15)
    ax.set_xlabel("rows per step (one layer)")
    ax.set_ylabel("GB/s of row bytes")
    # Below the axes, where it cannot cover a point or its ratio label.
    return _save_with_legend_below(plt, fig, ax, title, path, -0.14)


def _breakdown(plt: Any, results: Dict[str, Any], path: Path, title: str) -> Path:
    per = results["per_layer"]
    bars = [("resolve", per["resolve_us_per_layer"]), ("gather", per["gather_us_per_layer"]),
            ("exposed\nno prefetch", per["exposed_us_per_layer_no_prefetch"]),
            ("exposed\nprefetch", per["exposed_us_per_layer_prefetch"])]
    # A result without fused-leader figures (e.g. preset_dsv32-bf16_h200.json) lacks the key; it still draws.
    if "exposed_us_per_layer_prefetch_fused" in per:
        bars.append(("exposed\nprefetch, fused", per["exposed_us_per_layer_prefetch_fused"]))
    exposed_bars = len(bars) - 2
    # Layers sharing an indexer: the followers are where prefetch pays off, so show them apart.
    if "exposed_us_per_follower_prefetch" in per:
        bars += [("follower\nno prefetch", per["exposed_us_per_follower_no_prefetch"]),
                 ("follower\nprefetch", per["exposed_us_per_follower_prefetch"])]
    labels = [label for label, _ in bars]
    ours = [value for _, value in bars]
    fig, ax = plt.subplots(figsize=(7 if len(bars) <= 4 else 7.5 if len(bars) <= 6 else 8.5, 4.4))
    positions = list(range(len(labels)))
    baseline = results.get("baseline")
    width = 0.38 if baseline is not None else 0.6
    shift = width / 2 if baseline is not None else 0.0
    drawn = ax.bar([x - shift for x in positions], ours, width, label="hisparse")
    _label_bars(ax, drawn, ours)
    every_value = list(ours)
    if baseline is not None:
        layers = results["config"]["layers"]
        groups = results["config"]["index_groups"]
        # The baseline runs synchronously with no compute to hide behind: its whole step is exposed.
        theirs = [baseline["resolve_us_per_group"] * groups / layers, baseline["gather_us_per_layer"]]
        theirs += [baseline["step_us"] / layers] * exposed_bars
        drawn = ax.bar([x + shift for x in positions[: len(theirs)]], theirs, width,
                       label="plain PyTorch (exposed = whole step / layers)")
        _label_bars(ax, drawn, theirs)
        every_value += theirs
    # A log axis keeps microseconds and milliseconds readable side by side; an exposed time
    # measured as a difference can come out at or below zero (fully hidden), which it cannot show.
    log = min(every_value) > 0
    if log:
        ax.set_yscale("log")
    if per.get("compute_us_per_layer"):
        compute = per["compute_us_per_layer"]
        ax.axhline(compute, color="gray", linestyle=":", label=f"stand-in attention ({compute:.0f} us)")
    low, high = ax.get_ylim()
    ax.set_ylim(low, high * 2 if log else high * 1.1)  # headroom for the value labels
    ax.set_xticks(positions)
    ax.set_xticklabels(labels, fontsize=8 if len(bars) > 4 else 10)
    ax.set_ylabel("microseconds per layer per step")
    # Below the axes: the tall baseline bars leave no free corner inside them.
    return _save_with_legend_below(plt, fig, ax, title, path, -0.16)


def _save_with_legend_below(plt: Any, fig: Any, ax: Any, title: str, path: Path, offset: float) -> Path:
    """Legend in three columns `offset` (axes fraction) below the axes, the
    title, then the PNG written with the legend included in its bounds."""
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, offset), ncol=3, frameon=False)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def _label_bars(ax: Any, bars: Any, values: Sequence[float]) -> None:
    for bar, value in zip(bars, values):
        text = f"{value:.0f}" if value >= 100 else f"{value:.1f}"
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), textcoords="offset points",
                    xytext=(0, 2), ha="center", va="bottom", fontsize=7)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m hisparse.bench.plots RESULT.json DIR``: draw a saved result again."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m hisparse.bench.plots RESULT.json DIR", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as handle:
        results = json.load(handle)
    written = write_plots(results, args[1])
    if written is None:
        print(MATPLOTLIB_HINT, file=sys.stderr)
        return 1
    print(f"wrote {', '.join(written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
