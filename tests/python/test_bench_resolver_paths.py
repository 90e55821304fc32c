"""bench/bench_resolver.py times what each of its columns names."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import hisparse  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "bench_resolver.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_resolver_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_timed_path_runs_the_kernels_its_name_says(monkeypatch):
    bench = load_bench()
    args = bench.parse_args(["--device", "cpu", "--top-k", "64", "--hot-size", "128", "--context", "2048",
                             "--steps", "2", "--replays", "1", "--baseline-steps", "0"])
    calls = []
    resolve, gather = hisparse.ops.resolve_residency, hisparse.ops.gather_compact

    def spy_resolve(*a, **kw):
        calls.append(("resolve", kw.get("gather_schedule")))
        return resolve(*a, **kw)

    def spy_gather(*a, **kw):
        calls.append(("gather", kw.get("variant")))
        return gather(*a, **kw)

    monkeypatch.setattr(hisparse.ops, "resolve_residency", spy_resolve)
    monkeypatch.setattr(hisparse.ops, "gather_compact", spy_gather)
    # Scenario.resolve binds the resolver as a default argument at import: route it through the spy.
    monkeypatch.setattr(bench.Scenario.resolve, "__defaults__", (spy_resolve, None))
    pool, host_cache, hot_cache = bench.make_caches(args, 2, "cpu")
    seen = {}
    timed = bench.measure.Timer.time

    def record(self, fn, **kw):
        calls.clear()
        fn()
        seen[len(seen)] = sorted(set(calls))
        return timed(self, fn, **kw)

    monkeypatch.setattr(bench.measure.Timer, "time", record)
    result = bench.run_point(args, 2, 0.05, host_cache, hot_cache, memcpy_gbps=1.0)
    del host_cache, hot_cache
    pool.release()
    assert [seen[i] for i in range(5)] == [
        [("resolve", None)],  # resolve
        [("gather", "warp_per_row"), ("resolve", None)],  # resolve+gather_warp_per_row
        [("gather", "auto"), ("resolve", None)],  # resolve+gather_default: the split path's own gather
        [("resolve", "fused")],  # resolve_fused_gather
        [("resolve", "auto")],  # resolve_auto_gather
    ]
    assert {"resolve_us", "resolve+gather_default_us", "resolve_auto_gather_us"} <= set(result)
