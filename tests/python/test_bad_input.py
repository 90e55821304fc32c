"""Every public entry point of hisparse against bad input.

The matrix (bad_input_entries.py, run by bad_input_support.run_case in
worker processes, so that a crash names its case instead of ending the run):
per entry point and argument, wrong dtypes, shapes, ranks, strides, devices
(meta, sparse, CUDA where there is none), sizes (0, -1, 2**31, 2**62,
2**63, 2**64), non-integers (4.0, "4", None, lists), views of released host
pools, read-only arrays for outputs, and pairs of arguments that share
memory. Each case expects TypeError, ValueError or RuntimeError naming the
argument, no change to what the call was given, and a valid call afterwards
that leaves what a twin that saw no bad call leaves (and, where an entry has
a reference, the right result).

Beside it: the coverage check (a new public entry point without cases
fails), out-of-range data that is no error but must give the documented
result, the lifetime rules (views of released pools, views alive at exit),
and the CUDA cases (marked ``cuda`` and ``sanitize``: device mismatch,
unregistered host memory, strides at the bound inside the kernels, aliasing
on the device) that scripts/gpu_check.sh also runs under compute-sanitizer.
"""

from __future__ import annotations

import ctypes.util
import gc
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest
import torch

import hisparse
from hisparse import _C, ops

from conftest import requires_cuda

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bad_input_catalog  # noqa: E402

WORKERS = 2  # the CI machine's cores


# ---------------------------------------------------------------------- the matrix
def _run_worker(ids: List[str], results: Dict[str, str]) -> None:
    """Runs `ids` in worker processes, one after the other as crashes end them."""
    remaining = list(ids)
    while remaining:
        proc = subprocess.run([sys.executable, str(HERE / "bad_input_worker.py")], input="\n".join(remaining) + "\n",
                              capture_output=True, text=True, cwd=HERE, timeout=600)
        started = None
        for line in proc.stdout.splitlines():
            if line.startswith("START "):
                started = line[len("START "):]
            elif line.startswith("DONE "):
                done = json.loads(line[len("DONE "):])
                results[done["id"]] = done["problem"]
                started = None
        if started is not None:
            results[started] = f"crashed the process (exit status {proc.returncode}): {proc.stderr[-400:]}"
        elif proc.returncode != 0:
            raise RuntimeError(f"the worker failed outside a case: {proc.stderr[-2000:]}")
        remaining = [case for case in remaining if case not in results]


@pytest.fixture(scope="module")
def matrix_results() -> Dict[str, str]:
    ids = [case.id for case in bad_input_catalog.all_cases()]
    results: Dict[str, str] = {}
    shares = [ids[i::WORKERS] for i in range(WORKERS)]
    threads = [threading.Thread(target=_run_worker, args=(share, results)) for share in shares]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    missing = set(ids) - set(results)
    assert not missing, f"cases without a result: {sorted(missing)[:10]}"
    return results


ENTRY_NAMES = [entry.name for entry in bad_input_catalog.all_entries()]


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRY_NAMES)
def test_entry_point_refuses_bad_input(matrix_results: Dict[str, str], entry: str) -> None:
    cases = {k: v for k, v in matrix_results.items() if k.split("|", 1)[0] == entry}
    assert cases, f"{entry} has no cases"
    failures = {k.split("|", 1)[1]: v for k, v in cases.items() if v}
    assert not failures, f"{len(failures)} of {len(cases)} cases of {entry} failed:\n" + "\n".join(
        f"  {label}: {problem}" for label, problem in sorted(failures.items()))


def test_the_matrix_is_large_and_names_every_kind_of_bad_value() -> None:
    cases = bad_input_catalog.all_cases()
    labels = {case.label.split("=", 1)[-1].split(":", 1)[-1] for case in cases}
    for kind in ("dtype", "rank_down", "noncontig", "meta", "sparse", "readonly", "released", "huge_stride",
                 "neg", "zero", "2**31", "2**62", "2**63", "float", "str", "none", "list"):
        assert kind in labels, f"no case of kind {kind}"
    assert sum(case.alias is not None for case in cases) >= 40
    assert len(cases) >= 3000


