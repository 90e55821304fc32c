"""Integrity soak of one index group (a leader and three followers, each with
its own host cache and its own hot view in a shared slab) over thousands of
decode steps: random top-k with locality, 1-3 speculative rows per request,
padding rows and orphan rows, new tokens written to the host pool (and to the
resident page) every step followed by invalidate_written_slots, random
invalidate_sorted_slots, restarts of requests, occasional resets, prefetch on
or off, the leader's fused gather on or off, and sometimes two swap_in per
forward. After every swap_in of every layer, every attention-visible entry
must show the host row it stands for. One seed runs on layer-major host
caches, the other on one token-major HostPool view [slots, 4, row] (layer l
bound to [:, l]), where half the prefetch batches stage the followers with
one group gather (group_gather) and the others one follower at a time."""

import contextlib
import os
import random

import pytest

import hisparse

from runtime_setup import GroupSetup

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

K = 16          # top_k
H = 64          # hot slots per request
S = 8           # state rows = batch rows
MAX_Q = 3       # token rows per request (speculative decoding)
BLOCK = 8       # source (host) block size
HOT_BLOCK = 4   # hot and resident block size
MAX_LEN = 96    # tokens per request before it restarts
HOST_BLOCKS_PER_REQ = MAX_LEN // BLOCK
ROW_BYTES = 32
# HISPARSE_SOAK_STEPS overrides both (a short GPU session, a long overnight soak).
STEPS = {"cpu": 6000, "cuda": 8000}
if os.environ.get("HISPARSE_SOAK_STEPS"):
    STEPS = dict.fromkeys(STEPS, int(os.environ["HISPARSE_SOAK_STEPS"]))


