"""The tensor-parallel shared-pool program (bench/bench_shared_pool_tp.py) on the CPU backend: three
processes over gloo, one shared pool, rank 0 writes rows every round and the others read them back byte for
byte; host memory is one copy of the pool. (Its CUDA form, one rank per GPU, runs on multi-GPU machines.)"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_three_ranks_read_what_rank_zero_wrote_from_one_host_copy(tmp_path):
    out = tmp_path / "tp.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "bench", "bench_shared_pool_tp.py"), "--device", "cpu", "--ranks", "3",
         "--pool-gib", "0.03125", "--rows", "300", "--rounds", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["rounds"]["wrong_bytes"] == [[], [0, 0], [0, 0]]
    assert 0.95 < result["pool"]["host_memory_over_pool"] < 1.2
    assert [r["rank"] for r in result["pool"]["per_rank"]] == [0, 1, 2]
