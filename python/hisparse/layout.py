"""Host layout sizing and the host-memory check."""

from __future__ import annotations

from typing import NamedTuple

from . import _C

__all__ = ["HostLayout", "plan_host_layout", "check_host_memory", "available_host_memory"]


class HostLayout(NamedTuple):
    """How a host budget is cut into blocks.

    A host block holds ``block_size`` tokens of every layer; block 0 is the
    null block and never holds data.
    """

    host_num_blocks: int
    host_block_stride: int
    min_host_blocks: int


def plan_host_layout(page_size_bytes: int, block_size: int, max_model_len: int, host_budget_bytes: int) -> HostLayout:
    """Host block count and stride for a budget.

    Raises ValueError when the budget holds no block, or too few blocks for one
    request at ``max_model_len`` plus the null block and a copy-on-write tail.
    """
    for name, value in (
        ("page_size_bytes", page_size_bytes),
        ("block_size", block_size),
        ("max_model_len", max_model_len),
        ("host_budget_bytes", host_budget_bytes),
    ):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
        if not 0 <= value < 2**63:
            raise ValueError(f"{name}: expected a non-negative value below 2**63, got {value}")
    return HostLayout(*_C.plan_host_layout(page_size_bytes, block_size, max_model_len, host_budget_bytes))


def check_host_memory(pool_bytes: int) -> None:
    """Raise ValueError when a pinned pool of ``pool_bytes`` would not fit in RAM."""
    if isinstance(pool_bytes, bool) or not isinstance(pool_bytes, int):
        raise TypeError(f"pool_bytes: expected an int, got {type(pool_bytes).__name__}")
    if pool_bytes < 0:
        raise ValueError(f"pool_bytes: expected a non-negative int, got {pool_bytes!r}")
    _C.check_host_memory(pool_bytes)


def available_host_memory() -> int:
    """Bytes of RAM a new allocation can get (MemAvailable)."""
    return _C.available_host_memory()
