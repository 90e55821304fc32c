"""HISPARSE_TEST_SHARD=i/N (conftest.py): the shards scripts/gpu_check.sh runs side by side cover what -m and -k
select, each test once."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TARGET = str(HERE / "test_runtime.py")


def collected(shard, *options):
    env = dict(os.environ)
    env.pop("HISPARSE_TEST_SHARD", None)
    if shard is not None:
        env["HISPARSE_TEST_SHARD"] = shard
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             *options, TARGET], cwd=HERE.parent.parent, env=env, capture_output=True, text=True)
    return result, [line for line in result.stdout.splitlines() if "::" in line]


# Tests 0, 3 and 6 of the file: shards taken before -k would put all three in shard 0.
SELECTION = ("-k", "only_a_leader or bind_errors or overrides1")


@pytest.mark.slow
def test_the_shards_split_what_k_selected_once_each():
    _, selected = collected(None, *SELECTION)
    assert len(selected) == 3
    shards = [collected(f"{i}/3", *SELECTION)[1] for i in range(3)]
    assert sorted(sum(shards, [])) == sorted(selected)
    assert [len(shard) for shard in shards] == [1, 1, 1]


@pytest.mark.slow
@pytest.mark.parametrize("shard", ["3/3", "1", "a/2", "-1/2"])
def test_a_malformed_shard_is_refused_naming_the_variable(shard):
    result, _ = collected(shard)
    assert result.returncode != 0
    assert "HISPARSE_TEST_SHARD: expected i/N with 0 <= i < N" in result.stdout + result.stderr
