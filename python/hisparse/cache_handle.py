"""hisparse.CacheHandle: the attention-facing handle of one layer.

Modelled on the seed's ``HiSparseCacheHandle``, without any engine: a batch
is described by a small :class:`BatchInfo` (or None for a dummy batch), the
handle classifies it (decode batch, group prefetch batch, host mirror
needed), hands out the write target of the layer's resident KV cache, stores
written rows when the KV update is finished (``Runtime.write``: the host pool
when the batch needs it, and every hot copy of the written slots, so a row a
follower's leader prefetched before the follower wrote it is rewritten before
the follower reads it), and calls the runtime's ``swap_in`` with its resident
view and the group's prefetch policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from . import _C, _args
from .runtime import Runtime, paged_cache_view

__all__ = ["BatchInfo", "CacheHandle", "is_decode_batch", "is_group_prefetch_batch"]


@dataclass(frozen=True)
class BatchInfo:
    """What the handle needs to know about a batch (an engine's attention metadata).

    ``req_id_per_token``: int32 ``[>= num_actual_tokens]``, the batch row of
    each token row (optional).
    """

    num_actual_tokens: int
    num_decode_tokens: int
    num_reqs: int
    max_query_len: int
    req_id_per_token: Any = None

    def __post_init__(self) -> None:
        for name in ("num_actual_tokens", "num_decode_tokens", "num_reqs", "max_query_len"):
            _args.require_int(name, getattr(self, name), 0)


def is_decode_batch(batch: Optional[BatchInfo]) -> bool:
    """A plain decode batch: every request contributes exactly one query token."""
    return (
        batch is not None
        and batch.num_actual_tokens > 0
        and batch.num_decode_tokens == batch.num_actual_tokens
        and batch.num_reqs == batch.num_actual_tokens
        and batch.max_query_len == 1
    )


def is_group_prefetch_batch(batch: Optional[BatchInfo], max_rows: int) -> bool:
    """Prefetch historical KV for a pure decode batch, including verification."""
    return (
        batch is not None
        and 0 < batch.num_actual_tokens <= max_rows
        and batch.num_decode_tokens == batch.num_actual_tokens
        and 0 < batch.num_reqs <= batch.num_actual_tokens
        and 0 < batch.max_query_len <= max_rows
    )


class CacheHandle:
    """Attention-facing handle for one layer's resident KV and sparse offload state.

    The group leader's handle lists every handle of its index group in
    ``index_group_caches`` (itself first; add followers with
    :meth:`add_follower`); :meth:`prepare_group_for_batch` prepares all of
    them once per forward.
    """

    def __init__(self, runtime: Runtime) -> None:
        if not isinstance(runtime, Runtime):
            raise TypeError(f"runtime: expected a hisparse.Runtime, got {type(runtime).__name__}")
        self.runtime = runtime
        self.index_group_caches: List[CacheHandle] = [self]
        self._reset_binding_state()

    def _reset_binding_state(self) -> None:
        self.view: Any = None
        self.block_table: Any = None
        self.slot_mapping: Any = None
        self.mirror_slot_mapping: Any = None
        self.dummy_batch = False
        self.decode_batch = False
        self.prefetch_decode_group = False
        self.num_actual_tokens = 0
        self.num_decode_tokens = 0
        self.req_id_per_token: Any = None
        self.host_mirror_required = False
        self._num_written_rows = 0

    @property
    def is_writer(self) -> bool:
        """Whether this layer stores rows in the host pool (False on a reader of a shared pool, whose
        :meth:`finish_kv_update` updates only its own device copies)."""
        return self.runtime.is_writer

    def add_follower(self, handle: "CacheHandle") -> None:
        """Add the handle of a follower layer of this handle's index group."""
        if not isinstance(handle, CacheHandle):
            raise TypeError(f"handle: expected a hisparse.CacheHandle, got {type(handle).__name__}")
        if not self.runtime.is_group_leader:
            raise RuntimeError("add_follower: only the group leader's handle lists the group's handles")
        if handle.runtime.leader is not self.runtime or handle is self:
            raise ValueError("handle: expected the handle of a follower of this handle's runtime")
        if handle not in self.index_group_caches:
            self.index_group_caches.append(handle)

    # ------------------------------------------------------------------ binding
    def bind_cache(
        self,
        raw_tensor: Any,
        *,
        byte_offset: int,
        block_stride: int,
        num_blocks: int,
        block_size: int,
        block_table: Any,
        slot_mapping: Any,
        mirror_slot_mapping: Any = None,
    ) -> None:
        """Bind the layer's resident KV cache: a paged view into a device slab.

        ``block_table``: the resident block of each page per batch row (> 0 =
        resident, read by the resolver); ``slot_mapping``: where this step's
        new tokens are written in the view; ``mirror_slot_mapping``: their
        host slots, for :meth:`finish_kv_update`. The tensors are persistent
        buffers whose contents the engine updates every step.
        """
        self.view = paged_cache_view(
            raw_tensor,
            dtype=self.runtime.kv_dtype,
            row_width=self.runtime.row_width,
            byte_offset=byte_offset,
            block_stride=block_stride,
            num_blocks=num_blocks,
            block_size=block_size,
        )
        self.block_table = block_table
        self.slot_mapping = slot_mapping
        self.mirror_slot_mapping = mirror_slot_mapping

    def unbind_cache(self) -> None:
        """Detach KV storage and per-binding metadata, retaining the index group."""
        self._reset_binding_state()
        self.runtime.unbind_cache()

    # ------------------------------------------------------------------ per batch
    def prepare_group_for_batch(self, batch: Optional[BatchInfo]) -> None:
        """Classify ``batch`` (None = a dummy batch) for every handle of the group."""
        if not self.runtime.is_group_leader:
            raise RuntimeError("prepare_group_for_batch: call it on the group leader's handle")
        if batch is not None and not isinstance(batch, BatchInfo):
            raise TypeError(f"batch: expected a hisparse.BatchInfo or None, got {type(batch).__name__}")
        for cache in self.index_group_caches:
            cache._prepare_for_batch(batch)

    def _prepare_for_batch(self, batch: Optional[BatchInfo]) -> None:
        self.dummy_batch = batch is None
        self.runtime.begin_forward()
        self.num_actual_tokens = batch.num_actual_tokens if batch is not None else 0
        self.num_decode_tokens = batch.num_decode_tokens if batch is not None else 0
        self.req_id_per_token = batch.req_id_per_token if batch is not None else None
        self.decode_batch = is_decode_batch(batch)
        # Verification can prefetch old host rows without publishing tentative
        # writes; resident writes and host mirroring keep their own policy.
        self.prefetch_decode_group = self.decode_batch or is_group_prefetch_batch(batch, self.runtime.max_swap_rows)
        self.host_mirror_required = batch is not None and (not self.decode_batch or self.runtime.eager_host_mirror)
        self._num_written_rows = 0

    def write_target(self, num_input_rows: int, num_slot_rows: int) -> Tuple[Any, Any, int]:
        """(resident cache view, slot mapping of the rows to write, row count) for this layer's KV update."""
        _args.require_int("num_input_rows", num_input_rows, 0)
        _args.require_int("num_slot_rows", num_slot_rows, 0)
        if self.view is None or self.slot_mapping is None:
            raise RuntimeError("write_target: the handle has no bound cache (call bind_cache first)")
        num_rows = min(num_input_rows, num_slot_rows, self.num_actual_tokens)
        if self.decode_batch:
            num_rows = min(num_rows, self.runtime.max_num_reqs)
        self._num_written_rows = num_rows
        return self.view, self.slot_mapping[:num_rows], num_rows

    def finish_kv_update(
        self,
        written_rows: Any = None,
        *,
        host_slot_mapping: Any = None,
        req_id_per_token: Any = None,
        request_state_indices: Any = None,
        stream: Any = None,
    ) -> None:
        """Store this step's written rows: in the host pool when the batch needs
        it, and over every hot copy of their host slots (``Runtime.write``).

        Nothing happens for a dummy batch. The host store follows the seed's
        policy (not for a decode batch unless the config asks for an eager
        host mirror, and never on a reader of a shared pool): with
        ``eager_host_mirror=False`` the rows of decode batches reach the host
        only through the engine, so keep them on resident pages until it
        copies them. The hot copies are rewritten for every batch, so that a
        copy made before the write (a follower's rows its leader prefetched
        before the follower wrote them, or a rewritten slot) is never served.
        ``written_rows`` are the rows as stored in the cache (default:
        gathered from the resident view at the write target's slots, which
        allocates, so pass them inside a CUDA graph); ``host_slot_mapping``
        (the rows' host slots) defaults to the bound ``mirror_slot_mapping``;
        ``req_id_per_token`` (the rows' batch rows) to the batch's; the state
        rows to the runtime's ``request_state_indices``. The rows of the last
        :meth:`write_target` (or ``num_actual_tokens``) are stored.
        """
        if written_rows is not None:
            _args.check_tensor("written_rows", written_rows, sliceable=True)
        if host_slot_mapping is not None:
            _args.check_tensor("host_slot_mapping", host_slot_mapping, sliceable=True)
        if req_id_per_token is not None:
            _args.check_tensor("req_id_per_token", req_id_per_token, sliceable=True)
        if self.dummy_batch:
            return
        slots = host_slot_mapping if host_slot_mapping is not None else self.mirror_slot_mapping
        if slots is None:
            if not self.host_mirror_required:
                return
            raise ValueError("host_slot_mapping: required when no mirror_slot_mapping was bound")
        num_rows = self._num_written_rows or self.num_actual_tokens
        if written_rows is None:
            if self.view is None or self.slot_mapping is None:
                raise RuntimeError("finish_kv_update: no written_rows given and no bound cache to read them from")
            positions = self.slot_mapping[:num_rows].long().clamp(min=0)
            block_size = self.view.shape[1]
            written_rows = self.view[positions // block_size, positions % block_size]
        num_rows = min(num_rows, written_rows.shape[0])
        if num_rows == 0:
            return
        try:
            req_ids = req_id_per_token if req_id_per_token is not None else self.req_id_per_token
            if req_ids is None:
                raise ValueError("req_id_per_token: required when the batch gave none (BatchInfo.req_id_per_token)")
            self.runtime.write(
                written_rows[:num_rows],
                req_ids[:num_rows],
                slots[:num_rows],
                request_state_indices=request_state_indices,
                skip_host_store=not self.host_mirror_required,
                stream=stream,
            )
        except (TypeError, ValueError, RuntimeError) as error:
            raise _args.renamed(error, {"rows": "written_rows", "positions": "host_slot_mapping"}) from None

    def swap_in(
        self,
        topk_indices: Any = None,
        req_id_per_token: Any = None,
        *,
        block_table: Any = None,
        block_size: Optional[int] = None,
        num_valid_rows: Any = None,
        request_state_indices: Any = None,
        return_valid_counts: bool = False,
        attention_indices_out: Any = None,
        valid_counts_out: Any = None,
        num_tokens: Optional[int] = None,
        fused_gather: bool = _C.DEFAULT_FUSED_GATHER == 1,
        group_gather: bool = False,
        seq_lens: Any = None,
        stream: Any = None,
    ) -> Any:
        """The runtime's ``swap_in`` with this handle's resident view and the group's prefetch policy.

        The arguments are :meth:`hisparse.Runtime.swap_in`'s, in its order:
        the leader's handle takes ``topk_indices`` and ``req_id_per_token``
        (positionally) and the source ``block_table``; a follower's handle
        takes ``num_tokens`` only, and refuses a top-k (the follower reuses
        its leader's resolution). ``group_gather`` needs a prefetch batch on
        the leader.
        """
        if not self.runtime.is_group_leader and topk_indices is not None:
            raise ValueError(
                "topk_indices: a follower's handle reuses its group leader's resolution and reads no top-k; "
                "pass num_tokens (the step's token rows) instead"
            )
        if self.runtime.is_group_leader:
            # The leader resolves the step: both tensors are required, and sliced here.
            _args.check_tensor("topk_indices", topk_indices, sliceable=True)
            _args.check_tensor("req_id_per_token", req_id_per_token, sliceable=True)
            if len(topk_indices.shape) != 2:
                raise ValueError(
                    f"topk_indices: expected 2 dimensions [T, top_k], got shape {tuple(topk_indices.shape)}"
                )
            if len(req_id_per_token.shape) != 1:
                raise ValueError(
                    f"req_id_per_token: expected 1 dimension, got shape {tuple(req_id_per_token.shape)}"
                )
        if req_id_per_token is not None and topk_indices is not None:
            req_id_per_token = req_id_per_token[: topk_indices.shape[0]]
        return self.runtime.swap_in(
            topk_indices,
            req_id_per_token,
            num_tokens=num_tokens,
            seq_lens=seq_lens,
            request_state_indices=request_state_indices,
            block_table=block_table,
            block_size=block_size,
            resident_block_table=self.block_table if self.view is not None else None,
            resident_block_size=self.view.shape[1] if self.view is not None else None,
            num_valid_rows=num_valid_rows,
            prefetch=self.prefetch_decode_group,
            return_valid_counts=return_valid_counts,
            attention_indices_out=attention_indices_out,
            valid_counts_out=valid_counts_out,
            fused_gather=fused_gather,
            group_gather=group_gather,
            stream=stream,
        )
