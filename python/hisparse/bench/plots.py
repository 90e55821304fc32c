"""PNG plots of a bench or plan result, drawn with matplotlib when it is installed.

* ``hit_rate_vs_hot_size.png``: steady-state hit rate and misses per request
  per step against the hot-buffer size (the recommended size marked);
* ``bandwidth_vs_rows.png``: gather GB/s (hisparse and plain torch) against
  rows per step, with the memcpy ceiling;
* ``layer_time_breakdown.png``: per-layer time of resolve, gather and
  exposed swap (prefetch off / on), hisparse next to the PyTorch baseline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

__all__ = ["write_plots", "MATPLOTLIB_HINT", "matplotlib_available"]

MATPLOTLIB_HINT = "plots skipped: matplotlib is not installed (pip install matplotlib, or pip install 'hisparse[plot]')"


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
        left.axvline(marked, color="gray", linestyle=":", label=("recommended" if recommended else "benchmarked") + f" H={marked}")
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
    ax.plot(rows, [p["hisparse_gbps"] for p in sweep], "o-", label="hisparse gather_compact")
    ax.plot(rows, [p["torch_gbps"] for p in sweep], "s--", label="plain torch (index, copy, index_copy_)")
    ax.axhline(results["memcpy"]["gbps"], color="gray", linestyle=":", label="contiguous memcpy")
    ax.set_xscale("log")
    ax.set_xlabel("rows per step (one layer)")
    ax.set_ylabel("GB/s of row bytes")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _breakdown(plt: Any, results: Dict[str, Any], path: Path, title: str) -> Path:
    per = results["per_layer"]
    labels = ["resolve", "gather", "exposed\nno prefetch", "exposed\nprefetch"]
    ours = [per["resolve_us_per_layer"], per["gather_us_per_layer"], per["exposed_us_per_layer_no_prefetch"],
            per["exposed_us_per_layer_prefetch"]]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    positions = list(range(len(labels)))
    width = 0.38
    ax.bar([x - width / 2 for x in positions], ours, width, label="hisparse")
    baseline = results.get("baseline")
    if baseline is not None:
        layers = results["config"]["layers"]
        groups = results["config"]["index_groups"]
        theirs = [baseline["resolve_us_per_group"] * groups / layers, baseline["gather_us_per_layer"],
                  baseline["step_us"] / layers, baseline["step_us"] / layers]
        ax.bar([x + width / 2 for x in positions], theirs, width, label="plain PyTorch")
        ax.set_yscale("log")
    if per.get("compute_us_per_layer"):
        ax.axhline(per["compute_us_per_layer"], color="gray", linestyle=":", label="stand-in attention")
    ax.set_xticks(positions)
    ax.set_xticklabels(labels)
    ax.set_ylabel("microseconds per layer per step")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
