"""hisparse.Runtime: the per-layer data plane an engine calls every decode step.

A slim layer over the C++ runtime (hisparse/runtime.h): argument
conversion, torch's current stream, and tensor views of the results. The
first runtime of an index group (created without ``leader``) is the group
leader; it resolves residency once per step for the group and, for a
prefetch batch, loads every follower's rows on the group's copy stream (one
gather per follower, or one for all with ``group_gather=True`` when the
followers' host rows are laid out token-major: see
``Runtime.followers_staged_together``).
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from . import _C, _args
from ._tensors import torch_or_none
from .config import Config

__all__ = ["Runtime", "SlotInvalidator", "paged_cache_view"]

_TENSORS = _C.INDEX_GROUP_TENSORS
# hs_host_role_t by name, in code order.
_HOST_ROLES = ("auto", "writer", "reader")
# C ABI names -> the names the methods below give those arguments.
_SWAP_IN_NAMES = {"out_attention": "attention_indices_out", "out_valid_counts": "valid_counts_out",
                  "source_block_table": "block_table"}
_WRITE_NAMES = {"source_block_table": "block_table"}
_CREATE_NAMES = {"kv_dtype": "dtype", "topk_ready_event": "topk_ready", "device_type": "device",
                 "device_index": "device"}
_SOURCE_NAMES = {"host_cache": "kv_cache"}


def _torch():
    torch = torch_or_none()
    if torch is None:
        raise RuntimeError("hisparse.Runtime needs torch")
    return torch


class _Borrowed(NamedTuple):
    """A caller's tensor whose memory the runtime keeps using after the call that bound it."""

    value: Any  # the tensor as given
    keeper: Any  # a torch alias of its storage: replacing the tensor's storage frees nothing bound
    address: int  # its data address when bound; 0: not a torch tensor, or empty (nothing to check)


def _borrow(value: Any) -> _Borrowed:
    torch = torch_or_none()
    if torch is not None and isinstance(value, torch.Tensor):
        return _Borrowed(value, value.detach(), value.data_ptr())
    return _Borrowed(value, None, 0)


def _check_unmoved(borrowed: Dict[str, _Borrowed], whose: str = "") -> None:
    """Refuses to run on bound memory that its tensor no longer shows (``set_()``, or a ``resize_()`` that
    reallocated the storage): the library holds the address it was given, which the tensor may have freed."""
    for name, b in borrowed.items():
        if b.address != 0 and b.value.data_ptr() != b.address:
            raise RuntimeError(
                f"{name}{whose}: its memory moved after it was bound (its storage was replaced or reallocated, "
                f"e.g. by set_() or resize_(); bound at {b.address:#x}, now at {b.value.data_ptr():#x}); "
                "bind it again"
            )


def _torch_dtype(dtype: Any) -> Any:
    torch = _torch()
    element = getattr(torch, _args.dtype_name(dtype), None)
    if not isinstance(element, torch.dtype):
        raise TypeError(f"dtype: expected a torch dtype or dtype name, got {_args.shown(dtype)}")
    return element


def _strided_view(raw_tensor: Any, geometry: Tuple[int, tuple, tuple], dtype: Any) -> Any:
    """A torch view of ``raw_tensor``'s memory with the geometry the library computed.

    ``geometry`` is (data pointer, shape, element strides of ``dtype``) of a
    3-D view inside the contiguous ``raw_tensor``; the view shares (and keeps
    alive) raw_tensor's storage.
    """
    torch = _torch()
    data, shape, strides = geometry
    itemsize = _args.dtype_itemsize(dtype)
    flat = raw_tensor.reshape(-1).view(torch.uint8)
    view = torch.as_strided(
        flat,
        (shape[0], shape[1], shape[2] * itemsize),
        (strides[0] * itemsize, strides[1] * itemsize, 1),
        data - flat.data_ptr(),
    )
    return view if dtype == torch.uint8 else view.view(dtype)


