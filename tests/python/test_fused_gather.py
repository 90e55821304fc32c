"""The fused gather of hisparse.ops.resolve_residency (docs/residency.md,
"Fused gather").

Every scenario runs step by step on two copies of the same state and hot
cache: one resolves with the fused gather, the other resolves and then runs
gather_compact (default variant) on the swap list it emitted. Every output
buffer (padding included), the state, the counters and every byte of the hot
cache's memory must be identical after every step; on CUDA the fused run
must also equal a fused run of the CPU backend bit for bit. Bad inputs fail
naming the argument and leave everything untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import pytest

from conftest import cuda_available, requires_cuda, resolver_workspace, sanitize_subset

torch = pytest.importorskip("torch")
hisparse = pytest.importorskip("hisparse")
from hisparse import ops  # noqa: E402

SENTINEL = -77
MATRICES = ("attention", "hot_rows", "resolved", "miss_mask", "swap_host_rows", "swap_device_rows")
VECTORS = ("valid_counts", "swap_counts")
CPU = torch.device("cpu")
# Row bytes -> the dtype the caches are viewed as (the gather only moves bytes).
ROW_DTYPES = {16: torch.uint8, 32: torch.uint8, 656: torch.bfloat16, 1152: torch.int16}


def host_copy(tensor, device):
    """`tensor` in host memory a kernel of `device` can read (pinned on CUDA)."""
    return tensor.pin_memory() if device.type == "cuda" else tensor.clone()


# ----------------------------------------------------------------- scenario


@dataclass(frozen=True)
class Shape:
    row_bytes: int
    hot_block_size: int
    hot_block_stride: int
    K: int = 20
    H: int = 48
    max_union_rows: int = 40  # < 3 * K: the speculative request overflows
    block_size: int = 16
    source_width: int = 10
    resolver_host_rows: int = 740  # slots 740..767 of the source blocks are invalid
    gather_cache_rows: int = 700  # slots 700..739 are valid but zero-fill their hot rows
    steps: int = 5


# Batch rows: a plain request, a speculative one (q = 3), a padding row and
# a request with q = 2, on state rows out of order.
STATE_ROWS = [2, 0, -1, 5]
ROWS_PER_BATCH_ROW = [1, 3, 1, 2]
S = 6


class World:
    """Tables, host rows and per-request working sets that persist across steps."""

    def __init__(self, shape: Shape, seed: int):
        self.shape = shape
        self.rng = np.random.default_rng(seed)
        rng, s = self.rng, shape
        self.B = len(STATE_ROWS)
        self.req_id_per_token = np.repeat(np.arange(self.B), ROWS_PER_BATCH_ROW).astype(np.int32)
        self.T = len(self.req_id_per_token)
        self.context = s.source_width * s.block_size

        # Distinct host blocks per batch row; the speculative request owns
        # blocks 44 (zero fill) and 46 (half past the resolver's host_rows).
        blocks = rng.permutation(np.arange(1, 44))[: self.B * s.source_width].reshape(self.B, s.source_width)
        blocks[1, 2], blocks[1, 5] = 44, 46
        blocks[3, 7] = 0  # a null block: invalid entries
        self.source = blocks.astype(np.int32)

        self.hot_blocks = -(-s.H // s.hot_block_size)
        self.physical_blocks = self.B * self.hot_blocks + 2
        hot = rng.permutation(self.physical_blocks)[: self.B * self.hot_blocks].reshape(self.B, self.hot_blocks)
        hot[3, 1] = -1  # unusable slots: their misses are dropped
        self.hot_table = hot.astype(np.int32)

        pages = -(-self.context // s.hot_block_size)
        resident = np.zeros((self.B, pages), dtype=np.int32)
        resident[:, -2:] = rng.integers(1, 50, (self.B, 2))  # the newest tokens stay on the GPU
        self.resident = resident

        self.host = torch.from_numpy(rng.integers(0, 256, (s.gather_cache_rows, s.row_bytes), dtype=np.uint8))
        slab_rows = self.physical_blocks * s.hot_block_stride
        self.slab = torch.from_numpy(rng.integers(0, 256, (slab_rows, s.row_bytes), dtype=np.uint8))
        self.working = [rng.choice(self.context + 8, size=int(1.6 * s.K), replace=False) for _ in range(self.B)]

    def next_topk(self) -> np.ndarray:
        """One step's positions: drawn from drifting working sets (positions
        past the source table and -1 included)."""
        rng, s = self.rng, self.shape
        topk = np.empty((self.T, s.K), dtype=np.int32)
        for b in range(self.B):
            keep = rng.random(len(self.working[b])) > 0.3
            fresh = rng.choice(self.context + 8, size=int((~keep).sum()))
            self.working[b] = np.concatenate([self.working[b][keep], fresh])
        for t, b in enumerate(self.req_id_per_token):
            wide = b == 1 and rng.random() < 0.7  # the speculative request overflows its union
            pool = np.arange(self.context) if wide else self.working[b]
            topk[t] = rng.choice(pool, size=s.K, replace=len(pool) < s.K)
            topk[t, rng.random(s.K) < 0.05] = -1
        return topk

    def num_valid_rows(self, step: int) -> Optional[int]:
        return [None, self.T, self.T - 1, self.T - 3, 0][step % 5]

    def candidate_union(self, topk: np.ndarray, b: int, valid_rows: int) -> int:
        """Distinct hot candidates of batch row b (docs/residency.md step 1)."""
        s, slots = self.shape, set()
        for t in range(min(valid_rows, self.T)):
            if self.req_id_per_token[t] != b:
                continue
            for p in topk[t]:
                if p < 0 or p // s.block_size >= s.source_width:
                    continue
                h = self.source[b, p // s.block_size]
                g = int(h) * s.block_size + p % s.block_size
                if h <= 0 or g >= s.resolver_host_rows or self.resident[b, p // s.hot_block_size] > 0:
                    continue
                slots.add(g)
        return len(slots)


class Lane:
    """One copy of the mutable state (hot-region state, counters, hot cache)
    on one device, advanced either with the fused gather or with
    resolve + gather_compact."""

    def __init__(self, world: World, device, fused: bool, schedule: str = "auto"):
        s, self.world, self.device, self.fused, self.schedule = world.shape, world, device, fused, schedule
        self.dgi = torch.full((S, s.H), -1, dtype=torch.int32, device=device)
        self.lru = torch.arange(s.H, dtype=torch.int16).repeat(S, 1).to(device)
        self.stats = torch.zeros(5, dtype=torch.int64, device=device)
        dtype = ROW_DTYPES[s.row_bytes]
        self.host = host_copy(world.host, device).view(dtype)
        self.slab = world.slab.to(device, copy=True)  # each lane owns its hot cache
        hot = self.slab.view(dtype)
        if s.hot_block_stride > s.hot_block_size:
            # A [blocks, hot_block_size, W] view into a slab with gaps between blocks.
            width = hot.shape[1]
            hot = hot.as_strided((world.physical_blocks, s.hot_block_size, width),
                                 (s.hot_block_stride * width, width, 1))
        self.hot = hot
        # 0 = hot_block_size: the default path of both calls.
        self.stride_arg = 0 if s.hot_block_stride == s.hot_block_size else s.hot_block_stride
        self.workspace = resolver_workspace(device, S, s.H, s.max_union_rows)
        self.schedule_args = Schedule(schedule, device, S)

    def tensor(self, array):
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

    def step(self, topk: np.ndarray, num_valid_rows: Optional[int]) -> dict:
        w, s = self.world, self.world.shape
        T, K = w.T, s.K
        # Outputs with a row stride wider than K and rows past T.
        buffers = {n: torch.full((T + 2, K + 3), SENTINEL, dtype=torch.int32, device=self.device) for n in MATRICES}
        buffers.update({n: torch.full((T + 2,), SENTINEL, dtype=torch.int32, device=self.device) for n in VECTORS})
        outputs = {f"out_{n}": buffers[n][:, :K] for n in MATRICES}
        outputs.update({f"out_{n}": buffers[n] for n in VECTORS})
        kwargs = dict(
            hot_block_size=s.hot_block_size,
            attention_block_stride=s.hot_block_stride,
            host_rows=s.resolver_host_rows,
            max_union_rows=s.max_union_rows,
            source_block_table=self.tensor(w.source),
            block_size=s.block_size,
            resident_block_table=self.tensor(w.resident),
            resident_block_size=s.hot_block_size,
            num_valid_rows=None if num_valid_rows is None else self.tensor(np.array([num_valid_rows], np.int32)),
            stats=self.stats,
            workspace=self.workspace,
            **outputs,
        )
        args = (self.tensor(topk), self.tensor(w.req_id_per_token), self.tensor(np.array(STATE_ROWS, np.int32)),
                self.dgi, self.lru, self.tensor(w.hot_table))
        if self.fused:
            ops.resolve_residency(*args, **kwargs, gather_host_cache=self.host, gather_hot_cache=self.hot,
                                  gather_hot_block_stride=self.stride_arg, **self.schedule_args.kwargs())
            self.schedule_args.check_idle()
        else:
            ops.resolve_residency(*args, **kwargs)
            ops.gather_compact(self.host, self.hot, outputs["out_swap_host_rows"], outputs["out_swap_device_rows"],
                               outputs["out_swap_counts"], hot_block_size=s.hot_block_size,
                               hot_block_stride=self.stride_arg)
        snapshot = {n: b.cpu().numpy() for n, b in buffers.items()}
        snapshot.update(dgi=self.dgi.cpu().numpy(), lru=self.lru.cpu().numpy(), stats=self.stats.cpu().numpy(),
                        hot_bytes=self.slab.cpu().numpy())
        return snapshot


def assert_same(got: dict, want: dict, context: str) -> None:
    for name in want:
        if not np.array_equal(got[name], want[name]):
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{context}: {name}")


def assert_steps_same_as_cpu(got: list, dgi, lru, hot, want: tuple) -> None:
    """A CUDA run of several steps (`got`: each step's outputs, then the
    final state and hot cache) against the CPU backend's run of the same
    steps (`want`: what that run returned)."""
    want_steps, want_dgi, want_lru, want_hot = want[:4]
    for step, (g, w) in enumerate(zip(got, want_steps)):
        assert_same(g, w, f"step {step}: cuda vs cpu")
    assert torch.equal(dgi, want_dgi) and torch.equal(lru, want_lru)
    assert torch.equal(hot, want_hot)


SHAPES = [
    Shape(row_bytes=16, hot_block_size=4, hot_block_stride=4, steps=3),
    Shape(row_bytes=16, hot_block_size=4, hot_block_stride=7, steps=3),
    Shape(row_bytes=656, hot_block_size=16, hot_block_stride=16),
    Shape(row_bytes=656, hot_block_size=4, hot_block_stride=9),
    Shape(row_bytes=1152, hot_block_size=8, hot_block_stride=8),
    Shape(row_bytes=1152, hot_block_size=8, hot_block_stride=11),
    Shape(row_bytes=656, hot_block_size=1, hot_block_stride=3, K=33, H=96, max_union_rows=60),
    # Production sizes whose CUDA resolver arrays do not fit a block's shared
    # memory (a workspace): hot buffers of 20,480 slots with the speculative
    # request's union overflowing 4,000 rows, and vLLM's MTP-3 case.
    Shape(row_bytes=656, hot_block_size=64, hot_block_stride=80, K=2048, H=20480, max_union_rows=4000,
          block_size=1024, resolver_host_rows=46 * 1024 + 256, gather_cache_rows=44 * 1024 - 256, steps=3),
    Shape(row_bytes=656, hot_block_size=64, hot_block_stride=64, K=2048, H=10240, max_union_rows=8192,
          block_size=1024, resolver_host_rows=46 * 1024 + 256, gather_cache_rows=44 * 1024 - 256, steps=3),
]


def shape_id(shape: Shape) -> str:
    return f"rb{shape.row_bytes}-hbs{shape.hot_block_size}-stride{shape.hot_block_stride}-k{shape.K}-h{shape.H}"


# gather_schedule's values, and "handoff": "auto" with a handoff array.
SCHEDULES = ("auto", "handoff", "fused")


class Schedule:
    """What resolve_residency takes for one of SCHEDULES. The handoff array
    lives as long as the state, as an engine keeps it, and every launch must
    leave each record idle again (its state word zero)."""

    def __init__(self, name: str, device, num_state_rows: int):
        self.name = name
        self.handoff = None
        if name == "handoff":
            self.handoff = torch.zeros((num_state_rows, ops.RESOLVER_HANDOFF_WORDS), dtype=torch.int32, device=device)

    def kwargs(self) -> dict:
        return dict(gather_schedule="fused" if self.name == "fused" else "auto", handoff=self.handoff)

    def check_idle(self) -> None:
        if self.handoff is not None:
            left = torch.nonzero(self.handoff[:, 0].cpu()).flatten().tolist()
            assert not left, f"handoff records of state rows {left[:8]} left busy after the launch"


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("shape", sanitize_subset(SHAPES, set(SHAPES[:2])), ids=shape_id)
def test_fused_gather_matches_resolve_then_gather(device, shape, schedule):
    """Both schedules of the fused gather: "auto" (the CUDA resolve copies
    the rows of requests with few misses, a tail gather the others') and
    "fused" (every row in the resolve launch)."""
    world = World(shape, seed=shape.row_bytes * 100 + shape.hot_block_stride)
    fused, separate = Lane(world, device, fused=True, schedule=schedule), Lane(world, device, fused=False)
    reference = Lane(world, CPU, fused=True) if device.type == "cuda" else None
    moved = zero_filled = overflowed = 0
    for step in range(shape.steps):
        topk, valid = world.next_topk(), world.num_valid_rows(step)
        got = fused.step(topk, valid)
        assert_same(got, separate.step(topk, valid), f"step {step}: fused vs resolve + gather_compact")
        if reference is not None:
            assert_same(got, reference.step(topk, valid), f"step {step}: cuda vs cpu")
        counts = np.clip(got["swap_counts"][: world.T], 0, shape.K)
        moved += int(counts.sum())
        for t, count in enumerate(counts):
            zero_filled += int((got["swap_host_rows"][t, :count] >= shape.gather_cache_rows).sum())
        overflowed += world.candidate_union(topk, 1, world.T if valid is None else valid) > shape.max_union_rows
    # The scenario exercised what it claims to: misses moved rows, some of
    # them zero-filled, resident pages, invalid entries and union overflow.
    stats = got["stats"]
    assert moved == stats[2] > 0
    assert zero_filled > 0
    assert stats[3] > 0 and stats[4] > 0
    if shape.max_union_rows < 3 * shape.K:  # the speculative request can overflow
        assert overflowed > 0


def test_fused_gather_copies_the_swap_list_by_hand(device):
    """Independent of gather_compact: every swap entry's hot row holds its
    host row (zeros past the host cache); every other byte is unchanged."""
    shape = Shape(row_bytes=16, hot_block_size=4, hot_block_stride=6, steps=1)
    world = World(shape, seed=11)
    lane = Lane(world, device, fused=True)
    before = world.slab.numpy().copy()
    got = lane.step(world.next_topk(), None)
    expected = before.copy()
    host = world.host.numpy()
    for t in range(world.T):
        for k in range(max(0, min(int(got["swap_counts"][t]), shape.K))):
            h, d = int(got["swap_host_rows"][t, k]), int(got["swap_device_rows"][t, k])
            offset = (d // shape.hot_block_size) * shape.hot_block_stride + d % shape.hot_block_size
            expected[offset] = host[h] if h < shape.gather_cache_rows else 0
    assert got["stats"][2] > 0
    assert_same({"hot_bytes": got["hot_bytes"]}, {"hot_bytes": expected}, "hand model")


def run_steady_steps(device, new_per_step, K=64, H=128, q=1, schedule="auto"):
    """Fused resolves of len(new_per_step[0]) requests with q token rows
    each (656-byte rows), enqueued back to back with no host sync in between:
    step 0 fills the hot buffers, then step i replaces new_per_step[i - 1][b]
    positions of request b's first row (its other rows repeat the previous
    step's positions). Returns the outputs of every step, the final hot cache
    and the host rows."""
    block, row_bytes, span = 16, 656, 4096
    B = len(new_per_step[0])
    host_rows = B * span
    gen = torch.Generator().manual_seed(23)
    host = host_copy(torch.randint(-128, 127, (host_rows, row_bytes), generator=gen, dtype=torch.int8), device)
    hot = torch.zeros((B * H, row_bytes), dtype=torch.int8, device=device)
    dgi = torch.full((B, H), -1, dtype=torch.int32, device=device)
    lru = torch.arange(H, dtype=torch.int16).repeat(B, 1).to(device)
    hot_table = (torch.arange(B)[:, None] * (H // block) + torch.arange(H // block)).to(torch.int32).to(device)
    # Request b reads host rows b * span + position: no shared rows between requests.
    first = torch.arange(K, dtype=torch.int32).repeat(B, 1) + torch.arange(B, dtype=torch.int32)[:, None] * span
    steps = [first]
    for step, new in enumerate(new_per_step):
        rows = steps[-1].clone()
        for b, count in enumerate(new):
            rows[b, :count] = b * span + K + 100 * (step + 1) + torch.arange(count, dtype=torch.int32)
        steps.append(rows)
    req_id = torch.arange(B, dtype=torch.int32).repeat_interleave(q).to(device)
    state_rows = torch.arange(B, dtype=torch.int32, device=device)
    workspace = resolver_workspace(device, B, H, H)
    scheduled = Schedule(schedule, device, B)
    results = []
    for index, rows in enumerate(steps):
        # Row 0 of a request is this step's; the others the previous step's.
        previous = steps[max(index - 1, 0)]
        topk = torch.stack([rows] + [previous] * (q - 1), dim=1).reshape(B * q, K)
        out = {n: torch.full((B * q, K), SENTINEL, dtype=torch.int32, device=device) for n in MATRICES}
        out.update({n: torch.full((B * q,), SENTINEL, dtype=torch.int32, device=device) for n in VECTORS})
        ops.resolve_residency(
            topk.to(device), req_id, state_rows, dgi, lru, hot_table, hot_block_size=block,
            attention_block_stride=block, host_rows=host_rows, max_union_rows=H, gather_host_cache=host,
            gather_hot_cache=hot, workspace=workspace, **scheduled.kwargs(),
            **{f"out_{n}": t for n, t in out.items()})
        results.append(out)
    # After the last step: records a launch left would also break the next one.
    scheduled.check_idle()
    return [{n: t.cpu().numpy() for n, t in out.items()} for out in results], hot.cpu(), host.cpu()


# Per step, per request: misses that fit the resolver's miss stage (<= 8 rows
# on CUDA, read from host memory while the rest of the request resolves),
# exactly its size, one more, none, and a mix of both paths in one launch.
STEADY_NEW_POSITIONS = [[3, 8, 9], [0, 1, 8], [2, 0, 40], [1, 1, 1]]


@pytest.mark.parametrize(
    "K,H,q",
    sanitize_subset([(64, 128, 1), (1500, 2048, 2), (2048, 10240, 4), (2048, 16384, 4)],
                    {(64, 128, 1), (1500, 2048, 2), (2048, 10240, 4)}),
    ids=["one-chunk", "two-chunks", "workspace", "workspace-atomics"],
)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_fused_gather_few_misses_back_to_back(device, K, H, q, schedule):
    """Steady-state decode steps with a handful of misses per request, the
    case the CUDA fused gather stages early (its host reads start while the
    request is still being resolved), for a union built in one chunk of
    entries and in two, and at speculative shapes (union limit H) whose
    resolver arrays leave shared memory for a workspace (at H = 16,384 all
    but the union table, the held filter included): after every step each
    valid entry's hot row holds the entry's host row, and on CUDA every
    output and every hot byte equal the CPU backend's."""
    got, hot, host = run_steady_steps(device, STEADY_NEW_POSITIONS, K, H, q, schedule)
    for step, out in enumerate(got):
        misses = [K] * 3 if step == 0 else STEADY_NEW_POSITIONS[step - 1]
        # Misses go to the request's first token row while they fit in K.
        assert out["swap_counts"].reshape(3, q)[:, 0].tolist() == misses, f"step {step}"
        assert not out["swap_counts"].reshape(3, q)[:, 1:].any(), f"step {step}"
    last = got[-1]
    valid = last["hot_rows"] >= 0
    assert valid.all()
    assert torch.equal(hot[torch.from_numpy(last["hot_rows"][valid]).long()],
                       host[torch.from_numpy(last["resolved"][valid]).long()])
    if device.type == "cuda":
        want, want_hot, _ = run_steady_steps(CPU, STEADY_NEW_POSITIONS, K, H, q, schedule)
        for step, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"step {step}: cuda vs cpu")
        assert torch.equal(hot, want_hot)


