"""Benchmark presets and the settings a run is made of.

A preset fixes a model geometry (row size, top-k, layers, index-group size)
and a workload that fits one machine; every field can be overridden from the
command line. ``small`` is what ``hisparse bench`` runs without flags: the
DeepSeek-V3.2 FP8 row geometry at a size that a laptop CPU finishes in
seconds. ``tiny`` is for tests and CI.

The three model presets share one workload (32 requests of 16K tokens, 36
steps of which the first 12 warm the buffers up: the generated traces'
working sets stop growing after about a dozen steps): its host pool (21 GiB for 656-byte rows, 37 GiB for 1152-byte rows
over 61 layers) fits a single-GPU node with room to spare. Scale it with
``--batch`` and ``--context``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

__all__ = ["PRESETS", "DEFAULT_PRESET", "Settings", "make_settings", "default_hot_sizes", "OVERRIDABLE"]

DEFAULT_PRESET = "small"


@dataclass
class Settings:
    """Everything a bench or plan run is configured by (echoed into the JSON)."""

    preset: str
    description: str
    row_bytes: int
    top_k: int
    layers: int
    group_size: int
    batch: int
    context: int
    hot_size: int
    spec_tokens: int
    steps: int
    warmup_steps: int
    block_size: int = 64
    hot_block_size: int = 64
    # Trace generation (ignored when a trace file is replayed).
    trace_mode: str = "locality"
    trace_groups: int = 1
    reuse: float = 0.85
    window: int = 4
    region: float = 2.25
    clusters: int = 8
    drift: float = 2.0
    query_drift: float = 0.1
    query_spread: float = 0.3
    seed: int = 0
    # Measurement.
    compute_us: float = 150.0
    replays: int = 5
    baseline_steps: int = 4
    hot_sizes: List[int] = field(default_factory=list)
    gather_fractions: List[float] = field(default_factory=lambda: [0.01, 0.05, 0.1, 0.25, 0.5, 1.0])
    # Whether the runtimes keep a residency hint: "auto" (the library's choice,
    # hisparse.Runtime(residency_hint=None)), "on" or "off".
    residency_hint: str = "auto"
    # Whether a decode step reads ahead one word of every 64 KiB page of the
    # next layer's host blocks while a layer computes (ops.warm_host_pages on
    # a second stream): "on" or "off".
    warm_host_pages: str = "on"

    @property
    def rows_per_request(self) -> int:
        return 1 + self.spec_tokens

    @property
    def token_rows(self) -> int:
        return self.batch * self.rows_per_request

    @property
    def index_groups(self) -> int:
        return -(-self.layers // self.group_size)

    def group_layers(self) -> List[int]:
        """Layers in each index group (the last one may be smaller)."""
        return [min(self.group_size, self.layers - first) for first in range(0, self.layers, self.group_size)]

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


_MODEL_WORKLOAD = dict(
    top_k=2048, layers=61, batch=32, context=16384, hot_size=4096, spec_tokens=0, steps=36, warmup_steps=12,
    replays=5, baseline_steps=4,
)

PRESETS: Dict[str, Dict[str, Any]] = {
    "tiny": dict(
        description="tiny geometry for tests and CI (64-byte rows, k=64, 4 layers in index groups of 2)",
        row_bytes=64, top_k=64, layers=4, group_size=2, batch=2, context=1024, hot_size=128, spec_tokens=0,
        steps=10, warmup_steps=3, block_size=16, hot_block_size=16, replays=2, baseline_steps=3,
        clusters=2, drift=0.5, compute_us=20.0, gather_fractions=[0.1, 0.5, 1.0],
    ),
    "small": dict(
        description="DeepSeek-V3.2 FP8 rows (656 B, k=2048) at laptop scale: 8 layers, 4 requests of 16K tokens",
        row_bytes=656, top_k=2048, layers=8, group_size=1, batch=4, context=16384, hot_size=4096, spec_tokens=0,
        steps=24, warmup_steps=12, replays=3, baseline_steps=3,
    ),
    "dsv32-fp8": dict(
        description="DeepSeek-V3.2, FP8 MLA rows (656 B), k=2048, 61 layers, each layer its own indexer",
        row_bytes=656, group_size=1, **_MODEL_WORKLOAD,
    ),
    "dsv32-bf16": dict(
        description="DeepSeek-V3.2, bf16 MLA rows (1152 B), k=2048, 61 layers, each layer its own indexer",
        row_bytes=1152, group_size=1, **_MODEL_WORKLOAD,
    ),
    "glm5-shared-index": dict(
        description="shared index: index groups of 4 layers read one indexer's top-k "
        "(656-byte rows, k=2048, 61 layers: 15 groups of 4 and one of 1)",
        row_bytes=656, group_size=4, **_MODEL_WORKLOAD,
    ),
}

#: --residency-hint's values, as hisparse.Runtime's residency_hint.
RESIDENCY_HINT_CHOICES = {"auto": None, "on": True, "off": False}

#: Settings fields the command line may override (flag name = field name with dashes).
OVERRIDABLE = (
    "batch", "context", "hot_size", "layers", "group_size", "spec_tokens", "steps", "warmup_steps", "top_k",
    "row_bytes", "block_size", "hot_block_size", "trace_mode", "trace_groups", "reuse", "window", "region",
    "clusters", "drift", "query_drift", "query_spread", "seed", "compute_us", "replays", "baseline_steps",
    "hot_sizes", "gather_fractions", "residency_hint", "warm_host_pages",
)


def default_hot_sizes(top_k: int, hot_size: int, hot_block_size: int) -> List[int]:
    """The hot-buffer sweep: 1x to 4x top-k in steps, plus the configured size."""
    sizes = set()
    for factor in (1.0, 1.25, 1.5, 2.0, 3.0, 4.0):
        size = int(round(top_k * factor / hot_block_size)) * hot_block_size
        sizes.add(max(size, hot_block_size))
    sizes.add(hot_size)
    return sorted(s for s in sizes if s <= 32767)


def make_settings(preset: Optional[str], overrides: Dict[str, Any]) -> Settings:
    """The preset's values with every non-None override applied, validated."""
    name = preset or DEFAULT_PRESET
    if name not in PRESETS:
        raise ValueError(f"--preset: unknown preset {name!r}; choose from {', '.join(sorted(PRESETS))}")
    values = dict(PRESETS[name])
    for key, value in overrides.items():
        if key not in OVERRIDABLE:
            raise ValueError(f"{key}: not a setting that can be overridden")
        if value is not None:
            values[key] = value
    settings = Settings(preset=name, **values)
    if not settings.hot_sizes and settings.hot_block_size >= 1:  # validate names a bad block size
        settings.hot_sizes = default_hot_sizes(settings.top_k, settings.hot_size, settings.hot_block_size)
    validate(settings)
    return settings


