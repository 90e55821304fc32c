"""An independent model of residency resolution, written from docs/residency.md.

It exists so the tests have a second opinion that shares no code with the
C++ reference or the CUDA kernel: plain Python over lists, one function per
numbered section of the document, in the document's words. Speed does not
matter here; readability does.

Inputs are NumPy arrays (or anything ``np.asarray`` accepts) and ints, the
same as hisparse.ops.resolve_residency takes, minus the preallocated
outputs. The model returns every output, the new state and the counter
deltas; the inputs are never modified.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

INT32_MAX = 2**31 - 1

# Counter indices (docs/residency.md, section 8).
LOOKUPS, HITS, MISSES, RESIDENT, INVALID = range(5)

# Token row states (section "Token rows of a request").
ORPHAN, PADDING, REJECTED, ACTIVE = "orphan", "padding", "rejected", "active"


@dataclass
class ModelResult:
    """Everything one call produces. [T, K] arrays hold the first T rows.

    Swap entries that the op leaves untouched hold ``swap_fill``.
    """

    attention: np.ndarray
    hot_rows: np.ndarray
    resolved: np.ndarray
    miss_mask: np.ndarray
    valid_counts: np.ndarray
    swap_host_rows: np.ndarray
    swap_device_rows: np.ndarray
    swap_counts: np.ndarray
    device_global_indices: np.ndarray
    lru_slots: np.ndarray
    stats: np.ndarray  # int64 [5] increments of this call
    row_states: List[str] = field(default_factory=list)


@dataclass
class _Entry:
    kind: str  # "invalid", "resident" or "hot"
    g: int = -1  # host slot
    resident_row: int = -1


def _table(array) -> Optional[List[List[int]]]:
    return None if array is None else np.asarray(array).astype(np.int64).tolist()


def resolve_residency(
    topk_indices,
    req_id_per_token,
    request_state_indices,
    device_global_indices,
    lru_slots,
    hot_block_table,
    *,
    hot_block_size: int,
    attention_block_stride: int,
    host_rows: int,
    max_union_rows: int,
    source_block_table=None,
    block_size: int = 0,
    resident_block_table=None,
    resident_block_size: int = 0,
    num_valid_rows: Optional[int] = None,
    swap_fill: int = -1,
) -> ModelResult:
    topk = _table(topk_indices)
    T = len(topk)
    K = np.asarray(topk_indices).shape[1]
    req = np.asarray(req_id_per_token).astype(np.int64).tolist()[:T]
    state_of = np.asarray(request_state_indices).astype(np.int64).tolist()
    B = len(state_of)
    dgi = _table(device_global_indices)
    lru = _table(lru_slots)
    S, H = np.asarray(device_global_indices).shape
    hot_table = _table(hot_block_table)
    source = _table(source_block_table)
    resident = _table(resident_block_table)

    def addr(row: int) -> int:
        return (row // hot_block_size) * attention_block_stride + row % hot_block_size

    out = {
        name: [[fill] * K for _ in range(T)]
        for name, fill in [
            ("attention", -1),
            ("hot_rows", -1),
            ("resolved", -1),
            ("miss_mask", 0),
            ("swap_host_rows", swap_fill),
            ("swap_device_rows", swap_fill),
        ]
    }
    valid_counts = [0] * T
    swap_counts = [0] * T
    stats = [0] * 5

    # Token rows of a request.
    T_eff = T if num_valid_rows is None else min(max(int(num_valid_rows), 0), T)
    row_states = [ORPHAN] * T
    rows_of = {b: [t for t in range(T_eff) if req[t] == b] for b in range(B)}

    active_requests = []
    for b in range(B):
        rows = rows_of[b]
        if not rows:
            continue
        s = state_of[b]
        if s < 0:
            state = PADDING
        elif s >= S or s in state_of[:b] or rows[-1] - rows[0] + 1 != len(rows):
            state = REJECTED
        else:
            state = ACTIVE
            active_requests.append((b, s, rows[0], len(rows)))
        for t in rows:
            row_states[t] = state
        if state == REJECTED:
            stats[LOOKUPS] += K * len(rows)
            stats[INVALID] += K * len(rows)
    # Orphan, padding and rejected rows keep the -1 / 0 they were given above.

    for b, s, t0, q in active_requests:
        state_dgi = dgi[s]
        state_lru = lru[s]

        # 1. Classify every entry, in order e = (t - t0) * K + k.
        def classify(p: int) -> _Entry:
            if p < 0:
                return _Entry("invalid")
            if source is not None:
                blk = p // block_size
                if blk >= len(source[b]):
                    return _Entry("invalid")
                h = source[b][blk]
                if h <= 0:
                    return _Entry("invalid")
                g = h * block_size + p % block_size
            else:
                g = p
            if g >= host_rows:
                return _Entry("invalid")
            if resident is not None and p // resident_block_size < len(resident[b]):
                r = resident[b][p // resident_block_size]
                if r > 0:
                    row = r * resident_block_size + p % resident_block_size
                    if addr(row) > INT32_MAX:
                        return _Entry("invalid")
                    return _Entry("resident", g, row)
            return _Entry("hot", g)

        entries = [classify(topk[t0 + e // K][e % K]) for e in range(q * K)]

        # 2. The union: distinct hot-candidate slots in first-occurrence order.
        candidates = {}  # an insertion-ordered set
        for entry in entries:
            if entry.kind == "hot" and entry.g not in candidates:
                candidates[entry.g] = None
        U = list(candidates)[:max_union_rows]
        rank = {g: i for i, g in enumerate(U)}
        for entry in entries:
            if entry.kind == "hot" and entry.g not in rank:
                entry.kind = "invalid"  # overflow

        # 3. Usable slots.
        occurrences = Counter(state_lru)

        def physical_row(j: int) -> int:
            return hot_table[b][j // hot_block_size] * hot_block_size + j % hot_block_size

        def usable(j: int) -> bool:
            if not (0 <= j < H) or occurrences[j] != 1:
                return False
            if hot_table[b][j // hot_block_size] < 0:
                return False
            return physical_row(j) <= INT32_MAX and addr(physical_row(j)) <= INT32_MAX

        # 4. Hits and evictable positions.
        E: List[int] = []
        P: List[int] = []
        slot_of = {}  # member -> the slot serving it
        for i in range(H):
            j = state_lru[i]
            if usable(j) and state_dgi[j] in rank:
                P.append(i)
                slot_of[state_dgi[j]] = j  # the last hit position wins
            else:
                E.append(i)
        hits = set(slot_of)

        # 5. Misses.
        M = [g for g in U if g not in hits]
        assigned: List[int] = []  # in rank order
        for m, g in enumerate(M):
            if m < len(E) and usable(state_lru[E[m]]):
                j = state_lru[E[m]]
                state_dgi[j] = g
                slot_of[g] = j
                assigned.append(g)
            # else: dropped, its entries become invalid below.

        # 6. New LRU order.
        n = min(len(M), len(E))
        old = list(state_lru)
        state_lru[:] = [old[i] for i in E[n:]] + [old[i] for i in E[:n]] + [old[i] for i in P]

        # 7. Outputs of active rows.
        first_seen = set()
        for e, entry in enumerate(entries):
            t, k = t0 + e // K, e % K
            if entry.kind == "resident":
                row, miss = entry.resident_row, 0
                stats[RESIDENT] += 1
            elif entry.kind == "hot" and entry.g in slot_of:
                row = physical_row(slot_of[entry.g])
                miss = int(entry.g not in hits and entry.g not in first_seen)
                first_seen.add(entry.g)
            else:  # invalid, overflow or dropped
                row, miss = -1, 0
            out["hot_rows"][t][k] = row
            out["attention"][t][k] = -1 if row < 0 else addr(row)
            out["resolved"][t][k] = -1 if row < 0 else entry.g
            out["miss_mask"][t][k] = miss
            if row >= 0:
                valid_counts[t] += 1
            else:
                stats[INVALID] += 1
        for r in range(q):
            row_states[t0 + r] = ACTIVE

        for m, g in enumerate(assigned):
            t, k = t0 + m // K, m % K
            out["swap_host_rows"][t][k] = g
            out["swap_device_rows"][t][k] = physical_row(slot_of[g])
            swap_counts[t] += 1

        # 8. Counters.
        stats[LOOKUPS] += q * K
        stats[HITS] += len(hits)
        stats[MISSES] += len(assigned)

    def int32(rows) -> np.ndarray:
        return np.array(rows, dtype=np.int32).reshape(-1, K) if rows else np.zeros((0, K), np.int32)

    return ModelResult(
        attention=int32(out["attention"]),
        hot_rows=int32(out["hot_rows"]),
        resolved=int32(out["resolved"]),
        miss_mask=int32(out["miss_mask"]),
        valid_counts=np.array(valid_counts, dtype=np.int32),
        swap_host_rows=int32(out["swap_host_rows"]),
        swap_device_rows=int32(out["swap_device_rows"]),
        swap_counts=np.array(swap_counts, dtype=np.int32),
        device_global_indices=np.array(dgi, dtype=np.int32).reshape(S, H),
        lru_slots=np.array(lru, dtype=np.int16).reshape(S, H),
        stats=np.array(stats, dtype=np.int64),
        row_states=row_states,
    )
