"""The Runtime's token-major host layout: when the followers of an index
group are bound to adjacent rows of one host slot (host[:, l, :] of a
[slots, layers, W] HostPool view), a prefetching leader asked for
group_gather stages all of them with one gather_compact_group; without it
(the default) each follower gets its own gather, whatever the layout. The
bytes every layer's attention sees must be exactly those of per-layer gathers
from a layer-major layout either way, eagerly and in a CUDA graph; followers
that do not tile refuse group_gather, naming it and the reason, with nothing
enqueued."""

import pytest

import hisparse

from conftest import requires_cuda
from runtime_setup import GroupSetup, capture_graphed_step, host_memory

torch = pytest.importorskip("torch")

LAYERS = 4
KWARGS = dict(num_layers=LAYERS, top_k=16, hot_size=48, max_union_rows=32, row_bytes=64, block_size=8,
              hot_block_size=4, max_num_reqs=4, max_swap_rows=16, host_rows=8 + 4 * 64, seed=3)
MAX_POSITION = 64  # 8 source blocks of 8 per request: request s owns host slots 8 + 64 s .. 71 + 64 s
SHARED_TENSORS = ("attention_indices", "valid_counts", "hot_rows", "resolved_slots", "miss_mask", "swap_host_rows",
                  "swap_device_rows", "swap_counts", "device_global_indices", "lru_slots", "counters")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_pool(device, rows, pieces, row_bytes):
    """A token-major [rows, pieces, row_bytes] view of a HostPool (registered on CUDA)."""
    pool = hisparse.HostPool(rows * pieces * row_bytes, register="always" if device.type == "cuda" else "never")
    return pool, pool.view("uint8", (rows, pieces, row_bytes))


def rebind(setup, hosts):
    """Runtime l reads `hosts[l]` (holding the bytes of the layer-major setup.hosts[l]); every hot copy is dropped."""
    for layer, host in enumerate(hosts):
        host.copy_(setup.hosts[layer])
    setup.hosts = list(hosts)
    setup.bind()
    setup.leader.reset_hot_state()


def make_step(setup, state_rows, tokens, gen):
    """Random top-k of one step for the requests in `state_rows` (-1 = padding), with a shuffled source table."""
    K = setup.config.top_k
    T = len(state_rows) * tokens
    topk = torch.randint(-1, MAX_POSITION, (T, K), generator=gen, dtype=torch.int32)
    req_ids = torch.arange(len(state_rows), dtype=torch.int32).repeat_interleave(tokens)
    blocks = MAX_POSITION // setup.config.block_size
    table = torch.zeros((setup.max_num_reqs, blocks), dtype=torch.int32)
    for b, s in enumerate(state_rows):
        table[b] = 1 + max(s, 0) * blocks + torch.randperm(blocks, generator=gen)
    setup.set_batch(state_rows)
    device = setup.device
    return dict(topk=topk.to(device), req_ids=req_ids.to(device), block_table=table.to(device))


BATCHES = [[0, 1, 2, 3], [3, 1], [2, -1, 0, 1], [1, 3, 0], [0, 1, 2, 3], [3, 2, 1, 0], [0, 2], [1, 0, 3, 2]]


