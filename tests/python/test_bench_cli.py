"""hisparse bench / hisparse plan: the CLI end to end on the tiny preset, the
figures' consistency, trace replay, the PyTorch baseline's agreement, plots,
and the planner's recommendation against its own curve.

The subprocess tests run the CLI as a user does (CPU backend); the in-process
ones also run on CUDA where it is present (the `device` fixture), where the
same trace must give the same counters as on the CPU reference.
"""

import io
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import hisparse  # noqa: E402
from hisparse.bench import commands, plots  # noqa: E402
from hisparse.bench.baseline_step import BaselineStep  # noqa: E402
from hisparse.bench.plane import DataPlane  # noqa: E402
from hisparse.bench.planner import host_plan, recommend, residency_hint_kept_by_default  # noqa: E402
from hisparse.bench.presets import make_settings  # noqa: E402
from hisparse.bench.progress import Progress  # noqa: E402
from hisparse.bench.trace import (  # noqa: E402
    Trace,
    generate_locality,
    generate_scores,
    load_trace,
    save_trace,
    trace_stats,
)
from hisparse.cli import main  # noqa: E402


def run_cli(*args, timeout=180):
    command = [sys.executable, "-m", "hisparse", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One subprocess run of the tiny preset on the CPU: (directory, stdout, results)."""
    directory = tmp_path_factory.mktemp("bench")
    proc = run_cli("bench", "--preset", "tiny", "--device", "cpu", "--out", directory / "tiny.json",
                   "--save-trace", directory / "trace.npz", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    with open(directory / "tiny.json") as handle:
        return directory, proc.stdout, json.load(handle)


def run_main(argv, capsys):
    assert main([str(a) for a in argv]) == 0
    return capsys.readouterr().out


# ------------------------------------------------------------------------- the CLI end to end


@pytest.mark.slow
def test_bench_prints_the_table(tiny):
    _, stdout, _ = tiny
    for label in ("hisparse bench: preset tiny", "hit rate", "bytes moved", "link ceiling (memcpy)", "resolve",
                  "gather", "exposed, no prefetch", "exposed, prefetch", "exposed, prefetch + fused leaders",
                  "plain PyTorch step", "PyTorch agrees", "after fused steps", "hit rate vs hot-buffer size",
                  "gather bandwidth vs rows per step"):
        assert label in stdout, label


@pytest.mark.slow
def test_bench_json_echoes_config_and_environment(tiny):
    _, _, r = tiny
    c = r["config"]
    assert (c["preset"], c["layers"], c["group_size"], c["index_groups"]) == ("tiny", 4, 2, 2)
    assert (c["top_k"], c["row_bytes"], c["batch"], c["hot_size"], c["steps"]) == (64, 64, 2, 128, 10)
    env = r["environment"]
    for key in ("python", "torch", "hisparse", "platform", "command", "device"):
        assert env[key], key
    assert "bench" in env["command"] and "--preset tiny" in env["command"]
    assert r["trace"]["steps"] == 10 and r["trace"]["top_k"] == 64


@pytest.mark.slow
def test_bench_figures_are_sane(tiny):
    _, _, r = tiny
    row_bytes, group_size = r["config"]["row_bytes"], r["config"]["group_size"]
    steady = r["accounting"]["steady"]
    assert 0.0 <= steady["hit_rate"] <= 1.0
    assert steady["misses"] > 0 and steady["hits"] > 0
    for step in r["accounting"]["per_step"]:
        assert 0.0 <= step["hit_rate"] <= 1.0
        # Every layer of a group loads the rows its leader missed (equal groups here).
        assert step["bytes"] == step["misses"] * row_bytes * group_size
    assert r["accounting"]["per_step"][0]["hits"] == 0  # cold start
    assert steady["bytes_per_layer_step"] == pytest.approx(steady["misses_per_group_step"] * row_bytes)
    steady_steps = r["accounting"]["per_step"][r["config"]["warmup_steps"]:]
    assert steady["bytes_per_step"] == pytest.approx(
        sum(p["bytes"] for p in steady_steps) / r["accounting"]["steady_steps"])
    for name, timing in r["timing"].items():
        assert timing["median_s"] > 0 and timing["per_step_s"] > 0, name
    per = r["per_layer"]
    assert {"swap", "swap_prefetch", "swap_prefetch_fused"} <= set(r["timing"])
    for key in ("resolve_us_per_group", "gather_us_per_layer", "data_plane_us_per_step",
                "data_plane_us_per_step_prefetch", "data_plane_us_per_step_prefetch_fused",
                "exposed_us_per_layer_no_prefetch", "exposed_us_per_layer_prefetch",
                "exposed_us_per_layer_prefetch_fused"):
        assert per[key] > 0, key
    # The CPU backend has nothing to overlap: exposed time is the data plane's own time.
    assert per["exposed_us_per_layer_prefetch_fused"] == pytest.approx(
        per["data_plane_us_per_step_prefetch_fused"] / r["config"]["layers"])
    assert r["summary"]["exposed_us_per_layer_prefetch_fused"] == per["exposed_us_per_layer_prefetch_fused"]
    assert per["gather_gbps"] > 0 and per["gather_ratio_to_memcpy"] > 0
    assert r["memcpy"]["gbps"] > 0
    for point in r["gather_sweep"]:
        assert point["bytes"] == point["rows"] * row_bytes
        assert point["verified"] and point["hisparse_us"] > 0 and point["torch_us"] > 0
    for point in r["hit_rate_curve"]:
        assert 0.0 <= point["hit_rate"] <= 1.0
        assert point["bytes_per_step_per_layer"] == pytest.approx(point["misses_per_step"] * row_bytes)
    assert r["data_check"] is True
    fused = r["data_check_fused"]
    assert fused["matches"] is True and fused["steps"] == [3, 4]
    assert fused["rows_loaded"] > 0  # not vacuous: the fused steps loaded the rows checked


@pytest.mark.slow
def test_bench_baseline_agrees_and_curve_matches(tiny):
    _, _, r = tiny
    agreement = r["agreement"]
    assert agreement["all_agree"] and agreement["attention_indices_agree"] and agreement["miss_counts_agree"]
    assert agreement["resolutions_compared"] == r["config"]["baseline_steps"] * r["config"]["index_groups"]
    assert agreement["fused_steps_compared"] == r["config"]["baseline_steps"] // 2 >= 1
    assert r["baseline"]["speedup_step"] > 0 and r["baseline"]["step_us"] > 0
    assert r["curve_matches_measured"]["matches"] is True
    assert r["summary"]["baseline_agrees"] is True


@pytest.mark.slow
def test_saved_trace_replays_to_identical_results(tiny, capsys):
    directory, _, first = tiny
    out = directory / "replay.json"
    run_main(["bench", "--trace", directory / "trace.npz", "--preset", "tiny", "--device", "cpu",
              "--baseline-steps", "1", "--gather-fractions", "1", "--out", out, "--no-progress"], capsys)
    with open(out) as handle:
        second = json.load(handle)
    assert second["accounting"] == first["accounting"]
    strip = ("hit_rate", "misses", "hits", "bytes_per_step_per_layer", "misses_per_step_series")
    assert [{k: p[k] for k in strip} for p in second["hit_rate_curve"]] == [
        {k: p[k] for k in strip} for p in first["hit_rate_curve"]]
    assert second["trace"]["stats"] == first["trace"]["stats"]
    assert second["trace"]["meta"]["generator"] == "locality"


def test_trace_file_formats_round_trip(tmp_path):
    trace = generate_locality(batch=3, rows_per_request=2, context=300, top_k=16, steps=5, groups=2, seed=4)
    for name in ("t.npz", "t.pt"):
        save_trace(trace, str(tmp_path / name))
        back = load_trace(str(tmp_path / name))
        assert torch.equal(back.topk, trace.topk)
        assert (back.batch, back.rows_per_request, back.context) == (3, 2, 300)
        assert back.meta["reuse"] == trace.meta["reuse"]


def test_a_captured_trace_without_metadata_loads(tmp_path):
    import numpy as np

    topk = np.random.default_rng(0).permutation(512)[: 4 * 3 * 32].reshape(4, 3, 32).astype(np.int64)
    np.savez(tmp_path / "captured.npz", topk=topk)
    trace = load_trace(str(tmp_path / "captured.npz"))
    assert (trace.steps, trace.groups, trace.batch, trace.top_k) == (4, 1, 3, 32)
    assert trace.context == int(topk.max()) + 1
    np.savez(tmp_path / "bad.npz", topk=topk.astype(np.float32))
    with pytest.raises(TypeError, match="integer positions"):
        load_trace(str(tmp_path / "bad.npz"))


def test_bench_runs_on_every_device_with_the_same_counters(device, tmp_path, capsys):
    """The CPU reference and (where present) CUDA give identical counters on one trace."""
    trace = generate_locality(batch=2, rows_per_request=2, context=1024, top_k=64, steps=8, seed=11,
                              clusters=2, drift=0.5)
    save_trace(trace, str(tmp_path / "spec.pt"))
    results = {}
    for name in sorted({"cpu", device.type}):
        out = tmp_path / f"{name}.json"
        run_main(["bench", "--preset", "tiny", "--trace", tmp_path / "spec.pt", "--device", name, "--out", out,
                  "--baseline-steps", "2", "--replays", "1", "--quiet", "--no-progress"], capsys)
        with open(out) as handle:
            results[name] = json.load(handle)
    cpu, other = results["cpu"], results[device.type]
    assert other["config"]["spec_tokens"] == 1 and other["config"]["token_rows"] == 4
    assert other["accounting"] == cpu["accounting"]
    assert other["agreement"]["all_agree"] and other["data_check"]
    assert other["data_check_fused"]["matches"] and other["data_check_fused"]["rows_loaded"] > 0
    assert other["curve_matches_measured"]["matches"]
    if device.type == "cuda":
        # Exposure is a difference against the compute-only step: it may be at or below zero, never absent.
        assert {"step_prefetch", "step_prefetch_fused"} <= set(other["timing"])
        assert other["per_layer"]["exposed_us_per_layer_prefetch_fused"] is not None


@pytest.mark.parametrize("flags, choice", [([], None), (["--residency-hint"], True),
                                           (["--residency-hint", "off"], False), (["--residency-hint", "auto"], None)])
def test_the_runtimes_keep_the_residency_hint_the_flag_asks_for(device, flags, choice, monkeypatch, tmp_path, capsys):
    """--residency-hint auto (the default) leaves the choice to hisparse.Runtime; on (also the bare flag) and off
    force it on the leaders, never on a follower, and the JSON says what the runtimes kept."""
    import hisparse.bench.plane as plane_module

    asked = []

    class Recording(hisparse.Runtime):
        def __init__(self, *args, **kwargs):
            asked.append((kwargs.get("leader") is None, kwargs.get("residency_hint", "absent")))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(plane_module.hisparse, "Runtime", Recording)
    out = tmp_path / "run.json"
    run_main(["bench", "--preset", "tiny", "--device", device.type, "--steps", "4", "--warmup-steps", "1",
              "--baseline-steps", "0", "--replays", "1", "--gather-fractions", "1.0", "--quiet", "--no-progress",
              "--out", out, *flags], capsys)
    assert {hint for leads, hint in asked if leads} == {choice}
    assert {hint for leads, hint in asked if not leads} == {None}
    with open(out) as handle:
        kept = json.load(handle)["config"]["residency_hint_kept"]
    expected = choice if choice is not None else device.type == "cuda"
    assert kept is expected


def test_a_residency_hint_choice_other_than_auto_on_off_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--preset", "tiny", "--device", "cpu", "--no-progress", "--residency-hint", "yes"])
    assert exit_info.value.code == 2 and "--residency-hint" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--residency-hint: expected 'auto', 'on' or 'off', got 'yes'"):
        make_settings("tiny", {"residency_hint": "yes"})


@pytest.mark.parametrize("warm", ["on", "off"])
def test_steps_warm_the_next_layers_host_pages_beside_each_compute(device, warm, monkeypatch):
    """With --warm-host-pages on (the default), a step with compute warms layer l + 1's host cache (the first after
    the last) beside layer l's compute, over the source table; without compute, without a data plane, or with the
    flag off it warms nothing."""
    import hisparse.bench.plane as plane_module

    settings = make_settings("tiny", {"warm_host_pages": warm})
    trace = generate_locality(batch=settings.batch, rows_per_request=1, context=settings.context,
                              top_k=settings.top_k, steps=3, seed=5)
    plane = DataPlane(settings, trace, device)
    warmed, order = [], []
    inner = plane_module.ops.warm_host_pages

    def spy(host_cache, block_table, **kwargs):
        warmed.append(next(i for i, c in enumerate(plane.host_caches) if c.data_ptr() == host_cache.data_ptr()))
        order.append("warm")
        assert block_table is plane.source_table and kwargs["block_size"] == plane.block_size
        return inner(host_cache, block_table, **kwargs)

    monkeypatch.setattr(plane_module.ops, "warm_host_pages", spy)
    try:
        plane.reset()
        plane.step(0, compute=lambda: order.append("compute"))
        layers = settings.layers
        assert warmed == ([*range(1, layers), 0] if warm == "on" else [])
        if warm == "on" and device.type == "cpu":
            assert order == ["warm", "compute"] * layers  # no second stream on the CPU: warm, then compute
        warmed.clear()
        plane.step(1)
        plane.step(2, swap=False, compute=lambda: None)
        assert warmed == []
    finally:
        plane.close()


# ------------------------------------------------------------------------- fused leader gathers


def test_fused_steps_reach_the_leaders_and_leave_host_rows(device):
    """plane.step(fused=True) asks each leader for fused_gather; the fused check catches a wrong byte."""
    from hisparse.bench.runner import _fused_data_check

    settings = make_settings("tiny", {})
    trace = generate_locality(batch=settings.batch, rows_per_request=1, context=settings.context,
                              top_k=settings.top_k, steps=4, seed=5)
    fill = [0, 1, 2, 3]
    plane = DataPlane(settings, trace, device, fill_layers=fill)
    calls = []
    for runtime in plane.runtimes:
        def spy(*args, _inner=runtime.swap_in, _leader=runtime.is_group_leader, **kwargs):
            calls.append((_leader, kwargs.get("fused_gather"), kwargs.get("prefetch")))
            return _inner(*args, **kwargs)

        runtime.swap_in = spy
    try:
        check = _fused_data_check(plane, [1, 2], [0, 1])
        assert check["matches"] and check["rows_loaded"] > 0
        assert calls and {c for c in calls if c[0]} == {(True, True, True)}
        assert {c for c in calls if not c[0]} == {(False, None, None)}  # followers: no flag
        calls.clear()
        plane.step(3)
        assert {c for c in calls if c[0]} == {(True, False, False)}
        # The check reads every layer: one flipped byte in a follower's hot rows fails it.
        attention = plane.leaders[0].attention_indices[: plane.token_rows]
        row = int(attention[attention >= 0][0])
        plane.layer_rows(1)[row, 0] ^= 0xFF
        assert not plane.data_matches(0) and plane.data_matches(1)
    finally:
        plane.close()


# ------------------------------------------------------------------------- the baseline, directly


def test_baseline_detects_a_disagreement():
    """The agreement check is not vacuous: a perturbed baseline state is caught."""
    settings = make_settings("tiny", {"spec_tokens": 1})
    trace = generate_locality(batch=settings.batch, rows_per_request=2, context=settings.context,
                              top_k=settings.top_k, steps=6, seed=3)
    plane = DataPlane(settings, trace, torch.device("cpu"))
    try:
        plane.reset()
        for step in range(3):
            plane.step(step)
        plane.snapshot()
        baseline = BaselineStep(plane)
        baseline.load_state(plane.snapshot_state())
        plane.step(3)
        assert not any(baseline.timed_step(3, compare=True)["mismatches"].values())
        assert baseline.state_matches()

        plane.restore()
        baseline.load_state(plane.snapshot_state())
        dgi, _ = baseline.state[0]
        dgi[0, dgi[0] >= 0] = -1  # the baseline forgets request 0's hot rows
        plane.step(3)
        mismatches = baseline.timed_step(3, compare=True)["mismatches"]
        assert mismatches["attention"] >= 1 and mismatches["swap_counts"] >= 1
    finally:
        plane.close()


# ------------------------------------------------------------------------- traces


def test_locality_trace_is_seeded_and_well_formed():
    args = dict(batch=2, rows_per_request=1, context=2048, top_k=128, steps=6)
    a, b = generate_locality(seed=1, **args), generate_locality(seed=1, **args)
    assert torch.equal(a.topk, b.topk)
    assert not torch.equal(a.topk, generate_locality(seed=2, **args).topk)
    rows = a.topk.reshape(-1, 128)
    assert int(rows.min()) >= 0 and int(rows.max()) < 2048
    assert all(len(set(r.tolist())) == 128 for r in rows)  # top-k positions are distinct


@pytest.mark.slow
def test_locality_knobs_set_the_overlap():
    args = dict(batch=2, rows_per_request=1, context=4096, top_k=128, steps=8, seed=5)
    frozen = trace_stats(generate_locality(reuse=1.0, window=1, **args))
    assert frozen["adjacent_overlap"][1:] == [1.0] * 7  # everything reused from the last step
    fresh = trace_stats(generate_locality(reuse=0.0, window=3, **args))
    assert fresh["adjacent_overlap"][1:] == [0.0] * 7  # nothing selected in the window comes back
    default = trace_stats(generate_locality(**dict(args, context=16384, top_k=2048, steps=24)))
    assert 0.6 <= default["adjacent_overlap_mean"] <= 0.95
    assert default["saturation_step"] is not None and default["saturation_step"] <= 16


def test_scores_trace_has_emergent_locality():
    stats = trace_stats(generate_scores(batch=2, rows_per_request=1, context=4096, top_k=256, steps=10, seed=0))
    assert 0.5 < stats["adjacent_overlap_mean"] < 1.0
    assert stats["working_set"][-1] > 256


# ------------------------------------------------------------------------- the planner


@pytest.mark.slow
def test_plan_cli_recommendation_follows_its_curve(tmp_path):
    out = tmp_path / "plan.json"
    proc = run_cli("plan", "--preset", "tiny", "--device", "cpu", "--target-misses-per-step", "8",
                   "--max-model-len", "4096", "--max-requests", "16", "--host-budget-gib", "1", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "recommendation: H = " in proc.stdout and "per node" in proc.stdout
    with open(out) as handle:
        r = json.load(handle)
    curve = sorted(r["hit_rate_curve"], key=lambda p: p["hot_size"])
    chosen = r["recommendation"]["hot_size"]
    meeting = [p["hot_size"] for p in curve if p["misses_per_request_step"] <= 8]
    assert chosen == meeting[0]
    assert all(p["misses_per_request_step"] > 8 for p in curve if p["hot_size"] < chosen)
    host = r["host"]
    assert host["bytes_per_node"] == (1 + 16 * host["blocks_per_request"]) * host["page_size_bytes"]
    assert host["layout"]["host_num_blocks"] * host["page_size_bytes"] == host["bytes_per_node"]
    assert host["page_size_bytes"] == 16 * 64 * 4  # block_size x row_bytes x layers of the tiny preset
    assert host["budget"]["max_requests"] == (host["budget"]["layout"]["host_num_blocks"] - 1) // host[
        "blocks_per_request"]
    # A CPU run cannot know the GPU's SM count, which decides whether the runtimes keep a hint.
    assert host["residency_hint_kept_by_default"] is None and host["residency_hint_device"] == "cpu"
    assert "residency hint (where kept; the GPU's SM count decides the default)" in proc.stdout


@pytest.mark.slow
def test_plan_curve_equals_the_bench_curve_on_the_same_trace(tiny, capsys):
    directory, _, bench = tiny
    out = directory / "plan.json"
    run_main(["plan", "--trace", directory / "trace.npz", "--preset", "tiny", "--device", "cpu", "--out", out,
              "--target-hit-rate", "0.8", "--quiet"], capsys)
    with open(out) as handle:
        plan = json.load(handle)
    keys = ("hot_size", "hits", "misses", "hit_rate")
    assert [{k: p[k] for k in keys} for p in plan["hit_rate_curve"]] == [
        {k: p[k] for k in keys} for p in bench["hit_rate_curve"]]
    rec = plan["recommendation"]
    assert rec["hot_size"] == min(p["hot_size"] for p in plan["hit_rate_curve"] if p["hit_rate"] >= 0.8)


def test_recommend_reports_an_unmet_target():
    curve = [{"hot_size": 64, "hit_rate": 0.5, "misses_per_request_step": 30.0, "hot_buffer_bytes_per_request": 1,
              "bytes_per_step_per_layer": 1.0},
             {"hot_size": 128, "hit_rate": 0.7, "misses_per_request_step": 20.0, "hot_buffer_bytes_per_request": 2,
              "bytes_per_step_per_layer": 1.0}]
    rec = recommend(curve, top_k=64, target_misses=10)
    assert rec["hot_size"] is None and "no swept size" in rec["why"][0]
    rec = recommend(curve, top_k=64, target_misses=25)
    assert rec["hot_size"] == 128 and "H=64" in rec["why"][1]
    assert recommend(curve, top_k=64, target_hit_rate=0.4)["hot_size"] == 64


def test_host_plan_counts_the_residency_hint_per_index_group():
    plan = host_plan(max_model_len=8192, max_requests=2, layers=61, row_bytes=656, block_size=64, index_groups=16)
    rows = plan["layout"]["host_num_blocks"] * 64  # a layer's host rows
    assert plan["residency_hint_bytes_per_index_group"] == (rows + 31) // 32 * 4
    assert plan["residency_hint_bytes"] == 16 * plan["residency_hint_bytes_per_index_group"]
    assert host_plan(max_model_len=8192, max_requests=2, layers=61, row_bytes=656,
                     block_size=64)["index_groups"] == 61


@pytest.mark.cuda
def test_plan_asks_the_device_whether_the_runtimes_keep_a_hint():
    settings = make_settings("dsv32-fp8", {})
    device = torch.device("cuda", torch.cuda.current_device())
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    assert residency_hint_kept_by_default(settings, 4096, 2, device) is True
    assert residency_hint_kept_by_default(settings, 4096, sms, device) is False  # past half the SMs
    speculative = make_settings("dsv32-fp8", {"spec_tokens": 1})
    assert residency_hint_kept_by_default(speculative, 4096, 2, device) is False
    assert residency_hint_kept_by_default(settings, 4096, 2, torch.device("cpu")) is None


def test_host_plan_refuses_a_budget_too_small_for_one_request():
    plan = host_plan(max_model_len=8192, max_requests=2, layers=61, row_bytes=656, block_size=64,
                     host_budget_bytes=1 << 20)
    assert "increase host_budget_bytes" in plan["budget"]["error"]


# ------------------------------------------------------------------------- output


@pytest.mark.slow
def test_plots_are_written(tiny, tmp_path):
    pytest.importorskip("matplotlib")
    _, _, r = tiny
    written = plots.write_plots(r, str(tmp_path / "plots"))
    names = sorted(os.path.basename(p) for p in written)
    assert names == ["bandwidth_vs_rows.png", "hit_rate_vs_hot_size.png", "layer_time_breakdown.png"]
    for path in written:
        with open(path, "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    # A result saved before fused leader gathers were measured still draws.
    older = dict(r, per_layer={k: v for k, v in r["per_layer"].items() if "fused" not in k},
                 hit_rate_curve=[], gather_sweep=[])
    assert [os.path.basename(p) for p in plots.write_plots(older, str(tmp_path / "older"))] == [
        "layer_time_breakdown.png"]


def test_outputs_that_would_fail_after_the_run_are_refused_before_it(tmp_path, monkeypatch):
    def args(**fields):
        values = {"out": None, "plots": None, "save_trace": None}
        values.update(fields)
        return type("Args", (), values)()

    monkeypatch.setattr(plots, "matplotlib_available", lambda: False)
    with pytest.raises(ValueError, match=r"--plots: needs matplotlib.*pip install matplotlib"):
        commands.check_outputs(args(plots=str(tmp_path / "p")))
    assert not (tmp_path / "p").exists()
    monkeypatch.setattr(plots, "matplotlib_available", lambda: True)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=r"--plots: cannot write into"):
        commands.check_outputs(args(plots=str(blocker / "plots")))
    with pytest.raises(ValueError, match=r"--out: cannot write into"):
        commands.check_outputs(args(out=str(blocker / "r.json")))
    commands.check_outputs(args(out=str(tmp_path / "r.json"), plots=str(tmp_path / "p")))
    assert (tmp_path / "p").is_dir()


@pytest.mark.slow
def test_plan_refuses_a_non_positive_budget():
    proc = run_cli("plan", "--preset", "tiny", "--device", "cpu", "--host-budget-gib", "-1")
    assert proc.returncode == 2 and "--host-budget-gib: expected a positive number, got -1" in proc.stderr


def test_progress_bar_draws_only_when_enabled():
    stream = io.StringIO()
    with Progress(4, stream=stream, enabled=True) as progress:
        progress.phase("work")
        for _ in range(4):
            progress.advance()
    text = stream.getvalue()
    assert "100%" in text and "work" in text and text.endswith("\n")
    quiet = io.StringIO()
    with Progress(4, stream=quiet) as progress:  # a StringIO is not a terminal
        progress.advance(4)
    assert quiet.getvalue() == ""


# ------------------------------------------------------------------------- bad input


@pytest.mark.slow
def test_bad_flags_fail_cleanly():
    proc = run_cli("bench", "--preset", "tiny", "--device", "cpu", "--hot-size", "16")
    assert proc.returncode == 2 and "--hot-size" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli("plan", "--preset", "tiny", "--device", "cpu", "--trace", "/nonexistent/trace.npz")
    assert proc.returncode == 2 and "no such file" in proc.stderr


@pytest.mark.parametrize("flags, message", [
    (["--hot-block-size", "0"], "--hot-block-size: expected a positive value, got 0"),
    (["--context", "99999999999999"], "--context: expected at most 2**31 - 1 positions"),
    (["--seed", "99999999999999999999999"], "--seed: expected 0 <= seed < 2**63"),
    (["--drift", "inf"], "--drift: expected a finite number, got inf"),
    (["--query-drift", "nan"], "--query-drift: expected a finite number, got nan"),
    (["--query-spread", "inf"], "--query-spread: expected a finite number, got inf"),
    (["--batch", "100000000"], "--batch, --spec-tokens, --top-k: the trace of"),
    (["--spec-tokens", "100000000"], "--batch, --spec-tokens, --top-k: the trace of"),
    (["--hot-sizes", ",,,"], "--hot-sizes: expected comma-separated integers, got ',,,'"),
    (["--out", "/"], "--out: expected a file to write, got the directory '/'"),
])
def test_flags_no_run_could_use_are_refused_before_it(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--preset", "tiny", "--device", "cpu", "--no-progress", *flags])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_bench_refuses_an_undefined_compute_time(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--preset", "tiny", "--device", "cpu", "--no-progress", "--compute-us", "nan"])
    assert exit_info.value.code == 2
    assert "--compute-us: expected a finite number, got nan" in capsys.readouterr().err


def test_plan_refuses_an_infinite_budget(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--preset", "tiny", "--device", "cpu", "--no-progress", "--host-budget-gib", "inf"])
    assert exit_info.value.code == 2
    assert "--host-budget-gib: expected a positive number, got inf" in capsys.readouterr().err


@pytest.mark.parametrize("content", [b"", b"not a trace at all", b"PK\x03\x04 broken zip"])
@pytest.mark.parametrize("suffix", [".npz", ".pt"])
def test_unreadable_trace_files_are_named(content, suffix, tmp_path, capsys):
    trace = tmp_path / ("trace" + suffix)
    trace.write_bytes(content)
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--preset", "tiny", "--device", "cpu", "--no-progress", "--trace", str(trace)])
    assert exit_info.value.code == 2
    assert f"--trace: cannot read {str(trace)!r} as a trace" in capsys.readouterr().err


def test_a_trace_of_pickled_objects_is_named(tmp_path, capsys):
    import numpy as np

    trace = tmp_path / "trace.npz"
    np.savez(trace, topk=np.array([object()], dtype=object))
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--preset", "tiny", "--device", "cpu", "--no-progress", "--trace", str(trace)])
    assert exit_info.value.code == 2
    assert f"--trace: cannot read {str(trace)!r} as a trace: ValueError" in capsys.readouterr().err


@pytest.mark.slow
def test_trace_and_conflicting_sizes_are_refused(tiny, capsys):
    directory, _, _ = tiny
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--preset", "tiny", "--trace", str(directory / "trace.npz"), "--batch", "7"])
    assert exit_info.value.code == 2
    assert "--batch 7 disagrees with the trace" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_request_without_cuda_is_refused():
    proc = run_cli("bench", "--preset", "tiny", "--device", "cuda")
    assert proc.returncode == 2 and "no usable CUDA device" in proc.stderr


def test_trace_validation():
    topk = torch.zeros((2, 1, 3, 4), dtype=torch.int32)
    with pytest.raises(ValueError, match="rows_per_request"):
        Trace(topk, batch=2, rows_per_request=1, context=10)
    with pytest.raises(TypeError, match="int32"):
        Trace(topk.long(), batch=3, rows_per_request=1, context=10)
