"""bench/resolver_timeline.py stamps every phase of the resolver kernel and the early-read helpers' steps."""
import re
import shutil
import subprocess

import pytest
from bench_scripts import ROOT, load_bench_script


def load():
    return load_bench_script("resolver_timeline")


def test_every_phase_of_the_kernel_and_every_helper_step_gets_one_stamp():
    timeline = load()
    stamped = timeline.stamp_sources(ROOT)
    names = stamped.points
    for phase in ("A find_request", "B build_union", "C1 match_slots", "C2 walk_lru", "D assign_misses",
                  "E copy_assigned", "F write_outputs", "G finish", "H help_as_owner", "H help_as_idle",
                  "end copy_lists"):
        assert phase in names, f"{phase} is not stamped: {names}"
    values = [names[point] for point in stamped.values]
    assert values == [name for name, _, _ in timeline.VALUE_POINTS]
    assert [name for name in names if name.startswith("helper:") and name not in values] == [
        name for name, _, _ in timeline.HELPER_POINTS]
    assert [name for name in names if name.startswith("single row:")] == [
        name for name, _, _ in timeline.SINGLE_ROW_POINTS]
    assert [name for name in names if name.startswith("turns:")] == [name for name, _, _ in timeline.DEFERRED_POINTS]
    assert len(names) <= timeline.POINTS_PER_BLOCK
    text = "".join(stamped.sources.values())
    stamps = re.findall(r"timeline_(?:stamp|stamp_now|stamp_after|value)\(p, (\d+)[,)]", text)
    assert sorted(int(point) for point in stamps) == list(range(len(names))), "each point is stamped exactly once"
    assert re.findall(r"timeline_value\(p, (\d+),", text) == [str(point) for point in stamped.values]
    # The kernel's own points come first, then the single-row phases', then the helpers'.
    assert all(not name.startswith("helper:") for name in names[: stamped.owner_points])
    assert all(name.startswith("helper:") for name in names[stamped.owner_points:])
    assert names[stamped.owner_points - 1] == timeline.DEFERRED_POINTS[-1][0]
    # The stamps are defined once, where every stamped file sees them.
    assert text.count("void timeline_stamp(") == 1
    assert "void timeline_stamp(" in stamped.sources[str(timeline.CONTEXT)]
    # Each block names its row at its entry and each turn its own, after the barrier that ends the last
    # turn (thread 0 may still stamp the last turn before it) and before any stamp of the turn.
    kernel = stamped.sources[str(timeline.KERNEL)]
    assert kernel.count("timeline_set_row(") == 2
    entry = kernel.index("timeline_set_row(static_cast<int32_t>(blockIdx.x) * Gather::kRequestsPerBlock);")
    assert entry < kernel.index("timeline_stamp(p, 0);")
    turn = kernel.index("timeline_set_row(b);")
    assert kernel.rfind("const int32_t b = ", 0, turn) > entry
    assert kernel.rfind("if (turn > 0) __syncthreads();", 0, turn) > kernel.rfind("const int32_t b = ", 0, turn)
    assert turn < kernel.index(f"timeline_stamp(p, {names.index('A find_request')});")
    # Each turn's phase A is split at its start, the prior grid's wait and B1, all inside find_request.
    assert kernel.index(f"timeline_stamp(p, {names.index('A: turn start')});") > turn
    find_request = kernel.index("bool find_request(")
    find_end = kernel.index("\n}\n", find_request)
    for name, _, _ in timeline.PHASE_A_POINTS:
        assert name in names, f"{name} is not stamped: {names}"
        assert find_request < kernel.index(f"timeline_stamp(p, {names.index(name)});") < find_end
    assert (kernel.index(f"timeline_stamp(p, {names.index('A: prior grid waited')});") >
            kernel.index("wait_for_prior_grid();", find_request))
    assert (kernel.index(f"timeline_stamp(p, {names.index('A: B1')});") >
            kernel.index("__syncthreads();  // B1", find_request))
    # The row lives in shared memory the stamped launch adds, so a stamp loads nothing from global memory.
    assert timeline.LAUNCH_BYTES not in kernel
    assert f"constants.miss_stage.total_bytes + {timeline.ROW_SLOT_BYTES};" in kernel
    assert "timeline_row_slot()" in stamped.sources[str(timeline.CONTEXT)]


def test_a_phase_line_that_does_not_end_its_statement_is_refused(tmp_path):
    timeline = load()
    for relative in (timeline.KERNEL, timeline.EARLY_READS, timeline.SINGLE_ROW, timeline.CONTEXT):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / relative, tmp_path / relative)
    kernel = tmp_path / timeline.KERNEL
    source = kernel.read_text()
    # The phase comment stays on the statement's first line.
    line = next(line for line in source.splitlines() if "walk_lru(p, ws);" in line)
    kernel.write_text(source.replace(line, "  const LruWalk walk = walk_lru(  // C2 | B4\n      p, ws);", 1))
    with pytest.raises(SystemExit, match="must end its statement"):
        timeline.stamp_sources(tmp_path)


