"""hisparse.IndexGroup: the GPU state shared by the layers of one index group.

Layers that share one indexer output form an index group: the leader
resolves residency once per step, the followers reuse its slot assignment and
swap list and only move their own bytes. The group owns, on one device, the
hot-region state of every request state row, the shared top-k outputs of up
to ``max_swap_rows`` token rows, and the residency counters.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from . import _C, _args
from ._tensors import torch_or_none
from .config import Config

__all__ = ["IndexGroup", "ResolveResult"]

_TENSORS = _C.INDEX_GROUP_TENSORS


class ResolveResult(NamedTuple):
    """Views of the shared top-k rows one ``resolve`` wrote (rows [row_offset, row_offset + T))."""

    attention_indices: Any
    hot_rows: Any
    resolved_slots: Any
    miss_mask: Any
    valid_counts: Any
    swap_host_rows: Any
    swap_device_rows: Any
    swap_counts: Any


class IndexGroup:
    """Hot-region state, shared top-k outputs and counters of one index group.

    Sizes come from a :class:`hisparse.Config` or from keywords (``top_k`` and
    ``device_buffer_size`` are then required). The library's defaults apply
    to what is left out: ``max_union_rows = top_k * (1 +
    num_speculative_tokens)`` and ``max_swap_rows`` (token rows of the shared
    top-k state) ``= max_num_reqs * (1 + num_speculative_tokens)``, with the
    config's ``num_speculative_tokens`` (0 without a config). ``device`` is
    "cpu" (the reference backend), "cuda", "cuda:N", a torch.device or a CUDA
    index.

    Construction allocates and blocks until the state is initialised; every
    other method is stream-ordered on torch's current stream of the group's
    device (or ``stream``), never synchronises (except ``stats`` with
    ``synchronize=True``) and can be captured in a CUDA graph.

    The tensor properties are zero-copy views of the group's memory (torch
    tensors when torch is installed, else NumPy arrays). A view keeps the
    group's memory alive, so it stays valid after the group object is gone.
    """

    def __init__(
        self,
        config: Optional[Config] = None,
        *,
        max_num_reqs: int,
        device: Any = None,
        max_swap_rows: Optional[int] = None,
        top_k: Optional[int] = None,
        device_buffer_size: Optional[int] = None,
        max_union_rows: Optional[int] = None,
    ) -> None:
        if config is not None and not isinstance(config, Config):
            raise TypeError(f"config: expected a hisparse.Config or None, got {type(config).__name__}")
        _args.require_int("max_num_reqs", max_num_reqs, 1, bits=32)
        sizes = {"top_k": top_k, "device_buffer_size": device_buffer_size, "max_union_rows": max_union_rows}
        for name, value in sizes.items():
            if value is not None:
                _args.require_int(name, value, bits=32)
            if config is not None:
                from_config = getattr(config, name)
                if value is not None and value != from_config:
                    raise ValueError(f"{name}: {value} disagrees with config.{name} = {from_config}; give one of them")
                sizes[name] = from_config
        for name in ("top_k", "device_buffer_size"):
            if sizes[name] is None:
                raise ValueError(f"{name}: required when no config is given")
        if max_swap_rows is not None:
            _args.require_int("max_swap_rows", max_swap_rows, 1, bits=32)

        device_type, device_index = _args.device(device)
        try:
            self._group = _C.IndexGroup(
                device_type,
                device_index,
                max_num_reqs,
                sizes["device_buffer_size"],
                max_swap_rows or 0,
                sizes["top_k"],
                sizes["max_union_rows"] or 0,
                config.num_speculative_tokens if config is not None else 0,
            )
        except (TypeError, ValueError, RuntimeError) as error:
            raise _args.renamed(error, {"device_type": "device", "device_index": "device"}) from None
        self._config = config
        self._info = self._group.info()
        self._views = {name: self._view(which) for name, which in _TENSORS.items()}

    def _view(self, which: int) -> Any:
        array = self._group.tensor(which)
        torch = torch_or_none()
        if torch is not None:
            return torch.from_dlpack(array)
        import numpy as np  # noqa: PLC0415

        return np.from_dlpack(array)

    # ------------------------------------------------------------------ sizes
    @property
    def config(self) -> Optional[Config]:
        return self._config

    @property
    def device(self) -> Any:
        """torch.device of the group's memory (a string without torch)."""
        is_cuda = self._info["device_type"] == _C.DEVICE_CUDA
        name = f"cuda:{self._info['device_index']}" if is_cuda else "cpu"
        torch = torch_or_none()
        return torch.device(name) if torch is not None else name

    @property
    def max_num_reqs(self) -> int:
        return self._info["max_num_reqs"]

    @property
    def device_buffer_size(self) -> int:
        return self._info["device_buffer_size"]

    @property
    def max_swap_rows(self) -> int:
        return self._info["max_swap_rows"]

    @property
    def top_k(self) -> int:
        return self._info["top_k"]

    @property
    def max_union_rows(self) -> int:
        return self._info["max_union_rows"]

    @property
    def device_bytes(self) -> int:
        return self._info["device_bytes"]

    # ------------------------------------------------------------------ tensors
    @property
    def device_global_indices(self) -> Any:
        """int32 [max_num_reqs, device_buffer_size]: host slot held by each hot slot, -1 = empty."""
        return self._views["device_global_indices"]

    @property
    def lru_slots(self) -> Any:
        """int16 [max_num_reqs, device_buffer_size]: hot slots, least to most recently used."""
        return self._views["lru_slots"]

    @property
    def lru_init(self) -> Any:
        """int16 [device_buffer_size]: the initial LRU order 0 .. H-1 (read only by convention)."""
        return self._views["lru_init"]

    @property
    def attention_indices(self) -> Any:
        """int32 [max_swap_rows, top_k]: attention index per entry, -1 = masked."""
        return self._views["attention_indices"]

    @property
    def hot_rows(self) -> Any:
        """int32 [max_swap_rows, top_k]: physical hot (or resident) row per entry."""
        return self._views["hot_rows"]

    @property
    def resolved_slots(self) -> Any:
        """int32 [max_swap_rows, top_k]: host slot per entry."""
        return self._views["resolved_slots"]

    @property
    def miss_mask(self) -> Any:
        """int32 [max_swap_rows, top_k]: 1 at the first occurrence of each missed slot."""
        return self._views["miss_mask"]

    @property
    def valid_counts(self) -> Any:
        """int32 [max_swap_rows]: entries with an attention index per token row."""
        return self._views["valid_counts"]

    @property
    def swap_host_rows(self) -> Any:
        """int32 [max_swap_rows, top_k]: compact swap list, host slot of each miss."""
        return self._views["swap_host_rows"]

    @property
    def swap_device_rows(self) -> Any:
        """int32 [max_swap_rows, top_k]: compact swap list, physical hot row of each miss."""
        return self._views["swap_device_rows"]

    @property
    def swap_counts(self) -> Any:
        """int32 [max_swap_rows]: swap entries per token row."""
        return self._views["swap_counts"]

    @property
    def counters(self) -> Any:
        """int64 [5] device counters: lookups, hits, misses, resident, invalid (accumulated)."""
        return self._views["counters"]

    # ------------------------------------------------------------------ operations
    def _stream(self, stream: Any, *tensors: Any) -> int:
        return _args.stream(stream, self._views["device_global_indices"], *tensors)

    def reset(self, *, stream: Any = None) -> None:
        """Drop all hot-region state (every hit becomes a miss) and zero the counters.

        device_global_indices = -1, every lru_slots row = lru_init, counters = 0;
        the shared outputs are left as they are. One kernel, capturable.
        """
        self._group.reset(self._stream(stream))

    def invalidate_sorted_slots(self, sorted_slots: Any, state_indices: Any, *, stream: Any = None) -> None:
        """Drop hot copies of rewritten host slots.

        For each state row in ``state_indices`` (int32 [N]), every hot slot whose
        host slot occurs in ``sorted_slots`` (int32 [M], ascending) becomes -1.
        Both 1-D, contiguous, on the group's device. State rows outside
        [0, max_num_reqs) are skipped; empty inputs do nothing. Capturable.
        """
        self._group.invalidate_sorted_slots(
            _args.tensor("sorted_slots", sorted_slots),
            _args.tensor("state_indices", state_indices),
            self._stream(stream, sorted_slots, state_indices),
        )

    def copy_stats_async(self, *, stream: Any = None) -> None:
        """Enqueue a copy of the device counters into the page-locked host mirror."""
        self._group.copy_stats_async(self._stream(stream))

    def read_stats(self) -> list:
        """The host mirror as the last completed ``copy_stats_async`` left it (no sync)."""
        return list(self._group.read_stats())

    def stats(
        self,
        *,
        row_bytes: Optional[int] = None,
        num_layers: int = 1,
        synchronize: bool = True,
        stream: Any = None,
    ) -> dict:
        """Counters as a dict, with ``hit_rate`` and ``bytes_moved``.

        With ``synchronize`` (the default) the counters are copied on the
        stream and the stream is synchronised first, so the figures include
        all work enqueued so far; otherwise the last ``copy_stats_async`` is
        read as is. ``hit_rate`` = hits / (hits + misses) (0.0 before any
        lookup). ``bytes_moved`` = misses x row_bytes x num_layers (every
        layer of the group loads each missed row), None without a row size
        (``row_bytes`` defaults to the config's).
        """
        _args.require_int("num_layers", num_layers, 1)
        if row_bytes is None and self._config is not None:
            row_bytes = self._config.row_bytes
        if row_bytes is not None:
            _args.require_int("row_bytes", row_bytes, 0)
        if _args.require_bool("synchronize", synchronize):
            handle = self._stream(stream)
            self._group.copy_stats_async(handle)
            self._synchronize(stream, handle)
        values = dict(zip(_C.STAT_NAMES, self._group.read_stats()))
        looked_up = values["hits"] + values["misses"]
        values["hit_rate"] = values["hits"] / looked_up if looked_up else 0.0
        values["bytes_moved"] = None if row_bytes is None else values["misses"] * row_bytes * num_layers
        return values

    def _synchronize(self, stream: Any, handle: int) -> None:
        if self._info["device_type"] != _C.DEVICE_CUDA:
            return
        torch = torch_or_none()
        if torch is None:
            raise RuntimeError("stats(synchronize=True) on a CUDA group needs torch to synchronise the stream")
        device = torch.device("cuda", self._info["device_index"])
        if stream is not None and hasattr(stream, "synchronize"):
            stream.synchronize()
        elif handle == 0:  # the legacy default stream has no ExternalStream
            torch.cuda.synchronize(device)
        else:
            torch.cuda.ExternalStream(handle, device=device).synchronize()

    def resolve(
        self,
        topk_indices: Any,
        req_id_per_token: Any,
        request_state_indices: Any,
        hot_block_table: Any,
        *,
        host_rows: int,
        hot_block_size: Optional[int] = None,
        attention_block_stride: Optional[int] = None,
        row_offset: int = 0,
        source_block_table: Optional[Any] = None,
        block_size: Optional[int] = None,
        resident_block_table: Optional[Any] = None,
        resident_block_size: Optional[int] = None,
        num_valid_rows: Optional[Any] = None,
        out_attention: Optional[Any] = None,
        out_valid_counts: Optional[Any] = None,
        stream: Any = None,
    ) -> ResolveResult:
        """Resolve one step's top-k positions with the group's state.

        :func:`hisparse.ops.resolve_residency` with the group's
        device_global_indices, lru_slots, max_union_rows and counters; the
        outputs go to the shared rows [row_offset, row_offset + T) (T = rows
        of ``topk_indices``, whose width must be the group's top_k), except
        that ``out_attention`` / ``out_valid_counts`` redirect those two.
        ``hot_block_size`` and ``block_size`` default to the config's;
        ``attention_block_stride`` and ``resident_block_size`` to
        ``hot_block_size`` (the library's default for 0). Returns views of
        the rows written.
        """
        if hot_block_size is None:
            if self._config is None:
                raise ValueError("hot_block_size: required when the group has no config")
            hot_block_size = self._config.hot_block_size
        if block_size is None:
            block_size = self._config.block_size if (self._config is not None and source_block_table is not None) else 0
        self._group.resolve(
            _args.tensor("topk_indices", topk_indices),
            _args.tensor("req_id_per_token", req_id_per_token),
            _args.tensor("request_state_indices", request_state_indices),
            _args.tensor("hot_block_table", hot_block_table),
            _args.require_int("hot_block_size", hot_block_size, bits=64),
            _args.optional_int("attention_block_stride", attention_block_stride, 0),
            _args.require_int("host_rows", host_rows, bits=64),
            _args.require_int("row_offset", row_offset, bits=64),
            _args.optional_tensor("source_block_table", source_block_table),
            _args.require_int("block_size", block_size, bits=64),
            _args.optional_tensor("resident_block_table", resident_block_table),
            _args.optional_int("resident_block_size", resident_block_size, 0),
            _args.optional_tensor("num_valid_rows", num_valid_rows),
            _args.optional_tensor("out_attention", out_attention),
            _args.optional_tensor("out_valid_counts", out_valid_counts),
            self._stream(stream, topk_indices),
        )
        rows = slice(row_offset, row_offset + int(topk_indices.shape[0]))
        v = self._views
        return ResolveResult(
            attention_indices=v["attention_indices"][rows] if out_attention is None else out_attention,
            hot_rows=v["hot_rows"][rows],
            resolved_slots=v["resolved_slots"][rows],
            miss_mask=v["miss_mask"][rows],
            valid_counts=v["valid_counts"][rows] if out_valid_counts is None else out_valid_counts,
            swap_host_rows=v["swap_host_rows"][rows],
            swap_device_rows=v["swap_device_rows"][rows],
            swap_counts=v["swap_counts"][rows],
        )

    def __repr__(self) -> str:
        i = self._info
        return (
            f"IndexGroup(device={self.device}, max_num_reqs={i['max_num_reqs']}, "
            f"device_buffer_size={i['device_buffer_size']}, max_swap_rows={i['max_swap_rows']}, "
            f"top_k={i['top_k']}, max_union_rows={i['max_union_rows']})"
        )
