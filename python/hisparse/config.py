"""hisparse.Config: the sizes every other object is built from, validated up front."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from . import _C

__all__ = ["Config", "dtype_itemsize"]

_ITEMSIZE_BY_NAME = {
    "uint8": 1,
    "int8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int16": 2,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "int32": 4,
    "float32": 4,
    "float": 4,
    "int64": 8,
    "float64": 8,
    "double": 8,
}


def dtype_itemsize(dtype: Any) -> int:
    """Bytes per element of a torch dtype, NumPy dtype or dtype name."""
    itemsize = getattr(dtype, "itemsize", None)
    if isinstance(itemsize, int):
        return itemsize
    name = str(dtype).removeprefix("torch.")
    if name in _ITEMSIZE_BY_NAME:
        return _ITEMSIZE_BY_NAME[name]
    try:
        import numpy  # noqa: PLC0415

        return int(numpy.dtype(dtype).itemsize)
    except TypeError as error:
        raise TypeError(f"dtype: expected a torch dtype, NumPy dtype or dtype name, got {dtype!r}") from error


def _require_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class Config:
    """Sizes of a hisparse deployment.

    Give the row size either as ``row_bytes`` or as ``row_width`` elements of
    ``dtype``. ``max_union_rows`` defaults to ``top_k * (1 +
    num_speculative_tokens)``: the distinct rows one request can select in a
    step. Everything is checked at construction; ``check_device`` adds the
    check of a CUDA device.
    """

    top_k: int = 2048
    device_buffer_size: int = 4096
    max_union_rows: Optional[int] = None
    row_bytes: Optional[int] = None
    row_width: Optional[int] = None
    dtype: Any = None
    block_size: int = 64
    hot_block_size: int = 64
    num_speculative_tokens: int = 0
    eager_host_mirror: bool = False

    def __post_init__(self) -> None:
        for name in ("top_k", "device_buffer_size", "block_size", "hot_block_size", "num_speculative_tokens"):
            _require_int(name, getattr(self, name))
        if self.num_speculative_tokens < 0:
            raise ValueError(f"num_speculative_tokens: expected >= 0, got {self.num_speculative_tokens}")
        if not isinstance(self.eager_host_mirror, bool):
            raise TypeError(f"eager_host_mirror: expected a bool, got {type(self.eager_host_mirror).__name__}")
        if self.max_union_rows is None:
            object.__setattr__(self, "max_union_rows", self.top_k * (1 + self.num_speculative_tokens))
        _require_int("max_union_rows", self.max_union_rows)
        object.__setattr__(self, "row_bytes", self._resolve_row_bytes())
        for name in ("top_k", "device_buffer_size", "max_union_rows", "row_bytes", "block_size", "hot_block_size"):
            value = getattr(self, name)
            if not -(2**31) <= value < 2**31:
                raise ValueError(f"{name}: expected a value that fits in 32 bits, got {value}")
        _C.validate_config(
            self.top_k,
            self.device_buffer_size,
            self.max_union_rows,
            self.row_bytes,
            self.block_size,
            self.hot_block_size,
            self.eager_host_mirror,
            -1,
        )

    def _resolve_row_bytes(self) -> int:
        from_width = None
        if self.row_width is not None or self.dtype is not None:
            if self.row_width is None or self.dtype is None:
                raise ValueError("row_width/dtype: give both (or row_bytes alone)")
            _require_int("row_width", self.row_width)
            from_width = self.row_width * dtype_itemsize(self.dtype)
        if self.row_bytes is None:
            if from_width is None:
                raise ValueError("row_bytes: give row_bytes, or row_width and dtype")
            return from_width
        _require_int("row_bytes", self.row_bytes)
        if from_width is not None and from_width != self.row_bytes:
            raise ValueError(
                f"row_bytes: {self.row_bytes} disagrees with row_width x dtype size = {from_width}"
            )
        return self.row_bytes

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
        index = 0 if device is None else getattr(device, "index", device)
        if index is None:
            index = 0
        _C.validate_config(
            self.top_k,
            self.device_buffer_size,
            self.max_union_rows,
            self.row_bytes,
            self.block_size,
            self.hot_block_size,
            self.eager_host_mirror,
            _require_int("device", index),
        )
