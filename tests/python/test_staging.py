"""Prefill staging (hisparse.staging): staging_remap, build_staging_plan,
StagingPlan.ensure_gpu_sources, gather_resident_rows and gather_prefill_cache
(free function and Runtime method), each compared with a plain-Python model
that loops over blocks and, on random inputs, with the torch oracle
(staging_oracle.py) bit for bit; NumPy inputs; ids past the int32 row range;
shapes that depend on input shapes only; no host syncs and CUDA-graph capture
on CUDA, where CUDA also meets the CPU reference at production sizes; bad
inputs."""

from __future__ import annotations

import random

import pytest
import staging_oracle

import hisparse
from hisparse import staging

from conftest import requires_cuda, sanitize_subset

torch = pytest.importorskip("torch")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_memory(tensor, device):
    """`tensor` in host memory a kernel of `device` can read (pinned on CUDA)."""
    return tensor.pin_memory() if device.type == "cuda" else tensor.clone()


def random_bytes(shape, gen):
    return torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)


# ---------------------------------------------------------------- plain-Python models


def model_remap(ids, block_size):
    """(compact id per entry, row_ids list) of a flat list of block ids."""
    distinct = sorted({0} | {max(0, v) for v in ids})
    compact = {v: k for k, v in enumerate(distinct)}
    row_ids = []
    for k in range(len(ids) + 1):
        for o in range(block_size):
            row_ids.append(distinct[k] * block_size + o if k < len(distinct) else -1)
    return [compact[max(0, v)] for v in ids], row_ids


