"""Semantics of hisparse.ops.resolve_residency (docs/residency.md).

Every call goes through ``resolve``: it runs the op on the test's device,
and on CUDA also runs the CPU backend on copies of the same inputs and
requires the same bits; then it requires the independent model
(residency_model.py) to agree on every output, the new state and the
counters. Hand cases additionally spell out the expected tensors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pytest

import residency_model as model
from conftest import cuda_available, requires_cuda

torch = pytest.importorskip("torch")
hisparse = pytest.importorskip("hisparse")
from hisparse import ops  # noqa: E402

# What preallocated outputs hold before a call: whatever still holds it
# afterwards was left untouched by the op.
SENTINEL = -77
CPU = torch.device("cpu")

OUTPUT_MATRICES = ("attention", "hot_rows", "resolved", "miss_mask", "swap_host_rows", "swap_device_rows")
OUTPUT_VECTORS = ("valid_counts", "swap_counts")


# ----------------------------------------------------------------- harness


@dataclass
class Problem:
    """One call's inputs as NumPy arrays, plus layout knobs of the buffers."""

    topk: np.ndarray
    req_id_per_token: np.ndarray
    request_state_indices: np.ndarray
    device_global_indices: np.ndarray
    lru_slots: np.ndarray
    hot_block_table: np.ndarray
    hot_block_size: int = 1
    attention_block_stride: Optional[int] = None  # None: hot_block_size
    host_rows: int = 1 << 20
    max_union_rows: Optional[int] = None  # None: H
    source_block_table: Optional[np.ndarray] = None
    block_size: int = 0
    resident_block_table: Optional[np.ndarray] = None
    resident_block_size: Optional[int] = None  # None: hot_block_size
    num_valid_rows: Optional[int] = None
    stats: Optional[np.ndarray] = None
    # Layout: output rows past T, padding columns in every [rows, K] output
    # and in topk, padding columns in the block tables (row stride > width).
    extra_rows: int = 0
    pad_columns: int = 0
    table_pad: int = 0

    @property
    def T(self) -> int:
        return self.topk.shape[0]

    @property
    def K(self) -> int:
        return self.topk.shape[1]

    @property
    def H(self) -> int:
        return self.device_global_indices.shape[1]

    def scalars(self) -> dict:
        return dict(
            hot_block_size=self.hot_block_size,
            attention_block_stride=(
                self.hot_block_size if self.attention_block_stride is None else self.attention_block_stride
            ),
            host_rows=self.host_rows,
            max_union_rows=self.H if self.max_union_rows is None else self.max_union_rows,
        )

    def optional_scalars(self) -> dict:
        return dict(
            block_size=self.block_size,
            resident_block_size=(
                self.hot_block_size if self.resident_block_size is None else self.resident_block_size
            ),
        )


@dataclass
class Outcome:
    """What a call left in its buffers, as NumPy arrays."""

    buffers: dict  # name -> full output buffer, padding included
    T: int
    K: int
    device_global_indices: np.ndarray
    lru_slots: np.ndarray
    stats: Optional[np.ndarray]

    def __getattr__(self, name):
        if name in OUTPUT_MATRICES:
            return self.buffers[name][: self.T, : self.K]
        if name in OUTPUT_VECTORS:
            return self.buffers[name][: self.T]
        raise AttributeError(name)


def _i32(array) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(array, dtype=np.int32))


def _on(array: np.ndarray, device, pad: int = 0):
    """A torch copy of a 2-D array on `device`; with pad > 0 a view whose row stride is wider."""
    # Not torch.from_numpy alone: it gives empty arrays all-zero strides.
    source = torch.from_numpy(np.ascontiguousarray(array).copy())
    if pad == 0 or source.dim() != 2:
        return torch.empty(source.shape, dtype=source.dtype, device=device).copy_(source)
    rows, columns = source.shape
    wide = torch.full((rows, columns + pad), SENTINEL, dtype=source.dtype, device=device)
    wide[:, :columns] = source
    return wide[:, :columns]


def run_op(problem: Problem, device) -> Outcome:
    T, K = problem.T, problem.K
    rows = T + problem.extra_rows
    buffers = {
        name: torch.full((rows, K + problem.pad_columns), SENTINEL, dtype=torch.int32, device=device)
        for name in OUTPUT_MATRICES
    }
    buffers.update({name: torch.full((rows,), SENTINEL, dtype=torch.int32, device=device) for name in OUTPUT_VECTORS})
    dgi = _on(_i32(problem.device_global_indices), device)
    lru = _on(np.asarray(problem.lru_slots, dtype=np.int16), device)
    stats = None if problem.stats is None else _on(np.asarray(problem.stats, dtype=np.int64), device)
    optional = {}
    if problem.source_block_table is not None:
        optional["source_block_table"] = _on(_i32(problem.source_block_table), device, problem.table_pad)
    if problem.resident_block_table is not None:
        optional["resident_block_table"] = _on(_i32(problem.resident_block_table), device, problem.table_pad)
    if problem.num_valid_rows is not None:
        optional["num_valid_rows"] = _on(_i32([problem.num_valid_rows]), device)
    ops.resolve_residency(
        _on(_i32(problem.topk).reshape(T, K), device, problem.pad_columns),
        _on(_i32(problem.req_id_per_token), device),
        _on(_i32(problem.request_state_indices), device),
        dgi,
        lru,
        _on(_i32(problem.hot_block_table), device, problem.table_pad),
        **problem.scalars(),
        **{f"out_{name}": buffers[name][:, :K] for name in OUTPUT_MATRICES},
        **{f"out_{name}": buffers[name] for name in OUTPUT_VECTORS},
        **optional,
        **problem.optional_scalars(),
        stats=stats,
    )
    return Outcome(
        buffers={name: tensor.cpu().numpy() for name, tensor in buffers.items()},
        T=T,
        K=K,
        device_global_indices=dgi.cpu().numpy(),
        lru_slots=lru.cpu().numpy(),
        stats=None if stats is None else stats.cpu().numpy(),
    )


def run_model(problem: Problem) -> model.ModelResult:
    return model.resolve_residency(
        problem.topk.reshape(problem.T, problem.K),
        problem.req_id_per_token,
        problem.request_state_indices,
        problem.device_global_indices,
        problem.lru_slots,
        problem.hot_block_table,
        **problem.scalars(),
        source_block_table=problem.source_block_table,
        block_size=problem.block_size,
        resident_block_table=problem.resident_block_table,
        resident_block_size=problem.optional_scalars()["resident_block_size"],
        num_valid_rows=problem.num_valid_rows,
        swap_fill=SENTINEL,
    )


def assert_equal(got, want, err_msg: str) -> None:
    # np.array_equal first: the sweep compares ~20 arrays per step, and the
    # full assertion is only needed to explain a mismatch.
    if not np.array_equal(got, want):
        np.testing.assert_array_equal(got, want, err_msg=err_msg)


def assert_same_bits(got: Outcome, want: Outcome, context: str) -> None:
    for name in OUTPUT_MATRICES + OUTPUT_VECTORS:
        assert_equal(got.buffers[name], want.buffers[name], err_msg=f"{context}: {name}")
    assert_equal(got.device_global_indices, want.device_global_indices, err_msg=f"{context}: dgi")
    assert_equal(got.lru_slots, want.lru_slots, err_msg=f"{context}: lru_slots")
    if want.stats is not None:
        assert_equal(got.stats, want.stats, err_msg=f"{context}: stats")


def assert_matches_model(problem: Problem, got: Outcome, want: model.ModelResult, context: str) -> None:
    T, K = problem.T, problem.K
    for name in OUTPUT_MATRICES:
        buffer = got.buffers[name]
        if name.startswith("swap_"):
            # The swap list up to swap_counts first, so a wrong list reads as such ...
            for t in range(T):
                n = want.swap_counts[t]
                assert_equal(
                    buffer[t, :n], getattr(want, name)[t, :n], err_msg=f"{context}: {name} row {t}"
                )
        # ... then every cell, which also pins the ones the op must leave untouched.
        assert_equal(buffer[:T, :K], getattr(want, name), err_msg=f"{context}: {name}")
        assert (buffer[T:] == SENTINEL).all(), f"{context}: {name} written past row T"
        assert (buffer[:, K:] == SENTINEL).all(), f"{context}: {name} written past column K"
    for name in OUTPUT_VECTORS:
        assert_equal(got.buffers[name][:T], getattr(want, name), err_msg=f"{context}: {name}")
        assert (got.buffers[name][T:] == SENTINEL).all(), f"{context}: {name} written past row T"
    assert_equal(got.device_global_indices, want.device_global_indices, err_msg=f"{context}: dgi")
    assert_equal(got.lru_slots, want.lru_slots, err_msg=f"{context}: lru_slots")
    if problem.stats is not None:
        assert_equal(got.stats[:5], problem.stats[:5] + want.stats, err_msg=f"{context}: stats")
        assert_equal(got.stats[5:], problem.stats[5:], err_msg=f"{context}: stats past 5")