# ---------------------------------------------------------------------- coverage
def _closing(text: str, opening: int) -> int:
    """The index of the parenthesis that closes the one at `opening`."""
    depth = 0
    for i in range(opening, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise ValueError(text)


def _parameters(function: Any) -> List[str]:
    """The parameter names of a Python or nanobind callable, self excluded."""
    signatures = getattr(function, "__nb_signature__", None)
    if signatures is not None:
        text = signatures[0][0]
        inside = text[text.index("(") + 1: _closing(text, text.index("("))]
        names = [p.split(":")[0].split("=")[0].strip().lstrip("*") for p in re.split(r",(?![^\[]*\])", inside)]
        return [n for n in names if n and n not in ("self", "/")]
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return []
    return [n for n in signature.parameters if n not in ("self", "cls")]


def _public_callables() -> Dict[str, Any]:
    """Every public callable of hisparse, named as the entries name them."""
    found: Dict[str, Any] = {}

    def add_class(prefix: str, cls: type) -> None:
        found[prefix] = cls
        for name, member in vars(cls).items():
            if name.startswith("_") and name != "__call__":
                continue
            if isinstance(member, property) or not (callable(member) or isinstance(member, (staticmethod,
                                                                                            classmethod))):
                continue
            found[f"{prefix}.{name}"] = getattr(cls, name)

    for name in hisparse.__all__:
        value = getattr(hisparse, name)
        if inspect.isclass(value):
            add_class(name, value)
        elif callable(value) and not inspect.ismodule(value):
            found[name] = value
    for name in ops.__all__:
        value = getattr(ops, name)
        if callable(value):
            found[f"ops.{name}"] = value
    for name in hisparse.staging.__all__:
        value = getattr(hisparse.staging, name)
        if callable(value) and name not in ("StagingPlan", "build_staging_plan"):
            found[f"staging.{name}"] = value
    found["paged_cache_view"] = hisparse.runtime.paged_cache_view
    for name in dir(_C):
        if name.startswith("_"):
            continue
        value = getattr(_C, name)
        if inspect.isclass(value):
            if value is hisparse.StagingPlan:
                continue  # covered as hisparse.StagingPlan
            add_class(f"_C.{name}", value)
        elif callable(value):
            found[f"_C.{name}"] = value
    return found


# Public callables whose arguments need no bad-input cases, and why.
EXEMPT = {
    "HostLayout": "a NamedTuple of the three ints plan_host_layout returns; it validates nothing by design",
    "HostLayout.count": "tuple's own method",
    "HostLayout.index": "tuple's own method",
    "CacheHandle.unbind_cache": "no arguments",
}


def test_every_public_entry_point_has_bad_input_cases() -> None:
    covered = set(ENTRY_NAMES)
    covered |= {name.split("(")[0] for name in ENTRY_NAMES}
    missing = []
    for name, function in sorted(_public_callables().items()):
        if name in covered or name in EXEMPT:
            continue
        if not inspect.isclass(function) and not _parameters(function):
            continue  # no arguments: nothing to get wrong
        missing.append(f"{name}({', '.join(_parameters(function))})")
    assert not missing, "public entry points without bad-input cases (add them to bad_input_entries.py):\n  " + \
        "\n  ".join(missing)


# ---------------------------------------------------------------------- out-of-range data
def _gather_reference(host: np.ndarray, rows: int, swap_host: np.ndarray, swap_device: np.ndarray,
                      counts: np.ndarray, block: int, stride: int) -> np.ndarray:
    out = np.zeros((rows, host.shape[1]), dtype=host.dtype)
    for t in range(swap_host.shape[0]):
        for k in range(min(max(int(counts[t]), 0), swap_host.shape[1])):
            h, d = int(swap_host[t, k]), int(swap_device[t, k])
            if h < 0 or d < 0:
                continue
            offset = d // block * stride + d % block
            if offset < rows:
                out[offset] = host[h] if h < host.shape[0] else 0
    return out


INT32_MAX = 2**31 - 1


def test_gather_at_the_stride_bound_skips_rows_outside_the_hot_cache() -> None:
    # The largest stride allowed and the largest int32 rows: every offset is
    # computed in range (no wrap into the buffer) and lands past the cache.
    host = torch.randint(0, 256, (8, 32), dtype=torch.uint8)
    hot = torch.zeros((12, 32), dtype=torch.uint8)
    swap_host = torch.tensor([[1, 2, 3, 4, 5, 6]], dtype=torch.int32)
    swap_device = torch.tensor([[0, 5, INT32_MAX, INT32_MAX - 1, 2**30, 3]], dtype=torch.int32)
    counts = torch.tensor([6], dtype=torch.int32)
    for block, stride in ((4, INT32_MAX), (1, INT32_MAX), (4, 8), (7, 2**30)):
        hot.zero_()
        ops.gather_compact(host, hot, swap_host, swap_device, counts, hot_block_size=block, hot_block_stride=stride)
        expected = _gather_reference(host.numpy(), 12, swap_host.numpy(), swap_device.numpy(), counts.numpy(), block,
                                     stride)
        assert np.array_equal(hot.numpy(), expected), (block, stride)
    for stride in (INT32_MAX + 1, 2**62, 2**62 + 2**40, 2**63 - 1):
        with pytest.raises(ValueError, match="hot_block_stride"):
            ops.gather_compact(host, hot, swap_host, swap_device, counts, hot_block_size=4, hot_block_stride=stride)


def test_invalidate_sorted_slots_is_correct_in_any_order() -> None:
    group = hisparse.IndexGroup(max_num_reqs=2, top_k=4, device_buffer_size=8)
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    group.resolve(i32([[2, 5, 9, 11], [5, 6, 7, 8]]), i32([0, 1]), i32([0, 1]), i32([[1, 2], [3, 4]]), host_rows=64,
                  hot_block_size=4)
    before = group.device_global_indices.clone()
    for slots in ([11, 2, 7], [7, 11, 2], [2, 7, 11], [11, 11, 2, 7, 2]):
        group.device_global_indices.copy_(before)
        group.invalidate_sorted_slots(torch.tensor(slots, dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32))
        expected = before.clone()
        expected[torch.isin(expected, torch.tensor([2, 7, 11]))] = -1
        assert torch.equal(group.device_global_indices, expected), slots


def test_aliased_outputs_are_refused_before_anything_changes() -> None:
    group = hisparse.IndexGroup(max_num_reqs=2, top_k=4, device_buffer_size=8)
    before = (group.device_global_indices.clone(), group.lru_slots.clone())
    topk = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=torch.int32)
    with pytest.raises(ValueError, match="out_attention.*index group's state"):
        group.resolve(topk, torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32),
                      torch.tensor([[1, 2], [3, 4]], dtype=torch.int32), host_rows=64, hot_block_size=4,
                      out_attention=group.device_global_indices[:, :4])
    assert torch.equal(group.device_global_indices, before[0]) and torch.equal(group.lru_slots, before[1])


