"""hisparse.Runtime, CacheHandle and SlotInvalidator on every device: binding
errors that name the argument, swap_in against resolve_residency +
gather_compact done by hand, prefetch vs. per-layer staging, the step-row
capacity, misuse, reset, stats, mirroring, batch classification, and one
decode step of a 4-layer group captured in a CUDA graph."""

import pytest

import hisparse
from hisparse import ops
from hisparse.runtime import paged_cache_view

from conftest import requires_cuda, sanitize_subset
from runtime_setup import GroupSetup, capture_graphed_step, host_memory, random_bytes

torch = pytest.importorskip("torch")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_step(setup, *, state_rows, tokens_per_request=1, max_position=48, seed=0, with_source_table=True,
              resident_pages=None):
    """Top-k positions of one step for the requests in `state_rows` (-1 = padding).

    Request b owns host blocks 1 + 6 * s ... (source block size 8); with
    `resident_pages`, page `p` of every request is resident in its first
    resident block."""
    gen = torch.Generator().manual_seed(seed)
    device = setup.device
    K = setup.config.top_k
    batch = len(state_rows)
    T = batch * tokens_per_request
    topk = torch.randint(-1, max_position, (T, K), generator=gen, dtype=torch.int32)
    req_ids = torch.arange(batch, dtype=torch.int32).repeat_interleave(tokens_per_request)
    step = dict(topk=topk.to(device), req_ids=req_ids.to(device))
    if with_source_table:
        blocks = -(-max_position // setup.config.block_size)
        source = torch.zeros((setup.max_num_reqs, blocks), dtype=torch.int32)
        for b, s in enumerate(state_rows):
            source[b] = 1 + max(s, 0) * blocks + torch.randperm(blocks, generator=gen)
        step["block_table"] = source.to(device)
    if resident_pages is not None:
        pages = -(-max_position // setup.hot_block_size)
        resident = torch.zeros((setup.max_num_reqs, pages), dtype=torch.int32)
        for b, s in enumerate(state_rows):
            if s >= 0:
                resident[b, resident_pages] = setup.resident_block(s)
        step["resident_block_table"] = resident.to(device)
    setup.set_batch(state_rows)
    return step


def swap_kwargs(step):
    return {k: v for k, v in step.items() if k in ("block_table", "resident_block_table")}


# ---------------------------------------------------------------- binding errors


def test_only_a_leader_takes_a_residency_hint(device):
    setup = GroupSetup(device, num_layers=1, residency_hint=True)
    assert setup.leader.residency_hint
    with pytest.raises(ValueError, match="residency_hint: only a group leader"):
        hisparse.Runtime(setup.config, max_num_reqs=setup.max_num_reqs, leader=setup.leader, residency_hint=True)
    with pytest.raises(TypeError, match="residency_hint: expected a bool"):
        hisparse.Runtime(setup.config, max_num_reqs=setup.max_num_reqs, device=device, residency_hint=1)
    assert setup.leader.info()["group_size"] == 1


def test_the_default_residency_hint_is_kept_where_resolves_read_it(device):
    """residency_hint=None keeps a hint only where every launch of the group has early-read helpers: CUDA, no
    speculative rows, max_num_reqs below half the SMs, and resolver arrays in shared memory."""
    setup = GroupSetup(device, num_layers=1)
    config, reqs = setup.config, setup.max_num_reqs
    expected = device.type == "cuda"
    assert hisparse.Runtime.default_residency_hint(config, max_num_reqs=reqs, device=device) is expected
    leader = hisparse.Runtime(config, max_num_reqs=reqs, device=device)
    follower = hisparse.Runtime(config, max_num_reqs=reqs, leader=leader)
    assert leader.residency_hint is expected and follower.residency_hint is expected
    for forced in (False, True):
        runtime = hisparse.Runtime(config, max_num_reqs=reqs, device=device, residency_hint=forced)
        assert runtime.residency_hint is forced
    if device.type != "cuda":
        return
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    default = hisparse.Runtime.default_residency_hint
    assert default(config, max_num_reqs=(sms - 1) // 2, device=device)
    assert not default(config, max_num_reqs=(sms + 1) // 2, device=device)
    speculative = hisparse.Config(top_k=config.top_k, device_buffer_size=config.device_buffer_size,
                                  row_bytes=config.row_bytes, num_speculative_tokens=1)
    assert not default(speculative, max_num_reqs=reqs, device=device)
    assert not hisparse.Runtime(speculative, max_num_reqs=reqs, device=device).residency_hint
    # A shape whose arrays need the global workspace has no early-read helpers.
    big = hisparse.Config(top_k=2048, device_buffer_size=32767, row_bytes=64)
    assert ops.resolver_workspace_bytes(1, 32767, big.max_union_rows, device) > 0
    assert not default(big, max_num_reqs=reqs, device=device)


def test_default_residency_hint_errors_name_the_argument():
    config = hisparse.Config(top_k=8, device_buffer_size=16, row_bytes=64)
    with pytest.raises(TypeError, match="config: expected a hisparse.Config"):
        hisparse.Runtime.default_residency_hint(None, max_num_reqs=4)
    with pytest.raises(ValueError, match="max_num_reqs"):
        hisparse.Runtime.default_residency_hint(config, max_num_reqs=0)
    with pytest.raises(ValueError, match="device: expected 'cpu'"):
        hisparse.Runtime.default_residency_hint(config, max_num_reqs=4, device="tpu")
    assert hisparse.Runtime.default_residency_hint(config, max_num_reqs=4) is False


def test_bind_errors_name_the_argument(device):
    setup = GroupSetup(device, num_layers=2)
    leader, follower = setup.runtimes
    gen = torch.Generator().manual_seed(1)
    with pytest.raises(TypeError, match="kv_cache.*mismatched layout"):
        leader.bind_source_cache(setup.hosts[0].view(torch.int32))
    with pytest.raises(ValueError, match="kv_cache.*mismatched layout"):
        leader.bind_source_cache(setup.hosts[0].view(-1, 2 * setup.row_bytes))
    with pytest.raises(ValueError, match="raw_tensor.*too small"):
        leader.bind_hot_cache(setup.slab[: -setup.block_stride], byte_offset=0, block_stride=setup.block_stride,
                              num_blocks=setup.num_blocks, block_size=4, block_table=setup.hot_table)
    with pytest.raises(ValueError, match="block_size"):
        leader.bind_hot_cache(setup.slab, byte_offset=0, block_stride=setup.block_stride, num_blocks=2,
                              block_size=8, block_table=setup.hot_table)
    with pytest.raises(ValueError, match="block_table"):
        leader.bind_hot_cache(setup.slab, byte_offset=0, block_stride=setup.block_stride,
                              num_blocks=setup.num_blocks, block_size=4, block_table=setup.hot_table[:, :2])
    with pytest.raises(ValueError, match="block_stride"):
        follower.bind_hot_cache(setup.slab, byte_offset=0, block_stride=setup.block_bytes,
                                num_blocks=setup.num_blocks, block_size=4, block_table=setup.hot_table)
    # A follower configured with other hot blocks than its leader's.
    odd_config = hisparse.Config(top_k=8, device_buffer_size=32, max_union_rows=8, row_bytes=64, block_size=8,
                                 hot_block_size=8)
    odd = hisparse.Runtime(odd_config, max_num_reqs=setup.max_num_reqs, leader=leader)
    odd.bind_source_cache(setup.hosts[1])
    with pytest.raises(ValueError, match="block_size.*leader"):
        odd.bind_hot_cache(setup.slab, byte_offset=0, block_stride=2 * setup.block_stride,
                           num_blocks=setup.num_blocks // 2, block_size=8, block_table=setup.hot_table)
    # Refused bindings keep the earlier ones.
    assert leader.info()["source_bound"] and leader.info()["hot_bound"]
    assert leader.attention_block_stride == setup.block_stride // setup.row_bytes

    # Unbound runtime.
    leader.unbind_cache()
    assert leader.hot is None and leader.host_cache is None
    step = make_step(setup, state_rows=[0, 1])
    leader.begin_forward()
    with pytest.raises(RuntimeError, match="not prefetched.*not bound"):
        leader.swap_in(step["topk"], step["req_ids"])

    if device.type == "cuda":
        with pytest.raises(ValueError, match="kv_cache: host memory that is not pinned"):
            leader.bind_source_cache(random_bytes((256, 64), gen))  # pageable
        with pytest.raises(ValueError, match="kv_cache: hisparse requires a host-resident"):
            leader.bind_source_cache(setup.slab[: 256 * 64].view(256, 64))
        with pytest.raises(ValueError, match="raw_tensor.*cuda"):
            leader.bind_hot_cache(setup.slab.cpu(), byte_offset=0, block_stride=setup.block_stride,
                                  num_blocks=setup.num_blocks, block_size=4, block_table=setup.hot_table)
        with pytest.raises(ValueError, match="block_table.*cuda"):
            leader.bind_hot_cache(setup.slab, byte_offset=0, block_stride=setup.block_stride,
                                  num_blocks=setup.num_blocks, block_size=4, block_table=setup.hot_table.cpu())


def test_hot_view_is_the_one_the_library_bound(device):
    setup = GroupSetup(device, num_layers=2)
    for i, runtime in enumerate(setup.runtimes):
        hot = runtime.hot
        assert hot.data_ptr() == setup.slab.data_ptr() + i * setup.block_bytes
        assert tuple(hot.shape) == (setup.num_blocks, setup.hot_block_size, setup.row_bytes)
        assert hot.stride() == (setup.block_stride, setup.row_bytes, 1)
        same = paged_cache_view(setup.slab, dtype=torch.uint8, row_width=setup.row_bytes,
                                byte_offset=i * setup.block_bytes, block_stride=setup.block_stride,
                                num_blocks=setup.num_blocks, block_size=setup.hot_block_size)
        assert same.data_ptr() == hot.data_ptr() and same.stride() == hot.stride() and same.shape == hot.shape
    # Writes through the view land in the slab (it shares the slab's storage).
    setup.leader.hot[1, 2].fill_(7)
    offset = setup.block_stride + 2 * setup.row_bytes
    assert bool((setup.slab[offset : offset + setup.row_bytes] == 7).all())
    # Another element type: the row is narrower, the strides count elements.
    wide = paged_cache_view(setup.slab, dtype=torch.int16, row_width=setup.row_bytes // 2, byte_offset=0,
                            block_stride=setup.block_stride, num_blocks=setup.num_blocks,
                            block_size=setup.hot_block_size)
    assert wide.dtype == torch.int16 and wide.stride() == (setup.block_stride // 2, setup.row_bytes // 2, 1)


@pytest.mark.parametrize(
    "overrides, error, match",
    [
        (dict(byte_offset=8), ValueError, "byte_offset"),
        (dict(num_blocks=10**6), ValueError, "raw_tensor.*too small"),
        (dict(block_stride=100), ValueError, "block_stride"),
        (dict(block_size=0), ValueError, "block_size"),
        (dict(row_width=1.5), TypeError, "row_width"),
        (dict(dtype="complex128"), TypeError, "dtype"),
    ],
)
def test_paged_cache_view_errors_name_the_argument(device, overrides, error, match):
    setup = GroupSetup(device, num_layers=1)
    kwargs = dict(dtype=torch.uint8, row_width=setup.row_bytes, byte_offset=0, block_stride=setup.block_stride,
                  num_blocks=setup.num_blocks, block_size=setup.hot_block_size)
    with pytest.raises(error, match=match):
        paged_cache_view(setup.slab, **{**kwargs, **overrides})
    with pytest.raises(TypeError, match="raw_tensor"):
        paged_cache_view(setup.slab.numpy() if device.type == "cpu" else None, **kwargs)


def test_bad_constructor_arguments(device):
    config = hisparse.Config(top_k=8, device_buffer_size=32, row_bytes=64)
    with pytest.raises(TypeError, match="config"):
        hisparse.Runtime({"top_k": 8}, max_num_reqs=2)
    with pytest.raises(ValueError, match="max_num_reqs"):
        hisparse.Runtime(config, max_num_reqs=0, device=device)
    with pytest.raises(TypeError, match="dtype"):
        hisparse.Runtime(config, max_num_reqs=2, device=device, dtype="complex64")
    leader = hisparse.Runtime(config, max_num_reqs=2, device=device)
    other = hisparse.Config(top_k=16, device_buffer_size=32, row_bytes=64)
    with pytest.raises(ValueError, match="top_k"):
        hisparse.Runtime(other, max_num_reqs=2, leader=leader)
    with pytest.raises(ValueError, match="max_num_reqs"):
        hisparse.Runtime(config, max_num_reqs=3, leader=leader)
    bf16 = hisparse.Runtime(config, max_num_reqs=2, device=device, dtype=torch.bfloat16)
    assert bf16.row_width == 32 and bf16.kv_dtype == torch.bfloat16


# ---------------------------------------------------------------- swap_in semantics


@pytest.mark.parametrize("tokens_per_request", sanitize_subset([1, 2], {2}))
def test_swap_in_equals_resolve_and_gather_by_hand(device, tokens_per_request):
    K = 8
    setup = GroupSetup(device, num_layers=3, top_k=K, hot_size=32, max_union_rows=K * tokens_per_request,
                       max_num_reqs=4, max_swap_rows=4 * tokens_per_request, resident_blocks_per_req=1, seed=3)
    S, H = setup.max_num_reqs, setup.config.device_buffer_size
    i32 = dict(dtype=torch.int32, device=device)
    dgi = torch.full((S, H), -1, **i32)
    lru = torch.arange(H, dtype=torch.int16, device=device).repeat(S, 1)
    stats = torch.zeros(5, dtype=torch.int64, device=device)
    hand_slab = setup.slab.clone()
    stride_rows = setup.block_stride // setup.row_bytes
    hand_views = [
        paged_cache_view(hand_slab, dtype=torch.uint8, row_width=setup.row_bytes, byte_offset=i * setup.block_bytes,
                         block_stride=setup.block_stride, num_blocks=setup.num_blocks, block_size=4)
        for i in range(setup.num_layers)
    ]
    batches = [[2, 0, 1], [0, -1, 2], [3, 2, 0], [2, 0, 1]]
    for index, state_rows in enumerate(batches):
        step = make_step(setup, state_rows=state_rows, tokens_per_request=tokens_per_request, seed=10 + index % 3,
                         resident_pages=2)
        T = step["topk"].shape[0]
        num_valid = torch.tensor([T - (index == 2)], **i32)
        setup.begin_forward()
        attention, counts = setup.leader.swap_in(
            step["topk"], step["req_ids"], num_valid_rows=num_valid, return_valid_counts=True,
            prefetch=index % 2 == 1, **swap_kwargs(step))
        for follower in setup.runtimes[1:]:
            follower.swap_in(num_tokens=T)

        out = {name: torch.full((T, K), -7, **i32) for name in ("attention", "hot_rows", "resolved", "miss_mask",
                                                                "swap_host_rows", "swap_device_rows")}
        valid = torch.full((T,), -7, **i32)
        swap_counts = torch.full((T,), -7, **i32)
        ops.resolve_residency(
            step["topk"], step["req_ids"], setup.request_state_indices, dgi, lru, setup.hot_table,
            hot_block_size=4, attention_block_stride=stride_rows, host_rows=setup.hosts[0].shape[0],
            max_union_rows=setup.config.max_union_rows, out_attention=out["attention"], out_hot_rows=out["hot_rows"],
            out_resolved=out["resolved"], out_miss_mask=out["miss_mask"], out_valid_counts=valid,
            out_swap_host_rows=out["swap_host_rows"], out_swap_device_rows=out["swap_device_rows"],
            out_swap_counts=swap_counts, source_block_table=step["block_table"], block_size=8,
            resident_block_table=step["resident_block_table"], resident_block_size=4, num_valid_rows=num_valid,
            stats=stats)
        for i, view in enumerate(hand_views):
            ops.gather_compact(setup.hosts[i], view, out["swap_host_rows"], out["swap_device_rows"], swap_counts,
                               hot_block_size=4, hot_block_stride=stride_rows)
        sync(device)
        assert torch.equal(attention, out["attention"]), index
        assert torch.equal(counts, valid), index
        assert torch.equal(setup.leader.resolved_slots[:T], out["resolved"]), index
        assert torch.equal(setup.leader.device_global_indices, dgi), index
        assert torch.equal(setup.leader.lru_slots, lru), index
        assert torch.equal(setup.leader.counters, stats), index
        assert torch.equal(setup.slab, hand_slab), index
        assert (attention >= 0).any()


@pytest.mark.parametrize("tokens_per_request", [1, 3])
def test_prefetch_and_per_layer_staging_move_identical_bytes(device, tokens_per_request):
    kwargs = dict(num_layers=4, top_k=8, hot_size=24, max_union_rows=8 * tokens_per_request, max_num_reqs=4,
                  max_swap_rows=8 * tokens_per_request, seed=5)
    eager, lazy = GroupSetup(device, **kwargs), GroupSetup(device, **kwargs)
    for index in range(6):
        state_rows = [[0, 1, 2, 3], [3, 1], [2, -1, 0, 1]][index % 3]
        for setup, prefetch in ((eager, True), (lazy, False)):
            step = make_step(setup, state_rows=state_rows, tokens_per_request=tokens_per_request, seed=index)
            setup.begin_forward()
            for _ in range(2):  # two swap_in per forward take consecutive rows
                setup.swap_all(step["topk"], step["req_ids"], prefetch=prefetch, **swap_kwargs(step))
            info = [runtime.info() for runtime in setup.runtimes]
            assert all(i["next_row"] == 2 * step["topk"].shape[0] for i in info)
            assert not any(i["staged"] for i in info)
        sync(device)
        assert torch.equal(eager.slab, lazy.slab), index
        assert torch.equal(eager.leader.attention_indices, lazy.leader.attention_indices), index
        T = step["topk"].shape[0]
        assert eager.visible_rows_match(0, 2 * T), index


def test_prefetch_stages_followers_before_their_call(device):
    setup = GroupSetup(device, num_layers=3)
    step = make_step(setup, state_rows=[0, 1])
    setup.begin_forward()
    setup.leader.swap_in(step["topk"], step["req_ids"], prefetch=True, **swap_kwargs(step))
    assert [r.info()["staged"] for r in setup.runtimes] == [False, True, True]
    # The bytes are there before any follower's swap_in.
    assert setup.visible_rows_match(0, 2)
    for follower in setup.runtimes[1:]:
        follower.swap_in(num_tokens=2)
    assert [r.info()["staged"] for r in setup.runtimes] == [False, False, False]


SHARED_TENSORS = ("attention_indices", "valid_counts", "hot_rows", "resolved_slots", "miss_mask", "swap_host_rows",
                  "swap_device_rows", "swap_counts", "device_global_indices", "lru_slots", "counters")


def assert_same_group(a, b, where):
    """Every shared tensor, the counters and every byte of every layer's hot cache agree (synchronises)."""
    sync(a.device)
    for name in SHARED_TENSORS:
        assert torch.equal(getattr(a.leader, name), getattr(b.leader, name)), (where, name)
    assert torch.equal(a.slab, b.slab), where
    assert a.leader.stats() == b.leader.stats(), where


@pytest.mark.parametrize("hinted", [False, True], ids=["no_hint", "hint"])
@pytest.mark.parametrize("prefetch", sanitize_subset([False, True], {True}))
def test_fused_gather_on_the_leader_equals_a_separate_gather(device, prefetch, hinted):
    """With a residency hint (CUDA: the fused gather reads predicted misses
    early) or without, a fused step leaves what a separate gather does."""
    kwargs = dict(num_layers=3, top_k=8, hot_size=24, max_union_rows=16, max_num_reqs=4, max_swap_rows=16,
                  resident_blocks_per_req=1, seed=11)
    fused, plain = GroupSetup(device, residency_hint=hinted, **kwargs), GroupSetup(device, **kwargs)
    assert fused.leader.residency_hint is hinted and fused.runtimes[1].residency_hint is hinted
    batches = [[0, 1, 2, 3], [3, 1], [2, -1, 0, 1], [1, 3, 0], [0, 1, 2, 3], [3, 2, 1, 0]]
    staged_after_leader = [False] + [prefetch] * (fused.num_layers - 1)
    for index, state_rows in enumerate(batches):
        tokens = 1 + index % 2
        outputs = {}
        for setup, fuse in ((fused, True), (plain, False)):
            resident = index % 3 == 1  # resident rows are not host rows: visible_rows_match skips those steps
            step = make_step(setup, state_rows=state_rows, tokens_per_request=tokens, seed=20 + index % 3,
                             resident_pages=1 if resident else None)
            T = step["topk"].shape[0]
            num_valid = torch.tensor([T - (index == 2)], dtype=torch.int32, device=device)
            setup.begin_forward()
            results = []
            for _ in range(2 if index == 3 else 1):  # two swap_in per forward take consecutive rows
                attention, counts = setup.leader.swap_in(
                    step["topk"], step["req_ids"], prefetch=prefetch, fused_gather=fuse, num_valid_rows=num_valid,
                    return_valid_counts=True, **swap_kwargs(step))
                assert [r.info()["staged"] for r in setup.runtimes] == staged_after_leader, index
                for i, follower in enumerate(setup.runtimes[1:]):
                    # Followers never resolve: the flag changes nothing for them.
                    follower.swap_in(num_tokens=T, fused_gather=fuse and i % 2 == 0)
                assert not any(r.info()["staged"] for r in setup.runtimes), index
                results.append((attention.clone(), counts.clone()))
            outputs[fuse] = results
            assert resident or setup.visible_rows_match(0, len(results) * T), (fuse, index)
        for (fa, fc), (pa, pc) in zip(outputs[True], outputs[False]):
            assert torch.equal(fa, pa) and torch.equal(fc, pc), index
        assert_same_group(fused, plain, index)
    stats = fused.leader.stats()
    assert stats["hits"] > 0 and stats["misses"] > 0 and stats["resident"] > 0


def test_fused_gather_with_a_bad_value_is_refused_and_changes_nothing(device):
    setup = GroupSetup(device, num_layers=2, seed=4)
    leader, follower = setup.runtimes
    step = make_step(setup, state_rows=[0, 1])
    setup.begin_forward()
    setup.swap_all(step["topk"], step["req_ids"], prefetch=True, fused_gather=True, **swap_kwargs(step))
    sync(device)
    before = {name: getattr(leader, name).clone() for name in SHARED_TENSORS}
    slab = setup.slab.clone()
    stats = leader.stats()

    setup.begin_forward()
    for value in (2, -1):
        with pytest.raises(ValueError, match=f"fused_gather: expected 0 or 1, got {value}"):
            leader.swap_in(step["topk"], step["req_ids"], prefetch=True, fused_gather=value, **swap_kwargs(step))
    with pytest.raises(ValueError, match="fused_gather"):
        leader.swap_in(step["topk"], step["req_ids"], fused_gather=2**40, **swap_kwargs(step))
    with pytest.raises(TypeError, match="fused_gather"):
        leader.swap_in(step["topk"], step["req_ids"], fused_gather="yes", **swap_kwargs(step))
    sync(device)
    assert [r.info()["next_row"] for r in setup.runtimes] == [0, 0], "a refused call takes no rows"
    assert not any(r.info()["staged"] for r in setup.runtimes), "a refused call stages nothing"
    for name, value in before.items():
        assert torch.equal(getattr(leader, name), value), name
    assert torch.equal(setup.slab, slab)
    assert leader.stats() == stats

    # The group keeps working (a new step with new misses, fused), and a
    # follower checks the value too (like prefetch) before taking rows.
    step = make_step(setup, state_rows=[1, 0], seed=7)
    leader.swap_in(step["topk"], step["req_ids"], fused_gather=True, **swap_kwargs(step))
    with pytest.raises(ValueError, match="fused_gather: expected 0 or 1, got 2"):
        follower.swap_in(num_tokens=2, fused_gather=2)
    assert follower.info()["next_row"] == 0
    follower.swap_in(num_tokens=2)
    assert setup.visible_rows_match(0, 2)
    after = leader.stats()
    assert after["misses"] > stats["misses"] and after["hits"] > stats["hits"]


def test_step_rows_capacity_and_misuse(device):
    setup = GroupSetup(device, num_layers=2, max_swap_rows=4)
    leader, follower = setup.runtimes
    step = make_step(setup, state_rows=[0, 1])
    setup.begin_forward()
    with pytest.raises(RuntimeError, match="not prefetched.*leader first"):
        follower.swap_in(num_tokens=2)
    leader.swap_in(step["topk"], step["req_ids"], **swap_kwargs(step))
    leader.swap_in(step["topk"], step["req_ids"], **swap_kwargs(step))
    with pytest.raises(ValueError, match="speculative decode capacity: stop=6, capacity=4"):
        leader.swap_in(step["topk"], step["req_ids"], **swap_kwargs(step))
    follower.swap_in(num_tokens=2)
    follower.swap_in(num_tokens=2)
    with pytest.raises(ValueError, match="capacity"):
        follower.swap_in(num_tokens=2)
    setup.begin_forward()
    leader.swap_in(step["topk"], step["req_ids"], prefetch=True, **swap_kwargs(step))
    with pytest.raises(RuntimeError, match="not prefetched for these rows"):
        follower.swap_in(num_tokens=1)
    follower.swap_in(num_tokens=2)
    with pytest.raises(ValueError, match="num_tokens"):
        follower.swap_in()
    with pytest.raises(ValueError, match="topk_indices"):
        leader.swap_in()


def test_reset_makes_hits_misses(device):
    setup = GroupSetup(device, num_layers=2)
    step = make_step(setup, state_rows=[0, 1, 2])
    setup.begin_forward()
    setup.swap_all(step["topk"], step["req_ids"], prefetch=True, **swap_kwargs(step))
    cold = setup.leader.stats()
    assert cold["hits"] == 0 and cold["misses"] > 0
    setup.begin_forward()
    setup.swap_all(step["topk"], step["req_ids"], prefetch=True, **swap_kwargs(step))
    warm = setup.leader.stats()
    assert warm["misses"] == cold["misses"] and warm["hits"] == cold["misses"]  # a repeat is all hits
    setup.leader.reset_hot_state()
    sync(device)
    assert (setup.leader.device_global_indices == -1).all()
    assert setup.leader.stats()["lookups"] == 0
    setup.slab.zero_()  # so only bytes loaded after the reset can match
    setup.begin_forward()
    setup.swap_all(step["topk"], step["req_ids"], prefetch=False, **swap_kwargs(step))
    again = setup.leader.stats()
    assert again["hits"] == 0 and again["misses"] == cold["misses"]
    assert setup.visible_rows_match(0, 3)


def test_stats_hit_rate_and_bytes_moved(device):
    # Layers with different row sizes share one index group: bytes add up.
    config = hisparse.Config(top_k=4, device_buffer_size=8, row_bytes=32, block_size=4, hot_block_size=4)
    wide = hisparse.Config(top_k=4, device_buffer_size=8, row_bytes=96, block_size=4, hot_block_size=4)
    leader = hisparse.Runtime(config, max_num_reqs=1, device=device)
    follower = hisparse.Runtime(wide, max_num_reqs=1, leader=leader)
    gen = torch.Generator().manual_seed(2)
    table = torch.tensor([[1, 2]], dtype=torch.int32, device=device)
    slabs = []
    for runtime, row_bytes in ((leader, 32), (follower, 96)):
        runtime.bind_source_cache(host_memory(random_bytes((40, row_bytes), gen), device))
        slab = torch.zeros(3 * 8 * row_bytes, dtype=torch.uint8, device=device)  # stride 8 rows
        runtime.bind_hot_cache(slab, byte_offset=0, block_stride=8 * row_bytes, num_blocks=3, block_size=4,
                               block_table=table)
        slabs.append(slab)
    states = torch.tensor([0], dtype=torch.int32, device=device)
    req = torch.tensor([0], dtype=torch.int32, device=device)
    for positions in ([1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 5]):
        topk = torch.tensor([positions], dtype=torch.int32, device=device)
        leader.begin_forward()
        follower.begin_forward()
        leader.swap_in(topk, req, request_state_indices=states)
        follower.swap_in(num_tokens=1)
    stats = follower.stats()
    assert stats["misses"] == 5 and stats["hits"] == 7
    assert stats["hit_rate"] == pytest.approx(7 / 12)
    assert stats["group_row_bytes"] == 128 and stats["num_layers"] == 2
    assert stats["bytes_moved"] == 5 * 128
    assert stats["lookups"] == 12


def test_invalidate_sorted_slots_and_slot_invalidator(device):
    a = GroupSetup(device, num_layers=2, seed=1)
    b = GroupSetup(device, num_layers=1, seed=2)
    for setup in (a, b):
        step = make_step(setup, state_rows=[0, 1], with_source_table=False)
        setup.begin_forward()
        setup.swap_all(step["topk"], step["req_ids"], prefetch=False)
    i32 = dict(dtype=torch.int32, device=device)
    before = a.leader.device_global_indices.clone()
    held = before[0][before[0] >= 0]
    victim = int(held[0])
    a.leader.invalidate_sorted_slots(torch.tensor([victim], **i32), torch.tensor([0], **i32))
    sync(device)
    expected = before.clone()
    expected[0][expected[0] == victim] = -1
    assert torch.equal(a.leader.device_global_indices, expected)

    # Written slots: one launch over both groups; only the writing request's row changes.
    state_rows = torch.tensor([0, 1, -1, -1], **i32)
    invalidator = hisparse.SlotInvalidator(state_rows)
    tables = [a.leader.device_global_indices, b.leader.device_global_indices]
    written = [int(t[1][t[1] >= 0][0]) for t in tables]
    before = [t.clone() for t in tables]
    slots = torch.tensor(written, **i32)
    req_ids = torch.tensor([1, 1], **i32)
    for _ in range(2):  # the second call reuses the cached pointer array
        invalidator([a.leader, b.runtimes[0]], slots, req_ids)
    sync(device)
    for table, old in zip(tables, before):
        old = old.clone()
        for w in written:
            old[1][old[1] == w] = -1
        assert torch.equal(table, old)
    with pytest.raises(TypeError, match="leaders"):
        invalidator([object()], slots, req_ids)


def test_mirror_rows_writes_the_host_cache(device):
    setup = GroupSetup(device, num_layers=1)
    runtime = setup.leader
    rows = torch.full((3, setup.row_bytes), 0x5A, dtype=torch.uint8, device=device)
    runtime.mirror_rows(rows, torch.tensor([4, -1, 9], dtype=torch.int32, device=device))
    sync(device)
    host = setup.hosts[0]
    assert (host[4] == 0x5A).all() and (host[9] == 0x5A).all()
    with pytest.raises(TypeError, match="src_rows"):
        runtime.mirror_rows(rows.view(torch.int16), torch.tensor([0, 1, 2], dtype=torch.int32, device=device))
    runtime.unbind_cache()
    with pytest.raises(RuntimeError, match="bind_source_cache"):
        runtime.mirror_rows(rows, torch.tensor([0, 1, 2], dtype=torch.int32, device=device))


# ---------------------------------------------------------------- batch classification and CacheHandle


def test_batch_classification():
    decode = hisparse.BatchInfo(num_actual_tokens=4, num_decode_tokens=4, num_reqs=4, max_query_len=1)
    verify = hisparse.BatchInfo(num_actual_tokens=8, num_decode_tokens=8, num_reqs=4, max_query_len=2)
    mixed = hisparse.BatchInfo(num_actual_tokens=20, num_decode_tokens=4, num_reqs=5, max_query_len=16)
    from hisparse.cache_handle import is_decode_batch, is_group_prefetch_batch

    assert is_decode_batch(decode) and not is_decode_batch(verify) and not is_decode_batch(None)
    assert is_group_prefetch_batch(decode, 4) and not is_group_prefetch_batch(decode, 3)
    assert is_group_prefetch_batch(verify, 8) and not is_group_prefetch_batch(verify, 7)
    assert not is_group_prefetch_batch(mixed, 64) and not is_group_prefetch_batch(None, 64)
    assert not is_group_prefetch_batch(hisparse.BatchInfo(0, 0, 0, 0), 8)
    # max_query_len bound separately from the token count.
    assert not is_group_prefetch_batch(hisparse.BatchInfo(4, 4, 1, 5), 4)
    with pytest.raises(TypeError, match="num_reqs"):
        hisparse.BatchInfo(num_actual_tokens=1, num_decode_tokens=1, num_reqs=1.0, max_query_len=1)


@pytest.mark.parametrize("eager_host_mirror", [False, True])
def test_cache_handle_flow(device, eager_host_mirror):
    setup = GroupSetup(device, num_layers=3, max_num_reqs=4, max_swap_rows=8, resident_blocks_per_req=2,
                       eager_host_mirror=eager_host_mirror)
    handles = [hisparse.CacheHandle(runtime) for runtime in setup.runtimes]
    for handle in handles[1:]:
        handles[0].add_follower(handle)
    with pytest.raises(RuntimeError, match="leader"):
        handles[1].prepare_group_for_batch(None)
    i32 = dict(dtype=torch.int32, device=device)
    resident_table = torch.zeros((4, 12), **i32)
    slot_mapping = torch.zeros(8, **i32)
    mirror_slots = torch.full((8,), -1, **i32)
    for i, handle in enumerate(handles):
        # The resident view is the layer's view of the same slab.
        handle.bind_cache(setup.slab, byte_offset=i * setup.block_bytes, block_stride=setup.block_stride,
                          num_blocks=setup.num_blocks, block_size=4, block_table=resident_table,
                          slot_mapping=slot_mapping, mirror_slot_mapping=mirror_slots)

    # Prefill-like batch: not a decode batch, rows are mirrored to the host.
    prefill = hisparse.BatchInfo(num_actual_tokens=3, num_decode_tokens=0, num_reqs=1, max_query_len=3,
                                 req_id_per_token=torch.zeros(3, **i32))
    setup.set_batch([0, 1])
    handles[0].prepare_group_for_batch(prefill)
    assert all(h.host_mirror_required and not h.prefetch_decode_group and not h.decode_batch for h in handles)
    resident_row = setup.resident_block(0) * 4
    slot_mapping[:3] = torch.arange(resident_row, resident_row + 3, **i32)
    mirror_slots[:3] = torch.tensor([17, 18, 19], **i32)
    for i, handle in enumerate(handles):
        cache, slots, n = handle.write_target(5, 8)
        assert n == 3 and slots.shape[0] == 3 and cache.shape == (setup.num_blocks, 4, setup.row_bytes)
        cache[slots.long() // 4, slots.long() % 4] = 100 + i
        handle.finish_kv_update()
    sync(device)
    for i in range(3):
        assert (setup.hosts[i][17:20] == 100 + i).all()

    # Decode batch: prefetch for the whole group; mirrored only when eager.
    decode = hisparse.BatchInfo(num_actual_tokens=2, num_decode_tokens=2, num_reqs=2, max_query_len=1,
                                req_id_per_token=torch.arange(2, **i32))
    handles[0].prepare_group_for_batch(decode)
    assert all(h.decode_batch and h.prefetch_decode_group for h in handles)
    assert all(h.host_mirror_required == eager_host_mirror for h in handles)
    mirror_slots[:2] = torch.tensor([30, 31], **i32)
    for i, handle in enumerate(handles):
        _, slots, n = handle.write_target(2, 8)
        handle.finish_kv_update(torch.full((2, setup.row_bytes), 200 + i, dtype=torch.uint8, device=device))
    sync(device)
    for i in range(3):
        assert bool((setup.hosts[i][30:32] == 200 + i).all()) == eager_host_mirror

    step = make_step(setup, state_rows=[0, 1])
    resident_table[:2] = 0
    results = [handles[0].swap_in(step["topk"], step["req_ids"], block_table=step["block_table"], block_size=8)]
    assert [r.info()["staged"] for r in setup.runtimes] == [False, True, True]
    # A follower's handle refuses a top-k: it reuses its leader's resolution.
    with pytest.raises(ValueError, match="topk_indices.*follower"):
        handles[1].swap_in(step["topk"], step["req_ids"])
    for handle in handles[1:]:
        handle.swap_in(num_tokens=2)
        results.append(setup.leader.attention_indices[:2])
    assert all(torch.equal(results[0], r) for r in results[1:])
    assert setup.visible_rows_match(0, 2)
    # The handle passes the runtime's per-call options through: these
    # layer-major host caches cannot be grouped, and the runtime says so.
    with pytest.raises(ValueError, match="group_gather"):
        handles[0].swap_in(step["topk"], step["req_ids"], block_table=step["block_table"], block_size=8,
                           group_gather=True)

    # A dummy batch writes nothing anywhere.
    handles[0].prepare_group_for_batch(None)
    assert handles[0].dummy_batch and not handles[0].host_mirror_required
    handles[0].finish_kv_update()
    handles[0].unbind_cache()
    assert handles[0].view is None and not setup.leader.info()["source_bound"]


def test_follower_prefetch_never_serves_a_row_written_after_it(device):
    """Decode steps in which every layer of a group writes its row of the
    newest position (host slot 17 of request 0, 18 of request 1, not on a
    resident page) through its handle before its attention, and the indexer
    selects that position: the leader resolves and, as the handle's policy
    asks for a decode batch, prefetches the followers' rows before the
    followers wrote theirs, yet every layer reads the row it wrote (the
    follower's write rewrites the prefetched copy), and so does every later
    step."""
    setup = GroupSetup(device, num_layers=3, max_num_reqs=2, top_k=4, hot_size=8, row_bytes=32, block_size=4,
                       hot_block_size=4, host_rows=64, eager_host_mirror=True)
    handles = [hisparse.CacheHandle(runtime) for runtime in setup.runtimes]
    for handle in handles[1:]:
        handles[0].add_follower(handle)
    i32 = dict(dtype=torch.int32, device=device)
    mirror_slots = torch.tensor([17, 18], **i32)
    resident_table = torch.zeros((2, 4), **i32)  # nothing resident: the newest rows go through the hot buffer
    slot_mapping = torch.zeros(2, **i32)
    for i, handle in enumerate(handles):
        handle.bind_cache(setup.slab, byte_offset=i * setup.block_bytes, block_stride=setup.block_stride,
                          num_blocks=setup.num_blocks, block_size=4, block_table=resident_table,
                          slot_mapping=slot_mapping, mirror_slot_mapping=mirror_slots)
    setup.set_batch([0, 1])
    decode = hisparse.BatchInfo(num_actual_tokens=2, num_decode_tokens=2, num_reqs=2, max_query_len=1,
                                req_id_per_token=torch.arange(2, **i32))
    # Positions are host slots (no source table): each request selects its
    # newest slot and three older ones.
    topk = torch.tensor([[17, 3, 5, 9], [18, 4, 6, 10]], **i32)
    for step in range(2):
        handles[0].prepare_group_for_batch(decode)
        assert all(h.prefetch_decode_group for h in handles)
        new_rows = [torch.full((2, setup.row_bytes), 10 * step + 100 + i, dtype=torch.uint8, device=device)
                    for i in range(3)]
        for i, handle in enumerate(handles):
            handle.write_target(2, 2)
            handle.finish_kv_update(new_rows[i])
            if i == 0:
                attention = handle.runtime.swap_in(topk, decode.req_id_per_token,
                                                   prefetch=handle.prefetch_decode_group)
                # The followers' rows are staged now, before they wrote theirs.
                assert [r.info()["staged"] for r in setup.runtimes[1:]] == [True, True]
            else:
                handle.runtime.swap_in(num_tokens=2)
            sync(device)
            rows = setup.layer_rows(i)[attention[:, 0].long()].cpu()
            assert torch.equal(rows, new_rows[i].cpu()), f"step {step}: layer {i} read a stale row of its newest slot"
            assert (attention >= 0).all()
        assert setup.visible_rows_match(0, 2), "every visible row equals its host row"


# ---------------------------------------------------------------- CUDA graphs


@requires_cuda
@pytest.mark.sanitize
def test_decode_step_of_a_group_captured_in_a_cuda_graph():
    device = torch.device("cuda")
    kwargs = dict(num_layers=4, top_k=16, hot_size=48, max_num_reqs=4, max_swap_rows=4, host_rows=512, seed=9)
    graphed, eager = GroupSetup(device, **kwargs), GroupSetup(device, **kwargs)
    state_rows = [2, 0, 3, 1]
    max_position = 96
    static = make_step(graphed, state_rows=state_rows, max_position=max_position, seed=0)
    make_step(eager, state_rows=state_rows, max_position=max_position, seed=0)
    num_valid = torch.tensor([4], dtype=torch.int32, device=device)

    def step(setup, inputs):
        setup.begin_forward()
        return setup.swap_all(inputs["topk"], inputs["req_ids"], prefetch=True, block_table=inputs["block_table"],
                              num_valid_rows=num_valid)

    graph, graphed_attention = capture_graphed_step(step, graphed, static)

    for index in range(5):
        new = make_step(eager, state_rows=state_rows, max_position=max_position, seed=100 + index)
        for name in ("topk", "req_ids", "block_table"):
            static[name].copy_(new[name])
        graph.replay()
        eager_attention = step(eager, new)
        torch.cuda.synchronize()
        assert torch.equal(graphed_attention, eager_attention), index
        assert torch.equal(graphed.slab, eager.slab), index
        assert torch.equal(graphed.leader.device_global_indices, eager.leader.device_global_indices), index
        assert torch.equal(graphed.leader.lru_slots, eager.leader.lru_slots), index
        assert graphed.visible_rows_match(0, 4), index


@requires_cuda
@pytest.mark.parametrize("prefetch", [True, False])
def test_fused_gather_in_a_cuda_graph_equals_an_eager_separate_gather(prefetch):
    device = torch.device("cuda")
    kwargs = dict(num_layers=3, top_k=16, hot_size=48, max_num_reqs=4, max_swap_rows=4, host_rows=512,
                  seed=13)
    graphed, eager = GroupSetup(device, **kwargs), GroupSetup(device, **kwargs)
    state_rows = [1, 3, 0, 2]
    max_position = 96
    static = make_step(graphed, state_rows=state_rows, max_position=max_position, seed=0)
    make_step(eager, state_rows=state_rows, max_position=max_position, seed=0)
    num_valid = torch.tensor([3], dtype=torch.int32, device=device)  # one orphan row

    def step(setup, inputs, fused_gather):
        setup.begin_forward()
        return setup.swap_all(inputs["topk"], inputs["req_ids"], prefetch=prefetch, fused_gather=fused_gather,
                              block_table=inputs["block_table"], num_valid_rows=num_valid)

    graph, graphed_attention = capture_graphed_step(lambda setup, inputs: step(setup, inputs, True), graphed, static)

    for index in range(6):
        # Half the replays repeat the previous top-k: few or no misses.
        new = make_step(eager, state_rows=state_rows, max_position=max_position, seed=100 + index // 2)
        for name in ("topk", "req_ids", "block_table"):
            static[name].copy_(new[name])
        graph.replay()
        eager_attention = step(eager, new, False)
        torch.cuda.synchronize()
        assert torch.equal(graphed_attention, eager_attention), index
        assert_same_group(graphed, eager, index)
        assert graphed.visible_rows_match(0, 4), index


def test_every_swap_in_defaults_to_the_c_librarys_gather_path():
    import inspect

    from hisparse.cache_handle import CacheHandle

    want = hisparse._C.DEFAULT_FUSED_GATHER == 1
    for swap_in in (hisparse.Runtime.swap_in, hisparse.KVCache.swap_in, CacheHandle.swap_in):
        assert inspect.signature(swap_in).parameters["fused_gather"].default is want, swap_in
