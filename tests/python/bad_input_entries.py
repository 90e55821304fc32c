"""Every public entry point of hisparse as an entry of the bad-input suite
(see bad_input_support.py): valid arguments, the call, what it leaves
behind, and the bad values each argument must refuse.

Entries are named by where they live: "ops.gather_compact",
"IndexGroup.resolve", "_C.gather_compact", "_C.Runtime.swap_in", ...
COVERED lists, per public callable, the entry that covers it (the coverage
test in test_bad_input.py fails for a public callable that has none).
"""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import torch
from bad_input_support import Arg, B, C, D, Entry, I, L, O, Of, R, S, T, as_numpy, cuda_present
from warm_pages_model import warm_totals

import hisparse
from hisparse import _C, ops

from residency_model import resolve_residency as model_resolve

# ---------------------------------------------------------------------- small sizes
K, H, S_ROWS, HOT_BLOCK, HOST_ROWS, W = 4, 8, 2, 4, 64, 32  # top-k, hot slots, state rows, rows/block, rows, row bytes


def i32(values: Any) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def random_rows(seed: int, rows: int, width: int = W) -> torch.Tensor:
    return torch.from_numpy(rng(seed).integers(0, 256, (rows, width), dtype=np.uint8))


def nothing(*_: Any) -> Any:
    return None


# An array whose strides claim memory that is not there: a message that
# printed it (its repr reads the memory) would crash.
BROKEN_ARRAY = np.lib.stride_tricks.as_strided(np.zeros(4, np.int64), shape=(2, 3), strides=(2**60, 2**59))


def outputs(*names: str):
    """observe(): the named arguments after the call."""
    return lambda state, kw, result: [as_numpy(kw[name]) for name in names]


# ---------------------------------------------------------------------- ops
def copy_fixture(state: Any, seed: int) -> Dict[str, Any]:
    return dict(dst=torch.zeros(64, dtype=torch.uint8), src=random_rows(seed, 4, 16).reshape(-1))


def copy_check(state: Any, kw: Dict[str, Any], result: Any) -> None:
    assert torch.equal(kw["dst"], kw["src"])


def gather_fixture(state: Any, seed: int) -> Dict[str, Any]:
    # Used entries include a negative slot, a host slot past the host rows
    # (zero-filled) and a destination past the hot cache (skipped).
    return dict(host_cache=random_rows(seed, 16), hot_cache=torch.zeros((3, HOT_BLOCK, W), dtype=torch.uint8),
                swap_host_rows=i32([[1, 5, -1], [7, 20, 2]]), swap_device_rows=i32([[0, 5, 1], [9, 3, 40]]),
                swap_counts=i32([3, 3]), hot_block_size=HOT_BLOCK, hot_block_stride=None, stream=None)


def gather_reference(kw: Dict[str, Any], hot: np.ndarray, host: np.ndarray, pieces: int = 1) -> np.ndarray:
    out = np.zeros_like(hot)
    rows = hot.reshape(-1, hot.shape[-1]).shape[0]
    stride = kw.get("hot_block_stride") or kw["hot_block_size"]
    flat = out.reshape(rows, -1)
    for t in range(kw["swap_host_rows"].shape[0]):
        for k in range(min(max(int(kw["swap_counts"][t]), 0), kw["swap_host_rows"].shape[1])):
            h, d = int(kw["swap_host_rows"][t, k]), int(kw["swap_device_rows"][t, k])
            if h < 0 or d < 0:
                continue
            offset = d // kw["hot_block_size"] * stride + d % kw["hot_block_size"]
            if offset >= rows:
                continue
            flat[offset] = host[h] if h < host.shape[0] else 0
    return out


def gather_check(state: Any, kw: Dict[str, Any], result: Any) -> None:
    expected = gather_reference(kw, kw["hot_cache"].numpy(), kw["host_cache"].numpy())
    assert np.array_equal(kw["hot_cache"].numpy(), expected)


GATHER_ARGS = [
    T("host_cache", "dtype rank_down width misaligned huge_stride released"),
    T("hot_cache", "dtype rank_down width misaligned released", role="out"),
    T("swap_host_rows", "dtype rank_down noncontig short"),
    T("swap_device_rows", "dtype rank_down noncontig short"),
    T("swap_counts", "dtype rank_up short"),
    I("hot_block_size", "neg zero 2**31 2**62 2**63 2**64"),
    I("hot_block_stride", "neg 2**31 2**62 2**63 -2**63-1", optional=True,
      **{"below_block": (2, (ValueError,)), "2**62+2**40": (2**62 + 2**40, (ValueError,))}),
    S(),
]
GATHER_ALIAS = [("hot_cache", "host_cache"), ("hot_cache", "swap_host_rows"), ("hot_cache", "swap_counts")]


def group_gather_fixture(state: Any, seed: int) -> Dict[str, Any]:
    host = torch.from_numpy(rng(seed).integers(0, 256, (16, 2, W), dtype=np.uint8))
    return dict(host_cache=host, hot_caches=[torch.zeros((3, HOT_BLOCK, W), dtype=torch.uint8) for _ in range(2)],
                swap_host_rows=i32([[1, 5, -1], [7, 20, 2]]), swap_device_rows=i32([[0, 5, 1], [9, 3, 40]]),
                swap_counts=i32([3, 3]), hot_block_size=HOT_BLOCK, hot_block_stride=None, stream=None)


def group_gather_check(state: Any, kw: Dict[str, Any], result: Any) -> None:
    for piece, hot in enumerate(kw["hot_caches"]):
        expected = gather_reference(kw, hot.numpy(), kw["host_cache"][:, piece].numpy())
        assert np.array_equal(hot.numpy(), expected)


def plan_fixture(state: Any, seed: int) -> Dict[str, Any]:
    return dict(src_rows=random_rows(seed, 8), staged=torch.zeros((6, W), dtype=torch.uint8),
                row_ids=i32([[3, -1, 7, 9, 0, 1]]), dst_rows=i32([[0, 1, 2, 3, 4, 9]]),
                miss_mask=i32([[1, 1, 1, 1, 0, 1]]), stream=None)


def plan_check(state: Any, kw: Dict[str, Any], result: Any) -> None:
    expected = np.zeros((6, W), dtype=np.uint8)
    src = kw["src_rows"].numpy()
    for j in range(6):
        row, dst, miss = int(kw["row_ids"][0, j]), int(kw["dst_rows"][0, j]), int(kw["miss_mask"][0, j])
        if miss and 0 <= row < 8 and 0 <= dst < 6:
            expected[dst] = src[row]
    assert np.array_equal(kw["staged"].numpy(), expected)


def invalidate_fixture(state: Any, seed: int) -> Dict[str, Any]:
    tables = [torch.from_numpy(rng(seed + i).integers(-1, 12, (S_ROWS, H), dtype=np.int32)) for i in range(2)]
    return dict(tables=tables, request_state_indices=i32([1, 0, -1]), req_id_per_token=i32([0, 1, 2, 1]),
                written_slots=i32([3, 5, 7, -1]), table_pointers=None, stream=None)


def invalidate_check(state: Any, kw: Dict[str, Any], result: Any) -> None:
    # Checked against the inputs the twin saw, which equal these: every
    # written slot of the writer's state row is gone.
    for table in kw["tables"]:
        assert 3 not in table[1].tolist() and 5 not in table[0].tolist()


def mirror_fixture(state: Any, seed: int) -> Dict[str, Any]:
    return dict(src_rows=random_rows(seed, 4), host_cache=torch.zeros((8, W), dtype=torch.uint8),
                slot_mapping=i32([2, -1, 9, 5]), stream=None)


def mirror_check(state: Any, kw: Dict[str, Any], result: Any) -> None:
    host, src = kw["host_cache"].numpy(), kw["src_rows"].numpy()
    assert np.array_equal(host[2], src[0]) and np.array_equal(host[5], src[3])
    assert not host[[0, 1, 3, 4, 6, 7]].any()


def swap_fixture(state: Any, seed: int) -> Dict[str, Any]:
    # Kept alive by the state: the addresses point into these.
    source, target = random_rows(seed, 2), torch.zeros((2, W), dtype=torch.uint8)
    state["buffers"] = (source, target)
    return dict(src=torch.tensor([source.data_ptr(), source[1].data_ptr()], dtype=torch.int64),
                dst=torch.tensor([target[1].data_ptr(), target.data_ptr()], dtype=torch.int64),
                sizes=torch.tensor([W, W], dtype=torch.int64), stream=None)


def swap_observe(state: Any, kw: Dict[str, Any], result: Any) -> List[Any]:
    return [as_numpy(state["buffers"][1]), as_numpy(state["buffers"][0])]


def swap_check(state: Any, kw: Dict[str, Any], result: Any) -> None:
    source, target = state["buffers"]
    assert torch.equal(target[1], source[0]) and torch.equal(target[0], source[1])


def warm_fixture(state: Any, seed: int) -> Dict[str, Any]:
    # Consecutive blocks, a skipped entry and a block past the cache; 16-byte
    # pages, so that what is read does not depend on where the rows lie.
    return dict(host_cache=random_rows(seed, 16), block_table=i32([[0, 1, 3], [2, -1, 9]]), block_size=HOT_BLOCK,
                seq_lens=None, page_bytes=16, out=torch.zeros(2, dtype=torch.int64), stream=None)


def warm_check(state: Any, kw: Dict[str, Any], result: Any) -> None:
    expected = warm_totals(kw["host_cache"], kw["block_table"], kw["block_size"], kw["page_bytes"], kw["seq_lens"])
    assert tuple(kw["out"].tolist()) == expected


def resolve_fixture(state: Any, seed: int) -> Dict[str, Any]:
    g = rng(seed)
    T_ = 2
    kw = dict(
        topk_indices=torch.from_numpy(g.integers(-1, 24, (T_, K), dtype=np.int32)),
        req_id_per_token=i32([0, 1]), request_state_indices=i32([1, 0]),
        device_global_indices=torch.full((S_ROWS, H), -1, dtype=torch.int32),
        lru_slots=torch.arange(H, dtype=torch.int16).repeat(S_ROWS, 1),
        hot_block_table=i32([[1, 2], [3, 4]]), hot_block_size=HOT_BLOCK, attention_block_stride=HOT_BLOCK,
        host_rows=HOST_ROWS, max_union_rows=H, stream=None)
    for name in ("out_attention", "out_hot_rows", "out_resolved", "out_miss_mask", "out_swap_host_rows",
                 "out_swap_device_rows"):
        kw[name] = torch.full((T_, K), -7, dtype=torch.int32)
    kw["out_valid_counts"] = torch.full((T_,), -7, dtype=torch.int32)
    kw["out_swap_counts"] = torch.full((T_,), -7, dtype=torch.int32)
    kw["stats"] = torch.zeros(5, dtype=torch.int64)
    kw["workspace"] = None  # the CPU backend needs none; a workspace given is checked all the same
    kw["gather_schedule"] = "auto"
    kw["handoff"] = None  # checked on every backend, read by CUDA's automatic schedule alone
    kw["residency_hint"] = None  # checked on every backend, kept by CUDA's resolves alone
    return kw


