"""Functional kernels of hisparse.

Every op takes preallocated tensors (torch or NumPy), all on one device:
host tensors run the CPU reference backend, CUDA tensors the CUDA backend on
torch's current stream of their device unless ``stream`` is given. Ops never
allocate, never synchronise with the host, and can be captured in CUDA graphs.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from . import _C, _args
from ._tensors import torch_or_none

__all__ = [
    "GATHER_SCHEDULES",
    "GATHER_VARIANTS",
    "copy_bytes",
    "gather_compact",
    "gather_compact_group",
    "MAX_GATHER_GROUP_PIECES",
    "gather_plan",
    "invalidate_written_slots",
    "mirror_rows",
    "read_rows",
    "resolve_residency",
    "RESOLVER_HANDOFF_WORDS",
    "resolver_workspace_bytes",
    "swap_blocks_batch",
    "table_pointers",
    "update_residency",
    "WARM_PAGE_BYTES",
    "warm_host_pages",
    "write_rows",
]

# Schedules of the CUDA gather (hs_gather_variant_t), all byte-identical;
# "auto" is the library's choice. The CPU backend runs one reference loop.
GATHER_VARIANTS = tuple(_C.gather_variant_name(v) for v in range(_C.NUM_GATHER_VARIANTS))

# Most hot caches (pieces) one gather_compact_group call fills.
MAX_GATHER_GROUP_PIECES: int = _C.MAX_GATHER_GROUP_PIECES

# The page size of the GPU's mappings of host memory on Hopper: what
# warm_host_pages reads one word of by default.
WARM_PAGE_BYTES: int = 65536

# int32 words per state row of resolve_residency's ``handoff`` array.
RESOLVER_HANDOFF_WORDS: int = _C.RESOLVER_HANDOFF_WORDS


def copy_bytes(dst: Any, src: Any, *, stream: Any = None) -> None:
    """Copy ``src`` into ``dst`` byte for byte through a kernel of dst's device.

    On CUDA, ``src`` may be registered/pinned host memory (read zero-copy) or
    memory of the same device. Both must be contiguous and equally sized.
    """
    _C.copy_bytes(_args.tensor("dst", dst), _args.tensor("src", src), _args.stream(stream, dst, src))


def resolve_residency(
    topk_indices: Any,
    req_id_per_token: Any,
    request_state_indices: Any,
    device_global_indices: Any,
    lru_slots: Any,
    hot_block_table: Any,
    *,
    hot_block_size: int,
    attention_block_stride: int,
    host_rows: int,
    max_union_rows: int,
    out_attention: Any,
    out_hot_rows: Any,
    out_resolved: Any,
    out_miss_mask: Any,
    out_valid_counts: Any,
    out_swap_host_rows: Any,
    out_swap_device_rows: Any,
    out_swap_counts: Any,
    source_block_table: Optional[Any] = None,
    block_size: int = 0,
    resident_block_table: Optional[Any] = None,
    resident_block_size: int = 0,
    num_valid_rows: Optional[Any] = None,
    stats: Optional[Any] = None,
    gather_host_cache: Optional[Any] = None,
    gather_hot_cache: Optional[Any] = None,
    gather_hot_block_stride: int = 0,
    workspace: Optional[Any] = None,
    gather_schedule: str = "auto",
    handoff: Optional[Any] = None,
    residency_hint: Optional[Any] = None,
    stream: Any = None,
) -> None:
    """Resolve one step's top-k positions to readable rows and update the LRU.

    The exact contract (hits, misses, eviction order, outputs, counters) is
    docs/residency.md. dtypes: int32 everywhere except ``lru_slots`` (int16)
    and ``stats`` (int64, >= 5 entries: lookups, hits, misses, resident,
    invalid; accumulated). ``device_global_indices`` and ``lru_slots`` are
    updated in place.

    Fused gather: with ``gather_host_cache`` and ``gather_hot_cache`` (both or
    neither) the call also copies the rows of the swap list it emits into the
    hot cache, leaving the bytes :func:`gather_compact` would leave if run
    right after it on ``out_swap_host_rows``, ``out_swap_device_rows`` and
    ``out_swap_counts`` with this ``hot_block_size`` and
    ``hot_block_stride=gather_hot_block_stride`` (0 = ``hot_block_size``);
    one launch per layer instead of two, which pays off when few rows miss
    (steady-state decode; see docs/residency.md). The two tensors follow
    :func:`gather_compact`'s rules for ``host_cache`` and ``hot_cache``; the
    hot cache is on the device of ``topk_indices``. ``gather_schedule``
    (CUDA; the bytes are the same either way): "auto" lets each request
    decide on the device, without a host sync: one with a few misses copies
    them in the resolve launch, while its host reads overlap the resolve; the
    rows of requests with more are copied on every SM. With ``handoff``
    that happens in the same launch, from the moment each request's swap
    list is complete; without it, right after the resolve, by
    :func:`gather_compact`'s default schedule (a second launch, on the
    same stream).
    "fused" copies every row in the resolve launch (one SM per request).
    A batch of more requests than the GPU has SMs, up to twice as many,
    runs one block per SM that resolves two requests in turn (a request
    whose misses fit its half of the miss stage, at most 8 rows, starts
    reading them into shared memory as it finds them) and then copies both
    swap lists, under either schedule, where two requests' arrays would fit
    one SM's shared memory (k = 2048 up to H = 4096 on an H200). Without
    the gather's caches only "auto" is accepted (there is nothing to
    schedule).

    ``workspace``: on CUDA, a shape whose per-request arrays do not fit one
    block's shared memory (large hot buffers with speculative unions, see
    docs/residency.md) needs a contiguous uint8 tensor on the device of at
    least :func:`resolver_workspace_bytes` bytes for the rows of
    ``device_global_indices``; allocate it once with the state. A workspace
    given is checked on every backend (1-D uint8, contiguous, 16-byte
    aligned, on the device, sharing no memory with another argument); it is
    not read otherwise (and never by the CPU backend). Launches sharing one
    workspace must be stream-ordered.

    ``handoff``: the automatic schedule's records, an int32 tensor of shape
    ``(S, RESOLVER_HANDOFF_WORDS)`` (S: the rows of
    ``device_global_indices``), contiguous on the device. Allocate it once
    with the state, with ``torch.zeros``, and let only resolves write it:
    every launch leaves each record it used idle again (its first word 0).
    Memory that is not zeroed (``torch.empty``) cannot be detected and can
    make a launch copy wrong rows. Checked on
    every backend, read only by the CUDA backend's automatic schedule.

    ``residency_hint``: an int32 tensor of ``ceil(host_rows / 32)``
    elements, contiguous on the device: bit ``g`` set when some slot of
    ``device_global_indices`` probably holds host row ``g``. Start it from the
    state (all zeros for an empty one) and let the resolves keep it: on CUDA
    every resolve sets the bit of each row a slot takes and clears the bit of
    the row it replaces. With ``handoff``, the automatic schedule's helper
    blocks read the rows a request will most likely miss from the launch's
    start, before the request's swap list exists; with a hint they predict
    those rows from its bits, without one from ``device_global_indices``
    (docs/residency.md, "Residency hint"). A wrong bit only moves a read
    earlier or later: the rows copied, and where, always come from the swap
    list. Checked on every backend; the CPU backend neither reads nor writes
    it.
    """
    _C.resolve_residency(
        _args.tensor("topk_indices", topk_indices),
        _args.tensor("req_id_per_token", req_id_per_token),
        _args.tensor("request_state_indices", request_state_indices),
        _args.tensor("device_global_indices", device_global_indices),
        _args.tensor("lru_slots", lru_slots),
        _args.tensor("hot_block_table", hot_block_table),
        hot_block_size,
        attention_block_stride,
        host_rows,
        max_union_rows,
        _args.tensor("out_attention", out_attention),
        _args.tensor("out_hot_rows", out_hot_rows),
        _args.tensor("out_resolved", out_resolved),
        _args.tensor("out_miss_mask", out_miss_mask),
        _args.tensor("out_valid_counts", out_valid_counts),
        _args.tensor("out_swap_host_rows", out_swap_host_rows),
        _args.tensor("out_swap_device_rows", out_swap_device_rows),
        _args.tensor("out_swap_counts", out_swap_counts),
        _args.optional_tensor("source_block_table", source_block_table),
        block_size,
        _args.optional_tensor("resident_block_table", resident_block_table),
        resident_block_size,
        _args.optional_tensor("num_valid_rows", num_valid_rows),
        _args.optional_tensor("stats", stats),
        _args.optional_tensor("gather_host_cache", gather_host_cache),
        _args.optional_tensor("gather_hot_cache", gather_hot_cache),
        gather_hot_block_stride,
        _args.optional_tensor("workspace", workspace),
        _gather_schedule(gather_schedule, gather_host_cache is not None or gather_hot_cache is not None),
        _args.optional_tensor("handoff", handoff),
        _args.optional_tensor("residency_hint", residency_hint),
        _args.stream(stream, topk_indices),
    )


GATHER_SCHEDULES = ("auto", "fused")  # hs_resolve_gather_schedule_t, in order


def _gather_schedule(schedule: str, fused: bool) -> int:
    if not isinstance(schedule, str):
        raise TypeError(f"gather_schedule: expected one of {list(GATHER_SCHEDULES)}, got {type(schedule).__name__}")
    code = _args.choice("gather_schedule", schedule, GATHER_SCHEDULES)
    if not fused and code != _C.RESOLVE_GATHER_AUTO:
        # As the C ABI: a schedule other than the default without the fused gather it schedules is a mistake.
        raise ValueError(f"gather_schedule: {schedule!r} schedules the fused gather, which needs gather_host_cache "
                         "and gather_hot_cache; got neither")
    return code


def resolver_workspace_bytes(num_state_rows: int, device_buffer_size: int, max_union_rows: int, device: Any) -> int:
    """Bytes of the ``workspace`` that :func:`resolve_residency` needs on CUDA
    device ``device`` (an index, "cuda:N" or a torch.device) for
    ``num_state_rows`` rows of ``device_buffer_size`` hot slots and
    ``max_union_rows`` union rows; 0 when every array of a request fits one
    block's shared memory there."""
    device_type, index = _args.device(device)
    if device_type != _C.DEVICE_CUDA:
        raise ValueError(f"device: expected a CUDA device, got {device!r}")
    return _C.resolver_workspace_bytes(
        _args.require_int("num_state_rows", num_state_rows, 0, bits=64),
        _args.require_int("device_buffer_size", device_buffer_size, 1, bits=32),
        _args.require_int("max_union_rows", max_union_rows, 1, bits=32),
        max(index, 0),
    )


