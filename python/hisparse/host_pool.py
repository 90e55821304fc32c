"""hisparse.HostPool: the pinned host memory that holds every layer's KV."""

from __future__ import annotations

import atexit
import math
import weakref
from typing import Any, Optional, Sequence, Union

from . import _C
from ._tensors import torch_or_none
from .config import dtype_itemsize

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
        if isinstance(size_bytes, bool) or not isinstance(size_bytes, int):
            raise TypeError(f"size_bytes: expected an int, got {type(size_bytes).__name__}")
        if size_bytes <= 0:
            raise ValueError(f"size_bytes: expected a positive pool size, got {size_bytes}")
        if register not in _REGISTRATION:
            raise ValueError(f"register: expected one of {sorted(_REGISTRATION)}, got {register!r}")
        if populate_threads is not None and (not isinstance(populate_threads, int) or populate_threads < 1):
            raise ValueError(f"populate_threads: expected None or a positive int, got {populate_threads!r}")
        if device is not None and (not isinstance(device, int) or device < 0):
            raise ValueError(f"device: expected None or a device index >= 0, got {device!r}")
        self._pool = _C.HostPool(
            size_bytes,
            populate_threads or 0,
            _REGISTRATION[register],
            -1 if device is None else device,
            bool(huge_pages),
            bool(check_memory),
            max_segment_bytes or 0,
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
        itemsize = dtype_itemsize(dtype)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset: expected a non-negative int, got {offset!r}")
        if offset % itemsize != 0:
            raise ValueError(f"offset: expected a multiple of the {itemsize}-byte element size, got {offset}")
        if shape is None:
            shape = ((self._size - min(offset, self._size)) // itemsize,)
        elif isinstance(shape, int):
            shape = (shape,)
        shape = tuple(shape)
        if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
            raise ValueError(f"shape: expected non-negative ints, got {shape}")
        nbytes = math.prod(shape) * itemsize
        raw = self._pool.view_bytes(offset, nbytes)
        torch = None if numpy else torch_or_none()
        if torch is None:
            import numpy as np  # noqa: PLC0415

            return raw.view(np.dtype(dtype)).reshape(shape)
        tensor = torch.from_numpy(raw)
        torch_dtype = dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype).removeprefix("torch."))
        return tensor.view(torch_dtype).view(shape)

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


@atexit.register
def _release_all_pools() -> None:
    # Unregister before the CUDA runtime tears down; nothing runs after this.
    for pool in list(_live_pools):
        try:
            pool.release(force=True)
        except Exception:  # noqa: BLE001 - at exit, leaking beats crashing
            pass
