"""bench/bench_resolver.py times what each of its columns names."""

from __future__ import annotations

import importlib.util
import json
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
        schedule = kw.get("gather_schedule")
        if schedule == "auto" and kw.get("handoff") is None:
            schedule = "auto without a handoff"
        calls.append(("resolve", schedule))
        return resolve(*a, **kw)

    def spy_gather(*a, **kw):
        calls.append(("gather", kw.get("variant")))
        return gather(*a, **kw)

    monkeypatch.setattr(hisparse.ops, "resolve_residency", spy_resolve)
    monkeypatch.setattr(hisparse.ops, "gather_compact", spy_gather)
    # Scenario.resolve binds the resolver as a default argument at import: route it through the spy.
    monkeypatch.setattr(bench.Scenario.resolve, "__defaults__", (spy_resolve, *bench.Scenario.resolve.__defaults__[1:]))
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
    assert [seen[i] for i in range(6)] == [
        [("resolve", None)],  # resolve
        [("gather", "warp_per_row"), ("resolve", None)],  # resolve+gather_warp_per_row
        [("gather", "auto"), ("resolve", None)],  # resolve+gather_default: the split path's own gather
        [("resolve", "fused")],  # resolve_fused_gather
        [("resolve", "auto")],  # resolve_auto_gather: with the handoff array, as the Runtime runs it
        [("resolve", "auto without a handoff")],  # resolve_auto_tail_gather
    ]
    assert {"resolve_us", "resolve+gather_default_us", "resolve_auto_gather_us",
            "resolve_auto_tail_gather_us"} <= set(result)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the early-start bound forks a CUDA stream")
def test_the_early_start_bound_copies_each_steps_own_list_alone_and_beside_the_resolve(monkeypatch):
    bench = load_bench()
    args = bench.parse_args(["--top-k", "64", "--hot-size", "128", "--context", "2048", "--steps", "2",
                             "--replays", "1", "--baseline-steps", "0", "--early-start-bound"])
    calls = []
    resolve, gather = hisparse.ops.resolve_residency, hisparse.ops.gather_compact

    def spy_resolve(*a, **kw):
        calls.append(("resolve", kw.get("gather_schedule")))
        return resolve(*a, **kw)

    def spy_gather(*a, **kw):
        calls.append(("gather", kw.get("variant"), a[2].data_ptr()))
        return gather(*a, **kw)

    monkeypatch.setattr(hisparse.ops, "gather_compact", spy_gather)
    monkeypatch.setattr(bench.Scenario.resolve, "__defaults__", (spy_resolve, *bench.Scenario.resolve.__defaults__[1:]))
    pool, host_cache, hot_cache = bench.make_caches(args, 2, "cuda")
    seen = []
    timed = bench.measure.Timer.time

    def record(self, fn, **kw):
        calls.clear()
        fn()
        torch.cuda.synchronize()
        seen.append(list(calls))
        return timed(self, fn, **kw)

    monkeypatch.setattr(bench.measure.Timer, "time", record)
    result = bench.run_point(args, 2, 0.05, host_cache, hot_cache, memcpy_gbps=1.0)
    del host_cache, hot_cache
    pool.release()
    bound = seen[6:10]
    assert len(bound) == 4
    for timed_calls, variant, with_resolve in ((bound[0], "warp_per_row", False), (bound[1], "warp_per_row", True),
                                               (bound[2], "auto", False), (bound[3], "auto", True)):
        gathers = [c for c in timed_calls if c[0] == "gather"]
        resolves = [c for c in timed_calls if c[0] == "resolve"]
        assert [c[1] for c in gathers] == [variant, variant]
        # Each step copies its own list (a copy of it, not the resolver's output buffer).
        assert len({c[2] for c in gathers}) == 2
        assert resolves == ([("resolve", None)] * 2 if with_resolve else [])
    for name in ("gather_alone_warp_per_row", "resolve_beside_gather_warp_per_row", "gather_alone_default",
                 "resolve_beside_gather_default"):
        assert result[f"{name}_us"] > 0
        assert result[f"{name}_over_line_bound"] > 0


PEER = SCRIPT.parent / "peers" / "sglang_010c002_h200.json"


def test_the_recorded_peer_covers_the_default_grid():
    bench = load_bench()
    args = bench.parse_args([])
    peer = bench.load_peer(PEER, args)
    grid = {(int(b), float(m)) for b in args.batches.split(",") for m in args.miss_rates.split(",")}
    assert set(peer["by_point"]) == grid
    assert peer["limits"] == {(256, 0.001): 20.0}


def test_a_peer_for_another_shape_is_refused():
    bench = load_bench()
    with pytest.raises(SystemExit, match="its figures are for .*'top_k': 2048.* the grid is .*'top_k': 64"):
        bench.load_peer(PEER, bench.parse_args(["--top-k", "64"]))


def test_a_peer_for_another_host_footprint_is_refused():
    # The peer ran on a 2.56 GiB pool: 16,384 positions per request at 256 requests, the default.
    bench = load_bench()
    assert bench.parse_args([]).context == 16384
    with pytest.raises(SystemExit, match="its figures are for .*'context': 16384.* the grid is .*'context': 32768"):
        bench.load_peer(PEER, bench.parse_args(["--context", "32768"]))


