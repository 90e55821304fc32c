"""bench/bench_resolver.py's uneven section: each request misses what its weight says."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from bench_scripts import load_bench_script  # noqa: E402


def load_bench():
    return load_bench_script("bench_resolver")


def test_weights_spread_the_mean_over_the_requests():
    bench = load_bench()
    args = bench.parse_args([])
    even = bench.request_misses(args, 32, 0.025)
    uneven = bench.request_misses(args, 32, 0.025, 0.9)
    m = bench.misses_per_request(args, 0.025)
    assert even == [m] * 32
    assert uneven == bench.request_misses(args, 32, 0.025, 0.9)  # a fixed deal
    assert abs(sum(uneven) - 32 * m) <= 16
    assert min(uneven) == max(1, round(m * 0.1)) and max(uneven) == round(m * 1.9)
    assert uneven != sorted(uneven)  # dealt, not in weight order
    assert bench.request_misses(args, 1, 0.025, 0.9) == [m]


def test_each_request_misses_its_own_share_every_step():
    bench = load_bench()
    args = bench.parse_args(["--device", "cpu", "--top-k", "64", "--hot-size", "128", "--context", "2048",
                             "--steps", "3", "--replays", "1", "--baseline-steps", "0"])
    pool, host_cache, hot_cache = bench.make_caches(args, 4, "cpu")
    s = bench.Scenario(args, 4, 0.1, host_cache, hot_cache, spread=0.9)
    assert len(set(s.request_misses)) > 1
    s.resolve(0)
    s.resolve(1)
    for step in (2, 3):
        s.resolve(step)
        assert s.swap_counts.tolist() == s.request_misses
    del s, host_cache, hot_cache
    pool.release()


def test_the_section_runs_each_point_even_and_uneven(tmp_path):
    bench = load_bench()
    out = tmp_path / "uneven.json"
    result = bench.main(["--device", "cpu", "--sections", "uneven", "--uneven-batches", "4",
                         "--uneven-miss-rates", "0.1", "--paths", "resolve", "--top-k", "64", "--hot-size", "128",
                         "--context", "2048", "--steps", "2", "--replays", "1", "--baseline-steps", "0",
                         "--out", str(out)])
    points = result["uneven_points"]
    assert [p["miss_spread"] for p in points] == [0.0, 0.9]
    assert points[0]["request_misses"] == [6] * 4
    assert points[1]["swap_rows_observed"] == sum(points[1]["request_misses"])
    assert out.exists()