def test_read_only_inputs_are_accepted_and_read_only_outputs_refused() -> None:
    src = np.frombuffer(bytes(range(64)), dtype=np.uint8)
    dst = np.zeros(64, dtype=np.uint8)
    ops.copy_bytes(dst, src)
    assert dst.tolist() == list(range(64))
    with pytest.raises(TypeError, match="dst: expected a writable array"):
        ops.copy_bytes(src, dst)


def test_read_only_inputs_of_the_kv_kernels_are_accepted() -> None:
    def frozen(values: Any, dtype: Any) -> np.ndarray:
        array = np.array(values, dtype=dtype)
        array.flags.writeable = False
        return array

    rows = frozen(np.full((2, 32), 6), np.uint8)
    host = np.zeros((8, 32), dtype=np.uint8)
    ops.write_rows(rows, frozen([0, 0], np.int32), frozen([1, 2], np.int32), frozen([0], np.int32), host_cache=host)
    assert (host[1:3] == 6).all() and not host[0].any()
    out = np.zeros((1, 2, 32), dtype=np.uint8)
    ops.read_rows(frozen(host, np.uint8), frozen([[2, -1]], np.int32), out)
    assert (out[0, 0] == 6).all() and not out[0, 1].any()
    table = np.full((1, 2), 9, dtype=np.int32)
    ops.update_residency(table, frozen([0], np.int32), frozen([3], np.int32), frozen([[4]], np.int32),
                         table_block_size=2, num_pages=1)
    assert table.tolist() == [[0, 4]]
    with pytest.raises(TypeError, match="resident_block_table: expected a writable array"):
        ops.update_residency(frozen(table, np.int32), frozen([0], np.int32), frozen([3], np.int32),
                             frozen([[4]], np.int32), table_block_size=2, num_pages=1)


# ---------------------------------------------------------------------- lifetimes
def _mapped(address: int) -> bool:
    with open("/proc/self/maps") as maps:
        for line in maps:
            begin, end = (int(x, 16) for x in line.split()[0].split("-"))
            if begin <= address < end:
                return True
    return False


def test_a_released_pool_stays_mapped_for_its_views_and_refuses_hisparse() -> None:
    pool = hisparse.HostPool(1 << 16, register="never")
    address = pool.data_ptr
    rows = pool.view("uint8", (16, 32))
    rows.copy_(torch.arange(512, dtype=torch.int32).to(torch.uint8).view(16, 32))
    with pool:
        pass  # leaving the block releases the pool
    assert pool.released and _mapped(address)
    assert rows[3, 1] == 97  # the view still shows the pool's bytes
    hot = torch.zeros((1, 4, 32), dtype=torch.uint8)
    one = torch.tensor([[1]], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="host_cache: .*released"):
        ops.gather_compact(rows, hot, one, one - 1, torch.tensor([1], dtype=torch.int32), hot_block_size=4)
    config = hisparse.Config(top_k=4, device_buffer_size=8, row_bytes=32, block_size=4, hot_block_size=4)
    runtime = hisparse.Runtime(config, max_num_reqs=1)
    with pytest.raises(RuntimeError, match="kv_cache: .*released"):
        runtime.bind_source_cache(rows)
    del rows
    gc.collect()
    assert not _mapped(address), "the last view of a released pool unmaps it"


def test_a_released_shared_pool_stays_mapped_for_its_views_and_refuses_hisparse() -> None:
    pool = hisparse.HostPool.shared(1 << 16, pool_id=hisparse.shared_pool_id(), rank=0, ranks=1, register="never")
    address = pool.data_ptr
    rows = pool.view("uint8", (16, 32))
    rows.fill_(9)
    pool.release(force=True)
    assert pool.released and _mapped(address) and int(rows[15, 31]) == 9
    with pytest.raises(RuntimeError, match="src: .*released"):
        ops.copy_bytes(torch.zeros(512, dtype=torch.uint8), rows.view(-1))
    del rows
    gc.collect()
    assert not _mapped(address), "the last view of a released shared pool unmaps it"


