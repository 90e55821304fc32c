"""Decode traces: the top-k positions each request's indexer selects, step by step.

A :class:`Trace` holds ``topk``, int32 ``[steps, groups, rows, k]``:
request-relative token positions (``-1`` = no entry) selected at each decode
step by each index group's indexer for each token row. Token rows are
grouped by request, ``rows_per_request`` consecutive rows each (1 + the
speculative tokens); ``groups`` independent indexer streams are used by the
model's index groups in turn (group ``i`` reads stream ``i % groups``).
Positions lie in ``[0, context)``.

Two generators, both seeded and run on the trace's device step by step with
no host synchronisation (``torch.topk`` over per-position scores):

``locality``
    Per request, each step's top-k takes ``reuse x k`` positions from those
    the request selected in the last ``window`` steps and the rest from
    positions it did not select recently, preferring an "important region"
    of ``region x k`` positions made of ``clusters`` windows whose centres
    drift by ``drift`` positions per step. Facts it relies on: DeepSeek-V3.2's
    sparse attention (DSA) has a lightning indexer pick k = 2048 key
    positions per query token (the default k of the model presets); and the
    behaviour reported for such top-k selections in published measurements,
    as summarised in issue 5 of this project:
    consecutive decode steps share most of their selection (adjacent-step
    overlap of roughly 60-95%), and the set of positions a request has ever
    selected stops growing after about a dozen steps. The defaults (reuse
    0.85, window 4, region 2.25 k, 8 clusters, drift 2) land in that range;
    :func:`trace_stats` measures both on every trace so the claim is checked
    rather than assumed (at k=2048 over 16K positions: overlap 0.73, no
    more growth after step 13).

``scores``
    Top-k of real dot products: fixed random keys per request (``[context,
    32]``) against a query that drifts slowly around a fixed anchor (an
    Ornstein-Uhlenbeck walk: ``query_drift`` is the per-step mean reversion,
    ``query_spread`` the stationary spread). No reuse knob: locality follows
    from the scores.

Trace files (``--trace FILE`` replays one, ``--save-trace FILE`` writes one):

* ``.npz`` (NumPy): array ``topk`` (integer, ``[steps, rows, k]`` or
  ``[steps, groups, rows, k]``) and optionally ``meta``, a 0-d string array
  holding a JSON object;
* ``.pt`` / ``.pth`` (torch): a dict ``{"topk": tensor, "meta": dict}``.

``meta`` keys that are read: ``batch`` (requests; default: rows /
rows_per_request), ``rows_per_request`` (default 1), ``context`` (positions
per request; default: largest position + 1). Anything else is kept and
echoed into the results. To benchmark indices captured from your own model,
save each decode step's ``topk_indices`` (request-relative positions, the
rows of one step stacked in batch order) into such a file.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

__all__ = ["Trace", "generate_trace", "trace_stats", "load_trace", "save_trace", "SATURATION_GROWTH"]

#: A working set has stopped growing once every later step adds fewer new
#: positions per request than this fraction of top-k.
SATURATION_GROWTH = 0.02

_KEY_DIM = 32


@dataclass
class Trace:
    """Top-k positions of a decode run (see the module docstring)."""

    topk: Any
    batch: int
    rows_per_request: int
    context: int
    meta: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        import torch  # noqa: PLC0415

        if not isinstance(self.topk, torch.Tensor):
            raise TypeError(f"topk: expected a torch.Tensor, got {type(self.topk).__name__}")
        if self.topk.dim() != 4:
            raise ValueError(f"topk: expected [steps, groups, rows, k], got shape {tuple(self.topk.shape)}")
        if self.topk.dtype != torch.int32:
            raise TypeError(f"topk: expected int32 positions, got {self.topk.dtype}")
        steps, groups, rows, k = self.topk.shape
        if min(steps, groups, rows, k) < 1:
            raise ValueError(f"topk: expected a non-empty trace, got shape {tuple(self.topk.shape)}")
        if self.batch < 1 or self.rows_per_request < 1 or self.batch * self.rows_per_request != rows:
            raise ValueError(
                f"topk: {rows} token rows per step do not make batch={self.batch} requests of "
                f"rows_per_request={self.rows_per_request}"
            )
        if self.context < 1:
            raise ValueError(f"context: expected a positive number of positions, got {self.context}")

    @property
    def steps(self) -> int:
        return int(self.topk.shape[0])

    @property
    def groups(self) -> int:
        return int(self.topk.shape[1])

    @property
    def token_rows(self) -> int:
        return int(self.topk.shape[2])

    @property
    def top_k(self) -> int:
        return int(self.topk.shape[3])

    @property
    def spec_tokens(self) -> int:
        return self.rows_per_request - 1

    def to(self, device: Any) -> "Trace":
        topk = self.topk.to(device).contiguous()
        return Trace(topk, self.batch, self.rows_per_request, self.context, dict(self.meta))

    def truncated(self, steps: int) -> "Trace":
        if not 1 <= steps <= self.steps:
            raise ValueError(f"--steps: the trace has {self.steps} steps, got {steps}")
        return Trace(self.topk[:steps].contiguous(), self.batch, self.rows_per_request, self.context, dict(self.meta))

    def req_id_per_token(self, device: Any) -> Any:
        import torch  # noqa: PLC0415

        ids = torch.arange(self.batch, dtype=torch.int32, device=device)
        return ids.repeat_interleave(self.rows_per_request).contiguous()

    def describe(self) -> Dict[str, Any]:
        return {
            "steps": self.steps,
            "groups": self.groups,
            "batch": self.batch,
            "rows_per_request": self.rows_per_request,
            "top_k": self.top_k,
            "context": self.context,
            "meta": self.meta,
        }


# ---------------------------------------------------------------------------- generators


def generate_trace(settings: Any, device: Any) -> Trace:
    """The trace ``settings`` (a :class:`hisparse.bench.presets.Settings`) asks for."""
    common = dict(
        batch=settings.batch, rows_per_request=settings.rows_per_request, context=settings.context,
        top_k=settings.top_k, steps=settings.steps, groups=settings.trace_groups, seed=settings.seed, device=device,
    )
    if settings.trace_mode == "locality":
        return generate_locality(reuse=settings.reuse, window=settings.window, region=settings.region,
                                 clusters=settings.clusters, drift=settings.drift, **common)
    if settings.trace_mode == "scores":
        return generate_scores(query_drift=settings.query_drift, query_spread=settings.query_spread, **common)
    raise ValueError(f"--trace-mode: expected 'locality' or 'scores', got {settings.trace_mode!r}")


def _generator(torch: Any, device: Any, seed: int) -> Any:
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def generate_locality(
    *, batch: int, rows_per_request: int, context: int, top_k: int, steps: int, groups: int = 1,
    reuse: float = 0.85, window: int = 4, region: float = 2.25, clusters: int = 8, drift: float = 2.0,
    seed: int = 0, device: Any = "cpu",
) -> Trace:
    """Reuse-from-recent-steps plus fresh picks from a drifting important region."""
    import torch  # noqa: PLC0415

    device = torch.device(device)
    gen = _generator(torch, device, seed)
    n, q, k, c = groups * batch, rows_per_request, top_k, context
    reused = int(round(reuse * k))
    width = max(1, min(c, int(round(region * k))) // clusters)
    low, high = width / 2.0, c - width / 2.0
    centres = low + torch.rand((n, clusters), generator=gen, device=device) * max(high - low, 0.0)
    velocity = torch.where(torch.rand((n, clusters), generator=gen, device=device) < 0.5, -drift, drift)
    never = -(2**30)
    last = torch.full((n, c), never, dtype=torch.int32, device=device)
    ones = torch.ones((n, clusters), dtype=torch.int32, device=device)
    out = torch.empty((steps, n, q, k), dtype=torch.int32, device=device)
    for step in range(steps):
        starts = (centres - width / 2.0).round().long().clamp(0, c - width)
        marks = torch.zeros((n, c + 1), dtype=torch.int32, device=device)
        marks.scatter_add_(1, starts, ones)
        marks.scatter_add_(1, starts + width, -ones)
        in_region = marks.cumsum(1)[:, :c] > 0
        recent = last >= step - window
        # Tiers keep the two picks apart: recent positions score in [2, 3),
        # the rest of the region in [1, 2), everything else in [0, 1). A
        # recent position's random part halves with every step of age, so
        # the reused picks favour the latest step without excluding older ones.
        age = (step - 1 - last).clamp(0, window).float()
        tier = torch.where(recent, 2.0, in_region.float())
        noise = torch.rand((n, q, c), generator=gen, device=device)
        score = tier[:, None, :] + noise * torch.where(recent, 0.5**age, 1.0)[:, None, :]
        first = torch.topk(score, reused, dim=2, sorted=False).indices
        score = score.masked_fill(recent[:, None, :], -1.0).scatter_(2, first, -1.0)
        second = torch.topk(score, k - reused, dim=2, sorted=False).indices
        chosen = torch.cat((first, second), dim=2)
        out[step] = chosen.to(torch.int32)
        last.scatter_(1, chosen.reshape(n, q * k), step)
        centres += velocity
        bounce = (centres < low) | (centres > high)
        velocity = torch.where(bounce, -velocity, velocity)
        centres.clamp_(low, max(high, low))
    topk = out.view(steps, groups, batch * q, k).contiguous()
    meta = {"generator": "locality", "seed": seed, "reuse": reuse, "window": window, "region": region,
            "clusters": clusters, "drift": drift}
    return Trace(topk, batch, q, c, meta)


def generate_scores(
    *, batch: int, rows_per_request: int, context: int, top_k: int, steps: int, groups: int = 1,
    query_drift: float = 0.1, query_spread: float = 0.3, seed: int = 0, device: Any = "cpu",
) -> Trace:
    """Top-k of dot products: fixed random keys, a query drifting around an anchor."""
    import torch  # noqa: PLC0415

    device = torch.device(device)
    gen = _generator(torch, device, seed)
    n, q, k, c, d = groups * batch, rows_per_request, top_k, context, _KEY_DIM
    keys = torch.randn((n, c, d), generator=gen, device=device)
    anchor = torch.nn.functional.normalize(torch.randn((n, d), generator=gen, device=device), dim=1)
    walk = torch.randn((n, d), generator=gen, device=device) / math.sqrt(d)
    keep = 1.0 - min(max(query_drift, 0.0), 1.0)
    innovation = math.sqrt(max(1.0 - keep * keep, 0.0))
    out = torch.empty((steps, n, q, k), dtype=torch.int32, device=device)
    for step in range(steps):
        walk = keep * walk + innovation * torch.randn((n, d), generator=gen, device=device) / math.sqrt(d)
        query = (anchor + query_spread * walk)[:, None, :].expand(n, q, d)
        if q > 1:
            # Speculative rows query the next positions: the same direction, slightly perturbed.
            jitter = torch.randn((n, q, d), generator=gen, device=device) * (0.1 * query_spread / math.sqrt(d))
            jitter[:, 0] = 0.0
            query = query + jitter
        scores = torch.bmm(query, keys.transpose(1, 2))  # [n, q, c]
        out[step] = torch.topk(scores, k, dim=2, sorted=False).indices.to(torch.int32)
    topk = out.view(steps, groups, batch * q, k).contiguous()
    meta = {"generator": "scores", "seed": seed, "query_drift": query_drift, "query_spread": query_spread,
            "key_dim": d}
    return Trace(topk, batch, q, c, meta)


# ---------------------------------------------------------------------------- statistics


def trace_stats(trace: Trace) -> Dict[str, Any]:
    """Locality of a trace, per step, averaged over requests and index streams.

    ``adjacent_overlap[t]``: fraction of step t's valid entries that the same
    request also selected at step t-1 (step 0: 0). ``distinct_per_step[t]``:
    distinct positions a request selects at step t (over its token rows).
    ``working_set[t]``: distinct positions selected at steps 0..t.
    ``saturation_step``: the first step after which every step adds fewer
    than SATURATION_GROWTH x k new positions (None if it never does).
    """
    import torch  # noqa: PLC0415

    topk = trace.topk
    device = topk.device
    steps, groups, rows, k = topk.shape
    n = groups * trace.batch
    per_request = trace.rows_per_request * k
    last = torch.full((n, trace.context + 1), -2, dtype=torch.int32, device=device)
    overlap = torch.zeros(steps, dtype=torch.float64, device=device)
    distinct = torch.zeros(steps, dtype=torch.float64, device=device)
    working = torch.zeros(steps, dtype=torch.float64, device=device)
    for step in range(steps):
        chosen = topk[step].reshape(n, per_request).long()
        valid = (chosen >= 0) & (chosen < trace.context)
        # Invalid entries land in the spare column `context`, never counted.
        safe = torch.where(valid, chosen, trace.context)
        seen_before = (last.gather(1, safe) == step - 1) & valid
        overlap[step] = (seen_before.sum(1).double() / valid.sum(1).clamp(min=1).double()).mean()
        last.scatter_(1, safe, step)
        body = last[:, : trace.context]
        distinct[step] = (body == step).sum(1).double().mean()
        working[step] = (body >= 0).sum(1).double().mean()
    overlap, distinct, working = overlap.tolist(), distinct.tolist(), working.tolist()
    growth = [working[0]] + [working[i] - working[i - 1] for i in range(1, steps)]
    saturation = None
    for step in range(1, steps):
        if all(g < SATURATION_GROWTH * k for g in growth[step:]):
            saturation = step
            break
    later = overlap[1:]
    return {
        "adjacent_overlap": overlap,
        "adjacent_overlap_mean": sum(later) / len(later) if later else None,
        "distinct_per_step": distinct,
        "working_set": working,
        "working_set_growth": growth,
        "saturation_step": saturation,
        "saturation_growth_threshold": SATURATION_GROWTH * k,
    }


# ---------------------------------------------------------------------------- files


def save_trace(trace: Trace, path: str) -> None:
    """Write ``trace`` as .npz (NumPy) or .pt/.pth (torch), by suffix."""
    import torch  # noqa: PLC0415

    target = Path(path)
    meta = dict(trace.meta)
    meta.update(batch=trace.batch, rows_per_request=trace.rows_per_request, context=trace.context)
    topk = trace.topk.detach().cpu()
    if target.suffix in (".pt", ".pth"):
        torch.save({"topk": topk, "meta": meta}, target)
        return
    if target.suffix != ".npz":
        raise ValueError(f"--save-trace: expected a .npz, .pt or .pth file name, got {path!r}")
    import numpy as np  # noqa: PLC0415

    with open(target, "wb") as handle:
        np.savez_compressed(handle, topk=topk.numpy(), meta=np.array(json.dumps(meta)))


def _trace_file_contents(source: Path) -> Dict[str, Any]:
    """Every entry of a .pt/.pth (a dict) or .npz trace file, read whole; any reader's failure is the
    file's fault and named as such."""
    import torch  # noqa: PLC0415

    try:
        if source.suffix in (".pt", ".pth"):
            data = torch.load(source, map_location="cpu", weights_only=True)
            return dict(data) if isinstance(data, dict) else {}
        import numpy as np  # noqa: PLC0415

        with np.load(source, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except Exception as error:  # noqa: BLE001
        raise ValueError(f"--trace: cannot read {str(source)!r} as a trace: {type(error).__name__}: {error}") \
            from None


def load_trace(path: str, device: Any = "cpu") -> Trace:
    """Read a trace file (.npz or .pt/.pth, see the module docstring)."""
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415

    source = Path(path)
    if not source.is_file():
        raise ValueError(f"--trace: no such file: {path!r}")
    if source.suffix not in (".pt", ".pth", ".npz"):
        raise ValueError(f"--trace: expected a .npz, .pt or .pth file, got {path!r}")
    contents = _trace_file_contents(source)
    if "topk" not in contents:
        raise ValueError(f"--trace: {path!r} has no 'topk' entry (found {sorted(contents)})")
    if isinstance(contents["topk"], np.ndarray):
        topk = torch.from_numpy(np.ascontiguousarray(contents["topk"]))
        try:
            meta = json.loads(str(contents["meta"])) if "meta" in contents else {}
        except ValueError as error:
            raise ValueError(f"--trace: {path!r} holds a 'meta' entry that is not JSON: {error}") from None
    else:
        topk = torch.as_tensor(contents["topk"])
        meta = dict(contents.get("meta") or {})
    if topk.is_floating_point() or topk.dtype == torch.bool or topk.is_complex():
        raise TypeError(f"--trace: 'topk' must hold integer positions, got {topk.dtype}")
    if topk.dim() == 3:
        topk = topk[:, None]
    if topk.dim() != 4:
        raise ValueError(
            f"--trace: 'topk' must be [steps, rows, k] or [steps, groups, rows, k], got {tuple(topk.shape)}")
    if topk.numel() and (int(topk.min()) < -1 or int(topk.max()) >= 2**31 - 1):
        raise ValueError("--trace: positions must lie in [-1, 2**31 - 1)")
    rows = int(topk.shape[2])
    rows_per_request = int(meta.get("rows_per_request", 1))
    batch = int(meta.get("batch", rows // max(rows_per_request, 1)))
    largest = int(topk.max()) if topk.numel() else 0
    context = int(meta.get("context", largest + 1))
    if largest >= context:
        raise ValueError(f"--trace: position {largest} is outside the trace's context of {context} positions")
    meta.setdefault("source", str(source))
    return Trace(topk.to(torch.int32).contiguous().to(device), batch, rows_per_request, context, meta)


def check_trace_matches(trace: Trace, explicit: Dict[str, Optional[int]]) -> None:
    """Refuse command-line sizes that contradict a replayed trace."""
    facts = {"batch": trace.batch, "spec_tokens": trace.spec_tokens, "context": trace.context, "top_k": trace.top_k}
    for name, value in explicit.items():
        if value is not None and name in facts and value != facts[name]:
            raise ValueError(
                f"--{name.replace('_', '-')} {value} disagrees with the trace ({name} = {facts[name]}); "
                "leave it out when replaying a trace"
            )