def test_a_kernel_without_its_turn_row_or_list_copy_is_refused(tmp_path):
    timeline = load()
    for relative in (timeline.KERNEL, timeline.EARLY_READS, timeline.SINGLE_ROW, timeline.DEFERRED, timeline.CONTEXT):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / relative, tmp_path / relative)
    kernel = tmp_path / timeline.KERNEL
    source = kernel.read_text()
    kernel.write_text(source.replace("gather.copy_lists(", "gather.copy_both_lists(", 1))
    with pytest.raises(SystemExit, match="found 1 and 0"):
        timeline.stamp_sources(tmp_path)
    kernel.write_text(source.replace("if (turn > 0) __syncthreads();", "if (turn != 0) __syncthreads();", 1))
    with pytest.raises(SystemExit, match="found 0 and 1"):
        timeline.stamp_sources(tmp_path)
    kernel.write_text(source.replace(timeline.LAUNCH_BYTES, timeline.LAUNCH_BYTES.replace("shared_bytes", "bytes"), 1))
    with pytest.raises(SystemExit, match="extends"):
        timeline.stamp_sources(tmp_path)


def test_turns_are_reported_by_turn():
    timeline = load()
    stamped = timeline.Stamped(sources={}, points=["entry", "A find_request", "end copy_lists"], owner_points=3)
    # Four batch rows in two blocks: the entry is stamped in rows 0 and 2, each row's phase A in its own
    # slot, the end in the second rows' slots; row 4 is the extra row. Times in ns.
    launch = [[1_000, 2_000, 0], [0, 12_000, 25_000], [1_000, 2_400, 0], [0, 12_400, 27_000], [1_000, 0, 0]]
    report = timeline.summarise([launch], batch=4, stamped=stamped)
    assert report["turns"]
    first = {row["point"]: row for row in report["first turns"]}
    second = {row["point"]: row for row in report["second turns"]}
    assert first["A find_request"]["median_us"] == pytest.approx(1.2) and first["A find_request"]["blocks"] == 2
    assert second["A find_request"]["median_us"] == pytest.approx(11.2)
    assert "entry" not in second and "end copy_lists" not in first
    assert second["end copy_lists"]["max_us"] == pytest.approx(26.0)
    assert {row["point"] for row in report["owners"]} == {"entry", "A find_request", "end copy_lists"}
    # With an entry in every row, the launch ran one request per block: no turns.
    for slot in (1, 3):
        launch[slot][0] = 1_000
    assert timeline.summarise([launch], batch=4, stamped=stamped)["turns"] is False


def test_recorded_counts_are_reported_apart_from_the_times():
    timeline = load()
    points = ["entry", "helper: predicted rows", "helper: reads in and list seen"]
    stamped = timeline.Stamped(sources={}, points=points, owner_points=1, values=(1,))
    # One owner (block 0), the extra block 1, four helpers (blocks 2-5); counts are stored plus one.
    # Times in ns; a count never counts as a launch's first or last stamp.
    launch = [[1_000, 0, 0], [0, 0, 0], [1_200, 11, 21_000], [1_300, 21, 41_000], [1_100, 31, 61_000],
              [1_100, 1, 0]]
    report = timeline.summarise([launch], batch=1, stamped=stamped)
    helpers = {row["point"]: row for row in report["helpers"]}
    assert helpers["helper: predicted rows"] == {"point": "helper: predicted rows", "blocks": 4, "median": 15,
                                                 "min": 0, "max": 30}
    assert helpers["helper: reads in and list seen"]["max_us"] == pytest.approx(60.0)
    assert report["last_stamp_us"] == pytest.approx(60.0)
    relation = report["helper_rows_against_reads"]
    # Rows 10, 20, 30 against 20, 40, 60 us: the helper with no reads in is left out.
    assert relation["helpers"] == 3 and relation["correlation"] == pytest.approx(1.0)
    assert relation["median_rows"] == 20
    assert relation["reads_in_us_more_rows"] == pytest.approx(60.0)
    assert relation["reads_in_us_other_rows"] == pytest.approx(30.0)