def test_a_runtime_bound_in_a_released_pool_refuses_to_run() -> None:
    config = hisparse.Config(top_k=4, device_buffer_size=8, row_bytes=32, block_size=4, hot_block_size=4)
    runtime = hisparse.Runtime(config, max_num_reqs=1)
    pool = hisparse.HostPool(1 << 16, register="never")
    runtime.bind_source_cache(pool.view("uint8", (64, 32)))
    slab = torch.zeros(3 * 4 * 32, dtype=torch.uint8)
    runtime.bind_hot_cache(slab, byte_offset=0, block_stride=4 * 32, num_blocks=3, block_size=4,
                           block_table=torch.tensor([[1, 2]], dtype=torch.int32))
    runtime.request_state_indices = torch.tensor([0], dtype=torch.int32)
    topk = torch.tensor([[1, 2, 3, 4]], dtype=torch.int32)
    req = torch.tensor([0], dtype=torch.int32)
    runtime.begin_forward()
    runtime.swap_in(topk, req)
    pool.release(force=True)  # the runtime still holds its view
    runtime.begin_forward()
    with pytest.raises(RuntimeError, match="host_cache.*released"):
        runtime.swap_in(topk, req)
    with pytest.raises(RuntimeError, match="host_cache.*released"):
        runtime.mirror_rows(torch.zeros((1, 32), dtype=torch.uint8), torch.tensor([1], dtype=torch.int32))
    runtime.bind_source_cache(torch.zeros((64, 32), dtype=torch.uint8))  # rebinding makes it usable again
    runtime.begin_forward()
    runtime.swap_in(topk, req)


def _bound_runtime(config, leader=None):
    runtime = hisparse.Runtime(config, max_num_reqs=1, leader=leader)
    runtime.bind_source_cache(torch.zeros((64, 32), dtype=torch.uint8))
    runtime.bind_hot_cache(torch.zeros(3 * 4 * 32, dtype=torch.uint8), byte_offset=0, block_stride=4 * 32,
                           num_blocks=3, block_size=4, block_table=torch.tensor([[1, 2]], dtype=torch.int32))
    return runtime


def test_a_runtime_refuses_bound_tensors_whose_memory_moved() -> None:
    config = hisparse.Config(top_k=4, device_buffer_size=8, row_bytes=32, block_size=4, hot_block_size=4)
    leader = _bound_runtime(config)
    follower = _bound_runtime(config, leader=leader)
    leader.request_state_indices = torch.tensor([0], dtype=torch.int32)
    topk = torch.tensor([[1, 2, 3, 60]], dtype=torch.int32)
    req = torch.tensor([0], dtype=torch.int32)
    rows = torch.zeros((1, 32), dtype=torch.uint8)
    slots = torch.tensor([1], dtype=torch.int32)

    def step(**kwargs):
        leader.begin_forward()
        follower.begin_forward()
        leader.swap_in(topk, req, **kwargs)

    step()
    leader.host_cache.set_(torch.empty(0, dtype=torch.uint8))  # the bound memory would be freed
    with pytest.raises(RuntimeError, match="kv_cache: its memory moved"):
        step()
    with pytest.raises(RuntimeError, match="kv_cache: its memory moved"):
        leader.mirror_rows(rows, slots)
    with pytest.raises(RuntimeError, match="kv_cache: its memory moved"):
        leader.write(rows, req, slots)
    leader.bind_source_cache(torch.zeros((64, 32), dtype=torch.uint8))  # rebinding makes it usable again
    step()

    follower.hot_block_table.resize_(1 << 16)  # reallocates the table's storage
    step()  # without prefetch the leader stages no follower
    with pytest.raises(RuntimeError, match="block_table \\(bound to follower 0 of this leader\\): its memory moved"):
        step(prefetch=True)
    with pytest.raises(RuntimeError, match="block_table: its memory moved"):
        follower.swap_in(num_tokens=1)
    follower.bind_hot_cache(torch.zeros(3 * 4 * 32, dtype=torch.uint8), byte_offset=0, block_stride=4 * 32,
                            num_blocks=3, block_size=4, block_table=torch.tensor([[1, 2]], dtype=torch.int32))
    step(prefetch=True)
    follower.swap_in(num_tokens=1)


def test_a_staging_plan_keeps_its_storage_and_refuses_a_reallocated_one() -> None:
    args = (hisparse._C.DEVICE_CPU, 0, 2, 4, 4, 8)
    storage = torch.zeros(hisparse.StagingPlan.storage_bytes(*args), dtype=torch.uint8)
    plan = hisparse.StagingPlan(*args, storage)
    table = torch.tensor([[3, 5, 0, 0], [5, 9, 0, 0]], dtype=torch.int32)
    lens = torch.tensor([8, 8], dtype=torch.int32)
    plan.build(table, lens)
    expected = plan.block_table.clone()
    storage.set_(torch.empty(0, dtype=torch.uint8))  # the plan keeps the memory it was made on
    gc.collect()
    plan.build(table, lens)
    assert torch.equal(plan.block_table, expected)
    host = torch.arange(16 * 4, dtype=torch.int32).view(16, 4)
    hisparse.staging.gather_prefill_cache(plan, host)

    storage = torch.zeros(hisparse.StagingPlan.storage_bytes(*args), dtype=torch.uint8)
    plan = hisparse.StagingPlan(*args, storage)
    plan.build(table, lens)
    view = plan.block_table
    storage.resize_(1 << 22)  # reallocates the plan's memory
    with pytest.raises(RuntimeError, match="storage: the plan's buffer was reallocated"):
        plan.build(table, lens)
    with pytest.raises(RuntimeError, match="storage: the plan's buffer was reallocated"):
        hisparse.staging.gather_prefill_cache(plan, host)
    assert torch.equal(view, expected), "its views follow the storage (resize_ keeps the bytes)"


