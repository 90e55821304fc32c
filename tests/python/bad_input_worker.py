"""Runs cases of the bad-input suite (test_bad_input.py) in a process of its own.

Reads case ids from stdin, one per line, and writes per case a line
``START <id>`` before running it and ``DONE <json>`` after it, so that the
parent names the case a crash ended. Each entry's objects (and a twin that
sees only valid calls) are made once per process.
"""

from __future__ import annotations

import json
import sys
import warnings

import bad_input_catalog


def main() -> int:
    warnings.simplefilter("ignore")  # torch warns about read-only NumPy arrays and sparse tensors
    cases = {case.id: case for case in bad_input_catalog.all_cases()}
    states: dict = {}
    counts: dict = {}
    out = sys.stdout
    for line in sys.stdin:
        case_id = line.rstrip("\n")
        if not case_id:
            continue
        out.write(f"START {case_id}\n")
        out.flush()
        case = cases.get(case_id)
        if case is None:
            problem = "no such case"
        else:
            entry = case.entry
            try:
                if entry.name not in states:
                    states[entry.name] = (entry.setup(), entry.setup())
                problem = bad_input_catalog.run_case(case, *states[entry.name], 2 * counts.get(entry.name, 0))
            except Exception as error:  # noqa: BLE001 - a broken setup fails its cases, not the worker
                problem = f"setup failed: {type(error).__name__}: {error}"
            if problem is not None:
                states.pop(entry.name, None)  # a failed case may have left the objects apart from their twin
            counts[entry.name] = counts.get(entry.name, 0) + 1
        out.write("DONE " + json.dumps({"id": case_id, "problem": problem}) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