def test_the_summary_takes_times_after_each_launchs_first_stamp_per_role():
    timeline = load()
    stamped = timeline.Stamped(sources={}, points=["entry", "D assign_misses", "helper: copied"], owner_points=2)
    # Two owners (blocks 0, 1), the extra block 2 (left out), one helper (block 3); times in ns.
    launch = [[1_000, 11_000, 0], [2_000, 13_000, 0], [500, 0, 0], [1_500, 0, 31_000]]
    later = [[block[0] + 100_000 if block[0] else 0, block[1] + 100_000 if block[1] else 0,
              block[2] + 100_000 if block[2] else 0] for block in launch]
    report = timeline.summarise([launch, later], batch=2, stamped=stamped)
    owners = {row["point"]: row for row in report["owners"]}
    assert owners["entry"]["median_us"] == pytest.approx(1.0) and owners["entry"]["blocks"] == 4
    assert owners["D assign_misses"]["min_us"] == pytest.approx(10.5)
    assert owners["D assign_misses"]["max_us"] == pytest.approx(12.5)
    assert "helper: copied" not in owners
    helpers = {row["point"]: row for row in report["helpers"]}
    assert helpers["helper: copied"]["median_us"] == pytest.approx(30.5)
    assert report["last_stamp_us"] == pytest.approx(30.5)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_the_stamped_kernel_compiles(tmp_path):
    timeline = load()
    shutil.copytree(ROOT / "cpp", tmp_path / "cpp")
    for relative, text in timeline.stamp_sources(ROOT).sources.items():
        (tmp_path / relative).write_text(text)
    result = subprocess.run(
        ["nvcc", "-std=c++17", "-O3", "--expt-relaxed-constexpr", "-arch=sm_90", "-cubin", "-Icpp/include", "-Icpp",
         "-DHISPARSE_WITH_CUDA=1", str(timeline.KERNEL), "-o", str(tmp_path / "stamped.cubin")],
        cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_launch_without_stamps_is_reported():
    timeline = load()
    stamped = timeline.Stamped(sources={}, points=["entry"], owner_points=1)
    with pytest.raises(SystemExit, match="left no stamps"):
        timeline.summarise([[[0], [0]]], batch=1, stamped=stamped)


def test_a_kept_build_is_reused_only_for_the_same_stamped_sources(tmp_path, monkeypatch):
    timeline = load()
    stamped = timeline.stamp_sources(ROOT)
    builds = []

    def fake_build(tree, work, stamped_sources):
        builds.append(work)
        for relative, text in stamped_sources.sources.items():
            (work / "src" / relative).parent.mkdir(parents=True, exist_ok=True)
            (work / "src" / relative).write_text(text)
        (work / "site").mkdir()
        return work / "site"

    monkeypatch.setattr(timeline, "build", fake_build)
    work = tmp_path / "kept"
    assert timeline.stamped_site(ROOT, work, stamped) == work / "site"
    assert timeline.stamped_site(ROOT, work, stamped) == work / "site"
    assert builds == [work], "the second run reuses the first one's build"
    changed = timeline.Stamped({**stamped.sources, str(timeline.KERNEL): "// another kernel\n"}, stamped.points,
                               stamped.owner_points)
    with pytest.raises(SystemExit, match="holds no stamped build of these sources"):
        timeline.stamped_site(ROOT, work, changed)
    assert builds == [work]


def test_each_kind_of_helper_stamp_is_written_as_its_kind_says():
    timeline = load()
    assert timeline.helper_stamp("thread 0", 3) == "timeline_stamp(p, 3);"
    assert timeline.helper_stamp("one lane", 4) == "timeline_stamp_now(p, 4);"
    assert timeline.helper_stamp("after key", 5) == "timeline_stamp_after(p, 5, key);"
    assert timeline.helper_stamp("block", 6) == "__syncthreads(); timeline_stamp(p, 6);"
    with pytest.raises(ValueError, match="unknown stamp kind"):
        timeline.helper_stamp("sometimes", 7)


def test_sweep_regions_and_launches_are_checked(capsys):
    timeline = load()
    for flag in ("--sweep-regions", "--launches"):
        with pytest.raises(SystemExit):
            timeline.parse(["32", "0.025", flag, "0"])
        assert f"{flag}: expected at least 1, got 0" in capsys.readouterr().err
    args, bench_options = timeline.parse(["32", "0.025", "--sweep-regions", "61", "--", "--context", "16384"])
    assert args.sweep_regions == 61 and bench_options == ["--context", "16384"]


def test_a_sweep_reads_the_last_swap_list_from_every_other_region():
    torch = pytest.importorskip("torch")
    timeline = load()
    rows, width, hot_rows = 16, 32, 8
    regions = [torch.full((rows, width), 10 + r, dtype=torch.uint8) for r in range(3)]
    for region in regions:
        region[:, 0] = torch.arange(rows, dtype=torch.uint8)

    class Scenario:  # the parts of bench_resolver.Scenario a sweep uses
        hot_cache = torch.zeros((hot_rows, width), dtype=torch.uint8)
        out = {"swap_host": torch.tensor([[5, 9, -1], [2, 0, 0]], dtype=torch.int32),
               "swap_device": torch.tensor([[1, 6, 3], [4, 0, 0]], dtype=torch.int32)}
        swap_counts = torch.tensor([3, 1], dtype=torch.int32)

    timeline.sweep(regions, Scenario, block_size=4)
    hot = Scenario.hot_cache
    # Every listed row arrives from the last region; the negative slot and the rows past the counts copy nothing.
    assert hot[1, 0] == 5 and hot[6, 0] == 9 and hot[4, 0] == 2
    assert (hot[[1, 6, 4], 1:] == 12).all()
    assert (hot[[0, 2, 3, 5, 7]] == 0).all()
    timeline.sweep([], Scenario, block_size=4)  # no other region: nothing to read