def gather_compact(
    host_cache: Any,
    hot_cache: Any,
    swap_host_rows: Any,
    swap_device_rows: Any,
    swap_counts: Any,
    *,
    hot_block_size: int,
    hot_block_stride: Optional[int] = None,
    variant: Union[str, int] = "auto",
    max_blocks: Optional[int] = None,
    stream: Any = None,
) -> None:
    """Copy each swap entry's host row into its hot row (zero-copy host reads).

    ``host_cache``: the host cache ``[..., W]`` (any dtype, rows at one pitch,
    16-byte aligned rows of a multiple of 16 bytes; registered or pinned on
    CUDA). ``hot_cache``: the paged hot cache on the executing device, same
    dtype and W; physical hot row ``r`` lives at row offset
    ``(r // hot_block_size) * hot_block_stride + r % hot_block_size``
    (``hot_block_stride`` defaults to ``hot_block_size``). ``swap_host_rows``
    and ``swap_device_rows``: int32 ``[R, K]``; ``swap_counts``: int32
    ``[>= R]``, clamped to ``[0, K]``. Per used entry: a negative slot or a
    destination outside the hot cache is skipped, a host slot at or past the
    host row count zero-fills the destination. ``variant`` picks the CUDA
    schedule (:data:`GATHER_VARIANTS`; "auto" = "row_persistent", one warp per
    row on one block per SM, suited to misses local to each request; "sorted"
    for rows scattered over the pool); ``max_blocks`` sets the thread blocks
    of the "row_persistent" and "sorted" schedules (None: one per SM for
    "row_persistent", half the SMs for "sorted").
    """
    _C.gather_compact(
        _args.tensor("host_cache", host_cache),
        _args.tensor("hot_cache", hot_cache),
        _args.tensor("swap_host_rows", swap_host_rows),
        _args.tensor("swap_device_rows", swap_device_rows),
        _args.tensor("swap_counts", swap_counts),
        _args.require_int("hot_block_size", hot_block_size, bits=64),
        _args.optional_int("hot_block_stride", hot_block_stride, 0),
        _args.choice("variant", variant, GATHER_VARIANTS),
        _args.optional_int("max_blocks", max_blocks, 0),
        _args.stream(stream, hot_cache, swap_host_rows),
    )


