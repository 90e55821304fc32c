"""All entries and cases of the bad-input suite, and the map from each
public callable of hisparse to the entries that cover it."""

from __future__ import annotations

import functools
from typing import Dict, List

import bad_input_entries as entries
import bad_input_kv_entries as kv_entries
from bad_input_support import Case, Entry, cases_of, cuda_present, run_case

__all__ = ["all_cases", "all_entries", "run_case"]


@functools.cache
def all_entries() -> List[Entry]:
    found = (entries.ops_entries() + entries.group_entries() + entries.runtime_entries() + entries.pool_entries()
             + entries.staging_entries() + entries.misc_entries() + entries.more_entries()
             + kv_entries.all_kv_entries())
    names = [e.name for e in found]
    duplicates = {n for n in names if names.count(n) > 1}
    assert not duplicates, f"entries named twice: {duplicates}"
    return found


@functools.cache
def all_cases() -> List[Case]:
    present = cuda_present()
    out: List[Case] = []
    for entry in all_entries():
        out.extend(cases_of(entry, cuda_present=present))
    ids = [c.id for c in out]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    return out


def entries_by_name() -> Dict[str, Entry]:
    return {e.name: e for e in all_entries()}