def paged_cache_view(
    raw_tensor: Any,
    *,
    dtype: Any,
    row_width: int,
    byte_offset: int,
    block_stride: int,
    num_blocks: int,
    block_size: int,
) -> Any:
    """A ``[num_blocks, block_size, row_width]`` view of ``dtype`` into a byte slab.

    Block ``b`` starts ``byte_offset + b * block_stride`` bytes into the
    contiguous torch tensor ``raw_tensor`` (the seed's
    ``PagedCacheView.bind``): the view ``Runtime.bind_hot_cache`` binds, as
    the library computes and checks it (``hs_paged_cache_view``; errors name
    the argument).
    """
    torch = _torch()
    if not isinstance(raw_tensor, torch.Tensor):
        raise TypeError(f"raw_tensor: expected a torch.Tensor, got {type(raw_tensor).__name__}")
    element = _torch_dtype(dtype)
    geometry = _C.paged_cache_view(
        _args.tensor("raw_tensor", raw_tensor),
        _args.dtype_code("dtype", dtype),
        _args.require_int("row_width", row_width, bits=64),
        _args.require_int("byte_offset", byte_offset, bits=64),
        _args.require_int("block_stride", block_stride, bits=64),
        _args.require_int("num_blocks", num_blocks, bits=64),
        _args.require_int("block_size", block_size, bits=64),
    )
    return _strided_view(raw_tensor, geometry, element)


def _hint_choice(residency_hint: Optional[bool]) -> int:
    if residency_hint is None:
        return _C.RESIDENCY_HINT_AUTO
    return _C.RESIDENCY_HINT_ON if residency_hint else _C.RESIDENCY_HINT_OFF


def row_dtype(config: Config, dtype: Any) -> Any:
    """The element type of the KV rows: ``dtype``, else ``config.dtype``, else uint8 (the two must agree)."""
    if dtype is None:
        return config.dtype if config.dtype is not None else "uint8"
    if config.dtype is not None and _args.dtype_name(dtype) != _args.dtype_name(config.dtype):
        raise ValueError(f"dtype: {dtype} disagrees with config.dtype = {config.dtype}; give one of them")
    return dtype