def resolve(problem: Problem, device, context: str = "") -> Outcome:
    """Run on `device`, cross-check CUDA against CPU and everything against the model."""
    got = run_op(problem, device)
    if device.type == "cuda":
        assert_same_bits(got, run_op(problem, CPU), f"{context} cuda vs cpu")
    assert_matches_model(problem, got, run_model(problem), f"{context} vs model")
    return got


def advance(problem: Problem, outcome: Outcome, **changes) -> Problem:
    """The next step: the state (and counters) the op left, with new inputs."""
    return dataclasses.replace(
        problem,
        device_global_indices=outcome.device_global_indices.copy(),
        lru_slots=outcome.lru_slots.copy(),
        stats=None if outcome.stats is None else outcome.stats.copy(),
        **changes,
    )


def cold_state(S: int, H: int):
    return np.full((S, H), -1, np.int32), np.tile(np.arange(H, dtype=np.int16), (S, 1))


def identity_hot_table(B: int, H: int, hot_block_size: int = 1) -> np.ndarray:
    blocks = -(-H // hot_block_size)
    return np.tile(np.arange(blocks, dtype=np.int32), (B, 1))


def single_request(topk, H: int, **kwargs) -> Problem:
    """One request (batch row 0, state row 0) over all token rows of `topk`, cold state."""
    topk = _i32(topk)
    dgi, lru = cold_state(1, H)
    kwargs.setdefault("hot_block_table", identity_hot_table(1, H, kwargs.get("hot_block_size", 1)))
    kwargs.setdefault("stats", np.zeros(5, np.int64))
    return Problem(
        topk=topk,
        req_id_per_token=np.zeros(topk.shape[0], np.int32),
        request_state_indices=_i32([0]),
        device_global_indices=dgi,
        lru_slots=lru,
        **kwargs,
    )


def untouched(shape) -> np.ndarray:
    return np.full(shape, SENTINEL, np.int32)


# ----------------------------------------------------------------- hand cases


@pytest.mark.parametrize("k", [1, 31, 32, 33, 63, 64, 65, 128, 2048])
def test_cold_start_fills_in_lru_order_then_fixed_point(device, k):
    H = 2 * k
    positions = 3 * np.arange(k, dtype=np.int32)[::-1] + 1  # distinct, descending
    problem = single_request(positions[None, :], H, max_union_rows=k)
    out = resolve(problem, device, f"cold k={k}")

    slots = np.arange(k, dtype=np.int32)
    np.testing.assert_array_equal(out.hot_rows[0], slots)
    np.testing.assert_array_equal(out.attention[0], slots)
    np.testing.assert_array_equal(out.resolved[0], positions)
    np.testing.assert_array_equal(out.miss_mask[0], np.ones(k, np.int32))
    np.testing.assert_array_equal(out.valid_counts, [k])
    np.testing.assert_array_equal(out.swap_counts, [k])
    np.testing.assert_array_equal(out.swap_host_rows[0], positions)
    np.testing.assert_array_equal(out.swap_device_rows[0], slots)
    np.testing.assert_array_equal(out.device_global_indices[0], np.concatenate([positions, np.full(k, -1)]))
    np.testing.assert_array_equal(out.lru_slots[0], np.concatenate([np.arange(k, H), np.arange(k)]))
    np.testing.assert_array_equal(out.stats, [k, 0, k, 0, 0])

    again = resolve(advance(problem, out), device, f"fixed point k={k}")
    np.testing.assert_array_equal(again.device_global_indices, out.device_global_indices)
    np.testing.assert_array_equal(again.lru_slots, out.lru_slots)
    np.testing.assert_array_equal(again.hot_rows, out.hot_rows)
    np.testing.assert_array_equal(again.attention, out.attention)
    np.testing.assert_array_equal(again.resolved, out.resolved)
    np.testing.assert_array_equal(again.miss_mask, np.zeros((1, k), np.int32))
    np.testing.assert_array_equal(again.valid_counts, [k])
    np.testing.assert_array_equal(again.swap_counts, [0])
    np.testing.assert_array_equal(again.swap_host_rows, untouched((1, k)))
    np.testing.assert_array_equal(again.swap_device_rows, untouched((1, k)))
    np.testing.assert_array_equal(again.stats, [2 * k, k, k, 0, 0])


def test_fixed_point_with_a_different_order_of_the_same_positions(device):
    problem = single_request([[10, 11, 12, 13]], 8)
    out = resolve(problem, device)
    again = resolve(advance(problem, out, topk=_i32([[13, 11, 10, 12]])), device)
    np.testing.assert_array_equal(again.hot_rows, [[3, 1, 0, 2]])
    np.testing.assert_array_equal(again.miss_mask, [[0, 0, 0, 0]])
    np.testing.assert_array_equal(again.swap_counts, [0])
    np.testing.assert_array_equal(again.lru_slots, out.lru_slots)
    np.testing.assert_array_equal(again.device_global_indices, out.device_global_indices)


def test_partial_overlap_evicts_oldest_first(device):
    H = 6
    problem = single_request([[10, 11, 12]], H)
    out = resolve(problem, device, "step 1")
    np.testing.assert_array_equal(out.lru_slots, [[3, 4, 5, 0, 1, 2]])

    out = resolve(problem := advance(problem, out, topk=_i32([[20, 21, 22]])), device, "step 2")
    np.testing.assert_array_equal(out.hot_rows, [[3, 4, 5]])
    np.testing.assert_array_equal(out.lru_slots, [[0, 1, 2, 3, 4, 5]])
    np.testing.assert_array_equal(out.device_global_indices, [[10, 11, 12, 20, 21, 22]])

    # LRU 0..5 holding 10 11 12 20 21 22: 11 and 22 hit, 30 takes the oldest
    # evictable slot (0, holding 10); new order E[1:], E[:1], hits.
    out = resolve(problem := advance(problem, out, topk=_i32([[22, 30, 11]])), device, "step 3")
    np.testing.assert_array_equal(out.hot_rows, [[5, 0, 1]])
    np.testing.assert_array_equal(out.attention, [[5, 0, 1]])
    np.testing.assert_array_equal(out.resolved, [[22, 30, 11]])
    np.testing.assert_array_equal(out.miss_mask, [[0, 1, 0]])
    np.testing.assert_array_equal(out.valid_counts, [3])
    np.testing.assert_array_equal(out.swap_counts, [1])
    np.testing.assert_array_equal(out.swap_host_rows, [[30, SENTINEL, SENTINEL]])
    np.testing.assert_array_equal(out.swap_device_rows, [[0, SENTINEL, SENTINEL]])
    np.testing.assert_array_equal(out.device_global_indices, [[30, 11, 12, 20, 21, 22]])
    np.testing.assert_array_equal(out.lru_slots, [[2, 3, 4, 0, 1, 5]])
    np.testing.assert_array_equal(out.stats, [9, 2, 7, 0, 0])

    # LRU 2 3 4 0 1 5: 12 (slot 2) hits although it is the oldest; 40 and 41
    # evict the two oldest others, 20 (slot 3) and 21 (slot 4).
    out = resolve(problem := advance(problem, out, topk=_i32([[40, 41, 12]])), device, "step 4")
    np.testing.assert_array_equal(out.hot_rows, [[3, 4, 2]])
    np.testing.assert_array_equal(out.miss_mask, [[1, 1, 0]])
    np.testing.assert_array_equal(out.swap_host_rows, [[40, 41, SENTINEL]])
    np.testing.assert_array_equal(out.swap_device_rows, [[3, 4, SENTINEL]])
    np.testing.assert_array_equal(out.device_global_indices, [[30, 11, 12, 40, 41, 22]])
    np.testing.assert_array_equal(out.lru_slots, [[0, 1, 5, 3, 4, 2]])
    np.testing.assert_array_equal(out.stats, [12, 3, 9, 0, 0])


def test_duplicates_across_speculative_rows_share_one_slot(device):
    problem = single_request([[5, 6, 5], [6, 7, -1], [7, 5, 8]], 8)
    out = resolve(problem, device)
    np.testing.assert_array_equal(out.hot_rows, [[0, 1, 0], [1, 2, -1], [2, 0, 3]])
    np.testing.assert_array_equal(out.attention, [[0, 1, 0], [1, 2, -1], [2, 0, 3]])
    np.testing.assert_array_equal(out.resolved, [[5, 6, 5], [6, 7, -1], [7, 5, 8]])
    np.testing.assert_array_equal(out.miss_mask, [[1, 1, 0], [0, 1, 0], [0, 0, 1]])
    np.testing.assert_array_equal(out.valid_counts, [3, 2, 3])
    # Four misses packed K = 3 per row from the request's first row.
    np.testing.assert_array_equal(out.swap_counts, [3, 1, 0])
    np.testing.assert_array_equal(out.swap_host_rows, [[5, 6, 7], [8, SENTINEL, SENTINEL], untouched(3)])
    np.testing.assert_array_equal(out.swap_device_rows, [[0, 1, 2], [3, SENTINEL, SENTINEL], untouched(3)])
    np.testing.assert_array_equal(out.lru_slots, [[4, 5, 6, 7, 0, 1, 2, 3]])
    np.testing.assert_array_equal(out.stats, [9, 0, 4, 0, 1])


def test_resident_pages_take_no_slot(device):
    # Pages of 4 positions; page 1 (positions 4..7) is resident in block 7.
    problem = single_request(
        [[1, 5, 9, 6, 1]],
        8,
        hot_block_size=4,
        attention_block_stride=10,
        hot_block_table=_i32([[3, 5]]),
        resident_block_table=_i32([[0, 7, 0]]),
    )
    out = resolve(problem, device)
    np.testing.assert_array_equal(out.hot_rows, [[12, 29, 13, 30, 12]])
    np.testing.assert_array_equal(out.attention, [[30, 71, 31, 72, 30]])
    np.testing.assert_array_equal(out.resolved, [[1, 5, 9, 6, 1]])
    np.testing.assert_array_equal(out.miss_mask, [[1, 0, 1, 0, 0]])
    np.testing.assert_array_equal(out.valid_counts, [5])
    np.testing.assert_array_equal(out.swap_counts, [2])
    np.testing.assert_array_equal(out.swap_host_rows, [[1, 9] + [SENTINEL] * 3])
    np.testing.assert_array_equal(out.swap_device_rows, [[12, 13] + [SENTINEL] * 3])
    np.testing.assert_array_equal(out.device_global_indices, [[1, 9, -1, -1, -1, -1, -1, -1]])
    np.testing.assert_array_equal(out.stats, [5, 0, 2, 2, 0])


def test_resident_table_narrower_than_positions_and_nonpositive_blocks(device):
    # Page 0 resident (block 2); page 1 has block -3 (not resident); page 2 is past the table.
    problem = single_request(
        [[0, 5, 9]], 4, hot_block_size=4, resident_block_table=_i32([[2, -3]]), hot_block_table=_i32([[1]])
    )
    out = resolve(problem, device)
    np.testing.assert_array_equal(out.hot_rows, [[8, 4, 5]])
    np.testing.assert_array_equal(out.miss_mask, [[0, 1, 1]])
    np.testing.assert_array_equal(out.stats, [3, 0, 2, 1, 0])


def test_resident_table_with_a_source_table_resolves_pages_by_position(device):
    # Resident pages are looked up by request position p, and the entry must
    # still map to a valid host slot g (which out_resolved reports).
    problem = single_request(
        [[1, 6, 9]],
        4,
        hot_block_size=4,
        source_block_table=_i32([[2, 0, 3]]),
        block_size=4,
        resident_block_table=_i32([[5, 5, 0]]),
        host_rows=14,
    )
    out = resolve(problem, device)
    # 1 -> g 9, resident row 21; 6 -> null source block: invalid although resident;
    # 9 -> g 13, page 2 not resident -> hot slot 0.
    np.testing.assert_array_equal(out.hot_rows, [[21, -1, 0]])
    np.testing.assert_array_equal(out.resolved, [[9, -1, 13]])
    np.testing.assert_array_equal(out.stats, [3, 0, 1, 1, 1])


def test_invalid_entries_are_counted(device):
    # block_size 4; source row: block 0 null, 1 -> 3, 2 -> -2, 3 -> 5; W = 4.
    problem = single_request(
        [[-1, 2, 5, 9, 13, 14, 17, -5]],
        8,
        source_block_table=_i32([[0, 3, -2, 5]]),
        block_size=4,
        host_rows=22,
        table_pad=3,
    )
    out = resolve(problem, device)
    # 5 -> g 13; 13 -> g 21; 14 -> g 22 >= host_rows; 17 -> block 4 past the table.
    np.testing.assert_array_equal(out.resolved, [[-1, -1, 13, -1, 21, -1, -1, -1]])
    np.testing.assert_array_equal(out.hot_rows, [[-1, -1, 0, -1, 1, -1, -1, -1]])
    np.testing.assert_array_equal(out.attention, [[-1, -1, 0, -1, 1, -1, -1, -1]])
    np.testing.assert_array_equal(out.miss_mask, [[0, 0, 1, 0, 1, 0, 0, 0]])
    np.testing.assert_array_equal(out.valid_counts, [2])
    np.testing.assert_array_equal(out.swap_host_rows, [[13, 21] + [SENTINEL] * 6])
    np.testing.assert_array_equal(out.stats, [8, 0, 2, 0, 6])


def test_a_source_table_of_no_columns_makes_every_entry_invalid(device):
    # A table of width 0 is a table: every block lies past it. (torch gives a
    # tensor of no elements a null data pointer; it must not read as "no table",
    # under which positions would be host slots.)
    problem = single_request([[0, 3, 5]], 4, source_block_table=np.zeros((1, 0), np.int32), block_size=4,
                             host_rows=100)
    out = resolve(problem, device)
    np.testing.assert_array_equal(out.resolved, [[-1, -1, -1]])
    np.testing.assert_array_equal(out.swap_counts, [0])
    np.testing.assert_array_equal(out.stats, [3, 0, 0, 0, 3])


def _one_row_call(dgi, lru, **kwargs) -> dict:
    """resolve_residency of top-k [[1, 2]] for batch row 0 (state row 0) over NumPy arrays; its outputs."""
    out = {name: np.full((1, 2), SENTINEL, np.int32) for name in OUTPUT_MATRICES}
    out.update({name: np.full((1,), SENTINEL, np.int32) for name in OUTPUT_VECTORS})
    ops.resolve_residency(_i32([[1, 2]]), _i32([0]), _i32([0]), dgi, lru, np.zeros((1, 4), np.int32), hot_block_size=1,
                          attention_block_stride=1, host_rows=10, max_union_rows=4,
                          **{f"out_{name}": array for name, array in out.items()}, **kwargs)
    return out


def test_a_gather_schedule_without_the_fused_gather_is_refused():
    dgi, lru = cold_state(1, 4)
    with pytest.raises(ValueError, match="gather_schedule: 'fused' schedules the fused gather"):
        _one_row_call(dgi, lru, gather_schedule="fused")
    np.testing.assert_array_equal(dgi, cold_state(1, 4)[0])


@pytest.mark.parametrize("table", ["source_block_table", "resident_block_table"])
def test_the_torch_baseline_agrees_on_tables_of_no_columns(table):
    from hisparse.baseline import resolve_residency_torch

    tables = ({"source_block_table": np.zeros((1, 0), np.int32), "block_size": 1} if table == "source_block_table"
              else {"resident_block_table": np.zeros((1, 0), np.int32), "resident_block_size": 1})
    dgi, lru = cold_state(1, 4)
    want = _one_row_call(dgi.copy(), lru.copy(), **tables)
    got = {name: torch.full(array.shape, SENTINEL, dtype=torch.int32) for name, array in want.items()}
    torch_dgi, torch_lru = torch.from_numpy(dgi.copy()), torch.from_numpy(lru.copy())
    resolve_residency_torch(torch.tensor([[1, 2]], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
                            torch.tensor([0], dtype=torch.int32), torch_dgi, torch_lru,
                            torch.zeros((1, 4), dtype=torch.int32), hot_block_size=1, attention_block_stride=1,
                            host_rows=10, max_union_rows=4, **{f"out_{name}": t for name, t in got.items()},
                            **{name: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                               for name, v in tables.items()})
    for name, array in want.items():
        np.testing.assert_array_equal(got[name].numpy(), array, err_msg=name)


def test_an_empty_state_of_zero_strides_is_accepted():
    # NumPy gives arrays of no elements zero strides; S = 0 state rows reject
    # the request (state index 0 is out of range) instead of the call.
    out = _one_row_call(np.zeros((0, 4), np.int32), np.zeros((0, 4), np.int16))
    np.testing.assert_array_equal(out["resolved"], [[-1, -1]])
    np.testing.assert_array_equal(out["valid_counts"], [0])


def test_host_rows_bound_without_source_table(device):
    problem = single_request([[0, 9, 10, 11]], 4, host_rows=10)
    out = resolve(problem, device)
    np.testing.assert_array_equal(out.resolved, [[0, 9, -1, -1]])
    np.testing.assert_array_equal(out.stats, [4, 0, 2, 0, 2])
    empty = resolve(single_request([[0, 1]], 4, host_rows=0), device)
    np.testing.assert_array_equal(empty.attention, [[-1, -1]])
    np.testing.assert_array_equal(empty.device_global_indices, [[-1] * 4])


def test_padding_rows_write_minus_one_and_leave_state(device):
    dgi = _i32([[7, 8, -1, -1], [30, 31, 32, 33]])
    lru = np.array([[2, 3, 0, 1], [3, 1, 2, 0]], np.int16)
    problem = Problem(
        topk=_i32([[7, 9], [30, 8]]),
        req_id_per_token=_i32([1, 0]),
        request_state_indices=_i32([-1, 0]),
        device_global_indices=dgi,
        lru_slots=lru,
        hot_block_table=identity_hot_table(2, 4),
        stats=np.zeros(5, np.int64),
        extra_rows=2,
        pad_columns=1,
    )
    out = resolve(problem, device)
    # Row 1 (batch row 0) is padding; row 0 is batch row 1 on state row 0.
    np.testing.assert_array_equal(out.attention[1], [-1, -1])
    np.testing.assert_array_equal(out.hot_rows[1], [-1, -1])
    np.testing.assert_array_equal(out.resolved[1], [-1, -1])
    np.testing.assert_array_equal(out.miss_mask[1], [0, 0])
    np.testing.assert_array_equal(out.swap_host_rows[1], untouched(2))
    np.testing.assert_array_equal(out.swap_device_rows[1], untouched(2))
    np.testing.assert_array_equal(out.valid_counts, [2, 0])
    np.testing.assert_array_equal(out.swap_counts, [1, 0])
    np.testing.assert_array_equal(out.hot_rows[0], [0, 2])
    np.testing.assert_array_equal(out.device_global_indices, [[7, 8, 9, -1], dgi[1]])
    np.testing.assert_array_equal(out.lru_slots, [[3, 1, 2, 0], lru[1]])
    np.testing.assert_array_equal(out.stats, [2, 1, 1, 0, 0])

    all_padding = resolve(dataclasses.replace(problem, request_state_indices=_i32([-1, -5])), device)
    np.testing.assert_array_equal(all_padding.attention, -np.ones((2, 2)))
    np.testing.assert_array_equal(all_padding.valid_counts, [0, 0])
    np.testing.assert_array_equal(all_padding.device_global_indices, dgi)
    np.testing.assert_array_equal(all_padding.lru_slots, lru)
    np.testing.assert_array_equal(all_padding.stats, [0, 0, 0, 0, 0])


@pytest.mark.parametrize("num_valid_rows", [-3, 0, 1, 2, 3, 7])
def test_num_valid_rows(device, num_valid_rows):
    # Requests: rows 0-1 (batch row 0, state 0) and row 2 (batch row 1, state 1).
    problem = Problem(
        topk=_i32([[1, 2], [3, 1], [4, 5]]),
        req_id_per_token=_i32([0, 0, 1, 0]),
        request_state_indices=_i32([0, 1]),
        device_global_indices=cold_state(2, 4)[0],
        lru_slots=cold_state(2, 4)[1],
        hot_block_table=identity_hot_table(2, 4),
        num_valid_rows=num_valid_rows,
        stats=np.zeros(5, np.int64),
    )
    out = resolve(problem, device)
    valid = min(max(num_valid_rows, 0), 3)
    expected_counts = [2, 2, 2][:valid] + [0] * (3 - valid)
    np.testing.assert_array_equal(out.valid_counts, expected_counts)
    for t in range(valid, 3):
        np.testing.assert_array_equal(out.attention[t], [-1, -1])
        np.testing.assert_array_equal(out.swap_host_rows[t], untouched(2))
    expected_state0 = {0: [-1] * 4, 1: [1, 2, -1, -1]}.get(valid, [1, 2, 3, -1])
    np.testing.assert_array_equal(out.device_global_indices[0], expected_state0)
    np.testing.assert_array_equal(out.device_global_indices[1], [4, 5, -1, -1] if valid == 3 else [-1] * 4)
    np.testing.assert_array_equal(out.stats[0], 2 * valid)


def test_union_overflow_invalidates_later_first_occurring_slots(device):
    problem = single_request([[10, 11, 10, 12], [13, 11, 14, 13]], 8, max_union_rows=3)
    out = resolve(problem, device)
    # Candidates 10, 11, 12, 13, 14 in first-occurrence order; 13 and 14 overflow.
    np.testing.assert_array_equal(out.resolved, [[10, 11, 10, 12], [-1, 11, -1, -1]])
    np.testing.assert_array_equal(out.hot_rows, [[0, 1, 0, 2], [-1, 1, -1, -1]])
    np.testing.assert_array_equal(out.miss_mask, [[1, 1, 0, 1], [0, 0, 0, 0]])
    np.testing.assert_array_equal(out.valid_counts, [4, 1])
    np.testing.assert_array_equal(out.swap_counts, [3, 0])
    np.testing.assert_array_equal(out.device_global_indices, [[10, 11, 12, -1, -1, -1, -1, -1]])
    np.testing.assert_array_equal(out.lru_slots, [[3, 4, 5, 6, 7, 0, 1, 2]])
    np.testing.assert_array_equal(out.stats, [8, 0, 3, 0, 3])

    # Overflowed slots already held in the hot cache are not hits either.
    held = advance(problem, out, topk=_i32([[20, 21, 10, 11], [12, 20, 20, 20]]), max_union_rows=2)
    out = resolve(held, device)
    np.testing.assert_array_equal(out.resolved, [[20, 21, -1, -1], [-1, 20, 20, 20]])
    np.testing.assert_array_equal(out.hot_rows, [[3, 4, -1, -1], [-1, 3, 3, 3]])
    np.testing.assert_array_equal(out.miss_mask, [[1, 1, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(out.lru_slots, [[5, 6, 7, 0, 1, 2, 3, 4]])
    np.testing.assert_array_equal(out.stats, [16, 0, 5, 0, 6])


def test_corrupt_lru_degrades_and_dropped_misses_retry(device):
    H = 6
    problem = single_request([[101, 100, 103, 104, 105]], H)
    problem.device_global_indices = _i32([[100, -1, 101, -1, -1, 102]])
    # 7 and -3 are out of range, 2 appears twice; slots 1, 3 and 4 are missing.
    problem.lru_slots = np.array([[7, 2, 2, -3, 0, 5]], np.int16)
    out = resolve(problem, device, "step 1")
    # Only slot 0 (holding 100) is a usable hit; 101 sits in duplicated slot 2,
    # which is no hit. Misses 101, 103, 104, 105 meet positions holding 7, 2,
    # 2, -3: all unusable, so all are dropped.
    np.testing.assert_array_equal(out.hot_rows, [[-1, 0, -1, -1, -1]])
    np.testing.assert_array_equal(out.resolved, [[-1, 100, -1, -1, -1]])
    np.testing.assert_array_equal(out.miss_mask, [[0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(out.swap_counts, [0])
    np.testing.assert_array_equal(out.device_global_indices, [[100, -1, 101, -1, -1, 102]])
    np.testing.assert_array_equal(out.lru_slots, [[5, 7, 2, 2, -3, 0]])
    np.testing.assert_array_equal(out.stats, [5, 1, 0, 0, 4])

    # Next step the same misses come again; the first meets slot 5 (usable).
    out = resolve(problem := advance(problem, out), device, "step 2")
    np.testing.assert_array_equal(out.hot_rows, [[5, 0, -1, -1, -1]])
    np.testing.assert_array_equal(out.miss_mask, [[1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(out.swap_host_rows, [[101] + [SENTINEL] * 4])
    np.testing.assert_array_equal(out.swap_device_rows, [[5] + [SENTINEL] * 4])
    np.testing.assert_array_equal(out.device_global_indices, [[100, -1, 101, -1, -1, 101]])
    np.testing.assert_array_equal(out.lru_slots, [[-3, 5, 7, 2, 2, 0]])
    np.testing.assert_array_equal(out.stats, [10, 2, 1, 0, 7])


def test_int16_extreme_lru_values(device):
    problem = single_request([[1, 2, 3]], 4)
    problem.lru_slots = np.array([[-32768, 32767, 1, 0]], np.int16)
    out = resolve(problem, device)
    # 1 -> position 0 (unusable, dropped), 2 -> position 1 (dropped), 3 -> position 2 (slot 1).
    np.testing.assert_array_equal(out.hot_rows, [[-1, -1, 1]])
    np.testing.assert_array_equal(out.lru_slots, [[0, -32768, 32767, 1]])
    np.testing.assert_array_equal(out.device_global_indices, [[-1, 3, -1, -1]])


def test_member_held_twice_is_served_by_the_most_recent_slot(device):
    problem = single_request([[50, 51]], 5)
    problem.device_global_indices = _i32([[50, 60, 50, 61, 62]])
    problem.lru_slots = np.array([[2, 1, 0, 3, 4]], np.int16)
    out = resolve(problem, device)
    # 50 is held at positions 0 (slot 2) and 2 (slot 0): both are hits, slot 0 serves.
    np.testing.assert_array_equal(out.hot_rows, [[0, 1]])
    np.testing.assert_array_equal(out.miss_mask, [[0, 1]])
    np.testing.assert_array_equal(out.device_global_indices, [[50, 51, 50, 61, 62]])
    np.testing.assert_array_equal(out.lru_slots, [[3, 4, 1, 2, 0]])
    np.testing.assert_array_equal(out.stats, [2, 1, 1, 0, 0])


def test_hot_block_table_and_attention_stride(device):
    # H = 8 in blocks of 2: slots 2-3 sit in block -1 (unusable).
    problem = single_request(
        [[40, 41, 42, 43]],
        8,
        hot_block_size=2,
        attention_block_stride=7,
        hot_block_table=_i32([[5, -1, 9, 3, 77]]),
        table_pad=2,
    )
    out = resolve(problem, device, "step 1")
    # 40 -> slot 0 (row 10), 41 -> slot 1 (row 11); 42, 43 meet slots 2, 3: dropped.
    np.testing.assert_array_equal(out.hot_rows, [[10, 11, -1, -1]])
    np.testing.assert_array_equal(out.attention, [[35, 36, -1, -1]])
    np.testing.assert_array_equal(out.swap_device_rows, [[10, 11, SENTINEL, SENTINEL]])
    np.testing.assert_array_equal(out.lru_slots, [[4, 5, 6, 7, 0, 1, 2, 3]])
    np.testing.assert_array_equal(out.device_global_indices, [[40, 41, -1, -1, -1, -1, -1, -1]])

    out = resolve(problem := advance(problem, out), device, "step 2")
    # 42 -> slot 4 (block 9, row 18, index 63), 43 -> slot 5 (row 19, index 64).
    np.testing.assert_array_equal(out.hot_rows, [[10, 11, 18, 19]])
    np.testing.assert_array_equal(out.attention, [[35, 36, 63, 64]])
    np.testing.assert_array_equal(out.miss_mask, [[0, 0, 1, 1]])
    np.testing.assert_array_equal(out.swap_host_rows, [[42, 43, SENTINEL, SENTINEL]])
    np.testing.assert_array_equal(out.swap_device_rows, [[18, 19, SENTINEL, SENTINEL]])
    np.testing.assert_array_equal(out.lru_slots, [[6, 7, 2, 3, 4, 5, 0, 1]])
    np.testing.assert_array_equal(out.stats, [8, 2, 4, 0, 2])


def test_hot_table_is_read_per_batch_row(device):
    # Two requests on swapped state rows with different hot tables.
    dgi, lru = cold_state(2, 4)
    problem = Problem(
        topk=_i32([[5, 6], [7, 8]]),
        req_id_per_token=_i32([0, 1]),
        request_state_indices=_i32([1, 0]),
        device_global_indices=dgi,
        lru_slots=lru,
        hot_block_table=_i32([[4, 6], [0, 2]]),
        hot_block_size=2,
        attention_block_stride=3,
        stats=np.zeros(5, np.int64),
    )
    out = resolve(problem, device)
    np.testing.assert_array_equal(out.hot_rows, [[8, 9], [0, 1]])
    np.testing.assert_array_equal(out.attention, [[12, 13], [0, 1]])
    np.testing.assert_array_equal(out.device_global_indices, [[7, 8, -1, -1], [5, 6, -1, -1]])


def test_attention_index_beyond_int32_makes_slots_unusable(device):
    # Block 2**30 with stride 4: row fits in int32 for block size 1, index does not.
    problem = single_request(
        [[1, 2]], 2, hot_block_size=1, attention_block_stride=4, hot_block_table=_i32([[2**30, 3]])
    )
    out = resolve(problem, device)
    np.testing.assert_array_equal(out.hot_rows, [[-1, 3]])
    np.testing.assert_array_equal(out.attention, [[-1, 12]])
    np.testing.assert_array_equal(out.device_global_indices, [[-1, 2]])
    np.testing.assert_array_equal(out.lru_slots, [[0, 1]])


def test_attention_block_stride_beyond_int32_is_refused(device):
    # Attention indices are int32, so a stride past INT32_MAX can address
    # nothing; refusing it also keeps every index computation inside int64.
    problem = single_request([[10, 11]], 2, attention_block_stride=2**31, hot_block_table=_i32([[4, 0]]))
    with pytest.raises(ValueError, match="attention_block_stride"):
        resolve(problem, device)


def test_attention_index_beyond_int32_makes_the_slot_unusable(device):
    # Slot 0 sits in block 4: its index 4 * 2**30 exceeds INT32_MAX.
    problem = single_request(
        [[10, 11, 8]],
        2,
        attention_block_stride=2**30,
        hot_block_table=_i32([[4, 0]]),
        resident_block_table=_i32([[0] * 8 + [8]]),
    )
    out = resolve(problem, device)
    # 10 meets slot 0 (unusable): dropped; 11 takes slot 1 (block 0, index 0);
    # 8 is resident in block 8 at index 8 * 2**30: invalid.
    np.testing.assert_array_equal(out.hot_rows, [[-1, 0, -1]])
    np.testing.assert_array_equal(out.attention, [[-1, 0, -1]])
    np.testing.assert_array_equal(out.device_global_indices, [[-1, 11]])


def test_resident_index_beyond_int32_is_invalid(device):
    problem = single_request(
        [[0, 4]], 2, hot_block_size=4, attention_block_stride=8, resident_block_table=_i32([[2**29, 1]])
    )
    out = resolve(problem, device)
    # Page 0 is resident at index 2**29 * 8 > INT32_MAX: invalid (not hot); page 1 at row 4, index 8.
    np.testing.assert_array_equal(out.hot_rows, [[-1, 4]])
    np.testing.assert_array_equal(out.attention, [[-1, 8]])
    np.testing.assert_array_equal(out.device_global_indices, [[-1, -1]])
    np.testing.assert_array_equal(out.stats, [2, 0, 0, 1, 1])


def test_rejected_requests(device):
    dgi = _i32([[1, 2, -1, -1], [3, 4, -1, -1], [5, 6, -1, -1]])
    lru = np.array([[2, 3, 0, 1]] * 3, np.int16)
    problem = Problem(
        topk=_i32([[1, 9], [1, 9], [1, 9], [3, 9], [5, 9], [3, 9]]),
        # batch row 3 owns rows 3 and 5: not contiguous.
        req_id_per_token=_i32([0, 1, 2, 3, 4, 3]),
        # batch row 1: state row 5 >= S; batch row 2 shares state 0 with batch row 0.
        request_state_indices=_i32([0, 5, 0, 1, 2]),
        device_global_indices=dgi,
        lru_slots=lru,
        hot_block_table=identity_hot_table(5, 4),
        stats=np.zeros(5, np.int64),
    )
    out = resolve(problem, device)
    for t in (1, 2, 3, 5):
        np.testing.assert_array_equal(out.attention[t], [-1, -1])
        np.testing.assert_array_equal(out.hot_rows[t], [-1, -1])
        np.testing.assert_array_equal(out.resolved[t], [-1, -1])
        np.testing.assert_array_equal(out.miss_mask[t], [0, 0])
        np.testing.assert_array_equal(out.swap_host_rows[t], untouched(2))
    np.testing.assert_array_equal(out.valid_counts, [2, 0, 0, 0, 2, 0])
    np.testing.assert_array_equal(out.swap_counts, [1, 0, 0, 0, 1, 0])
    # Batch rows 0 and 4 (state rows 0 and 2): position 1 resp. 5 hits slot 0, 9 misses into slot 2.
    np.testing.assert_array_equal(out.hot_rows[0], [0, 2])
    np.testing.assert_array_equal(out.hot_rows[4], [0, 2])
    np.testing.assert_array_equal(out.device_global_indices, [[1, 2, 9, -1], dgi[1], [5, 6, 9, -1]])
    np.testing.assert_array_equal(out.lru_slots, [[3, 1, 2, 0], lru[1], [3, 1, 2, 0]])
    # 12 lookups: 4 rejected rows of 2 (all invalid) + 2 active rows.
    np.testing.assert_array_equal(out.stats, [12, 2, 2, 0, 8])


def test_state_row_of_an_earlier_batch_row_without_tokens_rejects(device):
    # The literal rule: an earlier batch row holding the same state row owns
    # it, whether or not it has token rows this step.
    dgi, lru = cold_state(1, 4)
    problem = Problem(
        topk=_i32([[1, 2]]),
        req_id_per_token=_i32([1]),
        request_state_indices=_i32([0, 0]),
        device_global_indices=dgi,
        lru_slots=lru,
        hot_block_table=identity_hot_table(2, 4),
        stats=np.zeros(5, np.int64),
    )
    out = resolve(problem, device)
    np.testing.assert_array_equal(out.attention, [[-1, -1]])
    np.testing.assert_array_equal(out.device_global_indices, dgi)
    np.testing.assert_array_equal(out.stats, [2, 0, 0, 0, 2])


def test_orphan_rows(device):
    dgi, lru = cold_state(1, 4)
    problem = Problem(
        topk=_i32([[1, 2], [3, 4], [5, 6], [7, 8]]),
        req_id_per_token=_i32([-1, 0, 2, 7, 0]),  # B = 2; the 5th entry is past T
        request_state_indices=_i32([0, -1]),
        device_global_indices=dgi,
        lru_slots=lru,
        hot_block_table=identity_hot_table(2, 4),
        stats=np.full(5, 1000, np.int64),
        extra_rows=1,
    )
    out = resolve(problem, device)
    for t in (0, 2, 3):
        np.testing.assert_array_equal(out.attention[t], [-1, -1])
        np.testing.assert_array_equal(out.miss_mask[t], [0, 0])
        np.testing.assert_array_equal(out.swap_device_rows[t], untouched(2))
    np.testing.assert_array_equal(out.hot_rows[1], [0, 1])
    np.testing.assert_array_equal(out.valid_counts, [0, 2, 0, 0])
    np.testing.assert_array_equal(out.swap_counts, [0, 2, 0, 0])
    np.testing.assert_array_equal(out.stats, [1002, 1000, 1002, 1000, 1000])


def test_counters_accumulate_and_leave_extra_entries(device):
    stats = np.array([100, 200, 300, 400, 500, 7, -8], np.int64)
    problem = single_request(
        [[4, -1, 5, 4]], 4, hot_block_size=4, resident_block_table=_i32([[0, 3]]), stats=stats
    )
    out = resolve(problem, device, "step 1")
    # 4, 5, 4 sit on resident page 1; -1 is invalid.
    np.testing.assert_array_equal(out.stats, [104, 200, 300, 403, 501, 7, -8])
    out = resolve(problem := advance(problem, out, topk=_i32([[4, 0, 0, 1]])), device, "step 2")
    np.testing.assert_array_equal(out.stats, [108, 200, 302, 404, 501, 7, -8])
    out = resolve(advance(problem, out, topk=_i32([[1, 2, 0, 7]])), device, "step 3")
    np.testing.assert_array_equal(out.stats, [112, 202, 303, 405, 501, 7, -8])


def test_empty_batch_and_zero_rows(device):
    dgi, lru = cold_state(2, 4)
    problem = Problem(
        topk=np.zeros((0, 3), np.int32),
        req_id_per_token=np.zeros(0, np.int32),
        request_state_indices=_i32([0, 1]),
        device_global_indices=dgi,
        lru_slots=lru,
        hot_block_table=identity_hot_table(2, 4),
        stats=np.zeros(5, np.int64),
        extra_rows=2,
    )
    out = resolve(problem, device)
    np.testing.assert_array_equal(out.device_global_indices, dgi)
    np.testing.assert_array_equal(out.stats, np.zeros(5))
    no_batch = dataclasses.replace(
        problem,
        topk=_i32([[1, 2, 3]]),
        req_id_per_token=_i32([0]),
        request_state_indices=np.zeros(0, np.int32),
        hot_block_table=np.zeros((0, 4), np.int32),
    )
    out = resolve(no_batch, device)
    np.testing.assert_array_equal(out.attention, [[-1, -1, -1]])
    np.testing.assert_array_equal(out.stats, np.zeros(5))


def test_without_stats(device):
    problem = dataclasses.replace(single_request([[3, 4]], 4), stats=None)
    out = resolve(problem, device)
    np.testing.assert_array_equal(out.hot_rows, [[0, 1]])


def test_numpy_arrays_run_the_cpu_backend():
    dgi, lru = cold_state(1, 4)
    outs = {name: np.full((1, 2), SENTINEL, np.int32) for name in OUTPUT_MATRICES}
    counts = {name: np.full(1, SENTINEL, np.int32) for name in OUTPUT_VECTORS}
    stats = np.zeros(5, np.int64)
    ops.resolve_residency(
        _i32([[8, 9]]),
        _i32([0]),
        _i32([0]),
        dgi,
        lru,
        identity_hot_table(1, 4),
        hot_block_size=1,
        attention_block_stride=1,
        host_rows=100,
        max_union_rows=4,
        **{f"out_{name}": array for name, array in outs.items()},
        **{f"out_{name}": array for name, array in counts.items()},
        num_valid_rows=_i32([1]),
        stats=stats,
    )
    np.testing.assert_array_equal(outs["hot_rows"], [[0, 1]])
    np.testing.assert_array_equal(outs["miss_mask"], [[1, 1]])
    np.testing.assert_array_equal(outs["swap_host_rows"], [[8, 9]])
    np.testing.assert_array_equal(counts["swap_counts"], [2])
    np.testing.assert_array_equal(dgi, [[8, 9, -1, -1]])
    np.testing.assert_array_equal(lru, [[2, 3, 0, 1]])
    np.testing.assert_array_equal(stats, [2, 0, 2, 0, 0])


# ----------------------------------------------------------------- randomised


@dataclass
class Scenario:
    """A multi-step run: the current step (tables, state, layout) and the range of its positions."""

    problem: Problem
    position_range: int
    large: bool


def random_scenario(rng: np.random.Generator, large: bool = False) -> Scenario:
    """A random first step: shapes, tables, state and layout."""
    if large:
        K = int(rng.choice([64, 256, 1024, 2048]))
        H = int(rng.choice([K, 2 * K, 4096]))
        hot_block_size = int(rng.choice([16, 64]))
        S, B = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    else:
        K = int(rng.integers(1, 9))
        H = int(rng.integers(1, 25))
        hot_block_size = int(rng.choice([1, 2, 3, 4, 8]))
        S, B = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    max_union_rows = H if rng.random() < 0.5 else int(rng.integers(1, H + 1))
    attention_block_stride = hot_block_size + int(rng.choice([0, 0, 1, 3, 16]))

    blocks = -(-H // hot_block_size) + int(rng.integers(0, 3))
    hot_block_table = np.stack([rng.permutation(blocks * 4)[:blocks] for _ in range(B)]).astype(np.int32)
    hot_block_table[rng.random(hot_block_table.shape) < 0.05] = -1

    source_block_table, block_size = None, 0
    if rng.random() < 0.5:
        block_size = int(rng.choice([1, 2, 4, 8] if not large else [64]))
        width = int(rng.integers(1, 7)) if not large else 4 * K // block_size
        host_blocks = width + 4
        source_block_table = rng.integers(0, host_blocks, (B, width)).astype(np.int32)
        source_block_table[rng.random(source_block_table.shape) < 0.05] = -1
        host_rows = max(0, host_blocks * block_size - int(rng.integers(0, 2 * block_size)))
        position_range = width * block_size + 2
    else:
        host_rows = int(rng.integers(0, 6 * H + 8))
        position_range = host_rows + 2
    if not large:
        # Small ranges give hits and duplicates, larger ones evictions.
        position_range = min(position_range, int(rng.choice([H // 2 + 2, H + 1, 2 * H + 1, 4 * H + 1])))

    resident_block_table = None
    if rng.random() < 0.3:
        width = int(rng.integers(0, 5)) if not large else 4 * K // hot_block_size
        resident_block_table = np.where(
            rng.random((B, width)) < 0.3, rng.integers(1, 40, (B, width)), rng.integers(-2, 1, (B, width))
        ).astype(np.int32)

    dgi, lru = cold_state(S, H)
    if rng.random() < 0.5:
        dgi = rng.integers(-1, position_range + 2, (S, H)).astype(np.int32)
        lru = np.stack([rng.permutation(H) for _ in range(S)]).astype(np.int16)

    problem = Problem(
        topk=np.zeros((0, K), np.int32),
        req_id_per_token=np.zeros(0, np.int32),
        request_state_indices=np.zeros(B, np.int32),
        device_global_indices=dgi,
        lru_slots=lru,
        hot_block_table=hot_block_table,
        hot_block_size=hot_block_size,
        attention_block_stride=attention_block_stride,
        host_rows=host_rows,
        max_union_rows=max_union_rows,
        source_block_table=source_block_table,
        block_size=block_size,
        resident_block_table=resident_block_table,
        stats=rng.integers(0, 1000, 5 + int(rng.integers(0, 2))) if rng.random() < 0.9 else None,
        extra_rows=int(rng.choice([0, 0, 2])),
        pad_columns=int(rng.choice([0, 0, 3])),
        table_pad=int(rng.choice([0, 0, 2])),
    )
    scenario = Scenario(problem, position_range, large)
    scenario.problem = random_step(rng, scenario)
    return scenario


def random_step(rng: np.random.Generator, scenario: Scenario) -> Problem:
    """New batch composition and top-k over the scenario's tables and current state."""
    problem, large = scenario.problem, scenario.large
    S = problem.device_global_indices.shape[0]
    B = problem.request_state_indices.shape[0]
    K = problem.K

    free = list(rng.permutation(S))
    state = np.empty(B, np.int32)
    for b in range(B):
        r = rng.random()
        if r < 0.1 or not free:
            state[b] = -1 if r < 0.1 or rng.random() < 0.5 else rng.integers(0, S)
        elif r < 0.15:
            state[b] = S + rng.integers(0, 3)  # rejected
        elif r < 0.22 and b > 0:
            state[b] = state[rng.integers(0, b)]  # shared: the later one is rejected
        else:
            state[b] = free.pop()

    # Contiguous rows per request in a random batch order, 1..4 rows each
    # (sometimes none), with occasional orphans and broken contiguity.
    req = []
    for b in rng.permutation(B):
        req += [int(b)] * int(rng.choice([0, 1, 1, 2, 3, 4]) if not large else rng.integers(1, 3))
        if rng.random() < 0.1:
            req.append(int(rng.choice([-1, B, B + 5])))
    if len(req) > 2 and rng.random() < 0.1:
        i, j = rng.choice(len(req), 2, replace=False)
        req[i], req[j] = req[j], req[i]
    T = len(req)
    req_id_per_token = np.array(req + list(rng.integers(-1, B + 1, int(rng.integers(0, 3)))), np.int32)

    topk = rng.integers(0, max(scenario.position_range, 1), (T, K)).astype(np.int32)
    topk[rng.random((T, K)) < 0.1] = -1
    if rng.random() < 0.2:
        topk[rng.random((T, K)) < 0.2] = rng.integers(-2**31, 0)

    num_valid_rows = None if rng.random() < 0.7 else int(rng.integers(-1, T + 2))
    return dataclasses.replace(
        problem,
        topk=topk,
        req_id_per_token=req_id_per_token,
        request_state_indices=state,
        num_valid_rows=num_valid_rows,
    )


def perturb_state(rng: np.random.Generator, scenario: Scenario) -> None:
    """What the engine does to the state between steps: invalidations, and rarely corruption."""
    dgi, lru = scenario.problem.device_global_indices, scenario.problem.lru_slots
    S, H = dgi.shape
    if rng.random() < 0.3:
        dgi[rng.random((S, H)) < 0.2] = -1
    if rng.random() < 0.1:
        mask = rng.random((S, H)) < 0.1
        dgi[mask] = rng.integers(-5, scenario.position_range + 5, int(mask.sum()))
    if rng.random() < 0.08:
        s, i = rng.integers(0, S), rng.integers(0, H)
        lru[s, i] = rng.choice([H, -1, 32767, -32768, lru[s, rng.integers(0, H)]])


def run_random_scenarios(device, seeds, large: bool = False) -> int:
    steps = 0
    for seed in seeds:
        rng = np.random.default_rng(seed)
        scenario = random_scenario(rng, large)
        for step in range(int(rng.integers(2, 7)) if not large else 3):
            out = resolve(scenario.problem, device, f"seed {seed} step {step}")
            steps += 1
            scenario.problem = advance(scenario.problem, out)
            perturb_state(rng, scenario)
            scenario.problem = random_step(rng, scenario)
    return steps


@pytest.mark.parametrize("chunk", range(20))
def test_random_scenarios_match_model(device, chunk):
    steps = run_random_scenarios(device, range(chunk * 150, (chunk + 1) * 150))
    assert steps >= 150 * 2


@pytest.mark.parametrize("seed", range(4))
def test_random_large_scenarios_match_model(device, seed):
    run_random_scenarios(device, [10_000 + seed], large=True)


def test_random_scenarios_exercise_every_path():
    """The sweep's inputs reach every row state and entry outcome (checked on the model)."""
    seen_rows, seen_stats = set(), np.zeros(5, np.int64)
    for seed in range(300):
        rng = np.random.default_rng(seed)
        result = run_model(random_scenario(rng).problem)
        seen_rows |= set(result.row_states)
        seen_stats += result.stats
    assert seen_rows == {model.ORPHAN, model.PADDING, model.REJECTED, model.ACTIVE}
    assert (seen_stats > 0).all(), seen_stats


# ----------------------------------------------------------------- bad input


def other_device(device):
    if device.type == "cuda":
        return CPU
    return torch.device("cuda") if cuda_available() else None


def valid_kwargs(device) -> dict:
    """A valid call with every optional argument present: T = 2, K = 3, B = 2, S = 2, H = 8."""
    on = lambda array, dtype=torch.int32: torch.tensor(array, dtype=dtype, device=device)  # noqa: E731
    out = lambda *shape: torch.full(shape, SENTINEL, dtype=torch.int32, device=device)  # noqa: E731
    return dict(
        topk_indices=on([[1, 2, 3], [4, 5, 6]]),
        req_id_per_token=on([0, 1]),
        request_state_indices=on([0, 1]),
        device_global_indices=on([[9] * 8, [-1] * 8]),
        lru_slots=on([list(range(8))] * 2, torch.int16),
        hot_block_table=on([[0, 1], [2, 3]]),
        hot_block_size=4,
        attention_block_stride=4,
        host_rows=1000,
        max_union_rows=8,
        out_attention=out(2, 3),
        out_hot_rows=out(2, 3),
        out_resolved=out(2, 3),
        out_miss_mask=out(2, 3),
        out_valid_counts=out(2),
        out_swap_host_rows=out(2, 3),
        out_swap_device_rows=out(2, 3),
        out_swap_counts=out(2),
        source_block_table=on([[1, 2], [3, 4]]),
        block_size=4,
        resident_block_table=on([[0, 0], [0, 0]]),
        resident_block_size=4,
        num_valid_rows=on([2]),
        stats=torch.zeros(5, dtype=torch.int64, device=device),
    )


TENSOR_ARGUMENTS = [
    "topk_indices",
    "req_id_per_token",
    "request_state_indices",
    "device_global_indices",
    "lru_slots",
    "hot_block_table",
    "out_attention",
    "out_hot_rows",
    "out_resolved",
    "out_miss_mask",
    "out_valid_counts",
    "out_swap_host_rows",
    "out_swap_device_rows",
    "out_swap_counts",
    "source_block_table",
    "resident_block_table",
    "num_valid_rows",
    "stats",
]
REQUIRED_TENSORS = TENSOR_ARGUMENTS[:14]


def wrong_dtype(name: str, tensor):
    if name == "lru_slots":
        return tensor.to(torch.int32)
    if name == "stats":
        return tensor.to(torch.int32)
    return tensor.to(torch.int64)


def wrong_shapes(name: str, tensor) -> list:
    """Tensors of a wrong shape (or rank) for argument `name`, given its valid value."""
    if name == "topk_indices":
        return [tensor[0], tensor[:, :0], tensor[None]]
    if name == "req_id_per_token":
        return [tensor[:1], tensor[None]]
    if name == "request_state_indices":
        return [tensor[:, None]]
    if name == "device_global_indices":
        return [tensor[0], tensor[:, :0], tensor.new_zeros((2, 32768))]
    if name == "lru_slots":
        return [tensor[:1], tensor[:, :7], tensor.new_zeros((2, 9)), tensor[0]]
    if name == "hot_block_table":
        return [tensor[:1], tensor[:, :1], tensor[0]]
    if name in ("source_block_table", "resident_block_table"):
        return [tensor[:1], tensor[0]]
    if name == "num_valid_rows":
        return [tensor.new_zeros(2), tensor.new_zeros(0)]
    if name in ("stats", "out_valid_counts", "out_swap_counts"):
        return [tensor[: tensor.shape[0] - 1], tensor[:, None]]
    # [>= T, K] outputs: too few rows, too few or too many columns, wrong rank.
    wide = tensor.new_zeros((tensor.shape[0], tensor.shape[1] + 1))
    return [tensor[:1], tensor[:, :2], wide, tensor[0]]


def wrong_strides(name: str, tensor) -> list:
    """Views with a stride the argument does not accept."""
    if tensor.dim() == 1:
        return [tensor.new_zeros(tensor.shape[0] * 2)[::2]]
    columns = tensor.new_zeros((tensor.shape[0], tensor.shape[1] * 2))[:, ::2]
    views = [columns]
    if name in ("device_global_indices", "lru_slots"):
        views.append(tensor.new_zeros((tensor.shape[0], tensor.shape[1] + 1))[:, : tensor.shape[1]])
    else:
        views.append(torch.as_strided(tensor.new_zeros(16), tensor.shape, (1, 1)))  # rows overlap
    return views


def assert_rejected(kwargs, exception, name, state_before):
    with pytest.raises(exception, match=name):
        ops.resolve_residency(**kwargs)
    for key, (tensor, before) in state_before.items():
        assert torch.equal(tensor.cpu(), before), f"{key} changed after a rejected call"


def snapshot(kwargs) -> dict:
    """The state tensors of a valid call and copies of their values."""
    return {key: (kwargs[key], kwargs[key].cpu().clone()) for key in ("device_global_indices", "lru_slots", "stats")}


def test_valid_kwargs_are_valid(device):
    kwargs = valid_kwargs(device)
    ops.resolve_residency(**kwargs)
    assert kwargs["out_valid_counts"].cpu().tolist() == [3, 3]


@pytest.mark.parametrize("name", TENSOR_ARGUMENTS)
def test_wrong_dtype_raises_type_error(device, name):
    kwargs = valid_kwargs(device)
    before = snapshot(kwargs)
    kwargs[name] = wrong_dtype(name, kwargs[name])
    assert_rejected(kwargs, TypeError, name, before)


@pytest.mark.parametrize("name", TENSOR_ARGUMENTS)
def test_unsupported_dtype_raises_type_error(device, name):
    kwargs = valid_kwargs(device)
    before = snapshot(kwargs)
    kwargs[name] = kwargs[name].to(torch.complex64)
    assert_rejected(kwargs, TypeError, name, before)


@pytest.mark.parametrize("name", TENSOR_ARGUMENTS)
def test_wrong_shape_raises_value_error(device, name):
    base = valid_kwargs(device)
    before = snapshot(base)
    for bad in wrong_shapes(name, base[name]):
        kwargs = dict(base)
        kwargs[name] = bad
        if name == "device_global_indices" and bad.shape[-1] == 32768:
            kwargs["lru_slots"] = kwargs["lru_slots"].new_zeros(bad.shape)
        assert_rejected(kwargs, ValueError, name, before)


# num_valid_rows has one element, so every stride reads the same value.
@pytest.mark.parametrize("name", [name for name in TENSOR_ARGUMENTS if name != "num_valid_rows"])
def test_wrong_stride_raises_value_error(device, name):
    base = valid_kwargs(device)
    before = snapshot(base)
    views = wrong_strides(name, base[name])
    assert views
    for bad in views:
        kwargs = dict(base)
        kwargs[name] = bad
        assert_rejected(kwargs, ValueError, name, before)


@pytest.mark.parametrize("name", TENSOR_ARGUMENTS)
def test_wrong_device_raises_value_error(device, name):
    other = other_device(device)
    if other is None:
        pytest.skip("needs a second device kind (CUDA)")
    kwargs = valid_kwargs(device)
    before = snapshot(kwargs)
    if name == "topk_indices":
        # The device of topk_indices picks the backend: every other tensor is then on the wrong one.
        kwargs[name] = kwargs[name].to(other)
        with pytest.raises(ValueError, match="topk_indices"):
            ops.resolve_residency(**kwargs)
        return
    kwargs[name] = kwargs[name].to(other)
    assert_rejected(kwargs, ValueError, name, before)


@pytest.mark.parametrize("name", REQUIRED_TENSORS)
def test_missing_tensor_raises_type_error(device, name):
    kwargs = valid_kwargs(device)
    before = snapshot(kwargs)
    kwargs[name] = None
    assert_rejected(kwargs, TypeError, name, before)


@pytest.mark.parametrize(
    "name, value",
    [
        ("hot_block_size", 0),
        ("hot_block_size", -4),
        ("hot_block_size", 2**31),
        ("attention_block_stride", 3),
        ("attention_block_stride", -1),
        ("host_rows", -1),
        ("host_rows", 2**31),
        ("max_union_rows", 0),
        ("max_union_rows", 9),
        ("block_size", 0),
        ("block_size", -64),
        ("block_size", 2**31),
        ("resident_block_size", 2),
        ("resident_block_size", 0),
    ],
)
def test_bad_scalar_raises_value_error(device, name, value):
    kwargs = valid_kwargs(device)
    before = snapshot(kwargs)
    kwargs[name] = value
    if name == "hot_block_size" and value > 0:
        kwargs["attention_block_stride"] = value
        kwargs["resident_block_size"] = value
    assert_rejected(kwargs, ValueError, name, before)


def test_optional_scalars_are_ignored_without_their_tables(device):
    kwargs = valid_kwargs(device)
    kwargs.update(source_block_table=None, block_size=0, resident_block_table=None, resident_block_size=-3)
    ops.resolve_residency(**kwargs)
    assert kwargs["out_valid_counts"].cpu().tolist() == [3, 3]


def test_bad_stream_raises_type_error(device):
    kwargs = valid_kwargs(device)
    before = snapshot(kwargs)
    kwargs["stream"] = "default"
    assert_rejected(kwargs, TypeError, "stream", before)


@requires_cuda
def test_cuda_runs_on_a_given_stream():
    device = torch.device("cuda")
    stream = torch.cuda.Stream()
    dgi, lru = cold_state(1, 4)
    kwargs = valid_kwargs(device)
    kwargs.update(
        topk_indices=torch.tensor([[5, 6, 5], [1, 2, 3]], dtype=torch.int32, device=device),
        device_global_indices=torch.tensor(np.concatenate([dgi, dgi]), device=device),
        lru_slots=torch.tensor(np.concatenate([lru, lru]), device=device),
        hot_block_table=torch.zeros((2, 4), dtype=torch.int32, device=device),
        hot_block_size=1,
        attention_block_stride=1,
        max_union_rows=4,
        source_block_table=None,
        resident_block_table=None,
    )
    torch.cuda.current_stream().synchronize()
    with torch.cuda.stream(stream):
        ops.resolve_residency(**kwargs, stream=stream)
    stream.synchronize()
    assert kwargs["device_global_indices"].cpu().tolist()[0] == [5, 6, -1, -1]
    assert kwargs["out_miss_mask"].cpu().tolist()[0] == [1, 1, 0]