def gather_compact_group(
    host_cache: Any,
    hot_caches: Sequence[Any],
    swap_host_rows: Any,
    swap_device_rows: Any,
    swap_counts: Any,
    *,
    hot_block_size: int,
    hot_block_stride: Optional[int] = None,
    max_blocks: Optional[int] = None,
    stream: Any = None,
) -> None:
    """:func:`gather_compact` for P layers whose rows of one token lie side by side.

    ``host_cache``: ``[..., P, W]``, the P rows of a host slot back to back
    (for example ``host[:, l0:l0 + P, :]`` of a token-major ``[slots, layers,
    W]`` cache); the leading dimensions flatten to slots at one pitch.
    ``hot_caches``: P hot caches of one shape, strides, dtype and device, as
    ``hot_cache`` of :func:`gather_compact`. Each used swap entry ``(h, d)``
    reads slot ``h``'s P rows as one contiguous span and writes row ``i`` to
    hot row ``d`` of ``hot_caches[i]``; the bytes equal P
    :func:`gather_compact` calls, one per piece. Why: the GPU reads host
    memory in 128-byte lines, so one 656-byte row costs six lines for 5.1 of
    data, while P adjacent rows read together waste at most one line.
    ``max_blocks``: CUDA thread blocks (None: one per SM).
    """
    hot_caches = _args.sequence("hot_caches", hot_caches)
    _C.gather_compact_group(
        _args.tensor("host_cache", host_cache),
        _args.tensor_list("hot_caches", hot_caches),
        _args.tensor("swap_host_rows", swap_host_rows),
        _args.tensor("swap_device_rows", swap_device_rows),
        _args.tensor("swap_counts", swap_counts),
        _args.require_int("hot_block_size", hot_block_size, bits=64),
        _args.optional_int("hot_block_stride", hot_block_stride, 0),
        _args.optional_int("max_blocks", max_blocks, 0),
        _args.stream(stream, *hot_caches[:1], swap_host_rows),
    )