def validate(s: Settings, *, trace_replay: bool = False) -> None:
    """Refuse settings that cannot describe a run, naming the flag."""
    positive = ("row_bytes", "top_k", "layers", "group_size", "batch", "context", "hot_size", "steps",
                "block_size", "hot_block_size", "window", "clusters", "trace_groups", "replays")
    for name in positive:
        if getattr(s, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: expected a positive value, got {getattr(s, name)}")
    for name in ("reuse", "region", "compute_us", "drift", "query_drift", "query_spread"):
        if not math.isfinite(getattr(s, name)):
            raise ValueError(f"--{name.replace('_', '-')}: expected a finite number, got {getattr(s, name)}")
    for name in ("spec_tokens", "warmup_steps", "baseline_steps", "compute_us", "drift", "query_drift",
                 "query_spread"):
        if getattr(s, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')}: expected a value >= 0, got {getattr(s, name)}")
    if not 0 <= s.seed < 2**63:
        raise ValueError(f"--seed: expected 0 <= seed < 2**63, got {s.seed}")
    if s.context > 2**31 - 1:
        raise ValueError(f"--context: expected at most 2**31 - 1 positions (int32 positions), got {s.context}")
    if s.row_bytes % 16:
        raise ValueError(f"--row-bytes: expected a multiple of 16 (rows are 16-byte aligned), got {s.row_bytes}")
    if s.warmup_steps >= s.steps:
        raise ValueError(f"--warmup-steps: expected fewer than --steps ({s.steps}), got {s.warmup_steps}")
    if not 0.0 <= s.reuse <= 1.0:
        raise ValueError(f"--reuse: expected a fraction in [0, 1], got {s.reuse}")
    if s.region < 1.0:
        raise ValueError(f"--region: expected a working-set size of at least 1 x top-k, got {s.region}")
    if s.top_k > s.context:
        raise ValueError(f"--top-k: expected at most --context ({s.context}) positions, got {s.top_k}")
    if s.residency_hint not in RESIDENCY_HINT_CHOICES:
        raise ValueError(f"--residency-hint: expected 'auto', 'on' or 'off', got {s.residency_hint!r}")
    if s.warm_host_pages not in ("on", "off"):
        raise ValueError(f"--warm-host-pages: expected 'on' or 'off', got {s.warm_host_pages!r}")
    if not trace_replay and s.trace_mode not in ("locality", "scores"):
        raise ValueError(f"--trace-mode: expected 'locality' or 'scores', got {s.trace_mode!r}")
    if s.hot_size < s.top_k:
        raise ValueError(f"--hot-size: a hot buffer must hold one step's top-k ({s.top_k} rows), got {s.hot_size}")
    if s.hot_size > 32767:
        raise ValueError(f"--hot-size: expected at most 32767 slots (int16 LRU), got {s.hot_size}")
    for size in s.hot_sizes:
        if not 1 <= size <= 32767:
            raise ValueError(f"--hot-sizes: expected sizes in [1, 32767], got {size}")
    for fraction in s.gather_fractions:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"--gather-fractions: expected fractions in (0, 1], got {fraction}")