def test_the_target_is_the_peer_over_1_1_or_the_line_bound_and_the_points_limit():
    bench = load_bench()
    peer = bench.load_peer(PEER, bench.parse_args([]))

    def compared(batch, miss_rate, auto, line_bound):
        point = {"batch": batch, "miss_rate": miss_rate, "resolve_auto_gather_us": auto,
                 "ideal_line_bound_us": line_bound}
        bench.compare_with_peer(point, peer)
        return point

    # The peer's time / 1.1 where it is above 1.05 x the line bound.
    p = compared(16, 0.05, 37.9, 22.8)
    assert p["peer_us"] == 41.8 and p["target_us"] == pytest.approx(41.8 / 1.1)
    assert p["meets_target"] and p["peer_over_auto"] == pytest.approx(41.8 / 37.9)
    assert not compared(16, 0.05, 38.1, 22.8)["meets_target"]
    # 1.05 x the line bound where beating the peer by 1.1 would beat the link.
    p = compared(100, 0.2, 601.0, 572.7)
    assert p["target_us"] == pytest.approx(1.05 * 572.7) and p["meets_target"]
    # The point's own limit caps the target (256 requests at 0.1%: 20 us, below 23.3 / 1.1).
    p = compared(256, 0.001, 20.5, 7.2)
    assert p["target_us"] == 20.0 and not p["meets_target"]
    # A point the peer did not run gets nothing.
    p = compared(133, 0.05, 200.0, 190.0)
    assert "peer_us" not in p and "meets_target" not in p


def small_run(batches):
    """A CPU run of the grid's code at a small shape: the given batches at 5% misses."""
    return ["--device", "cpu", "--top-k", "64", "--hot-size", "128", "--context", "2048", "--steps", "2",
            "--replays", "1", "--baseline-steps", "0", "--batches", batches, "--miss-rates", "0.05"]


def write_peer(tmp_path):
    """A peer file with one point (2 requests at 5%) that any run meets."""
    peer = tmp_path / "peer.json"
    peer.write_text(json.dumps({
        "name": "a peer", "source": "this test", "memcpy_h2d_gbps": 1.0,
        "shape": {"top_k": 64, "hot_size": 128, "row_bytes": 656, "context": 2048},
        "target": {"faster_by": 1.1, "line_bound_factor": 1.05, "rule": "r"},
        "points": [{"batch": 2, "miss_rate": 0.05, "us": 1e9}],
    }))
    return peer


def test_a_run_with_a_peer_reports_each_compared_point(tmp_path):
    bench = load_bench()
    small = small_run("2,3")
    peer = write_peer(tmp_path)
    result = bench.main(small + ["--peer", str(peer)])
    first, second = result["points"]
    assert first["peer_us"] == 1e9 and first["meets_target"] is True
    assert "peer_us" not in second
    assert result["peer"]["points_compared"] == 1 and result["peer"]["points_met"] == 1


def test_paths_times_only_the_named_timings_and_reports_what_follows_from_them(tmp_path):
    bench = load_bench()
    small = small_run("2")
    peer = write_peer(tmp_path)
    (point,) = bench.main(small + ["--paths", "resolve_auto_gather", "--peer", str(peer)])["points"]
    timings = {name for name in point if name.endswith("_us") and name.startswith("resolve")}
    assert timings == {"resolve_auto_gather_us"}
    assert point["auto_over_line_bound"] == point["resolve_auto_gather_us"] / point["ideal_line_bound_us"]
    assert point["meets_target"] is True and point["peer_over_auto"] == 1e9 / point["resolve_auto_gather_us"]
    for derived in ("speedup_vs_torch", "gather_default_over_ideal", "fused_over_ideal", "best_over_line_bound"):
        assert derived not in point
    with pytest.raises(SystemExit, match="--paths: expected some of"):
        bench.main(small + ["--paths", "resolve,resolve_sideways"])


def test_each_section_reads_a_pool_of_its_own_context():
    bench = load_bench()
    result = bench.main(small_run("2") + ["--sections", "grid,speculative", "--spec-context", "4096",
                                          "--spec-batches", "3", "--spec-token-rows", "2", "--spec-hot-sizes", "256",
                                          "--spec-miss-rates", "0.05"])
    env = result["environment"]
    rows = lambda batch, context: (1 + batch * context // 64) * 64 * 656  # noqa: E731
    assert env["host_pool"]["size_bytes"] == rows(2, 2048)
    assert env["speculative_host_pool"]["size_bytes"] == rows(3, 4096)
    # The ceiling comes from a buffer of its own, larger than either pool here.
    assert env["memcpy"]["bytes"] == 16 << 20 > rows(3, 4096)
    (point,) = result["speculative_points"]
    assert point["token_rows"] == 2 and point["swap_rows_observed"] == point["misses_per_step"]


@pytest.mark.parametrize("extra, message", [
    (["--context", "1000"], r"--context: expected a positive multiple of --block-size \(64\), got 1000"),
    (["--context", "0"], r"--context: expected a positive multiple of --block-size \(64\), got 0"),
    (["--context", "64"], r"--context 64 too small: 4 steps of 1 token rows at miss rate 0.05 take 76 positions"),
    (["--sections", "speculative", "--spec-context", "192", "--spec-batches", "1", "--spec-token-rows", "4",
      "--spec-hot-sizes", "256", "--spec-miss-rates", "0.05"],
     r"--spec-context 192 too small: 4 steps of 4 token rows at miss rate 0.05 take 268 positions"),
])
def test_a_context_that_cannot_hold_the_steps_is_refused_naming_its_flag(extra, message):
    bench = load_bench()
    with pytest.raises(SystemExit, match=message):
        bench.main(small_run("2") + extra)