def run_steps(setups, group_gather, *, seed=0):
    """The same steps on every setup (prefetching leader, then the followers);
    setups[i] asks for group_gather on every prefetching step when
    group_gather[i]. After each step, every setup shows its host rows and all
    setups agree bit for bit."""
    gens = [torch.Generator().manual_seed(seed) for _ in setups]
    misses = []
    for index, state_rows in enumerate(BATCHES):
        tokens = 1 + index % 2
        fused = index % 3 == 1  # some steps copy the leader's rows in its resolve
        prefetch = index != 5  # one step stages every layer on its own call
        attention = []
        for setup, gen, grouped in zip(setups, gens, group_gather):
            step = make_step(setup, state_rows, tokens, gen)
            T = step["topk"].shape[0]
            setup.begin_forward()
            setup.leader.swap_in(step["topk"], step["req_ids"], prefetch=prefetch, fused_gather=fused,
                                 group_gather=grouped and prefetch, block_table=step["block_table"])
            assert [r.info()["staged"] for r in setup.runtimes] == [False] + [prefetch] * (LAYERS - 1), index
            for follower in setup.runtimes[1:]:
                follower.swap_in(num_tokens=T, group_gather=True)  # a follower ignores it
            assert setup.visible_rows_match(0, T), index
            attention.append(setup.leader.attention_indices[:T].clone())
        sync(setups[0].device)
        for setup, got in zip(setups[1:], attention[1:]):
            assert torch.equal(got, attention[0]), index
            assert torch.equal(setup.slab, setups[0].slab), index
            for name in SHARED_TENSORS:
                assert torch.equal(getattr(setup.leader, name), getattr(setups[0].leader, name)), (index, name)
        misses.append(setups[0].leader.stats()["misses"])
    assert misses[-1] > misses[0] > 0, "later steps miss again (not only the cold start)"
    stats = setups[0].leader.stats()
    assert stats["hits"] > 0
    return stats


def assert_group_gather_refused(setup, step, *fragments):
    """A prefetching leader asked for group_gather raises ValueError naming it
    and `fragments`, before anything is enqueued: no rows taken, nothing
    staged, hot caches and group state unchanged (synchronises)."""
    device = setup.device
    setup.begin_forward()
    sync(device)
    before = {name: getattr(setup.leader, name).clone() for name in SHARED_TENSORS}
    slab = setup.slab.clone()
    with pytest.raises(ValueError, match="group_gather: the followers' host caches do not tile") as error:
        setup.leader.swap_in(step["topk"], step["req_ids"], prefetch=True, group_gather=True,
                             block_table=step["block_table"])
    for fragment in fragments:
        assert fragment in str(error.value), (fragment, str(error.value))
    sync(device)
    assert [r.info()["next_row"] for r in setup.runtimes] == [0] * len(setup.runtimes), "a refused call takes no rows"
    assert not any(r.info()["staged"] for r in setup.runtimes), "a refused call stages nothing"
    assert torch.equal(setup.slab, slab), "a refused call moves no bytes"
    for name, value in before.items():
        assert torch.equal(getattr(setup.leader, name), value), name


def test_group_gather_and_per_follower_staging_of_token_major_followers_move_layer_major_bytes(device):
    layer_major, grouped, per_follower = (GroupSetup(device, **KWARGS) for _ in range(3))
    pools = [host_pool(device, KWARGS["host_rows"], LAYERS, KWARGS["row_bytes"]) for _ in range(2)]
    with pools[0][0], pools[1][0]:
        for setup, (_, host) in zip((grouped, per_follower), pools):
            rebind(setup, [host[:, layer, :] for layer in range(LAYERS)])
            # The layout allows group_gather; only a call that asks uses it.
            assert setup.leader.followers_staged_together
            assert setup.leader.info()["followers_staged_together"]
            assert not any(f.followers_staged_together for f in setup.runtimes[1:])
        assert not layer_major.leader.followers_staged_together
        run_steps([layer_major, grouped, per_follower], [False, True, False])
        sync(device)


def test_followers_tile_in_address_order_not_in_creation_order(device):
    # The leader reads piece 3; followers 1, 2, 3 read pieces 1, 2, 0: in
    # address order the followers are 3, 1, 2, and their rows still tile.
    layer_major, permuted = GroupSetup(device, **KWARGS), GroupSetup(device, **KWARGS)
    pool, host = host_pool(device, KWARGS["host_rows"], LAYERS, KWARGS["row_bytes"])
    with pool:
        rebind(permuted, [host[:, piece, :] for piece in (3, 1, 2, 0)])
        assert permuted.leader.followers_staged_together
        run_steps([layer_major, permuted], [False, True], seed=1)
        sync(device)