RESOLVE_OUTPUTS = ("out_attention", "out_hot_rows", "out_resolved", "out_miss_mask", "out_valid_counts",
                   "out_swap_counts", "device_global_indices", "lru_slots", "stats")


def resolve_check(state: Any, kw: Dict[str, Any], result: Any) -> None:
    model = model_resolve(
        kw["topk_indices"].numpy(), kw["req_id_per_token"].numpy(), kw["request_state_indices"].numpy(),
        np.full((S_ROWS, H), -1), np.tile(np.arange(H), (S_ROWS, 1)), kw["hot_block_table"].numpy(),
        hot_block_size=HOT_BLOCK, attention_block_stride=HOT_BLOCK, host_rows=HOST_ROWS, max_union_rows=H)
    assert np.array_equal(kw["out_attention"].numpy(), model.attention)
    assert np.array_equal(kw["device_global_indices"].numpy(), model.device_global_indices)
    assert np.array_equal(kw["lru_slots"].numpy(), model.lru_slots)


RESOLVE_ARGS = [
    T("topk_indices", "dtype rank_down noncontig"),
    T("req_id_per_token", "dtype rank_up short"),
    T("request_state_indices", "dtype rank_up"),
    T("device_global_indices", "dtype rank_down noncontig", role="out"),
    T("lru_slots", "dtype rank_down noncontig", role="out"),
    T("hot_block_table", "dtype rank_down short noncontig"),
    I("hot_block_size", "neg zero 2**31 2**63"),
    I("attention_block_stride", "neg zero 2**31 2**63"),
    I("host_rows", "neg 2**31 2**63"),
    I("max_union_rows", "neg zero 2**31"),
    T("out_attention", "dtype rank_down short", role="out"),
    T("out_hot_rows", "dtype short", role="out"),
    T("out_resolved", "dtype short", role="out"),
    T("out_miss_mask", "dtype short", role="out"),
    T("out_valid_counts", "dtype short rank_up", role="out"),
    T("out_swap_host_rows", "dtype short", role="out"),
    T("out_swap_device_rows", "dtype short", role="out"),
    T("out_swap_counts", "dtype short", role="out"),
    T("stats", "dtype short", role="out", optional=True),
    T("workspace", "dtype rank_up noncontig misaligned released", role="out", optional=True,
      like=torch.zeros(256, dtype=torch.uint8),
      **{"over_device_global_indices": (Of(lambda s, kw: kw["device_global_indices"].view(torch.uint8).view(-1), True),
                                        (ValueError,)),
         "over_topk_indices": (Of(lambda s, kw: kw["topk_indices"].view(torch.uint8).view(-1), True),
                               (ValueError,))}),
    R("gather_schedule", ["bogus", "FUSED", ""]),
    T("handoff", "dtype rank_up rank_down noncontig short released", role="out", optional=True,
      like=torch.zeros((S_ROWS, _C.RESOLVER_HANDOFF_WORDS), dtype=torch.int32),
      **{"over_device_global_indices": (
          Of(lambda s, kw: kw["device_global_indices"].view(-1)[: S_ROWS * _C.RESOLVER_HANDOFF_WORDS]
             .view(S_ROWS, _C.RESOLVER_HANDOFF_WORDS), True), (ValueError,))}),
    T("residency_hint", "dtype rank_up noncontig short released", role="out", optional=True,
      like=torch.zeros((HOST_ROWS + 31) // 32, dtype=torch.int32),
      **{"over_device_global_indices": (
          Of(lambda s, kw: kw["device_global_indices"].view(-1)[: (HOST_ROWS + 31) // 32], True), (ValueError,))}),
    S(),
]
RESOLVE_ALIAS = [("out_attention", "device_global_indices"), ("out_hot_rows", "topk_indices"),
                 ("out_swap_counts", "req_id_per_token"), ("lru_slots", "out_miss_mask"),
                 ("out_resolved", "out_swap_host_rows"), ("stats", "hot_block_table")]


def fused_fixture(state: Any, seed: int) -> Dict[str, Any]:
    kw = resolve_fixture(state, seed)
    kw.update(gather_host_cache=random_rows(seed, HOST_ROWS), gather_hot_cache=torch.zeros((5, HOT_BLOCK, W),
                                                                                           dtype=torch.uint8),
              gather_hot_block_stride=0)
    return kw


def table_pointers_fixture(state: Any, seed: int) -> Dict[str, Any]:
    return dict(tables=[torch.zeros((S_ROWS, H), dtype=torch.int32) for _ in range(2)])


def _c_stream(kw: Dict[str, Any]) -> Any:
    return kw.get("stream")  # None is the default stream to _C too


def _opt(value: Any, default: int) -> Any:
    return default if value is None else value


def c_args(fixture, **values: Any):
    """A fixture for a _C function: `fixture`'s arguments with the defaults _C takes as plain values."""
    return lambda state, seed: dict(fixture(state, seed), **values)


def call_c_gather(state: Any, kw: Dict[str, Any]) -> None:
    _C.gather_compact(kw["host_cache"], kw["hot_cache"], kw["swap_host_rows"], kw["swap_device_rows"],
                      kw["swap_counts"], kw["hot_block_size"], kw["hot_block_stride"], kw["variant"],
                      kw["max_blocks"], kw["stream"])


def call_c_group_gather(state: Any, kw: Dict[str, Any]) -> None:
    _C.gather_compact_group(kw["host_cache"], kw["hot_caches"], kw["swap_host_rows"], kw["swap_device_rows"],
                            kw["swap_counts"], kw["hot_block_size"], kw["hot_block_stride"], kw["max_blocks"],
                            kw["stream"])


def call_c_resolve(state: Any, kw: Dict[str, Any]) -> None:
    _C.resolve_residency(
        kw["topk_indices"], kw["req_id_per_token"], kw["request_state_indices"], kw["device_global_indices"],
        kw["lru_slots"], kw["hot_block_table"], kw["hot_block_size"], kw["attention_block_stride"], kw["host_rows"],
        kw["max_union_rows"], kw["out_attention"], kw["out_hot_rows"], kw["out_resolved"], kw["out_miss_mask"],
        kw["out_valid_counts"], kw["out_swap_host_rows"], kw["out_swap_device_rows"], kw["out_swap_counts"],
        stats=kw["stats"], gather_host_cache=kw.get("gather_host_cache"), gather_hot_cache=kw.get("gather_hot_cache"),
        gather_hot_block_stride=kw.get("gather_hot_block_stride", 0), workspace=kw.get("workspace"),
        gather_schedule=kw.get("gather_schedule", 0), handoff=kw.get("handoff"),
        residency_hint=kw.get("residency_hint"), stream=_c_stream(kw))


def ops_entries() -> List[Entry]:
    c_stream = [S()]
    gather_c_args = [a for a in GATHER_ARGS if a.name != "hot_block_stride"] + [
        I("hot_block_stride", "neg 2**31 2**62 2**63 -2**63-1",
          **{"below_block": (2, (ValueError,)), "2**62+2**40": (2**62 + 2**40, (ValueError,))}),
        I("variant", "neg 2**31", **{"99": (99, (ValueError,))}),
        I("max_blocks", "neg 2**31"),
    ]
    fused_args = RESOLVE_ARGS + [
        T("gather_host_cache", "dtype width misaligned released", optional=True),
        T("gather_hot_cache", "dtype width misaligned", role="out", optional=True),
        I("gather_hot_block_stride", "neg 2**31 2**62 2**63",
          **{"below_block": (2, (ValueError,)), "2**62+2**40": (2**62 + 2**40, (ValueError,))}),
    ]
    fused_alias = [("gather_hot_cache", "gather_host_cache"), ("gather_hot_cache", "topk_indices"),
                   ("gather_hot_cache", "lru_slots")]
    setup = dict
    return [
        Entry("ops.copy_bytes", setup, copy_fixture, lambda s, kw: ops.copy_bytes(**kw), outputs("dst"),
              [T("dst", "redtype width released", role="out"), T("src", "width huge_stride released"), S()],
              [("dst", "src")], copy_check),
        Entry("_C.copy_bytes", setup, copy_fixture, lambda s, kw: _C.copy_bytes(kw["dst"], kw["src"], _c_stream(kw)),
              outputs("dst"), [T("dst", "width", role="out"), T("src", "width huge_stride")] + c_stream,
              [("dst", "src")], copy_check),
        Entry("ops.gather_compact", setup, lambda s, seed: dict(gather_fixture(s, seed), variant="auto",
                                                                  max_blocks=None),
              lambda s, kw: ops.gather_compact(**kw), outputs("hot_cache"),
              GATHER_ARGS + [C("variant", ["bogus", 99, -1]), I("max_blocks", "neg 2**31 2**63", optional=True)],
              GATHER_ALIAS, gather_check),
        Entry("_C.gather_compact", setup, c_args(gather_fixture, hot_block_stride=0, variant=0, max_blocks=0),
              call_c_gather, outputs("hot_cache"), gather_c_args, GATHER_ALIAS, gather_check),
        Entry("ops.gather_compact_group", setup, group_gather_fixture, lambda s, kw: ops.gather_compact_group(**kw),
              outputs("hot_caches"),
              [T("host_cache", "dtype rank_down misaligned released"), L("hot_caches", "dtype width readonly meta"),
               T("swap_host_rows", "dtype rank_down short"), T("swap_device_rows", "dtype rank_down short"),
               T("swap_counts", "dtype short"), I("hot_block_size", "neg zero 2**31 2**63"),
               I("hot_block_stride", "neg 2**31 2**62 2**63", optional=True,
                 **{"2**62+2**40": (2**62 + 2**40, (ValueError,))}),
               I("max_blocks", "neg 2**31", optional=True), S()],
              [("hot_caches", "swap_host_rows"), ("hot_caches", "host_cache")], group_gather_check),
        Entry("_C.gather_compact_group", setup, c_args(group_gather_fixture, hot_block_stride=0, max_blocks=0),
              call_c_group_gather, outputs("hot_caches"),
              [T("host_cache", "dtype rank_down misaligned"), L("hot_caches", "dtype width readonly"),
               T("swap_host_rows", "dtype short"), I("hot_block_size", "neg zero 2**31"),
               I("hot_block_stride", "neg 2**31 2**62", **{"2**62+2**40": (2**62 + 2**40, (ValueError,))}),
               I("max_blocks", "neg 2**31")] + c_stream, [], group_gather_check),
        Entry("ops.gather_plan", setup, plan_fixture, lambda s, kw: ops.gather_plan(**kw), outputs("staged"),
              [T("src_rows", "dtype rank_down width misaligned released"),
               T("staged", "dtype width noncontig misaligned", role="out"), T("row_ids", "dtype_int64 noncontig"),
               T("dst_rows", "dtype short"), T("miss_mask", "dtype short"), S()],
              [("staged", "src_rows"), ("staged", "row_ids"), ("staged", "miss_mask")], plan_check),
        Entry("_C.gather_plan", setup, plan_fixture,
              lambda s, kw: _C.gather_plan(kw["src_rows"], kw["staged"], kw["row_ids"], kw["dst_rows"],
                                           kw["miss_mask"], _c_stream(kw)), outputs("staged"),
              [T("src_rows", "dtype width"), T("staged", "width", role="out"), T("row_ids", "dtype"),
               T("dst_rows", "short"), T("miss_mask", "dtype")] + c_stream, [("staged", "dst_rows")], plan_check),
        Entry("ops.invalidate_written_slots", setup, invalidate_fixture,
              lambda s, kw: ops.invalidate_written_slots(**kw), outputs("tables"),
              [L("tables", "dtype rank_up noncontig readonly meta"), T("request_state_indices", "dtype rank_up"),
               T("req_id_per_token", "dtype rank_up"), T("written_slots", "dtype_int64 rank_up"),
               T("table_pointers", "dtype", optional=True, like=torch.zeros(2, dtype=torch.int64)), S()],
              [("request_state_indices", "tables"), ("written_slots", "tables")], invalidate_check),
        Entry("_C.invalidate_written_slots", setup, invalidate_fixture,
              lambda s, kw: _C.invalidate_written_slots(kw["tables"], kw["request_state_indices"],
                                                        kw["req_id_per_token"], kw["written_slots"],
                                                        kw["table_pointers"], _c_stream(kw)), outputs("tables"),
              [L("tables", "dtype readonly"), T("request_state_indices", "dtype"), T("req_id_per_token", "rank_up"),
               T("written_slots", "dtype"),
               T("table_pointers", "dtype", optional=True, like=torch.zeros(2, dtype=torch.int64))] + c_stream,
              [("req_id_per_token", "tables")], invalidate_check),
        Entry("ops.mirror_rows", setup, mirror_fixture, lambda s, kw: ops.mirror_rows(**kw), outputs("host_cache"),
              [T("src_rows", "dtype rank_down width misaligned"),
               T("host_cache", "dtype rank_down width misaligned released", role="out"),
               T("slot_mapping", "dtype_int16 rank_up short"), S()],
              [("host_cache", "src_rows"), ("host_cache", "slot_mapping")], mirror_check),
        Entry("_C.mirror_rows", setup, mirror_fixture,
              lambda s, kw: _C.mirror_rows(kw["src_rows"], kw["host_cache"], kw["slot_mapping"], _c_stream(kw)),
              outputs("host_cache"), [T("src_rows", "width"), T("host_cache", "width", role="out"),
                                      T("slot_mapping", "dtype_int16")] + c_stream,
              [("host_cache", "slot_mapping")], mirror_check),
        Entry("ops.swap_blocks_batch", setup, swap_fixture, lambda s, kw: ops.swap_blocks_batch(**kw), swap_observe,
              [T("src", "dtype rank_up short"), T("dst", "dtype short"), T("sizes", "dtype short"), S()], [],
              swap_check),
        Entry("_C.swap_blocks_batch", setup, swap_fixture,
              lambda s, kw: _C.swap_blocks_batch(kw["src"], kw["dst"], kw["sizes"], _c_stream(kw)), swap_observe,
              [T("src", "dtype"), T("dst", "short"), T("sizes", "dtype")] + c_stream, [], swap_check),
        Entry("ops.warm_host_pages", setup, warm_fixture, lambda s, kw: ops.warm_host_pages(**kw), outputs("out"),
              [T("host_cache", "rank_down width misaligned released"), T("block_table", "dtype rank_down rank_up"),
               T("seq_lens", "dtype short", optional=True, like=i32([4, 4])),
               T("out", "dtype short", role="out", optional=True, like=torch.zeros(2, dtype=torch.int64)),
               I("block_size", "neg zero 2**31 2**63"),
               I("page_bytes", "neg zero 2**31 2**63", **{"not_a_power_of_two": (48, (ValueError,)),
                                                        "below_16": (8, (ValueError,))}), S()],
              [("out", "block_table"), ("out", "host_cache")], warm_check),
        Entry("_C.warm_host_pages", setup, warm_fixture,
              lambda s, kw: _C.warm_host_pages(kw["host_cache"], kw["block_table"], kw["seq_lens"], kw["block_size"],
                                               kw["page_bytes"], kw["out"], _c_stream(kw)),
              outputs("out"), [T("block_table", "dtype"), T("out", "dtype", role="out", optional=True,
                                                             like=torch.zeros(2, dtype=torch.int64))] + c_stream,
              [("out", "block_table")], warm_check),
        Entry("ops.resolve_residency", setup, resolve_fixture, lambda s, kw: ops.resolve_residency(**kw),
              outputs(*RESOLVE_OUTPUTS), RESOLVE_ARGS, RESOLVE_ALIAS, resolve_check),
        Entry("ops.resolve_residency(fused)", setup, fused_fixture, lambda s, kw: ops.resolve_residency(**kw),
              outputs(*RESOLVE_OUTPUTS, "gather_hot_cache"), fused_args, fused_alias, resolve_check),
        Entry("_C.resolve_residency", setup, c_args(fused_fixture, gather_schedule=0), call_c_resolve,
              outputs(*RESOLVE_OUTPUTS, "gather_hot_cache"),
              [a for a in fused_args if a.name not in ("stats", "gather_schedule")]
              + [I("gather_schedule", "neg 2**31", **{"two": (2, (ValueError,))})],
              RESOLVE_ALIAS[:3] + fused_alias[:1], resolve_check),
        Entry("ops.table_pointers", setup, table_pointers_fixture, lambda s, kw: ops.table_pointers(**kw),
              lambda s, kw, result: [as_numpy(result) - np.array([t.data_ptr() for t in kw["tables"]])],
              [L("tables", "list meta sparse"),
               Arg("tables", "object", (), extra={"empty": ([], (ValueError,)), "ints": ([1, 2], (TypeError,)),
                                                  "numpy": ([np.zeros(2, np.int32)], (TypeError,))})], []),
    ]


# ---------------------------------------------------------------------- index groups
def group_setup() -> Any:
    return hisparse.IndexGroup(max_num_reqs=S_ROWS, top_k=K, device_buffer_size=H, max_swap_rows=4)


def group_state(group: Any) -> List[Any]:
    return [as_numpy(group.device_global_indices), as_numpy(group.lru_slots), as_numpy(group.counters)]


def group_resolve_fixture(group: Any, seed: int) -> Dict[str, Any]:
    g = rng(seed)
    return dict(topk_indices=torch.from_numpy(g.integers(-1, 24, (2, K), dtype=np.int32)),
                req_id_per_token=i32([0, 1]), request_state_indices=i32([1, 0]), hot_block_table=i32([[1, 2], [3, 4]]),
                host_rows=HOST_ROWS, hot_block_size=HOT_BLOCK, attention_block_stride=None, row_offset=0,
                out_attention=None, out_valid_counts=None, stream=None)


def group_resolve_observe(group: Any, kw: Dict[str, Any], result: Any) -> List[Any]:
    return group_state(group) + [as_numpy(v) for v in result]


GROUP_RESOLVE_ARGS = [
    T("topk_indices", "dtype rank_down noncontig", width=(torch.zeros((2, K + 1), dtype=torch.int32), (ValueError,))),
    T("req_id_per_token", "dtype rank_up short"), T("request_state_indices", "dtype rank_up"),
    T("hot_block_table", "dtype rank_down short"),
    I("host_rows", "neg 2**31 2**63"), I("hot_block_size", "neg zero 2**31 2**63", optional=True),
    I("attention_block_stride", "neg 2**31 2**63", optional=True),
    I("row_offset", "neg 2**31 2**63", **{"past_the_rows": (3, (ValueError,))}),
    T("out_attention", "dtype short", role="out", optional=True, like=torch.zeros((2, K), dtype=torch.int32)),
    T("out_valid_counts", "dtype short", role="out", optional=True, like=torch.zeros(2, dtype=torch.int32)), S(),
]


def group_out_fixture(group: Any, seed: int) -> Dict[str, Any]:
    kw = group_resolve_fixture(group, seed)
    kw.update(out_attention=torch.zeros((2, K), dtype=torch.int32), out_valid_counts=torch.zeros(2, dtype=torch.int32))
    return kw


def invalidate_sorted_fixture(group: Any, seed: int) -> Dict[str, Any]:
    return dict(sorted_slots=i32([9, 2, 5]), state_indices=i32([0, 1, 7, -1]), stream=None)


def sorted_observe(group: Any, kw: Dict[str, Any], result: Any) -> List[Any]:
    return group_state(group)


def resolve_then(call):
    """A reset and a valid resolve first, so that the state holds slots to drop (the same each time)."""
    def run(group: Any, kw: Dict[str, Any]) -> Any:
        group.reset()
        group.resolve(i32([[2, 5, 9, 11], [5, 6, 7, 8]]), i32([0, 1]), i32([0, 1]), i32([[1, 2], [3, 4]]),
                      host_rows=HOST_ROWS, hot_block_size=HOT_BLOCK)
        return call(group, kw)
    return run


def group_entries() -> List[Entry]:
    def make(kw: Dict[str, Any]) -> Any:
        return hisparse.IndexGroup(**kw)

    def info(group: Any, kw: Dict[str, Any], result: Any) -> List[Any]:
        return [repr(result)]

    ctor_fixture = lambda s, seed: dict(max_num_reqs=2, top_k=4, device_buffer_size=8, device=None,  # noqa: E731
                                        max_swap_rows=None, max_union_rows=None)
    c_ctor = lambda s, seed: dict(device_type=_C.DEVICE_CPU, device_index=0, max_num_reqs=2,  # noqa: E731
                                  device_buffer_size=8, max_swap_rows=0, top_k=4, max_union_rows=0,
                                  num_speculative_tokens=0)
    return [
        Entry("IndexGroup", dict, ctor_fixture, lambda s, kw: make(kw), info,
              [I("max_num_reqs", "neg zero 2**31 2**63"), I("top_k", "neg zero 2**31", optional=True),
               I("device_buffer_size", "neg zero 2**31", optional=True,
                 **{"above_int16": (40000, (ValueError,))}),
               I("max_swap_rows", "neg zero 2**31", optional=True), I("max_union_rows", "neg 2**31", optional=True),
               D("device"), O("config", optional=True)], []),
        Entry("_C.IndexGroup", dict, c_ctor, lambda s, kw: _C.IndexGroup(**kw).info(), lambda s, kw, r: [r],
              [I("device_type", "neg 2**31"), I("device_index", "2**31"), I("max_num_reqs", "neg zero 2**31"),
               I("device_buffer_size", "neg zero 2**31"), I("max_swap_rows", "neg 2**31"), I("top_k", "neg zero"),
               I("max_union_rows", "neg 2**31"), I("num_speculative_tokens", "neg 2**31")], []),
        Entry("IndexGroup.resolve", group_setup, group_resolve_fixture, lambda g, kw: g.resolve(**kw),
              group_resolve_observe, GROUP_RESOLVE_ARGS, []),
        Entry("IndexGroup.resolve(outputs)", group_setup, group_out_fixture, lambda g, kw: g.resolve(**kw),
              group_resolve_observe, [], [("out_attention", "topk_indices"), ("out_attention", "hot_block_table"),
                                          ("out_valid_counts", "req_id_per_token"),
                                          ("out_attention", "out_valid_counts")]),
        Entry("_C.IndexGroup.resolve", group_setup, c_args(group_resolve_fixture, attention_block_stride=0),
              lambda g, kw: g._group.resolve(kw["topk_indices"], kw["req_id_per_token"], kw["request_state_indices"],
                                             kw["hot_block_table"], kw["hot_block_size"],
                                             kw["attention_block_stride"], kw["host_rows"], kw["row_offset"],
                                             stream=_c_stream(kw)),
              lambda g, kw, r: group_state(g),
              [T("topk_indices", "dtype rank_down"), T("req_id_per_token", "short"),
               T("hot_block_table", "dtype short"), I("host_rows", "neg 2**31"), I("hot_block_size", "neg zero"),
               I("attention_block_stride", "neg 2**31 2**63"), I("row_offset", "neg 2**63")] + [S()], []),
        Entry("IndexGroup.invalidate_sorted_slots", group_setup, invalidate_sorted_fixture,
              resolve_then(lambda g, kw: g.invalidate_sorted_slots(**kw)), sorted_observe,
              [T("sorted_slots", "dtype rank_up noncontig"), T("state_indices", "dtype_int64 rank_up noncontig"), S()],
              []),
        Entry("_C.IndexGroup.invalidate_sorted_slots", group_setup, invalidate_sorted_fixture,
              resolve_then(lambda g, kw: g._group.invalidate_sorted_slots(kw["sorted_slots"], kw["state_indices"],
                                                                          _c_stream(kw))), sorted_observe,
              [T("sorted_slots", "dtype rank_up"), T("state_indices", "dtype")] + [S()], []),
        Entry("IndexGroup.reset", group_setup, lambda g, seed: dict(stream=None),
              resolve_then(lambda g, kw: g.reset(**kw)), sorted_observe, [S()], []),
        Entry("IndexGroup.copy_stats_async", group_setup, lambda g, seed: dict(stream=None),
              resolve_then(lambda g, kw: g.copy_stats_async(**kw)), lambda g, kw, r: [g.read_stats()], [S()], []),
        Entry("IndexGroup.stats", group_setup, lambda g, seed: dict(row_bytes=None, num_layers=1, synchronize=True),
              resolve_then(lambda g, kw: g.stats(**kw)), lambda g, kw, r: [r],
              [I("row_bytes", "neg", optional=True), I("num_layers", "neg zero"), B("synchronize")], []),
        Entry("_C.IndexGroup.tensor", group_setup, lambda g, seed: dict(which=0),
              lambda g, kw: g._group.tensor(kw["which"]), lambda g, kw, r: [np.from_dlpack(r).copy()],
              [I("which", "neg 2**31 2**63", **{"past_the_tensors": (99, (ValueError,))})], []),
        Entry("_C.IndexGroup.reset", group_setup, lambda g, seed: dict(stream=None),
              lambda g, kw: g._group.reset(_c_stream(kw)), sorted_observe, [S()], []),
        Entry("_C.IndexGroup.copy_stats_async", group_setup, lambda g, seed: dict(stream=None),
              lambda g, kw: g._group.copy_stats_async(_c_stream(kw)), lambda g, kw, r: [g.read_stats()], [S()], []),
    ]


# ---------------------------------------------------------------------- runtimes
class RuntimeState:
    """A leader and a follower, bound, with their host caches in a host pool and hot views in one slab."""

    def __init__(self) -> None:
        self.config = hisparse.Config(top_k=K, device_buffer_size=H, row_bytes=W, block_size=HOT_BLOCK,
                                      hot_block_size=HOT_BLOCK)
        self.leader = hisparse.Runtime(self.config, max_num_reqs=S_ROWS, max_swap_rows=4)
        self.follower = hisparse.Runtime(self.config, max_num_reqs=S_ROWS, leader=self.leader)
        self.pool = hisparse.HostPool(2 * HOST_ROWS * W, register="never")
        self.hosts = [self.pool.view("uint8", (HOST_ROWS, W), offset=i * HOST_ROWS * W) for i in range(2)]
        for i, host in enumerate(self.hosts):
            host.copy_(random_rows(100 + i, HOST_ROWS))
        self.blocks = 1 + S_ROWS * (H // HOT_BLOCK)
        self.slab = torch.zeros(self.blocks * 2 * HOT_BLOCK * W, dtype=torch.uint8)
        self.table = i32([[1, 2], [3, 4]])
        for i, runtime in enumerate((self.leader, self.follower)):
            runtime.bind_source_cache(self.hosts[i])
            runtime.bind_hot_cache(self.slab, byte_offset=i * HOT_BLOCK * W, block_stride=2 * HOT_BLOCK * W,
                                   num_blocks=self.blocks, block_size=HOT_BLOCK, block_table=self.table)
        self.leader.request_state_indices = i32([1, 0])

    def observe(self) -> List[Any]:
        return [as_numpy(self.slab), as_numpy(self.leader.device_global_indices), as_numpy(self.leader.lru_slots),
                as_numpy(self.hosts[0]), as_numpy(self.hosts[1])]


def swap_in_fixture(state: RuntimeState, seed: int) -> Dict[str, Any]:
    g = rng(seed)
    return dict(topk_indices=torch.from_numpy(g.integers(-1, 24, (2, K), dtype=np.int32)),
                req_id_per_token=i32([0, 1]), request_state_indices=None, block_table=None, block_size=None,
                resident_block_table=None, resident_block_size=None, num_valid_rows=None, prefetch=True,
                return_valid_counts=False, attention_indices_out=torch.zeros((2, K), dtype=torch.int32),
                valid_counts_out=torch.zeros(2, dtype=torch.int32), num_tokens=None, ignore_topk_ready=False,
                fused_gather=False, group_gather=False, stream=None)


def swap_in_call(state: RuntimeState, kw: Dict[str, Any]) -> Any:
    state.leader.begin_forward()
    state.follower.begin_forward()
    out = state.leader.swap_in(**kw)
    state.follower.swap_in(num_tokens=2)
    return out


def runtime_observe(state: RuntimeState, kw: Dict[str, Any], result: Any) -> List[Any]:
    return state.observe() + [as_numpy(result)]


def c_swap_in_fixture(state: RuntimeState, seed: int) -> Dict[str, Any]:
    kw = swap_in_fixture(state, seed)
    return dict(topk_indices=kw["topk_indices"], req_id_per_token=kw["req_id_per_token"], request_state_indices=None,
                source_block_table=None, block_size=0, resident_block_table=None, resident_block_size=0,
                num_valid_rows=None, out_attention=kw["attention_indices_out"], out_valid_counts=kw["valid_counts_out"],
                prefetch=True, ignore_topk_ready=False, num_tokens=0, fused_gather=0, group_gather=0, stream=0)


def c_swap_in_call(state: RuntimeState, kw: Dict[str, Any]) -> Any:
    state.leader.begin_forward()
    state.follower.begin_forward()
    rsi = kw["request_state_indices"] if kw["request_state_indices"] is not None else state.leader.request_state_indices
    out = state.leader._rt.swap_in(kw["topk_indices"], kw["req_id_per_token"], rsi, kw["source_block_table"],
                                   kw["block_size"], kw["resident_block_table"], kw["resident_block_size"],
                                   kw["num_valid_rows"], kw["out_attention"], kw["out_valid_counts"], kw["prefetch"],
                                   kw["ignore_topk_ready"], kw["num_tokens"], kw["fused_gather"], kw["group_gather"],
                                   kw["stream"])
    state.follower.swap_in(num_tokens=2)
    return out


SWAP_IN_ARGS = [
    T("topk_indices", "dtype rank_down noncontig", optional=True,
      width=(torch.zeros((2, K + 1), dtype=torch.int32), (ValueError,))),
    T("req_id_per_token", "dtype rank_up rank_down", optional=True),
    T("request_state_indices", "dtype rank_up", optional=True, like=i32([1, 0])),
    T("block_table", "dtype rank_down", optional=True, like=i32([[1, 2], [3, 4]])),
    I("block_size", "neg 2**31 2**63", optional=True),
    T("resident_block_table", "dtype rank_down", optional=True, like=i32([[0, 0], [0, 0]])),
    I("resident_block_size", "neg 2**31", optional=True),
    T("num_valid_rows", "dtype", optional=True, like=i32([2]),
      two=(torch.zeros(2, dtype=torch.int32), (ValueError,))),
    B("prefetch"), B("return_valid_counts"), B("ignore_topk_ready"),
    T("attention_indices_out", "dtype short", role="out", optional=True),
    T("valid_counts_out", "dtype short", role="out", optional=True),
    I("num_tokens", "neg 2**63", optional=True, **{"not_the_rows": (3, (ValueError,))}),
    I("fused_gather", "neg 2**31", **{"two": (2, (ValueError,))}),
    I("group_gather", "neg 2**31", **{"two": (2, (ValueError,))}),
    S(),
]
# fused_gather and group_gather take bools (ints 0/1 too): bools are valid, so no "bool" case.
for _arg in SWAP_IN_ARGS:
    if _arg.name in ("fused_gather", "group_gather"):
        _arg.bad = tuple(label for label in _arg.bad if label != "bool")


def bind_source_fixture(state: RuntimeState, seed: int) -> Dict[str, Any]:
    return dict(kv_cache=state.hosts[0], registered_host_pool=None)


def bind_hot_fixture(state: RuntimeState, seed: int) -> Dict[str, Any]:
    return dict(raw_tensor=state.slab, byte_offset=0, block_stride=2 * HOT_BLOCK * W, num_blocks=state.blocks,
                block_size=HOT_BLOCK, block_table=state.table)


def runtime_entries() -> List[Entry]:
    ctor = lambda s, seed: dict(config=s.config, max_num_reqs=S_ROWS, device=None, dtype=None,  # noqa: E731
                                max_swap_rows=None, leader=None, copy_stream=None, topk_ready=None,
                                residency_hint=False)
    return [
        Entry("Runtime", RuntimeState, ctor, lambda s, kw: hisparse.Runtime(**kw).info(), lambda s, kw, r: [r],
              [O("config"), I("max_num_reqs", "neg zero 2**31 2**63"), I("max_swap_rows", "neg zero 2**31",
                                                                          optional=True),
               O("dtype", optional=True, **{"unknown": ("no-such-dtype", (TypeError,)),
                                            "broken_array": (BROKEN_ARRAY, (TypeError,))}),
               O("leader", optional=True), D("device"),
               I("copy_stream", "neg 2**64", optional=True),
               I("topk_ready", "neg 2**64", optional=True), B("residency_hint", optional=True)], []),
        Entry("Runtime.swap_in", RuntimeState, swap_in_fixture, swap_in_call, runtime_observe, SWAP_IN_ARGS,
              [("attention_indices_out", "topk_indices"), ("valid_counts_out", "req_id_per_token"),
               ("attention_indices_out", "valid_counts_out")]),
        Entry("_C.Runtime.swap_in", RuntimeState, c_swap_in_fixture, c_swap_in_call, runtime_observe,
              [T("topk_indices", "dtype rank_down", optional=True), T("req_id_per_token", "dtype", optional=True),
               I("block_size", "neg 2**63"), I("resident_block_size", "2**63"), B("prefetch"), B("ignore_topk_ready"),
               T("out_attention", "dtype short", role="out", optional=True),
               T("out_valid_counts", "dtype short", role="out", optional=True),
               I("num_tokens", "neg 2**63"), I("fused_gather", "neg 2**31", **{"two": (2, (ValueError,))}),
               I("group_gather", "2**31"), S()], [("out_attention", "topk_indices")]),
        Entry("Runtime.bind_source_cache", RuntimeState, bind_source_fixture,
              lambda s, kw: s.leader.bind_source_cache(kw["kv_cache"], registered_host_pool=kw["registered_host_pool"]),
              lambda s, kw, r: swap_in_call(s, swap_in_fixture(s, 5)) is not None and s.observe(),
              [T("kv_cache", "dtype rank_down width misaligned released", role="out"),
               T("registered_host_pool", "", optional=True, like=torch.zeros(64, dtype=torch.uint8),
                 elsewhere=(torch.zeros(64, dtype=torch.uint8), (ValueError,)))], []),
        Entry("Runtime.bind_hot_cache", RuntimeState, bind_hot_fixture,
              lambda s, kw: s.leader.bind_hot_cache(**kw),
              lambda s, kw, r: swap_in_call(s, swap_in_fixture(s, 6)) is not None and s.observe(),
              [T("raw_tensor", "noncontig released", role="out",
                 too_small=(torch.zeros(HOT_BLOCK * W, dtype=torch.uint8), (ValueError,))),
               I("byte_offset", "neg 2**62 2**63", **{"unaligned": (8, (ValueError,))}),
               I("block_stride", "neg zero 2**62 2**63", **{"not_rows": (W + 1, (ValueError,))}),
               I("num_blocks", "neg zero 2**62 2**63"), I("block_size", "neg zero 2**31 2**63"),
               T("block_table", "dtype rank_down noncontig")],
              [("block_table", "raw_tensor")]),
        Entry("Runtime.mirror_rows", RuntimeState, lambda s, seed: dict(src_rows=random_rows(seed, 3),
                                                                         slot_mapping=i32([4, -1, 70]), stream=None),
              lambda s, kw: s.leader.mirror_rows(**kw), lambda s, kw, r: s.observe(),
              [T("src_rows", "dtype rank_down width"), T("slot_mapping", "dtype_int16 short"), S()], []),
        Entry("Runtime.invalidate_sorted_slots", RuntimeState,
              lambda s, seed: dict(sorted_slots=i32([3, 9, 1]), state_indices=i32([1, 0]), stream=None),
              lambda s, kw: (s.leader.reset_hot_state(), swap_in_call(s, swap_in_fixture(s, 7)),
                             s.leader.invalidate_sorted_slots(**kw)),
              lambda s, kw, r: s.observe(),
              [T("sorted_slots", "dtype rank_up"), T("state_indices", "dtype rank_up"), S()], []),
        Entry("Runtime.reset_hot_state", RuntimeState, lambda s, seed: dict(stream=None),
              lambda s, kw: s.leader.reset_hot_state(**kw), lambda s, kw, r: s.observe(), [S()], []),
        Entry("Runtime.rebuild_residency_hint", RuntimeState, lambda s, seed: dict(stream=None),
              lambda s, kw: s.leader.rebuild_residency_hint(**kw), lambda s, kw, r: s.observe(), [S()], []),
        Entry("Runtime.copy_stats_async", RuntimeState, lambda s, seed: dict(stream=None),
              lambda s, kw: s.leader.copy_stats_async(**kw), lambda s, kw, r: [s.leader.stats(synchronize=False)],
              [S()], []),
        Entry("Runtime.gather_prefill_cache", RuntimeState,
              lambda s, seed: dict(plan=hisparse.build_staging_plan(i32([[1, 3], [2, 0]]), i32([8, 3]), HOT_BLOCK, 4),
                                   resident_cache=None, min_rows=None),
              lambda s, kw: s.leader.gather_prefill_cache(**kw), loaded_rows,
              [O("plan"), I("min_rows", "neg 2**63", optional=True)], []),
        Entry("_C.Runtime.bind_source_cache", RuntimeState,
              lambda s, seed: dict(host_cache=s.hosts[0], registered_host_pool=None),
              lambda s, kw: s.leader._rt.bind_source_cache(kw["host_cache"], kw["registered_host_pool"]),
              lambda s, kw, r: s.observe(),
              [T("host_cache", "dtype width released", role="out"),
               T("registered_host_pool", "", optional=True, like=torch.zeros(64, dtype=torch.uint8))], []),
        Entry("_C.Runtime.bind_hot_cache", RuntimeState, bind_hot_fixture,
              lambda s, kw: s.leader._rt.bind_hot_cache(kw["raw_tensor"], kw["byte_offset"], kw["block_stride"],
                                                        kw["num_blocks"], kw["block_size"], kw["block_table"]),
              lambda s, kw, r: s.observe(),
              [T("raw_tensor", "", role="out",
                 too_small=(torch.zeros(HOT_BLOCK * W, dtype=torch.uint8), (ValueError,))),
               I("byte_offset", "neg 2**63"), I("block_stride", "zero 2**63"),
               I("num_blocks", "zero 2**63"), I("block_size", "zero 2**63"), T("block_table", "dtype")], []),
        Entry("_C.Runtime.group_tensor", RuntimeState, lambda s, seed: dict(which=0),
              lambda s, kw: s.leader._rt.group_tensor(kw["which"]), lambda s, kw, r: [np.from_dlpack(r).copy()],
              [I("which", "neg 2**31", **{"past_the_tensors": (99, (ValueError,))})], []),
        Entry("_C.Runtime.mirror_rows", RuntimeState, lambda s, seed: dict(src_rows=random_rows(seed, 3),
                                                                            slot_mapping=i32([4, -1, 70]), stream=None),
              lambda s, kw: s.leader._rt.mirror_rows(kw["src_rows"], kw["slot_mapping"], _c_stream(kw)),
              lambda s, kw, r: s.observe(), [T("src_rows", "dtype width"), T("slot_mapping", "dtype_int16")] + [S()],
              []),
        Entry("paged_cache_view", RuntimeState,
              lambda s, seed: dict(raw_tensor=s.slab, dtype=torch.uint8, row_width=W, byte_offset=0,
                                   block_stride=2 * HOT_BLOCK * W, num_blocks=s.blocks, block_size=HOT_BLOCK),
              lambda s, kw: hisparse.runtime.paged_cache_view(**kw), lambda s, kw, r: [r.data_ptr() - s.slab.data_ptr(),
                                                                                        tuple(r.shape)],
              [T("raw_tensor", "noncontig", too_small=(torch.zeros(HOT_BLOCK * W, dtype=torch.uint8), (ValueError,))),
               O("dtype", **{"unknown": ("no-such-dtype", (TypeError,))}),
               I("row_width", "neg zero 2**62 2**63"), I("byte_offset", "neg 2**63"),
               I("block_stride", "neg zero 2**62 2**63"), I("num_blocks", "neg zero 2**62"),
               I("block_size", "neg zero 2**62")], []),
    ]


# ---------------------------------------------------------------------- host pools, layout, config, events
def pool_entries() -> List[Entry]:
    pool_kw = lambda s, seed: dict(size_bytes=1 << 16, populate_threads=None, register="never",  # noqa: E731
                                   device=None, huge_pages=True, check_memory=True, max_segment_bytes=None)

    def make_pool(kw: Dict[str, Any]) -> Any:
        pool = hisparse.HostPool(**kw)
        info = pool.info()
        pool.release()
        return [info["size_bytes"], info["mapped_bytes"], info["registered"]]

    def pool_state() -> Any:
        return {"pool": hisparse.HostPool(1 << 16, register="never")}

    def view_kw(s: Any, seed: int) -> Dict[str, Any]:
        return dict(dtype="int32", shape=(4, 4), offset=64, numpy=False)

    too_big = 2**62
    return [
        Entry("HostPool", dict, pool_kw, lambda s, kw: make_pool(kw), lambda s, kw, r: r,
              [I("size_bytes", "neg zero 2**64", **{"2**62": (too_big, (ValueError, MemoryError))}),
               I("populate_threads", "neg zero 2**31", optional=True),
               R("register", ["sometimes"]), I("device", "neg 2**31", optional=True),
               B("huge_pages"), B("check_memory"),
               I("max_segment_bytes", "neg zero 2**64", optional=True, **{"not_pages": (1000, (ValueError,))})], []),
        Entry("_C.HostPool", dict,
              lambda s, seed: dict(size_bytes=1 << 16, populate_threads=0, registration=_C.REGISTER_NEVER,
                                   device=-1, huge_pages=True, check_memory=True, max_segment_bytes=0),
              lambda s, kw: _C.HostPool(**kw).info()["size_bytes"], lambda s, kw, r: [r],
              [I("size_bytes", "neg zero 2**64"), I("populate_threads", "neg 2**31"),
               I("registration", "neg 2**31", **{"three": (3, (ValueError,))}), I("device", "2**31"),
               B("huge_pages"), B("check_memory"), I("max_segment_bytes", "neg 2**64")], []),
        Entry("HostPool.view", pool_state, view_kw, lambda s, kw: s["pool"].view(**kw).clone(),
              lambda s, kw, r: [as_numpy(r), s["pool"]._pool.live_views],
              [O("dtype", **{"unknown": ("no-such-dtype", (TypeError,)), "broken_array": (BROKEN_ARRAY, (TypeError,))}),
               Arg("shape", "object", (), True, extra={"too_big": ((1 << 20,), (ValueError,)),
                                                      "negative": ((-1,), (ValueError,)),
                                                      "float": ((2.0,), (TypeError,)), "str": ("4", (TypeError,))}),
               I("offset", "neg 2**63", **{"unaligned": (2, (ValueError,)), "past_the_end": (1 << 20, (ValueError,))}),
               B("numpy")], []),
        Entry("_C.HostPool.view_bytes", pool_state, lambda s, seed: dict(offset=0, nbytes=16),
              lambda s, kw: np.array(s["pool"]._pool.view_bytes(kw["offset"], kw["nbytes"])),
              lambda s, kw, r: [r, s["pool"]._pool.live_views],
              [I("offset", "neg 2**64", **{"past": (1 << 20, (ValueError,))}),
               I("nbytes", "neg 2**64", **{"past": (1 << 20, (ValueError,))})], []),
        Entry("HostPool.release", pool_state, lambda s, seed: dict(force=False),
              lambda s, kw: (s["pool"].release(**kw), s.update(pool=hisparse.HostPool(1 << 16, register="never"))),
              lambda s, kw, r: [s["pool"].released], [B("force")], []),
        Entry("HostPool.shared", dict,
              lambda s, seed: dict(size_bytes=1 << 16, pool_id=hisparse.shared_pool_id(), rank=0, ranks=1,
                                   register="never"),
              lambda s, kw: hisparse.HostPool.shared(**kw).info()["ranks"], lambda s, kw, r: [r],
              [I("size_bytes", "neg zero 2**64"), O("pool_id", optional=True, **{"short": (b"abc", (ValueError,))}),
               I("rank", "neg 2**31", optional=True, **{"not_a_rank": (1, (ValueError,))}),
               I("ranks", "neg zero 2**31", optional=True), R("register", ["sometimes"])], []),
        Entry("plan_host_layout", dict,
              lambda s, seed: dict(page_size_bytes=4096, block_size=64, max_model_len=1024, host_budget_bytes=1 << 24),
              lambda s, kw: hisparse.plan_host_layout(**kw), lambda s, kw, r: list(r),
              [I("page_size_bytes", "neg zero 2**64", **{"not_16": (100, (ValueError,))}),
               I("block_size", "neg zero 2**63"), I("max_model_len", "neg zero 2**63"),
               I("host_budget_bytes", "neg 2**64", **{"too_small": (4096, (ValueError,))})], []),
        Entry("_C.plan_host_layout", dict,
              lambda s, seed: dict(page_size_bytes=4096, block_size=64, max_model_len=1024, host_budget_bytes=1 << 24),
              lambda s, kw: _C.plan_host_layout(**kw), lambda s, kw, r: list(r),
              [I("page_size_bytes", "neg 2**64"), I("block_size", "zero 2**63"), I("max_model_len", "neg 2**63"),
               I("host_budget_bytes", "neg 2**64")], []),
        Entry("check_host_memory", dict, lambda s, seed: dict(pool_bytes=1 << 20),
              lambda s, kw: hisparse.check_host_memory(**kw), lambda s, kw, r: [r],
              [I("pool_bytes", "neg 2**64", **{"2**62": (2**62, (ValueError,))})], []),
        Entry("_C.check_host_memory", dict, lambda s, seed: dict(pool_bytes=1 << 20),
              lambda s, kw: _C.check_host_memory(**kw), lambda s, kw, r: [r],
              [I("pool_bytes", "neg 2**64", **{"2**63": (2**63, (ValueError,))})], []),
        Entry("Config", dict, lambda s, seed: dict(top_k=4, device_buffer_size=8, row_bytes=32),
              lambda s, kw: hisparse.Config(**kw), lambda s, kw, r: [repr(r)],
              [I("top_k", "neg zero 2**31 2**63"), I("device_buffer_size", "neg zero 2**31",
                                                     **{"above_int16": (40000, (ValueError,))}),
               I("row_bytes", "neg zero 2**31", optional=True, **{"not_16": (20, (ValueError,))})], []),
        Entry("Config.check_device", dict, lambda s, seed: dict(device=None),
              lambda s, kw: hisparse.Config(row_bytes=656).check_device(**kw), lambda s, kw, r: [r],
              [D("device")], [], valid_call=cuda_present()),
        Entry("_C.validate_config", dict,
              lambda s, seed: dict(top_k=4, device_buffer_size=8, max_union_rows=4, num_speculative_tokens=0,
                                   row_bytes=32, block_size=4, hot_block_size=4, eager_host_mirror=False, device=-1),
              lambda s, kw: _C.validate_config(**kw), lambda s, kw, r: [r],
              [I("top_k", "neg zero 2**31"), I("device_buffer_size", "zero 2**31"), I("max_union_rows", "neg 2**31"),
               I("num_speculative_tokens", "neg 2**31"), I("row_bytes", "zero 2**31"), I("block_size", "zero 2**31"),
               I("hot_block_size", "zero 2**31"), B("eager_host_mirror"), I("device", "2**31")], []),
        Entry("_C.default_max_union_rows", dict, lambda s, seed: dict(top_k=4, num_speculative_tokens=1),
              lambda s, kw: _C.default_max_union_rows(**kw), lambda s, kw, r: [r],
              [I("top_k", "neg zero 2**31"), I("num_speculative_tokens", "neg 2**31")], []),
        Entry("_C.default_max_swap_rows", dict, lambda s, seed: dict(max_num_reqs=4, num_speculative_tokens=1),
              lambda s, kw: _C.default_max_swap_rows(**kw), lambda s, kw, r: [r],
              [I("max_num_reqs", "neg zero 2**31"), I("num_speculative_tokens", "neg 2**31")], []),
        Entry("Runtime.default_residency_hint", dict,
              lambda s, seed: dict(config=hisparse.Config(top_k=4, device_buffer_size=8, row_bytes=32),
                                   max_num_reqs=4, device=None),
              lambda s, kw: hisparse.Runtime.default_residency_hint(**kw), lambda s, kw, r: [r],
              [O("config"), I("max_num_reqs", "neg zero 2**31"), D("device")], []),
        Entry("_C.runtime_default_residency_hint", dict,
              lambda s, seed: dict(top_k=4, device_buffer_size=8, max_union_rows=4, num_speculative_tokens=0,
                                   row_bytes=32, block_size=4, hot_block_size=4, eager_host_mirror=False,
                                   max_num_reqs=4, device_type=_C.DEVICE_CPU, device_index=0),
              lambda s, kw: _C.runtime_default_residency_hint(**kw), lambda s, kw, r: [r],
              [I("top_k", "neg zero 2**31"), I("device_buffer_size", "zero 2**31"), I("max_union_rows", "neg 2**31"),
               I("num_speculative_tokens", "neg 2**31"), I("row_bytes", "zero 2**31"), I("block_size", "zero 2**31"),
               I("hot_block_size", "zero 2**31"), B("eager_host_mirror"), I("max_num_reqs", "neg zero 2**31"),
               I("device_type", "neg 2**31", **{"seven": (7, (ValueError,))}), I("device_index", "2**31")], []),
        Entry("_C.resolver_shared_memory_bytes", dict, lambda s, seed: dict(device_buffer_size=64, max_union_rows=8),
              lambda s, kw: _C.resolver_shared_memory_bytes(**kw), lambda s, kw, r: [r],
              [I("device_buffer_size", "neg zero 2**31"), I("max_union_rows", "neg zero 2**31")], []),
        Entry("_C.cuda_device_properties", dict, lambda s, seed: dict(device=0),
              lambda s, kw: _C.cuda_device_properties(**kw), lambda s, kw, r: [r],
              [I("device", "neg 2**31", **{"absent": (1 << 20, (ValueError, RuntimeError))})], [],
              valid_call=cuda_present()),
        Entry("_C.gather_variant_name", dict, lambda s, seed: dict(variant=0),
              lambda s, kw: _C.gather_variant_name(**kw), lambda s, kw, r: [r], [I("variant", "2**31 2**63")], []),
        Entry("_C.supports_shared_host_pool", dict, lambda s, seed: dict(device_type=_C.DEVICE_CPU),
              lambda s, kw: _C.supports_shared_host_pool(**kw), lambda s, kw, r: [r],
              [I("device_type", "neg 2**31", **{"seven": (7, (ValueError,))})], []),
        Entry("use_shared_host_pool", dict, lambda s, seed: dict(tensor_parallel_size=2, device="cpu"),
              lambda s, kw: hisparse.use_shared_host_pool(**kw), lambda s, kw, r: [r],
              [I("tensor_parallel_size", "neg zero 2**63", optional=True),
               I("pipeline_parallel_size", "neg 2**63", optional=True),
               D("device")], []),
        Entry("IpcEvent", dict, lambda s, seed: dict(device="cpu"), lambda s, kw: hisparse.IpcEvent(**kw).device,
              lambda s, kw, r: [r], [D("device")], []),
        Entry("IpcEvent.from_bytes", dict, lambda s, seed: dict(handle=b"\0" * _C.IPC_EVENT_HANDLE_BYTES, device=None),
              lambda s, kw: hisparse.IpcEvent.from_bytes(**kw), lambda s, kw, r: [r],
              [O("handle", **{"short": (b"abc", (ValueError,)), "garbage": (b"\1" * _C.IPC_EVENT_HANDLE_BYTES,
                                                                             (ValueError, RuntimeError))})], [],
              valid_call=False),
        Entry("IpcEvent.record", lambda: {"event": hisparse.IpcEvent("cpu")}, lambda s, seed: dict(stream=None),
              lambda s, kw: s["event"].record(**kw), lambda s, kw, r: [r], [S()], []),
        Entry("IpcEvent.wait", lambda: {"event": hisparse.IpcEvent("cpu")}, lambda s, seed: dict(stream=None),
              lambda s, kw: s["event"].wait(**kw), lambda s, kw, r: [r], [S()], []),
        Entry("_C.IpcEvent", dict, lambda s, seed: dict(device_type=_C.DEVICE_CPU, device_index=0),
              lambda s, kw: _C.IpcEvent(**kw).info()["device_type"], lambda s, kw, r: [r],
              [I("device_type", "neg 2**31"), I("device_index", "2**31")], []),
        Entry("_C.IpcEvent.open", dict, lambda s, seed: dict(handle=_C.IpcEvent(_C.DEVICE_CPU, 0).export_handle(),
                                                             device_index=-1),
              lambda s, kw: _C.IpcEvent.open(**kw), lambda s, kw, r: [r] * 0,
              [O("handle", **{"short": (b"ab", (ValueError,))}), I("device_index", "2**31")], [],
              valid_call=False),
    ]


# ---------------------------------------------------------------------- prefill staging
def plan_table(seed: int) -> Dict[str, Any]:
    return dict(block_table=i32([[1, 3, 5], [2, 0, 4]]), seq_lens=i32([9, 5]))


def plan_observe(state: Any, kw: Dict[str, Any], plan: Any) -> List[Any]:
    return [as_numpy(plan.block_table), as_numpy(plan.row_ids), as_numpy(plan.miss_mask)]


def plan_state() -> Dict[str, Any]:
    return {"plan": hisparse.build_staging_plan(i32([[1, 3, 5], [2, 0, 4]]), i32([9, 5]), HOT_BLOCK, 4)}


def stored_plan_observe(state: Any, kw: Dict[str, Any], result: Any) -> List[Any]:
    return plan_observe(state, kw, state["plan"]) + [as_numpy(result)]


def loaded_rows(state: Any, kw: Dict[str, Any], staged: Any) -> List[Any]:
    """The staged rows a gather loads (the others hold unspecified bytes)."""
    plan = kw["plan"]
    loaded = (plan.row_ids.reshape(-1) >= 0).numpy() if hasattr(plan.row_ids, "numpy") else plan.row_ids >= 0
    return [as_numpy(staged).reshape(-1, staged.shape[-1])[loaded]]


def prefill_fixture(state: Any, seed: int) -> Dict[str, Any]:
    return dict(plan=state["plan"], host_cache=random_rows(seed, 32), resident_cache=None,
                min_rows=hisparse.staging.MIN_STAGED_PREFILL_ROWS, stream=None)


def resident_fixture(state: Any, seed: int) -> Dict[str, Any]:
    return dict(source=torch.from_numpy(rng(seed).integers(0, 256, (3, HOT_BLOCK, W), dtype=np.uint8)),
                destination=torch.zeros((5, W), dtype=torch.uint8), row_ids=i32([0, 11, -1, 40, 5]), stream=None)


def remap_c_fixture(state: Any, seed: int) -> Dict[str, Any]:
    table = i32([[4, 2], [0, 4]])
    nbytes = _C.staging_remap_workspace_bytes(_C.DEVICE_CPU, 0, 4, HOT_BLOCK)
    return dict(block_table=table, block_size=HOT_BLOCK, out_block_table=torch.zeros((2, 2), dtype=torch.int32),
                out_row_ids=torch.zeros((1, 5 * HOT_BLOCK), dtype=torch.int32),
                workspace=torch.zeros(nbytes, dtype=torch.uint8), stream=None)


def staging_entries() -> List[Entry]:
    staging = hisparse.staging
    plan_kw = lambda s, seed: dict(plan_table(seed), block_size=HOT_BLOCK, staging_block_capacity=4,  # noqa: E731
                                   stream=None)
    c_plan = lambda s, seed: dict(device_type=_C.DEVICE_CPU, device_index=0, num_rows=2, num_cols=3,  # noqa: E731
                                  block_size=HOT_BLOCK, staging_block_capacity=4, storage=None)
    return [
        Entry("build_staging_plan", dict, plan_kw, lambda s, kw: hisparse.build_staging_plan(**kw), plan_observe,
              [T("block_table", "dtype rank_down noncontig huge_stride"), T("seq_lens", "dtype rank_up short"),
               I("block_size", "neg zero 2**31 2**63"), I("staging_block_capacity", "neg 2**31 2**63"), S()], []),
        Entry("StagingPlan", dict, c_plan, lambda s, kw: repr(hisparse.StagingPlan(**kw)), lambda s, kw, r: [r],
              [I("device_type", "neg 2**31"), I("device_index", "2**31"), I("num_rows", "neg 2**31 2**63"),
               I("num_cols", "neg 2**31 2**63"), I("block_size", "neg zero 2**31"),
               I("staging_block_capacity", "neg 2**31 2**63"),
               T("storage", "dtype", role="out", optional=True, like=torch.zeros(4096, dtype=torch.uint8),
                 too_small=(torch.zeros(64, dtype=torch.uint8), (ValueError,)))], []),
        Entry("StagingPlan.storage_bytes", dict, lambda s, seed: {k: v for k, v in c_plan(s, seed).items()
                                                                   if k != "storage"},
              lambda s, kw: hisparse.StagingPlan.storage_bytes(**kw), lambda s, kw, r: [r],
              [I("num_rows", "neg 2**31 2**63"), I("block_size", "neg zero"), I("staging_block_capacity", "neg")], []),
        Entry("StagingPlan.build", plan_state, lambda s, seed: dict(plan_table(seed), stream=None),
              lambda s, kw: s["plan"].build(**kw), stored_plan_observe,
              [T("block_table", "dtype rank_down", **{"other_shape": (i32([[1, 2]]), (ValueError,))}),
               T("seq_lens", "dtype short"), S()], []),
        Entry("StagingPlan.ensure_gpu_sources", plan_state,
              lambda s, seed: dict(resident_state_rows=i32([[0, 1, 0, 0], [0, 0, 2, 0]]), state_indices=i32([0, 1]),
                                   resident_block_size=HOT_BLOCK, stream=None),
              lambda s, kw: (s["plan"].build(**plan_table(0)), s["plan"].ensure_gpu_sources(**kw)),
              lambda s, kw, r: plan_observe(s, kw, s["plan"]) + [as_numpy(s["plan"].gpu_row_ids)],
              [T("resident_state_rows", "dtype rank_down"), T("state_indices", "dtype rank_up"),
               I("resident_block_size", "2**63"), S()], []),
        Entry("staging.gather_prefill_cache", plan_state, prefill_fixture,
              lambda s, kw: staging.gather_prefill_cache(**kw), loaded_rows,
              [O("plan"), T("host_cache", "rank_down width released"),
               T("resident_cache", "", optional=True, like=torch.zeros((3, HOT_BLOCK, W), dtype=torch.uint8)),
               I("min_rows", "neg 2**31 2**63"), S()], []),
        Entry("_C.gather_prefill_cache", plan_state,
              lambda s, seed: dict(prefill_fixture(s, seed), staged=torch.zeros((5, HOT_BLOCK, W), dtype=torch.uint8)),
              lambda s, kw: _C.gather_prefill_cache(kw["plan"], kw["host_cache"], kw["resident_cache"], kw["staged"],
                                                    _c_stream(kw)),
              outputs("staged"),
              [O("plan"), T("host_cache", "dtype width"),
               T("resident_cache", "redtype", optional=True, like=torch.zeros((3, HOT_BLOCK, W), dtype=torch.uint8)),
               T("staged", "dtype short", role="out")] + [S()], [("staged", "host_cache")]),
        Entry("staging.gather_resident_rows", dict, resident_fixture,
              lambda s, kw: staging.gather_resident_rows(**kw), outputs("destination"),
              [T("source", "rank_down width misaligned released"), T("destination", "width short", role="out"),
               T("row_ids", "dtype_int16 short"), S()],
              [("destination", "source"), ("destination", "row_ids")]),
        Entry("_C.gather_resident_rows", dict, resident_fixture,
              lambda s, kw: _C.gather_resident_rows(kw["source"], kw["destination"], kw["row_ids"], _c_stream(kw)),
              outputs("destination"),
              [T("source", "rank_down"), T("destination", "short", role="out"), T("row_ids", "dtype_int16")] + [S()],
              [("destination", "row_ids")]),
        Entry("staging.staging_remap", dict, lambda s, seed: dict(block_table=i32([[4, 2], [0, 4]]),
                                                                  block_size=HOT_BLOCK, stream=None),
              lambda s, kw: staging.staging_remap(**kw), lambda s, kw, r: [as_numpy(x) for x in r],
              [T("block_table", "dtype noncontig"), I("block_size", "neg zero 2**31 2**63"), S()], []),
        Entry("_C.staging_remap", dict, remap_c_fixture,
              lambda s, kw: _C.staging_remap(kw["block_table"], kw["block_size"], kw["out_block_table"],
                                             kw["out_row_ids"], kw["workspace"], _c_stream(kw)),
              outputs("out_block_table", "out_row_ids"),
              [T("block_table", "dtype noncontig"), I("block_size", "neg zero 2**31"),
               T("out_block_table", "dtype short", role="out"), T("out_row_ids", "dtype short", role="out"),
               T("workspace", "dtype short", role="out")] + [S()],
              [("out_block_table", "block_table"), ("out_row_ids", "workspace"), ("workspace", "block_table")]),
        Entry("_C.staging_remap_workspace_bytes", dict,
              lambda s, seed: dict(device_type=_C.DEVICE_CPU, device_index=0, num_entries=4, block_size=HOT_BLOCK),
              lambda s, kw: _C.staging_remap_workspace_bytes(**kw), lambda s, kw, r: [r],
              [I("device_type", "neg 2**31"), I("device_index", "2**31"), I("num_entries", "neg 2**31 2**63"),
               I("block_size", "neg zero 2**31")], []),
    ]


# ---------------------------------------------------------------------- slot invalidator, cache handles
class HandleState(RuntimeState):
    def __init__(self) -> None:
        super().__init__()
        self.leader.unbind_cache()
        self.follower.unbind_cache()
        self.handle = hisparse.CacheHandle(self.leader)
        self.follower_handle = hisparse.CacheHandle(self.follower)
        self.handle.add_follower(self.follower_handle)
        self.resident = torch.zeros(self.blocks * HOT_BLOCK * W, dtype=torch.uint8)
        for i, runtime in enumerate((self.leader, self.follower)):
            runtime.bind_source_cache(self.hosts[i])
            runtime.bind_hot_cache(self.slab, byte_offset=i * HOT_BLOCK * W, block_stride=2 * HOT_BLOCK * W,
                                   num_blocks=self.blocks, block_size=HOT_BLOCK, block_table=self.table)
        self.bind()

    def bind(self) -> None:
        for h in (self.handle, self.follower_handle):
            h.bind_cache(self.resident, byte_offset=0, block_stride=HOT_BLOCK * W, num_blocks=self.blocks,
                         block_size=HOT_BLOCK, block_table=torch.zeros((S_ROWS, 2), dtype=torch.int32),
                         slot_mapping=i32([0, 1]), mirror_slot_mapping=i32([3, 4]))


def batch() -> Any:
    return hisparse.BatchInfo(num_actual_tokens=2, num_decode_tokens=2, num_reqs=2, max_query_len=1)


def handle_swap_fixture(state: HandleState, seed: int) -> Dict[str, Any]:
    g = rng(seed)
    return dict(topk_indices=torch.from_numpy(g.integers(-1, 24, (2, K), dtype=np.int32)),
                req_id_per_token=i32([0, 1]), block_table=None,
                block_size=None, num_valid_rows=None, request_state_indices=None, return_valid_counts=False,
                attention_indices_out=None, valid_counts_out=None, fused_gather=False, group_gather=False,
                stream=None)


def handle_swap_call(state: HandleState, kw: Dict[str, Any]) -> Any:
    state.handle.prepare_group_for_batch(batch())
    out = state.handle.swap_in(**kw)
    state.follower_handle.swap_in(num_tokens=kw["topk_indices"].shape[0])
    return out


def invalidator_state() -> Dict[str, Any]:
    state = RuntimeState()
    return {"runtime": state, "invalidator": hisparse.SlotInvalidator(i32([1, 0]))}


def invalidator_fixture(state: Any, seed: int) -> Dict[str, Any]:
    return dict(leaders=[state["runtime"].leader], written_slots=i32([3, 9]), req_id_per_token=i32([0, 1]),
                stream=None)


def invalidator_call(state: Any, kw: Dict[str, Any]) -> Any:
    state["runtime"].leader.reset_hot_state()
    swap_in_call(state["runtime"], swap_in_fixture(state["runtime"], 3))
    return state["invalidator"](**kw)


def misc_entries() -> List[Entry]:
    return [
        Entry("SlotInvalidator", dict, lambda s, seed: dict(request_state_indices=i32([1, 0])),
              lambda s, kw: type(hisparse.SlotInvalidator(**kw)).__name__, lambda s, kw, r: [r],
              [O("request_state_indices", **{"numpy": (np.zeros(2, np.int32), (TypeError,))})], []),
        Entry("SlotInvalidator.__call__", invalidator_state, invalidator_fixture, invalidator_call,
              lambda s, kw, r: s["runtime"].observe(),
              [O("leaders", **{"not_runtimes": ([4], (TypeError,)), "nested": ([[1]], (TypeError,))}),
               T("written_slots", "dtype rank_up"), T("req_id_per_token", "dtype rank_up"), S()], []),
        Entry("_C.SlotInvalidator.run", invalidator_state, invalidator_fixture,
              lambda s, kw: (s["runtime"].leader.reset_hot_state(),
                             swap_in_call(s["runtime"], swap_in_fixture(s["runtime"], 3)),
                             s["invalidator"]._inv.run([r._rt for r in kw["leaders"]],
                                                       s["invalidator"].request_state_indices, kw["req_id_per_token"],
                                                       kw["written_slots"], _c_stream(kw))),
              lambda s, kw, r: s["runtime"].observe(),
              [T("written_slots", "dtype"), T("req_id_per_token", "dtype")] + [S()], []),
        Entry("_C.SlotInvalidator", dict, lambda s, seed: dict(device_type=_C.DEVICE_CPU, device_index=0),
              lambda s, kw: type(_C.SlotInvalidator(**kw)).__name__, lambda s, kw, r: [r],
              [I("device_type", "neg 2**31", **{"nine": (9, (ValueError,))}), I("device_index", "2**31")], []),
        Entry("BatchInfo", dict, lambda s, seed: dict(num_actual_tokens=2, num_decode_tokens=2, num_reqs=2,
                                                      max_query_len=1),
              lambda s, kw: hisparse.BatchInfo(**kw), lambda s, kw, r: [r],
              [I("num_actual_tokens", "neg"), I("num_decode_tokens", "neg"), I("num_reqs", "neg"),
               I("max_query_len", "neg")], []),
        Entry("CacheHandle", RuntimeState, lambda s, seed: dict(runtime=s.leader),
              lambda s, kw: type(hisparse.CacheHandle(**kw)).__name__, lambda s, kw, r: [r], [O("runtime")], []),
        Entry("CacheHandle.add_follower", HandleState, lambda s, seed: dict(handle=s.follower_handle),
              lambda s, kw: s.handle.add_follower(**kw), lambda s, kw, r: [len(s.handle.index_group_caches)],
              [O("handle", **{"itself": (None, (TypeError,))})], []),
        Entry("CacheHandle.bind_cache", HandleState,
              lambda s, seed: dict(raw_tensor=s.resident, byte_offset=0, block_stride=HOT_BLOCK * W,
                                   num_blocks=s.blocks, block_size=HOT_BLOCK,
                                   block_table=torch.zeros((S_ROWS, 2), dtype=torch.int32),
                                   slot_mapping=i32([0, 1]), mirror_slot_mapping=i32([3, 4])),
              lambda s, kw: s.handle.bind_cache(**kw), lambda s, kw, r: [tuple(s.handle.view.shape)],
              [O("raw_tensor", **{"numpy": (np.zeros(64, np.uint8), (TypeError,))}),
               I("byte_offset", "neg 2**63"), I("block_stride", "neg zero 2**63"),
               I("num_blocks", "neg zero 2**62"), I("block_size", "neg zero 2**62")], []),
        Entry("CacheHandle.prepare_group_for_batch", HandleState, lambda s, seed: dict(batch=batch()),
              lambda s, kw: s.handle.prepare_group_for_batch(**kw),
              lambda s, kw, r: [s.handle.decode_batch, s.handle.num_actual_tokens],
              [O("batch", optional=True)], []),
        Entry("CacheHandle.write_target", HandleState, lambda s, seed: dict(num_input_rows=2, num_slot_rows=2),
              lambda s, kw: (s.handle.prepare_group_for_batch(batch()), s.handle.write_target(**kw))[1][2],
              lambda s, kw, r: [r], [I("num_input_rows", "neg"), I("num_slot_rows", "neg")], []),
        Entry("CacheHandle.finish_kv_update", HandleState,
              lambda s, seed: dict(written_rows=random_rows(seed, 2), host_slot_mapping=i32([5, 6]),
                                   req_id_per_token=i32([0, 1]), stream=None),
              lambda s, kw: (s.handle.prepare_group_for_batch(hisparse.BatchInfo(2, 0, 1, 2)),
                             s.handle.write_target(2, 2), s.handle.finish_kv_update(**kw)),
              lambda s, kw, r: s.observe(),
              [T("written_rows", "dtype width", optional=True), T("host_slot_mapping", "dtype_int16", optional=True),
               T("req_id_per_token", "dtype", optional=True), S()], []),
        Entry("CacheHandle.swap_in", HandleState, handle_swap_fixture, handle_swap_call, runtime_observe,
              [T("req_id_per_token", "dtype rank_up rank_down"), T("topk_indices", "dtype rank_down rank_up"),
               T("block_table", "dtype", optional=True, like=i32([[1, 2], [3, 4]])),
               Arg("fused_gather", "bool", ("str", "float", "list", "none")), B("return_valid_counts"), S()], []),
    ]


def c_runtime_fixture(state: Any, seed: int) -> Dict[str, Any]:
    return dict(top_k=K, device_buffer_size=H, max_union_rows=H, num_speculative_tokens=0, row_bytes=W,
                block_size=HOT_BLOCK, hot_block_size=HOT_BLOCK, eager_host_mirror=False, device_type=_C.DEVICE_CPU,
                device_index=0, max_num_reqs=S_ROWS, max_swap_rows=0, kv_dtype=0, leader=None, copy_stream=0,
                topk_ready_event=0, residency_hint=_C.RESIDENCY_HINT_OFF)


def more_entries() -> List[Entry]:
    """The entries of what the lists above leave out: the _C twins of wrapped methods, and Runtime.stats."""
    c_pool = lambda: {"pool": _C.HostPool(1 << 16, 0, _C.REGISTER_NEVER)}  # noqa: E731
    c_event = lambda: {"event": _C.IpcEvent(_C.DEVICE_CPU, 0)}  # noqa: E731
    return [
        Entry("Runtime.stats", RuntimeState, lambda s, seed: dict(synchronize=True, stream=None),
              lambda s, kw: s.leader.stats(**kw), lambda s, kw, r: [r], [B("synchronize"), S()], []),
        Entry("_C.Runtime", dict, c_runtime_fixture, lambda s, kw: _C.Runtime(**kw).info(), lambda s, kw, r: [r],
              [I("top_k", "neg zero 2**31"), I("device_buffer_size", "neg zero 2**31"), I("max_union_rows", "2**31"),
               I("num_speculative_tokens", "neg 2**31"), I("row_bytes", "neg zero 2**31"),
               I("block_size", "neg zero 2**31"), I("hot_block_size", "neg zero 2**31"), B("eager_host_mirror"),
               I("device_type", "neg 2**31"), I("device_index", "2**31"), I("max_num_reqs", "neg zero 2**31"),
               I("max_swap_rows", "neg 2**31"),
               I("kv_dtype", "2**31", **{"past": (99, (TypeError,)), "negative": (-1, (TypeError,))}),
               O("leader", optional=True), S("copy_stream"), S("topk_ready_event"),
               I("residency_hint", "neg 2**31", past=(3, (ValueError,)))], []),
        Entry("_C.Runtime.reset_hot_state", RuntimeState, lambda s, seed: dict(stream=None),
              lambda s, kw: s.leader._rt.reset_hot_state(kw["stream"]), lambda s, kw, r: s.observe(), [S()], []),
        Entry("_C.Runtime.rebuild_residency_hint", RuntimeState, lambda s, seed: dict(stream=None),
              lambda s, kw: s.leader._rt.rebuild_residency_hint(kw["stream"]), lambda s, kw, r: s.observe(),
              [S()], []),
        Entry("_C.Runtime.invalidate_sorted_slots", RuntimeState,
              lambda s, seed: dict(sorted_slots=i32([3, 9, 1]), state_indices=i32([1, 0]), stream=None),
              lambda s, kw: (s.leader.reset_hot_state(), swap_in_call(s, swap_in_fixture(s, 7)),
                             s.leader._rt.invalidate_sorted_slots(kw["sorted_slots"], kw["state_indices"],
                                                                  kw["stream"])),
              lambda s, kw, r: s.observe(), [T("sorted_slots", "dtype rank_up"), T("state_indices", "dtype"), S()],
              []),
        Entry("_C.Runtime.copy_stats_async", RuntimeState, lambda s, seed: dict(stream=None),
              lambda s, kw: s.leader._rt.copy_stats_async(kw["stream"]), lambda s, kw, r: [s.leader._rt.stats()],
              [S()], []),
        Entry("_C.paged_cache_view", RuntimeState,
              lambda s, seed: dict(raw_tensor=s.slab, dtype=0, row_width=W, byte_offset=0,
                                   block_stride=2 * HOT_BLOCK * W, num_blocks=s.blocks, block_size=HOT_BLOCK),
              lambda s, kw: _C.paged_cache_view(**kw), lambda s, kw, r: [r[0] - s.slab.data_ptr(), r[1], r[2]],
              [T("raw_tensor", "noncontig list none str int sparse meta", typed=False),
               I("dtype", "2**31", **{"past": (99, (TypeError,)), "negative": (-1, (TypeError,))}),
               I("row_width", "zero 2**62 2**63"), I("byte_offset", "neg 2**63"), I("block_stride", "zero 2**63"),
               I("num_blocks", "zero 2**62"), I("block_size", "zero 2**62")], []),
        Entry("_C.HostPool.release", c_pool, lambda s, seed: dict(force=False),
              lambda s, kw: (s["pool"].release(kw["force"]), s.update(pool=_C.HostPool(1 << 16, 0, 2))),
              lambda s, kw, r: [s["pool"].info()["released"]], [B("force")], []),
        Entry("_C.HostPool.shared", dict,
              lambda s, seed: dict(id=_C.shared_pool_id(), rank=0, nranks=1, size_bytes=1 << 16,
                                   registration=_C.REGISTER_NEVER),
              lambda s, kw: _C.HostPool.shared(**kw).info()["ranks"], lambda s, kw, r: [r],
              [O("id", **{"short": (b"abc", (ValueError,))}), I("rank", "neg 2**31"), I("nranks", "neg zero 2**31"),
               I("size_bytes", "neg zero 2**64"), I("registration", "neg 2**31")], []),
        Entry("_C.IpcEvent.record", c_event, lambda s, seed: dict(stream=None),
              lambda s, kw: s["event"].record(kw["stream"]), lambda s, kw, r: [r], [S()], []),
        Entry("_C.IpcEvent.wait", c_event, lambda s, seed: dict(stream=None),
              lambda s, kw: s["event"].wait(kw["stream"]), lambda s, kw, r: [r], [S()], []),
    ]
