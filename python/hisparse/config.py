"""hisparse.Config: the sizes every other object is built from, validated up front."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from . import _C, _args

__all__ = ["Config"]

# hs_config_init's values: the library's defaults, read rather than repeated.
_DEFAULTS = _C.default_config()


@dataclass(frozen=True)
class Config:
    """Sizes of a hisparse deployment (the library's hs_config_t).

    Give the row size either as ``row_bytes`` or as ``row_width`` elements of
    ``dtype``. ``max_union_rows`` (the distinct rows one request can select in
    a step) defaults to the library's rule, ``top_k * (1 +
    num_speculative_tokens)`` (``hisparse._C.default_max_union_rows``).
    Everything is checked at construction by the library; ``check_device``
    adds the residency resolver's shared-memory need against a CUDA device.
    """

    top_k: int = _DEFAULTS["top_k"]
    device_buffer_size: int = _DEFAULTS["device_buffer_size"]
    max_union_rows: Optional[int] = None
    row_bytes: Optional[int] = None
    row_width: Optional[int] = None
    dtype: Any = None
    block_size: int = _DEFAULTS["block_size"]
    hot_block_size: int = _DEFAULTS["hot_block_size"]
    num_speculative_tokens: int = _DEFAULTS["num_speculative_tokens"]
    eager_host_mirror: bool = _DEFAULTS["eager_host_mirror"]

    def __post_init__(self) -> None:
        for name in ("top_k", "device_buffer_size", "block_size", "hot_block_size", "num_speculative_tokens"):
            _args.require_int(name, getattr(self, name), bits=32)
        _args.require_bool("eager_host_mirror", self.eager_host_mirror)
        if self.max_union_rows is None:
            object.__setattr__(
                self, "max_union_rows", _C.default_max_union_rows(self.top_k, self.num_speculative_tokens)
            )
        _args.require_int("max_union_rows", self.max_union_rows, bits=32)
        object.__setattr__(self, "row_bytes", _args.require_int("row_bytes", self._resolve_row_bytes(), bits=32))
        self._validate(-1)

    def _resolve_row_bytes(self) -> int:
        from_width = None
        if self.row_width is not None or self.dtype is not None:
            if self.row_width is None or self.dtype is None:
                raise ValueError("row_width/dtype: give both (or row_bytes alone)")
            from_width = _args.require_int("row_width", self.row_width) * _args.dtype_itemsize(self.dtype)
        if self.row_bytes is None:
            if from_width is None:
                raise ValueError("row_bytes: give row_bytes, or row_width and dtype")
            return from_width
        _args.require_int("row_bytes", self.row_bytes)
        if from_width is not None and from_width != self.row_bytes:
            raise ValueError(f"row_bytes: {self.row_bytes} disagrees with row_width x dtype size = {from_width}")
        return self.row_bytes

    def _c_fields(self) -> tuple:
        """The fields in the order the _C functions that take a whole config (hs_config_t) list them."""
        return (
            self.top_k,
            self.device_buffer_size,
            self.max_union_rows,
            self.num_speculative_tokens,
            self.row_bytes,
            self.block_size,
            self.hot_block_size,
            self.eager_host_mirror,
        )

    def _validate(self, device: int) -> None:
        _C.validate_config(*self._c_fields(), device)

    @property
    def resolver_shared_memory_bytes(self) -> int:
        """Shared memory per block the CUDA residency resolver needs for this config."""
        return _C.resolver_shared_memory_bytes(self.device_buffer_size, self.max_union_rows)

    def check_device(self, device: Any = None) -> None:
        """Raise if CUDA device ``device`` cannot run this configuration.

        Every valid shape runs on a CUDA device: one whose resolver arrays do
        not fit a block's shared memory there uses a workspace
        (:func:`hisparse.ops.resolver_workspace_bytes`, allocated by index
        groups). ``device`` is an index, a torch.device, or None for device 0.
        """
        index = 0
        if device is not None:
            kind, index = _args.device(device)
            if kind != _C.DEVICE_CUDA:
                given = _args.shown(device)
                raise ValueError(f"device: expected a CUDA device (an index, 'cuda[:N]', a torch.device), got {given}")
        self._validate(max(index, 0))
