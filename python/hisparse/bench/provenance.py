"""Where a result comes from: the commit of the tree that made it and the command that ran.

Every benchmark JSON (``bench/bench_*.py``, ``hisparse bench``, ``hisparse
plan``) carries both at its top level, so a figure can always be traced to
the code that produced it.

The commit is, in order of preference:

1. ``HISPARSE_COMMIT`` when set (a machine that receives a working tree
   without ``.git`` cannot ask git; set it to the commit the tree was copied
   from);
2. ``git rev-parse HEAD`` of the first hisparse checkout found among the
   places the caller names, this package's own directory and the current
   directory, with ``-dirty`` appended when tracked files outside
   ``bench/results/`` differ from that commit (a result of uncommitted code
   must not claim a commit); a place the checkout does not track (a copy
   of another tree inside it) belongs to no checkout;
3. ``"unknown"``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence, Union

__all__ = ["COMMIT_ENV", "commit", "command_line", "provenance"]

COMMIT_ENV = "HISPARSE_COMMIT"

PathLike = Union[str, "os.PathLike[str]"]

# A file only a hisparse checkout has: a git tree without it is some other project.
_CHECKOUT_MARKER = Path("cpp") / "include" / "hisparse" / "hisparse.h"


def _git(directory: PathLike, *args: str) -> Optional[str]:
    """Stripped stdout of ``git -C directory args``, or None when git fails or is missing."""
    try:
        done = subprocess.run(
            ["git", "-C", os.fspath(directory), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def commit(*places: PathLike) -> str:
    """The commit of the hisparse tree that runs (see the module docstring for the order)."""
    given = os.environ.get(COMMIT_ENV, "").strip()
    if given:
        return given
    for place in [*places, Path(__file__).resolve().parent, Path.cwd()]:
        directory = Path(place)
        if directory.is_file():
            directory = directory.parent
        if not directory.is_dir():
            continue
        top = _git(directory, "rev-parse", "--show-toplevel")
        if not top or not (Path(top) / _CHECKOUT_MARKER).is_file():
            continue
        if not _git(directory, "ls-files", "--", "."):
            continue  # untracked here: its code is not the checkout's
        head = _git(top, "rev-parse", "HEAD")
        if not head:
            continue
        changed = _git(top, "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results")
        return head + "-dirty" if changed else head
    return "unknown"


def command_line(argv: Optional[Sequence[str]] = None) -> str:
    """The command as typed: ``python3 bench/bench_resolver.py ...``, ``python -m hisparse bench ...``
    or ``hisparse bench ...`` (arguments shell-quoted)."""
    argv = list(sys.argv if argv is None else argv)
    program = argv[0] if argv else ""
    python = Path(sys.executable).name or "python"
    if program.endswith("__main__.py"):
        head = [python, "-m", Path(program).parent.name]
    elif program.endswith(".py"):
        head = [python, program]
    else:
        head = [Path(program).name or python]
    return " ".join(head + [shlex.quote(arg) for arg in argv[1:]])


def provenance(*places: PathLike) -> Dict[str, str]:
    """``{"commit": ..., "command": ...}`` for the top of a result JSON."""
    return {"commit": commit(*places), "command": command_line()}
