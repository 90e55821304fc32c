"""hisparse.HostPool: the pinned host memory that holds every layer's KV."""

from __future__ import annotations

import atexit
import math
import weakref
from typing import Any, Optional, Sequence, Union

from . import _C, _args
from ._tensors import torch_or_none

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
        _args.require_int("size_bytes", size_bytes, 1, bits=64)
        if register not in _REGISTRATION:
            raise ValueError(f"register: expected one of {sorted(_REGISTRATION)}, got {register!r}")
        self._pool = _C.HostPool(
            size_bytes,
            _args.optional_int("populate_threads", populate_threads, 0, 1),
            _REGISTRATION[register],
            _args.optional_int("device", device, -1, 0),
            bool(huge_pages),
            bool(check_memory),
            _args.optional_int("max_segment_bytes", max_segment_bytes, 0, 1),
        )
        self._size = size_bytes
        _live_pools.add(self)

    # ------------------------------------------------------------------ facts
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
        """Setup figures: bytes, populate and register seconds, segments, ..."""
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
        return f"HostPool({self._size} bytes, {state})"


def _torch_dtype(torch: Any, dtype: Any) -> Any:
    if isinstance(dtype, torch.dtype):
        return dtype
    element = getattr(torch, _args.dtype_name(dtype), None)
    if not isinstance(element, torch.dtype):
        raise TypeError(f"dtype: {dtype!r} is not a torch dtype")
    return element


def _numpy_dtype(dtype: Any) -> Any:
    import numpy as np  # noqa: PLC0415

    try:
        return np.dtype(_args.dtype_name(dtype))
    except TypeError as error:
        raise TypeError(
            f"dtype: NumPy has no {dtype!r}; view the pool as a torch tensor or as same-sized integers"
        ) from error


@atexit.register
def _release_all_pools() -> None:
    # Unregister before the CUDA runtime tears down; nothing runs after this.
    for pool in list(_live_pools):
        try:
            pool.release(force=True)
        except Exception:  # noqa: BLE001 - at exit, leaking beats crashing
            pass
