"""hisparse: the data plane for hierarchical sparse attention.

The full KV cache of every request lives in pinned host memory; each request
keeps a small GPU hot buffer of the rows its sparse-attention indexer keeps
selecting. hisparse resolves each decode step's top-k positions to rows the
attention kernel can read, loads the missing rows over PCIe, and maintains
the buffer's LRU order, without host syncs and inside CUDA graphs.

Importing hisparse never initialises CUDA and does not need torch.
"""

from . import _C, ops
from .cache_handle import BatchInfo, CacheHandle
from .config import Config
from .host_pool import HostPool
from .host_registration import is_pinned, pin_tensor, unpin_tensor
from .index_group import IndexGroup
from .ipc_event import IpcEvent
from .kv_cache import KVCache
from .layout import HostLayout, check_host_memory, plan_host_layout
from .runtime import Runtime, SlotInvalidator
from .shared_pool import shared_pool_id, use_shared_host_pool
from .staging import StagingPlan, build_staging_plan

__version__ = _C.version()

#: Names of the residency counters, in the order of a stats tensor (hs_stat_t).
STAT_NAMES = _C.STAT_NAMES

__all__ = [
    "BatchInfo",
    "CacheHandle",
    "Config",
    "HostLayout",
    "HostPool",
    "IndexGroup",
    "IpcEvent",
    "KVCache",
    "Runtime",
    "STAT_NAMES",
    "SlotInvalidator",
    "StagingPlan",
    "__version__",
    "build_staging_plan",
    "check_host_memory",
    "is_pinned",
    "ops",
    "pin_tensor",
    "plan_host_layout",
    "shared_pool_id",
    "unpin_tensor",
    "use_shared_host_pool",
]
