"""HISPARSE_TEST_SHARD=i/N (conftest.py): the shards scripts/gpu_check.sh runs side by side cover what -m and -k
select, each test once.

The shards are checked on a suite of nine empty tests built for the purpose, under this directory's conftest.py
hook, so that what is selected does not depend on the machine (the suite's own files collect a CUDA case of most
tests where a GPU is present)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parent / "conftest.py"


@pytest.fixture
def nine_tests(tmp_path):
    """A directory of test_0 .. test_8, collected under this suite's collection hook."""
    (tmp_path / "conftest.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('hisparse_suite_conftest', {str(CONFTEST)!r})\n"
        "suite = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(suite)\n"
        "pytest_collection_modifyitems = suite.pytest_collection_modifyitems\n")
    (tmp_path / "test_nine.py").write_text("".join(f"def test_{i}():\n    pass\n\n\n" for i in range(9)))
    return tmp_path


def collected(directory, shard, *options):
    env = dict(os.environ)
    env.pop("HISPARSE_TEST_SHARD", None)
    if shard is not None:
        env["HISPARSE_TEST_SHARD"] = shard
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             *options, "test_nine.py"], cwd=directory, env=env, capture_output=True, text=True)
    return result, [line.split("::")[1] for line in result.stdout.splitlines() if "::" in line]


@pytest.mark.slow
def test_the_shards_split_what_k_selected_once_each(nine_tests):
    # Tests 0, 3 and 6: shards taken before -k would put all three in shard 0.
    selection = ("-k", "test_0 or test_3 or test_6")
    _, selected = collected(nine_tests, None, *selection)
    assert selected == ["test_0", "test_3", "test_6"]
    shards = [collected(nine_tests, f"{i}/3", *selection)[1] for i in range(3)]
    assert shards == [["test_0"], ["test_3"], ["test_6"]]


@pytest.mark.slow
def test_the_shards_cover_the_whole_selection_in_order(nine_tests):
    shards = [collected(nine_tests, f"{i}/4")[1] for i in range(4)]
    assert shards == [[f"test_{k}" for k in range(i, 9, 4)] for i in range(4)]


@pytest.mark.slow
@pytest.mark.parametrize("shard", ["3/3", "1", "a/2", "-1/2"])
def test_a_malformed_shard_is_refused_naming_the_variable(nine_tests, shard):
    result, _ = collected(nine_tests, shard)
    assert result.returncode != 0
    assert "HISPARSE_TEST_SHARD: expected i/N with 0 <= i < N" in result.stdout + result.stderr
