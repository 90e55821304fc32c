"""Data-movement kernels on every device: gather_compact (every variant),
gather_plan, invalidate_written_slots, mirror_rows and swap_blocks_batch,
each compared byte for byte with a plain Python/torch reference and, on CUDA,
with the CPU backend; round trips through the host; bad inputs."""

import pytest

import hisparse
from hisparse import ops

from conftest import requires_cuda, sanitize_subset

torch = pytest.importorskip("torch")

VARIANTS = list(ops.GATHER_VARIANTS)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_bytes(shape, gen):
    return torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)


def host_copy(tensor, device):
    """`tensor` in host memory a kernel of `device` can read (pinned on CUDA)."""
    return tensor.pin_memory() if device.type == "cuda" else tensor.clone()


# ---------------------------------------------------------------- gather_compact


def gather_reference(host, hot_flat, swap_host, swap_dev, counts, hbs, stride):
    """Python model of gather_compact on a flat [span_rows, W] hot slab (in place)."""
    rows, k = swap_host.shape
    span = hot_flat.shape[0]
    for t, count in enumerate(counts[:rows].tolist()):  # a list: tens of thousands of rows stay fast
        used = max(0, min(count, k))
        if used == 0:
            continue
        host_row, dev_row = swap_host[t, :used].tolist(), swap_dev[t, :used].tolist()
        for h, d in zip(host_row, dev_row):
            if h < 0 or d < 0:
                continue
            offset = (d // hbs) * stride + d % hbs
            if offset >= span:
                continue
            hot_flat[offset] = 0 if h >= host.shape[0] else host[h]
    return hot_flat


def make_swap_case(gen, *, host_rows, rows, k, physical_rows, out_of_range=True):
    """Swap lists with distinct destinations, runs of adjacent host rows, and
    every kind of special entry (zero fill, negative, out-of-range)."""
    perm = torch.randperm(physical_rows + (8 if out_of_range else 0), generator=gen)[: rows * k]
    if perm.numel() < rows * k:
        perm = torch.cat([perm, torch.full((rows * k - perm.numel(),), -1, dtype=perm.dtype)])
    swap_dev = perm.view(rows, k).to(torch.int32)
    swap_host = torch.randint(0, host_rows, (rows, k), generator=gen, dtype=torch.int32)
    # Runs of adjacent host rows (what the sorted schedule coalesces).
    for t in range(rows):
        start = int(torch.randint(0, max(1, host_rows - k), (1,), generator=gen))
        length = int(torch.randint(1, k + 1, (1,), generator=gen))
        swap_host[t, :length] = torch.arange(start, start + length, dtype=torch.int32).clamp(max=host_rows - 1)
    flat_h, flat_d = swap_host.view(-1), swap_dev.view(-1)
    special = torch.randperm(rows * k, generator=gen)
    n = max(1, rows * k // 12)
    flat_h[special[:n]] = host_rows + torch.randint(0, 5, (n,), generator=gen, dtype=torch.int32)  # zero fill
    flat_h[special[n : 2 * n]] = -1
    flat_d[special[2 * n : 3 * n]] = -7
    counts = torch.randint(-2, k + 3, (rows,), generator=gen, dtype=torch.int32)
    counts[0] = k + 5  # clamped to k
    if rows > 1:
        counts[1] = -1  # clamped to 0
    return swap_host, swap_dev, counts


@pytest.mark.parametrize("row_bytes", [16, 656, 1152])
@pytest.mark.parametrize("variant", VARIANTS)
def test_gather_compact_matches_reference(device, row_bytes, variant):
    gen = torch.Generator().manual_seed(row_bytes)
    host_rows, rows, k, hbs, stride, blocks = 300, 5, 37, 4, 7, 64
    host = random_bytes((host_rows, row_bytes), gen)
    span = (blocks - 1) * stride + hbs
    hot0 = random_bytes((span, row_bytes), gen)
    swap_host, swap_dev, counts = make_swap_case(gen, host_rows=host_rows, rows=rows, k=k, physical_rows=blocks * hbs)
    expected = gather_reference(host, hot0.clone(), swap_host, swap_dev, counts, hbs, stride)

    hot = hot0.to(device)
    ops.gather_compact(host_copy(host, device), hot, swap_host.to(device), swap_dev.to(device), counts.to(device),
                       hot_block_size=hbs, hot_block_stride=stride, variant=variant)
    sync(device)
    assert torch.equal(hot.cpu(), expected)


@pytest.mark.parametrize("variant", VARIANTS)
def test_gather_compact_3d_strided_view_and_dtype(device, variant):
    """A [blocks, hot_block_size, W] bf16 view into a larger slab equals the flat addressing."""
    gen = torch.Generator().manual_seed(7)
    width, hbs, stride, blocks, host_rows = 328, 8, 24, 6, 500  # 656-byte rows
    host = torch.randn((host_rows, width), generator=gen).to(torch.bfloat16)
    slab = torch.randn(((blocks + 1) * stride, width), generator=gen).to(torch.bfloat16)
    swap_host, swap_dev, counts = make_swap_case(gen, host_rows=host_rows, rows=3, k=16, physical_rows=blocks * hbs)
    expected = gather_reference(host.view(torch.uint8), slab.view(torch.uint8).clone(), swap_host, swap_dev, counts,
                                hbs, stride)

    slab_d = slab.to(device)
    view = slab_d.as_strided((blocks, hbs, width), (stride * width, width, 1))
    ops.gather_compact(host_copy(host, device), view, swap_host.to(device), swap_dev.to(device), counts.to(device),
                       hot_block_size=hbs, hot_block_stride=stride, variant=variant)
    sync(device)
    # Rows of blocks past the view (block 6 lives at rows 144..) are outside it: skipped.
    assert torch.equal(slab_d.cpu().view(torch.uint8)[: (blocks - 1) * stride + hbs],
                       expected[: (blocks - 1) * stride + hbs])
    assert torch.equal(slab_d.cpu()[(blocks - 1) * stride + hbs:], slab[(blocks - 1) * stride + hbs:])


def test_gather_compact_zero_fill_clamp_and_skip_by_hand(device):
    host = torch.arange(10 * 16, dtype=torch.uint8).view(10, 16)
    hot = torch.full((8, 16), 0xAA, dtype=torch.uint8)
    swap_host = torch.tensor([[3, 10, -1, 5, 4], [1, 2, 3, 4, 5]], dtype=torch.int32)
    swap_dev = torch.tensor([[0, 1, 2, 9, 3], [4, 5, 6, 7, -1]], dtype=torch.int32)
    counts = torch.tensor([4, 0], dtype=torch.int32)
    hot_d = hot.to(device)
    ops.gather_compact(host_copy(host, device), hot_d, swap_host.to(device), swap_dev.to(device), counts.to(device),
                       hot_block_size=4)
    sync(device)
    expected = hot.clone()
    expected[0] = host[3]  # copied
    expected[1] = 0  # host slot 10 >= 10 rows: zero fill
    # (-1, 2) skipped; (5, 9) outside the hot cache; column 4 and row 1 past their counts
    assert torch.equal(hot_d.cpu(), expected)


def make_sparse_case(gen, *, rows, k, used, host_rows, physical_rows):
    """Swap lists of `rows` token rows where only the rows in `used` ({row: count})
    have a positive count. Every entry a kernel must not touch (columns past a
    row's clamped count, rows of count <= 0) points at a real host row and a
    real hot row of the upper half, so copying it would change the hot cache;
    the used entries have distinct destinations in the lower half, with one of
    each special kind (zero fill, negative host, negative and out-of-range
    destination) when there are enough of them."""
    trap = physical_rows // 2
    swap_host = torch.randint(0, host_rows, (rows, k), generator=gen, dtype=torch.int32)
    swap_dev = torch.randint(trap, physical_rows, (rows, k), generator=gen, dtype=torch.int32)
    counts = torch.zeros(rows, dtype=torch.int32)
    entries = [(t, j) for t, count in sorted(used.items()) for j in range(max(0, min(count, k)))]
    assert len(entries) <= trap
    dest = torch.randperm(trap, generator=gen)[: len(entries)].tolist()
    for (t, j), d in zip(entries, dest):
        swap_dev[t, j] = d
    for t, count in used.items():
        counts[t] = count
    specials = [(0, host_rows + 3), (0, -1), (1, -5), (1, physical_rows + 40)]  # (swap_host=0 / swap_dev=1, value)
    for (t, j), (which, value) in zip(entries[1::3], specials):
        (swap_host if which == 0 else swap_dev)[t, j] = value
    return swap_host, swap_dev, counts


def run_gather_case(device, host, hot0, swap_host, swap_dev, counts, hbs, stride, variant, max_blocks=None):
    expected = gather_reference(host, hot0.clone(), swap_host, swap_dev, counts, hbs, stride)
    hot = hot0.clone().to(device)  # hot0 stays the bytes before the call (.to("cpu") would alias it)
    ops.gather_compact(host_copy(host, device), hot, swap_host.to(device), swap_dev.to(device), counts.to(device),
                       hot_block_size=hbs, hot_block_stride=stride, variant=variant, max_blocks=max_blocks)
    sync(device)
    return hot.cpu(), expected


def sparse_used_rows(rows, k):
    """A few used rows with full, clamped, short and negative counts, placed at
    and around the prefix windows of the CUDA schedules (1024 and 4096 token
    rows), past the 65535 rows of a grid dimension, and at the very end."""
    picks = {0: k, 1: -4, 2: 1, 1023: k + 9, 1024: 2, 4095: -1, 4096: k, 4097: 1, 65535: k, 65536: k + 1,
             rows // 2: 2, rows - 2: -(2**31), rows - 1: k + 1}
    return {t: count for t, count in picks.items() if t < rows}


@pytest.mark.parametrize("max_blocks", [None, 1, 7])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("rows, k, row_bytes", [(5000, 3, 16), (5000, 40, 656), (70000, 3, 32)])
def test_gather_compact_many_rows_few_used(device, rows, k, row_bytes, variant, max_blocks):
    """Thousands of token rows, nearly all of count 0: only the used entries land."""
    gen = torch.Generator().manual_seed(rows + k)
    host_rows, hbs, stride, blocks = 300, 4, 5, 256
    host = random_bytes((host_rows, row_bytes), gen)
    hot0 = random_bytes(((blocks - 1) * stride + hbs, row_bytes), gen)
    swap_host, swap_dev, counts = make_sparse_case(gen, rows=rows, k=k, used=sparse_used_rows(rows, k),
                                                   host_rows=host_rows, physical_rows=blocks * hbs)
    hot, expected = run_gather_case(device, host, hot0, swap_host, swap_dev, counts, hbs, stride, variant, max_blocks)
    assert not torch.equal(expected, hot0)
    assert torch.equal(hot, expected)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("rows", [1, 5000, 70000])
def test_gather_compact_all_counts_zero(device, rows, variant):
    gen = torch.Generator().manual_seed(rows)
    host_rows, k, width, hot_rows = 64, 4, 32, 128
    host = random_bytes((host_rows, width), gen)
    hot0 = random_bytes((hot_rows, width), gen)
    swap_host = torch.randint(0, host_rows, (rows, k), generator=gen, dtype=torch.int32)
    swap_dev = torch.randint(0, hot_rows, (rows, k), generator=gen, dtype=torch.int32)
    counts = torch.randint(-5, 1, (rows,), generator=gen, dtype=torch.int32)  # every count clamps to 0
    hot, expected = run_gather_case(device, host, hot0, swap_host, swap_dev, counts, 8, 8, variant)
    assert torch.equal(expected, hot0)
    assert torch.equal(hot, hot0)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    "rows, k, count", sanitize_subset([(3, 200, 200), (3, 200, 37), (5000, 3, 3), (70000, 3, 4), (70000, 64, 64)],
                                      {(3, 200, 37), (5000, 3, 3)}))
def test_gather_compact_single_used_row_at_end(device, rows, k, count, variant):
    """Only the last token row has entries (3 rows: split over several sorting blocks)."""
    gen = torch.Generator().manual_seed(rows * k + count)
    host_rows, hbs, stride, blocks, row_bytes = 500, 8, 8, 64, 48
    host = random_bytes((host_rows, row_bytes), gen)
    hot0 = random_bytes((blocks * hbs, row_bytes), gen)
    swap_host, swap_dev, counts = make_sparse_case(gen, rows=rows, k=k, used={rows - 1: count},
                                                   host_rows=host_rows, physical_rows=blocks * hbs)
    hot, expected = run_gather_case(device, host, hot0, swap_host, swap_dev, counts, hbs, stride, variant)
    assert not torch.equal(expected, hot0)
    assert torch.equal(hot, expected)


@requires_cuda
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("max_blocks", [1, 3, None])
@pytest.mark.parametrize("row_bytes, base_offset",
                         sanitize_subset([(16, 0), (656, 0), (4096, 0), (240, 48), (656, 112)], {(656, 0)}))
def test_gather_compact_cuda_equals_cpu_backend(variant, max_blocks, row_bytes, base_offset):
    """base_offset: the host rows start that many bytes past a 128-byte line,
    so rows of 240 bytes touch two or three lines and 656-byte ones six."""
    gen = torch.Generator().manual_seed(row_bytes + 11)
    host_rows, rows, k, hbs, stride, blocks = 4000, 9, 300, 64, 96, 48
    host = random_bytes((host_rows, row_bytes), gen)
    span = (blocks - 1) * stride + hbs
    hot0 = random_bytes((span, row_bytes), gen)
    swap_host, swap_dev, counts = make_swap_case(gen, host_rows=host_rows, rows=rows, k=k, physical_rows=blocks * hbs)
    cpu_hot = hot0.clone()
    ops.gather_compact(host, cpu_hot, swap_host, swap_dev, counts, hot_block_size=hbs, hot_block_stride=stride)
    pinned = torch.empty(host_rows * row_bytes + 128, dtype=torch.uint8).pin_memory()
    shift = (base_offset - pinned.data_ptr()) % 128
    pinned_host = pinned[shift:shift + host_rows * row_bytes].view(host_rows, row_bytes)
    pinned_host.copy_(host)
    assert pinned_host.data_ptr() % 128 == base_offset
    hot = hot0.cuda()
    ops.gather_compact(pinned_host, hot, swap_host.cuda(), swap_dev.cuda(), counts.cuda(), hot_block_size=hbs,
                       hot_block_stride=stride, variant=variant, max_blocks=max_blocks)
    torch.cuda.synchronize()
    assert torch.equal(hot.cpu(), cpu_hot)


@requires_cuda
@pytest.mark.parametrize("max_blocks", [None, 2])
@pytest.mark.parametrize("k", [1, 31, 32, 33, 2048, 4096, 20000])
def test_gather_compact_sorted_capacities(k, max_blocks):
    """Sorting capacities: rows split over many blocks (None) and whole rows per
    block (2 blocks for 2 rows), which at k = 4096 opts in to more shared
    memory and at k = 20000 exceeds it and runs the persistent schedule."""
    gen = torch.Generator().manual_seed(k)
    host_rows, rows = 50000, 2
    host = random_bytes((host_rows, 32), gen)
    physical = rows * k + 64
    swap_host, swap_dev, counts = make_swap_case(gen, host_rows=host_rows, rows=rows, k=k, physical_rows=physical,
                                                 out_of_range=False)
    counts[:] = k
    cpu_hot = torch.zeros((physical, 32), dtype=torch.uint8)
    ops.gather_compact(host, cpu_hot, swap_host, swap_dev, counts, hot_block_size=64)
    hot = torch.zeros_like(cpu_hot).cuda()
    ops.gather_compact(host.pin_memory(), hot, swap_host.cuda(), swap_dev.cuda(), counts.cuda(), hot_block_size=64,
                       variant="sorted", max_blocks=max_blocks)
    torch.cuda.synchronize()
    assert torch.equal(hot.cpu(), cpu_hot)


@requires_cuda
@pytest.mark.sanitize
def test_gather_compact_from_host_pool_in_cuda_graph():
    """A registered HostPool view as the source; capture once, replay with new lists."""
    gen = torch.Generator().manual_seed(5)
    rows_n, width = 2048, 656
    with hisparse.HostPool(rows_n * width, register="always") as pool:
        host = pool.view("uint8", (rows_n, width))
        host.copy_(random_bytes((rows_n, width), gen))
        hot = torch.zeros((1024, width), dtype=torch.uint8, device="cuda")
        swap_host = torch.zeros((4, 64), dtype=torch.int32, device="cuda")
        swap_dev = torch.zeros((4, 64), dtype=torch.int32, device="cuda")
        counts = torch.zeros(4, dtype=torch.int32, device="cuda")
        graph = torch.cuda.CUDAGraph()
        ops.gather_compact(host, hot, swap_host, swap_dev, counts, hot_block_size=64)  # warm-up outside capture
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            ops.gather_compact(host, hot, swap_host, swap_dev, counts, hot_block_size=64)
        for step in range(3):
            h = torch.randperm(rows_n, generator=gen)[:256].view(4, 64).to(torch.int32)
            d = torch.randperm(1024, generator=gen)[:256].view(4, 64).to(torch.int32)
            c = torch.randint(0, 65, (4,), generator=gen, dtype=torch.int32)
            swap_host.copy_(h)
            swap_dev.copy_(d)
            counts.copy_(c)
            hot.zero_()
            graph.replay()
            torch.cuda.synchronize()
            expected = gather_reference(host.clone(), torch.zeros((1024, width), dtype=torch.uint8), h, d, c, 64, 64)
            assert torch.equal(hot.cpu(), expected), step
        del host


# ---------------------------------------------------------------- gather_plan


@pytest.mark.sanitize
def test_gather_plan_matches_reference(device):
    gen = torch.Generator().manual_seed(3)
    width, n_src, block, n_blocks = 1152, 400, 16, 10  # float16 rows of 576 values
    src = torch.randn((n_src, width // 2), generator=gen).to(torch.float16).view(torch.uint8)
    staged0 = random_bytes((n_blocks, block, width), gen)
    count = n_blocks * block + 20
    row_ids = torch.randint(-3, n_src + 5, (1, count), generator=gen, dtype=torch.int32)
    dst_rows = torch.randperm(count, generator=gen).view(1, count).to(torch.int32) - 10  # some < 0 and >= staged
    miss_mask = torch.randint(0, 2, (1, count), generator=gen, dtype=torch.int32) * 3
    expected = staged0.clone().view(-1, width)
    for j in range(count):
        r, d, m = int(row_ids[0, j]), int(dst_rows[0, j]), int(miss_mask[0, j])
        if m != 0 and 0 <= r < n_src and 0 <= d < expected.shape[0]:
            expected[d] = src[r]
    staged = staged0.to(device)
    ops.gather_plan(host_copy(src, device), staged, row_ids.to(device), dst_rows.to(device), miss_mask.to(device))
    sync(device)
    assert torch.equal(staged.cpu().view(-1, width), expected)
    if device.type == "cuda":  # sources in device memory work too
        staged = staged0.to(device)
        ops.gather_plan(src.to(device), staged, row_ids.to(device), dst_rows.to(device), miss_mask.to(device))
        torch.cuda.synchronize()
        assert torch.equal(staged.cpu().view(-1, width), expected)


# ---------------------------------------------------------------- invalidation


def invalidate_reference(tables, rsi, req, written):
    tables = [t.clone() for t in tables]
    for t in range(min(req.numel(), written.numel())):
        b = int(req[t])
        if not 0 <= b < rsi.numel():
            continue
        s = int(rsi[b])
        if not 0 <= s < tables[0].shape[0]:
            continue
        w = int(written[t])
        if w < 0:
            continue
        for table in tables:
            table[s][table[s] == w] = -1
    return tables


@pytest.mark.parametrize("num_tables", sanitize_subset([1, 3, 70], {3}))
@pytest.mark.parametrize("with_pointers", [False, True])
def test_invalidate_written_slots(device, num_tables, with_pointers):
    gen = torch.Generator().manual_seed(num_tables)
    states, hot = 6, 50
    tables0 = [torch.randint(-1, 20, (states, hot), generator=gen, dtype=torch.int32) for _ in range(num_tables)]
    rsi = torch.tensor([2, -1, 5, 9, 0, 3], dtype=torch.int32)
    req = torch.tensor([0, 0, 1, 2, 3, 4, 7, -1, 5, 4, 2], dtype=torch.int32)
    written = torch.tensor([4, 7, 3, 11, 2, -1, 5, 6, 1, 9], dtype=torch.int32)  # one shorter: n = 10
    expected = invalidate_reference(tables0, rsi, req, written)
    # Something changed, and untouched rows (1, 4) stayed as they were.
    assert any(not torch.equal(e, t) for e, t in zip(expected, tables0))
    tables = [t.to(device) for t in tables0]
    pointers = None
    if with_pointers:
        pointers = torch.tensor([t.data_ptr() for t in tables], dtype=torch.int64, device=device)
    ops.invalidate_written_slots(tables, rsi.to(device), req.to(device), written.to(device), table_pointers=pointers)
    sync(device)
    for got, want in zip(tables, expected):
        assert torch.equal(got.cpu(), want)


def test_table_pointers_helper(device):
    tables = [torch.zeros((2, 4), dtype=torch.int32, device=device) for _ in range(3)]
    pointers = ops.table_pointers(tables)
    assert pointers.dtype == torch.int64 and pointers.device.type == device.type
    assert pointers.cpu().tolist() == [t.data_ptr() for t in tables]


# ---------------------------------------------------------------- device -> host


@pytest.mark.parametrize("index_dtype", sanitize_subset([torch.int32, torch.int64], {torch.int64}))
def test_mirror_rows_round_trip(device, index_dtype):
    gen = torch.Generator().manual_seed(9)
    n, host_rows, width = 70, 200, 656
    src = random_bytes((n, width), gen).to(device)
    host0 = random_bytes((host_rows, width), gen)
    host = host_copy(host0, device)
    slots = torch.randperm(host_rows + 20, generator=gen)[:n].to(index_dtype)
    slots[::9] = -1
    ops.mirror_rows(src, host, slots.to(device))
    sync(device)
    expected = host0.clone()
    for i in range(n):
        if 0 <= int(slots[i]) < host_rows:
            expected[int(slots[i])] = src[i].cpu()
    assert torch.equal(host, expected)
    # Back through gather_compact: the mirrored rows come back unchanged.
    valid = (slots >= 0) & (slots < host_rows)
    back = torch.zeros((n, width), dtype=torch.uint8, device=device)
    swap_host = torch.where(valid, slots, -1).to(torch.int32).view(1, n)
    swap_dev = torch.arange(n, dtype=torch.int32).view(1, n)
    ops.gather_compact(host, back, swap_host.to(device), swap_dev.to(device),
                       torch.tensor([n], dtype=torch.int32, device=device), hot_block_size=n)
    sync(device)
    assert torch.equal(back[valid.to(device)], src[valid.to(device)])


@pytest.mark.sanitize
def test_swap_blocks_batch_round_trip(device):
    gen = torch.Generator().manual_seed(4)
    # (bytes, source offset): 16-, 8-, 4- and 1-byte aligned copies, empty and
    # negative sizes (skipped), and one null source address (skipped).
    entries = [(4096, 0), (656, 0), (13, 0), (0, 0), (-5, 0), (48, 8), (1000, 4), (37, 3), (64, None)]
    blocks = [random_bytes((max(n, 0) + 16,), gen).to(device) for n, _ in entries]
    host = [host_copy(torch.zeros(max(n, 0) + 16, dtype=torch.uint8), device) for n, _ in entries]
    src = torch.tensor([0 if off is None else b.data_ptr() + off for b, (_, off) in zip(blocks, entries)],
                       dtype=torch.int64)
    dst = torch.tensor([h.data_ptr() for h in host], dtype=torch.int64)
    sizes = torch.tensor([n for n, _ in entries], dtype=torch.int64)
    ops.swap_blocks_batch(src.to(device), dst.to(device), sizes.to(device))
    sync(device)
    for b, h, (n, off) in zip(blocks, host, entries):
        if n > 0 and off is not None:
            assert torch.equal(h[:n], b.cpu()[off : off + n])
            assert int(h[n:].sum()) == 0
        else:
            assert int(h.sum()) == 0
    # And back: host -> fresh device blocks.
    again = [torch.zeros_like(b) for b in blocks]
    back_dst = torch.tensor([a.data_ptr() for a in again], dtype=torch.int64)
    ops.swap_blocks_batch(dst.to(device), back_dst.to(device), sizes.to(device))
    sync(device)
    for a, b, (n, off) in zip(again, blocks, entries):
        if n > 0 and off is not None:
            assert torch.equal(a[:n], b[off : off + n])


# ---------------------------------------------------------------- bad inputs


def gather_args(device, *, host=None, hot=None, swap_host=None, swap_dev=None, counts=None):
    host = host if host is not None else host_copy(torch.zeros((8, 32), dtype=torch.uint8), device)
    hot = hot if hot is not None else torch.zeros((8, 32), dtype=torch.uint8, device=device)
    swap_host = swap_host if swap_host is not None else torch.zeros((2, 4), dtype=torch.int32, device=device)
    swap_dev = swap_dev if swap_dev is not None else torch.zeros((2, 4), dtype=torch.int32, device=device)
    counts = counts if counts is not None else torch.zeros(2, dtype=torch.int32, device=device)
    return host, hot, swap_host, swap_dev, counts


def test_gather_compact_bad_inputs(device):
    def run(exc, match, hot_block_size=4, **kwargs):
        with pytest.raises(exc, match=match):
            ops.gather_compact(*gather_args(device, **kwargs), hot_block_size=hot_block_size)

    run(TypeError, "swap_host_rows: expected dtype int32", swap_host=torch.zeros((2, 4), dtype=torch.int64,
                                                                                   device=device))
    run(TypeError, "hot_cache: expected dtype uint8", hot=torch.zeros((8, 16), dtype=torch.int16, device=device))
    run(ValueError, "hot_cache: expected rows of 32 bytes", hot=torch.zeros((8, 48), dtype=torch.uint8, device=device))
    run(ValueError, "host_cache: expected rows of a positive multiple of 16 bytes",
        host=host_copy(torch.zeros((8, 20), dtype=torch.uint8), device))
    misaligned = host_copy(torch.zeros(8 * 32 + 1, dtype=torch.uint8), device)[1:].view(8, 32)
    run(ValueError, "host_cache: expected a data pointer aligned to 16 bytes", host=misaligned)
    pitched = host_copy(torch.zeros((8, 40), dtype=torch.uint8), device)[:, :32]
    run(ValueError, "host_cache: expected a row pitch that is a multiple of 16 bytes", host=pitched)
    run(ValueError, "swap_device_rows: expected size 4 in dimension 1",
        swap_dev=torch.zeros((2, 5), dtype=torch.int32, device=device))
    run(ValueError, "swap_counts: expected at least 2", counts=torch.zeros(1, dtype=torch.int32, device=device))
    run(ValueError, "hot_block_size: expected a positive", hot_block_size=0)
    with pytest.raises(ValueError, match="hot_block_stride: expected 0"):
        ops.gather_compact(*gather_args(device), hot_block_size=4, hot_block_stride=3)
    with pytest.raises(ValueError, match="variant: expected one of"):
        ops.gather_compact(*gather_args(device), hot_block_size=4, variant="fastest")
    with pytest.raises(ValueError, match=r"variant: expected 0 to 3 \(auto, warp_per_row, sorted, row_persistent\)"):
        ops.gather_compact(*gather_args(device), hot_block_size=4, variant=9)
    with pytest.raises(ValueError, match="max_blocks"):
        ops.gather_compact(*gather_args(device), hot_block_size=4, max_blocks=-1)
    hot3d = torch.zeros((4, 2, 32), dtype=torch.uint8, device=device)
    with pytest.raises(ValueError, match="hot_cache: expected size 4 in dimension 1"):
        ops.gather_compact(*gather_args(device, hot=hot3d), hot_block_size=4)


@requires_cuda
def test_gather_compact_bad_inputs_cuda():
    host, hot, swap_host, swap_dev, counts = gather_args(torch.device("cuda"))
    unpinned = torch.zeros((8, 32), dtype=torch.uint8)
    with pytest.raises(ValueError, match="host_cache: host memory that is not pinned or registered"):
        ops.gather_compact(unpinned, hot, swap_host, swap_dev, counts, hot_block_size=4)
    with pytest.raises(ValueError, match="swap_host_rows: expected a tensor on cuda:0"):
        ops.gather_compact(host, hot, swap_host.cpu(), swap_dev, counts, hot_block_size=4)
    with pytest.raises(ValueError, match=r"host_cache: expected a tensor on cpu \(the device of hot_cache\)"):
        ops.gather_compact(host.cuda(), hot.cpu(), swap_host.cpu(), swap_dev.cpu(), counts.cpu(), hot_block_size=4)
    if torch.cuda.device_count() > 1:
        with pytest.raises(ValueError, match="host_cache"):
            ops.gather_compact(host.to("cuda:1"), hot, swap_host, swap_dev, counts, hot_block_size=4)
    with pytest.raises(ValueError, match="host_cache: host memory that is not pinned"):
        ops.mirror_rows(hot, unpinned, torch.zeros(8, dtype=torch.int64, device="cuda"))
    with pytest.raises(ValueError, match="src_rows: host memory that is not pinned"):
        ops.gather_plan(unpinned, hot, *(torch.zeros((1, 4), dtype=torch.int32, device="cuda"),) * 3)
    device_block = torch.zeros(64, dtype=torch.uint8, device="cuda")
    host_block = torch.zeros(64, dtype=torch.uint8)
    with pytest.raises(ValueError, match="src: entry 0 points to CUDA device memory"):
        ops.swap_blocks_batch(torch.tensor([device_block.data_ptr()]), torch.tensor([host_block.data_ptr()]),
                              torch.tensor([64]))


def test_other_ops_bad_inputs(device):
    host = host_copy(torch.zeros((8, 32), dtype=torch.uint8), device)
    src = torch.zeros((4, 32), dtype=torch.uint8, device=device)
    with pytest.raises(TypeError, match="slot_mapping: expected dtype int32 or int64"):
        ops.mirror_rows(src, host, torch.zeros(4, dtype=torch.float32, device=device))
    with pytest.raises(ValueError, match="slot_mapping: expected at least 4"):
        ops.mirror_rows(src, host, torch.zeros(3, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="host_cache: expected rows of 32 bytes"):
        ops.mirror_rows(src, host_copy(torch.zeros((8, 16), dtype=torch.uint8), device),
                        torch.zeros(4, dtype=torch.int64, device=device))
    ids = torch.zeros((1, 4), dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="dst_rows: expected 4 elements"):
        ops.gather_plan(host, src, ids, torch.zeros((1, 5), dtype=torch.int32, device=device), ids)
    with pytest.raises(TypeError, match="miss_mask: expected dtype int32"):
        ops.gather_plan(host, src, ids, ids, ids.to(torch.bool))
    with pytest.raises(ValueError, match="staged: expected contiguous rows"):
        ops.gather_plan(host, torch.zeros((4, 64), dtype=torch.uint8, device=device)[:, :32], ids, ids, ids)
    table = torch.zeros((3, 8), dtype=torch.int32, device=device)
    vec = torch.zeros(3, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"tables\[1\]: expected shape \[3, 8\]"):
        ops.invalidate_written_slots([table, torch.zeros((3, 9), dtype=torch.int32, device=device)], vec, vec, vec)
    with pytest.raises(TypeError, match=r"tables\[0\]: expected dtype int32"):
        ops.invalidate_written_slots([table.to(torch.int64)], vec, vec, vec)
    with pytest.raises(TypeError, match="tables: expected a sequence"):
        ops.invalidate_written_slots(table, vec, vec, vec)
    with pytest.raises(TypeError, match="tables: expected a sequence of tensors, got dict"):
        ops.invalidate_written_slots({0: table}, vec, vec, vec)
    with pytest.raises(ValueError, match="table_pointers: expected size 1"):
        ops.invalidate_written_slots([table], vec, vec, vec,
                                     table_pointers=torch.zeros(2, dtype=torch.int64, device=device))
    if device.type == "cpu":
        with pytest.raises(ValueError, match="table_pointers: entry 0 does not hold"):
            ops.invalidate_written_slots([table], vec, vec, vec,
                                         table_pointers=torch.zeros(1, dtype=torch.int64, device=device))
    addresses = torch.zeros(2, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match="sizes: expected size 2"):
        ops.swap_blocks_batch(addresses, addresses, torch.zeros(3, dtype=torch.int64, device=device))
    with pytest.raises(TypeError, match="dst: expected dtype int64"):
        ops.swap_blocks_batch(addresses, addresses.to(torch.int32), addresses)
    if device.type == "cpu":
        buffer = torch.zeros(64, dtype=torch.uint8)
        ends = torch.tensor([buffer.data_ptr()], dtype=torch.int64)
        with pytest.raises(ValueError, match="sizes: entry 0 .* runs past the end of a process's address space"):
            ops.swap_blocks_batch(ends, ends + 32, torch.tensor([2**63 - 1], dtype=torch.int64))
    # Nothing to do is not an error.
    ops.invalidate_written_slots([], vec, vec, vec)
    ops.swap_blocks_batch(addresses[:0], addresses[:0], addresses[:0])
