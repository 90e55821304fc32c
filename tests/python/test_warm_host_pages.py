"""ops.warm_host_pages: the words it reads (count and XOR) against a model written from its contract, on every
backend, CUDA bit for bit with the CPU reference, in a CUDA graph too; and the purpose of the contract: a request's
consecutive blocks read every page they span exactly once."""
import numpy as np
import pytest
import torch
from warm_pages_model import warm_totals, warmed_offsets

from hisparse import ops

from conftest import requires_cuda, sanitize_subset


def host_rows_at(rows, row_bytes, shift, gen, pinned=False):
    """Random rows [rows, row_bytes] whose first byte lies `shift` bytes past a 64 KiB boundary."""
    raw = torch.empty(rows * row_bytes + 65536 + 16, dtype=torch.uint8)
    if pinned:
        raw = raw.pin_memory()
    start = (shift - raw.data_ptr()) % 65536
    view = raw[start:start + rows * row_bytes].view(rows, row_bytes)
    view.copy_(torch.randint(0, 256, (rows, row_bytes), dtype=torch.uint8, generator=gen))
    return view


def random_table(gen, requests, width, blocks):
    """Rows of consecutive runs of host blocks, with skipped entries (-1) and blocks past the cache."""
    table = np.full((requests, width), -1, dtype=np.int32)
    g = np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=gen)))
    for b in range(requests):
        i = 0
        while i < width:
            run = int(g.integers(1, 6))
            first = int(g.integers(0, blocks + 2))
            for j in range(min(run, width - i)):
                table[b, i + j] = first + j
            i += run
            if g.random() < 0.2 and i < width:
                table[b, i] = -1 if g.random() < 0.5 else blocks + int(g.integers(0, 3))
                i += 1
    return torch.from_numpy(table)


SCENARIOS = [
    # rows, row bytes, block size, page bytes, shift past a 64 KiB boundary, requests, width, with lengths
    (300, 656, 16, 65536, 0, 4, 12, False),
    (300, 656, 16, 4096, 48, 3, 9, True),
    (97, 16, 4, 16, 0, 2, 30, True),
    (1000, 1152, 64, 65536, 4096 - 1152, 5, 10, False),
    (64, 48, 5, 256, 32, 3, 7, True),
    (0, 656, 16, 65536, 0, 2, 3, False),
]


def run(host, table, block_size, page_bytes, lengths, device):
    out = torch.full((2,), -7, dtype=torch.int64, device=device)
    ops.warm_host_pages(host, table.to(device), block_size=block_size, page_bytes=page_bytes,
                        seq_lens=None if lengths is None else lengths.to(device), out=out)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return tuple(int(x) for x in out.cpu())


def scenario(index, pinned=False):
    rows, row_bytes, block_size, page_bytes, shift, requests, width, with_lengths = SCENARIOS[index]
    gen = torch.Generator().manual_seed(index + 50)
    host = host_rows_at(rows, row_bytes, shift, gen, pinned)
    blocks = -(-rows // block_size)
    table = random_table(gen, requests, width, blocks)
    lengths = None
    if with_lengths:
        lengths = torch.randint(-block_size, (width + 1) * block_size, (requests + 1,), dtype=torch.int32,
                                generator=gen)
    return host, table, block_size, page_bytes, lengths


@pytest.mark.parametrize("index", range(len(SCENARIOS)))
def test_warm_host_pages_reads_the_words_of_its_contract(index):
    host, table, block_size, page_bytes, lengths = scenario(index)
    got = run(host, table, block_size, page_bytes, lengths, torch.device("cpu"))
    assert got == warm_totals(host, table, block_size, page_bytes, lengths)
    if SCENARIOS[index][0] > 0:
        assert got[0] > 0


@pytest.mark.parametrize("page_bytes", [16, 4096, 65536])
@pytest.mark.parametrize("shift", [0, 48, 30000])
def test_consecutive_blocks_read_each_page_they_span_once(page_bytes, shift):
    gen = torch.Generator().manual_seed(shift + page_bytes)
    rows, row_bytes, block_size = 600, 656, 16
    host = host_rows_at(rows, row_bytes, shift, gen)
    # Request 0: blocks 3..20 in order; request 1: 21..30 (its first page may be request 0's last).
    table = torch.tensor([list(range(3, 21)), list(range(21, 31)) + [-1] * 8], dtype=torch.int32)
    base = host.data_ptr()
    for b, (first, last) in enumerate([(3, 20), (21, 30)]):
        start, end = first * block_size * row_bytes, (last + 1) * block_size * row_bytes
        pages = sorted({(base + o) // page_bytes for o in (start, end - 1)} |
                       {p for p in range((base + start) // page_bytes, (base + end - 1) // page_bytes + 1)})
        read = [(base + o) // page_bytes for o in warmed_offsets(host, table[b:b + 1], block_size, page_bytes)]
        assert sorted(read) == pages, f"request {b}"
    out = torch.zeros(2, dtype=torch.int64)
    ops.warm_host_pages(host, table, block_size=block_size, page_bytes=page_bytes, out=out)
    assert int(out[0]) == len(warmed_offsets(host, table, block_size, page_bytes))


def test_warm_host_pages_without_out_and_with_an_empty_table():
    host = torch.zeros((64, 656), dtype=torch.uint8)
    table = torch.tensor([[0, 1, 2]], dtype=torch.int32)
    ops.warm_host_pages(host, table, block_size=8)  # no output: nothing to see, nothing refused
    out = torch.full((2,), 5, dtype=torch.int64)
    ops.warm_host_pages(host, torch.zeros((0, 3), dtype=torch.int32), block_size=8, out=out)
    assert out.tolist() == [0, 0]
    ops.warm_host_pages(host, torch.zeros((2, 0), dtype=torch.int32), block_size=8, out=out)
    assert out.tolist() == [0, 0]


@requires_cuda
@pytest.mark.parametrize("index", sanitize_subset(list(range(len(SCENARIOS))), {0, 2}))
def test_warm_host_pages_cuda_equals_cpu_backend(index):
    host, table, block_size, page_bytes, lengths = scenario(index, pinned=True)
    cpu = run(host, table, block_size, page_bytes, lengths, torch.device("cpu"))
    assert run(host, table, block_size, page_bytes, lengths, torch.device("cuda")) == cpu
    assert cpu == warm_totals(host, table, block_size, page_bytes, lengths)


@requires_cuda
@pytest.mark.sanitize
def test_warm_host_pages_in_a_cuda_graph_on_a_side_stream():
    gen = torch.Generator().manual_seed(9)
    host = host_rows_at(2000, 656, 0, gen, pinned=True)
    table = torch.arange(2 * 60, dtype=torch.int32).view(2, 60)
    lengths = torch.tensor([60 * 16, 500], dtype=torch.int32)
    expected = warm_totals(host, table, 16, 65536, lengths)
    out = torch.zeros(2, dtype=torch.int64, device="cuda")
    table_d, lengths_d = table.cuda(), lengths.cuda()
    side = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            ops.warm_host_pages(host, table_d, block_size=16, seq_lens=lengths_d, out=out)
        torch.cuda.current_stream().wait_stream(side)
    for _ in range(2):
        out.fill_(-1)
        graph.replay()
        torch.cuda.synchronize()
        assert tuple(out.cpu().tolist()) == expected