class Request:
    def __init__(self, state_row, rng):
        self.state_row = state_row
        self.rng = rng
        self.restart()

    def restart(self):
        first = 1 + self.state_row * HOST_BLOCKS_PER_REQ
        blocks = list(range(first, first + HOST_BLOCKS_PER_REQ))
        self.rng.shuffle(blocks)  # the request's host blocks, in a new order
        self.blocks = blocks
        self.length = 0
        self.previous = []

    def host_slot(self, position):
        return self.blocks[position // BLOCK] * BLOCK + position % BLOCK

    def topk_row(self):
        n = self.length
        row = []
        for _ in range(K):
            r = self.rng.random()
            if r < 0.6 and self.previous:
                row.append(self.rng.choice(self.previous))
            elif r < 0.8:
                row.append(n - 1 - self.rng.randrange(min(16, n)))
            elif r < 0.97:
                row.append(self.rng.randrange(n))
            else:
                row.append(-1)
        return row


def use_token_major_hosts(setup, pool):
    """Rebind every layer's host cache to its piece of one token-major view of `pool`, same bytes."""
    rows = setup.hosts[0].shape[0]
    host = pool.view("uint8", (rows, setup.num_layers, ROW_BYTES))
    for layer in range(setup.num_layers):
        host[:, layer] = setup.hosts[layer]
    setup.hosts = [host[:, layer] for layer in range(setup.num_layers)]
    setup.bind()
    assert setup.leader.followers_staged_together  # the layout allows group_gather


def run_soak(device, steps, seed, layout):
    rng = random.Random(seed)
    # A stream of its own, so the fused gather changes nothing else the soak draws.
    fuse_rng = random.Random(seed + 7919)
    host_rows = (1 + S * HOST_BLOCKS_PER_REQ) * BLOCK
    setup = GroupSetup(device, num_layers=4, top_k=K, hot_size=H, max_union_rows=K * MAX_Q, row_bytes=ROW_BYTES,
                       block_size=BLOCK, hot_block_size=HOT_BLOCK, max_num_reqs=S, max_swap_rows=2 * S * MAX_Q,
                       host_rows=host_rows, resident_blocks_per_req=1, seed=seed)
    with contextlib.ExitStack() as stack:
        if layout == "token_major":
            pool = stack.enter_context(hisparse.HostPool(
                host_rows * setup.num_layers * ROW_BYTES, register="always" if device.type == "cuda" else "never"))
            use_token_major_hosts(setup, pool)
        return soak_steps(setup, device, steps, rng, fuse_rng, seed, group_gather=layout == "token_major")


def soak_steps(setup, device, steps, rng, fuse_rng, seed, *, group_gather):
    leader = setup.leader
    invalidator = hisparse.SlotInvalidator(setup.request_state_indices)
    stride_rows = setup.block_stride // ROW_BYTES
    requests = [Request(s, rng) for s in range(S)]
    i32 = dict(dtype=torch.int32, device=device)
    source_table = torch.zeros((S, HOST_BLOCKS_PER_REQ), **i32)
    resident_table = torch.zeros((S, MAX_LEN // HOT_BLOCK), **i32)
    generator = torch.Generator().manual_seed(seed)
    checked = 0
    calls = 0
    fused_steps = 0
    grouped_calls = 0
    # Streams of their own, so that the flags change nothing else the soak draws.
    group_rng = random.Random(seed + 104729)
    totals = []

    for step in range(steps):
        # The batch: some requests, in random order, with padding rows between them.
        active = [r for r in requests if rng.random() < 0.85] or [requests[0]]
        rng.shuffle(active)
        rows = active + [None] * (S - len(active))
        rng.shuffle(rows)
        setup.set_batch([r.state_row if r is not None else -1 for r in rows])

        # New tokens: written to every layer's host cache and, on the resident
        # page, to the resident block; then their hot copies are dropped.
        written, writers = [], []
        resident_updates = []
        source = torch.zeros((S, HOST_BLOCKS_PER_REQ), dtype=torch.int32)
        resident = torch.zeros((S, MAX_LEN // HOT_BLOCK), dtype=torch.int32)
        for b, request in enumerate(rows):
            if request is None:
                continue
            if request.length == MAX_LEN:
                request.restart()
            position = request.length
            slot = request.host_slot(position)
            payload = torch.randint(0, 256, (setup.num_layers, ROW_BYTES), generator=generator, dtype=torch.uint8)
            for layer in range(setup.num_layers):
                setup.hosts[layer][slot] = payload[layer]
            block = setup.resident_block(request.state_row)
            resident_updates.append((block * stride_rows + position % HOT_BLOCK, payload))
            request.length += 1
            written.append(slot)
            writers.append(b)
            source[b] = torch.tensor(request.blocks, dtype=torch.int32)
            resident[b, position // HOT_BLOCK] = block
        if resident_updates:
            index = torch.tensor([row for row, _ in resident_updates], dtype=torch.long, device=device)
            payloads = torch.stack([p for _, p in resident_updates], dim=1).to(device)
            for layer in range(setup.num_layers):
                setup.layer_rows(layer)[index] = payloads[layer]
        source_table.copy_(source)
        resident_table.copy_(resident)
        invalidator([leader], torch.tensor(written, **i32), torch.tensor(writers, **i32))

        if rng.random() < 0.1:  # an engine dropping hot copies of freed blocks
            slots = sorted(rng.sample(range(setup.hosts[0].shape[0]), 6))
            states = rng.sample(range(S), 3)
            leader.invalidate_sorted_slots(torch.tensor(slots, **i32), torch.tensor(states, **i32))
        if rng.random() < 0.004:
            totals.append(leader.stats())  # the reset zeroes the counters
            leader.reset_hot_state()

        setup.begin_forward()
        fused_gather = fuse_rng.random() < 0.5  # half the steps copy the leader's rows in its resolve
        fused_steps += fused_gather
        for _ in range(2 if rng.random() < 0.1 else 1):
            topk, req_ids = [], []
            for b, request in enumerate(rows):
                q = rng.randint(1, MAX_Q) if request is not None else 1
                for _ in range(q):
                    topk.append(request.topk_row() if request is not None else [rng.randrange(MAX_LEN)] * K)
                    req_ids.append(b)
            valid = len(topk)
            for _ in range(rng.choice([0, 0, 1, 2])):  # orphan rows past num_valid_rows
                topk.append([rng.randrange(MAX_LEN) for _ in range(K)])
                req_ids.append(rng.randrange(S))
            topk_t = torch.tensor(topk, **i32)
            prefetch = rng.random() < 0.7
            grouped = prefetch and group_gather and group_rng.random() < 0.5
            grouped_calls += grouped
            attention = setup.swap_all(
                topk_t, torch.tensor(req_ids, **i32), prefetch=prefetch, fused_gather=fused_gather,
                group_gather=grouped,
                block_table=source_table, block_size=BLOCK, resident_block_table=resident_table,
                resident_block_size=HOT_BLOCK, num_valid_rows=torch.tensor([valid], **i32))
            first = setup.leader.info()["next_row"] - len(topk)
            assert setup.visible_rows_match(first, len(topk)), f"step {step}"
            visible = attention[:valid] >= 0
            checked += int(visible.sum())
            assert not (attention[valid:] >= 0).any(), f"step {step}: orphan rows must be masked"
            calls += 1
            for b, request in enumerate(rows):
                if request is not None:
                    positions = [p for row, r in zip(topk[:valid], req_ids) if r == b for p in row if p >= 0]
                    request.previous = sorted(set(positions))[-3 * K:]
    totals.append(leader.stats())  # synchronises: nothing reads the host pool after it
    stats = {name: sum(t[name] for t in totals) for name in hisparse.STAT_NAMES + ("bytes_moved",)}
    return stats, checked, calls, fused_steps, grouped_calls


@pytest.fixture
def one_cpu_thread():
    # The soak issues thousands of tiny tensor ops; torch's intra-op thread
    # pool only adds contention to them (tenfold on a loaded machine).
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.mark.parametrize(("seed", "layout"), [(0, "layer_major"), (1, "token_major")])
def test_integrity_soak(device, seed, layout, one_cpu_thread):
    steps = STEPS[device.type] // 2
    stats, checked, calls, fused_steps, grouped_calls = run_soak(device, steps, seed, layout)
    hit_rate = stats["hits"] / (stats["hits"] + stats["misses"])
    assert calls >= steps
    assert 0.4 * steps < fused_steps < 0.6 * steps
    if layout == "token_major":
        assert 0.2 * calls < grouped_calls < 0.5 * calls  # about half of the ~70% prefetching calls
    else:
        assert grouped_calls == 0
    assert checked > steps * S * K // 2, "most entries must be attention-visible"
    assert stats["misses"] > 0 and stats["hits"] > stats["misses"], stats
    assert 0.3 < hit_rate < 1.0, stats
    assert stats["resident"] > 0 and stats["invalid"] > 0, stats
    assert stats["bytes_moved"] == stats["misses"] * 4 * ROW_BYTES
