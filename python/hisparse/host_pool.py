"""hisparse.HostPool: the pinned host memory that holds every layer's KV."""

from __future__ import annotations

import atexit
import math
import weakref
from typing import Any, Optional, Sequence, Union

from . import _C, _args
from ._tensors import torch_or_none
from .shared_pool import broadcast_pool_id

__all__ = ["HostPool"]

_REGISTRATION = {"auto": _C.REGISTER_AUTO, "always": _C.REGISTER_ALWAYS, "never": _C.REGISTER_NEVER}
_live_pools: "weakref.WeakSet[HostPool]" = weakref.WeakSet()


class HostPool:
    """An exact-size, page-aligned host region, populated and GPU-registered.

    ``register``: "auto" registers with the GPU when the CUDA backend and a
    device are present, "always" fails otherwise, "never" skips it. Pages are
    populated by ``populate_threads`` threads (None: one per core) before
    registration. The pool is released by ``release()``, on garbage
    collection, and at interpreter exit.
    """

    def __init__(
        self,
        size_bytes: int,
        *,
        populate_threads: Optional[int] = None,
        register: str = "auto",
        device: Optional[int] = None,
        huge_pages: bool = True,
        check_memory: bool = True,
        max_segment_bytes: Optional[int] = None,
    ) -> None:
        self._pool = _C.HostPool(
            *_pool_options(size_bytes, register, populate_threads, device, huge_pages, check_memory, max_segment_bytes)
        )
        self._size = size_bytes
        _live_pools.add(self)

    @classmethod
    def shared(
        cls,
        size_bytes: int,
        *,
        group: Any = None,
        pool_id: Optional[bytes] = None,
        rank: Optional[int] = None,
        ranks: Optional[int] = None,
        writer_rank: int = 0,
        populate_threads: Optional[int] = None,
        register: str = "auto",
        device: Optional[int] = None,
        huge_pages: bool = True,
        check_memory: bool = True,
        max_segment_bytes: Optional[int] = None,
        timeout: float = _C.SHARED_POOL_DEFAULT_TIMEOUT_SECONDS,
    ) -> "HostPool":
        """This rank's view of one host pool shared by the ranks of a group.

        A collective over the torch.distributed process group ``group``
        (None: the world group; gloo or NCCL): rank 0 makes the pool id and
        broadcasts it through the group, every rank attaches to one named
        shared-memory region, populates its share of the pages, and
        registers the whole region with its own device (``register``,
        ``device`` as for a private pool). Returns on every rank once every
        rank is ready, or raises on every rank: a rank that fails, dies or
        makes no progress for ``timeout`` seconds is named in the error, and
        nothing stays in /dev/shm. ``pool_id``, ``rank`` and ``ranks``
        replace the group for callers with their own channel (the id from
        :func:`hisparse.shared_pool_id`, sent to every rank).

        ``size_bytes`` and ``writer_rank`` (the one rank that writes rows;
        the others only read) must agree on every rank. Views, ``info()``
        (adds ``shared``, ``rank``, ``ranks``, ``writer_rank``,
        ``is_writer``, this rank's share and wait times) and ``release()``
        (this rank's registration and mapping) work as for a private pool.
        """
        options = _pool_options(size_bytes, register, populate_threads, device, huge_pages, check_memory,
                                max_segment_bytes)
        for name, value in (("writer_rank", writer_rank), ("rank", rank), ("ranks", ranks)):
            if value is not None:
                _args.require_int(name, value, 0, bits=32)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"timeout: expected a positive number of seconds, got {_args.shown(timeout)}")
        if pool_id is None:
            if rank is not None or ranks is not None:
                raise ValueError("rank, ranks: give them with pool_id; with a group they come from the group")
            pool_id, rank, ranks = broadcast_pool_id(group)
        else:
            if group is not None:
                raise ValueError("group: give either a group or pool_id with rank and ranks, not both")
            if not isinstance(pool_id, (bytes, bytearray)):
                raise TypeError(f"pool_id: expected bytes from hisparse.shared_pool_id(), got {type(pool_id).__name__}")
            if rank is None or ranks is None:
                raise ValueError("rank, ranks: pool_id needs this process's rank and the rank count")
        pool = cls.__new__(cls)
        size, threads, registration, device_index, huge, check, segment_bytes = options
        pool._pool = _C.HostPool.shared(
            bytes(pool_id), rank, ranks, size, writer_rank, threads, registration, device_index, huge, check,
            segment_bytes, float(timeout),
        )
        pool._size = size_bytes
        _live_pools.add(pool)
        return pool

    # ------------------------------------------------------------------ facts
    @property
    def is_shared(self) -> bool:
        """True for a pool made by :meth:`shared`."""
        return bool(self._pool.info()["shared"])

    @property
    def is_writer(self) -> bool:
        """Whether this rank may write rows (always True for a private pool)."""
        return bool(self._pool.info()["is_writer"])

    @property
    def nbytes(self) -> int:
        return self._size

    @property
    def released(self) -> bool:
        return bool(self._pool.info()["released"])

    @property
    def registered(self) -> bool:
        return bool(self._pool.info()["registered"])

    @property
    def data_ptr(self) -> int:
        """Base address; RuntimeError after release."""
        return self._pool.data_ptr

    def info(self) -> dict:
        """Setup figures: bytes, populate and register seconds, segments, and
        the sharing facts (``shared``, ``rank``, ``ranks``, ``writer_rank``,
        ``is_writer``, ``share_offset``, ``share_bytes``, ``wait_seconds``,
        ``ready_seconds``; a private pool is rank 0 of 1)."""
        return self._pool.info()

    def segments(self) -> list:
        """Registered (address, bytes) ranges, exact."""
        return self._pool.segments()

    # ------------------------------------------------------------------ views
    def view(
        self,
        dtype: Any = "uint8",
        shape: Optional[Union[int, Sequence[int]]] = None,
        *,
        offset: int = 0,
        numpy: bool = False,
    ) -> Any:
        """A zero-copy tensor over the pool.

        Returns a torch tensor (CPU) when torch is installed and ``numpy`` is
        False, else a NumPy array. ``shape`` defaults to every whole element
        after ``offset``. The view keeps the pool alive; ``release()`` refuses
        while views exist.
        """
        itemsize = _args.dtype_itemsize(dtype)
        _args.require_int("offset", offset, 0)
        numpy = _args.require_bool("numpy", numpy)
        if offset % itemsize != 0:
            raise ValueError(f"offset: expected a multiple of the {itemsize}-byte element size, got {offset}")
        if shape is None:
            shape = ((self._size - min(offset, self._size)) // itemsize,)
        elif isinstance(shape, int):
            shape = (shape,)
        elif isinstance(shape, (tuple, list)):
            shape = tuple(shape)
        else:
            raise TypeError(f"shape: expected None, an int or a sequence of ints, got {type(shape).__name__}")
        shape = tuple(_args.require_int(f"shape[{i}]", d, 0) for i, d in enumerate(shape))
        torch = None if numpy else torch_or_none()
        # Resolve the element type before touching the pool, so a bad dtype
        # leaves no view behind.
        element = _numpy_dtype(dtype) if torch is None else _torch_dtype(torch, dtype)
        nbytes = math.prod(shape) * itemsize
        if offset + nbytes > self._size:
            raise ValueError(
                f"shape: {shape} of {itemsize}-byte elements from offset {offset} ends at byte {offset + nbytes}, "
                f"which exceeds the pool's {self._size} bytes"
            )
        raw = self._pool.view_bytes(offset, nbytes)
        if torch is None:
            return raw.view(element).reshape(shape)
        return torch.from_numpy(raw).view(element).view(shape)

    # ------------------------------------------------------------------ lifetime
    def release(self, *, force: bool = False) -> None:
        """Unregister, then unmap. Idempotent.

        Synchronise the GPU first if kernels may still read the pool.
        RuntimeError while tensor views are alive, unless ``force``.
        """
        self._pool.release(force)

    def __enter__(self) -> "HostPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release(force=True)

    def __repr__(self) -> str:
        info = self._pool.info()
        state = "released" if info["released"] else ("registered" if info["registered"] else "unregistered")
        shared = f", shared rank {info['rank']} of {info['ranks']}" if info["shared"] else ""
        return f"HostPool({self._size} bytes, {state}{shared})"


def _pool_options(
    size_bytes: Any, register: Any, populate_threads: Any, device: Any, huge_pages: Any, check_memory: Any,
    max_segment_bytes: Any,
) -> tuple:
    """The arguments every pool takes, private or shared, as _C takes them (0 and -1 for the defaults)."""
    size = _args.require_int("size_bytes", size_bytes, 1, bits=64)
    if not isinstance(register, str):
        raise TypeError(f"register: expected one of {sorted(_REGISTRATION)}, got {type(register).__name__}")
    if register not in _REGISTRATION:
        raise ValueError(f"register: expected one of {sorted(_REGISTRATION)}, got {_args.shown(register)}")
    return (
        size,
        _args.optional_int("populate_threads", populate_threads, 0, 1),
        _REGISTRATION[register],
        _args.optional_int("device", device, -1, 0),
        _args.require_bool("huge_pages", huge_pages),
        _args.require_bool("check_memory", check_memory),
        _args.optional_int("max_segment_bytes", max_segment_bytes, 0, 1),
    )


def _torch_dtype(torch: Any, dtype: Any) -> Any:
    if isinstance(dtype, torch.dtype):
        return dtype
    element = getattr(torch, _args.dtype_name(dtype), None)
    if not isinstance(element, torch.dtype):
        raise TypeError(f"dtype: {_args.shown(dtype)} is not a torch dtype")
    return element


def _numpy_dtype(dtype: Any) -> Any:
    import numpy as np  # noqa: PLC0415

    try:
        return np.dtype(_args.dtype_name(dtype))
    except TypeError as error:
        raise TypeError(
            f"dtype: NumPy has no {_args.shown(dtype)}; view the pool as a torch tensor or as same-sized integers"
        ) from error


@atexit.register
def _release_all_pools() -> None:
    # Unregister before the CUDA runtime tears down; nothing runs after this.
    for pool in list(_live_pools):
        try:
            pool.release(force=True)
        except Exception:  # noqa: BLE001 - at exit, leaking beats crashing
            pass