def test_group_gather_on_followers_that_do_not_tile_is_refused_and_changes_nothing(device):
    rows, width = KWARGS["host_rows"], KWARGS["row_bytes"]
    layer_major = GroupSetup(device, **KWARGS)
    gap, pitch, tiled = (GroupSetup(device, **KWARGS) for _ in range(3))
    gap_pool, five = host_pool(device, rows, 5, width)
    pitch_pool, doubled = host_pool(device, 2 * rows, LAYERS, width)
    tiled_pool, four = host_pool(device, rows, LAYERS, width)
    with gap_pool, pitch_pool, tiled_pool:
        # Followers at pieces 1, 3, 4: not adjacent.
        rebind(gap, [five[:, piece, :] for piece in (0, 1, 3, 4)])
        # Followers at adjacent pieces 1, 2, 3 of slot 0, but the last one
        # steps over every other slot: its pitch is twice the others'.
        rebind(pitch, [doubled[:rows, 0, :], doubled[:rows, 1, :], doubled[:rows, 2, :], doubled[::2, 3, :]])
        rebind(tiled, [four[:, layer, :] for layer in range(LAYERS)])
        assert not gap.leader.followers_staged_together
        assert not pitch.leader.followers_staged_together
        assert tiled.leader.followers_staged_together

        step = make_step(gap, [0, 1, 2, 3], 1, torch.Generator().manual_seed(9))
        assert_group_gather_refused(gap, step, "not adjacent")
        step = make_step(pitch, [0, 1, 2, 3], 1, torch.Generator().manual_seed(9))
        assert_group_gather_refused(pitch, step, f"follower 2's host slots are {2 * LAYERS * width} bytes apart",
                                    f"follower 0's {LAYERS * width}")
        # After a refusal the group keeps working: the default path stages
        # these followers one by one, the tiled group may group them.
        run_steps([layer_major, gap, pitch, tiled], [False, False, False, True], seed=2)

        # The answer follows the bindings: one follower moved out of the span
        # ends the tiling, moving it back restores it; so does unbinding.
        last = tiled.runtimes[3]
        last.bind_source_cache(host_memory(tiled.hosts[3].contiguous(), device))
        assert not tiled.leader.followers_staged_together
        step = make_step(tiled, [3, 2, 1, 0], 2, torch.Generator().manual_seed(4))
        assert_group_gather_refused(tiled, step, "follower 2")
        last.bind_source_cache(tiled.hosts[3])
        assert tiled.leader.followers_staged_together
        tiled.begin_forward()
        tiled.swap_all(step["topk"], step["req_ids"], prefetch=True, group_gather=True,
                       block_table=step["block_table"])
        assert tiled.visible_rows_match(0, step["topk"].shape[0])
        last.unbind_cache()
        assert not tiled.leader.followers_staged_together
        sync(device)


def test_one_follower_never_takes_a_group_gather(device):
    kwargs = dict(KWARGS, num_layers=2)
    setup = GroupSetup(device, **kwargs)
    pool, host = host_pool(device, kwargs["host_rows"], 2, kwargs["row_bytes"])
    with pool:
        rebind(setup, [host[:, 0, :], host[:, 1, :]])
        assert not setup.leader.followers_staged_together
        step = make_step(setup, [0, 1], 1, torch.Generator().manual_seed(5))
        assert_group_gather_refused(setup, step, "1 follower", "at least two")
        setup.begin_forward()
        setup.swap_all(step["topk"], step["req_ids"], prefetch=True, block_table=step["block_table"])
        assert setup.visible_rows_match(0, 2)
        sync(device)