def run_full_buffer_steps(device, misses_per_step, K=64, H=2048, max_union_rows=64, row_bytes=656, schedule="auto",
                          unusable=(), padding_rows=0):
    """Fused resolves of len(misses_per_step[0]) requests whose hot buffers
    start full (H distinct host rows each, in a shuffled LRU order), enqueued
    one after another: at step i request b selects K positions of which
    misses_per_step[i][b] its buffer does not hold. The requests in
    `unusable` have no physical block for their last hot block, so its
    slots are unusable (misses that would take them are dropped). The batch
    ends with `padding_rows` token rows of no request (req_id -1). Returns
    every step's outputs, the final state and hot cache, and the host rows."""
    block, span = 16, 2 * H
    B = len(misses_per_step[0])
    gen = torch.Generator().manual_seed(31)
    host = host_copy(torch.randint(-128, 127, (B * span, row_bytes), generator=gen, dtype=torch.int8), device)
    hot = torch.zeros((B * H, row_bytes), dtype=torch.int8, device=device)
    held = torch.stack([torch.randperm(span, generator=gen)[:H] for _ in range(B)]).to(torch.int32)
    held += torch.arange(B, dtype=torch.int32)[:, None] * span
    dgi = held.clone().to(device)
    hot[:] = host[held.flatten().long()].to(device)  # slot j of request b is hot row b * H + j
    lru = torch.stack([torch.randperm(H, generator=gen) for _ in range(B)]).to(torch.int16).to(device)
    hot_table = (torch.arange(B)[:, None] * (H // block) + torch.arange(H // block)).to(torch.int32)
    hot_table[list(unusable), -1] = -1
    hot_table = hot_table.to(device)
    T = B + padding_rows
    req_id = torch.tensor(list(range(B)) + [-1] * padding_rows, dtype=torch.int32, device=device)
    state_rows = torch.arange(B, dtype=torch.int32, device=device)
    scheduled = Schedule(schedule, device, B)
    results = []
    for misses in misses_per_step:
        topk = torch.zeros((T, K), dtype=torch.int32)
        for b, m in enumerate(misses):
            mine = set(held[b].tolist())
            fresh = [g for g in (b * span + torch.randperm(span, generator=gen)).tolist() if g not in mine][:m]
            hits = held[b][torch.randperm(H, generator=gen)[: K - m]].tolist()
            topk[b] = torch.tensor(hits + fresh, dtype=torch.int32)[torch.randperm(K, generator=gen)]
        out = {n: torch.full((T, K), SENTINEL, dtype=torch.int32, device=device) for n in MATRICES}
        out.update({n: torch.full((T,), SENTINEL, dtype=torch.int32, device=device) for n in VECTORS})
        ops.resolve_residency(
            topk.to(device), req_id, state_rows, dgi, lru, hot_table, hot_block_size=block,
            attention_block_stride=block, host_rows=B * span, max_union_rows=max_union_rows,
            gather_host_cache=host, gather_hot_cache=hot, **scheduled.kwargs(),
            **{f"out_{n}": t for n, t in out.items()})
        scheduled.check_idle()
        results.append({n: t.cpu().numpy() for n, t in out.items()})
        held = dgi.cpu()  # what the buffers hold now, for the next step's hits and misses
    return results, dgi.cpu(), lru.cpu(), hot.cpu(), host.cpu()


def check_full_buffer_steps(device, misses_per_step, **run) -> None:
    """run_full_buffer_steps(device, misses_per_step, **run) with no
    unusable slots: every miss is assigned, every hot row of the last step
    holds its host row, and on CUDA all outputs, the state and every hot
    byte equal the CPU backend's."""
    got, dgi, lru, hot, host = run_full_buffer_steps(device, misses_per_step, **run)
    for step, out in enumerate(got):
        assert out["swap_counts"].tolist() == misses_per_step[step], f"step {step}"
        assert (out["hot_rows"] >= 0).all(), f"step {step}"
    last = got[-1]
    assert torch.equal(hot[torch.from_numpy(last["hot_rows"]).long().flatten()],
                       host[torch.from_numpy(last["resolved"]).long().flatten()])
    if device.type == "cuda":
        assert_steps_same_as_cpu(got, dgi, lru, hot, run_full_buffer_steps(CPU, misses_per_step, **run))


# Per step, per request: misses among K = 64 selected positions of a full
# buffer of 2048 rows (at most 8 fit the CUDA resolver's stage).
FULL_BUFFER_MISSES = [[2, 8, 9, 0], [1, 3, 64, 2], [8, 0, 5, 1]]


@pytest.mark.sanitize
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_fused_gather_full_buffers(device, schedule):
    """Requests whose hot buffers are full (2048 rows in a shuffled LRU
    order) and select 64 positions a step, 0 to 64 of them new: each miss
    evicts one of the oldest rows among 2048, and in one CUDA launch some
    requests' misses fit the resolver's stage (read from host memory while
    the request is still resolved) and others' are copied after phase D.
    Every miss is counted, every valid entry's hot row holds its host row
    afterwards, and on CUDA all outputs, the state and every hot byte equal
    the CPU backend's."""
    check_full_buffer_steps(device, FULL_BUFFER_MISSES, schedule=schedule)


def many_request_misses(batch: int) -> list:
    """Per step, per request: misses among K = 128 selected positions of a
    full buffer of 512 rows, three steps: some fit the CUDA resolver's stage,
    the others are handed over."""
    return [[(0, 3, 9, 30, 100, 128, 8, 64)[(b + step) % 8] for b in range(batch)] for step in range(3)]


def one_helper_batch() -> int:
    """A batch whose CUDA handoff launch has fewer than two helper blocks
    for most requests, but one for each (61 requests on 132 SMs: 70
    helpers): the one helper of most requests predicts and reads all of
    their misses early."""
    return max((device_sms() - 1) // 2 - 4, 1)


def device_sms() -> int:
    """The CUDA device's SM count (132 without one: the batches below are then CPU runs alone)."""
    return torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132


def tail_read_batch() -> int:
    """A batch past half the SMs whose CUDA handoff launch still leaves SMs
    idle (86 requests on 132 SMs: 45 helper blocks): the first requests'
    helpers read the tails of their lists (docs/residency.md, "Fused
    gather"), 17 rows each."""
    return device_sms() // 2 + 20


# Batches of test_fused_gather_many_requests_full_buffers, as (requests,
# padding token rows): 16 requests have two helper blocks or more each on a
# GPU of 49 SMs or more, one_helper_batch() one for most (early reads both);
# a padding row after 16 requests makes the launch one of more token rows
# than requests, whose helpers do not read early, and the requests with long
# lists keep a head of them for their phase E (100 and 128 misses over 16
# of 132 blocks are 13 and 16 rows). tail_read_batch() has tail-read helpers
# for about half of its requests, and a batch two short of the SM count one
# for its first request, whose tail is its whole list (at most 768 rows).
MANY_REQUEST_BATCHES = {"early_reads": lambda: (16, 0), "one_helper_each": lambda: (one_helper_batch(), 0),
                        "kept_heads": lambda: (16, 1), "tail_reads": lambda: (tail_read_batch(), 0),
                        "one_tail_helper": lambda: (device_sms() - 2, 0)}


@pytest.mark.sanitize
@pytest.mark.parametrize("batch", sorted(MANY_REQUEST_BATCHES))
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_fused_gather_many_requests_full_buffers(device, schedule, batch):
    """Many requests with full hot buffers and 0 to 128 misses each, three
    steps (many_request_misses); requests 3 and 11 have unusable slots: the
    rows those hold miss again, and misses that would take them are
    dropped. Every valid entry's hot row holds its host row afterwards, the
    requests without unusable slots assign every miss, and on CUDA all
    outputs, the state and every hot byte equal the CPU backend's. Under the
    handoff on CUDA (docs/residency.md, "Fused gather"), the requests of the
    early-read batches have their misses predicted and read early by the
    helper blocks, which take the rows held in unusable slots for hits (a
    wrong prediction: read late), and the kept-heads batch copies the heads
    of its long lists in phase E and leaves the rest to the helper blocks;
    its padding row's entries are written inactive."""
    B, padding_rows = MANY_REQUEST_BATCHES[batch]()
    misses = many_request_misses(B)
    unusable = (3, 11)
    run = dict(K=128, H=512, max_union_rows=128, schedule=schedule, unusable=unusable, padding_rows=padding_rows)
    got, dgi, lru, hot, host = run_full_buffer_steps(device, misses, **run)
    usable = [b for b in range(B) if b not in unusable]
    for step, out in enumerate(got):
        assert out["swap_counts"][usable].tolist() == [misses[step][b] for b in usable], f"step {step}"
        assert (out["hot_rows"][usable] >= 0).all(), f"step {step}"
        assert (out["hot_rows"][B:] == -1).all() and not out["swap_counts"][B:].any(), f"step {step}: padding"
        assert not out["valid_counts"][B:].any(), f"step {step}: padding"
    assert any((out["hot_rows"][list(unusable)] < 0).any() for out in got), "no miss was dropped"
    last = got[-1]
    valid = last["hot_rows"] >= 0
    assert torch.equal(hot[torch.from_numpy(last["hot_rows"][valid]).long()],
                       host[torch.from_numpy(last["resolved"][valid]).long()])
    if device.type == "cuda":
        assert_steps_same_as_cpu(got, dgi, lru, hot, run_full_buffer_steps(CPU, misses, **run))


@pytest.mark.sanitize
def test_fused_gather_helpers_that_note_destinations(device):
    """Requests whose helpers' reads run long past the swap list's arrival:
    16 requests selecting 2,048 positions of full 4,096-row buffers, 20% of
    them new, rows of 656 bytes (4.3 MB from host memory, tens of
    microseconds on a PCIe link). Under the handoff on CUDA the launch runs
    the early-read helpers that note their buffered rows' hot rows while
    they read (at most 8 helpers per request on GPUs of up to 145 SMs) and
    copy them in one flat pass after their reads (docs/residency.md,
    "Fused gather"). Two steps; every miss is assigned, every valid entry's
    hot row holds its host row afterwards, and on CUDA all outputs, the
    state and every hot byte equal the CPU backend's."""
    B, K, H = 16, 2048, 4096
    misses = [[K // 5 + b for b in range(B)], [K // 5 - b for b in range(B)]]
    check_full_buffer_steps(device, misses, K=K, H=H, max_union_rows=K, schedule="handoff")


@pytest.mark.sanitize
def test_fused_gather_tail_reads_at_decode_shape(device):
    """Three quarters of the SMs in requests (99 on 132 SMs: 32 helper
    blocks) selecting 2,048 positions of full 4,096-row buffers, 2.5-6% of
    them new, rows of 656 bytes: under the handoff on CUDA the first
    requests' helpers predict their misses in top-k order and read the last
    24 of them while the owners resolve, then copy their lists' tails while
    the owners copy the heads (docs/residency.md, "Fused gather"). Two
    steps; every miss is assigned, every valid entry's hot row holds its
    host row afterwards, and on CUDA all outputs, the state and every hot
    byte equal the CPU backend's."""
    B, K, H = device_sms() * 3 // 4, 2048, 4096
    misses = [[50 + (b * 7) % 73 for b in range(B)], [120 - (b * 5) % 71 for b in range(B)]]
    check_full_buffer_steps(device, misses, K=K, H=H, max_union_rows=K, schedule="handoff")


def hint_of(dgi, host_rows):
    """The residency hint that holds exactly the host rows of `dgi` below `host_rows`."""
    rows = dgi.flatten().cpu().numpy().astype(np.int64)
    rows = rows[(rows >= 0) & (rows < host_rows)]
    words = np.zeros((host_rows + 31) // 32, dtype=np.uint32)
    np.bitwise_or.at(words, rows >> 5, (np.uint32(1) << (rows & 31).astype(np.uint32)))
    return torch.from_numpy(words.view(np.int32).copy())


def resolve_full_buffers(device, schedule, topk, dgi, lru, hot, host, block, host_rows, max_union_rows,
                         hinted=False):
    """One fused resolve of topk's rows, request b on state row b with the
    given (full) state, hot blocks b * (H / block) on, with a residency hint
    of the state when `hinted`; checks that the handoff records are idle
    afterwards. Returns the outputs, the final state, the hot cache and the
    host rows."""
    B, K = topk.shape
    H = dgi.shape[1]
    hot_table = (torch.arange(B)[:, None] * (H // block) + torch.arange(H // block)).to(torch.int32).to(device)
    out = {n: torch.full((B, K), SENTINEL, dtype=torch.int32, device=device) for n in MATRICES}
    out.update({n: torch.full((B,), SENTINEL, dtype=torch.int32, device=device) for n in VECTORS})
    scheduled = Schedule(schedule, device, B)
    rows = torch.arange(B, dtype=torch.int32, device=device)
    ops.resolve_residency(
        topk.to(device), rows, rows, dgi, lru, hot_table, hot_block_size=block, attention_block_stride=block,
        host_rows=host_rows, max_union_rows=max_union_rows, gather_host_cache=host, gather_hot_cache=hot,
        **scheduled.kwargs(), **({"residency_hint": hint_of(dgi, host_rows).to(device)} if hinted else {}),
        **{f"out_{n}": t for n, t in out.items()})
    scheduled.check_idle()
    return {n: t.cpu().numpy() for n, t in out.items()}, dgi.cpu(), lru.cpu(), hot.cpu(), host.cpu()


def run_crafted_misses(device, K=16, H=64, max_union_rows=12, row_bytes=656, schedule="auto"):
    """One fused resolve of three requests with full buffers whose misses take
    every way the CUDA resolver copies host rows: request 0 has two misses
    (staged after C1) and a key past max_union_rows (no member: never
    copied); request 1 has three misses and one past the gather's host rows
    (zero-filled by phase E, never staged); request 2 has two misses and
    nothing else to copy (the block skips phase E). Returns the outputs, the
    final state, the hot cache and the host rows."""
    block, span, B = 16, 512, 3
    gen = torch.Generator().manual_seed(47)
    host_rows = B * span
    host = host_copy(torch.randint(-128, 127, (host_rows - 8, row_bytes), generator=gen, dtype=torch.int8), device)
    held = torch.stack([b * span + torch.randperm(span - 8, generator=gen)[:H] for b in range(B)]).to(torch.int32)
    topk = torch.empty((B, K), dtype=torch.int32)
    for b in range(B):
        mine = held[b].tolist()
        fresh = [g for g in (b * span + torch.randperm(span - 8, generator=gen)).tolist() if g not in mine]
        hits = mine[:K]
        if b == 0:
            # ranks: 0 and 1 misses, 2..11 hits, 12 a miss past the union, 13..15 hits
            row = [fresh[0], fresh[1]] + hits[:10] + [fresh[2]] + hits[10:13]
        elif b == 2:
            # 2 misses and 10 hits, 4 of them twice: a union of 12
            row = [fresh[0], fresh[1]] + hits[:10] + hits[:4]
        else:
            past_gather = host_rows - 8
            # 4 misses and 8 hits, 4 of them twice: a union of 12
            row = [fresh[0], fresh[1], fresh[2], past_gather] + hits[:8] + hits[:4]
        topk[b] = torch.tensor(row, dtype=torch.int32)
    hot = torch.zeros((B * H, row_bytes), dtype=torch.int8, device=device)
    for b in range(B):
        inside = held[b] < host.shape[0]
        hot[b * H:(b + 1) * H][inside.to(device)] = host[held[b][inside].long()].to(device)
    lru = torch.stack([torch.randperm(H, generator=gen) for _ in range(B)]).to(torch.int16).to(device)
    return resolve_full_buffers(device, schedule, topk, held.clone().to(device), lru, hot, host, block, host_rows,
                                max_union_rows)


@pytest.mark.sanitize
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_fused_gather_every_staging_path(device, schedule):
    """Misses staged after C1, past the union and zero-filled by phase E, in
    one launch (run_crafted_misses): every valid entry's hot row holds its
    host row (zeros past the gather's host rows), entries past the union are
    -1, and on CUDA every output, the state and every hot byte equal the CPU
    backend's."""
    got, dgi, lru, hot, host = run_crafted_misses(device, schedule=schedule)
    assert got["swap_counts"].tolist() == [2, 4, 2]
    assert (got["hot_rows"][0, 12:] == -1).all() and (got["hot_rows"][0, :12] >= 0).all()
    assert (got["hot_rows"][1:] >= 0).all()
    valid = got["hot_rows"] >= 0
    rows = torch.from_numpy(got["hot_rows"][valid]).long()
    sources = torch.from_numpy(got["resolved"][valid]).long()
    inside = sources < host.shape[0]
    assert (~inside).sum() == 1 and not hot[rows[~inside]].any()
    assert torch.equal(hot[rows[inside]], host[sources[inside]])
    if device.type == "cuda":
        want, want_dgi, want_lru, want_hot, _ = run_crafted_misses(CPU, schedule=schedule)
        assert_same(got, want, "cuda vs cpu")
        assert torch.equal(dgi, want_dgi) and torch.equal(lru, want_lru)
        assert torch.equal(hot, want_hot)


def run_twice_held_keys(device, schedule, K=64, H=128, row_bytes=656, fresh=12, twice=6, hinted=False):
    """One fused resolve of two requests with full buffers whose state is
    corrupt: `twice` of the keys they select are held by two usable slots
    each. Each request selects `fresh` new positions (more than the CUDA
    resolver's 8-row stage) and K - fresh held ones, so that phase C1, which
    counts every slot holding a member, sees fresh - twice misses (within
    the stage) where phase D assigns `fresh`. Returns the outputs, the final
    state, the hot cache and the host rows."""
    block, span, B = 16, 1024, 2
    gen = torch.Generator().manual_seed(61)
    host = host_copy(torch.randint(-128, 127, (B * span, row_bytes), generator=gen, dtype=torch.int8), device)
    held = torch.stack([b * span + torch.randperm(span, generator=gen)[:H] for b in range(B)]).to(torch.int32)
    held[:, H - twice:] = held[:, :twice]  # the last slots hold the first slots' keys again
    topk = torch.empty((B, K), dtype=torch.int32)
    for b in range(B):
        mine = set(held[b].tolist())
        new = [g for g in (b * span + torch.randperm(span, generator=gen)).tolist() if g not in mine][:fresh]
        topk[b] = torch.tensor(new + held[b, : K - fresh].tolist(), dtype=torch.int32)
    hot = host[held.flatten().long()].to(device)
    lru = torch.stack([torch.randperm(H, generator=gen) for _ in range(B)]).to(torch.int16).to(device)
    return resolve_full_buffers(device, schedule, topk, held.clone().to(device), lru, hot, host, block, B * span, K,
                                hinted)


@pytest.mark.sanitize
@pytest.mark.parametrize("hinted", [False, True], ids=["no_hint", "hint"])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_fused_gather_with_keys_held_twice(device, schedule, hinted):
    """A corrupt state holding selected keys at two slots makes the misses
    seen after C1 fewer than phase D assigns (run_twice_held_keys): with a
    handoff array the request closes its record after C1 and publishes it
    after D all the same (where its helpers read early, as two requests'
    do on any GPU of 7 SMs or more, it keeps the record closed and copies
    its whole list itself). Every
    miss is copied, every valid entry's hot row holds its host row, the
    records are idle again, and on CUDA every output, the state and every
    hot byte equal the CPU backend's."""
    got, dgi, lru, hot, host = run_twice_held_keys(device, schedule, hinted=hinted)
    assert got["swap_counts"].tolist() == [12, 12]
    assert (got["hot_rows"] >= 0).all()
    assert torch.equal(hot[torch.from_numpy(got["hot_rows"]).long().flatten()],
                       host[torch.from_numpy(got["resolved"]).long().flatten()])
    if device.type == "cuda":
        want, want_dgi, want_lru, want_hot, _ = run_twice_held_keys(CPU, schedule)
        assert_same(got, want, "cuda vs cpu")
        assert torch.equal(dgi, want_dgi) and torch.equal(lru, want_lru)
        assert torch.equal(hot, want_hot)


# Misses per batch row of run_early_read_cases; batch rows 10 and 11 name
# the state rows of 0 and 1 again, so they resolve nothing.
EARLY_READ_MISSES = [0, 3, 9, 40, 100, 200, 1, 8, 60, 150, 5, 5]


def run_early_read_cases(device, schedule, steps=2, K=256, H=1024, row_bytes=656, hinted=False,
                          misses_per_row=EARLY_READ_MISSES):
    """`steps` fused resolves of 12 one-row requests on full buffers of H
    slots (each state row's host rows span max(4096, 2 H) rows), where
    the handoff's helper blocks read early (a helper block per request or
    more on any GPU of 25 SMs or more, two from 37): token rows 6-11 in reverse batch order
    (their helpers cannot find their rows and predict nothing), batch rows
    10 and 11 naming the state rows of 0 and 1 (their helpers must leave
    those records alone), top-k rows repeating hits and misses, some misses
    past the gather's host rows (zero-filled), and misses_per_row[b] fresh
    positions per step. Returns per step the outputs, and the final state,
    hot cache and host rows."""
    block, span, B, S = 16, max(4096, 2 * H), len(misses_per_row), 10
    gen = torch.Generator().manual_seed(67)
    host_rows = S * span
    gather_rows = host_rows - 64
    host = host_copy(torch.randint(-128, 127, (gather_rows, row_bytes), generator=gen, dtype=torch.int8), device)
    order = [torch.randperm(span, generator=gen) + s * span for s in range(S)]
    held = torch.stack([order[s][:H] for s in range(S)]).to(torch.int32)
    dgi = held.clone().to(device)
    lru = torch.stack([torch.randperm(H, generator=gen) for _ in range(S)]).to(torch.int16).to(device)
    hot = torch.zeros((B * H, row_bytes), dtype=torch.int8, device=device)
    for s in range(S):
        inside = held[s] < gather_rows
        hot[s * H:(s + 1) * H][inside.to(device)] = host[held[s][inside].long()].to(device)
    state_rows = torch.tensor(list(range(S)) + [0, 1], dtype=torch.int32)
    req_id = torch.tensor(list(range(6)) + list(range(11, 5, -1)), dtype=torch.int32)
    hot_table = (torch.arange(B)[:, None] * (H // block) + torch.arange(H // block)).to(torch.int32).to(device)
    scheduled = Schedule(schedule, device, S)
    fresh_at = [H] * S
    outputs = []
    hint = {"residency_hint": hint_of(dgi, host_rows).to(device)} if hinted else {}
    for step in range(steps):
        topk = torch.empty((B, K), dtype=torch.int32)
        for t in range(B):
            b = int(req_id[t])
            s = int(state_rows[b])
            misses = misses_per_row[b]
            fresh = order[s][fresh_at[s]:fresh_at[s] + misses].tolist()
            if b < S:
                fresh_at[s] += misses
            if s == 3 and misses:
                fresh[0] = host_rows - 1 - step  # past the gather's host rows: zero-filled
            hits = dgi[s].cpu()[torch.randperm(H, generator=gen)[: K - misses]].tolist()
            row = fresh + hits
            row[-4:] = row[:4]  # repeated positions (misses among them where there are any)
            topk[t] = torch.tensor(row, dtype=torch.int32)
        out = {n: torch.full((B, K), SENTINEL, dtype=torch.int32, device=device) for n in MATRICES}
        out.update({n: torch.full((B,), SENTINEL, dtype=torch.int32, device=device) for n in VECTORS})
        ops.resolve_residency(
            topk.to(device), req_id.to(device), state_rows.to(device), dgi, lru, hot_table, hot_block_size=block,
            attention_block_stride=block, host_rows=host_rows, max_union_rows=K, gather_host_cache=host,
            gather_hot_cache=hot, **scheduled.kwargs(), **hint, **{f"out_{n}": t for n, t in out.items()})
        scheduled.check_idle()
        outputs.append({n: t.cpu().numpy() for n, t in out.items()})
        if hinted and device.type == "cuda":
            # Every request owns its host rows, so the kept hint is exact.
            assert torch.equal(hint["residency_hint"].cpu(), hint_of(dgi, host_rows)), f"step {step}: hint"
    return outputs, dgi.cpu(), lru.cpu(), hot.cpu(), host.cpu()


def check_early_read_cases(device, schedule, **run):
    """run_early_read_cases: every request's misses are assigned and copied
    (zeros past the gather's host rows), the two batch rows naming an
    earlier request's state row resolve nothing, every valid entry's hot row
    holds its host row, the handoff's records are idle after every launch,
    and on CUDA every output, the state and every hot byte equal the CPU
    backend's after each step."""
    got, dgi, lru, hot, host = run_early_read_cases(device, schedule, **run)
    misses_per_row = run.get("misses_per_row", EARLY_READ_MISSES)
    for step, out in enumerate(got):
        # Token row t belongs to batch row req_id[t]: rows 6-11 reversed.
        by_row = [misses_per_row[b] for b in list(range(6)) + list(range(11, 5, -1))]
        expected = [m if b < 10 else 0 for m, b in zip(by_row, list(range(6)) + list(range(11, 5, -1)))]
        assert out["swap_counts"].tolist() == expected, f"step {step}"
        inactive = [t for t, b in enumerate(list(range(6)) + list(range(11, 5, -1))) if b >= 10]
        assert (out["hot_rows"][inactive] == -1).all(), f"step {step}"
    last = got[-1]
    valid = last["hot_rows"] >= 0
    rows = torch.from_numpy(last["resolved"][valid]).long()
    inside = rows < host.shape[0]
    copied = hot[torch.from_numpy(last["hot_rows"][valid]).long()]
    assert torch.equal(copied[inside], host[rows[inside]])
    assert (copied[~inside] == 0).all() and (~inside).any()
    if device.type == "cuda":
        run.pop("hinted", None)
        assert_steps_same_as_cpu(got, dgi, lru, hot, run_early_read_cases(CPU, schedule, **run))


@pytest.mark.sanitize
@pytest.mark.parametrize("hinted", [False, True], ids=["no_hint", "hint"])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_fused_gather_early_reads_edge_cases(device, schedule, hinted):
    """check_early_read_cases at 1,024 hot slots per request."""
    check_early_read_cases(device, schedule, hinted=hinted)


@pytest.mark.sanitize
def test_fused_gather_early_reads_on_a_large_hot_buffer(device):
    """check_early_read_cases at 8,192 hot slots per request (32-byte rows),
    under the handoff, whose helpers predict from the state rows: each
    helper marks a state row longer than its first round of loads (4,096
    entries) as held."""
    check_early_read_cases(device, "handoff", H=8192, row_bytes=32)


@pytest.mark.sanitize
@pytest.mark.parametrize("row_bytes", [656, 3088])
def test_fused_gather_early_reads_past_the_buffer(device, row_bytes):
    """check_early_read_cases with up to 1,900 misses per request of
    k = 2,048 on 4,096 hot slots: an early-read helper (about ten per
    request) predicts more rows than its shared memory buffers (about 150
    rows of 656 bytes, about 30 of 3,088), reads the others from host memory once
    the swap list is published, and the records still close."""
    misses = [0, 3, 1900, 40, 1500, 200, 1, 8, 1300, 150, 5, 5]
    check_early_read_cases(device, "handoff", K=2048, H=4096, row_bytes=row_bytes, misses_per_row=misses)


# Launch shapes for the residency hint's upkeep (resolve_residency.cu): the
# kept copy of the state row (one block per SM, shared arrays, resolve alone
# or fused), two requests per block in turn (a fused batch past the SM
# count), and arrays in the workspace (H past what one block's shared memory
# holds).
HINT_LAUNCHES = {
    "kept_resolve": dict(B=4, K=64, H=128, fused=False),
    "kept_fused": dict(B=4, K=64, H=128, fused=True),
    "turns": dict(B=140, K=64, H=128, fused=True),
    "split": dict(B=2, K=64, H=32767, fused=True),
}


def run_hint_launch(device, B, K, H, fused, hinted, steps=3, row_bytes=32):
    """`steps` resolves of B one-row requests on full buffers, each request
    owning its host rows, with a few fresh positions per request and step
    (some requests none); with `hinted`, a residency hint of the state is
    passed and, on CUDA, must equal the state's rows after every step.
    Returns per step the outputs, and the final state and hot cache."""
    gen = torch.Generator().manual_seed(B * 1000 + H)
    span = H + K * steps
    host_rows = B * span
    order = [torch.randperm(span, generator=gen) + s * span for s in range(B)]
    dgi = torch.stack([order[s][:H] for s in range(B)]).to(torch.int32).to(device)
    lru = torch.stack([torch.randperm(H, generator=gen) for _ in range(B)]).to(torch.int16).to(device)
    host = host_copy(torch.randint(0, 255, (host_rows, row_bytes), generator=gen, dtype=torch.uint8), device)
    hot = torch.zeros((B * H, row_bytes), dtype=torch.uint8, device=device)
    hot_table = (torch.arange(B)[:, None] * H + torch.arange(H)).to(torch.int32).to(device)
    state_rows = torch.arange(B, dtype=torch.int32)
    req_id = torch.arange(B, dtype=torch.int32)
    workspace = resolver_workspace(device, B, H, K)
    extra = {"workspace": workspace} if workspace is not None else {}
    hint = {"residency_hint": hint_of(dgi, host_rows).to(device)} if hinted else {}
    gather = dict(gather_host_cache=host, gather_hot_cache=hot) if fused else {}
    fresh_at = [H] * B
    outputs = []
    for step in range(steps):
        topk = torch.empty((B, K), dtype=torch.int32)
        for b in range(B):
            misses = (b * 7 + step * 3) % 9
            fresh = order[b][fresh_at[b]:fresh_at[b] + misses].tolist()
            fresh_at[b] += misses
            hits = dgi[b].cpu()[torch.randperm(H, generator=gen)[: K - misses]].tolist()
            topk[b] = torch.tensor(fresh + hits, dtype=torch.int32)
        out = {n: torch.full((B, K), SENTINEL, dtype=torch.int32, device=device) for n in MATRICES}
        out.update({n: torch.full((B,), SENTINEL, dtype=torch.int32, device=device) for n in VECTORS})
        ops.resolve_residency(
            topk.to(device), req_id.to(device), state_rows.to(device), dgi, lru, hot_table, hot_block_size=1,
            attention_block_stride=1, host_rows=host_rows, max_union_rows=K, **extra, **gather, **hint,
            **{f"out_{n}": t for n, t in out.items()})
        outputs.append({n: t.cpu().numpy() for n, t in out.items()})
        if hinted and device.type == "cuda":
            assert torch.equal(hint["residency_hint"].cpu(), hint_of(dgi, host_rows)), f"step {step}: hint"
    return outputs, dgi.cpu(), lru.cpu(), hot.cpu()


@requires_cuda
@pytest.mark.parametrize("launch", sanitize_subset(list(HINT_LAUNCHES), {"kept_fused", "turns"}))
def test_residency_hint_stays_exact_in_every_launch(launch):
    """A resolve with a residency hint keeps it equal to the state's rows
    whichever launch runs it (its upkeep differs between them), and its
    outputs, state and hot bytes equal a resolve without a hint and the CPU
    backend's."""
    shape = HINT_LAUNCHES[launch]
    device = torch.device("cuda")
    got, dgi, lru, hot = run_hint_launch(device, hinted=True, **shape)
    for name, (want, want_dgi, want_lru, want_hot) in (
            ("no hint", run_hint_launch(device, hinted=False, **shape)),
            ("cpu", run_hint_launch(CPU, hinted=False, **shape))):
        for step, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{launch}, step {step}: hint vs {name}")
        assert torch.equal(dgi, want_dgi) and torch.equal(lru, want_lru), f"{launch}: state vs {name}"
        assert torch.equal(hot, want_hot), f"{launch}: hot bytes vs {name}"
    assert any(int(o["swap_counts"].sum()) > 0 for o in got)


# Misses per request of one cold-start step (K = 16, two token rows each):
# within the CUDA resolver's stage (8 rows), one more, a first row that
# fills up with one miss in the second, and two full rows; the automatic
# schedule copies the first two in the resolve launch and leaves the others
# (the second row's single entry included) to the tail gather.
AUTO_SPLIT_MISSES = [3, 8, 9, 17, 32]


def run_auto_split(device, schedule, K=16, H=64, row_bytes=656):
    """One fused resolve of len(AUTO_SPLIT_MISSES) two-row requests on cold
    buffers, request b selecting AUTO_SPLIT_MISSES[b] distinct positions
    (repeated and -1 entries fill the rest). Returns the outputs, the hot
    cache and the host rows."""
    block, span, B, q = 16, 256, len(AUTO_SPLIT_MISSES), 2
    gen = torch.Generator().manual_seed(59)
    host = host_copy(torch.randint(-128, 127, (B * span, row_bytes), generator=gen, dtype=torch.int8), device)
    hot = torch.zeros((B * H, row_bytes), dtype=torch.int8, device=device)
    topk = torch.full((B * q, K), -1, dtype=torch.int32)
    for b, misses in enumerate(AUTO_SPLIT_MISSES):
        distinct = b * span + torch.randperm(span, generator=gen)[:misses].to(torch.int32)
        entries = torch.cat([distinct, distinct[torch.randint(0, misses, (q * K - misses,), generator=gen)]])
        entries[torch.rand(q * K, generator=gen) < 0.1] = -1
        entries[:misses] = distinct  # every distinct position occurs
        topk[b * q:(b + 1) * q] = entries.reshape(q, K)
    dgi = torch.full((B, H), -1, dtype=torch.int32, device=device)
    lru = torch.arange(H, dtype=torch.int16).repeat(B, 1).to(device)
    hot_table = (torch.arange(B)[:, None] * (H // block) + torch.arange(H // block)).to(torch.int32).to(device)
    out = {n: torch.full((B * q, K), SENTINEL, dtype=torch.int32, device=device) for n in MATRICES}
    out.update({n: torch.full((B * q,), SENTINEL, dtype=torch.int32, device=device) for n in VECTORS})
    scheduled = Schedule(schedule, device, B)
    ops.resolve_residency(
        topk.to(device), torch.arange(B, dtype=torch.int32).repeat_interleave(q).to(device),
        torch.arange(B, dtype=torch.int32, device=device), dgi, lru, hot_table, hot_block_size=block,
        attention_block_stride=block, host_rows=B * span, max_union_rows=H, gather_host_cache=host,
        gather_hot_cache=hot, **scheduled.kwargs(), **{f"out_{n}": t for n, t in out.items()})
    scheduled.check_idle()
    return {n: t.cpu().numpy() for n, t in out.items()}, hot.cpu(), host.cpu()


@pytest.mark.sanitize
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_fused_gather_splits_requests_by_their_misses(device, schedule):
    """Requests whose misses fit the resolver's stage and requests with more,
    one whose misses spill into its second token row, in one launch: every
    swap entry's hot row holds its host row, and on CUDA the outputs and
    every hot byte equal the CPU backend's, in both schedules."""
    got, hot, host = run_auto_split(device, schedule)
    counts = got["swap_counts"].reshape(-1, 2)
    assert counts.tolist() == [[3, 0], [8, 0], [9, 0], [16, 1], [16, 16]]
    valid = got["hot_rows"] >= 0
    assert torch.equal(hot[torch.from_numpy(got["hot_rows"][valid]).long()],
                       host[torch.from_numpy(got["resolved"][valid]).long()])
    if device.type == "cuda":
        want, want_hot, _ = run_auto_split(CPU, schedule)
        assert_same(got, want, "cuda vs cpu")
        assert torch.equal(hot, want_hot)


# ----------------------------------------------------------------- bad inputs


def snapshot(lane: Lane, kwargs: dict) -> list:
    outputs = [v for v in kwargs.values() if isinstance(v, torch.Tensor)]
    return [t.cpu().clone() for t in (lane.dgi, lane.lru, lane.stats, lane.slab, *outputs)]


def small_call(device):
    """A lane and the arguments of one resolve on it (outputs included)."""
    shape = Shape(row_bytes=32, hot_block_size=4, hot_block_stride=4, steps=1)
    world = World(shape, seed=5)
    lane = Lane(world, device, fused=True)
    T, K = world.T, shape.K
    outputs = {f"out_{n}": torch.full((T, K), SENTINEL, dtype=torch.int32, device=device) for n in MATRICES}
    outputs.update({f"out_{n}": torch.full((T,), SENTINEL, dtype=torch.int32, device=device) for n in VECTORS})
    args = (lane.tensor(world.next_topk()), lane.tensor(world.req_id_per_token),
            lane.tensor(np.array(STATE_ROWS, np.int32)), lane.dgi, lane.lru, lane.tensor(world.hot_table))
    kwargs = dict(hot_block_size=4, attention_block_stride=4, host_rows=shape.resolver_host_rows,
                  max_union_rows=shape.max_union_rows, source_block_table=lane.tensor(world.source),
                  block_size=shape.block_size, stats=lane.stats, **outputs)
    return lane, args, kwargs


def expect_failure(lane, args, kwargs, exc, match, **gather):
    before = snapshot(lane, kwargs)
    with pytest.raises(exc, match=match):
        ops.resolve_residency(*args, **kwargs, **gather)
    after = snapshot(lane, kwargs)
    for was, now in zip(before, after):
        assert torch.equal(was, now), f"a failed call ({match}) changed state, outputs or the hot cache"


def test_fused_gather_bad_inputs(device):
    lane, args, kwargs = small_call(device)
    host, hot = lane.host, lane.hot

    def fail(exc, match, **gather):
        expect_failure(lane, args, kwargs, exc, match, **gather)

    fail(ValueError, r"gather_hot_cache: expected a tensor, got NULL \(a fused gather needs", gather_host_cache=host)
    fail(ValueError, r"gather_host_cache: expected a tensor, got NULL \(a fused gather needs", gather_hot_cache=hot)
    fail(ValueError, "gather_hot_block_stride: expected 0 without a fused gather", gather_hot_block_stride=8)
    fail(ValueError, r"gather_schedule: expected one of \['auto', 'fused'\], got 'split'",
         gather_host_cache=host, gather_hot_cache=hot, gather_schedule="split")
    fail(ValueError, r"gather_hot_block_stride: expected 0 \(= hot_block_size\) or at least hot_block_size \(4\)",
         gather_host_cache=host, gather_hot_cache=hot, gather_hot_block_stride=3)
    fail(TypeError, r"gather_hot_cache: expected dtype uint8 \(the dtype of gather_host_cache\), got int16",
         gather_host_cache=host, gather_hot_cache=hot.view(torch.int16))
    fail(ValueError, "gather_hot_cache: expected rows of 32 bytes",
         gather_host_cache=host, gather_hot_cache=lane.slab.view(-1, 64))
    fail(ValueError, "gather_host_cache: expected rows of a positive multiple of 16 bytes",
         gather_host_cache=host_copy(torch.zeros((8, 20), dtype=torch.uint8), device), gather_hot_cache=hot)
    misaligned = host_copy(torch.zeros(8 * 32 + 1, dtype=torch.uint8), device)[1:].view(8, 32)
    fail(ValueError, "gather_host_cache: expected a data pointer aligned to 16 bytes",
         gather_host_cache=misaligned, gather_hot_cache=hot)
    fail(ValueError, "gather_hot_cache: expected size 4 in dimension 1",
         gather_host_cache=host, gather_hot_cache=lane.slab[:64].view(32, 2, 32))
    fail(ValueError, "gather_hot_cache: expected a block stride of gather_hot_block_stride x row width",
         gather_host_cache=host, gather_hot_cache=lane.slab[:64].view(16, 4, 32), gather_hot_block_stride=5)
    words = ops.RESOLVER_HANDOFF_WORDS
    records = torch.zeros((S, words), dtype=torch.int32, device=device)
    fail(ValueError,
         r"handoff: expected size 6 in dimension 0 \(the rows of device_global_indices\), got shape \[5, 4\]",
         gather_host_cache=host, gather_hot_cache=hot, handoff=records[:5])
    fail(ValueError, r"handoff: expected size 4 in dimension 1 \(HS_RESOLVER_HANDOFF_WORDS\)",
         gather_host_cache=host, gather_hot_cache=hot, handoff=torch.zeros((S, 3), dtype=torch.int32, device=device))
    fail(TypeError, r"handoff: expected dtype int32, got int64",
         gather_host_cache=host, gather_hot_cache=hot, handoff=records.to(torch.int64))
    fail(ValueError, r"handoff: expected a contiguous tensor",
         gather_host_cache=host, gather_hot_cache=hot,
         handoff=torch.zeros((S, 2 * words), dtype=torch.int32, device=device)[:, ::2])
    fail(ValueError, r"(handoff: shares memory with device_global_indices"
                     r"|device_global_indices: shares memory with handoff)",
         gather_host_cache=host, gather_hot_cache=hot, handoff=lane.dgi.view(-1)[: S * words].view(S, words))
    other = "cuda" if device.type == "cpu" and cuda_available() else ("cpu" if device.type == "cuda" else None)
    if other is not None:
        fail(ValueError, rf"gather_hot_cache: expected a tensor on {device.type}.* \(the device of topk_indices\)",
             gather_host_cache=host, gather_hot_cache=hot.to(other))
        fail(ValueError, rf"handoff: expected a tensor on {device.type}.* \(the device of topk_indices\)",
             gather_host_cache=host, gather_hot_cache=hot, handoff=records.to(other))


@requires_cuda
def test_fused_gather_bad_inputs_cuda():
    device = torch.device("cuda")
    lane, args, kwargs = small_call(device)

    def fail(match, **gather):
        expect_failure(lane, args, kwargs, ValueError, match, **gather)

    unpinned = torch.zeros(tuple(lane.host.shape), dtype=lane.host.dtype)
    fail("gather_host_cache: host memory that is not pinned or registered",
         gather_host_cache=unpinned, gather_hot_cache=lane.hot)
    if torch.cuda.device_count() > 1:
        fail("gather_host_cache", gather_host_cache=lane.host.to("cuda:1"), gather_hot_cache=lane.hot)


@requires_cuda
@pytest.mark.sanitize
@pytest.mark.parametrize("stage_rows", [0, 1])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_fused_gather_with_a_short_or_no_miss_stage(monkeypatch, stage_rows, schedule):
    """Rows so long that the CUDA resolver's miss stage holds one row, or none
    (the shared memory the union leaves has room for no more): with none, the
    launch copies every miss after phase D; with one, a request stages its
    misses only when it has at most one. Every output, the state, the
    counters and every hot byte equal resolve + gather_compact and the CPU
    backend's fused gather."""
    device = torch.device("cuda")
    base = Shape(row_bytes=16, hot_block_size=16, hot_block_stride=16, steps=3)
    need = hisparse._C.resolver_shared_memory_bytes(base.H, base.max_union_rows)
    limit = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    # A stage of n rows takes 16 bytes of row owners (n <= 4) and n rows.
    one_row = (limit - need - 16) // 16 * 16
    row_bytes = one_row if stage_rows == 1 else one_row + 16
    assert need + 16 + row_bytes * stage_rows <= limit < need + 16 + row_bytes * (stage_rows + 1)
    monkeypatch.setitem(ROW_DTYPES, row_bytes, torch.uint8)
    shape = Shape(row_bytes=row_bytes, hot_block_size=16, hot_block_stride=16, steps=3)
    world = World(shape, seed=41 + stage_rows)
    fused, separate = Lane(world, device, fused=True, schedule=schedule), Lane(world, device, fused=False)
    reference = Lane(world, CPU, fused=True)
    moved = 0
    for step in range(shape.steps):
        topk, valid = world.next_topk(), world.num_valid_rows(step)
        got = fused.step(topk, valid)
        assert_same(got, separate.step(topk, valid), f"step {step}: fused vs resolve + gather_compact")
        assert_same(got, reference.step(topk, valid), f"step {step}: cuda vs cpu")
        moved += int(np.clip(got["swap_counts"][: world.T], 0, shape.K).sum())
    assert moved == got["stats"][2] > 0


# ----------------------------------------------------------------- batches past the SM count


# New positions per step of request b: NEW_POSITIONS[b % 7], so one batch
# holds requests that hit everything, requests whose few misses the resolve
# copies itself and requests left to the automatic schedule's tail gather.
NEW_POSITIONS = [0, 1, 2, 3, 8, 50, 400]


def run_wide_batch(device, schedule, B, steps=3, K=2048, H=4096, span=8192, row_bytes=656, rows_of=lambda b: 1,
                   draft_changes=64):
    """`steps` fused resolves of B requests (k = K, H hot slots each) over
    one host cache of `span` rows: a cold start, then steps where request b
    replaces NEW_POSITIONS[b % 7] of its positions by ones it never
    selected before. Request b has rows_of(b) token rows, as speculative
    decoding gives: its first row holds its positions, and each further
    row the same with `draft_changes` of them replaced by others of the
    span. Returns per step the outputs, the state and every hot byte."""
    gen = torch.Generator().manual_seed(B)
    host = host_copy(torch.randint(-128, 127, (span, row_bytes), generator=gen, dtype=torch.int8), device)
    hot = torch.zeros((B * H, row_bytes), dtype=torch.int8, device=device)
    positions = torch.stack([torch.randperm(span, generator=gen)[:K] for _ in range(B)]).to(torch.int32)
    used = positions.clone()  # per request, every position it ever selected (never fresh again)
    dgi = torch.full((B, H), -1, dtype=torch.int32, device=device)
    lru = torch.arange(H, dtype=torch.int16).repeat(B, 1).to(device)
    hot_table = torch.arange(B * H, dtype=torch.int32).reshape(B, H).to(device)
    rows_per_request = [rows_of(b) for b in range(B)]
    owners = torch.repeat_interleave(torch.arange(B, dtype=torch.int32), torch.tensor(rows_per_request))
    T = owners.numel()
    max_union_rows = min(H, K + (max(rows_per_request) - 1) * draft_changes)
    rows = torch.arange(B, dtype=torch.int32, device=device)
    scheduled = Schedule(schedule, device, B)
    snapshots = []
    for step in range(steps):
        if step > 0:
            for b in range(B):
                new = NEW_POSITIONS[b % len(NEW_POSITIONS)]
                fresh = torch.randperm(span, generator=gen)
                fresh = fresh[~torch.isin(fresh, used[b])][:new].to(torch.int32)
                positions[b, torch.randperm(K, generator=gen)[:new]] = fresh
            used = torch.cat([used, positions], dim=1)
        token_rows = positions[owners.long()].clone()
        for t in range(T):
            if t > 0 and owners[t] == owners[t - 1]:
                drafted = torch.randperm(span, generator=gen)[:draft_changes].to(torch.int32)
                token_rows[t, torch.randperm(K, generator=gen)[:draft_changes]] = drafted
        out = {n: torch.full((T, K), SENTINEL, dtype=torch.int32, device=device) for n in MATRICES}
        out.update({n: torch.full((T,), SENTINEL, dtype=torch.int32, device=device) for n in VECTORS})
        ops.resolve_residency(
            token_rows.to(device), owners.to(device), rows, dgi, lru, hot_table, hot_block_size=1,
            attention_block_stride=1, host_rows=span, max_union_rows=max_union_rows, gather_host_cache=host,
            gather_hot_cache=hot, **scheduled.kwargs(), **{f"out_{n}": t for n, t in out.items()})
        scheduled.check_idle()
        # Copies: on the CPU, .cpu() is the tensor itself, which the next step changes.
        snapshot = {n: t.cpu().numpy().copy() for n, t in out.items()}
        snapshot.update(dgi=dgi.cpu().numpy().copy(), lru=lru.cpu().numpy().copy(), hot_bytes=hot.cpu().numpy().copy())
        snapshots.append(snapshot)
    return snapshots, host.cpu()


def assert_wide_batch_hot_rows(snapshot, host):
    """Every valid entry's hot row holds its host row."""
    valid = snapshot["hot_rows"] >= 0
    hot = torch.from_numpy(snapshot["hot_bytes"])
    assert torch.equal(hot[torch.from_numpy(snapshot["hot_rows"][valid]).long()],
                       host[torch.from_numpy(snapshot["resolved"][valid]).long()])


@requires_cuda
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("extra_requests", [-100, -40, -1, 8, 120, 140],
                         ids=["helpers", "owners-keep-lists", "fills-every-sm", "turns", "turns-full", "past-twice"])
def test_fused_gather_on_batches_past_the_sm_count(schedule, extra_requests):
    """Batches around the SM count (H = 4096, k = 2048, 656-byte rows):
    below half of it the handoff schedule adds a helper block per idle SM;
    from half the SM count on (and for a batch that fills every SM) it adds
    none and every request keeps its whole list; up to twice the SM count,
    where two requests' arrays would fit one SM's shared memory (an H200,
    not an A100), the CUDA resolver runs one block per SM that resolves two
    requests in turn and then copies both swap lists; past it, or where the
    shape does not fit, one block per request, in waves, and the automatic
    schedule takes the tail gather even with a handoff array. Every
    output, the state and every hot byte equal the CPU backend's after
    every step, and every valid entry's hot row holds its host row."""
    props = torch.cuda.get_device_properties(0)
    B = max(props.multi_processor_count + extra_requests, 1)
    got, host = run_wide_batch(torch.device("cuda"), schedule, B)
    want, _ = run_wide_batch(CPU, schedule, B)
    swaps = []
    for step, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, f"step {step}: cuda vs cpu")
        assert_wide_batch_hot_rows(g, host)
        swaps.append(g["swap_counts"])
    # Cold start: every request misses all of its rows; later steps miss
    # exactly the positions each request replaced.
    assert (swaps[0] == 2048).all()
    expected = np.array([NEW_POSITIONS[b % len(NEW_POSITIONS)] for b in range(B)])
    assert all((s == expected).all() for s in swaps[1:])


@requires_cuda
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("extra_requests", sanitize_subset([8, 120], {8}), ids=["turns", "turns-full"])
def test_fused_gather_past_the_sm_count_with_several_rows_per_request(schedule, extra_requests):
    """Two requests per block in turn (a fused gather past the SM count, up
    to twice it) with requests of one, two and three token rows in one launch
    (k = 1024, H = 2048, each draft row changes 64 positions of its
    request's first row), as speculative decoding gives. Every output, the
    state and every hot byte equal the CPU backend's after every step, and
    every valid entry's hot row holds its host row."""
    props = torch.cuda.get_device_properties(0)
    B = props.multi_processor_count + extra_requests
    K = 1024
    shape = dict(K=K, H=2048, rows_of=lambda b: 1 + b % 3)
    got, host = run_wide_batch(torch.device("cuda"), schedule, B, **shape)
    want, _ = run_wide_batch(CPU, schedule, B, **shape)
    for step, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, f"step {step}: cuda vs cpu")
        assert_wide_batch_hot_rows(g, host)
    # Cold start: each request's first token row copies all of its k rows.
    first_rows = np.cumsum([0] + [shape["rows_of"](b) for b in range(B - 1)])
    assert (got[0]["swap_counts"][first_rows] == K).all()
