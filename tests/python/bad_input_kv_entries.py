"""The model-level KV cache and its kernels as entries of the bad-input suite
(see bad_input_support.py and bad_input_entries.py): hisparse.KVCache and
hisparse._C.KvCache, the write op, the read helper and the residency update
(ops and _C), the runtime's write, per-request reset, counter reset and host
role, host registration (pin_tensor and the _C calls under it), and the
resolver's workspace size.

Besides the values any argument of its kind must refuse, these entries pass
memory the library owns or has bound (the cache's host rows and slab, a
runtime's bound caches and its group's state) where the call writes, or
reads what it writes: `Of` makes such a value from the entry's objects.
"""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import torch
from bad_input_entries import (
    HOT_BLOCK,
    S_ROWS,
    H,
    K,
    RuntimeState,
    W,
    _c_stream,
    i32,
    outputs,
    random_rows,
    rng,
    swap_in_call,
    swap_in_fixture,
)
from bad_input_support import Arg, B, C, D, Entry, I, O, Of, R, S, T, as_numpy, cuda_present

import hisparse
from hisparse import _C, ops

# ---------------------------------------------------------------------- the KV cache
KV_LAYERS, KV_REQS, KV_LEN = 2, 3, 32  # layers (one group: a leader, a follower), request rows, positions each
KV_WRITTEN = (10, 7, 0)  # positions written per request row when the state is made
KV_BLOCKS = 1 + KV_REQS * (H // HOT_BLOCK + 1)  # slab blocks per layer: block 0, hot blocks, one resident page each
UINT8 = _C.DTYPES["uint8"][0]


def kv_config() -> Any:
    return hisparse.Config(top_k=K, device_buffer_size=H, row_bytes=W, block_size=HOT_BLOCK, hot_block_size=HOT_BLOCK)


def kv_make(**changes: Any) -> Any:
    kw = dict(num_layers=KV_LAYERS, layer_groups=[0, 0], max_requests=KV_REQS, max_seq_len=KV_LEN, resident_pages=1)
    kw.update(changes)
    return hisparse.KVCache(kv_config(), **kw)


class KvState:
    """A cache whose request rows 0 and 1 are admitted (2 is free) with KV_WRITTEN positions written in each layer."""

    def __init__(self) -> None:
        self.kv = kv_make()
        self.kv.admit(0)
        self.kv.admit(1)
        self.kv.begin_forward(i32(list(KV_WRITTEN)))
        req = i32([r for r, n in enumerate(KV_WRITTEN) for _ in range(n)])
        positions = i32([p for n in KV_WRITTEN for p in range(n)])
        for layer in range(KV_LAYERS):
            self.kv.write(layer, random_rows(300 + layer, len(positions)), req, positions)
        # An unrelated buffer the cache never sees.
        self.elsewhere = torch.zeros((2, W), dtype=torch.uint8)

    def observe(self) -> List[Any]:
        kv = self.kv
        return [as_numpy(kv.host_cache), as_numpy(kv.slab), as_numpy(kv.group_tensor(0, "device_global_indices")),
                as_numpy(kv.group_tensor(0, "lru_slots")), as_numpy(kv.table("seq_lens")),
                as_numpy(kv.table("resident_block_table")), as_numpy(kv.table("ring_pages")),
                kv.info()["active_requests"], kv.stats()["total"]]

    def host_slot(self, row: int, position: int) -> int:
        source = self.kv.table("source_block_table")
        return int(source[row, position // HOT_BLOCK]) * HOT_BLOCK + position % HOT_BLOCK


def kv_observe(state: KvState, kw: Dict[str, Any], result: Any) -> List[Any]:
    return state.observe() + [as_numpy(result)]


def kv_ctor_state() -> Dict[str, Any]:
    released = hisparse.HostPool(1 << 16, register="never")
    released.release()
    return {"small": hisparse.HostPool(4096, register="never"), "released": released}


def kv_ctor_fixture(state: Any, seed: int) -> Dict[str, Any]:
    return dict(config=kv_config(), num_layers=KV_LAYERS, max_requests=KV_REQS, max_seq_len=KV_LEN, layer_groups=[0, 0],
                resident_pages=1, resident_page_size=None, device=None, dtype=None, max_swap_rows=None,
                host_pool=None, host_event=None)


def kv_size_args(c_names: bool = False) -> List[Arg]:
    """The arguments that size a cache (KVCache, KVCache.host_bytes, and their _C twins)."""
    groups = Arg("layer_groups", "object", ("int", "str"), True,
                 extra={"bad_item": ([0, "x"], (TypeError,)), "float_item": ([0, 1.0], (TypeError,)),
                        "bool_item": ([0, True], (TypeError,)), "short": ([0], (ValueError,)),
                        "skips_a_group": ([0, 2], (ValueError,)), "negative": ([0, -1], (ValueError,)),
                        "past_int32": ([0, 2**31], (ValueError,)), "a_dict": ({0: 0, 1: 0}, (TypeError,))})
    out = [I("num_layers", "neg zero 2**31"), groups, I("max_requests", "neg zero 2**31"),
           I("max_seq_len", "neg zero 2**63",
             **{"2**40": (2**40, (ValueError,)), "2**63-1": (2**63 - 1, (ValueError,))}),
           I("resident_pages", "neg 2**31", **{"2**30": (2**30, (ValueError,))}),
           I("resident_page_size", "neg 2**63", optional=not c_names, **{"not_whole_blocks": (6, (ValueError,))})]
    if c_names:
        out += [I("top_k", "neg zero 2**31"), I("device_buffer_size", "neg zero 2**31"),
                I("max_union_rows", "neg 2**31"), I("num_speculative_tokens", "neg 2**31"),
                I("row_bytes", "neg zero 2**31", **{"not_16": (20, (ValueError,))}),
                I("block_size", "neg zero 2**31"), I("hot_block_size", "neg zero 2**31"),
                I("device_type", "neg 2**31", **{"nine": (9, (ValueError,))}), I("device_index", "2**31"),
                I("kv_dtype", "2**31", **{"past": (99, (TypeError,)), "negative": (-1, (TypeError,))})]
    else:
        out += [O("config"), D("device"),
                O("dtype", optional=True, **{"unknown": ("no-such-dtype", (TypeError,)),
                                             "complex": (torch.complex128, (TypeError,))})]
    return out


def kv_c_fixture(state: Any, seed: int) -> Dict[str, Any]:
    return dict(top_k=K, device_buffer_size=H, max_union_rows=K, num_speculative_tokens=0, row_bytes=W,
                block_size=HOT_BLOCK, hot_block_size=HOT_BLOCK, num_layers=KV_LAYERS, layer_groups=[0, 0],
                max_requests=KV_REQS, max_seq_len=KV_LEN, resident_pages=1, resident_page_size=0,
                device_type=_C.DEVICE_CPU, device_index=0, kv_dtype=UINT8)


def kv_admit_call(state: KvState, kw: Dict[str, Any]) -> Any:
    row = state.kv.admit(**kw)
    state.kv.release(row)
    return row


def kv_write_fixture(state: KvState, seed: int) -> Dict[str, Any]:
    # The follower: its write waits for the rows its leader prefetched.
    return dict(layer=1, rows=random_rows(seed, 2), req_id_per_token=i32([0, 1]),
                positions=i32([KV_WRITTEN[0], KV_WRITTEN[1]]), stream=None)


DECODE_LENGTHS = [KV_WRITTEN[0] + 1, KV_WRITTEN[1] + 1, 0]


def kv_write_check(state: KvState, kw: Dict[str, Any], result: Any) -> None:
    kv, layer = state.kv, kw["layer"]
    resident = kv.table("resident_block_table")
    for t in range(2):
        row, position = int(kw["req_id_per_token"][t]), int(kw["positions"][t])
        assert torch.equal(kv.host_cache[state.host_slot(row, position), layer], kw["rows"][t])
        block = int(resident[row, position // HOT_BLOCK])
        assert block > 0, "the newest page is resident"
        assert torch.equal(kv.layer_view(layer)[block, position % HOT_BLOCK], kw["rows"][t])


def kv_swap_fixture(state: KvState, seed: int) -> Dict[str, Any]:
    g = rng(seed)
    return dict(layer=0, topk_indices=torch.from_numpy(g.integers(-1, 12, (2, K), dtype=np.int32)),
                req_id_per_token=i32([0, 1]), num_tokens=None, num_valid_rows=None, prefetch=True, fused_gather=False,
                stream=None)


def kv_swap_call(state: KvState, kw: Dict[str, Any]) -> Any:
    kv = state.kv
    kv.begin_forward(i32(list(KV_WRITTEN)))
    leader = kv.swap_in(**kw).clone()
    follower = kv.swap_in(1, num_tokens=2).clone()
    return [leader, follower, kv.read(0, leader), kv.read(1, follower)]


def kv_swap_check(state: KvState, kw: Dict[str, Any], result: Any) -> None:
    leader, follower, rows, follower_rows = result
    assert torch.equal(leader, follower)
    topk = kw["topk_indices"]
    for t in range(2):
        row = int(kw["req_id_per_token"][t])
        for k in range(K):
            position = int(topk[t, k])
            if 0 <= position < KV_WRITTEN[row]:
                slot = state.host_slot(row, position)
                assert leader[t, k] >= 0
                assert torch.equal(rows[t, k], state.kv.host_cache[slot, 0])
                assert torch.equal(follower_rows[t, k], state.kv.host_cache[slot, 1])
            else:
                assert leader[t, k] == -1 and not rows[t, k].any()


def kv_read_fixture(state: KvState, seed: int) -> Dict[str, Any]:
    g = rng(seed)
    return dict(layer=seed % KV_LAYERS,
                indices=torch.from_numpy(g.integers(-1, KV_BLOCKS * HOT_BLOCK + 3, (2, K), dtype=np.int32)),
                out=torch.zeros((2, K, W), dtype=torch.uint8), stream=None)


def read_reference(cache_rows: np.ndarray, indices: np.ndarray) -> np.ndarray:
    out = np.zeros(indices.shape + cache_rows.shape[-1:], dtype=cache_rows.dtype)
    for (t, k), index in np.ndenumerate(indices):
        if 0 <= index < cache_rows.shape[0]:
            out[t, k] = cache_rows[index]
    return out


def kv_read_check(state: KvState, kw: Dict[str, Any], result: Any) -> None:
    view = state.kv.layer_view(kw["layer"]).reshape(-1, W).numpy()
    assert np.array_equal(result.numpy(), read_reference(view, kw["indices"].numpy()))


def kv_lengths_fixture(state: KvState, seed: int) -> Dict[str, Any]:
    return dict(seq_lens=torch.from_numpy(rng(seed).integers(0, KV_LEN + 1, KV_REQS, dtype=np.int32)), stream=None)


def kv_lengths_check(state: KvState, kw: Dict[str, Any], result: Any) -> None:
    # One resident page of HOT_BLOCK positions: the newest page's column holds the row's resident block
    # unless a later page of the row (an earlier, longer forward) holds the ring slot.
    table, blocks = state.kv.table("resident_block_table"), state.kv.table("resident_blocks")
    ring = state.kv.table("ring_pages")
    assert torch.equal(state.kv.table("seq_lens"), kw["seq_lens"])
    for row, length in enumerate(kw["seq_lens"].tolist()):
        expected = torch.zeros(table.shape[1], dtype=torch.int32)
        if length > 0:
            page = (length - 1) // HOT_BLOCK
            assert int(ring[row, 0]) >= page, (row, length)
            if int(ring[row, 0]) == page:
                expected[page] = blocks[row, 0]
        assert torch.equal(table[row], expected), (row, length)


def layer_arg(**extra: Any) -> Arg:
    return I("layer", "neg 2**31 2**63", **{"past_the_layers": (KV_LAYERS, (ValueError,))}, **extra)


def kv_of(make) -> Of:
    return Of(lambda state: make(state.kv))


def kv_entries() -> List[Entry]:
    follower_with_topk = Arg("layer", "int", (), message_name="topk_indices",
                             extra={"a_follower_given_a_topk": (1, (ValueError,))})
    flag_labels = ("str", "float", "list", "none")
    query = lambda method: lambda s, kw: method(s.kv)(**kw)  # noqa: E731
    return [
        Entry("KVCache", kv_ctor_state, kv_ctor_fixture, lambda s, kw: hisparse.KVCache(**kw).info(),
              lambda s, kw, r: [r],
              kv_size_args() + [
                  I("max_swap_rows", "neg zero 2**31", optional=True),
                  O("host_pool", optional=True,
                    **{"too_small": (Of(lambda s: s["small"]), (ValueError,)),
                       "released": (Of(lambda s: s["released"]), (ValueError, RuntimeError)),
                       "c_pool": (Of(lambda s: s["small"]._pool), (TypeError,))}),
                  O("host_event", optional=True, **{"c_event": (_C.IpcEvent(_C.DEVICE_CPU, 0), (TypeError,))})], []),
        Entry("KVCache.host_bytes", dict, lambda s, seed: {k: v for k, v in kv_ctor_fixture(s, seed).items()
                                                           if k not in ("max_swap_rows", "host_pool", "host_event")},
              lambda s, kw: hisparse.KVCache.host_bytes(**kw), lambda s, kw, r: [r], kv_size_args(), []),
        Entry("KVCache.admit", KvState, lambda s, seed: dict(row=2, stream=None), kv_admit_call, kv_observe,
              [I("row", "neg 2**31 2**63", optional=True,
                 **{"past_the_rows": (KV_REQS, (ValueError,)), "admitted": (1, (RuntimeError,))}), S()], []),
        Entry("KVCache.release", KvState, lambda s, seed: dict(row=0, stream=None),
              lambda s, kw: (s.kv.release(**kw), s.kv.admit(0)), lambda s, kw, r: s.observe(),
              [I("row", "neg 2**31 2**63",
                 **{"past_the_rows": (KV_REQS, (ValueError,)), "not_admitted": (2, (RuntimeError,))}), S()], []),
        Entry("KVCache.begin_forward", KvState, kv_lengths_fixture, lambda s, kw: s.kv.begin_forward(**kw),
              lambda s, kw, r: s.observe(),
              [T("seq_lens", "dtype rank_up rank_down short noncontig released huge_stride"), S()], [],
              kv_lengths_check),
        Entry("KVCache.write", KvState, kv_write_fixture,
              lambda s, kw: (s.kv.begin_forward(i32(DECODE_LENGTHS)), s.kv.write(**kw)),
              lambda s, kw, r: s.observe(),
              [layer_arg(),
               T("rows", "dtype rank_down rank_up width noncontig misaligned released huge_stride",
                 **{"over_the_host_cache": (kv_of(lambda kv: kv.host_cache[20:22, 1]), (ValueError,)),
                    "over_the_slab": (kv_of(lambda kv: kv.layer_view(1)[1, :2]), (ValueError,))}),
               T("req_id_per_token", "dtype rank_up short noncontig released",
                 **{"over_the_slab": (kv_of(lambda kv: kv.layer_view(1)[0, 0, :8].view(torch.int32)),
                                      (ValueError,))}),
               T("positions", "dtype_int16 rank_up short noncontig released",
                 **{"over_the_host_cache": (kv_of(lambda kv: kv.host_cache[0, 1, :8].view(torch.int32)),
                                            (ValueError,))}), S()], [],
              kv_write_check),
        Entry("KVCache.swap_in", KvState, kv_swap_fixture, kv_swap_call, kv_observe,
              [layer_arg(), follower_with_topk,
               T("topk_indices", "dtype rank_down rank_up noncontig released", optional=True,
                 **{"none_on_a_leader": (None, (TypeError, ValueError)),
                    "wider_than_top_k": (torch.zeros((2, K + 1), dtype=torch.int32), (ValueError,))}),
               T("req_id_per_token", "dtype rank_up short released", optional=True,
                 **{"none_on_a_leader": (None, (TypeError, ValueError))}),
               T("num_valid_rows", "dtype", optional=True, like=i32([2]),
                 two=(torch.zeros(2, dtype=torch.int32), (ValueError,))),
               I("num_tokens", "neg 2**63", optional=True, **{"not_the_rows": (3, (ValueError,))}),
               Arg("prefetch", "bool", flag_labels, extra={"two": (2, (ValueError,))}),
               Arg("fused_gather", "bool", flag_labels, extra={"two": (2, (ValueError,))}), S()], [],
              kv_swap_check),
        Entry("KVCache.read", KvState, kv_read_fixture, lambda s, kw: s.kv.read(**kw), outputs("out"),
              [layer_arg(), T("indices", "dtype rank_down rank_up noncontig released"),
               T("out", "dtype rank_down short width noncontig misaligned released", role="out", optional=True,
                 **{"over_the_slab": (kv_of(lambda kv: kv.layer_view(0)[1:3]), (ValueError,)),
                    "over_another_layer": (kv_of(lambda kv: kv.layer_view(1)[1:3]), (ValueError,)),
                    "over_the_host_cache": (kv_of(lambda kv: kv.host_cache[:4].view(2, K, W)), (ValueError,))})],
              [("out", "indices")], kv_read_check),
        Entry("KVCache.reset_stats", KvState, lambda s, seed: dict(stream=None),
              lambda s, kw: (kv_swap_call(s, kv_swap_fixture(s, 9)), s.kv.reset_stats(**kw)),
              lambda s, kw, r: s.observe(), [S()], []),
        Entry("KVCache.stats", KvState, lambda s, seed: dict(synchronize=True, stream=None),
              lambda s, kw: s.kv.stats(**kw), lambda s, kw, r: [r], [B("synchronize"), S()], []),
        Entry("KVCache.group_of", KvState, lambda s, seed: dict(layer=1), query(lambda kv: kv.group_of),
              lambda s, kw, r: [r], [layer_arg()], []),
        Entry("KVCache.leader_of", KvState, lambda s, seed: dict(layer=1), query(lambda kv: kv.leader_of),
              lambda s, kw, r: [r], [layer_arg()], []),
        Entry("KVCache.layer_view", KvState, lambda s, seed: dict(layer=1), query(lambda kv: kv.layer_view),
              lambda s, kw, r: [as_numpy(r), tuple(r.shape)], [layer_arg()], []),
        Entry("KVCache.group_tensor", KvState, lambda s, seed: dict(layer=1, name="lru_slots"),
              query(lambda kv: kv.group_tensor), lambda s, kw, r: [as_numpy(r)],
              [layer_arg(), R("name", ["bogus", "slab", "LRU_SLOTS"])], []),
        Entry("KVCache.table", KvState, lambda s, seed: dict(name="source_block_table"),
              query(lambda kv: kv.table), lambda s, kw, r: [as_numpy(r)],
              [R("name", ["bogus", "slab", "host_cache", "lru_slots"])], []),
        # ------------------------------------------------------------ _C
        Entry("_C.KvCache", kv_ctor_state,
              lambda s, seed: dict(kv_c_fixture(s, seed), max_swap_rows=0, host_pool=None, host_event=None),
              lambda s, kw: _C.KvCache(**kw).info(), lambda s, kw, r: [r],
              kv_size_args(c_names=True) + [
                  I("max_swap_rows", "neg 2**31"),
                  O("host_pool", optional=True,
                    **{"too_small": (Of(lambda s: s["small"]._pool), (ValueError,)),
                       "released": (Of(lambda s: s["released"]._pool), (ValueError, RuntimeError)),
                       "python_pool": (Of(lambda s: s["small"]), (TypeError,))}),
                  O("host_event", optional=True, **{"python_event": (hisparse.IpcEvent("cpu"), (TypeError,))})], []),
        Entry("_C.KvCache.host_bytes", dict, kv_c_fixture, lambda s, kw: _C.KvCache.host_bytes(**kw),
              lambda s, kw, r: [r], kv_size_args(c_names=True), []),
        Entry("_C.KvCache.admit", KvState, lambda s, seed: dict(row=2, stream=None),
              lambda s, kw: (s.kv._kv.admit(kw["row"], _c_stream(kw)), s.kv.release(2)), lambda s, kw, r: s.observe(),
              [I("row", "2**31", **{"below_minus_one": (-2, (ValueError,)), "past_the_rows": (KV_REQS, (ValueError,)),
                                    "admitted": (1, (RuntimeError,))}), S()], []),
        Entry("_C.KvCache.release", KvState, lambda s, seed: dict(row=0, stream=None),
              lambda s, kw: (s.kv._kv.release(kw["row"], _c_stream(kw)), s.kv.admit(0)), lambda s, kw, r: s.observe(),
              [I("row", "neg 2**31", **{"past_the_rows": (KV_REQS, (ValueError,)),
                                        "not_admitted": (2, (RuntimeError,))}), S()], []),
        Entry("_C.KvCache.begin_forward", KvState, kv_lengths_fixture,
              lambda s, kw: s.kv._kv.begin_forward(kw["seq_lens"], _c_stream(kw)), lambda s, kw, r: s.observe(),
              [T("seq_lens", "dtype rank_up short noncontig"), S()], [], kv_lengths_check),
        Entry("_C.KvCache.write", KvState, kv_write_fixture,
              lambda s, kw: (s.kv.begin_forward(i32(DECODE_LENGTHS)),
                             s.kv._kv.write(kw["layer"], kw["rows"], kw["req_id_per_token"], kw["positions"],
                                            _c_stream(kw))),
              lambda s, kw, r: s.observe(),
              [layer_arg(), T("rows", "dtype width noncontig",
                              **{"over_the_slab": (kv_of(lambda kv: kv.layer_view(1)[1, :2]), (ValueError,))}),
               T("req_id_per_token", "dtype short"), T("positions", "dtype_int16 short"), S()], [], kv_write_check),
        Entry("_C.KvCache.swap_in", KvState,
              lambda s, seed: dict(kv_swap_fixture(s, seed), num_tokens=0, prefetch=1, fused_gather=0),
              lambda s, kw: (s.kv.begin_forward(i32(list(KV_WRITTEN))),
                             s.kv._kv.swap_in(kw["layer"], kw["topk_indices"], kw["req_id_per_token"],
                                              kw["num_valid_rows"], kw["num_tokens"], kw["prefetch"],
                                              kw["fused_gather"], _c_stream(kw)),
                             s.kv.swap_in(1, num_tokens=2))[1],
              kv_observe,
              [layer_arg(), follower_with_topk, T("topk_indices", "dtype rank_down noncontig", optional=True),
               T("req_id_per_token", "dtype rank_up", optional=True), I("num_tokens", "neg 2**63"),
               I("prefetch", "neg 2**31", **{"two": (2, (ValueError,))}),
               I("fused_gather", "neg 2**31", **{"two": (2, (ValueError,))}), S()], []),
        Entry("_C.KvCache.read", KvState, kv_read_fixture,
              lambda s, kw: s.kv._kv.read(kw["layer"], kw["indices"], kw["out"], _c_stream(kw)), outputs("out"),
              [layer_arg(), T("indices", "dtype rank_down"),
               T("out", "dtype short width", role="out",
                 **{"over_the_slab": (kv_of(lambda kv: kv.layer_view(0)[1:3]), (ValueError,))})],
              [("out", "indices")], lambda s, kw, r: kv_read_check(s, kw, kw["out"])),
        Entry("_C.KvCache.reset_stats", KvState, lambda s, seed: dict(stream=None),
              lambda s, kw: (kv_swap_call(s, kv_swap_fixture(s, 9)), s.kv._kv.reset_stats(_c_stream(kw))),
              lambda s, kw, r: s.observe(), [S()], []),
        Entry("_C.KvCache.copy_stats_async", KvState, lambda s, seed: dict(stream=None),
              lambda s, kw: (s.kv._kv.copy_stats_async(_c_stream(kw)), kv_swap_call(s, kv_swap_fixture(s, 9))),
              lambda s, kw, r: [s.kv._kv.stats(-1)], [S()], []),
        Entry("_C.KvCache.stats", KvState, lambda s, seed: dict(group=-1), lambda s, kw: s.kv._kv.stats(**kw),
              lambda s, kw, r: [r],
              [I("group", "2**31 2**63", **{"below_minus_one": (-2, (ValueError,)),
                                            "past_the_groups": (1, (ValueError,))})], []),
        Entry("_C.KvCache.layer_group", KvState, lambda s, seed: dict(layer=1),
              lambda s, kw: s.kv._kv.layer_group(**kw), lambda s, kw, r: [r], [layer_arg()], []),
        Entry("_C.KvCache.tensor", KvState, lambda s, seed: dict(which=_C.KV_CACHE_TENSORS["seq_lens"]),
              lambda s, kw: s.kv._kv.tensor(**kw), lambda s, kw, r: [np.from_dlpack(r).copy()],
              [I("which", "neg 2**31 2**63", **{"past_the_tensors": (99, (ValueError,))})], []),
        Entry("_C.KvCache.group_tensor", KvState,
              lambda s, seed: dict(layer=1, which=_C.INDEX_GROUP_TENSORS["lru_slots"]),
              lambda s, kw: s.kv._kv.group_tensor(**kw), lambda s, kw, r: [np.from_dlpack(r).copy()],
              [layer_arg(), I("which", "neg 2**31 2**63", **{"past_the_tensors": (99, (ValueError,))})], []),
    ]


# ---------------------------------------------------------------------- the kernels
def write_rows_fixture(state: Any, seed: int) -> Dict[str, Any]:
    # Batch rows 0 and 1 in state rows 1 and 0. Token 0 (b 0, position 1) lands in host slot 5, resident row 5 and
    # hot row 3 (state row 1 holds slot 5 in hot slot 3); token 1 (b 1, position 2) in host slot 14, resident row
    # 10 and hot row 10 (hot slot 2; its copy in hot slot 5 lies in an unusable hot block); token 2 (position 70)
    # has no slot.
    dgi = torch.full((S_ROWS, H), -1, dtype=torch.int32)
    dgi[1, 3], dgi[0, 2], dgi[0, 5] = 5, 14, 14
    return dict(rows=random_rows(seed, 3), req_id_per_token=i32([0, 1, 0]), positions=i32([1, 2, 70]),
                request_state_indices=i32([1, 0]), host_cache=torch.zeros((16, W), dtype=torch.uint8),
                source_block_table=i32([[1, 2], [3, 0]]), block_size=HOT_BLOCK, host_rows=0,
                resident_cache=torch.zeros((3, HOT_BLOCK, W), dtype=torch.uint8),
                resident_block_table=i32([[1, 0], [2, 0]]),
                hot_cache=torch.zeros((3, HOT_BLOCK, W), dtype=torch.uint8), hot_block_table=i32([[0, 1], [2, -1]]),
                device_global_indices=dgi, stream=None)


def write_rows_check(state: Any, kw: Dict[str, Any], result: Any) -> None:
    rows = kw["rows"].numpy()
    for name, landed in (("host_cache", {5: 0, 14: 1}), ("resident_cache", {5: 0, 10: 1}),
                         ("hot_cache", {3: 0, 10: 1})):
        expected = np.zeros((kw[name].numel() // W, W), dtype=np.uint8)
        for row, t in landed.items():
            expected[row] = rows[t]
        assert np.array_equal(kw[name].numpy().reshape(-1, W), expected), name


def call_c_write_rows(state: Any, kw: Dict[str, Any]) -> None:
    _C.write_rows(kw["rows"], kw["req_id_per_token"], kw["positions"], kw["request_state_indices"], kw["host_cache"],
                  kw["source_block_table"], kw["block_size"], kw["host_rows"], kw["resident_cache"],
                  kw["resident_block_table"], kw["hot_cache"], kw["hot_block_table"], kw["device_global_indices"],
                  _c_stream(kw))


WRITE_ROWS_OUTPUTS = ("host_cache", "resident_cache", "hot_cache")
WRITE_ROWS_ALIAS = [("host_cache", "rows"), ("hot_cache", "rows"), ("resident_cache", "rows"),
                    ("host_cache", "hot_cache"), ("host_cache", "positions"),
                    ("hot_cache", "device_global_indices"), ("resident_cache", "resident_block_table"),
                    ("hot_cache", "hot_block_table"), ("host_cache", "source_block_table"),
                    ("resident_cache", "req_id_per_token"), ("hot_cache", "request_state_indices")]


def read_rows_fixture(state: Any, seed: int) -> Dict[str, Any]:
    cache = torch.from_numpy(rng(seed).integers(0, 256, (3, HOT_BLOCK, W), dtype=np.uint8))
    return dict(cache=cache, indices=i32([[0, 5, -1, 11], [12, 3, 40, 7]]),
                out=torch.zeros((2, K, W), dtype=torch.uint8), stream=None)


def read_rows_check(state: Any, kw: Dict[str, Any], result: Any) -> None:
    expected = read_reference(kw["cache"].numpy().reshape(-1, W), kw["indices"].numpy())
    assert np.array_equal(kw["out"].numpy(), expected)


def residency_fixture(state: Any, seed: int) -> Dict[str, Any]:
    lengths = torch.from_numpy(rng(seed).integers(-1, 13, 3, dtype=np.int32))
    return dict(resident_block_table=torch.full((3, 6), 9, dtype=torch.int32), request_state_indices=i32([1, 0, -1]),
                seq_lens=lengths, resident_blocks=i32([[1, 2, 3, 4], [5, 6, 7, 8]]), table_block_size=2, num_pages=2,
                blocks_per_page=2, ring_pages=i32([[-1, -1], [-1, 5]]), stream=None)


def residency_check(state: Any, kw: Dict[str, Any], result: Any) -> None:
    # Pages of 2 x 2 = 4 positions, the newest 2 resident, page g in ring slot g % 2; state row 1's
    # slot 1 holds page 5 from the start, so its pages 1 and 3 are never resident.
    table, blocks, ring = kw["resident_block_table"], kw["resident_blocks"], kw.get("ring_pages")
    held = [[-1, -1], [-1, 5]]
    for b, (s, length) in enumerate(zip(kw["request_state_indices"].tolist(), kw["seq_lens"].tolist())):
        expected = torch.zeros(6, dtype=torch.int32)
        if s >= 0 and length > 0:
            last = (length - 1) // 4
            for page in range(max(0, last - 1), last + 1):
                held[s][page % 2] = max(held[s][page % 2], page)
            for q in range(6):
                page = q // 2
                if max(0, last - 1) <= page <= last and (ring is None or held[s][page % 2] == page):
                    expected[q] = blocks[s, (page % 2) * 2 + q % 2]
        assert torch.equal(table[b], expected), (b, s, length)
    if ring is not None:
        assert ring.tolist() == held


RESIDENCY_ALIAS = [("resident_block_table", "resident_blocks"), ("resident_block_table", "seq_lens"),
                   ("resident_block_table", "request_state_indices"), ("ring_pages", "resident_block_table"),
                   ("ring_pages", "resident_blocks"), ("ring_pages", "seq_lens")]


def kernel_entries() -> List[Entry]:
    write_args = [
        T("rows", "dtype rank_down rank_up width noncontig misaligned released huge_stride"),
        T("req_id_per_token", "dtype rank_up short noncontig"),
        T("positions", "dtype_int16 rank_up short noncontig"),
        T("request_state_indices", "dtype rank_up noncontig"),
        T("host_cache", "dtype rank_down width misaligned released huge_stride", role="out", optional=True),
        T("source_block_table", "dtype rank_down noncontig short", optional=True),
        I("block_size", "neg zero 2**63"),
        I("host_rows", "neg 2**63", **{"not_the_rows": (5, (ValueError,))}),
        T("resident_cache", "dtype rank_down width noncontig misaligned released", role="out", optional=True,
          **{"none_with_a_table": (None, (ValueError,))}),
        T("resident_block_table", "dtype rank_down short noncontig", optional=True),
        T("hot_cache", "dtype rank_down width misaligned released", role="out", optional=True,
          **{"none_with_a_table": (None, (ValueError,)),
             "a_row_into_the_resident_cache": (
                 Of(lambda s, kw: kw["resident_cache"].view(-1, W)[1:9].view(2, HOT_BLOCK, W), True), (ValueError,))}),
        T("hot_block_table", "dtype rank_down short", optional=True),
        T("device_global_indices", "dtype rank_down noncontig", optional=True),
        S(),
    ]
    c_write_args = [a for a in write_args if a.name in ("rows", "positions", "host_cache", "resident_cache",
                                                         "device_global_indices", "block_size", "stream")]
    read_args = [T("cache", "rank_up width noncontig misaligned released huge_stride"),
                 T("indices", "dtype rank_down noncontig released"),
                 T("out", "dtype rank_down short width noncontig misaligned released", role="out"), S()]
    residency_args = [
        T("resident_block_table", "dtype rank_down noncontig released", role="out"),
        T("request_state_indices", "dtype rank_up noncontig"), T("seq_lens", "dtype rank_up short"),
        T("resident_blocks", "dtype rank_down noncontig width"),
        I("table_block_size", "neg zero 2**62 2**63"), I("num_pages", "neg 2**31"),
        I("blocks_per_page", "neg zero 2**31"),
        T("ring_pages", "dtype rank_down rank_up short width noncontig released", role="out", optional=True), S(),
    ]
    cuda_device = D("device")
    cuda_device.extra.update({"cpu": ("cpu", (ValueError,)), "none": (None, (ValueError,))})
    return [
        Entry("ops.write_rows", dict, write_rows_fixture, lambda s, kw: ops.write_rows(**kw),
              outputs(*WRITE_ROWS_OUTPUTS), write_args, WRITE_ROWS_ALIAS, write_rows_check),
        Entry("_C.write_rows", dict, write_rows_fixture, call_c_write_rows, outputs(*WRITE_ROWS_OUTPUTS),
              c_write_args, WRITE_ROWS_ALIAS[:4], write_rows_check),
        Entry("ops.read_rows", dict, read_rows_fixture, lambda s, kw: ops.read_rows(**kw), outputs("out"), read_args,
              [("out", "cache"), ("out", "indices")], read_rows_check),
        Entry("_C.read_rows", dict, read_rows_fixture,
              lambda s, kw: _C.read_rows(kw["cache"], kw["indices"], kw["out"], _c_stream(kw)), outputs("out"),
              [T("cache", "width"), T("indices", "dtype"), T("out", "dtype short", role="out"), S()],
              [("out", "cache")], read_rows_check),
        Entry("ops.update_residency", dict, residency_fixture, lambda s, kw: ops.update_residency(**kw),
              outputs("resident_block_table", "ring_pages"), residency_args, RESIDENCY_ALIAS, residency_check),
        Entry("_C.update_residency", dict, residency_fixture,
              lambda s, kw: _C.update_residency(kw["resident_block_table"], kw["table_block_size"],
                                                kw["blocks_per_page"], kw["num_pages"], kw["request_state_indices"],
                                                kw["seq_lens"], kw["resident_blocks"], kw["ring_pages"],
                                                _c_stream(kw)),
              outputs("resident_block_table", "ring_pages"),
              [T("resident_block_table", "dtype", role="out"), T("seq_lens", "dtype"), T("resident_blocks", "width"),
               I("table_block_size", "zero 2**62"), I("num_pages", "neg"), I("blocks_per_page", "zero"),
               T("ring_pages", "dtype width", role="out", optional=True), S()],
              RESIDENCY_ALIAS[:1] + RESIDENCY_ALIAS[3:4], residency_check),
        Entry("ops.resolver_workspace_bytes", dict,
              lambda s, seed: dict(num_state_rows=4, device_buffer_size=64, max_union_rows=8, device="cuda:0"),
              lambda s, kw: ops.resolver_workspace_bytes(**kw), lambda s, kw, r: [r],
              [I("num_state_rows", "neg 2**62 2**63"),
               I("device_buffer_size", "neg zero 2**31", **{"above_int16": (40000, (ValueError,))}),
               I("max_union_rows", "neg zero 2**31", **{"above_the_hot_rows": (65, (ValueError,))}),
               cuda_device], [],
              valid_call=cuda_present()),
        Entry("_C.resolver_workspace_bytes", dict,
              lambda s, seed: dict(num_state_rows=4, device_buffer_size=64, max_union_rows=8, device=0),
              lambda s, kw: _C.resolver_workspace_bytes(**kw), lambda s, kw, r: [r],
              [I("num_state_rows", "neg 2**62 2**63"), I("device_buffer_size", "neg zero 2**31"),
               I("max_union_rows", "neg zero 2**31", **{"above_the_hot_rows": (65, (ValueError,))}),
               I("device", "neg 2**31")], [], valid_call=cuda_present()),
    ]


# ---------------------------------------------------------------------- the runtime's KV calls
def runtime_write_fixture(state: RuntimeState, seed: int) -> Dict[str, Any]:
    # Batch row 0 (state row 1) writes position 5 (resident in block 1), batch row 1 (state row 0) position 9
    # (resident in block 2); position 70 lies past the host cache.
    return dict(rows=random_rows(seed, 3), req_id_per_token=i32([0, 1, 1]), positions=i32([5, 9, 70]),
                request_state_indices=None, block_table=None, block_size=None,
                resident_cache=torch.zeros((3, HOT_BLOCK, W), dtype=torch.uint8),
                resident_block_table=i32([[0, 1, 0, 0], [0, 0, 2, 0]]), skip_host_store=False, stream=None)


def runtime_write_call(state: RuntimeState, kw: Dict[str, Any]) -> None:
    state.leader.reset_hot_state()
    swap_in_call(state, swap_in_fixture(state, 7))  # hot copies for the write to rewrite
    state.leader.write(**kw)


def runtime_write_check(state: RuntimeState, kw: Dict[str, Any], result: Any) -> None:
    rows, host = kw["rows"], state.hosts[0]
    assert torch.equal(host[5], rows[0]) and torch.equal(host[9], rows[1])
    resident = kw["resident_cache"].view(-1, W)
    assert torch.equal(resident[HOT_BLOCK + 1], rows[0]) and torch.equal(resident[2 * HOT_BLOCK + 1], rows[1])
    # Every hot copy of a written slot holds the new row.
    hot, table = state.leader.hot.reshape(-1, W), state.table
    states = [1, 0]
    for t, slot in ((0, 5), (1, 9)):
        held = state.leader.device_global_indices[states[t]]
        for j in (held == slot).nonzero().flatten().tolist():
            offset = int(table[t, j // HOT_BLOCK]) * HOT_BLOCK + j % HOT_BLOCK
            assert torch.equal(hot[offset], rows[t]), (t, j)


def runtime_kv_entries() -> List[Entry]:
    flag_labels = ("str", "float", "list", "none")

    def c_write(state: RuntimeState, kw: Dict[str, Any]) -> None:
        state.leader.reset_hot_state()
        swap_in_call(state, swap_in_fixture(state, 7))
        state.leader._rt.write(kw["rows"], kw["req_id_per_token"], kw["positions"], state.leader.request_state_indices,
                               kw["block_table"], kw["block_size"], kw["resident_cache"], kw["resident_block_table"],
                               kw["skip_host_store"], _c_stream(kw))

    def reset_then(call):
        def run(state: RuntimeState, kw: Dict[str, Any]) -> Any:
            state.leader.reset_hot_state()
            swap_in_call(state, swap_in_fixture(state, 7))
            return call(state, kw)
        return run

    stats_observe = lambda s, kw, r: s.observe() + [s.leader.stats()]  # noqa: E731
    return [
        Entry("Runtime.write", RuntimeState, runtime_write_fixture, runtime_write_call,
              lambda s, kw, r: s.observe() + [as_numpy(kw["resident_cache"])],
              [T("rows", "dtype rank_down rank_up width noncontig misaligned released huge_stride",
                 **{"over_the_bound_host_cache": (Of(lambda s: s.hosts[0][:3]), (ValueError,)),
                    "over_the_bound_hot_view": (Of(lambda s: s.slab[: 3 * W].view(3, W)), (ValueError,))}),
               T("req_id_per_token", "dtype rank_up short noncontig"),
               T("positions", "dtype_int16 rank_up short noncontig",
                 **{"over_the_bound_host_cache": (Of(lambda s: s.hosts[0][0, :12].view(torch.int32)),
                                                  (ValueError,))}),
               T("request_state_indices", "dtype rank_up", optional=True, like=i32([1, 0])),
               T("block_table", "dtype rank_down noncontig short", optional=True, like=i32([[1, 2], [3, 4]])),
               I("block_size", "neg 2**63", optional=True),
               T("resident_cache", "dtype rank_down width noncontig misaligned released", role="out", optional=True,
                 **{"none_with_a_table": (None, (ValueError,)),
                    "over_the_bound_hot_view_elsewhere": (
                        Of(lambda s: s.slab[HOT_BLOCK * W: 4 * HOT_BLOCK * W].view(3, HOT_BLOCK, W)), (ValueError,)),
                    "over_the_bound_host_cache": (Of(lambda s: s.hosts[0][: 3 * HOT_BLOCK].view(3, HOT_BLOCK, W)),
                                                  (ValueError,)),
                    "over_the_group_state": (Of(lambda s: s.leader.device_global_indices.view(torch.uint8)
                                                .view(1, 2, W)), (ValueError,))}),
               T("resident_block_table", "dtype rank_down short", optional=True),
               Arg("skip_host_store", "bool", flag_labels, extra={"two": (2, (ValueError,))}), S()],
              [("resident_cache", "rows"), ("resident_cache", "positions"), ("resident_cache", "resident_block_table"),
               ("resident_cache", "req_id_per_token")],
              runtime_write_check),
        Entry("_C.Runtime.write", RuntimeState,
              lambda s, seed: dict(runtime_write_fixture(s, seed), block_size=0, skip_host_store=0), c_write,
              lambda s, kw, r: s.observe() + [as_numpy(kw["resident_cache"])],
              [T("rows", "dtype width", **{"over_the_bound_host_cache": (Of(lambda s: s.hosts[0][:3]),
                                                                         (ValueError,))}),
               T("positions", "dtype_int16"), T("req_id_per_token", "dtype"),
               T("block_table", "dtype", optional=True, like=i32([[1, 2], [3, 4]]),
                 message_name="source_block_table"),
               I("block_size", "neg 2**63"), T("resident_cache", "dtype width", role="out", optional=True),
               I("skip_host_store", "neg 2**31", **{"two": (2, (ValueError,))}), S()],
              [("resident_cache", "rows")], runtime_write_check),
        Entry("Runtime.reset_request", RuntimeState, lambda s, seed: dict(state_row=seed % S_ROWS, stream=None),
              reset_then(lambda s, kw: s.leader.reset_request(**kw)), lambda s, kw, r: s.observe(),
              [I("state_row", "neg 2**31 2**63", **{"past_the_rows": (S_ROWS, (ValueError,))}), S()], []),
        Entry("_C.Runtime.reset_request", RuntimeState, lambda s, seed: dict(state_row=seed % S_ROWS, stream=None),
              reset_then(lambda s, kw: s.leader._rt.reset_request(kw["state_row"], _c_stream(kw))),
              lambda s, kw, r: s.observe(),
              [I("state_row", "neg 2**31", **{"past_the_rows": (S_ROWS, (ValueError,))}), S()], []),
        Entry("Runtime.reset_stats", RuntimeState, lambda s, seed: dict(stream=None),
              reset_then(lambda s, kw: s.leader.reset_stats(**kw)), stats_observe, [S()], []),
        Entry("_C.Runtime.reset_stats", RuntimeState, lambda s, seed: dict(stream=None),
              reset_then(lambda s, kw: s.leader._rt.reset_stats(_c_stream(kw))), stats_observe, [S()], []),
        Entry("Runtime.set_host_sharing", RuntimeState, lambda s, seed: dict(role="writer", event=None),
              lambda s, kw: s.leader.set_host_sharing(**kw),
              lambda s, kw, r: [s.leader.is_writer, s.leader.info()["host_role"]],
              [C("role", ["owner", 3, -1, 2**31]),
               O("event", optional=True, **{"c_event": (_C.IpcEvent(_C.DEVICE_CPU, 0), (TypeError,)),
                                            "numpy": (np.zeros(4), (TypeError,))})], []),
        Entry("_C.Runtime.set_host_sharing", RuntimeState, lambda s, seed: dict(role=1, event=None),
              lambda s, kw: s.leader._rt.set_host_sharing(**kw),
              lambda s, kw, r: [s.leader.is_writer, s.leader.info()["host_role"]],
              [I("role", "neg 2**31", **{"three": (3, (ValueError,))}),
               O("event", optional=True, **{"python_event": (hisparse.IpcEvent("cpu"), (TypeError,))})], []),
    ]


# ---------------------------------------------------------------------- host registration
class PinState:
    """One tensor registered for good (`kept`), and one (`mine`) each valid call registers (or leaves registered)."""

    def __init__(self, pin_mine: bool = False) -> None:
        self.kept = torch.zeros(8192, dtype=torch.uint8)
        self.mine = torch.zeros(4096, dtype=torch.uint8)
        self.never = torch.zeros(64, dtype=torch.uint8)
        self.released = ReleasedView()
        hisparse.pin_tensor(self.kept, "cpu")
        if pin_mine:
            hisparse.pin_tensor(self.mine, "cpu")

    def observe(self) -> List[Any]:
        return [hisparse.is_pinned(self.kept), hisparse.is_pinned(self.mine), hisparse.is_pinned(self.never)]

    def __del__(self) -> None:
        for tensor in (self.kept, self.mine):
            if hisparse.is_pinned(tensor):
                hisparse.unpin_tensor(tensor)


class ReleasedView:
    """A view of a host pool released while it lives."""

    def __init__(self) -> None:
        self.pool = hisparse.HostPool(1 << 16, register="never")
        self.view = self.pool.view(torch.uint8, (4096,))
        self.pool.release(force=True)


def pin_observe(state: PinState, kw: Dict[str, Any], result: Any) -> List[Any]:
    return state.observe() + [result]


def pin_call(state: PinState, kw: Dict[str, Any]) -> Any:
    hisparse.pin_tensor(**kw)
    pinned = hisparse.is_pinned(state.mine)
    hisparse.unpin_tensor(state.mine)
    return pinned


def address(tensor: torch.Tensor) -> int:
    return tensor.data_ptr()


def registration_entries() -> List[Entry]:
    tensor_labels = "noncontig huge_stride"
    empty = {"empty": (torch.zeros(0, dtype=torch.uint8), (ValueError,))}
    overlapping = {"overlaps_a_registered_range": (Of(lambda s: s.kept[4000:]), (ValueError,))}

    def c_register(state: PinState, kw: Dict[str, Any]) -> Any:
        _C.host_register(kw["data"], kw["bytes"], kw["device_type"], kw["device_index"])
        pinned = hisparse.is_pinned(state.mine)
        _C.host_unregister(address(state.mine))
        return pinned

    return [
        Entry("pin_tensor", PinState, lambda s, seed: dict(tensor=s.mine, device="cpu"), pin_call, pin_observe,
              [T("tensor", tensor_labels + " released", **empty, **overlapping), D("device")], []),
        Entry("unpin_tensor", lambda: PinState(pin_mine=True), lambda s, seed: dict(tensor=s.mine),
              lambda s, kw: (hisparse.unpin_tensor(**kw), hisparse.pin_tensor(s.mine, "cpu")),
              lambda s, kw, r: s.observe(),
              [T("tensor", tensor_labels, **{"never_pinned": (Of(lambda s: s.never), (ValueError,)),
                                            "inside_a_registered_range": (Of(lambda s: s.kept[64:]),
                                                                          (ValueError,))})], []),
        Entry("is_pinned", PinState, lambda s, seed: dict(tensor=s.kept[100:200]),
              lambda s, kw: hisparse.is_pinned(**kw), pin_observe, [T("tensor", tensor_labels)], []),
        Entry("_C.host_register", PinState,
              lambda s, seed: dict(data=address(s.mine), bytes=s.mine.numel(), device_type=_C.DEVICE_CPU,
                                   device_index=0), c_register, pin_observe,
              [I("data", "neg 2**64", **{"null": (0, (ValueError,)), "unmapped": (0x1000, (ValueError,)),
                                         "overlaps_a_registered_range": (Of(lambda s: address(s.kept) + 64),
                                                                         (ValueError,)),
                                         "in_a_released_pool": (Of(lambda s: address(s.released.view)),
                                                                (RuntimeError, ValueError))}),
               I("bytes", "neg 2**64", **{"zero": (0, (ValueError,)), "wraps": (2**64 - 1, (ValueError,)),
                                          "past_the_mapping": (2**46, (ValueError,))}),
               I("device_type", "neg 2**31", **{"nine": (9, (ValueError,))}), I("device_index", "2**31")], []),
        Entry("_C.host_unregister", lambda: PinState(pin_mine=True), lambda s, seed: dict(data=address(s.mine)),
              lambda s, kw: (_C.host_unregister(**kw), hisparse.pin_tensor(s.mine, "cpu")),
              lambda s, kw, r: s.observe(),
              [I("data", "neg 2**64", **{"null": (0, (ValueError,)),
                                         "never_registered": (Of(lambda s: address(s.never)), (ValueError,)),
                                         "inside_a_registered_range": (Of(lambda s: address(s.kept) + 8),
                                                                       (ValueError,))})], []),
        Entry("_C.host_is_registered", PinState, lambda s, seed: dict(data=address(s.kept) + 16, bytes=64),
              lambda s, kw: _C.host_is_registered(**kw), pin_observe,
              [I("data", "neg 2**64"), I("bytes", "neg 2**64", **{"wraps": (2**64 - 32, (ValueError,))})], []),
    ]


def all_kv_entries() -> List[Entry]:
    return kv_entries() + kernel_entries() + runtime_kv_entries() + registration_entries()