def gather_plan(src_rows: Any, staged: Any, row_ids: Any, dst_rows: Any, miss_mask: Any, *, stream: Any = None) -> None:
    """Prefill staging: ``staged[dst_rows[j]] = src_rows[row_ids[j]]`` where
    ``miss_mask[j] != 0`` and ``row_ids[j] >= 0``.

    ``row_ids``, ``dst_rows``, ``miss_mask``: int32 with the same number of
    elements (the staging plan's ``[1, N]``). ``staged``: contiguous rows on
    the executing device, same dtype and row width as ``src_rows``. Entries
    whose source or destination row is out of range are skipped.
    """
    _C.gather_plan(
        _args.tensor("src_rows", src_rows),
        _args.tensor("staged", staged),
        _args.tensor("row_ids", row_ids),
        _args.tensor("dst_rows", dst_rows),
        _args.tensor("miss_mask", miss_mask),
        _args.stream(stream, staged, row_ids),
    )


def table_pointers(tables: Sequence[Any]) -> Any:
    """An int64 tensor of the tables' data pointers on their device.

    The seed's cached group table for :func:`invalidate_written_slots`. Build
    it once, outside CUDA-graph capture (it copies from the host), and keep it
    with the tables. Passing it is optional: without it the pointers travel
    as kernel arguments.
    """
    torch = torch_or_none()
    if torch is None:
        raise RuntimeError("table_pointers needs torch")
    tables = _args.sequence("tables", tables)
    if not tables:
        raise ValueError("tables: expected at least one table")
    for i, table in enumerate(tables):
        if not isinstance(_args.check_tensor(f"tables[{i}]", table), torch.Tensor):
            raise TypeError(f"tables[{i}]: expected a torch.Tensor, got {type(table).__name__}")
    device = tables[0].device
    return torch.tensor([t.data_ptr() for t in tables], dtype=torch.int64, device=device)


