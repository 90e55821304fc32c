"""bench/bench_layer_scaling.py and the DataPlane option it varies on every backend (host regions)."""
import pytest

torch = pytest.importorskip("torch")

from bench_scripts import load_bench_script  # noqa: E402

from hisparse.bench.plane import DataPlane  # noqa: E402
from hisparse.bench.presets import make_settings  # noqa: E402
from hisparse.bench.trace import generate_trace  # noqa: E402


def load():
    return load_bench_script("bench_layer_scaling")


def tiny_plane(**options):
    settings = make_settings("tiny", {})
    device = torch.device("cpu")
    trace = generate_trace(settings, device)
    return settings, trace, DataPlane(settings, trace, device, fill_layers=[0, 1, 2, 3], **options)


def test_layers_share_host_regions_and_still_see_their_rows():
    settings, trace, plane = tiny_plane(host_regions=2)
    try:
        assert plane.host_regions == 2
        assert plane.pool.nbytes == 2 * plane.layer_bytes
        pointers = [cache.data_ptr() for cache in plane.host_caches]
        assert pointers[0] == pointers[2] and pointers[1] == pointers[3] and pointers[0] != pointers[1]
        for step in range(trace.steps):
            plane.step(step)
        assert all(plane.data_matches(group) for group in range(plane.index_groups))
    finally:
        plane.close()


@pytest.mark.parametrize("regions", [0, 5, -1])
def test_host_regions_outside_one_to_the_layer_count_are_refused(regions):
    settings = make_settings("tiny", {})
    trace = generate_trace(settings, torch.device("cpu"))
    with pytest.raises(ValueError, match=rf"host_regions: expected 1 to 4 \(the layers\), got {regions}"):
        DataPlane(settings, trace, torch.device("cpu"), host_regions=regions)


def test_default_plane_gives_every_layer_its_own_host_cache():
    _, _, plane = tiny_plane()
    try:
        assert plane.host_regions == 4
        assert len({cache.data_ptr() for cache in plane.host_caches}) == 4
    finally:
        plane.close()


@pytest.mark.parametrize("argv, message", [
    (["--layers", "16,x"], "--layers: expected a comma list of integers"),
    (["--steps-per-graph", "0"], "--steps-per-graph: expected at least 1, got 0"),
    (["--replays", "0"], "--replays: expected at least 1, got 0"),
    (["--copy-stream", "mine"], "invalid choice"),
    (["--layers", "0,16"], "--layers: expected positive layer counts, got [0, 16]"),
    (["--host-regions", "0"], "--host-regions: expected at least 1, got 0"),
    (["--row-bytes", "650"], "--row-bytes: expected a multiple of 16 (rows are 16-byte aligned), got 650"),
    (["--row-bytes", "0"], "--row-bytes: expected a positive value, got 0"),
])
def test_bad_arguments_name_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit):
        load().parse_args(argv)
    assert message in capsys.readouterr().err


def test_row_bytes_default_to_none_meaning_the_presets():
    module = load()
    assert module.parse_args([]).row_bytes is None
    assert module.parse_args(["--row-bytes", "640"]).row_bytes == 640


def test_without_cuda_it_says_so(monkeypatch, capsys):
    module = load()
    monkeypatch.setattr(module.torch.cuda, "is_available", lambda: False)
    assert module.main(["--layers", "1"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("event, name", [
    ("void hisparse::cuda::(anonymous namespace)::resolve_residency_kernel<A, B, 1, (HintUpkeep)1>(P, C, L)",
     "resolve_residency_kernel"),
    ("hisparse::cuda::(anonymous namespace)::gather_row_persistent_kernel(hisparse::GatherCompactParams, int)",
     "gather_row_persistent_kernel"),
])
def test_profiled_kernels_are_named_by_their_own_name(event, name):
    assert load().kernel_name(event) == name