def test_group_gather_needs_a_prefetch_and_a_flag_value(device):
    setup = GroupSetup(device, **KWARGS)
    pool, host = host_pool(device, KWARGS["host_rows"], LAYERS, KWARGS["row_bytes"])
    with pool:
        rebind(setup, [host[:, layer, :] for layer in range(LAYERS)])
        assert setup.leader.followers_staged_together
        leader = setup.leader
        step = make_step(setup, [0, 1, 2, 3], 1, torch.Generator().manual_seed(6))
        kwargs = dict(block_table=step["block_table"])
        setup.begin_forward()
        # Without a prefetch there are no followers to stage: an error, naming both.
        with pytest.raises(ValueError, match=r"group_gather: .*prefetch = 1.*prefetch = 0"):
            leader.swap_in(step["topk"], step["req_ids"], group_gather=True, **kwargs)
        for value in (2, -1):
            with pytest.raises(ValueError, match=f"group_gather: expected 0 or 1, got {value}"):
                leader.swap_in(step["topk"], step["req_ids"], prefetch=True, group_gather=value, **kwargs)
        with pytest.raises(ValueError, match="group_gather"):
            leader.swap_in(step["topk"], step["req_ids"], prefetch=True, group_gather=2**40, **kwargs)
        with pytest.raises(TypeError, match="group_gather"):
            leader.swap_in(step["topk"], step["req_ids"], prefetch=True, group_gather="yes", **kwargs)
        sync(setup.device)
        assert [r.info()["next_row"] for r in setup.runtimes] == [0] * LAYERS
        assert not any(r.info()["staged"] for r in setup.runtimes)

        # A follower checks the value too, before taking rows; True is ignored.
        leader.swap_in(step["topk"], step["req_ids"], prefetch=True, group_gather=True, **kwargs)
        follower = setup.runtimes[1]
        with pytest.raises(ValueError, match="group_gather: expected 0 or 1, got 2"):
            follower.swap_in(num_tokens=4, group_gather=2)
        assert follower.info()["next_row"] == 0 and follower.info()["staged"]
        for follower in setup.runtimes[1:]:
            follower.swap_in(num_tokens=4, group_gather=True)
        assert setup.visible_rows_match(0, 4)


# ---------------------------------------------------------------- CUDA graphs


@requires_cuda
@pytest.mark.sanitize
@pytest.mark.parametrize("group_gather", [True, False])
@pytest.mark.parametrize("fused_gather", [False, True])
def test_token_major_staging_in_a_cuda_graph_replays_like_eager(fused_gather, group_gather):
    # The graphed and eager groups are token-major and stage their followers
    # alike (with one group gather or one gather each); the layer-major group
    # cannot group them and always gathers per follower.
    device = torch.device("cuda")
    kwargs = dict(KWARGS, max_swap_rows=4)
    graphed, eager, layer_major = (GroupSetup(device, **kwargs) for _ in range(3))
    pools = [host_pool(device, kwargs["host_rows"], LAYERS, kwargs["row_bytes"]) for _ in range(2)]
    with pools[0][0], pools[1][0]:
        for setup, (_, host) in zip((graphed, eager), pools):
            rebind(setup, [host[:, layer, :] for layer in range(LAYERS)])
            assert setup.leader.followers_staged_together
        state_rows = [2, 0, 3, 1]
        gen = torch.Generator().manual_seed(0)
        static = make_step(graphed, state_rows, 1, gen)
        num_valid = torch.tensor([4], dtype=torch.int32, device=device)

        def step(setup, inputs):
            setup.begin_forward()
            return setup.swap_all(inputs["topk"], inputs["req_ids"], prefetch=True, fused_gather=fused_gather,
                                  group_gather=group_gather and setup is not layer_major,
                                  block_table=inputs["block_table"], num_valid_rows=num_valid)

        graph, graphed_attention = capture_graphed_step(step, graphed, static)

        for index in range(6):
            # Half the replays repeat the previous top-k: few or no misses.
            seed = 100 + index // 2
            new = make_step(eager, state_rows, 1, torch.Generator().manual_seed(seed))
            make_step(layer_major, state_rows, 1, torch.Generator().manual_seed(seed))
            for name in ("topk", "req_ids", "block_table"):
                static[name].copy_(new[name])
            graph.replay()
            eager_attention = step(eager, new)
            layer_major_attention = step(layer_major, new)
            torch.cuda.synchronize()
            assert torch.equal(graphed_attention, eager_attention), index
            assert torch.equal(graphed_attention, layer_major_attention), index
            assert torch.equal(graphed.slab, eager.slab), index
            assert torch.equal(graphed.slab, layer_major.slab), index
            assert torch.equal(graphed.leader.device_global_indices, eager.leader.device_global_indices), index
            assert torch.equal(graphed.leader.lru_slots, eager.leader.lru_slots), index
            assert graphed.visible_rows_match(0, 4), index
        torch.cuda.synchronize()
