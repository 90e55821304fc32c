"""hisparse.KVCache: the model-level KV cache, built in one call.

A slim layer over the C++ KV cache (hisparse/kv_cache.h): from a
:class:`hisparse.Config` and a layer -> group map it builds the host cache
(a private pinned pool, or a pool given, e.g. a shared one), the device slab
(hot and resident blocks of every layer), the tables and one runtime per
layer with its index group. Per forward: :meth:`KVCache.begin_forward` with
the lengths after the forward's tokens, then per layer in order
:meth:`KVCache.write` (the layer's new rows), :meth:`KVCache.swap_in` (the
group leader with its top-k, a follower with the token count) and
:meth:`KVCache.read` (the rows the attention indices name). Batch row b of
every call is request row b (:meth:`KVCache.admit` picks one).

Everything on that path runs on torch's current stream of the cache's
device (or ``stream``), never synchronises and can be captured in a CUDA
graph; creation, :meth:`stats` and the views are host work.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from . import _C, _args
from ._tensors import torch_or_none
from .config import Config
from .runtime import row_dtype

__all__ = ["KVCache"]

_TENSORS = _C.KV_CACHE_TENSORS
_GROUP_TENSORS = _C.INDEX_GROUP_TENSORS


def _check_config(config: Any) -> Config:
    if not isinstance(config, Config):
        raise TypeError(f"config: expected a hisparse.Config, got {type(config).__name__}")
    return config


def _torch():
    torch = torch_or_none()
    if torch is None:
        raise RuntimeError("hisparse.KVCache needs torch")
    return torch


class KVCache:
    """The KV of one model's sparse-attention layers: host cache, hot and resident blocks, runtimes.

    ``config`` sizes everything (``top_k``, ``device_buffer_size`` = H hot
    rows per request, block sizes, the row size: ``row_width`` elements of
    ``dtype``, the dtype of the rows). ``layer_groups`` gives each layer's
    index group, numbered 0, 1, ... in order of first appearance (None:
    every layer its own group); the first layer of a group leads it.
    ``max_requests`` request rows of ``max_seq_len`` positions each;
    ``resident_pages`` newest pages of ``resident_page_size`` positions (a
    multiple of ``hot_block_size``; None = ``hot_block_size``) stay resident
    on the device. ``host_pool``: a :class:`hisparse.HostPool` (e.g.
    :meth:`hisparse.HostPool.shared`) of at least :meth:`host_bytes` bytes
    holding the host cache at offset 0, and so no other live cache's (a
    second cache on it raises ``ValueError``); None: a private pinned pool.
    ``host_event``: a :class:`hisparse.IpcEvent` the writer of a shared pool
    records after its host writes and readers wait on before their gathers.
    """

    def __init__(
        self,
        config: Config,
        *,
        num_layers: int,
        max_requests: int,
        max_seq_len: int,
        layer_groups: Optional[Sequence[int]] = None,
        resident_pages: int = 0,
        resident_page_size: Optional[int] = None,
        device: Any = None,
        dtype: Any = None,
        max_swap_rows: Optional[int] = None,
        host_pool: Any = None,
        host_event: Any = None,
    ) -> None:
        from .host_pool import HostPool  # noqa: PLC0415
        from .ipc_event import IpcEvent  # noqa: PLC0415

        if host_pool is not None and not isinstance(host_pool, HostPool):
            raise TypeError(f"host_pool: expected a hisparse.HostPool or None, got {type(host_pool).__name__}")
        if host_event is not None and not isinstance(host_event, IpcEvent):
            raise TypeError(f"host_event: expected a hisparse.IpcEvent or None, got {type(host_event).__name__}")
        self._dtype = row_dtype(_check_config(config), dtype)
        args = self._sizes(config, num_layers, layer_groups, max_requests, max_seq_len, resident_pages,
                           resident_page_size, device, self._dtype)
        if max_swap_rows is not None:
            _args.require_int("max_swap_rows", max_swap_rows, 1, bits=32)
        self._config = config
        # _C.KvCache borrows the pool (as one of its views: mapped, and refusing a plain release, while the cache
        # or any view of its host cache lives) and the event.
        self._kv = _C.KvCache(
            *args,
            max_swap_rows or 0,
            None if host_pool is None else host_pool._pool,
            None if host_event is None else host_event._event,
        )
        torch = _torch()
        self._host_pool = host_pool
        self._host_event = host_event
        self._info = self._kv.info()
        self._torch_dtype = getattr(torch, _args.dtype_name(self._dtype))
        self._views = {name: torch.from_dlpack(self._kv.tensor(which)) for name, which in _TENSORS.items()}
        L, W = self._info["num_layers"], config.row_bytes // _args.dtype_itemsize(self._dtype)
        self._host = self._views.pop("host_cache").view(self._torch_dtype).view(self._info["host_rows"], L, W)
        self._slab = self._views.pop("slab").view(self._torch_dtype).view(
            L, self._info["num_blocks"], config.hot_block_size, W
        )
        self._groups = [self._kv.layer_group(layer) for layer in range(L)]
        self._group_views: dict = {}

    @staticmethod
    def _sizes(config, num_layers, layer_groups, max_requests, max_seq_len, resident_pages, resident_page_size,
               device, dtype) -> tuple:
        num_layers = _args.require_int("num_layers", num_layers, 1, bits=32)
        groups: List[int] = []
        if layer_groups is not None:
            groups = _args.int_sequence("layer_groups", layer_groups)
            if len(groups) != num_layers:
                raise ValueError(f"layer_groups: expected one group per layer ({num_layers}), got {len(groups)}")
        device_type, device_index = _args.device(device)
        return (
            config.top_k,
            config.device_buffer_size,
            config.max_union_rows,
            config.num_speculative_tokens,
            config.row_bytes,
            config.block_size,
            config.hot_block_size,
            num_layers,
            groups,
            _args.require_int("max_requests", max_requests, 1, bits=32),
            _args.require_int("max_seq_len", max_seq_len, 1, bits=64),
            _args.require_int("resident_pages", resident_pages, 0, bits=32),
            _args.optional_int("resident_page_size", resident_page_size, 0, 1),
            device_type,
            device_index,
            _args.dtype_code("dtype", dtype),
        )

    @classmethod
    def host_bytes(
        cls,
        config: Config,
        *,
        num_layers: int,
        max_requests: int,
        max_seq_len: int,
        layer_groups: Optional[Sequence[int]] = None,
        resident_pages: int = 0,
        resident_page_size: Optional[int] = None,
        device: Any = None,
        dtype: Any = None,
    ) -> int:
        """Bytes of host memory the cache of these arguments needs (the size of a shared pool for it)."""
        return _C.KvCache.host_bytes(*cls._sizes(config, num_layers, layer_groups, max_requests, max_seq_len,
                                                 resident_pages, resident_page_size, device,
                                                 row_dtype(_check_config(config), dtype)))

    # ------------------------------------------------------------------ description
    @property
    def config(self) -> Config:
        return self._config

    @property
    def num_layers(self) -> int:
        return self._info["num_layers"]

    @property
    def num_groups(self) -> int:
        return self._info["num_groups"]

    @property
    def max_requests(self) -> int:
        return self._info["max_requests"]

    @property
    def dtype(self) -> Any:
        return self._torch_dtype

    @property
    def device(self) -> Any:
        return self._slab.device

    @property
    def is_writer(self) -> bool:
        """Whether this process writes the host cache (False on a reader of a shared pool)."""
        return self._info["is_writer"]

    def info(self) -> dict:
        """Sizes and state (groups, blocks, host and device bytes, admitted requests, writer)."""
        return self._kv.info()

    def _layer(self, layer: Any) -> int:
        layer = _args.require_int("layer", layer)
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer: expected 0 <= layer < num_layers = {self.num_layers}, got {layer}")
        return layer

    def group_of(self, layer: int) -> int:
        return self._groups[self._layer(layer)][0]

    def leader_of(self, layer: int) -> int:
        """The layer that leads ``layer``'s index group (``layer`` itself on a leader)."""
        return self._groups[self._layer(layer)][1]

    @property
    def host_cache(self) -> Any:
        """``[host_rows, L, W]`` host rows, token-major: host slot g holds every layer's row side by side."""
        return self._host

    @property
    def slab(self) -> Any:
        """``[L, num_blocks, hot_block_size, W]`` on the device: per layer block 0 unused, then the
        request rows' hot blocks, then their resident blocks."""
        return self._slab

    def layer_view(self, layer: int) -> Any:
        """Layer ``layer``'s paged cache ``[num_blocks, hot_block_size, W]``: attention index ``a`` is its
        row ``a`` (``view.flatten(0, 1)[a]``), the paged KV view a sparse attention kernel reads."""
        return self._slab[self._layer(layer)]

    def group_tensor(self, layer: int, name: str) -> Any:
        """A tensor of layer ``layer``'s index group (``hisparse._C.INDEX_GROUP_TENSORS`` names, e.g.
        device_global_indices, lru_slots, attention_indices, counters): the library's own memory."""
        layer = self._layer(layer)
        name = _args.name_of("name", name, _GROUP_TENSORS)
        key = (self._groups[layer][0], name)
        if key not in self._group_views:
            self._group_views[key] = _torch().from_dlpack(self._kv.group_tensor(layer, _GROUP_TENSORS[name]))
        return self._group_views[key]

    def table(self, name: str) -> Any:
        """One of the cache's int32 tables by name (request_state_indices, source_block_table,
        hot_block_table, resident_blocks, resident_block_table, seq_lens, ring_pages): read them, do not
        write them."""
        return self._views[_args.name_of("name", name, self._views)]

    # ------------------------------------------------------------------ requests
    def _stream(self, stream: Any, *tensors: Any) -> int:
        return _args.stream(stream, self._slab, *tensors)

    def admit(self, row: Optional[int] = None, *, stream: Any = None) -> int:
        """Admit a request into request row ``row`` (None: the lowest free one) and return the row;
        its hot state is reset in every group and its ring slots hold no page (stream-ordered)."""
        return self._kv.admit(_args.optional_int("row", row, -1, 0), self._stream(stream))

    def release(self, row: int, *, stream: Any = None) -> None:
        """Release request row ``row``; its hot state is reset in every group and its ring slots
        emptied (stream-ordered)."""
        self._kv.release(_args.require_int("row", row, 0, bits=32), self._stream(stream))

    # ------------------------------------------------------------------ a forward
    def begin_forward(self, seq_lens: Any, *, stream: Any = None) -> None:
        """Start a forward: ``seq_lens`` (int32 [max_requests] on the device) is each request row's length
        after this forward's tokens (0 for free rows); the newest pages become resident."""
        self._kv.begin_forward(_args.tensor("seq_lens", seq_lens), self._stream(stream, seq_lens))

    def write(self, layer: int, rows: Any, req_id_per_token: Any, positions: Any, *, stream: Any = None) -> None:
        """Store layer ``layer``'s new rows (``rows`` [T, W] of the cache's dtype; ``req_id_per_token`` int32
        [>= T] request rows; ``positions`` int32 or int64 [>= T]): host slot, resident copy and every hot
        copy of the slot (skipped host store on a reader of a shared pool)."""
        self._kv.write(
            _args.require_int("layer", layer, bits=32),
            _args.tensor("rows", rows),
            _args.tensor("req_id_per_token", req_id_per_token),
            _args.tensor("positions", positions),
            self._stream(stream, rows),
        )

    def swap_in(
        self,
        layer: int,
        topk_indices: Any = None,
        req_id_per_token: Any = None,
        *,
        num_tokens: Optional[int] = None,
        num_valid_rows: Any = None,
        prefetch: bool = True,
        fused_gather: bool = _C.DEFAULT_FUSED_GATHER == 1,
        stream: Any = None,
    ) -> Any:
        """Make layer ``layer``'s rows of this step available and return the attention indices.

        The group leader gives ``topk_indices`` (int32 [T, k], k <= top_k,
        request-relative positions, -1 = none; positions at or past the
        request's length are dropped) and ``req_id_per_token`` (request
        rows); a follower gives ``num_tokens`` only (a top-k is refused).
        Returns int32 [T, k] attention indices: rows of :meth:`layer_view`,
        -1 = masked (a view of the group's shared state, valid until the next
        forward). ``prefetch`` (leader): stage every follower now; always
        correct, since each follower's :meth:`write` rewrites a prefetched
        copy of its new rows.
        """
        layer = _args.require_int("layer", layer, bits=32)
        first, count, _ = self._kv.swap_in(
            layer,
            _args.optional_tensor("topk_indices", topk_indices),
            _args.optional_tensor("req_id_per_token", req_id_per_token),
            _args.optional_tensor("num_valid_rows", num_valid_rows),
            _args.optional_int("num_tokens", num_tokens, 0, 0),
            _args.flag("prefetch", prefetch),
            _args.flag("fused_gather", fused_gather),
            self._stream(stream, topk_indices),
        )
        width = topk_indices.shape[1] if topk_indices is not None else self._config.top_k
        return self.group_tensor(layer, "attention_indices")[first : first + count, :width]

    def read(self, layer: int, indices: Any, out: Any = None, *, stream: Any = None) -> Any:
        """The rows attention ``indices`` (int32 [T, k]) name in layer ``layer``'s view, zeros for -1:
        ``out`` [T, k, W] of the cache's dtype (allocated when None)."""
        if out is None:
            torch = _torch()
            out = torch.empty((*_args.index_rows("indices", indices), self._slab.shape[-1]), dtype=self._torch_dtype,
                              device=self.device)
        self._kv.read(
            _args.require_int("layer", layer, bits=32),
            _args.tensor("indices", indices),
            _args.tensor("out", out),
            self._stream(stream, indices),
        )
        return out

    # ------------------------------------------------------------------ counters
    def reset_stats(self, *, stream: Any = None) -> None:
        """Zero every group's counters (the hot state stays), stream-ordered."""
        self._kv.reset_stats(self._stream(stream))

    def stats(self, *, synchronize: bool = True, stream: Any = None) -> dict:
        """Counters in total and per group: ``{"total": {...}, "groups": [{...}, ...]}``.

        Each has lookups, hits, misses, resident, invalid, hit_rate,
        bytes_moved (misses x the row bytes of the group's layers) and
        num_layers; the total is the sum over the groups. With
        ``synchronize`` the counters are copied on the stream and the stream
        is synchronised first; otherwise the last copy is read as it is.
        """
        handle = self._stream(stream)
        if _args.require_bool("synchronize", synchronize):
            self._kv.copy_stats_async(handle)
            if self.device.type == "cuda":
                torch = _torch()
                if handle == 0:
                    torch.cuda.synchronize(self.device)
                else:
                    torch.cuda.ExternalStream(handle, device=self.device).synchronize()
        return {
            "total": self._kv.stats(-1),
            "groups": [self._kv.stats(g) for g in range(self.num_groups)],
        }

    def __repr__(self) -> str:
        return (
            f"KVCache({self.num_layers} layers in {self.num_groups} groups, {self.max_requests} requests, "
            f"device={self.device}, dtype={self._torch_dtype})"
        )
