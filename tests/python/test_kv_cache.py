"""hisparse.KVCache and its kernels on every device: write_rows, read_rows and
update_residency against independent Python models of docs/kv_cache.md (CUDA
bit for bit against the CPU backend), the KV cache's flow (random prefills
and decode steps of groups with followers give back exactly the rows
written, with and without resident pages, narrow top-k, counters per group
and in total, reset, admit/release resetting a row), the runtime's narrow
top-k and request lengths against a padded top-k by hand, host registration
(pin_tensor), the reader role (mirror refused, host store skipped), and a
shared host pool over gloo in which rank 0 writes and rank 1 reads."""

from __future__ import annotations

import numpy as np
import pytest

import hisparse
from hisparse import ops

from conftest import requires_cuda

torch = pytest.importorskip("torch")

I32 = torch.int32


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def to(device, *tensors):
    return [t.to(device) for t in tensors]


# ---------------------------------------------------------------- models of the kernels


def model_write_rows(rows, req, positions, states, host, source, block_size, resident, resident_table, hot,
                     hot_table, dgi):
    """docs/kv_cache.md, write_rows, on CPU tensors (host [N, W]; resident and hot [blocks, bs, W])."""
    host, resident, hot = host.clone(), resident.clone(), hot.clone()
    rbs, hbs = resident.shape[1], hot.shape[1]
    resident_rows, hot_rows = resident.view(-1, resident.shape[-1]), hot.view(-1, hot.shape[-1])
    S, H = dgi.shape
    for t in range(rows.shape[0]):
        b = int(req[t])
        if not 0 <= b < states.shape[0]:
            continue
        s, p = int(states[b]), int(positions[t])
        if s < 0 or s >= S:
            continue
        slot = -1
        if p >= 0 and p // block_size < source.shape[1] and int(source[b, p // block_size]) > 0:
            slot = int(source[b, p // block_size]) * block_size + p % block_size
            slot = slot if slot < host.shape[0] else -1
        if slot >= 0:
            host[slot] = rows[t]
        if p >= 0 and p // rbs < resident_table.shape[1] and int(resident_table[b, p // rbs]) > 0:
            offset = int(resident_table[b, p // rbs]) * rbs + p % rbs
            if offset < resident_rows.shape[0]:
                resident_rows[offset] = rows[t]
        if slot < 0:
            continue
        for j in range(H):
            if int(dgi[s, j]) != slot or j // hbs >= hot_table.shape[1] or int(hot_table[b, j // hbs]) < 0:
                continue
            offset = int(hot_table[b, j // hbs]) * hbs + j % hbs
            if offset < hot_rows.shape[0]:
                hot_rows[offset] = rows[t]
    return host, resident, hot


def model_update_residency(states, lengths, blocks, *, table_width, table_block_size, blocks_per_page, num_pages,
                           ring=None):
    """docs/kv_cache.md, update_residency; `ring` (ring pages) is updated in place when given."""
    table = torch.zeros((states.shape[0], table_width), dtype=I32)
    page_size = table_block_size * blocks_per_page
    windows = []
    for b in range(states.shape[0]):
        s, length = int(states[b]), int(lengths[b])
        if s < 0 or s >= blocks.shape[0] or length <= 0 or num_pages == 0:
            windows.append(range(0))
            continue
        last = (length - 1) // page_size
        windows.append(range(max(0, last - num_pages + 1), last + 1))
        for page in windows[-1] if ring is not None else ():
            ring[s, page % num_pages] = max(int(ring[s, page % num_pages]), page)
    for b, window in enumerate(windows):
        s = int(states[b])
        for q in range(table_width):
            page = q // blocks_per_page
            if page in window and (ring is None or int(ring[s, page % num_pages]) == page):
                table[b, q] = blocks[s, (page % num_pages) * blocks_per_page + q % blocks_per_page]
    return table


# ---------------------------------------------------------------- kernels


@pytest.mark.parametrize("seed", range(4))
def test_write_rows_matches_the_model(device, seed):
    gen = torch.Generator().manual_seed(seed)
    T, W, B, S, H, bs, hbs, rbs = 13, 16, 4, 5, 12, 4, 4, 2
    rows = torch.randint(-1000, 1000, (T, W), generator=gen).to(torch.float32)
    req = torch.randint(0, B, (T,), generator=gen, dtype=I32)
    req[3], req[7] = -1, B  # orphan token rows
    positions = torch.randperm(40, generator=gen)[:T].to(I32) - 2  # distinct, a few negative
    states = torch.tensor([3, -1, 0, 4], dtype=I32)
    # Distinct blocks per (batch row, column), some of them "none", so that no
    # two tokens write one destination (the spec leaves such a race unordered);
    # a few host blocks lie past the host cache.
    source = torch.randperm(42, generator=gen)[:40].view(B, 10).to(I32) - 1
    host = torch.randn((40 * bs, W), generator=gen)
    resident = torch.randn((B * 20, rbs, W), generator=gen)
    resident_table = torch.randperm(B * 20 + 4, generator=gen)[: B * 20].view(B, 20).to(I32) - 3
    hot = torch.randn((B * 3 + 1, hbs, W), generator=gen)
    hot_table = torch.randperm(B * 3, generator=gen).view(B, 3).to(I32)
    hot_table[0, 1] = -1  # an unusable hot block: its slots are never written
    dgi = torch.randint(-1, 160, (S, H), generator=gen, dtype=I32)
    # Plant copies of the slots the rows write, twice for one of them.
    for t in range(T):
        b, p = int(req[t]), int(positions[t])
        if 0 <= b < B and int(states[b]) >= 0 and p >= 0 and p // bs < 10 and int(source[b, p // bs]) > 0:
            slot = int(source[b, p // bs]) * bs + p % bs
            if slot < host.shape[0]:
                dgi[int(states[b]), t % H] = slot
                dgi[int(states[b]), (t + 5) % H] = slot
    want = model_write_rows(rows, req, positions, states, host, source, bs, resident, resident_table, hot,
                            hot_table, dgi)
    assert not torch.equal(want[2], hot) and not torch.equal(want[0], host)
    d = device
    got_host = host.clone() if d.type == "cpu" else host.clone().pin_memory()
    got_resident, got_hot = to(d, resident, hot)
    ops.write_rows(*to(d, rows, req, positions, states), host_cache=got_host, source_block_table=source.to(d),
                   block_size=bs, resident_cache=got_resident, resident_block_table=resident_table.to(d),
                   hot_cache=got_hot, hot_block_table=hot_table.to(d), device_global_indices=dgi.to(d))
    sync(d)
    assert torch.equal(got_host, want[0])
    assert torch.equal(got_resident.cpu(), want[1])
    assert torch.equal(got_hot.cpu(), want[2])


def test_write_rows_without_a_source_table_or_host(device):
    rows = torch.arange(2 * 16, dtype=torch.float32).view(2, 16)
    req, positions = torch.tensor([0, 0], dtype=I32), torch.tensor([3, 40], dtype=I32)
    states = torch.tensor([0], dtype=I32)
    hot = torch.zeros((2, 4, 16))
    dgi = torch.full((1, 8), -1, dtype=I32)
    dgi[0, 5] = 3
    hot_table = torch.tensor([[1, 0]], dtype=I32)
    d = device
    got_hot = hot.to(d)
    # No host cache: slots are bounded by host_rows only (40 is past it).
    ops.write_rows(*to(d, rows, req, positions, states), host_rows=10, hot_cache=got_hot,
                   hot_block_table=hot_table.to(d), device_global_indices=dgi.to(d))
    sync(d)
    want = torch.zeros((2, 4, 16))
    want[0, 1] = rows[0]  # slot 5: logical block 1 -> block 0, row 1
    assert torch.equal(got_hot.cpu(), want)


def test_write_rows_with_a_source_table_of_no_columns_stores_nothing(device):
    # Every position's block lies past a table of width 0 (torch gives it a
    # null data pointer, which must not read as "no table": positions would be
    # host slots then).
    rows = torch.ones((2, 16))
    req, positions = torch.tensor([0, 0], dtype=I32), torch.tensor([1, 3], dtype=I32)
    host = torch.zeros((8, 16))
    d = device
    got_host = host.clone() if d.type == "cpu" else host.clone().pin_memory()
    ops.write_rows(*to(d, rows, req, positions, torch.tensor([0], dtype=I32)), host_cache=got_host,
                   source_block_table=torch.zeros((1, 0), dtype=I32, device=d), block_size=4)
    sync(d)
    assert torch.equal(got_host, host)


def test_write_rows_errors_name_the_argument(device):
    rows = torch.zeros((2, 16), device=device)
    req = torch.zeros(2, dtype=I32, device=device)
    states = torch.zeros(1, dtype=I32, device=device)
    with pytest.raises(TypeError, match="positions: expected dtype int32 or int64"):
        ops.write_rows(rows, req, torch.zeros(2, device=device), states)
    with pytest.raises(ValueError, match="resident_block_table: expected a tensor with resident_cache"):
        ops.write_rows(rows, req, req, states, resident_cache=torch.zeros((1, 4, 16), device=device))
    with pytest.raises(ValueError, match="rows: expected rows of a positive multiple of 16 bytes"):
        ops.write_rows(torch.zeros((2, 3), device=device), req, req, states)


@pytest.mark.parametrize("seed", range(3))
def test_read_rows_copies_named_rows_and_zeroes_the_rest(device, seed):
    gen = torch.Generator().manual_seed(seed)
    blocks, bs, stride, W = 5, 4, 6, 8
    slab = torch.randn((blocks * stride, W), generator=gen)
    span = (blocks - 1) * stride + bs
    indices = torch.randint(-3, span + 3, (7, 9), generator=gen, dtype=I32)
    want = torch.zeros((7, 9, W))
    for t in range(7):
        for k in range(9):
            a = int(indices[t, k])
            if 0 <= a < span:
                want[t, k] = slab[a]
    d = device
    out = torch.full((7, 9, W), 5.0, device=d)
    slab_d = slab.to(d)
    ops.read_rows(slab_d.as_strided((blocks, bs, W), (stride * W, W, 1)), indices.to(d), out)
    sync(d)
    assert torch.equal(out.cpu(), want)
    # Flat rows [N, W]: the index is the row.
    flat = torch.randn((10, W), generator=gen)
    idx = torch.tensor([[9, 0, 10, -1]], dtype=I32)
    out = torch.empty((1, 4, W), device=d)
    ops.read_rows(flat.to(d), idx.to(d), out)
    sync(d)
    assert torch.equal(out.cpu(), torch.stack([flat[9], flat[0], torch.zeros(W), torch.zeros(W)]).unsqueeze(0))


@pytest.mark.parametrize(("pages", "blocks_per_page"), [(0, 1), (1, 1), (2, 1), (2, 3), (3, 2)])
def test_update_residency_matches_the_model(device, pages, blocks_per_page):
    gen = torch.Generator().manual_seed(pages * 10 + blocks_per_page)
    B, S, width, tbs = 6, 4, 17, 4
    states = torch.tensor([2, -1, 0, 3, 1, 7], dtype=I32)
    lengths = torch.randint(-2, width * tbs + 6, (B,), generator=gen, dtype=I32)
    blocks = torch.randint(1, 99, (S, max(pages * blocks_per_page, 1)), generator=gen, dtype=I32)
    want = model_update_residency(states, lengths, blocks, table_width=width, table_block_size=tbs,
                                  blocks_per_page=blocks_per_page, num_pages=pages)
    d = device
    table = torch.full((B, width), -9, dtype=I32, device=d)
    ops.update_residency(table, *to(d, states, lengths, blocks), table_block_size=tbs, num_pages=pages,
                         blocks_per_page=blocks_per_page)
    sync(d)
    assert torch.equal(table.cpu(), want)


@pytest.mark.parametrize("seed", range(6))
def test_update_residency_with_ring_pages_matches_the_model(device, seed):
    # Repeated state rows, lengths that grow and fall back, slots holding pages from earlier calls.
    gen = torch.Generator().manual_seed(seed)
    B, S, width, tbs, pages, per_page = 7, 3, 13, 2, 1 + seed % 3, 1 + seed % 2
    blocks = torch.randint(1, 99, (S, pages * per_page), generator=gen, dtype=I32)
    ring = torch.randint(-1, 4, (S + 1, pages + 1), generator=gen, dtype=I32)
    d = device
    got_ring = ring.to(d)
    for _ in range(5):
        states = torch.randint(-1, S + 1, (B,), generator=gen, dtype=I32)
        lengths = torch.randint(-1, width * tbs + 4, (B,), generator=gen, dtype=I32)
        want = model_update_residency(states, lengths, blocks, table_width=width, table_block_size=tbs,
                                      blocks_per_page=per_page, num_pages=pages, ring=ring)
        table = torch.full((B, width), -9, dtype=I32, device=d)
        ops.update_residency(table, *to(d, states, lengths, blocks), table_block_size=tbs, num_pages=pages,
                             blocks_per_page=per_page, ring_pages=got_ring)
        sync(d)
        assert torch.equal(table.cpu(), want)
        assert torch.equal(got_ring.cpu(), ring)


def test_update_residency_keeps_a_rolled_back_page_out_of_the_slot_a_later_page_holds(device):
    # Pages of 4 positions, 2 resident: at length 10 pages 1 and 2 are resident (page 2 in slot 0);
    # back at length 8, page 0 would return to slot 0, which page 2 has written.
    d = device
    states, blocks = torch.tensor([0], dtype=I32, device=d), torch.tensor([[50, 51]], dtype=I32, device=d)
    ring = torch.full((1, 2), -1, dtype=I32, device=d)
    table = torch.empty((1, 4), dtype=I32, device=d)
    for length, want_table, want_ring in [(10, [0, 51, 50, 0], [2, 1]), (8, [0, 51, 0, 0], [2, 1]),
                                          (13, [0, 0, 50, 51], [2, 3])]:
        ops.update_residency(table, states, torch.tensor([length], dtype=I32, device=d), blocks, table_block_size=4,
                             num_pages=2, ring_pages=ring)
        sync(d)
        assert table.cpu().tolist() == [want_table] and ring.cpu().tolist() == [want_ring], length


# ---------------------------------------------------------------- the KV cache


def make_cache(device, *, layer_groups=(0, 0, 1, 1, 1), resident_pages=0, resident_page_size=None, dtype=torch.float32,
               hot=12, top_k=6, max_requests=3, max_seq_len=40, row_width=16, max_swap_rows=None,
               num_speculative_tokens=0):
    config = hisparse.Config(top_k=top_k, device_buffer_size=hot, row_width=row_width, dtype=dtype, block_size=8,
                             hot_block_size=4, num_speculative_tokens=num_speculative_tokens)
    return hisparse.KVCache(config, num_layers=len(layer_groups), layer_groups=list(layer_groups),
                            max_requests=max_requests, max_seq_len=max_seq_len, resident_pages=resident_pages,
                            resident_page_size=resident_page_size, device=device, max_swap_rows=max_swap_rows)


class Truth:
    """What every layer wrote for every (request row, position)."""

    def __init__(self, cache, seed):
        self.cache = cache
        self.gen = torch.Generator().manual_seed(seed)
        self.rows = {}

    def new_rows(self, layer, req, positions):
        rows = torch.randn((len(req), self.cache.slab.shape[-1]), generator=self.gen).to(self.cache.dtype)
        for i, (r, p) in enumerate(zip(req.tolist(), positions.tolist())):
            self.rows[(layer, r, p)] = rows[i]
        return rows


def run_forward(cache, truth, lengths, req, positions, topk, *, prefetch=True):
    """One forward over every layer in order (write, swap_in, read); returns
    every layer's (attention indices, rows read)."""
    d = cache.device
    cache.begin_forward(torch.tensor(lengths, dtype=I32, device=d))
    results = []
    for layer in range(cache.num_layers):
        rows = truth.new_rows(layer, req, positions)
        cache.write(layer, rows.to(d), req.to(d), positions.to(d))
        if cache.leader_of(layer) == layer:
            attention = cache.swap_in(layer, topk.to(d), req.to(d), prefetch=prefetch)
        else:
            attention = cache.swap_in(layer, num_tokens=topk.shape[0])
        results.append((attention.clone(), cache.read(layer, attention)))
    return results


def check_rows(truth, req, topk, lengths, results):
    """Every entry of a written position shows that layer's row; others are -1 and zeros."""
    for layer, (attention, rows) in enumerate(results):
        attention, rows = attention.cpu(), rows.cpu()
        for t in range(topk.shape[0]):
            r = int(req[t])
            for k in range(topk.shape[1]):
                p = int(topk[t, k])
                if 0 <= p < lengths[r]:
                    assert attention[t, k] >= 0, f"layer {layer} token {t}: position {p} did not resolve"
                    assert torch.equal(rows[t, k], truth.rows[(layer, r, p)]), (
                        f"layer {layer} token {t} position {p}: a stale row")
                else:
                    assert attention[t, k] == -1 and not rows[t, k].any()


@pytest.mark.parametrize(("resident_pages", "resident_page_size"), [(0, None), (1, None), (2, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_cache_serves_exactly_the_rows_written(device, resident_pages, resident_page_size, dtype):
    cache = make_cache(device, resident_pages=resident_pages, resident_page_size=resident_page_size, dtype=dtype)
    truth = Truth(cache, seed=resident_pages)
    gen = torch.Generator().manual_seed(7)
    prompt = [9, 14, 5]
    rows = [cache.admit() for _ in prompt]
    assert rows == [0, 1, 2]
    req = torch.cat([torch.full((n,), r, dtype=I32) for r, n in zip(rows, prompt)])
    positions = torch.cat([torch.arange(n, dtype=I32) for n in prompt])
    cache.begin_forward(torch.tensor(prompt, dtype=I32, device=device))
    for layer in range(cache.num_layers):
        cache.write(layer, truth.new_rows(layer, req, positions).to(device), req.to(device), positions.to(device))
    lengths = list(prompt)
    req = torch.tensor(rows, dtype=I32)
    for _ in range(16):
        lengths = [n + 1 for n in lengths]
        positions = torch.tensor([n - 1 for n in lengths], dtype=I32)
        # k = 5 of top_k = 6: the newest position, random older ones (and one past the length).
        older = [torch.randint(0, n - 1, (3,), generator=gen).tolist() for n in lengths]
        topk = torch.tensor([[n - 1, *o, n + 2] for n, o in zip(lengths, older)], dtype=I32)
        results = run_forward(cache, truth, lengths, req, positions, topk)
        check_rows(truth, req, topk, lengths, results)
    stats = cache.stats()
    total, groups = stats["total"], stats["groups"]
    assert len(groups) == 2 and total["num_layers"] == 5
    for key in ("lookups", "hits", "misses", "resident", "invalid", "bytes_moved"):
        assert total[key] == sum(g[key] for g in groups)
    row_bytes = cache.config.row_bytes
    assert groups[0]["bytes_moved"] == groups[0]["misses"] * 2 * row_bytes
    assert groups[1]["bytes_moved"] == groups[1]["misses"] * 3 * row_bytes
    assert total["misses"] > 0 and total["hits"] > 0
    assert (total["resident"] > 0) == (resident_pages > 0)
    cache.reset_stats()
    assert cache.stats()["total"]["lookups"] == 0


@pytest.mark.parametrize(("resident_pages", "resident_page_size"), [(1, None), (2, None), (2, 8)])
@pytest.mark.parametrize("seed", range(3))
def test_kv_cache_serves_the_rows_written_when_lengths_fall_back(device, resident_pages, resident_page_size, seed):
    # Speculative decoding: each forward writes the new token and up to 3 draft tokens; the drafts the
    # verify rejects are written again at the next forward, whose length falls back (often across a
    # page boundary, back into a page whose ring block a later page wrote).
    cache = make_cache(device, layer_groups=(0, 0, 1), resident_pages=resident_pages,
                       resident_page_size=resident_page_size, max_seq_len=128, max_swap_rows=12, hot=32,
                       num_speculative_tokens=3)
    truth = Truth(cache, seed=seed)
    gen = torch.Generator().manual_seed(100 + seed)
    rows = [cache.admit() for _ in range(3)]
    accepted = [0, 0, 0]  # positions below it are final
    for _ in range(24):
        drafts = [int(torch.randint(0, 4, (1,), generator=gen)) for _ in rows]
        lengths = [a + 1 + n for a, n in zip(accepted, drafts)]
        req = torch.cat([torch.full((n - a,), r, dtype=I32) for r, a, n in zip(rows, accepted, lengths)])
        positions = torch.cat([torch.arange(a, n, dtype=I32) for a, n in zip(accepted, lengths)])
        topk = torch.stack([torch.randint(0, lengths[int(r)], (6,), generator=gen, dtype=I32) for r in req.tolist()])
        results = run_forward(cache, truth, lengths, req, positions, topk)
        check_rows(truth, req, topk, lengths, results)
        accepted = [a + 1 + int(torch.randint(0, n + 1, (1,), generator=gen)) for a, n in zip(accepted, drafts)]
    # Ring slots of a released request's row hold no page once it is admitted again.
    cache.release(rows[0])
    assert cache.admit() == rows[0]
    sync(device)
    assert (cache.table("ring_pages")[rows[0]] == -1).all()
    assert (cache.table("ring_pages")[rows[1]] >= 0).any()


@requires_cuda
def test_a_speculative_step_captured_in_a_cuda_graph_replays_like_eager():
    """A whole forward (begin_forward with its ring-page claim, then every layer's write, swap_in and read)
    captured once and replayed over speculative steps of 1-4 tokens per request in 12 static token rows
    (the rest padding), whose lengths fall back across resident pages: attention indices, rows read, the
    slab and the residency tables match a cache that runs the same steps eagerly."""
    d = torch.device("cuda")
    caches = [make_cache(d, layer_groups=(0, 0, 1), resident_pages=2, max_seq_len=64, max_swap_rows=12, hot=32,
                         num_speculative_tokens=3) for _ in range(2)]
    graphed, eager = caches
    for cache in caches:
        assert [cache.admit() for _ in range(3)] == [0, 1, 2]
    L, T, W = graphed.num_layers, 12, graphed.slab.shape[-1]
    gen = torch.Generator().manual_seed(5)
    accepted = [0, 0, 0]

    def next_inputs():
        drafts = [int(torch.randint(0, 4, (1,), generator=gen)) for _ in range(3)]
        lengths = [a + 1 + n for a, n in zip(accepted, drafts)]
        req = torch.full((T,), -1, dtype=I32)
        positions = torch.zeros(T, dtype=I32)
        topk = torch.full((T, 6), -1, dtype=I32)
        for r in range(3):
            for i in range(1 + drafts[r]):
                t = 4 * r + i
                req[t], positions[t] = r, accepted[r] + i
                topk[t] = torch.randint(0, lengths[r], (6,), generator=gen, dtype=I32)
        for r in range(3):
            accepted[r] += 1 + int(torch.randint(0, drafts[r] + 1, (1,), generator=gen))
        return dict(lengths=torch.tensor(lengths, dtype=I32), req=req, positions=positions, topk=topk,
                    rows=torch.randn((L, T, W), generator=gen))

    def step(cache, inputs):
        cache.begin_forward(inputs["lengths"])
        out = []
        for layer in range(L):
            cache.write(layer, inputs["rows"][layer], inputs["req"], inputs["positions"])
            if cache.leader_of(layer) == layer:
                attention = cache.swap_in(layer, inputs["topk"], inputs["req"])
            else:
                attention = cache.swap_in(layer, num_tokens=T)
            out.append((attention.clone(), cache.read(layer, attention)))
        return out

    from runtime_setup import capture_cuda_graph  # noqa: PLC0415

    static = {name: value.to(d) for name, value in next_inputs().items()}
    # The warm-up step runs on both caches, so that they start the replays alike.
    graph, graphed_out = capture_cuda_graph(lambda: step(graphed, static),
                                            lambda: (step(graphed, static), step(eager, static)))
    fell_back = 0
    for index in range(12):
        before = static["lengths"].clone()
        new = next_inputs()
        for name, value in new.items():
            static[name].copy_(value)
        fell_back += int((static["lengths"] < before).any())
        graph.replay()
        eager_out = step(eager, {name: value.to(d) for name, value in new.items()})
        torch.cuda.synchronize()
        for layer, ((a, rows), (b, eager_rows)) in enumerate(zip(graphed_out, eager_out)):
            assert torch.equal(a, b) and torch.equal(rows, eager_rows), (index, layer)
        assert torch.equal(graphed.slab, eager.slab), index
        for name in ("resident_block_table", "ring_pages", "seq_lens"):
            assert torch.equal(graphed.table(name), eager.table(name)), (index, name)
    assert fell_back > 0


def test_kv_cache_admit_release_resets_the_row(device):
    cache = make_cache(device, layer_groups=(0, 0), max_requests=2)
    truth = Truth(cache, seed=3)
    for _ in range(2):
        cache.admit()
    req = torch.tensor([0, 1], dtype=I32)
    positions = torch.tensor([0, 0], dtype=I32)
    topk = torch.tensor([[0, -1, -1, -1, -1, -1], [0, -1, -1, -1, -1, -1]], dtype=I32)
    run_forward(cache, truth, [1, 1], req, positions, topk)
    dgi = cache._kv.group_tensor(0, hisparse._C.INDEX_GROUP_TENSORS["device_global_indices"])
    dgi = torch.from_dlpack(dgi)
    assert (dgi[0] >= 0).any() and (dgi[1] >= 0).any()
    cache.release(0)
    sync(device)
    assert (dgi[0] == -1).all() and (dgi[1] >= 0).any()
    with pytest.raises(RuntimeError, match="not admitted"):
        cache.release(0)
    assert cache.admit() == 0
    with pytest.raises(RuntimeError, match="admitted already"):
        cache.admit(1)
    assert cache.info()["active_requests"] == 2


def test_kv_cache_tensors_and_errors(device):
    cache = make_cache(device, resident_pages=1)
    info = cache.info()
    assert cache.slab.shape == (5, info["num_blocks"], 4, 16) and cache.slab.device.type == device.type
    assert cache.host_cache.shape == (info["host_rows"], 5, 16)
    assert info["host_bytes"] == cache.host_cache.numel() * 4
    assert info["host_bytes"] == hisparse.KVCache.host_bytes(cache.config, num_layers=5, layer_groups=[0, 0, 1, 1, 1],
                                                             max_requests=3, max_seq_len=40, resident_pages=1)
    source = cache.table("source_block_table").cpu()
    assert source.shape == (3, 5) and source[1, 0] == 6 and (source > 0).all()
    assert cache.table("hot_block_table").cpu()[2].tolist() == [7, 8, 9]
    assert [cache.leader_of(layer) for layer in range(5)] == [0, 0, 2, 2, 2]
    with pytest.raises(ValueError, match="name: expected one of"):
        cache.table("slab")
    cache.begin_forward(torch.tensor([3, 0, 0], dtype=I32, device=device))
    topk = torch.zeros((1, 6), dtype=I32, device=device)
    with pytest.raises(ValueError, match="topk_indices: a follower"):
        cache.swap_in(1, topk, torch.zeros(1, dtype=I32, device=device))
    with pytest.raises(ValueError, match="topk_indices: expected 1 to top_k = 6 columns"):
        cache.swap_in(0, torch.zeros((1, 7), dtype=I32, device=device), torch.zeros(1, dtype=I32, device=device))
    with pytest.raises(ValueError, match="seq_lens: expected size 3"):
        cache.begin_forward(torch.zeros(2, dtype=I32, device=device))
    with pytest.raises(TypeError, match="rows: expected dtype float32"):
        cache.write(0, torch.zeros((1, 16), dtype=torch.float64, device=device), topk[0, :1], topk[0, :1])
    with pytest.raises(ValueError, match="layer: expected 0 <= layer < num_layers = 5"):
        cache.write(5, torch.zeros((1, 16), device=device), topk[0, :1], topk[0, :1])
    with pytest.raises(ValueError, match=r"layer_groups\[2\]"):
        make_cache(device, layer_groups=(0, 0, 2))
    with pytest.raises(ValueError, match="resident_page_size"):
        make_cache(device, resident_pages=1, resident_page_size=6)


# ---------------------------------------------------------------- the runtime's narrow top-k


def test_narrow_topk_and_lengths_equal_a_padded_topk(device):
    from runtime_setup import GroupSetup  # noqa: PLC0415

    narrow, padded = (GroupSetup(device, num_layers=2, top_k=8, hot_size=16, max_num_reqs=2, seed=4) for _ in range(2))
    gen = torch.Generator().manual_seed(5)
    for setup in (narrow, padded):
        setup.set_batch([1, 0])
    lengths = torch.tensor([30, 12], dtype=I32)
    req = torch.tensor([0, 1], dtype=I32)
    for _ in range(4):
        topk = torch.randint(-1, 40, (2, 5), generator=gen, dtype=I32)
        by_hand = torch.full((2, 8), -1, dtype=I32)
        by_hand[:, :5] = torch.where(topk < lengths[req].unsqueeze(1), topk, -1)
        narrow.begin_forward()
        padded.begin_forward()
        a = narrow.swap_all(topk.to(device), req.to(device), prefetch=True, seq_lens=lengths.to(device))
        b = padded.swap_all(by_hand.to(device), req.to(device), prefetch=True)
        assert a.shape == (2, 5)
        assert torch.equal(a.cpu(), b[:, :5].cpu()) and (narrow.leader.attention_indices[:2, 5:] == -1).all()
        assert torch.equal(narrow.leader.device_global_indices.cpu(), padded.leader.device_global_indices.cpu())
        assert torch.equal(narrow.leader.lru_slots.cpu(), padded.leader.lru_slots.cpu())
        sync(device)
        assert narrow.visible_rows_match(0, 2)
    assert narrow.leader.stats() == padded.leader.stats()
    narrow.leader.reset_stats()
    assert narrow.leader.stats()["lookups"] == 0
    assert (narrow.leader.device_global_indices >= 0).any(), "reset_stats keeps the hot state"
    narrow.leader.reset_request(0)
    sync(device)
    assert (narrow.leader.device_global_indices[0] == -1).all()
    assert narrow.leader.lru_slots[0].tolist() == list(range(16))
    with pytest.raises(ValueError, match="state_row: expected 0 <= state_row < max_num_reqs = 2"):
        narrow.leader.reset_request(2)


# ---------------------------------------------------------------- host memory and roles


def test_pin_tensor_records_and_refuses_overlaps():
    memory = torch.zeros(4096, dtype=torch.uint8)
    hisparse.pin_tensor(memory[:1024], "cpu")
    assert hisparse.is_pinned(memory[100:200]) and not hisparse.is_pinned(memory[1000:1100])
    with pytest.raises(ValueError, match="overlaps"):
        hisparse.pin_tensor(memory[512:2048], "cpu")
    with pytest.raises(ValueError, match="not the start"):
        hisparse.unpin_tensor(memory[8:16])
    hisparse.unpin_tensor(memory[:1024])
    assert not hisparse.is_pinned(memory[:1])
    with pytest.raises(ValueError, match="contiguous"):
        hisparse.pin_tensor(memory.view(64, 64)[:, :8], "cpu")
    with pytest.raises(TypeError, match="tensor: expected a torch tensor or a NumPy array"):
        hisparse.pin_tensor([1, 2, 3], "cpu")
    array = np.zeros(256, dtype=np.uint8)
    hisparse.pin_tensor(array, "cpu")
    hisparse.unpin_tensor(array)


@requires_cuda
def test_a_pinned_tensor_binds_on_cuda():
    from runtime_setup import GroupSetup  # noqa: PLC0415

    setup = GroupSetup(torch.device("cuda"), num_layers=1)
    host = torch.zeros((64, 64), dtype=torch.uint8)
    with pytest.raises(ValueError, match="register it .hisparse.pin_tensor"):
        setup.leader.bind_source_cache(host)
    hisparse.pin_tensor(host)
    try:
        setup.leader.bind_source_cache(host)
        assert setup.leader.info()["source_bound"]
    finally:
        setup.leader.unbind_cache()
        hisparse.unpin_tensor(host)


def test_a_reader_refuses_mirrors_and_skips_the_host_store(device):
    from runtime_setup import GroupSetup  # noqa: PLC0415

    setup = GroupSetup(device, num_layers=2, max_num_reqs=2)
    setup.set_batch([0, 1])
    leader = setup.leader
    assert leader.is_writer and leader.info()["host_role"] == 0
    event = hisparse.IpcEvent(device.type)
    leader.set_host_sharing("reader", event)
    assert not leader.is_writer and not hisparse.CacheHandle(leader).is_writer
    rows = torch.full((2, 64), 9, dtype=torch.uint8, device=device)
    slots = torch.tensor([3, 4], dtype=I32, device=device)
    with pytest.raises(RuntimeError, match="mirror_rows: this process reads the shared host pool"):
        leader.mirror_rows(rows, slots)
    before = setup.hosts[0].clone()
    leader.write(rows, torch.tensor([0, 1], dtype=I32, device=device), slots)
    sync(device)
    assert torch.equal(setup.hosts[0], before), "a reader leaves the host cache alone"
    leader.set_host_sharing("writer")
    leader.write(rows, torch.tensor([0, 1], dtype=I32, device=device), slots)
    sync(device)
    assert (setup.hosts[0][3:5] == 9).all()
    with pytest.raises(ValueError, match="role: expected one of"):
        leader.set_host_sharing("owner")


@pytest.mark.slow
def test_shared_pool_rank0_writes_rank1_reads_over_gloo():
    import kv_shared_worker as worker  # noqa: PLC0415

    results = worker.run("kv_shared", 2, {"steps": 6})
    for rank, result in enumerate(results):
        assert result.get("ok") and result["returncode"] == 0, f"rank {rank}: {result}"
        assert result["is_writer"] is (rank == 0)
        assert result["host_wrong"] == 0, f"rank {rank} sees host rows rank 0 did not write"
        assert result["read_wrong"] == 0, f"rank {rank} read rows other than the writer's"
        assert result["misses"] > 0
    assert results[1]["mirror_refused"] is True
