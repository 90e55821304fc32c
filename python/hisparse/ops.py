"""Functional kernels of hisparse.

Every op takes preallocated tensors (torch or NumPy), all on one device:
host tensors run the CPU reference backend, CUDA tensors the CUDA backend on
torch's current stream of their device unless ``stream`` is given. Ops never
allocate, never synchronise with the host, and can be captured in CUDA graphs.
"""

from __future__ import annotations

from typing import Any, Optional

from . import _C
from ._tensors import export, export_optional, stream_handle

__all__ = ["copy_bytes", "resolve_residency"]


def copy_bytes(dst: Any, src: Any, *, stream: Any = None) -> None:
    """Copy ``src`` into ``dst`` byte for byte through a kernel of dst's device.

    On CUDA, ``src`` may be registered/pinned host memory (read zero-copy) or
    memory of the same device. Both must be contiguous and equally sized.
    """
    _C.copy_bytes(export(dst, "dst"), export(src, "src"), stream_handle(stream, dst, src))


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
    stream: Any = None,
) -> None:
    """Resolve one step's top-k positions to readable rows and update the LRU.

    The exact contract (hits, misses, eviction order, outputs, counters) is
    docs/residency.md. dtypes: int32 everywhere except ``lru_slots`` (int16)
    and ``stats`` (int64, >= 5 entries: lookups, hits, misses, resident,
    invalid; accumulated). ``device_global_indices`` and ``lru_slots`` are
    updated in place.
    """
    _C.resolve_residency(
        export(topk_indices, "topk_indices"),
        export(req_id_per_token, "req_id_per_token"),
        export(request_state_indices, "request_state_indices"),
        export(device_global_indices, "device_global_indices"),
        export(lru_slots, "lru_slots"),
        export(hot_block_table, "hot_block_table"),
        hot_block_size,
        attention_block_stride,
        host_rows,
        max_union_rows,
        export(out_attention, "out_attention"),
        export(out_hot_rows, "out_hot_rows"),
        export(out_resolved, "out_resolved"),
        export(out_miss_mask, "out_miss_mask"),
        export(out_valid_counts, "out_valid_counts"),
        export(out_swap_host_rows, "out_swap_host_rows"),
        export(out_swap_device_rows, "out_swap_device_rows"),
        export(out_swap_counts, "out_swap_counts"),
        export_optional(source_block_table, "source_block_table"),
        block_size,
        export_optional(resident_block_table, "resident_block_table"),
        resident_block_size,
        export_optional(num_valid_rows, "num_valid_rows"),
        export_optional(stats, "stats"),
        stream_handle(stream, topk_indices),
    )
