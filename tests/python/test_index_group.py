"""hisparse.IndexGroup on every device: initial state, resolution through the
group against hisparse.ops.resolve_residency, reset, invalidate_sorted_slots
against a plain Python loop, the stats dict, bad inputs, and the lifetime of
the zero-copy tensor views."""

import gc
import weakref

import pytest

import hisparse

from conftest import requires_cuda

torch = pytest.importorskip("torch")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_group(device, **overrides):
    sizes = dict(max_num_reqs=4, top_k=6, device_buffer_size=16, max_swap_rows=8, max_union_rows=12)
    sizes.update(overrides)
    return hisparse.IndexGroup(device=device, **sizes)


def make_step(device, *, batch, tokens_per_request, top_k, hot_size, seed, state_rows=None,
              hot_block_size=4, max_position=40, with_tables=False):
    """One decode step: `batch` requests with `tokens_per_request` contiguous token rows each."""
    gen = torch.Generator().manual_seed(seed)
    num_tokens = batch * tokens_per_request
    topk = torch.randint(-1, max_position, (num_tokens, top_k), generator=gen, dtype=torch.int32)
    req_ids = torch.arange(batch, dtype=torch.int32).repeat_interleave(tokens_per_request)
    if state_rows is None:
        state_rows = list(range(batch))[::-1]
    blocks = -(-hot_size // hot_block_size)
    hot_table = (torch.arange(batch * blocks, dtype=torch.int32) + 1).view(batch, blocks)
    step = dict(
        topk_indices=topk,
        req_id_per_token=req_ids,
        request_state_indices=torch.tensor(state_rows, dtype=torch.int32),
        hot_block_table=hot_table,
    )
    extra = {}
    if with_tables:
        block_size = 8
        source = torch.randint(0, 30, (batch, -(-max_position // block_size)), generator=gen, dtype=torch.int32)
        resident = torch.zeros((batch, -(-max_position // hot_block_size)), dtype=torch.int32)
        resident[:, -1] = 50  # the newest page of every request stays resident
        extra = dict(source_block_table=source, block_size=block_size, resident_block_table=resident,
                     resident_block_size=hot_block_size)
    step = {k: v.to(device) for k, v in step.items()}
    extra = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in extra.items()}
    return step, extra


def resolve_with_ops(state, step, extra, *, hot_block_size, host_rows, max_union_rows, num_valid_rows=None):
    """hisparse.ops.resolve_residency on plain tensors; returns the outputs."""
    topk = step["topk_indices"]
    device = topk.device
    full = dict(dtype=torch.int32, device=device)
    out = dict(
        out_attention=torch.full(topk.shape, -7, **full),
        out_hot_rows=torch.full(topk.shape, -7, **full),
        out_resolved=torch.full(topk.shape, -7, **full),
        out_miss_mask=torch.full(topk.shape, -7, **full),
        out_valid_counts=torch.full(topk.shape[:1], -7, **full),
        out_swap_host_rows=state["swap_host_rows"],
        out_swap_device_rows=state["swap_device_rows"],
        out_swap_counts=torch.full(topk.shape[:1], -7, **full),
    )
    hisparse.ops.resolve_residency(
        step["topk_indices"], step["req_id_per_token"], step["request_state_indices"],
        state["device_global_indices"], state["lru_slots"], step["hot_block_table"],
        hot_block_size=hot_block_size, attention_block_stride=hot_block_size, host_rows=host_rows,
        max_union_rows=max_union_rows, num_valid_rows=num_valid_rows, stats=state["stats"], **out, **extra,
    )
    return out


# ---------------------------------------------------------------- construction

def test_initial_state(device):
    group = make_group(device)
    S, H, R, K = 4, 16, 8, 6
    expected = {
        "device_global_indices": (torch.int32, (S, H)),
        "lru_slots": (torch.int16, (S, H)),
        "lru_init": (torch.int16, (H,)),
        "attention_indices": (torch.int32, (R, K)),
        "hot_rows": (torch.int32, (R, K)),
        "resolved_slots": (torch.int32, (R, K)),
        "miss_mask": (torch.int32, (R, K)),
        "valid_counts": (torch.int32, (R,)),
        "swap_host_rows": (torch.int32, (R, K)),
        "swap_device_rows": (torch.int32, (R, K)),
        "swap_counts": (torch.int32, (R,)),
        "counters": (torch.int64, (5,)),
    }
    for name, (dtype, shape) in expected.items():
        tensor = getattr(group, name)
        assert tensor.dtype == dtype, name
        assert tuple(tensor.shape) == shape, name
        assert tensor.device.type == device.type, name
        assert tensor.is_contiguous(), name
    assert group.device.type == device.type
    assert (group.device_global_indices == -1).all()
    init = torch.arange(H, dtype=torch.int16, device=device)
    assert torch.equal(group.lru_init, init)
    assert torch.equal(group.lru_slots, init.expand(S, H))
    for name in ("attention_indices", "hot_rows", "resolved_slots", "swap_host_rows", "swap_device_rows"):
        assert (getattr(group, name) == -1).all(), name
    for name in ("miss_mask", "valid_counts", "swap_counts", "counters"):
        assert (getattr(group, name) == 0).all(), name
    assert (group.max_num_reqs, group.device_buffer_size, group.max_swap_rows, group.top_k,
            group.max_union_rows) == (S, H, R, K, 12)
    assert group.device_bytes >= S * H * 6 + R * K * 4 * 6
    assert "max_num_reqs=4" in repr(group)


def test_sizes_from_config(device):
    config = hisparse.Config(top_k=8, device_buffer_size=32, row_bytes=64, num_speculative_tokens=1)
    group = hisparse.IndexGroup(config, max_num_reqs=3, device=device)
    assert group.config is config
    assert (group.top_k, group.device_buffer_size, group.max_union_rows) == (8, 32, 16)
    assert group.max_swap_rows == 6  # max_num_reqs x (1 + speculative tokens)
    default_union = hisparse.IndexGroup(max_num_reqs=1, top_k=4, device_buffer_size=8, device=device)
    assert default_union.max_union_rows == 4  # top_k x (1 + num_speculative_tokens), hisparse._C's rule
    assert default_union.max_union_rows == hisparse._C.default_max_union_rows(4, 0)
    with pytest.raises(ValueError, match="max_union_rows"):  # the default union does not fit 4 hot slots
        hisparse.IndexGroup(max_num_reqs=1, top_k=8, device_buffer_size=4, device=device)


@pytest.mark.parametrize(
    "overrides, name",
    [
        (dict(max_num_reqs=0), "max_num_reqs"),
        (dict(device_buffer_size=0), "device_buffer_size"),
        (dict(device_buffer_size=32768, max_union_rows=6), "device_buffer_size"),
        (dict(max_swap_rows=0), "max_swap_rows"),
        (dict(top_k=0), "top_k"),
        (dict(max_union_rows=17), "max_union_rows"),
    ],
)
def test_bad_options_name_the_option(device, overrides, name):
    with pytest.raises(ValueError, match=name):
        make_group(device, **overrides)


def test_bad_constructor_arguments():
    with pytest.raises(TypeError, match="max_num_reqs"):
        hisparse.IndexGroup(max_num_reqs=2.0, top_k=4, device_buffer_size=8)
    with pytest.raises(ValueError, match="top_k"):
        hisparse.IndexGroup(max_num_reqs=2, device_buffer_size=8)
    with pytest.raises(ValueError, match="device"):
        hisparse.IndexGroup(max_num_reqs=2, top_k=4, device_buffer_size=8, device="tpu")
    with pytest.raises(TypeError, match="config"):
        hisparse.IndexGroup({"top_k": 4}, max_num_reqs=2)
    config = hisparse.Config(top_k=8, device_buffer_size=32, row_bytes=64)
    with pytest.raises(ValueError, match="top_k"):
        hisparse.IndexGroup(config, max_num_reqs=2, top_k=4)


# ---------------------------------------------------------------- resolve

@pytest.mark.parametrize("tokens_per_request", [1, 2])
@pytest.mark.parametrize("with_tables", [False, True])
def test_resolve_equals_ops_resolve_residency(device, tokens_per_request, with_tables):
    S, H, K, batch = 5, 16, 6, 3
    R = 2 * batch * tokens_per_request
    group = make_group(device, max_num_reqs=S, device_buffer_size=H, top_k=K, max_swap_rows=R,
                       max_union_rows=min(H, K * tokens_per_request))
    state = dict(
        device_global_indices=group.device_global_indices.clone(),
        lru_slots=group.lru_slots.clone(),
        stats=torch.zeros(5, dtype=torch.int64, device=device),
        swap_host_rows=torch.full((batch * tokens_per_request, K), -1, dtype=torch.int32, device=device),
        swap_device_rows=torch.full((batch * tokens_per_request, K), -1, dtype=torch.int32, device=device),
    )
    T = batch * tokens_per_request
    row_offset = T  # the second half of the shared rows
    for step_index, seed in enumerate([11, 12, 11, 13]):  # the third step repeats the first
        step, extra = make_step(device, batch=batch, tokens_per_request=tokens_per_request, top_k=K,
                                hot_size=H, seed=seed, state_rows=[3, 0, 4], with_tables=with_tables)
        num_valid_rows = torch.tensor([T - 1 if step_index == 3 else T], dtype=torch.int32, device=device)
        result = group.resolve(**step, **extra, host_rows=200, hot_block_size=4, row_offset=row_offset,
                               num_valid_rows=num_valid_rows)
        expected = resolve_with_ops(state, step, extra, hot_block_size=4, host_rows=200,
                                    max_union_rows=group.max_union_rows, num_valid_rows=num_valid_rows)
        sync(device)
        assert torch.equal(group.device_global_indices, state["device_global_indices"]), step_index
        assert torch.equal(group.lru_slots, state["lru_slots"]), step_index
        assert torch.equal(group.counters, state["stats"]), step_index
        rows = slice(row_offset, row_offset + T)
        assert torch.equal(result.attention_indices, expected["out_attention"])
        assert torch.equal(group.attention_indices[rows], expected["out_attention"])
        assert torch.equal(result.hot_rows, expected["out_hot_rows"])
        assert torch.equal(result.resolved_slots, expected["out_resolved"])
        assert torch.equal(result.miss_mask, expected["out_miss_mask"])
        assert torch.equal(result.valid_counts, expected["out_valid_counts"])
        assert torch.equal(result.swap_counts, expected["out_swap_counts"])
        assert torch.equal(result.swap_host_rows, state["swap_host_rows"])
        assert torch.equal(result.swap_device_rows, state["swap_device_rows"])
        assert (group.attention_indices[:row_offset] == -1).all(), "rows before row_offset untouched"
    stats = group.stats()
    assert stats["hits"] > 0 and stats["misses"] > 0


def test_resolve_output_overrides(device):
    group = make_group(device)
    step, _ = make_step(device, batch=2, tokens_per_request=1, top_k=6, hot_size=16, seed=5)
    attention = torch.full((2, 6), 99, dtype=torch.int32, device=device)
    valid = torch.full((2,), 99, dtype=torch.int32, device=device)
    result = group.resolve(**step, host_rows=100, hot_block_size=4, out_attention=attention,
                           out_valid_counts=valid)
    sync(device)
    assert result.attention_indices is attention and result.valid_counts is valid
    assert (attention != 99).any() and (valid != 99).all()
    assert (group.attention_indices == -1).all() and (group.valid_counts == 0).all()
    assert (group.hot_rows[:2] != -1).any()


def test_reset_makes_hits_misses(device):
    group = make_group(device)
    step, _ = make_step(device, batch=3, tokens_per_request=1, top_k=6, hot_size=16, seed=21)
    kwargs = dict(host_rows=100, hot_block_size=4)
    group.resolve(**step, **kwargs)
    first = group.stats()
    assert first["misses"] > 0 and first["hits"] == 0

    group.resolve(**step, **kwargs)  # same positions: all hits, no misses
    second = group.stats()
    assert second["misses"] == first["misses"]
    assert second["hits"] == first["misses"]
    assert (group.swap_counts[:3] == 0).all()

    group.reset()
    sync(device)
    assert (group.device_global_indices == -1).all()
    assert torch.equal(group.lru_slots, group.lru_init.expand_as(group.lru_slots))
    assert (group.counters == 0).all()

    result = group.resolve(**step, **kwargs)
    third = group.stats()
    assert third["hits"] == 0
    assert third["misses"] == first["misses"]
    assert int(result.swap_counts.sum()) == first["misses"]


# ---------------------------------------------------------------- invalidate_sorted_slots

def invalidate_loop(table, sorted_slots, state_indices):
    table = table.tolist()
    slots = set(sorted_slots.tolist())
    for s in state_indices.tolist():
        if 0 <= s < len(table):
            table[s] = [-1 if v in slots else v for v in table[s]]
    return torch.tensor(table, dtype=torch.int32)


@pytest.mark.parametrize("seed", range(6))
def test_invalidate_sorted_slots_matches_loop(device, seed):
    gen = torch.Generator().manual_seed(seed)
    group = make_group(device, max_num_reqs=6, device_buffer_size=32)
    table = torch.randint(-1, 50, (6, 32), generator=gen, dtype=torch.int32)
    group.device_global_indices.copy_(table.to(device))
    # Sorted with duplicates; state rows unsorted, duplicated, padded (-1) and past the end.
    sorted_slots = torch.randint(-1, 50, (int(torch.randint(1, 20, (1,), generator=gen)),), generator=gen,
                                 dtype=torch.int32).sort().values
    state_indices = torch.tensor([4, 1, 4, -1, 6, 0, 5][: 2 + seed % 6], dtype=torch.int32)
    group.invalidate_sorted_slots(sorted_slots.to(device), state_indices.to(device))
    sync(device)
    assert torch.equal(group.device_global_indices.cpu(), invalidate_loop(table, sorted_slots, state_indices))


def test_invalidate_sorted_slots_exact_and_empty(device):
    group = make_group(device, max_num_reqs=3, device_buffer_size=4, max_union_rows=4)
    start = torch.tensor([[5, 9, -1, 7], [9, 5, 3, 2], [7, 9, 9, 1]], dtype=torch.int32, device=device)
    group.device_global_indices.copy_(start)
    i32 = dict(dtype=torch.int32, device=device)
    group.invalidate_sorted_slots(torch.empty(0, **i32), torch.tensor([0, 1, 2], **i32))
    group.invalidate_sorted_slots(torch.tensor([5, 9], **i32), torch.empty(0, **i32))
    sync(device)
    assert torch.equal(group.device_global_indices, start)
    group.invalidate_sorted_slots(torch.tensor([2, 5, 9, 9], **i32), torch.tensor([2, 0], **i32))
    sync(device)
    expected = torch.tensor([[-1, -1, -1, 7], [9, 5, 3, 2], [7, -1, -1, 1]], **i32)
    assert torch.equal(group.device_global_indices, expected)


# ---------------------------------------------------------------- stats

def test_stats_dict(device):
    config = hisparse.Config(top_k=6, device_buffer_size=16, max_union_rows=6, row_bytes=656)
    group = hisparse.IndexGroup(config, max_num_reqs=4, device=device)
    empty = group.stats()
    assert empty == dict(lookups=0, hits=0, misses=0, resident=0, invalid=0, hit_rate=0.0, bytes_moved=0)
    step, _ = make_step(device, batch=2, tokens_per_request=1, top_k=6, hot_size=16, seed=3)
    group.resolve(**step, host_rows=100)  # hot_block_size from the config
    group.resolve(**step, host_rows=100)
    stats = group.stats(num_layers=3)
    counters = group.counters.tolist()
    assert [stats[name] for name in hisparse.STAT_NAMES] == counters
    assert stats["lookups"] == 2 * 2 * 6
    assert stats["hits"] == stats["misses"] > 0
    assert stats["hit_rate"] == pytest.approx(0.5)
    assert stats["bytes_moved"] == stats["misses"] * 656 * 3
    assert group.stats(row_bytes=128)["bytes_moved"] == stats["misses"] * 128
    # Without synchronize the last copied values are read as they are.
    group.reset()
    assert group.stats(synchronize=False)["misses"] == stats["misses"]
    group.copy_stats_async()
    sync(device)
    assert group.read_stats() == [0] * 5
    no_config = make_group(device)
    assert no_config.stats()["bytes_moved"] is None


# ---------------------------------------------------------------- bad inputs

def test_bad_inputs_raise_naming_the_argument(device):
    group = make_group(device)
    i32 = dict(dtype=torch.int32, device=device)
    states = torch.tensor([0, 1], **i32)
    before = group.device_global_indices.clone()
    with pytest.raises(TypeError, match="sorted_slots"):
        group.invalidate_sorted_slots(torch.tensor([1, 2], dtype=torch.int64, device=device), states)
    with pytest.raises(ValueError, match="state_indices"):
        group.invalidate_sorted_slots(torch.tensor([1], **i32), torch.zeros((2, 2), **i32))
    with pytest.raises(ValueError, match="sorted_slots"):
        group.invalidate_sorted_slots(torch.arange(8, **i32)[::2], states)
    with pytest.raises(TypeError, match="sorted_slots"):
        group.invalidate_sorted_slots([1, 2], states)
    if device.type == "cuda":
        with pytest.raises(ValueError, match="state_indices"):
            group.invalidate_sorted_slots(torch.tensor([1], **i32), states.cpu())

    step, _ = make_step(device, batch=2, tokens_per_request=1, top_k=6, hot_size=16, seed=1)
    with pytest.raises(ValueError, match="row_offset"):
        group.resolve(**step, host_rows=100, hot_block_size=4, row_offset=7)
    with pytest.raises(ValueError, match="row_offset"):
        group.resolve(**step, host_rows=100, hot_block_size=4, row_offset=-1)
    narrow = dict(step, topk_indices=step["topk_indices"][:, :5].contiguous())
    with pytest.raises(ValueError, match="topk_indices"):
        group.resolve(**narrow, host_rows=100, hot_block_size=4)
    with pytest.raises(ValueError, match="hot_block_size"):
        group.resolve(**step, host_rows=100)  # no config to take it from
    with pytest.raises(ValueError, match="hot_block_size"):
        group.resolve(**step, host_rows=100, hot_block_size=0)
    with pytest.raises(TypeError, match="hot_block_table"):
        group.resolve(**dict(step, hot_block_table=step["hot_block_table"].to(torch.int64)), host_rows=100,
                      hot_block_size=4)
    with pytest.raises(TypeError, match="host_rows"):
        group.resolve(**step, host_rows=None, hot_block_size=4)
    if device.type == "cuda":
        with pytest.raises(ValueError, match="topk_indices"):
            group.resolve(**dict(step, topk_indices=step["topk_indices"].cpu()), host_rows=100, hot_block_size=4)

    # Nothing above touched the state, and the group still works.
    sync(device)
    assert torch.equal(group.device_global_indices, before)
    assert (group.counters == 0).all()
    group.resolve(**step, host_rows=100, hot_block_size=4)
    assert group.stats()["lookups"] == 12


# ---------------------------------------------------------------- lifetime

def test_views_keep_the_group_alive(device):
    # A view keeps the group's memory (not the Python object) alive.
    group = make_group(device)
    native = weakref.ref(group._group)
    view = group.lru_slots
    counters = group.counters
    group.reset()
    del group
    gc.collect()
    assert native() is None, "views hold the group's state, not its Python object"
    view[0, 0] = 7
    sync(device)
    assert int(view[0, 0]) == 7
    assert torch.equal(view[1], torch.arange(16, dtype=torch.int16, device=device))
    del view
    gc.collect()
    assert torch.equal(counters.cpu(), torch.zeros(5, dtype=torch.int64)), "the counters outlive the other views"
    del counters
    gc.collect()


def test_views_stay_valid_while_the_group_lives(device):
    group = make_group(device)
    first = group.device_global_indices
    assert group.device_global_indices.data_ptr() == first.data_ptr()
    step, _ = make_step(device, batch=2, tokens_per_request=1, top_k=6, hot_size=16, seed=8)
    group.resolve(**step, host_rows=100, hot_block_size=4)
    group.reset()
    group.resolve(**step, host_rows=100, hot_block_size=4)
    sync(device)
    assert (first != -1).any(), "the early view sees the state written later"
    assert first.data_ptr() == group.device_global_indices.data_ptr()


def test_numpy_views_on_cpu():
    import numpy as np

    group = make_group("cpu")
    array = np.from_dlpack(group._group.tensor(hisparse._C.INDEX_GROUP_TENSORS["lru_slots"]))
    assert array.dtype == np.int16 and array.shape == (4, 16)
    group.lru_slots[0, 0] = 5
    assert array[0, 0] == 5, "NumPy and torch views share the group's memory"
    with pytest.raises(ValueError, match="which"):
        group._group.tensor(99)


# ---------------------------------------------------------------- CUDA graphs

@requires_cuda
def test_operations_capture_into_a_cuda_graph():
    device = torch.device("cuda")
    group = make_group(device)
    step, _ = make_step(device, batch=3, tokens_per_request=1, top_k=6, hot_size=16, seed=4)
    i32 = dict(dtype=torch.int32, device=device)
    sorted_slots = torch.tensor([1, 2, 3], **i32)
    state_indices = torch.tensor([0, 1, 2, 3], **i32)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        group.reset()
        group.resolve(**step, host_rows=100, hot_block_size=4)
        group.invalidate_sorted_slots(sorted_slots, state_indices)
        group.copy_stats_async()
    # Capture records work without running it.
    torch.cuda.synchronize()
    assert (group.device_global_indices == -1).all()

    expected = make_group(device)
    expected.resolve(**step, host_rows=100, hot_block_size=4)
    expected.invalidate_sorted_slots(sorted_slots, state_indices)
    for _ in range(2):  # the reset inside the graph makes replays repeatable
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(group.device_global_indices, expected.device_global_indices)
        assert torch.equal(group.lru_slots, expected.lru_slots)
        assert torch.equal(group.attention_indices, expected.attention_indices)
        assert group.read_stats() == expected.counters.tolist()
