"""gather_compact_group on every device: P hot caches filled from one
token-major host slot per swap entry. Each case is compared byte for byte
with a torch-indexing model of the contract (written here, independent of
the kernels) and with P calls of ops.gather_compact; on CUDA also with the
CPU backend. Hot caches as separate tensors and as slices of one slab, 2-D
and 3-D (block-strided) views, a token-major cache sliced in the middle,
special entries (zero fill, skips, clamped counts, padding rows), and bad
inputs that must fail naming the argument."""

import pytest

import hisparse
from hisparse import ops

from conftest import requires_cuda, sanitize_subset

torch = pytest.importorskip("torch")

MAX_PIECES = 16  # HS_MAX_GATHER_GROUP_PIECES


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_bytes(shape, gen):
    return torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)


def random_tensor(shape, dtype, gen):
    """Random bit patterns of `dtype` (NaNs included: results are compared as bytes)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return random_bytes((*shape[:-1], shape[-1] * itemsize), gen).view(dtype)


def host_copy(tensor, device):
    """`tensor` in host memory a kernel of `device` can read (pinned on CUDA)."""
    return tensor.pin_memory() if device.type == "cuda" else tensor.clone()


def as_bytes(tensor):
    return tensor.detach().cpu().contiguous().view(torch.uint8)


# ---------------------------------------------------------------- the model


def expected_group(host_cache, hot_regions, swap_host, swap_dev, counts, hbs, stride):
    """The contract with torch indexing, in place on `hot_regions`.

    host_cache: the [..., P, W] source (CPU). hot_regions: P uint8 tensors
    [span, row_bytes], each the memory of one hot cache from its data pointer
    to the end of its extent (written in place). Each used entry (h, d) is
    skipped when h < 0, d < 0 or the physical offset of d lies at or past
    span; a host slot at or past the slot count zero-fills every piece."""
    pieces = host_cache.shape[-2]
    host = as_bytes(host_cache).reshape(-1, pieces, hot_regions[0].shape[1])
    slots = host.shape[0]
    rows, k = swap_host.shape
    used = torch.arange(k)[None, :] < counts[:rows].to(torch.int64).clamp(0, k)[:, None]
    h = swap_host[used].to(torch.int64)
    d = swap_dev[used].to(torch.int64)
    keep = (h >= 0) & (d >= 0)
    h, d = h[keep], d[keep]
    offset = (d // hbs) * stride + d % hbs
    span = hot_regions[0].shape[0]
    inside = offset < span
    h, offset = h[inside], offset[inside]
    assert offset.unique().numel() == offset.numel(), "test cases use distinct destinations"
    fill = h >= slots
    for i, region in enumerate(hot_regions):
        rows_i = torch.zeros((h.numel(), region.shape[1]), dtype=torch.uint8)
        rows_i[~fill] = host[h[~fill], i]
        region[offset] = rows_i
    return int(h.numel())


def make_swap_lists(gen, *, slots, rows, k, physical_rows, extra_counts=2):
    """int32 swap lists with distinct destinations (some past the hot cache),
    runs of adjacent host slots, zero-fill slots, negative slots and
    destinations, counts past K and negative, and a padding row of count 0."""
    assert rows >= 3
    n = rows * k
    dest = torch.randperm(physical_rows + 24, generator=gen)[:n]
    if dest.numel() < n:
        dest = torch.cat([dest, torch.full((n - dest.numel(),), -1, dtype=dest.dtype)])
    swap_dev = dest.view(rows, k).to(torch.int32)
    swap_host = torch.randint(0, slots, (rows, k), generator=gen, dtype=torch.int32)
    for t in range(rows):
        start = int(torch.randint(0, max(1, slots - k), (1,), generator=gen))
        length = int(torch.randint(1, k + 1, (1,), generator=gen))
        swap_host[t, :length] = torch.arange(start, start + length, dtype=torch.int32).clamp(max=slots - 1)
    flat_h, flat_d = swap_host.view(-1), swap_dev.view(-1)
    special = torch.randperm(n, generator=gen)
    m = max(1, n // 10)
    flat_h[special[:m]] = slots + torch.randint(0, 4, (m,), generator=gen, dtype=torch.int32)  # zero fill
    flat_h[special[m : 2 * m]] = -1 - torch.randint(0, 3, (m,), generator=gen, dtype=torch.int32)
    flat_d[special[2 * m : 3 * m]] = -7
    counts = torch.randint(-2, k + 3, (rows + extra_counts,), generator=gen, dtype=torch.int32)
    counts[0] = k + 5  # clamped to K
    counts[1] = -3  # clamped to 0
    counts[2] = 0  # a padding row
    counts[rows:] = k  # past R: never read
    return swap_host, swap_dev, counts


# ---------------------------------------------------------------- hot caches


class HotCaches:
    """P hot caches of one shape and strides, as views into CPU-initialised
    backing tensors: "flat" = separate tensors, 2-D views ending inside the
    last block; "blocks" = separate tensors, 3-D [blocks, hbs, W] views at a
    block stride; "slab" = 3-D views of one tensor, layer after layer (a
    destination past one layer's view would land in the next layer's
    memory). Every backing tensor has guard rows around its views."""

    GUARD = 3

    def __init__(self, layout, pieces, *, blocks, hbs, stride, width, dtype, gen):
        self.width, self.dtype = width, dtype
        full_span = (blocks - 1) * stride + hbs
        if layout == "flat":
            self.span = full_span - hbs // 2
            self.shape, self.strides = (self.span, width), (width, 1)
        else:
            self.span = full_span
            self.shape, self.strides = (blocks, hbs, width), (stride * width, width, 1)
        guard = self.GUARD
        if layout == "slab":
            layer = blocks * stride
            self.backings = [random_tensor((guard + pieces * layer + guard, width), dtype, gen)]
            self.placements = [(0, guard + i * layer) for i in range(pieces)]
        else:
            # Allocated one by one, in reverse order of use: unrelated base addresses.
            self.backings = [random_tensor((guard + self.span + guard, width), dtype, gen) for _ in range(pieces)]
            self.backings.reverse()
            self.placements = [(i, guard) for i in range(pieces)]

    def materialize(self, device):
        """(backings on `device`, the P hot-cache views into them)."""
        backings = [b.clone().to(device) for b in self.backings]
        views = [backings[b].as_strided(self.shape, self.strides, row * self.width) for b, row in self.placements]
        return backings, views

    def expected(self, host_cache, swap_host, swap_dev, counts, hbs, stride):
        """Expected bytes of every backing tensor, and the number of landing entries."""
        out = [as_bytes(b).clone() for b in self.backings]
        regions = [out[b][row : row + self.span] for b, row in self.placements]
        landed = expected_group(host_cache, regions, swap_host, swap_dev, counts, hbs, stride)
        return out, landed


def run_group_case(device, host_full, slicer, hot, swap, hbs, stride, *, max_blocks=None):
    """Runs gather_compact_group on `device`; checks the model, then P calls of gather_compact."""
    swap_host, swap_dev, counts = swap
    host_cache_cpu = slicer(host_full)
    pieces = host_cache_cpu.shape[-2]
    expected, landed = hot.expected(host_cache_cpu, swap_host, swap_dev, counts, hbs, stride)
    assert landed > 0
    assert any(not torch.equal(e, as_bytes(b)) for e, b in zip(expected, hot.backings))

    host_cache = slicer(host_copy(host_full, device))
    sh, sd, sc = swap_host.to(device), swap_dev.to(device), counts.to(device)
    backings, views = hot.materialize(device)
    ops.gather_compact_group(host_cache, views, sh, sd, sc, hot_block_size=hbs,
                             hot_block_stride=None if stride == hbs else stride, max_blocks=max_blocks)
    sync(device)
    for i, (got, want) in enumerate(zip(backings, expected)):
        assert torch.equal(as_bytes(got), want), f"backing tensor {i}"

    # The same bytes as P calls of gather_compact, one per piece.
    single_backings, single_views = hot.materialize(device)
    for i in range(pieces):
        ops.gather_compact(host_cache[..., i, :], single_views[i], sh, sd, sc, hot_block_size=hbs,
                           hot_block_stride=stride)
    sync(device)
    for i, (got, want) in enumerate(zip(backings, single_backings)):
        assert torch.equal(as_bytes(got), as_bytes(want)), f"backing tensor {i} vs gather_compact"


def whole(host):
    return host


@pytest.mark.parametrize("dtype, layout", [(torch.uint8, "flat"), (torch.bfloat16, "blocks"), (torch.uint8, "slab"),
                                           (torch.float16, "slab")])
@pytest.mark.parametrize("row_bytes, pieces", sanitize_subset(
    [(r, p) for r in (16, 656, 1152) for p in (1, 2, 3, 4, 16)], {(16, 1), (656, 3)}))
def test_group_matches_model(device, row_bytes, pieces, dtype, layout):
    gen = torch.Generator().manual_seed(row_bytes * 31 + pieces)
    itemsize = torch.empty((), dtype=dtype).element_size()
    width = row_bytes // itemsize
    slots, rows, k, hbs, blocks = 120, 5, 24, 4, 40
    stride = hbs if layout == "flat" else 6
    host_full = random_tensor((slots, pieces, width), dtype, gen)
    hot = HotCaches(layout, pieces, blocks=blocks, hbs=hbs, stride=stride, width=width, dtype=dtype, gen=gen)
    swap = make_swap_lists(gen, slots=slots, rows=rows, k=k, physical_rows=blocks * hbs)
    run_group_case(device, host_full, whole, hot, swap, hbs, stride)


@pytest.mark.parametrize("max_blocks", sanitize_subset([None, 1], {1}))
@pytest.mark.parametrize("leading", ["3d", "4d"])
def test_group_token_major_cache_sliced_in_the_middle(device, leading, max_blocks):
    """host[:, 1:4, :] of a [slots, 5, W] float16 cache: a slot pitch of 5 rows
    for 3 pieces; and the same with two leading dimensions that flatten."""
    gen = torch.Generator().manual_seed(17)
    slots, layers, width, hbs, stride, blocks = 90, 5, 328, 8, 12, 20  # 656-byte rows
    host_full = random_tensor((slots, layers, width), torch.float16, gen)
    if leading == "4d":
        host_full = host_full.view(2, slots // 2, layers, width)

    def slicer(host):
        sliced = host[..., 1:4, :]
        assert sliced.stride(-3) == layers * width and sliced.shape[-2] == 3
        return sliced

    hot = HotCaches("blocks", 3, blocks=blocks, hbs=hbs, stride=stride, width=width, dtype=torch.float16, gen=gen)
    swap = make_swap_lists(gen, slots=slots, rows=4, k=20, physical_rows=blocks * hbs)
    run_group_case(device, host_full, slicer, hot, swap, hbs, stride, max_blocks=max_blocks)


def test_group_by_hand(device):
    """Zero fill, skips, clamped counts and a padding row, spelled out."""
    # Host slot s, layer l: 16 bytes of value 10 * s + l + 1; pieces are layers 1 and 2.
    host_full = torch.tensor([[[10 * s + l + 1] * 16 for l in range(3)] for s in range(6)], dtype=torch.uint8)
    swap_host = torch.tensor([[3, 6, -1, 5, 4, 2],
                              [1, 2, 3, 4, 5, 0],
                              [0, 1, 2, 3, 4, 5],
                              [5, 5, 5, 5, 5, 5]], dtype=torch.int32)
    swap_dev = torch.tensor([[0, 1, 2, 9, 3, 5],
                             [4, -1, 6, 7, 8, 2],
                             [0, 1, 2, 3, 4, 5],
                             [5, 5, 5, 5, 5, 5]], dtype=torch.int32)
    counts = torch.tensor([5, 9, 0, -3, 6], dtype=torch.int32)  # 5 used; clamped to 6; padding; clamped to 0
    hots0 = [torch.full((8, 16), 0xA0, dtype=torch.uint8), torch.full((8, 16), 0xB0, dtype=torch.uint8)]
    hots = [h.to(device) for h in hots0]
    ops.gather_compact_group(host_copy(host_full, device)[:, 1:3, :], hots, swap_host.to(device),
                             swap_dev.to(device), counts.to(device), hot_block_size=4)
    sync(device)
    for i, (got, before) in enumerate(zip(hots, hots0)):
        layer = 1 + i
        want = before.clone()
        want[0] = 30 + layer + 1  # slot 3
        want[1] = 0  # slot 6 of 6: zero fill
        # (-1 -> 2) skipped; (5 -> 9) outside the 8-row cache; (2 -> 5) past count 5
        want[3] = 40 + layer + 1  # slot 4
        want[4] = 10 + layer + 1  # slot 1
        # (2 -> -1) skipped
        want[6] = 30 + layer + 1
        want[7] = 40 + layer + 1
        # (5 -> 8) outside the cache
        want[2] = 0 + layer + 1  # slot 0, column 5 of the clamped row 1
        # rows 2 (count 0) and 3 (count -3) write nothing: row 5 keeps its fill
        assert torch.equal(got.cpu(), want), f"hot_caches[{i}]"


def test_group_slab_destinations_past_a_layer_are_skipped(device):
    """Hot caches as 2-D slices of one slab, back to back: a destination past
    one cache lands inside the next one's memory, so it must be skipped, not
    written there."""
    gen = torch.Generator().manual_seed(23)
    pieces, slots, rows_per_cache, width = 4, 32, 16, 32
    host_full = random_bytes((slots, pieces, width), gen)
    slab0 = random_bytes((pieces * rows_per_cache, width), gen)
    slab = slab0.to(device)
    hots = [slab[i * rows_per_cache : (i + 1) * rows_per_cache] for i in range(pieces)]
    swap_host = torch.tensor([[1, 2, 3, 4, 5, 6]], dtype=torch.int32)
    swap_dev = torch.tensor([[0, rows_per_cache, rows_per_cache + 1, 2 * rows_per_cache + 3, 15, 2**31 - 1]],
                            dtype=torch.int32)
    counts = torch.tensor([6], dtype=torch.int32)
    ops.gather_compact_group(host_copy(host_full, device), hots, swap_host.to(device), swap_dev.to(device),
                             counts.to(device), hot_block_size=4)
    sync(device)
    want = slab0.clone()
    for i in range(pieces):
        want[i * rows_per_cache + 0] = host_full[1, i]
        want[i * rows_per_cache + 15] = host_full[5, i]
    assert torch.equal(slab.cpu(), want)


@pytest.mark.parametrize("max_blocks", [None, 1, 7])
@pytest.mark.parametrize("rows", [5000, 70000])
def test_group_many_rows_few_used(device, rows, max_blocks):
    """Thousands of token rows, nearly all padding (count 0 or negative); the
    few used rows are spread over the whole range, the last one included.
    Every unused entry points at a real slot and a real hot row."""
    gen = torch.Generator().manual_seed(rows)
    pieces, slots, k, hbs, stride, blocks, width = 4, 200, 3, 4, 5, 64, 32
    host_full = random_bytes((slots, pieces, width), gen)
    physical = blocks * hbs
    swap_host = torch.randint(0, slots, (rows, k), generator=gen, dtype=torch.int32)
    swap_dev = torch.randint(physical // 2, physical, (rows, k), generator=gen, dtype=torch.int32)
    counts = torch.randint(-3, 1, (rows,), generator=gen, dtype=torch.int32)
    used = {0: k, 1023: k + 4, 4096: 2, rows // 2: 1, rows - 1: k}
    dest = torch.randperm(physical // 2, generator=gen).tolist()
    for t, count in used.items():
        counts[t] = count
        for j in range(min(count, k)):
            swap_dev[t, j] = dest.pop()
    swap_host[rows - 1, 0] = slots + 1  # zero fill
    hot = HotCaches("blocks", pieces, blocks=blocks, hbs=hbs, stride=stride, width=width, dtype=torch.uint8, gen=gen)
    run_group_case(device, host_full, whole, hot, (swap_host, swap_dev, counts), hbs, stride,
                   max_blocks=max_blocks)


def test_group_all_counts_zero_touches_nothing(device):
    gen = torch.Generator().manual_seed(2)
    host_full = random_bytes((16, 3, 32), gen)
    hots0 = [random_bytes((8, 32), gen) for _ in range(3)]
    hots = [h.to(device) for h in hots0]
    swap = torch.randint(0, 8, (9, 4), generator=gen, dtype=torch.int32)
    counts = torch.tensor([0, -1, 0, -(2**31), 0, 0, -5, 0, 0], dtype=torch.int32)
    ops.gather_compact_group(host_copy(host_full, device), hots, swap.to(device), swap.to(device),
                             counts.to(device), hot_block_size=8)
    sync(device)
    for got, want in zip(hots, hots0):
        assert torch.equal(got.cpu(), want)


# ---------------------------------------------------------------- CUDA


@requires_cuda
@pytest.mark.parametrize("max_blocks", [None, 1, 3])
@pytest.mark.parametrize("row_bytes, pieces", sanitize_subset([(656, 4), (1152, 8), (16, 16)], {(656, 4)}))
def test_group_cuda_equals_cpu_backend(row_bytes, pieces, max_blocks):
    gen = torch.Generator().manual_seed(row_bytes + pieces)
    slots, layers, rows, k, hbs, stride, blocks = 3000, pieces + 2, 9, 300, 64, 96, 48
    host_full = random_bytes((slots, layers, row_bytes), gen)
    swap_host, swap_dev, counts = make_swap_lists(gen, slots=slots, rows=rows, k=k, physical_rows=blocks * hbs)
    hot = HotCaches("slab", pieces, blocks=blocks, hbs=hbs, stride=stride, width=row_bytes, dtype=torch.uint8,
                    gen=gen)
    cpu_backings, cpu_views = hot.materialize(torch.device("cpu"))
    ops.gather_compact_group(host_full[:, 1 : 1 + pieces], cpu_views, swap_host, swap_dev, counts,
                             hot_block_size=hbs, hot_block_stride=stride)
    backings, views = hot.materialize(torch.device("cuda"))
    ops.gather_compact_group(host_full.pin_memory()[:, 1 : 1 + pieces], views, swap_host.cuda(), swap_dev.cuda(),
                             counts.cuda(), hot_block_size=hbs, hot_block_stride=stride, max_blocks=max_blocks)
    torch.cuda.synchronize()
    expected, _ = hot.expected(host_full[:, 1 : 1 + pieces], swap_host, swap_dev, counts, hbs, stride)
    for got, cpu, want in zip(backings, cpu_backings, expected):
        assert torch.equal(as_bytes(cpu), want)
        assert torch.equal(as_bytes(got), want)


@requires_cuda
@pytest.mark.sanitize
def test_group_from_host_pool_in_cuda_graph():
    """A registered HostPool token-major cache sliced at layer 2; capture once,
    replay with new swap lists. The warm-up runs on a side stream passed explicitly."""
    gen = torch.Generator().manual_seed(8)
    slots, layers, pieces, width, hot_rows = 1024, 6, 3, 656, 512
    with hisparse.HostPool(slots * layers * width, register="always") as pool:
        full = pool.view("uint8", (slots, layers, width))
        full.copy_(random_bytes((slots, layers, width), gen))
        host_cache = full[:, 2 : 2 + pieces]
        hots = [torch.zeros((hot_rows, width), dtype=torch.uint8, device="cuda") for _ in range(pieces)]
        swap_host = torch.zeros((4, 64), dtype=torch.int32, device="cuda")
        swap_dev = torch.zeros((4, 64), dtype=torch.int32, device="cuda")
        counts = torch.zeros(4, dtype=torch.int32, device="cuda")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        ops.gather_compact_group(host_cache, hots, swap_host, swap_dev, counts, hot_block_size=64, stream=stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ops.gather_compact_group(host_cache, hots, swap_host, swap_dev, counts, hot_block_size=64)
        for step in range(3):
            h = torch.randperm(slots + 40, generator=gen)[:256].view(4, 64).to(torch.int32)  # some zero fill
            d = torch.randperm(hot_rows + 20, generator=gen)[:256].view(4, 64).to(torch.int32)  # some outside
            c = torch.randint(-1, 70, (4,), generator=gen, dtype=torch.int32)
            swap_host.copy_(h)
            swap_dev.copy_(d)
            counts.copy_(c)
            for hot in hots:
                hot.zero_()
            graph.replay()
            torch.cuda.synchronize()
            regions = [torch.zeros((hot_rows, width), dtype=torch.uint8) for _ in range(pieces)]
            expected_group(host_cache.clone(), regions, h, d, c, 64, 64)
            for i, (got, want) in enumerate(zip(hots, regions)):
                assert torch.equal(got.cpu(), want), (step, i)
        del full, host_cache


# ---------------------------------------------------------------- bad inputs


def group_args(device, *, pieces=2, width=32, host=None, hots=None, swap_host=None, swap_dev=None, counts=None):
    """Valid arguments: host slots of 7s, zeroed hot caches (so a stray write shows)."""
    host = host if host is not None else host_copy(torch.full((8, pieces, width), 7, dtype=torch.uint8), device)
    hots = hots if hots is not None else [torch.zeros((8, width), dtype=torch.uint8, device=device)
                                          for _ in range(pieces)]
    swap_host = swap_host if swap_host is not None else torch.arange(8, dtype=torch.int32, device=device).view(2, 4)
    swap_dev = swap_dev if swap_dev is not None else torch.arange(8, dtype=torch.int32, device=device).view(2, 4)
    counts = counts if counts is not None else torch.full((2,), 4, dtype=torch.int32, device=device)
    return host, hots, swap_host, swap_dev, counts


def test_group_bad_inputs(device):
    witnesses = []  # hot caches handed to failing calls: none may change

    def run(exc, match, *, hot_block_size=4, hot_block_stride=None, max_blocks=None, **kwargs):
        args = group_args(device, **kwargs)
        if isinstance(args[1], (list, tuple)):
            witnesses.extend(h for h in args[1] if isinstance(h, torch.Tensor))
        with pytest.raises(exc, match=match):
            ops.gather_compact_group(*args, hot_block_size=hot_block_size, hot_block_stride=hot_block_stride,
                                     max_blocks=max_blocks)

    def zeros(shape, dtype=torch.uint8):
        return torch.zeros(shape, dtype=dtype, device=device)

    def host(shape, dtype=torch.uint8):
        return host_copy(torch.full(shape, 7, dtype=dtype), device)

    # Number of pieces.
    run(ValueError, "num_hot_caches", hots=[], host=host((8, 1, 32)))
    run(ValueError, "num_hot_caches", pieces=MAX_PIECES + 1, width=16)
    # The hot caches: one shape, one stride set, the dtype and row width of host_cache.
    run(ValueError, r"hot_caches\[1\]", hots=[zeros((8, 32)), zeros((12, 32))])
    run(ValueError, r"hot_caches\[2\]", pieces=3, hots=[zeros((8, 32)), zeros((8, 32)), zeros((2, 4, 32))])
    wide = zeros((2, 2, 4, 32))  # as [2, 2, 2, 32] with a doubled outer stride
    run(ValueError, r"hot_caches\[1\]",
        hots=[zeros((2, 2, 2, 32)), wide.as_strided((2, 2, 2, 32), (256, 64, 32, 1))])
    run(TypeError, "hot_caches", hots=[zeros((8, 16), torch.float16), zeros((8, 16), torch.float16)])
    run(TypeError, r"hot_caches\[1\]", hots=[zeros((8, 32)), zeros((8, 16), torch.float16)])
    run(ValueError, "hot_caches", hots=[zeros((8, 48)), zeros((8, 48))])
    run(ValueError, "hot_caches", hots=[zeros((8, 64))[:, :32], zeros((8, 64))[:, :32]])  # rows not contiguous
    run(TypeError, "hot_caches", hots=zeros((2, 8, 32)))  # a tensor, not a sequence of tensors
    run(TypeError, "hot_caches", hots=[zeros((8, 32)), None])
    # host_cache: [..., P, W], rows back to back, slots at a pitch of a multiple of 16 bytes >= P rows.
    run(ValueError, "host_cache", host=host((8, 32)), pieces=1)
    run(ValueError, "host_cache", host=host((8, 3, 32)))
    run(ValueError, "host_cache", host=host((8, 2, 64))[:, :, :32])  # stride(-2) != W
    pitched = host((8 * 72,)).as_strided((8, 2, 32), (72, 32, 1))
    run(ValueError, "host_cache.*16", host=pitched)
    overlapping = host((9 * 32,)).as_strided((8, 2, 32), (32, 32, 1))
    run(ValueError, "host_cache", host=overlapping)
    # The rest as gather_compact.
    run(TypeError, "swap_host_rows", swap_host=zeros((2, 4), torch.int64))
    run(ValueError, "swap_device_rows", swap_dev=zeros((2, 5), torch.int32))
    run(ValueError, "swap_counts", counts=zeros((1,), torch.int32))
    run(ValueError, "hot_block_size", hot_block_size=0)
    run(ValueError, "hot_block_stride", hot_block_stride=3)
    run(ValueError, "hot_caches", hots=[zeros((2, 4, 32)), zeros((2, 4, 32))], hot_block_stride=6)
    run(ValueError, "max_blocks", max_blocks=-1)

    sync(device)
    for hot in witnesses:
        assert int(hot.count_nonzero()) == 0
    # Everything still works after the errors.
    args = group_args(device)
    ops.gather_compact_group(*args, hot_block_size=4)
    sync(device)
    for hot in args[1]:
        assert torch.equal(hot.cpu(), torch.full((8, 32), 7, dtype=torch.uint8))


@requires_cuda
def test_group_bad_inputs_cuda():
    host, hots, swap_host, swap_dev, counts = group_args(torch.device("cuda"))
    unpinned = torch.full((8, 2, 32), 7, dtype=torch.uint8)
    with pytest.raises(ValueError, match="host_cache: host memory that is not pinned or registered"):
        ops.gather_compact_group(unpinned, hots, swap_host, swap_dev, counts, hot_block_size=4)
    with pytest.raises(ValueError, match=r"hot_caches\[1\]"):
        ops.gather_compact_group(host, [hots[0], hots[1].cpu()], swap_host, swap_dev, counts, hot_block_size=4)
    with pytest.raises(ValueError, match=r"hot_caches\[1\]"):
        ops.gather_compact_group(host, [hots[0].cpu(), hots[1]], swap_host.cpu(), swap_dev.cpu(), counts.cpu(),
                                 hot_block_size=4)
    with pytest.raises(ValueError, match="swap_host_rows"):
        ops.gather_compact_group(host, hots, swap_host.cpu(), swap_dev, counts, hot_block_size=4)
    if torch.cuda.device_count() > 1:
        with pytest.raises(ValueError, match=r"hot_caches\[1\]"):
            ops.gather_compact_group(host, [hots[0], hots[1].to("cuda:1")], swap_host, swap_dev, counts,
                                     hot_block_size=4)
    torch.cuda.synchronize()
    for hot in hots:
        assert int(hot.count_nonzero()) == 0
