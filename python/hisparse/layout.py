"""Host layout sizing and the host-memory check."""

from __future__ import annotations

from typing import NamedTuple

from . import _C, _args

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
    return HostLayout(
        *_C.plan_host_layout(
            _args.require_int("page_size_bytes", page_size_bytes, 0, bits=64),
            _args.require_int("block_size", block_size, 0, bits=64),
            _args.require_int("max_model_len", max_model_len, 0, bits=64),
            _args.require_int("host_budget_bytes", host_budget_bytes, 0, bits=64),
        )
    )


def check_host_memory(pool_bytes: int) -> None:
    """Raise ValueError when a pinned pool of ``pool_bytes`` would not fit in RAM."""
    _C.check_host_memory(_args.require_int("pool_bytes", pool_bytes, 0, bits=64))


def available_host_memory() -> int:
    """Bytes of RAM a new allocation can get (MemAvailable)."""
    return _C.available_host_memory()
