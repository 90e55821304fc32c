"""The CUDA resolver against the CPU reference, bit for bit.

Each test runs multi-step scenarios twice from identical inputs, once on the
CPU backend and once on CUDA, each backend carrying its own state
(device_global_indices, lru_slots, stats) from step to step, and requires
every output and the state to be identical after every step. Scenarios keep
a persistent world (per state row: source blocks, hot blocks, a drifting set
of positions) so that steps hit, miss and evict like a real decode loop.
The semantics themselves are pinned by test_resolve_residency.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import numpy as np
import pytest

from conftest import requires_cuda, resolver_workspace, sanitize_subset

torch = pytest.importorskip("torch")
hisparse = pytest.importorskip("hisparse")
from hisparse import ops  # noqa: E402

pytestmark = requires_cuda

SENTINEL = -77
MATRICES = ("attention", "hot_rows", "resolved", "miss_mask", "swap_host_rows", "swap_device_rows")
VECTORS = ("valid_counts", "swap_counts")
WARP_BOUNDARY_K = (1, 31, 32, 33, 63, 64, 65, 128, 2048)
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Config:
    B: int
    S: int
    H: int
    K: int
    q_max: int = 1
    max_union_rows: Optional[int] = None  # None: min(H, q_max * K)
    hot_block_size: int = 1
    attention_extra: int = 0  # attention_block_stride = hot_block_size + this
    block_size: int = 0  # 0: no source table (positions are host slots)
    resident: bool = False
    working_factor: float = 1.25  # positions a state row draws from, in units of K
    duplicate_rate: float = 0.05  # entries repeating another entry of their row
    drift: float = 0.1  # fraction of a working set replaced per step
    invalid_rate: float = 0.02
    padding_rate: float = 0.1  # batch rows with state -1
    reject_rate: float = 0.05  # state >= S, shared state rows
    orphan_rate: float = 0.1
    corrupt_rate: float = 0.0  # chance per step and state row of a corrupt lru / dgi
    table_corrupt_rate: float = 0.01  # null/negative source and hot blocks
    pad: int = 0  # extra columns (row stride > width) on topk, outputs, tables
    extra_rows: int = 0  # output rows past T

    @property
    def union_limit(self) -> int:
        return self.max_union_rows if self.max_union_rows is not None else min(self.H, self.q_max * self.K)

    @property
    def attention_block_stride(self) -> int:
        return self.hot_block_size + self.attention_extra


class World:
    """Per state row tables and positions that persist across steps."""

    def __init__(self, rng: np.random.Generator, cfg: Config):
        self.cfg = cfg
        self.hot_blocks = -(-cfg.H // cfg.hot_block_size)
        if cfg.block_size:
            self.source_width = max(1, -(-int(cfg.K * cfg.working_factor * 4) // cfg.block_size))
            self.context = self.source_width * cfg.block_size
            self.host_blocks = self.source_width * 2 + 8
            self.host_rows = self.host_blocks * cfg.block_size - cfg.block_size // 2
            self.source = rng.integers(1, self.host_blocks, (cfg.S, self.source_width)).astype(np.int32)
        else:
            self.context = int(cfg.K * cfg.working_factor * 4) + 16
            self.host_rows = self.context - 3
        self.resident_width = -(-self.context // cfg.hot_block_size)
        self.hot = np.stack([rng.permutation(self.hot_blocks * 3)[: self.hot_blocks] for _ in range(cfg.S)])
        self.hot = self.hot.astype(np.int32)
        size = min(self.context, max(1, int(cfg.K * cfg.working_factor)))
        self.working = [rng.choice(self.context, size, replace=False) for _ in range(cfg.S)]
        self.assignment = rng.permutation(cfg.S)

    def drift(self, rng: np.random.Generator) -> None:
        for working in self.working:
            replaced = rng.random(working.size) < self.cfg.drift
            working[replaced] = rng.integers(0, self.context, int(replaced.sum()))

    def initial_state(self, rng: np.random.Generator, warm: bool):
        cfg = self.cfg
        dgi = np.full((cfg.S, cfg.H), -1, np.int32)
        lru = np.tile(np.arange(cfg.H, dtype=np.int16), (cfg.S, 1))
        if warm:
            for s in range(cfg.S):
                lru[s] = rng.permutation(cfg.H)
                filled = rng.random(cfg.H) < 0.7
                dgi[s, filled] = rng.integers(0, self.host_rows + 2, int(filled.sum()))
        return dgi, lru

    def step(self, rng: np.random.Generator, T_fixed: Optional[int] = None) -> dict:
        """One step's inputs (NumPy). With T_fixed, exactly that many token rows."""
        cfg = self.cfg
        B, S, K = cfg.B, cfg.S, cfg.K
        # Requests keep their state rows from step to step, with some churn.
        order = self.assignment
        if rng.random() < 0.5:
            i, j = rng.integers(0, S, 2)
            order[i], order[j] = order[j], order[i]
        state = np.empty(B, np.int32)
        for b in range(B):
            r = rng.random()
            if r < cfg.padding_rate:
                state[b] = -1
            elif r < cfg.padding_rate + cfg.reject_rate:
                state[b] = S + int(rng.integers(0, 3)) if rng.random() < 0.5 or b == 0 else state[rng.integers(0, b)]
            else:
                state[b] = order[b % S]

        rows = []
        for b in rng.permutation(B):
            q = int(rng.integers(1, cfg.q_max + 1)) if rng.random() > 0.03 else 0
            rows += [int(b)] * q
            if rng.random() < cfg.orphan_rate:
                rows.append(int(rng.choice([-1, B, B + 7, -(2**31)])))
        if len(rows) > 2 and rng.random() < cfg.reject_rate:
            i, j = rng.choice(len(rows), 2, replace=False)
            rows[i], rows[j] = rows[j], rows[i]
        if T_fixed is not None:
            rows = rows[:T_fixed]
            valid = len(rows)
            rows += list(rng.integers(-1, B + 1, T_fixed - len(rows)))
            num_valid_rows = valid if valid < T_fixed or rng.random() < 0.5 else T_fixed + 3
        else:
            num_valid_rows = None if rng.random() < 0.6 else int(rng.integers(-1, len(rows) + 3))
        T = len(rows)
        req = np.array(rows, np.int32)

        topk = np.empty((T, K), np.int32)
        previous_request = None
        for t in range(T):
            b = req[t]
            s = int(state[b]) if 0 <= b < B else -1
            working = self.working[s % S]
            if previous_request == b and rng.random() < 0.8:
                # Speculative row: mostly the previous row's positions.
                row = topk[t - 1].copy()
                changed = rng.random(K) < 0.2
                row[changed] = rng.choice(working, int(changed.sum()))
            elif working.size >= K:
                row = rng.permutation(working)[:K]
            else:
                row = rng.choice(working, K)
            duplicated = rng.random(K) < cfg.duplicate_rate
            row[duplicated] = rng.choice(row, int(duplicated.sum()))
            bad = rng.random(K) < cfg.invalid_rate
            row[bad] = rng.choice([-1, -5, self.context, self.context + 99, 2**31 - 1], int(bad.sum()))
            topk[t] = row
            previous_request = b

        inputs = dict(topk=topk, req=req, state=state, num_valid_rows=num_valid_rows)
        table_state = np.where((state >= 0) & (state < S), state, rng.integers(0, S, B))
        hot = self.hot[table_state].copy()
        broken = rng.random(hot.shape) < cfg.table_corrupt_rate
        hot[broken] = rng.choice([-1, -3, INT32_MAX // cfg.attention_block_stride + 1], int(broken.sum()))
        inputs["hot"] = hot
        if cfg.block_size:
            source = self.source[table_state].copy()
            broken = rng.random(source.shape) < cfg.table_corrupt_rate
            source[broken] = rng.choice([0, -1, self.host_blocks + 5], int(broken.sum()))
            inputs["source"] = source
        if cfg.resident:
            # The newest pages of each request stay resident, a few older ones too.
            resident = np.zeros((B, self.resident_width), np.int32)
            tail = max(1, self.resident_width // 8)
            resident[:, -tail:] = rng.integers(1, 5000, (B, tail))
            scattered = rng.random(resident.shape) < 0.05
            resident[scattered] = rng.integers(-2, 5000, int(scattered.sum()))
            # Sometimes narrower than the positions (fixed width under a graph).
            narrower = int(rng.integers(0, 2)) if T_fixed is None else 0
            inputs["resident"] = resident[:, : self.resident_width - narrower]
        return inputs

    def corrupt(self, rng: np.random.Generator, dgi: np.ndarray, lru: np.ndarray) -> None:
        """Damage the state in place (applied identically to both backends' copies)."""
        cfg = self.cfg
        H = cfg.H
        for s in range(cfg.S):
            if rng.random() >= cfg.corrupt_rate:
                continue
            kind = rng.integers(0, 4)
            n = int(rng.integers(1, max(2, H // 8)))
            where = rng.integers(0, H, n)
            if kind == 0:  # out-of-range slots
                lru[s, where] = rng.choice([-1, H, H + 1, 32767, -32768], n)
            elif kind == 1:  # duplicated slots (some slot then occurs nowhere)
                lru[s, where] = lru[s, rng.integers(0, H, n)]
            elif kind == 2:  # garbage host slots
                dgi[s, where] = rng.choice([-7, INT32_MAX, -(2**31), self.host_rows + 1], n)
            else:  # the same host slot held twice
                dgi[s, where] = dgi[s, rng.integers(0, H, 1)]


def on(array: np.ndarray, device, pad: int = 0) -> torch.Tensor:
    """A torch copy on `device`; 2-D arrays with pad > 0 become views with a wider row stride."""
    # Not torch.from_numpy alone: empty arrays would get all-zero strides.
    source = torch.from_numpy(np.ascontiguousarray(array).copy())
    if pad == 0 or source.dim() != 2:
        return torch.empty(source.shape, dtype=source.dtype, device=device).copy_(source)
    rows, columns = source.shape
    wide = torch.full((rows, columns + pad), SENTINEL, dtype=source.dtype, device=device)
    wide[:, :columns] = source.to(device)
    return wide[:, :columns]


class Backend:
    """One backend's run of a scenario: its own state, counters and (CUDA,
    large shapes) resolver workspace."""

    def __init__(self, device, cfg: Config, dgi: np.ndarray, lru: np.ndarray, stats: np.ndarray):
        self.device = torch.device(device)
        self.cfg = cfg
        self.dgi = on(dgi, self.device)
        self.lru = on(lru, self.device)
        self.stats = on(stats, self.device)
        self.workspace = resolver_workspace(self.device, cfg.S, cfg.H, cfg.union_limit)

    def outputs(self, T: int) -> dict:
        cfg = self.cfg
        rows = T + cfg.extra_rows
        out = {
            name: torch.full((rows, cfg.K + cfg.pad), SENTINEL, dtype=torch.int32, device=self.device)[:, : cfg.K]
            for name in MATRICES
        }
        out.update({name: torch.full((rows,), SENTINEL, dtype=torch.int32, device=self.device) for name in VECTORS})
        return out

    def arguments(self, inputs: dict, out: dict) -> dict:
        cfg, device = self.cfg, self.device
        args = dict(
            topk_indices=on(inputs["topk"], device, cfg.pad),
            req_id_per_token=on(inputs["req"], device),
            request_state_indices=on(inputs["state"], device),
            device_global_indices=self.dgi,
            lru_slots=self.lru,
            hot_block_table=on(inputs["hot"], device, cfg.pad),
            hot_block_size=cfg.hot_block_size,
            attention_block_stride=cfg.attention_block_stride,
            host_rows=inputs["host_rows"],
            max_union_rows=cfg.union_limit,
            stats=self.stats,
            **{f"out_{name}": tensor for name, tensor in out.items()},
        )
        if self.workspace is not None:
            args["workspace"] = self.workspace
        if "source" in inputs:
            args.update(source_block_table=on(inputs["source"], device, cfg.pad), block_size=cfg.block_size)
        if "resident" in inputs:
            args.update(
                resident_block_table=on(inputs["resident"], device, cfg.pad), resident_block_size=cfg.hot_block_size
            )
        if inputs["num_valid_rows"] is not None:
            args["num_valid_rows"] = on(np.array([inputs["num_valid_rows"]], np.int32), device)
        return args

    def run(self, inputs: dict) -> dict:
        out = self.outputs(inputs["topk"].shape[0])
        ops.resolve_residency(**self.arguments(inputs, out))
        return out

    def snapshot(self, out: dict) -> dict:
        result = {name: tensor.cpu().numpy() for name, tensor in out.items()}
        result.update(dgi=self.dgi.cpu().numpy(), lru=self.lru.cpu().numpy(), stats=self.stats.cpu().numpy())
        return result


def assert_same(got: dict, want: dict, T: int, context: str, *, whole_swap_list: bool = True) -> None:
    """Every output row < T and the state; swap lists up to swap_counts (and untouched past them)."""
    for name in ("dgi", "lru", "stats", "attention", "hot_rows", "resolved", "miss_mask", "valid_counts",
                 "swap_counts"):
        a, b = got[name], want[name]
        if name not in ("dgi", "lru", "stats"):
            a, b = a[:T], b[:T]
        if not np.array_equal(a, b):
            np.testing.assert_array_equal(a, b, err_msg=f"{context}: {name}")
    counts = want["swap_counts"][:T]
    for name in ("swap_host_rows", "swap_device_rows"):
        for t in np.flatnonzero(counts):
            n = counts[t]
            if not np.array_equal(got[name][t, :n], want[name][t, :n]):
                np.testing.assert_array_equal(got[name][t, :n], want[name][t, :n], err_msg=f"{context}: {name} row {t}")
        if whole_swap_list:
            # Eager runs start from sentinel buffers: nothing past the counts, and no row past T, was written.
            if not np.array_equal(got[name], want[name]):
                np.testing.assert_array_equal(got[name], want[name], err_msg=f"{context}: {name} (untouched cells)")
    if whole_swap_list:
        for name in MATRICES + VECTORS:
            assert (got[name][T:] == SENTINEL).all(), f"{context}: {name} written past row T"


def run_scenario(cfg: Config, seed: int, steps: int, *, warm: bool = False) -> dict:
    """Runs `steps` steps on CPU and CUDA; returns how often each outcome occurred (to keep tests honest)."""
    rng = np.random.default_rng(seed)
    world = World(rng, cfg)
    dgi, lru = world.initial_state(rng, warm)
    stats = rng.integers(0, 1000, 7).astype(np.int64)
    cpu = Backend("cpu", cfg, dgi, lru, stats)
    gpu = Backend("cuda", cfg, dgi, lru, stats)
    seen = dict(hits=0, misses=0, invalid=0, resident=0, swaps=0)
    for step in range(steps):
        inputs = world.step(rng)
        inputs["host_rows"] = world.host_rows
        T = inputs["topk"].shape[0]
        before = cpu.stats.clone()
        want = cpu.snapshot(cpu.run(inputs))
        got = gpu.snapshot(gpu.run(inputs))
        torch.cuda.synchronize()
        assert_same(got, want, T, f"{cfg} seed {seed} step {step}")
        delta = want["stats"] - before.numpy()
        seen["hits"] += int(delta[1])
        seen["misses"] += int(delta[2])
        seen["resident"] += int(delta[3])
        seen["invalid"] += int(delta[4])
        seen["swaps"] += int(want["swap_counts"][:T].sum())
        # The next step starts from the (identical) state each backend left.
        world.drift(rng)
        if cfg.corrupt_rate:
            dgi_now, lru_now = want["dgi"].copy(), want["lru"].copy()
            world.corrupt(rng, dgi_now, lru_now)
            for backend in (cpu, gpu):
                backend.dgi.copy_(torch.from_numpy(dgi_now))
                backend.lru.copy_(torch.from_numpy(lru_now))
    return seen


# ----------------------------------------------------------------- scenarios


def random_config(rng: np.random.Generator) -> Config:
    K = int(rng.choice(WARP_BOUNDARY_K[:-1] + (200, 700)))
    q_max = int(rng.integers(1, 5))
    H = int(min(32767, max(1, rng.choice([K // 2 + 1, K + 3, 2 * K, q_max * K + 17, 3 * K + 100]))))
    hot_block_size = int(rng.choice([1, 2, 16, 64]))
    union_limit = int(min(H, q_max * K)) if rng.random() < 0.7 else int(rng.integers(1, H + 1))
    return Config(
        B=int(rng.integers(1, 9)),
        S=int(rng.integers(1, 12)),
        H=H,
        K=K,
        q_max=q_max,
        max_union_rows=union_limit,
        hot_block_size=hot_block_size,
        attention_extra=int(rng.choice([0, 0, 1, 64])),
        block_size=int(rng.choice([0, 1, 16, 64])),
        resident=bool(rng.random() < 0.4),
        working_factor=float(rng.choice([0.5, 1.0, 1.25, 2.0])),
        drift=float(rng.choice([0.0, 0.05, 0.3, 1.0])),
        invalid_rate=float(rng.choice([0.0, 0.02, 0.2])),
        corrupt_rate=float(rng.choice([0.0, 0.0, 0.2])),
        pad=int(rng.choice([0, 0, 5])),
        extra_rows=int(rng.choice([0, 2])),
    )


@pytest.mark.parametrize("seed", sanitize_subset(range(40), {0, 1}))
def test_random_configs_match_cpu(seed):
    rng = np.random.default_rng(1000 + seed)
    cfg = random_config(rng)
    run_scenario(cfg, seed, steps=5, warm=bool(seed % 2))


@pytest.mark.parametrize("K", sanitize_subset(WARP_BOUNDARY_K, {1, 33, 65, 2048}))
def test_warp_boundary_top_k(K):
    cfg = Config(B=5, S=7, H=min(32767, 2 * K + 5), K=K, q_max=3, hot_block_size=16, block_size=16,
                 resident=True, drift=0.2, corrupt_rate=0.1, pad=3, extra_rows=1)
    seen = run_scenario(cfg, seed=K, steps=4)
    assert seen["misses"] > 0 and seen["invalid"] > 0 and seen["resident"] > 0
    assert seen["hits"] > 0 or K == 1


@pytest.mark.parametrize("K", WARP_BOUNDARY_K)
def test_warp_boundary_top_k_without_tables(K):
    cfg = Config(B=3, S=3, H=K + 1, K=K, q_max=2, max_union_rows=K + 1, working_factor=1.0, drift=0.5)
    seen = run_scenario(cfg, seed=100 + K, steps=4)
    assert seen["hits"] > 0 and seen["misses"] > 0


@pytest.mark.parametrize("union_limit", sanitize_subset([1, 2, 31, 33, 700, 1023, 1025, 2047], {33, 1025}))
def test_union_overflow(union_limit):
    # Far more distinct candidates (up to 4 x 2048) than union rows.
    cfg = Config(B=4, S=4, H=4096, K=2048, q_max=4, max_union_rows=union_limit, working_factor=4.0,
                 drift=0.5, block_size=64)
    seen = run_scenario(cfg, seed=union_limit, steps=3)
    assert seen["invalid"] > 0


@pytest.mark.parametrize("union_limit", [1, 5, 64, 100])
def test_union_overflow_small_top_k(union_limit):
    cfg = Config(B=6, S=6, H=128, K=65, q_max=4, max_union_rows=union_limit, working_factor=3.0, drift=0.3)
    run_scenario(cfg, seed=50 + union_limit, steps=4)


@pytest.mark.parametrize("seed", sanitize_subset(range(8), {0}))
def test_corrupt_state(seed):
    cfg = Config(B=6, S=6, H=int([64, 100, 1000, 4096][seed % 4]), K=int([32, 33, 500, 2048][seed % 4]),
                 q_max=2, max_union_rows=None, hot_block_size=int([1, 4][seed % 2]), block_size=16,
                 corrupt_rate=0.8, table_corrupt_rate=0.05, drift=0.2)
    cfg = replace(cfg, max_union_rows=min(cfg.H, cfg.q_max * cfg.K))
    run_scenario(cfg, seed=seed, steps=6, warm=True)


@pytest.mark.parametrize(
    "B, H, union_limit, q_max, drift",
    [
        (100, 4096, 2048, 1, 0.001),  # the performance target's shape
        (100, 4096, 2048, 1, 0.2),
        (256, 4096, 4096, 2, 0.05),
        (128, 5120, 4096, 2, 0.1),
        (256, 5120, 2048, 1, 0.01),
        # More requests than an H200 has SMs, fewer and more than twice as many.
        (200, 4096, 2048, 1, 0.05),
        (300, 2048, 2048, 1, 0.2),
    ],
)
def test_production_shapes(B, H, union_limit, q_max, drift):
    cfg = Config(B=B, S=B + 16, H=H, K=2048, q_max=q_max, max_union_rows=union_limit, hot_block_size=64,
                 attention_extra=64, block_size=64, resident=True, working_factor=1.0, drift=drift,
                 duplicate_rate=0.0,
                 invalid_rate=0.005, padding_rate=0.05, reject_rate=0.01, orphan_rate=0.02)
    seen = run_scenario(cfg, seed=B + H, steps=3)
    assert seen["hits"] > 0 and seen["misses"] > 0


# Speculative decoding (2-4 token rows of k = 2048, unions up to 8,192) on hot
# buffers of 6-32K slots. On an H200 (227 KiB of shared memory per block) the
# resolver keeps these in shared memory only in part: the comment names what
# moves to the workspace (resolver_shared_memory.hpp, kResolverSpillOrder).
LARGE_SHAPES = [
    (6144, 6144, 3),  # the LRU copy alone (read in place: no workspace bytes)
    (10240, 8192, 4),  # vLLM's MTP-3 case: + entry codes, evictable positions, member first entries
    (32767, 8192, 4),  # + member keys
    (16384, 16384, 4),  # everything but the union table (global atomics on slot and member words)
    (32767, 32767, 4),  # everything
]


def large_config(H: int, union_limit: int, q_max: int, **overrides) -> Config:
    fields = dict(B=3, S=5, H=H, K=2048, q_max=q_max, max_union_rows=union_limit, hot_block_size=64,
                  attention_extra=64, block_size=64, resident=True, drift=0.2, corrupt_rate=0.3)
    fields.update(overrides)
    return Config(**fields)


def check_workspace_matches_the_layout(cfg: Config) -> None:
    """The scenario runs the split placement where the all-shared layout is
    larger than the device allows (and only then needs workspace bytes)."""
    limit = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    need = hisparse._C.resolver_shared_memory_bytes(cfg.H, cfg.union_limit)
    size = ops.resolver_workspace_bytes(cfg.S, cfg.H, cfg.union_limit, 0)
    if need <= limit:
        assert size == 0
    elif (cfg.H, cfg.union_limit) != (6144, 6144):
        assert size > 0


@pytest.mark.parametrize(
    "H, union_limit, q_max",
    sanitize_subset(LARGE_SHAPES, {(10240, 8192, 4), (16384, 16384, 4)}),
)
@pytest.mark.parametrize("working_factor", [1.25, 4.0], ids=["narrow", "wide"])
def test_large_shapes_match_cpu(H, union_limit, q_max, working_factor):
    """Cold start, then warm steps with speculative rows, resident pages,
    padding, rejected and orphan rows, corrupt LRU and dgi rows and broken
    table entries (the tripwires), bit for bit; "wide" draws the rows of a
    request from 4 x k positions, so its union grows towards q x k."""
    cfg = large_config(H, union_limit, q_max, working_factor=working_factor)
    check_workspace_matches_the_layout(cfg)
    seen = run_scenario(cfg, seed=H + union_limit + int(working_factor), steps=3)
    assert seen["hits"] > 0 and seen["misses"] > 0 and seen["resident"] > 0 and seen["invalid"] > 0


@pytest.mark.parametrize("H, union_limit, q_max", [(10240, 8192, 4), (32767, 32767, 4)])
def test_large_shapes_warm_replay(H, union_limit, q_max):
    """Warm, shuffled hot buffers and the same positions resolved again
    (drift 0): the second step of each request is mostly hits."""
    cfg = large_config(H, union_limit, q_max, drift=0.0, corrupt_rate=0.0, padding_rate=0.0, reject_rate=0.0)
    seen = run_scenario(cfg, seed=H, steps=3, warm=True)
    assert seen["hits"] > seen["misses"] > 0


def test_large_shapes_union_overflow():
    """A union limit below the request's candidates at a split layout: the
    entries past it overflow (invalid), as on the CPU."""
    cfg = large_config(16384, 5000, 4, working_factor=4.0, drift=0.5)
    seen = run_scenario(cfg, seed=3, steps=3)
    assert seen["invalid"] > 0


@pytest.mark.parametrize("H, union_limit", [(10240, 8192), (32767, 32767)])
def test_index_group_brings_its_workspace(H, union_limit):
    """Through an index group (the Runtime's path) a shape that needs a
    workspace needs nothing of the caller: CUDA and CPU groups agree."""
    cfg = large_config(H, union_limit, 4, B=2, S=3, padding_rate=0.0, reject_rate=0.0, orphan_rate=0.0,
                       corrupt_rate=0.0, resident=False)
    rng = np.random.default_rng(H)
    world = World(rng, cfg)
    R = cfg.B * cfg.q_max + 8
    groups = {d: hisparse.IndexGroup(max_num_reqs=cfg.S, device=d, max_swap_rows=R, top_k=cfg.K,
                                     device_buffer_size=H, max_union_rows=union_limit) for d in ("cpu", "cuda")}
    for step in range(3):
        inputs = world.step(rng)
        T = inputs["topk"].shape[0]
        results = {}
        for d, group in groups.items():
            device = torch.device(d)
            got = group.resolve(on(inputs["topk"], device), on(inputs["req"], device), on(inputs["state"], device),
                                on(inputs["hot"], device), host_rows=world.host_rows, hot_block_size=cfg.hot_block_size,
                                attention_block_stride=cfg.attention_block_stride,
                                source_block_table=on(inputs["source"], device), block_size=cfg.block_size)
            results[d] = [t.cpu().numpy() for t in got] + [group.device_global_indices.cpu().numpy(),
                                                           group.lru_slots.cpu().numpy()]
        torch.cuda.synchronize()
        for index, (a, b) in enumerate(zip(results["cuda"], results["cpu"])):
            np.testing.assert_array_equal(a, b, err_msg=f"step {step} (T={T}): field {index}")
        world.drift(rng)
    assert groups["cuda"].device_bytes > groups["cpu"].device_bytes


def test_empty_shapes():
    cfg = Config(B=3, S=3, H=8, K=4)
    rng = np.random.default_rng(0)
    world = World(rng, cfg)
    dgi, lru = world.initial_state(rng, warm=True)
    stats = np.arange(5, dtype=np.int64)
    for T, B in [(0, 3), (0, 0), (4, 0)]:
        inputs = dict(
            topk=rng.integers(0, 20, (T, cfg.K)).astype(np.int32),
            req=np.zeros(T, np.int32),
            state=np.arange(B, dtype=np.int32),
            num_valid_rows=None,
            hot=np.zeros((B, cfg.H), np.int32),
            host_rows=world.host_rows,
        )
        cpu = Backend("cpu", cfg, dgi, lru, stats)
        gpu = Backend("cuda", cfg, dgi, lru, stats)
        want = cpu.snapshot(cpu.run(inputs))
        got = gpu.snapshot(gpu.run(inputs))
        assert_same(got, want, T, f"T={T} B={B}")


# ----------------------------------------------------------------- CUDA graphs


GRAPH_CONFIGS = [
    Config(B=8, S=10, H=600, K=256, q_max=3, hot_block_size=16, block_size=16, resident=True, drift=0.2, pad=2,
           orphan_rate=0.2),
    # A split layout with a workspace (vLLM's MTP-3 case).
    Config(B=3, S=4, H=10240, K=2048, q_max=4, max_union_rows=8192, hot_block_size=64, block_size=64,
           resident=True, drift=0.2, orphan_rate=0.2),
]


@pytest.mark.parametrize("cfg", sanitize_subset(GRAPH_CONFIGS, {GRAPH_CONFIGS[0]}), ids=["small", "mtp3"])
def test_cuda_graph_replay_matches_eager(cfg):
    """One captured resolve replayed over new inputs copied into static tensors."""
    T = 2 * cfg.B + 4
    rng = np.random.default_rng(7)
    world = World(rng, cfg)
    dgi, lru = world.initial_state(rng, warm=True)
    stats = np.zeros(5, np.int64)
    cpu = Backend("cpu", cfg, dgi, lru, stats)
    gpu = Backend("cuda", cfg, dgi, lru, stats)

    first = world.step(rng, T_fixed=T)
    first["host_rows"] = world.host_rows
    first["num_valid_rows"] = T  # the static tensor must exist in the captured call
    static_out = gpu.outputs(T)
    static_args = gpu.arguments(first, static_out)

    # The first launch configures the kernel; capture only once that is done,
    # on throwaway state so the graph and the CPU start from the same state.
    warm = dict(static_args, device_global_indices=gpu.dgi.clone(), lru_slots=gpu.lru.clone(),
                stats=gpu.stats.clone())
    ops.resolve_residency(**warm)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.resolve_residency(**static_args)
    torch.cuda.synchronize()
    # Capturing ran nothing: the state is still the initial one.
    assert np.array_equal(gpu.dgi.cpu().numpy(), dgi)
    assert np.array_equal(gpu.lru.cpu().numpy(), lru)

    statics = dict(topk="topk_indices", req="req_id_per_token", state="request_state_indices", hot="hot_block_table",
                   source="source_block_table", resident="resident_block_table")
    for step in range(6):
        inputs = first if step == 0 else world.step(rng, T_fixed=T)
        inputs["host_rows"] = world.host_rows
        for key, name in statics.items():
            # Same shapes every step (World.step with T_fixed keeps table widths).
            static_args[name].copy_(torch.from_numpy(np.ascontiguousarray(inputs[key])))
        static_args["num_valid_rows"].fill_(int(inputs["num_valid_rows"]))
        graph.replay()
        want = cpu.snapshot(cpu.run(inputs))
        got = gpu.snapshot(static_out)
        assert_same(got, want, T, f"graph step {step}", whole_swap_list=False)
        world.drift(rng)


# ----------------------------------------------------------------- configuration


def small_call_at(H: int, union_limit: int) -> dict:
    """One request's arguments at hot size H: a few positions, cold state."""
    device = torch.device("cuda")
    return dict(
        topk_indices=torch.arange(4, dtype=torch.int32, device=device)[None].clone(),
        req_id_per_token=torch.zeros(1, dtype=torch.int32, device=device),
        request_state_indices=torch.zeros(1, dtype=torch.int32, device=device),
        device_global_indices=torch.full((1, H), -1, dtype=torch.int32, device=device),
        lru_slots=torch.arange(H, dtype=torch.int16, device=device)[None].clone(),
        hot_block_table=torch.arange(H, dtype=torch.int32, device=device)[None].clone(),
        hot_block_size=1,
        attention_block_stride=1,
        host_rows=100,
        max_union_rows=union_limit,
        **{f"out_{name}": torch.full((1, 4), SENTINEL, dtype=torch.int32, device=device) for name in MATRICES},
        **{f"out_{name}": torch.full((1,), SENTINEL, dtype=torch.int32, device=device) for name in VECTORS},
    )


def test_workspace_is_required_beyond_the_shared_memory_limit():
    """H = 32767 with a union of 32767 fits no block's shared memory: without
    a workspace, or with a short one, the call fails naming it and runs
    nothing; with one it resolves like the CPU backend."""
    H = 32767
    kwargs = small_call_at(H, H)
    limit = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    assert hisparse._C.resolver_shared_memory_bytes(H, H) > limit
    size = ops.resolver_workspace_bytes(1, H, H, 0)
    assert size > 0
    for workspace, match in [
        (None, rf"workspace: .* needs a workspace of {size} B .* got NULL"),
        (torch.empty(size - 16, dtype=torch.uint8, device="cuda"), rf"workspace: expected at least {size} B"),
        (torch.empty(size // 4, dtype=torch.int32, device="cuda"), "workspace: expected dtype uint8"),
        (torch.empty(size, dtype=torch.uint8), "workspace: expected a tensor on cuda"),
    ]:
        with pytest.raises((ValueError, TypeError), match=match):
            ops.resolve_residency(**kwargs, workspace=workspace)
        # Nothing ran: outputs and state are as they were.
        assert (kwargs["out_attention"] == SENTINEL).all()
        assert (kwargs["device_global_indices"] == -1).all()
    ops.resolve_residency(**kwargs, workspace=torch.empty(size, dtype=torch.uint8, device="cuda"))
    cpu = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in small_call_at(H, H).items()}
    ops.resolve_residency(**cpu)
    for name in ("out_attention", "out_hot_rows", "out_valid_counts", "out_swap_counts", "device_global_indices",
                 "lru_slots"):
        assert torch.equal(kwargs[name].cpu(), cpu[name]), name
    assert kwargs["out_valid_counts"].item() == 4


@pytest.mark.parametrize("H, union_limit", [(4096, 2048), (4096, 4096), (5120, 4096), (5120, 5120)])
def test_production_shared_memory_fits(H, union_limit):
    need = hisparse._C.resolver_shared_memory_bytes(H, union_limit)
    assert need <= torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    assert ops.resolver_workspace_bytes(256, H, union_limit, 0) == 0