def invalidate_written_slots(
    tables: Sequence[Any],
    request_state_indices: Any,
    req_id_per_token: Any,
    written_slots: Any,
    *,
    table_pointers: Optional[Any] = None,
    stream: Any = None,
) -> None:
    """Drop hot copies of rewritten host slots in every table, in one launch.

    For each token ``t < min(len(req_id_per_token), len(written_slots))`` with
    batch row ``b = req_id_per_token[t]`` and state row
    ``s = request_state_indices[b]`` (invalid ones skipped), every slot of row
    ``s`` of every table holding ``written_slots[t]`` (skipped when negative)
    becomes -1. ``tables``: the index groups' int32 ``[S, H]``
    ``device_global_indices``, all of one shape and device. ``table_pointers``:
    optional, see :func:`table_pointers`.
    """
    tables = _args.sequence("tables", tables)
    _C.invalidate_written_slots(
        _args.tensor_list("tables", tables),
        _args.tensor("request_state_indices", request_state_indices),
        _args.tensor("req_id_per_token", req_id_per_token),
        _args.tensor("written_slots", written_slots),
        _args.optional_tensor("table_pointers", table_pointers),
        _args.stream(stream, request_state_indices, *tables),
    )


def mirror_rows(src_rows: Any, host_cache: Any, slot_mapping: Any, *, stream: Any = None) -> None:
    """Write device row ``i`` of ``src_rows`` to host slot ``slot_mapping[i]``.

    Keeps the host pool authoritative for KV written on the GPU: a kernel
    stores into registered host memory, ordered on the stream and capturable.
    Negative slots and slots past the host row count are skipped.
    ``slot_mapping``: int32 or int64, at least one entry per source row.
    """
    _C.mirror_rows(
        _args.tensor("src_rows", src_rows),
        _args.tensor("host_cache", host_cache),
        _args.tensor("slot_mapping", slot_mapping),
        _args.stream(stream, src_rows, slot_mapping),
    )


def swap_blocks_batch(src: Any, dst: Any, sizes: Any, *, stream: Any = None) -> None:
    """Copy ``sizes[i]`` bytes from address ``src[i]`` to address ``dst[i]``.

    The seed's ``swap_blocks_batch`` (device-to-host block copies on the
    current stream), done by one kernel so it is capturable. ``src``, ``dst``,
    ``sizes``: int64 1-D on the executing device. Entries with a size <= 0 or
    a null address are skipped; the caller guarantees every range is device
    memory of that device or registered host memory.
    """
    _C.swap_blocks_batch(
        _args.tensor("src", src),
        _args.tensor("dst", dst),
        _args.tensor("sizes", sizes),
        _args.stream(stream, src, dst, sizes),
    )


def warm_host_pages(
    host_cache: Any,
    block_table: Any,
    *,
    block_size: int,
    seq_lens: Any = None,
    page_bytes: int = WARM_PAGE_BYTES,
    out: Any = None,
    stream: Any = None,
) -> None:
    """Read one word of every ``page_bytes`` page of the requests' host blocks, so their translations are warm.

    Where the host caches of many layers together outgrow what the GPU keeps
    of its translations of host pages, every row a step reads pays a cold
    one. Call this for the next layer's host cache while the current layer
    computes, on a second stream, and that layer's gather or fused resolve
    finds them warm (docs/performance.md, "Host page warm-up").

    ``host_cache``: the host cache ``[..., W]`` (as in :func:`gather_compact`);
    block ``h`` is its rows ``h * block_size`` to ``(h + 1) * block_size``.
    ``block_table``: int32 ``[B, M]`` on the executing device, request
    ``b``'s host blocks; ``seq_lens``: int32 ``[>= B]`` there, or None (every
    entry used): request ``b`` uses its first ``ceil(seq_lens[b] /
    block_size)`` entries. Entries < 0 or past the cache are skipped.
    ``page_bytes``: a power of two from 16 to 2**30. ``out``: int64 ``[2]``
    on the executing device, or None: the words read and their XOR (an
    unsigned 32-bit value), the same on every backend. Nothing else is
    written; stream-ordered and capturable.
    """
    _C.warm_host_pages(
        _args.tensor("host_cache", host_cache),
        _args.tensor("block_table", block_table),
        _args.optional_tensor("seq_lens", seq_lens),
        _args.require_int("block_size", block_size, bits=64),
        _args.require_int("page_bytes", page_bytes, bits=64),
        _args.optional_tensor("out", out),
        _args.stream(stream, block_table, out),
    )