def test_a_host_pool_serves_one_kv_cache_at_a_time() -> None:
    config = hisparse.Config(top_k=4, device_buffer_size=8, row_bytes=32, block_size=4, hot_block_size=4)
    sizes = dict(num_layers=1, max_requests=1, max_seq_len=16)
    pool = hisparse.HostPool(hisparse.KVCache.host_bytes(config, **sizes), register="never")
    first = hisparse.KVCache(config, **sizes, host_pool=pool)
    with pytest.raises(ValueError, match="host_pool: the pool already holds the host cache of another KV cache"):
        hisparse.KVCache(config, **sizes, host_pool=pool)
    first.admit(0)
    first.begin_forward(torch.tensor([1], dtype=torch.int32))
    row = torch.full((1, 32), 7, dtype=torch.uint8)
    first.write(0, row, torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
    del first
    gc.collect()
    second = hisparse.KVCache(config, **sizes, host_pool=pool)
    second.admit(0)


def test_a_kv_cache_keeps_its_borrowed_pool_mapped_for_its_views() -> None:
    config = hisparse.Config(top_k=4, device_buffer_size=8, row_bytes=32, block_size=4, hot_block_size=4)
    sizes = dict(num_layers=2, max_requests=2, max_seq_len=16)
    pool = hisparse.HostPool(max(hisparse.KVCache.host_bytes(config, **sizes), 1 << 16), register="never")
    address = pool.data_ptr
    kv = hisparse.KVCache(config, **sizes, host_pool=pool)
    kv.admit(0)
    kv.begin_forward(torch.tensor([3, 0], dtype=torch.int32))
    rows = torch.arange(3 * 32, dtype=torch.int32).to(torch.uint8).view(3, 32)
    kv.write(0, rows, torch.zeros(3, dtype=torch.int32), torch.arange(3, dtype=torch.int32))
    host = kv.host_cache
    with pytest.raises(RuntimeError, match="view.*still alive"):
        pool.release()  # the cache holds its host cache in the pool
    del kv
    gc.collect()
    with pytest.raises(RuntimeError, match="view.*still alive"):
        pool.release()  # and so does the view of it
    del pool
    gc.collect()
    assert _mapped(address)
    slot = 4  # request 0's first host block is block 1
    assert torch.equal(host[slot: slot + 3, 0], rows), "the view still shows the rows written"
    del host
    gc.collect()
    assert not _mapped(address), "the last view of the cache's host cache unmaps the pool"


def test_a_released_borrowed_pool_refuses_the_cache_and_keeps_its_views_mapped() -> None:
    config = hisparse.Config(top_k=4, device_buffer_size=8, row_bytes=32, block_size=4, hot_block_size=4)
    sizes = dict(num_layers=1, max_requests=1, max_seq_len=8)
    pool = hisparse.HostPool(1 << 16, register="never")
    kv = hisparse.KVCache(config, **sizes, host_pool=pool)
    kv.admit(0)
    kv.begin_forward(torch.tensor([1], dtype=torch.int32))
    pool.release(force=True)
    row = torch.full((1, 32), 7, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="host_cache.*released"):
        kv.write(0, row, torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="host_cache.*released"):
        kv.swap_in(0, torch.tensor([[0, -1, -1, -1]], dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
    assert int(kv.host_cache.sum()) == 0, "mapped, not written"


def test_runtimes_and_caches_keep_their_host_events_alive() -> None:
    config = hisparse.Config(top_k=4, device_buffer_size=8, row_bytes=32, block_size=4, hot_block_size=4)
    runtime = hisparse.Runtime(config, max_num_reqs=1)
    runtime.bind_source_cache(torch.zeros((64, 32), dtype=torch.uint8))
    runtime.bind_hot_cache(torch.zeros(3 * 4 * 32, dtype=torch.uint8), byte_offset=0, block_stride=4 * 32,
                           num_blocks=3, block_size=4, block_table=torch.tensor([[1, 2]], dtype=torch.int32))
    c_runtime = hisparse.Runtime(config, max_num_reqs=1)
    c_runtime.bind_source_cache(torch.zeros((64, 32), dtype=torch.uint8))
    c_runtime.bind_hot_cache(torch.zeros(3 * 4 * 32, dtype=torch.uint8), byte_offset=0, block_stride=4 * 32,
                             num_blocks=3, block_size=4, block_table=torch.tensor([[1, 2]], dtype=torch.int32))
    runtime.set_host_sharing("writer", hisparse.IpcEvent("cpu"))
    c_runtime._rt.set_host_sharing(1, _C.IpcEvent(_C.DEVICE_CPU, 0))  # the only reference is the runtime's
    kv = hisparse.KVCache(config, num_layers=1, max_requests=1, max_seq_len=8, host_event=hisparse.IpcEvent("cpu"))
    gc.collect()
    row, zero = torch.full((1, 32), 5, dtype=torch.uint8), torch.zeros(1, dtype=torch.int32)
    for r in (runtime, c_runtime):
        r.write(row, zero, torch.tensor([3], dtype=torch.int32), request_state_indices=zero)  # records the event
        assert torch.equal(r.host_cache[3], row[0])
    kv.admit(0)
    kv.begin_forward(torch.tensor([1], dtype=torch.int32))
    kv.write(0, row, zero, zero)
    with pytest.raises(TypeError, match="event: expected a hisparse._C.IpcEvent or None, got int"):
        c_runtime._rt.set_host_sharing(1, 12345)


@pytest.mark.slow
def test_views_alive_at_exit_leave_stderr_empty() -> None:
    code = textwrap.dedent("""
        import numpy as np, torch, hisparse
        i32 = lambda v: torch.tensor(v, dtype=torch.int32)
        config = hisparse.Config(top_k=4, device_buffer_size=8, row_bytes=32, block_size=4, hot_block_size=4)
        runtime = hisparse.Runtime(config, max_num_reqs=2)
        pool = hisparse.HostPool(1 << 16)
        runtime.bind_source_cache(pool.view("uint8", (64, 32)))
        slab = torch.zeros(5 * 4 * 32, dtype=torch.uint8)
        runtime.bind_hot_cache(slab, byte_offset=0, block_stride=128, num_blocks=5, block_size=4,
                               block_table=i32([[1, 2], [3, 4]]))
        runtime.request_state_indices = i32([0, 1])
        runtime.begin_forward()
        kept_attention = runtime.swap_in(i32([[1, 2, 3, 4], [5, 6, 7, 8]]), i32([0, 1]))
        kept_state = runtime.lru_slots
        group = hisparse.IndexGroup(max_num_reqs=2, top_k=4, device_buffer_size=8)
        kept_result = group.resolve(i32([[1, 2, 3, 4]]), i32([0]), i32([0]), i32([[1, 2]]), host_rows=64,
                                    hot_block_size=4)
        kept_plan_rows = hisparse.build_staging_plan(i32([[1, 2]]), i32([8]), 4, 4).row_ids
        kept_numpy_rows = hisparse.build_staging_plan(np.array([[1, 2]], np.int32), np.array([8], np.int32),
                                                      4, 4).row_ids
        kept_pool_view = pool.view("uint8", (16,), numpy=True)
        pool.release(force=True)
        kv = hisparse.KVCache(config, num_layers=1, max_requests=1, max_seq_len=8,
                              host_pool=hisparse.HostPool(1 << 16, register="never"),
                              host_event=hisparse.IpcEvent("cpu"))
        kept_kv_host, kept_kv_slab = kv.host_cache, kv.slab
        del kv
        print("done")
        """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "done"
    assert result.stderr == "", result.stderr


def test_no_driver_is_said_as_such() -> None:
    reason = _C.cuda_unavailable_reason()
    if not _C.build_info()["cuda_compiled"] or _C.cuda_device_count() > 0:
        pytest.skip("needs the CUDA backend on a machine without a device")
    if ctypes.util.find_library("cuda") is None:
        assert "no CUDA driver is installed" in reason, reason
    assert "insufficient" not in reason.lower() or ctypes.util.find_library("cuda") is not None, reason


# ---------------------------------------------------------------------- CUDA
@pytest.fixture
def cuda() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


@requires_cuda
@pytest.mark.sanitize
def test_cuda_device_mismatch_is_named(cuda: torch.device) -> None:
    host = torch.randint(0, 256, (8, 32), dtype=torch.uint8).pin_memory()
    hot = torch.zeros((2, 4, 32), dtype=torch.uint8, device=cuda)
    rows = torch.tensor([[1, 2]], dtype=torch.int32, device=cuda)
    counts = torch.tensor([2], dtype=torch.int32)  # on the host: wrong
    with pytest.raises(ValueError, match="swap_counts: expected a tensor on cuda"):
        ops.gather_compact(host, hot, rows, rows, counts, hot_block_size=4)
    ops.gather_compact(host, hot, rows, rows, counts.to(cuda), hot_block_size=4)
    torch.cuda.synchronize()
    assert torch.equal(hot.view(8, 32)[1:3].cpu(), host[1:3])


@requires_cuda
@pytest.mark.sanitize
def test_cuda_unregistered_host_memory_is_refused(cuda: torch.device) -> None:
    host = torch.randint(0, 256, (8, 32), dtype=torch.uint8)  # pageable
    hot = torch.zeros((2, 4, 32), dtype=torch.uint8, device=cuda)
    rows = torch.tensor([[1, 2]], dtype=torch.int32, device=cuda)
    counts = torch.tensor([2], dtype=torch.int32, device=cuda)
    with pytest.raises(ValueError, match="host_cache: host memory that is not pinned or registered"):
        ops.gather_compact(host, hot, rows, rows, counts, hot_block_size=4)
    ops.gather_compact(host.pin_memory(), hot, rows, rows, counts, hot_block_size=4)
    torch.cuda.synchronize()
    assert torch.equal(hot.view(8, 32)[1:3].cpu(), host[1:3])


@requires_cuda
@pytest.mark.sanitize
@pytest.mark.parametrize("variant", ["warp_per_row", "row_persistent", "sorted"])
def test_cuda_gather_at_the_stride_bound_matches_the_cpu(cuda: torch.device, variant: str) -> None:
    host = torch.randint(0, 256, (8, 32), dtype=torch.uint8)
    swap_host = torch.tensor([[1, 2, 3, 4, 5, 6, -1, 9]], dtype=torch.int32)
    swap_device = torch.tensor([[0, 5, INT32_MAX, INT32_MAX - 1, 2**30, 3, 7, 6]], dtype=torch.int32)
    counts = torch.tensor([8], dtype=torch.int32)
    for block, stride in ((4, INT32_MAX), (1, INT32_MAX), (4, 8), (7, 2**30)):
        cpu_hot = torch.zeros((12, 32), dtype=torch.uint8)
        ops.gather_compact(host, cpu_hot, swap_host, swap_device, counts, hot_block_size=block,
                           hot_block_stride=stride)
        gpu_hot = torch.zeros((12, 32), dtype=torch.uint8, device=cuda)
        ops.gather_compact(host.pin_memory(), gpu_hot, swap_host.to(cuda), swap_device.to(cuda), counts.to(cuda),
                           hot_block_size=block, hot_block_stride=stride, variant=variant)
        torch.cuda.synchronize()
        assert torch.equal(gpu_hot.cpu(), cpu_hot), (block, stride)


@requires_cuda
@pytest.mark.sanitize
def test_cuda_fused_gather_at_the_stride_bound_matches_the_cpu(cuda: torch.device) -> None:
    # Hot blocks far past the hot cache (attention indices still int32): the
    # resolver computes their offsets (block x stride + row, up to 2^58) in
    # range and skips them, as the CPU does.
    def run(device: torch.device) -> List[torch.Tensor]:
        i32 = lambda v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
        host = torch.arange(64 * 32, dtype=torch.int32).to(torch.uint8).view(64, 32)
        host = host.pin_memory() if device.type == "cuda" else host
        hot = torch.zeros((3, 4, 32), dtype=torch.uint8, device=device)
        group = hisparse.IndexGroup(max_num_reqs=2, top_k=4, device_buffer_size=8, device=device)
        outs = {n: torch.zeros((2, 4), dtype=torch.int32, device=device) for n in
                ("out_attention", "out_hot_rows", "out_resolved", "out_miss_mask", "out_swap_host_rows",
                 "out_swap_device_rows")}
        ops.resolve_residency(i32([[1, 2, 3, 4], [5, 6, 7, 8]]), i32([0, 1]), i32([0, 1]),
                              group.device_global_indices, group.lru_slots,
                              i32([[0, 2**27], [1, 2**28]]), hot_block_size=4, attention_block_stride=4,
                              host_rows=64, max_union_rows=8, **outs,
                              out_valid_counts=torch.zeros(2, dtype=torch.int32, device=device),
                              out_swap_counts=torch.zeros(2, dtype=torch.int32, device=device),
                              gather_host_cache=host, gather_hot_cache=hot.view(12, 32),
                              gather_hot_block_stride=INT32_MAX)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return [hot.cpu(), group.device_global_indices.cpu(), outs["out_swap_device_rows"].cpu()]

    for mine, theirs in zip(run(cuda), run(torch.device("cpu"))):
        assert torch.equal(mine, theirs)


@requires_cuda
@pytest.mark.sanitize
def test_cuda_aliased_outputs_are_refused(cuda: torch.device) -> None:
    group = hisparse.IndexGroup(max_num_reqs=2, top_k=4, device_buffer_size=8, device=cuda)
    topk = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=torch.int32, device=cuda)
    req = torch.tensor([0, 1], dtype=torch.int32, device=cuda)
    before = group.lru_slots.clone()
    with pytest.raises(ValueError, match="out_attention.*index group's state"):
        group.resolve(topk, req, req, torch.tensor([[1, 2], [3, 4]], dtype=torch.int32, device=cuda),
                      host_rows=64, hot_block_size=4, out_attention=group.device_global_indices[:, :4])
    torch.cuda.synchronize()
    assert torch.equal(group.lru_slots, before)
    hot = torch.zeros((2, 4, 32), dtype=torch.uint8, device=cuda)
    with pytest.raises(ValueError, match="hot_cache: shares memory with swap_host_rows"):
        ops.gather_compact(torch.zeros((8, 32), dtype=torch.uint8).pin_memory(), hot,
                           hot.view(-1)[:8].view(torch.int32).view(1, 2), topk[:1, :2], req[:1], hot_block_size=4)


@requires_cuda
@pytest.mark.sanitize
def test_cuda_kv_kernels_refuse_unregistered_host_memory_other_devices_and_aliases(cuda: torch.device) -> None:
    i32 = lambda v, device=cuda: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    rows = torch.full((2, 32), 7, dtype=torch.uint8, device=cuda)
    req, positions, states = i32([0, 0]), i32([1, 2]), i32([0])
    with pytest.raises(ValueError, match="host_cache: host memory that is not pinned or registered"):
        ops.write_rows(rows, req, positions, states, host_cache=torch.zeros((8, 32), dtype=torch.uint8))
    host = torch.zeros((8, 32), dtype=torch.uint8).pin_memory()
    with pytest.raises(ValueError, match="req_id_per_token: expected a tensor on cuda"):
        ops.write_rows(rows, req.cpu(), positions, states, host_cache=host)
    hot = torch.zeros((2, 4, 32), dtype=torch.uint8, device=cuda)
    dgi = torch.full((1, 8), -1, dtype=torch.int32, device=cuda)
    with pytest.raises(ValueError, match="hot_cache: shares memory with device_global_indices"):
        ops.write_rows(rows, req, positions, states, host_cache=host, hot_cache=dgi.view(torch.uint8).view(1, 1, 32),
                       hot_block_table=i32([[0, 1]]), device_global_indices=dgi)
    ops.write_rows(rows, req, positions, states, host_cache=host, hot_cache=hot, hot_block_table=i32([[0, 1]]),
                   device_global_indices=dgi)
    torch.cuda.synchronize()
    assert (host[1:3] == 7).all() and not host[0].any() and not host[3:].any()
    indices = i32([[1, 2, -1, 40]])
    with pytest.raises(ValueError, match="out: expected a tensor on cuda"):
        ops.read_rows(host.to(cuda), indices, torch.zeros((1, 4, 32), dtype=torch.uint8))
    with pytest.raises(ValueError, match="out: shares memory with cache"):
        ops.read_rows(hot.view(8, 32), indices, hot[:1])
    out = torch.zeros((1, 4, 32), dtype=torch.uint8, device=cuda)
    ops.read_rows(host.to(cuda), indices, out)
    torch.cuda.synchronize()
    assert (out[0, :2].cpu() == 7).all() and not out[0, 2:].cpu().any()
    table = torch.full((1, 4), 9, dtype=torch.int32, device=cuda)
    with pytest.raises(ValueError, match="seq_lens: expected a tensor on cuda"):
        ops.update_residency(table, states, i32([5], "cpu"), i32([[3]]), table_block_size=4, num_pages=1)
    ops.update_residency(table, states, i32([5]), i32([[3]]), table_block_size=4, num_pages=1)
    torch.cuda.synchronize()
    assert table.cpu().tolist() == [[0, 3, 0, 0]]


@requires_cuda
@pytest.mark.sanitize
def test_cuda_kv_cache_refuses_other_devices_and_outputs_over_its_memory(cuda: torch.device) -> None:
    config = hisparse.Config(top_k=4, device_buffer_size=8, row_bytes=32, block_size=4, hot_block_size=4)
    kv = hisparse.KVCache(config, num_layers=2, layer_groups=[0, 0], max_requests=1, max_seq_len=16, resident_pages=1,
                          device=cuda)
    kv.admit(0)
    with pytest.raises(ValueError, match="seq_lens: expected a tensor on cuda"):
        kv.begin_forward(torch.tensor([3], dtype=torch.int32))
    kv.begin_forward(torch.tensor([3], dtype=torch.int32, device=cuda))
    rows = torch.full((3, 32), 5, dtype=torch.uint8, device=cuda)
    req, positions = torch.zeros(3, dtype=torch.int32, device=cuda), torch.arange(3, dtype=torch.int32, device=cuda)
    with pytest.raises(ValueError, match="rows: expected a tensor on cuda"):
        kv.write(0, rows.cpu(), req, positions)
    with pytest.raises(ValueError, match="rows: shares memory with"):
        kv.write(0, kv.layer_view(0)[1, :3], req, positions)
    for layer in range(2):
        kv.write(layer, rows, req, positions)
    attention = kv.swap_in(0, torch.tensor([[0, 1, 2, -1]], dtype=torch.int32, device=cuda), req[:1])
    kv.swap_in(1, num_tokens=1)
    with pytest.raises(ValueError, match="out: shares memory with the cache's slab and tables"):
        kv.read(0, attention, kv.layer_view(1)[1:2])
    with pytest.raises(ValueError, match="out: expected a tensor on cuda"):
        kv.read(0, attention, torch.zeros((1, 4, 32), dtype=torch.uint8))
    for layer in range(2):
        out = kv.read(layer, attention)
        torch.cuda.synchronize()
        assert (out[0, :3].cpu() == 5).all() and not out[0, 3].cpu().any()


@requires_cuda
@pytest.mark.sanitize
def test_cuda_released_registered_pool_is_refused(cuda: torch.device) -> None:
    pool = hisparse.HostPool(1 << 20, register="always")
    rows = pool.view("uint8", (64, 32))
    rows.fill_(3)
    pool.release(force=True)
    hot = torch.zeros((2, 4, 32), dtype=torch.uint8, device=cuda)
    one = torch.tensor([[1]], dtype=torch.int32, device=cuda)
    with pytest.raises(RuntimeError, match="host_cache: .*released"):
        ops.gather_compact(rows, hot, one, one, torch.tensor([1], dtype=torch.int32, device=cuda), hot_block_size=4)
    assert int(rows[5, 5]) == 3
    del rows
    gc.collect()
    assert os.path.exists("/proc/self/maps")