def model_packed_entries(table, seq_lens, block_size, capacity):
    """The (row, col) of every packed slot that holds a real entry, in slot order."""
    entries, slot = [], 0
    for row in range(len(table)):
        used = max(0, -(-seq_lens[row] // block_size))
        for col in range(used):
            if slot >= capacity:
                return entries
            if col < len(table[row]):
                entries.append((row, col))
            slot += 1  # a slot past column C still takes capacity
    return entries


def model_plan(table, seq_lens, block_size, capacity):
    """dict of the plan's lists: block_table, row_ids, dst_rows, miss_mask."""
    entries = model_packed_entries(table, seq_lens, block_size, capacity)
    referenced = [table[r][c] for r, c in entries] + [0] * (capacity - len(entries))
    compact, row_ids = model_remap(referenced, block_size)
    new_table = [[0] * len(row) for row in table]
    for (r, c), k in zip(entries, compact):
        new_table[r][c] = k
    return {
        "block_table": new_table,
        "row_ids": row_ids,
        "dst_rows": list(range(len(row_ids))),
        "miss_mask": [int(v >= 0) for v in row_ids],
    }


def model_gpu_sources(plan, resident, states, resident_block_size):
    """(gpu_row_ids, miss_mask) lists after ensure_gpu_sources, for a compatible call."""
    block_size = plan["block_size"]
    table, row_ids = plan["block_table"], plan["row_ids"]
    pages_per_block = block_size // resident_block_size
    gpu, miss = [], []
    for k in range(len(row_ids) // block_size):
        host_block = row_ids[k * block_size] // block_size if row_ids[k * block_size] >= 0 else -1
        # First block-table entry (row-major) that references staged block k.
        first = next(((r, c) for r in range(len(table)) for c in range(len(table[r])) if table[r][c] == k), None)
        pages = [0] * pages_per_block
        if first is not None:
            r, c = first
            s = states[r]
            if 0 <= s < len(resident):  # padding / unknown state rows have no resident pages
                for i in range(pages_per_block):
                    col = c * pages_per_block + i
                    pages[i] = resident[s][col] if col < len(resident[s]) else 0
        for o in range(block_size):
            valid = row_ids[k * block_size + o] >= 0
            page = pages[o // resident_block_size]
            hit = valid and host_block > 0 and page > 0
            gpu.append(page * resident_block_size + o % resident_block_size if hit else -1)
            miss.append(int(valid and not hit))
    return gpu, miss


def flat(tensor):
    return tensor.cpu().reshape(-1).tolist()


def random_case(rng, *, rows=None, cols=None, block_size=None, pool=None, capacity=None):
    """A batch with shared blocks, zero and negative entries and uneven lengths."""
    rows = rng.randint(1, 6) if rows is None else rows
    cols = rng.randint(1, 9) if cols is None else cols
    block_size = rng.choice([1, 2, 4, 8, 16]) if block_size is None else block_size
    pool = rng.randint(2, 3 * rows * cols) if pool is None else pool
    shared = [rng.randint(1, pool) for _ in range(cols)]  # a common prefix some requests share
    table = []
    for _ in range(rows):
        row = []
        for c in range(cols):
            roll = rng.random()
            if roll < 0.25:
                row.append(shared[c])
            elif roll < 0.35:
                row.append(0)
            elif roll < 0.4:
                row.append(-1)
            else:
                row.append(rng.randint(1, pool))
        table.append(row)
    seq_lens = [rng.choice([0, rng.randint(1, cols * block_size), cols * block_size + rng.randint(1, 20)])
                for _ in range(rows)]
    need = sum(max(0, -(-s // block_size)) for s in seq_lens)
    if capacity is None:
        capacity = rng.choice([need, need + rng.randint(1, 5), max(0, need - rng.randint(1, 4)), 0])
    return table, seq_lens, block_size, capacity


def plan_lists(plan):
    return {
        "block_table": plan.block_table.cpu().tolist(),
        "row_ids": flat(plan.row_ids),
        "dst_rows": flat(plan.dst_rows),
        "miss_mask": flat(plan.miss_mask),
        "block_size": plan.block_size,
    }


# ---------------------------------------------------------------- staging_remap


@pytest.mark.parametrize("shape", [(0,), (1,), (7,), (3, 5), (2, 3, 4)])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_staging_remap_matches_model(device, shape, dtype):
    rng = random.Random(len(shape) * 100 + sum(shape) + (dtype == torch.int64))
    for block_size in (1, 3, 8):
        numel = 1
        for n in shape:
            numel *= n
        values = [rng.choice([-3, -1, 0, rng.randint(1, 12), rng.randint(100, 120)]) for _ in range(numel)]
        table = torch.tensor(values, dtype=dtype).view(shape).to(device)
        new_table, row_ids = staging.staging_remap(table, block_size)
        compact, expected_rows = model_remap(values, block_size)
        assert new_table.shape == table.shape and new_table.dtype == torch.int32
        assert row_ids.shape == (1, (numel + 1) * block_size) and row_ids.dtype == torch.int32
        assert new_table.device == table.device and row_ids.device == table.device
        assert flat(new_table) == compact
        assert flat(row_ids) == expected_rows


def test_staging_remap_by_hand():
    table = torch.tensor([[7, 3, 7], [0, -5, 12]], dtype=torch.int32)
    new_table, row_ids = staging.staging_remap(table, 2)
    assert new_table.tolist() == [[2, 1, 2], [0, 0, 3]]
    # ids 0, 3, 7, 12 in ascending order, then 3 unused blocks of -1.
    assert row_ids.tolist() == [[0, 1, 6, 7, 14, 15, 24, 25] + [-1] * 6]


# ---------------------------------------------------------------- build_staging_plan


def test_build_staging_plan_matches_model(device):
    rng = random.Random(11)
    for case in range(300):
        table, seq_lens, block_size, capacity = random_case(rng)
        dtype = rng.choice([torch.int32, torch.int64])
        extra = rng.randint(0, 2)  # seq_lens may be longer than the table (padding rows)
        lens = seq_lens + [rng.randint(0, 50) for _ in range(extra)]
        plan = hisparse.build_staging_plan(
            torch.tensor(table, dtype=dtype).to(device), torch.tensor(lens, dtype=dtype).to(device), block_size,
            capacity,
        )
        expected = model_plan(table, seq_lens, block_size, capacity)
        got = plan_lists(plan)
        for name in ("block_table", "row_ids", "dst_rows", "miss_mask"):
            assert got[name] == expected[name], (case, name, table, seq_lens, block_size, capacity)
        assert plan.gpu_row_ids is None and plan.gpu_source_key is None
        assert plan.block_size == block_size and plan.num_blocks == capacity + 1


def test_build_staging_plan_by_hand():
    table = torch.tensor([[5, 3, 0, 7], [3, 9, -1, 4]], dtype=torch.int32)
    plan = hisparse.build_staging_plan(table, torch.tensor([3, 5], dtype=torch.int32), 2, 6)
    # Request 0 reads blocks 5, 3; request 1 reads 3, 9, -1 (null); 7 and 4 are not read.
    assert plan.block_table.tolist() == [[2, 1, 0, 0], [1, 3, 0, 0]]
    assert plan.row_ids.tolist() == [[0, 1, 6, 7, 10, 11, 18, 19] + [-1] * 6]
    assert plan.miss_mask.tolist() == [[1] * 8 + [0] * 6]
    # Capacity 3: request 1's second and third block do not fit.
    small = hisparse.build_staging_plan(table, torch.tensor([3, 5], dtype=torch.int32), 2, 3)
    assert small.block_table.tolist() == [[2, 1, 0, 0], [1, 0, 0, 0]]
    assert small.row_ids.tolist() == [[0, 1, 6, 7, 10, 11, -1, -1]]


@pytest.mark.parametrize("rows,cols,capacity", [(0, 4, 3), (3, 0, 2), (0, 0, 0), (2, 3, 0)])
def test_build_staging_plan_empty_shapes(device, rows, cols, capacity):
    table = torch.ones((rows, cols), dtype=torch.int32, device=device)
    plan = hisparse.build_staging_plan(table, torch.full((rows,), 9, dtype=torch.int32, device=device), 4, capacity)
    assert plan.block_table.shape == (rows, cols)
    assert plan.row_ids.shape == (1, (capacity + 1) * 4)
    expected = model_plan(table.cpu().tolist(), [9] * rows, 4, capacity)
    assert flat(plan.row_ids) == expected["row_ids"] and flat(plan.miss_mask) == expected["miss_mask"]


def test_plan_shapes_depend_on_input_shapes_only(device):
    """Two batches of equal shapes but different data give outputs of equal shapes."""
    rng = random.Random(5)
    rows, cols, block_size, capacity = 4, 6, 4, 13
    shapes = set()
    for _ in range(6):
        table, seq_lens, _, _ = random_case(rng, rows=rows, cols=cols, block_size=block_size, capacity=capacity)
        plan = hisparse.build_staging_plan(
            torch.tensor(table, dtype=torch.int32, device=device), torch.tensor(seq_lens, device=device),
            block_size, capacity,
        )
        resident = torch.randint(0, 4, (5, 12), dtype=torch.int32, device=device)
        plan.ensure_gpu_sources(resident, torch.tensor([0, 1, 2, 3], dtype=torch.int32, device=device), 2)
        n = (capacity + 1) * block_size
        assert plan.block_table.shape == (rows, cols)
        for tensor in (plan.row_ids, plan.dst_rows, plan.miss_mask, plan.gpu_row_ids):
            assert tensor.shape == (1, n) and tensor.dtype == torch.int32 and tensor.device.type == device.type
        host = host_memory(random_bytes((60 * block_size, 32), torch.Generator().manual_seed(1)), device)
        staged = staging.gather_prefill_cache(plan, host, torch.zeros((5, 2, 32), dtype=torch.uint8, device=device))
        assert staged.shape == (capacity + 1, block_size, 32)
        shapes.add(tuple(staged.shape))
    assert len(shapes) == 1


# ---------------------------------------------------------------- ensure_gpu_sources


def make_plan(rng, device, **kwargs):
    table, seq_lens, block_size, capacity = random_case(rng, **kwargs)
    plan = hisparse.build_staging_plan(
        torch.tensor(table, dtype=torch.int32, device=device), torch.tensor(seq_lens, device=device), block_size,
        capacity,
    )
    return plan, table, seq_lens


@pytest.mark.parametrize("resident_block_size", [1, 2, 4, 8])
def test_ensure_gpu_sources_matches_model(device, resident_block_size):
    rng = random.Random(resident_block_size)
    for case in range(120):
        plan, table, _ = make_plan(rng, device, block_size=8)
        rows = len(table)
        num_states = rng.randint(1, 7)
        res_cols = rng.randint(1, 3 * len(table[0]) * (8 // resident_block_size))
        resident = [[rng.choice([0, 0, -1, rng.randint(1, 40)]) for _ in range(res_cols)] for _ in range(num_states)]
        # Padding (-1) and out-of-table state rows are read as "no resident pages".
        states = [rng.choice([rng.randint(0, num_states - 1)] * 4 + [-1, num_states]) for _ in range(rows)]
        states += [rng.randint(-1, num_states - 1) for _ in range(rng.randint(0, 2))]
        before = plan_lists(plan)
        plan.ensure_gpu_sources(
            torch.tensor(resident, dtype=rng.choice([torch.int32, torch.int64]), device=device),
            torch.tensor(states, dtype=torch.int32, device=device),
            resident_block_size,
        )
        gpu, miss = model_gpu_sources(before, resident, states, resident_block_size)
        assert flat(plan.gpu_row_ids) == gpu, case
        assert flat(plan.miss_mask) == miss, case
        assert plan.gpu_row_ids.dtype == torch.int32 and plan.miss_mask.dtype == torch.int32
        assert plan.gpu_row_ids.shape == plan.row_ids.shape == plan.miss_mask.shape
        # Only the miss mask and the GPU sources change.
        after = plan_lists(plan)
        for name in ("block_table", "row_ids", "dst_rows"):
            assert after[name] == before[name]


def test_ensure_gpu_sources_by_hand():
    table = torch.tensor([[5, 3], [3, 9]], dtype=torch.int32)
    plan = hisparse.build_staging_plan(table, torch.tensor([8, 8], dtype=torch.int32), 4, 4)
    # Staged blocks: 0 (null), 3, 5, 9. Host block 3 is first referenced by (0, 1), so
    # request 0's pages 2 and 3 serve it even though request 1 holds it too.
    resident = torch.tensor([[0, 6, 0, 8], [4, 0, 2, 0], [1, 1, 1, 1]], dtype=torch.int32)
    plan.ensure_gpu_sources(resident, torch.tensor([0, 1], dtype=torch.int32), 2)
    gpu = plan.gpu_row_ids.view(-1, 4).tolist()
    assert gpu[0] == [-1] * 4  # the null block is never resident
    assert gpu[1] == [-1, -1, 16, 17]  # host 3: pages (0, 8)
    assert gpu[2] == [-1, -1, 12, 13]  # host 5: pages (0, 6)
    assert gpu[3] == [4, 5, -1, -1]  # host 9: request 1 pages (2, 0)
    assert gpu[4] == [-1] * 4  # unused
    assert plan.miss_mask.view(-1, 4).tolist() == [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0] * 4]


def test_ensure_gpu_sources_early_returns(device):
    table = torch.tensor([[1, 2, 3, 4], [2, 5, 6, 0], [7, 8, 9, 10]], dtype=torch.int32, device=device)
    plan = hisparse.build_staging_plan(table, torch.tensor([32, 20, 8], device=device), 8, 12)
    host_only = flat(plan.miss_mask)
    states = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    resident = torch.randint(1, 9, (3, 16), dtype=torch.int32, device=device)

    # block_size not a multiple of resident_block_size, a size <= 0, too few state rows:
    # nothing changes.
    for args in ((resident, states, 3), (resident, states, 0), (resident, states, -2), (resident, states[:2], 2)):
        plan.ensure_gpu_sources(*args)
        assert plan.gpu_row_ids is None and plan.gpu_source_key is None and flat(plan.miss_mask) == host_only

    plan.ensure_gpu_sources(resident, states, 2)
    assert plan.gpu_source_key == (resident.data_ptr(), 2)
    first = flat(plan.gpu_row_ids)
    gpu, miss = model_gpu_sources(plan_lists(plan) | {"miss_mask": host_only}, resident.cpu().tolist(), [0, 1, 2], 2)
    assert first == gpu and flat(plan.miss_mask) == miss

    # Same table (same storage) and page size: cached, even after the table changed in place.
    resident.zero_()
    plan.ensure_gpu_sources(resident, states, 2)
    assert flat(plan.gpu_row_ids) == first
    # Another page size or another table recomputes.
    plan.ensure_gpu_sources(resident, states, 4)
    assert plan.gpu_source_key == (resident.data_ptr(), 4)
    assert flat(plan.gpu_row_ids) == [-1] * len(first) and flat(plan.miss_mask) == host_only

    # An incompatible table after a compatible one drops the sources of the old one.
    other = torch.randint(1, 9, (3, 16), dtype=torch.int32, device=device)
    plan.ensure_gpu_sources(other, states, 2)
    assert plan.gpu_row_ids is not None and any(v >= 0 for v in flat(plan.gpu_row_ids))
    plan.ensure_gpu_sources(other, states, 3)
    assert plan.gpu_row_ids is None and plan.gpu_source_key is None and flat(plan.miss_mask) == host_only


def test_ensure_gpu_sources_without_rows_or_columns(device):
    empty = hisparse.build_staging_plan(torch.zeros((0, 4), dtype=torch.int32, device=device),
                                        torch.zeros(0, dtype=torch.int32, device=device), 4, 2)
    empty.ensure_gpu_sources(torch.ones((2, 4), dtype=torch.int32, device=device),
                             torch.zeros(2, dtype=torch.int32, device=device), 2)
    assert empty.gpu_row_ids is None  # no batch rows: nothing to resolve
    plan, _, _ = make_plan(random.Random(2), device, rows=2, cols=3, block_size=4, capacity=6)
    for resident in (torch.ones((2, 0), dtype=torch.int32, device=device),
                     torch.ones((0, 5), dtype=torch.int32, device=device)):
        plan.ensure_gpu_sources(resident, torch.zeros(2, dtype=torch.int32, device=device), 2)
        assert flat(plan.gpu_row_ids) == [-1] * plan.row_ids.shape[1]
        assert flat(plan.miss_mask) == [int(v >= 0) for v in flat(plan.row_ids)]


# ---------------------------------------------------------------- gather_resident_rows


def test_gather_resident_rows_matches_model(device):
    gen = torch.Generator().manual_seed(4)
    blocks, block_size, width = 6, 4, 16
    slab = random_bytes((blocks, 2, block_size, width), gen).to(device)
    source = slab[:, 1]  # a strided paged view: blocks 2 x block_size rows apart
    row_ids = torch.tensor([5, -1, 0, 23, 24, 100, 7, 7], dtype=torch.int32)
    destination = random_bytes((8, width), gen).to(device)
    staging.gather_resident_rows(source, destination, row_ids.to(device))
    rows = source.cpu().reshape(-1, width)
    for j, r in enumerate(row_ids.tolist()):
        expected = rows[r] if 0 <= r < blocks * block_size else rows[0]  # outside the cache: row 0
        assert torch.equal(destination[j].cpu(), expected), j
    # Another dtype of the same row size is reinterpreted, not converted.
    halves = torch.zeros((8, width // 2), dtype=torch.float16, device=device)
    staging.gather_resident_rows(source, halves, row_ids.to(device))
    assert torch.equal(halves.view(torch.uint8).cpu(), destination.cpu())


# ---------------------------------------------------------------- gather_prefill_cache


def expected_staged(plan, host_rows, resident_rows):
    """Staged rows by the model: resident copy, else host row; None where unspecified."""
    gpu = flat(plan.gpu_row_ids) if plan.gpu_row_ids is not None else [-1] * plan.row_ids.shape[1]
    out = []
    for r, g, m in zip(flat(plan.row_ids), gpu, flat(plan.miss_mask)):
        if g >= 0:
            out.append(resident_rows[g])
        elif m and r >= 0:
            out.append(host_rows[r])
        else:
            out.append(None)
    return out


@pytest.mark.parametrize("host_dims", [2, 3])
@pytest.mark.parametrize("with_resident", [False, True])
def test_gather_prefill_cache_matches_model(device, host_dims, with_resident):
    rng = random.Random(host_dims * 10 + with_resident)
    gen = torch.Generator().manual_seed(host_dims)
    block_size, width, host_blocks = 8, 48, 64
    host_cpu = torch.randn((host_blocks, block_size, width // 2), generator=gen).to(torch.float16)
    host = host_memory(host_cpu if host_dims == 3 else host_cpu.view(-1, width // 2), device)
    resident_cpu = random_bytes((40, 4, width), gen)  # uint8 rows of the same byte size
    resident = resident_cpu.to(device)
    for case in range(25):
        plan, table, seq_lens = make_plan(rng, device, block_size=block_size, pool=host_blocks - 1)
        if with_resident:
            pages = torch.randint(0, 40, (len(table) + 1, 2 * len(table[0])), generator=gen, dtype=torch.int32)
            pages[torch.rand(pages.shape, generator=gen) < 0.4] = 0
            plan.ensure_gpu_sources(pages.to(device), torch.arange(len(table), dtype=torch.int32, device=device), 4)
        staged = staging.gather_prefill_cache(plan, host, resident if with_resident else None)
        sync(device)
        assert staged.shape == (plan.num_blocks, block_size, width // 2) and staged.dtype == torch.float16
        assert staged.device.type == device.type
        got = staged.cpu().view(torch.uint8).reshape(-1, width)
        expected = expected_staged(plan, host_cpu.view(torch.uint8).reshape(-1, width), resident_cpu.reshape(-1, width))
        for j, row in enumerate(expected):
            if row is not None:
                assert torch.equal(got[j], row), (case, j)
        if not with_resident:
            # End to end: every staged entry reads its host block through the renumbered table.
            new_table = plan.block_table.cpu().tolist()
            for r, c in model_packed_entries(table, seq_lens, block_size, plan.num_blocks - 1):
                src = max(0, table[r][c])
                assert torch.equal(staged.cpu()[new_table[r][c]], host_cpu[src]), (case, r, c)


def test_gather_prefill_cache_minimum_rows(device):
    gen = torch.Generator().manual_seed(8)
    host = host_memory(random_bytes((16, 4, 32), gen), device)
    plan = hisparse.build_staging_plan(torch.tensor([[3, 5]], dtype=torch.int32, device=device),
                                       torch.tensor([8], device=device), 4, 2)
    staged = staging.gather_prefill_cache(plan, host)
    assert staged.shape == (3, 4, 32) and staged.is_contiguous()
    assert staged.untyped_storage().nbytes() >= staging.MIN_STAGED_PREFILL_ROWS * 32
    assert staging.gather_prefill_cache(plan, host, min_rows=0).untyped_storage().nbytes() == 3 * 4 * 32
    assert staging.gather_prefill_cache(plan, host, min_rows=21).untyped_storage().nbytes() == 6 * 4 * 32
    sync(device)
    assert torch.equal(staged[1].cpu(), host[3].cpu()) and torch.equal(staged[2].cpu(), host[5].cpu())


def make_runtime(device, block_size=8, row_bytes=64):
    config = hisparse.Config(top_k=8, device_buffer_size=16, max_union_rows=8, row_bytes=row_bytes,
                             block_size=block_size, hot_block_size=4)
    return hisparse.Runtime(config, max_num_reqs=2, device=device)


@pytest.mark.parametrize("host_dims", [2, 3])
def test_runtime_gather_prefill_cache(device, host_dims):
    rng = random.Random(6)
    gen = torch.Generator().manual_seed(6)
    runtime = make_runtime(device)
    with pytest.raises(RuntimeError, match="bind_source_cache"):
        runtime.gather_prefill_cache(make_plan(rng, device, block_size=8)[0])
    host_cpu = random_bytes((32, 8, 64), gen)
    host = host_memory(host_cpu if host_dims == 3 else host_cpu.view(-1, 64), device)
    runtime.bind_source_cache(host)
    resident_cpu = random_bytes((12, 2, 64), gen)
    for case in range(10):
        plan, table, _ = make_plan(rng, device, block_size=8, pool=31)
        pages = torch.randint(0, 12, (len(table), 4 * len(table[0])), generator=gen, dtype=torch.int32)
        plan.ensure_gpu_sources(pages.to(device), torch.arange(len(table), dtype=torch.int32, device=device), 2)
        staged = runtime.gather_prefill_cache(plan, resident_cpu.to(device))
        sync(device)
        assert staged.shape == (plan.num_blocks, 8, 64)
        got = staged.cpu().reshape(-1, 64)
        for j, row in enumerate(expected_staged(plan, host_cpu.reshape(-1, 64), resident_cpu.reshape(-1, 64))):
            if row is not None:
                assert torch.equal(got[j], row), (case, j)
    other = hisparse.build_staging_plan(torch.ones((1, 2), dtype=torch.int32, device=device),
                                        torch.tensor([5], device=device), 4, 2)
    expected_size = 8  # the host cache's dimension 1, or config.block_size for rows
    message = f"HiSparse staging block size 4 does not match the KV cache block size {expected_size}"
    with pytest.raises(ValueError, match=message):
        runtime.gather_prefill_cache(other)
    with pytest.raises(TypeError, match="plan"):
        runtime.gather_prefill_cache("plan")
    if device.type == "cuda":
        cpu_plan = hisparse.build_staging_plan(torch.ones((1, 2), dtype=torch.int32), torch.tensor([5]), 8, 2)
        with pytest.raises(ValueError, match="plan: expected a plan on the runtime's device"):
            runtime.gather_prefill_cache(cpu_plan)


# ---------------------------------------------------------------- bad inputs


def test_bad_inputs(device):
    table = torch.ones((2, 3), dtype=torch.int32, device=device)
    lens = torch.tensor([4, 4], dtype=torch.int32, device=device)
    build = hisparse.build_staging_plan
    with pytest.raises(TypeError, match="block_table"):
        build(table.float(), lens, 4, 4)
    with pytest.raises(TypeError, match="block_table"):
        build(table.tolist(), lens, 4, 4)
    with pytest.raises(ValueError, match="block_table"):
        build(table[0], lens, 4, 4)
    with pytest.raises(ValueError, match="seq_lens"):
        build(table, lens[:1], 4, 4)
    with pytest.raises(ValueError, match="seq_lens"):
        build(table, lens.view(2, 1), 4, 4)
    with pytest.raises(TypeError, match="seq_lens"):
        build(table, lens.to(torch.bool), 4, 4)
    with pytest.raises(ValueError, match="block_size"):
        build(table, lens, 0, 4)
    with pytest.raises(TypeError, match="block_size"):
        build(table, lens, 4.0, 4)
    with pytest.raises(ValueError, match="staging_block_capacity"):
        build(table, lens, 4, -1)
    with pytest.raises(TypeError, match="staging_block_capacity"):
        build(table, lens, 4, True)
    with pytest.raises(ValueError, match="block_size"):
        staging.staging_remap(table, -4)
    if device.type == "cuda":
        with pytest.raises(ValueError, match="seq_lens: expected a tensor on cuda"):
            build(table, lens.cpu(), 4, 4)

    plan = build(table, lens, 4, 4)
    states = torch.zeros(2, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="resident_state_rows"):
        plan.ensure_gpu_sources(torch.ones(4, dtype=torch.int32, device=device), states, 2)
    with pytest.raises(TypeError, match="state_indices"):
        plan.ensure_gpu_sources(table, states.float(), 2)
    with pytest.raises(TypeError, match="resident_block_size"):
        plan.ensure_gpu_sources(table, states, "2")

    host = host_memory(torch.zeros((16, 4, 32), dtype=torch.uint8), device)
    with pytest.raises(TypeError, match="plan"):
        staging.gather_prefill_cache(None, host)
    with pytest.raises(TypeError, match="host_cache"):
        staging.gather_prefill_cache(plan, host.numpy() if device.type == "cpu" else [1])
    with pytest.raises(ValueError, match="HiSparse staging block size 4 does not match the KV cache block size 8"):
        staging.gather_prefill_cache(plan, host.view(8, 8, 32))
    with pytest.raises(ValueError, match="min_rows"):
        staging.gather_prefill_cache(plan, host, min_rows=-1)
    with pytest.raises(ValueError, match="src_rows"):  # rows of 24 bytes: not a multiple of 16
        staging.gather_prefill_cache(plan, host_memory(torch.zeros((64, 24), dtype=torch.uint8), device))

    plan.ensure_gpu_sources(torch.ones((2, 8), dtype=torch.int32, device=device), states, 2)
    assert plan.gpu_row_ids is not None
    with pytest.raises(ValueError, match="resident_cache: the plan serves rows"):
        staging.gather_prefill_cache(plan, host)
    with pytest.raises(ValueError, match="resident_cache: expected a paged cache"):
        staging.gather_prefill_cache(plan, host, torch.zeros((4, 4, 32), dtype=torch.uint8, device=device))
    with pytest.raises(TypeError, match="resident_cache"):
        staging.gather_prefill_cache(plan, host, "cache")

    dest = torch.zeros((4, 32), dtype=torch.uint8, device=device)
    ids = torch.zeros(4, dtype=torch.int32, device=device)
    source = torch.zeros((2, 2, 32), dtype=torch.uint8, device=device)
    with pytest.raises(ValueError, match="source"):
        staging.gather_resident_rows(source.view(4, 32), dest, ids)
    with pytest.raises(ValueError, match="source"):
        staging.gather_resident_rows(source[:0], dest, ids)
    with pytest.raises(ValueError, match="destination"):
        staging.gather_resident_rows(source, dest[:, :16], ids)
    with pytest.raises(ValueError, match="row_ids"):
        staging.gather_resident_rows(source, dest, ids[:3])
    with pytest.raises(TypeError, match="row_ids"):
        staging.gather_resident_rows(source, dest, ids.float())
    # State stays valid after the errors above.
    staged = staging.gather_prefill_cache(plan, host, torch.zeros((4, 2, 32), dtype=torch.uint8, device=device))
    assert staged.shape == (5, 4, 32)


# ---------------------------------------------------------------- CUDA: no syncs, graph capture


@requires_cuda
@pytest.mark.sanitize
def test_staging_never_syncs_with_the_host():
    rng = random.Random(9)
    table, seq_lens, block_size, capacity = random_case(rng, rows=5, cols=8, block_size=8, pool=60)
    bt = torch.tensor(table, dtype=torch.int32, device="cuda")
    lens = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    resident_table = torch.randint(0, 10, (6, 32), dtype=torch.int32, device="cuda")
    states = torch.arange(5, dtype=torch.int32, device="cuda")
    host = random_bytes((64 * 8, 64), torch.Generator().manual_seed(0)).pin_memory()
    resident = torch.zeros((10, 2, 64), dtype=torch.uint8, device="cuda")
    staging.gather_prefill_cache(hisparse.build_staging_plan(bt, lens, 8, capacity), host)  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        plan = hisparse.build_staging_plan(bt, lens, block_size, capacity)
        plan.ensure_gpu_sources(resident_table, states, 2)
        staged = staging.gather_prefill_cache(plan, host, resident)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert staged.shape == (capacity + 1, block_size, 64)


@requires_cuda
def test_staging_in_cuda_graph():
    """Capture plan, GPU sources and gather once; replay with new tables and lengths."""
    rng = random.Random(10)
    gen = torch.Generator().manual_seed(10)
    rows, cols, block_size, capacity, width = 4, 6, 8, 20, 64
    host_cpu = random_bytes((48 * block_size, width), gen)
    host = host_cpu.pin_memory()
    resident_cpu = random_bytes((16, 4, width), gen)
    resident = resident_cpu.cuda()
    bt = torch.zeros((rows, cols), dtype=torch.int32, device="cuda")
    lens = torch.zeros(rows, dtype=torch.int32, device="cuda")
    pages = torch.zeros((rows, 2 * cols), dtype=torch.int32, device="cuda")
    states = torch.arange(rows, dtype=torch.int32, device="cuda")

    def step():
        plan = hisparse.build_staging_plan(bt, lens, block_size, capacity)
        plan.ensure_gpu_sources(pages, states, 4)
        return plan, staging.gather_prefill_cache(plan, host, resident)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan, staged = step()
    for replay in range(3):
        table, seq_lens, _, _ = random_case(rng, rows=rows, cols=cols, block_size=block_size, pool=47,
                                            capacity=capacity)
        page_table = torch.randint(0, 16, (rows, 2 * cols), generator=gen, dtype=torch.int32)
        bt.copy_(torch.tensor(table, dtype=torch.int32))
        lens.copy_(torch.tensor(seq_lens, dtype=torch.int32))
        pages.copy_(page_table)
        graph.replay()
        torch.cuda.synchronize()
        expected = model_plan(table, seq_lens, block_size, capacity)
        got = plan_lists(plan)
        for name in ("block_table", "row_ids", "dst_rows"):
            assert got[name] == expected[name], (replay, name)
        gpu, miss = model_gpu_sources(expected | {"block_size": block_size}, page_table.tolist(), list(range(rows)), 4)
        assert flat(plan.gpu_row_ids) == gpu and flat(plan.miss_mask) == miss
        rows_out = staged.cpu().reshape(-1, width)
        for j, row in enumerate(expected_staged(plan, host_cpu, resident_cpu.reshape(-1, width))):
            if row is not None:
                assert torch.equal(rows_out[j], row), (replay, j)


# ---------------------------------------------------------------- the C++ core against the torch oracle


def oracle_case(rng, *, max_id=None):
    """random_case, with some ids near the top of the int32 row range of its block size."""
    table, seq_lens, block_size, capacity = random_case(rng)
    top = (2**31 - block_size) // block_size  # largest id whose rows fit int32
    if max_id is None and rng.random() < 0.3:
        for row in table:
            for c in range(len(row)):
                if rng.random() < 0.2:
                    row[c] = top - rng.randint(0, 3)
    return table, seq_lens, block_size, capacity


def to_device(values, dtype, device):
    return torch.tensor(values, dtype=dtype).to(device)


def test_staging_remap_matches_the_oracle(device):
    rng = random.Random(21)
    for case in range(200):
        shape = rng.choice([(0,), (1,), (rng.randint(1, 40),), (rng.randint(1, 5), rng.randint(1, 7)), (2, 3, 4)])
        block_size = rng.choice([1, 2, 3, 8, 64])
        top = (2**31 - block_size) // block_size
        numel = 1
        for n in shape:
            numel *= n
        values = [rng.choice([-9, -1, 0, rng.randint(1, 30), rng.randint(1, 30), top, top - 1]) for _ in range(numel)]
        dtype = rng.choice([torch.int32, torch.int64])
        table = torch.tensor(values, dtype=dtype).view(shape)
        new_table, row_ids = staging.staging_remap(table.to(device), block_size)
        expected_table, expected_rows = staging_oracle.staging_remap(table, block_size)
        assert new_table.device.type == device.type and new_table.dtype == torch.int32
        assert torch.equal(new_table.cpu(), expected_table), (case, values, block_size)
        assert torch.equal(row_ids.cpu(), expected_rows), (case, values, block_size)


def test_build_staging_plan_matches_the_oracle(device):
    rng = random.Random(22)
    for case in range(300):
        table, seq_lens, block_size, capacity = oracle_case(rng)
        lens = seq_lens + [rng.randint(-5, 50) for _ in range(rng.randint(0, 2))]
        dtype = rng.choice([torch.int32, torch.int64])
        cpu_table = torch.tensor(table, dtype=dtype)
        cpu_lens = torch.tensor(lens, dtype=rng.choice([torch.int32, torch.int64]))
        plan = hisparse.build_staging_plan(cpu_table.to(device), cpu_lens.to(device), block_size, capacity)
        expected = staging_oracle.build_staging_plan(cpu_table, cpu_lens, block_size, capacity)
        for name in ("block_table", "row_ids", "dst_rows", "miss_mask"):
            got = getattr(plan, name)
            assert got.dtype == torch.int32 and got.device.type == device.type
            assert torch.equal(got.cpu(), getattr(expected, name)), (case, name, table, lens, block_size, capacity)
        assert plan.num_blocks == expected.num_blocks and plan.block_size == block_size


def test_ensure_gpu_sources_matches_the_oracle(device):
    """Calls in sequence on one plan and its oracle (on the same tensors, so both key their cache alike): new
    tables, cache hits, padding and unknown state rows, page sizes that do not divide the block size."""
    rng = random.Random(23)
    for case in range(100):
        table, seq_lens, _, capacity = oracle_case(rng)
        block_size = rng.choice([4, 8, 16])
        capacity = max(capacity, rng.randint(1, 12))
        bt = torch.tensor(table, dtype=torch.int32, device=device)
        lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
        plan = hisparse.build_staging_plan(bt, lens, block_size, capacity)
        expected = staging_oracle.build_staging_plan(bt, lens, block_size, capacity)
        rows = len(table)
        top = (2**31 - 8) // 8  # the largest page whose rows fit int32 at every page size tried
        tables = []
        for _ in range(3):
            num_states = rng.choice([0, 1, 6, 6, 8])
            width = rng.choice([0, 1, len(table[0]), 3 * len(table[0]), 2 * block_size * len(table[0])])
            pages = [[rng.choice([0, -3, rng.randint(1, 50), rng.randint(1, 50), top]) for _ in range(width)]
                     for _ in range(num_states)]
            dtype = rng.choice([torch.int32, torch.int64])
            tables.append(torch.tensor(pages, dtype=dtype).view(num_states, width).to(device))
        for step in range(8):
            pages = rng.choice(tables)
            states = [rng.choice([rng.randint(0, 5)] * 4 + [-1, 9]) for _ in range(rows + rng.choice([-1, 0, 0, 0, 2]))]
            states = torch.tensor(states, dtype=rng.choice([torch.int32, torch.int64]), device=device)
            resident_block_size = rng.choice([1, 2, 4, 4, 8, 3, 0])
            plan.ensure_gpu_sources(pages, states, resident_block_size)
            expected.ensure_gpu_sources(pages, states, resident_block_size)
            context = (case, step, resident_block_size, states.tolist())
            assert plan.gpu_source_key == expected.gpu_source_key, context
            assert (plan.gpu_row_ids is None) == (expected.gpu_row_ids is None), context
            if plan.gpu_row_ids is not None:
                assert torch.equal(plan.gpu_row_ids.cpu(), expected.gpu_row_ids.cpu()), context
            assert torch.equal(plan.miss_mask.cpu(), expected.miss_mask.cpu()), context


def test_gather_resident_rows_matches_the_oracle(device):
    rng = random.Random(24)
    gen = torch.Generator().manual_seed(24)
    for case in range(40):
        blocks, block_size, width = rng.randint(1, 9), rng.choice([1, 2, 4, 16]), rng.choice([16, 32, 48])
        slab = random_bytes((blocks, 2, block_size, width), gen)
        source = slab[:, rng.randint(0, 1)]
        count = rng.randint(0, 30)
        ids = torch.tensor([rng.randint(-3, blocks * block_size + 3) for _ in range(count)],
                           dtype=rng.choice([torch.int32, torch.int64]))
        destination = random_bytes((count, width), gen)
        expected = destination.clone()
        staging_oracle.gather_resident_rows(source, expected, ids)
        got = destination.to(device)
        staging.gather_resident_rows(source.to(device), got, ids.to(device))
        sync(device)
        assert torch.equal(got.cpu(), expected), case


@pytest.mark.parametrize("with_resident", [False, True])
def test_gather_prefill_cache_matches_the_oracle(device, with_resident):
    rng = random.Random(25 + with_resident)
    gen = torch.Generator().manual_seed(25)
    block_size, width, host_blocks = 8, 32, 48
    host_cpu = random_bytes((host_blocks, block_size, width), gen)
    host = host_memory(host_cpu, device)
    resident_cpu = random_bytes((30, 2, width), gen)
    for case in range(30):
        # Ids up to host_blocks + 4: some rows lie past the host cache.
        table, seq_lens, _, capacity = random_case(rng, block_size=block_size, pool=host_blocks + 4)
        cpu_table, cpu_lens = torch.tensor(table, dtype=torch.int32), torch.tensor(seq_lens, dtype=torch.int32)
        plan = hisparse.build_staging_plan(cpu_table.to(device), cpu_lens.to(device), block_size, capacity)
        expected_plan = staging_oracle.build_staging_plan(cpu_table, cpu_lens, block_size, capacity)
        resident = None
        if with_resident:
            pages = torch.randint(0, 30, (len(table), 4 * len(table[0])), generator=gen, dtype=torch.int32)
            states = torch.arange(len(table), dtype=torch.int32)
            plan.ensure_gpu_sources(pages.to(device), states.to(device), 2)
            expected_plan.ensure_gpu_sources(pages, states, 2)
            resident = resident_cpu.to(device)
        staged = staging.gather_prefill_cache(plan, host, resident)
        expected = staging_oracle.gather_prefill_cache(expected_plan, host_cpu, resident_cpu if with_resident else None)
        sync(device)
        # Rows read from neither cache are unspecified; every other row is the oracle's.
        rows = flat(expected_plan.row_ids)
        gpu = flat(expected_plan.gpu_row_ids) if expected_plan.gpu_row_ids is not None else [-1] * len(rows)
        got, want = staged.cpu().reshape(-1, width), expected.reshape(-1, width)
        for j, (r, g) in enumerate(zip(rows, gpu)):
            if g >= 0 or 0 <= r < host_blocks * block_size:
                assert torch.equal(got[j], want[j]), (case, j)


def test_numpy_inputs_run_the_cpu_backend_and_give_numpy_outputs():
    np = pytest.importorskip("numpy")
    rng = random.Random(26)
    for case in range(40):
        table, seq_lens, block_size, capacity = oracle_case(rng)
        plan = hisparse.build_staging_plan(np.array(table, dtype=np.int64).reshape(len(table), -1),
                                           np.array(seq_lens, dtype=np.int32), block_size, capacity)
        expected = staging_oracle.build_staging_plan(torch.tensor(table), torch.tensor(seq_lens), block_size, capacity)
        for name in ("block_table", "row_ids", "dst_rows", "miss_mask"):
            assert isinstance(getattr(plan, name), np.ndarray)
            assert getattr(plan, name).tolist() == getattr(expected, name).tolist(), (case, name)
    new_table, row_ids = staging.staging_remap(np.array([[7, 3, 7], [0, -5, 12]], dtype=np.int32), 2)
    assert isinstance(new_table, np.ndarray) and new_table.tolist() == [[2, 1, 2], [0, 0, 3]]
    assert row_ids.tolist() == [[0, 1, 6, 7, 14, 15, 24, 25] + [-1] * 6]
    plan = hisparse.build_staging_plan(np.array([[3, 5]], dtype=np.int32), np.array([8]), 4, 2)
    plan.ensure_gpu_sources(np.array([[0, 2, 3, 0]], dtype=np.int32), np.array([0], dtype=np.int32), 2)
    assert plan.gpu_row_ids.tolist() == [[-1] * 4 + [-1, -1, 4, 5] + [6, 7, -1, -1]]
    host = np.arange(8 * 4 * 16, dtype=np.uint8).reshape(8, 4, 16)
    resident = np.full((4, 2, 16), 200, dtype=np.uint8)
    staged = staging.gather_prefill_cache(plan, host, resident)
    assert isinstance(staged, np.ndarray) and staged.shape == (3, 4, 16)
    assert (staged[1, :2] == host[3, :2]).all() and (staged[1, 2:] == 200).all()
    assert (staged[2, 2:] == host[5, 2:]).all()
    # A read-only host cache is accepted: the gather only reads it.
    host.setflags(write=False)
    staging.gather_prefill_cache(plan, host, resident)


def test_block_ids_outside_the_int32_row_range_count_as_the_null_block(device):
    """Where the oracle (like the seed) would wrap or truncate, the core stages the null block."""
    block_size = 4
    top = (2**31 - block_size) // block_size
    values = [[top, top + 1, 2**32 + 5, 5], [-2, 2**40, 7, top]]
    table = torch.tensor(values, dtype=torch.int64)
    plan = hisparse.build_staging_plan(table.to(device), torch.tensor([16, 16], device=device), block_size, 8)
    replaced = torch.where((table < 0) | (table > top), torch.zeros_like(table), table)
    expected = staging_oracle.build_staging_plan(replaced, torch.tensor([16, 16]), block_size, 8)
    for name in ("block_table", "row_ids", "miss_mask"):
        assert torch.equal(getattr(plan, name).cpu(), getattr(expected, name)), name
    assert flat(plan.row_ids)[12:16] == [4 * top, 4 * top + 1, 4 * top + 2, 2**31 - 1]
    new_table, _ = staging.staging_remap(torch.tensor([top + 1], dtype=torch.int32, device=device), block_size)
    assert flat(new_table) == [0]


def test_plan_views_keep_their_memory_alive(device):
    table = torch.tensor([[3, 5]], dtype=torch.int32, device=device)
    plan = hisparse.build_staging_plan(table, torch.tensor([8], device=device), 4, 2)
    row_ids = plan.row_ids
    del plan
    import gc

    gc.collect()
    torch.zeros(1 << 16, dtype=torch.int32, device=device)  # reuse freed memory if any was freed
    assert flat(row_ids) == [0, 1, 2, 3, 12, 13, 14, 15, 20, 21, 22, 23]
    np = pytest.importorskip("numpy")
    numpy_plan = hisparse.build_staging_plan(np.array([[3, 5]], dtype=np.int32), np.array([8]), 4, 2)
    numpy_rows = numpy_plan.row_ids
    del numpy_plan
    gc.collect()
    assert numpy_rows.tolist() == [[0, 1, 2, 3, 12, 13, 14, 15, 20, 21, 22, 23]]


PRODUCTION_SIZES = [(3, 5, 64, 0), (64, 32, 64, 2048), (1500, 24, 16, 30000)]


@requires_cuda
@pytest.mark.parametrize("rows,cols,block_size,capacity", sanitize_subset(PRODUCTION_SIZES, [(64, 32, 64, 2048)]))
def test_cuda_matches_the_cpu_reference_at_production_sizes(rows, cols, block_size, capacity):
    """Large batches (more rows than one scan block, many sort tiles), CUDA against the CPU backend bit for bit."""
    gen = torch.Generator().manual_seed(rows + capacity)
    table = torch.randint(-1, 5000, (rows, cols), generator=gen, dtype=torch.int64)
    table[:, :4] = torch.randint(1, 40, (1, 4), generator=gen)  # a shared prefix
    lens = torch.randint(0, cols * block_size + 50, (rows,), generator=gen)
    pages = torch.randint(0, 3000, (rows + 3, 2 * cols), generator=gen, dtype=torch.int32)
    pages[torch.rand(pages.shape, generator=gen) < 0.5] = 0
    states = torch.randperm(rows + 3, generator=gen)[:rows].to(torch.int32)
    states[::7] = -1
    plans = {}
    for name in ("cpu", "cuda"):
        plan = hisparse.build_staging_plan(table.to(name), lens.to(name), block_size, capacity)
        before = plan.miss_mask.cpu().clone()
        plan.ensure_gpu_sources(pages.to(name), states.to(name), block_size // 2)
        plans[name] = (plan, before)
    torch.cuda.synchronize()
    (cpu, cpu_before), (cuda, cuda_before) = plans["cpu"], plans["cuda"]
    assert torch.equal(cpu_before, cuda_before)
    for name in ("block_table", "row_ids", "dst_rows", "miss_mask", "gpu_row_ids"):
        assert torch.equal(getattr(cpu, name), getattr(cuda, name).cpu()), name
    assert (cpu.miss_mask > 0).any() and (capacity == 0 or (cpu.gpu_row_ids >= 0).any())
    host = random_bytes((5000 * block_size, 32), gen)
    resident = random_bytes((3000, block_size // 2, 32), gen)
    staged_cpu = staging.gather_prefill_cache(cpu, host, resident)
    staged_cuda = staging.gather_prefill_cache(cuda, host.pin_memory(), resident.cuda())
    torch.cuda.synchronize()
    loaded = ((cpu.gpu_row_ids >= 0) | (cpu.miss_mask > 0)).view(-1)
    assert torch.equal(staged_cpu.reshape(-1, 32)[loaded], staged_cuda.cpu().reshape(-1, 32)[loaded])
