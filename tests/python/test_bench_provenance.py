"""The commit and command every benchmark JSON carries (hisparse.bench.provenance)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hisparse.bench import provenance

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(directory: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(directory), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True, text=True, check=True,
    )
    return done.stdout.strip()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A minimal hisparse-looking git checkout with one commit."""
    root = tmp_path / "checkout"
    header = root / "cpp" / "include" / "hisparse" / "hisparse.h"
    header.parent.mkdir(parents=True)
    header.write_text("/* marker */\n")
    (root / "bench" / "results").mkdir(parents=True)
    (root / "bench" / "results" / "r.json").write_text("{}\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "init")
    return root


@pytest.fixture(autouse=True)
def no_commit_override(monkeypatch):
    monkeypatch.delenv(provenance.COMMIT_ENV, raising=False)


def test_environment_variable_wins(monkeypatch, tmp_path):
    monkeypatch.setenv(provenance.COMMIT_ENV, " 0123abc ")
    assert provenance.commit(tmp_path) == "0123abc"


@needs_git
def test_head_of_a_checkout(checkout, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert provenance.commit(checkout / "bench") == git(checkout, "rev-parse", "HEAD")


@needs_git
def test_changed_tracked_files_mark_the_commit_dirty_but_results_do_not(checkout, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    head = git(checkout, "rev-parse", "HEAD")
    (checkout / "bench" / "results" / "r.json").write_text('{"new": 1}\n')
    assert provenance.commit(checkout) == head
    (checkout / "cpp" / "include" / "hisparse" / "hisparse.h").write_text("/* changed */\n")
    assert provenance.commit(checkout) == head + "-dirty"


@needs_git
def test_an_untracked_tree_inside_a_checkout_does_not_take_its_commit(checkout, monkeypatch, tmp_path):
    copy = checkout / "scratch" / "tree"
    shutil.copytree(checkout / "cpp", copy / "cpp")
    (copy / "bench").mkdir()
    monkeypatch.chdir(copy)
    assert provenance.commit(copy / "bench") != git(checkout, "rev-parse", "HEAD")
    # The checkout's own tracked places still name it.
    assert provenance.commit(checkout / "bench") == git(checkout, "rev-parse", "HEAD")


@needs_git
def test_another_git_tree_is_not_taken_for_hisparse(tmp_path, monkeypatch):
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q")
    (other / "f").write_text("x\n")
    git(other, "add", "-A")
    git(other, "commit", "-q", "-m", "init")
    monkeypatch.chdir(other)
    # The installed package is outside any checkout when tests run against a wheel; either way the
    # other tree's HEAD must never be reported.
    assert provenance.commit(other) != git(other, "rev-parse", "HEAD")


def test_outside_any_checkout_the_commit_is_unknown(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(provenance, "__file__", str(tmp_path / "provenance.py"))
    assert provenance.commit(tmp_path) == "unknown"


def test_command_line_forms(monkeypatch):
    python = Path(sys.executable).name
    assert provenance.command_line(["bench/bench_resolver.py", "--counts", "", "--out", "a b.json"]) == (
        f"{python} bench/bench_resolver.py --counts '' --out 'a b.json'"
    )
    assert provenance.command_line(["/x/site-packages/hisparse/__main__.py", "bench", "--preset", "tiny"]) == (
        f"{python} -m hisparse bench --preset tiny"
    )
    assert provenance.command_line(["/venv/bin/hisparse", "plan"]) == "hisparse plan"
    monkeypatch.setattr(sys, "argv", ["hisparse", "bench"])
    assert provenance.provenance()["command"] == "hisparse bench"


@pytest.mark.slow
def test_hisparse_plan_json_carries_commit_and_command(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "plan.json"
    env = dict(os.environ, **{provenance.COMMIT_ENV: "feedbeef"})
    proc = subprocess.run(
        [sys.executable, "-m", "hisparse", "plan", "--preset", "tiny", "--device", "cpu", "--no-progress",
         "--out", str(out)],
        capture_output=True, text=True, timeout=180, env=env,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert list(result)[:4] == ["benchmark", "schema_version", "commit", "command"]
    assert result["commit"] == "feedbeef"
    assert result["command"].endswith(f"-m hisparse plan --preset tiny --device cpu --no-progress --out {out}")