def write_rows(
    rows: Any,
    req_id_per_token: Any,
    positions: Any,
    request_state_indices: Any,
    *,
    host_cache: Any = None,
    source_block_table: Any = None,
    block_size: int = 0,
    host_rows: int = 0,
    resident_cache: Any = None,
    resident_block_table: Any = None,
    hot_cache: Any = None,
    hot_block_table: Any = None,
    device_global_indices: Any = None,
    stream: Any = None,
) -> None:
    """Store new rows so that no stale copy of them can be served (docs/kv_cache.md, "write_rows").

    Row ``t`` (batch row ``req_id_per_token[t]``, position ``positions[t]``)
    goes to its host slot in ``host_cache`` (through ``source_block_table``
    with ``block_size``, or the position is the slot), to its resident copy
    (``resident_cache`` paged view with ``resident_block_table``, > 0 =
    resident) and over every hot copy of its slot that
    ``device_global_indices`` holds for its state row (``hot_cache`` paged
    view with ``hot_block_table``, >= 0 = usable). Padding rows, positions
    without a slot and destinations outside their tensors are skipped.
    """
    _C.write_rows(
        _args.tensor("rows", rows),
        _args.tensor("req_id_per_token", req_id_per_token),
        _args.tensor("positions", positions),
        _args.tensor("request_state_indices", request_state_indices),
        _args.optional_tensor("host_cache", host_cache),
        _args.optional_tensor("source_block_table", source_block_table),
        _args.require_int("block_size", block_size, bits=64),
        _args.require_int("host_rows", host_rows, bits=64),
        _args.optional_tensor("resident_cache", resident_cache),
        _args.optional_tensor("resident_block_table", resident_block_table),
        _args.optional_tensor("hot_cache", hot_cache),
        _args.optional_tensor("hot_block_table", hot_block_table),
        _args.optional_tensor("device_global_indices", device_global_indices),
        _args.stream(stream, rows),
    )


def read_rows(cache: Any, indices: Any, out: Any, *, stream: Any = None) -> None:
    """``out[t, k]`` = the row of ``cache`` at row offset ``indices[t, k]`` (the attention addressing), zeros
    for an index < 0 or past the cache.

    ``cache``: a paged view ``[blocks, block_size, W]`` (rows contiguous
    within a block) or rows ``[N, W]``; ``indices`` int32 ``[T, k]``; ``out``
    ``[T, k, W]`` contiguous, cache's dtype, on its device. The read of
    exactly the rows hisparse resolved.
    """
    _C.read_rows(
        _args.tensor("cache", cache), _args.tensor("indices", indices), _args.tensor("out", out),
        _args.stream(stream, cache, indices),
    )


def update_residency(
    resident_block_table: Any,
    request_state_indices: Any,
    seq_lens: Any,
    resident_blocks: Any,
    *,
    table_block_size: int,
    num_pages: int,
    blocks_per_page: int = 1,
    ring_pages: Any = None,
    stream: Any = None,
) -> None:
    """The newest ``num_pages`` pages of every request resident (the seed's ``update_hisparse_residency``).

    For batch row b with state row s and length ``seq_lens[b] > 0``, the
    table entries of its newest pages (``blocks_per_page`` entries of
    ``table_block_size`` positions each) get the state row's blocks
    ``resident_blocks[s]`` (page g in ring slot ``g % num_pages``); every
    other entry is 0 (not resident).

    ``ring_pages`` (int32 ``[>= S, >= num_pages]``, read and written) keeps
    a length that falls back across a page boundary (rejected draft tokens)
    from serving a page whose ring slot a later page has written: every page
    of the call's windows first claims its slot (``ring_pages[s, g %
    num_pages] = max(itself, g)``), and a page is resident only while its slot
    holds it; the others are served from the host and hot copies. Fill a
    state row's entries with -1 when a new request takes it. Without it,
    lengths must never fall back across a page boundary.
    """
    _C.update_residency(
        _args.tensor("resident_block_table", resident_block_table),
        _args.require_int("table_block_size", table_block_size, bits=64),
        _args.require_int("blocks_per_page", blocks_per_page, bits=32),
        _args.require_int("num_pages", num_pages, bits=32),
        _args.tensor("request_state_indices", request_state_indices),
        _args.tensor("seq_lens", seq_lens),
        _args.tensor("resident_blocks", resident_blocks),
        _args.optional_tensor("ring_pages", ring_pages),
        _args.stream(stream, resident_block_table),
    )