class Runtime:
    """One attention layer's host/hot data plane and its share of an index group.

    ``config`` (a :class:`hisparse.Config`) sizes everything; ``dtype`` is the
    element type of the KV rows (default ``config.dtype``, else uint8: view
    FP8 caches as uint8), so a row is ``config.row_bytes / itemsize``
    elements. ``max_swap_rows`` (token rows of shared top-k state per
    forward) defaults to the leader's, else to the library's ``max_num_reqs *
    (1 + config.num_speculative_tokens)``. A runtime created with ``leader`` joins
    that runtime's index group. The leader alone may take a ``copy_stream``
    (torch.cuda.Stream or handle; default: the group creates one) and a
    ``topk_ready`` event (torch.cuda.Event or handle) that the producer of the
    top-k records; the copy stream then waits for it instead of the compute
    stream. ``residency_hint`` decides whether a leader keeps a residency
    hint for its group's CUDA resolves (a bit per host row, ``host_rows / 8``
    bytes of device memory): the fused gather's helper blocks, which read a
    request's predicted misses from host memory while the request still
    resolves, then predict them from its bits instead of from the state row.
    That took 0.88-0.97x the step's time at 1-64 requests missing 5-20%, but
    only launches with a helper block per request read it (from half the
    SMs on only the first requests have one), and elsewhere its upkeep costs
    1-3% (docs/residency.md, "Residency hint"; figures in
    docs/performance.md). The default, ``None``, keeps one where every
    launch of the group has such helpers: a CUDA group without speculative
    tokens, ``max_num_reqs`` below half the device's SMs and resolver
    arrays that fit shared memory (:meth:`default_residency_hint` says what
    it decides); ``True`` or ``False`` forces the choice. Followers use
    their leader's (give ``None`` or ``False``).

    Construction of a leader allocates and blocks; everything else runs on
    torch's current stream of the runtime's device (or ``stream``), never
    synchronises (except ``stats``) and can be captured in a CUDA graph.
    Bound tensors are borrowed: the runtime keeps references to them (and
    to their memory) until ``unbind_cache``, and a call that would use the
    memory of a bound tensor that no longer shows it (its storage replaced
    by ``set_()`` or reallocated by ``resize_()``) raises ``RuntimeError``
    naming the tensor; bind it again. A captured CUDA graph replays with the
    addresses it was captured with: keep bound tensors' storages as they
    are while it may run.
    """

    def __init__(
        self,
        config: Config,
        *,
        max_num_reqs: int,
        device: Any = None,
        dtype: Any = None,
        max_swap_rows: Optional[int] = None,
        leader: Optional["Runtime"] = None,
        copy_stream: Any = None,
        topk_ready: Any = None,
        residency_hint: Optional[bool] = None,
    ) -> None:
        if not isinstance(config, Config):
            raise TypeError(f"config: expected a hisparse.Config, got {type(config).__name__}")
        if leader is not None and not isinstance(leader, Runtime):
            raise TypeError(f"leader: expected a hisparse.Runtime or None, got {type(leader).__name__}")
        _args.require_int("max_num_reqs", max_num_reqs, 1, bits=32)
        if residency_hint is not None:
            _args.require_bool("residency_hint", residency_hint)
        dtype = row_dtype(config, dtype)
        kv_code = _args.dtype_code("dtype", dtype)
        if max_swap_rows is not None:
            _args.require_int("max_swap_rows", max_swap_rows, 1, bits=32)
        device_type, device_index = _args.device(device)
        if leader is not None and device is None:
            device_type, device_index = leader._info["device_type"], leader._info["device_index"]
        self._config = config
        try:
            self._rt = _C.Runtime(
                *config._c_fields(),
                device_type,
                device_index,
                max_num_reqs,
                max_swap_rows or 0,
                kv_code,
                leader._rt if leader is not None else None,
                _args.handle("copy_stream", copy_stream, "cuda_stream"),
                self._event_handle(topk_ready, device_type, device_index),
                _hint_choice(residency_hint),
            )
        except (TypeError, ValueError, RuntimeError) as error:
            raise _args.renamed(error, _CREATE_NAMES) from None
        self._info = self._rt.info()
        torch = _torch()
        self._dtype = _torch_dtype(dtype)
        self._leader = leader
        # Weak, so that a leader and its followers form no reference cycle.
        self._followers: List[weakref.ref] = []
        if leader is not None:
            leader._followers.append(weakref.ref(self))
        # Kept so that the borrowed streams and events outlive the group.
        self._copy_stream = copy_stream
        self._topk_ready = topk_ready
        self._views = {name: torch.from_dlpack(self._rt.group_tensor(which)) for name, which in _TENSORS.items()}
        # The bound tensors by argument name (kv_cache, registered_host_pool, raw_tensor, block_table), kept
        # alive and checked before each call that uses their memory.
        self._bound: Dict[str, _Borrowed] = {}
        self._hot = None
        #: int32 [B] state row per batch row, used by ``swap_in`` when none is given
        #: (the seed's runtime attribute, shared by every runtime of an engine).
        self.request_state_indices: Any = None

    @staticmethod
    def _event_handle(event: Any, device_type: int, device_index: int) -> int:
        if event is None or isinstance(event, int):
            return _args.handle("topk_ready", event, "cuda_event")
        if not hasattr(event, "cuda_event"):
            raise TypeError(
                f"topk_ready: expected None, an int handle or a torch.cuda.Event, got {type(event).__name__}"
            )
        if device_type != _C.DEVICE_CUDA:
            raise ValueError("topk_ready: a top-k-ready event needs a CUDA runtime")
        handle = _args.handle("topk_ready", event, "cuda_event")
        if handle == 0:
            # torch creates the CUDA event at its first record; record it once
            # so that a handle exists (a no-op dependency for later waits).
            torch = _torch()
            device = torch.device("cuda", device_index) if device_index >= 0 else torch.device("cuda")
            event.record(torch.cuda.current_stream(device))
            handle = _args.handle("topk_ready", event, "cuda_event")
        return handle

    # ------------------------------------------------------------------ description
    @property
    def config(self) -> Config:
        return self._config

    @property
    def is_group_leader(self) -> bool:
        return self._leader is None

    @property
    def leader(self) -> "Runtime":
        """The group leader (this runtime when it leads)."""
        return self if self._leader is None else self._leader

    @property
    def followers(self) -> List["Runtime"]:
        return [f for f in (ref() for ref in self._followers) if f is not None]

    @property
    def device(self) -> Any:
        torch = _torch()
        if self._info["device_type"] == _C.DEVICE_CUDA:
            return torch.device("cuda", self._info["device_index"])
        return torch.device("cpu")

    @property
    def kv_dtype(self) -> Any:
        return self._dtype

    @property
    def row_width(self) -> int:
        return self._info["row_width"]

    @property
    def row_bytes(self) -> int:
        return self._info["row_bytes"]

    @property
    def max_num_reqs(self) -> int:
        return self._info["max_num_reqs"]

    @property
    def max_swap_rows(self) -> int:
        return self._info["max_swap_rows"]

    @property
    def eager_host_mirror(self) -> bool:
        return self._info["eager_host_mirror"]

    def info(self) -> dict:
        """Current state (binding, cursor, staged rows, group size) as a dict."""
        return self._rt.info()

    # ------------------------------------------------------------------ group tensors
    def _group_view(name: str, doc: str) -> property:  # noqa: N805 (a class-body helper)
        def get(self: "Runtime") -> Any:
            return self._views[name]

        get.__doc__ = doc
        return property(get)

    device_global_indices = _group_view("device_global_indices", "int32 [S, H]: host slot held by each hot slot.")
    lru_slots = _group_view("lru_slots", "int16 [S, H]: hot slots from least to most recently used.")
    attention_indices = _group_view("attention_indices", "int32 [R, K]: shared attention indices, -1 = masked.")
    valid_counts = _group_view("valid_counts", "int32 [R]: entries with an attention index per token row.")
    hot_rows = _group_view("hot_rows", "int32 [R, K]: physical hot (or resident) row per entry.")
    resolved_slots = _group_view("resolved_slots", "int32 [R, K]: host slot per entry.")
    miss_mask = _group_view("miss_mask", "int32 [R, K]: 1 at the first occurrence of each missed slot.")
    swap_host_rows = _group_view("swap_host_rows", "int32 [R, K]: compact swap list, host slots.")
    swap_device_rows = _group_view("swap_device_rows", "int32 [R, K]: compact swap list, physical hot rows.")
    swap_counts = _group_view("swap_counts", "int32 [R]: swap entries per token row.")
    counters = _group_view("counters", "int64 [5]: lookups, hits, misses, resident, invalid (device).")
    del _group_view

    # ------------------------------------------------------------------ binding
    @property
    def host_cache(self) -> Any:
        """The bound host (source) cache, or None."""
        return self._bound_value("kv_cache")

    @property
    def hot(self) -> Any:
        """The bound hot view ``[num_blocks, block_size, row_width]`` into the slab, or None."""
        return self._hot

    @property
    def hot_block_table(self) -> Any:
        return self._bound_value("block_table")

    def _bound_value(self, name: str) -> Any:
        borrowed = self._bound.get(name)
        return None if borrowed is None else borrowed.value

    @property
    def followers_staged_together(self) -> bool:
        """Whether this leader's followers' layout allows ``swap_in(..., group_gather=True)``.

        True when the group has at least two followers whose host caches tile
        one token-major span: same dtype, row width, host rows and slot pitch,
        and base addresses exactly one row apart (e.g. ``host[:, l, :]`` of a
        ``[slots, layers, W]`` :class:`hisparse.HostPool` view for every
        follower ``l``), and whose hot views share one layout. It reports the
        layout, not what a call does: followers are staged one by one unless
        a call asks for ``group_gather``. Read from the current bindings (it
        follows every rebinding); always False on a follower. See
        docs/staging.md, "Token-major host layout".
        """
        return self._rt.info()["followers_staged_together"]

    @property
    def attention_block_stride(self) -> int:
        """Rows between hot blocks as the attention kernel addresses them (0 unbound)."""
        return self._rt.info()["attention_block_stride"]

    def bind_source_cache(self, kv_cache: Any, *, registered_host_pool: Any = None) -> None:
        """Bind the host cache ``[rows, ..., row_width]`` (host slot g = row g).

        It must be host memory of the runtime's dtype and row width; on CUDA
        pinned or registered (e.g. a :class:`hisparse.HostPool` view).
        ``registered_host_pool`` is the registered range that holds it.
        """
        try:
            self._rt.bind_source_cache(
                _args.tensor("kv_cache", kv_cache), _args.optional_tensor("registered_host_pool", registered_host_pool)
            )
        except (TypeError, ValueError, RuntimeError) as error:
            raise _args.renamed(error, _SOURCE_NAMES) from None
        self._bound["kv_cache"] = _borrow(kv_cache)
        self._bound["registered_host_pool"] = _borrow(registered_host_pool)

    def bind_hot_cache(
        self,
        raw_tensor: Any,
        *,
        byte_offset: int,
        block_stride: int,
        num_blocks: int,
        block_size: int,
        block_table: Any,
    ) -> None:
        """Bind this layer's strided view into the shared GPU slab.

        ``block_stride`` is in bytes (a multiple of the row size);
        ``block_table`` is int32 ``[B, >= ceil(H / block_size)]``, the
        physical hot block of each logical hot block per batch row.
        """
        self._rt.bind_hot_cache(
            _args.tensor("raw_tensor", raw_tensor),
            _args.require_int("byte_offset", byte_offset, bits=64),
            _args.require_int("block_stride", block_stride, bits=64),
            _args.require_int("num_blocks", num_blocks, bits=64),
            _args.require_int("block_size", block_size, bits=64),
            _args.tensor("block_table", block_table),
        )
        self._bound["raw_tensor"] = _borrow(raw_tensor)
        self._bound["block_table"] = _borrow(block_table)
        # The view the library bound (a NumPy slab simply has no torch view).
        torch = torch_or_none()
        is_torch = torch is not None and isinstance(raw_tensor, torch.Tensor)
        self._hot = _strided_view(raw_tensor, self._rt.hot_cache(), self._dtype) if is_torch else None

    def unbind_cache(self) -> None:
        """Restore the unbound state without unregistering the host pool."""
        self._rt.unbind()
        self._bound = {}
        self._hot = None

    def _check_bound_memory(self, *, group: bool = False) -> None:
        """Refuses before a call that uses this runtime's bound memory (and, with ``group``, its followers')
        if a bound tensor's memory moved since it was bound."""
        _check_unmoved(self._bound)
        if group:
            for index, follower in enumerate(self.followers):
                _check_unmoved(follower._bound, f" (bound to follower {index} of this leader)")

    # ------------------------------------------------------------------ decode step
    def _stream(self, stream: Any, *tensors: Any) -> int:
        return _args.stream(stream, self._views["device_global_indices"], *tensors)

    def begin_forward(self) -> None:
        """Reset the per-forward row cursor (call on every runtime before a forward)."""
        self._rt.begin_forward()

    def swap_in(
        self,
        topk_indices: Any = None,
        req_id_per_token: Any = None,
        *,
        request_state_indices: Any = None,
        block_table: Any = None,
        block_size: Optional[int] = None,
        resident_block_table: Any = None,
        resident_block_size: Optional[int] = None,
        num_valid_rows: Any = None,
        prefetch: bool = False,
        return_valid_counts: bool = False,
        attention_indices_out: Any = None,
        valid_counts_out: Any = None,
        num_tokens: Optional[int] = None,
        ignore_topk_ready: bool = False,
        fused_gather: bool = _C.DEFAULT_FUSED_GATHER == 1,
        group_gather: bool = False,
        seq_lens: Any = None,
        stream: Any = None,
    ) -> Any:
        """Resolve once per group and make this layer's rows available.

        The leader reads ``topk_indices`` (int32 [T, top_k] request-relative
        positions), ``req_id_per_token``, ``request_state_indices`` (default
        :attr:`request_state_indices`), the source ``block_table`` (positions
        -> host slots; None: positions are host slots) with ``block_size``
        (default config.block_size), the optional ``resident_block_table``,
        ``num_valid_rows``, ``prefetch`` (stage every follower now) and the
        optional outputs. A follower needs only T (``num_tokens``) and
        refuses a top-k (it reuses its leader's resolution). Returns the
        attention indices of this call's rows (``attention_indices_out`` when
        given), with the valid counts when ``return_valid_counts``.

        A top-k narrower than ``config.top_k`` (k columns) and per-request
        lengths ``seq_lens`` (int32 [>= B]: positions at or past
        ``seq_lens[b]`` are dropped) are applied before the resolve, on a
        copy padded to ``top_k`` columns; the returned indices are then the
        first k columns of the shared rows.

        ``fused_gather`` (leader only; followers ignore it; default
        ``True``, ``hisparse._C.DEFAULT_FUSED_GATHER``): the resolve launch
        itself copies the leader's own missed rows into its hot cache, in the
        resolver's automatic schedule (a request with many misses publishes
        its swap list to the same launch's helper blocks, one per SM the
        batch leaves idle, through the index group's handoff array; past the
        SM count each request's block copies its own rows, two blocks per
        SM, where the shape fits, and otherwise the same call enqueues a
        tail gather right after the resolve);
        ``False`` runs a separate gather after the resolve.
        Bytes, indices, state and counters are the same either way; followers
        still gather on the leader's swap list. See docs/residency.md, "Fused
        gather".

        ``group_gather`` (leader only; followers ignore it): this prefetch
        batch stages all followers with one ``gather_compact_group`` from
        their token-major host span instead of one gather per follower. It
        needs ``prefetch=True`` and followers whose host caches tile
        (:attr:`followers_staged_together`); otherwise ``ValueError`` naming
        ``group_gather``, raised before anything is enqueued. Bytes and
        indices are the same either way. The group gather reads more bytes
        per second but makes every follower wait for all followers' bytes, so
        it pays only when a layer's attention is short next to a follower's
        copy; see docs/staging.md, "Token-major host layout".
        """
        if request_state_indices is None:
            request_state_indices = self.request_state_indices
        if topk_indices is not None:
            _args.check_tensor("topk_indices", topk_indices)
        if not self.is_group_leader and topk_indices is not None:
            raise ValueError(
                "topk_indices: a follower reuses its group leader's resolution of the step and reads no top-k; "
                "pass num_tokens (the step's token rows) instead"
            )
        if self.is_group_leader and topk_indices is not None and req_id_per_token is not None:
            _args.check_tensor("topk_indices", topk_indices, sliceable=True)
            if len(topk_indices.shape) != 2:
                shape = tuple(topk_indices.shape)
                raise ValueError(f"topk_indices: expected 2 dimensions [T, top_k], got shape {shape}")
            req_id_per_token = _args.check_tensor("req_id_per_token", req_id_per_token, sliceable=True)
            if len(req_id_per_token.shape) != 1:
                raise ValueError(f"req_id_per_token: expected 1 dimension, got shape {tuple(req_id_per_token.shape)}")
            req_id_per_token = req_id_per_token[: topk_indices.shape[0]]
        return_valid_counts = _args.require_bool("return_valid_counts", return_valid_counts)
        # A leader's prefetch batch stages every follower's rows too.
        self._check_bound_memory(group=self.is_group_leader and _args.require_bool("prefetch", prefetch))
        try:
            first, count, _ = self._rt.swap_in(
                _args.optional_tensor("topk_indices", topk_indices),
                _args.optional_tensor("req_id_per_token", req_id_per_token),
                _args.optional_tensor("request_state_indices", request_state_indices),
                _args.optional_tensor("block_table", block_table),
                _args.optional_int("block_size", block_size, 0, 0, bits=32),
                _args.optional_tensor("resident_block_table", resident_block_table),
                _args.optional_int("resident_block_size", resident_block_size, 0, 0, bits=32),
                _args.optional_tensor("num_valid_rows", num_valid_rows),
                _args.optional_tensor("attention_indices_out", attention_indices_out),
                _args.optional_tensor("valid_counts_out", valid_counts_out),
                _args.require_bool("prefetch", prefetch),
                _args.require_bool("ignore_topk_ready", ignore_topk_ready),
                _args.optional_int("num_tokens", num_tokens, 0, 0),
                _args.flag("fused_gather", fused_gather),
                _args.flag("group_gather", group_gather),
                self._stream(stream, topk_indices),
                _args.optional_tensor("seq_lens", seq_lens),
            )
        except (TypeError, ValueError, RuntimeError) as error:
            raise _args.renamed(error, _SWAP_IN_NAMES) from None
        rows = slice(first, first + count)
        attention = self._views["attention_indices"][rows] if attention_indices_out is None else attention_indices_out
        if topk_indices is not None and attention_indices_out is None:
            attention = attention[:, : topk_indices.shape[1]]
        if return_valid_counts:
            counts = self._views["valid_counts"][rows] if valid_counts_out is None else valid_counts_out
            return attention, counts
        return attention

    def reset_hot_state(self, *, stream: Any = None) -> None:
        """Drop all hot-buffer bookkeeping of the group (hits become misses), stream-ordered."""
        self._rt.reset_hot_state(self._stream(stream))

    @property
    def residency_hint(self) -> bool:
        """Whether the group keeps a residency hint: the leader's ``residency_hint``, with ``None`` decided."""
        return self._info["residency_hint"]

    @staticmethod
    def default_residency_hint(config: Config, *, max_num_reqs: int, device: Any = None) -> bool:
        """Whether a leader of ``config`` and ``max_num_reqs`` created on ``device``
        with ``residency_hint=None`` (the default) keeps a residency hint."""
        if not isinstance(config, Config):
            raise TypeError(f"config: expected a hisparse.Config, got {type(config).__name__}")
        _args.require_int("max_num_reqs", max_num_reqs, 1, bits=32)
        device_type, device_index = _args.device(device)
        try:
            return _C.runtime_default_residency_hint(*config._c_fields(), max_num_reqs, device_type, device_index)
        except (TypeError, ValueError, RuntimeError) as error:
            raise _args.renamed(error, _CREATE_NAMES) from None

    def rebuild_residency_hint(self, *, stream: Any = None) -> None:
        """Rebuild the group's residency hint from its state, stream-ordered.

        Call it after writing ``device_global_indices`` directly (restoring a
        snapshot): the hint predicts the misses the fused gather reads early,
        and a stale one wastes host reads. A no-op without a hint (created
        without a hint, or on the CPU).
        """
        self._rt.rebuild_residency_hint(self._stream(stream))

    def reset_request(self, state_row: int, *, stream: Any = None) -> None:
        """Drop the hot state of one request (state row ``state_row``) in the group, stream-ordered.

        Call it when a state row changes hands, so a new request is never
        served the previous one's rows; other rows and the counters stay.
        """
        self._rt.reset_request(_args.require_int("state_row", state_row, bits=32), self._stream(stream))

    def reset_stats(self, *, stream: Any = None) -> None:
        """Zero the group's counters (the hot state stays), stream-ordered."""
        self._rt.reset_stats(self._stream(stream))

    def write(
        self,
        rows: Any,
        req_id_per_token: Any,
        positions: Any,
        *,
        request_state_indices: Any = None,
        block_table: Any = None,
        block_size: Optional[int] = None,
        resident_cache: Any = None,
        resident_block_table: Any = None,
        skip_host_store: bool = False,
        stream: Any = None,
    ) -> None:
        """The write op: this forward's new rows of the layer, so that no stale copy can be served.

        ``rows`` [T, row_width] (the runtime's dtype, on its device) go to
        their host slots (``positions`` through the source ``block_table``
        with ``block_size``, or positions are host slots without one), to
        their resident copy (``resident_cache``, a paged view, with
        ``resident_block_table``) and over every hot copy of their slot in the
        group's hot state (write-through, after this layer's prefetched rows
        landed). A reader of a shared pool (and ``skip_host_store=True``)
        leaves the host cache alone. Stream-ordered, capturable.
        """
        if request_state_indices is None:
            request_state_indices = self.request_state_indices
        self._check_bound_memory()
        try:
            self._rt.write(
                _args.tensor("rows", rows),
                _args.tensor("req_id_per_token", req_id_per_token),
                _args.tensor("positions", positions),
                _args.tensor("request_state_indices", request_state_indices),
                _args.optional_tensor("block_table", block_table),
                _args.optional_int("block_size", block_size, 0),
                _args.optional_tensor("resident_cache", resident_cache),
                _args.optional_tensor("resident_block_table", resident_block_table),
                _args.flag("skip_host_store", skip_host_store),
                self._stream(stream, rows),
            )
        except (TypeError, ValueError, RuntimeError) as error:
            raise _args.renamed(error, _WRITE_NAMES) from None

    def set_host_sharing(self, role: str = "auto", event: Any = None) -> None:
        """Who writes the host cache: ``role`` "auto" (learned from the pool at
        ``bind_source_cache``), "writer" or "reader", and an optional
        :class:`hisparse.IpcEvent` the writer records after its host writes and
        a reader waits on before its gathers. The runtime keeps a reference to
        the event.
        """
        from .ipc_event import IpcEvent  # noqa: PLC0415

        if event is not None and not isinstance(event, IpcEvent):
            raise TypeError(f"event: expected a hisparse.IpcEvent or None, got {type(event).__name__}")
        # _C.Runtime keeps the event alive while it holds it.
        self._rt.set_host_sharing(_args.choice("role", role, _HOST_ROLES), None if event is None else event._event)

    @property
    def is_writer(self) -> bool:
        """Whether this runtime writes its host cache (False on a reader of a shared pool)."""
        return bool(self._rt.info()["is_writer"])

    def invalidate_sorted_slots(self, sorted_slots: Any, state_indices: Any, *, stream: Any = None) -> None:
        """Drop hot copies of the host slots in ``sorted_slots`` (ascending) for ``state_indices``."""
        self._rt.invalidate_sorted_slots(
            _args.tensor("sorted_slots", sorted_slots),
            _args.tensor("state_indices", state_indices),
            self._stream(stream, sorted_slots),
        )

    def mirror_rows(self, src_rows: Any, slot_mapping: Any, *, stream: Any = None) -> None:
        """``host_cache[slot_mapping[i]] = src_rows[i]`` (device rows into the host pool), stream-ordered."""
        self._check_bound_memory()
        self._rt.mirror_rows(
            _args.tensor("src_rows", src_rows),
            _args.tensor("slot_mapping", slot_mapping),
            self._stream(stream, src_rows),
        )

    # ------------------------------------------------------------------ prefill
    def gather_prefill_cache(
        self, plan: Any, resident_cache: Any = None, *, min_rows: Optional[int] = None
    ) -> Any:
        """Stage this layer's bound host cache for a shared prefill ``plan``.

        :func:`hisparse.staging.gather_prefill_cache` on the cache given to
        ``bind_source_cache``. The plan's block size must be the cache's:
        dimension 1 of a paged host cache ``[blocks, block_size, row]``, else
        ``config.block_size``. Returns ``[num_blocks, block_size, row_width]``
        on the plan's device (which must be the runtime's).
        """
        from . import staging  # noqa: PLC0415

        if not isinstance(plan, staging.StagingPlan):
            raise TypeError(f"plan: expected a hisparse.StagingPlan, got {type(plan).__name__}")
        host_cache = self.host_cache
        if host_cache is None:
            raise RuntimeError("gather_prefill_cache: the runtime has no source cache; call bind_source_cache first")
        cache_block_size = host_cache.shape[1] if len(host_cache.shape) >= 3 else self._config.block_size
        if cache_block_size != plan.block_size:
            raise ValueError(
                f"HiSparse staging block size {plan.block_size} does not match "
                f"the KV cache block size {cache_block_size}."
            )
        plan_device = plan.row_ids.device
        if self._info["device_type"] == _C.DEVICE_CUDA:
            index = self._info["device_index"]
            expected = "cuda" if index < 0 else f"cuda:{index}"
            same = plan_device.type == "cuda" and (index < 0 or plan_device.index == index)
        else:
            expected, same = "cpu", plan_device.type == "cpu"
        if not same:
            raise ValueError(f"plan: expected a plan on the runtime's device {expected}, got one on {plan_device}")
        if min_rows is None:
            min_rows = staging.MIN_STAGED_PREFILL_ROWS
        _args.require_int("min_rows", min_rows, 0, bits=32)
        return staging.gather_prefill_cache(plan, host_cache, resident_cache, min_rows=min_rows)

    # ------------------------------------------------------------------ counters
    def copy_stats_async(self, *, stream: Any = None) -> None:
        self._rt.copy_stats_async(self._stream(stream))

    def stats(self, *, synchronize: bool = True, stream: Any = None) -> dict:
        """The group's counters with ``hit_rate`` and ``bytes_moved``.

        ``bytes_moved`` = misses x row bytes summed over the group's layers.
        With ``synchronize`` the counters are copied on the stream and the
        stream is synchronised first; otherwise the last ``copy_stats_async``
        is read as it is.
        """
        if _args.require_bool("synchronize", synchronize):
            handle = self._stream(stream)
            self._rt.copy_stats_async(handle)
            if self._info["device_type"] == _C.DEVICE_CUDA:
                torch = _torch()
                if stream is not None and hasattr(stream, "synchronize"):
                    stream.synchronize()
                elif handle == 0:
                    torch.cuda.synchronize(self.device)
                else:
                    torch.cuda.ExternalStream(handle, device=self.device).synchronize()
        return self._rt.stats()

    def __repr__(self) -> str:
        role = "leader" if self.is_group_leader else "follower"
        return (
            f"Runtime({role}, device={self.device}, dtype={self._dtype}, row_width={self.row_width}, "
            f"max_num_reqs={self.max_num_reqs}, max_swap_rows={self.max_swap_rows})"
        )


class SlotInvalidator:
    """Drop hot copies of rewritten host slots for many index groups at once.

    The seed's ``HiSparseSlotInvalidator``: one launch over the
    ``device_global_indices`` of every given runtime's group. The device array
    of table pointers is built once per set of groups (blocking: call once
    outside CUDA-graph capture) and cached.
    """

    def __init__(self, request_state_indices: Any) -> None:
        torch = _torch()
        if not isinstance(request_state_indices, torch.Tensor):
            raise TypeError(
                f"request_state_indices: expected a torch.Tensor, got {type(request_state_indices).__name__}"
            )
        self.request_state_indices = request_state_indices
        device = request_state_indices.device
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            self._inv = _C.SlotInvalidator(_C.DEVICE_CUDA, index)
        else:
            self._inv = _C.SlotInvalidator(_C.DEVICE_CPU, 0)

    def __call__(
        self, leaders: Sequence[Runtime], written_slots: Any, req_id_per_token: Any, *, stream: Any = None
    ) -> None:
        leaders = _args.sequence("leaders", leaders)
        for i, leader in enumerate(leaders):
            if not isinstance(leader, Runtime):
                raise TypeError(f"leaders[{i}]: expected a hisparse.Runtime, got {type(leader).__name__}")
        self._inv.run(
            [leader._rt for leader in leaders],
            _args.tensor("request_state_indices", self.request_state_indices),
            _args.tensor("req_id_per_token", req_id_per_token),
            _args.tensor("written_slots", written_slots),
            _args.stream(stream, self.request_state_indices),
        )
